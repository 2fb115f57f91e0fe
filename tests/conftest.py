"""Shared fixtures: in-process shards and servers on 127.0.0.1 with port 0."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ps.config import OptimizerConfig, ServerConfig, TableConfig
from ps.rows import parallel
from ps.server import Server


@pytest.fixture(autouse=True, scope="session")
def split_every_batch():
    """In-process tests run every compiled per-id loop split over 3 threads, however small the batch, so the
    state machines and oracles check the split kernels (servers started as processes use the defaults)."""
    saved = parallel.THREADS, parallel.MIN_PART
    parallel.THREADS, parallel.MIN_PART = 3, 1
    yield
    parallel.THREADS, parallel.MIN_PART = saved


@pytest.fixture
def sgd1_table() -> TableConfig:
    """dim 4, SGD with lr 1: a pushed gradient g turns row r into r - g exactly."""
    return TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 1.0))


@pytest.fixture
def servers(tmp_path):
    """Factory: start n in-process shards (shard i of n), stopped at teardown. Returns (addresses, Server list)."""
    started: list[Server] = []

    def start(n: int = 2, root=None):
        root = root or tmp_path
        out = []
        for i in range(n):
            s = Server(ServerConfig(data_dir=str(root / f"shard-{i}"), shard_id=i, num_shards=n, port=0))
            s.start()
            started.append(s)
            out.append(s)
        return [f"127.0.0.1:{s.port}" for s in out], out

    yield start
    for s in started:
        try:
            s.stop(grace_s=1)
        except Exception:
            pass


def random_ids(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)


def crash(shard) -> None:
    """Leaves a Shard the way kill -9 would: nothing flushed, the journal and RocksDB's WAL are what is left
    (closing the RocksDB handle writes nothing a crash would not leave)."""
    shard._closed.set()
    shard._wake.set()
    shard._flusher.join()
    journal = shard.journal
    journal._prefault.close()
    if journal._fd >= 0:  # closed as the kernel closes it: the space prepared after the last record stays
        if journal._map is not None:
            journal._map.close()
            journal._map = None
        os.close(journal._fd)
        journal._fd = -1
    shard.store.close()

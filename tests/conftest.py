"""Shared fixtures: in-process shards and servers on 127.0.0.1 with port 0."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps.checkpoint import FORMAT, write_manifest
from ps.config import OptimizerConfig, TableConfig
from ps.rows import parallel
from ps.server import Server
from ps.server_config import ServerConfig
from ps.sharding import NUM_SLOTS
from tests.waiting import join_thread
from worker.synthetic import SyntheticConfig
from worker.synthetic_files import write_synthetic

# A shell starts a command it runs in the background (`cmd &`) with SIGINT ignored, and Python started so installs
# no KeyboardInterrupt handler, nor do the processes it starts: the tests of Ctrl-C would fail for how the suite
# was started. The suite runs as from a terminal either way.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
    """Factory: start n in-process shards (shard i of n; config: more ServerConfig fields), stopped at teardown.
    Returns (addresses, Server list)."""
    started: list[Server] = []

    def start(n: int = 2, root=None, **config):
        root = root or tmp_path
        out = []
        for i in range(n):
            s = Server(ServerConfig(data_dir=str(root / f"shard-{i}"), shard_id=i, num_shards=n, port=0, **config))
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


FLUSH_CRASH_POINTS = ("some_tables_written", "rows_written", "position_recorded")


@contextlib.contextmanager
def call_slots_taken(server: Server, timeout_s: float = 30.0) -> Iterator[None]:
    """Within it, server's every call slot (ServerConfig threads + max_queued_calls) is taken by Stats calls held in
    the shard, so that gRPC refuses any further call (RESOURCE_EXHAUSTED); they are let go, and answered, at its
    end. A call found still waiting after a moment is taken to be queued and another is sent, until one is refused."""
    real_stats, release, entered = server.shard.stats, threading.Event(), threading.Event()

    def stuck_stats():
        entered.set()
        assert release.wait(timeout_s)
        return real_stats()

    server.shard.stats = stuck_stats
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub, held = ps_pb2_grpc.ParameterServerStub(channel), []
    try:
        deadline, refused = time.monotonic() + timeout_s, False
        while not refused and time.monotonic() < deadline:
            call = stub.Stats.future(ps_pb2.StatsRequest(), timeout=2 * timeout_s)
            try:
                call.result(timeout=0.2)
            except grpc.FutureTimeoutError:  # running or queued
                held.append(call)
                continue
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                refused = True
                continue
            raise AssertionError("a Stats call was answered while the shard's were held")
        assert refused and entered.is_set(), f"no call refused within {timeout_s:g} s ({len(held)} held)"
        yield
    finally:
        release.set()
        server.shard.stats = real_stats
        for call in held:  # queued, or refused later than the moment waited for
            assert call.exception() is None or call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        channel.close()


class _Killed(BaseException):
    """Stops a flush where kill -9 would; a BaseException, so no `except Exception` on the way swallows it."""


def one_shard_checkpoint(shard, directory: str, tables: list[TableConfig], edit=lambda info: None) -> None:
    """A checkpoint of one shard (ps.engine.shard.Shard) whose manifest lists `tables`, as `ps-worker checkpoint
    save` writes it; edit: changes the shard's manifest entry first (a damaged manifest, its checksum made again)."""
    clock, token = shard.hold(60)
    try:
        info = shard.save_checkpoint(directory, token)
    finally:
        shard.release(token)
    edit(info)
    manifest = {"format": FORMAT, "num_shards": 1, "num_slots": NUM_SLOTS, "clock": clock, "created": "now",
                "tables": [t.to_dict() for t in tables], "shards": [info]}  # fmt: skip
    write_manifest(directory, manifest)


def one_table_checkpoint(root, rows: int) -> str:
    """root/ckpt: a checkpoint of one shard (data dir root/source) holding ids 1..rows of table "a" (dim 2), each
    pushed once with gradient 1."""
    from ps.engine.shard import Shard

    spec = TableConfig("a", 2)
    shard = Shard(ServerConfig(data_dir=str(root / "source")))
    try:
        shard.create_table(spec)
        shard.push("a", np.arange(1, rows + 1, dtype=np.uint64), np.ones((rows, 2), np.float32))
        one_shard_checkpoint(shard, str(root / "ckpt"), [spec])
    finally:
        shard.close()
    return str(root / "ckpt")


def exported(out, table: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, rows) of a table of the export in out, read as docs/reliability.md tells a serving system to: its
    export.json first, then the files in the folder that names ("dir")."""
    import json

    with open(os.path.join(out, "export.json")) as f:
        files = os.path.join(out, json.load(f)["dir"])
    return np.load(os.path.join(files, f"{table}.ids.npy")), np.load(os.path.join(files, f"{table}.rows.npy"))


def stop_servers(running: list) -> None:
    """Closes each (in-process ps.server.Server, grpc channel) pair a test fixture started; a server that fails
    to stop (the state the test left it in) does not keep the others running."""
    for server, channel in running:
        channel.close()
        try:
            server.stop(grace_s=1)
        except Exception:
            pass


def crash(shard, during_flush: str | None = None, meanwhile: Callable[[], object] | None = None) -> None:
    """Leaves a Shard the way kill -9 would: the journal and RocksDB's WAL are what is left (closing the RocksDB
    handle writes nothing a crash would not leave), and dirty rows are lost, so are evicted rows still waiting
    for their background write (all but the oldest batch, which may be being written: it lands whole or not).

    during_flush: the process dies inside a flush (Shard.flush), at one of FLUSH_CRASH_POINTS:
    "some_tables_written": the dirty rows of every table but the last are in RocksDB (the shard needs two tables);
    "rows_written": every dirty row is in RocksDB, the journal position they cover is not recorded;
    "position_recorded": that position (and the `applied` table) is recorded, the journal is not trimmed.
    meanwhile, if given, runs at that point before the process dies (pushes acknowledged during the flush)."""
    assert shard.flusher.stop(60), "the shard's flusher, stopping: still running after 60 s"
    if during_flush is not None:
        _flush_until(shard, during_flush, meanwhile)
    journal = shard.journal
    marker = getattr(journal, "_marker", None)  # the journal mark's writer thread dies too, writing nothing more
    if marker is not None:
        marker._stop.set()
        join_thread(marker._thread, 60, "the journal mark's writer, stopping")
    journal._prefault.close()
    if journal._fd >= 0:  # closed as the kernel closes it: the space prepared after the last record stays
        if journal._map is not None:
            journal._map.close()
            journal._map = None
        os.close(journal._fd)
        journal._fd = -1
    behind = shard.store._behind
    with behind._cv:  # the store's close would write them
        while len(behind._pending) > 1:
            behind._pending_bytes -= behind._pending.pop().nbytes
    shard.store.close()


def _flush_until(shard, point: str, meanwhile: Callable[[], object] | None) -> None:
    """Runs shard.flush() and kills it at `point` (see crash) by making the step after it raise _Killed."""
    tables = list(shard.tables.values())  # flushed in this order
    if point == "some_tables_written":
        assert len(tables) >= 2, "a crash between two tables' writes needs two tables"
    owner, step = {
        "some_tables_written": (tables[-1], "flush"),
        "rows_written": (shard.store.meta, "set_flushed_seq"),
        "position_recorded": (shard.journal, "trim"),
    }[point]

    def die_at_the_point(*args, **kwargs):
        if meanwhile is not None:
            meanwhile()
        raise _Killed(point)

    setattr(owner, step, die_at_the_point)  # an instance attribute: hides the method for this object only
    try:
        shard.flush()
    except _Killed:
        return
    finally:
        delattr(owner, step)
    raise AssertionError(f"Shard.flush finished without reaching {point!r}: the crash points no longer match it")


TRAIN_ROWS, TEST_ROWS = 600, 150  # of the files fixture


@pytest.fixture
def files(tmp_path):
    """(train, test): Criteo files of TRAIN_ROWS and TEST_ROWS rows of one synthetic generator."""
    train_path, test_path = tmp_path / "train.tsv", tmp_path / "test.tsv"
    cfg = SyntheticConfig(rows=TRAIN_ROWS)
    write_synthetic(train_path, cfg, 0, TRAIN_ROWS)
    write_synthetic(test_path, cfg, TRAIN_ROWS, TRAIN_ROWS + TEST_ROWS)
    return str(train_path), str(test_path)

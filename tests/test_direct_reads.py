"""`ps-server --direct-reads`: RocksDB reads its files with O_DIRECT (ps.storage.store.rocksdb_options), and the
rows written without it read back the same with it."""

from __future__ import annotations

import glob
import mmap
import os

import numpy as np
import pytest

from ps.__main__ import build_parser
from ps.config import ServerConfig, TableConfig
from ps.engine.shard import Shard
from ps.storage.store import Store


def reads_with_o_direct(directory: str) -> bool:
    probe = os.path.join(directory, "probe")
    with open(probe, "wb") as f:
        f.write(bytes(4096))
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
        try:
            os.readv(fd, [mmap.mmap(-1, 4096)])
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        os.unlink(probe)


def options_say(path: str) -> str:
    """The use_direct_reads line of the newest OPTIONS file RocksDB wrote in path."""
    newest = max(glob.glob(os.path.join(path, "OPTIONS-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
    with open(newest) as f:
        return next(line.strip() for line in f if line.strip().startswith("use_direct_reads="))


def test_rows_written_without_direct_reads_read_back_the_same_with_them(tmp_path):
    if not reads_with_o_direct(str(tmp_path)):
        pytest.skip(f"{tmp_path}'s file system does not read with O_DIRECT")
    ids = np.arange(0, 5000, 7, dtype=np.uint64)
    rows = np.random.default_rng(0).standard_normal((len(ids), 6)).astype(np.float32)
    s = Store(str(tmp_path))
    s.create_table(TableConfig("emb", 2))
    s.put_rows("emb", ids, rows, np.arange(len(ids), dtype=np.uint64), np.ones(len(ids), bool), {})
    s.flush()  # into SST files, which the reopened store reads past the page cache
    s.close()
    assert options_say(str(tmp_path)) == "use_direct_reads=false"
    s = Store(str(tmp_path), direct_reads=True)
    try:
        assert options_say(str(tmp_path)) == "use_direct_reads=true"
        found, got, lsn, complete = s.get_rows("emb", np.concatenate([ids[::-1], [1, 2]]).astype(np.uint64), 6)
        assert found.tolist() == [True] * len(ids) + [False, False] and complete.all()
        assert np.array_equal(got, rows[::-1]) and lsn.tolist() == list(range(len(ids)))[::-1]
    finally:
        s.close()


def test_the_flag_reaches_the_shards_store(tmp_path):
    assert build_parser().parse_args(["--data-dir", "d"]).direct_reads is False
    assert build_parser().parse_args(["--data-dir", "d", "--direct-reads"]).direct_reads is True
    if not reads_with_o_direct(str(tmp_path)):
        pytest.skip(f"{tmp_path}'s file system does not read with O_DIRECT")
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "shard"), direct_reads=True))
    try:
        assert options_say(str(tmp_path / "shard")) == "use_direct_reads=true"
    finally:
        shard.close()

"""`ps-server --mmap-reads`: RocksDB reads its files through memory maps (ps.storage.store.rocksdb_options), rows
written without it read back the same with it, and it is refused beside --direct-reads."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import numpy as np
import pytest

from ps.__main__ import build_parser
from ps.config import ServerConfig, TableConfig
from ps.engine.shard import Shard
from ps.storage.store import Store, rocksdb_options


def options_say(path: str) -> str:
    """The allow_mmap_reads line of the newest OPTIONS file RocksDB wrote in path."""
    newest = max(glob.glob(os.path.join(path, "OPTIONS-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
    with open(newest) as f:
        return next(line.strip() for line in f if line.strip().startswith("allow_mmap_reads="))


def test_rows_written_without_mmap_reads_read_back_the_same_with_them(tmp_path):
    ids = np.arange(0, 5000, 7, dtype=np.uint64)
    rows = np.random.default_rng(0).standard_normal((len(ids), 6)).astype(np.float32)
    s = Store(str(tmp_path))
    s.create_table(TableConfig("emb", 2))
    s.put_rows("emb", ids, rows, np.arange(len(ids), dtype=np.uint64), np.ones(len(ids), bool), {})
    s.flush()  # into SST files, which the reopened store reads through maps
    s.close()
    assert options_say(str(tmp_path)) == "allow_mmap_reads=false"
    s = Store(str(tmp_path), mmap_reads=True, index_in_cache=True)
    try:
        assert options_say(str(tmp_path)) == "allow_mmap_reads=true"
        found, got, lsn, complete = s.get_rows("emb", np.concatenate([ids[::-1], [1, 2]]).astype(np.uint64), 6)
        assert found.tolist() == [True] * len(ids) + [False, False] and complete.all()
        assert np.array_equal(got, rows[::-1]) and lsn.tolist() == list(range(len(ids)))[::-1]
    finally:
        s.close()


def test_the_flag_reaches_the_shards_store(tmp_path):
    assert build_parser().parse_args(["--data-dir", "d"]).mmap_reads is False
    assert build_parser().parse_args(["--data-dir", "d", "--mmap-reads"]).mmap_reads is True
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "shard"), mmap_reads=True))
    try:
        assert options_say(str(tmp_path / "shard")) == "allow_mmap_reads=true"
    finally:
        shard.close()


def test_mmap_reads_and_direct_reads_are_refused_together(tmp_path):
    with pytest.raises(ValueError, match="--direct-reads and --mmap-reads exclude each other"):
        ServerConfig(data_dir=str(tmp_path / "a"), direct_reads=True, mmap_reads=True).validate()
    with pytest.raises(ValueError, match="exclude each other"):
        rocksdb_options(direct_reads=True, mmap_reads=True)
    both = subprocess.run(
        [sys.executable, "-m", "ps", "--data-dir", str(tmp_path / "b"), "--port", "0", "--direct-reads",
         "--mmap-reads"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert both.returncode == 2 and "--direct-reads and --mmap-reads exclude each other" in both.stderr, both.stderr
    assert "Traceback" not in both.stderr and not os.path.exists(tmp_path / "b")

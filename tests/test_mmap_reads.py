"""`ps-server --mmap-reads`: RocksDB reads its files through memory maps (ps.storage.options.rocksdb_options), rows
written without it read back the same with it, and it is refused beside --direct-reads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ps.cli_server_flags import build_parser
from ps.engine.shard import Shard
from ps.server_config import ServerConfig
from ps.storage.options import rocksdb_options
from tests.readmodes import check_rows_read_back_the_same, options_say


def test_rows_written_without_mmap_reads_read_back_the_same_with_them(tmp_path):
    check_rows_read_back_the_same(str(tmp_path), "allow_mmap_reads", mmap_reads=True, index_in_cache=True)


def test_the_flag_reaches_the_shards_store(tmp_path):
    assert build_parser().parse_args(["--data-dir", "d"]).mmap_reads is False
    assert build_parser().parse_args(["--data-dir", "d", "--mmap-reads"]).mmap_reads is True
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "shard"), mmap_reads=True))
    try:
        assert options_say(str(tmp_path / "shard"), "allow_mmap_reads") == "allow_mmap_reads=true"
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

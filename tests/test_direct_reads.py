"""`ps-server --direct-reads`: RocksDB reads its files with O_DIRECT (ps.storage.options.rocksdb_options), and the
rows written without it read back the same with it."""

from __future__ import annotations

import mmap
import os

import pytest

from ps.cli_server_flags import build_parser
from ps.engine.shard import Shard
from ps.server_config import ServerConfig
from tests.readmodes import check_rows_read_back_the_same, options_say


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


def test_rows_written_without_direct_reads_read_back_the_same_with_them(tmp_path):
    if not reads_with_o_direct(str(tmp_path)):
        pytest.skip(f"{tmp_path}'s file system does not read with O_DIRECT")
    check_rows_read_back_the_same(str(tmp_path), "use_direct_reads", direct_reads=True)


def test_the_flag_reaches_the_shards_store(tmp_path):
    assert build_parser().parse_args(["--data-dir", "d"]).direct_reads is False
    assert build_parser().parse_args(["--data-dir", "d", "--direct-reads"]).direct_reads is True
    if not reads_with_o_direct(str(tmp_path)):
        pytest.skip(f"{tmp_path}'s file system does not read with O_DIRECT")
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "shard"), direct_reads=True))
    try:
        assert options_say(str(tmp_path / "shard"), "use_direct_reads") == "use_direct_reads=true"
    finally:
        shard.close()

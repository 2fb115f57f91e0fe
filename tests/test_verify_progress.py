"""What a verify logs while it reads (ps.storage.verifyscan ScanProgress): a line every ps.progress.LOG_EVERY_S seconds
with the rows read of about those RocksDB holds, their bytes, the rate and the time left, and a closing line with
what it read and how long it took; at --verify-on-start in the server's log, for `ps-server verify` on stderr."""

import logging
import re
import subprocess
import sys

import numpy as np

from ps import progress
from ps.config import TableConfig
from ps.engine.shard import Shard
from ps.server_config import ServerConfig
from ps.storage.verify import verify_data_dir
from ps.storage.verifyscan import VERIFY_CHUNK_ROWS

ROWS = VERIFY_CHUNK_ROWS * 2 + 1000  # three chunks of the scan, the last a short one
CLOSING = (
    r"verified {dir}'s RocksDB: {rows:,} rows \([\d.,]+ [KM]iB\) and \d+ other keys read in \d+\.\d s, "
    r"every block's checksum verified"
)


def _data_dir(path) -> str:
    shard = Shard(ServerConfig(data_dir=str(path), flush_interval_s=3600))
    try:
        shard.create_table(TableConfig("t", 4))
        shard.push("t", np.arange(ROWS, dtype=np.uint64), np.ones((ROWS, 4), np.float32))
    finally:
        shard.close()
    return str(path)


def test_a_verify_logs_rows_read_of_about_the_total_with_a_rate_and_the_time_left_then_how_long_it_took(
    tmp_path, caplog, monkeypatch
):
    """A line after every chunk (LOG_EVERY_S 0): the rows read of RocksDB's estimate of ROWS, the share, the
    bytes, a rate, the time left while rows are left; then the closing line."""
    path = _data_dir(tmp_path / "d")
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="ps.storage.verifyscan")
    lines, damaged = verify_data_dir(path)
    assert not damaged, lines
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("verifying ")]
    read = [VERIFY_CHUNK_ROWS, 2 * VERIFY_CHUNK_ROWS, ROWS]
    assert len(said) == len(read), said
    for line, done in zip(said, read, strict=True):
        left = r", about [\d,]+ s left" if done < ROWS else ""
        share = rf"\({100 * done / ROWS:.0f}%, [\d.,]+ [KM]iB\)"
        assert re.fullmatch(rf"verifying {path}: {done:,} of about {ROWS:,} rows read {share}, [\d,]+ rows/s{left}",
                            line), line  # fmt: skip
    assert re.search(CLOSING.format(dir=re.escape(path), rows=ROWS), caplog.text), caplog.text


def test_verify_on_start_and_ps_server_verify_say_how_long_the_read_took(tmp_path, caplog, servers):
    """--verify-on-start logs the closing line in the server's log; `ps-server verify` writes it on stderr, its
    report alone on stdout."""
    path = _data_dir(tmp_path / "shard-0")
    caplog.set_level(logging.INFO, logger="ps.storage.verifyscan")
    servers(1, root=tmp_path, verify_on_start=True)
    assert re.search(CLOSING.format(dir=re.escape(path), rows=ROWS), caplog.text), caplog.text
    done = subprocess.run([sys.executable, "-m", "ps", "verify", path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(CLOSING.format(dir=re.escape(path), rows=ROWS), done.stderr), done.stderr
    assert "'s RocksDB: " not in done.stdout, done.stdout

"""What a long journal replay logs (ps.storage.journalreplay replay_progress, every ps.progress
LOG_EVERY_S seconds): the records so far, the bytes read of about those the segments hold, the rate and the
time left."""

import logging
import re

import numpy as np

from ps import progress
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.server_config import ServerConfig
from ps.storage.journalreplay import replay_progress
from tests.conftest import crash

PUSHES = 20


def test_the_line_gives_the_bytes_read_of_the_total_the_rate_and_the_time_left():
    """96 MiB of 240 MiB read in 8 s: 12 MiB/s, 144 MiB left: 12 s (a total the read passed: ps.progress.pace)."""
    mib = 1 << 20
    assert replay_progress(120_000, 1_234_567, (96 * mib, 240 * mib), 8.0) == (
        "replaying: 120,000 journal records so far (at record 1,234,567), 96.0 MiB of about 240.0 MiB read (40%), "
        "12.0 MiB/s, about 12 s left"
    )


def test_a_replay_logs_its_progress_with_the_bytes_read_a_rate_and_the_time_left(tmp_path, caplog, monkeypatch):
    """PUSHES records left in the journal by a crash, a line after each record applied (LOG_EVERY_S 0): the
    records so far, bytes read growing to the journal's end, a rate, the time left until the last record."""
    cfg = TableConfig("t", 4, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))
    shard = Shard(ServerConfig(data_dir=str(tmp_path), flush_interval_s=3600))
    shard.create_table(cfg)
    for k in range(PUSHES):
        shard.push("t", np.arange(k * 10, k * 10 + 10, dtype=np.uint64), np.ones((10, 4), np.float32))
    crash(shard)
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="ps.engine.shard")
    shard = Shard(ServerConfig(data_dir=str(tmp_path), flush_interval_s=3600))
    shard.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("replaying: ")]
    assert len(lines) == PUSHES, lines
    read = []
    for records, line in enumerate(lines, start=1):
        got = re.fullmatch(rf"replaying: {records} journal records so far \(at record (\d+)\), ([\d.,]+ (?:B|KiB)) of "
                           r"about ([\d.,]+ (?:B|KiB)) read \((\d+)%\), [\d.,]+ (?:B|KiB|MiB)/s(, about \d+ s left)?",
                           line)  # fmt: skip
        assert got, line
        read.append((got[2], got[3], int(got[4]), got[5] is not None))
    assert read[-1][0] == read[-1][1] and read[-1][2] == 100 and not read[-1][3], read[-1]  # the whole journal read
    assert all(left and share < 100 for _, _, share, left in read[:-1]), read
    assert f"replayed {PUSHES} journal records" in caplog.text

"""What the server logs while a Shrink runs (ps.engine.shrinkprogress ShrinkProgress.scanned): a line every
ps.progress.LOG_EVERY_S seconds with the rows scanned of those the tables hold, the rate and the time left, and a final
line with the rows scanned and the time it took."""

import logging
import re

import numpy as np
import pytest

from ps import progress
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.engine.shrinkprogress import ShrinkProgress
from ps.engine.table import FLUSH_CHUNK_ROWS
from ps.errors import ShrinkRunningError
from ps.server_config import ServerConfig
from tests.test_shrink_ram import shrinkable_table


def test_a_shrink_logs_its_progress_with_a_rate_and_the_time_left_then_how_long_it_took(tmp_path, caplog, monkeypatch):
    """Tables a (2.5 chunks of rows) and b (100 rows), a line after every chunk (LOG_EVERY_S 0): the rows
    scanned of both tables' 20,580, the share, a rate, the time left while rows are left, the table being
    scanned; then the final line."""
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    n = FLUSH_CHUNK_ROWS * 5 // 2
    shard = Shard(ServerConfig(data_dir=str(tmp_path), flush_interval_s=3600))
    try:
        for name, rows in (("a", n), ("b", 100)):
            shard.create_table(shrinkable_table(name, 4))
            shard.push(name, np.arange(rows, dtype=np.uint64), np.ones((rows, 4), np.float32))
        caplog.set_level(logging.INFO)
        assert shard.shrink()["dropped"] == 0
    finally:
        shard.close()
    total = n + 100
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shrinking: ")]
    scanned = [FLUSH_CHUNK_ROWS, 2 * FLUSH_CHUNK_ROWS, n, total]
    assert len(lines) == len(scanned), lines
    for line, done, table in zip(lines, scanned, ["'a', 1 of 2"] * 3 + ["'b', 2 of 2"], strict=True):
        left = r", about [\d,]+ s left" if done < total else ""
        want = rf"shrinking: {done:,} of {total:,} rows scanned \({100 * done / total:.0f}%\), [\d,]+ rows/s{left} "
        assert re.fullmatch(want + rf"\(table {table}\)", line), line
    assert re.search(rf"shrink at step 0 dropped 0 ids from a, b \({total:,} rows scanned in \d+\.\d s\)", caplog.text)


def test_the_total_counts_only_the_tables_with_a_rule_on(tmp_path, caplog, monkeypatch):
    """Table a has a rule on (100 rows), table off none (300 rows, which Table.shrink does not scan): the lines
    say 100 rows, all of them scanned, not 100 of 400; a Shrink refused meanwhile says "of 100 rows"."""
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    scanned, refusals = ShrinkProgress.scanned, []

    def scanned_and_refused(self: ShrinkProgress, table: str, n: int) -> None:
        scanned(self, table, n)
        with pytest.raises(ShrinkRunningError) as refused, shard.shrink_running.begin(ShrinkProgress([table])):
            pass
        refusals.append(str(refused.value))

    monkeypatch.setattr(ShrinkProgress, "scanned", scanned_and_refused)
    shard = Shard(ServerConfig(data_dir=str(tmp_path), flush_interval_s=3600))
    try:
        shard.create_table(shrinkable_table("a", 4))
        shard.create_table(TableConfig("off", 4, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
        for name, rows in (("a", 100), ("off", 300)):
            shard.push(name, np.arange(rows, dtype=np.uint64), np.ones((rows, 4), np.float32))
        caplog.set_level(logging.INFO)
        assert shard.shrink()["dropped"] == 0
    finally:
        shard.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shrinking: ")]
    assert len(lines) == 1 and lines[0].startswith("shrinking: 100 of 100 rows scanned (100%), "), lines
    assert len(refusals) == 1 and " 100 of 100 rows scanned so far" in refusals[0], refusals

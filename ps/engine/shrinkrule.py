"""A Shrink's rule for one chunk of a table's rows (ps.config.EvictionConfig): show and click decayed, and which ids
are dropped and which kept rows are written.

Table.shrink scans RocksDB in chunks, takes RAM's rows where newer, and applies this rule; its RowWriter
(ps.engine.rowwriter) writes what it decided.
"""

from __future__ import annotations

import numpy as np

from ps.config import EvictionConfig
from ps.rows.layout import CLICK, LAST_STEP, SHOW

# A score this close to the threshold, relative to it, counts as at it (kept): show and click are float32 and the
# coefficients and threshold binary fractions of decimals, so a score the formula puts exactly at the threshold
# (10 shows times nonclk_coeff 0.01, threshold 0.1) is computed a few float32 roundings off, either side.
SCORE_SLACK = 2**-20


def shrink_chunk(
    ev: EvictionConfig, stats_col: int, rows: np.ndarray, lsn: np.ndarray, clock: int, flushed_seq: int
) -> tuple[np.ndarray, np.ndarray]:
    """Decays the chunk's show and click in place (rows: (n, width) full rows, statistics at stats_col); returns
    (drop, written) bool (n,): drop the ids last pushed more than ev.ttl_steps before clock or scoring under
    ev.score_threshold (by more than SCORE_SLACK of it: a score at the threshold keeps its id; scored in float64),
    except a row pushed since the last flush (lsn past flushed_seq), kept, decayed, until a later shrink (a drop
    is not journaled: after a crash the journal's replay of that push would bring the row back); write the kept
    rows where decay changed them (decay < 1)."""
    sc = stats_col
    rows[:, sc + SHOW] *= ev.decay
    rows[:, sc + CLICK] *= ev.decay
    show, click = rows[:, sc + SHOW].astype(np.float64), rows[:, sc + CLICK].astype(np.float64)
    drop = np.zeros(len(rows), dtype=bool)
    if ev.ttl_steps > 0:
        drop |= rows[:, sc + LAST_STEP] < clock - ev.ttl_steps
    if ev.score_threshold > 0:
        score = (show - click) * ev.nonclk_coeff + click * ev.click_coeff
        drop |= score < ev.score_threshold * (1 - SCORE_SLACK)
    drop &= lsn <= np.uint64(flushed_seq)  # pushed since the last flush: kept
    written = ~drop if ev.decay < 1 else np.zeros(len(rows), dtype=bool)  # decay 1: kept rows as they were
    return drop, written

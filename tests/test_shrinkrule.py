"""A Shrink's score rule (ps.engine.shrinkrule) through a shard: which ids a score threshold keeps and drops."""

from fractions import Fraction

import numpy as np
import pytest

from ps.config import EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.server_config import ServerConfig

# (nonclk_coeff, click_coeff, threshold): each case's shows and clicks below score exactly the threshold by the
# documented formula, (show - click) * nonclk_coeff + click * click_coeff, in exact decimal arithmetic
AT_THRESHOLD = [
    (0.01, 1.0, 0.1, 10, 0),  # float32 scores 0.099999994
    (0.01, 1.0, 0.05, 5, 0),
    (0.1, 0.3, 0.9, 3, 3),  # float64 scores 0.8999999999999999
    (0.1, 0.3, 1.0, 4, 3),
]


def _exact(nonclk: float, click_coeff: float, show: int, click: int) -> Fraction:
    return (show - click) * Fraction(str(nonclk)) + click * Fraction(str(click_coeff))


@pytest.mark.parametrize(("nonclk", "click_coeff", "threshold", "show", "click"), AT_THRESHOLD)
def test_an_id_scoring_exactly_the_threshold_is_kept_and_one_just_under_is_dropped(
    tmp_path, nonclk, click_coeff, threshold, show, click
):
    """Docs/tables.md: ids scoring *under* score_threshold are dropped. Id 1 scores the threshold exactly (in
    decimal), id 2 has one show less and no more clicks: under it. A shrink keeps 1 and drops 2."""
    assert _exact(nonclk, click_coeff, show, click) == Fraction(str(threshold))
    assert _exact(nonclk, click_coeff, show - 1, min(click, show - 1)) < Fraction(str(threshold))
    ev = EvictionConfig(score_threshold=threshold, nonclk_coeff=nonclk, click_coeff=click_coeff)
    cfg = TableConfig("t", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0), eviction=ev)
    shard = Shard(ServerConfig(data_dir=str(tmp_path), flush_interval_s=3600))
    try:
        table = shard.create_table(cfg)
        ids = np.array([1, 2], np.uint64)
        shows = np.array([show, show - 1], np.float32)
        clicks = np.array([click, min(click, show - 1)], np.float32)
        shard.push("t", ids, np.ones((2, 2), np.float32), shows=shows, clicks=clicks)
        assert shard.shrink("t")["dropped"] == 1
        assert table.num_rows == 1
        np.testing.assert_array_equal(table.peek(ids)[:, :2], [[-1.0, -1.0], [0.0, 0.0]])  # 2: its initial row
    finally:
        shard.close()


@pytest.mark.parametrize(
    ("settings", "off"),
    [
        ({}, True),
        ({"nonclk_coeff": 0.2, "click_coeff": 2.0}, True),  # coefficients score ids, but no threshold drops any
        ({"ttl_steps": 5}, False),
        ({"score_threshold": 0.5}, False),
        ({"decay": 0.9}, False),
    ],
)
def test_eviction_is_off_without_a_ttl_a_threshold_or_a_decay_whatever_the_coefficients(settings, off):
    assert EvictionConfig(**settings).is_off is off

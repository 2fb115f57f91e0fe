"""Training against servers whose RAM tier holds a small part of the table: rows evicted to RocksDB and read back
must train exactly as rows kept in RAM, so the job ends with the same rows and the same AUC as with a large tier.

The oracle is the same job on servers with a tier that holds everything: one worker, seeded data and initializers
and prefetched rows corrected by the rows the pushes return make training deterministic, so the final rows are
compared bit for bit (benchmarks/small_tier.py measures the speed of the same comparison on the demo's data).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from worker.client import Client
from worker.cluster import LocalCluster
from worker.job import prepare
from worker.train import train
from worker.train_config import TrainConfig

TINY_TIER = "128K"  # a few hundred rows of the FM table (dim 9, Adagrad) per server, of about 3,600 (with the
# logit bias's table: two tables, each share at least 256 rows)
LARGE_TIER = "1G"
CONFIG = TrainConfig(model="fm", synthetic_rows=4000, synthetic_eval_rows=1000, recipe="large", batch_size=256,
                     progress=False)  # fmt: skip


def _train_on(tier: str, ids: np.ndarray) -> tuple[dict, np.ndarray, list]:
    """(the job's results, the final rows of ids, each server's stats of the table) on 2 servers with --cache-bytes
    tier."""
    with LocalCluster(2, extra_args=["--cache-bytes", tier]) as cluster:
        cfg = dataclasses.replace(CONFIG, servers=tuple(cluster.addresses))
        results = train(cfg)
        with Client(cluster.addresses) as client:
            stats = [next(t for t in s.tables if t.name == "fm") for s in client.stats()]
            rows = client.pull("fm", ids)
    return results, rows, stats


def test_a_ram_tier_smaller_than_the_table_trains_the_same_rows_as_a_large_one():
    _, data, _, _ = prepare(dataclasses.replace(CONFIG, local_shards=2))
    ids = np.unique(np.concatenate([field.ids.ravel() for b in data.train() for field in b.fields.values()]))
    small, small_rows, small_stats = _train_on(TINY_TIER, ids)
    large, large_rows, large_stats = _train_on(LARGE_TIER, ids)

    for s, g in zip(small_stats, large_stats, strict=True):
        assert s.num_rows == g.num_rows > 2 * s.rows_in_ram  # the table is larger than the tiny tier
        assert s.evictions > 0 and s.cache_misses > g.cache_misses  # rows were dropped and read back
        assert g.evictions == 0
    assert small["train_examples"] == large["train_examples"] == 4000
    np.testing.assert_array_equal(small_rows, large_rows)
    assert small["eval_auc"] == large["eval_auc"] and small["eval_logloss"] == large["eval_logloss"]
    assert large["eval_auc"] > 0.6  # the job learned something: equal rows are not just untouched ones

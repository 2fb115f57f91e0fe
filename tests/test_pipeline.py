"""worker.pipeline: prefetched (order, bounded look-ahead, errors raised at the consumer, early stop) and the
refresh of rows pulled ahead (RecentIds), which makes a run with prefetch train exactly as one without."""

from __future__ import annotations

import threading
import time

import pytest

import numpy as np

from worker.pipeline import RecentIds, prefetched


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_yields_every_batch_with_its_pull_in_order(depth):
    assert list(prefetched(range(10), lambda b: b * b, depth)) == [(b, b * b) for b in range(10)]


def test_pulls_at_most_depth_batches_ahead():
    pulled = []
    gen = prefetched(range(100), lambda b: pulled.append(b) or b, depth=2)
    next(gen)
    time.sleep(0.3)
    assert len(pulled) <= 1 + 2 + 1  # the one consumed, two queued, one waiting to be queued
    gen.close()


def test_an_error_in_a_pull_is_raised_at_that_batch():
    def pull(b):
        if b == 3:
            raise ConnectionError("server 1 is gone")
        return b

    got = []
    with pytest.raises(ConnectionError, match="server 1"):
        for batch, _ in prefetched(range(10), pull, depth=2):
            got.append(batch)
    assert got == [0, 1, 2]


def test_stopping_early_ends_the_thread():
    before = threading.active_count()
    for batch, _ in prefetched(iter(range(1000)), lambda b: b, depth=1):
        if batch == 2:
            break
    time.sleep(0.3)
    assert threading.active_count() == before


def test_recent_ids_marks_ids_of_the_last_pushes_only():
    recent = RecentIds(2)
    rng = np.random.default_rng(0)
    pushes = [np.unique(rng.integers(0, 100, 30).astype(np.uint64)) for _ in range(3)]
    for p in pushes:
        recent.add(p)
    ids = np.arange(100, dtype=np.uint64)
    expected = np.array([i in set(pushes[1].tolist()) | set(pushes[2].tolist()) for i in range(100)])
    np.testing.assert_array_equal(recent.stale(ids), expected)  # the first push fell out of the window
    assert not RecentIds(1).stale(ids).any()


@pytest.mark.parametrize("prefetch", [1, 3])
def test_training_with_prefetch_computes_with_exactly_the_rows_of_a_run_without(servers, tmp_path, prefetch):
    """The rows pulled ahead are refreshed where this worker's own recent pushes touched them, so a run with
    prefetch trains exactly the model of a run without (one worker; Zipf ids repeat from batch to batch)."""
    from worker.client import Client
    from worker.dense import DenseSync
    from worker.train import DataSource, TrainConfig, evaluate, make_backend, run_epochs, table_configs

    results = []
    for depth in (0, prefetch):
        cfg = TrainConfig(model="deepfm", hidden=(16,), synthetic_rows=6000, synthetic_eval_rows=2000,
                          batch_size=500, prefetch=depth, progress=False)  # fmt: skip
        addresses, _ = servers(2, root=tmp_path / f"prefetch-{depth}")
        with Client(addresses) as client:
            client.wait_ready()
            data = DataSource(cfg)
            spec = data.spec()
            backend = make_backend(spec, cfg)
            for t in table_configs(cfg, spec):
                client.create_table(t)
            dense = DenseSync(client, spec.dense_params())
            dense.pull()
            _, _, train_logloss = run_epochs(client, spec, backend, dense, data, cfg)
            results.append((train_logloss, evaluate(client, spec, backend, dense.pull(), data.eval())))
    assert results[0] == results[1]

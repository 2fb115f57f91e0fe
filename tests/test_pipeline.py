"""worker.pipeline.prefetched: order, bounded look-ahead, errors raised at the consumer, early stop."""

from __future__ import annotations

import threading
import time

import pytest

from worker.pipeline import prefetched


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

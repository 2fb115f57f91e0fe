"""worker.pipeline: prefetched (order, bounded look-ahead, errors raised at the consumer, early stop) and the
overlay of the rows the last pushes returned on rows pulled ahead (RecentRows), which makes a run with prefetch train exactly as one without."""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import threading
import time

import numpy as np
import pytest

from tests.waiting import wait_until
from worker import pipeline
from worker.pipeline import RecentRows, prefetched


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_yields_every_batch_with_its_pull_in_order(depth):
    assert list(prefetched(range(10), lambda b: b * b, depth)) == [(b, b * b) for b in range(10)]


def test_pulls_at_most_depth_batches_ahead(monkeypatch):
    pulled, full_at = [], []  # full_at: how many batches were pulled when the thread found the queue full

    class WatchedQueue(queue.Queue):
        def put(self, item, block=True, timeout=None):
            if self.full():
                full_at.append(len(pulled))
            super().put(item, block, timeout)

    monkeypatch.setattr(pipeline.queue, "Queue", WatchedQueue)
    gen = prefetched(range(100), lambda b: pulled.append(b) or b, depth=2)
    try:
        assert next(gen) == (0, 0)
        # batch 3 waits for room (1 and 2 fill the queue), and nothing more is pulled until the next batch is taken
        wait_until(lambda: 4 in full_at, 10, lambda: f"batch 3 to wait for room in the queue (pulled {pulled})")
        assert pulled == [0, 1, 2, 3]
        assert next(gen) == (1, 1)
        wait_until(lambda: 5 in full_at, 10, lambda: f"batch 4 to wait for room in the queue (pulled {pulled})")
        assert pulled == [0, 1, 2, 3, 4]
    finally:
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


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "prefetch"]


def test_stopping_early_ends_the_thread():
    # counts only prefetch threads: other tests' threads (gRPC's) may end meanwhile and change the total
    assert _prefetch_threads() == []
    batches = prefetched(iter(range(1000)), lambda b: b, depth=1)
    for batch, _ in batches:
        if batch == 0:
            assert len(_prefetch_threads()) == 1
        if batch == 2:
            break
    batches.close()  # what leaving a for loop over it does once the generator is collected
    wait_until(lambda: _prefetch_threads() == [], 10, "the prefetch thread to end")


def test_recent_rows_lays_the_newest_returned_row_over_each_id():
    recent = RecentRows(2)
    rng = np.random.default_rng(0)
    pushes = [np.unique(rng.integers(0, 100, 30).astype(np.uint64)) for _ in range(3)]
    for k, p in enumerate(pushes):
        recent.add(p, np.full((len(p), 2), float(k), np.float32))
    ids = np.arange(100, dtype=np.uint64)
    rows = np.full((100, 2), -1.0, np.float32)
    recent.overlay(ids, rows)
    newest = {}
    for k in (1, 2):  # the first push fell out of the window
        newest.update({i: float(k) for i in pushes[k].tolist()})
    np.testing.assert_array_equal(rows[:, 0], [newest.get(i, -1.0) for i in range(100)])
    np.testing.assert_array_equal(recent.covered(ids), [i in newest for i in range(100)])
    assert not RecentRows(1).covered(ids).any()


def _train(addresses, cfg, oracle: bool):
    """run_epochs, or (oracle) the plainest loop: pull every row, compute, push, dense step, clock."""
    from worker.batch import table_ids
    from worker.client import Client
    from worker.job import loop_settings, open_job
    from worker.loop import run_epochs
    from worker.scoring import evaluate, field_tables, model_inputs
    from worker.steprows import pull_rows

    with Client(addresses) as client:
        client.wait_ready()
        cfg, data, spec, backend, dense = open_job(cfg, client)
        if oracle:
            for batch in data.train():
                tids = table_ids(batch, field_tables(spec))
                rows = pull_rows(client, spec, tids)
                _, row_grads, dense_grads = backend.forward_backward(
                    model_inputs(spec, batch, tids, rows), dense.values, batch.labels
                )
                client.push_many([(t, ti.uniq, row_grads[t], ti.clicks, ti.shows) for t, ti in tids.items()])
                dense.step(dense_grads)
                client.advance_clock()
        else:
            run_epochs(client, spec, backend, dense, data.train, loop_settings(cfg, data))
        ids = np.unique(np.concatenate([bags.ids for b in data.eval() for bags in b.fields.values()]))
        return evaluate(client, spec, backend, dense.pull(), data.eval()), client.pull(cfg.model, ids)


def test_stages_closed_early_stop_their_threads_and_close_their_source():
    """Scoring chains two prefetched stages: closed part way through an endless source, both threads end and the
    source generator is closed (by the thread that ran it)."""
    closed = threading.Event()

    def endless():
        try:
            k = 0
            while True:
                yield k
                k += 1
        finally:
            closed.set()

    before = {t for t in threading.enumerate() if t.name == "prefetch"}
    chained = prefetched(prefetched(endless(), lambda b: -b, 2), lambda item: item[1] * 2, 2)
    assert [next(chained) for _ in range(3)] == [((0, 0), 0), ((1, -1), -2), ((2, -2), -4)]
    chained.close()
    wait_until(closed.is_set, 10, lambda: "the source to be closed")
    wait_until(lambda: not {t for t in threading.enumerate() if t.name == "prefetch"} - before, 10,
               lambda: "both stages' threads to end")  # fmt: skip


@pytest.mark.parametrize("depth", [0, 1])
def test_scoring_reads_and_pulls_the_next_batch_while_one_is_scored(depth):
    """predictions (eval, predict): with prefetch 1, batch k+1 is read and its rows pulled while batch k is
    scored (the backend's predict waits for that pull); with 0, each batch in turn. Either way the same
    probabilities, in order."""
    from worker.batch import Bags, Batch
    from worker.models.spec import FieldSpec, ModelSpec
    from worker.scoring import predictions

    spec = ModelSpec("lr", (FieldSpec("f", "lr", 1),), 0)
    pulled = [threading.Event() for _ in range(4)]

    class Tables:
        def pull_many(self, items):
            out = [np.asarray(ids, dtype=np.float32).reshape(-1, 1) for _, ids in items]
            pulled[int(items[0][1][0])].set()  # batch k holds the id k
            return out

    class Backend:
        def predict(self, inputs, dense_values):
            k = int(inputs.rows["lr"][0, 0])
            waited = pulled[k + 1].wait(timeout=0.5 if depth == 0 else 30) if k + 1 < len(pulled) else True
            return np.full(2, (k + 1) / 4 if waited else -1.0, dtype=np.float32)

    batches = (Batch(np.zeros(2), {"f": Bags.one_per_example(np.full(2, k, dtype=np.uint64))}) for k in range(4))
    probs = [p.tolist() for _, p in predictions(Tables(), spec, Backend(), {}, batches, prefetch=depth)]
    overlapped = [[0.25] * 2, [0.5] * 2, [0.75] * 2, [1.0] * 2]
    assert probs == (overlapped if depth else [[-1.0] * 2] * 3 + [[1.0] * 2])


def test_training_computes_with_exactly_the_rows_of_a_plain_pull_compute_push_loop(servers, tmp_path):
    """Rows pulled ahead (prefetch 1 and 3) or not (0), overlaid with the rows the last pushes returned: one
    worker trains exactly the model of the plainest loop (Zipf ids repeat from batch to batch, so a stale row
    would show)."""
    from worker.train_config import TrainConfig

    cfg = TrainConfig(model="deepfm", hidden=(16,), synthetic_rows=6000, synthetic_eval_rows=2000, batch_size=500,
                      synthetic_history=1.0, epochs=1, recipe="large", progress=False)  # fmt: skip
    runs = {}
    for label, depth in [("oracle", 0), ("0", 0), ("1", 1), ("3", 3)]:
        addresses, _ = servers(2, root=tmp_path / label)
        runs[label] = _train(addresses, dataclasses.replace(cfg, prefetch=depth), oracle=label == "oracle")
    want_metrics, want_rows = runs.pop("oracle")
    for label, (metrics, rows) in runs.items():
        assert metrics == want_metrics, label
        np.testing.assert_array_equal(rows, want_rows)


def test_a_sigterm_another_thread_receives_stops_a_consumer_waiting_for_a_batch():
    """The kernel may deliver SIGTERM to any thread: a consumer waiting for the next batch still raises Terminated
    while the pull it waits for goes on (a sync pull may wait out its barrier for minutes)."""
    from ps.terminate import Terminated, sigterm_raises

    release, taken, pulled = threading.Event(), threading.Event(), threading.Event()

    def pull(b):
        if b == 1:  # once the consumer waits for this batch, the signal lands on the prefetch thread; the pull holds
            taken.wait(60)
            time.sleep(0.5)
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            release.wait(20)
            pulled.set()
        return b

    with sigterm_raises(cleanup_limit_s=None):
        try:
            with pytest.raises(Terminated):
                for _ in prefetched(range(3), pull, depth=1):
                    taken.set()
            raised_while_the_pull_held = not pulled.is_set()
        finally:
            release.set()
    assert raised_while_the_pull_held


def test_sigterm_raises_puts_the_handler_before_it_back():
    """The block's SIGTERM handler is the caller's again after it, whether the block ended by itself or by a
    SIGTERM (not the SIG_IGN the first SIGTERM sets, so that a second one waits for the cleanup)."""
    from ps.terminate import Terminated, sigterm_raises

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with sigterm_raises(cleanup_limit_s=None):
            assert signal.getsignal(signal.SIGTERM) is not mine
        assert signal.getsignal(signal.SIGTERM) is mine  # the block ended with no signal
        with pytest.raises(Terminated), sigterm_raises(cleanup_limit_s=None):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)

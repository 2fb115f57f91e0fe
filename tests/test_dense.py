"""Dense parameters on the servers: every worker starts from the same initial values, gradients are summed
over --dense-sync-every steps and applied by the server's optimizer; with staleness k a background thread pushes
them, and the values of step s include every gradient of the steps before s - k."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from ps.config import OptimizerConfig
from ps.errors import JobConflictError
from ps.stamp import WorkerStamp
from tests.inprocess import InProcessTables
from tests.waiting import join_thread, wait_until
from worker.dense import MIN_BASE_RATE, DenseSync, start_logit_bias, table_config, table_name
from worker.models.spec import DenseParam, ModelSpec, uniform_fields
from worker.steprows import AsyncRows, ClockedRows

SGD1 = OptimizerConfig("sgd", 1.0)


def _tables(spec, optimizer=SGD1):
    tables = InProcessTables(cache_bytes=64 << 20)
    for p in spec.dense_params():
        tables.create_table(table_config(p, optimizer))
    return tables


def test_initial_values_are_glorot_or_zero_and_the_same_for_every_worker():
    spec = ModelSpec("dnn", uniform_fields(3, 4), num_dense=2, hidden=(8, 8))
    with _tables(spec) as tables:
        a, b = DenseSync(tables, spec.dense_params()).pull(), DenseSync(tables, spec.dense_params()).pull()
        for p in spec.dense_params():
            np.testing.assert_array_equal(a[p.name], b[p.name])
            assert a[p.name].shape == p.shape
            if p.init == "zeros":
                assert (a[p.name] == 0).all()
            else:
                assert np.abs(a[p.name]).max() <= p.glorot_scale and a[p.name].std() > p.glorot_scale / 4
        assert not np.array_equal(a["mlp.1.weight"], a["mlp.0.weight"][:8])  # equal shapes, different values


def test_gradients_are_summed_and_pushed_every_k_steps():
    spec = ModelSpec("dnn", uniform_fields(1, 2), num_dense=0, hidden=(3,))
    with _tables(spec) as tables:
        dense = DenseSync(tables, spec.dense_params(), sync_every=3)
        start = {k: v.copy() for k, v in dense.pull().items()}
        ones = {p.name: np.ones(p.shape, np.float32) for p in spec.dense_params()}
        dense.step(ones)
        dense.step(ones)
        assert dense.syncs == 0 and all(np.array_equal(dense.values[k], start[k]) for k in start)
        dense.step(ones)  # third step: push the sum (3 per entry); SGD lr 1 subtracts it
        assert dense.syncs == 1
        for k in start:
            np.testing.assert_allclose(dense.values[k], start[k] - 3.0, rtol=1e-6)
            np.testing.assert_allclose(tables.pull(table_name(spec.dense_params()[0]), np.arange(2)).shape, (2, 3))
        dense.step(ones)
        dense.flush()  # a partial window is pushed at the end of training
        assert dense.syncs == 2
        for k in start:
            np.testing.assert_allclose(dense.values[k], start[k] - 4.0, rtol=1e-6)


# ---- background pushes (staleness k > 0) ----------------------------------------------------------------------
STEPS = 40
PARAMS = [DenseParam("w", (2, STEPS), "glorot", "dnn"), DenseParam("b", (1, STEPS), "zeros", "dnn")]


class SgdTables:
    """Dense tables that start at zero and apply plain SGD with lr 1 (a push of g turns rows r into r - g),
    recording every push's gradients. A push waits for a permit of `gate` (if given) after a random delay of up
    to delay_s, then raises `fail` (if given)."""

    def __init__(self, delay_s: float = 0.0, gate: threading.Semaphore | None = None, fail: Exception | None = None):
        self.rows = {table_name(p): np.zeros(p.shape, np.float32) for p in PARAMS}
        self.pushes: list[dict[str, np.ndarray]] = []
        self.started = 0  # pushes begun
        self.delay_s, self.gate, self.fail = delay_s, gate, fail
        self.rng = np.random.default_rng(0)

    def pull_many(self, items):
        return [self.rows[t][ids.astype(np.int64)].copy() for t, ids in items]

    def push_many(self, items, advance_clock=0, return_rows=False, add_delta=False):
        assert return_rows and not add_delta and advance_clock == 0
        self.started += 1
        time.sleep(self.rng.uniform(0, self.delay_s))
        if self.gate is not None:
            assert self.gate.acquire(timeout=10), "the test never released this push"
        if self.fail is not None:
            raise self.fail
        self.pushes.append({t: g.copy() for t, _, g, *_ in items})
        for t, ids, g, *_ in items:
            self.rows[t][ids.astype(np.int64)] -= g
        return self.pull_many([(t, ids) for t, ids, *_ in items])


def step_grads(s: int) -> dict[str, np.ndarray]:
    """Step s's gradients: -1 in column s, so a value of 1 in column s says step s is applied."""
    out = {p.name: np.zeros(p.shape, np.float32) for p in PARAMS}
    for g in out.values():
        g[:, s] = -1.0
    return out


def applied_steps(values: dict[str, np.ndarray]) -> np.ndarray:
    """The steps whose gradients values include (every parameter agreeing)."""
    cols = [v == 1.0 for v in values.values()]
    assert all(((v == 0.0) | (v == 1.0)).all() for v in values.values())
    assert all((c == cols[0][0]).all() for c in cols)
    return np.flatnonzero(cols[0][0])


@pytest.mark.parametrize("staleness", [1, 3])
def test_the_values_of_step_s_include_every_step_before_s_minus_k(staleness):
    tables = SgdTables(delay_s=0.003)
    dense = DenseSync(tables, PARAMS, staleness=staleness)
    assert not dense.inline
    dense.pull()
    lags = []
    for s in range(STEPS):
        applied = applied_steps(dense.values)  # what step s computes with
        assert set(range(s - staleness)) <= set(applied) and set(applied) <= set(range(s)), (s, applied)
        lags.append(s - len(applied))
        dense.step(step_grads(s))
    dense.flush()
    assert list(applied_steps(dense.values)) == list(range(STEPS))
    assert list(applied_steps({p.name: tables.rows[table_name(p)] for p in PARAMS})) == list(range(STEPS))
    assert dense.syncs == len(tables.pushes) and max(lags) <= staleness
    dense.close()
    dense.close()


def first_push_held(staleness: int) -> tuple[threading.Semaphore, SgdTables, DenseSync]:
    """(gate, tables, dense): a DenseSync of staleness whose step 0's push has begun and waits at the gate."""
    gate = threading.Semaphore(0)
    tables = SgdTables(gate=gate)
    dense = DenseSync(tables, PARAMS, staleness=staleness)
    dense.pull()
    dense.step(step_grads(0))
    wait_until(lambda: tables.started == 1, 10, "the push of step 0")
    return gate, tables, dense


def test_a_step_blocks_past_k_unapplied_steps_and_the_pending_steps_go_in_one_push():
    gate, tables, dense = first_push_held(staleness=2)
    dense.step(step_grads(1))  # 2 steps unapplied: returns
    third = threading.Thread(target=dense.step, args=(step_grads(2),))
    third.start()
    third.join(0.3)
    assert third.is_alive()  # 3 unapplied > 2
    gate.release()  # step 0's push returns
    join_thread(third, 10, "step 2, once step 0 was applied")
    assert list(applied_steps(dense.values)) == [0]
    gate.release()
    dense.flush()
    assert list(applied_steps(dense.values)) == [0, 1, 2]
    merged = tables.pushes[1]["dense.dnn.w"]
    assert len(tables.pushes) == 2 and dense.syncs == 2
    np.testing.assert_array_equal(np.flatnonzero(merged[0]), [1, 2])  # steps 1 and 2 in one push
    dense.close()


def test_an_error_of_the_thread_is_raised_by_the_next_step_and_by_flush():
    gate = threading.Semaphore(0)
    dense = DenseSync(SgdTables(gate=gate, fail=ConnectionError("server 1 is gone")), PARAMS, staleness=1)
    dense.pull()
    dense.step(step_grads(0))  # returns at once: its push is held at the gate, and 1 step may be unapplied
    gate.release()  # now it fails
    with pytest.raises(ConnectionError, match="server 1 is gone"):
        dense.step(step_grads(1))  # 2 unapplied > 1, and the push of step 0 failed
    with pytest.raises(ConnectionError, match="server 1 is gone"):
        dense.flush()
    dense.close()
    with pytest.raises(ConnectionError):
        dense.step(step_grads(2))


def test_close_waits_a_bounded_time_for_a_push_in_flight_then_leaves_it():
    """A stopping worker whose dense push retries against a shard that does not answer is not held by it."""
    gate, _, dense = first_push_held(staleness=1)
    thread = dense._thread
    started = time.monotonic()
    dense.close(wait_s=0.5)
    assert time.monotonic() - started < 5 and thread.is_alive() and thread.daemon
    gate.release()  # the push returns; the thread sees close() and ends
    join_thread(thread, 10, "the dense-push thread, once its push returned")


def test_background_pushes_reach_the_servers_optimizer():
    spec = ModelSpec("dnn", uniform_fields(1, 2), num_dense=0, hidden=(3,))
    with _tables(spec) as tables:
        dense = DenseSync(tables, spec.dense_params(), staleness=2)
        start = {k: v.copy() for k, v in dense.pull().items()}
        for _ in range(7):
            dense.step({p.name: np.ones(p.shape, np.float32) for p in spec.dense_params()})
        dense.flush()
        assert 1 <= dense.syncs <= 7
        for p in spec.dense_params():
            np.testing.assert_allclose(dense.values[p.name], start[p.name] - 7.0, rtol=1e-6)
            np.testing.assert_allclose(dense.pull()[p.name], start[p.name] - 7.0, rtol=1e-6)
        dense.close()
        with pytest.raises(RuntimeError, match="after close"):
            dense.step({p.name: np.ones(p.shape, np.float32) for p in spec.dense_params()})


JOB, OTHER = 0xA51C, 0xB0B


def _async_stamp(job: int) -> WorkerStamp:
    return WorkerStamp(job, 0, 1, 0, barrier_timeout_s=30.0, setup="mode=async model=dnn", unclocked=True)


def _held_by_job(tables, spec: ModelSpec) -> None:
    """JOB's MLP tables made, stamped: JOB holds the shard."""
    for p in spec.dense_params():
        tables.shard.create_table(table_config(p, SGD1), stamp=_async_stamp(JOB))


def _dense_of(job: int, tables, spec: ModelSpec, **settings) -> DenseSync:
    """An async worker's DenseSync of the job, with settings (staleness, sync_every)."""
    return DenseSync(tables, spec.dense_params(), source=AsyncRows(tables, spec, 0, _async_stamp(job)), **settings)


def test_a_second_jobs_background_push_is_refused_while_the_first_holds_the_shard():
    """--dense-staleness > 0: the MLP's background pushes carry the job's stamp, as the step's pushes do: job
    OTHER's is refused while JOB (its tables made, no push yet) holds the shard, and changes nothing. The refusal
    reaches the loop through the step itself (when the thread's push failed before the step's wait ended) or the
    flush after it."""
    spec = ModelSpec("dnn", uniform_fields(1, 2), num_dense=0, hidden=(3,))
    ones = {p.name: np.ones(p.shape, np.float32) for p in spec.dense_params()}
    with InProcessTables(cache_bytes=64 << 20) as tables:
        _held_by_job(tables, spec)
        other = _dense_of(OTHER, tables, spec, staleness=1)
        start = {k: v.copy() for k, v in other.pull().items()}
        with pytest.raises(JobConflictError, match=rf"holds job {JOB} .* of job {OTHER} .*nothing was applied"):
            other.step(ones)
            other.flush()
        other.close()
        mine = _dense_of(JOB, tables, spec, staleness=1)
        for k, v in mine.pull().items():
            np.testing.assert_array_equal(v, start[k])  # nothing of OTHER's push
        mine.step(ones)
        mine.flush()
        for k, v in mine.pull().items():
            np.testing.assert_allclose(v, start[k] - 1.0, rtol=1e-6)
        assert tables.shard.stats()["job"] == JOB
        mine.close()


def test_a_second_jobs_steps_since_the_last_sync_are_refused_at_flush_while_the_first_holds_the_shard():
    """--dense-staleness 0 --dense-sync-every 3: flush() (a validation's, the run's end) pushes the steps added
    since the last sync apart from a step's push, with the job's stamp: job OTHER's is refused while JOB holds the
    shard, and changes nothing; JOB's own is applied."""
    spec = ModelSpec("dnn", uniform_fields(1, 2), num_dense=0, hidden=(3,))
    ones = {p.name: np.ones(p.shape, np.float32) for p in spec.dense_params()}
    with InProcessTables(cache_bytes=64 << 20) as tables:
        _held_by_job(tables, spec)
        other = _dense_of(OTHER, tables, spec, sync_every=3)
        start = {k: v.copy() for k, v in other.pull().items()}
        other.step(ones)  # not a sync: added
        with pytest.raises(JobConflictError, match=rf"holds job {JOB} .* of job {OTHER} .*nothing was applied"):
            other.flush()
        mine = _dense_of(JOB, tables, spec, sync_every=3)
        for k, v in mine.pull().items():
            np.testing.assert_array_equal(v, start[k])  # nothing of OTHER's push
        mine.step(ones)
        mine.step(ones)
        mine.flush()
        assert mine.syncs == 1
        for k, v in mine.pull().items():
            np.testing.assert_allclose(v, start[k] - 2.0, rtol=1e-6)
        assert tables.shard.stats()["job"] == JOB


def test_an_ssp_workers_background_push_is_stamped_and_moves_no_clock(servers):
    """ssp: the MLP's background push carries the worker's stamp marked apart, so its clock stays where the step's
    pushes put it; one given before the first step's push is sent at once, holds the shard for the job, and moves
    no clock (a clock of 1 would say step 0's rows are applied before they are)."""
    from worker.client import Client

    addresses, (server,) = servers(1)
    clocks = server.shard.jobs
    ones = {p.name: np.ones(p.shape, np.float32) for p in PARAMS}
    with Client(addresses, timeout_s=30) as client:
        for p in PARAMS:
            client.create_table(table_config(p, SGD1))
        source = ClockedRows(client, None, WorkerStamp(JOB, 0, 2, 0, staleness=1, barrier_timeout_s=30.0))
        dense = DenseSync(client, PARAMS, staleness=1, source=source)
        start = {k: v.copy() for k, v in dense.pull().items()}
        dense.step(ones)  # step 0's MLP push, before step 0's push
        wait_until(lambda: dense.syncs == 1, 10, "the background push, sent before the worker's first step")
        assert clocks.job == JOB and clocks._clocks == [0, 0] and dense.syncs == 1
        source.push(0, {}, {}, [])  # step 0's push (no rows: a batch of no ids), answered
        assert clocks._clocks == [1, 0]
        for s in (1, 2):
            source.push(s, {}, {}, [])
        dense.step(ones)
        dense.flush()
        assert clocks._clocks == [3, 0] and dense.syncs == 2
        for k, v in dense.pull().items():
            np.testing.assert_allclose(v, start[k] - 2.0, rtol=1e-6)
        dense.close()


def test_staleness_is_checked():
    assert DenseSync(None, PARAMS).inline
    with pytest.raises(ValueError, match="--dense-staleness is -1"):
        DenseSync(None, PARAMS, staleness=-1)
    with pytest.raises(ValueError, match="--dense-sync-every 1"):
        DenseSync(None, PARAMS, sync_every=4, staleness=2)


def test_the_logit_bias_of_a_new_model_starts_at_the_labels_log_odds_once(servers, tmp_path):
    """Started once, by an add-delta push that leaves the optimizer's state as it was, however many workers send
    it (here at once, from two clients); a model with trained rows, or whose bias moved, keeps its own; rates of 0
    and 1 are clipped, not infinite. (In-process shards: the clients reach them through gRPC all the same.)"""
    from worker.client import Client

    spec = ModelSpec("lr", uniform_fields(3, 1), num_dense=0)
    params = spec.dense_params()
    addresses, _ = servers(2)
    with Client(addresses) as a, Client(addresses) as b:
        for p in params:
            a.create_table(table_config(p, OptimizerConfig("adam", 0.001)))
        a.create_table(table_config(DenseParam("scratch", (4, 2), "zeros", "lr"), SGD1))
        ids, deltas = np.arange(4, dtype=np.uint64), np.ones((4, 2), np.float32)
        assert a.push_once("dense.lr.scratch", ids, deltas, key=12345) == 4  # applied, then never again:
        assert b.push_once("dense.lr.scratch", ids, deltas, key=12345) == 0  # another client under the key
        assert a.push_once("dense.lr.scratch", ids, deltas, key=12345) == 0
        np.testing.assert_array_equal(a.pull("dense.lr.scratch", ids), deltas)
        assert start_logit_bias(a, params, 20, 1000, trained_rows=3) is None  # not a new model
        results = []
        both = [threading.Thread(target=lambda c=c: results.append(start_logit_bias(c, params, 20, 1000, 0)))
                for c in (a, b)]  # fmt: skip
        for t in both:
            t.start()
        for t in both:
            join_thread(t, 30, "a start")
        started = [r for r in results if r is not None]
        assert len(started) == 1 and started[0] == pytest.approx(np.log(0.02 / 0.98), abs=1e-6)
        value = DenseSync(a, params).pull()["logit.bias"][0, 0]
        assert value == np.float32(np.log(0.02 / 0.98))  # applied once, not twice
        assert start_logit_bias(b, params, 500, 1000, 0) is None  # moved: kept
        assert DenseSync(b, params).pull()["logit.bias"][0, 0] == value
    for positives, want in (
        (0, np.log(MIN_BASE_RATE / (1 - MIN_BASE_RATE))),
        (7, -np.log(MIN_BASE_RATE / (1 - MIN_BASE_RATE))),
    ):
        with Client(servers(1, root=tmp_path / str(positives))[0]) as c:
            for p in params:
                c.create_table(table_config(p))
            assert start_logit_bias(c, params, positives, 7, 0) == pytest.approx(want, abs=1e-5)
            assert start_logit_bias(c, params, 0, 0, 0) is None


def test_push_once_of_a_sync_or_ssp_worker_holds_every_shard_for_its_job_moving_no_clock(servers):
    """A logit-bias start with a clocked stamp (sync included) is sent apart: every shard takes it for the job,
    once, and no clock moves; the worker's step 0 then moves every shard's min_clock to 1."""
    from ps.config import InitializerConfig, TableConfig
    from worker.client import Client

    addresses, _ = servers(2)
    ids, deltas = np.arange(8, dtype=np.uint64), np.ones((8, 1), np.float32)
    for sync in (False, True):
        stamp = WorkerStamp(0x51 + sync, 0, 1, 0, staleness=0 if sync else 1, sync=sync, barrier_timeout_s=30.0)
        with Client(addresses) as client:
            name = f"bias{int(sync)}"
            cfg = TableConfig(name=name, dim=1, initializer=InitializerConfig("zeros"), optimizer=SGD1)
            client.create_table(cfg, stamp=stamp)
            assert client.push_once(name, ids, deltas, key=99 + sync, stamp=stamp) == 8
            assert client.push_once(name, ids, deltas, key=99 + sync, stamp=stamp) == 0
            assert [(s.job, s.min_clock) for s in client.stats()] == [(stamp.job, 0)] * 2
            client.push_many([(name, ids, deltas)], advance_clock=1, stamp=stamp)  # step 0: 1 - 1 with SGD1
            assert [s.min_clock for s in client.stats()] == [1, 1]
            np.testing.assert_array_equal(client.pull(name, ids), np.zeros((8, 1), np.float32))
            client.finish(replace(stamp, acked=1))


def test_push_once_split_into_chunks_applies_every_chunk_once(servers):
    """A push_once larger than the client's message size goes to each shard as one request of several pushes:
    every id is applied, once."""
    from ps.config import InitializerConfig, TableConfig
    from worker.client import Client

    addresses, _ = servers(2)
    ids, deltas = np.arange(40, dtype=np.uint64), np.ones((40, 2), np.float32)
    with Client(addresses, max_request_bytes=200) as client:  # ~12 ids a message: several per shard
        client.create_table(TableConfig(name="once", dim=2, initializer=InitializerConfig("zeros")))
        assert client.push_once("once", ids, deltas, key=777) == 40
        assert client.push_once("once", ids, deltas, key=777) == 0
        np.testing.assert_array_equal(client.pull("once", ids), deltas)

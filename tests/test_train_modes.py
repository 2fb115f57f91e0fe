"""Training modes end to end on real servers: sync equals one worker at the summed batch; ssp never serves a pull
past its staleness bound; geo and ssp train; a worker that stops early lets the others finish."""

from __future__ import annotations

import dataclasses
import math
import re
import threading
import time

import numpy as np
import pytest

from ps.errors import PsError
from worker.client import Client
from worker.job import loop_settings, open_job
from worker.model_tables import table_configs
from worker.step import Step
from worker.synthetic import SyntheticConfig
from worker.synthetic_files import write_synthetic
from worker.train_config import TrainConfig


def _run_worker(addresses, cfg: TrainConfig, slow_s: float = 0.0) -> dict:
    """One worker's run_epochs, as `ps-worker train` runs it (its validation set too); returns the loop's result and
    its tables view."""
    from worker.loop import run_epochs
    from worker.row_source import row_source

    with Client(addresses, timeout_s=30) as client:
        client.wait_ready()
        cfg, data, spec, backend, dense = open_job(cfg, client)
        if slow_s:
            compute = backend.forward_backward

            def slowly(*args):
                time.sleep(slow_s)
                return compute(*args)

            backend.forward_backward = slowly
        tables = table_configs(cfg, spec, data.schema.table_overrides())
        source = row_source(cfg, client, spec, tables)
        result = run_epochs(
            client, spec, backend, dense, data.train, loop_settings(cfg, data), data.validation(), source=source
        )
        return {"result": result, "spec": spec, "data": data}


def _run_all(run, cfgs: list) -> list:
    """run(cfg) for each of cfgs on its own thread; their results, or the first failure re-raised."""
    out: list = [None] * len(cfgs)
    errors: list = []

    def one(i):
        try:
            out[i] = run(cfgs[i])
        except BaseException as e:  # handed to the test
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cfgs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a worker still runs after 300 s"
    if errors:
        raise errors[0]
    return out


def _run_job(addresses, cfgs: list[TrainConfig], slow: dict | None = None) -> list[dict]:
    """Runs one worker per config on threads (_run_all); slow: {worker index: seconds added to each step}."""
    slow = slow or {}
    return _run_all(lambda job: _run_worker(addresses, job[1], slow.get(job[0], 0.0)), list(enumerate(cfgs)))


def _model(addresses, cfg: TrainConfig, path) -> tuple[np.ndarray, dict]:
    """The rows of every id in the data file and the dense parameters, as the servers hold them."""
    from worker.batch import table_ids
    from worker.dense import DenseSync
    from worker.scoring import field_tables

    with Client(addresses) as client:
        cfg, data, spec, _, _ = open_job(dataclasses.replace(cfg, worker_id=0, num_workers=1, batch_size=4096), client)
        ids = np.unique(np.concatenate([table_ids(b, field_tables(spec))[cfg.model].uniq for b in data.train()]))
        dense = DenseSync(client, spec.dense_params()).pull()
        return client.pull(cfg.model, ids), {k: v.copy() for k, v in dense.items()}


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "train.txt"
    write_synthetic(path, SyntheticConfig(rows=3200, seed=3))
    return str(path)


@pytest.mark.parametrize("dense_l2", [0.0, 0.5])
def test_sync_two_workers_train_the_model_of_one_worker_at_the_summed_batch(servers, tmp_path, data_file, dense_l2):
    """2 workers at batch 32 (the file's lines dealt round-robin) in sync mode leave the rows and the MLP where one
    worker at batch 64 leaves them after the same 50 steps, with the default optimizers (Adagrad, Adam): the servers
    sum each step's pushes before their optimizers see them. With --dense-l2 the sum holds l2 * W once, as the one
    worker's step does."""
    base = TrainConfig(data=data_file, model="deepfm", hidden=(16, 8), recipe="large", epochs=1, progress=False,
                       validation_fraction=0.0, synthetic_eval_rows=0, prefetch=1, dense_l2=dense_l2)  # fmt: skip
    solo = _two_sync_workers_train_as_one(servers, tmp_path, data_file, base, job_id=7)
    assert solo.steps == 50


def _two_sync_workers_train_as_one(servers, tmp_path, data_file, base: TrainConfig, job_id: int):
    """Runs base as one worker at batch 64 and as 2 sync workers at batch 32, on clusters of their own, and checks
    that both leave the same rows and MLP; returns the one worker's result."""
    one, _ = servers(2, root=tmp_path / "one")
    [solo] = _run_job(one, [dataclasses.replace(base, batch_size=64)])
    two, _ = servers(2, root=tmp_path / "two")
    sync = dataclasses.replace(base, batch_size=32, mode="sync", num_workers=2, job_id=job_id)
    runs = _run_job(two, [dataclasses.replace(sync, worker_id=i) for i in range(2)])
    assert [r["result"].steps for r in runs] == [solo["result"].steps] * 2
    want_rows, want_dense = _model(one, base, data_file)
    got_rows, got_dense = _model(two, base, data_file)
    assert np.abs(want_rows).max() > 0.01  # trained: the initial rows are within 0.01
    # float32 sums in another order (two partial sums, then their sum) differ in the last bits: atol 1e-6
    np.testing.assert_allclose(got_rows, want_rows, rtol=1e-5, atol=1e-6)
    for name, want in want_dense.items():
        np.testing.assert_allclose(got_dense[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    return solo["result"]


def test_sync_with_dense_sync_every_leaves_the_mlp_of_one_worker_at_the_summed_batch(servers, tmp_path, data_file):
    """--dense-sync-every 3 with a validation every 7 steps (on a file) and 50 steps: the MLP's steps since its last
    sync, before each validation and at the end, go in one summed step of the workers (Adam steps once on their
    sum), so 2 sync workers at batch 32 leave the model one worker at batch 64 leaves."""
    validation = tmp_path / "validation.txt"
    write_synthetic(validation, SyntheticConfig(rows=200, seed=4))
    base = TrainConfig(data=data_file, model="deepfm", hidden=(16, 8), recipe="large", epochs=1, progress=False,
                       validation_data=str(validation), eval_every=7, early_stop=0, synthetic_eval_rows=0,
                       prefetch=1, dense_sync_every=3)  # fmt: skip
    solo = _two_sync_workers_train_as_one(servers, tmp_path, data_file, base, job_id=17)
    assert solo.steps == 50 and len(solo.curve) == 8  # steps 7, 14, .., 49 and the epoch's end


def test_sync_differs_from_async_so_the_comparison_above_can_fail(servers, tmp_path, data_file):
    base = TrainConfig(data=data_file, model="fm", recipe="large", epochs=1, progress=False, batch_size=32,
                       validation_fraction=0.0, synthetic_eval_rows=0, num_workers=2, job_id=9)  # fmt: skip
    one, _ = servers(2, root=tmp_path / "one")
    _run_job(one, [dataclasses.replace(base, batch_size=64, num_workers=1)])
    two, _ = servers(2, root=tmp_path / "two")
    _run_job(two, [dataclasses.replace(base, worker_id=i) for i in range(2)])
    want, _ = _model(one, base, data_file)
    got, _ = _model(two, base, data_file)
    assert not np.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ssp_no_pull_is_served_past_the_staleness_bound(servers, tmp_path, data_file):
    """One worker is slowed down; the fast one runs ahead until the bound stops it: every shard saw a clock gap of
    exactly k at most, and reached it."""
    k = 2
    addresses, started = servers(2)
    cfg = TrainConfig(data=data_file, model="fm", recipe="large", epochs=1, progress=False, batch_size=64,
                      validation_fraction=0.0, synthetic_eval_rows=0, num_workers=2, job_id=11, mode="ssp",
                      staleness=k, row_cache_bytes=0)  # fmt: skip
    runs = _run_job(addresses, [dataclasses.replace(cfg, worker_id=i) for i in range(2)], slow={1: 0.03})
    assert [r["result"].steps for r in runs] == [25, 25]
    gaps = [s.shard.jobs.max_gap for s in started]
    assert max(gaps) == k, gaps


def test_ssp_row_cache_serves_rows_within_the_bound(servers, tmp_path, data_file):
    addresses, started = servers(2)
    cfg = TrainConfig(data=data_file, model="fm", recipe="large", epochs=2, progress=False, batch_size=64,
                      validation_fraction=0.0, synthetic_eval_rows=0, num_workers=2, job_id=13, mode="ssp",
                      staleness=4, row_cache_bytes=8 << 20)  # fmt: skip
    runs = _run_job(addresses, [dataclasses.replace(cfg, worker_id=i) for i in range(2)])
    for r in runs:
        stats = r["result"].source_stats
        assert 0 < stats["cache_hit_rate"] < 1, stats
        assert stats["cache_bytes_saved"] > 0
    assert max(s.shard.jobs.max_gap for s in started) <= 4


@pytest.mark.parametrize("mode", ["geo", "ssp", "async"])
def test_two_workers_train_in_every_mode(servers, tmp_path, mode):
    """Each mode learns the planted model on a small sample (the oracle comparison at scale is
    benchmarks/train_modes.py)."""
    from worker.scoring import evaluate

    addresses, _ = servers(2)
    cfg = TrainConfig(model="fm", recipe="large", epochs=1, progress=False, batch_size=256, synthetic_rows=40_000,
                      synthetic_eval_rows=5000, num_workers=2, job_id=17, mode=mode,
                      staleness=4 if mode == "ssp" else None, geo_every=4 if mode == "geo" else None)  # fmt: skip
    runs = _run_job(addresses, [dataclasses.replace(cfg, worker_id=i) for i in range(2)])
    assert sum(r["result"].examples for r in runs) == 40_000
    with Client(addresses) as client:
        cfg, data, spec, backend, dense = open_job(dataclasses.replace(cfg, worker_id=0), client)
        figures = evaluate(client, spec, backend, dense.pull(), data.eval())
    assert figures["eval_auc"] > 0.70, figures
    assert figures["oracle_auc"] - figures["eval_auc"] < 0.035, figures  # async and geo ~0.022 here


def _small_mlp_run(addresses: list[str], data_file: str, **settings) -> TrainConfig:
    """One epoch of a small MLP (dnn, hidden 4) on data_file in batches of 200, no validation split, with settings."""
    base = dict(servers=tuple(addresses), data=data_file, model="dnn", hidden=(4,), recipe="large", progress=False,
                batch_size=200, epochs=1, validation_fraction=0.0, synthetic_eval_rows=0)  # fmt: skip
    return TrainConfig(**{**base, **settings})


def test_a_second_async_job_is_refused_while_one_trains_and_an_async_and_a_geo_worker_of_one_job_stop(
    servers, data_file
):
    """`train` run twice on one cluster: the second job's first push is refused (FAILED_PRECONDITION, naming both
    jobs) and the first trains on to its end; then a job whose worker 0 runs async and worker 1 geo stops, both
    workers naming the mode. A job whose workers all finished frees the shards at once."""
    from ps.errors import InvalidArgumentError, JobConflictError

    addresses, _ = servers(2)
    cfg = TrainConfig(data=data_file, model="fm", recipe="large", epochs=1, progress=False, batch_size=200,
                      validation_fraction=0.0, synthetic_eval_rows=0, job_id=31)  # fmt: skip
    first = threading.Thread(target=lambda: out.append(_run_worker(addresses, cfg, slow_s=0.3)))
    out: list = []
    first.start()
    with Client(addresses) as client:
        deadline = time.monotonic() + 120
        while not all(s.job == 31 for s in client.stats()):  # its first push (after its kernels compile)
            assert time.monotonic() < deadline and first.is_alive(), "job 31 never pushed"
            time.sleep(0.05)
    with pytest.raises(JobConflictError, match=r"holds job 31 \(--mode async.* so worker 0 of job 32 "):
        _run_worker(addresses, dataclasses.replace(cfg, job_id=32))
    first.join(timeout=120)
    assert out and out[0]["result"].examples == 3200  # job 31 trained all of its data
    mixed = [dataclasses.replace(cfg, job_id=33, num_workers=2, worker_id=0),
             dataclasses.replace(cfg, job_id=33, num_workers=2, worker_id=1, mode="geo", geo_every=2)]  # fmt: skip
    errors: list = [None, None]

    def run(i):
        try:
            _run_worker(addresses, mixed[i], slow_s=0.2)
        except Exception as e:  # the test looks at both
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for e in errors:
        assert isinstance(e, InvalidArgumentError), e
        assert re.search(r"job 33 stops: .*'mode' '(async|geo)' \(the job's: '(geo|async)'\)", str(e)), e


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_a_run_whose_mlp_pushes_in_the_background_frees_the_shards_at_its_end(servers, data_file, mode, monkeypatch):
    """--dense-staleness 1: the MLP's background pushes carry the job's stamp, and all of them are sent before the
    worker says it is done (an async one after it would mark the worker running again, so the job would hold the
    shard for its barrier timeout; an ssp one would be refused as a done worker's): the next job trains at once.
    Each background push is slowed, so that the last one is still pending when the training loop ends."""
    from worker.steprows import AsyncRows, ClockedRows
    from worker.train import train

    source = AsyncRows if mode == "async" else ClockedRows
    push_apart = source.push_apart

    def slowly(self, items):
        time.sleep(0.1)
        return push_apart(self, items)

    monkeypatch.setattr(source, "push_apart", slowly)

    addresses, _ = servers(1)
    cfg = _small_mlp_run(addresses, data_file, mode=mode, dense_staleness=1)
    for job_id in (51, 52):
        assert train(dataclasses.replace(cfg, job_id=job_id))["dense_syncs"] > 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_mlps_steps_since_its_last_sync_go_with_the_step_before_each_validation_and_the_end(servers, data_file,
                                                                                                 mode, monkeypatch):  # fmt: skip
    """--dense-sync-every 3: the step before each validation (every 5 steps, and at the epoch's end: a run of 16
    steps, so syncs in steps 3, 5, 8, 10, 13, 15 and 16) and the run's last step (without validation: syncs in 3,
    6, .. 15 and 16) push the MLP's steps since its last sync with their own push, stamped as a step's (a sync
    job's as the step's contribution), so no MLP push goes apart from a step's; the next job trains at once."""
    from worker.train import train

    pushes, push_many = [], Client.push_many

    def recorded(self, items, *args, **kwargs):
        pushes.append(([item[0] for item in items], kwargs.get("stamp")))
        return push_many(self, items, *args, **kwargs)

    monkeypatch.setattr(Client, "push_many", recorded)
    addresses, _ = servers(1)
    cfg = _small_mlp_run(
        addresses, data_file, batch_size=180, validation_fraction=0.1, mode=mode, dense_sync_every=3, eval_every=5
    )
    for job_id, changes, syncs in (
        (81, {}, 7),
        (82, {"batch_size": 200, "validation_fraction": 0.0, "eval_every": 0}, 6),
    ):
        pushes.clear()
        result = train(dataclasses.replace(cfg, job_id=job_id, **changes))
        steps = math.ceil(result["train_examples"] / (changes or {"batch_size": 180})["batch_size"])
        mlp = [(tables, stamp) for tables, stamp in pushes if any(t.startswith("dense.") for t in tables)]
        assert steps == 16 and result["dense_syncs"] == syncs and len(mlp) == syncs
        assert all(not t.startswith("dense.") for tables, _ in mlp for t in tables[:1])  # with the step's rows
        assert all(stamp is not None and stamp.job == job_id and stamp.sync == (mode == "sync") for _, stamp in mlp)
    assert train(dataclasses.replace(cfg, job_id=83))["dense_syncs"] > 0


def test_a_run_that_fails_with_mlp_pushes_in_the_background_frees_the_shards_at_once(servers, data_file, monkeypatch):
    """--dense-staleness 1, async: a run that fails mid-training ends the MLP's background pushes before it tells
    the shards it stopped (one applied after the stop would mark its worker running again, and the shard would hold
    its job for the barrier timeout): the next job trains at once. Each background push is slowed, so that one is
    in flight when the run fails."""
    from worker.steprows import AsyncRows
    from worker.train import train

    push_apart, push = AsyncRows.push_apart, AsyncRows.push

    def slowly(self, items):
        time.sleep(0.3)
        return push_apart(self, items)

    def fails(self, step, *args):
        if step == 3:
            raise ValueError("a failure mid-training")
        return push(self, step, *args)

    monkeypatch.setattr(AsyncRows, "push_apart", slowly)
    monkeypatch.setattr(AsyncRows, "push", fails)
    addresses, _ = servers(1)
    cfg = _small_mlp_run(addresses, data_file, dense_staleness=1, job_id=51)
    with pytest.raises(ValueError, match="a failure mid-training"):
        train(cfg)
    monkeypatch.undo()
    assert train(dataclasses.replace(cfg, job_id=52))["dense_syncs"] > 0


def test_a_run_whose_mlp_push_fails_tells_the_shards_it_stopped_after_its_steps_push(servers, data_file, monkeypatch):
    """--dense-staleness 1, async: the MLP's background push fails, and the next step's dense.step raises it while
    that step's rows' push (on the pusher thread, slowed on the shard) is in flight; the stop goes out after that
    push's reply (one applied after the stop would mark its worker running again, and the shard would hold its job
    for the barrier timeout): the next job, started once such a push would have landed, trains at once."""
    from ps.engine.shard import Shard
    from worker.steprows import AsyncRows
    from worker.train import train

    push_batch = Shard.push_batch

    def fails(self, items):
        raise ValueError("the MLP's push failed")

    def slowly(self, pushes, *args, **kwargs):
        time.sleep(0.5)
        return push_batch(self, pushes, *args, **kwargs)

    monkeypatch.setattr(AsyncRows, "push_apart", fails)
    monkeypatch.setattr(Shard, "push_batch", slowly)
    addresses, _ = servers(1)
    cfg = _small_mlp_run(addresses, data_file, dense_staleness=1, job_id=53)
    with pytest.raises(ValueError, match="the MLP's push failed"):
        train(cfg)
    time.sleep(1.0)  # a push the run left in flight lands meanwhile
    monkeypatch.undo()
    assert train(dataclasses.replace(cfg, job_id=54))["dense_syncs"] > 0


def test_a_signal_that_ends_a_steps_wait_for_its_push_tells_the_shards_it_stopped_after_that_push(
    servers, data_file, monkeypatch
):
    """--dense-staleness 1, async: a SIGTERM ends step 3's wait for its rows' push (on the pusher thread, slowed on
    the shard) past the loop's grace; the loop waits for that push (Step.settle) before the source tells the
    shards the worker stopped: a push applied after the stop would mark its worker running again, and geo's deltas
    flushed while the step's push still adds to them would be pushed twice."""
    import worker.step
    from ps.engine.shard import Shard
    from ps.terminate import Terminated
    from worker.steprows import AsyncRows
    from worker.train import train

    push_batch, result_of, settle, abandon = Shard.push_batch, worker.step.result_of, Step.settle, AsyncRows.abandon
    waits, events = [], []

    def slowly(self, pushes, *args, **kwargs):
        if not all(p[0].startswith("dense.") for p in pushes):  # the rows' pushes
            time.sleep(0.5)
        applied = push_batch(self, pushes, *args, **kwargs)
        events.append("pushed")
        return applied

    def signalled(future):
        waits.append(future)
        if len(waits) == 3:  # step 3's wait for its push: the signal's exception, the push still in flight
            raise Terminated()
        return result_of(future)

    monkeypatch.setattr(Shard, "push_batch", slowly)
    monkeypatch.setattr(worker.step, "result_of", signalled)
    monkeypatch.setattr(Step, "settle", lambda self: (settle(self), events.append("settled")))
    monkeypatch.setattr(AsyncRows, "abandon", lambda self, *a, **k: (events.append("stop"), abandon(self, *a, **k)))
    addresses, _ = servers(1)
    cfg = _small_mlp_run(addresses, data_file, dense_staleness=1, job_id=55)
    with pytest.raises(Terminated):
        train(cfg)
    assert waits[2].done() and events.index("settled") < events.index("stop")
    assert events[events.index("settled") - 1] == "pushed"  # step 3's rows, waited for


def test_a_steps_failed_push_is_the_runs_error_said_once(servers, data_file, monkeypatch, caplog):
    """--dense-staleness 1, async: step 3's rows' push fails on the shard; the run ends with that error, and the
    stop path's wait for the step's push (Step.settle) has nothing more to wait for: no second word of it."""
    from ps.engine.shard import Shard
    from worker.train import train

    push_batch, calls = Shard.push_batch, []

    def fails(self, pushes, *args, **kwargs):
        if not all(p[0].startswith("dense.") for p in pushes):  # the rows' pushes
            calls.append(1)
            if len(calls) == 3:
                raise ValueError("the shard's disk is gone")
        return push_batch(self, pushes, *args, **kwargs)

    monkeypatch.setattr(Shard, "push_batch", fails)
    addresses, _ = servers(1)
    with pytest.raises(PsError, match="the shard's disk is gone"):
        train(_small_mlp_run(addresses, data_file, dense_staleness=1, job_id=57))
    assert "failed too" not in caplog.text


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_early_stopping_puts_the_best_back_while_its_job_holds_the_shards(servers, mode, monkeypatch):
    """The restore's pushes come before the worker says it is done, with its job's stamp: until then its job holds
    the shards, and a shard another job took would refuse them rather than have the restore's deltas land in that
    job's tables. Checked at the restore: another job's stamp is refused then, and taken once the run is over; and
    every add-delta push (the new model's logit-bias start and the restore) came stamped with the job."""
    from ps.engine.shard import Shard
    from ps.errors import JobConflictError
    from ps.stamp import WorkerStamp
    from worker.best import BestModel
    from worker.train import train

    addresses, (server,) = servers(1)
    other = WorkerStamp(77, 0, 1, 0, staleness=1, setup="mode=ssp staleness=1 model=fm", barrier_timeout_s=30.0)
    refused, restore = [], BestModel.restore
    stamped, deltas, push_stamped, push_batch = [], [], Shard.push_stamped, Shard.push_batch

    def watched_stamped(self, pushes, advance_clock, client, seq, stamp, *args, **kwargs):
        if any(p.add_delta for p in pushes):
            stamped.append(stamp)
        return push_stamped(self, pushes, advance_clock, client, seq, stamp, *args, **kwargs)

    def watched_batch(self, pushes, *args, **kwargs):  # every batch applied, stamped or not
        if any(p.add_delta for p in pushes):
            deltas.append(len(pushes))
        return push_batch(self, pushes, *args, **kwargs)

    monkeypatch.setattr(Shard, "push_stamped", watched_stamped)
    monkeypatch.setattr(Shard, "push_batch", watched_batch)

    def checked(self, dense):
        with pytest.raises(JobConflictError, match=r"shard 0 holds job 61 .* so worker 0 of job 77 ") as e:
            server.shard.jobs.check(other, pull=True)
        refused.append(e.value)
        return restore(self, dense)

    monkeypatch.setattr(BestModel, "restore", checked)
    cfg = TrainConfig(servers=tuple(addresses), model="deepfm", hidden=(8,), synthetic_rows=4000,
                      synthetic_eval_rows=500, learning_rate=0.5, epochs=30, early_stop=2, progress=False, mode=mode,
                      job_id=61)  # fmt: skip
    result = train(cfg)
    assert result["stopped_early"] and result["restored_best"] and len(refused) == 1
    assert deltas and len(stamped) == len(deltas) and {s.job for s in stamped} == {61}
    server.shard.jobs.check(other, pull=True)  # the job is over: free


def test_a_sync_worker_that_finishes_early_does_not_hold_the_others(servers, tmp_path, data_file):
    """Worker 1 trains one epoch, worker 0 two: once worker 1 is done, worker 0's steps complete without it."""
    addresses, _ = servers(1)
    cfg = TrainConfig(data=data_file, model="fm", recipe="large", epochs=1, progress=False, batch_size=1000,
                      validation_fraction=0.0, synthetic_eval_rows=0, num_workers=2, job_id=19, mode="sync",
                      barrier_timeout_s=20)  # fmt: skip
    started = time.monotonic()
    runs = _run_job(addresses, [dataclasses.replace(cfg, worker_id=0, epochs=2), dataclasses.replace(cfg, worker_id=1)])
    assert [r["result"].steps for r in runs] == [4, 2]  # 1600 lines each: batches of 1000 and 600
    assert time.monotonic() - started < 15


def test_a_sync_job_says_once_when_the_servers_hold_a_model_it_trains_further(servers, data_file, capsys):
    """In sync no step is applied before every worker has pushed, so rows a worker finds before its first push are
    an earlier run's, the same for every worker: worker 0 says for the second job that it trains that model
    further, once; nothing is said for the first."""
    from worker.train import train

    addresses, _ = servers(1)
    cfg = TrainConfig(servers=tuple(addresses), data=data_file, model="fm", recipe="large", progress=False,
                      batch_size=1000, validation_fraction=0.0, synthetic_eval_rows=0, num_workers=2, mode="sync",
                      barrier_timeout_s=20)  # fmt: skip
    said = "the servers hold this model's tables with "
    for job_id, kept in ((41, False), (42, True)):
        capsys.readouterr()
        runs = [dataclasses.replace(cfg, worker_id=i, job_id=job_id) for i in range(2)]
        assert [r["train_examples"] for r in _run_all(train, runs)] == [1600, 1600]
        assert capsys.readouterr().out.count(said) == (1 if kept else 0)


def test_workers_of_one_job_with_other_models_both_stop_at_once_naming_the_model(servers, tmp_path, data_file):
    """An fm worker and a deepfm worker given one sync job: whichever stamp comes second is refused, which stops
    the job, so both fail with the models named, long before the 60 s barrier would have ended the wait."""
    from ps.errors import InvalidArgumentError

    addresses, _ = servers(2)
    cfg = TrainConfig(data=data_file, model="fm", recipe="large", epochs=1, progress=False, batch_size=400,
                      validation_fraction=0.0, synthetic_eval_rows=0, num_workers=2, job_id=23, mode="sync",
                      barrier_timeout_s=60)  # fmt: skip
    cfgs = [dataclasses.replace(cfg, worker_id=0), dataclasses.replace(cfg, worker_id=1, model="deepfm", hidden=(8,))]
    errors: list = [None, None]

    def run(i):
        try:
            _run_worker(addresses, cfgs[i])
        except Exception as e:  # the test looks at both
            errors[i] = e

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert time.monotonic() - started < 30
    for e in errors:
        assert isinstance(e, InvalidArgumentError), e
        assert "stops: worker" in str(e) and "runs another setup than the job started with" in str(e), e
        assert re.search(r"'model' '(fm|deepfm)' \(the job's: '(deepfm|fm)'\)", str(e)), e


def test_the_job_setup_moves_with_what_workers_share_and_not_with_what_each_chooses():
    from worker.job import prepare
    from worker.row_source import job_setup

    def setup(**changes) -> str:
        cfg = TrainConfig(servers=("h:1",), synthetic_rows=20_000, num_workers=2, job_id=5, mode="sync",
                          model="deepfm", hidden=(16,), progress=False)  # fmt: skip
        resolved, _, spec, _ = prepare(dataclasses.replace(cfg, **changes))
        return job_setup(resolved, spec)

    base = setup()
    assert base.startswith("mode=sync model=deepfm fields=") and "hidden=16 dense=ps" in base
    for own in ({"worker_id": 1}, {"batch_size": 64}, {"backend": "numpy", "epochs": 3}, {"prefetch": 2}):
        assert setup(**own) == base, own
    shared = [{"mode": "ssp", "staleness": 2}, {"model": "dnn"}, {"hidden": (8,)}, {"embedding_dim": 4},
              {"mode": "ssp", "dense": "allreduce"}, {"dense_sync_every": 2}]  # fmt: skip
    assert len({base, *(setup(**c) for c in shared)}) == len(shared) + 1
    assert "staleness=2" in setup(mode="ssp", staleness=2)
    assert "dense_optimizer=adam:0.001" in setup(mode="ssp", dense="allreduce")
    assert "dense_sync_every=2" in setup(dense_sync_every=2)  # sync's sums; ssp applies each push as it comes
    assert setup(mode="ssp", staleness=2, dense_sync_every=2) == setup(mode="ssp", staleness=2)
    assert "geo_every=3" in setup(mode="geo", geo_every=3) and setup(mode="geo", geo_every=3) != setup(mode="geo")
    assert setup(mode="async").startswith("mode=async model=deepfm")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"mode": "sync", "staleness": 2}, "--staleness 2 is ssp's"),
        ({"mode": "ssp", "geo_every": 3}, "--geo-every 3 is geo's"),
        ({"dense": "allreduce", "dense_staleness": 1}, "--dense-staleness 1 is the --dense ps path's"),
        ({"dense_sync_every": 3, "dense_staleness": 1}, "--dense-sync-every 3 applies"),
        ({"local_shards": 2, "num_workers": 2, "worker_id": 1}, "each worker would start shards of its own"),
        ({"mode": "async", "num_workers": 2}, "--num-workers 2 needs --job-id: the same for all the job's workers"),
        ({"mode": "async", "row_cache_bytes": 1 << 20}, "--row-cache-bytes serves rows within ssp's"),
        ({"mode": "geo", "l2": 0.5}, "--l2 0.5 with --mode geo: geo pushes its rows' deltas as add-delta pushes"),
    ],
)
def test_settings_a_mode_would_ignore_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TrainConfig(servers=("h:1",)), **changes).validate()


def test_every_worker_of_a_job_picks_the_same_recipe():
    """The recipe goes by the job's examples, not by a worker's share (shares of 999,999 rows differ by one)."""
    from worker.job import prepare

    chosen = set()
    for i in range(2):
        cfg = TrainConfig(
            servers=("h:1",), synthetic_rows=999_999, num_workers=2, worker_id=i, job_id=3, progress=False
        )
        resolved, _, _, line = prepare(cfg)
        chosen.add((resolved.batch_size, resolved.epochs, resolved.optimizer, line))
    assert len(chosen) == 1, chosen


def test_torchruns_unnamed_run_id_is_no_job_id(monkeypatch):
    """torchrun without --rdzv-id sets TORCHELASTIC_RUN_ID=none for every run: taken as a job id, every job after the
    first on the same servers would be refused as a second run of it. A sync job of several workers is refused
    before it starts instead, asking for a job id; a named run id is one."""
    from worker.cli_train_config import train_config_from_argv

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    cfg = train_config_from_argv(["--servers", "h:1", "--mode", "sync"])
    assert cfg.job_id is None
    with pytest.raises(ValueError, match=r"--num-workers 2 needs --job-id: .* torchrun given a --rdzv-id"):
        cfg.validate()
    assert train_config_from_argv(["--servers", "h:1", "--mode", "sync", "--job-id", "none"]).job_id  # a name given
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "my-job-3")
    named = train_config_from_argv(["--servers", "h:1", "--mode", "sync"])
    assert named.job_id == train_config_from_argv(["--servers", "h:1", "--job-id", "my-job-3"]).job_id
    assert named.job_name == "my-job-3"  # the shards name the job so
    named.validate()


def test_a_job_id_given_as_a_name_is_the_name_the_stamps_carry():
    """--job-id j3: the job's id is the name's hash, and its stamps carry the name for the shards' messages; an
    integer is the id itself (no name); a name a stamp cannot carry (past 100 characters, not printable ASCII) is
    hashed all the same, and the shards name the job by its id."""
    from worker.cli_train_config import train_config_from_argv
    from worker.job import prepare
    from worker.row_source import row_source

    def given(job: str) -> tuple[int, str]:
        cfg = train_config_from_argv(["--servers", "h:1", "--job-id", job])
        return cfg.job_id, cfg.job_name

    assert given("j3")[1] == "j3" and given("j3")[0] not in (0, None) and given("j3")[0] != given("j4")[0]
    assert given("74") == (74, "") and given("0x4a") == (74, "")
    for unfit in ("j" * 101, "j\u00f6b", "j\tb"):
        assert given(unfit)[0] and given(unfit)[1] == ""
    for mode in ("async", "sync"):  # the stamp of every mode's row source carries it
        cfg = train_config_from_argv(["--servers", "h:1", "--job-id", "j3", "--mode", mode, "--synthetic-rows", "100"])
        resolved, _, spec, _ = prepare(cfg)
        assert row_source(resolved, None, spec, []).stamp.job_name == "j3"


@pytest.mark.parametrize("mode", ["sync", "ssp"])
def test_a_worker_whose_tables_check_fails_stops_the_job_at_once(servers, data_file, mode):
    """Worker 0 makes the tables and waits for worker 1 (sync: at its first step; ssp: at its sixth of 16, past
    the staleness of 4); worker 1, given another --embedding-dim (a flag given to one worker only), fails its
    tables check before it creates anything: it tells the shards it stopped, so worker 0 fails at once naming it
    and why, not at its 60 s barrier."""
    from ps.errors import BarrierTimeoutError
    from worker.train import train

    addresses, _ = servers(2)
    cfg = TrainConfig(servers=tuple(addresses), data=data_file, model="fm", recipe="large", progress=False,
                      batch_size=100, validation_fraction=0.0, synthetic_eval_rows=0, num_workers=2, job_id=61,
                      mode=mode, barrier_timeout_s=60)  # fmt: skip
    errors: list = []

    def worker0():
        try:
            train(dataclasses.replace(cfg, worker_id=0))
        except Exception as e:  # the test looks at it
            errors.append(e)

    thread = threading.Thread(target=worker0)
    thread.start()
    with Client(addresses) as client:  # worker 0's tables made: it holds the shards for the job
        deadline = time.monotonic() + 60
        while not all(s.tables for s in client.stats()) and time.monotonic() < deadline:
            time.sleep(0.05)
    with pytest.raises(ValueError, match="other settings than this run's"):
        train(dataclasses.replace(cfg, worker_id=1, embedding_dim=4))
    started = time.monotonic()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert time.monotonic() - started < 20
    assert len(errors) == 1 and isinstance(errors[0], BarrierTimeoutError), errors
    assert "worker 1 stopped before its end" in str(errors[0]) and "other settings" in str(errors[0]), errors[0]

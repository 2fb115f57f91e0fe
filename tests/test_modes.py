"""Training modes on the servers' clock (ps.engine.jobs): sync steps summed over the workers and applied once,
bounded-staleness pulls that wait for the slowest worker, deadlines that name the missing workers, and the
client's stamps over gRPC."""

from __future__ import annotations

import dataclasses
import re
import socket
import threading
import time

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps import codec, wire
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.jobs import JobClocks
from ps.engine.push import TablePush
from ps.engine.shard import MAX_COUNT_PER_ID, Shard
from ps.engine.syncsum import sum_contributions, sync_key
from ps.errors import (
    BarrierTimeoutError,
    CallerGoneError,
    DataLossError,
    InvalidArgumentError,
    JobConflictError,
    JobIdReusedError,
    PsError,
    RpcThreadsExhaustedError,
    ShardClosingError,
    StorageError,
    WorkerDoneError,
)
from ps.rows.initializers import init_rows
from ps.server_config import ServerConfig
from ps.stamp import job_hash
from ps.storage.shardmeta import JOB_DONE_REMEDY
from tests.conftest import crash, random_ids
from tests.waiting import join_thread, wait_until
from worker.client import Client, WorkerStamp, sum_duplicates

JOB = 0x5EED
J3 = job_hash("j3")  # the job of --job-id j3
SGD = TableConfig("emb", 4, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))  # row = -(sum of grads)


def open_shard(path, *tables: TableConfig, threads: int = 8) -> Shard:
    shard = Shard(ServerConfig(data_dir=str(path), threads=threads))
    for cfg in tables or (SGD,):
        shard.create_table(cfg)
    return shard


def stamp(worker: int, step: int, **kw) -> WorkerStamp:
    kw.setdefault("barrier_timeout_s", 30.0)
    return WorkerStamp(kw.pop("job", JOB), worker, kw.pop("num_workers", 2), step, **kw)


def push(ids, grads, shows=None, clicks=None, table="emb") -> TablePush:
    return TablePush(name=table, ids=ids, grads=np.asarray(grads, np.float32), shows=shows, clicks=clicks)


class Concurrently:
    """Runs functions on threads; join() returns their results in order, or raises the first exception."""

    def __init__(self, *fns):
        self.results: list = [None] * len(fns)
        self.errors: list = [None] * len(fns)
        self.threads = [threading.Thread(target=self._run, args=(i, f), daemon=True) for i, f in enumerate(fns)]
        for t in self.threads:
            t.start()

    def _run(self, i, fn):
        try:
            self.results[i] = fn()
        except BaseException as e:
            self.errors[i] = e

    def join(self, timeout_s: float = 300) -> list:  # a hang guard: a cold cache compiles kernels first
        for t in self.threads:
            join_thread(t, timeout_s, "a worker thread")
        for e in self.errors:
            if e is not None:
                raise e
        return self.results


def step_data(rng, worker: int, step: int, dim: int) -> tuple:
    """A worker's push of a step: unique ids overlapping the other worker's, grads, shows, clicks."""
    ids = np.unique(rng.integers(0, 60, 40)).astype(np.uint64) + np.uint64(1000 * (step % 2))
    n = len(ids)
    grads = rng.standard_normal((n, dim)).astype(np.float32)
    shows = rng.integers(1, 4, n).astype(np.float32)
    clicks = np.minimum(shows, rng.integers(0, 2, n)).astype(np.float32)
    return ids, grads, shows, clicks


# ---- sync ---------------------------------------------------------------------------------------------


def test_sum_contributions_against_a_loop():
    a = [push(np.array([5, 1], np.uint64), [[1.0], [2.0]], np.ones(2, np.float32), np.zeros(2, np.float32), "t")]
    b = [
        push(np.array([9], np.uint64), [[7.0]], np.ones(1, np.float32), np.ones(1, np.float32), "u"),
        push(np.array([1, 3], np.uint64), [[10.0], [20.0]], np.full(2, 2, np.float32), np.ones(2, np.float32), "t"),
    ]
    t, u = sum_contributions([a, b, []], MAX_COUNT_PER_ID)
    assert (t.name, u.name) == ("t", "u") and not t.add_delta
    assert t.ids.tolist() == [1, 3, 5] and t.grads[:, 0].tolist() == [12.0, 20.0, 1.0]
    assert t.shows.tolist() == [3.0, 2.0, 1.0] and t.clicks.tolist() == [1.0, 1.0, 0.0]
    t, _ = sum_contributions([a, b, b], 2.0)  # counts clipped, grads not
    assert t.grads[:, 0].tolist() == [22.0, 40.0, 1.0]
    assert t.shows.tolist() == [2.0, 2.0, 1.0] and t.clicks.tolist() == [2.0, 2.0, 0.0]


def test_a_sync_sum_past_the_per_id_count_limit_is_applied_with_counts_clipped_to_it(tmp_path):
    """Each contribution carries the most shows a push may (MAX_COUNT_PER_ID per id); their sum is more: the
    step is applied, with the sum's counts clipped to the limit, not failed for every worker."""
    shard = open_shard(tmp_path)
    try:
        ids, most = A[:2], np.full(2, MAX_COUNT_PER_ID, np.float32)
        Concurrently(
            *(lambda w=w: shard.push_stamped([push(ids, np.ones((2, 4)), most, most)], 1, 0, 0, stamp(w, 0, sync=True))
              for w in range(2))
        ).join()  # fmt: skip
        rows = shard.table("emb").peek(ids)
        assert (rows[:, :4] == -2).all() and (rows[:, -4] == MAX_COUNT_PER_ID).all()  # the embedding, show count
        assert (rows[:, -3] == MAX_COUNT_PER_ID).all() and shard.clock == 1  # click count
    finally:
        shard.close()


def test_a_sync_sum_that_overflows_float32_is_refused_for_what_it_is_and_applies_nothing(tmp_path):
    shard = open_shard(tmp_path)
    try:
        ids = A[:2]
        before = shard.table("emb").peek(ids)
        results = Concurrently(
            *(lambda w=w: shard.push_stamped([push(ids, np.full((2, 4), 3e38))], 1, 0, 0, stamp(w, 0, sync=True))
              for w in range(2))
        )  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=r"sum of the workers' gradients for id \d+ of table 'emb' "
                           r"overflows float32 \(each worker's is finite"):  # fmt: skip
            results.join()
        np.testing.assert_array_equal(shard.table("emb").peek(ids), before)
        assert shard.clock == 0
    finally:
        shard.close()


def test_a_sync_step_far_past_the_jobs_newest_is_refused_naming_steps(tmp_path):
    shard = open_shard(tmp_path)
    try:
        shard.push_stamped([push(A[:2], np.ones((2, 4)))], 1, 0, 0, stamp(0, 0, sync=True, num_workers=1))
        with pytest.raises(InvalidArgumentError, match=r"sync step 2,097,152 is more than 1,048,576 steps past the "
                           r"newest step of job 24301 applied on shard 0 \(0\)"):  # fmt: skip
            shard.push_stamped([push(A[:2], np.ones((2, 4)))], 1, 0, 0, stamp(0, 2**21, sync=True, num_workers=1))
        assert shard.clock == 1
    finally:
        shard.close()


@pytest.mark.parametrize("optimizer", [OptimizerConfig("adagrad", 0.1), OptimizerConfig("adam", 0.01)])
def test_a_sync_step_is_the_sum_of_the_workers_pushes_applied_once(tmp_path, optimizer):
    cfg = TableConfig("emb", 3, InitializerConfig("uniform", 0.1, 3), optimizer)
    synced, oracle = open_shard(tmp_path / "sync", cfg), open_shard(tmp_path / "oracle", cfg)
    try:
        rng = np.random.default_rng(0)
        data = [[step_data(rng, w, s, 3) for s in range(5)] for w in range(2)]

        def worker(w):
            return [synced.push_stamped([push(*data[w][s])], 1, 0, 0, stamp(w, s, sync=True)) for s in range(5)]

        replies = Concurrently(lambda: worker(0), lambda: worker(1)).join()
        for s in range(5):  # the oracle: one unstamped push per step of the concatenated ids, duplicates summed
            ids, grads, shows, clicks = (np.concatenate([data[w][s][k] for w in range(2)]) for k in range(4))
            uniq, summed = sum_duplicates(ids, np.concatenate([grads, shows[:, None], clicks[:, None]], axis=1))
            oracle.push_batch([push(uniq, summed[:, :3], summed[:, 3].copy(), summed[:, 4].copy())], 1)
        ids = np.unique(np.concatenate([d[0] for w in data for d in w]))
        np.testing.assert_allclose(synced.table("emb").peek(ids), oracle.table("emb").peek(ids), rtol=1e-6, atol=1e-7)
        assert synced.clock == oracle.clock == 5  # advanced once per step, not once per worker
        for w in range(2):  # every contributor's reply: after its step's sum, every clock at step + 1
            assert [(clock, n, low) for clock, n, low in replies[w]] == [
                (s + 1, len(data[w][s][0]), s + 1) for s in range(5)
            ]
        assert synced.jobs.stats() == {
            "job": JOB,
            "job_name": "",
            "num_workers": 2,
            "min_clock": 5,
            "max_gap": 0,
            "job_unclocked": False,
        }
    finally:
        synced.close()
        oracle.close()


def sync_steps(shard, steps: range, value: float = 1.0, setup: str = "") -> None:
    """Two workers push value to ids A (worker 0) and B (worker 1) in each sync step, stamped with setup."""
    for s in steps:
        Concurrently(
            lambda s=s: shard.push_stamped([push(A, np.full((len(A), 4), value))], 1, 0, 0,
                                           stamp(0, s, sync=True, setup=setup)),
            lambda s=s: shard.push_stamped([push(B, np.full((len(B), 4), value))], 1, 0, 0,
                                           stamp(1, s, sync=True, setup=setup)),
        ).join()  # fmt: skip


A, B = random_ids(20, seed=1), random_ids(30, seed=2)


@pytest.mark.parametrize("restart", [None, "close", "crash"])
def test_a_retried_contribution_to_an_applied_step_applies_nothing(tmp_path, restart):
    """Without a restart the shard knows the step was applied whole and answers at once; after one, the newest
    step the journal holds may be partly applied, so its contributions are gathered again and the sum applied
    again: the journal's exactly-once rule applies none of it a second time."""
    shard = open_shard(tmp_path)
    try:
        sync_steps(shard, range(3))
        assert (shard.pull("emb", A) == -3).all() and shard.clock == 3
        if restart == "close":
            shard.close()
        elif restart == "crash":  # kill -9: the journal is what is left, replayed at start
            crash(shard)
        if restart:
            shard = open_shard(tmp_path)
            assert shard.journal.applied[sync_key(JOB)][0] == 3
        journaled = shard.journal.next_seq
        got = shard.push_stamped([push(A, np.full((len(A), 4), 50.0))], 1, 0, 0, stamp(0, 0, sync=True))
        assert got == (3, 0, 2 if restart else 3)  # older than the newest step the journal holds: answered at
        # once; after a restart min_clock says only what the journal proves (the newest step may be partial)
        if restart:  # the newest: both workers send it again (neither had its reply)
            sync_steps(shard, range(2, 3), value=50.0)
        else:
            got = shard.push_stamped([push(A, np.full((len(A), 4), 50.0))], 1, 0, 0, stamp(0, 2, sync=True))
            assert got == (3, 0, 3)
        assert (shard.pull("emb", A) == -3).all() and (shard.pull("emb", B) == -3).all() and shard.clock == 3
        assert shard.journal.next_seq == journaled
        sync_steps(shard, range(3, 4))  # the job goes on
        assert (shard.pull("emb", B) == -4).all() and shard.clock == 4
    finally:
        shard.close()


def test_a_sync_sum_a_crash_left_half_applied_is_completed_once_after_the_restart(tmp_path):
    """Step 3's sum spans two tables; a crash came after its first table's record: the workers send step 3 again
    and the restarted shard applies the second table's push, and not the first's again."""
    other = dataclasses.replace(SGD, name="other")
    shard = open_shard(tmp_path, SGD, other)

    def both(ids, v):
        return [push(ids, np.full((len(ids), 4), v)), push(ids, np.full((len(ids), 4), v), table="other")]

    for s in range(4):
        Concurrently(
            *(lambda s=s, w=w, ids=ids: shard.push_stamped(both(ids, 1.0), 1, 0, 0, stamp(w, s, sync=True))
              for w, ids in ((0, A), (1, B)))
        ).join()  # fmt: skip
    assert (shard.pull("other", A) == -4).all()
    crash(shard)
    shard = open_shard(tmp_path, SGD, other)
    try:
        applied = shard.journal.applied[sync_key(JOB)]
        assert applied[0] == 4
        kept = shard.journal.applied  # as if the crash came after the first table's record:
        kept._entries[sync_key(JOB)] = kept.entry(sync_key(JOB))._replace(parts=1)
        shard.pushes.advanced[sync_key(JOB)], shard.pushes.clock = applied[0] - 1, 3  # and before the sum's advance
        for ids in (A, B):  # and the second table's push never happened: its rows back by one step
            shard.push("other", ids, np.full((len(ids), 4), 1.0), None, None, True)
        assert (shard.pull("other", A) == -3).all() and (shard.pull("emb", A) == -4).all()
        Concurrently(
            *(lambda w=w, ids=ids: shard.push_stamped(both(ids, 1.0), 1, 0, 0, stamp(w, 3, sync=True))
              for w, ids in ((0, A), (1, B)))
        ).join()  # fmt: skip
        for table in ("emb", "other"):
            assert (shard.pull(table, A) == -4).all() and (shard.pull(table, B) == -4).all(), table
        assert shard.clock == 4
    finally:
        shard.close()


def test_a_contribution_to_a_later_step_answers_the_retries_of_an_earlier_one(tmp_path):
    """After a restart, worker 1 retries step 2 (the newest the journal holds); worker 0 had its reply and sends
    step 3: that proves step 2 whole, so worker 1's retry is answered, and step 3 goes on."""
    shard = open_shard(tmp_path)
    sync_steps(shard, range(3))
    crash(shard)
    shard = open_shard(tmp_path)
    try:
        retry = Concurrently(
            lambda: shard.push_stamped([push(B, np.full((len(B), 4), 9.0))], 1, 0, 0, stamp(1, 2, sync=True))
        )
        wait_until(lambda: 2 in shard.jobs.sync.steps, 30, "worker 1's retry of step 2 to wait")
        later = Concurrently(
            lambda: shard.push_stamped([push(A, np.full((len(A), 4), 1.0))], 1, 0, 0, stamp(0, 3, sync=True))
        )
        retry.join(timeout_s=10)
        shard.push_stamped([push(B, np.full((len(B), 4), 1.0))], 1, 0, 0, stamp(1, 3, sync=True))
        later.join(timeout_s=10)
        assert (shard.pull("emb", A) == -4).all() and (shard.pull("emb", B) == -4).all() and shard.clock == 4
    finally:
        shard.close()


def test_a_sync_step_missing_a_worker_fails_at_its_deadline_and_applies_nothing(tmp_path):
    shard = open_shard(tmp_path)
    try:
        sync_steps(shard, range(1))
        before, journaled = shard.table("emb").peek(A), shard.journal.next_seq
        started = time.monotonic()
        with pytest.raises(BarrierTimeoutError) as info:
            shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 0, 0, stamp(0, 1, sync=True, barrier_timeout_s=0.5))
        assert 0.5 <= time.monotonic() - started < 10
        assert info.value.status == "ABORTED"
        message = str(info.value)
        assert "worker 1 (at step 1)" in message and f"job {JOB}" in message and "worker 0's" in message
        assert "nothing of the step was applied" in message
        assert (shard.table("emb").peek(A) == before).all() and shard.journal.next_seq == journaled
        assert shard.clock == 1 and not shard.jobs.sync.steps  # the contribution was dropped
        # worker 1 contributes later alone: it waits for worker 0 again, whose contribution is gone
        with pytest.raises(BarrierTimeoutError, match=r"for the pushes of worker 0 \(at step 1\)"):
            shard.push_stamped([push(B, np.ones((len(B), 4)))], 1, 0, 0, stamp(1, 1, sync=True, barrier_timeout_s=0.2))
        assert (shard.pull("emb", B) == -1).all()
    finally:
        shard.close()


def test_a_sync_step_whose_callers_left_is_dropped_at_its_deadline_and_few_gather_at_once(tmp_path):
    """A contribution whose caller left waits for a retry only until the step's barrier timeout: then, with nobody
    waiting for it, a timer drops it (its memory too). Steps of a job gathering at once are bounded: a stamp that
    would open one more is refused, changing nothing."""
    shard = open_shard(tmp_path)
    try:
        with pytest.raises(CallerGoneError):
            shard.push_stamped([push(A, np.ones((len(A), 4)))], 0, 0, 0,
                               stamp(0, 0, sync=True, barrier_timeout_s=0.5), lambda: True)  # fmt: skip
        assert list(shard.jobs.sync.steps) == [0]  # kept for a retry
        wait_until(lambda: not shard.jobs.sync.steps, 10, "the step nobody waits for to be dropped")
        with pytest.raises(BarrierTimeoutError, match=r"for the pushes of worker 0 \(at step 0\)"):
            shard.push_stamped([push(B, np.ones((len(B), 4)))], 0, 0, 0, stamp(1, 0, sync=True, barrier_timeout_s=0.2))
        before = {t for t in threading.enumerate() if t.name == "ps-sync-expiry"}  # other tests' may still run
        for step in [1] * 20 + [2, 3, 4]:  # a hostile client's steps, each left at once, step 1 again and again
            with pytest.raises(CallerGoneError):
                shard.push_stamped([push(A, np.ones((len(A), 4)))], 0, 0, 0,
                                   stamp(0, step, sync=True, barrier_timeout_s=60), lambda: True)  # fmt: skip
        timers = {t for t in threading.enumerate() if t.name == "ps-sync-expiry"} - before
        assert len(timers) == 4  # one per step, whatever the contributions to it
        with pytest.raises(InvalidArgumentError, match=r"sync step 5 of job \d+ while steps 1, 2, 3, 4 are still "
                                                       r"gathering on shard 0: .*nothing was applied"):  # fmt: skip
            shard.push_stamped([push(A, np.ones((len(A), 4)))], 0, 0, 0, stamp(0, 5, sync=True))
        assert sorted(shard.jobs.sync.steps) == [1, 2, 3, 4]
        assert (shard.pull("emb", A) == 0).all() and (shard.pull("emb", B) == 0).all()
    finally:
        shard.close()
    wait_until(lambda: not any(t.is_alive() for t in timers), 5, "the timers' end")


def test_two_workers_of_one_worker_id_fail_the_step_for_both_naming_the_duplicate(tmp_path):
    """Worker 0's step 1 from client 11 waits for worker 1; a second process says it is worker 0 too (client
    12): the step fails for both with the duplicate named, not at the deadline as a missing worker 1."""
    shard = open_shard(tmp_path)
    try:
        sync_steps(shard, range(1))
        before = shard.table("emb").peek(A)
        first = Concurrently(
            lambda: shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 11, 0, stamp(0, 1, sync=True))
        )
        wait_until(lambda: 1 in shard.jobs.sync.steps and shard.jobs.sync.steps[1].contributions, 30, "worker 0's push")
        started = time.monotonic()
        duplicate = "two workers of job .* say they are worker 0 .*give each worker its own --worker-id in 0..1"
        with pytest.raises(InvalidArgumentError, match=duplicate):
            shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 12, 0, stamp(0, 1, sync=True))
        with pytest.raises(InvalidArgumentError, match=duplicate):
            first.join()
        assert time.monotonic() - started < 10  # not the 30 s deadline
        assert (shard.table("emb").peek(A) == before).all() and shard.clock == 1
    finally:
        shard.close()


SETUP = "mode=sync model=fm fields=3:0a1b2c3d numeric=0"


def test_a_worker_of_another_setup_stops_the_job_and_every_worker_hears_why(tmp_path):
    """Worker 0 (its setup starts the job) waits in sync step 1 and in a pull; worker 1 comes with another model
    and hidden widths: it is refused naming both keys, and worker 0's waits end at once with the same reason, not
    at their deadline; later stamps of the job are refused too, and nothing of step 1 was applied. A new job id
    starts afresh."""
    shard = open_shard(tmp_path)
    try:
        sync_steps(shard, range(1), setup=SETUP)
        before, journaled = shard.table("emb").peek(A), shard.journal.next_seq
        waiting = Concurrently(
            lambda: shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 11, 0, stamp(0, 1, sync=True, setup=SETUP)),
            lambda: shard.jobs.wait_for_pull(stamp(0, 2, sync=True, setup=SETUP)),
        )  # fmt: skip
        wait_until(lambda: 1 in shard.jobs.sync.steps and shard.jobs.sync.steps[1].contributions, 30, "worker 0's push")
        wait_until(lambda: shard.jobs._waiting == 2, 30, "worker 0's two waits")
        started = time.monotonic()
        other = SETUP.replace("model=fm", "model=deepfm") + " hidden=400,400 dense=ps"
        expected = (
            r"shard 0: job 24301 stops: worker 1 runs another setup than the job started with here \((worker 0's|its "
            r"own) first stamp\): "
            r"'model' 'deepfm' \(the job's: 'fm'\), 'hidden' '400,400' \(the job's: '\(unset\)'\), 'dense' 'ps' "
            r"\(the job's: '\(unset\)'\); every worker of a job runs the same mode, model and tables"
        )
        with pytest.raises(InvalidArgumentError, match=expected):
            shard.jobs.check(stamp(1, 1, sync=True, setup=other), pull=False)
        assert not join_all(waiting)
        for error in waiting.errors:
            assert isinstance(error, InvalidArgumentError) and re.search(expected, str(error)), error
        assert time.monotonic() - started < 10  # not the 30 s deadline
        assert (shard.table("emb").peek(A) == before).all() and shard.journal.next_seq == journaled
        with pytest.raises(InvalidArgumentError, match=expected):  # the job stays stopped, for the right setup too
            shard.push_stamped([push(B, np.ones((len(B), 4)))], 1, 12, 0, stamp(1, 1, sync=True, setup=SETUP))
        assert (shard.pull("emb", B) == -1).all()
        # the pairs, not their order, are the setup; a new job follows its own first stamp
        reordered = " ".join(reversed(SETUP.split()))
        assert shard.jobs.wait_for_pull(WorkerStamp(JOB + 1, 0, 1, 0, setup=reordered)) == 0
        shard.jobs.check(WorkerStamp(JOB + 1, 0, 1, 0, setup=SETUP), pull=True)
        assert shard.jobs.job == JOB + 1
    finally:
        shard.close()


def test_a_stop_leaves_a_sum_being_applied_and_a_push_applied_since_its_check_as_applied():
    """The stop fails what is not yet applied only: contributors of a step whose sum is being applied get their
    replies as applied, and a stamped push applied after its check moves its worker's clock without an error."""
    jobs = JobClocks(0, lambda key: 0, threads=8, max_count=1e6)
    release, applying = threading.Event(), threading.Event()

    def apply(pushes, advance, key, seq):
        applying.set()
        assert release.wait(30)

    contributors = Concurrently(
        *(lambda w=w: jobs.push_sync(stamp(w, 0, sync=True, setup=SETUP), [push(A, np.ones((len(A), 4)),
                                     np.ones(len(A)), np.zeros(len(A)))], 1, apply) for w in range(2))
    )  # fmt: skip
    assert applying.wait(30)
    with pytest.raises(InvalidArgumentError, match="job 24301 stops: worker 1 runs another setup"):
        jobs.check(stamp(1, 1, setup="model=lr"), pull=False)
    release.set()
    assert [r[0] for r in contributors.join()] == [len(A), len(A)]

    ssp = JobClocks(0, lambda key: 0, threads=8, max_count=1e6)
    ssp.check(stamp(0, 0, staleness=2, setup=SETUP), pull=False)
    assert ssp.pushed(stamp(1, 0, staleness=2, setup=SETUP)) == 0  # the job starts here
    ssp.check(stamp(0, 0, staleness=2, setup=SETUP), pull=False)
    with pytest.raises(InvalidArgumentError, match="stops"):
        ssp.check(stamp(1, 1, staleness=2, setup="model=lr"), pull=False)
    assert ssp.pushed(stamp(0, 0, staleness=2, setup=SETUP)) == 1  # applied after its check: not an error
    with pytest.raises(InvalidArgumentError, match="stops"):
        ssp.check(stamp(0, 1, staleness=2, setup=SETUP), pull=False)


def test_a_sum_that_applies_past_the_barrier_timeout_is_waited_for_as_applied():
    """Every worker contributed; the sum takes longer to apply than the barrier timeout (a shard's first push
    compiling its kernels, a slow disk). Nobody is missing, so the contributors and the pulls wait for the apply:
    the contributors get their replies as applied, instead of failing the job with 'nothing of the step was
    applied' about a sum that is, naming no worker; a pull's deadline counts from the apply's end, so a pull two
    steps ahead (prefetch) still gives the workers their time for the step between."""
    jobs = JobClocks(0, lambda key: 0, threads=8, max_count=1e6)
    applying, sums = threading.Event(), []

    def apply(pushes, advance, key, seq):
        applying.set()
        time.sleep(2.0 if seq == 1 else 0.0)  # step 0's sum: 2.5 x the barrier timeout
        sums.append(seq)

    def contribute(w, step):
        data = [push(A, np.ones((len(A), 4)), np.ones(len(A)), np.zeros(len(A)))]
        return jobs.push_sync(stamp(w, step, sync=True, barrier_timeout_s=0.8, setup=SETUP), data, 1, apply)

    def pull(step):
        return jobs.wait_for_pull(stamp(0, step, barrier_timeout_s=0.8, setup=SETUP))

    step0 = Concurrently(*(lambda w=w: contribute(w, 0) for w in range(2)))
    assert applying.wait(30)
    pulls = Concurrently(lambda: pull(1), lambda: pull(2))
    assert [r[0] for r in step0.join()] == [len(A), len(A)] and sums == [1]
    time.sleep(0.2)  # the workers compute step 1
    Concurrently(*(lambda w=w: contribute(w, 1) for w in range(2))).join()
    served = pulls.join()
    assert served[0] >= 1 and served[1] == 2 and sums == [1, 2]


def join_all(waiting: Concurrently) -> bool:
    """Joins the threads of waiting; whether none of them failed."""
    for t in waiting.threads:
        join_thread(t, 60, "a worker thread")
    return not any(waiting.errors)


def test_a_setup_past_its_limit_is_a_bad_stamp(tmp_path):
    shard = open_shard(tmp_path)
    try:
        with pytest.raises(InvalidArgumentError, match="bad worker stamp: setup of 1,001 characters is longer"):
            shard.jobs.check(stamp(0, 0, setup="x" * 1001), pull=True)
        assert shard.jobs.job == 0
    finally:
        shard.close()


def test_a_done_worker_lets_the_others_step_complete(tmp_path):
    shard = open_shard(tmp_path)
    try:
        sync_steps(shard, range(1))
        waiting = Concurrently(
            lambda: shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 0, 0, stamp(0, 1, sync=True))
        )
        wait_until(lambda: 1 in shard.jobs.sync.steps and shard.jobs.sync.steps[1].contributions, 30, "worker 0's push")
        assert (shard.pull("emb", A) == -1).all()  # not applied: worker 1 has not pushed step 1
        assert shard.push_stamped([], 0, 0, 0, stamp(1, 1, done=True)) == (1, 0, 1)
        assert waiting.join() == [(2, len(A), 2)]  # worker 1 done: only worker 0's clock counts
        assert (shard.pull("emb", A) == -2).all() and (shard.pull("emb", B) == -1).all()
        # later steps of worker 0 complete at once
        assert shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 0, 0, stamp(0, 2, sync=True)) == (3, len(A), 3)
    finally:
        shard.close()


def test_a_push_of_a_worker_held_as_done_is_refused_and_changes_nothing(tmp_path):
    shard = open_shard(tmp_path)
    try:
        sync_steps(shard, range(1))
        for _ in range(2):  # a done stamp said again changes nothing
            assert shard.push_stamped([], 0, 0, 0, stamp(1, 1, done=True, acked=1)) == (1, 0, 1)
        before, journaled = shard.table("emb").peek(B), shard.journal.next_seq
        for again in (stamp(1, 1, sync=True, barrier_timeout_s=1), stamp(1, 1, barrier_timeout_s=1)):
            with pytest.raises(WorkerDoneError) as info:  # a second run under the job id, most likely
                shard.push_stamped([push(B, np.ones((len(B), 4)))], 1, 0, 0, again)
            assert info.value.status == "FAILED_PRECONDITION"
            assert f"worker 1 of job {JOB} said it is done" in str(info.value)
            assert "a job id is for one run; give a new --job-id; nothing was applied" in str(info.value)
        assert (shard.table("emb").peek(B) == before).all() and shard.journal.next_seq == journaled
        assert shard.clock == 1 and not shard.jobs.sync.steps
    finally:
        shard.close()


def test_a_pull_when_every_worker_is_done_is_served_at_once(tmp_path):
    shard = open_shard(tmp_path)
    try:
        sync_steps(shard, range(2))
        for w in range(2):
            shard.push_stamped([], 0, 0, 0, stamp(w, 2, done=True, acked=2))
        started = time.monotonic()
        assert shard.jobs.wait_for_pull(stamp(0, 100, barrier_timeout_s=10)) == 2  # no worker left to wait for
        assert time.monotonic() - started < 5  # at once, not at the barrier's deadline
    finally:
        shard.close()


# ---- a shard restart in the middle of a job ----------------------------------------------------------------


def sync_worker(shard, worker: int, steps: range, ids, retry: int | None = None) -> None:
    """A worker's loop from a restart on: its push of step `retry` sent again (its reply was lost), then per step
    a stamped pull and a sync push, each stamp saying the steps it had its replies to; then done."""
    if retry is not None:
        shard.push_stamped([push(ids, np.ones((len(ids), 4)))], 1, 0, 0, stamp(worker, retry, sync=True, acked=retry))
    for s in steps:
        shard.jobs.wait_for_pull(stamp(worker, s, acked=s, barrier_timeout_s=5))
        shard.push_stamped([push(ids, np.ones((len(ids), 4)))], 1, 0, 0, stamp(worker, s, sync=True, acked=s))
    shard.push_stamped([], 0, 0, 0, stamp(worker, steps.stop, done=True, acked=steps.stop))


@pytest.mark.parametrize("retry_first", [True, False])
def test_a_sync_job_goes_on_to_its_end_after_a_shard_restart_in_its_middle(tmp_path, retry_first):
    """Steps 0-2 are applied; worker 0 had its reply to step 2, worker 1's was lost in the crash. After the
    restart worker 1 sends step 2 again and worker 0 pulls step 3 (acked 3), in either order: worker 0's acked
    proves step 2 whole (the journal holds it), so neither waits for the other, and both go on to the end."""
    shard = open_shard(tmp_path)
    sync_steps(shard, range(3))
    crash(shard)
    shard = open_shard(tmp_path)
    try:
        first, second = (1, 0) if retry_first else (0, 1)
        run = {0: lambda: sync_worker(shard, 0, range(3, 6), A), 1: lambda: sync_worker(shard, 1, range(3, 6), B, 2)}
        started = Concurrently(run[first])
        wait_until(lambda: shard.jobs._cond._waiters, 30, f"worker {first} to wait")  # its step 2, or its pull
        Concurrently(run[second]).join()
        started.join()
        assert (shard.pull("emb", A) == -6).all() and (shard.pull("emb", B) == -6).all()  # every step once
        assert shard.clock == 6 and shard.journal.applied[sync_key(JOB)][0] == 6
        assert shard.jobs.stats()["min_clock"] == 6
    finally:
        shard.close()


def test_an_ssp_job_goes_on_to_its_end_after_a_shard_restart(tmp_path):
    """Worker 0 pushed steps 0-3, worker 1 steps 0-2; after the restart their clocks are known again from their
    next pulls' acked, which serve each other within staleness 1, and both go on to the end."""
    shard = open_shard(tmp_path)
    for s in range(4):
        ssp_push(shard, 0, s, A, staleness=1, acked=s)
    for s in range(3):
        ssp_push(shard, 1, s, B, staleness=1, acked=s)
    crash(shard)
    shard = open_shard(tmp_path)
    gaps: list[int] = []

    def worker(w, steps, ids):
        for s in steps:
            gaps.append(s - shard.jobs.wait_for_pull(stamp(w, s, staleness=1, acked=s, barrier_timeout_s=5)))
            ssp_push(shard, w, s, ids, staleness=1, acked=s)

    try:
        Concurrently(lambda: worker(0, range(4, 8), A), lambda: worker(1, range(3, 8), B)).join()
        assert (shard.pull("emb", A) == -8).all() and (shard.pull("emb", B) == -8).all()
        assert shard.jobs.min_clock() == 8 and max(gaps) <= 1
    finally:
        shard.close()


def test_no_stamp_proves_a_sync_step_the_journal_does_not_hold(tmp_path):
    """Worker 0 contributes to step 1; stamps of worker 1 with a later step and a larger acked come (a buggy or
    hostile caller): step 1 was never applied, so it still waits for worker 1's contribution, and fails at its
    deadline with nothing applied."""
    shard = open_shard(tmp_path)
    try:
        sync_steps(shard, range(1))
        before, journaled = shard.table("emb").peek(A), shard.journal.next_seq
        gathering = Concurrently(
            lambda: shard.push_stamped(
                [push(A, np.ones((len(A), 4)))], 1, 0, 0, stamp(0, 1, sync=True, barrier_timeout_s=5)
            )
        )
        wait_until(lambda: 1 in shard.jobs.sync.steps, 30, "worker 0's contribution")
        with pytest.raises(BarrierTimeoutError):
            shard.push_stamped([push(B, np.ones((len(B), 4)))], 1, 0, 0,
                               stamp(1, 7, sync=True, acked=7, barrier_timeout_s=0.2))  # fmt: skip
        with pytest.raises(BarrierTimeoutError):
            shard.jobs.wait_for_pull(stamp(1, 9, acked=9, barrier_timeout_s=0.2))
        with pytest.raises(BarrierTimeoutError, match=r"for the pushes of worker 1 \(at step 9\).*nothing of the step"):
            gathering.join()
        assert (shard.table("emb").peek(A) == before).all() and shard.journal.next_seq == journaled
    finally:
        shard.close()


def test_a_worker_done_before_a_restart_is_still_done_after_it(tmp_path, caplog):
    """Done flags are stored as they come (ps.engine.followedjob's done_store): after a crash, worker 0 goes on alone
    with no wait for worker 1, which finished before it and sends nothing more; a record of another job, or of
    another worker count, marks nobody done, and so does one that does not read (the store says it is damaged, and
    that nothing needs restoring for it; the shard logs that)."""
    shard = open_shard(tmp_path)
    sync_steps(shard, range(2))
    shard.push_stamped([], 0, 0, 0, stamp(1, 2, done=True, acked=2))
    shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 0, 0, stamp(0, 2, sync=True, acked=2))  # alone
    crash(shard)
    shard = open_shard(tmp_path)
    try:
        assert shard.store.meta.job_done(JOB, 2) == [1] and shard.store.meta.job_done(JOB + 1, 2) == []
        assert shard.store.meta.job_done(JOB, 3) == []
        assert shard.jobs.wait_for_pull(stamp(0, 3, acked=3, barrier_timeout_s=0.3)) == 3
        assert shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 0, 0, stamp(0, 3, sync=True, acked=3)) == (
            4, len(A), 4)  # fmt: skip
        assert (shard.pull("emb", A) == -4).all() and (shard.pull("emb", B) == -2).all()
        with pytest.raises(WorkerDoneError):  # still done: a push of it is refused, as before the restart
            shard.push_stamped([push(B, np.ones((len(B), 4)))], 1, 0, 0, stamp(1, 3, sync=True, acked=2))
        for record in (b'{"job": 1, "done": "x"}', b'{"job": 1, "num_workers": 2, "done": [1, 2]}', b"[1]"):
            shard.store._dir.meta_cf.put(b"job_done", record)
            with pytest.raises(DataLossError, match=f"meta key job_done holds {re.escape(ascii(record))}, which does "
                                                    "not read as its value") as refused:  # fmt: skip
                shard.store.meta.job_done(JOB, 2)
            assert str(refused.value).endswith(f"lists what is damaged; {JOB_DONE_REMEDY}"), str(refused.value)
            caplog.clear()
            assert shard.jobs._stored_done(stamp(0, 0)) == []
            said = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
            assert len(said) == 1 and said[0].endswith(f"lists what is damaged; {JOB_DONE_REMEDY}"), said
            assert said[0].count("waited for") == 1 and "restore the dir" not in said[0], said
    finally:
        shard.close()


def test_without_the_done_record_a_restarted_shard_waits_for_the_finished_worker(tmp_path):
    """The record is what carries the flag (a mutation check of the test above): deleted before the restart,
    worker 0 waits for worker 1 until its deadline, and a done stamp of worker 1 sent again ends the wait."""
    shard = open_shard(tmp_path)
    sync_steps(shard, range(2))
    shard.push_stamped([], 0, 0, 0, stamp(1, 2, done=True, acked=2))
    shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 0, 0, stamp(0, 2, sync=True, acked=2))  # alone
    shard.store._dir.meta_cf.delete(b"job_done")
    crash(shard)
    shard = open_shard(tmp_path)
    try:
        with pytest.raises(
            BarrierTimeoutError,
            match=r"for worker 1 \(at step 2; not heard from here: not started, or cut off",
        ):
            shard.jobs.wait_for_pull(stamp(0, 3, acked=3, barrier_timeout_s=0.3))
        assert shard.push_stamped([], 0, 0, 0, stamp(1, 2, done=True, acked=2)) == (3, 0, 3)
        assert shard.jobs.wait_for_pull(stamp(0, 3, acked=3)) == 3
    finally:
        shard.close()


def test_a_done_store_that_fails_is_logged_and_changes_nothing_else(caplog):
    """A read that fails at the job's start follows the job with no worker done; a write that fails keeps the flag
    in memory: the done stamp is answered, and worker 0 is not waited for."""

    def fail(*args):
        raise StorageError("disk gone")

    jobs = JobClocks(0, lambda key: 0, 8, MAX_COUNT_PER_ID, done_store=(fail, fail))
    jobs.check(stamp(0, 0), pull=True)
    assert jobs.finish(stamp(0, 0, done=True)) == 0  # worker 1's clock, 0: worker 0 done in memory
    assert jobs.wait_for_pull(stamp(1, 0, barrier_timeout_s=0.3)) == 0
    assert (
        "could not be read, so none is taken as done: disk gone" in caplog.text
        and "are done failed (disk gone)" in caplog.text
    )


def test_the_done_stores_failures_name_the_job_as_its_workers_named_it(tmp_path, caplog):
    """A job named 'j3' (its stamps' job_name): the logs of a done record that does not read, and of one whose write
    RocksDB refused, name it so, and its id (the name's hash) nowhere, the store's own words of the write
    included."""

    class Refusing:  # the store's meta column family, whose writes fail
        def __init__(self, meta):
            self.meta = meta

        def put(self, *args):
            raise Exception("IO error: disk gone")

        def __getattr__(self, name):
            return getattr(self.meta, name)

    shard = open_shard(tmp_path)
    try:
        shard.store._dir.meta_cf.put(b"job_done", b"[1]")
        with caplog.at_level("INFO", "ps"):
            shard.jobs.check(stamp(0, 0, job=J3, job_name="j3"), pull=True)
            shard.store._dir.meta_cf = Refusing(shard.store._dir.meta_cf)
            assert shard.push_stamped([], 0, 0, 0, stamp(1, 0, done=True, job=J3, job_name="j3"))[2] == 0
        said = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage() or "failed" in
                r.getMessage()]  # fmt: skip
        assert len(said) == 2, said
        assert said[0].startswith("shard 0: the done workers of job 'j3' could not be read"), said
        assert said[1].startswith("shard 0: storing that workers of job 'j3' are done failed (RocksDB in "), said
        assert "failed while storing that workers [1] of the job are done: IO error: disk gone" in said[1], said
        assert not any(str(J3) in line for line in said), said
    finally:
        shard.store._dir.meta_cf = getattr(shard.store._dir.meta_cf, "meta", shard.store._dir.meta_cf)
        shard.close()


# ---- the server's RPC threads, job switches ------------------------------------------------------------------


def test_a_wait_that_would_hold_the_last_free_rpc_thread_is_refused(tmp_path):
    """2 RPC threads: worker 0's sync push of step 0 waits on one; its prefetched pull of step 1 would wait on
    the other, which worker 1's push needs: it is refused at once, naming --threads, and worker 1's push
    completes the step."""
    shard = open_shard(tmp_path, threads=2)
    try:
        waiting = Concurrently(
            lambda: shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 0, 0, stamp(0, 0, sync=True))
        )
        wait_until(lambda: 0 in shard.jobs.sync.steps, 30, "worker 0's push to wait")
        started = time.monotonic()
        with pytest.raises(RpcThreadsExhaustedError) as info:
            shard.jobs.wait_for_pull(stamp(0, 1, barrier_timeout_s=2))
        assert time.monotonic() - started < 1 and info.value.status == "RESOURCE_EXHAUSTED"
        message = str(info.value)
        assert (
            "worker 0's pull of step 1" in message
            and "while waits hold 1 of this server's 2 RPC threads (--threads)" in message
        )
        assert "start ps-server with --threads >= 2 x workers + 2 (6)" in message
        assert shard.push_stamped([push(B, np.ones((len(B), 4)))], 1, 0, 0, stamp(1, 0, sync=True)) == (1, len(B), 1)
        assert waiting.join() == [(1, len(A), 1)]
    finally:
        shard.close()


def test_a_contribution_refused_for_want_of_threads_fails_its_step_for_every_contributor(tmp_path):
    shard = open_shard(tmp_path, threads=2)
    try:
        three = dict(num_workers=3, sync=True, barrier_timeout_s=5)
        waiting = Concurrently(
            lambda: shard.push_stamped([push(A, np.ones((len(A), 4)))], 1, 0, 0, stamp(0, 0, **three))
        )
        wait_until(lambda: 0 in shard.jobs.sync.steps, 30, "worker 0's push to wait")
        with pytest.raises(RpcThreadsExhaustedError, match=r"--threads >= 2 x workers \+ 2 \(8\)"):
            shard.push_stamped([push(B, np.ones((len(B), 4)))], 1, 0, 0, stamp(1, 0, **three))
        with pytest.raises(RpcThreadsExhaustedError, match="worker 1's sync push of step 0"):
            waiting.join()
        assert (shard.pull("emb", A) == 0).all() and shard.clock == 0 and not shard.jobs.sync.steps
    finally:
        shard.close()


def test_a_sum_applied_after_a_job_switch_changes_nothing_of_the_new_job():
    """Job JOB's step 3 is being applied when a stamp of another job comes: that job's steps are its own, each
    applied once, none taken for the old job's step."""
    held, applied, release = {}, [], threading.Event()

    def apply(pushes, advance_clock, key, seq):
        if key == sync_key(JOB):
            release.wait(30)
        applied.append((key, seq))
        held[key] = seq

    jobs = JobClocks(0, lambda key: held.get(key, 0), threads=8, max_count=MAX_COUNT_PER_ID)
    one = [push(A[:3], np.ones((3, 4)), np.ones(3, np.float32), np.zeros(3, np.float32))]
    old = Concurrently(
        lambda: jobs.push_sync(WorkerStamp(JOB, 0, 1, 3, sync=True, barrier_timeout_s=0.5), one, 1, apply)
    )
    wait_until(lambda: 3 in jobs.sync.steps and jobs.sync.steps[3].applying, 30, "job JOB's step 3 to be applied")
    other = JOB + 1
    time.sleep(0.6)  # no stamp of JOB for its barrier timeout: another job may start
    assert jobs.wait_for_pull(WorkerStamp(other, 0, 1, 0)) == 0  # the job switch
    release.set()
    old.join()
    for s in range(5):
        assert jobs.push_sync(WorkerStamp(other, 0, 1, s, sync=True), one, 1, apply) == (3, s + 1)
    assert applied == [(sync_key(JOB), 4)] + [(sync_key(other), s + 1) for s in range(5)]


# ---- bounded staleness ----------------------------------------------------------------------------------


def ssp_push(shard, worker: int, step: int, ids, **kw) -> tuple:
    kw.setdefault("staleness", 2)
    return shard.push_stamped([push(ids, np.ones((len(ids), 4)))], 0, 0, 0, stamp(worker, step, **kw))


def test_a_pull_waits_for_the_slowest_worker_within_its_staleness_and_no_longer(tmp_path):
    shard = open_shard(tmp_path)
    try:
        for s in range(5):
            assert ssp_push(shard, 0, s, A)[2] == 0  # worker 1 has pushed nothing: min_clock 0
        for s in range(2):
            ssp_push(shard, 1, s, B)
        assert shard.jobs.min_clock() == 2
        assert shard.jobs.wait_for_pull(stamp(0, 4, staleness=2)) == 2  # 4 - 2 <= 2: served at once
        pushed = threading.Event()
        served = []

        def pull():
            low = shard.jobs.wait_for_pull(stamp(0, 5, staleness=2))  # needs worker 1's step 2 (min_clock 3)
            served.append((pushed.is_set(), low))

        waiting = Concurrently(pull)
        time.sleep(0.3)  # the pull must still be waiting: worker 1 has pushed steps 0 and 1 only
        assert not served
        pushed.set()
        assert ssp_push(shard, 1, 2, B)[2] == 3
        waiting.join(30)  # served once worker 1's step 2 is in
        assert served == [(True, 3)]
        assert shard.jobs.max_gap == 2 and shard.stats()["max_gap"] == 2  # step 5 served at min_clock 3
    finally:
        shard.close()


def test_a_pull_past_its_deadline_names_every_worker_it_waited_for(tmp_path):
    shard = open_shard(tmp_path)
    try:
        for s in range(7):
            ssp_push(shard, 0, s, A)
        ssp_push(shard, 1, 0, B)
        with pytest.raises(BarrierTimeoutError) as info:
            shard.jobs.wait_for_pull(stamp(0, 7, staleness=1, num_workers=2, barrier_timeout_s=0.3))
        message = str(info.value)
        assert message.startswith("shard 0: worker 0's pull of step 7 (staleness 1) waited 0.3")
        assert "for worker 1 (at step 1) of job" in message and "the job stops" in message
        assert "worker 0 (" not in message  # worker 0 is at step 7, not waited for
    finally:
        shard.close()


def test_holds_back_to_back_pause_a_pulls_deadline_and_a_dead_worker_still_stops_the_job(tmp_path):
    """A saver holding the shard more often than the barrier timeout (0.3 s holds 0.3 s apart; 1 s timeout): each
    hold's time is left out of the pull's wait, and worker 1, which never pushes, still times the pull out while the
    holds go on, after 1 s of the wait that no hold took."""
    shard = open_shard(tmp_path)
    gate, done, capped = shard.checkpoints.gate, threading.Event(), []

    def hold_back_to_back() -> None:
        give_up = time.monotonic() + 15
        while not done.is_set():
            if time.monotonic() > give_up:
                capped.append(True)
                return
            _, token = shard.hold(60)
            time.sleep(0.3)
            shard.release(token)
            time.sleep(0.3)

    holder = threading.Thread(target=hold_back_to_back, daemon=True)
    try:
        holder.start()
        wait_until(lambda: gate.held_s(time.monotonic()) > 0, 10, "the first hold")
        started = time.monotonic()
        held_before = gate.held_s(started)
        with pytest.raises(BarrierTimeoutError) as info:
            shard.jobs.wait_for_pull(stamp(0, 1, sync=True, barrier_timeout_s=1.0))
        ended = time.monotonic()
        done.set()
        join_thread(holder, 10, "the holder")
        assert not capped, "the pull did not time out while holds went on"
        held = gate.held_s(ended) - held_before
        assert held > 0 and ended - started - held > 0.999, (ended - started, held)  # 1 s not held, at least
        assert re.search(r"waited 1(\.\d+)? s \(and [\d.]+ s while checkpoints held its pushes\) for worker 1",
                         str(info.value)), info.value  # fmt: skip
    finally:
        done.set()
        shard.close()


def test_a_pull_timeout_names_the_others_not_the_caller_whose_own_step_waits_for_them(tmp_path):
    """Worker 0's pull of step 1 needs every clock at 1, its own too (its sync step 0 waits for worker 1): the
    timeout names worker 1, the one to look at."""
    shard = open_shard(tmp_path)
    try:
        with pytest.raises(BarrierTimeoutError) as info:
            shard.jobs.wait_for_pull(stamp(0, 1, sync=True, barrier_timeout_s=0.2))
        unheard = "not heard from here: not started, or cut off"
        assert f"for worker 1 (at step 0; {unheard}) of job" in str(info.value)
        assert "worker 0 (" not in str(info.value)
    finally:
        shard.close()


def test_a_stamp_of_another_job_is_refused_while_the_job_runs_and_starts_it_once_that_one_is_over(tmp_path):
    """A second job's stamps are refused, changing nothing, while the job followed runs; once no stamp of it has
    come for its barrier timeout (its workers are gone) the new job starts, and a job whose workers are all done
    gives way at once."""
    shard = open_shard(tmp_path)
    try:
        ssp_push(shard, 0, 0, A, barrier_timeout_s=3.0)  # the refusals below come well inside it
        busy = (
            r"shard 0 holds job .* \(sync or ssp, 2 of its 2 workers not done, .*cannot train here: .* holds it "
            r"for .* s more .*: wait that long; if they run, wait for the job's end, or stop it; nothing"
        )
        with pytest.raises(JobConflictError, match=busy):
            shard.jobs.wait_for_pull(WorkerStamp(JOB + 1, 0, 3, 0))
        with pytest.raises(JobConflictError, match=busy):
            shard.push_stamped([push(B, np.ones((len(B), 4)))], 0, 0, 0, WorkerStamp(JOB + 1, 0, 3, 0))
        assert (shard.pull("emb", B) == 0).all() and shard.stats()["job"] == JOB  # nothing applied
        time.sleep(3.2)
        assert shard.jobs.wait_for_pull(WorkerStamp(JOB + 1, 0, 3, 0)) == 0  # JOB's workers are gone: a new job of 3
        assert shard.stats()["job"] == JOB + 1 and shard.stats()["num_workers"] == 3
        for w in range(3):
            shard.jobs.finish(WorkerStamp(JOB + 1, w, 3, 0))
        assert shard.jobs.wait_for_pull(WorkerStamp(JOB + 2, 0, 1, 0)) == 0  # every worker done: over at once
        assert shard.stats()["job"] == JOB + 2
    finally:
        shard.close()


@pytest.mark.parametrize("sync", [True, False])
def test_a_worker_that_stops_before_its_end_stops_the_job_at_once_and_frees_the_shard(tmp_path, sync):
    """Worker 1's stop stamp ends worker 0's wait at once (not at its 30 s barrier), naming worker 1 and why;
    nothing of the step is applied, later stamps of the job are refused the same way, and another job may start
    at once. A stop stamp of a job the shard does not follow changes nothing."""
    shard = open_shard(tmp_path)
    try:
        ssp_push(shard, 0, 0, A)
        ssp_push(shard, 1, 0, B)
        before = shard.pull("emb", A).copy()
        shard.push_stamped([], 0, 0, 0, WorkerStamp(JOB + 7, 0, 2, 0, stopped="not this job"))  # not followed: nothing
        assert shard.stats()["job"] == JOB and shard.jobs.tenancy.stopped is None
        if sync:
            waiting = Concurrently(lambda: shard.push_stamped([push(A, np.ones((len(A), 4)))], 0, 11, 0,
                                                              stamp(0, 1, sync=True)))  # fmt: skip
            wait_until(lambda: shard.jobs.sync.steps, 10, "worker 0's contribution")
        else:
            waiting = Concurrently(lambda: shard.jobs.wait_for_pull(stamp(0, 4, staleness=2)))
            wait_until(lambda: shard.jobs._waiting, 10, "worker 0's pull to wait")
        started = time.monotonic()
        shard.push_stamped([], 0, 0, 0, stamp(1, 0, acked=1, stopped="interrupted (Ctrl-C)"))
        why = r"job 24301 stops: worker 1 stopped before its end \('interrupted \(Ctrl-C\)'\); start the job anew"
        with pytest.raises(BarrierTimeoutError, match=why):
            waiting.join()
        assert time.monotonic() - started < 5
        assert (shard.pull("emb", A) == before).all()
        with pytest.raises(BarrierTimeoutError, match=why):
            ssp_push(shard, 0, 1, A)
        assert shard.jobs.wait_for_pull(WorkerStamp(JOB + 1, 0, 1, 0)) == 0  # another job starts at once
        assert shard.stats()["job"] == JOB + 1
    finally:
        shard.close()


def test_an_ssp_worker_pushing_from_a_second_process_stops_the_job(tmp_path):
    """Worker 1 restarted mid-job (another client id) would train its share again: refused, nothing applied, and
    the job stops for every worker."""
    shard = open_shard(tmp_path)
    try:
        for s in range(3):
            shard.push_stamped([push(A, np.ones((len(A), 4)))], 0, 11, s + 1, stamp(0, s, staleness=2))
            shard.push_stamped([push(B, np.ones((len(B), 4)))], 0, 12, s + 1, stamp(1, s, staleness=2))
        shard.push_stamped([push(B, np.ones((len(B), 4)))], 0, 12, 4, stamp(1, 3, staleness=2))  # a retry: fine
        before = shard.pull("emb", B).copy()
        restarted = r"job .* stops: worker 1's push of step 0 comes from another process .*its clock here is 4"
        with pytest.raises(JobConflictError, match=restarted):
            shard.push_stamped([push(B, np.ones((len(B), 4)))], 0, 13, 1, stamp(1, 0, staleness=2))
        assert (shard.pull("emb", B) == before).all()
        with pytest.raises(JobConflictError, match=restarted):  # worker 0 hears why at once
            shard.jobs.wait_for_pull(stamp(0, 3, staleness=2))
    finally:
        shard.close()


# ---- bad stamps -----------------------------------------------------------------------------------------


@pytest.fixture
def server1(servers):
    addresses, (server,) = servers(1)
    channel = grpc.insecure_channel(addresses[0])
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(SGD)))
    yield addresses, stub, server.shard
    channel.close()


def push_request(ids, value: float = 1.0, add_delta: bool = False) -> ps_pb2.PushRequest:
    grads = wire.encode_rows(np.full((len(ids), 4), value, np.float32))
    return ps_pb2.PushRequest(table="emb", ids=wire.encode_ids(ids), grads=grads, dim=4, add_delta=add_delta)


def test_bad_stamps_are_invalid_arguments_and_change_nothing(server1):
    _, stub, shard = server1
    good = dict(job=JOB, worker=0, num_workers=2, step=0)
    stub.PushBatch(ps_pb2.PushBatchRequest(pushes=[push_request(A)], stamp=ps_pb2.WorkerStamp(**good)))
    before = (shard.table("emb").peek(A), shard.journal.next_seq, shard.jobs.stats(), shard.clock)
    bad = [
        ({"job": 0}, "job 0 is no job id"),
        ({"worker": 2}, "worker 2 is out of range for a job of 2 workers"),
        ({"num_workers": 0}, "num_workers 0 is out of range"),
        ({"barrier_timeout_s": -1.0}, "barrier_timeout_s -1.0 is out of range"),
        ({"barrier_timeout_s": float("nan")}, "barrier_timeout_s nan is out of range"),
        ({"step": 2**50}, "is past the largest step"),
        ({"acked": 1}, "acked 1 is past step 0"),
    ]
    for fields, fragment in bad:
        s = ps_pb2.WorkerStamp(**{**good, **fields})
        pull = ps_pb2.PullBatchRequest(pulls=[ps_pb2.PullRequest(table="emb", ids=b"")], stamp=s)
        for method, request in ((stub.PullBatch, pull), (stub.PushBatch, ps_pb2.PushBatchRequest(stamp=s))):
            with pytest.raises(grpc.RpcError) as info:
                method(request)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
            assert fragment in info.value.details()
    refusals = [
        (ps_pb2.PullBatchRequest(stamp=ps_pb2.WorkerStamp(**good, done=True)), "not by a pull"),
        (ps_pb2.PullBatchRequest(stamp=ps_pb2.WorkerStamp(**good, stopped="x")), "stopped is said by a PushBatch"),
        (ps_pb2.PushBatchRequest(pushes=[push_request(A)], stamp=ps_pb2.WorkerStamp(**good, stopped="x")),
         "a stop stamp comes in a PushBatch without pushes"),
        (ps_pb2.PushBatchRequest(stamp=ps_pb2.WorkerStamp(**good, done=True, stopped="x")), "not both"),
        (ps_pb2.PushBatchRequest(stamp=ps_pb2.WorkerStamp(**good, stopped="x" * 1001)), "stopped of 1,001 characters"),
        (ps_pb2.PushBatchRequest(stamp=ps_pb2.WorkerStamp(**good, stopped_by="InvalidArgumentError")), "no stopped"),
        (ps_pb2.PushBatchRequest(stamp=ps_pb2.WorkerStamp(**good, stopped="x", stopped_by="E" * 101)),
         "stopped_by of 101 characters"),
        (ps_pb2.PushBatchRequest(pushes=[push_request(A)], stamp=ps_pb2.WorkerStamp(**good, done=True)),
         "without pushes"),
        (ps_pb2.PushBatchRequest(pushes=[push_request(A, add_delta=True)], stamp=ps_pb2.WorkerStamp(**good, sync=True)),
         "is add_delta, which a sync push cannot carry"),
        (ps_pb2.PushBatchRequest(pushes=[push_request(A, np.nan)], stamp=ps_pb2.WorkerStamp(**good, sync=True)),
         "non-finite"),
        (ps_pb2.PullBatchRequest(stamp=ps_pb2.WorkerStamp(**good, unclocked=True)),
         "unclocked (an async or geo worker's) is said by a PushBatch, not by a pull"),
        (ps_pb2.PushBatchRequest(pushes=[push_request(A)], stamp=ps_pb2.WorkerStamp(**good, sync=True, unclocked=True)),
         "says sync (its step summed over the job's workers) or unclocked (async or geo), not both"),
        (ps_pb2.PullBatchRequest(stamp=ps_pb2.WorkerStamp(**good, apart=True)), "apart (a push that ends none of its "
         "worker's steps here) is said by a PushBatch, not by a pull"),
        (ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(SGD), stamp=ps_pb2.WorkerStamp(**good, apart=True)),
         "is said by a PushBatch, not by a CreateTable; nothing was created"),
        (ps_pb2.PushBatchRequest(pushes=[push_request(A)], stamp=ps_pb2.WorkerStamp(**good, apart=True, sync=True)),
         "that is no sync contribution, not done and not stopped; this one says sync"),
        (ps_pb2.PushBatchRequest(pushes=[push_request(A)], advance_clock=1, stamp=ps_pb2.WorkerStamp(**good, apart=True)),
         "stamped apart ends none of its worker's steps, so it advances no clock; this one advances it by 1"),
        (ps_pb2.PushBatchRequest(stamp=ps_pb2.WorkerStamp(**good, apart=True, done=True)), "this one says done"),
        (ps_pb2.PushBatchRequest(stamp=ps_pb2.WorkerStamp(**good, apart=True, stopped="x")), "this one says stopped"),
        *[(ps_pb2.PushBatchRequest(pushes=[push_request(A)], stamp=ps_pb2.WorkerStamp(**good, job_name=name)),
           f"bad worker stamp: job_name {said} is not a name of 1 to 100 printable ASCII characters (empty: none)")
          for name, said in [("\x1b[2Jj3\n", r"'\x1b[2Jj3\n'"), ("j\u00f6b", r"'j\xf6b'"), ("\u202ej3", r"'\u202ej3'"),
                             ("j" * 101, "'" + "j" * 39 + "... (101 characters)")]],
        (ps_pb2.PullBatchRequest(stamp=ps_pb2.WorkerStamp(**good, job_name="j\tb")), r"job_name 'j\tb' is not a name"),
        *[(request(job_name=name), f"bad worker stamp: job_name {said} is not the name of job {JOB}, the stamp's (its "
           f"hash is {job_hash(name)}): a stamp names its own job")  # another job's name, or no job's
          for request in (lambda **kw: ps_pb2.PullBatchRequest(stamp=ps_pb2.WorkerStamp(**good, **kw)),
                          lambda **kw: ps_pb2.PushBatchRequest(pushes=[push_request(A)], stamp=ps_pb2.WorkerStamp(**good, **kw)),
                          lambda **kw: ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(SGD),
                                                                 stamp=ps_pb2.WorkerStamp(**good, **kw)))
          for name, said in [("j3", "'j3'"), ("it's \"j3\"", "'it\\'s \"j3\"'")]],
        (ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(SGD), stamp=ps_pb2.WorkerStamp(**good,
                                                                                               job_name="a\x00")),
         r"job_name 'a\x00' is not a name of 1 to 100 printable ASCII characters (empty: none); nothing was created"),
        (ps_pb2.PushBatchRequest(pushes=[push_request(A)], stamp=ps_pb2.WorkerStamp(**good, apart=True,
                                                                                    unclocked=True)),
         "this one says unclocked"),
    ]  # fmt: skip
    methods = {ps_pb2.PullBatchRequest: stub.PullBatch, ps_pb2.PushBatchRequest: stub.PushBatch,
               ps_pb2.CreateTableRequest: stub.CreateTable}  # fmt: skip
    for request, fragment in refusals:
        method = methods[type(request)]
        with pytest.raises(grpc.RpcError) as info:
            method(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in info.value.details()
        assert info.value.details().isascii() and info.value.details().isprintable()  # nothing of it printed raw
    after = (shard.table("emb").peek(A), shard.journal.next_seq, shard.jobs.stats(), shard.clock)
    assert (before[0] == after[0]).all() and before[1:] == after[1:] and not shard.jobs.sync.steps
    assert shard.jobs._done == [False, False] and shard.jobs.tenancy.stopped is None  # done and stopped refused too
    # another worker count: refused, and the job stops
    s = ps_pb2.WorkerStamp(**{**good, "num_workers": 3, "worker": 2})
    with pytest.raises(grpc.RpcError) as info:
        stub.PushBatch(ps_pb2.PushBatchRequest(pushes=[push_request(A)], stamp=s))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    count = "job 24301 stops: worker 2 says the job has 3 workers; it started here with 2 (worker 0's first stamp)"
    assert count in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.PushBatch(ps_pb2.PushBatchRequest(pushes=[push_request(A)], stamp=ps_pb2.WorkerStamp(**good)))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and count in info.value.details()
    assert (shard.table("emb").peek(A) == before[0]).all() and shard.journal.next_seq == before[1]


def test_waits_whose_callers_left_free_their_threads_at_once(server1):
    """Stamped pulls and sync pushes whose callers gave up (a 1 s deadline, against a 60 s barrier) stop waiting
    then: they do not hold the server's RPC threads until their barrier timeout, so the job's other workers are
    not refused for want of threads; a sync contribution whose caller left still counts in its step."""
    _, stub, shard = server1
    stamp = dict(job=JOB, num_workers=2, barrier_timeout_s=60)

    def gives_up(request, method):
        with pytest.raises(grpc.RpcError) as info:
            method(request, timeout=1.0)
        return info.value.code()

    pull = ps_pb2.PullBatchRequest(pulls=[ps_pb2.PullRequest(table="emb", ids=b"")],
                                   stamp=ps_pb2.WorkerStamp(worker=0, step=5, **stamp))  # fmt: skip
    sync = ps_pb2.PushBatchRequest(pushes=[push_request(A, 1.0)], client_id=21, seq=1,
                                   stamp=ps_pb2.WorkerStamp(worker=0, step=0, sync=True, **stamp))  # fmt: skip
    calls = [lambda: gives_up(pull, stub.PullBatch)] * 5 + [lambda: gives_up(sync, stub.PushBatch)]
    assert set(Concurrently(*calls).join()) == {grpc.StatusCode.DEADLINE_EXCEEDED}
    wait_until(lambda: shard.jobs._waiting == 0, 5, "the waits whose callers left to end")
    other = ps_pb2.PushBatchRequest(pushes=[push_request(A, 2.0)], client_id=22, seq=1,
                                    stamp=ps_pb2.WorkerStamp(worker=1, step=0, sync=True, **stamp))  # fmt: skip
    assert stub.PushBatch(other, timeout=10).num_applied == len(A)  # worker 0's contribution was kept
    np.testing.assert_array_equal(shard.pull("emb", A), np.full((len(A), 4), -3.0, np.float32))


def test_a_stopping_server_ends_the_waits_of_jobs_first(servers):
    """A stamped pull waiting for a worker (60 s barrier) ends with UNAVAILABLE as its server stops, which takes
    no longer than the stop itself: the client sends it again, to the restarted shard."""
    addresses, (server,) = servers(1)
    channel = grpc.insecure_channel(addresses[0])
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(SGD)))
    pull = ps_pb2.PullBatchRequest(pulls=[ps_pb2.PullRequest(table="emb", ids=b"")],
                                   stamp=ps_pb2.WorkerStamp(job=JOB, worker=0, num_workers=2, step=5,
                                                            barrier_timeout_s=60))  # fmt: skip

    def waits():
        with pytest.raises(grpc.RpcError) as info:
            stub.PullBatch(pull, timeout=60)
        return info.value.code()

    waiting = Concurrently(waits)
    wait_until(lambda: server.shard.jobs._waiting == 1, 10, "the pull to wait")
    started = time.monotonic()
    server.stop(grace_s=30)
    assert waiting.join() == [grpc.StatusCode.UNAVAILABLE]
    assert time.monotonic() - started < 10  # not the 30 s grace, nor the 60 s barrier
    channel.close()


def test_a_client_cannot_push_under_a_jobs_sync_key(server1):
    """A PushBatch whose client_id is a job's sync key (computable from the job id) is applied under another key:
    it cannot make the journal say the job's steps were applied, so the job's sums are applied, not dropped."""
    _, stub, shard = server1
    stub.PushBatch(ps_pb2.PushBatchRequest(client_id=sync_key(JOB), seq=100))  # no pushes: only a request number
    assert shard.journal.applied.get(sync_key(JOB)) is None

    def contribute(worker: int, value: float):
        s = ps_pb2.WorkerStamp(job=JOB, worker=worker, num_workers=2, step=0, sync=True, barrier_timeout_s=30)
        request = ps_pb2.PushBatchRequest(pushes=[push_request(A, value)], client_id=11 + worker, seq=1, stamp=s)
        return stub.PushBatch(request, timeout=60).num_applied

    assert Concurrently(lambda: contribute(0, 1.0), lambda: contribute(1, 2.0)).join() == [len(A), len(A)]
    np.testing.assert_array_equal(shard.pull("emb", A), np.full((len(A), 4), -3.0, np.float32))


def test_a_stamp_of_another_worker_count_stops_the_job_and_ends_the_waits_in_process(tmp_path):
    shard = open_shard(tmp_path)
    try:
        ssp_push(shard, 0, 0, A)
        waiting = Concurrently(lambda: shard.jobs.wait_for_pull(stamp(0, 2, staleness=0)))  # for worker 1's step 0
        wait_until(lambda: shard.jobs._waiting == 1, 30, "worker 0's pull")
        started = time.monotonic()
        with pytest.raises(InvalidArgumentError, match="worker 1 says the job has 4 workers; it started here with 2"):
            shard.push_stamped([push(A, np.ones((len(A), 4)))], 0, 0, 0, stamp(1, 0, num_workers=4))
        with pytest.raises(InvalidArgumentError, match="says the job has 4 workers"):
            waiting.join()
        assert time.monotonic() - started < 10  # not the 30 s deadline
        assert (shard.pull("emb", A) == -1).all()
    finally:
        shard.close()


# ---- the client over gRPC -------------------------------------------------------------------------------


def test_clients_stamps_reach_every_shard_and_return_min_clock(servers):
    addresses, started = servers(2)
    ids = [random_ids(50, seed=10)] * 2  # both workers push the same ids: each step adds -(1 + 2) to a row
    history: list[list] = [[], []]

    def worker(w):
        with Client(addresses, timeout_s=30) as client:
            client.create_table(SGD)
            for s in range(3):
                pull = WorkerStamp(JOB, w, 2, s, staleness=0, sync=True, barrier_timeout_s=30)
                rows, pulled_min = client.pull_many([("emb", ids[w])], stamp=pull)
                grads = np.full((len(ids[w]), 4), float(w + 1), np.float32)
                returned, pushed_min = client.push_many([("emb", ids[w], grads, None)], advance_clock=1,
                                                        return_rows=True, stamp=pull)  # fmt: skip
                history[w].append((pulled_min, pushed_min, rows[0][:, 0].copy(), returned[0][:, 0].copy()))
            return client.finish(WorkerStamp(JOB, w, 2, 3))

    Concurrently(lambda: worker(0), lambda: worker(1)).join()
    for w in range(2):
        for s, (pulled_min, pushed_min, rows, returned) in enumerate(history[w]):
            assert pulled_min == s and pushed_min == s + 1  # a pull of step s is served once every step < s is in
            np.testing.assert_array_equal(rows, np.full(len(ids[w]), -3.0 * s))  # both workers' steps < s
            np.testing.assert_array_equal(returned, np.full(len(ids[w]), -3.0 * (s + 1)))
    for server in started:  # every shard followed the job and got every step once
        stats = server.shard.stats()
        assert (stats["job"], stats["num_workers"], stats["min_clock"], server.shard.clock) == (JOB, 2, 3, 3)
        assert server.shard.journal.applied[sync_key(JOB)][0] == 3


def test_an_ssp_row_cache_never_takes_rows_of_a_split_push_as_fresh_at_its_stamped_batchs_clock(servers):
    """ssp, staleness 1: worker 0's push of step 0 reaches its shard as two PushBatch calls (a message holds one id
    here), the stamp on the second; worker 1 pushes step 0 on id 1 between them. The stamped reply says min_clock 1,
    but id 1's row came back with the first call, before worker 1's push: at step 2, which must see every worker's
    step 0, worker 0 reads the rows a pull gives, not that row from its cache."""
    from worker.batch import TableIds
    from worker.rowcache import RowCache
    from worker.steprows import ClockedRows

    addresses, _ = servers(1)
    ids = np.array([1, 2], np.uint64)
    tids = {"emb": TableIds(ids, {}, np.ones(2, np.float32), np.zeros(2, np.float32))}
    with Client(addresses, timeout_s=30, max_request_bytes=32) as client, Client(addresses, timeout_s=30) as other:
        client.create_table(SGD)
        calls, other_pushed = client._outcomes, []

        def worker_1_pushes_after_the_first_call(*args, **kw):
            replies = calls(*args, **kw)
            if not other_pushed:
                grads = np.full((1, 4), 2.0, np.float32)
                other_pushed.append(
                    other.push_many([("emb", ids[:1], grads)], advance_clock=1, stamp=stamp(1, 0, staleness=1))
                )
            return replies

        client._outcomes = worker_1_pushes_after_the_first_call

        class Spec:
            def row_dim(self, table):
                return 4

        source = ClockedRows(client, Spec(), stamp(0, 0, staleness=1), RowCache(1 << 20, {"emb": 4}), depth=1)
        source.push(0, tids, {"emb": np.ones((2, 4), np.float32)}, [])
        assert len(other_pushed) == 1  # the push was two calls, worker 1's push between them
        rows = source.rows(2, tids, source.prepare(2, tids))["emb"]
        np.testing.assert_array_equal(rows, client.pull("emb", ids))
        np.testing.assert_array_equal(rows[:, 0], [-3.0, -1.0])  # id 1: both workers' gradients


@pytest.mark.parametrize("mode", ["sync", "ssp"])
def test_a_push_apart_of_several_messages_carries_the_job_on_every_one_and_another_jobs_shard_refuses_it_whole(
    servers, mode
):
    """A worker's push sent apart from its steps (early stopping's restore of the best model) that takes several
    PushBatch messages per shard stamps each of them: once its job's tenancy lapsed (the worker silent past its barrier
    timeout, in a long validation) and another job took the shard, the shard refuses its first message
    (FAILED_PRECONDITION) and none of it is applied."""
    from worker.batch import TableIds
    from worker.steprows import ClockedRows

    addresses, (server,) = servers(1)
    ids = np.arange(1, 41, dtype=np.uint64)
    tids = {"emb": TableIds(ids[:2], {}, np.ones(2, np.float32), np.zeros(2, np.float32))}

    class Spec:
        def row_dim(self, table):
            return 4

    with Client(addresses, timeout_s=30, max_request_bytes=200) as client, Client(addresses, timeout_s=30) as other:
        client.create_table(SGD)
        mine = stamp(0, 0, num_workers=1, sync=mode == "sync", staleness=1 if mode == "ssp" else 0,
                     barrier_timeout_s=0.3)  # fmt: skip
        source = ClockedRows(client, Spec(), mine)
        source.push(0, tids, {"emb": np.ones((2, 4), np.float32)}, [])  # its step 0: the shard holds the job

        def taken() -> bool:  # by another job, once the tenancy of this one lapsed
            try:
                other.pull_many([("emb", ids[:1])], stamp=WorkerStamp(JOB + 1, 0, 1, 0, staleness=1))
            except JobConflictError:
                return False
            return True

        wait_until(taken, 10, "the other job taking the shard")
        before = client.pull("emb", ids)
        with pytest.raises(JobConflictError, match=f"holds job {JOB + 1}") as refused:
            source.push_apart([("emb", ids, np.ones((len(ids), 4), np.float32))], add_delta=True)  # 40 ids: 5 messages
        assert refused.value.status == "FAILED_PRECONDITION"
        np.testing.assert_array_equal(client.pull("emb", ids), before)
    assert server.shard.stats()["job"] == JOB + 1


def test_an_ssp_step_push_of_several_messages_stamps_each_and_moves_the_workers_clock_at_its_last(servers):
    """ssp: a step's push that takes several messages per shard (one id each here) stamps every one with the step,
    marked apart but for the last, which moves no clock: the worker's clock on the shard moves to step + 1 only
    with the last message, once the shard holds the whole step; the first step's messages too."""
    addresses, (server,) = servers(1)
    ids = np.array([1, 2, 3], np.uint64)
    with Client(addresses, timeout_s=30, max_request_bytes=32) as client:
        client.create_table(SGD)
        calls, seen = client._outcomes, []

        def noted(batch, *args, **kw):  # each wave's stamped step and apart, then the worker's clock on the shard
            replies = calls(batch, *args, **kw)
            ((_, _, request),) = batch
            seen.append((request.stamp.step, request.stamp.apart, server.shard.stats()["min_clock"]))
            return replies

        client._outcomes = noted
        for step in range(2):
            client.push_many([("emb", ids, np.ones((3, 4), np.float32))], advance_clock=1,
                             stamp=stamp(0, step, num_workers=1, staleness=1, acked=step))  # fmt: skip
    assert seen == [(0, True, 0), (0, True, 0), (0, False, 1), (1, True, 1), (1, True, 1), (1, False, 2)]
    np.testing.assert_array_equal(server.shard.pull("emb", ids), np.full((3, 4), -2.0))  # both steps, once each
    assert server.shard.clock == 2  # advance_clock: with the last message only


def test_a_clocked_push_builds_the_apart_stamp_only_where_a_shard_gets_several_messages(servers, monkeypatch):
    """The apart stamp (a shard's messages before its last) is built only for a push where some shard gets more
    than one message, not on every step: a step of one message per shard builds the step's stamp alone."""
    addresses, _ = servers(2)
    ids = np.arange(1, 7, dtype=np.uint64)
    built, real = [], codec.stamp_to_proto

    def noted(s: WorkerStamp) -> ps_pb2.WorkerStamp:
        built.append(s.apart)
        return real(s)

    monkeypatch.setattr(codec, "stamp_to_proto", noted)
    with Client(addresses, timeout_s=30) as client:
        client.create_table(SGD)
        for step, max_request_bytes, want in ((0, client.max_request_bytes, [False]), (1, 32, [False, True])):
            built.clear()
            client.max_request_bytes = max_request_bytes  # 32: one id a message, several messages a shard
            client.push_many([("emb", ids, np.ones((len(ids), 4), np.float32))], advance_clock=1,
                             stamp=stamp(0, step, num_workers=1, staleness=1, acked=step))  # fmt: skip
            assert built == want, step
        np.testing.assert_array_equal(client.pull("emb", ids), np.full((len(ids), 4), -2.0))  # both steps, once


def test_a_first_ssp_step_of_several_messages_on_a_shard_another_job_holds_is_refused_whole(servers):
    """An ssp worker's first step, three messages on its shard, while another job holds the shard: every message
    carries the job's stamp (apart but for the last), so the shard refuses the first (FAILED_PRECONDITION), the
    push stops there, and none of the step is applied."""
    addresses, (server,) = servers(1)
    ids = np.array([1, 2, 3], np.uint64)
    with Client(addresses, timeout_s=30, max_request_bytes=32) as client:
        client.create_table(SGD)
        client.pull_many([("emb", ids[:1])], stamp=WorkerStamp(JOB + 1, 0, 1, 0, staleness=1))  # the other job's
        before = client.pull("emb", ids)
        with pytest.raises(JobConflictError, match=f"holds job {JOB + 1}") as refused:
            client.push_many([("emb", ids, np.ones((3, 4), np.float32))], advance_clock=1,
                             stamp=stamp(0, 0, num_workers=1, staleness=1))  # fmt: skip
        assert refused.value.status == "FAILED_PRECONDITION"
        np.testing.assert_array_equal(client.pull("emb", ids), before)
    assert server.shard.stats()["job"] == JOB + 1 and server.shard.clock == 0


def test_an_apart_stamp_holds_the_shard_for_its_job_moves_no_clock_and_is_applied_once(tmp_path):
    """A PushBatch stamped apart (a message of a step before the shard's last, or a push sent apart from the
    steps) is applied, starts and holds the shard for its job (another job's stamp is refused), moves no clock, and
    sent again (same client and seq) is applied once; the step's last message, not apart, moves the clock. Its
    client is its worker's process, as a step's: a push of the worker from another one is refused."""
    shard = open_shard(tmp_path)
    ids = np.array([1, 2], np.uint64)
    apart = stamp(0, 3, num_workers=1, staleness=1, apart=True)
    for _ in range(2):  # the second: a retry of the first
        shard.push_stamped([push(ids, np.ones((2, 4)))], 0, 77, 1, apart)
        assert shard.jobs._clocks == [0] and shard.clock == 0
    np.testing.assert_array_equal(shard.pull("emb", ids), np.full((2, 4), -1.0))
    assert shard.jobs.stats()["job"] == JOB
    with pytest.raises(JobConflictError, match=f"holds job {JOB}"):
        shard.jobs.check(WorkerStamp(JOB + 1, 0, 1, 0, staleness=1), pull=True)
    shard.push_stamped([push(ids, np.ones((2, 4)))], 1, 77, 2, dataclasses.replace(apart, apart=False))
    assert shard.jobs._clocks == [4] and shard.clock == 1
    np.testing.assert_array_equal(shard.pull("emb", ids), np.full((2, 4), -2.0))
    shard.close()
    shard = open_shard(tmp_path / "other")  # the apart push names its worker's process: another one is refused
    shard.push_stamped([push(ids, np.ones((2, 4)))], 0, 77, 1, apart)
    with pytest.raises(JobConflictError, match="comes from another process"):
        shard.push_stamped([push(ids, np.ones((2, 4)))], 0, 88, 1, apart)
    np.testing.assert_array_equal(shard.pull("emb", ids), np.full((2, 4), -1.0))
    shard.close()


def test_a_clients_stop_reaches_every_shard_it_can_and_names_those_it_cannot(servers):
    """Client.stop_job stops the job on each live shard and returns a line for a shard that is down, within its
    deadline, without retrying (a stopping worker does not wait)."""
    addresses, started = servers(2)
    with Client(addresses, timeout_s=30) as client:
        client.create_table(SGD)
        client.pull_many([("emb", A)], stamp=WorkerStamp(JOB, 0, 2, 0, staleness=3))  # both shards follow JOB
        stopped = WorkerStamp(JOB, 0, 2, 0, acked=41)  # a worker past its first steps: acked > step is fine here
        assert client.stop_job(stopped, "ValueError: a bad line") == []
    for server in started:
        assert "worker 0 stopped before its end ('ValueError: a bad line')" in str(server.shard.jobs.tenancy.stopped)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connections are refused
        with Client([addresses[0], closed], timeout_s=30, server_timeout_s=300) as client:
            started_s = time.monotonic()
            lines = client.stop_job(WorkerStamp(JOB + 1, 0, 2, 0), "x" * 5000)
            assert time.monotonic() - started_s < 5
    assert lines == [f"shard 1 at {closed} (connection refused: nothing listens there)"], lines


def test_a_worker_stopped_by_a_refusal_that_stopped_its_job_stops_the_other_shards_with_that_refusal(servers):
    """Two workers of one job with other models race over two shards: worker 0's stamp starts the job on shard 1,
    worker 1's on shard 0. Worker 1 is refused on shard 1 (its setup differs: the job stops there) and stops,
    telling every shard why; shard 0 then stops the job with that refusal, its class and its words naming what
    differs, so worker 0 learns the cause there too, not only that worker 1 stopped. A stop for any other reason
    stays a stop naming the worker (ABORTED), and so does one whose refusal stopped another job or stops none, and
    one of the worker's own error whose words read as a relay (its stamp's stopped_by names no refusal). The worker
    tells the shards through its row source (worker.stopping.abandon), as a training worker does."""
    from worker.steprows import ClockedRows
    from worker.stopping import abandon, stopped_by

    fm, deepfm = SETUP, SETUP.replace("model=fm", "model=deepfm")
    addresses, started = servers(2)
    ids = random_ids(64)
    with Client(addresses, timeout_s=30) as client:
        client.create_table(SGD)
        started[1].shard.jobs.wait_for_pull(WorkerStamp(JOB, 0, 2, 0, setup=fm))  # worker 0 first on shard 1
        started[0].shard.jobs.wait_for_pull(WorkerStamp(JOB, 1, 2, 0, setup=deepfm))  # worker 1 first on shard 0
        mine = WorkerStamp(JOB, 1, 2, 0, setup=deepfm)
        with pytest.raises(InvalidArgumentError, match="shard 1: job 24301 stops: worker 1 runs another setup") as e:
            client.pull_many([("emb", ids)], stamp=mine)
        assert stopped_by(e.value) == "InvalidArgumentError" and stopped_by(ValueError("a bad line")) == ""
        abandon(ClockedRows(client, None, mine), e.value)
        named = r"shard 1: job 24301 stops: worker 1 runs another setup .*'model' 'deepfm' \(the job's: 'fm'\)"
        with pytest.raises(InvalidArgumentError, match=named):  # the cause, shard 1's refusal
            started[0].shard.jobs.wait_for_pull(WorkerStamp(JOB, 0, 2, 0, setup=fm))
        with pytest.raises(InvalidArgumentError, match=named):
            client.pull_many([("emb", ids)], stamp=WorkerStamp(JOB, 0, 2, 0, setup=fm))
        stopped = "worker 1 stopped before its end"
        for job, reason, by in [
            (JOB + 1, "ValueError: a bad line", ""),
            (JOB + 2, f"DiskFullError: shard 1: job {JOB + 2} stops: x", "DiskFullError"),  # stops no job
            (JOB + 3, f"InvalidArgumentError: shard 1: job {JOB} stops: x", "InvalidArgumentError"),  # another job's
            (JOB + 4, f"InvalidArgumentError: shard 1: job {JOB + 4} stops: x", ""),  # no stopped_by
        ]:
            started[0].shard.jobs.wait_for_pull(WorkerStamp(job, 0, 2, 0))
            assert client.stop_job(WorkerStamp(job, 1, 2, 0), reason, by=by) == []
            with pytest.raises(BarrierTimeoutError, match=f"job {job} stops: {stopped}"):
                started[0].shard.jobs.wait_for_pull(WorkerStamp(job, 0, 2, 0))
        own = InvalidArgumentError(f"shard 1: job {JOB + 5} stops: x")  # the worker's own, no shard's refusal
        assert stopped_by(own) == ""
        started[0].shard.jobs.wait_for_pull(WorkerStamp(JOB + 5, 0, 2, 0))
        abandon(ClockedRows(client, None, WorkerStamp(JOB + 5, 1, 2, 0)), own)
        with pytest.raises(BarrierTimeoutError, match=f"job {JOB + 5} stops: {stopped}"):
            started[0].shard.jobs.wait_for_pull(WorkerStamp(JOB + 5, 0, 2, 0))


def test_a_job_named_by_its_workers_is_named_so_in_the_refusal_that_stops_it_and_in_its_relay(servers):
    """Workers given --job-id j3 stamp its name (job is its hash): the refusal that stops the job names it 'j3', not
    the number, and the other shard relays it by that name too; a stamp of the job without the name (a worker
    resumed from its file) is named by the name the shard knows."""
    from worker.steprows import ClockedRows
    from worker.stopping import abandon

    fm, deepfm = SETUP, SETUP.replace("model=fm", "model=deepfm")
    addresses, started = servers(2)
    ids = random_ids(64)
    with Client(addresses, timeout_s=30) as client:
        client.create_table(SGD)
        started[1].shard.jobs.wait_for_pull(WorkerStamp(J3, 0, 2, 0, setup=fm, job_name="j3"))
        started[0].shard.jobs.wait_for_pull(WorkerStamp(J3, 1, 2, 0, setup=deepfm, job_name="j3"))
        mine = WorkerStamp(J3, 1, 2, 0, setup=deepfm)  # no name: the shard's
        with pytest.raises(InvalidArgumentError, match="shard 1: job 'j3' stops: worker 1 runs another setup") as e:
            client.pull_many([("emb", ids)], stamp=mine)
        assert str(J3) not in str(e.value)
        abandon(ClockedRows(client, None, dataclasses.replace(mine, job_name="j3")), e.value)
        named = r"shard 1: job 'j3' stops: worker 1 runs another setup .*'model' 'deepfm' \(the job's: 'fm'\)"
        with pytest.raises(InvalidArgumentError, match=named) as e:  # the cause, shard 1's refusal, relayed
            client.pull_many([("emb", ids)], stamp=WorkerStamp(J3, 0, 2, 0, setup=fm, job_name="j3"))
        assert str(J3) not in str(e.value)


def _first_pull_lost(server, seen: list, what) -> object:
    """A stand-in for the shard's wait_for_pull that records what(stamp) of each stamped pull and answers the first
    UNAVAILABLE (the client sends it again), the others as the shard does."""
    real = server.shard.jobs.wait_for_pull

    def lost_once(stamp, caller_gone=None):
        seen.append(what(stamp))
        if len(seen) == 1:
            raise ShardClosingError("shard 0 is shutting down")
        return real(stamp, caller_gone)

    return lost_once


def test_a_stamped_request_sent_again_carries_the_acked_the_worker_has_then(servers):
    """A pull sent ahead of its step's previous push carries the acked of then; if its shard restarts meanwhile,
    the retry must say what the worker knows now, or the restarted shard holds the worker behind itself."""
    addresses, (server,) = servers(1)
    seen = []
    lost_once = _first_pull_lost(server, seen, lambda stamp: stamp.acked)
    ids = random_ids(8, seed=3)
    with Client(addresses, timeout_s=30, server_timeout_s=30) as client:
        client.create_table(SGD)
        client.push_many([("emb", ids, np.ones((8, 4), np.float32), None)], advance_clock=1,
                         stamp=WorkerStamp(JOB, 0, 1, 0, sync=True))  # fmt: skip
        server.shard.jobs.wait_for_pull = lost_once
        client.pull_many([("emb", ids)], stamp=WorkerStamp(JOB, 0, 1, 1, acked=0))  # sent before step 0's reply
    assert seen == [0, 1]


def test_a_stamp_sent_again_takes_the_acked_of_its_own_worker_not_of_another_of_the_client(servers):
    """One client pushing for two workers of an ssp job: worker 0 has had steps 0 to 2 answered; worker 1's pull of
    step 2, sent again after UNAVAILABLE, still says acked 0 (no step of worker 1 was answered: worker 0's say
    nothing of it), so the shard does not move worker 1's clock to 2 for steps it never got."""
    addresses, (server,) = servers(1)
    seen = []
    lost_once = _first_pull_lost(server, seen, lambda stamp: (stamp.worker, stamp.acked))
    ids = random_ids(8, seed=4)
    with Client(addresses, timeout_s=30, server_timeout_s=30) as client:
        client.create_table(SGD)
        for step in range(3):
            client.push_many([("emb", ids, np.ones((8, 4), np.float32), None)], advance_clock=1,
                             stamp=stamp(0, step, staleness=2, acked=step))  # fmt: skip
        server.shard.jobs.wait_for_pull = lost_once
        client.pull_many([("emb", ids)], stamp=stamp(1, 2, staleness=2))
    assert seen == [(1, 0), (1, 0)]
    assert server.shard.stats()["min_clock"] == 0  # worker 1 pushed no step


def test_two_client_processes_given_one_worker_id_fail_their_sync_step_at_once(servers):
    """Through the Client: sync batches carry the client's id (not a request number), so the shard tells two
    processes given one --worker-id apart instead of waiting out the barrier for the worker neither is."""
    addresses, (server,) = servers(1)
    with Client(addresses, timeout_s=30) as first, Client(addresses, timeout_s=30) as second:
        first.create_table(SGD)
        step = WorkerStamp(JOB, 0, 2, 0, sync=True, barrier_timeout_s=30)
        waiting = Concurrently(lambda: first.push_many([("emb", A, np.ones((len(A), 4)), None)], stamp=step))
        jobs = server.shard.jobs
        wait_until(lambda: 0 in jobs.sync.steps and jobs.sync.steps[0].contributions, 30, "the first push")
        started = time.monotonic()
        duplicate = "two workers of job .* say they are worker 0"
        with pytest.raises(InvalidArgumentError, match=duplicate):
            second.push_many([("emb", A, np.ones((len(A), 4)), None)], stamp=step)
        with pytest.raises(InvalidArgumentError, match=duplicate):
            waiting.join()
        assert time.monotonic() - started < 10  # not the 30 s barrier
        assert (first.pull("emb", A) == 0).all()  # nothing of the step was applied


def test_a_clients_stamped_wait_past_its_deadline_is_aborted_and_not_retried(servers):
    addresses, _ = servers(2)
    with Client(addresses, timeout_s=30) as client:
        client.create_table(SGD)
        client.push_many([("emb", A, np.ones((len(A), 4)), None)], stamp=WorkerStamp(JOB, 0, 2, 0))
        started = time.monotonic()
        with pytest.raises(
            BarrierTimeoutError, match=r"waited 0\.[0-9]+ s for worker 1 \(at step 0; not heard from here: not started"
        ):
            client.pull_many([("emb", A)], stamp=WorkerStamp(JOB, 0, 2, 1, barrier_timeout_s=0.3))
        assert time.monotonic() - started < 10
        rows, low = client.pull_many([("emb", A)], stamp=WorkerStamp(JOB, 1, 2, 0))  # step 0 never waits
        assert low == 0 and (rows[0] == -1).all()
        assert client.finish(WorkerStamp(JOB, 1, 2, 0)) == 1  # worker 1 done: worker 0's clock is the job's
        rows, low = client.pull_many([("emb", A)], stamp=WorkerStamp(JOB, 0, 2, 1, barrier_timeout_s=0.3))
        assert low == 1


def test_initial_rows_come_back_with_a_stamp_on_a_shard_without_the_ids(servers):
    """A stamped pull of ids of one shard still reaches the other (an empty PullBatch) and waits there too."""
    addresses, started = servers(2)
    mine = A[started[0].shard.slot_map.shard_of(A) == 0][:3]
    cfg = TableConfig("init", 2, InitializerConfig("uniform", 0.5, 4))
    with Client(addresses, timeout_s=30) as client:
        client.create_table(cfg)
        rows, low = client.pull_many([("init", mine)], stamp=WorkerStamp(JOB, 0, 1, 0))
    want = np.empty((len(mine), 2), np.float32)
    init_rows(cfg.initializer, mine, want, 2)
    np.testing.assert_array_equal(rows[0], want)
    assert low == 0 and [s.shard.jobs.job for s in started] == [JOB, JOB]


@pytest.mark.parametrize("finished", [False, True])
def test_a_second_run_under_a_job_id_is_refused_not_dropped(servers, finished):
    """Run 1 of the job applies steps 0 and 1 (its workers finish, or are killed before they do); run 2 under the
    same job id, against the same servers: its step 0 was applied before, so its push is an error, not silently
    dropped: FAILED_PRECONDITION from a shard holding the worker as done, or JobIdReusedError from the client
    for a shard answering that it applied the step before."""
    addresses, _ = servers(2)

    def run1(w):
        with Client(addresses, timeout_s=30) as client:
            client.create_table(SGD)
            for s in range(2):
                sync = WorkerStamp(J3, w, 2, s, sync=True, barrier_timeout_s=30, acked=s)
                assert codec.stamp_to_proto(sync).acked == s
                client.push_many([("emb", A, np.ones((len(A), 4)), None)], advance_clock=1, stamp=sync)
            if finished:
                client.finish(WorkerStamp(J3, w, 2, 2, acked=2))

    Concurrently(lambda: run1(0), lambda: run1(1)).join()
    with Client(addresses, timeout_s=30) as client:
        assert (client.pull("emb", A) == -4).all()
        expected = PsError if finished else JobIdReusedError
        with pytest.raises(expected, match="a new --job-id") as info:
            client.push_many([("emb", A, np.ones((len(A), 4)), None)], advance_clock=1,
                             stamp=WorkerStamp(J3, 0, 2, 0, sync=True, barrier_timeout_s=5))  # fmt: skip
        if finished:
            assert "FAILED_PRECONDITION" in str(info.value) and "said it is done" in str(info.value)
        else:
            assert f"job {J3}'s step 0 was applied before on shard" in str(info.value)
            with pytest.raises(JobIdReusedError, match=r"^job 'j3''s step 0 was applied before on shard"):
                client.push_many([("emb", A, np.ones((len(A), 4)), None)], advance_clock=1,
                                 stamp=WorkerStamp(J3, 0, 2, 0, sync=True, barrier_timeout_s=5, job_name="j3"))  # fmt: skip
        assert (client.pull("emb", A) == -4).all()


def test_calls_on_two_threads_that_find_a_shard_back_note_it_once(servers):
    """Both calls see the shard marked down, then answered: the mark is dropped once, without a KeyError."""
    addresses, _ = servers(1)
    both_looked = threading.Barrier(2)

    class SeenByBoth(dict):
        def __contains__(self, key):  # answers after the other thread's look too
            found = super().__contains__(key)
            both_looked.wait(10)
            return found

    with Client(addresses, timeout_s=30) as client:
        client._outages.down = SeenByBoth({0: time.monotonic()})
        Concurrently(client.stats, client.stats).join()
        assert dict(client._outages.down) == {}


def test_a_retry_of_a_step_the_journal_holds_moves_the_clocks_and_wakes_a_waiting_pull():
    """A contribution to a step the shard applied before (its journal holds it: a retry after a restart) applies
    nothing, yet moves every worker's clock to it: the push's reply carries the new min clock, and a pull that
    waited for that step is served."""
    held = {sync_key(JOB): 4}  # the journal holds step 3: clocks start at 3
    jobs = JobClocks(0, lambda key: held.get(key, 0), threads=8, max_count=MAX_COUNT_PER_ID)
    pull = Concurrently(lambda: jobs.wait_for_pull(stamp(1, 4, acked=4, sync=True, barrier_timeout_s=20)))
    wait_until(lambda: jobs._waiting == 1, 10, "worker 1's pull to wait")
    one = [push(A[:3], np.ones((3, 4)), np.ones(3, np.float32), np.zeros(3, np.float32))]
    assert jobs.push_sync(stamp(0, 3, acked=3, sync=True), one, 1, lambda *a: pytest.fail("applied again")) == (0, 4)
    assert pull.join(5) == [4]

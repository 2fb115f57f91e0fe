"""Async and geo jobs on the shards (ps.engine.followedjob and tenancy, unclocked stamps): a shard trains one job at
a time, whatever its mode, and refuses a worker of its job that runs another mode or setup; a resumed job, a late
worker and the reads of eval, predict, export and stats go on; a job whose workers are gone holds the shard no
longer."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
import time

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps import codec, wire
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.push import TablePush
from ps.engine.shard import Shard
from ps.errors import CheckpointInProgressError, InvalidArgumentError, JobConflictError, TableNotFoundError
from ps.server_config import ServerConfig
from ps.stamp import WorkerStamp, job_hash

JOB, OTHER = 0xA51C, 0xB0B
SGD = TableConfig("emb", 4, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))  # row = -(sum of grads)
IDS = np.array([3, 5, 8], np.uint64)
ASYNC = "mode=async model=fm fields=3:abcd numeric=0"
GEO = "mode=geo geo_every=4 model=fm fields=3:abcd numeric=0"


@pytest.fixture
def shard(tmp_path):
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    shard.create_table(SGD)
    yield shard
    shard.close()


def unclocked(worker: int = 0, job: int = JOB, num_workers: int = 2, setup: str = ASYNC, **kw) -> WorkerStamp:
    kw.setdefault("barrier_timeout_s", 30.0)
    return WorkerStamp(job, worker, num_workers, 0, setup=setup, unclocked=True, **kw)


SEQ = itertools.count(1)  # request numbers: increasing for every client


def push(shard: Shard, stamp: WorkerStamp, client: int = 11) -> None:
    """One push of grads 1 on IDS (each row moves by -1 under SGD 1) with stamp, from client."""
    pushes = [TablePush(name="emb", ids=IDS, grads=np.ones((len(IDS), 4), np.float32), shows=None, clicks=None)]
    shard.push_stamped(pushes, 1, client, next(SEQ), stamp)


def rows(shard: Shard) -> float:
    """The value every row of IDS has (-(pushes applied))."""
    r = shard.pull("emb", IDS)
    assert (r == r[0, 0]).all()
    return float(r[0, 0])


def test_a_second_async_job_is_refused_naming_both_and_changes_nothing(shard):
    push(shard, unclocked(0))
    push(shard, unclocked(1), client=12)  # the job's second worker
    second = (rf"shard 0 holds job {JOB} \(--mode async, 2 of its 2 workers not done, .*\), so worker 0 of "
              rf"job {OTHER} \(--mode geo\) cannot train here: .* If the workers of job {JOB} are gone .*, the shard holds "
              rf"it for .* s more .*: wait that long, or resume job {JOB} \(its workers' command with --job-id {JOB};"
              ".*nothing was applied")  # fmt: skip
    with pytest.raises(JobConflictError, match=second) as refused:
        push(shard, unclocked(0, job=OTHER, num_workers=1, setup=GEO), client=13)
    assert refused.value.status == "FAILED_PRECONDITION"
    with pytest.raises(JobConflictError):  # a sync or ssp job too
        push(shard, WorkerStamp(OTHER, 0, 1, 0, setup="mode=ssp"), client=13)
    assert rows(shard) == -2.0 and shard.stats()["job"] == JOB
    push(shard, unclocked(0))  # the job itself goes on
    assert rows(shard) == -3.0


def test_jobs_are_named_as_their_workers_named_them_where_their_stamps_say(shard):
    """A stamp's job_name (the --job-id its id is the hash of) names the job in the shard's refusals; a job whose
    stamps carry none is named by its id, and a stamp of the job followed without one by the name the shard knows."""
    j3, j4 = job_hash("j3"), job_hash("j4")  # the jobs of --job-id j3 and j4
    push(shard, unclocked(0, job=j3, job_name="j3", token=1))
    named = (
        r"shard 0 holds job 'j3' \(--mode async, .*\), so worker 0 of job 'j4' \(--mode geo\) cannot train here: "
        r".* If the workers of job 'j3' are gone .* or resume job 'j3' \(its workers' command with --job-id j3;"
    )
    with pytest.raises(JobConflictError, match=named) as refused:
        push(shard, unclocked(0, job=j4, num_workers=1, setup=GEO, job_name="j4"), client=13)
    assert str(j3) not in str(refused.value) and str(j4) not in str(refused.value)
    with pytest.raises(JobConflictError, match=rf"holds job 'j3' .* so worker 0 of job {OTHER} \("):  # no name
        push(shard, unclocked(0, job=OTHER, num_workers=1, setup=GEO), client=13)
    with pytest.raises(JobConflictError, match=r"worker 0 of job 'j3' \(--mode async\) is trained here by another"):
        push(shard, unclocked(0, job=j3, token=2), client=14)  # the job's own stamp, without its name: the shard's
    with pytest.raises(InvalidArgumentError, match=r"^shard 0: job 'j3' stops: worker 1 runs another setup"):
        push(shard, unclocked(1, job=j3, setup=GEO), client=15)
    assert rows(shard) == -1.0


def test_the_same_job_resumed_after_a_stop_or_a_crash_and_a_late_worker_push_on(shard):
    push(shard, unclocked(0))
    shard.push_stamped([], 0, 0, 0, unclocked(0, stopped="interrupted (Ctrl-C)"))  # a Ctrl-C tells the shards
    push(shard, unclocked(0), client=21)  # resumed under its job id, from a new process: its job, not a new one
    push(shard, unclocked(0), client=22)  # started again after a crash (it said nothing)
    push(shard, unclocked(1), client=23)  # the job's second worker joins late
    shard.push_stamped([], 0, 0, 0, unclocked(1, done=True))  # and finishes: worker 0, resumed, still trains
    assert rows(shard) == -4.0
    with pytest.raises(JobConflictError):  # the resumed job holds the shard as the first run did
        push(shard, unclocked(0, job=OTHER), client=24)
    assert rows(shard) == -4.0


def test_reads_of_eval_predict_export_and_stats_go_on_while_an_async_job_trains(servers):
    addresses, _ = servers(1)
    channel = grpc.insecure_channel(addresses[0])
    try:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        stub.CreateTable(ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(SGD)))
        grads = np.ones((len(IDS), 4), np.float32)
        one = ps_pb2.PushRequest(table="emb", ids=wire.encode_ids(IDS), grads=wire.encode_rows(grads), dim=4)
        trains = ps_pb2.PushBatchRequest(pushes=[one], client_id=5, seq=1, stamp=codec.stamp_to_proto(unclocked(0)))
        stub.PushBatch(trains)
        pulled = stub.Pull(ps_pb2.PullRequest(table="emb", ids=wire.encode_ids(IDS)))
        assert (wire.decode_rows(pulled.rows, len(IDS), 4) == -1).all()
        assert len(stub.PullBatch(ps_pb2.PullBatchRequest(pulls=[ps_pb2.PullRequest(table="emb", ids=b"")])).replies)
        assert stub.DescribeTable(ps_pb2.DescribeTableRequest(table="emb")).num_rows == len(IDS)
        assert stub.Stats(ps_pb2.StatsRequest()).job == JOB
        hold = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=5))  # export's first step
        stub.Checkpoint(ps_pb2.CheckpointRequest(phase="release", token=hold.token))
        other = ps_pb2.PushBatchRequest(pushes=[one], client_id=6, seq=1,
                                        stamp=codec.stamp_to_proto(unclocked(0, job=OTHER)))  # fmt: skip
        with pytest.raises(grpc.RpcError) as refused:
            stub.PushBatch(other)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"holds job {JOB}" in refused.value.details() and f"of job {OTHER}" in refused.value.details()
        pulled = stub.Pull(ps_pb2.PullRequest(table="emb", ids=wire.encode_ids(IDS)))
        assert (wire.decode_rows(pulled.rows, len(IDS), 4) == -1).all()
    finally:
        channel.close()


@pytest.mark.parametrize(
    ("setup", "stamp", "differs"),
    [
        (GEO, {}, r"'mode' 'geo' \(the job's: 'async'\)"),
        (GEO.replace("geo_every=4", "geo_every=8"), {"setup": GEO}, r"'geo_every' '8' \(the job's: '4'\)"),
        (ASYNC, {"num_workers": 3}, "says the job has 3 workers; it started here with 2"),
        (ASYNC, {"unclocked": False}, "stamps as sync or ssp does, where the job started here as async or geo"),
    ],
)
def test_a_worker_of_another_mode_or_setup_is_refused_and_stops_the_job(shard, setup, stamp, differs):
    first = stamp.pop("setup", ASYNC)
    push(shard, unclocked(0, setup=first))
    kw = {"num_workers": 2, **stamp}
    odd = WorkerStamp(JOB, 1, kw["num_workers"], 0, setup=setup, unclocked=kw.get("unclocked", True),
                      barrier_timeout_s=30.0)  # fmt: skip
    with pytest.raises(InvalidArgumentError, match=rf"job {JOB} stops: worker 1 .*{differs}") as refused:
        push(shard, odd, client=12)
    assert refused.value.status == "INVALID_ARGUMENT"
    with pytest.raises(InvalidArgumentError, match=differs):  # worker 0 hears why at its next push
        push(shard, unclocked(0, setup=first))
    assert rows(shard) == -1.0


def test_a_gone_jobs_tenancy_expires_at_its_barrier_timeout_and_an_ended_one_frees_the_shard_at_once(shard):
    push(shard, unclocked(0, barrier_timeout_s=1.0))
    with pytest.raises(JobConflictError, match=r"holds it for (0\.9\d*|1) s more \(its barrier timeout, 1 s,"):
        push(shard, unclocked(0, job=OTHER, num_workers=1), client=12)
    time.sleep(1.1)  # no push of JOB for its barrier timeout: its worker is gone
    push(shard, unclocked(0, job=OTHER, num_workers=1), client=12)
    assert shard.stats()["job"] == OTHER and rows(shard) == -2.0
    shard.push_stamped([], 0, 0, 0, unclocked(0, job=OTHER, num_workers=1, done=True))  # its only worker is done
    push(shard, unclocked(0, num_workers=1, setup=GEO), client=13)  # free at once
    shard.push_stamped([], 0, 0, 0, unclocked(0, num_workers=1, setup=GEO, stopped="failed"))  # stopped: free too
    push(shard, unclocked(0, job=OTHER, num_workers=1), client=14)
    assert shard.stats()["job"] == OTHER and rows(shard) == -4.0


def test_a_job_whose_pushes_a_checkpoint_holds_back_past_its_barrier_timeout_keeps_the_shard(shard):
    """Its workers are there, their pushes sent again while a long save holds them back: the job is heard from,
    and another job is refused at its check, not let in as the tenancy ends."""
    push(shard, unclocked(0, barrier_timeout_s=1.0))
    _, token = shard.hold(30.0)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # the job's worker sends its push again and again
        with pytest.raises(CheckpointInProgressError):
            push(shard, unclocked(0, barrier_timeout_s=1.0))
        time.sleep(0.1)
    with pytest.raises(JobConflictError, match=rf"holds job {JOB} .*last heard from 0\.\d+ s ago"):
        push(shard, unclocked(0, job=OTHER, num_workers=1), client=12)
    shard.release(token)
    push(shard, unclocked(0, barrier_timeout_s=1.0))
    assert shard.stats()["job"] == JOB and rows(shard) == -2.0


def test_a_new_run_of_an_async_job_id_that_ended_starts_anew_with_its_own_setup(shard):
    """A job id given run after run (a deployment's fixed --job-id): once a run's workers are all done, the next
    run's first push starts the job again, with its own setup and worker count."""
    for w in range(2):
        push(shard, unclocked(w), client=11 + w)
        shard.push_stamped([], 0, 0, 0, unclocked(w, done=True))
    push(shard, unclocked(0, num_workers=3, setup=GEO), client=21)
    assert shard.stats()["num_workers"] == 3 and rows(shard) == -3.0
    with pytest.raises(InvalidArgumentError, match="'mode' 'async'"):  # the new run's setup is the job's now
        push(shard, unclocked(1, num_workers=3), client=22)


@pytest.mark.parametrize("restart", [False, True])
def test_a_new_run_of_an_async_job_id_holds_the_shard_from_its_first_table_though_its_last_run_finished(
    tmp_path, restart
):
    """The shard stores the done workers of a job (for a restart mid-job), and a job id is given run after run: the
    done flags stored as the last run finished are not the new run's. Its first table holds the shard (another
    job's create is refused, nothing created), here and on a shard restarted since the last run; a worker of the new
    run that has not started yet is not taken as done where the shard saw the last run end."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    try:
        shard.create_table(SGD)
        for w in range(2):  # the last run, finished
            push(shard, unclocked(w), client=11 + w)
            shard.push_stamped([], 0, 0, 0, unclocked(w, done=True))
        if restart:
            shard.close()
            shard = Shard(ServerConfig(data_dir=str(tmp_path)))
        shard.create_table(SGD, stamp=unclocked(0, token=0xA))  # the new run's worker 0 makes its table
        with pytest.raises(JobConflictError, match=rf"holds job {JOB} .*nothing was created"):
            shard.create_table(TableConfig("other", 2), stamp=unclocked(0, job=OTHER, num_workers=1))
        push(shard, unclocked(0, token=0xA), client=21)
        shard.push_stamped([], 0, 0, 0, unclocked(0, token=0xA, done=True))  # its worker 1 has not started yet
        if not restart:
            with pytest.raises(JobConflictError, match=rf"holds job {JOB} \(--mode async, 1 of its 2 workers not"):
                push(shard, unclocked(0, job=OTHER, num_workers=1), client=12)
        assert shard.stats()["job"] == JOB and "other" not in shard.tables
    finally:
        shard.close()


def test_unclocked_stamps_come_on_pushes_only_and_never_with_sync(shard):
    with pytest.raises(InvalidArgumentError, match="unclocked .* is said by a PushBatch, not by a pull"):
        shard.jobs.check(unclocked(0), pull=True)
    with pytest.raises(InvalidArgumentError, match="says sync .* or unclocked .*, not both"):
        push(shard, unclocked(0, sync=True))
    assert rows(shard) == 0.0 and shard.stats()["job"] == 0


@pytest.mark.parametrize("second", ["async", "ssp"])
def test_two_jobs_first_pushes_reaching_a_free_shard_together_let_one_in_and_refuse_the_other(shard, second):
    """Job OTHER's push comes between the check and the apply of JOB's first push on a free shard (forced by a
    hook in push_batch): JOB holds the shard from its check on, so OTHER is refused then, with nothing applied."""
    apply, outcome = shard.push_batch, []

    def between(*args, **kw):  # JOB's push, checked, about to be applied
        if not outcome:
            outcome.append("sent")
            late = (unclocked(0, job=OTHER, num_workers=1) if second == "async"
                    else WorkerStamp(OTHER, 0, 1, 0, staleness=1, setup="mode=ssp"))  # fmt: skip
            try:
                push(shard, late, client=12)
                outcome[0] = "applied"
            except JobConflictError as e:
                outcome[0] = str(e)
        return apply(*args, **kw)

    shard.push_batch = between
    push(shard, unclocked(0))
    assert len(outcome) == 1 and re.search(rf"is applying the first push of job {JOB} \(--mode async, worker 0\), so "
                                           rf"worker 0 of job {OTHER} .* cannot train here: .*nothing was applied",
                                           outcome[0]), outcome  # fmt: skip
    assert rows(shard) == -1.0 and shard.stats()["job"] == JOB
    with pytest.raises(JobConflictError, match=rf"holds job {JOB}"):  # and so it is after the push
        push(shard, unclocked(0, job=OTHER, num_workers=1), client=12)


def test_a_first_push_that_fails_leaves_the_shard_free(shard):
    """A job's first push refused (a table the shard lacks) takes no tenancy: another job starts at once."""
    bad = [TablePush(name="nope", ids=IDS, grads=np.ones((len(IDS), 4), np.float32), shows=None, clicks=None)]
    with pytest.raises(TableNotFoundError):
        shard.push_stamped(bad, 1, 11, next(SEQ), unclocked(0))
    assert shard.stats()["job"] == 0
    push(shard, unclocked(0, job=OTHER, num_workers=1), client=12)
    assert rows(shard) == -1.0 and shard.stats()["job"] == OTHER


def test_an_async_job_id_stopped_by_a_worker_of_another_setup_runs_again_once_its_workers_stopped(shard):
    """A fixed job id (a deployment's) whose run stopped because one worker had another setup: its live workers
    hear why at their next push; once every worker has stopped (their stop stamps), the next run under the id
    starts anew, as after a run that finished, instead of being refused for the old mismatch for good."""
    push(shard, unclocked(0))
    with pytest.raises(InvalidArgumentError, match="runs another setup"):
        push(shard, unclocked(1, setup=GEO), client=12)
    with pytest.raises(InvalidArgumentError, match="runs another setup"):  # worker 0 hears why
        push(shard, unclocked(0))
    for w in range(2):  # each worker failed, and said so
        shard.push_stamped([], 0, 0, 0, unclocked(w, stopped="failed"))
    push(shard, unclocked(0, setup=GEO), client=21)  # the next run, its setup fixed
    push(shard, unclocked(1, setup=GEO), client=22)
    assert shard.stats()["job"] == JOB and rows(shard) == -3.0


def test_a_push_applied_before_its_job_started_with_another_count_is_answered_as_applied(shard):
    """Two workers of a new job that disagree on its worker count both pass their checks (the job has not started:
    neither can be told wrong yet) and are applied. The one whose push starts the job second gets its reply as
    applied, as it was (not an error saying it was not); its next push is refused, and stops the job."""
    apply, outcome = shard.push_batch, []

    def between(*args, **kw):  # worker 0's push (2 workers), checked, about to be applied
        if not outcome:
            outcome.append("sent")
            push(shard, unclocked(1, num_workers=3), client=12)  # checked, applied, starts the job: 3 workers
        return apply(*args, **kw)

    shard.push_batch = between
    push(shard, unclocked(0))
    assert rows(shard) == -2.0 and shard.stats()["num_workers"] == 3
    with pytest.raises(InvalidArgumentError, match=rf"job {JOB} stops: worker 0 says the job has 2 workers; it "
                                                   "started here with 3 .*the request was not applied"):  # fmt: skip
        push(shard, unclocked(0))
    assert rows(shard) == -2.0


@pytest.mark.parametrize("setup", [ASYNC, GEO])
def test_a_second_process_pushing_as_a_worker_is_refused_until_the_first_says_done(shard, setup):
    """Two processes given one --worker-id (tokens A and B): B is refused, changing nothing, while A's pushes are
    heard; A restarted (its --resume-file keeps its token; a new client) pushes on at once; B's stop stamp does not
    free the worker; once A says it is done, B takes the worker over, and A is the one refused."""
    a, b = (unclocked(0, setup=setup, token=t) for t in (0xA, 0xB))
    push(shard, a)
    refusal = (rf"shard 0: worker 0 of job {JOB} \(--mode {'geo' if setup == GEO else 'async'}\) is trained here by "
               r"another process \(last heard from 0\.\d+ s ago; .* this process's, 0xb\), which holds worker 0 for "
               r"(\d+\.?\d*) s more \(the job's barrier timeout, 30 s, after it was last heard from\) unless it says "
               r"it is done or stopped\. If this is worker 0 started again after that process was killed without a "
               r"word .*: without the --resume-file its killed run kept, it is another process, refused until then; "
               r"with that file it is the same process and pushes on at once\. If the other process runs, two "
               r"processes given one --worker-id would train its share twice .* own --worker-id in 0\.\.1, or stop "
               r"the other one; nothing was applied$")  # fmt: skip
    with pytest.raises(JobConflictError, match=refusal) as refused:
        push(shard, b, client=12)
    assert refused.value.status == "FAILED_PRECONDITION" and float(re.search(refusal, str(refused.value))[1]) > 29
    with pytest.raises(JobConflictError, match="nothing was applied"):  # nor may B say worker 0 is done
        shard.push_stamped([], 0, 0, 0, dataclasses.replace(b, done=True))
    with pytest.raises(JobConflictError, match=r"another process .*nothing was created"):
        shard.create_table(SGD, stamp=b)
    shard.push_stamped([], 0, 0, 0, dataclasses.replace(b, stopped="JobConflictError: ..."))  # B's end: no change
    with pytest.raises(JobConflictError, match="another process"):  # A still holds worker 0
        push(shard, b, client=12)
    push(shard, a, client=21)  # A restarted with its --resume-file: a new client, its token
    assert rows(shard) == -2.0 and shard.stats()["job"] == JOB
    push(shard, unclocked(1, setup=setup, token=0xC), client=13)  # worker 1 of the job is another worker
    shard.push_stamped([], 0, 0, 0, dataclasses.replace(a, done=True))
    push(shard, b, client=12)  # the worker is B's now
    with pytest.raises(JobConflictError, match=r"another process .*this process's, 0xa\)"):
        push(shard, a, client=21)
    assert rows(shard) == -4.0


def test_a_worker_whose_process_was_not_heard_for_the_barrier_timeout_is_taken_by_another(shard):
    """A killed without a word while worker 1 keeps the job running: B is refused until A was not heard from for
    the job's barrier timeout, then takes worker 0."""
    a, b = (unclocked(0, barrier_timeout_s=1.0, token=t) for t in (0xA, 0xB))
    push(shard, a)
    with pytest.raises(JobConflictError, match=r"holds worker 0 for (0\.9\d*|1) s more"):
        push(shard, b, client=12)
    deadline, pushes = time.monotonic() + 1.1, 0
    while time.monotonic() < deadline:  # the job is heard from all along: only worker 0's process is gone
        push(shard, unclocked(1, barrier_timeout_s=1.0, token=0xC), client=13)
        pushes += 1
        time.sleep(0.1)
    push(shard, b, client=12)
    with pytest.raises(JobConflictError, match="another process"):
        push(shard, a)
    assert shard.stats()["job"] == JOB and rows(shard) == -(2 + pushes)


def test_two_processes_first_pushes_as_one_worker_reaching_a_free_shard_together_let_one_in(shard):
    """B's push comes between the check and the apply of A's first push on a free shard: A's claim refuses it."""
    apply, outcome = shard.push_batch, []

    def between(*args, **kw):
        if not outcome:
            outcome.append("sent")
            try:
                push(shard, unclocked(0, token=0xB), client=12)
                outcome[0] = "applied"
            except JobConflictError as e:
                outcome[0] = str(e)
        return apply(*args, **kw)

    shard.push_batch = between
    push(shard, unclocked(0, token=0xA))
    assert len(outcome) == 1 and "is trained here by another process (last heard from 0 s ago" in outcome[0], outcome
    assert rows(shard) == -1.0


def test_a_request_refused_for_its_content_takes_no_worker_for_its_process(servers):
    """Requests of worker 1 from process B (token 0xB) whose stamp passes, while no process holds worker 1, but
    that are refused for what they carry (a push of a NaN gradient, one that repeats an id, a table spec with dim
    0): INVALID_ARGUMENT, and worker 1 stays free, so its own process (token 0xC) pushes on at once."""
    addresses, _ = servers(1)
    with grpc.insecure_channel(addresses[0]) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        stub.CreateTable(ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(SGD)))

        def batch(stamp: WorkerStamp, ids: np.ndarray = IDS, grad: float = 1.0, seq: int = 1) -> bytes:
            grads = np.full((len(ids), 4), grad, np.float32)
            one = ps_pb2.PushRequest(table="emb", ids=wire.encode_ids(ids), grads=wire.encode_rows(grads), dim=4)
            request = ps_pb2.PushBatchRequest(pushes=[one], client_id=30 + stamp.token, seq=seq,
                                              stamp=codec.stamp_to_proto(stamp))  # fmt: skip
            return request.SerializeToString()

        push_batch = channel.unary_unary("/sparseps.ParameterServer/PushBatch")
        create_table = channel.unary_unary("/sparseps.ParameterServer/CreateTable")
        push_batch(batch(unclocked(0, token=0xA)), timeout=30)
        b = unclocked(1, token=0xB)
        bad_spec = ps_pb2.TableSpec(name="emb2", dim=0)
        for call, request, words in (
            (push_batch, batch(b, grad=float("nan")), "non-finite"),
            (push_batch, batch(b, ids=np.array([3, 5, 3], np.uint64)), "repeats id"),
            (create_table, ps_pb2.CreateTableRequest(spec=bad_spec, stamp=codec.stamp_to_proto(b)).SerializeToString(),
             "dim must be in"),
        ):  # fmt: skip
            with pytest.raises(grpc.RpcError) as refused:
                call(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
            assert words in refused.value.details()
        push_batch(batch(unclocked(1, token=0xC)), timeout=30)  # worker 1's own process: not held by B
        with pytest.raises(grpc.RpcError) as refused:  # and now it holds worker 1: B is refused for that
            push_batch(batch(b, seq=2), timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "another process" in refused.value.details()
        pulled = stub.Pull(ps_pb2.PullRequest(table="emb", ids=wire.encode_ids(IDS)))
        assert (wire.decode_rows(pulled.rows, len(IDS), 4) == -2).all()


def test_a_token_comes_on_unclocked_stamps_only(shard):
    with pytest.raises(InvalidArgumentError, match=r"token .* is said by an unclocked stamp, not a sync or ssp one"):
        push(shard, WorkerStamp(JOB, 0, 1, 0, staleness=1, setup="mode=ssp", token=0xA))
    assert rows(shard) == 0.0 and shard.stats()["job"] == 0


def test_a_done_stamp_that_carries_pushes_is_refused_before_its_worker_is_heard_from(shard):
    """Worker 1's done stamp comes, wrongly, with a push and another process's token: refused, changing nothing: the
    token is not taken as worker 1's, so worker 1's own process pushes on."""
    push(shard, unclocked(0, token=5))
    pushes = [TablePush(name="emb", ids=IDS, grads=np.ones((len(IDS), 4), np.float32), shows=None, clicks=None)]
    with pytest.raises(InvalidArgumentError, match="a done stamp comes in a PushBatch without pushes"):
        shard.push_stamped(pushes, 0, 12, next(SEQ), unclocked(1, token=7, done=True))
    assert rows(shard) == -1.0
    push(shard, unclocked(1, token=9), client=13)  # worker 1's own process: not held by the refused stamp's token
    assert rows(shard) == -2.0


def test_another_jobs_stamp_while_a_worker_of_the_running_job_is_claimed_gets_the_running_jobs_advice(shard):
    """While a new process of the running job's worker 1 applies its first push (its claim in flight), a stamp of
    another job is refused as one that meets the running job: how long the shard holds it, and how to resume it;
    not as one that meets a job starting ("is applying the first push ... wait for its end")."""
    push(shard, unclocked(0, token=5))
    tenancy = shard.jobs.tenancy
    assert tenancy.take(unclocked(1, token=7), pull=False, create=False)  # worker 1's new process: claimed
    with pytest.raises(JobConflictError) as refused:
        tenancy.check_job(unclocked(0, job=OTHER, token=9))
    said = str(refused.value)
    assert "holds job" in said and "resume job" in said and "applying the first push" not in said, said


def test_the_log_line_of_a_job_followed_counts_its_workers_in_the_singular_for_one(shard, caplog):
    """The line says "follows job 'j1' of 1 worker", not "of 1 workers"; a job of 2 workers (in place of the
    first) is plural."""
    with caplog.at_level(logging.INFO, logger="ps.engine.jobs"):
        push(shard, unclocked(0, job=job_hash("j1"), num_workers=1, job_name="j1"))
        shard.push_stamped([], 0, 0, 0, unclocked(0, job=job_hash("j1"), num_workers=1, job_name="j1", done=True))
        push(shard, unclocked(0, job=job_hash("j2"), num_workers=2, job_name="j2"), client=13)
    followed = [r.getMessage() for r in caplog.records if " follows job " in r.getMessage()]
    assert followed == [
        "shard 0 follows job 'j1' of 1 worker (clocks from 0)",
        "shard 0 follows job 'j2' of 2 workers (clocks from 0), in place of job 'j1'",
    ], followed

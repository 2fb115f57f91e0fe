"""A job's tenancy of a shard from its first table (ps.engine.tenancy, stamped CreateTable): a train run's worker stamps
the CreateTable requests that make its job's tables, so a second job's create or replace is refused while the first
job holds the shard, before it changes anything; the same job's workers, resumed ones included, go on; a create that
fails, a check_only and an unstamped create (`train --create-tables-only`, other callers) hold nothing."""

from __future__ import annotations

import dataclasses
import itertools
import re
import time

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps import codec
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.push import TablePush
from ps.engine.shard import Shard
from ps.errors import InvalidArgumentError, JobConflictError, TableExistsError, TableNotFoundError
from ps.server_config import ServerConfig
from ps.stamp import WorkerStamp
from worker.client import Client

JOB, OTHER = 0xA51C, 0xB0B
SGD4 = TableConfig("emb", 4, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))
ADAM8 = TableConfig("emb", 8, InitializerConfig("zeros", 0.0), OptimizerConfig("adam", 0.01))  # another spec
IDS = np.array([3, 5, 8], np.uint64)
ASYNC = "mode=async model=fm fields=3:abcd numeric=0"
SSP = "mode=ssp staleness=1 model=fm fields=3:abcd numeric=0"
SEQ = itertools.count(1)


@pytest.fixture
def shard(tmp_path):
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    yield shard
    shard.close()


def async_stamp(worker: int = 0, job: int = JOB, num_workers: int = 2, **kw) -> WorkerStamp:
    kw.setdefault("barrier_timeout_s", 30.0)
    return WorkerStamp(job, worker, num_workers, 0, setup=ASYNC, unclocked=True, **kw)


def ssp_stamp(worker: int = 0, job: int = OTHER, num_workers: int = 1, **kw) -> WorkerStamp:
    return WorkerStamp(job, worker, num_workers, 0, staleness=1, setup=SSP, barrier_timeout_s=30.0, **kw)


def push(shard: Shard, stamp: WorkerStamp, client: int = 11) -> None:
    pushes = [TablePush(name="emb", ids=IDS, grads=np.ones((len(IDS), 4), np.float32), shows=None, clicks=None)]
    shard.push_stamped(pushes, 1, client, next(SEQ), stamp)


def held_by(job: int) -> str:
    return rf"shard 0 holds job {job} \(--mode \w+, \d+ of its \d+ workers not done, last heard from .*\), so worker "


def test_a_second_jobs_create_or_replace_is_refused_while_the_first_holds_the_shard_changing_nothing(shard):
    """Job JOB made its table (untrained) and has not pushed yet; job OTHER, started just after with another
    dim and optimizer, would replace it (replace_untrained): refused, naming both jobs, the table as JOB made it."""
    shard.create_table(SGD4, stamp=async_stamp(0))
    assert shard.stats()["job"] == JOB
    refusal = held_by(JOB) + rf"0 of job {OTHER} \(--mode ssp\) cannot train here: .*; nothing was "
    for create in (shard.create_table, shard.check_create):
        with pytest.raises(JobConflictError, match=refusal + "created$") as refused:
            create(ADAM8, replace_untrained=True, stamp=ssp_stamp())
        assert refused.value.status == "FAILED_PRECONDITION"
    with pytest.raises(JobConflictError, match=refusal + "created$"):  # a table of its own too
        shard.create_table(TableConfig("mine", 2), stamp=ssp_stamp())
    with pytest.raises(JobConflictError, match=refusal + "applied$"):  # and, as before, its pulls and pushes
        shard.jobs.check(ssp_stamp(), pull=True)
    assert shard.table("emb").cfg == SGD4.normalized() and "mine" not in shard.tables
    assert shard.stats()["job"] == JOB and shard.stats()["num_workers"] == 2
    shard.create_table(SGD4, stamp=async_stamp(1))  # the job's other worker
    shard.create_table(SGD4, stamp=async_stamp(0))  # its worker 0 again (a run resumed under its job id)
    push(shard, async_stamp(0))
    assert (shard.pull("emb", IDS) == -1.0).all()


def test_a_create_holds_the_shard_for_its_barrier_timeout_unless_its_job_stops_or_ends(shard):
    shard.create_table(SGD4, stamp=async_stamp(0, num_workers=1, barrier_timeout_s=0.3))
    with pytest.raises(JobConflictError, match=r"holds it for 0\.[123]\d* s more \(its barrier timeout, 0\.3 s,"):
        shard.create_table(SGD4, stamp=ssp_stamp())
    time.sleep(0.4)  # nothing of JOB came for its barrier timeout: its worker is gone
    shard.create_table(SGD4, stamp=ssp_stamp())
    assert shard.stats()["job"] == OTHER and shard.stats()["min_clock"] == 0  # a create moves no clock
    shard.push_stamped([], 0, 0, 0, ssp_stamp(stopped="ValueError: a bad flag"))  # OTHER failed before training
    shard.create_table(SGD4, stamp=async_stamp(0))  # free at once
    assert shard.stats()["job"] == JOB


def test_a_create_that_fails_and_a_check_only_leave_the_shard_free(shard):
    shard.create_table(SGD4)  # unstamped (another caller, or `train --create-tables-only`): holds nothing
    assert shard.stats()["job"] == 0
    push(shard, WorkerStamp(OTHER, 0, 1, 0, setup=SSP, staleness=1), client=12)  # trained: emb is not replaced
    shard.push_stamped([], 0, 0, 0, WorkerStamp(OTHER, 0, 1, 0, setup=SSP, staleness=1, done=True, acked=1))
    with pytest.raises(TableExistsError, match="only a table never trained is replaced"):
        shard.create_table(ADAM8, replace_untrained=True, stamp=async_stamp(0))
    with pytest.raises(InvalidArgumentError, match="bad worker stamp: done is said by a PushBatch without pushes, "
                                                   "not by a CreateTable; nothing was created"):  # fmt: skip
        shard.create_table(TableConfig("t", 2), stamp=async_stamp(0, done=True))
    shard.check_create(TableConfig("t", 2), stamp=async_stamp(0))
    assert shard.stats()["job"] == OTHER and not shard.jobs.tenancy._claims and "t" not in shard.tables
    shard.create_table(TableConfig("t", 2), stamp=ssp_stamp(job=0x5EC))  # OTHER is done: another job starts
    assert shard.stats()["job"] == 0x5EC


@pytest.mark.parametrize("second", ["create", "push"])
def test_two_jobs_reaching_a_free_shard_together_let_the_first_create_in_and_refuse_the_other(shard, second):
    """Job OTHER's create (or push) comes while JOB's create on a free shard is checked and not yet made (forced
    by a hook): JOB holds the shard from its check on, so OTHER is refused, with nothing created or applied."""
    shard.create_table(TableConfig("t", 2))
    make, outcome = shard._create_table, []

    def between(*args, **kw):  # JOB's create, checked, about to be made
        if not outcome:
            outcome.append("sent")
            try:
                if second == "create":
                    shard.create_table(TableConfig("t", 3), replace_untrained=True, stamp=ssp_stamp())
                else:
                    push(shard, async_stamp(0, job=OTHER, num_workers=1), client=12)
                outcome[0] = "let in"
            except JobConflictError as e:
                outcome[0] = str(e)
        return make(*args, **kw)

    shard._create_table = between
    shard.create_table(SGD4, stamp=async_stamp(0))
    done = "created" if second == "create" else "applied"  # what the refusal says of the request it refused
    assert re.search(rf"is creating a table of job {JOB} \(--mode async, worker 0\), so worker 0 of job {OTHER} .* "
                     rf"cannot train here: .*; nothing was {done}$", outcome[0]), outcome  # fmt: skip
    assert shard.stats()["job"] == JOB and shard.table("t").dim == 2 and shard.stats()["clock"] == 0
    with pytest.raises(JobConflictError, match=held_by(JOB)):  # and so it is after the create
        shard.create_table(TableConfig("t", 3), replace_untrained=True, stamp=ssp_stamp())


def test_a_client_create_refused_by_one_shard_creates_nothing_on_any(servers):
    """Client.create_table sends the stamp with its check_only and its create: a shard that holds another job
    refuses the check, before any shard creates the table."""
    addresses, _ = servers(2)
    with grpc.insecure_channel(addresses[1]) as channel:  # JOB holds shard 1 only
        ps_pb2_grpc.ParameterServerStub(channel).CreateTable(
            ps_pb2.CreateTableRequest(
                spec=codec.table_config_to_proto(SGD4), stamp=codec.stamp_to_proto(async_stamp(0))
            )
        )
    with Client(addresses) as client:
        with pytest.raises(JobConflictError, match=rf"shard 1 holds job {JOB} .* of job {OTHER} "):
            client.create_table(TableConfig("mine", 2), stamp=ssp_stamp())
        with pytest.raises(TableNotFoundError):
            client.describe_table("mine", shards=[0])
        assert [s.job for s in client.stats()] == [0, JOB]
        client.create_table(TableConfig("mine", 2))  # unstamped: as before
        assert [s.job for s in client.stats()] == [0, JOB]


def test_an_unstamped_replace_is_refused_while_a_job_holds_the_shard(shard):
    """`train --create-tables-only` (no stamp) of other settings would replace the untrained table a job made and
    is about to train: refused while the job holds the shard, the table as the job made it; an unstamped create
    that replaces nothing goes on; once the job is over the replace goes through."""
    shard.create_table(SGD4, stamp=async_stamp(0, num_workers=1))
    refusal = (
        rf"shard 0 holds job {JOB} \(--mode async\), and this create would replace table 'emb' .*nothing was created$"
    )
    for create in (shard.create_table, shard.check_create):
        with pytest.raises(JobConflictError, match=refusal) as refused:
            create(ADAM8, replace_untrained=True)
        assert refused.value.status == "FAILED_PRECONDITION"
    assert shard.table("emb").cfg == SGD4.normalized()
    shard.create_table(SGD4, replace_untrained=True)  # the same spec: nothing to replace
    shard.create_table(TableConfig("mine", 2))  # a table of another name
    shard.push_stamped([], 0, 0, 0, async_stamp(0, num_workers=1, done=True))  # the job is over
    shard.create_table(ADAM8, replace_untrained=True)
    assert shard.table("emb").cfg == ADAM8.normalized() and shard.stats()["job"] == JOB


def test_a_check_only_keeps_no_tenancy_alive_and_claims_nothing(shard):
    """JOB's worker made its table, then its checks keep coming (a train run checks its tables before it creates
    them): they do not keep JOB's tenancy of the shard (it lasts its barrier timeout from the create, the last write),
    so job OTHER gets the shard then; a check of a free shard claims nothing for its job."""
    shard.create_table(SGD4, stamp=async_stamp(0, num_workers=1, barrier_timeout_s=0.5))
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        shard.check_create(SGD4, stamp=async_stamp(0, num_workers=1, barrier_timeout_s=0.5))
        time.sleep(0.05)
    shard.create_table(SGD4, stamp=ssp_stamp())  # JOB was not heard from for 0.5 s: OTHER takes the shard
    assert shard.stats()["job"] == OTHER
    shard.push_stamped([], 0, 0, 0, ssp_stamp(done=True))  # OTHER is over: the shard is free
    shard.check_create(SGD4, stamp=async_stamp(0))
    assert not shard.jobs.tenancy._claims and shard.stats()["job"] == OTHER
    shard.create_table(SGD4, stamp=async_stamp(0))
    with pytest.raises(JobConflictError, match=held_by(JOB)):  # a check is refused where its create would be
        shard.check_create(SGD4, stamp=ssp_stamp(job=0x5EC))


def test_a_check_only_of_another_process_takes_no_worker_token(shard):
    """Worker 0's process A (token 0xA) was not heard from for the barrier timeout while worker 1 keeps the job
    running; process B's check of worker 0 passes (as its create would: A's claim on the worker lapsed) but takes
    nothing: A, restarted with its --resume-file, pushes on, and B is refused then."""
    a, b = (async_stamp(0, barrier_timeout_s=0.5, token=t) for t in (0xA, 0xB))
    shard.create_table(SGD4, stamp=a)
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:  # the job is heard from; worker 0's process A is not
        push(shard, async_stamp(1, barrier_timeout_s=0.5, token=0xC), client=13)
        time.sleep(0.05)
    shard.check_create(SGD4, stamp=b)
    push(shard, a, client=21)
    with pytest.raises(JobConflictError, match=r"worker 0 of job .* is trained here by another process"):
        shard.check_create(SGD4, stamp=b)


def test_a_shared_push_of_a_jobs_worker_holds_the_shard_moving_no_clock_and_naming_no_process(shard):
    """A new model's logit-bias start (Client.push_once: a PushBatch marked shared, under a key every worker sends,
    before the worker's first step) carries the job's stamp, apart: another job's is refused, changing nothing; the
    job's is applied once, moves no clock (its worker has pushed no step yet), and its key is no worker's process,
    so the worker's first step from its own client goes on. A shared push whose clocked stamp is not apart is
    refused, as is one apart that says done or sync, changing nothing."""
    shard.create_table(SGD4, stamp=ssp_stamp())
    bias = [TablePush(name="emb", ids=IDS[:1], grads=np.full((1, 4), 0.5, np.float32), shows=None, clicks=None,
                      add_delta=True)]  # fmt: skip
    apart = ssp_stamp(apart=True)
    with pytest.raises(JobConflictError, match=held_by(OTHER) + rf"0 of job {JOB} .*nothing was applied$"):
        shard.push_stamped(bias, 0, 900, 1, async_stamp(0), shared=True)
    assert (shard.pull("emb", IDS) == 0.0).all()
    _, applied, min_clock = shard.push_stamped(bias, 0, 900, 1, apart, shared=True)
    assert applied == 1 and min_clock == 0 and shard.stats()["min_clock"] == 0
    assert shard.push_stamped(bias, 0, 900, 1, apart, shared=True)[1] == 0  # once per key
    push(shard, ssp_stamp(), client=11)  # step 0 of the worker, from its process's client
    assert shard.stats()["min_clock"] == 1 and shard.pull("emb", IDS)[:, 0].tolist() == [-0.5, -1.0, -1.0]
    shard.push_stamped(bias, 0, 902, 1, apart, shared=True)  # one after the worker's step: its key no process
    push(shard, dataclasses.replace(ssp_stamp(), step=1, acked=1), client=11)  # the worker's step 1 goes on
    assert shard.stats()["min_clock"] == 2 and shard.pull("emb", IDS)[:, 0].tolist() == [-1.0, -2.0, -2.0]
    shared = (r"bad worker stamp: a shared PushBatch \(applied once under a key any caller may send\) is none of "
              r"its worker's steps nor its end, so its stamp says apart .* or unclocked .*, not done or stopped; this "
              r"one says ")  # fmt: skip
    for said in ({}, {"sync": True}, {"step": 5}):  # clocked, not apart: refused whatever else it says
        with pytest.raises(
            InvalidArgumentError, match=shared + "neither apart nor unclocked; nothing was applied$"
        ) as refused:
            shard.push_stamped(bias, 0, 901, 1, dataclasses.replace(ssp_stamp(), **said), shared=True)
        assert refused.value.status == "INVALID_ARGUMENT"
    with pytest.raises(InvalidArgumentError, match=shared + "done; nothing was applied$"):  # apart, but an end
        shard.push_stamped(bias, 0, 901, 1, ssp_stamp(apart=True, done=True), shared=True)
    with pytest.raises(InvalidArgumentError, match=r"bad worker stamp: apart .*; this one says sync; "):  # stampcheck's
        shard.push_stamped(bias, 0, 901, 1, ssp_stamp(apart=True, sync=True), shared=True)
    assert shard.stats()["min_clock"] == 2 and shard.pull("emb", IDS)[:, 0].tolist() == [-1.0, -2.0, -2.0]


def test_an_unclocked_shared_push_is_applied_once_and_moves_no_clock(shard):
    """An async or geo job's logit-bias start: its unclocked stamp, not apart, is one of a shared push; applied
    once, it holds the shard for the job and moves neither the shard's clock nor a worker's."""
    bias = [TablePush(name="emb", ids=IDS[:1], grads=np.full((1, 4), 0.5, np.float32), shows=None, clicks=None,
                      add_delta=True)]  # fmt: skip
    shard.create_table(SGD4)
    clock, applied, _ = shard.push_stamped(bias, 0, 900, 1, async_stamp(1), shared=True)
    assert (clock, applied) == (0, 1) and shard.stats()["job"] == JOB
    assert shard.push_stamped(bias, 0, 900, 1, async_stamp(0), shared=True)[:2] == (0, 0)  # once per key
    assert shard.pull("emb", IDS)[:, 0].tolist() == [0.5, 0.0, 0.0]
    assert shard.stats()["clock"] == 0 and shard.stats()["min_clock"] == 0


def test_a_shared_push_whose_unclocked_stamp_says_done_or_stopped_is_refused_changing_nothing(shard):
    """A shared PushBatch (a key any caller may send) is none of its worker's steps, nor its end: an unclocked
    stamp that says done or stopped is refused (INVALID_ARGUMENT), and the job's workers stay running: another
    job is still refused the shard (each, taken, would mark its worker done: both done, another job comes in)."""
    shard.create_table(SGD4)
    push(shard, async_stamp(0))
    for worker, said in ((0, {"done": True}), (1, {"stopped": "interrupted (Ctrl-C)"})):
        with pytest.raises(
            InvalidArgumentError, match=rf"; this one says {next(iter(said))}; nothing was applied$"
        ) as refused:
            shard.push_stamped([], 0, 900 + worker, 1, async_stamp(worker, **said), shared=True)
        assert refused.value.status == "INVALID_ARGUMENT"
    with pytest.raises(JobConflictError, match=held_by(JOB) + r"0 of job .* nothing was created$"):
        shard.create_table(TableConfig("mine", 2), stamp=ssp_stamp())
    assert "mine" not in shard.tables and shard.stats()["job"] == JOB

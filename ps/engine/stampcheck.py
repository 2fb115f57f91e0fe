"""The checks of a worker's stamp that need no job: check_stamp (what no job's stamp may say), and the words the
refusals of ps.engine.tenancy use for a job's setup (its key=value pairs, what differs between two, its mode) and for
stopping a job (job_stops); what a PushBatch's stamp may say of the batch it stamps (check_batch_stamp,
check_ending_batch).
"""

from __future__ import annotations

import math

from ps.config import DEFAULT_BARRIER_S, MAX_BARRIER_S, MAX_CLOCK, MAX_JOB_NAME_CHARS, MAX_STAMP_TEXT
from ps.errors import NOTHING_APPLIED, InvalidArgumentError, echo
from ps.stamp import WorkerStamp, is_job_name, job_hash

MAX_WORKERS = 65536  # of a job: a shard keeps a clock per worker
MAX_SETUP_CHARS = MAX_STAMP_TEXT  # of a stamp's setup and stop reason
MAX_STOPPED_BY_CHARS = 100  # of a stop stamp's stopped_by: an error's class name
NAMED_KEYS = 8  # setup keys named in a refusal, at most


def check_stamp(stamp: WorkerStamp, pull: bool, create: bool = False) -> None:
    """InvalidArgumentError for a stamp no job can have (a pull's, a CreateTable's (create), or a PushBatch's: done
    and stopped are for pushes)."""
    bad = ""
    if stamp.job == 0:
        bad = "job 0 is no job id; give every job a nonzero id"
    elif not 1 <= stamp.num_workers <= MAX_WORKERS:
        bad = f"num_workers {stamp.num_workers:,} is out of range: a job has 1 to {MAX_WORKERS:,} workers"
    elif stamp.worker >= stamp.num_workers:
        bad = f"worker {stamp.worker:,} is out of range for a job of {stamp.num_workers:,} workers (0 to "
        bad += f"{stamp.num_workers - 1:,})"
    elif stamp.step > MAX_CLOCK:
        bad = f"step {stamp.step:,} is past the largest step a shard takes ({MAX_CLOCK:,})"
    elif stamp.acked > (MAX_CLOCK if stamp.done or stamp.stopped else stamp.step):
        bad = f"acked {stamp.acked:,} is past step {stamp.step:,}: a worker has had the replies of its steps "
        bad += "before the one it stamps at most"
    elif not (math.isfinite(stamp.barrier_timeout_s) and 0 <= stamp.barrier_timeout_s <= MAX_BARRIER_S):
        bad = f"barrier_timeout_s {stamp.barrier_timeout_s} is out of range: 0 ({DEFAULT_BARRIER_S:g} s) to {MAX_BARRIER_S:g} seconds"
    elif len(stamp.setup) > MAX_SETUP_CHARS:
        bad = f"setup of {len(stamp.setup):,} characters is longer than {MAX_SETUP_CHARS:,}"
    elif len(stamp.stopped) > MAX_SETUP_CHARS:
        bad = f"stopped of {len(stamp.stopped):,} characters is longer than {MAX_SETUP_CHARS:,}"
    elif len(stamp.stopped_by) > MAX_STOPPED_BY_CHARS:
        bad = f"stopped_by of {len(stamp.stopped_by):,} characters is longer than {MAX_STOPPED_BY_CHARS:,}"
    elif stamp.job_name and not is_job_name(stamp.job_name):
        bad = f"job_name {echo(stamp.job_name, 40)} is not a name of 1 to {MAX_JOB_NAME_CHARS} printable ASCII "
        bad += "characters (empty: none)"
    elif stamp.job_name and job_hash(stamp.job_name) != stamp.job:
        bad = f"job_name {echo(stamp.job_name)} is not the name of job {stamp.job}, the stamp's (its hash is "
        bad += f"{job_hash(stamp.job_name)}): a stamp names its own job, by the --job-id text its id is the hash of"
    elif stamp.stopped_by and not stamp.stopped:
        bad = "stopped_by (the refusal a worker stopped on) is said by a stop stamp, with stopped; this one says no stopped"
    elif (pull or create) and (stamp.done or stamp.stopped):
        bad = f"{'done' if stamp.done else 'stopped'} is said by a PushBatch without pushes, not by a "
        bad += "pull" if pull else "CreateTable"
    elif stamp.done and stamp.stopped:
        bad = "a stamp says done (the worker finished) or stopped (it did not), not both"
    elif stamp.unclocked and pull:
        bad = "unclocked (an async or geo worker's) is said by a PushBatch, not by a pull (which waits for nothing)"
    elif stamp.unclocked and stamp.sync:
        bad = "a stamp says sync (its step summed over the job's workers) or unclocked (async or geo), not both"
    elif stamp.token and not stamp.unclocked:
        bad = "token (an async or geo worker process's) is said by an unclocked stamp, not a sync or ssp one"
    elif stamp.apart and (pull or create):
        bad = "apart (a push that ends none of its worker's steps here) is said by a PushBatch, not by a "
        bad += "pull" if pull else "CreateTable"
    elif stamp.apart and (stamp.sync or stamp.done or stamp.stopped or stamp.unclocked):
        said = next(k for k in ("sync", "done", "stopped", "unclocked") if getattr(stamp, k))
        bad = "apart (a push that ends none of its worker's steps here) is said by a push of a sync or ssp worker "
        bad += f"that is no sync contribution, not done and not stopped; this one says {said}"
    if bad:
        raise InvalidArgumentError(f"bad worker stamp: {bad}; {nothing_done(create)}")


def job_stops(shard_id: int, job: str) -> str:
    """How the message of an error that stops a job (job: as ps.stamp job_named names it) on a shard starts
    (ps.stamp JOB_STOPPING_ERRORS; its stopping_refusal finds it in a stop stamp's reason)."""
    return f"shard {shard_id}: job {job} stops: "


def nothing_done(create: bool) -> str:
    """How a refusal ends: what the refused request did not do (a CreateTable's create: its table; a pull's or
    push's: its rows)."""
    return "nothing was created" if create else NOTHING_APPLIED


def setup_pairs(setup: str) -> dict[str, str]:
    """The key=value pairs of a stamp's setup (a token without '=' is a key with an empty value)."""
    return dict(token.partition("=")[::2] for token in setup.split())


def job_kind(setup: str, unclocked: bool) -> str:
    """A job's mode as its setup names it ('--mode geo'), else as its stamps tell it ('sync or ssp')."""
    mode = setup_pairs(setup).get("mode")
    if mode:
        return f"--mode {mode if mode.isalnum() and len(mode) <= 20 else echo(mode, 20)}"  # a word as it is
    return "async or geo" if unclocked else "sync or ssp"


def setup_difference(setup: str, job_setup: str) -> str:
    """The keys whose values differ between two setups, each as "key 'value' (the job's: 'value')"."""
    mine, job = setup_pairs(setup), setup_pairs(job_setup)
    keys = [k for k in dict.fromkeys([*job, *mine]) if mine.get(k) != job.get(k)]
    named = ", ".join(f"{echo(k)} {echo(mine.get(k, '(unset)'), 40)} (the job's: {echo(job.get(k, '(unset)'), 40)})"
                      for k in keys[:NAMED_KEYS])  # fmt: skip
    return named + (f" and {len(keys) - NAMED_KEYS} more" if len(keys) > NAMED_KEYS else "")


def check_batch_stamp(stamp: WorkerStamp, shared: bool, advance_clock: int) -> None:
    """InvalidArgumentError for what a PushBatch's stamp may not say of the batch, whatever the job: a shared batch
    (applied once under a key any worker may send) stamped as one of its worker's steps or its end, or a batch
    stamped apart that advances the clock."""
    if shared and (stamp.done or stamp.stopped or not (stamp.apart or stamp.unclocked)):
        said = "done" if stamp.done else "stopped" if stamp.stopped else "neither apart nor unclocked"
        raise InvalidArgumentError("bad worker stamp: a shared PushBatch (applied once under a key any caller may "
                                   "send) is none of its worker's steps nor its end, so its stamp says apart (a "
                                   "sync or ssp worker's) or unclocked (an async or geo worker's), not done or "
                                   f"stopped; this one says {said}; {NOTHING_APPLIED}")  # fmt: skip
    if stamp.apart and advance_clock:
        raise InvalidArgumentError(f"a PushBatch stamped apart ends none of its worker's steps, so it advances no "
                                   f"clock; this one advances it by {advance_clock:,}; {NOTHING_APPLIED}")  # fmt: skip


def check_ending_batch(stamp: WorkerStamp, carries: bool) -> None:
    """InvalidArgumentError where a done or stop stamp's PushBatch carries pushes or a clock advance."""
    if carries:
        word = "stop" if stamp.stopped else "done"
        raise InvalidArgumentError(f"a {word} stamp comes in a PushBatch without pushes and without a clock "
                                   f"advance; {NOTHING_APPLIED}")  # fmt: skip

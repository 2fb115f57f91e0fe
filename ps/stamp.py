"""WorkerStamp: what a training job's worker stamps its requests with (sync and ssp: its PullBatch and PushBatch;
async and geo: its PushBatch, unclocked; every mode: the CreateTable of its job's tables, which holds the shard for
the job), field for field protos/ps.proto's WorkerStamp. The worker builds it
(worker/steprows.py) and sends it
(ps.codec.stamp_to_proto); the shard reads it back (ps.service.stamp_of, from_message), checks it and keeps the job's
clocks by it (ps.engine.followedjob)."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, fields
from typing import Any

from ps.config import DEFAULT_BARRIER_S, MAX_JOB_NAME_CHARS
from ps.errors import BarrierTimeoutError, InvalidArgumentError, JobConflictError, PsError, SyncStepTooLargeError

# the refusals that stop a job on a shard (ps.engine.tenancy JobTenancy.stop), whose message starts with
# ps.engine.stampcheck job_stops' words
JOB_STOPPING_ERRORS = (InvalidArgumentError, JobConflictError, SyncStepTooLargeError, BarrierTimeoutError)


@dataclass(frozen=True)
class WorkerStamp:
    """job (nonzero, the same for every worker, one id per run: a shard remembers the sync steps it applied under
    it), this worker in [0, num_workers), the step (a pull's: about to be computed; a push's: whose gradients
    these are), staleness (a pull waits until every worker pushed the steps < step - staleness), sync (a push's
    step is summed over every worker and applied once), barrier_timeout_s (how long a wait may last; 0: the
    shard's default, DEFAULT_BARRIER_S), done (finish), acked: the number of this worker's steps whose push has had
    its reply (at most step, but for done; a shard that restarted learns the worker's clock from it), setup: what
    every worker of the job runs alike (worker.row_source.job_setup; the shards refuse a worker of another setup,
    which stops the job), stopped: why the worker stopped before its end (nonempty: a stop stamp), unclocked:
    an async or geo job's push stamp, which holds the shards for its job and moves no clock (step, staleness, sync
    and acked 0), and token: an unclocked stamp's worker process (random, nonzero, kept in its --resume-file; 0:
    not known), so that a shard refuses a second process pushing as the same worker (ps.engine.tenancy), and apart:
    a sync or ssp worker's PushBatch that ends none of its steps on the shard (a message of a step's push before
    the shard's last, or a push sent apart from the steps), which holds the shard for the job and moves no clock;
    stopped_by: a stop stamp's, the class of the shard's refusal its worker stopped on (worker.stopping
    stopped_by; empty: a cause of its own), which a shard relays where it stopped the job (ps.engine.tenancy);
    job_name: the job as its workers' --job-id named it (job is that name's hash, job_hash: a shard refuses a name
    that hashes to another job; empty: no name), which the shard's messages name it by (job_named)."""

    job: int
    worker: int
    num_workers: int
    step: int
    staleness: int = 0
    sync: bool = False
    barrier_timeout_s: float = 0.0
    done: bool = False
    acked: int = 0
    setup: str = ""
    stopped: str = ""
    unclocked: bool = False
    token: int = 0
    apart: bool = False
    stopped_by: str = ""
    job_name: str = ""

    @property
    def named(self) -> str:
        """The stamp's job as messages name it (job_named)."""
        return job_named(self.job, self.job_name)

    @property
    def timeout_s(self) -> float:
        """How long a wait of this stamp may last, in seconds."""
        return self.barrier_timeout_s or DEFAULT_BARRIER_S

    @staticmethod
    def from_message(m: Any) -> WorkerStamp:
        """The stamp of a WorkerStamp message (generated, or a ps.codec view with the same attributes; the proto's
        fields and this class's are one list: tests/test_codec.py)."""
        return WorkerStamp(**{f.name: getattr(m, f.name) for f in fields(WorkerStamp)})


def stopping_refusal(stamp: WorkerStamp) -> tuple[type[PsError], str] | None:
    """The refusal a stop stamp's worker stopped on, where it stopped the stamp's job on a shard: its class (the
    stamp's stopped_by, worker/stopping.py stopped_by: the class of the shard's refusal, is one of
    JOB_STOPPING_ERRORS) and its words (the stamp's reason, stop_reason: the error's class, then its first line,
    holds job_stops' words of the stamp's job, by its name or its id, then printable ASCII to its end; the first,
    the cause, where a reason relays a relay). None otherwise: the worker stopped for a cause of its own, or on a
    refusal that stops no job. A shard relays it (ps.engine.tenancy relayed_stop); a geo worker pushes no deltas
    after it (worker/steprows.py GeoRows)."""
    cls = next((c for c in JOB_STOPPING_ERRORS if c.__name__ == stamp.stopped_by), None)
    job = "|".join(re.escape(n) for n in {str(stamp.job), stamp.named})  # (a shard may name it by its id)
    found = None if cls is None else re.search(rf"\bshard \d+: job (?:{job}) stops: [ -~]*\Z", stamp.stopped)
    return None if found is None else (cls, found[0])


def job_named(job: int, name: str = "") -> str:
    """A job as messages name it: by its name, quoted ('j3': a stamp's job_name, printable ASCII once checked,
    ps.engine.stampcheck), else by its id."""
    return ascii(name) if name else str(job)


def job_hash(name: str) -> int:
    """The job id a --job-id name stands for (worker.cli_train_config job_id): the 64-bit hash of its text (its CRC-32
    low, its Adler-32 high), which a stamp's job_name must hash to (ps.engine.stampcheck)."""
    data = name.encode()
    return zlib.crc32(data) | (zlib.adler32(data) << 32)


def names_job(name: str, job: int) -> bool:
    """Whether name may be a stamp's job_name (is_job_name) and is the name of job (job_hash)."""
    return is_job_name(name) and job_hash(name) == job


def is_job_name(text: str) -> bool:
    """Whether text may be a stamp's job_name: 1 to MAX_JOB_NAME_CHARS printable ASCII characters (a shard prints
    it in its messages as it is, quoted)."""
    return 0 < len(text) <= MAX_JOB_NAME_CHARS and text.isascii() and text.isprintable()

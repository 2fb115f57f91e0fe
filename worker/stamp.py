"""WorkerStamp: what a training job's worker stamps its pulls and pushes with in sync and ssp modes."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from protos import ps_pb2
from ps.config import DEFAULT_BARRIER_S


@dataclass(frozen=True)
class WorkerStamp:
    """What a training job's worker stamps its requests with in a mode other than async (protos/ps.proto,
    WorkerStamp): job (nonzero, the same for every worker, one id per run: a shard remembers the sync steps it
    applied under it), this worker in [0, num_workers), the step (a pull's: about to be computed; a push's: whose
    gradients these are), staleness (a pull waits until every worker pushed the steps < step - staleness), sync
    (a push's step is summed over every worker and applied once), how long a wait may last, done (finish), and
    acked: the number of this worker's steps whose push has had its reply (at most step, but for done; a shard
    that restarted learns the worker's clock from it), and setup: what every worker of the job runs alike
    (worker.steprows.job_setup; the shards refuse a worker of another setup, which stops the job); stopped: why
    the worker stopped before its end (stop_job)."""

    job: int
    worker: int
    num_workers: int
    step: int
    staleness: int = 0
    sync: bool = False
    barrier_timeout_s: float = DEFAULT_BARRIER_S
    done: bool = False
    acked: int = 0
    setup: str = ""
    stopped: str = ""

    def to_proto(self) -> ps_pb2.WorkerStamp:
        """The message of every field (the proto's fields and this class's are one list: tests/test_codec.py)."""
        return ps_pb2.WorkerStamp(**asdict(self))

"""Exactly-once numbering of a client's pushes: its random client id, a request number per shard, and the checks
of the reply to a PushBatch's first attempt.

A shard applies a PushBatch of (client id, request number) once however often it arrives (ps.engine.shard.Shard
.push_batch), so the client may send it again (worker/retry.py says for how long). A sync PushBatch carries the
client id but no number: its shard applies the step's sum under the job's key (ps.engine.jobs).
"""

from __future__ import annotations

import secrets
import threading

from protos import ps_pb2
from ps.errors import ClientIdInUseError, JobIdReusedError
from ps.stamp import WorkerStamp


def new_client_id() -> int:
    """A random client id: nonzero, top bit clear (ps.service.client_key)."""
    return secrets.randbits(63) | 1


class RequestNumbers:
    """The PushBatch requests a client sent to each of num_shards shards. Hold lock across a push's numbering and
    sending (one push_many at a time): each shard gets requests in seq order."""

    def __init__(self, num_shards: int):
        self.seq = [0] * num_shards
        self.lock = threading.Lock()

    def next(self, shard: int) -> int:
        """The number of the next request to the shard."""
        self.seq[shard] += 1
        return self.seq[shard]


def check_applied(
    where: str, client_id: int, request: ps_pb2.PushBatchRequest, reply: ps_pb2.PushBatchResponse
) -> None:
    """ClientIdInUseError when the reply to a PushBatch's first attempt applied fewer ids than it carried: the
    shard (where: "shard i at address") holds a request of this client id at or past this one, which another
    caller sent."""
    sent = sum(len(p.ids) // 8 for p in request.pushes)
    if reply.num_applied < sent:
        raise ClientIdInUseError(
            f"{where} applied {reply.num_applied} of the {sent} ids of PushBatch "
            f"request {request.seq} of client id {client_id:#x} on its first attempt: it had applied a "
            "request of this client id numbered as high before, so another caller uses the same client id; the "
            "rest was not applied. Give each client its own id"
        )


def check_contributed(
    where: str, request: ps_pb2.PushBatchRequest, reply: ps_pb2.PushBatchResponse, stamp: WorkerStamp
) -> None:
    """JobIdReusedError when the reply to a sync PushBatch's first attempt carrying ids applied none: the shard
    (where: "shard i at address") had applied that step of the job before (an earlier run of the job id, or this
    worker restarted within its job); the contribution was dropped."""
    if reply.num_applied == 0 and any(p.ids for p in request.pushes):
        raise JobIdReusedError(
            f"job {stamp.named}'s step {stamp.step} was applied before on {where}, so this push of it was dropped: "
            "an earlier run used the job id, or this "
            "worker restarted within a running sync job, which a worker cannot rejoin; a job id is for one run: "
            "start every worker of the job again under a new --job-id"
        )

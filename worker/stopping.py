"""Why a worker stopped before its end, as its job's shards read it (stop_reason, stopped_by), whether a shard's
refusal stopped its job (stopped_the_job), and its row source told that it stopped (abandon).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ps.errors import PsError
from ps.stamp import stopping_refusal
from ps.terminate import Terminated, signal_behind
from worker.retry import pushes_cannot_land

if TYPE_CHECKING:
    from worker.client import WorkerStamp

log = logging.getLogger("worker.stopping")


def stop_reason(e: BaseException) -> str:
    """Why a worker stopped, for its job's other workers: "interrupted (Ctrl-C)", "terminated (SIGTERM)", or the
    error's class and the first line of its message ("InvalidArgumentError: shard 1 at ...": with stopped_by, a
    shard reads a refusal that stopped the job so, and stops the job with it, ps.engine.tenancy)."""
    e = signal_behind(e) or e  # numba can wrap a signal's exception in a SystemError
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(e, Terminated):
        return "terminated (SIGTERM)"
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def stopped_by(e: BaseException) -> str:
    """The class of the shard's refusal a worker stopped on, for its stop stamp's stopped_by (a shard relays a
    refusal that stopped the job: ps.engine.tenancy): e's, where a shard refused a call with it (worker.retry's
    refused_by names the shard); "" for a cause of the worker's own, a PsError it raised itself included."""
    return type(e).__name__ if isinstance(e, PsError) and getattr(e, "refused_by", None) is not None else ""


def stopped_the_job(stamp: WorkerStamp | None, reason: str, by: str) -> bool:
    """Whether a worker stopped for reason (stop_reason) on a refusal of class by (stopped_by) stopped on a shard's
    refusal that stopped its job (ps.stamp stopping_refusal; stamp: the worker's, None: not known): the shards that
    stopped the job refuse its further pushes (geo's held deltas, allreduce's MLP) and the others would apply them,
    so none is made."""
    return stamp is not None and stopping_refusal(replace(stamp, stopped=reason, stopped_by=by)) is not None


def abandon(source: Any, e: BaseException) -> None:
    """source.abandon(stop_reason(e), pushes_ok, stopped_by(e)) for a worker that e stops before its end
    (pushes_ok: not worker.retry.pushes_cannot_land(e)); a failure of that is logged, not raised: e is the error to
    report."""
    try:
        source.abandon(stop_reason(e), pushes_ok=not pushes_cannot_land(e), by=stopped_by(e))
    except Exception as failed:
        log.warning("could not tell the servers that this worker stopped: %s", failed)

"""What a --dense allreduce worker stopped before its end does with the MLP it holds: the writer writes it to the
servers, unless the error that stopped the worker says that the write cannot land or must not; what happened is
logged, never raised (the error that stopped the worker is the one to report, and its exit code stays that one's).

The errors, by what they say of the servers (for the stop and for the save's own failure alike, but for the
fourth, which only the stop looks for; the first three are worker.retry's pushes_cannot_land, and the first four
what a geo worker's held deltas follow too):
- the servers failed: a shard unavailable (not answering, closing, starting, paused past its retries, busy), its data
  dir lost, a push it must replay on a restart, its store failing, its disk full or its file size limit reached:
  the write would fail the same way;
- the model state replaced: a shard restored from a checkpoint or started on a new data dir since this run read
  it; the run's MLP must not be written into another model;
- the job refused: the shards follow another job, or take this worker as done, or its job id or client id as used
  by another run; the write carries the same stamp and client id, and would be refused the same way;
- a refusal that stopped the job (a shard's, relayed: "shard N: job J stops: ...", ps.stamp stopping_refusal): the
  shards that stopped the job refuse the write and the others would apply it, so it is not made;
- a request refused (anything else a shard or the client's own checks refuse: bad values, a request too large, a
  table missing, a barrier timeout): the servers are up, and the write is a request of its own.
"""

from __future__ import annotations

import logging
from typing import Any

from ps.errors import ModelStateReplacedError, PsError
from ps.stamp import WorkerStamp
from worker.retry import JOB_REFUSALS, pushes_cannot_land, servers_failed
from worker.stopping import stop_reason, stopped_by, stopped_the_job

log = logging.getLogger("worker.allreduce_stop")

KEPT = "they hold the MLP written last (or the one the job started from), and a resumed run trains it from there"
MIXED = ("unless a shard applied part of this write before it failed (the error says which): such a shard holds "
         "this MLP's tables it applied, the others the ones written before")  # fmt: skip
NOT_OURS = "they hold another model, which this run's MLP is not written into"


def save_dense_on_stop(dense: Any, e: BaseException, stamp: WorkerStamp | None = None) -> None:
    """--dense allreduce: the MLP lives in the workers until the end, so a worker that e stops has the writer (the
    lowest rank with a batch: dense.writes_on_stop) write it to the servers (AllReduceDense.save_on_stop), before it
    tells them it stopped, unless e says the servers failed, hold another model state, or refuse the job, or is a
    shard's refusal that stopped the job (stamp: the worker's, which names its job; None: not looked for) (the
    module docstring); the writer then logs that it wrote nothing, and why. A failure of the write is logged with
    what it says of the servers; nothing is raised (e is the error to report). dense without save_on_stop (the
    PS dense path): nothing to do."""
    save = getattr(dense, "save_on_stop", None)
    if save is None:
        return
    stopped_job = stopped_the_job(stamp, stop_reason(e), stopped_by(e))
    if stopped_job or pushes_cannot_land(e):
        if dense.writes_on_stop():
            why = f"a shard's refusal stopped the job ({stop_reason(e)})" if stopped_job else what_happened(e)
            log.warning("did not write the MLP of this worker's last step to the servers as it stopped (--dense "
                        "allreduce): %s; %s", why, left_on_servers(e))  # fmt: skip
        return
    try:
        if save():
            log.info("wrote the MLP of this worker's last step to the servers (--dense allreduce), for a resumed run")
    except Exception as failed:
        log.warning("could not write the MLP to the servers as this worker stopped (--dense allreduce): %s; %s",
                    what_happened(failed), left_on_servers(failed, tried=True))  # fmt: skip


def what_happened(e: BaseException) -> str:
    """e, as the log says it: for a PsError, what it says of the servers first (the module docstring)."""
    if not isinstance(e, PsError):
        return str(e)
    if isinstance(e, ModelStateReplacedError):
        return f"the servers hold another model state than the one this run trained ({type(e).__name__}: {e})"
    if isinstance(e, JOB_REFUSALS):
        return f"the shards refuse this worker's job ({type(e).__name__}: {e})"
    if servers_failed(e):
        return f"the servers failed ({type(e).__name__}: {e})"
    return f"a request was refused, the servers are up ({type(e).__name__}: {e})"


def left_on_servers(e: BaseException, tried: bool = False) -> str:
    """What MLP the servers hold after e kept the write from being made, or (tried) stopped it part way: the write is
    a push per table and shard, so some may have landed."""
    if isinstance(e, ModelStateReplacedError):
        return NOT_OURS
    return f"{KEPT}; {MIXED}" if tried else KEPT

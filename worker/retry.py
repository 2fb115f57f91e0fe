"""Retry policy: which failed calls a client sends again and for how long, its waits for a shard that is down or
starting, and the error a call ends with; and what such an error says of the servers (servers_failed), and of a
stopped worker's further pushes (pushes_cannot_land).

A call that fails with UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED (RETRYABLE), or that an overloaded shard refused
before running it (RESOURCE_EXHAUSTED, ps.errors.OVERLOADED: overloaded), is sent again while its shard has
been failing for less than the client's server_timeout_s (Outages.keep_waiting), counted from the first failure of
any call of the client to it: a call made while the shard is still failing, after another gave up on it, waits only
for what is left of that (one attempt, then the error); one that may have run on its
shard (may_have_run) is not sent again when a repeat would apply it once more (sent_once); a PushBatch with a
client id gets no attempt once its first is ps.config RETRY_WINDOW_S old (retry_window_left), and ends with
RequestOutcomeUnknownError (Outages.outcome_unknown). The loop that applies this is
ShardCalls._call_until_answered (worker/shard_calls.py).
What it logs goes to the client's logger, "worker.client".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from protos import ps_pb2
from ps.config import REQUEST_RETENTION_S, RETRY_WINDOW_S
from ps.diskfull import DiskFullError
from ps.errornames import ERROR_NAME_KEY, error_class, error_fields
from ps.errors import (
    CHECKPOINT_PAUSE,
    OVERLOADED,
    PARTLY_APPLIED,
    SHARD_STARTING,
    SHRINK_NOT_AGAIN,
    ClientIdInUseError,
    DataDirLostError,
    FileTooLargeError,
    JobConflictError,
    JobIdReusedError,
    ModelStateReplacedError,
    PsError,
    RequestOutcomeUnknownError,
    ServerUnavailableError,
    ShardNeedsRestartError,
    StorageError,
    WorkerDoneError,
)

log = logging.getLogger("worker.client")


def error_name(e: grpc.RpcError) -> str | None:
    """The PsError class a refusal's server named (ps.errornames.ERROR_NAME_KEY), None if it named none."""
    return _name_in(_trailers(e))


def _name_in(trailers: tuple) -> str | None:
    """The PsError class named in a refusal's trailing metadata (error_name's), None if none is."""
    return next((v for k, v in trailers if k == ERROR_NAME_KEY), None)


def _trailers(e: grpc.RpcError) -> tuple:
    """The trailing metadata of the call that failed with e: () for none."""
    try:
        return tuple(e.trailing_metadata() or ())
    except Exception:  # an error raised by the client side itself has no call behind it
        return ()


RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
# (and the RESOURCE_EXHAUSTED of a call refused as overloaded: retryable)
# a call that ended so may have run on its shard (a stopping server cancels the calls it has not finished)
MAY_HAVE_RUN = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
# gRPC's texts of an UNAVAILABLE call that never reached a server: no connection was made
NOT_CONNECTED = ("failed to connect to all addresses", "DNS resolution failed", "Connection refused")
# never sent again after a deadline (but a Checkpoint release), with what to do then
APPLIED_AGAIN_IF_SENT_AGAIN = {
    "Shrink": f"{SHRINK_NOT_AGAIN}: one sent again would decay the rows this one shrank a second time; the "
    "shard's log says how far it got, and 'shrink at step ...' with the seconds it took once it ended: a "
    "--timeout-s past those gives the next Shrink of these tables the time it needs",
    "Checkpoint": "a hold whose reply was lost keeps the shard from taking pushes and Shrinks for up to "
    "--hold-timeout-s; a larger --timeout-s gives a large shard's save the time it needs",
}


# a checkpoint's pause of a shard's pushes past which a client warns that it waits (at INFO before): a save's hold
# lasts while every shard flushes and checkpoints, and the hold of a saver that died until its --hold-timeout-s
LONG_PAUSE_S = 10.0

# the errors that say a shard's process or its data dir failed, whatever the request
SERVER_FAILURES = (DataDirLostError, ShardNeedsRestartError, StorageError, DiskFullError, FileTooLargeError)


def servers_failed(e: BaseException) -> bool:
    """Whether e, the error a call (or the client's own check) ended with, says a server failed: a shard unavailable
    (status UNAVAILABLE: not answering, closing, starting, paused past the retries, busy), one of SERVER_FAILURES,
    or a PsError of no subclass (a server's error the client has no class for). Anything else a shard or the client
    refused (bad values, a request too large, a table missing, a barrier timeout, another job) leaves them up."""
    if not isinstance(e, PsError):
        return False
    return e.status == "UNAVAILABLE" or isinstance(e, SERVER_FAILURES) or type(e) is PsError


# the refusals that say the shards take no more pushes of this run's job: another run holds the job, or takes the
# worker as done, or the job id or the client id as its own
JOB_REFUSALS = (JobConflictError, WorkerDoneError, JobIdReusedError, ClientIdInUseError)


def pushes_cannot_land(e: BaseException) -> bool:
    """Whether e says that a further push of the run's (a stopped worker's held deltas, its MLP) would fail or must
    not be made: the servers failed (servers_failed), they hold another model state than the run read
    (ModelStateReplacedError: its position is void), or they refuse its job (JOB_REFUSALS). Such a push may be
    refused so by some shards and applied by others."""
    return servers_failed(e) or isinstance(e, (ModelStateReplacedError, *JOB_REFUSALS))


def overloaded(e: grpc.RpcError) -> bool:
    """Whether the call that failed with e was refused, never run, by a shard whose threads were busy and whose
    queue of calls was full (ps-server --max-queued-calls): gRPC's RESOURCE_EXHAUSTED of OVERLOADED, which names no
    PsError (the shard's own RESOURCE_EXHAUSTED refusals do; a message over gRPC's limit says otherwise)."""
    return (e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_name(e) is None
            and OVERLOADED in (e.details() or ""))  # fmt: skip


def retryable(e: grpc.RpcError) -> bool:
    """Whether a call that failed with e may be sent again, as far as its status says: RETRYABLE, or overloaded."""
    return e.code() in RETRYABLE or overloaded(e)


def why_failed(e: grpc.RpcError) -> str:
    """What a failed call's status says, in short: gRPC's text for a refused connection names every address it
    tried ("failed to connect to all addresses; last error: ..."), its code's name for a cancelled call, what the
    start of a shard that is starting is doing."""
    details = e.details() or ""
    if doing := starting(e):
        return f"starting: {doing}"
    if "Connection refused" in details:
        return "connection refused: nothing listens there"
    if e.code() == grpc.StatusCode.CANCELLED:
        return "CANCELLED: the server stopped the call"
    if overloaded(e):
        return (f"RESOURCE_EXHAUSTED: {details}: every thread of the shard busy and its queue of calls full (ps-server "
                "--threads, --max-queued-calls); the call was not run")  # fmt: skip
    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"DEADLINE_EXCEEDED: {details}; down, or busy: its requests may be waiting for their memory room"
    return f"{e.code().name}: {details}"


def failing(e: grpc.RpcError) -> str:
    """How a shard whose call failed with e is said to be: "not answering in time" for a deadline (it may be busy,
    not down), "overloaded" for a call refused as overloaded, else "unavailable"."""
    if overloaded(e):
        return "overloaded"
    return "not answering in time" if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "unavailable"


def starting(e: grpc.RpcError) -> str:
    """What the start of the shard that refused the call is doing ("replaying its journal, 43% (12 s so far)"), or
    "" when the shard was not starting (ps.errors.ShardStartingError)."""
    details = e.details() or ""
    if e.code() != grpc.StatusCode.UNAVAILABLE or f" {SHARD_STARTING}: " not in details:
        return ""
    return details.split(f" {SHARD_STARTING}: ", 1)[1]


def retry_window_left(method: str, request: object, started: tuple[float, float]) -> float:
    """Seconds left to send attempts of a call first sent at started (time.monotonic(), time.time()): of
    RETRY_WINDOW_S for a PushBatch with a client id (its shard keeps it only so long), by whichever clock has
    moved more (monotonic time stops while the machine sleeps; wall time can be set back); inf for the others."""
    if method != "PushBatch" or not getattr(request, "client_id", 0):
        return float("inf")
    return RETRY_WINDOW_S - max(time.monotonic() - started[0], time.time() - started[1])


def unanswered(e: grpc.RpcError) -> bool:
    """Whether the call that failed with e may have run on its shard without its answer reaching the client: past
    its deadline, or cancelled (MAY_HAVE_RUN), or UNAVAILABLE with its connection lost after it was sent (the shard's
    process died: "Socket closed", "Connection reset by peer"); not a refusal its shard made and named (error_name)
    nor a call that found no connection to make (NOT_CONNECTED)."""
    if e.code() in MAY_HAVE_RUN:
        return True
    if e.code() != grpc.StatusCode.UNAVAILABLE or error_name(e) is not None:
        return False
    return not any(text in (e.details() or "") for text in NOT_CONNECTED)


def may_have_run(e: grpc.RpcError) -> bool:
    """Whether the call that failed with e may have run on its shard: unanswered, or refused by its shard after part
    of it was applied (PARTLY_APPLIED: a batch push's pushes before the refused one, a Shrink's chunks before it
    stopped); not another refusal its shard made and named (a shard starting, or stopping)."""
    return unanswered(e) or partly_applied(e)


def partly_applied(e: grpc.RpcError) -> bool:
    """Whether e is its shard's refusal saying part of the call was applied (PARTLY_APPLIED in its details)."""
    return PARTLY_APPLIED in (e.details() or "")


def sent_once(method: str, request: object) -> bool:
    """Whether a call of method with request is not sent again after its deadline (APPLIED_AGAIN_IF_SENT_AGAIN)."""
    return method in APPLIED_AGAIN_IF_SENT_AGAIN and getattr(request, "phase", "") != "release"


class Outages:
    """The shards a client's calls find failing, since when (down: shard -> time.monotonic() it started failing; failed:
    shard -> that of its latest failed attempt), and which of them a checkpoint's pause holds (pausing: logged at INFO,
    not WARNING, until it has lasted LONG_PAUSE_S: long_paused, warned once). A shard's outage lasts until a call to it
    is answered (back), or until none of its calls failed for server_timeout_s before a call began (that call's first
    failure starts a new one): a call that gave up on the shard does not end it, so the calls that follow wait for no
    more than what is left of it; nor do a call's own attempts, however far apart its backoff or its deadlines put them.
    Every method takes lock: a client's calls run on any thread. servers: the client's addresses, for its messages."""

    def __init__(self, servers: list[str], gone: Callable[[int], str | None] | None = None):
        """gone(shard): why the shard can never answer again (a local shard whose process exited), else None:
        a shard gone is not waited for."""
        self.servers = servers
        self.gone = gone
        self.down: dict[int, float] = {}
        self.failed: dict[int, float] = {}
        self.pausing: set[int] = set()
        self.long_paused: set[int] = set()
        self.lock = threading.Lock()

    def _end(self, shard: int) -> tuple[float | None, bool]:
        """Ends the shard's outage (lock held): (since when it was failing, None where it was not; whether a
        checkpoint's pause held it, not warned as long)."""
        self.failed.pop(shard, None)
        paused = shard in self.pausing and shard not in self.long_paused
        self.pausing.discard(shard)
        self.long_paused.discard(shard)
        return self.down.pop(shard, None), paused

    def back(self, shard: int) -> None:
        """Notes that the shard answered; logs that it is back if it was failing."""
        with self.lock:
            since, paused = self._end(shard)
        if since is not None:
            log.log(logging.INFO if paused else logging.WARNING, "shard %d at %s is back after %.1f s", shard,
                    self.servers[shard], time.monotonic() - since)  # fmt: skip

    def keep_waiting(self, shard: int, e: grpc.RpcError, server_timeout_s: float, began: float) -> bool:
        """True while the shard has been failing for less than server_timeout_s, since the first failure of its
        outage (logs when that starts, and, while time is left, a pause that lasts and a failure after a pause), and
        is not gone. e: the error of an attempt of a call whose first attempt was sent at time.monotonic() `began`:
        a failure seen within server_timeout_s before it began keeps the outage going, and so do the call's own (its
        retries, however far apart its backoff or deadlines put them)."""
        if server_timeout_s <= 0 or (self.gone is not None and self.gone(shard)):
            return False
        now = time.monotonic()
        paused = CHECKPOINT_PAUSE in (e.details() or "")  # a routine pause of pushes, seconds long
        with self.lock:
            last = self.failed.get(shard, began)
            if began - last > server_timeout_s:  # no call failed on it for so long before this one began: over
                self._end(shard)
            self.failed[shard] = max(last, now)
            since = self.down.setdefault(shard, now)
            if since is now and paused:
                self.pausing.add(shard)
            outage = not paused and shard in self.pausing  # a shard that failed during a checkpoint's pause
            if outage:
                self.pausing.discard(shard)
            long = paused and shard in self.pausing and now - since >= LONG_PAUSE_S and shard not in self.long_paused
            if long:
                self.long_paused.add(shard)
        left = server_timeout_s - (now - since)  # none: this call ends with error(), which says why
        if long and left > 0:
            log.warning("shard %d at %s has refused pushes for %.0f s: a checkpoint holds them (the save of a large "
                        "shard, or the hold of a saver that died, which ends after its --hold-timeout-s); waiting for "
                        "it for up to %.0f s more", shard, self.servers[shard], now - since, left)  # fmt: skip
        if outage and left > 0:
            log.warning("shard %d at %s is %s (%s) after a checkpoint's pause; waiting for it for up to %.0f s "
                        "more", shard, self.servers[shard], failing(e), why_failed(e), left)  # fmt: skip
        doing = starting(e)
        if since is now and doing:  # this call marked it
            log.warning("shard %d at %s is starting (%s); waiting for it for up to %.0f s", shard, self.servers[shard],
                        doing, server_timeout_s)  # fmt: skip
        elif since is now:
            log.log(logging.INFO if paused else logging.WARNING, "shard %d at %s is %s (%s); waiting for it for up to "
                    "%.0f s", shard, self.servers[shard], failing(e), why_failed(e), server_timeout_s)  # fmt: skip
        return left > 0

    def outcome_unknown(
        self, shard: int, request: ps_pb2.PushBatchRequest, e: grpc.RpcError, client_id: int
    ) -> PsError:
        """The error of a PushBatch not answered within RETRY_WINDOW_S of its first attempt."""
        with self.lock:  # a later call waits for the shard anew
            self._end(shard)
        what = f"PushBatch request {request.seq}" if request.seq else "a sync PushBatch"
        return RequestOutcomeUnknownError(
            f"shard {shard} at {self.servers[shard]} did not answer {what} of client id {client_id:#x} within "
            f"{RETRY_WINDOW_S / 86400:.3g} days of its first attempt (last: {why_failed(e)}), so it is not sent again: "
            f"a shard forgets a request {REQUEST_RETENTION_S / 86400:.3g} days after applying it, and an attempt after "
            "that would be applied a second time. Its outcome is unknown: it may or may not have been applied. To be "
            "exact, restore the servers from a checkpoint saved before it (ps-server --restore) and train on from "
            "there; a job that can take one push lost or kept (async SGD, say) can start again on the "
            "servers as they are"
        )

    def error(
        self,
        method: str,
        shard: int,
        e: grpc.RpcError,
        timeout_s: float,
        request: object,
        server_timeout_s: float,
        ran: bool = True,
    ) -> PsError:
        """The error a call that failed with e ends with: for a shard gone (see __init__), why; for one not sent again
        after it may have run unanswered, that it may still run; for one whose shard stayed down, how long it was
        waited for (ran: whether any attempt of it may have run, may_have_run, which the error's `ran` says); else
        the PsError of e's status, the shard's refusal, whose `refused_by` names the shard (a call not sent again
        after its shard said part of it was applied, PARTLY_APPLIED, included: the shard's words say what stands,
        and where the shard is gone since, that too)."""
        code, where = e.code(), f"shard {shard} at {self.servers[shard]}"
        gone = self.gone(shard) if self.gone is not None and retryable(e) else None
        if gone:  # before "it may still be running there": it is not running anywhere
            with self.lock:
                self._end(shard)
            if partly_applied(e):  # what stays of it is the shard's to say
                return self._refusal(method, shard, e, f"; since then {gone}")
            return ServerUnavailableError(f"{where}: {method} failed ({why_failed(e)}): {gone}")
        once = sent_once(method, request) and may_have_run(e)
        if once and unanswered(e):  # the shard's answer, where one came, says what of it stands: raised as it is
            ended = (f"did not answer {method} within {timeout_s:g} s" if code == grpc.StatusCode.DEADLINE_EXCEEDED
                     else f"cancelled {method} (is it stopping?)" if code == grpc.StatusCode.CANCELLED
                     else f"lost the connection during {method} ({why_failed(e)}; did it die?)")  # fmt: skip
            return ServerUnavailableError(
                f"{where} {ended}: it may still be running there, or be done; "
                "it was not sent again, since a repeat would apply it once more "
                f"({APPLIED_AGAIN_IF_SENT_AGAIN[method]})"
            )
        if retryable(e) and not once:
            with self.lock:  # the outage goes on: a later call waits only for what is left of it
                since = self.down.get(shard)
            waited = 0.0 if since is None else time.monotonic() - since
            tried = f"; it has been failing for {waited:.0f} s (server timeout {server_timeout_s:g} s)"
            if starting(e):  # a journal replay or a restore can take longer than the timeout: say how to wait
                tried += "; a larger server timeout (--server-timeout) waits for a start that takes longer"
            elif CHECKPOINT_PAUSE in (e.details() or ""):  # a save of a large shard, or a hold its saver left
                tried += ("; it was last refused by a checkpoint's hold of its pushes, which lasts while the save "
                          "runs (if the saver died, until its --hold-timeout-s): a larger server timeout "
                          "(--server-timeout) waits out a longer hold")  # fmt: skip
            ended = f" did not answer {method} within {timeout_s:g} s" if code == grpc.StatusCode.DEADLINE_EXCEEDED \
                else f": {method} failed ({why_failed(e)})"  # fmt: skip
            error = ServerUnavailableError(where + ended + (tried if server_timeout_s > 0 else ""))
            error.ran = ran
            return error
        if code == grpc.StatusCode.UNIMPLEMENTED:  # a gRPC server of another service: not a shard, not a bug of ours
            return ServerUnavailableError(f"{where} does not serve {method} ({e.details()}): it is a gRPC server "
                                          "but not a sparseps shard; is --servers the right address (ps-server "
                                          "prints its address as it starts)?")  # fmt: skip
        return self._refusal(method, shard, e)

    def _refusal(self, method: str, shard: int, e: grpc.RpcError, after: str = "") -> PsError:
        """The PsError of e's status, the class its shard named, in the shard's words (and `after` them), with the
        fields its shard sent (ps.errornames.error_fields: a DiskFullError's reason, path and remedy)."""
        code = e.code().name
        head = f"shard {shard} at {self.servers[shard]}: {method} failed with {code}: "
        trailers = _trailers(e)  # read once: the class named and the fields
        cls = error_class(code, _name_in(trailers))
        error = cls.received(f"{head}{e.details()}{after}", head, error_fields(trailers))
        error.refused_by = shard  # a shard's refusal, not the worker's own error (worker.stopping.stopped_by)
        return error


def push_left(error: PsError, batches: dict[int, int], wave: int, failed: dict[int, PsError]) -> PsError:
    """error, the first of the calls that failed in wave `wave` (from 0) of a push sent as batches[shard] batches
    per shard (a shard's k-th batch in wave k, each wave sent once the one before had every reply), with what the
    push left on each shard added to its message where the push was more than one batch: the batches applied, the
    one that failed (failed: shard -> its error; a shard unavailable or not answering may apply it, now or later,
    or not, where an attempt of it may have run) and those not sent; where it was one batch, whether it may be
    applied. The same object: its class and fields stay."""
    if sum(batches.values()) <= 1:
        if isinstance(error, ServerUnavailableError):  # RequestOutcomeUnknownError says so itself
            outcome = "may be applied, now or later, or not" if error.ran else "was not applied (no attempt of it ran)"
            error.args = (f"{error}; the push {outcome}", *error.args[1:])
        return error
    left = []
    for shard in sorted(batches):
        total, e = batches[shard], failed.get(shard)
        if e is None:
            left.append(f"shard {shard}: {min(total, wave + 1)} of {total} applied")
            continue
        may_be = isinstance(e, ServerUnavailableError) and e.ran  # unanswered, and an attempt of it may have run
        outcome = ": it may be applied, now or later, or not" if may_be else ""
        unsent = total - wave - 1
        left.append(f"shard {shard}: {wave} of {total} applied, batch {wave + 1} failed ({type(e).__name__}{outcome})"
                    + (f", {unsent} not sent" if unsent else ""))  # fmt: skip
    error.args = (f"{error}. This push was {sum(batches.values())} PushBatch calls; {'; '.join(left)}",
                  *error.args[1:])  # fmt: skip
    return error

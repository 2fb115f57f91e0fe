"""ShardCalls: a Client's calls to its shards, a batch of them at once, each sent again while its shard may come back.

Resilience: a call that fails with UNAVAILABLE or DEADLINE_EXCEEDED (the server is down, restarting, starting or
stuck), or CANCELLED (a server stopping cancels the calls it has not finished; this client cancels none it goes on
with), or RESOURCE_EXHAUSTED from a server too busy to take it (its queue of calls full: worker.retry.overloaded;
such a call was not run) is sent again, with backoff from 0.05 s to 2 s, while the shard has been failing for less than
`server_timeout_s`, counted from the first failure of any of the client's calls to it (worker.retry.Outages); the
client logs which shard it is waiting for (for a shard that is starting, what its start is
doing: ps.errors.ShardStartingError) and when it is back, and past the timeout raises ServerUnavailableError
naming the shard. Pushes are safe to send again: each PushBatch carries this
client's random id and a per-shard request number, and the shard applies a request once however often it
arrives (ps.engine.shard.Shard.push_batch), across its restarts too, for as long as it keeps the request
(ps.storage.applied: REQUEST_RETENTION_S after it was applied). So no attempt of a PushBatch goes out once its
first attempt is ps.config RETRY_WINDOW_S old (a day less), whatever server_timeout_s says, and none has a
deadline past that: the call raises RequestOutcomeUnknownError, saying it may or may not be applied. A PushBatch
and a PullBatch also carry the shard's model state id as wait_ready read it (StatsResponse state_id), and so do a
CreateTable, a Shrink and a checkpoint's hold and save (the id the save read, worker.checkpoint): a shard that came
back restored from a checkpoint, or on a new data dir, refuses them, applying, creating, shrinking, holding and
reading nothing (ModelStateReplacedError, not retried), so a run does not train on over a model that lost its
pushes, nor make a table on a new data dir that hides the one lost there, nor an eval score with rows of two model
states, nor a checkpoint mix them, nor a Shrink sent again while its shard restarts decay a restored checkpoint's
rows; their other refusals found the state id the shard's (carries_state_id). Any call that carries no
state id and that a shard refuses (a DescribeTable of a table that a new data dir does not hold) asks the shard's
Stats once: where its state id is not the one wait_ready read, the refusal is raised as ModelStateReplacedError,
with the shard's words (_replaced). A call sent again past
each deadline until the server timeout asks the same: where the shard answers the Stats, the error says it is up and
that the call may need a longer --timeout-s (a big pull on a busy shard), not only that the shard was failing.
advance_clock is such a PushBatch, of no pushes. Shrink and Checkpoint carry no client id nor request number: one
whose deadline passed, that its stopping shard cancelled, or whose connection was lost after it was sent (the shard
died) may be running or done on its shard (worker.retry.unanswered), so it is not sent again (a repeat would decay
the scores once more; a hold would meet its own hold, a save its own files; a release is sent again) and raises
ServerUnavailableError saying so; one its shard refused after part of it was applied (a Shrink stopped part way:
ps.errors.PARTLY_APPLIED) is not sent again either, and raises that refusal; an UNAVAILABLE that found no
connection, or that the shard named (starting, or closing: nothing was applied), is retried as for the others.

The policy (which failures are sent again, the waits, the errors) is worker/retry.py's, the calls at once
worker/fanout.py's; this module is the loop that applies them, with the channels and stubs it calls through.
What it logs goes to the client's logger, "worker.client". worker/client.py is the API over it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from protos import ps_pb2, ps_pb2_grpc
from ps.codec import STATE_ID_PHASES
from ps.errors import (
    ModelStateReplacedError,
    PsError,
    RequestTooLargeError,
    ServerUnavailableError,
)
from ps.replacedstate import PUSH_REFUSED, READ_REFUSED, how_replaced, model_state_replaced
from ps.security import READ_ONLY_METHODS
from worker.channels import open_channels
from worker.fanout import CallThreads, at_once, attempt
from worker.request_numbers import new_client_id
from worker.retry import Outages, may_have_run, retry_window_left, retryable, sent_once, unanswered

log = logging.getLogger("worker.client")

CLOSE_TIMEOUT_S = 5.0  # close's wait for the channels
PROBE_TIMEOUT_S = 2.0  # the deadline of _probe's Stats (a push waits for it under its client's numbering lock): a shard
# still busy with a call's abandoned attempts is slow


class ShardCalls:
    """The channels to a list of shards and the calls over them: (method, shard, request) calls made at once, each
    sent again as the module docstring says, and the error each ends with. worker.client.Client builds its calls on
    it; its constructor says what the arguments mean (tls: (tls_ca, tls_cert, tls_key)). Three fields are the
    Client's to write: `_acked` (the steps of a worker whose stamped push every shard answered, which a stamped call
    sent again carries), `_room` (the shards' smallest request room as wait_ready read it, named in a too-large
    refusal) and `_seen` (what wait_ready read of each shard, (state id, cluster name), state id 0: not read; pushes
    and pulls carry the state id, and the refusals of calls that carry none are checked against it: _replaced)."""

    def __init__(
        self,
        servers: list[str],
        timeout_s: float,
        server_timeout_s: float,
        max_request_bytes: int,
        tls: tuple[str | None, str | None, str | None],
        auth_token: str | None,
        shard_gone: Callable[[int], str | None] | None,
    ):
        self.servers = list(servers)
        self.timeout_s = timeout_s
        self.server_timeout_s = server_timeout_s
        self.max_request_bytes = max_request_bytes
        self.client_id = new_client_id()  # nonzero, top bit clear (ps.service.client_key): deduplicated
        self._outages = Outages(self.servers, shard_gone)  # the shards failing now, and since when
        self._closed = False
        # (job, worker) -> the worker's steps whose stamped push had every shard's reply (Client.push_many's)
        self._acked: dict[tuple[int, int], int] = {}
        self._channels = open_channels(self.servers, *tls, auth_token)
        self._tls = tls  # for why_not_ready
        self._stubs = [ps_pb2_grpc.ParameterServerStub(c) for c in self._channels]
        self._callers = CallThreads()  # the calls of a batch past its first
        self._room = 0  # the smallest request room of the shards as wait_ready read it (0: none, or not read)
        self._seen = [(0, "")] * len(self.servers)  # each shard's (state id, cluster) as wait_ready read it
        self._interrupted = False  # a signal stopped a call's wait: later calls block (_attempt)

    def _call_all(self, method: str, requests: list) -> list:
        return self._call_many(method, list(range(len(self._stubs))), requests)

    def _call_many(self, method: str, shards: list[int], requests: list) -> list:
        """Sends all requests at once (one per entry of shards), waits for all, raises the first error."""
        return self._call_mixed([(method, s, r) for s, r in zip(shards, requests)])

    def _call_mixed(
        self, calls: list[tuple[str, int, object]], retried: set[int] | None = None, timeout_s: float | None = None
    ) -> list:
        """Sends every (method, shard, request) at once, waits for all; returns the replies in order or raises
        the first error. Each attempt's deadline is timeout_s (None: self.timeout_s). A call failing with
        UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED is sent again (backoff) while its shard has been failing for less
        than server_timeout_s, on its own: a call waiting at a job's barrier on one shard may wait for the retry of
        another on a restarted one. The positions of calls sent again are added to `retried`."""
        outcomes = self._outcomes(calls, retried, timeout_s)
        for outcome in outcomes:
            if isinstance(outcome, PsError):
                raise outcome
        return outcomes

    def _outcomes(
        self, calls: list[tuple[str, int, object]], retried: set[int] | None = None, timeout_s: float | None = None
    ) -> list:
        """_call_mixed's calls, made as it says: the reply, or the PsError it ended with, of each, in order."""
        timeout_s = timeout_s or self.timeout_s
        return at_once(
            self._callers,
            calls,
            lambda c, i, interruptible: self._call_until_answered(c, i, retried, timeout_s, interruptible),
        )

    def _call_until_answered(
        self, call: tuple[str, int, object], i: int, retried: set[int] | None, timeout_s: float, interruptible: bool
    ) -> object:
        """One call of _call_mixed, sent again as it says: its reply, or the PsError it ends with (returned)."""
        method, shard, request = call
        delay, started = 0.05, (time.monotonic(), time.time())
        left = retry_window_left(method, request, started)
        ran = False  # an attempt may have run on the shard (worker.retry.may_have_run)
        while True:
            outcome = self._attempt(call, min(timeout_s, left), interruptible)
            if not isinstance(outcome, grpc.RpcError):
                self._outages.back(shard)
                return outcome
            ran = ran or may_have_run(outcome)
            once = sent_once(method, request) and may_have_run(outcome)
            if (
                not retryable(outcome)
                or once
                or self._closed
                or not self._outages.keep_waiting(shard, outcome, self.server_timeout_s, started[0])
            ):
                return self._error(method, shard, outcome, timeout_s, request, ran)
            if retried is not None:
                retried.add(i)
            time.sleep(delay)
            if self._closed:  # closed while it slept: its last error stands
                return self._error(method, shard, outcome, timeout_s, request, ran)
            left = retry_window_left(method, request, started)
            if left <= 0:
                return self._outages.outcome_unknown(shard, request, outcome, self.client_id)
            self._restamp(request)
            delay = min(2 * delay, 2.0)

    def _attempt(self, call: tuple[str, int, object], timeout_s: float, interruptible: bool) -> object:
        """One attempt of a (method, shard, request) call: its reply, or the grpc.RpcError it failed with
        (worker.fanout.attempt; interruptible on the caller's thread). Once a signal has stopped such a wait, every
        later attempt is a blocking call: the exception the signal raised can land inside gRPC's bookkeeping of
        the channel's calls in flight and leave no thread polling for their completions, so that a later future
        would never complete, its deadline included (a worker stopping by SIGTERM hung in stop_job that way), while
        a blocking call polls for its own completion."""
        method, shard, request = call
        interruptible = interruptible and not self._interrupted
        try:
            return attempt(getattr(self._stubs[shard], method), request, timeout_s, interruptible)
        except BaseException:
            if interruptible:
                self._interrupted = True
            raise

    def _restamp(self, request: object) -> None:
        """Raises the acked of a stamped request about to be sent again to what this worker knows now: a pull sent
        ahead of its step's previous push carried the acked of then, and a shard restarted meanwhile learns the
        worker's clock from stamps alone (ps.engine.followedjob), so the old one could hold the worker behind itself."""
        stamp = request.stamp if isinstance(request, (ps_pb2.PullBatchRequest, ps_pb2.PushBatchRequest)) and \
            request.HasField("stamp") else None  # fmt: skip
        if stamp is None or stamp.done or stamp.stopped:
            return
        acked = min(self._acked.get((stamp.job, stamp.worker), 0), stamp.step)
        if acked > stamp.acked:
            stamp.acked = acked

    def _send(self, calls: list[tuple[str, int, object]], timeout_s: float) -> list:
        """Makes every (method, shard, request) call at once, once: the first from this thread (interruptible,
        see _attempt), the others on the pool. Returns each call's reply, or the grpc.RpcError it failed with."""
        return at_once(self._callers, calls, lambda c, i, interruptible: self._attempt(c, timeout_s, interruptible))

    def _error(
        self, method: str, shard: int, e: grpc.RpcError, timeout_s: float, request: object = None, ran: bool = True
    ) -> PsError:
        """The error a call ends with (worker.retry.Outages.error; ran: whether an attempt may have run); for a message
        too large for its shard's room, the room its size came from (wait_ready's: a shard that restarted with a
        smaller room since refuses it)."""
        error = self._outages.error(method, shard, e, timeout_s, request, self.server_timeout_s, ran)
        if getattr(error, "refused_by", None) == shard and not isinstance(error, ModelStateReplacedError) and \
                not carries_state_id(request):  # fmt: skip
            error = self._replaced(method, shard, error)
        elif e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and type(error) is ServerUnavailableError and \
                method != "Stats" and not (sent_once(method, request) and unanswered(e)):  # fmt: skip
            self._deadline_hint(method, shard, error)
        sync = isinstance(request, ps_pb2.PushBatchRequest) and request.HasField("stamp") and request.stamp.sync
        if isinstance(error, RequestTooLargeError) and self._room and not sync:  # a sync push is one message
            error.args = (f"{error}. This client sized its messages ({self.max_request_bytes:,} bytes) by the room "
                          f"for requests its shards reported when it connected (the smallest {self._room:,} bytes): "
                          f"where shard {shard}'s room above is smaller, the shard restarted with a smaller "
                          "--memory-bytes since, and a worker started again sizes its messages by the room then",)  # fmt: skip
        return error

    def _probe(self, shard: int) -> tuple[ps_pb2.StatsResponse | None, float]:
        """The shard's Stats (one attempt within PROBE_TIMEOUT_S; None if it failed, or the client is closed: its
        channels take no call) and the seconds it took."""
        began = time.monotonic()
        try:
            stats = None if self._closed else self._attempt(("Stats", shard, ps_pb2.StatsRequest()), PROBE_TIMEOUT_S,
                                                            False)  # fmt: skip
        except ValueError:  # closed meanwhile: "Cannot invoke RPC on closed channel!"
            stats = None
        return (None if isinstance(stats, grpc.RpcError) else stats), time.monotonic() - began

    def _deadline_hint(self, method: str, shard: int, error: ServerUnavailableError) -> None:
        """Adds to error, that of a call whose attempts outlived their deadline until the server timeout, that the
        shard is up where it answers a Stats (_probe): the call needs longer than its deadline gives it."""
        stats, took_s = self._probe(shard)
        if stats is not None:
            error.args = (f"{error}; yet it answered a Stats in {took_s:.2f} s: it is up, and {method} may take longer "
                          f"than its deadline (--timeout-s {self.timeout_s:g}: a large request, or a busy shard); a "
                          "larger --timeout-s gives it the time it needs", *error.args[1:])  # fmt: skip

    def _replaced(self, method: str, shard: int, error: PsError) -> PsError:
        """error, a refusal of the shard's of a call that carries no state id, or where the shard's Stats (one
        attempt) give another state id than wait_ready read (it came back restored, or on a new data dir: such a
        call finds no table there), a ModelStateReplacedError saying so after the shard's words
        (ps.replacedstate.model_state_replaced: a read's words for a method of ps.security.READ_ONLY_METHODS, else a push's,
        the call's outcome left to the shard's words). A run stops on it without a --skip-examples hint of its own
        (worker.train): the servers no longer hold what it trained."""
        seen, cluster = self._seen[shard]
        if not seen:
            return error
        stats, _ = self._probe(shard)
        if stats is None or stats.state_id in (0, seen):
            return error
        how = how_replaced(stats.restored_from)
        if stats.cluster != cluster:
            how += f" of another cluster ({f'cluster {stats.cluster!r}' if stats.cluster else 'unnamed'})"
        if (stats.shard_id, stats.num_shards) != (shard, len(self.servers)):
            how += f" as shard {stats.shard_id} of {stats.num_shards}"
        words = READ_REFUSED if method in READ_ONLY_METHODS else PUSH_REFUSED
        said = model_state_replaced(shard, stats.state_id, seen, how, words._replace(outcome=""))
        replaced = ModelStateReplacedError(f"{error}; {said}")
        replaced.refused_by = shard
        return replaced

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Closes the channels (their calls in flight are cancelled), for at most timeout_s: a channel whose close
        does not return by then (seen once after a SIGTERM landed inside a call) is left to the process's end."""
        self._closed = True  # a call the closing cancels is not sent again
        self._callers.close()
        closing = threading.Thread(target=lambda: [c.close() for c in self._channels], name="ps-close", daemon=True)
        closing.start()
        closing.join(timeout_s)
        if closing.is_alive():
            log.warning("the client's gRPC channels did not close within %.3g s; going on without them", timeout_s)


def carries_state_id(request: object) -> bool:
    """Whether request has a state_id field holding an id (nonzero) that its shard checks before anything else of
    the call (ps.engine.shard check_state_id; of a Checkpoint, only in the phases of ps.codec STATE_ID_PHASES), so
    that a refusal other than ModelStateReplacedError found the id the shard's, and needs no Stats to tell whether
    the shard was replaced (ShardCalls._replaced)."""
    fields = getattr(getattr(request, "DESCRIPTOR", None), "fields_by_name", {})
    if "state_id" not in fields or not request.state_id:
        return False
    return "phase" not in fields or request.phase in STATE_ID_PHASES

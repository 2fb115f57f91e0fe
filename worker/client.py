"""Client: pull and push any batch of ids against a sharded cluster.

Every call: dedup the ids once (`np.unique`), sum the gradients of duplicates, route each unique id to the
shard that owns its slot (ps.sharding), send one request per shard (chunked past `max_request_bytes`) with a
deadline of `timeout_s`, all in flight at once, and reassemble the answers in the caller's order. A call is a
blocking unary call: the caller's thread makes one, a small pool of the client's threads the others at once (a
gRPC future would start a polling thread per call whenever none is in flight: ~0.6 ms of a step each time).

Resilience: a call that fails with UNAVAILABLE or DEADLINE_EXCEEDED (the server is down, restarting, starting or
stuck), or CANCELLED (a server stopping cancels the calls it has not finished; this client cancels none it goes on
with), is sent again, with backoff from 0.05 s to 2 s, while the shard has been failing for less than
`server_timeout_s`; the client logs which shard it is waiting for (for a shard that is starting, what its start is
doing: ps.errors.ShardStartingError) and when it is back, and past the timeout raises ServerUnavailableError
naming the shard. Pushes are safe to send again: each PushBatch carries this
client's random id and a per-shard request number, and the shard applies a request once however often it
arrives (ps.engine.shard.Shard.push_batch), across its restarts too, for as long as it keeps the request
(ps.storage.applied: REQUEST_RETENTION_S after it was applied). So no attempt of a PushBatch goes out once its
first attempt is ps.config RETRY_WINDOW_S old (a day less), whatever server_timeout_s says, and none has a
deadline past that: the call raises RequestOutcomeUnknownError, saying it may or may not be applied.
Shrink, AdvanceClock and Checkpoint carry no such id: one whose deadline passed (or that its stopping shard cancelled) may be running or done on its shard,
so it is not sent again (a repeat would
decay the scores, or move the clock, once more; a hold would meet its own hold, a save its own files; a release is
sent again) and raises ServerUnavailableError saying so; UNAVAILABLE (the shard is down or closing: nothing was
applied) is retried as for the others.

Modes on the servers' clock: pull_many and push_many with a WorkerStamp (a training job's worker and step) send
every shard a request carrying it, and return the job's min_clock with their rows (ps/engine/jobs.py has the
semantics: a pull waits for the slowest worker within the staleness; a sync push waits for every worker's
push of the step, summed and applied once); finish() says the worker is done. A stamped call sent again carries
the acked the worker has then (the steps whose stamped push_many returned), not that of its first attempt. A
stamped call's deadline is timeout_s + the stamp's barrier_timeout_s (a wait is not a dead server); a wait that ends without the other
workers raises BarrierTimeoutError (ABORTED), never retried. A sync push's first attempt that a shard answers
as applied before (a second run under the job's id) raises JobIdReusedError.
"""

from __future__ import annotations

import logging
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import grpc
import numba
import numpy as np

from protos import ps_pb2, ps_pb2_grpc
from ps import codec, wire
from ps.config import (
    DEFAULT_BARRIER_S,
    MAX_MESSAGE_BYTES,
    MAX_STAMP_TEXT,
    REQUEST_RETENTION_S,
    RETRY_WINDOW_S,
    TableConfig,
)
from ps.errors import (
    CHECKPOINT_PAUSE,
    CLIENT_TABLE_FULL,
    DISK_FULL_PREFIX,
    SHARD_STARTING,
    STATUS_TO_ERROR,
    ClientIdInUseError,
    ClientTableFullError,
    DiskFullError,
    JobIdReusedError,
    PsError,
    RequestOutcomeUnknownError,
    ServerUnavailableError,
)
from ps.security import client_channel, tls_hint
from ps.sharding import SlotMap

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
# a call that ended so may have run on its shard (a stopping server cancels the calls it has not finished)
MAY_HAVE_RUN = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
# never sent again after a deadline (but a Checkpoint release), with what to do then
APPLIED_AGAIN_IF_SENT_AGAIN = {
    "Shrink": "a larger --timeout-s gives a large table's Shrink the time it needs; `ps-worker stats` shows the rows "
    "left",
    "AdvanceClock": "`ps-worker stats` shows each shard's clock",
    "Checkpoint": "a hold whose reply was lost keeps the shard from taking pushes for up to --hold-timeout-s; a "
    "larger --timeout-s gives a large shard's save the time it needs",
}


def _why(e: grpc.RpcError) -> str:
    """What a failed call's status says, in short: gRPC's text for a refused connection names every address it
    tried ("failed to connect to all addresses; last error: ..."), its code's name for a cancelled call, what the
    start of a shard that is starting is doing."""
    details = e.details() or ""
    if doing := _starting(e):
        return f"starting: {doing}"
    if "Connection refused" in details:
        return "connection refused: nothing listens there"
    if e.code() == grpc.StatusCode.CANCELLED:
        return "CANCELLED: the server stopped the call"
    return f"{e.code().name}: {details}"


class PushItem(NamedTuple):
    """One table's push in push_many: ids (n,) with grads (n, dim), one show per occurrence and clicks (n,) summed
    per id the same way (None: no clicks); or, with shows (n,), ids already unique and every count given per id."""

    table: str
    ids: np.ndarray
    grads: np.ndarray
    clicks: np.ndarray | None = None
    shows: np.ndarray | None = None


def _starting(e: grpc.RpcError) -> str:
    """What the start of the shard that refused the call is doing ("replaying its journal, 43% (12 s so far)"), or
    "" when the shard was not starting (ps.errors.ShardStartingError)."""
    details = e.details() or ""
    if e.code() != grpc.StatusCode.UNAVAILABLE or f" {SHARD_STARTING}: " not in details:
        return ""
    return details.split(f" {SHARD_STARTING}: ", 1)[1]


def _retry_window_left(method: str, request: object, started: tuple[float, float]) -> float:
    """Seconds left to send attempts of a call first sent at started (time.monotonic(), time.time()): of
    RETRY_WINDOW_S for a PushBatch with a client id (its shard keeps it only so long), by whichever clock has
    moved more (monotonic time stops while the machine sleeps; wall time can be set back); inf for the others."""
    if method != "PushBatch" or not getattr(request, "client_id", 0):
        return float("inf")
    return RETRY_WINDOW_S - max(time.monotonic() - started[0], time.time() - started[1])


def _sent_once(method: str, request: object) -> bool:
    """Whether a call of method with request is not sent again after its deadline (APPLIED_AGAIN_IF_SENT_AGAIN)."""
    return method in APPLIED_AGAIN_IF_SENT_AGAIN and getattr(request, "phase", "") != "release"


log = logging.getLogger("worker.client")


def _server_list_error(servers: list[str], found: list[tuple[int, int]]) -> str:
    """What is wrong with a server list whose servers say they are shards found[i] = (shard_id, num_shards):
    a server listed twice, shards missing or extra, or the order."""
    listed = [f"{a} (shard {sid} of {n})" for a, (sid, n) in zip(servers, found)]
    ids = [sid for sid, _ in found]
    counts = {n for _, n in found}
    if len(set(ids)) < len(ids):
        twice = sorted({sid for sid in ids if ids.count(sid) > 1})
        same = [a for a, sid in zip(servers, ids) if sid == twice[0]]
        what = f"shard {', '.join(map(str, twice))} is listed more than once"
        what += (" (the same address twice)" if len(set(same)) < len(same) else
                 f" ({' and '.join(same)} both say they are shard {twice[0]}: was one started without its --shard-id, "
                 "which defaults to 0?)")  # fmt: skip
    elif len(counts) > 1:
        what = "the servers belong to clusters of different shard counts"
    elif counts != {len(servers)}:
        (n,) = counts
        absent = sorted(set(range(n)) - set(ids))
        what = f"the cluster has {n} shards, the list {len(servers)}" + (
            f"; shards {', '.join(map(str, absent))} are missing" if absent else "")  # fmt: skip
    else:
        what = "the servers are not in shard order"
    return (f"the server list does not match the cluster: {what}. Listed: {', '.join(listed)}; give every shard's "
            "address once, in shard order")  # fmt: skip


NOTHING_LISTENS = "; nothing listens there: is ps-server running on that host and port?"
CLOSE_TIMEOUT_S = 5.0  # Client.close's wait for its channels
STOP_TIMEOUT_S = 2.0  # stop_job's deadline per shard: a stopping worker does not wait long
MAX_STOP_REASON = MAX_STAMP_TEXT  # characters of a stop stamp's reason, as the shards take it
READY_PATIENCE_S = 2.0  # wait_ready logs what it waits for once a shard has not answered for this long


def _why_not_ready(address: str, tls: bool, client_cert: bool, timeout_s: float = 1.0) -> str:
    """A hint for a server whose gRPC channel did not become ready: NOTHING_LISTENS when no TCP connection can be
    made there (the server is down); the TLS flag the shard wants, or has not, as a probe finds it
    (ps.security.tls_hint); else that something listens but does not answer as a sparseps shard."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError):
        return NOTHING_LISTENS
    return tls_hint(address, tls, client_cert, timeout_s) or (
        "; something listens there, but it did not answer as a sparseps shard (gRPC): it may be another service's "
        "port (HTTP, a metrics endpoint), or a shard too busy to answer"
    )


@numba.njit(nogil=True, cache=True)
def segment_sum(inverse: np.ndarray, grads: np.ndarray, out: np.ndarray) -> None:
    """out[inverse[i], :] += grads[i, :]."""
    dim = grads.shape[1]
    for i in range(inverse.shape[0]):
        u = inverse[i]
        for j in range(dim):
            out[u, j] += grads[i, j]


def sum_duplicates(ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique sorted ids, their summed grads)."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    out = np.zeros((len(uniq), grads.shape[1]), dtype=np.float32)
    segment_sum(inverse.ravel().astype(np.int64), np.ascontiguousarray(grads, dtype=np.float32), out)
    return uniq, out


def _per_id(values, n: int, table: str, what: str) -> np.ndarray:
    """values as n float32, one per id (a single value is used for every id); ValueError for another length."""
    flat = np.asarray(values, dtype=np.float32).ravel()
    if len(flat) not in (1, n):
        raise ValueError(f"push to {table!r} has {len(flat)} {what} for {n} ids")
    return np.broadcast_to(flat, (n,)) if len(flat) != n else flat


def push_arrays(
    table: str,
    ids: np.ndarray,
    grads: np.ndarray,
    clicks: np.ndarray | None,
    shows: np.ndarray | None,
    dim: int,
) -> tuple:
    """(unique ids, their grads (n, dim), shows (n,), clicks (n,), all float32, and where each given id's row is
    in them or None) of one push item, as Client.push_many sends it. shows None: each occurrence of an id is one
    show and duplicates are summed; given: ids must be unique (ValueError) and everything is taken per id.
    Ids that are unique and increasing already (dense tables, a caller's np.unique) are taken as they are: no
    copy, no sort."""
    ids = np.ascontiguousarray(ids, dtype=np.uint64).ravel()
    grads = np.asarray(grads, dtype=np.float32).reshape(len(ids), dim)
    clicks = np.zeros(len(ids), np.float32) if clicks is None else _per_id(clicks, len(ids), table, "clicks")
    if shows is not None:
        if wire.repeats_ids(ids):
            raise ValueError(f"push to {table!r} with shows given repeats ids; they must be unique")
        return ids, grads, _per_id(shows, len(ids), table, "shows"), clicks, None
    if wire.strictly_increasing(ids):
        return ids, grads, np.ones(len(ids), dtype=np.float32), clicks, None
    counts = np.stack([np.ones(len(ids), dtype=np.float32), clicks], axis=1)  # show, click per occurrence
    uniq, summed = sum_duplicates(ids, np.concatenate([grads, counts], axis=1))
    order = np.searchsorted(uniq, ids)  # uniq is sorted: where each given id's row lands
    return uniq, summed[:, :dim], summed[:, dim], summed[:, dim + 1], order


def _per_item(flags: bool | Sequence[bool], n: int) -> list[bool]:
    """One flag per item of n: a single flag for all of them, or a sequence of n (ValueError for another length)."""
    if isinstance(flags, (bool, np.bool_)):
        return [bool(flags)] * n
    out = [bool(f) for f in flags]
    if len(out) != n:
        raise ValueError(f"push_many has {len(out)} add_delta flags for {n} items")
    return out


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


class Client:
    def __init__(
        self,
        servers: list[str],
        timeout_s: float = 60.0,
        server_timeout_s: float = 300.0,
        max_request_bytes: int = 64 * 1024 * 1024,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        auth_token: str | None = None,
    ):
        """timeout_s: the deadline of one attempt of a call; server_timeout_s: how long a shard may keep failing
        (down, restarting) before a call gives up (0: no retries). tls_ca: verify the servers' TLS certificates
        against it; tls_cert / tls_key: this client's certificate, for servers that require one; auth_token:
        sent with every call (ps/security.py)."""
        if not servers:
            raise ValueError("Client needs at least one server address")
        self.servers = list(servers)
        self.timeout_s = timeout_s
        self.server_timeout_s = server_timeout_s
        self.max_request_bytes = max_request_bytes
        self.client_id = secrets.randbits(63) | 1  # nonzero, top bit clear (ps.service.client_key): deduplicated
        self._request_seq = [0] * len(servers)  # PushBatch requests sent to each shard
        self._push_lock = threading.Lock()  # one push_many at a time: each shard gets requests in seq order
        self._down: dict[int, float] = {}  # shard -> when it started failing (_down_lock: calls run on any thread)
        self._pausing: set[int] = set()  # the shards of _down held by a checkpoint: logged at INFO, not WARNING
        self._down_lock = threading.Lock()
        self._closed = False
        self._acked: dict[int, int] = {}  # job -> this worker's steps whose stamped push had every shard's reply
        self.slot_map = SlotMap.contiguous(len(servers))
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # a restarted shard is found within ~2 s, not after gRPC's default backoff (up to 120 s)
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        self._channels = [client_channel(a, options, tls_ca, tls_cert, tls_key, auth_token) for a in self.servers]
        self._tls = (bool(tls_ca or tls_cert or tls_key), bool(tls_cert))  # for _why_not_ready
        self._stubs = [ps_pb2_grpc.ParameterServerStub(c) for c in self._channels]
        self._dims: dict[str, int] = {}
        self._routes: dict[tuple[int, int, int], tuple[np.ndarray, list]] = {}  # see _route
        self._callers = _CallThreads()  # the calls of a batch past its first

    # ---- cluster --------------------------------------------------------------------------------------
    def _why_not_ready(self, shard: int) -> str:
        return _why_not_ready(self.servers[shard], *self._tls)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Waits up to timeout_s for every shard to answer, and checks that shard i says it is shard i of
        len(servers) and that they all give one cluster name (ps-server --cluster). timeout_s None:
        server_timeout_s, the time a shard that is down is waited for (when that is 0, one call's deadline,
        timeout_s of the constructor)."""
        if timeout_s is None:
            timeout_s = self.server_timeout_s if self.server_timeout_s > 0 else self.timeout_s
        deadline = time.monotonic() + timeout_s
        for i, channel in enumerate(self._channels):
            ready = grpc.channel_ready_future(channel)
            try:
                ready.result(timeout=min(READY_PATIENCE_S, max(0.1, deadline - time.monotonic())))
            except grpc.FutureTimeoutError:
                left = deadline - time.monotonic()
                if left > 0:
                    log.warning("shard %d at %s does not answer yet%s; waiting for it for up to %.0f s", i,
                                self.servers[i], self._why_not_ready(i), left)  # fmt: skip
                try:
                    ready.result(timeout=max(0.1, left))
                except grpc.FutureTimeoutError:
                    raise ServerUnavailableError(
                        f"shard {i} at {self.servers[i]} did not accept a connection within {timeout_s:g} s"
                        + self._why_not_ready(i)
                    ) from None
        stats = self.stats()
        found = [(s.shard_id, s.num_shards) for s in stats]
        if found != [(i, len(self.servers)) for i in range(len(self.servers))]:
            raise PsError(_server_list_error(self.servers, found))
        names = [s.cluster for s in stats]
        if len(set(names)) > 1:
            said = ", ".join(
                f"{a} (shard {i}) says {n or '(unnamed)'!r}" for i, (a, n) in enumerate(zip(self.servers, names))
            )
            raise PsError(f"the server list mixes clusters: {said} (ps-server --cluster); give the addresses of one "
                          "cluster's shards")  # fmt: skip

    def stats(self) -> list[ps_pb2.StatsResponse]:
        return self._call_all("Stats", [ps_pb2.StatsRequest()] * len(self._stubs))

    def create_table(self, cfg: TableConfig) -> None:
        """Creates the table on every shard (idempotent for the same spec)."""
        cfg.validate()
        spec = codec.table_config_to_proto(cfg)
        self._call_all("CreateTable", [ps_pb2.CreateTableRequest(spec=spec)] * len(self._stubs))
        self._dims[cfg.name] = cfg.dim

    def describe_table(self, name: str) -> list[ps_pb2.TableInfo]:
        infos = self._call_all("DescribeTable", [ps_pb2.DescribeTableRequest(table=name)] * len(self._stubs))
        self._dims[name] = infos[0].spec.dim
        return infos

    def dim(self, table: str) -> int:
        if table not in self._dims:
            self.describe_table(table)
        return self._dims[table]

    # ---- data -----------------------------------------------------------------------------------------
    def pull(self, table: str, ids: np.ndarray) -> np.ndarray:
        """(len(ids), dim) float32 rows of ids (any shape, flattened; duplicates allowed), in order."""
        return self.pull_many([(table, ids)])[0]

    def pull_many(
        self, items: list[tuple[str, np.ndarray]], stamp: WorkerStamp | None = None
    ) -> list[np.ndarray] | tuple[list[np.ndarray], int]:
        """pull() of several (table, ids) at once: one PullBatch per shard (more past max_request_bytes), all in
        flight together, one wait. With a stamp, every shard gets a PullBatch carrying it (an empty one where it
        holds none of the ids, so that the pull waits for the job on every shard), and this returns (the rows,
        the job's min_clock: the smallest any shard answered)."""
        plans, requests = [], []
        for table, ids in items:
            ids = np.ascontiguousarray(ids, dtype=np.uint64).ravel()
            dim = self.dim(table)
            if wire.strictly_increasing(ids):  # unique and sorted already (a batch's unique ids): taken as they are
                uniq, inverse = ids, None
            else:
                uniq, inverse = np.unique(ids, return_inverse=True)
            rows = np.empty((len(uniq), dim), dtype=np.float32)
            for shard, sel in self._route(uniq, dim):
                request = ps_pb2.PullRequest(table=table, ids=wire.encode_ids(uniq[sel]))
                requests.append((shard, request, len(sel) * (4 * dim + 8), (rows, sel, dim)))
            plans.append((rows, inverse))
        groups = self._group(requests, every_shard=stamp is not None)
        proto = None if stamp is None else stamp.to_proto()
        calls = [("PullBatch", shard, ps_pb2.PullBatchRequest(pulls=[r[1] for r in g], stamp=proto))
                 for shard, g in groups]  # fmt: skip
        replies = self._call_mixed(calls, timeout_s=self._deadline(stamp))
        for (_, group), batch in zip(groups, replies):
            for (_, _, _, (rows, sel, dim)), reply in zip(group, batch.replies, strict=True):
                rows[sel] = wire.decode_rows(reply.rows, len(sel), dim)
        out = [rows if inverse is None else rows[inverse.ravel()] for rows, inverse in plans]
        return out if stamp is None else (out, min(r.min_clock for r in replies))

    def push(
        self, table: str, ids: np.ndarray, grads: np.ndarray, clicks: np.ndarray | None = None, add_delta: bool = False
    ) -> None:
        """Sums the grads of duplicate ids, then applies them on the owning shards. grads: (len(ids), dim).
        Each occurrence of an id is one show; clicks (len(ids),), e.g. the label of each occurrence's example,
        are summed per id the same way (None: no clicks). add_delta: see push_many."""
        self.push_many([PushItem(table, ids, grads, clicks=clicks)], add_delta=add_delta)

    def push_many(
        self,
        items: Sequence[PushItem | tuple],
        advance_clock: int = 0,
        return_rows: bool = False,
        add_delta: bool | Sequence[bool] = False,
        stamp: WorkerStamp | None = None,
    ) -> list | None | tuple[list | None, int]:
        """push() of several PushItems (or tuples in its order) at once and (if advance_clock > 0) the clock
        advance of every shard after them: one PushBatch per shard (more past max_request_bytes), all in flight
        together. A shard applies its batch only if every push in it is valid.

        An item with shows: its ids must be unique (a shard rejects duplicates) and grads, clicks and shows are
        sent per id as given, for a caller that summed them already.
        return_rows: returns, per item, the rows of its ids (in its order) right after the push, as a pull()
        then would: a training step's push and pull in one round trip. (Past max_request_bytes a shard gets its
        batches one after the other, and an item's rows are those after its own batch.)

        add_delta (one flag for every item, or one per item): the item's grads are deltas that the shards add to
        the embeddings as they are, with no optimizer step and the optimizer state untouched (e.g. best rows -
        current rows, to restore a model); duplicate ids' deltas are summed, and shows and clicks count as for
        any push (give shows 0 per id to count none). A batch may mix such items with optimizer pushes.

        Sent again while a shard is unavailable (see the module docstring), and applied once.

        stamp: every shard gets a batch carrying it and this returns (what it returns without one, the job's
        min_clock: the smallest any shard answered). Not sync: a shard's last batch carries the stamp (its
        worker's clock moves once the shard has every push of the step). Sync: each shard gets exactly one
        batch, whatever its size (the worker's contribution to the step), sent without this client's id: the
        shard applies the step's sum under the job's key."""
        requests, plans = [], []
        for item, delta in zip(items, _per_item(add_delta, len(items)), strict=True):
            table, ids, grads, clicks, shows = PushItem(*item)
            dim = self.dim(table)
            uniq, item_grads, item_shows, item_clicks, order = push_arrays(table, ids, grads, clicks, shows, dim)
            rows = np.empty((len(uniq), dim), dtype=np.float32) if return_rows else None
            for shard, sel in self._route(uniq, dim):
                request = ps_pb2.PushRequest(
                    table=table,
                    ids=wire.encode_ids(uniq[sel]),
                    grads=wire.encode_rows(item_grads[sel]),
                    dim=dim,
                    shows=wire.encode_rows(item_shows[sel]),
                    clicks=wire.encode_rows(item_clicks[sel]),
                    return_rows=return_rows,
                    add_delta=delta,
                )
                requests.append((shard, request, len(sel) * (4 * dim + 16), (rows, sel, dim)))
            plans.append((rows, order))
        sync = stamp is not None and stamp.sync
        groups = self._group(requests, every_shard=advance_clock > 0 or stamp is not None, whole=sync)
        last = {shard: i for i, (shard, _) in enumerate(groups)}  # the clock moves after a shard's last batch
        proto = None if stamp is None else stamp.to_proto()
        with self._push_lock:
            waves: list[list] = []  # wave k: the k-th batch of each shard; a shard's batches go in order
            for i, (shard, g) in enumerate(groups):
                request = ps_pb2.PushBatchRequest(
                    pushes=[r[1] for r in g], advance_clock=advance_clock if last[shard] == i else 0,
                    stamp=proto if last[shard] == i else None,
                )  # fmt: skip
                request.client_id = self.client_id  # a sync batch's tells two workers of one worker id apart
                if not sync:  # a sync batch is applied under the job's key, not this client's request numbers
                    self._request_seq[shard] += 1
                    request.seq = self._request_seq[shard]
                k = sum(1 for s, _ in groups[:i] if s == shard)
                waves += [[] for _ in range(k + 1 - len(waves))]
                waves[k].append((("PushBatch", shard, request), g))
            min_clock = None
            for wave in waves:
                retried: set[int] = set()
                replies = self._call_mixed([call for call, _ in wave], retried, timeout_s=self._deadline(stamp))
                for k, (((_, shard, request), _), reply) in enumerate(zip(wave, replies)):
                    if k not in retried and sync:  # a retry's reply counts only what the lost attempts left
                        self._check_contributed(shard, request, reply, stamp)  # undone
                    elif k not in retried:
                        self._check_applied(shard, request, reply)
                    if request.HasField("stamp"):
                        min_clock = reply.min_clock if min_clock is None else min(min_clock, reply.min_clock)
                if return_rows:
                    for (_, group), batch in zip(wave, replies):
                        for (_, _, _, (rows, sel, dim)), reply in zip(group, batch.rows, strict=True):
                            rows[sel] = wire.decode_rows(reply.rows, len(sel), dim)
        out = [rows if order is None else rows[order] for rows, order in plans] if return_rows else None
        if stamp is None:
            return out
        self._acked[stamp.job] = max(self._acked.get(stamp.job, 0), stamp.step + 1)  # every shard answered
        return out, min_clock or 0

    def finish(self, stamp: WorkerStamp) -> int:
        """Tells every shard that the stamp's worker is done (no wait of the job counts it any more); returns the
        job's min_clock. Idempotent: a shard that restarted forgets it, and is told again by calling this again.
        The stamp's acked should count every step of the worker (a shard raises the worker's clock to it)."""
        done = ps_pb2.PushBatchRequest(stamp=replace(stamp, done=True, sync=False).to_proto())
        replies = self._call_mixed(
            [("PushBatch", s, done) for s in range(len(self._stubs))], timeout_s=self._deadline(stamp)
        )
        return min(r.min_clock for r in replies)

    def stop_job(self, stamp: WorkerStamp, reason: str, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
        """Tells every shard that the stamp's worker stopped before its end, and why (reason, cut to
        MAX_STOP_REASON characters): each stops the job if it follows it, so that the other workers' waits end
        now, naming this worker, instead of at their barrier timeout, and another job may start. One attempt per
        shard, each within timeout_s, never retried: the worker is on its way out. Returns a line per shard that
        did not take it (empty: every shard did)."""
        why = reason if len(reason) <= MAX_STOP_REASON else reason[: MAX_STOP_REASON - 3] + "..."
        stop = ps_pb2.PushBatchRequest(
            stamp=replace(stamp, stopped=why or "stopped", done=False, sync=False).to_proto()
        )
        outcomes = self._send([("PushBatch", s, stop) for s in range(len(self._stubs))], timeout_s)
        return [f"shard {s} at {self.servers[s]} ({_why(o)})"
                for s, o in enumerate(outcomes) if isinstance(o, grpc.RpcError)]  # fmt: skip

    def _deadline(self, stamp: WorkerStamp | None) -> float:
        """A call's deadline: timeout_s, plus the stamp's barrier_timeout_s for a stamped call (it may wait)."""
        return self.timeout_s + (0.0 if stamp is None else stamp.barrier_timeout_s or DEFAULT_BARRIER_S)

    def _check_applied(self, shard: int, request: ps_pb2.PushBatchRequest, reply) -> None:
        """ClientIdInUseError when the reply to a PushBatch's first attempt applied fewer ids than it carried: the
        shard holds a request of this client id at or past this one, which another caller sent."""
        sent = sum(len(p.ids) // 8 for p in request.pushes)
        if reply.num_applied < sent:
            raise ClientIdInUseError(
                f"shard {shard} at {self.servers[shard]} applied {reply.num_applied} of the {sent} ids of PushBatch "
                f"request {request.seq} of client id {self.client_id:#x} on its first attempt: it had applied a "
                "request of this client id numbered as high before, so another caller uses the same client id; the "
                "rest was not applied. Give each client its own id"
            )

    def _check_contributed(self, shard: int, request: ps_pb2.PushBatchRequest, reply, stamp: WorkerStamp) -> None:
        """JobIdReusedError when the reply to a sync PushBatch's first attempt carrying ids applied none: the shard
        had applied that step of the job before (an earlier run of the job id, or this worker restarted within its
        job); the contribution was dropped."""
        if reply.num_applied == 0 and any(p.ids for p in request.pushes):
            raise JobIdReusedError(
                f"job id {stamp.job}'s step {stamp.step} was applied before on shard {shard} at "
                f"{self.servers[shard]}, so this push of it was dropped: an earlier run used the job id, or this "
                "worker restarted within a running sync job, which a worker cannot rejoin; a job id is for one run: "
                "start every worker of the job again under a new --job-id"
            )

    def advance_clock(self, steps: int = 1) -> int:
        """Advances every shard's clock; returns the new step (of shard 0)."""
        replies = self._call_all("AdvanceClock", [ps_pb2.AdvanceClockRequest(steps=steps)] * len(self._stubs))
        return int(replies[0].step)

    def shrink(self, table: str = "") -> list[ps_pb2.ShrinkResponse]:
        """Runs the eviction rules of one table (or all) on every shard."""
        return self._call_all("Shrink", [ps_pb2.ShrinkRequest(table=table)] * len(self._stubs))

    def checkpoint(self, requests: dict[int, ps_pb2.CheckpointRequest]) -> list[ps_pb2.CheckpointResponse]:
        """Sends each shard its Checkpoint phase (hold, save or release: worker/checkpoint.py runs them) at once;
        the replies in shard order. A hold or save whose deadline passed is not sent again (module docstring)."""
        shards = sorted(requests)
        return self._call_many("Checkpoint", shards, [requests[s] for s in shards])

    # ---- plumbing -------------------------------------------------------------------------------------
    def _route(self, uniq: np.ndarray, dim: int) -> list[tuple[int, np.ndarray]]:
        """(shard, positions in uniq) per request: grouped by owner, chunked to max_request_bytes. The routes of
        the last ids seen per (count, dim, request size limit) are kept: a dense table pushes the same ids every
        step. Callers only index with the positions, never change them."""
        key = (len(uniq), dim, self.max_request_bytes)
        known = self._routes.get(key)
        if known is not None and np.array_equal(known[0], uniq):
            return known[1]
        routes = list(self._compute_route(uniq, dim))
        if len(self._routes) >= 256:
            self._routes.clear()
        self._routes[key] = (uniq.copy(), routes)
        return routes

    def _compute_route(self, uniq: np.ndarray, dim: int):
        owner = self.slot_map.shard_of(uniq)
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(len(self._stubs) + 1))
        chunk = max(1, self.max_request_bytes // (4 * dim + 8))
        for shard in range(len(self._stubs)):
            sel = order[bounds[shard] : bounds[shard + 1]]
            for start in range(0, len(sel), chunk):
                yield shard, sel[start : start + chunk]

    def _group(self, requests: list[tuple], every_shard: bool = False, whole: bool = False) -> list[tuple[int, list]]:
        """Packs (shard, request, bytes, extra) into (shard, [those tuples]) batches of at most
        max_request_bytes each (a larger request alone), in order; whole: one batch per shard, whatever its size;
        every_shard: an empty batch for each shard that has none."""
        groups, open_group = [], {}
        for r in requests:
            shard, size = r[0], r[2]
            g = open_group.get(shard)
            if g is None or (not whole and g[1] and g[2] + size > self.max_request_bytes):
                g = open_group[shard] = [shard, [], 0]
                groups.append(g)
            g[1].append(r)
            g[2] += size
        if every_shard:
            groups += [[s, [], 0] for s in range(len(self._stubs)) if s not in open_group]
        return [(shard, rs) for shard, rs, _ in groups]

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
        timeout_s = timeout_s or self.timeout_s
        outcomes = self._at_once(
            calls, lambda c, i, interruptible: self._call_until_answered(c, i, retried, timeout_s, interruptible)
        )
        for outcome in outcomes:
            if isinstance(outcome, PsError):
                raise outcome
        return outcomes

    def _call_until_answered(
        self, call: tuple[str, int, object], i: int, retried: set[int] | None, timeout_s: float, interruptible: bool
    ) -> object:
        """One call of _call_mixed, sent again as it says: its reply, or the PsError it ends with (returned)."""
        method, shard, request = call
        delay, started = 0.05, (time.monotonic(), time.time())
        left = _retry_window_left(method, request, started)
        while True:
            outcome = self._attempt(call, min(timeout_s, left), interruptible)
            if not isinstance(outcome, grpc.RpcError):
                with self._down_lock:
                    since = self._down.pop(shard, None)
                    paused = shard in self._pausing
                    self._pausing.discard(shard)
                if since is not None:
                    log.log(logging.INFO if paused else logging.WARNING, "shard %d at %s is back after %.1f s", shard,
                            self.servers[shard], time.monotonic() - since)  # fmt: skip
                return outcome
            once = outcome.code() in MAY_HAVE_RUN and _sent_once(method, request)
            if (
                outcome.code() not in RETRYABLE
                or once
                or self._closed
                or not self._keep_waiting(shard, method, outcome)
            ):
                return self._error(method, shard, outcome, timeout_s, request)
            if retried is not None:
                retried.add(i)
            time.sleep(delay)
            if self._closed:  # closed while it slept: its last error stands
                return self._error(method, shard, outcome, timeout_s, request)
            left = _retry_window_left(method, request, started)
            if left <= 0:
                return self._outcome_unknown(shard, request, outcome)
            self._restamp(request)
            delay = min(2 * delay, 2.0)

    def _attempt(self, call: tuple[str, int, object], timeout_s: float, interruptible: bool) -> object:
        """One attempt of a call: its reply, or the grpc.RpcError it failed with. interruptible: as a gRPC future,
        whose wait a signal interrupts (the caller's thread: Ctrl-C during a sync or ssp wait stops the worker at
        once, cancelling the call)."""
        method, shard, request = call
        stub = getattr(self._stubs[shard], method)
        if not interruptible:
            try:
                return stub(request, timeout=timeout_s)
            except grpc.RpcError as e:
                return e
        future = stub.future(request, timeout=timeout_s)
        try:
            return future.result()
        except grpc.RpcError as e:
            return e
        except BaseException:  # KeyboardInterrupt, or Terminated from a SIGTERM handler
            future.cancel()
            raise

    def _restamp(self, request: object) -> None:
        """Raises the acked of a stamped request about to be sent again to what this worker knows now: a pull sent
        ahead of its step's previous push carried the acked of then, and a shard restarted meanwhile learns the
        worker's clock from stamps alone (ps.engine.jobs), so the old one could hold the worker behind itself."""
        stamp = request.stamp if isinstance(request, (ps_pb2.PullBatchRequest, ps_pb2.PushBatchRequest)) and \
            request.HasField("stamp") else None  # fmt: skip
        if stamp is None or stamp.done or stamp.stopped:
            return
        acked = min(self._acked.get(stamp.job, 0), stamp.step)
        if acked > stamp.acked:
            stamp.acked = acked

    def _send(self, calls: list[tuple[str, int, object]], timeout_s: float) -> list:
        """Makes every (method, shard, request) call at once, once: the first from this thread (interruptible,
        see _attempt), the others on the pool. Returns each call's reply, or the grpc.RpcError it failed with."""
        return self._at_once(calls, lambda c, i, interruptible: self._attempt(c, timeout_s, interruptible))

    def _at_once(self, calls: list, run: Callable[[tuple, int, bool], object]) -> list:
        """[run(call, its position, interruptible)] of every call at once: the first on this thread (interruptible:
        a signal stops the wait, see _attempt), the others on the pool; in order."""
        if not calls:
            return []
        others = [self._callers.submit(run, c, i, False) for i, c in enumerate(calls[1:], start=1)]
        return [run(calls[0], 0, True), *(f.result() for f in others)]

    def _keep_waiting(self, shard: int, method: str, e: grpc.RpcError) -> bool:
        """True while the shard has been failing for less than server_timeout_s (logs when it starts)."""
        if self.server_timeout_s <= 0:
            return False
        now = time.monotonic()
        paused = CHECKPOINT_PAUSE in (e.details() or "")  # a routine pause of pushes, seconds long
        with self._down_lock:
            since = self._down.setdefault(shard, now)
            if since is now and paused:
                self._pausing.add(shard)
            outage = not paused and shard in self._pausing  # a shard that failed during a checkpoint's pause
            if outage:
                self._pausing.discard(shard)
        if outage:
            log.warning("shard %d at %s is unavailable (%s) after a checkpoint's pause; waiting for it for up to "
                        "%.0f s more", shard, self.servers[shard], _why(e), self.server_timeout_s - (now - since))  # fmt: skip
        doing = _starting(e)
        if since is now and doing:  # this call marked it
            log.warning("shard %d at %s is starting (%s); waiting for it for up to %.0f s", shard, self.servers[shard],
                        doing, self.server_timeout_s)  # fmt: skip
        elif since is now:
            log.log(logging.INFO if paused else logging.WARNING, "shard %d at %s is unavailable (%s); waiting for it "
                    "for up to %.0f s", shard, self.servers[shard], _why(e), self.server_timeout_s)  # fmt: skip
        return now - since < self.server_timeout_s

    def _outcome_unknown(self, shard: int, request: ps_pb2.PushBatchRequest, e: grpc.RpcError) -> PsError:
        """The error of a PushBatch not answered within RETRY_WINDOW_S of its first attempt."""
        with self._down_lock:  # a later call waits for the shard anew
            self._down.pop(shard, None)
            self._pausing.discard(shard)
        what = f"PushBatch request {request.seq}" if request.seq else "a sync PushBatch"
        return RequestOutcomeUnknownError(
            f"shard {shard} at {self.servers[shard]} did not answer {what} of client id {self.client_id:#x} within "
            f"{RETRY_WINDOW_S / 86400:.3g} days of its first attempt (last: {_why(e)}), so it is not sent again: a "
            f"shard forgets a request {REQUEST_RETENTION_S / 86400:.3g} days after applying it, and an attempt after "
            "that would be applied a second time. Its outcome is unknown: it may or may not have been applied. To be "
            "exact, restore the servers from a checkpoint saved before it (ps-server --restore) and train on from "
            "there; a job that can take one push lost or kept (async SGD, say) can start again on the "
            "servers as they are"
        )

    def _error(self, method: str, shard: int, e: grpc.RpcError, timeout_s: float, request: object = None) -> PsError:
        code, where = e.code(), f"shard {shard} at {self.servers[shard]}"
        if code in MAY_HAVE_RUN and _sent_once(method, request):
            ended = f"did not answer {method} within {timeout_s:g} s" if code == grpc.StatusCode.DEADLINE_EXCEEDED \
                else f"cancelled {method} (is it stopping?)"  # fmt: skip
            return ServerUnavailableError(
                f"{where} {ended}: it may still be running there, or be done; "
                "it was not sent again, since a repeat would apply it once more "
                f"({APPLIED_AGAIN_IF_SENT_AGAIN[method]})"
            )
        if code in RETRYABLE:
            with self._down_lock:  # a later call waits for the shard anew, for its own server timeout
                since = self._down.pop(shard, None)
                self._pausing.discard(shard)
            waited = 0.0 if since is None else time.monotonic() - since
            tried = f"; it has been failing for {waited:.0f} s (server timeout {self.server_timeout_s:.0f} s)"
            if _starting(e):  # a journal replay or a restore can take longer than the timeout: say how to wait
                tried += "; a larger server timeout (--server-timeout) waits for a start that takes longer"
            ended = f" did not answer {method} within {timeout_s:g} s" if code == grpc.StatusCode.DEADLINE_EXCEEDED \
                else f": {method} failed ({_why(e)})"  # fmt: skip
            return ServerUnavailableError(where + ended + (tried if self.server_timeout_s > 0 else ""))
        cls = STATUS_TO_ERROR.get(code.name, PsError)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and DISK_FULL_PREFIX in (e.details() or ""):
            cls = DiskFullError
        elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and CLIENT_TABLE_FULL in (e.details() or ""):
            cls = ClientTableFullError
        return cls(f"{where}: {method} failed with {code.name}: {e.details()}")

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

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _CallThreads:
    """Daemon threads that make a Client's calls past the first of a batch, one more started whenever none is
    idle (several threads of a worker call at once: prefetch, push, dense). Daemons: a call in flight, such as a
    pull waiting at a barrier, never holds up the process's exit."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0
        self._closed = False

    def close(self) -> None:
        """Each thread ends once it is done with the calls already given; submit raises RuntimeError after."""
        with self._lock:
            threads, self._closed = self._threads, True
        for _ in range(threads):
            self._work.put(None)

    def submit(self, fn, *args) -> Future:
        """fn(*args) on one of the threads; its Future."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            if self._idle:
                self._idle -= 1
            else:
                self._threads += 1
                threading.Thread(target=self._run, name="ps-call", daemon=True).start()
        self._work.put((future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args = item
            try:
                result, error = fn(*args), None
            except BaseException as e:  # handed to the caller
                result, error = None, e
            with self._lock:  # idle before the caller hears: its next call finds this thread
                self._idle += 1
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

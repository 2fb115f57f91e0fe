"""Client: pull and push any batch of ids against a sharded cluster.

Every call: dedup the ids once (`np.unique`), sum the gradients of duplicates, route each unique id to the
shard that owns its slot (ps.sharding), send one request per shard (chunked past `max_request_bytes`) with a
deadline of `timeout_s`, all in flight at once, and reassemble the answers in the caller's order. A call is a
blocking unary call: the caller's thread makes one, a small pool of the client's threads the others at once (a
gRPC future would start a polling thread per call whenever none is in flight: ~0.6 ms of a step each time).

Resilience (worker/shard_calls.py, whose docstring says it whole): a call that fails because its shard is down,
restarting, starting or too busy is sent again, with backoff, while the shard has been failing for less than
`server_timeout_s`, then raises ServerUnavailableError naming the shard. Pushes are applied once however often they
are sent (a PushBatch carries this client's id and a per-shard request number); a Shrink or Checkpoint that may have
run on its shard is not sent again.

Training jobs: push_many with an unclocked WorkerStamp (an async or geo job's worker) sends it on every batch, so
that a shard training another job refuses them (ps/engine/followedjob.py); finish() and stop_job() say the worker sends
no more. Modes on the servers' clock: pull_many and push_many with a WorkerStamp (a training job's worker and step) send
every shard a request carrying it, and return the job's min_clock with their rows (ps/engine/jobs.py has the
semantics: a pull waits for the slowest worker within the staleness; a sync push waits for every worker's
push of the step, summed and applied once); finish() says the worker is done. A stamped call sent again carries
the acked the worker has then (the steps whose stamped push_many returned), not that of its first attempt. A
stamped call's deadline is timeout_s + the stamp's wait limit (WorkerStamp.timeout_s; a wait is not a dead server); a
wait that ends without the other workers raises BarrierTimeoutError (ABORTED), never retried. A sync push's first
attempt that a shard answers as applied before (a second run under the job's id) raises JobIdReusedError.

The pieces, each in its own module: worker/dedup.py (unique ids, summed duplicates), worker/routing.py (ids to
shards, requests to batches), worker/fanout.py (a batch of calls at once), worker/retry.py (what is sent again,
the waits for a shard, the errors), worker/shard_calls.py (the calls to the shards, sent again as retry.py says),
worker/request_numbers.py (client id and request numbers), worker/push_waves.py (a push's batches in waves, their
replies checked), worker/channels.py (channels, readiness, the server list's check), ps/stamp.py (WorkerStamp).
This module is the API over them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import grpc
import numpy as np

from protos import ps_pb2
from ps import codec, wire
from ps.config import CLIENT_MESSAGE_BYTES, MAX_STAMP_TEXT, TableConfig, message_bytes_for
from ps.errors import PsError
from ps.sharding import SlotMap
from ps.stamp import WorkerStamp
from worker.channels import check_cluster, wait_connected
from worker.dedup import PushItem, per_item, push_arrays, segment_sum, sum_duplicates
from worker.push_waves import check_wave, push_waves, scatter_rows
from worker.request_numbers import RequestNumbers
from worker.retry import push_left, why_failed
from worker.routing import Router
from worker.shard_calls import ShardCalls
from worker.shrinkreplies import shrink_replies
from worker.tabledims import TableDims, read_rows

__all__ = ["Client", "PushItem", "WorkerStamp", "push_arrays", "segment_sum", "sum_duplicates"]

STOP_TIMEOUT_S = 2.0  # stop_job's deadline per shard: a stopping worker does not wait long
MAX_STOP_REASON = MAX_STAMP_TEXT  # characters of a stop stamp's reason, as the shards take it


class Client(ShardCalls):
    def __init__(
        self,
        servers: list[str],
        timeout_s: float = 60.0,
        server_timeout_s: float = 300.0,
        max_request_bytes: int = CLIENT_MESSAGE_BYTES,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        auth_token: str | None = None,
        shard_gone: Callable[[int], str | None] | None = None,
    ):
        """timeout_s: the deadline of one attempt of a call; server_timeout_s: how long a shard may keep failing
        (down, restarting), from the first failed call to it, before its calls give up (0: no retries). tls_ca:
        verify the servers' TLS certificates against it; tls_cert / tls_key: this client's certificate, for servers
        that require one; auth_token:
        sent with every call (ps/security.py). max_request_bytes: the largest message sent (ids and rows; a call
        is split past it); wait_ready lowers it to fit the room the shards keep for requests (message_bytes_for).
        shard_gone(shard): why a shard can never answer again (a local shard whose process exited), else None: a
        call to a shard gone fails at once, saying why, instead of waiting server_timeout_s."""
        if not servers:  # both checked before any channel opens
            raise ValueError("Client needs at least one server address")
        self.slot_map = SlotMap.contiguous(len(servers))  # and at most NUM_SLOTS
        self._router = Router(self.slot_map, len(servers))
        tls = (tls_ca, tls_cert, tls_key)
        super().__init__(servers, timeout_s, server_timeout_s, max_request_bytes, tls, auth_token, shard_gone)
        self._numbers = RequestNumbers(len(servers))  # PushBatch requests sent to each shard, and the push lock
        self._dims = TableDims(self.describe_table)  # each table's dim as read: its pulls' rows are checked by it

    def _deadline(self, stamp: WorkerStamp | None) -> float:
        """A call's deadline: timeout_s, plus the stamp's wait limit (WorkerStamp.timeout_s) for a call that may
        wait (a stamp not unclocked)."""
        return self.timeout_s + (0.0 if stamp is None or stamp.unclocked else stamp.timeout_s)

    def _where(self, shard: int) -> str:
        return f"shard {shard} at {self.servers[shard]}"

    # ---- cluster --------------------------------------------------------------------------------------
    def wait_ready(self, timeout_s: float | None = None) -> list[ps_pb2.StatsResponse]:
        """Waits up to timeout_s for every shard to answer, and checks that shard i says it is shard i of
        len(servers) and that they all give one cluster name (ps-server --cluster). timeout_s None:
        server_timeout_s, the time a shard that is down is waited for (when that is 0, one call's deadline,
        timeout_s of the constructor). Returns the shards' Stats it read, for a caller that reads them next."""
        if timeout_s is None:
            timeout_s = self.server_timeout_s if self.server_timeout_s > 0 else self.timeout_s
        wait_connected(self._channels, self.servers, self._tls, timeout_s)
        stats = self.stats()
        check_cluster(self.servers, stats)
        self.max_request_bytes = message_bytes_for(self.max_request_bytes, [s.request_room_bytes for s in stats])
        self._room = min((s.request_room_bytes for s in stats if s.request_room_bytes), default=0)
        self._seen = [(s.state_id, s.cluster) for s in stats]
        return stats

    @property
    def state_ids(self) -> tuple[int, ...]:
        """Each shard's model state id as wait_ready read it (StatsResponse state_id; 0: not read), which this
        client's pushes and pulls carry."""
        return tuple(state_id for state_id, _ in self._seen)

    def stats(self) -> list[ps_pb2.StatsResponse]:
        return self._call_all("Stats", [ps_pb2.StatsRequest()] * len(self._stubs))

    def create_table(self, cfg: TableConfig, replace_untrained: bool = False, stamp: WorkerStamp | None = None) -> None:
        """Creates the table on every shard (idempotent for the same spec). replace_untrained: a table of the name
        with another spec that a shard holds untrained (no row, no pending id) is replaced there. With several
        shards, every shard first checks the request (CreateTable's check_only) and any refusal is raised before
        a shard creates anything; what can still fail on one shard after the others created the table is a
        RocksDB write there, or a table created or trained in between by another client (or, with a stamp, a
        shard taken by another job in between). stamp: a training job's worker's (its row source's,
        worker/steprows.py), for its job's tables: each shard holds itself for the job from then on, as after the
        job's first push, and refuses the create while it holds another job (ps.engine.tenancy). Each request
        carries its shard's state id as wait_ready read it (state_ids): a shard replaced since (restored, or on a
        new data dir) refuses it, creating nothing (ModelStateReplacedError), so that no table made on a new data
        dir hides the trained one it lost (worker.tables lost_tables finds a table some shards lack)."""
        cfg.validate()
        spec = codec.table_config_to_proto(cfg)
        proto = None if stamp is None else codec.stamp_to_proto(stamp)

        def requests(check_only: bool) -> list[ps_pb2.CreateTableRequest]:
            return [ps_pb2.CreateTableRequest(spec=spec, replace_untrained=replace_untrained, check_only=check_only,
                                              stamp=proto, state_id=seen) for seen in self.state_ids]  # fmt: skip

        if len(self._stubs) > 1:
            self._call_all("CreateTable", requests(check_only=True))
        self._call_all("CreateTable", requests(check_only=False))
        self._dims.note(cfg.name, cfg.dim)

    def describe_table(self, name: str, shards: list[int] | None = None) -> list[ps_pb2.TableInfo]:
        """Each shard's TableInfo of the table, in shard order (shards: of these shards only; None: of all)."""
        shards = list(range(len(self._stubs))) if shards is None else shards
        infos = self._call_many("DescribeTable", shards, [ps_pb2.DescribeTableRequest(table=name)] * len(shards))
        self._dims.note(name, infos[0].spec.dim)
        return infos

    def dim(self, table: str) -> int:
        """The table's dim as this client read it (create_table, describe_table; read now where it was not): its
        pulls and pushes are of it, and a pull answered with rows of another dim raises TableReplacedError."""
        return self._dims.of(table)

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
            for shard, sel in self._router.route(uniq, dim, self.max_request_bytes):
                request = ps_pb2.PullRequest(table=table, ids=wire.encode_ids(uniq[sel]))
                requests.append((shard, request, len(sel) * (4 * dim + 8), (rows, sel, dim)))
            plans.append((rows, inverse))
        groups = self._router.group(requests, self.max_request_bytes, every_shard=stamp is not None)
        proto, seen = None if stamp is None else codec.stamp_to_proto(stamp), self.state_ids
        calls = [("PullBatch", shard, ps_pb2.PullBatchRequest(pulls=[r[1] for r in g], stamp=proto,
                                                               state_id=seen[shard]))
                 for shard, g in groups]  # fmt: skip
        replies = self._call_mixed(calls, timeout_s=self._deadline(stamp))
        for (_, group), batch in zip(groups, replies):
            for (shard, request, _, (rows, sel, dim)), reply in zip(group, batch.replies, strict=True):
                rows[sel] = read_rows(request.table, dim, reply, len(sel), self._where(shard))
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
        the embeddings as they are, with no optimizer step and the optimizer state untouched (FTRL's z aside, set
        to give the new embedding), e.g. best rows - current rows, to restore a model; duplicate ids' deltas are
        summed, and shows and clicks count as for any push (give shows 0 per id to count none). A batch may mix such
        items with optimizer pushes.

        Sent again while a shard is unavailable (worker/shard_calls.py), and applied once. A batch that fails
        stops the push: the batches after it are not sent, those before it stay applied, and the error raised (the
        first of its wave's) says what each shard applied (worker.retry.push_left).

        stamp: every shard gets a batch carrying it and this returns (what it returns without one, the job's
        min_clock: the smallest any shard answered, which the rows returned are at least as fresh as; 0 where they
        are returned and a shard got more than one batch: it read the rows of its earlier batches before that
        clock). Clocked, not sync: every batch carries it (a shard that holds another job refuses each), marked
        apart on a shard's batches before its last (they move no clock: the worker's clock moves with the last,
        once the shard holds every push of the step); a stamp marked apart (a push sent apart from the steps) is
        sent so on every batch, and counts no step as answered. Sync: each shard gets exactly one batch, whatever
        its size (the worker's contribution to the step), sent without this client's id: the shard applies the
        step's sum under the job's key. Unclocked (an async or geo job's): every batch carries it, and this returns
        what it returns without one."""
        requests, plans = self._push_requests(items, return_rows, add_delta)
        sync = stamp is not None and stamp.sync
        clocked = stamp is not None and not stamp.unclocked
        groups = self._router.group(
            requests, self.max_request_bytes, every_shard=advance_clock > 0 or clocked, whole=sync
        )
        with self._numbers.lock:
            waves = push_waves(groups, advance_clock, stamp, self.client_id, list(self.state_ids), self._numbers)
            min_clock = self._send_waves(waves, Counter(shard for shard, _ in groups), stamp, return_rows)
        out = [rows if order is None else rows[order] for rows, order in plans] if return_rows else None
        if not clocked:
            return out
        if not stamp.apart:
            worker = stamp.job, stamp.worker
            self._acked[worker] = max(self._acked.get(worker, 0), stamp.step + 1)  # every shard answered
        if return_rows and len(waves) > 1:  # rows of a shard's batch before its last were read before the
            min_clock = 0  # clock its reply gave: they are known fresh at none
        return out, min_clock or 0

    def _push_requests(self, items: Sequence[PushItem | tuple], return_rows: bool,
                       add_delta: bool | Sequence[bool]) -> tuple[list, list]:  # fmt: skip
        """(push_many's requests as (shard, PushRequest, bytes, (rows, positions, dim)), per item (its rows array
        where return_rows, else None; the order that gives its ids' rows))."""
        requests, plans = [], []
        for item, delta in zip(items, per_item(add_delta, len(items)), strict=True):
            table, ids, grads, clicks, shows = PushItem(*item)
            dim = self.dim(table)
            uniq, item_grads, item_shows, item_clicks, order = push_arrays(table, ids, grads, clicks, shows, dim)
            rows = np.empty((len(uniq), dim), dtype=np.float32) if return_rows else None
            routed = self._routed_pushes(table, dim, uniq, item_grads, item_shows, item_clicks, return_rows, delta)
            for shard, sel, request in routed:
                size = len(request.ids) + len(request.grads) + len(request.shows) + len(request.clicks)
                requests.append((shard, request, size, (rows, sel, dim)))
            plans.append((rows, order))
        return requests, plans

    def _send_waves(self, waves: list[list], batches: Counter, stamp: WorkerStamp | None,
                    return_rows: bool) -> int | None:  # fmt: skip
        """push_many's waves sent one after the other (batches: each shard's count, one per wave), each reply
        checked and its rows scattered where return_rows; the smallest min_clock the stamped ones answered. A
        wave with a failed call raises (push_left) and the waves after it are not sent."""
        min_clock = None
        for w, wave in enumerate(waves):
            retried: set[int] = set()
            replies = self._outcomes([call for call, _ in wave], retried, timeout_s=self._deadline(stamp))
            failed = {shard: o for ((_, shard, _), _), o in zip(wave, replies) if isinstance(o, PsError)}
            if failed:  # the waves after it are not sent
                raise push_left(next(iter(failed.values())), batches, w, failed)
            min_clock = check_wave(wave, replies, retried, stamp, self.client_id, self._where, min_clock)
            if return_rows:
                scatter_rows(wave, replies)
        return min_clock

    def _routed_pushes(self, table: str, dim: int, uniq: np.ndarray, grads: np.ndarray, shows: np.ndarray | None,
                       clicks: np.ndarray | None, return_rows: bool,
                       add_delta: bool) -> Iterator[tuple[int, np.ndarray, Any]]:  # fmt: skip
        """(shard, positions in uniq, PushRequest) per request of one item's arrays (push_arrays'), as the router
        splits them; shows or clicks None (every id shown once, or clicked never) are left out of the requests."""
        per_id = 8 + 4 * ((shows is not None) + (clicks is not None))  # the id, and the counts sent
        for shard, sel in self._router.route(uniq, dim, self.max_request_bytes, per_id=per_id):
            request = ps_pb2.PushRequest(
                table=table,
                ids=wire.encode_ids(uniq[sel]),
                grads=wire.encode_rows(grads[sel]),
                dim=dim,
                shows=b"" if shows is None else wire.encode_rows(shows[sel]),
                clicks=b"" if clicks is None else wire.encode_rows(clicks[sel]),
                return_rows=return_rows,
                add_delta=add_delta,
            )
            yield shard, sel, request

    def push_once(
        self, table: str, ids: np.ndarray, deltas: np.ndarray, key: int, stamp: WorkerStamp | None = None
    ) -> int:
        """Adds deltas (len(ids), dim) to the rows of ids, as push_many's add_delta does, at most once per key on
        each shard, whichever clients send it, under whatever certificates: each shard gets one PushBatch under
        client_id `key` (nonzero), marked shared, request number 1, which a shard that applied it before answers
        applying nothing (its exactly-once rule). stamp: a training job's worker's (sent not sync, and apart where
        clocked; not done or stopped): each shard checks it as the job's pushes (a shard holding another job refuses
        it) and holds itself for the job, moving no clock (ps.engine.followedjob). Returns the ids applied by this call
        (0: applied before, by any caller; or by this call's own attempt that a retry followed)."""
        dim = self.dim(table)
        uniq, grads, shows, clicks, _ = push_arrays(table, ids, deltas, None, None, dim)
        routed = self._routed_pushes(table, dim, uniq, grads, shows, clicks, False, True)
        groups = self._router.group(
            [(shard, push, 0, None) for shard, _, push in routed], self.max_request_bytes, whole=True
        )  # a shard's chunks in one request: request number 1 is applied once
        proto = None if stamp is None else codec.stamp_to_proto(replace(stamp, sync=False, apart=not stamp.unclocked))
        calls = [("PushBatch", shard, ps_pb2.PushBatchRequest(pushes=[r[1] for r in g], client_id=key, seq=1,
                                                              shared=True, state_id=self.state_ids[shard],
                                                              stamp=proto))
                 for shard, g in groups]  # fmt: skip
        return sum(int(reply.num_applied) for reply in self._call_mixed(calls))

    def finish(self, stamp: WorkerStamp) -> int:
        """Tells every shard that the stamp's worker is done (no wait of the job counts it any more); returns the
        job's min_clock. Idempotent. A shard stores it (ps.engine.followedjob's done_store), so a shard that restarts
        still counts the worker done.
        The stamp's acked should count every step of the worker (a shard raises the worker's clock to it)."""
        done = ps_pb2.PushBatchRequest(stamp=codec.stamp_to_proto(replace(stamp, done=True, sync=False)))
        replies = self._call_mixed(
            [("PushBatch", s, done) for s in range(len(self._stubs))], timeout_s=self._deadline(stamp)
        )
        return min(r.min_clock for r in replies)

    def stop_job(self, stamp: WorkerStamp, reason: str, timeout_s: float = STOP_TIMEOUT_S, by: str = "") -> list[str]:
        """Tells every shard that the stamp's worker stopped before its end, and why (reason, cut to
        MAX_STOP_REASON characters; by: the class of the shard's refusal it stopped on, worker.stopping.stopped_by,
        where one did): each stops the job if it follows it, so that the other workers' waits end
        now, naming this worker, instead of at their barrier timeout, and another job may start. One attempt per
        shard, each within timeout_s, never retried: the worker is on its way out. Returns a line per shard that
        did not take it (empty: every shard did)."""
        why = reason if len(reason) <= MAX_STOP_REASON else reason[: MAX_STOP_REASON - 3] + "..."
        stop = ps_pb2.PushBatchRequest(
            stamp=codec.stamp_to_proto(replace(stamp, stopped=why or "stopped", stopped_by=by, done=False, sync=False))
        )
        outcomes = self._send([("PushBatch", s, stop) for s in range(len(self._stubs))], timeout_s)
        return [f"shard {s} at {self.servers[s]} ({why_failed(o)})"
                for s, o in enumerate(outcomes) if isinstance(o, grpc.RpcError)]  # fmt: skip

    def advance_clock(self, steps: int = 1) -> int:
        """Advances every shard's clock by steps, once however often it is sent again: a PushBatch of no pushes
        under this client's request numbers (push_many's advance_clock alone); returns the new step (of shard 0).
        Unstamped: in no job's name (a training worker's advance is its push_many's, with its job's stamp)."""
        with self._numbers.lock:
            calls = [("PushBatch", s, ps_pb2.PushBatchRequest(advance_clock=steps, client_id=self.client_id,
                                                              seq=self._numbers.next(s), state_id=self.state_ids[s]))
                     for s in range(len(self._stubs))]  # fmt: skip
            return int(self._call_mixed(calls)[0].step)

    def shrink(self, table: str = "") -> list[ps_pb2.ShrinkResponse]:
        """Runs the eviction rules of one table (or all) on every shard; where one fails, the error names the shards
        that shrank (worker.shrinkreplies). Each Shrink carries its shard's state id as wait_ready read it: a shard
        replaced since (restored from a checkpoint, or on a new data dir) shrinks nothing (ModelStateReplacedError),
        where it would decay and drop the rows of a model state other than the one this client read."""
        calls = [
            ("Shrink", s, ps_pb2.ShrinkRequest(table=table, state_id=seen)) for s, seen in enumerate(self.state_ids)
        ]
        return shrink_replies(self._outcomes(calls))

    def checkpoint(self, requests: dict[int, ps_pb2.CheckpointRequest]) -> list[ps_pb2.CheckpointResponse]:
        """Sends each shard its Checkpoint phase (hold, save or release: worker/checkpoint.py runs them) at once;
        the replies in shard order. A hold or save whose deadline passed is not sent again (worker/shard_calls.py).
        Raises the first failure, its shard_outcomes the class of each shard's reply or error, in shard order
        (whether every shard refused alike: worker.checkpoint_left)."""
        outcomes = self._outcomes([("Checkpoint", s, requests[s]) for s in sorted(requests)])
        failed = [o for o in outcomes if isinstance(o, PsError)]
        if failed:
            failed[0].shard_outcomes = [type(o) for o in outcomes]
            raise failed[0]
        return outcomes

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

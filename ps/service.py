"""The gRPC servicer: decodes and validates requests, calls the Shard, maps every exception to a status (through
ps.service_calls.rpc_handler).

No client ever sees UNKNOWN: a request whose bytes do not decode is INVALID_ARGUMENT (ps.codec reads every
request), ps.errors exceptions map to their status, anything else is INTERNAL, logged. A full disk (ENOSPC,
EDQUOT) is RESOURCE_EXHAUSTED: the journal, the store and the checkpoint save raise ps.diskfull.DiskFullError,
naming the path and what of the request stands; any other error of a full disk (ps.diskfull.disk_full_reason) is
mapped to RESOURCE_EXHAUSTED here too. Refusals are logged through ps.refusals: a client's mistake at INFO (a full
table of clients at WARNING), damage and a full disk at ERROR, each kind (method, error class and status) at most
once a minute, the count of the others in a line at the minute's end.

Replies are bounded before they are built: Pull, PullBatch (all its pulls together) and PushBatch with
return_rows compute the size of the rows they would return from ids x dim, and a reply that would not fit in the
server's message limit (ServerConfig.max_message_bytes, the limit gRPC sends with) is RESOURCE_EXHAUSTED, naming
the size and the limit, before any row is gathered or any push applied. RESOURCE_EXHAUSTED, not
INVALID_ARGUMENT: the request is well formed and would succeed against a server with a larger limit, and it is
the code gRPC itself gives a message over the limit, so clients handle one code for both. Those replies take room
in the servicer's ReplyRoom (ps.replies, --reply-bytes) once their request passed its checks, right before their
rows are read (a PushBatch's after its push), until their call ends: a reply waits while replies built and not yet
sent fill it, and one larger than all of it is refused the same way, before anything is read or applied. A handler
hands its reply's hold the call's cancel as it returns the reply (HeldReply.handed): a reply unread
--reply-read-timeout-s later has its call ended (ps.unreadreplies).

A PullBatch carries at most MAX_BATCH_ITEMS pulls and a PushBatch at most MAX_BATCH_ITEMS pushes; more is
INVALID_ARGUMENT, checked before any pull or push of the request is looked at.

Status messages are clipped to ps.errors.MAX_DETAILS_BYTES: gRPC sends them in a trailer, which has a size limit.

Checkpoints are written only inside the operator's checkpoint root (ServerConfig.checkpoint_root, ps-server
--checkpoint-root); a save on a server without one is FAILED_PRECONDITION (see checkpoint_dir).

Stamped PullBatch and PushBatch requests (a training job's workers; those of sync and ssp jobs wait) go to the
shard's JobClocks (ps.engine.jobs) after they are validated, on this RPC thread: ServerConfig.threads should be
at least 2 x the job's workers + 2 (a wait that would hold the last free thread is RESOURCE_EXHAUSTED). Their
replies carry the job's min_clock; a wait that ends without its workers is ABORTED (BarrierTimeoutError), naming
them. A stamped CreateTable (a job's worker creating its job's tables) is checked there too, and holds the
shard for its job as a first push does.

While the shard starts (ps.server listens before its data dir is open), StartGate stands in for the servicer: every
method is UNAVAILABLE (ps.errors.ShardStartingError) saying what the start is doing, and clients retry it as an
outage; once the shard is built, the gate hands every call to the servicer.

Exactly once per client: PushBatch's client_id is deduplicated under the caller's identity where the server knows
one (see client_key), and its reply's num_applied counts the ids applied by this request, 0 for a request applied
before (a retry).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import Message

from protos import ps_pb2, ps_pb2_grpc
from ps import codec, wire
from ps.config import DEFAULT_HOLD_S, DEFAULT_REPLY_BYTES, MAX_MESSAGE_BYTES
from ps.engine.push import TablePush, ids_applied
from ps.engine.shard import Shard
from ps.engine.syncsum import SYNC_KEY_BIT
from ps.errors import (
    NOTHING_APPLIED,
    CheckpointOutsideRootError,
    InvalidArgumentError,
    NoCheckpointRootError,
    ReplyTooLargeError,
    ShardStartingError,
    echo,
)
from ps.refusals import RefusalLog
from ps.replacedstate import CHECKPOINT_REFUSED, CREATE_REFUSED, READ_REFUSED, SHRINK_REFUSED, table_replaced
from ps.replies import REPLY_FRAME_BYTES, ReplyRoom
from ps.service_calls import CallerGone, RunningCalls, refuse, rpc_handler
from ps.stamp import WorkerStamp

if TYPE_CHECKING:
    from ps.engine.table import Table
    from ps.metrics import ServerMetrics

log = logging.getLogger("ps.service")
MAX_BATCH_ITEMS = 4096  # pulls in a PullBatch, pushes in a PushBatch


def _check_count(method: str, what: str, n: int) -> None:
    if n > MAX_BATCH_ITEMS:
        raise InvalidArgumentError(
            f"{method} carries {n:,} {what}, over the {MAX_BATCH_ITEMS:,} one request may carry; send several "
            f"requests; {NOTHING_APPLIED}"
        )


def checkpoint_dir(root: str | None, requested: str) -> str:
    """The directory a Checkpoint save of `requested` writes to: requested relative to root, or an absolute path
    inside it, resolved (symlinks followed) to an absolute path strictly inside root's own resolved path.
    NoCheckpointRootError when the server has no root; InvalidArgumentError for an empty path, one with a '..'
    part or a character that does not print (a NUL, a line break, a terminal escape: the path reaches the server's
    log and every tool that prints it as it is), or one that resolves to root itself or outside it
    (CheckpointOutsideRootError, a subclass)."""
    if not root:
        raise NoCheckpointRootError(
            "this server takes no checkpoints: start ps-server with --checkpoint-root DIR (PS_CHECKPOINT_ROOT) to let "
            "it write checkpoints inside DIR"
        )
    if not requested or not requested.isprintable() or ".." in requested.split("/"):
        raise InvalidArgumentError(
            f"checkpoint dir {echo(requested)} is not a usable path: give a new directory relative to the server's "
            "checkpoint root, or absolute inside it, with no '..' part and only characters that print (no control "
            "characters, no line breaks)"
        )
    base = os.path.realpath(root)
    try:
        path = os.path.realpath(os.path.join(base, requested))  # an absolute `requested` replaces base
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"checkpoint dir {echo(requested)} cannot be resolved: {e}") from None
    if path == base or os.path.commonpath([base, path]) != base:
        raise CheckpointOutsideRootError(
            f"checkpoint dir {echo(requested)} resolves to {echo(path)}, not inside this server's checkpoint root "
            f"{base}: give a new directory inside the root, as an absolute path or relative to the root in the "
            "request (`ps-worker checkpoint save DIR` sends DIR made absolute from its own working directory)"
        )
    return path


def client_key(client_id: int, context: grpc.ServicerContext, shared: bool = False) -> int:
    """The key under which a PushBatch's client_id is deduplicated: client_id itself below 2^63; a 63-bit hash of
    it at or above (the keys with SYNC_KEY_BIT set are the jobs' sync sums', not a client's to use, and masking
    the bit would give id and id + 2^63 one key: one's requests dropped as the other's retries); or, when the
    caller presented a client certificate (mutual TLS), a 63-bit hash of the certificate's identities and
    client_id, so that a caller cannot touch the requests of a caller with another certificate. shared (the
    request's `shared`): a key any caller may send, whatever its certificate (Client.push_once: a push applied
    once, whoever sends it), a 63-bit hash of client_id apart from all others. 0 (no deduplication) stays 0; no
    key is 0."""
    identities = context.peer_identities() if client_id and not shared else None
    if shared and client_id:
        who = b"shared\0" + client_id.to_bytes(8, "little")
    elif identities:
        who = b"\0".join(sorted(identities)) + b"\0" + client_id.to_bytes(8, "little")
    elif client_id & SYNC_KEY_BIT:
        who = b"top bit\0" + client_id.to_bytes(8, "little")
    else:
        return client_id
    return (int.from_bytes(hashlib.blake2b(who, digest_size=8).digest(), "little") & ~SYNC_KEY_BIT) or 1


def stamp_of(request: Any) -> WorkerStamp | None:
    """The WorkerStamp of a PullBatch, PushBatch or CreateTable request (a codec View, or a generated message), None
    without one."""
    if isinstance(request, Message):
        m = request.stamp if request.HasField("stamp") else None
    else:
        m = request.stamp
    if m is None:
        return None
    return WorkerStamp.from_message(m)


# methods whose servicer returns the response's bytes (multi-MB payloads, fewer copies)
PRESERIALIZED = {"Pull", "PullBatch", "PushBatch"}


def handler(servicer: ParameterServerServicer) -> grpc.GenericRpcHandler:
    """The servicer's methods, as the generated add_ParameterServerServicer_to_server registers them, except that
    ps.codec reads every request (the bulk ones as views of the request's bytes, not copies; bytes that do not
    decode as a codec.Undecodable), and the methods in PRESERIALIZED send the bytes their servicer returns as they
    are."""
    service = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]
    handlers = {}
    for method in service.methods:
        response_cls = getattr(ps_pb2, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=codec.request_reader(method.name),
            response_serializer=bytes if method.name in PRESERIALIZED else response_cls.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


class StartGate(grpc.GenericRpcHandler):
    """The ParameterServer service of a server whose shard is starting: until open(), every method is answered
    UNAVAILABLE (ShardStartingError) with starting()'s text, before its request is read, so that clients wait and
    retry as for an outage; from open() on, every call goes to the servicer's handler. Registered before the
    server starts (gRPC takes no handlers after): the token check (ps.security) still comes first."""

    def __init__(self, starting: Callable[[], str]):
        service = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]
        self._methods = {f"/{service.full_name}/{m.name}" for m in service.methods}
        self._starting = starting
        self._refusal = grpc.unary_unary_rpc_method_handler(self._refuse)  # no deserializer: the bytes, unread
        self._open: grpc.GenericRpcHandler | None = None

    def open(self, servicer: ParameterServerServicer) -> None:
        self._open = handler(servicer)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        served = self._open
        if served is not None:
            return served.service(handler_call_details)
        return self._refusal if handler_call_details.method in self._methods else None

    def _refuse(self, request: bytes, context: grpc.ServicerContext) -> None:
        refuse(context, ShardStartingError(self._starting()))


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    def __init__(self, shard: Shard, metrics: ServerMetrics | None = None, max_reply_bytes: int = MAX_MESSAGE_BYTES,
                 reply_bytes: int = DEFAULT_REPLY_BYTES, reply_read_timeout_s: float = 0.0):  # fmt: skip
        self.shard = shard
        self.calls = RunningCalls()  # Server.stop waits for them before it closes the shard
        self.metrics = metrics  # ps.metrics.ServerMetrics, or None
        self.max_reply_bytes = max_reply_bytes  # the server's grpc.max_send_message_length
        self.replies = ReplyRoom(reply_bytes, reply_read_timeout_s)  # the replies of rows built, not sent (ps.replies)
        self.refusals = RefusalLog(log)  # a kind of refusal is logged once a minute at most, then its count

    def _check_reply(self, method: str, shapes: list[tuple[int, int]], runs_alone: bool = False) -> int:
        """The size of a reply carrying rows of these (ids, dim), at most; ReplyTooLargeError when it would exceed
        max_reply_bytes, or the whole reply room (unless it runs alone: a sync step's rows to return). Called
        before anything is gathered or applied."""
        rows_bytes = sum(4 * n * dim for n, dim in shapes)
        size = rows_bytes + REPLY_FRAME_BYTES * (len(shapes) + 1)
        if size <= self.max_reply_bytes:
            self.replies.refuse_larger(method, size, runs_alone)
            return size
        if len(shapes) == 1:
            n, dim = shapes[0]
            what = f"{n:,} ids x dim {dim} x 4 bytes"
        else:
            what = f"{len(shapes)} arrays of rows, {sum(n for n, _ in shapes):,} ids in all"
        raise ReplyTooLargeError(
            f"{method} reply would be {size:,} bytes ({rows_bytes:,} bytes of rows: {what}), over this server's "
            f"message limit of {self.max_reply_bytes:,} bytes; send fewer ids per request"
        )

    def _info(self, table) -> ps_pb2.TableInfo:
        return ps_pb2.TableInfo(
            spec=codec.table_config_to_proto(table.cfg), num_rows=table.num_rows, row_floats=table.width
        )

    @rpc_handler
    def CreateTable(self, request: Any, context: grpc.ServicerContext) -> Message:
        self.shard.check_state_id(request.state_id, CREATE_REFUSED)  # before the spec is read
        cfg, stamp = codec.table_config_from_proto(request.spec), stamp_of(request)
        if request.check_only:
            cfg, num_rows, width = self.shard.check_create(cfg, request.replace_untrained, stamp)
            return ps_pb2.TableInfo(spec=codec.table_config_to_proto(cfg), num_rows=num_rows, row_floats=width)
        return self._info(self.shard.create_table(cfg, request.replace_untrained, stamp))

    @rpc_handler
    def DescribeTable(self, request: Any, context: grpc.ServicerContext) -> Message:
        return self._info(self.shard.table(request.table))

    @rpc_handler
    def Pull(self, request: Any, context: grpc.ServicerContext) -> bytes:
        """Returns the PullResponse already serialized (see handler)."""
        ids = wire.decode_ids(request.ids)
        table = self.shard.table(request.table)  # the one the reply is sized for and read from (a replaced one refuses)
        size = self._check_reply("Pull", [(len(ids), table.dim)])
        cost = self.shard.pulls.check_pull(table, ids)  # refused before it waits for reply room
        held = self.replies.hold(size, context.add_callback, CallerGone(context))
        replies = []

        def reply_rows(n: int, dim: int) -> Any:  # rows of the reply, made once the pull holds its request room
            reply, rows = codec.pull_response_to_fill(n, dim)
            replies.append(reply)
            return rows

        self.shard.pulls.pull(table, ids, reply_rows, CallerGone(context), cost)  # straight into the reply
        held.handed("Pull", context.cancel, context.peer)
        return replies[0]

    def _decode_push(self, request) -> tuple[TablePush, Table]:
        """A PushRequest as a push of the shard's, with its lengths and dim checked, and the Table they were checked
        against: the one the push goes to, and its rows sent back are read from (one replaced since refuses both)."""
        table = self.shard.table(request.table)
        if request.dim != table.dim:
            if request.dim in table.replaced_dims:  # the dim of a table this one replaced: its client read that one's
                said = table_replaced(request.table, request.dim, table.dim)
                raise InvalidArgumentError(f"push says dim {request.dim}: {said}")
            raise InvalidArgumentError(f"push says dim {request.dim}, but table {request.table!r} has dim {table.dim}")
        ids = wire.decode_ids(request.ids)
        grads = wire.decode_rows(request.grads, len(ids), table.dim, field="grads")
        shows = wire.decode_rows(request.shows, len(ids), 1, "shows")[:, 0] if request.shows else None
        clicks = wire.decode_rows(request.clicks, len(ids), 1, "clicks")[:, 0] if request.clicks else None
        push = TablePush(name=request.table, ids=ids, grads=grads, shows=shows, clicks=clicks,
                         add_delta=request.add_delta)  # fmt: skip
        return push, table

    @rpc_handler
    def Push(self, request: Any, context: grpc.ServicerContext) -> Message:
        push, table = self._decode_push(request)
        self.shard.push(**push._asdict(), caller_gone=CallerGone(context), table=table)
        return ps_pb2.PushResponse(num_applied=len(push.ids))

    @rpc_handler
    def PullBatch(self, request: Any, context: grpc.ServicerContext) -> bytes:
        """Returns the PullBatchResponse already serialized (see handler)."""
        _check_count("PullBatch", "pulls", len(request.pulls))
        self.shard.check_state_id(request.state_id, READ_REFUSED)
        stamp = stamp_of(request)
        if stamp is not None:
            self.shard.jobs.check(stamp, pull=True)
        ids = [wire.decode_ids(p.ids) for p in request.pulls]
        pulls = [(self.shard.table(p.table), i) for p, i in zip(request.pulls, ids)]  # each looked up once, as Pull's
        size = self._check_reply("PullBatch", [(len(ids), table.dim) for table, ids in pulls])
        cost = self.shard.pulls.check_pull_batch(pulls)  # every pull checked before any runs, or the ssp wait
        min_clock = 0 if stamp is None else self.shard.jobs.wait_for_pull(stamp, CallerGone(context))
        # after the ssp wait: no wait for the job's other workers is made holding reply room
        held = self.replies.hold(size, context.add_callback, CallerGone(context))
        reply = self.shard.pulls.pull_batch(pulls, cost, lambda rows: codec.encode_pull_batch_response(rows, min_clock),
                                            CallerGone(context))  # fmt: skip
        held.handed("PullBatch", context.cancel, context.peer)
        return reply

    @rpc_handler
    def PushBatch(self, request: Any, context: grpc.ServicerContext) -> bytes:
        """Returns the PushBatchResponse already serialized (see handler). Each push's table is looked up once
        (_decode_push): the push goes to that Table and the rows it asks back (return_rows) are read from it. A
        table replaced (CreateTable replace_untrained) before the pushes are checked (Shard.check_push) refuses the
        request with nothing applied (ShardClosingError, UNAVAILABLE: sent again, it goes to the new table); one
        replaced between that check and its push's apply refuses that push, and the refusal says which pushes before
        it stay applied (PushPath.push_batch). A push that asks rows back is applied
        before its reply waits for reply room (ReplyRoom.hold), so a caller that leaves during that wait gets an
        error (CallerGoneError) for a push that was applied: sent again with its client_id and seq it is
        deduplicated, while one sent without a client_id (0) is applied twice."""
        _check_count("PushBatch", "pushes", len(request.pushes))
        self.shard.check_state_id(request.state_id)
        decoded = [self._decode_push(p) for p in request.pushes]
        pushes, tables = [push for push, _ in decoded], [table for _, table in decoded]
        back = [(table, push.ids) for push, table, p in zip(pushes, tables, request.pushes) if p.return_rows]
        client, stamp, min_clock = client_key(request.client_id, context, request.shared), stamp_of(request), 0
        sync = stamp is not None and stamp.sync  # one PushBatch per shard and step: runs alone past the room
        if back:  # before the push: a rejected request changes nothing
            size = self._check_reply("PushBatch", [(len(ids), table.dim) for table, ids in back], runs_alone=sync)
            cost = self.shard.pulls.check_pull_batch(back, "a PushBatch's rows to return", larger_runs_alone=sync)
        if stamp is not None:  # its waits for the job's other workers are no part of serving it
            step, num_applied, min_clock = self.shard.push_stamped(
                pushes, request.advance_clock, client, request.seq, stamp, CallerGone(context), request.shared, tables
            )
        else:
            with self.shard.store.foreground.serving():
                step, applied = self.shard.push_batch(pushes, request.advance_clock, client, request.seq,
                                                      CallerGone(context), request.shared, tables)  # fmt: skip
            num_applied = ids_applied(pushes, applied)
        if not back:
            return codec.encode_push_batch_response(num_applied, step, [], min_clock)
        # reply room right before the rows are read: a push refused (a checkpoint's hold, its values) never waits
        # for it, nor does a stamped push hold it while it waits for the job's other workers
        held = self.replies.hold(size, context.add_callback, CallerGone(context))
        with self.shard.store.foreground.serving():
            reply = self.shard.pulls.pull_batch(
                back, cost, lambda rows: codec.encode_push_batch_response(num_applied, step, rows, min_clock),
                CallerGone(context),
            )  # fmt: skip
        held.handed("PushBatch", context.cancel, context.peer)
        return reply

    @rpc_handler
    def Checkpoint(self, request: Any, context: grpc.ServicerContext) -> Message:
        if request.phase in codec.STATE_ID_PHASES:  # a release is never refused for it: it ends a hold or nothing
            self.shard.check_state_id(request.state_id, CHECKPOINT_REFUSED[request.phase])
        if request.phase == "hold":
            clock, token = self.shard.hold(request.hold_timeout_s or DEFAULT_HOLD_S, CallerGone(context))
            return ps_pb2.CheckpointResponse(clock=clock, token=token)
        if request.phase == "save":
            directory = checkpoint_dir(self.shard.config.checkpoint_root, request.dir)
            info = self.shard.save_checkpoint(directory, request.token, CallerGone(context))
            return ps_pb2.CheckpointResponse(clock=info["clock"], shard_json=json.dumps(info))
        if request.phase == "release":
            self.shard.release(request.token)
            return ps_pb2.CheckpointResponse(clock=self.shard.clock)
        raise InvalidArgumentError(f"checkpoint phase {echo(request.phase)} is unknown; expected hold, save or release")

    @rpc_handler
    def AdvanceClock(self, request: Any, context: grpc.ServicerContext) -> Message:
        return ps_pb2.ClockResponse(step=self.shard.advance_clock(request.steps))

    @rpc_handler
    def Shrink(self, request: Any, context: grpc.ServicerContext) -> Message:
        self.shard.check_state_id(request.state_id, SHRINK_REFUSED)
        return ps_pb2.ShrinkResponse(**self.shard.shrink(request.table), lists_tables_without_rule=True)

    @rpc_handler
    def Stats(self, request: Any, context: grpc.ServicerContext) -> Message:
        s = {**self.shard.stats(), **self.replies.stats()}
        tables = [ps_pb2.TableStats(**t) for t in s.pop("tables")]
        return ps_pb2.StatsResponse(tables=tables, **s)

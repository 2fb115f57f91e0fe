"""The gRPC health service of a shard: grpc_health's servicer, with status changes that never send under its lock.

grpc_health's HealthServicer sends while it holds its lock: the new status to every open Watch stream, and a new
Watch stream's first response. A send can wait for gRPC's event thread; that thread runs the close callback of a
cancelled Watch, which takes the same lock. Watch streams cancelled while a server stops or while others open (no
token is needed for health calls) so left the server hanging after SIGTERM, serving nothing. Here the lock only
guards the state: the watchers to notify are copied under it and sent to after it is released.

A shard listens while it starts (ps.server): its services are NOT_SERVING until the start is done (and, under
--memory-bytes, its warm-up: ps.engine.warmup), and a Check answered NOT_SERVING then carries what the start is
doing in its trailing metadata, under STARTING_KEY (UTF-8: "shard 0 is starting: replaying its journal, 43% (12 s
so far)"). The standard protocol has no field for a reason; probes that do not look for the key see a plain
NOT_SERVING. check_health reads it. A shard that found its
data dir or journal segment deleted under it (ps.engine.writeguard) is NOT_SERVING for good, and says which under
LOST_KEY, naming no path (health answers callers without the token).

At most MAX_WATCHES Watch streams are open at once; one more is refused RESOURCE_EXHAUSTED. A stream holds no
thread, so gRPC's bound on concurrent calls (--threads + --max-queued-calls) does not count it, but it holds
memory (~50 KiB, both ends' share), and health calls need no token: without the bound, anyone who reaches the port
could grow the server without end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ps.errors import OVERLOADED
from ps.tlsprobe import tls_hint

log = logging.getLogger("ps.health")  # check_health's warnings (the probe's own TLS files)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


HEALTH_SERVICE = "grpc.health.v1.Health"
SERVICE_NAME = "sparseps.ParameterServer"  # the service a shard's health reports, beside "" (the whole server)
STARTING_KEY = "sparseps-starting-bin"  # trailing metadata of a NOT_SERVING Check: what the start is doing
LOST_KEY = "sparseps-lost-bin"  # trailing metadata of a NOT_SERVING Check: what was deleted under the shard
MAX_WATCHES = 64  # Watch streams open at once (a few per monitor that watches); past them RESOURCE_EXHAUSTED


def add_to_server(servicer: HealthServicer, server: grpc.Server) -> None:
    """Registers the health service as health_pb2_grpc.add_HealthServicer_to_server does, except that a request
    that does not decode is answered INVALID_ARGUMENT (the generated deserializer raises: INTERNAL)."""
    methods = {  # name: (handler kind, request class, response class)
        "Check": (grpc.unary_unary_rpc_method_handler, health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse),
        "List": (grpc.unary_unary_rpc_method_handler, health_pb2.HealthListRequest, health_pb2.HealthListResponse),
        "Watch": (grpc.unary_stream_rpc_method_handler, health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse),
    }
    handlers = {
        name: kind(
            _decoded(getattr(servicer, name)),
            request_deserializer=_tolerant(request.FromString),
            response_serializer=response.SerializeToString,
        )  # fmt: skip
        for name, (kind, request, response) in methods.items()
        if hasattr(servicer, name)
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(HEALTH_SERVICE, handlers),))


class _Undecodable:
    def __init__(self, error: Exception):
        self.error = error


def _tolerant(parse: Callable) -> Callable:
    def deserialize(data: bytes) -> object:
        try:
            return parse(data)
        except Exception as e:  # DecodeError, or what a malformed message raises inside protobuf
            return _Undecodable(e)

    return deserialize


def _decoded(method: Callable) -> Callable:
    """method, answering a request that did not decode with INVALID_ARGUMENT (grpc's attributes kept)."""

    def behavior(request: object, context: grpc.ServicerContext, *args: object, **kwargs: object) -> object:
        if isinstance(request, _Undecodable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a health request that does not decode: {request.error}")
        return method(request, context, *args, **kwargs)

    for attr in ("experimental_non_blocking", "experimental_thread_pool"):  # how grpc calls Watch
        if hasattr(method, attr):
            setattr(behavior, attr, getattr(method, attr))
    return behavior


class HealthServicer(health.HealthServicer):
    """Check and Watch as grpc_health serves them (Watch streams hold no thread); set and enter_graceful_shutdown
    notify the watchers outside the lock. Relies on grpc_health's state attributes (_lock, _server_status,
    _send_response_callbacks, _gracefully_shutting_down); tests/test_health.py checks both the protocol and the
    shutdown race. starting: what the shard's start is doing, or None once it is done (see the module's
    docstring); grpc_health's "" starts SERVING, so a server that starts its shard after listening sets NOT_SERVING
    first. lost: what was deleted under the shard (its refusal of writes), or None. At most MAX_WATCHES Watch
    streams are open at once."""

    def __init__(self, starting: Callable[[], str | None] | None = None, lost: Callable[[], str | None] | None = None):
        super().__init__()
        self._starting = starting
        self._lost = lost
        self._watches = 0  # Watch streams open (under self._lock), counted from their admission to their close

    def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext) -> object:
        """grpc_health's Check; a NOT_SERVING answer of a starting shard says why (STARTING_KEY), and so does one of
        a shard whose files were deleted under it (LOST_KEY)."""
        reply = super().Check(request, context)
        if reply.status != NOT_SERVING:
            return reply
        why = self._starting() if self._starting is not None else None
        if why:
            context.set_trailing_metadata(((STARTING_KEY, why.encode()),))
            return reply
        why = self._lost() if self._lost is not None else None
        if why:
            context.set_trailing_metadata(((LOST_KEY, why.encode()),))
        return reply

    def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext,
              send_response_callback: Callable | None = None) -> object:  # fmt: skip
        """Sends the service's status, then every change, with no send under the lock: the watcher is registered
        after its first response, and a change in between is sent too (once more, at worst). RESOURCE_EXHAUSTED
        while MAX_WATCHES streams are open."""
        if send_response_callback is None:  # a server without non-blocking streaming: grpc_health's own way
            return super().Watch(request, context)  # (it holds a thread: gRPC's bound on calls counts it)
        service = request.service
        with self._lock:
            full = self._watches >= MAX_WATCHES
            self._watches += not full
            status = self._server_status.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        if full:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{MAX_WATCHES} health Watch streams are open on "
                          "this server, the most it keeps open at once: close one, or poll with Check")  # fmt: skip
        self._send([send_response_callback], status)
        with self._lock:
            self._send_response_callbacks.setdefault(service, set()).add(send_response_callback)
            now = self._server_status.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        forget = self._on_close_callback(send_response_callback, service)

        def closed() -> None:
            try:
                forget()
            finally:  # the slot comes back whatever grpc_health's callback does (gRPC only logs its errors)
                with self._lock:
                    self._watches -= 1

        if not context.add_callback(closed):  # the stream ended before the callback was added: it will never run
            with self._lock:
                self._send_response_callbacks[service].discard(send_response_callback)
                self._watches -= 1
            return None
        if now != status:
            self._send([send_response_callback], now)
        return None

    def set(self, service: str, status: int) -> None:
        """Sets a service's status and sends it to the service's watchers; ignored after enter_graceful_shutdown."""
        with self._lock:
            if self._gracefully_shutting_down:
                return
            self._server_status[service] = status
            watchers = list(self._send_response_callbacks.get(service, ()))
        self._send(watchers, status)

    @property
    def shutting_down(self) -> bool:
        """enter_graceful_shutdown was called: NOT_SERVING for good."""
        return self._gracefully_shutting_down

    def enter_graceful_shutdown(self) -> None:
        """Sets every service NOT_SERVING for good (later set calls are ignored) and tells their watchers."""
        with self._lock:
            if self._gracefully_shutting_down:
                return
            self._gracefully_shutting_down = True
            watchers = []
            for service in self._server_status:
                self._server_status[service] = NOT_SERVING
                watchers += self._send_response_callbacks.get(service, ())
        self._send(watchers, NOT_SERVING)

    @staticmethod
    def _send(watchers: list, status: int) -> None:
        response = health_pb2.HealthCheckResponse(status=status)
        for send in watchers:
            try:
                send(response)
            except Exception:  # a stream closing meanwhile: its close callback removes it; the others still hear
                pass


class Health(NamedTuple):
    """check_health's answer: serving (SERVING), starting (NOT_SERVING from a shard whose start is not done), and
    the text to print: the status (with what the start is doing, if starting) or the error."""

    serving: bool
    starting: bool
    text: str


def check_health(address: str, timeout_s: float = 3.0, tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, tls_server_name: str | None = None) -> Health:  # fmt: skip
    """What the gRPC health service of the shard at address says of SERVICE_NAME (Health: a server that does not
    know that service is no shard), over TLS (tls_ca) or mutual TLS (tls_cert, tls_key) as given, with no token:
    a shard asks none for health checks (ps.security.TokenCheck), and a token sent would cross a plain channel
    readable; tls_server_name: the name to expect in the server's certificate when it
    does not name the address dialed (a probe of 127.0.0.1, say). An UNAVAILABLE whose cause is a TLS setting that
    differs from the shard's (gRPC says only "Socket closed") says which flag is missing or too many (tls_hint).
    A Check an overloaded shard refuses (its threads busy, its queue of calls full: ps.errors.OVERLOADED) is asked
    again within timeout_s: such a shard is alive. A TLS file of the probe's not yet valid is warned of once, on the
    logger "ps.health", as a server warns of its own."""
    from ps.security import client_channels

    options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
    (channel,), warnings = client_channels([address], options, tls_ca, tls_cert, tls_key)
    for warning in warnings:  # a certificate of the probe's not yet valid: logged as a server logs its own
        log.warning("%s", warning)
    try:
        with channel:
            reply, call = _check(health_pb2_grpc.HealthStub(channel), timeout_s)
    except grpc.RpcError as e:
        text = f"{e.code().name}: {e.details()}"
        if _overloaded(e):
            return Health(False, False, f"{text}: the shard's threads stayed busy and its queue of calls full for "
                          f"{timeout_s:g} s (ps-server --threads, --max-queued-calls)")  # fmt: skip
        if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):  # another gRPC server's port
            return Health(False, False, f"{text}: its health service knows no {SERVICE_NAME}: it is not a sparseps "
                          "shard (another service's port?)")  # fmt: skip
        if "Connection refused" in (e.details() or ""):  # gRPC's text names every address it tried
            return Health(False, False, f"{e.code().name}: connection refused: nothing listens there (a shard "
                          "listens within seconds of its start, before it opens its data dir: is it running?)")  # fmt: skip
        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            text = f"{e.code().name}: no answer within {timeout_s:g} s"
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            text += tls_hint(address, tls_ca, tls_cert, tls_key, tls_server_name, min(timeout_s, 2.0))
        return Health(False, False, text)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    why = [v for k, v in (call.trailing_metadata() or ()) if k == STARTING_KEY]
    if reply.status == NOT_SERVING and why:
        return Health(False, True, f"{status}: {why[0].decode('utf-8', 'replace')}")
    lost = [v for k, v in (call.trailing_metadata() or ()) if k == LOST_KEY]
    if reply.status == NOT_SERVING and lost:
        return Health(False, False, f"{status}: {lost[0].decode('utf-8', 'replace')}")
    return Health(reply.status == SERVING, False, status)


def _overloaded(e: grpc.RpcError) -> bool:
    return e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and OVERLOADED in (e.details() or "")


def _check(stub: health_pb2_grpc.HealthStub, timeout_s: float) -> tuple:
    """(reply, call) of a Check of SERVICE_NAME, asked again after a pause while the shard refuses it as
    overloaded, up to timeout_s in all; the last refusal (grpc.RpcError) past it."""
    deadline, pause = time.monotonic() + timeout_s, 0.05
    while True:
        try:
            return stub.Check.with_call(health_pb2.HealthCheckRequest(service=SERVICE_NAME),
                                        timeout=max(deadline - time.monotonic(), 0.001))  # fmt: skip
        except grpc.RpcError as e:
            if not _overloaded(e) or time.monotonic() + pause >= deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.5)

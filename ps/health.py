"""The gRPC health service of a shard: grpc_health's servicer, with status changes that never send under its lock.

grpc_health's HealthServicer sends while it holds its lock: the new status to every open Watch stream, and a new
Watch stream's first response. A send can wait for gRPC's event thread; that thread runs the close callback of a
cancelled Watch, which takes the same lock. Watch streams cancelled while a server stops or while others open (no
token is needed for health calls) so left the server hanging after SIGTERM, serving nothing. Here the lock only
guards the state: the watchers to notify are copied under it and sent to after it is released.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServicer(health.HealthServicer):
    """Check and Watch as grpc_health serves them (Watch streams hold no thread); set and enter_graceful_shutdown
    notify the watchers outside the lock. Relies on grpc_health's state attributes (_lock, _server_status,
    _send_response_callbacks, _gracefully_shutting_down); tests/test_health.py checks both the protocol and the
    shutdown race."""

    def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext,
              send_response_callback: Callable | None = None) -> object:  # fmt: skip
        """Sends the service's status, then every change, with no send under the lock: the watcher is registered
        after its first response, and a change in between is sent too (once more, at worst)."""
        if send_response_callback is None:  # a server without non-blocking streaming: grpc_health's own way
            return super().Watch(request, context)
        service = request.service
        with self._lock:
            status = self._server_status.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        self._send([send_response_callback], status)
        with self._lock:
            self._send_response_callbacks.setdefault(service, set()).add(send_response_callback)
            now = self._server_status.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        if not context.add_callback(self._on_close_callback(send_response_callback, service)):
            with self._lock:  # the stream ended before the callback was added: it will never run
                self._send_response_callbacks[service].discard(send_response_callback)
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

"""The HTTP server under both metrics endpoints, a shard's (ps.metrics) and a training worker's (worker.telemetry):
a thread per connection, at most MAX_CONNECTIONS at once, any more closed unread.

Without the bound, a peer that opens connections and sends nothing (each may idle for Handler.timeout) makes the
server start a thread for each, without end. prometheus-client's own start_http_server has no such bound.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger("ps.metrics")

MAX_CONNECTIONS = 16  # a metrics port's connections served at once (Prometheus scrapes over one or a few)


def serve_wsgi(app: Callable, host: str, port: int, thread_name: str,
               tls: ssl.SSLContext | None = None) -> WSGIServer:  # fmt: skip
    """Serves app on host:port (0: a free port; an IPv6 address bare or in brackets) in a daemon thread, over TLS
    with the server-side context tls if given; returns the server (its port: server_address[1]; stop() ends it).
    OSError if the port cannot be had."""
    host = host.strip("[]")  # an IPv6 address as --host may give it ([::1]): the socket wants it bare
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type("MetricsServer", (BoundedServer,), {"address_family": family})
    http = make_server(host, port, app, server_class, Handler)
    try:
        if tls is not None:  # the handshake runs in the request's thread (Handler.setup): a slow client holds it alone
            http.socket = tls.wrap_socket(http.socket, server_side=True, do_handshake_on_connect=False)
    except BaseException:
        http.server_close()
        raise
    threading.Thread(target=http.serve_forever, name=thread_name, daemon=True).start()
    return http


def stop(http: WSGIServer) -> None:
    """Ends serve_wsgi's server: its thread, then its socket."""
    http.shutdown()
    http.server_close()


class BoundedServer(ThreadingWSGIServer):
    """A thread per connection, at most MAX_CONNECTIONS at once: a connection past them is closed unread, so that
    a peer opening connections (each may idle for Handler.timeout) cannot make the server start threads without
    bound."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: socket.socket, client_address: Any) -> None:
        """A failed TLS handshake or a client that went away: one debug line, not a traceback on stderr."""
        log.debug("metrics request from %s failed", client_address, exc_info=True)


class Handler(WSGIRequestHandler):
    timeout = 10.0  # seconds a client may take to send its request (and to finish a TLS handshake)

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
        pass

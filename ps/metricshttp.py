"""The HTTP server under both metrics endpoints, a shard's (ps.metrics) and a training worker's (worker.telemetry):
a thread per connection, at most MAX_CONNECTIONS at once, any more closed unread, each connection closed once it has
lasted Handler.timeout seconds in all.

Without the bound, a peer that opens connections and sends nothing makes the server start a thread for each, without
end. Without the deadline, a peer that sends its request a byte at a time, or reads the reply so, holds a connection
as long as it likes (a socket timeout bounds each read and write, not their sum): MAX_CONNECTIONS such peers would
keep Prometheus's scrapes out. prometheus-client's own start_http_server has neither bound.
"""

from __future__ import annotations

import io
import logging
import socket
import ssl
import threading
import time
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
    a peer opening connections (each held for up to Handler.timeout) cannot make the server start threads without
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
    """One connection's request and reply, all within `timeout` seconds of its start: the TLS handshake, the request's
    read and the reply's write each get what is left of it, and a connection still at any of them when it has
    passed is closed (TimeoutError, BoundedServer.handle_error's debug line)."""

    timeout = 10.0  # seconds a connection may last in all: its TLS handshake, its request and the reply

    def setup(self) -> None:
        self.connection = self.request
        stream = DeadlineStream(self.connection, time.monotonic() + self.timeout)
        self.rfile = io.BufferedReader(stream)
        self.wfile = DeadlineWriter(stream)
        if isinstance(self.connection, ssl.SSLSocket):
            stream.time_left()
            self.connection.do_handshake()

    def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
        pass


class DeadlineStream(io.RawIOBase):
    """A connection read and written with each call's socket timeout set to what is left until deadline
    (time.monotonic()): TimeoutError once it has passed. A TLS socket's handshake, read and write each keep to
    the timeout they start with as a whole, as a plain socket's recv and send do."""

    def __init__(self, connection: socket.socket, deadline: float) -> None:
        super().__init__()
        self._connection = connection
        self._deadline = deadline

    def time_left(self) -> None:
        """Sets the connection's timeout to the time left; TimeoutError if none is."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the metrics connection's deadline (Handler.timeout) passed")
        self._connection.settimeout(left)

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.time_left()
        return self._connection.recv_into(buffer)

    def write(self, data: Any) -> int:
        self.time_left()
        return self._connection.send(data)


class DeadlineWriter(io.BufferedIOBase):
    """Writes all of each write to a DeadlineStream, as socketserver's own writer does with sendall."""

    def __init__(self, stream: DeadlineStream) -> None:
        super().__init__()
        self._stream = stream

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        with memoryview(data) as view:
            sent = 0
            while sent < len(view):
                sent += self._stream.write(view[sent:])
            return sent

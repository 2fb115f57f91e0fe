"""The HTTP server under both metrics endpoints, a shard's (ps.metrics) and a training worker's (worker.telemetry),
and the app both serve (exposition_app): a thread per connection, at most MAX_CONNECTIONS at once, any more closed
unread; a connection is closed once its TLS handshake and request have taken Handler.timeout seconds in all, or its
reply Handler.reply_s seconds from its first byte (the time the app takes to collect the reply counts in neither).

Without the bound, a peer that opens connections and sends nothing makes the server start a thread for each, without
end. Without the deadlines, a peer that sends its request a byte at a time, or reads the reply so, holds a connection
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
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder

from ps.errors import echo

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


def exposition_app(registry: CollectorRegistry) -> Callable:
    """prometheus-client's WSGI app of registry, behind a check of the request's Accept header: one naming a format
    version that is not dotted numbers ("application/openmetrics-text; version=1.0.x", "text/plain;version=x"), on
    which the app's choice of encoder fails (it compares "x" with 0: a 500, and an ERROR line with a traceback in
    the log), is answered 400 naming the header."""
    app = make_wsgi_app(registry)

    def checked(environ: dict, start_response: Callable) -> Any:
        accept = environ.get("HTTP_ACCEPT", "")
        try:
            choose_encoder(accept)
        except (TypeError, ValueError):
            start_response("400 Bad Request", [("Content-Type", "text/plain")])
            return [f"the Accept header {echo(accept)} names a format version that is not dotted numbers (such as "
                    "version=1.0.0)\n".encode()]  # fmt: skip
        return app(environ, start_response)

    return checked


def stop(http: WSGIServer) -> None:
    """Ends serve_wsgi's server: its thread, then its socket."""
    http.shutdown()
    http.server_close()


class BoundedServer(ThreadingWSGIServer):
    """A thread per connection, at most MAX_CONNECTIONS at once: a connection past them is closed unread, so that
    a peer opening connections cannot make the server start threads without bound. Each is held until its reply
    ends or a deadline cuts it: Handler.timeout for its handshake and request, Handler.reply_s for its reply, and
    the time the app takes to collect the reply between them."""

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
    """One connection's request and reply. The TLS handshake and the request's reads keep to one deadline, `timeout`
    seconds from the connection's start (a client sending its request slowly is cut there); the reply's writes to
    another, reply_s seconds from its first byte, so that the time the app takes to collect the reply counts in
    neither (a client reading the reply slower is cut: a metrics reply is small, read in far less). A connection past
    either is closed (TimeoutError): one debug line, BoundedServer.handle_error's or QuietReply's, not a traceback on
    stderr. An HTTP/0.9 request (no version, no headers) is answered 400 as it arrives (refused_http09)."""

    timeout = 10.0  # seconds for a connection's TLS handshake and its request, in all
    reply_s = 30.0  # seconds for a reply's writes, in all, from its first byte

    def setup(self) -> None:
        self.connection = self.request
        stream = DeadlineStream(self.connection, time.monotonic() + self.timeout, self.reply_s)
        self.rfile = io.BufferedReader(stream)
        self.wfile = DeadlineWriter(stream)
        if isinstance(self.connection, ssl.SSLSocket):
            stream.read_time_left()
            self.connection.do_handshake()

    def handle(self) -> None:
        """wsgiref's WSGIRequestHandler.handle with QuietReply for its ServerHandler."""
        # CPython 3.11's wsgiref.simple_server.WSGIRequestHandler.handle, copied with QuietReply in place of its
        # ServerHandler: wsgiref has no hook for the reply's class, and its ServerHandler prints each error's
        # traceback on stderr (a reply cut at its deadline among them).
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            return
        if self.refused_http09():
            return
        if not self.parse_request():  # an error reply was sent
            return
        reply = QuietReply(self.rfile, self.wfile, self.get_stderr(), self.get_environ(), multithread=False)
        reply.request_handler = self  # as wsgiref's: its close() logs the request through it
        reply.run(self.server.get_app())

    def refused_http09(self) -> bool:
        """Whether the request line is an HTTP/0.9 GET (a method and a path, no version: `GET /metrics`), which has
        been answered 400, the connection to be closed. http.server's parse_request would read header lines after
        it, which HTTP/0.9 has none of, until the request's deadline; a 400 with a status line (HTTP/1.0's) says
        at once what to send instead."""
        words = self.raw_requestline.decode("iso-8859-1").split()
        if len(words) != 2 or words[0] != "GET":  # anything else: parse_request's to judge, at once
            return False
        self.command, self.path = words
        self.requestline, self.request_version = " ".join(words), "HTTP/1.0"  # 0.9's replies have no status line
        self.close_connection = True
        self.send_error(400, explain=f"the request line {echo(self.requestline)} has no HTTP version (HTTP/0.9, not "
                        "served): send 'GET PATH HTTP/1.1' and its headers")  # fmt: skip
        return True

    def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
        pass


class QuietReply(ServerHandler):
    """wsgiref's reply to one request, its errors logged instead of printed on stderr: a connection's (a reply cut
    at its deadline, a client gone) at debug, the app's own at error, with its traceback."""

    def log_exception(self, exc_info: Any) -> None:
        peer = self.request_handler.client_address
        if isinstance(exc_info[1], OSError):
            log.debug("metrics reply to %s cut", peer, exc_info=exc_info)
        else:
            log.error("metrics reply to %s failed", peer, exc_info=exc_info)


class DeadlineStream(io.RawIOBase):
    """A connection whose reads keep to one deadline (time.monotonic()), and whose writes to another, reply_s seconds
    from the first write: each call's socket timeout is set to what is left, TimeoutError once nothing is. A TLS
    socket's handshake, read and write each keep to the timeout they start with as a whole, as a plain socket's recv
    and send do."""

    def __init__(self, connection: socket.socket, read_deadline: float, reply_s: float) -> None:
        super().__init__()
        self._connection = connection
        self._read_deadline = read_deadline
        self._reply_s = reply_s
        self._reply_deadline: float | None = None  # set by the first write

    def read_time_left(self) -> None:
        """Sets the connection's timeout to the time left for reads; TimeoutError if none is."""
        self._set_timeout(self._read_deadline, "the metrics request's deadline (Handler.timeout)")

    def _set_timeout(self, deadline: float, what: str) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what} passed")
        self._connection.settimeout(left)

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.read_time_left()
        return self._connection.recv_into(buffer)

    def write(self, data: Any) -> int:
        """Sends some of data within the reply's deadline, reply_s seconds from the first write."""
        if self._reply_deadline is None:
            self._reply_deadline = time.monotonic() + self._reply_s
        self._set_timeout(self._reply_deadline, "the metrics reply's deadline (Handler.reply_s)")
        return self._connection.send(data)


class DeadlineWriter(io.BufferedIOBase):
    """Writes all of each write to a DeadlineStream, as socketserver's own writer does with sendall, one send at a
    time, so that each keeps to the reply's deadline (SSLSocket.sendall's timeout is per send, not for the whole)."""

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

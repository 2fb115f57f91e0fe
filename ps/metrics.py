"""Prometheus metrics of a shard, served at /metrics on --metrics-port (prometheus-client), guarded as the gRPC port.

The endpoint listens on the server's --host and follows its security settings, so that whoever may not call the
shard may not read its metrics either: with --tls-cert/--tls-key it serves HTTPS with the same certificate, with
--tls-ca as well it requires a client certificate that CA signed, and with --auth-token-file it answers 401 to a
request without `Authorization: Bearer <token>`. Only GET /metrics answers; every other path is 404.
Prometheus scrapes that with `scheme: https`, `tls_config: {ca_file, cert_file, key_file}` and
`authorization: {credentials_file}` (docs/security.md).

Per RPC method (`method` label), observed by the servicer:
    sparseps_requests_total{method, code}          calls, by gRPC status code name
    sparseps_request_seconds{method}                latency histogram
    sparseps_request_bytes_total{method, direction} request ("in") and reply ("out") bytes
Per table (`table` label), read from the shard at each scrape:
    sparseps_table_rows, sparseps_table_pending_ids, sparseps_table_rows_in_ram, sparseps_table_rows_on_disk,
    sparseps_table_dirty_rows, sparseps_table_ram_bytes, sparseps_table_disk_bytes      (gauges)
    sparseps_table_evictions_total, sparseps_table_ids_pulled_total, sparseps_table_ids_pushed_total (counters)
Per shard: sparseps_clock, sparseps_ram_budget_bytes, sparseps_ram_used_bytes, sparseps_journal_bytes, and the memory
plan's parts: sparseps_memory_budget_bytes, sparseps_block_cache_used_bytes, sparseps_memtable_bytes,
sparseps_table_reader_bytes, sparseps_write_behind_bytes.
"""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import threading
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer

if TYPE_CHECKING:
    from ps.engine.shard import Shard

log = logging.getLogger("ps.metrics")

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TABLE_GAUGES = ("rows_in_ram", "rows_on_disk", "dirty_rows", "ram_bytes", "disk_bytes", "pending_ids")
TABLE_COUNTERS = ("evictions", "ids_pulled", "ids_pushed")


class ServerMetrics:
    def __init__(self, shard: Shard):
        self.registry = CollectorRegistry()
        self.requests = Counter("sparseps_requests", "RPCs served", ["method", "code"], registry=self.registry)
        self.seconds = Histogram("sparseps_request_seconds", "RPC latency", ["method"], buckets=BUCKETS,
                                 registry=self.registry)  # fmt: skip
        self.bytes = Counter("sparseps_request_bytes", "RPC payload bytes", ["method", "direction"],
                             registry=self.registry)  # fmt: skip
        self.registry.register(_ShardCollector(shard))

    def observe(self, method: str, code: str, seconds: float, bytes_in: int, bytes_out: int) -> None:
        self.requests.labels(method, code).inc()
        self.seconds.labels(method).observe(seconds)
        self.bytes.labels(method, "in").inc(bytes_in)
        self.bytes.labels(method, "out").inc(bytes_out)

    def serve(
        self, port: int, host: str, tls: tuple[str, str, str | None] | None = None, token: str | None = None
    ) -> int:
        """Serves /metrics on host:port (0: a free port) in a thread; returns the port. tls: (cert, key, ca or
        None) PEM files: HTTPS, and with ca, clients must present a certificate it signed. token: requests must
        carry `Authorization: Bearer <token>`."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server_class = type("MetricsServer", (_MetricsServer,), {"address_family": family})
        self._http = make_server(host, port, _guarded(make_wsgi_app(self.registry), token), server_class, _Handler)
        if tls is not None:
            self._http.socket = _tls_context(*tls).wrap_socket(
                self._http.socket, server_side=True, do_handshake_on_connect=False
            )  # the handshake runs in the request's thread (_Handler.setup): a slow client holds only that one
        threading.Thread(target=self._http.serve_forever, name="ps-metrics", daemon=True).start()
        return self._http.server_address[1]

    def close(self) -> None:
        http = getattr(self, "_http", None)
        if http is not None:
            http.shutdown()
            http.server_close()


def _tls_context(cert: str, key: str, ca: str | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if ca:
        context.load_verify_locations(ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _guarded(app, token: str | None):
    """The metrics WSGI app behind a bearer-token check (if token) and a path check (only /metrics)."""
    expected = f"Bearer {token}".encode() if token else None

    def guarded(environ, start_response):
        given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if expected is not None and not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
            return [b"missing or wrong token (Authorization: Bearer ...)\n"]
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: metrics are at /metrics\n"]
        return app(environ, start_response)

    return guarded


class _MetricsServer(ThreadingWSGIServer):
    def handle_error(self, request, client_address) -> None:
        """A failed TLS handshake or a client that went away: one debug line, not a traceback on stderr."""
        log.debug("metrics request from %s failed", client_address, exc_info=True)


class _Handler(WSGIRequestHandler):
    timeout = 10.0  # seconds a client may take to send its request (and to finish a TLS handshake)

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def log_message(self, format: str, *args) -> None:  # no access log on stderr
        pass


class _ShardCollector:
    def __init__(self, shard):
        self.shard = shard

    def collect(self):
        s = self.shard.stats()
        gauges = {k: GaugeMetricFamily(f"sparseps_table_{k}", f"table {k}", labels=["table"]) for k in TABLE_GAUGES}
        gauges["num_rows"] = GaugeMetricFamily("sparseps_table_rows", "ids with a trained row", labels=["table"])
        counters = {
            k: CounterMetricFamily(f"sparseps_table_{k}", f"table {k}", labels=["table"]) for k in TABLE_COUNTERS
        }
        for t in s["tables"]:
            for k, family in gauges.items():
                family.add_metric([t["name"]], t.get(k, 0))
            for k, family in counters.items():
                family.add_metric([t["name"]], t.get(k, 0))
        yield from gauges.values()
        yield from counters.values()
        for name, key, text in (("sparseps_clock", "clock", "the shard's clock (steps)"),
                                ("sparseps_ram_budget_bytes", "ram_budget_bytes", "--cache-bytes"),
                                ("sparseps_ram_used_bytes", "ram_used_bytes", "RAM tier bytes in use"),
                                ("sparseps_journal_bytes", "journal_bytes", "journal bytes on disk"),
                                ("sparseps_memory_budget_bytes", "memory_budget_bytes", "--memory-bytes; 0: none"),
                                ("sparseps_block_cache_used_bytes", "block_cache_used_bytes", "RocksDB block cache"),
                                ("sparseps_memtable_bytes", "memtable_bytes", "RocksDB memtables"),
                                ("sparseps_table_reader_bytes", "table_reader_bytes", "RocksDB table readers"),
                                ("sparseps_write_behind_bytes", "write_behind_bytes", "rows waiting to be written")):  # fmt: skip
            family = GaugeMetricFamily(name, text)
            family.add_metric([], s.get(key, 0))
            yield family

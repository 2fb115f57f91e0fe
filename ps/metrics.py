"""Prometheus metrics of a shard, served at /metrics on --metrics-port (prometheus-client), guarded as the gRPC port.

The endpoint listens on the server's --host and follows its security settings, so that whoever may not call the
shard may not read its metrics either: with --tls-cert/--tls-key it serves HTTPS with the same certificate, with
--tls-ca as well it requires a client certificate that CA signed, and with --auth-token-file it answers 401 to a
request without `Authorization: Bearer <token>`. Only GET /metrics answers; every other path is 404. It serves
ps.metricshttp.MAX_CONNECTIONS connections at once, a thread each, and closes any more unread.
Prometheus scrapes that with `scheme: https`, `tls_config: {ca_file, cert_file, key_file}` and
`authorization: {credentials_file}` (docs/security.md).

The port serves from before the shard opens its data dir (ps.server), while it starts:
    sparseps_starting                               1 while the shard starts (calls UNAVAILABLE) and warms up (phase
                                                    "warming": calls served), health NOT_SERVING; 0 once that is done
    sparseps_start_phase{phase}                     1 for the phase the start is in (ps.engine.startup.PHASES:
                                                    "warming", the warm-up under --memory-bytes, ps.engine.warmup)
    sparseps_start_progress                         the fraction of that phase done (replaying: of the journal's
                                                    bytes); absent for a phase that has no measure
    sparseps_start_seconds                          seconds the start has taken so far, or took
Per RPC method (`method` label), observed by the servicer:
    sparseps_requests_total{method, code}          calls, by gRPC status code name; with --auth-token-file, the
                                                    calls refused for their token too, before the servicer sees
                                                    them: UNAUTHENTICATED (none, or a wrong one), PERMISSION_DENIED
                                                    (the read-only token's call that would change something),
                                                    method "other" for a path that names no method of the service
    sparseps_request_seconds{method}                latency histogram
    sparseps_request_bytes_total{method, direction} request ("in") and reply ("out") bytes
Per table (`table` label), read from the shard at each scrape: sparseps_table_rows and sparseps_table_<k> for
each k of TABLE_GAUGES (gauges) and TABLE_COUNTERS (counters, `_total`). Per shard: SHARD_GAUGES (the clock, the
memory plan's parts, the data dir's bytes and its disk's free and total bytes, whether that disk is low and the
free bytes under which it is (ps.storage.diskspace), failed flushes in a row, the servicer's reply room and the
replies waiting for it, ps.replies) and SHARD_COUNTERS (`_total`: the requests that waited for request room, the
replies that waited for reply room, the calls cancelled at the limit, their reply unread in time): these, per
table and per shard, once the shard serves; sparseps_data_dir_lost, 1 once the shard found its journal segment or
its data dir deleted under it (ps.storage.journal.Journal.check_intact),
and sparseps_shard_broken, 1 once a push failed part way through being applied (ps.engine.writeguard,
ShardNeedsRestartError): then the per-table and per-shard figures are not served (Stats refuses them), the rest
are. The process: prometheus-client's process_* (resident memory, CPU seconds, start time, open files).
Counters count from the server's start: a restart sets them to 0 (process_start_time_seconds tells when;
Prometheus' rate() and increase() take such a reset as one).
"""

from __future__ import annotations

import hmac
import ssl
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ps.engine.startup import PHASES, StartProgress
from ps.errors import DataDirLostError, ShardNeedsRestartError
from ps.metricshttp import exposition_app, serve_wsgi, stop

if TYPE_CHECKING:
    from ps.engine.shard import Shard
    from ps.replies import ReplyRoom

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TABLE_GAUGES = {  # key of a table's stats -> help
    "rows_in_ram": "rows in the RAM tier",
    "rows_on_disk": "rows in RocksDB",
    "dirty_rows": "RAM rows newer than RocksDB (their pushes are in the journal)",
    "ram_bytes": "RAM tier bytes charged to the table",
    "disk_bytes": "bytes of the table's rows in RocksDB, from its row counts (the data dir holds more: "
    "sparseps_data_dir_bytes)",
    "pending_ids": "ids pushed but not admitted yet (statistics only)",
}
TABLE_COUNTERS = {
    "evictions": "rows dropped from the RAM tier to make room",
    "cache_misses": "ids looked up in RocksDB: misses of the RAM tier, ids never seen before included",
    "admitted": "ids admitted (given a trained row)",
    "dropped": "ids dropped by Shrink",
    "pulls": "lookups: pulls, and pushes that return rows",
    "pushes": "pushes applied",
    "ids_pulled": "ids looked up: of pulls, and the rows push replies return",
    "ids_pushed": "ids pushed",
}
SHARD_GAUGES = (  # (metric, key of the shard's stats, help)
    ("sparseps_clock", "clock", "the shard's clock (steps)"),
    ("sparseps_uptime_seconds", "uptime_s", "seconds since the shard started"),
    ("sparseps_ram_budget_bytes", "ram_budget_bytes", "the RAM tier's budget (--cache-bytes)"),
    ("sparseps_ram_used_bytes", "ram_used_bytes", "RAM tier bytes in use"),
    ("sparseps_journal_bytes", "journal_bytes", "journal bytes on disk: pushes not yet flushed to RocksDB"),
    ("sparseps_flushing", "flushing", "1 while a flush writes dirty rows to RocksDB (the flusher's, a checkpoint's)"),
    ("sparseps_memory_budget_bytes", "memory_budget_bytes", "--memory-bytes; 0: no overall bound"),
    ("sparseps_block_cache_budget_bytes", "block_cache_budget_bytes", "RocksDB's block cache capacity"),
    ("sparseps_block_cache_used_bytes", "block_cache_used_bytes", "RocksDB's block cache in use"),
    ("sparseps_memtable_bytes", "memtable_bytes", "RocksDB's memtables"),
    ("sparseps_table_reader_bytes", "table_reader_bytes", "RocksDB's table readers (index and filter blocks)"),
    ("sparseps_write_behind_bytes", "write_behind_bytes", "evicted rows waiting for their RocksDB write"),
    ("sparseps_journal_map_bytes", "journal_map_bytes", "the journal segment mapped for appends (its size; 0: none)"),
    (
        "sparseps_request_room_bytes",
        "request_room_bytes",
        "room --memory-bytes keeps for requests' copies of rows, taken by each pull and push (0: unbounded)",
    ),
    (
        "sparseps_request_room_used_bytes",
        "request_room_used_bytes",
        "request room held now by the pulls and pushes running",
    ),
    (
        "sparseps_reply_room_bytes",
        "reply_room_bytes",
        "room --reply-bytes keeps for the replies of rows built and not yet sent, each counted twice (0: unbounded)",
    ),
    (
        "sparseps_reply_room_used_bytes",
        "reply_room_used_bytes",
        "reply room held now by the replies built and not yet sent (their callers have not read them all)",
    ),
    ("sparseps_reply_room_waiting", "reply_room_waiting", "replies waiting now for reply room"),
    (
        "sparseps_sync_steps_bytes",
        "sync_steps_bytes",
        "room --memory-bytes keeps for sync steps' contributions and the copies their sums make (0: unbounded)",
    ),
    (
        "sparseps_sync_steps_held_bytes",
        "sync_steps_held_bytes",
        "bytes of the sync steps' contributions held now, until every worker of their step has pushed",
    ),
    (
        "sparseps_data_dir_bytes",
        "data_dir_bytes",
        "bytes of the data dir's files: RocksDB (write-ahead logs included) and the journal",
    ),
    ("sparseps_disk_free_bytes", "disk_free_bytes", "bytes free (to this user) on the data dir's file system"),
    ("sparseps_disk_total_bytes", "disk_total_bytes", "the size of the data dir's file system"),
    (
        "sparseps_disk_low",
        "disk_low",
        "1 from when the data dir's disk has less free space than sparseps_disk_low_bytes until it has 10% more "
        "than that (at the flusher's last look, every 30 s; the server logs a warning): 0 otherwise",
    ),
    (
        "sparseps_disk_low_bytes",
        "disk_low_bytes",
        "free bytes under which the disk is low: the largest of 5% of the disk, 2 GiB (a quarter of a disk under 8 "
        "GiB) and a tenth of the data dir",
    ),
    ("sparseps_flush_failures", "flush_failures", "background flushes failed in a row (0: the last one succeeded)"),
    (
        "sparseps_clients",
        "clients",
        "clients whose newest request the shard keeps, to apply a retry of it once (ps.storage.applied)",
    ),
)
SHARD_COUNTERS = (  # (metric, key of the shard's stats, help): counts since the start, exposed as metric_total
    (
        "sparseps_request_room_waits",
        "request_room_waits",
        "pulls and pushes that waited for room (their copies would not fit beside others')",
    ),
    (
        "sparseps_reply_room_waits",
        "reply_room_waits",
        "replies that waited for reply room (they would not fit beside the replies not yet sent)",
    ),
    (
        "sparseps_reply_room_expired",
        "reply_room_expired",
        "calls cancelled at the limit: their caller had not read their reply of rows within "
        "--reply-read-timeout-s of its being built; a call whose read completed at that very moment may be counted",
    ),
)


class ServerMetrics:
    """A shard's metrics: the start's from the first scrape (progress), the shard's once attach() gives it."""

    def __init__(self, progress: StartProgress):
        self.registry = CollectorRegistry()
        self.requests = Counter("sparseps_requests", "RPCs served", ["method", "code"], registry=self.registry)
        self.seconds = Histogram("sparseps_request_seconds", "RPC latency", ["method"], buckets=BUCKETS,
                                 registry=self.registry)  # fmt: skip
        self.bytes = Counter("sparseps_request_bytes", "RPC payload bytes", ["method", "direction"],
                             registry=self.registry)  # fmt: skip
        self.registry.register(_StartCollector(progress))
        self._shard = _ShardCollector()
        self.registry.register(self._shard)
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_start_time_seconds, ...

    def attach(self, shard: Shard, replies: ReplyRoom | None = None) -> None:
        """The shard's metrics, and its servicer's reply room's, are served from now on (its start is done)."""
        self._shard.replies = replies
        self._shard.shard = shard

    def observe(self, method: str, code: str, seconds: float, bytes_in: int, bytes_out: int) -> None:
        self.requests.labels(method, code).inc()
        self.seconds.labels(method).observe(seconds)
        self.bytes.labels(method, "in").inc(bytes_in)
        self.bytes.labels(method, "out").inc(bytes_out)

    def refused_unread(self, method: str, code: str) -> None:
        """A call the token check refused before the servicer saw it (ps.security.TokenCheck): counted in
        sparseps_requests_total only (its request was not read, and it took no time worth a latency)."""
        self.requests.labels(method, code).inc()

    def serve(
        self,
        port: int,
        host: str,
        tls: tuple[str, str, str | None] | None = None,
        token: str | None = None,
        read_token: str | None = None,
    ) -> int:
        """Serves /metrics on host:port (0: a free port) in a thread (ps.metricshttp); returns the port. tls: (cert,
        key, ca or None) PEM files: HTTPS, and with ca, clients must present a certificate it signed. token: requests
        must carry `Authorization: Bearer <token>`, or <read_token> (the read-only one: metrics change nothing)."""
        context = _tls_context(*tls) if tls is not None else None
        app = _guarded(exposition_app(self.registry), token, read_token)
        self._http = serve_wsgi(app, host, port, "ps-metrics", context)  # close()'s stop() waits for its thread
        return self._http.server_address[1]

    def close(self) -> None:
        http = getattr(self, "_http", None)
        if http is not None:
            stop(http)


def _tls_context(cert: str, key: str, ca: str | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if ca:
        context.load_verify_locations(ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _guarded(app, token: str | None, read_token: str | None = None):
    """The metrics WSGI app behind a bearer-token check (if token: token or read_token) and a path check (only
    /metrics)."""
    admitted = [f"Bearer {t}".encode() for t in (token, read_token) if t] if token else []

    def guarded(environ, start_response):
        given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if admitted and not any(hmac.compare_digest(given, expected) for expected in admitted):
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
            return [b"missing or wrong token (Authorization: Bearer ...)\n"]
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: metrics are at /metrics\n"]
        return app(environ, start_response)

    return guarded


class _StartCollector:
    def __init__(self, progress: StartProgress):
        self.progress = progress

    def collect(self):
        phase, fraction, took_s = self.progress.snapshot()
        starting = GaugeMetricFamily("sparseps_starting", "1 while the shard starts (health NOT_SERVING, every call "
                                     "UNAVAILABLE) and, under --memory-bytes, while it warms up (phase warming: health "
                                     "NOT_SERVING, the calls served); 0 once that is done")  # fmt: skip
        starting.add_metric([], float(phase != "serving"))
        phases = GaugeMetricFamily("sparseps_start_phase", "1 for the phase the shard's start is in",
                                   labels=["phase"])  # fmt: skip
        for name in PHASES:
            phases.add_metric([name], float(name == phase))
        seconds = GaugeMetricFamily("sparseps_start_seconds", "seconds the shard's start has taken so far, or took")
        seconds.add_metric([], took_s)
        yield from (starting, phases, seconds)
        if fraction is not None:
            progress = GaugeMetricFamily("sparseps_start_progress", "fraction of the start's phase done (replaying: "
                                         "of the journal's bytes)")  # fmt: skip
            progress.add_metric([], fraction)
            yield progress


class _ShardCollector:
    def __init__(self):
        self.shard: Shard | None = None  # set once the shard serves
        self.replies: ReplyRoom | None = None  # its servicer's, set with it

    def collect(self):
        shard = self.shard
        if shard is None:
            return
        try:
            s = {**shard.stats(), **shard.health_stats(), **(self.replies.stats() if self.replies else {})}
        except (DataDirLostError, ShardNeedsRestartError):  # Stats' refusal: the figures are gone with the data
            s = None  # dir, or meaningless; the gauges below say why (their flags are set before the refusal)
        lost = GaugeMetricFamily("sparseps_data_dir_lost", "1 once the shard found its journal segment or its data "
                                 "dir deleted under it: it takes no more writes (docs/reliability.md)")  # fmt: skip
        lost.add_metric([], float(bool(shard.journal.lost)))
        broken = GaugeMetricFamily("sparseps_shard_broken", "1 once a push journaled failed part way through being "
                                   "applied in RAM: the shard takes no more writes until a restart replays its "
                                   "journal (docs/storage.md)")  # fmt: skip
        broken.add_metric([], float(bool(shard.guard.broken)))
        yield from (lost, broken)
        if s is None:
            return
        gauges = {
            k: GaugeMetricFamily(f"sparseps_table_{k}", text, labels=["table"]) for k, text in TABLE_GAUGES.items()
        }
        gauges["num_rows"] = GaugeMetricFamily("sparseps_table_rows", "ids with a trained row", labels=["table"])
        counters = {
            k: CounterMetricFamily(f"sparseps_table_{k}", text, labels=["table"]) for k, text in TABLE_COUNTERS.items()
        }
        for t in s["tables"]:
            for k, family in gauges.items():
                family.add_metric([t["name"]], t.get(k, 0))
            for k, family in counters.items():
                family.add_metric([t["name"]], t.get(k, 0))
        yield from gauges.values()
        yield from counters.values()
        for name, key, text in SHARD_GAUGES:
            family = GaugeMetricFamily(name, text)
            family.add_metric([], s.get(key, 0))
            yield family
        for name, key, text in SHARD_COUNTERS:
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], s.get(key, 0))
            yield counter

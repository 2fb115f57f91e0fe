"""Prometheus metrics of a shard, served on --metrics-port (prometheus-client).

Per RPC method (`method` label), observed by the servicer:
    sparseps_requests_total{method, code}          calls, by gRPC status code name
    sparseps_request_seconds{method}                latency histogram
    sparseps_request_bytes_total{method, direction} request ("in") and reply ("out") bytes
Per table (`table` label), read from the shard at each scrape:
    sparseps_table_rows, sparseps_table_pending_ids, sparseps_table_rows_in_ram, sparseps_table_rows_on_disk,
    sparseps_table_dirty_rows, sparseps_table_ram_bytes, sparseps_table_disk_bytes      (gauges)
    sparseps_table_evictions_total, sparseps_table_ids_pulled_total, sparseps_table_ids_pushed_total (counters)
Per shard: sparseps_clock, sparseps_ram_budget_bytes, sparseps_ram_used_bytes, sparseps_journal_bytes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TABLE_GAUGES = ("rows_in_ram", "rows_on_disk", "dirty_rows", "ram_bytes", "disk_bytes", "pending_ids")
TABLE_COUNTERS = ("evictions", "ids_pulled", "ids_pushed")


class ServerMetrics:
    def __init__(self, shard):
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

    def serve(self, port: int, host: str) -> int:
        """Serves /metrics over HTTP on host:port (0: a free port); returns the port."""
        self._http, _ = start_http_server(port, addr=host, registry=self.registry)
        return self._http.server_address[1]

    def close(self) -> None:
        http = getattr(self, "_http", None)
        if http is not None:
            http.shutdown()
            http.server_close()


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
                                ("sparseps_journal_bytes", "journal_bytes", "journal bytes on disk")):  # fmt: skip
            family = GaugeMetricFamily(name, text)
            family.add_metric([], s.get(key, 0))
            yield family

"""Prometheus metrics of a training worker, served on `ps-worker train --metrics-port`:
sparseps_worker_examples_total, sparseps_worker_steps_total     examples and steps trained
sparseps_worker_step_seconds                                    histogram of one step (compute and exchange)
sparseps_worker_train_logloss                                   the running logloss of the progress bar (NaN
                                                                before the first step)

The endpoint is plain HTTP with no token, so it listens on 127.0.0.1 unless `--metrics-host` widens it
(docs/security.md). It serves ps.metricshttp.MAX_CONNECTIONS connections at once, as a shard's metrics port does,
and closes any more unread.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ps.listen_address import host_port
from ps.metricshttp import exposition_app, serve_wsgi, stop

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def metrics_url(host: str, port: int) -> str:
    """The endpoint's URL: http://HOST:PORT/metrics, an IPv6 address in brackets (ps.listen_address.host_port)."""
    return f"http://{host_port(host, port)}/metrics"


class TrainTelemetry:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.examples = Counter("sparseps_worker_examples", "examples trained", registry=self.registry)
        self.steps = Counter("sparseps_worker_steps", "training steps", registry=self.registry)
        self.step_seconds = Histogram("sparseps_worker_step_seconds", "one training step", buckets=BUCKETS,
                                      registry=self.registry)  # fmt: skip
        self.logloss = Gauge("sparseps_worker_train_logloss", "running train logloss", registry=self.registry)
        self.logloss.set(float("nan"))  # not 0, a perfect loss, before the first step
        self._http = None

    def step(self, examples: int, seconds: float, logloss: float) -> None:
        self.examples.inc(examples)
        self.steps.inc()
        self.step_seconds.observe(seconds)
        self.logloss.set(logloss)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serves GET /metrics over plain HTTP on host:port (0: a free port); returns the port. ValueError naming
        --metrics-port if the port cannot be had (in use, not allowed)."""
        try:
            self._http = serve_wsgi(exposition_app(self.registry), host, port, "ps-worker-metrics")
        except OSError as e:
            raise ValueError(f"cannot listen on {host_port(host, port)} (--metrics-port): {e.strerror or e}; give a free port, "
                             "or 0 for any free one") from None  # fmt: skip
        return self._http.server_address[1]

    def close(self) -> None:
        """Stops serving (again: nothing)."""
        if self._http is not None:
            http, self._http = self._http, None
            stop(http)

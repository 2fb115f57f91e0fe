"""The worker's metrics endpoint (plain HTTP, no token) listens on the loopback unless --metrics-host widens it."""

from __future__ import annotations

import urllib.request

from worker.__main__ import build_parser
from worker.telemetry import TrainTelemetry


def test_the_endpoint_listens_on_the_loopback_by_default():
    telemetry = TrainTelemetry()
    port = telemetry.serve(0)
    try:
        assert telemetry._http.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            assert b"sparseps_worker_steps_total" in reply.read()
    finally:
        telemetry.close()


def test_metrics_host_is_a_train_flag_defaulting_to_the_loopback():
    parser = build_parser()
    assert parser.parse_args(["train", "--metrics-port", "0"]).metrics_host == "127.0.0.1"
    assert parser.parse_args(["train", "--metrics-host", "0.0.0.0"]).metrics_host == "0.0.0.0"

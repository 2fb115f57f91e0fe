"""Prometheus metrics on --metrics-port: per-method request counts, latency histograms and bytes; per-table
rows in RAM and on disk, evictions, ids pulled and pushed; read over HTTP as Prometheus would; and every metric
the docs name served, with the labels they give it."""

from __future__ import annotations

import logging
import socket
import time
import urllib.error
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from ps.config import TableConfig
from ps.metricshttp import Handler, serve_wsgi, stop
from ps.server import Server
from ps.server_config import ServerConfig
from tests.bounded_http import check_connections_bounded, check_slow_clients_dropped
from tests.conftest import random_ids
from worker.client import Client


def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_the_server_serves_request_and_table_metrics(tmp_path):
    server = Server(ServerConfig(data_dir=str(tmp_path), port=0, metrics_port=0, cache_bytes=256 << 10))
    server.start()
    try:
        with Client([f"127.0.0.1:{server.port}"], server_timeout_s=0) as client:
            client.create_table(TableConfig("emb", 8))
            ids = random_ids(5000)
            for _ in range(3):
                client.push("emb", ids, np.ones((5000, 8), np.float32))
            client.pull("emb", ids)
            try:
                client.pull("nope", ids[:3])
            except Exception:
                pass
        m = scrape(server.metrics_port)
        assert m[("sparseps_requests_total", (("code", "OK"), ("method", "PushBatch")))] == 3
        assert m[("sparseps_requests_total", (("code", "NOT_FOUND"), ("method", "DescribeTable")))] == 1
        assert m[("sparseps_request_seconds_count", (("method", "PushBatch"),))] == 3
        assert m[("sparseps_request_bytes_total", (("direction", "in"), ("method", "PushBatch")))] > 3 * 5000 * 8 * 4
        assert m[("sparseps_request_bytes_total", (("direction", "out"), ("method", "PullBatch")))] >= 5000 * 8 * 4
        table = (("table", "emb"),)
        assert m[("sparseps_table_rows", table)] == 5000
        assert m[("sparseps_table_ids_pushed_total", table)] == 15000
        assert m[("sparseps_table_evictions_total", table)] > 0  # a 256 KiB RAM tier cannot hold 5000 rows
        assert m[("sparseps_table_rows_in_ram", table)] < 5000
        assert m[("sparseps_ram_budget_bytes", ())] == 256 << 10
        assert m[("sparseps_table_admitted_total", table)] == 5000 and m[("sparseps_table_pushes_total", table)] == 3
        assert m[("sparseps_table_cache_misses_total", table)] >= 5000  # new ids are looked up in RocksDB
        assert m[("sparseps_flush_failures", ())] == 0 and m[("sparseps_uptime_seconds", ())] > 0
        assert m[("sparseps_request_room_waits_total", ())] == 0  # a count since the start: a counter, not a gauge
        files = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
        assert m[("sparseps_data_dir_bytes", ())] > 0 and abs(m[("sparseps_data_dir_bytes", ())] - files) < files / 2
        assert m[("sparseps_disk_free_bytes", ())] > 0 and m[("process_resident_memory_bytes", ())] > 50 << 20
        assert m[("sparseps_disk_total_bytes", ())] >= m[("sparseps_disk_free_bytes", ())]
        assert m[("sparseps_disk_low_bytes", ())] >= 0.05 * m[("sparseps_disk_total_bytes", ())] - 1
        assert m[("sparseps_disk_low", ())] == float(
            m[("sparseps_disk_free_bytes", ())] < m[("sparseps_disk_low_bytes", ())]
        )
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        helps = [line for line in text.splitlines() if line.startswith("# HELP sparseps_")]
        assert helps and not [h for h in helps if h.split(" ", 3)[3].startswith("table ")], helps  # each says what
    finally:
        server.stop(grace_s=1)


def test_a_training_worker_counts_examples_and_steps_and_serves_them():
    from tests.inprocess import InProcessTables
    from worker.job import loop_settings, open_job
    from worker.loop import run_epochs
    from worker.telemetry import TrainTelemetry
    from worker.train_config import TrainConfig

    cfg = TrainConfig(model="lr", synthetic_rows=5000, batch_size=1000, epochs=1, recipe="large", progress=False)
    telemetry = TrainTelemetry()
    port = telemetry.serve(0, "127.0.0.1")
    try:
        with InProcessTables(cache_bytes=64 << 20) as tables:
            cfg, data, spec, backend, dense = open_job(cfg, tables)
            result = run_epochs(tables, spec, backend, dense, data.train, loop_settings(cfg, data), telemetry=telemetry)
            train_logloss = result.train_logloss
        m = scrape(port)
        assert m[("sparseps_worker_examples_total", ())] == 5000 and m[("sparseps_worker_steps_total", ())] == 5
        assert m[("sparseps_worker_step_seconds_count", ())] == 5
        assert m[("sparseps_worker_train_logloss", ())] == train_logloss
    finally:
        telemetry.close()


def test_only_the_metrics_path_answers(tmp_path):
    server = Server(ServerConfig(data_dir=str(tmp_path), port=0, metrics_port=0))
    server.start()
    try:
        base = f"http://127.0.0.1:{server.metrics_port}"
        codes = {}
        for path in ("/metrics", "/", "/favicon.ico", "/metrics/", "/debug", "/metrics?name[]=sparseps_clock"):
            try:
                codes[path] = urllib.request.urlopen(base + path, timeout=10).status
            except urllib.error.HTTPError as e:
                codes[path] = e.code
        assert codes == {"/metrics": 200, "/": 404, "/favicon.ico": 404, "/metrics/": 404, "/debug": 404,
                         "/metrics?name[]=sparseps_clock": 200}  # fmt: skip
    finally:
        server.stop(grace_s=1)


def test_an_ipv6_host_serves_grpc_and_metrics_with_or_without_brackets(tmp_path):
    """--host ::1 (or [::1]): gRPC listens on [::1]:PORT and the metrics on the same address."""

    import pytest

    from ps.health import check_health
    from ps.listen_address import host_port

    assert host_port("::1", 5) == host_port("[::1]", 5) == "[::1]:5" and host_port("10.0.0.1", 5) == "10.0.0.1:5"
    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"this machine has no IPv6 loopback: {e}")
    for i, host in enumerate(("::1", "[::1]")):
        server = Server(ServerConfig(data_dir=str(tmp_path / f"d{i}"), host=host, port=0, metrics_port=0))
        server.start()
        try:
            assert check_health(f"[::1]:{server.port}").text == "SERVING"
            with urllib.request.urlopen(f"http://[::1]:{server.metrics_port}/metrics", timeout=10) as r:
                assert b"sparseps_" in r.read()
        finally:
            server.stop(grace_s=1)


def served_families() -> dict[str, tuple[str, set[str]]]:
    """{name: (type, label names)} of every family and sample a server (starting, then serving tables) and a
    training worker serve."""
    import tempfile

    from prometheus_client import generate_latest

    from ps.engine.startup import StartProgress
    from ps.metrics import ServerMetrics
    from worker.telemetry import TrainTelemetry

    texts = []
    progress = StartProgress()
    progress.enter("replaying", lambda: 0.5)  # a phase with a measure: sparseps_start_progress too
    texts.append(generate_latest(ServerMetrics(progress).registry).decode())
    with tempfile.TemporaryDirectory() as d:
        server = Server(ServerConfig(data_dir=d, port=0, metrics_port=0))
        server.start()
        try:
            with Client([f"127.0.0.1:{server.port}"], server_timeout_s=0) as client:
                client.create_table(TableConfig("emb", 8))
                client.push("emb", random_ids(10), np.ones((10, 8), np.float32))
            texts.append(
                urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
            )
        finally:
            server.stop(grace_s=1)
    telemetry = TrainTelemetry()
    telemetry.step(100, 0.01, 0.5)
    texts.append(generate_latest(telemetry.registry).decode())
    out = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            labels = {k for s in family.samples for k in s.labels} - {"le"}
            out[family.name] = (family.type, labels)
            for sample in family.samples:
                out[sample.name] = (family.type, labels)
    return out


def test_every_metric_the_docs_name_is_served_with_its_labels():
    """The names (and `{labels}`) README, docs/, deploy/ and the metrics modules' docstrings give operators, against
    what a server and a worker serve: a metric renamed or dropped, or a label changed, fails here."""
    import os
    import re

    import ps.metrics
    import ps.refusals
    import worker.telemetry

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    texts = [ps.metrics.__doc__, ps.refusals.__doc__, worker.telemetry.__doc__]
    for folder, names in (("", ["README.md"]), ("docs", None), ("deploy", None), (os.path.join("deploy", "k8s"), None)):
        path = os.path.join(root, folder)
        for name in names or sorted(os.listdir(path)):
            if os.path.isfile(os.path.join(path, name)):
                with open(os.path.join(path, name), encoding="utf-8") as f:
                    texts.append(f.read())
    named = re.findall(r"\b(sparseps_[a-z_]*[a-z])(?:\{([a-z_]+(?:, ?[a-z_]+)*)\})?(?![a-z_{<])", "\n".join(texts))
    served = served_families()
    assert not [n for n, (kind, _) in served.items() if n.endswith("_total") and kind != "counter"]  # no gauge
    wanted = {"sparseps_requests_total", "sparseps_start_progress", "sparseps_disk_low", "sparseps_worker_steps_total"}
    assert wanted <= {name for name, _ in named}, named  # the scan finds the names the docs give
    for name, labels in named:
        assert name in served, f"{name} is named in the docs but not served"
        kind, served_labels = served[name]
        assert not name.endswith("_total") or kind == "counter", f"{name} is a {kind}"
        if labels:
            assert {label.strip() for label in labels.split(",")} == served_labels, (name, labels, served_labels)


def test_the_metrics_port_serves_a_bounded_number_of_connections_and_closes_the_rest_unread(tmp_path, monkeypatch):
    """Each connection takes a thread for as long as its client idles (up to the handler's timeout): past
    MAX_CONNECTIONS at once, a connection is closed at once, so that nobody can make the server start threads without
    bound; once they are gone, scrapes are served again."""
    monkeypatch.setattr(Handler, "timeout", 120.0)  # no idle connection is closed for its timeout meanwhile
    server = Server(ServerConfig(data_dir=str(tmp_path), port=0, metrics_port=0))
    server.start()

    def scraped() -> None:
        assert ("sparseps_starting", ()) in scrape(server.metrics_port)

    try:
        check_connections_bounded(server.metrics_port, scraped, wait_s=30)
    finally:
        server.stop(grace_s=1)


def test_a_shards_metrics_port_drops_clients_sending_their_requests_a_byte_at_a_time(tmp_path, monkeypatch):
    """Slow clients on every thread of the port are dropped at the handler's deadline, and a scrape is served."""
    monkeypatch.setattr(Handler, "timeout", 3.0)  # check_slow_clients_dropped: why not less
    server = Server(ServerConfig(data_dir=str(tmp_path), port=0, metrics_port=0))
    server.start()

    def scraped() -> None:
        assert ("sparseps_starting", ()) in scrape(server.metrics_port)

    try:
        check_slow_clients_dropped(server.metrics_port, scraped, deadline_s=Handler.timeout)
    finally:
        server.stop(grace_s=1)


def read_slowly(port: int, chunk_bytes: int, give_up_s: float = 60) -> tuple[int, bool]:
    """Asks 127.0.0.1:port for / over a socket with a small receive buffer and reads the reply chunk_bytes at a time,
    every 20 ms; returns (bytes read, whether the server ended the connection within give_up_s)."""
    got = 0
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # before connecting: the kernel buffers little
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        give_up = time.monotonic() + give_up_s
        while time.monotonic() < give_up:
            try:
                data = s.recv(chunk_bytes)
            except ConnectionResetError:
                data = b""
            if not data:
                return got, True
            got += len(data)
            time.sleep(0.02)
    return got, False


def serve_chunks(chunk: bytes, chunks: int, collect_s: float = 0.0):
    """A WSGI app that takes collect_s to collect its reply, then replies chunks times chunk."""

    def app(environ, start_response):
        time.sleep(collect_s)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return (chunk for _ in range(chunks))

    return app


def test_a_reply_read_past_its_deadline_is_cut_with_a_debug_line_not_a_traceback(monkeypatch, capfd, caplog):
    """A client reading a long reply steadily but slowly, each write of it well within a socket timeout, gets only
    what the server sent within reply_s; the cut is one debug line in the log, nothing on stderr."""
    monkeypatch.setattr(Handler, "reply_s", 1.0)
    caplog.set_level(logging.DEBUG, logger="ps.metrics")
    chunk, chunks = b"x" * (256 << 10), 64  # 16 MiB: 1 s allowed, which this client (<= 3.2 MB/s) reads in 5 s
    http = serve_wsgi(serve_chunks(chunk, chunks), "127.0.0.1", 0, "test-slow-reply")
    try:
        got, ended = read_slowly(http.server_address[1], 64 << 10)
    finally:
        stop(http)
    assert ended, "the connection was still open after 60 s"
    assert got < len(chunk) * chunks, f"the whole reply ({got} bytes) came, past the reply's deadline"
    assert "metrics reply to" in caplog.text and "cut" in caplog.text, caplog.text
    err = capfd.readouterr().err
    assert "Traceback" not in err and "TimeoutError" not in err, err


def test_a_reply_whose_collection_outlasts_the_request_deadline_is_served(monkeypatch, capfd):
    """The time the app takes to collect a reply counts in neither deadline: a shard with many tables, collecting for
    longer than Handler.timeout, still answers."""
    monkeypatch.setattr(Handler, "timeout", 1.0)
    http = serve_wsgi(serve_chunks(b"metrics\n", 3, collect_s=2.0), "127.0.0.1", 0, "test-slow-collect")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http.server_address[1]}/", timeout=10) as reply:
            assert reply.read() == b"metrics\n" * 3
    finally:
        stop(http)
    assert "Traceback" not in capfd.readouterr().err


def test_a_reply_read_slowly_within_its_deadline_is_served_past_the_request_deadline(monkeypatch):
    """A scraper reading a reply within reply_s gets all of it, however long past Handler.timeout it takes: the
    reply's deadline counts from its first byte."""
    monkeypatch.setattr(Handler, "timeout", 1.0)
    monkeypatch.setattr(Handler, "reply_s", 30.0)
    chunk, chunks = b"x" * (256 << 10), 32  # 8 MiB: this client (<= 3.2 MB/s) reads it in ~3 s
    http = serve_wsgi(serve_chunks(chunk, chunks), "127.0.0.1", 0, "test-slow-honest-reply")
    started = time.monotonic()
    try:
        got, ended = read_slowly(http.server_address[1], 64 << 10)
    finally:
        stop(http)
    assert ended, "the connection was still open after 60 s"
    assert got > len(chunk) * chunks, f"{got} bytes of the reply's {len(chunk) * chunks} (and its headers) came"
    assert time.monotonic() - started > 2 * Handler.timeout  # it took longer than the request's deadline


def test_an_accept_header_naming_an_unreadable_format_version_is_a_400_on_both_endpoints(tmp_path, capfd, caplog):
    """An Accept header naming OpenMetrics (or text/plain) with a version that is not dotted numbers ("1.0.x") is the
    client's slip: a 400 naming the header, not the 500 and the ERROR line with a traceback that prometheus-client's
    encoder choice gives (it compares "x" with 0); the scrape that follows, and one asking version 1.0.0, are
    served."""
    from worker.telemetry import TrainTelemetry

    caplog.set_level(logging.DEBUG, logger="ps.metrics")
    server = Server(ServerConfig(data_dir=str(tmp_path), port=0, metrics_port=0))
    server.start()
    telemetry = TrainTelemetry()
    unreadable = ("application/openmetrics-text; version=1.0.x", "text/plain;version=x", "text/plain;version=a")
    try:
        for port in (server.metrics_port, telemetry.serve(0, "127.0.0.1")):
            for accept in unreadable:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
                try:
                    urllib.request.urlopen(request, timeout=10)
                    raise AssertionError(f"{accept!r} was served")
                except urllib.error.HTTPError as e:
                    assert e.code == 400, (accept, e.code)
                    assert f"the Accept header {accept!r}" in e.read().decode()
            good = {"Accept": "application/openmetrics-text; version=1.0.0"}
            reply = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=good),
                                           timeout=10)  # fmt: skip
            assert reply.status == 200 and reply.headers["Content-Type"].startswith("application/openmetrics-text")
            assert scrape(port)
    finally:
        telemetry.close()
        server.stop(grace_s=1)
    assert "failed" not in caplog.text and "Traceback" not in caplog.text, caplog.text
    assert "Traceback" not in capfd.readouterr().err


def test_an_http09_request_is_answered_400_at_once_and_closed(monkeypatch):
    """A request line with no version (HTTP/0.9: `GET /metrics`), which has no headers, is answered 400 and closed
    as it arrives, not held for header lines until the request's deadline: the reply and the close come within a
    socket timeout far below that deadline."""
    monkeypatch.setattr(Handler, "timeout", 60.0)  # the deadline the request would otherwise be held to
    http = serve_wsgi(serve_chunks(b"metrics\n", 1), "127.0.0.1", 0, "test-http09")
    try:
        with socket.create_connection(("127.0.0.1", http.server_address[1]), timeout=10) as conn:
            conn.sendall(b"GET /metrics\r\n")
            reply = b""
            while data := conn.recv(4096):  # TimeoutError past 10 s: the server held it
                reply += data
        with socket.create_connection(("127.0.0.1", http.server_address[1]), timeout=10) as conn:
            conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            served = b"".join(iter(lambda: conn.recv(4096), b""))
    finally:
        stop(http)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400 Bad Request\r\n") and b"Connection: close" in head, reply
    assert b"the request line 'GET /metrics' has no HTTP version (HTTP/0.9, not served)" in body, body
    assert served.startswith(b"HTTP/1.0 200 OK\r\n") and served.endswith(b"\r\n\r\nmetrics\n"), served

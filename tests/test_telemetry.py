"""The worker's metrics endpoint (plain HTTP, no token) listens on the loopback unless --metrics-host widens it."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from worker.__main__ import main
from worker.telemetry import TrainTelemetry


def _scrape(port: int) -> bytes:
    """The page the worker's endpoint at 127.0.0.1:port serves at /metrics, asserted to hold the steps counter."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read()
    assert b"sparseps_worker_steps_total" in text
    return text


@pytest.fixture
def served():
    """(telemetry, port): a TrainTelemetry serving on a free port of its default host, closed at the end."""
    telemetry = TrainTelemetry()
    port = telemetry.serve(0)
    try:
        yield telemetry, port
    finally:
        telemetry.close()


def test_the_endpoint_listens_on_the_loopback_by_default(served):
    telemetry, port = served
    assert telemetry._http.server_address[0] == "127.0.0.1"
    text = _scrape(port)
    assert b"sparseps_worker_train_logloss NaN" in text  # before the first step: no loss yet, not a perfect one


def test_metrics_host_is_a_train_flag_defaulting_to_the_loopback():
    from worker.cli_train_config import train_config_from_argv

    assert train_config_from_argv(["--servers", "h:1", "--metrics-port", "0"], environ={}).metrics_host == "127.0.0.1"
    given = ["--servers", "h:1", "--metrics-port", "0", "--metrics-host", "0.0.0.0"]
    assert train_config_from_argv(given, environ={}).metrics_host == "0.0.0.0"
    assert train_config_from_argv(["--servers", "h:1"], environ={}).metrics_port is None  # neither given: no endpoint


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])  # the default's value too: given, and nothing listens
@pytest.mark.parametrize("command", [["train", "--synthetic-rows", "100"], ["launch", "--workers", "2"]])
def test_a_metrics_host_without_a_metrics_port_is_refused_naming_both(command, host, capsys):
    """No --metrics-port: no endpoint, so a --metrics-host would be ignored; refused before anything is dialled."""
    assert main([*command, "--servers", "127.0.0.1:9", "--server-timeout", "0", "--metrics-host", host]) == 2
    err = capsys.readouterr().err
    assert (f"--metrics-host {host} is the --metrics-port endpoint's setting; this run has no --metrics-port, which "
            "would ignore it") in err, err  # fmt: skip


@pytest.mark.parametrize("host", ["", " ", "[]"])
@pytest.mark.parametrize("command", [["train", "--synthetic-rows", "100"], ["launch", "--workers", "2"]])
def test_an_empty_metrics_host_is_refused_naming_the_flag(command, host, capsys):
    """An empty --metrics-host would have the endpoint, plain HTTP with no token, listen on every address: refused
    (exit 2) before anything is dialled, as ps-server refuses an empty --host."""
    argv = [*command, "--servers", "127.0.0.1:9", "--server-timeout", "0", "--metrics-port", "0"]
    assert main([*argv, "--metrics-host", host]) == 2
    err = capsys.readouterr().err
    assert f"ps-worker: error: --metrics-host is empty ({host!r}): give an address of this machine" in err, err


def test_shared_settings_with_a_metrics_host_pass_a_create_tables_job_and_an_empty_hidden_is_not_given():
    """A deployment's create-tables job shares the workers' settings (PS_METRICS_HOST, a --config [train]) but not
    their --metrics-port: it is not refused. PS_HIDDEN= (empty) is --hidden not given: lr takes it, deepfm gets the
    default MLP."""
    from worker.cli_train_config import train_config_from_argv
    from worker.models.spec import DEFAULT_HIDDEN

    shared = {"PS_METRICS_HOST": "0.0.0.0"}
    cfg = train_config_from_argv(["--servers", "h:1", "--create-tables-only"], environ=shared)
    assert cfg.create_tables_only and cfg.metrics_port is None
    with pytest.raises(ValueError, match="--metrics-host 0.0.0.0 is the --metrics-port endpoint's setting"):
        train_config_from_argv(["--servers", "h:1"], environ=shared)
    empty = {"PS_HIDDEN": ""}
    assert train_config_from_argv(["--servers", "h:1", "--model", "lr"], environ=empty).model == "lr"
    assert train_config_from_argv(["--servers", "h:1", "--model", "deepfm"], environ=empty).hidden == DEFAULT_HIDDEN


def test_a_metrics_port_in_use_stops_the_run_naming_the_flag_before_any_table_is_made(capsys):
    import socket

    from ps.errors import TableNotFoundError
    from worker.__main__ import main as worker_main
    from worker.client import Client
    from worker.cluster import LocalCluster

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with LocalCluster(1) as cluster:
            try:
                code = worker_main(["train", "--servers", cluster.addresses[0], "--model", "fm", "--synthetic-rows",
                                    "500", "--metrics-port", str(port)])  # fmt: skip
            except SystemExit as e:
                code = e.code
            err = capsys.readouterr().err
            assert code == 2 and f"cannot listen on 127.0.0.1:{port} (--metrics-port): " in err, err
            assert "give a free port, or 0 for any free one" in err, err
            with Client(cluster.addresses) as client, pytest.raises(TableNotFoundError):
                client.describe_table("fm")
    finally:
        taken.close()


def test_the_endpoint_serves_a_bounded_number_of_connections_and_closes_the_rest_unread(served, monkeypatch):
    """As a shard's metrics port: each connection takes a thread while its client idles, so past MAX_CONNECTIONS at
    once a connection is closed at once; once the idle ones are gone, scrapes are served again."""
    from ps.metricshttp import Handler
    from tests.bounded_http import check_connections_bounded

    monkeypatch.setattr(Handler, "timeout", 120.0)  # no idle connection is closed for its timeout meanwhile
    port = served[1]
    check_connections_bounded(port, lambda: _scrape(port), wait_s=20)


def test_clients_sending_their_requests_a_byte_at_a_time_are_dropped_so_that_a_scrape_is_served(served, monkeypatch):
    """MAX_CONNECTIONS clients dripping a request's header, each byte well within a read's timeout, hold every thread
    only until the handler's deadline for a connection's TLS handshake and request (Handler.timeout; a reply keeps
    to Handler.reply_s of its own): then a scrape is served (a slowloris would otherwise keep Prometheus out for as
    long as it drips)."""
    from ps.metricshttp import Handler
    from tests.bounded_http import check_slow_clients_dropped

    monkeypatch.setattr(Handler, "timeout", 3.0)  # check_slow_clients_dropped: why not less
    port = served[1]
    check_slow_clients_dropped(port, lambda: _scrape(port), deadline_s=Handler.timeout)


def test_the_run_names_an_ipv6_endpoint_by_a_url_that_reaches_it(capsys):
    """--metrics-host ::1 (or [::1]): the run's line names the endpoint as a URL, the address in brackets, which a
    URL parser (Prometheus', curl's, urllib's) reads as that host and port."""
    import socket
    import urllib.parse

    from worker.cli_train_config import train_config_from_argv
    from worker.train import served_metrics

    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"this machine has no IPv6 loopback: {e}")
    for host in ("::1", "[::1]"):
        cfg = train_config_from_argv(["--servers", "h:1", "--metrics-port", "0", "--metrics-host", host], environ={})
        with served_metrics(cfg) as telemetry:
            url = capsys.readouterr().out.strip().removeprefix("metrics Prometheus on ")
            parts = urllib.parse.urlsplit(url)
            assert (parts.hostname, parts.port) == ("::1", telemetry._http.server_address[1]), url
            with urllib.request.urlopen(url, timeout=10) as reply:
                assert b"sparseps_worker_steps_total" in reply.read()

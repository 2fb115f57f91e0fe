"""A shard answers while it starts: health NOT_SERVING with what the start is doing, every call UNAVAILABLE saying
the same (clients wait and retry), the metrics port with the start's gauges; then SERVING and every call served.
A start that fails after listening exits with its message; a SIGTERM during the start stops it at once and the
next start has every push. The start is held at a journal record for as long as each test needs (tests.slow_start)."""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.request

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from protos import ps_pb2, ps_pb2_grpc
from ps.config import OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.engine.startup import PHASES, StartProgress, StartStopped
from ps.engine.table import Table
from ps.errors import ServerUnavailableError
from ps.health import NOT_SERVING, SERVING, check_health
from ps.server import SERVICE_NAME, Server
from ps.server_config import ServerConfig
from tests.conftest import crash
from tests.server_process import ServerProcess
from tests.slow_start import hold_replay
from tests.waiting import join_thread, wait_until
from worker.client import Client

RECORDS, PER_RECORD, DIM = 4, 10, 4
IDS = np.arange(RECORDS * PER_RECORD, dtype=np.uint64)


def crashed_with_a_journal(data_dir) -> np.ndarray:
    """A data dir left as kill -9 leaves it after RECORDS pushes (none flushed: the start replays them all); returns
    the rows the shard served before the crash, the oracle of every start after it."""
    shard = Shard(ServerConfig(data_dir=str(data_dir)))
    shard.create_table(TableConfig("emb", DIM, optimizer=OptimizerConfig("sgd", 1.0)))
    for k in range(RECORDS):  # equal records: the k-th ends at k/RECORDS of the journal's bytes
        ids = IDS[k * PER_RECORD : (k + 1) * PER_RECORD]
        grads = np.full((PER_RECORD, DIM), k + 1, np.float32)
        shard.push("emb", ids, grads, clicks=np.ones(PER_RECORD, np.float32))  # no record ends in zero bytes
    rows = shard.pull("emb", IDS).copy()
    crash(shard)
    return rows


def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def health_cli(address: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ps", "health", address, *flags], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def health_cli_once(address: str, says: str, *flags: str) -> subprocess.CompletedProcess:
    """`ps-server health` run until its output holds says (the start may still be in an earlier phase, opening
    RocksDB, when the server first answers)."""
    return wait_until(lambda: says in ((p := health_cli(address, *flags)).stdout + p.stderr) and p, 60,
                      f"ps-server health to say {says!r}")  # fmt: skip


def test_a_starting_shard_says_so_to_health_calls_and_metrics_then_serves(tmp_path, monkeypatch, caplog):
    rows = crashed_with_a_journal(tmp_path / "d")
    gate = tmp_path / "gate"
    monkeypatch.setattr(Table, "replay", Table.replay)  # put back at the test's end
    hold_replay(str(gate), at_record=3)
    listening: queue.SimpleQueue = queue.SimpleQueue()
    built: dict = {}

    def build() -> None:
        try:
            config = ServerConfig(data_dir=str(tmp_path / "d"), metrics_port=0)
            built["server"] = Server(config, on_listening=listening.put)
        except BaseException as e:
            built["error"] = e

    builder = threading.Thread(target=build)
    builder.start()
    pulled: dict = {}
    try:
        early = listening.get(timeout=60)
        address = f"127.0.0.1:{early.port}"
        starting = re.escape("shard 0 is starting: replaying its journal, 75% (") + r"\d+ s so far\)"
        health = wait_until(lambda: (h := check_health(address, 5)).starting and "75%" in h.text and h, 60,
                            "the start to reach the held journal record, the third of four")  # fmt: skip
        assert not health.serving and re.fullmatch("NOT_SERVING: " + starting, health.text), health
        channel = grpc.insecure_channel(address)
        health_stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE_NAME):
            assert health_stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status == NOT_SERVING
        watch = health_stub.Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=60)
        assert next(watch).status == NOT_SERVING
        with pytest.raises(grpc.RpcError) as refused:
            ps_pb2_grpc.ParameterServerStub(channel).Pull(ps_pb2.PullRequest(table="emb", ids=IDS.tobytes()), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and re.fullmatch(starting, refused.value.details())
        m = scrape(early.metrics_port)
        assert m[("sparseps_starting", ())] == 1 and m[("sparseps_start_phase", (("phase", "replaying"),))] == 1
        assert m[("sparseps_start_progress", ())] == 0.75 and ("sparseps_table_rows", (("table", "emb"),)) not in m
        assert sum(m[("sparseps_start_phase", (("phase", p),))] for p in PHASES) == 1

        with Client([address], server_timeout_s=0.2) as impatient, pytest.raises(ServerUnavailableError) as gave_up:
            impatient.pull("emb", IDS)
        assert re.search(
            r"DescribeTable failed \(starting: replaying its journal, 75% .*a larger server timeout "
            r"\(--server-timeout\) waits for a start",
            str(gave_up.value),
        ), gave_up.value

        def pull() -> None:  # a worker's client, meanwhile: it waits for the shard as for an outage
            with Client([address], server_timeout_s=60) as client:
                pulled["rows"] = client.pull("emb", IDS)

        with caplog.at_level(logging.INFO, logger="worker.client"):
            puller = threading.Thread(target=pull)
            puller.start()
            wait_until(lambda: "is starting (replaying its journal" in caplog.text, 30, "the client to say it waits")
            gate.touch()
            join_thread(builder, 60, "the start, let go on")
            assert "error" not in built, built
            server = built["server"]
            assert server is early
            assert check_health(address, 5).starting  # built, not serving until start()
            server.start()
            join_thread(puller, 60, "the client's pull")
        assert next(watch).status == SERVING
        watch.cancel()
        assert check_health(address, 5) == (True, False, "SERVING")
        np.testing.assert_array_equal(pulled["rows"], rows)  # every journaled push, replayed
        m = scrape(server.metrics_port)
        assert m[("sparseps_starting", ())] == 0 and m[("sparseps_start_phase", (("phase", "serving"),))] == 1
        assert m[("sparseps_table_rows", (("table", "emb"),))] == len(IDS)
        channel.close()
    finally:
        gate.touch()
        builder.join(60)
        if "server" in built:
            built["server"].stop(grace_s=1)


def test_start_progress_describes_its_phase_and_stops_only_when_asked():
    progress = StartProgress()
    assert progress.starting and progress.phase == "checking"
    progress.enter("replaying", lambda: 0.437)
    assert re.fullmatch(r"replaying its journal, 43% \(\d+ s so far\)", progress.describe())
    progress.enter("restoring", lambda: 1 / 0)  # a failing figure is left out, never raised to the reader
    assert progress.snapshot()[1] is None and progress.describe().startswith("restoring from its checkpoint (")
    progress.enter("flushing", lambda: 7.0)
    assert progress.snapshot()[1] == 1.0  # clamped to 0..1
    with pytest.raises(ValueError, match="unknown start phase 'napping'"):
        progress.enter("napping")
    progress.check()
    progress.stop.set()
    with pytest.raises(StartStopped, match="writing the replayed rows"):
        progress.check()
    with pytest.raises(StartStopped):
        progress.enter("ready")  # every phase begins where stopping is safe: it checks first
    progress = StartProgress()  # one not asked to stop
    with progress.read_only("verifying"):
        assert progress.interruptible and progress.phase == "verifying"
    assert not progress.interruptible  # a stop after the read-only part waits for the next check
    assert not progress.stop_asked()  # not set: the start goes on
    progress.finish()
    progress.stop.set()
    progress.check()  # a shard that serves is stopped by Server.stop, not by its start's checks
    assert not progress.stop_asked()  # a stop asked for now stops a shard that serves
    assert not progress.starting and progress.describe() == "serving" and not progress.interruptible


@pytest.mark.parametrize("warming", [False, True])
def test_a_stop_asked_for_just_before_the_shard_serves_ends_the_start(warming):
    """A signal whose handler runs once finish()'s check has passed, before the phase changes (simulated: the check
    returns into it) ends the start all the same: StartStopped, the start still "about to serve"."""
    progress = StartProgress()
    progress.enter("ready")
    check = progress.check

    def signalled_after() -> None:
        check()
        progress.stop.set()
        assert progress.stop_asked()  # what the handler's line says: the start stops

    progress.check = signalled_after
    with pytest.raises(StartStopped, match="about to serve"):
        progress.finish(warming)
    assert progress.starting and progress.phase == "ready" and progress.describe().startswith("about to serve (")


def slow_server(tmp_path, gate, at: int | str, *flags: str, stdin: int | None = None) -> ServerProcess:
    """ps-server on tmp_path / "d", its start held at `at` until the file gate exists (tests.slow_start)."""
    return ServerProcess(tmp_path / "d", *flags, launcher=("-m", "tests.slow_start", str(gate), str(at)), stdin=stdin)


def test_a_start_that_fails_after_listening_exits_with_its_message(tmp_path):
    crashed_with_a_journal(tmp_path / "d")
    (segment,) = (tmp_path / "d" / "journal").iterdir()
    data = bytearray(segment.read_bytes())
    end = len(data.rstrip(b"\0"))
    data[end * 5 // 8] ^= 0xFF  # inside the third of the four equal records: acknowledged records follow it
    segment.write_bytes(bytes(data))
    gate = tmp_path / "gate"
    server = slow_server(tmp_path, gate, 1)
    try:
        address = server.answering()
        probe = health_cli_once(address, "NOT_SERVING: shard 0 is starting: replaying its journal")
        assert probe.returncode == 3 and "NOT_SERVING: shard 0 is starting: replaying its journal" in probe.stderr
        gate.touch()
        assert server.proc.wait(60) == 2, server.output()
    finally:
        server.proc.kill()
    out = server.output()
    assert "ps-server: error:" in out and "is corrupt at byte" in out and "Refusing to start" in out, out
    assert "listening on" not in out and "Traceback" not in out, out
    probe = health_cli(address)
    assert probe.returncode == 1 and "connection refused" in probe.stderr, probe.stderr


def test_sigterm_during_the_start_stops_it_and_the_next_start_has_every_push(tmp_path):
    rows = crashed_with_a_journal(tmp_path / "d")
    gate = tmp_path / "gate"
    server = slow_server(tmp_path, gate, 2)
    try:
        address = server.answering()
        alive = health_cli_once(address, "replaying its journal", "--starting-ok")
        assert alive.returncode == 0 and "NOT_SERVING: shard 0 is starting: replaying its journal" in alive.stdout
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "received SIGTERM" in server.output(), 30, "the server to take the signal")
        gate.touch()  # the held record goes on; the start stops before the next one
        assert server.proc.wait(60) == 0, server.output()
    finally:
        server.proc.kill()
    out = server.output()
    assert re.search(r"stopped during its start \(replaying its journal, \d+%", out) and "listening on" not in out, out
    again = ServerProcess(tmp_path / "d")
    try:
        address = again.started()
        assert address is not None, again.output()
        assert f"replayed {RECORDS} journal records" in again.output()
        with Client([address]) as client:
            np.testing.assert_array_equal(client.pull("emb", IDS), rows)
    finally:
        again.stop_cleanly()


def test_sigterm_during_verify_on_start_stops_it_at_once(tmp_path):
    rows = crashed_with_a_journal(tmp_path / "d")
    server = slow_server(tmp_path, tmp_path / "gate", "verify", "--verify-on-start")
    try:
        address = server.answering()
        probe = health_cli_once(address, "verifying every block")
        assert probe.returncode == 3, probe.stderr
        assert "NOT_SERVING: shard 0 is starting: verifying every block of its data dir (--verify-on-start)" in (
            probe.stderr
        )
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0, server.output()  # the gate never opens: the reading stops where it is
    finally:
        server.proc.kill()
    out = server.output()
    assert "stopped during its start (verifying every block" in out and "listening on" not in out, out
    again = ServerProcess(tmp_path / "d")
    try:
        address = again.started()
        assert address is not None, again.output()
        with Client([address]) as client:
            np.testing.assert_array_equal(client.pull("emb", IDS), rows)
    finally:
        again.stop_cleanly()


# ps-server (tests.slow_start: its --verify-on-start reading held until the file GATE) whose start also waits, before
# that reading begins, for the file GATE.begin, and whose ps-signals thread takes 3 s over each line (a slow stderr),
# having made the file GATE.said
SLOW_LINE_BEFORE_VERIFY = """import logging, sys, threading, time
import ps.server
from ps.__main__ import main
from tests.slow_start import hold_verify, wait_for

gate = sys.argv[1]
hold_verify(gate)
build = ps.server.Server._build_shard


def build_later(self):
    wait_for(gate + ".begin")
    return build(self)


class Slow(logging.Filter):
    def filter(self, record):
        if threading.current_thread().name == "ps-signals":
            open(gate + ".said", "w").close()
            time.sleep(3)
        return True


ps.server.Server._build_shard = build_later
logging.getLogger("ps.server").addFilter(Slow())
sys.exit(main(sys.argv[2:]))
"""


def test_a_sigterm_just_before_verify_on_start_stops_the_start_though_its_line_is_slow(tmp_path):
    """The handler asks for the stop itself: the read-only phase that begins after it is not entered, while the
    signal's line (another thread's) is still being written; that line still comes before the start's last one."""
    crashed_with_a_journal(tmp_path / "d")
    gate = tmp_path / "gate"
    server = ServerProcess(tmp_path / "d", "--verify-on-start", launcher=("-c", SLOW_LINE_BEFORE_VERIFY, str(gate)))
    try:
        server.answering()
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: os.path.exists(f"{gate}.said"), 30, "the signal's line to be under way")
        (tmp_path / "gate.begin").touch()
        assert server.proc.wait(30) == 0, server.output()  # the reading's gate never opens: it must not begin
    except subprocess.TimeoutExpired:
        raise server.hung("the start went on into its reading") from None
    finally:
        server.proc.kill()
    out = server.output()
    said, stopped = out.find("received SIGTERM, shutting down"), out.find("stopped during its start (checking its")
    assert 0 <= said < stopped and "listening on" not in out, out


def test_sigterm_during_a_restore_says_it_stops_it_now_and_the_same_restore_starts_it_over(tmp_path):
    """The log line of the signal and the last line say what happens: the restore stops part way (after the batch
    it writes), and a start with the same --restore starts it over; a start without it is refused."""
    from tests.conftest import one_table_checkpoint

    checkpoint = one_table_checkpoint(tmp_path, 300)
    gate = tmp_path / "gate"
    server = slow_server(tmp_path, gate, "restore", "--restore", checkpoint)
    try:
        address = server.answering()
        health_cli_once(address, "restoring from its checkpoint")
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "received SIGTERM" in server.output(), 30, "the server to take the signal")
        gate.touch()  # the held batch is written; the restore stops at its check
        assert server.proc.wait(60) == 0, server.output()
    finally:
        server.proc.kill()
    out = server.output()
    assert re.search(r"received SIGTERM, shutting down \(the start stops now, its restore part way: restoring from "
                     r"its checkpoint \(--restore\).*; the next start with the same --restore starts the restore "
                     r"over\)", out), out  # fmt: skip
    assert ("stopped during its start (restoring from its checkpoint (--restore)" in out and f"start it again with "
            f"the same --restore {checkpoint}: a restore stopped part way leaves its data dir marked" in out), out  # fmt: skip
    assert "once the restore is done" not in out and "listening on" not in out, out
    without = ServerProcess(tmp_path / "d")
    assert without.started() is None and "holds a restore from" in without.output(), without.output()
    again = ServerProcess(tmp_path / "d", "--restore", checkpoint)
    try:
        assert again.started() is not None, again.output()
        assert "did not finish (the server stopped during it): starting it over" in again.output()
    finally:
        again.stop_cleanly()


def test_a_closed_stdin_stops_verify_on_start_at_once_as_sigterm_does(tmp_path):
    """--stop-with-stdin (ps-worker's local shards): the parent gone, a long --verify-on-start ends where it is."""
    crashed_with_a_journal(tmp_path / "d")
    server = slow_server(tmp_path, tmp_path / "gate", "verify", "--verify-on-start", "--stop-with-stdin",
                         stdin=subprocess.PIPE)  # fmt: skip
    try:
        address = server.answering()
        assert health_cli_once(address, "verifying every block").returncode == 3
        server.proc.stdin.close()
        assert server.proc.wait(60) == 0, server.output()  # the gate never opens: the reading stops where it is
    finally:
        server.proc.kill()
    out = server.output()
    assert "standard input closed" in out and "stopped during its start (verifying every block" in out, out


# ps-server whose Server.start, once called (the start "about to serve"), makes the file GATE.reached, then waits
# until the file GATE exists
HELD_ABOUT_TO_SERVE = """import sys
import ps.server
from ps.__main__ import main
from tests.slow_start import wait_for

gate = sys.argv[1]
start = ps.server.Server.start


def start_later(self, *args, **kwargs):
    open(gate + ".reached", "w").close()
    wait_for(gate)
    return start(self, *args, **kwargs)


ps.server.Server.start = start_later
sys.exit(main(sys.argv[2:]))
"""


def test_sigterm_when_the_shard_is_about_to_serve_stops_the_start(tmp_path):
    """The shard built, not serving yet ("about to serve"): the signal's line says the start stops, and it does: no
    call served, no `listening on`, the line of a start stopped, exit 0."""
    crashed_with_a_journal(tmp_path / "d")
    gate = tmp_path / "gate"
    server = ServerProcess(tmp_path / "d", launcher=("-c", HELD_ABOUT_TO_SERVE, str(gate)))
    try:
        server.answering()
        wait_until(lambda: os.path.exists(f"{gate}.reached") or server.proc.poll() is not None, 60, "about to serve")
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "received SIGTERM" in server.output(), 30, "the server to take the signal")
        gate.touch()
        assert server.proc.wait(60) == 0, server.output()
    finally:
        server.proc.kill()
    out = server.output()
    assert "received SIGTERM, shutting down (the start stops now: about to serve (" in out, out
    assert "stopped during its start (about to serve (" in out and "its data dir is as the next start can use" in out
    assert "listening on" not in out and "stopped cleanly" not in out and "Traceback" not in out, out

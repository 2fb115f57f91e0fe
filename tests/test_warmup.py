"""ps.engine.warmup.warm_up: a scratch table pulled and pushed in a temporary directory, removed afterwards; a
failure is reported, not raised."""

from __future__ import annotations

import logging
import tempfile
import threading

import pytest

from ps.engine import warmup
from tests.server_process import ServerProcess


def test_it_runs_in_a_directory_it_removes(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert warmup.warm_up() is True
    assert list(tmp_path.iterdir()) == []


def test_a_failure_is_logged_and_returns_false(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def broken_store(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(warmup, "Store", broken_store)
    with caplog.at_level(logging.WARNING, logger="ps.engine.warmup"):
        assert warmup.warm_up() is False
    assert "no space left on device" in caplog.text and "first request loads them" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_it_loads_the_kernels_of_large_requests_and_of_eviction(tmp_path):
    """What the first requests of a larger-than-RAM table take: the split over kernel threads, the parallel hash of a
    large journal record, the choice of victims and the index's deletes. In a process of its own, where nothing
    loaded them before (numba compiles, or loads from its cache, on a kernel's first call)."""
    import subprocess
    import sys

    script = (
        "from ps.engine.warmup import warm_up\n"
        "from ps.rows import parallel\n"
        "from ps.storage import arenalookups, checksum, eviction, index\n"
        "assert warm_up()\n"
        "kernels = {'victims': eviction._probation_victims, 'hash': checksum._hash_chunks, 'fold': checksum._fold,\n"
        "           'delete': index._delete}\n"
        "if parallel.THREADS > 1:\n"
        "    kernels['group'] = arenalookups._group_by_home\n"
        "print(sorted(name for name, k in kernels.items() if not k.signatures))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout  # none left for a request to load


def test_requests_after_it_load_no_kernel_it_did_not(tmp_path):
    """Pulls and pushes of a few ids and of LARGE_IDS ids, sent as requests to a server given memory_bytes (as the
    servers that run the warm-up are) in the same process after the warm-up, call no compiled kernel with argument
    types it did not: pushes without shows and clicks, with both (as training sends them) and with clicks only. (A
    request's ids, grads, shows and clicks are read-only views of its bytes: numba compiles, or loads, another
    specialization for those on their first call.)"""
    import subprocess
    import sys

    script = (
        "import sys, tempfile, grpc, numba, numpy as np\n"
        "from protos import ps_pb2, ps_pb2_grpc\n"
        "from ps.config import TableConfig\n"
        "from ps.server_config import ServerConfig\n"
        "from ps.engine.warmup import LARGE_IDS, warm_up\n"
        "from ps.server import Server\n"
        "def kernels():\n"
        "    found = {v for m in list(sys.modules.values()) if m.__name__.startswith('ps.') for v in vars(m).values()\n"
        "             if isinstance(v, numba.core.registry.CPUDispatcher)}\n"
        "    return {(k.py_func.__qualname__, str(s)) for k in found for s in k.signatures}\n"
        "server = Server(ServerConfig(data_dir=tempfile.mkdtemp(dir=sys.argv[1]), port=0, flush_interval_s=3600.0,\n"
        "                             memory_bytes=256 << 20))\n"
        "stub = ps_pb2_grpc.ParameterServerStub(grpc.insecure_channel(f'127.0.0.1:{server.start()}'))\n"
        "assert warm_up()\n"
        "server.shard.create_table(TableConfig(name='t', dim=16))\n"
        "before = kernels()\n"
        "for n in (3, LARGE_IDS):\n"
        "    ids = np.arange(n, dtype=np.uint64).tobytes()\n"
        "    stub.Pull(ps_pb2.PullRequest(table='t', ids=ids), timeout=60)\n"
        "    grads = np.full((n, 16), 0.5, dtype=np.float32).tobytes()\n"
        "    shows, clicks = np.full(n, 2, dtype=np.float32).tobytes(), np.ones(n, dtype=np.float32).tobytes()\n"
        "    for counts in ({}, {'shows': shows, 'clicks': clicks}, {'clicks': np.zeros(n, np.float32).tobytes()}):\n"
        "        stub.Push(ps_pb2.PushRequest(table='t', dim=16, ids=ids, grads=grads, **counts), timeout=60)\n"
        "print(sorted(kernels() - before))\n"
        "server.stop()\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout  # none left for a request to load


def test_a_stop_set_ends_it_between_steps_and_its_directory_goes(tmp_path, monkeypatch, caplog):
    from ps.signalsafe import StopFlag

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stop = StopFlag()
    stop.set()
    with caplog.at_level(logging.INFO, logger="ps.engine.warmup"):
        assert warmup.warm_up(stop) is False
    assert "the server is stopping" in caplog.text and list(tmp_path.iterdir()) == []


def _held_in_its_warm_up(tmp_path, scratch):
    """A --memory-bytes server (tests.slow_start) whose warm-up waits inside its first push until the file
    tmp_path/gate exists, TMPDIR scratch: (the ServerProcess, the gate), once the warm-up is held."""
    import os

    gate = tmp_path / "gate"
    server = ServerProcess(tmp_path / "d", "--memory-bytes", "96M", launcher=("-m", "tests.slow_start", str(gate),
                           "warm-up"), env={**os.environ, "TMPDIR": str(scratch)})  # fmt: skip
    _await(server, lambda: os.path.exists(f"{gate}.reached"), "the warm-up's push")
    return server, gate


def _await(server: ServerProcess, done, what: str, timeout_s: float = 120) -> None:
    """Waits until done() or the server's exit; if neither comes in timeout_s, fails with its output and every
    thread's stack (ServerProcess.hung)."""
    from tests.waiting import wait_until

    try:
        wait_until(lambda: done() or server.proc.poll() is not None, timeout_s, what)
    except AssertionError as e:
        raise server.hung(str(e)) from None


def test_a_server_stopped_during_its_warm_up_waits_for_it_and_its_directory_goes(tmp_path):
    """SIGTERM while the warm-up of a --memory-bytes server is inside a step (held there by tests.slow_start): the
    stop waits for that step, the warm-up ends and removes its scratch directory, the process exits 0. (A warm-up
    thread cut off at exit leaves the directory, or aborts the process inside RocksDB after "stopped cleanly".)"""
    import signal

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    server, gate = _held_in_its_warm_up(tmp_path, scratch)
    try:
        assert server.proc.poll() is None and [p.name for p in scratch.iterdir()][0].startswith("ps-warm-up-")
        server.proc.send_signal(signal.SIGTERM)
        _await(server, lambda: "stopped cleanly" in server.output(), "the stop")
        gate.touch()  # the warm-up's step ends
        _await(server, lambda: False, "the exit once the warm-up's step ended")
        assert server.proc.returncode == 0, server.output()
    finally:
        server.proc.kill()
    said = server.output()
    assert "stopped cleanly" in said and "the server is stopping" in said, said
    assert list(scratch.iterdir()) == [], said


def test_a_second_signal_while_the_stopped_server_waits_for_its_warm_up_exits_now(tmp_path):
    """The shard is closed before the wait: a second SIGTERM exits at once (143), saying so."""
    import signal

    server, gate = _held_in_its_warm_up(tmp_path, tmp_path)
    try:
        server.proc.send_signal(signal.SIGTERM)
        _await(server, lambda: "waiting for the warm-up" in server.output(), "the wait for the warm-up")
        server.stop()  # the second SIGTERM
        assert server.proc.returncode == 128 + signal.SIGTERM, server.output()
    finally:
        gate.touch()
        server.proc.kill()
    said = server.output()
    assert "stopped cleanly" in said and "received SIGTERM again after the stop: exiting now; the shard was " \
        "stopped first, its rows all written (the warm-up's scratch directory, ps-warm-up-*, may be left" \
        in said, said  # fmt: skip


def test_health_is_not_serving_while_the_warm_up_runs_and_calls_are_served_meanwhile(tmp_path):
    """A --memory-bytes server held inside its warm-up's first push: health NOT_SERVING, saying the kernels load
    (a starting shard: `ps-server health --starting-ok` takes it as alive), while a call is served; once the
    warm-up ends, SERVING, its line ("compiled kernels loaded") logged before."""
    import re

    import grpc

    from protos import ps_pb2, ps_pb2_grpc
    from ps.health import check_health

    server, gate = _held_in_its_warm_up(tmp_path, tmp_path)
    try:
        address = re.search(r"listening on (\S+:\d+)", server.output()).group(1)
        serving, starting, text = check_health(address, 30)
        assert (serving, starting) == (False, True) and "loading its compiled kernels (warm-up" in text, text
        with grpc.insecure_channel(address) as channel:
            ps_pb2_grpc.ParameterServerStub(channel).Stats(ps_pb2.StatsRequest(), timeout=30)
        assert check_health(address, 30)[:2] == (False, True) and "compiled kernels loaded" not in server.output()
        gate.touch()
        _await(server, lambda: check_health(address, 30).serving, "SERVING once the warm-up ended")
        assert check_health(address, 30) == (True, False, "SERVING")
        assert "compiled kernels loaded in" in server.output(), server.output()
        server.stop_cleanly()
    finally:
        gate.touch()
        server.proc.kill()


@pytest.mark.parametrize("ends", ["ran", "failed", "lost meanwhile", "stopping meanwhile"])
def test_health_after_the_warm_up_whatever_it_did(tmp_path, monkeypatch, ends):
    """A server started warming is NOT_SERVING until its warm-up thread's end, then SERVING, a failed warm-up too
    (logged; the first requests load the kernels); a shard found lost, or stopping, meanwhile stays NOT_SERVING."""
    from ps.health import NOT_SERVING, SERVICE_NAME, SERVING
    from ps.server import Server
    from ps.server_config import ServerConfig
    from ps.server_run import _warm_up_then_serve

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    if ends == "failed":

        def broken_store(*args, **kwargs):
            raise OSError("no space left on device")

        monkeypatch.setattr(warmup, "Store", broken_store)
    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, memory_bytes=256 << 20))
    try:
        server.start(warming=True)
        statuses = lambda: {server.health._server_status[name] for name in ("", SERVICE_NAME)}
        assert statuses() == {NOT_SERVING} and "loading its compiled kernels" in server._starting()
        if ends == "lost meanwhile":
            server._not_serving()
        if ends == "stopping meanwhile":
            server.health.enter_graceful_shutdown()
        running = threading.Event()
        running.set()
        _warm_up_then_serve(server, None, running)
        assert statuses() == ({SERVING} if ends in ("ran", "failed") else {NOT_SERVING})
        assert not running.is_set()  # its scratch dir removed: a second signal's line speaks of none
        assert server._starting() is None
    finally:
        server.stop()


def test_a_shard_stopping_during_its_warm_up_says_nothing_of_starting(tmp_path, monkeypatch):
    """Once its health shuts down (the stop), a shard still warming up is stopping, not starting: ps-server health
    reads a plain NOT_SERVING (exit 1), not 'starting' (exit 3)."""
    from ps.server import Server
    from ps.server_config import ServerConfig

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, memory_bytes=256 << 20))
    try:
        server.start(warming=True)
        assert "loading its compiled kernels" in server._starting()
        server.health.enter_graceful_shutdown()
        assert server._starting() is None
    finally:
        server.stop()


def test_metrics_say_the_shard_starts_while_it_warms_up_and_serves_its_calls(tmp_path):
    """Started warming, a shard's metrics say it starts (sparseps_starting 1, phase "warming", its seconds counting)
    while a call is served, as the gauge's text says; a stop asked for meanwhile ends no start (the calls are
    served). Once warmed(): 0, phase "serving", the seconds the start took, its warm-up included."""
    import time

    import grpc

    from protos import ps_pb2, ps_pb2_grpc
    from ps.engine.startup import PHASES
    from ps.server import Server
    from ps.server_config import ServerConfig
    from tests.test_metrics import scrape

    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, metrics_port=0, memory_bytes=256 << 20))
    try:
        server.start(warming=True)
        m = scrape(server.metrics_port)
        assert m[("sparseps_starting", ())] == 1 and m[("sparseps_start_phase", (("phase", "warming"),))] == 1
        assert sum(m[("sparseps_start_phase", (("phase", p),))] for p in PHASES) == 1
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            ps_pb2_grpc.ParameterServerStub(channel).Stats(ps_pb2.StatsRequest(), timeout=30)
        server.progress.stop.set()
        server.progress.check()  # served calls: no start left to stop
        time.sleep(0.05)  # the start's seconds go on through the warm-up
        assert scrape(server.metrics_port)[("sparseps_start_seconds", ())] > m[("sparseps_start_seconds", ())]
        server.warmed()
        done = scrape(server.metrics_port)
        assert done[("sparseps_starting", ())] == 0 and done[("sparseps_start_phase", (("phase", "serving"),))] == 1
        took = done[("sparseps_start_seconds", ())]
        time.sleep(0.05)
        assert scrape(server.metrics_port)[("sparseps_start_seconds", ())] == took
    finally:
        server.stop()

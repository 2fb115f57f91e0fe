"""A second SIGTERM or Ctrl-C while ps-server stops ends it at once, as kill -9 would, and the next start replays
its journal: every acknowledged push is there. Not while the stop writes the only copy of some pushes (the journal
found its segment deleted): then the stop goes on and says why. The stop is held open by tests.slow_start (its
last flush waits for a file), so the second signal always lands inside it. The first signal stops a serving shard
wherever its main thread is in its wait for the stop. The handler takes no lock that the main thread it interrupts
may hold (stderr's: its lines are another thread's): a second signal inside the first's stop.set(), or a signal
inside a log line of the main thread, does what it does anywhere else."""

from __future__ import annotations

import os
import signal
import subprocess

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from tests.server_process import ServerProcess
from tests.waiting import wait_until

TIMEOUT_S = 30
COMPILE_S = 120  # a call that may compile kernels first (a cold numba cache, a loaded host)
DIM = 4
IDS = np.arange(1, 300, dtype=np.uint64)


def push(stub, value: float) -> None:
    grads = np.full((len(IDS), DIM), value, dtype="<f4")
    stub.Push(ps_pb2.PushRequest(table="t", ids=IDS.astype("<u8").tobytes(), grads=grads.tobytes(), dim=DIM),
              timeout=COMPILE_S)  # fmt: skip


def pull(address: str) -> np.ndarray:
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        reply = stub.Pull(ps_pb2.PullRequest(table="t", ids=IDS.astype("<u8").tobytes()), timeout=TIMEOUT_S)
    return np.frombuffer(reply.rows, dtype="<f4").reshape(len(IDS), DIM)


def trained_server(data_dir, gate) -> tuple[ServerProcess, np.ndarray]:
    """A server whose stop waits for `gate`, with table t pushed 3 times (acknowledged, not flushed: it flushes every
    hour), and its rows."""
    server = ServerProcess(
        data_dir, "--flush-interval-s", "3600", launcher=("-m", "tests.slow_start", str(gate), "stop")
    )
    address = server.started()
    assert address, server.output()
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        stub.CreateTable(ps_pb2.CreateTableRequest(spec=ps_pb2.TableSpec(name="t", dim=DIM)), timeout=TIMEOUT_S)
        for value in (0.5, -0.25, 0.125):
            push(stub, value)
    return server, pull(address)


def restarted_rows(data_dir) -> np.ndarray:
    server = ServerProcess(data_dir)
    address = server.started()
    assert address, server.output()
    try:
        return pull(address)
    finally:
        server.stop_cleanly()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_while_stopping_exits_at_once_and_the_journal_has_every_push(tmp_path, sig):
    data_dir, gate = tmp_path / "d", tmp_path / "gate"
    server, rows = trained_server(data_dir, gate)
    try:
        server.proc.send_signal(sig)
        wait_until(lambda: f"received {sig.name}, shutting down" in server.output(), TIMEOUT_S, "the first signal")
        server.proc.send_signal(sig)
        assert server.proc.wait(TIMEOUT_S) == 128 + sig, server.output()
    finally:
        server.proc.kill()
    out = server.output()
    assert f"received {sig.name} again while stopping: exiting now, without writing the rest of its rows" in out, out
    assert "stopped cleanly" not in out and "Traceback" not in out, out
    np.testing.assert_array_equal(restarted_rows(data_dir), rows)


def test_a_second_signal_does_not_cut_short_a_stop_that_writes_the_only_copy(tmp_path):
    """The journal segment deleted under the server: the second SIGTERM is logged, the stop goes on and exits 0
    once its flush is done, and a restart has every acknowledged push."""
    data_dir, gate = tmp_path / "d", tmp_path / "gate"
    server, rows = trained_server(data_dir, gate)
    try:
        for name in os.listdir(data_dir / "journal"):
            os.remove(data_dir / "journal" / name)
        wait_until(lambda: "is in RocksDB now" in server.output(), TIMEOUT_S, "the journal to find its segment gone")
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "received SIGTERM, shutting down" in server.output(), TIMEOUT_S, "the first signal")
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "received SIGTERM again: the stop goes on" in server.output(), TIMEOUT_S, "the second")
        assert server.proc.poll() is None, server.output()
        gate.touch()
        assert server.proc.wait(TIMEOUT_S) == 0, server.output()
    finally:
        server.proc.kill()
    np.testing.assert_array_equal(restarted_rows(data_dir), rows)


def test_a_stdin_closed_while_stopping_is_no_second_signal(tmp_path):
    """--stop-with-stdin: the parent that started the server dies while the stop it asked for runs (a local cluster
    whose owner was killed): the stop goes on to its end, exit 0, instead of ending at once."""
    data_dir, gate = tmp_path / "d", tmp_path / "gate"
    server = ServerProcess(data_dir, "--stop-with-stdin", launcher=("-m", "tests.slow_start", str(gate), "stop"),
                           stdin=subprocess.PIPE)  # fmt: skip
    try:
        assert server.started(), server.output()
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "received SIGTERM, shutting down" in server.output(), TIMEOUT_S, "the first signal")
        server.proc.stdin.close()
        wait_until(lambda: "standard input closed" in server.output(), TIMEOUT_S, "the stdin thread to see it")
        assert server.proc.poll() is None, server.output()
        gate.touch()
        assert server.proc.wait(TIMEOUT_S) == 0, server.output()
    finally:
        server.proc.kill()
    assert "again while stopping" not in server.output()


# ps-server whose main thread looks for the stop without pause (ps.server_run.SIGNAL_CHECK_S 0) while another thread
# keeps asking for Python's lock: the main thread is then often paused inside the look itself, where a signal that
# arrives meanwhile has its handler run once the thread goes on
SPINNING = ("-c", "import sys, threading\nimport ps.server_run\nfrom ps.__main__ import main\n\n\ndef busy():\n"
            "    while True:\n        sum(range(100))\n\n\nps.server_run.SIGNAL_CHECK_S = 0\n"
            "threading.Thread(target=busy, daemon=True).start()\nsys.exit(main(sys.argv[1:]))")  # fmt: skip


def test_a_sigterm_stops_a_serving_shard_wherever_its_main_thread_waits_for_it(tmp_path):
    """The first SIGTERM's handler runs in the main thread wherever that thread is in its wait for the stop, and
    sets the stop there (a StopFlag: no lock, which the interrupted wait could hold): the stop runs, exit 0."""
    for run in range(5):  # a SIGTERM each: such a wait hangs in most of them
        server = ServerProcess(tmp_path / f"d{run}", launcher=SPINNING)
        assert server.started(), server.output()
        server.stop_cleanly()  # AssertionError with every thread's stack if it hangs
        assert "stopped cleanly" in server.output(), server.output()


class _Fake:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


def _server(lost: bool = False, saving: bool = False) -> _Fake:
    journal = _Fake(seems_lost=lambda: lost)
    return _Fake(shard=_Fake(journal=journal, saving_checkpoint=saving))


@pytest.fixture
def exits(monkeypatch):
    """os._exit recorded instead of taken: the codes it was called with."""
    codes: list[int] = []

    def record(code: int) -> None:
        codes.append(code)

    monkeypatch.setattr(os, "_exit", record)
    return codes


@pytest.fixture
def said():
    """The ps-signals thread's HandlerWork, started."""
    from ps.signalsafe import HandlerWork

    work = HandlerWork("ps-signals-test")
    work.start()
    return work


def test_the_second_signal_exits_unless_a_lost_journal_or_a_save_needs_the_stop(exits, capfd, said):
    from ps.server_run import _exit_now_unless_needed

    _exit_now_unless_needed(_server(), 3, signal.SIGINT, said, False)
    err = capfd.readouterr().err
    assert exits == [130] and "shard 3: received SIGINT again while stopping: exiting now" in err
    assert "ps-warm-up-" not in err, err  # no warm-up runs: no scratch directory to leave
    lost = _exit_now_unless_needed(_server(lost=True), 3, signal.SIGTERM, said, True)
    assert "must write the rows RocksDB lacks" in lost
    assert "a checkpoint is being saved" in _exit_now_unless_needed(_server(saving=True), 3, signal.SIGTERM, said, True)
    assert exits == [130]


def test_a_second_signal_says_a_warm_up_may_leave_its_scratch_directory_only_while_one_runs(exits, capfd, said):
    """Exiting now, during the stop or after it, cuts a warm-up that runs short: its scratch directory may be left,
    and the last line says so; without a warm-up running (none, or ended) it says nothing of one."""
    from ps.server_run import _exit_now_after_the_stop, _exit_now_unless_needed

    scratch = "(the warm-up's scratch directory, ps-warm-up-*, may be left in the temporary directory)"
    for warm_up_running in (True, False):
        _exit_now_unless_needed(_server(), 1, signal.SIGTERM, said, warm_up_running)
        during = capfd.readouterr().err
        _exit_now_after_the_stop(1, signal.SIGTERM, 0, said, warm_up_running)
        after = capfd.readouterr().err
        assert "which the next start replays" in during and "its rows all written" in after, (during, after)
        assert (scratch in during, scratch in after) == (warm_up_running, warm_up_running), (during, after)
    _exit_now_after_the_stop(1, signal.SIGINT, 1, said, False)
    assert "its stop failed, as said above\n" in capfd.readouterr().err
    assert exits == [143, 143, 143, 143, 1]


def test_the_second_signal_exits_even_where_stderr_is_closed(exits, monkeypatch, said):
    """stderr's reader gone (`ps-server ... | tee log`, tee stopped by the same Ctrl-C): the write fails, the exit
    still comes, and nothing is raised into the stop the handler interrupted."""
    from ps.server_run import _exit_now_unless_needed

    def closed(fd: int, data: bytes) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(os, "write", closed)
    _exit_now_unless_needed(_server(), 0, signal.SIGTERM, said, False)
    assert exits == [143]


# ps-server whose first signal's line is slow to write (a stderr that keeps it 0.3 s), and the second SIGTERM comes
# while it is being written: sent by the ps-signals thread as it begins the line, once the main thread has counted it
SECOND_SIGNAL_DURING_THE_FIRST_LINE = (
    "-c",
    """import os, signal, sys, time
import ps.server_run
from ps.__main__ import main

shutting_down = ps.server_run._shutting_down


def slow_line(sig, progress, ends_start):
    os.kill(os.getpid(), signal.SIGTERM)
    while len(progress.stop.received) < 2:  # the second signal's handler has begun, in the main thread
        time.sleep(0.001)
    time.sleep(0.3)
    shutting_down(sig, progress, ends_start)


ps.server_run._shutting_down = slow_line
sys.exit(main(sys.argv[1:]))
""",
)


def test_a_second_signal_exits_after_the_first_signals_line_is_written(tmp_path):
    """The second SIGTERM's handler exits (143) once the line the first one handed to the ps-signals thread is
    written (EXIT_SAID_WAIT_S at most): its own line comes after it, not instead of it."""
    server = ServerProcess(tmp_path / "d", launcher=SECOND_SIGNAL_DURING_THE_FIRST_LINE)
    try:
        assert server.started(), server.output()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(TIMEOUT_S) == 143, server.output()
    finally:
        server.proc.kill()
    out = server.output()
    first, second = out.find("received SIGTERM, shutting down"), out.find("received SIGTERM again while stopping")
    assert 0 <= first < second, out


# ps-server whose stop flag sends it a second SIGTERM from inside the first set(), the first signal's handler's
SIGNAL_INSIDE_SET = (
    "-c",
    """import os, signal, sys, time
import ps.server_run
from ps.__main__ import main


class Probe(ps.server_run.StopFlag):
    sent = False

    def set(self, sig=None):
        super().set(sig)
        if not Probe.sent:
            Probe.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # its handler runs meanwhile, in the main thread


ps.server_run.StopFlag = Probe
sys.exit(main(sys.argv[1:]))
""",
)


def test_a_second_signal_while_the_stop_is_being_set_exits_at_once(tmp_path):
    """The second SIGTERM's handler runs inside the first one's stop.set(), the first signal counted and the first
    handler not yet past it: it exits as a second signal does, and waits for nothing the first one holds."""
    server = ServerProcess(tmp_path / "d", launcher=SIGNAL_INSIDE_SET)
    assert _exit_code_after_a_sigterm(server) == 143, server.output()
    assert "received SIGTERM again while stopping: exiting now" in server.output(), server.output()


# ps-server whose stderr behaves as its io.BufferedWriter does (a write that the thread inside one enters again
# raises RuntimeError), and whose main thread, once the handlers are in place, is sent a SIGTERM inside a log line
# (Server.start's first: the shard about to serve, its start is stopped)
STDERR_IN_USE = (
    "-c",
    """import logging, os, signal, sys, threading, time
import ps.server
from ps.__main__ import main


class Buffered:
    def __init__(self, stream):
        self.stream, self.lock, self.owner = stream, threading.Lock(), None

    def write(self, text):
        if self.owner == threading.get_ident():
            raise RuntimeError("reentrant call inside stderr")
        with self.lock:
            self.owner = threading.get_ident()
            try:
                if "PROBE" in text:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.5)  # its handler runs here
                return self.stream.write(text)
            finally:
                self.owner = None

    def __getattr__(self, name):
        return getattr(self.stream, name)


sys.stderr = Buffered(sys.stderr)
start = ps.server.Server.start


def start_saying(self, *args, **kwargs):
    logging.getLogger("probe").warning("PROBE")
    return start(self, *args, **kwargs)


ps.server.Server.start = start_saying
sys.exit(main(sys.argv[1:]))
""",
)


def test_a_signal_inside_a_log_line_of_the_main_thread_is_said_and_stops_the_shard(tmp_path):
    """The handler writes nothing itself: its line comes from another thread, once the main thread's is done. (The
    signal comes as the shard is about to serve: it ends the start, as its line says.)"""
    server = ServerProcess(tmp_path / "d", launcher=STDERR_IN_USE)
    try:
        assert server.proc.wait(TIMEOUT_S) == 0, server.output()
    finally:
        server.proc.kill()
    out = server.output()
    assert "received SIGTERM, shutting down (the start stops now: about to serve" in out, out
    assert "stopped during its start (about to serve" in out and "listening on" not in out, out
    assert "Logging error" not in out and "Traceback" not in out, out


# ps-server whose ps-signals thread never gets through a line (a logging call of that thread that never returns)
SIGNAL_LINE_STUCK = (
    "-c",
    """import logging, sys, threading, time
import ps.server
from ps.__main__ import main


class Stuck(logging.Filter):
    def filter(self, record):
        while threading.current_thread().name == "ps-signals":
            time.sleep(1)
        return True


logging.getLogger("ps.server").addFilter(Stuck())
sys.exit(main(sys.argv[1:]))
""",
)


def test_a_signal_whose_line_never_gets_written_still_stops_the_shard(tmp_path):
    """The stop is the handler's, not its line's: it waits SAID_WAIT_S at most for that line, then runs."""
    server = ServerProcess(tmp_path / "d", launcher=SIGNAL_LINE_STUCK)
    assert _exit_code_after_a_sigterm(server) == 0, server.output()
    assert "stopped cleanly" in server.output(), server.output()


def _exit_code_after_a_sigterm(server: ServerProcess) -> int:
    """Starts the server, stops it with one SIGTERM (ServerProcess.stop: an AssertionError with every thread's
    stack if it does not exit) and returns its exit code."""
    try:
        assert server.started(), server.output()
        server.stop()
        return server.proc.returncode
    finally:
        server.proc.kill()

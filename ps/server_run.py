"""serve(): a ps-server process run until SIGTERM, SIGINT or the end of its standard input: its signals' handler
and lines, the exit of a second signal, the lines it says as it starts, serves and stops, and how its stop went."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time

from ps.diskfull import DiskFullError
from ps.engine.startup import StartProgress, StartStopped
from ps.engine.warmup import warm_up
from ps.errors import DataDirLostError, ShardNeedsRestartError
from ps.listen_address import host_port
from ps.server import Server
from ps.server_config import ServerConfig
from ps.signalsafe import HandlerWork, StopFlag
from ps.terminate import SIGNAL_CHECK_S

log = logging.getLogger("ps.server")  # the logger of the server's lines, whichever module says them


SAID_WAIT_S = 5.0  # a stop's lines wait this long at most for the signal's line (logged by another thread)
EXIT_SAID_WAIT_S = 1.0  # a second signal's exit waits this long at most for the lines handed over before it


def _stop_at_end_of_stdin(stop: StopFlag) -> None:
    """(thread) Once standard input is closed, SIGTERM to the main thread: the stop is a SIGTERM's in every way,
    a read-only phase of the start (--verify-on-start) ended where it is too. Nothing if serve's stop is set
    already (a second SIGTERM would end that stop at once)."""
    try:  # the raw descriptor: a daemon thread blocked inside sys.stdin's buffer aborts interpreter shutdown
        while os.read(0, 4096):
            pass
    except OSError:  # no usable stdin: treat it as closed
        pass
    if stop.is_set():
        log.info("standard input closed (the process that started this server is gone); the stop goes on")
        return
    log.info("standard input closed (the process that started this server is gone): stopping as on SIGTERM")
    signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)


def serve(config: ServerConfig, stop_with_stdin: bool = False) -> None:
    """Runs a shard until SIGTERM or SIGINT (or, with stop_with_stdin, until standard input is closed: the
    parent that holds its other end is gone). Prints `starting on HOST:PORT` once it listens (health NOT_SERVING,
    every call UNAVAILABLE) and `listening on HOST:PORT` once its calls are served: health SERVING then, or, under
    --memory-bytes, once the warm-up that starts then ends (_warm_up_then_serve). A stop during the start, up to the
    instant the calls are served, ends it at its next safe point (ps.engine.startup) and returns, saying so."""
    stop = StopFlag()  # on_signal sets it, counting the signals: the start's next check and the wait see it at once
    progress = StartProgress(stop)
    serving: list[Server] = []  # the server, once it serves
    stopped_with: list[int] = []  # the stop's exit code, once the shard is stopped (a warm-up may still end)
    warming_up = threading.Event()  # set while a warm-up runs, its scratch dir in place (read by on_signal: no lock)
    said = HandlerWork("ps-signals")  # on_signal's log lines
    said.start()

    def on_signal(signum, frame):
        """(main thread, wherever it is) Takes no lock, as the code it interrupted may hold it (HandlerWork): sets
        `stop` (a StopFlag), tells a second signal by its count, and hands its log lines to the ps-signals thread;
        a second signal that exits waits for those lines first, a bounded time (_exit_now)."""
        sig = signal.Signals(signum)
        stop.set(sig)
        again = len(stop.received) > 1
        if again and stopped_with:  # the shard is closed: nothing is left to write
            _exit_now_after_the_stop(config.shard_id, sig, stopped_with[0], said, warming_up.is_set())
            return
        if again and serving:  # a signal during the stop: exit now where the journal has what the stop would write
            why_not = _exit_now_unless_needed(serving[0], config.shard_id, sig, said, warming_up.is_set())
            said.run(functools.partial(log.warning, "received %s again: the stop goes on: %s", sig.name, why_not))
            return
        ends_start = progress.stop_asked()  # before the calls are served: the start stops (StartProgress.finish)
        said.run(functools.partial(_shutting_down, sig, progress, ends_start))
        if progress.interruptible and not again:  # a read-only phase: stopped where it is (once: a second signal
            raise StartStopped(progress.describe())  # must not interrupt the first one's way out)

    signal.signal(signal.SIGTERM, on_signal)  # before the port is announced: a SIGTERM right after is clean
    signal.signal(signal.SIGINT, on_signal)
    if stop_with_stdin:
        threading.Thread(target=_stop_at_end_of_stdin, args=(stop,), name="ps-stdin", daemon=True).start()
    where = f"ps-server shard {config.shard_id}/{config.num_shards}"
    warms = config.memory_bytes is not None  # its fixed footprint in place before data arrives (ps.engine.warmup)
    until = "its calls are served and its warm-up of the compiled kernels ends" if warms else "it serves"
    try:
        server = Server(config, progress, on_listening=lambda server: _say(
            f"{where} starting on {host_port(config.host, server.port)} (data dir {config.data_dir}; health says NOT_SERVING, "
            f"and what the start is doing, until {until})"))  # fmt: skip
        port = server.start(warming=warms)
    except StartStopped as e:
        said.drained(SAID_WAIT_S)  # the signal's line first
        print(_stopped_start_line(where, e, progress.phase, config.restore_dir), file=sys.stderr, flush=True)
        return
    serving.append(server)
    _say(
        f"{where} listening on {host_port(config.host, port)} (data dir {config.data_dir}: {server.shard.describe_start()})"
    )
    warming = None
    if warms:
        warming_up.set()
        warming = threading.Thread(target=_warm_up_then_serve, args=(server, stop, warming_up), name="ps-warm-up",
                                   daemon=True)  # fmt: skip
        warming.start()
    while not stop.is_set():  # polled in slices (a SIGTERM another thread received: ps.terminate)
        time.sleep(SIGNAL_CHECK_S)
    said.drained(SAID_WAIT_S)  # the signal's line first
    code = stop_server(server, config.shard_id)
    stopped_with.append(code)  # before serving is cleared: a second signal from here on exits now (on_signal)
    serving.clear()
    if warming is not None and warming.is_alive():  # it ends after its current step, its scratch dir removed
        log.info("waiting for the warm-up of the compiled kernels to end its current step")
        while warming.is_alive():  # in slices: a second signal exits now (on_signal)
            warming.join(SIGNAL_CHECK_S)
    if code:
        raise SystemExit(code)


def _warm_up_then_serve(server: Server, stop: StopFlag | None, running: threading.Event | None = None) -> None:
    """(ps-warm-up thread) The warm-up, then running cleared (its scratch dir is removed) and Server.warmed():
    health SERVING however the warm-up ended (a failed one is logged by warm_up, and the first requests load the
    kernels instead), unless the shard is stopping or NOT_SERVING for good (its data dir or journal segment deleted
    under it, or broken): then it stays NOT_SERVING."""
    try:
        warm_up(stop)
    finally:
        if running is not None:
            running.clear()
        server.warmed()


def _exit_now(message: str, code: int, said: HandlerWork) -> None:
    """Exits with code, message the last line on stderr, once the lines handed to `said` before are written
    (EXIT_SAID_WAIT_S at most: its thread may wait for a lock that the main thread, interrupted, holds). Runs in a
    signal handler: takes no lock, and raises nothing."""
    said.drained(EXIT_SAID_WAIT_S)
    try:  # os.write, not print: no buffer a signal could find half written, and a closed stderr raises nothing
        os.write(2, message.encode())
    except OSError:
        pass
    finally:
        os._exit(code)


def _exit_now_after_the_stop(shard_id: int, sig: signal.Signals, code: int, said: HandlerWork,
                             warm_up_running: bool) -> None:  # fmt: skip
    """A second SIGTERM or SIGINT once the shard is stopped (its warm-up may still be ending: warm_up_running):
    exits at once (_exit_now), with the stop's exit code if it failed, else 128 + the signal's number."""
    how = ("the shard was stopped first, its rows all written" if not code else
           "its stop failed, as said above")  # fmt: skip
    _exit_now(f"ps-server shard {shard_id}: received {sig.name} again after the stop: exiting now; {how}"
              f"{_scratch_note(warm_up_running)}\n", code or 128 + sig, said)  # fmt: skip


def _scratch_note(warm_up_running: bool) -> str:
    """What an exit now leaves of a warm-up that runs: its scratch directory."""
    if not warm_up_running:
        return ""
    return " (the warm-up's scratch directory, ps-warm-up-*, may be left in the temporary directory)"


def _exit_now_unless_needed(server: Server, shard_id: int, sig: signal.Signals, said: HandlerWork,
                            warm_up_running: bool) -> str:  # fmt: skip
    """A second SIGTERM or SIGINT while a serving shard stops: the process exits at once (_exit_now; exit code 128
    + the signal's number), as a kill -9 would end it, and the next start replays the journal (a warm-up that runs,
    warm_up_running, may leave its scratch directory: the line says so). Not while what the
    stop writes is the only copy of some pushes (the journal's segment or the data dir deleted:
    Journal.seems_lost), nor while a checkpoint is being saved (its folder would be left half written): then the
    stop goes on, and this returns why, for the log. Runs in a signal handler: takes no lock, and raises
    nothing."""
    shard = server.shard
    why_not = ""
    if shard is not None and shard.journal.seems_lost():
        why_not = ("it must write the rows RocksDB lacks, as the journal's segment or the data dir was deleted: "
                   "SIGKILL would lose the pushes since")  # fmt: skip
    elif shard is not None and shard.saving_checkpoint:
        why_not = ("a checkpoint is being saved, and cut short it would leave its folder half written; it ends by "
                   "itself, or SIGKILL stops everything")  # fmt: skip
    if not why_not:
        _exit_now(f"ps-server shard {shard_id}: received {sig.name} again while stopping: exiting now, without "
                  "writing the rest of its rows to RocksDB; every acknowledged push is in its journal, which the next "
                  f"start replays{_scratch_note(warm_up_running)}\n", 128 + sig, said)  # fmt: skip
    return why_not


def _shutting_down(sig: signal.Signals, progress: StartProgress, ends_start: bool) -> None:
    """(ps-signals thread) The line of a signal that asked for the stop; ends_start: StartProgress.stop_asked's."""
    log.info("received %s, shutting down%s", sig.name, _stop_note(progress, ends_start))


def _stop_note(progress: StartProgress, ends_start: bool) -> str:
    """What a stop asked for does to the start (ends_start: it ends it), for the log line that says it was asked
    for."""
    if not ends_start:
        return ""
    if progress.phase == "restoring":
        return (f" (the start stops now, its restore part way: {progress.describe()}; the next start with the same "
                "--restore starts the restore over)")  # fmt: skip
    return f" (the start stops now: {progress.describe()})"


def _stopped_start_line(where: str, stopped: StartStopped, phase: str, restore_dir: str | None) -> str:
    """The line that says a start was stopped (StartStopped) in phase: what the data dir is fit for now."""
    if phase == "restoring":  # stopped inside the restore: the dir is marked until a restore finishes
        return (f"{where}: stopped during its start ({stopped}); start it again with the same --restore "
                f"{restore_dir}: a restore stopped part way leaves its data dir marked, and that start starts it "
                "over (a start without that --restore is refused)")  # fmt: skip
    return f"{where}: stopped during its start ({stopped}); its data dir is as the next start can use"


def _say(line: str) -> None:
    """line on standard output; a reader that is gone (a killed parent) leaves the rest of the lines unsaid."""
    try:
        print(line, flush=True)
    except BrokenPipeError:  # whoever read this server's output is gone: serve, and stop as told
        log.warning("standard output is a pipe nobody reads any more; its lines are dropped")
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of the process)


def stop_server(server: Server, shard_id: int) -> int:
    """Stops a serving shard and says how it went: 0, or 1 when its disk was too full to write its last rows
    (the journal holds them: nothing acknowledged is lost), its data dir was deleted under it (DataDirLostError:
    the message says what was lost), or it broke (a push journaled but applied in part: its last rows stay
    unwritten, the journal replays them)."""
    try:
        server.stop()
        broken = server.shard.guard.broken if server.shard is not None else ""
    except ShardNeedsRestartError as e:  # broken by a push that failed while the stop flushed
        broken = str(e)
    except DataDirLostError as e:
        print(f"ps-server shard {shard_id}: {e}", file=sys.stderr, flush=True)
        return 1
    except DiskFullError as e:
        print(f"ps-server shard {shard_id}: stopped without writing its last rows to RocksDB: {e}. Every acknowledged "
              "push is in its journal, replayed at the next start once the disk has room", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    if broken:
        print(f"ps-server shard {shard_id}: stopped without writing its last rows to RocksDB (its journal holds every "
              f"acknowledged push and replays them at the next start): {broken}", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    print(f"ps-server shard {shard_id}: stopped cleanly", file=sys.stderr, flush=True)
    return 0

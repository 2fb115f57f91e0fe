"""Server process lifecycle: listen (ParameterServer + health), build the shard meanwhile, serve, stop cleanly."""

from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from ps.accel.threadnames import name_os_thread
from ps.engine.shard import Shard
from ps.engine.startup import StartProgress, StartStopped
from ps.engine.warmup import warm_up
from ps.errors import SHARD_STARTING, DataDirLostError, DiskFullError, ShardNeedsRestartError, StorageError
from ps.health import NOT_SERVING, SERVICE_NAME, SERVING, HealthServicer
from ps.health import add_to_server as add_health_to_server
from ps.metrics import ServerMetrics
from ps.replies import reply_room_bytes
from ps.security import (
    READ_ONLY_METHODS,
    READ_TOKEN_FILE,
    TOKEN_FILE,
    TokenCheck,
    read_token,
    readable_by_all,
    server_credentials,
)
from ps.server_config import ServerConfig
from ps.service import ParameterServerServicer, StartGate
from ps.storage.verify import verify_data_dir
from ps.terminate import SIGNAL_CHECK_S, HandlerWork, StopFlag

log = logging.getLogger("ps.server")

CALLS_DRAIN_S = 30.0  # a stop waits this long at most for the handlers of calls gRPC cancelled to return
SAID_WAIT_S = 5.0  # a stop's lines wait this long at most for the signal's line (logged by another thread)
EXIT_SAID_WAIT_S = 1.0  # a second signal's exit waits this long at most for the lines handed over before it


def grpc_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Channel/server options shared by both ends: message limits raised above gRPC's 4 MiB default."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


class Server:
    """One shard: a Shard behind a gRPC server, which listens while the Shard is built. Server(config) binds the
    port and the metrics port (a taken one fails before the data dir is looked at), starts listening, then builds
    the Shard (verify, checks, RocksDB, restore, journal replay: ps.engine.startup's phases, told to `progress`).
    Meanwhile health says NOT_SERVING (with what the start is doing, ps.health), every ParameterServer call is
    UNAVAILABLE saying the same (ps.service.StartGate), and the metrics port serves the start's gauges. A start
    that fails, or is stopped (StartStopped), stops listening before it raises. `start()` then serves: SERVING;
    it returns the port. `start(warming=True)` serves the calls but leaves health NOT_SERVING, saying the kernels
    are loading, until `warmed()`: a readiness probe sends traffic once the compiled kernels are in place."""

    def __init__(self, config: ServerConfig, progress: StartProgress | None = None,
                 on_listening: Callable[[Server], None] | None = None):  # fmt: skip
        """progress: where the start says what it does, and its stop (None: a new one). on_listening: called with
        this server (its port and metrics_port set, no shard yet) once it listens, before the data dir is looked
        at."""
        if config.threads < 1:  # before anything is opened; ThreadPoolExecutor's own message names no setting
            raise ValueError(f"threads (--threads) must be >= 1, got {config.threads}")
        self.config = config
        self.progress = progress if progress is not None else StartProgress()
        root = config.checkpoint_root
        if root and os.path.isdir(root) and not os.access(root, os.W_OK | os.X_OK):
            log.warning("--checkpoint-root %s is not writable by this user: checkpoint saves (ps-worker checkpoint "
                        "save, export) will be refused until it is", root)  # fmt: skip
        self._token = read_token(config.auth_token_file) if config.auth_token_file else None
        self._read_token = read_token(config.read_token_file, READ_TOKEN_FILE) if config.read_token_file else None
        for what, path in ((TOKEN_FILE, config.auth_token_file), (READ_TOKEN_FILE, config.read_token_file),
                           ("TLS key (--tls-key)", config.tls_key)):  # fmt: skip
            warning = readable_by_all(path) if path else None
            if warning:
                log.warning("%s %s", what, warning)
        self.metrics = ServerMetrics(self.progress) if config.metrics_port is not None else None
        refused = self.metrics.refused_unread if self.metrics is not None else None
        interceptors = [TokenCheck(self._token, self._read_token, refused)] if self._token else []
        self._credentials = (
            server_credentials(config.tls_cert, config.tls_key, config.tls_ca) if config.tls_cert else None
        )  # read before anything starts: a missing key file fails here, with its name
        self._grpc = grpc.server(
            ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="ps-rpc", initializer=name_os_thread),
            interceptors=interceptors,
            # a call past the threads' and the queue's calls is refused at once (RESOURCE_EXHAUSTED, OVERLOADED)
            maximum_concurrent_rpcs=config.threads + config.max_queued_calls,
            # no SO_REUSEPORT: a second server on a taken port must fail, not silently share its traffic
            options=grpc_options(config.max_message_bytes) + [("grpc.so_reuseport", 0)],
        )
        self.health = HealthServicer(starting=self._starting, lost=self._lost)
        self._warming_since: float | None = None  # time.monotonic() of start(warming=True), until warmed()
        self._health_lock = threading.Lock()  # SERVING from warmed() never undoes _not_serving()'s NOT_SERVING
        self._gone = False  # _not_serving() was called: NOT_SERVING for good
        for name in ("", SERVICE_NAME):
            self.health.set(name, NOT_SERVING)
        self._gate = StartGate(lambda: self._starting() or "")
        self._servicer: ParameterServerServicer | None = None  # once start() serves the shard
        self._grpc.add_generic_rpc_handlers((self._gate,))
        add_health_to_server(self.health, self._grpc)
        self.port = self._bind()
        self.metrics_port = None
        self.shard: Shard | None = None
        try:
            self._listen()
            if on_listening is not None:
                on_listening(self)
            self.shard = self._build_shard()
            self.progress.enter("ready")  # a stop asked for meanwhile: the shard just built is closed cleanly
        except BaseException:
            try:
                if self.shard is not None:
                    self.shard.close()
            finally:
                self._stop_listening()
            raise

    def _starting(self) -> str | None:
        """What a shard that is starting says it does, its warm-up included; None once it serves."""
        if self.progress.starting:
            return f"shard {self.config.shard_id} {SHARD_STARTING}: {self.progress.describe()}"
        since = self._warming_since
        if since is None or self._gone:
            return None
        return (f"shard {self.config.shard_id} {SHARD_STARTING}: loading its compiled kernels (warm-up, "
                f"{time.monotonic() - since:.0f} s so far; calls are served meanwhile)")  # fmt: skip

    def _lost(self) -> str | None:
        """What was deleted under the shard (ps.engine.writeguard: it takes no writes), or None."""
        shard = self.shard
        return (shard.guard.lost() or None) if shard is not None and hasattr(shard, "guard") else None

    def _bind(self) -> int:
        c = self.config
        address = host_port(c.host, c.port)
        # gRPC listens on what it can of a host's addresses: localhost's ::1 alone where another process holds
        # 127.0.0.1:PORT, whose clients would reach that process. A port taken on any of them is refused first.
        taken = bind_problems(c.host, c.port, only_in_use=True) if c.port else []
        try:
            if taken:
                port = 0
            elif self._credentials is not None:
                port = self._grpc.add_secure_port(address, self._credentials)
            else:
                port = self._grpc.add_insecure_port(address)
        except RuntimeError:  # grpc raises this when the port is taken or the host is not an address
            port = 0
        if not port:  # gRPC's message says only "Failed to bind": binds of our own find why
            why = (taken or bind_problems(c.host, c.port) or
                   ["gRPC could not bind it, though a plain socket can (the port taken meanwhile?)"])  # fmt: skip
            raise OSError(f"cannot listen on {address} (--host, --port): {why[0]}")
        return port

    def _listen(self) -> None:
        """Serves the metrics port (if any), then the gRPC port: health NOT_SERVING, calls UNAVAILABLE."""
        c = self.config
        if self.metrics is not None:  # the metrics port is guarded as the gRPC port is (ps.metrics)
            tls = (c.tls_cert, c.tls_key, c.tls_ca) if c.tls_cert else None
            try:
                self.metrics_port = self.metrics.serve(c.metrics_port, c.host, tls, self._token, self._read_token)
            except OSError as e:
                raise OSError(f"cannot listen on {host_port(c.host, c.metrics_port)} (--metrics-port): "
                              f"{e.strerror or e}; is the port in use?") from e  # fmt: skip
            log.info("Prometheus metrics on %s://%s/metrics%s", "https" if tls else "http",
                     host_port(c.host, self.metrics_port), " (bearer token required)" if self._token else "")  # fmt: skip
        if self._read_token:
            log.info("a read-only token (--read-token-file) is admitted to %s%s", ", ".join(READ_ONLY_METHODS),
                     "" if self.metrics is None else " and /metrics")  # fmt: skip
        self._grpc.start()
        warning = exposure_warning(c.host, self._credentials is not None, self._token is not None)
        if warning:
            log.warning("%s", warning)

    def _build_shard(self) -> Shard:
        """--verify-on-start's reading (read-only: a stop may end it anywhere), then the Shard."""
        c = self.config
        if c.verify_on_start and os.path.isdir(c.data_dir) and os.listdir(c.data_dir):
            with self.progress.read_only("verifying"):
                lines, damaged = verify_data_dir(c.data_dir, restoring=c.restore_dir)
            if damaged:
                found = "\n".join(line for line in lines if not line.startswith("ok "))
                raise StorageError(f"{c.data_dir} is damaged (--verify-on-start); refusing to start:\n{found}")
        return Shard(c, self.progress)

    def _stop_listening(self) -> None:
        """After a failed or stopped start: both ports closed, and no gRPC thread left running a call."""
        self.health.enter_graceful_shutdown()
        self._grpc.stop(None).wait()
        if self.metrics is not None:
            self.metrics.close()

    def start(self, warming: bool = False) -> int:
        """Serves the shard built: the calls go to it, health says SERVING (with warming: once warmed() is called),
        the metrics port serves its figures."""
        servicer = ParameterServerServicer(self.shard, self.metrics, max_reply_bytes=self.config.max_message_bytes,
                                           reply_bytes=reply_room_bytes(self.config.reply_bytes,
                                                                        self.config.memory_bytes),
                                           reply_read_timeout_s=self.config.reply_read_timeout_s)  # fmt: skip
        self._servicer = servicer
        if self.metrics is not None:
            self.metrics.attach(self.shard, servicer.replies)
        self._warming_since = time.monotonic() if warming else None
        self._gate.open(servicer)
        self.progress.finish()
        if not warming:
            self._serving()
        self.shard.guard.listeners.append(self._not_serving)  # its data dir deleted under it, or broken
        if self.shard.journal.lost or self.shard.guard.broken:  # found before the listener was there
            self._not_serving()
        return self.port

    def warmed(self) -> None:
        """The warm-up that start(warming=True) waits for ended, however it went: health SERVING, unless the shard
        is NOT_SERVING for good meanwhile (_not_serving) or stopping (health ignores it then)."""
        self._serving()
        self._warming_since = None  # after: a Check that read NOT_SERVING before still finds why

    def _serving(self) -> None:
        with self._health_lock:
            if not self._gone:
                for name in ("", SERVICE_NAME):
                    self.health.set(name, SERVING)

    def _not_serving(self) -> None:
        """Health NOT_SERVING for good: the shard found its data dir or journal segment deleted under it, or
        broke (a journaled push only partly applied: ps.engine.writeguard)."""
        with self._health_lock:
            self._gone = True
            for name in ("", SERVICE_NAME):
                self.health.set(name, NOT_SERVING)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stops taking requests, lets running ones finish (up to grace_s), then flushes and closes the store.
        Waits of training jobs end first (UNAVAILABLE: their clients send them again, to the restarted shard), as
        they would outlast the grace; gRPC cancels what is left at its end (clients send that again too), and the
        store is closed once the handlers of those calls returned (up to CALLS_DRAIN_S more)."""
        self.health.enter_graceful_shutdown()
        self.shard.jobs.close()
        self._grpc.stop(grace_s).wait()
        if self._servicer is not None:  # gRPC cancelled what was left; the handlers of those calls may still run
            running = self._servicer.calls.wait_done(CALLS_DRAIN_S)
            if running:
                log.warning("%d calls still running %g s after the stop (a checkpoint being written?): closing the "
                            "store under them, they fail", running, CALLS_DRAIN_S)  # fmt: skip
            self._servicer.refusals.close()  # the counts of refusals not logged yet, before the log ends
            self._servicer.replies.close()  # its watch of unread replies: gRPC ended their calls
        if self.metrics is not None:
            self.metrics.close()
        self.shard.close()

    def wait(self) -> None:
        self._grpc.wait_for_termination()


def host_port(host: str, port: int) -> str:
    """HOST:PORT as gRPC takes it: an IPv6 address in brackets ([::1]:5000), whether --host gave them or not."""
    bare = host.strip("[]")
    return f"[{bare}]:{port}" if ":" in bare else f"{host}:{port}"


def bind_problems(host: str, port: int, only_in_use: bool = False) -> list[str]:
    """What binding a socket to each of host's addresses at port meets, as gRPC binds (SO_REUSEADDR), each said
    with what to do: the port in use, the host no address of this machine or no name that resolves ([] if every
    bind succeeds). only_in_use: the port in use, nothing else (an address gRPC would skip, as localhost's ::1 on
    a host without IPv6, is no problem)."""
    try:
        addresses = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)  # fmt: skip
    except (socket.gaierror, UnicodeError) as e:
        why = getattr(e, "strerror", None) or e
        return [] if only_in_use else [f"the host {host!r} is no address or name that resolves ({why}): give --host "
                                       "an address of this machine"]  # fmt: skip
    problems = []
    for family, kind, proto, _, sockaddr in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(sockaddr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                problems.append(f"port {port} of {sockaddr[0]} is in use ({e.strerror}): stop what listens there, or "
                                "give another --port")  # fmt: skip
            elif only_in_use:
                continue
            elif e.errno == errno.EACCES:
                problems.append(f"this user may not listen on port {port} ({e.strerror}): give a --port of 1024 or "
                                "more")  # fmt: skip
            else:
                problems.append(f"{sockaddr[0]} port {port}: {e.strerror or e}: is --host an address of this "
                                "machine? (0.0.0.0: all of them)")  # fmt: skip
    return problems


def exposure_warning(host: str, tls: bool, token: bool) -> str | None:
    """What a server listening on host says when others may reach it with neither TLS nor a token (None for a
    loopback address, or when it has either)."""
    if tls or token or host in ("localhost", "") or _is_loopback(host):
        return None
    return (f"listening on {host} with neither TLS nor a token: anyone who can reach this port can read and "
            "overwrite every table; give --tls-cert/--tls-key and --auth-token-file (docs/security.md), or listen "
            "on 127.0.0.1")  # fmt: skip


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: only its resolution would tell
        return False


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
    parent that holds its other end is gone). Prints `starting on HOST:PORT` once it listens (health NOT_SERVING)
    and `listening on HOST:PORT` once it serves. A stop during the start ends it at its next safe point
    (ps.engine.startup) and returns, saying so."""
    stop = StopFlag()  # on_signal sets it, counting the signals: the start's next check and the wait see it at once
    progress = StartProgress(stop)
    serving: list[Server] = []  # the server, once it serves
    stopped_with: list[int] = []  # the stop's exit code, once the shard is stopped (a warm-up may still end)
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
            _exit_now_after_the_stop(config.shard_id, sig, stopped_with[0], said)
            return
        if again and serving:  # a signal during the stop: exit now where the journal has what the stop would write
            why_not = _exit_now_unless_needed(serving[0], config.shard_id, sig, said)
            said.run(functools.partial(log.warning, "received %s again: the stop goes on: %s", sig.name, why_not))
            return
        said.run(functools.partial(_shutting_down, sig, progress))
        if progress.interruptible and not again:  # a read-only phase: stopped where it is (once: a second signal
            raise StartStopped(progress.describe())  # must not interrupt the first one's way out)

    signal.signal(signal.SIGTERM, on_signal)  # before the port is announced: a SIGTERM right after is clean
    signal.signal(signal.SIGINT, on_signal)
    if stop_with_stdin:
        threading.Thread(target=_stop_at_end_of_stdin, args=(stop,), name="ps-stdin", daemon=True).start()
    where = f"ps-server shard {config.shard_id}/{config.num_shards}"
    try:
        server = Server(config, progress, on_listening=lambda server: _say(
            f"{where} starting on {host_port(config.host, server.port)} (data dir {config.data_dir}; health says NOT_SERVING, "
            "and what the start is doing, until it serves)"))  # fmt: skip
    except StartStopped as e:
        said.drained(SAID_WAIT_S)  # the signal's line first
        print(_stopped_start_line(where, e, progress.phase, config.restore_dir), file=sys.stderr, flush=True)
        return
    warms = config.memory_bytes is not None  # its fixed footprint in place before data arrives (ps.engine.warmup)
    port = server.start(warming=warms)
    serving.append(server)
    _say(
        f"{where} listening on {host_port(config.host, port)} (data dir {config.data_dir}: {server.shard.describe_start()})"
    )
    warming = None
    if warms:
        warming = threading.Thread(target=_warm_up_then_serve, args=(server, stop), name="ps-warm-up", daemon=True)
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


def _warm_up_then_serve(server: Server, stop: StopFlag) -> None:
    """(ps-warm-up thread) The warm-up, then health SERVING however it ended: a failed one is logged by warm_up,
    and the first requests load the kernels instead."""
    try:
        warm_up(stop)
    finally:
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


def _exit_now_after_the_stop(shard_id: int, sig: signal.Signals, code: int, said: HandlerWork) -> None:
    """A second SIGTERM or SIGINT once the shard is stopped (its warm-up may still be ending): exits at once
    (_exit_now), with the stop's exit code if it failed, else 128 + the signal's number."""
    how = ("the shard was stopped first, its rows all written" if not code else
           "its stop failed, as said above")  # fmt: skip
    _exit_now(f"ps-server shard {shard_id}: received {sig.name} again after the stop: exiting now; {how} (a "
              "warm-up's scratch directory, ps-warm-up-*, may be left in the temporary directory)\n",
              code or 128 + sig, said)  # fmt: skip


def _exit_now_unless_needed(server: Server, shard_id: int, sig: signal.Signals, said: HandlerWork) -> str:
    """A second SIGTERM or SIGINT while a serving shard stops: the process exits at once (_exit_now; exit code 128
    + the signal's number), as a kill -9 would end it, and the next start replays the journal. Not while what the
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
                  "start replays\n", 128 + sig, said)  # fmt: skip
    return why_not


def _shutting_down(sig: signal.Signals, progress: StartProgress) -> None:
    """(ps-signals thread) The line of a signal that asked for the stop."""
    log.info("received %s, shutting down%s", sig.name, _stop_note(progress))


def _stop_note(progress: StartProgress) -> str:
    """What a stop asked for now does to the start, for the log line that says it was asked for."""
    if not progress.starting:
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

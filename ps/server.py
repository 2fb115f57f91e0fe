"""`Server`: a shard's process lifecycle: listen (ParameterServer + health), build the shard meanwhile, serve, stop
cleanly (the process run around it, until a signal: ps/server_run.py; where it listens: ps/listen_address.py)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from ps.accel.threadnames import name_os_thread
from ps.engine.shard import Shard
from ps.engine.startup import PHASES, StartProgress, StartStopped
from ps.errors import SHARD_STARTING, StorageError
from ps.health import NOT_SERVING, SERVICE_NAME, SERVING, HealthServicer
from ps.health import add_to_server as add_health_to_server
from ps.listen_address import bind_problems, exposure_warning, host_port
from ps.metrics import ServerMetrics
from ps.replies import reply_room_bytes
from ps.secretfiles import (
    READ_TOKEN_FILE,
    TOKEN_FILE,
    optional_token,
    readable_by_all,
    refuse_empty,
)
from ps.security import READ_ONLY_METHODS, TokenCheck, server_credentials
from ps.server_config import ServerConfig
from ps.service import ParameterServerServicer, StartGate
from ps.storage.verify import verify_data_dir

log = logging.getLogger("ps.server")

CALLS_DRAIN_S = 30.0  # a stop waits this long at most for the handlers of calls gRPC cancelled to return


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
    it returns the port (a stop asked for until then ends the start there instead: StartStopped, nothing served).
    `start(warming=True)` serves the calls but leaves health NOT_SERVING, saying the kernels are loading, until
    `warmed()`: a readiness probe finds it Ready once the compiled kernels are in place."""

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
        refuse_empty(("--tls-cert", config.tls_cert), ("--tls-key", config.tls_key), ("--tls-ca", config.tls_ca))
        self._token = optional_token("--auth-token-file", config.auth_token_file)
        self._read_token = optional_token("--read-token-file", config.read_token_file, READ_TOKEN_FILE)
        for what, path in ((TOKEN_FILE, config.auth_token_file), (READ_TOKEN_FILE, config.read_token_file),
                           ("TLS key (--tls-key)", config.tls_key)):  # fmt: skip
            warning = readable_by_all(path) if path else None
            if warning:
                log.warning("%s %s", what, warning)
        self.metrics = ServerMetrics(self.progress) if config.metrics_port is not None else None
        refused = self.metrics.refused_unread if self.metrics is not None else None
        interceptors = [TokenCheck(self._token, self._read_token, refused)] if self._token else []
        self._credentials, tls_warnings = (
            server_credentials(config.tls_cert, config.tls_key, config.tls_ca) if config.tls_cert else (None, [])
        )  # read before anything starts: a missing key file fails here, with its name
        for warning in tls_warnings:  # a certificate not yet valid: the clock that says so may be the wrong one
            log.warning("%s", warning)
        self._grpc = grpc.server(
            ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="ps-rpc", initializer=name_os_thread),
            interceptors=interceptors,
            # a call past the threads' and the queue's calls is refused at once (RESOURCE_EXHAUSTED, OVERLOADED)
            maximum_concurrent_rpcs=config.threads + config.max_queued_calls,
            # no SO_REUSEPORT: a second server on a taken port must fail, not silently share its traffic
            options=grpc_options(config.max_message_bytes) + [("grpc.so_reuseport", 0)],
        )
        self.health = HealthServicer(starting=self._starting, lost=self._lost)
        self._warming_since = 0.0  # time.monotonic() of start(): its warm-up, the phase "warming" (if any), began
        self._health_lock = threading.Lock()  # SERVING from warmed() never undoes _not_serving()'s NOT_SERVING
        self._gone = False  # _not_serving() was called: NOT_SERVING for good
        for name in ("", SERVICE_NAME):
            self.health.set(name, NOT_SERVING)
        about_to_serve = f"shard {config.shard_id} {SHARD_STARTING}: {PHASES['ready']}"  # start() ended the start
        self._gate = StartGate(lambda: self._starting() or about_to_serve)  # and has not opened the gate yet
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
            self._close_unserved()
            raise

    def _starting(self) -> str | None:
        """What a shard that is starting says it does, its warm-up included; None once it serves."""
        if self.progress.starting:
            return f"shard {self.config.shard_id} {SHARD_STARTING}: {self.progress.describe()}"
        since = self._warming_since
        if self.progress.phase != "warming" or self._gone or self.health.shutting_down:  # stopping: not starting
            return None
        return (f"shard {self.config.shard_id} {SHARD_STARTING}: loading its compiled kernels (warm-up, "
                f"{time.monotonic() - since:.0f} s so far; calls are served meanwhile)")  # fmt: skip

    def _lost(self) -> str | None:
        """Why the shard takes no writes (ps.engine.writeguard: its data dir deleted under it, or it broke), naming no
        path (health answers callers without the token), or None."""
        shard = self.shard
        return (shard.guard.lost_unnamed() or None) if shard is not None and hasattr(shard, "guard") else None

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
        warning = exposure_warning(c.host, self._credentials is not None, self._token is not None, bool(c.tls_ca))
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

    def _close_unserved(self) -> None:
        """After a failed or stopped start: the shard built (if any) closed, then _stop_listening."""
        try:
            if self.shard is not None:
                self.shard.close()
        finally:
            self._stop_listening()

    def _stop_listening(self) -> None:
        """After a failed or stopped start: both ports closed, and no gRPC thread left running a call."""
        self.health.enter_graceful_shutdown()
        self._grpc.stop(None).wait()
        if self.metrics is not None:
            self.metrics.close()

    def start(self, warming: bool = False) -> int:
        """Serves the shard built: the calls go to it, health says SERVING (with warming: once warmed() is called),
        the metrics port serves its figures. A stop asked for before (StartProgress.finish) ends the start instead:
        no call served, health NOT_SERVING, the shard closed and both ports too (as a stopped start in __init__),
        and StartStopped raised."""
        servicer = ParameterServerServicer(self.shard, self.metrics, max_reply_bytes=self.config.max_message_bytes,
                                           reply_bytes=reply_room_bytes(self.config.reply_bytes,
                                                                        self.config.memory_bytes),
                                           reply_read_timeout_s=self.config.reply_read_timeout_s)  # fmt: skip
        self._warming_since = time.monotonic()
        try:
            self.progress.finish(warming)
        except StartStopped:
            self._close_unserved()
            raise
        self._servicer = servicer
        if self.metrics is not None:
            self.metrics.attach(self.shard, servicer.replies)
        self._gate.open(servicer)
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
        self.progress.warmed()  # after: a Check that read NOT_SERVING before still finds why

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
                log.warning("%d call%s still running %g s after the stop (a checkpoint being written?): closing the "
                            "store under them, they fail", running, "s" * (running != 1), CALLS_DRAIN_S)  # fmt: skip
            self._servicer.refusals.close()  # the counts of refusals not logged yet, before the log ends
            self._servicer.replies.close()  # its watch of unread replies: gRPC ended their calls
        if self.metrics is not None:
            self.metrics.close()
        self.shard.close()

    def wait(self) -> None:
        self._grpc.wait_for_termination()

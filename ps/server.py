"""Server process lifecycle: start the gRPC server (ParameterServer + health), report the port, stop cleanly."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc

from ps.accel.threadnames import name_os_thread
from ps.config import ServerConfig
from ps.engine.shard import Shard
from ps.engine.warmup import warm_up
from ps.errors import DiskFullError
from ps.health import SERVING, HealthServicer
from ps.health import add_to_server as add_health_to_server
from ps.metrics import ServerMetrics
from ps.security import TokenCheck, read_token, server_credentials
from ps.service import ParameterServerServicer, add_to_server

log = logging.getLogger("ps.server")
SERVICE_NAME = "sparseps.ParameterServer"


def grpc_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Channel/server options shared by both ends: message limits raised above gRPC's 4 MiB default."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


class Server:
    """One shard: a Shard behind a gRPC server. The port is bound (and the metrics port checked) before the data
    dir is opened, so a server that cannot listen leaves the data dir as it was; `start()` serves and returns the
    port."""

    def __init__(self, config: ServerConfig):
        if config.threads < 1:  # before anything is opened; ThreadPoolExecutor's own message names no setting
            raise ValueError(f"threads (--threads) must be >= 1, got {config.threads}")
        self.config = config
        self._token = read_token(config.auth_token_file) if config.auth_token_file else None
        interceptors = [TokenCheck(self._token)] if self._token else []
        self._credentials = (
            server_credentials(config.tls_cert, config.tls_key, config.tls_ca) if config.tls_cert else None
        )  # read before anything starts: a missing key file fails here, with its name
        self._grpc = grpc.server(
            ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="ps-rpc", initializer=name_os_thread),
            interceptors=interceptors,
            # no SO_REUSEPORT: a second server on a taken port must fail, not silently share its traffic
            options=grpc_options(config.max_message_bytes) + [("grpc.so_reuseport", 0)],
        )
        self.port = self._bind()
        try:
            if config.metrics_port:
                check_port_free(config.host, config.metrics_port, "--metrics-port")
            self.shard = Shard(config)
        except BaseException:
            self._grpc.stop(None)
            raise
        self.health = HealthServicer()
        self.metrics = ServerMetrics(self.shard) if config.metrics_port is not None else None
        self.metrics_port = None
        servicer = ParameterServerServicer(self.shard, self.metrics, max_reply_bytes=config.max_message_bytes)
        add_to_server(servicer, self._grpc)
        add_health_to_server(self.health, self._grpc)

    def _bind(self) -> int:
        address = f"{self.config.host}:{self.config.port}"
        hint = "is the port in use by another process, or the host not an address of this machine?"
        try:
            if self._credentials is not None:
                port = self._grpc.add_secure_port(address, self._credentials)
            else:
                port = self._grpc.add_insecure_port(address)
        except RuntimeError as e:  # grpc raises this when the port is taken or the host is not an address
            raise OSError(f"cannot listen on {address} (--host, --port): {e}; {hint}") from None
        if not port:
            raise OSError(f"cannot listen on {address} (--host, --port): {hint}")
        return port

    def start(self) -> int:
        self._grpc.start()
        warning = exposure_warning(self.config.host, self._credentials is not None, self._token is not None)
        if warning:
            log.warning("%s", warning)
        if self.metrics is not None:
            c = self.config  # the metrics port is guarded as the gRPC port is (ps.metrics)
            tls = (c.tls_cert, c.tls_key, c.tls_ca) if c.tls_cert else None
            try:
                self.metrics_port = self.metrics.serve(c.metrics_port, c.host, tls, self._token)
            except OSError as e:
                self._grpc.stop(None)
                raise OSError(f"cannot listen on {c.host}:{c.metrics_port} (--metrics-port): {e.strerror or e}") from e
            log.info("Prometheus metrics on %s://%s:%d/metrics%s", "https" if tls else "http", c.host,
                     self.metrics_port, " (bearer token required)" if self._token else "")  # fmt: skip
        for name in ("", SERVICE_NAME):
            self.health.set(name, SERVING)
        return self.port

    def stop(self, grace_s: float = 5.0) -> None:
        """Stops taking requests, lets running ones finish (up to grace_s), then flushes and closes the store.
        Waits of training jobs end first (UNAVAILABLE: their clients send them again, to the restarted shard), as
        they would outlast the grace; gRPC cancels what is left at its end (clients send that again too)."""
        self.health.enter_graceful_shutdown()
        self.shard.jobs.close()
        self._grpc.stop(grace_s).wait()
        if self.metrics is not None:
            self.metrics.close()
        self.shard.close()

    def wait(self) -> None:
        self._grpc.wait_for_termination()


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


def check_port_free(host: str, port: int, flag: str) -> None:
    """OSError naming flag and the address unless host:port can be bound now (the port is released again)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds it
        try:
            probe.bind((host, port))
        except OSError as e:
            raise OSError(f"cannot listen on {host}:{port} ({flag}): {e.strerror}; is the port in use?") from None


def _stop_at_end_of_stdin(stop: threading.Event) -> None:
    try:  # the raw descriptor: a daemon thread blocked inside sys.stdin's buffer aborts interpreter shutdown
        while os.read(0, 4096):
            pass
    except OSError:  # no usable stdin: treat it as closed
        pass
    log.info("standard input closed (the process that started this server is gone), shutting down")
    stop.set()


def serve(config: ServerConfig, stop_with_stdin: bool = False) -> None:
    """Runs a shard until SIGTERM or SIGINT (or, with stop_with_stdin, until standard input is closed: the
    parent that holds its other end is gone); prints `listening on HOST:PORT` once it serves."""
    stop = threading.Event()

    def on_signal(signum, frame):
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)  # before the port is announced: a SIGTERM right after is clean
    signal.signal(signal.SIGINT, on_signal)
    if stop_with_stdin:
        threading.Thread(target=_stop_at_end_of_stdin, args=(stop,), name="ps-stdin", daemon=True).start()
    server = Server(config)
    try:
        port = server.start()
    except BaseException:
        server.shard.close()
        raise
    try:
        print(f"ps-server shard {config.shard_id}/{config.num_shards} listening on {config.host}:{port} "
              f"(data dir {config.data_dir}: {server.shard.describe_start()})", flush=True)  # fmt: skip
    except BrokenPipeError:  # whoever read this server's output is gone (a killed parent): serve, and stop as told
        log.warning("standard output is a pipe nobody reads any more; its lines are dropped")
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of the process)
    if config.memory_bytes is not None:  # its fixed footprint in place before data arrives (ps.engine.warmup)
        threading.Thread(target=warm_up, name="ps-warm-up", daemon=True).start()
    stop.wait()
    code = stop_server(server, config.shard_id)
    if code:
        raise SystemExit(code)


def stop_server(server: Server, shard_id: int) -> int:
    """Stops a serving shard and says how it went: 0, or 1 when its disk was too full to write its last rows
    (the journal holds them: nothing acknowledged is lost)."""
    try:
        server.stop()
    except DiskFullError as e:
        print(f"ps-server shard {shard_id}: stopped without writing its last rows to RocksDB: {e}. Every acknowledged "
              "push is in its journal, replayed at the next start once the disk has room", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    print(f"ps-server shard {shard_id}: stopped cleanly", file=sys.stderr, flush=True)
    return 0

"""LocalCluster: N ps-server child processes on 127.0.0.1, for `ps-worker train --local-shards N` and tests.

Each shard runs `python -m ps --port 0` on its own data dir (`<root>/shard-<i>`), logs to `<root>/shard-<i>.log`,
and reports its port on stdout; root, unless given, is a temporary directory of kind "local" (worker/temp_dirs.py).
start() waits for every port and for the shards to answer, with a deadline.
stop() sends SIGTERM, waits, then kills. Restarting on the same root gives the shards their rows back.
Each shard's standard input is a pipe this process holds (`--stop-with-stdin`): when this process dies, however
it dies, the pipe closes and the shards stop cleanly instead of running on without their parent. The shards
run in a session of their own: a terminal's Ctrl-C reaches this process alone, which stops them itself.
The shards listen on 127.0.0.1 for this machine's processes, with no TLS and no token, and do not inherit the
PS_* variables of a worker's own client security (SECURITY_VARIABLES): PS_TLS_CA, PS_TLS_CERT and PS_TLS_KEY
mean other things to ps-server (client certificates required; its own certificate), and its shards would refuse to
start or their clients to connect. Nor do they read the worker's config file (PS_CONFIG): its [server] section
describes the cluster's own servers (their TLS and token, --host, --memory-bytes, --restore), not throwaway shards.
Nor do they take PS_READ_TOKEN_FILE (a token of the cluster's servers, which a shard without --auth-token-file
refuses to start with) or PS_METRICS_PORT (the worker's own --metrics-port: every shard would listen on it, and all
but the first fail to start) (SHARD_DROPPED).
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from ps.errors import ServerUnavailableError
from ps.settings import CONFIG_ENV
from ps.terminate import how_it_ended
from worker.temp_dirs import keep, make_temp_dir

_LISTENING = re.compile(rb"listening on (\S+):(\d+)")
SECURITY_VARIABLES = ("PS_TLS_CA", "PS_TLS_CERT", "PS_TLS_KEY", "PS_AUTH_TOKEN_FILE")  # a client's: not the shards'


def without_security_variables(environ: dict[str, str]) -> dict[str, str]:
    """environ less SECURITY_VARIABLES: for local shards, and the workers launch starts against them."""
    return {k: v for k, v in environ.items() if k not in SECURITY_VARIABLES}


SHARD_DROPPED = (CONFIG_ENV, "PS_READ_TOKEN_FILE", "PS_METRICS_PORT")  # the worker's or the real servers'


def shard_environment(environ: dict[str, str]) -> dict[str, str]:
    """A local shard's environment: environ less SECURITY_VARIABLES and SHARD_DROPPED."""
    return {k: v for k, v in without_security_variables(environ).items() if k not in SHARD_DROPPED}


DISCARDED_STOP_S = 30.0  # cleanup() of a cluster in a root of its own: SIGTERM to SIGKILL (its rows are deleted)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    def __init__(
        self, num_shards: int, root: str | None = None, start_timeout_s: float = 60.0, extra_args: Sequence[str] = ()
    ):
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.num_shards = num_shards
        self._own_root = root is None
        self._lock_fd: int | None = None  # held by this process and the shards while they use a root made here
        if root is None:
            root, self._lock_fd = make_temp_dir("local")
        self.root = root
        self.start_timeout_s = start_timeout_s
        self.extra_args = list(extra_args)
        self.procs: list[subprocess.Popen] = []
        self.addresses: list[str] = []

    def data_dir(self, shard_id: int) -> str:
        return os.path.join(self.root, f"shard-{shard_id}")

    def log_path(self, shard_id: int) -> str:
        return os.path.join(self.root, f"shard-{shard_id}.log")

    def start(self) -> list[str]:
        """Starts every shard; returns their addresses in shard order."""
        os.makedirs(self.root, exist_ok=True)
        self.procs = [self._spawn(i) for i in range(self.num_shards)]
        deadline = time.monotonic() + self.start_timeout_s
        try:
            self.addresses = [self._await_port(i, p, deadline) for i, p in enumerate(self.procs)]
        except BaseException:
            self.stop()
            raise
        return self.addresses

    def _spawn(self, shard_id: int, port: int = 0) -> subprocess.Popen:
        cmd = [
            sys.executable, "-m", "ps",
            "--host", "127.0.0.1",  # whatever PS_HOST says: these shards have no TLS and no token
            "--port", str(port),
            "--shard-id", str(shard_id),
            "--num-shards", str(self.num_shards),
            "--data-dir", self.data_dir(shard_id),
            "--stop-with-stdin",  # this process holds the pipe: if it dies, even by SIGKILL, the shard stops
            *self.extra_args,
        ]  # fmt: skip
        with open(self.log_path(shard_id), "ab") as log:  # the child keeps its own copy of the descriptor
            held = () if self._lock_fd is None else (self._lock_fd,)
            # a session of its own: a terminal's Ctrl-C goes to this process alone, which ends its step and then
            # stops the shards; sent to them too, they quit under its step, which logged them as down
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.PIPE, pass_fds=held,
                                    start_new_session=True, env=shard_environment(dict(os.environ)))  # fmt: skip

    def _await_port(self, shard_id: int, proc: subprocess.Popen, deadline: float) -> str:
        out = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerUnavailableError(
                    f"local shard {shard_id} did not report its port within {self.start_timeout_s:.0f} s; "
                    f"log: {self.log_path(shard_id)}\n{self._tail(shard_id)}"
                )
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                out += chunk
                m = _LISTENING.search(out)
                if m:
                    return f"{m.group(1).decode()}:{int(m.group(2))}"
                if chunk:
                    continue
            if proc.poll() is not None:
                raise ServerUnavailableError(
                    f"local shard {shard_id} {how_it_ended(proc.returncode)} before listening; "
                    f"log: {self.log_path(shard_id)}\n{self._tail(shard_id)}"
                )

    def _tail(self, shard_id: int, lines: int = 20) -> str:
        try:
            with open(self.log_path(shard_id), "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""

    def kill(self, shard_id: int) -> None:
        """SIGKILL one shard (for crash tests)."""
        self.procs[shard_id].kill()
        self.procs[shard_id].wait()

    def restart(self, shard_id: int) -> str:
        """Starts a shard that was killed again, on its data dir and its port (clients keep their address)."""
        if self.procs[shard_id].poll() is None:
            raise RuntimeError(f"local shard {shard_id} is still running")
        for pipe in (self.procs[shard_id].stdout, self.procs[shard_id].stdin):
            if pipe:
                pipe.close()
        port = int(self.addresses[shard_id].rsplit(":", 1)[1])
        self.procs[shard_id] = self._spawn(shard_id, port)
        address = self._await_port(shard_id, self.procs[shard_id], time.monotonic() + self.start_timeout_s)
        assert address == self.addresses[shard_id], (address, self.addresses[shard_id])
        return address

    def gone(self, shard_id: int) -> str | None:
        """Why shard shard_id can never answer again (its process exited: nothing restarts a local shard), or None
        while it runs."""
        if shard_id >= len(self.procs):
            return None
        proc = self.procs[shard_id]
        code = proc.poll()
        if code is None:
            return None
        return (
            f"local shard {shard_id} (pid {proc.pid}) {how_it_ended(code)}, and a local shard is not restarted: its "
            f"rows are gone with it (its log: {self.log_path(shard_id)})"
        )

    def died(self) -> str | None:
        """gone() of the first shard whose process exited, or None while every shard runs."""
        return next(filter(None, map(self.gone, range(len(self.procs)))), None)

    def stop(self, timeout_s: float = 300.0) -> list[int]:
        """SIGTERM every shard, wait up to timeout_s (a shard flushes its dirty rows first: ~0.5M rows/s),
        then SIGKILL. Returns the exit codes."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
            for pipe in (p.stdout, p.stdin):
                if pipe:
                    pipe.close()
        self.procs = []
        return codes

    def cleanup(self) -> None:
        """stop(), and delete the root if this cluster made it: then the shards' final flush is of rows about to be
        deleted, so they get DISCARDED_STOP_S, well inside a stopping worker's cleanup limit (ps.terminate),
        before SIGKILL. Where a shard had died (gone), the shards' logs stay (the root kept, its data dirs
        deleted)."""
        died = self.died()
        self.stop(DISCARDED_STOP_S if self._own_root else 300.0)
        if self._own_root and died:  # the logs kept, for what ended the shard; the rows deleted
            for shard_id in range(self.num_shards):
                shutil.rmtree(self.data_dir(shard_id), ignore_errors=True)
            keep(self.root, died)
        elif self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        self._release()

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> LocalCluster:
        """start(); interrupted (Ctrl-C, SIGTERM), it cleans up as __exit__ would. A shard that fails to start
        leaves the root, whose shard log the error names (kept: worker.temp_dirs.keep)."""
        try:
            self.start()
        except BaseException as e:
            if not isinstance(e, Exception):  # KeyboardInterrupt, ps.terminate.Terminated
                self.cleanup()
            elif self._own_root:
                first_line = str(e).splitlines()[0] if str(e) else repr(e)
                keep(self.root, f"a local shard failed to start: {first_line}")
                self._release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

"""ServerProcess: `python -m ps` on a data dir as a child process, for black-box tests that measure it from /proc
or damage its files between runs."""

from __future__ import annotations

import atexit
import contextlib
import re
import signal
import subprocess
import sys
import time

from tests.waiting import wait_until

_STARTED: list[subprocess.Popen] = []  # every server started, killed at exit if still running (a failed test's)


@atexit.register
def _kill_left() -> None:
    for proc in _STARTED:
        if proc.poll() is None:
            proc.kill()


class ServerProcess:
    """`python -m ps` on a data dir, its output in a file beside the dir; started() waits for it to listen or
    to exit. launcher: what runs ps-server's main (tests.slow_start: a start held as long as the test needs); env:
    its environment (None: this process's). Python's faulthandler is on: a stop that hangs fails with every
    thread's stack in its message (hung)."""

    def __init__(
        self,
        data_dir,
        *flags: str,
        shard: tuple[int, int] = (0, 1),
        launcher: tuple[str, ...] = ("-m", "ps"),
        stdin: int | None = None,
        env: dict[str, str] | None = None,
    ):
        self.log_path = f"{data_dir}.{time.monotonic_ns()}.log"
        args = ["--data-dir", str(data_dir), "--port", "0", "--shard-id", str(shard[0]), "--num-shards", str(shard[1])]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-X", "faulthandler", *launcher, *args, *flags],
                stdin=stdin,
                stdout=log,
                stderr=log,
                env=env,
            )
        _STARTED.append(self.proc)

    def output(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def started(self, timeout_s: float = 120) -> str | None:
        """The address once it listens, or None if it exits first (AssertionError if neither in timeout_s)."""

        def listening_or_exited() -> tuple[str | None] | None:
            found = re.search(r"listening on (\S+:\d+)", self.output())
            if found:
                return (found.group(1),)
            return (None,) if self.proc.poll() is not None else None

        try:
            (address,) = wait_until(
                listening_or_exited, timeout_s, lambda: f"ps-server to listen or exit:\n{self.output()}", poll_s=0.05
            )
        except AssertionError:
            self.proc.kill()
            raise
        return address

    def answering(self, timeout_s: float = 120) -> str:
        """The address once it listens while it starts (`starting on HOST:PORT`); AssertionError if it does not."""
        found = wait_until(lambda: re.search(r"starting on (\S+:\d+)", self.output()), timeout_s,
                           lambda: f"ps-server to listen while it starts:\n{self.output()}", poll_s=0.05)  # fmt: skip
        return found.group(1)

    def refused(self) -> str:
        """Its output, after asserting that it exits without listening, with an error and no traceback."""
        address = self.started()
        if address is not None:
            self.stop()
        assert address is None, f"ps-server started on the damaged dir:\n{self.output()}"
        out = self.output()
        assert self.proc.wait(30) == 2 and "ps-server: error:" in out and "Traceback" not in out, out
        return out

    def status_kib(self, field: str) -> int:
        """A field of /proc/<pid>/status (VmRSS, RssAnon, VmSize, ...), in KiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE).group(1))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """sig, then waits up to 60 s for the exit; AssertionError with the threads' stacks if it does not come."""
        self.proc.send_signal(sig)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired as hung:
            raise self.hung(f"ps-server did not exit within 60 s of signal {sig}") from hung

    def hung(self, what: str) -> AssertionError:
        """For a wait on it that ran out: SIGABRT (faulthandler writes every thread's stack to the output), then
        SIGKILL; the AssertionError to raise, `what` and its output (the stacks at the end)."""
        self.proc.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.proc.kill()
        return AssertionError(f"{what}:\n{self.output()[-20000:]}")

    def stop_cleanly(self) -> None:
        """SIGTERM, and asserts a clean exit (0) within 60 s; kills it otherwise."""
        try:
            self.stop()
            assert self.proc.returncode == 0, self.output()
        finally:
            self.proc.kill()

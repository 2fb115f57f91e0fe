"""Waiting with a deadline in tests: poll a condition, join a thread, read a child process's pipe as it is written.

Each wait fails with an AssertionError that names what was awaited, so a test whose helper thread or child
process died says so instead of hanging the suite.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import IO, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str | Callable[[], str], poll_s: float = 0.01) -> T:
    """Calls predicate every poll_s until it returns something truthy, and returns that. AssertionError if
    timeout_s passes first, naming `what` (a string, or a function called then to describe the state). An
    exception from predicate propagates: a predicate can fail fast when the awaited thing can no longer happen."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what() if callable(what) else what}")
        time.sleep(poll_s)


def join_thread(thread: threading.Thread, timeout_s: float, what: str) -> None:
    """thread.join with a deadline: AssertionError naming `what` if the thread is still running after it."""
    thread.join(timeout_s)
    if thread.is_alive():
        raise AssertionError(f"{what}: still running after {timeout_s:g} s")


class PipeReader:
    """Reads a child process's text pipe on a thread as it is written, so the child never blocks on a full pipe
    and a test can wait for a line with a deadline. The thread ends when the pipe closes (the child exits)."""

    def __init__(self, stream: IO[str]):
        self._chunks: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), name="pipe-reader", daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self._chunks.append(line)

    def text(self) -> str:
        """Everything read so far."""
        with self._lock:
            return "".join(self._chunks)

    def wait_for(self, pattern: str, timeout_s: float, what: str) -> re.Match:
        """The first match of the regular expression in what was read, once there is one (see wait_until)."""
        return wait_until(
            lambda: re.search(pattern, self.text(), re.MULTILINE), timeout_s, lambda: f"{what}; read:\n{self.text()}"
        )

    def close(self, timeout_s: float = 30.0) -> str:
        """Waits for the pipe to close (call it once the child has exited); returns everything read."""
        join_thread(self._thread, timeout_s, "reading a child's pipe until it closes")
        return self.text()

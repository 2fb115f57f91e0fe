"""SIGTERM as an exception, so that a command stopped by `kill`, a container runtime or a launcher cleans up as
on Ctrl-C: local shards stopped, temporary directories removed, a message, exit code 143.

    with sigterm_raises():   # main thread only; elsewhere it does nothing
        ...                  # the first SIGTERM raises Terminated here; later ones are ignored while it unwinds

Terminated is a BaseException, as KeyboardInterrupt is: an `except Exception` on the way does not swallow it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

EXIT_CODE = 128 + signal.SIGTERM  # 143, as a shell reports a process ended by SIGTERM


class Terminated(BaseException):
    """SIGTERM reached this process."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises Terminated in the main thread (once: a second SIGTERM while the first
    unwinds is ignored, so that the cleanup it triggers runs to its end); the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

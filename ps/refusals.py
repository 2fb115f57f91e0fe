"""RefusalLog: the servicer's log lines of the requests it refuses, one per kind at most every REFUSAL_LOG_S.

A kind is a method and an error class (`PushBatch`, `DiskFullError`). Its first refusal is logged at once; those
that follow within REFUSAL_LOG_S are counted, not logged, and the next line of the kind says how many there were.
So a client that repeats one bad request, or every worker's push meeting a full disk, gives a line a minute, not
one per request; sparseps_requests_total{method, code} counts every refusal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

REFUSAL_LOG_S = 60.0  # between two lines of one kind of refusal


class RefusalLog:
    """Logs refusals to `log`, each kind at most once every every_s seconds (clock: monotonic seconds). The
    kinds are few (methods x error classes), so the table of them stays small. Thread-safe."""

    def __init__(self, log: logging.Logger, every_s: float = REFUSAL_LOG_S,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.log, self.every_s, self.clock = log, every_s, clock
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, str], list] = {}  # kind -> [time of its last line, refusals not logged since]

    def refused(self, level: int, method: str, error: BaseException, text: str, exc_info: bool = False) -> None:
        """Logs `method <text>` at level, with the count of the refusals of this kind not logged since its last
        line; or, within every_s of that line, only counts it. exc_info: with error's traceback."""
        kind, now = (method, type(error).__name__), self.clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen[0] < self.every_s:
                seen[1] += 1
                return
            unlogged = seen[1] if seen is not None else 0
            self._kinds[kind] = [now, 0]
        more = (f" ({unlogged:,} more {method} refusals of this kind since its last line, not logged)" if unlogged
                else f" (more within {self.every_s:g} s are counted in its next line)")  # fmt: skip
        self.log.log(level, "%s %s%s", method, text, more, exc_info=error if exc_info else None)

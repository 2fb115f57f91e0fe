"""RefusalLog: the servicer's log lines of the requests it refuses, one per kind at most every REFUSAL_LOG_S.

A kind is a method, an error class and the status the call ended with (`PushBatch`, `DiskFullError`,
`RESOURCE_EXHAUSTED`; an OSError of a full disk and one of an I/O error are two kinds). Its first refusal is logged at
once; those that follow within REFUSAL_LOG_S are counted, not logged, and when that interval ends one line says
how many there were, with the last one's text, and starts the kind's next interval. So a client that repeats one
bad request, or every worker's push meeting a full disk, gives a line a minute, not one per request, and a burst's
count is logged within REFUSAL_LOG_S of its first line, or as the server stops (close) if that comes first;
sparseps_requests_total{method, code} counts every refusal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

REFUSAL_LOG_S = 60.0  # between two lines of one kind of refusal


@dataclass
class _Kind:
    """A kind's interval: when its last line was logged, and the refusals counted since (the last one's level and
    text, for the line that tells them; a timer set to tell them at the interval's end)."""

    logged_at: float
    count: int = 0
    level: int = logging.INFO
    text: str = ""
    timer: threading.Timer | None = None


class RefusalLog:
    """Logs refusals to `log`, each kind at most once every every_s seconds (clock: monotonic seconds); a timer
    thread logs the count of an interval's refusals at its end. The kinds are few (methods x error classes x
    codes), so the table of them stays small. Thread-safe."""

    def __init__(self, log: logging.Logger, every_s: float = REFUSAL_LOG_S,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.log, self.every_s, self.clock = log, every_s, clock
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, str, str], _Kind] = {}
        self._closed = False  # from close() on, every refusal is logged as it comes

    def refused(self, level: int, method: str, error: BaseException, text: str, code: str,
                exc_info: bool = False) -> None:  # fmt: skip
        """Logs `method <text>` at level, or, within every_s of the last line of its kind (method, error's class,
        the call's status code), counts it for the line at the interval's end. exc_info: with error's traceback."""
        kind, now = (method, type(error).__name__, code), self.clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if not self._closed and seen is not None and now - seen.logged_at < self.every_s:
                seen.count, seen.level, seen.text = seen.count + 1, level, text
                if seen.timer is None:
                    seen.timer = threading.Timer(seen.logged_at + self.every_s - now, self._tell, (kind,))
                    seen.timer.daemon = True
                    seen.timer.start()
                return
            self._kinds[kind] = _Kind(now)
            more = "" if self._closed else f" (more of this kind within {self.every_s:g} s are counted in one line)"
        self.log.log(level, "%s %s%s", method, text, more, exc_info=error if exc_info else None)

    def _tell(self, kind: tuple[str, str, str]) -> None:
        """The timer's: logs the count of kind's refusals in its interval; that line starts its next interval."""
        with self._lock:
            seen = self._kinds[kind]
            if not seen.count:  # close() told them
                return
            count, level, text = seen.count, seen.level, seen.text
            self._kinds[kind] = _Kind(self.clock())
        self._line(kind, count, level, text)

    def close(self) -> None:
        """Logs the counts not told yet, and from now on every refusal as it comes: the server stops."""
        with self._lock:
            self._closed = True
            untold = [(kind, seen) for kind, seen in self._kinds.items() if seen.count]
            for kind, seen in untold:
                if seen.timer is not None:
                    seen.timer.cancel()
                self._kinds[kind] = _Kind(seen.logged_at)
        for kind, seen in untold:
            self._line(kind, seen.count, seen.level, seen.text)

    def _line(self, kind: tuple[str, str, str], count: int, level: int, text: str) -> None:
        method, error, code = kind
        self.log.log(level, "%s %s (the last of %s %s refusals of this kind, %s %s, since the kind's previous line)",
                     method, text, f"{count:,}", method, error, code)  # fmt: skip

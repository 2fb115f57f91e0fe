"""The progress of long work as it is shown: CountProgress, a count (rows exported, examples scored) as the long
commands show it; and a server's progress log lines (a journal replay, a restore, a verify, a Shrink): LoggedCount,
the count of such work with a line every LOG_EVERY_S seconds, and pace, the part of a line that says how far it got,
how fast and how long is left.

CountProgress shows a tqdm bar on a terminal; a plain line every PLAIN_EVERY_S seconds on stderr that is none (a
log file); nothing when off. A subclass says what its plain line reads (line) or writes its own lines (say, every
every_s seconds), and may grow the bar's total as it goes (advance_bar).

The tqdm bar exists only where it is shown (`bar` is None otherwise): tqdm starts its monitor thread for every
instance it makes, a disabled one too, and a progress not shown starts no thread.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from tqdm import tqdm

LOG_EVERY_S = 10.0  # between the progress log lines of a long replay, restore, verify or Shrink


class LoggedCount:
    """A count of long work done so far (done) and when it began (started, time.monotonic()), with a log line, at
    INFO on logger, every LOG_EVERY_S seconds: line(done, seconds since it began) says what it reads."""

    def __init__(self, logger: logging.Logger, line: Callable[[int, float], str]) -> None:
        self.logger, self.line = logger, line
        self.done = 0
        self.started = self._said = time.monotonic()

    def add(self, n: int) -> None:
        """Counts n more done; logs the line where LOG_EVERY_S passed since the count began or since its last line."""
        self.done += n
        now = time.monotonic()
        if now - self._said >= LOG_EVERY_S:
            self._said = now
            self.logger.info("%s", self.line(self.done, now - self.started), stacklevel=2)  # the caller of add

    def took_s(self) -> float:
        """Seconds since the count began."""
        return time.monotonic() - self.started


def _count(n: float) -> str:
    return f"{n:,.0f}"


def pace(done: int, expected: int, took_s: float, what: str, per_s: str = " rows/s",
         show: Callable[[float], str] = _count, about: str = "about ", aside: str = "") -> str:  # fmt: skip
    """How far work got of what was expected, taking took_s so far: "1,200,000 of about 3,000,000 rows read (40%),
    400,000 rows/s, about 5 s left", where what is "rows read", per_s " rows/s" (the rate's unit after show's), show
    formats a count (human_bytes for bytes: "96.0 MiB of about 240.0 MiB read (40%), 12.0 MiB/s, ..."), about comes
    before the total ("" for a total that is no estimate), aside goes after the share, in its brackets. A total
    under done (an estimate the work passed, or 0: none known) is shown as done, with no time left."""
    total = max(expected, done)
    rate = done / max(took_s, 1e-9)
    left = f", about {(total - done) / rate:,.0f} s left" if total > done and rate > 0 else ""
    share = 100 * done / max(total, 1)
    return f"{show(done)} of {about}{show(total)} {what} ({share:.0f}%{aside}), {show(rate)}{per_s}{left}"


class CountProgress:
    PLAIN_EVERY_S = 30.0

    def __init__(self, total: int, on: bool, unit: str, desc: str | None = None, bar_format: str | None = None):
        """total: the count expected (0: unknown); on: shown at all; unit, desc, bar_format: the bar's (tqdm)."""
        self.plain = on and not sys.stderr.isatty()
        self.bar: tqdm | None = None  # the bar on a terminal; None where it is not shown (off, or plain lines)
        if on and not self.plain:
            self.bar = tqdm(total=total, unit=unit, unit_scale=True, desc=desc, smoothing=0.1, bar_format=bar_format)
        self.total, self.done = total, 0
        self.every_s = self.PLAIN_EVERY_S  # between plain lines
        self.started = self.last = time.perf_counter()

    def update(self, n: int) -> None:
        self.done += n
        self.advance_bar(n)
        now = time.perf_counter()
        if self.plain and now - self.last >= self.every_s:
            self.last = now
            self.say(self.done / max(now - self.started, 1e-9))

    def say(self, rate: float) -> None:
        """Writes the plain line for `done` so far at rate per second (on stderr)."""
        print(self.line(rate), file=sys.stderr, flush=True)

    def advance_bar(self, n: int) -> None:
        """Moves the bar (if shown) by n."""
        if self.bar is not None:
            self.bar.update(n)

    def line(self, rate: float) -> str:
        """The plain line for `done` so far at rate per second."""
        raise NotImplementedError

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

"""CountProgress: the progress of a count of work (rows exported, examples scored) as the long commands show it: a
tqdm bar on a terminal; a plain line every PLAIN_EVERY_S seconds on stderr that is none (a log file); nothing
when off. A subclass says what its plain line reads (line) or writes its own lines (say, every every_s seconds),
and may grow the bar's total as it goes (advance_bar).

The tqdm bar exists only where it is shown (`bar` is None otherwise): tqdm starts its monitor thread for every
instance it makes, a disabled one too, and a progress not shown starts no thread.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


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

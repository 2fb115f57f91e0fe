"""CountProgress: the progress of a count of work (rows exported, examples scored) as the long commands show it: a
tqdm bar on a terminal; a plain line every PLAIN_EVERY_S seconds on stderr that is none (a log file); nothing
when off. A subclass says what its plain line reads (line) and may grow the bar's total as it goes (advance_bar).
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
        self.bar = tqdm(total=total, unit=unit, unit_scale=True, desc=desc, disable=not on or self.plain,
                        smoothing=0.1, bar_format=bar_format)  # fmt: skip
        self.total, self.done = total, 0
        self.started = self.last = time.perf_counter()

    def update(self, n: int) -> None:
        self.done += n
        self.advance_bar(n)
        now = time.perf_counter()
        if self.plain and now - self.last >= self.PLAIN_EVERY_S:
            self.last = now
            print(self.line(self.done / max(now - self.started, 1e-9)), file=sys.stderr, flush=True)

    def advance_bar(self, n: int) -> None:
        self.bar.update(n)

    def line(self, rate: float) -> str:
        """The plain line for `done` so far at rate per second."""
        raise NotImplementedError

    def close(self) -> None:
        self.bar.close()

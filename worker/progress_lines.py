"""The PROGRESS lines a worker writes on stdout under `ps-worker train --progress-lines` (worker/loop_progress.py) and
`ps-worker launch` reads (worker/launch_workers.py, merged by worker/launch_report.py):

    PROGRESS {"worker": i, "examples": n, "steps": s, "total": t, "logloss": x, "examples_per_s": r
              [, "pushed": p] [, "at_most": true] [, "estimated": true] [, "cache_hit_rate": h, "cache_bytes_saved": b]}

n, s: examples and steps the worker has trained so far, all epochs; p (only where it is less than n): of those n,
the examples whose updates the servers hold (geo keeps the deltas of up to --geo-every - 1 steps locally); t: examples
it will train, all epochs (0: unknown; with at_most, an upper bound: early stopping may end the run sooner; with
estimated, an estimate from the file's bytes (worker/linecount.py), which the count may pass: t is then kept above n,
see about_total, and shown as "about t", with no time left); r: n over the training time so far, the evaluations of the
validation set and a resumed run's skipping left out (the final line's r is the run's examples_per_s); x: its running
train logloss (null before the first step); h, b: its row cache's hit rate and the bytes its hits did not pull (geo: the
share of rows read locally). One every 2 s (JSON_EVERY_S) and one at the end; a worker stopped before its end (a signal,
an error) writes one as it stops. A worker's final evaluation (train's, not launch's workers': they have
--no-final-eval) then writes its scoring's lines (worker/scoring.py ScoringProgress), as often:

    PROGRESS {"worker": i, "phase": "eval", "scored": n, "total": t, "examples_per_s": r [, "estimated": true]}

n: examples of the eval set scored so far; t: the eval set's examples (0: unknown; estimated as above), n at the
last line, written when the scoring is done (one stopped by an error or a signal keeps the t it expected); r: n
over the scoring's time. parse_progress reads training's lines only: a line that does not parse as one (an
evaluation's among them) is output, not training progress.
The bar of a count of examples (training's, worker/loop.py; scoring's, worker/scoring.py) is an ExamplesProgress,
which shows an estimated total the same way: ABOUT_BAR_FORMAT, and a share kept under 100% (about_total).
"""

from __future__ import annotations

import json
import math
import time

from ps.progress import CountProgress

PREFIX = "PROGRESS "
JSON_EVERY_S = 2.0  # between a worker's lines
# a tqdm bar over an estimated total: "about", and no time left (tqdm's would be a guess shown as a figure)
ABOUT_BAR_FORMAT = "{l_bar}{bar}| {n_fmt} of about {total_fmt} [{elapsed}, {rate_fmt}{postfix}]"


def about_total(done: int, total: int) -> int:
    """The total to show for `done` examples of an estimated `total`: total, or more once done nears it, so
    that the share shown (rounded to a percent) stays at most 99% until the run's end says it is done."""
    return max(total, math.ceil(done / 0.99) + 1)


class ExamplesProgress(CountProgress):
    """A count of examples (training's, scoring's) as ps.progress shows it, over a total that may be an estimate:
    the data's line count or the split's expected share, which the count may pass (the total then grows with it,
    so that the bar never shows more than 100%), or, estimated, a total from bytes (worker/linecount.py: shown as
    "about", with no time left, and never as 100% until close). postfix: figures shown after the bar's rate;
    restart: the bar's count and clock start over (training's first step after a skip)."""

    counted = "examples"  # what a plain line says was counted

    def __init__(self, total: int, on: bool, estimated: bool = False, desc: str | None = None):
        self.estimated = estimated and total > 0
        super().__init__(total, on, unit="ex", desc=desc, bar_format=ABOUT_BAR_FORMAT if self.estimated else None)

    def advance_bar(self, n: int) -> None:
        bar = self.bar
        if bar is None:
            return
        if bar.total and self.estimated:
            bar.total = about_total(bar.n + n, bar.total)
        elif bar.total and bar.n + n > bar.total:
            bar.total = bar.n + n
        bar.update(n)

    def shown_total(self) -> int:
        """The total a line shows for the examples counted so far (an estimate grown past them: about_total)."""
        return about_total(self.done, self.total) if self.estimated else max(self.total, self.done)

    def line(self, rate: float) -> str:
        total = self.shown_total()
        about = "about " if self.estimated else ""
        of = f" of {about}{total:,} ({self.done / total:.0%})" if self.total else ""
        return f"progress: {self.done:,}{of} {self.counted}, {rate:,.0f} examples/s"

    def postfix(self, figures: dict) -> None:
        if self.bar is not None:
            self.bar.set_postfix(figures, refresh=False)

    def restart(self) -> None:
        """The count and the rate's clock start over, and the bar's description (what it waited for) goes."""
        if self.bar is not None:
            self.bar.set_description_str(None, refresh=False)
            self.bar.reset(self.bar.total)
        self.done, self.started = 0, time.perf_counter()

    def close(self, finished: bool = True) -> None:
        """finished: the count is the total (fewer than expected where lines were malformed or the run stopped
        early); else an error or a signal stopped the count, and the total shown stays the one expected."""
        if finished and self.bar is not None:
            self.bar.total = self.bar.n
        super().close()


def progress_line(report: dict) -> str:
    """The line of a report (the grammar above)."""
    return PREFIX + json.dumps(report)


def parse_progress(line: str) -> dict | None:
    """The report of a training PROGRESS line (one with "examples"), or None for any other line (a scoring one
    too)."""
    if not line.startswith(PREFIX):
        return None
    try:
        report = json.loads(line[len(PREFIX) :])
    except ValueError:
        return None
    ok = isinstance(report, dict) and isinstance(report.get("examples"), int | float)
    return report if ok else None

"""The PROGRESS lines a worker writes on stdout under `ps-worker train --progress-lines` (worker/loop.py) and
`ps-worker launch` reads (worker/launch_workers.py, merged by worker/launch_report.py):

    PROGRESS {"worker": i, "examples": n, "steps": s, "total": t, "logloss": x, "examples_per_s": r
              [, "pushed": p] [, "at_most": true] [, "estimated": true] [, "cache_hit_rate": h, "cache_bytes_saved": b]}

n, s: examples and steps the worker has trained so far, all epochs; p (only where it is less than n): of those n,
the examples whose updates the servers hold (geo keeps the deltas of up to --geo-every - 1 steps locally); t: examples it will train, all epochs (0:
unknown; with at_most, an upper bound: early stopping may end the run sooner; with estimated, an estimate from
the file's bytes (worker/linecount.py), which the count may pass: t is then kept above n, see about_total, and
shown as "about t", with no time left); r: n over the training time so far, the evaluations of the validation set
and a resumed run's skipping left out (the final line's r is the run's examples_per_s); x: its running train
logloss (null before the first step); h, b: its row cache's hit rate and the bytes its hits did not pull (geo: the share of rows
read locally). One every 2 s (JSON_EVERY_S) and one at the end; a worker stopped before its end (a signal, an
error) writes one as it stops. A worker's final evaluation (train's, not launch's workers': they have
--no-final-eval) then writes its scoring's lines (worker/scoring.py ScoringProgress), as often:

    PROGRESS {"worker": i, "phase": "eval", "scored": n, "total": t, "examples_per_s": r [, "estimated": true]}

n: examples of the eval set scored so far; t: the eval set's examples (0: unknown; estimated as above), n at the
last line, written when the scoring is done (one stopped by an error or a signal keeps the t it expected); r: n
over the scoring's time. parse_progress reads training's lines only: a line that does not parse as one (an
evaluation's among them) is output, not training progress.
A bar over an estimated total (training's, worker/loop.py; scoring's, worker/scoring.py) shows it the same way:
ABOUT_BAR_FORMAT, and advance, which keeps the share under 100% (about_total).
"""

from __future__ import annotations

import json
import math

from tqdm import tqdm

PREFIX = "PROGRESS "
JSON_EVERY_S = 2.0  # between a worker's lines
# a tqdm bar over an estimated total: "about", and no time left (tqdm's would be a guess shown as a figure)
ABOUT_BAR_FORMAT = "{l_bar}{bar}| {n_fmt} of about {total_fmt} [{elapsed}, {rate_fmt}{postfix}]"


def about_total(done: int, total: int) -> int:
    """The total to show for `done` examples of an estimated `total`: total, or more once done nears it, so
    that the share shown (rounded to a percent) stays at most 99% until the run's end says it is done."""
    return max(total, math.ceil(done / 0.99) + 1)


def advance(bar: tqdm, n: int, estimated: bool = False) -> None:
    """bar.update(n), its total grown to the new count first when n would take it past the total (an estimate:
    the data's line count, the split's expected share), so that the bar never shows more than 100%; estimated
    (a total from bytes): never 100% either, until the run's end (about_total)."""
    if bar.total and estimated:
        bar.total = about_total(bar.n + n, bar.total)
    elif bar.total and bar.n + n > bar.total:
        bar.total = bar.n + n
    bar.update(n)


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

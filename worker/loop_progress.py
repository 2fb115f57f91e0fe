"""A training run's progress lines as run_epochs (worker/loop.py) trains: PROGRESS lines or plain ones; its bar's
figures."""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING

from tqdm import tqdm

from ps.bytesize import human_bytes
from worker.progress_lines import JSON_EVERY_S, about_total, progress_line

if TYPE_CHECKING:
    from worker.loop import LoopResult


class ProgressLines:
    """PROGRESS lines on stdout every `every_s` seconds (ps-worker train --progress-lines, read by launch; grammar in
    worker/progress_lines.py); or, plain, 'progress: ...' lines for a person on stderr (a bar's redraws would fill
    a log file), which also give the rate since the line before (a run slowing down shows there first, not in the
    whole run's) and, where the total is known exactly, the time left at that rate."""

    JSON_EVERY_S, PLAIN_EVERY_S = JSON_EVERY_S, 30.0

    def __init__(self, worker: int, total: int, plain: bool = False, every_s: float | None = None,
                 at_most: bool = False, estimated: bool = False):  # fmt: skip
        self.worker, self.total, self.plain, self.at_most = worker, total, plain, at_most
        self.estimated = estimated and total > 0
        self.every_s = every_s if every_s is not None else self.PLAIN_EVERY_S if plain else self.JSON_EVERY_S
        self.last = time.perf_counter()
        self.since: tuple[int, float] | None = None  # (examples, seconds) at the last line

    def update(self, result: LoopResult, logloss: float, seconds: float, extra: dict, final: bool = False,
               stopped: bool = False) -> None:  # fmt: skip
        """A line every every_s seconds; at once when final (the run's end: its total the examples trained) or
        stopped (an error or a signal ended it: the total stays what the run meant to train). seconds: the
        training time so far, as result.seconds counts it (evaluations and skipping left out): the rate's."""
        now = time.perf_counter()
        if not (final or stopped) and now - self.last < self.every_s:
            return
        self.last = now
        total = result.examples if final else max(self.total, result.examples)  # the total was an estimate
        estimated = self.estimated and not final
        total = about_total(result.examples, total) if estimated else total
        line = {"worker": self.worker, "examples": result.examples, "steps": result.steps, "total": total,
                "logloss": None if math.isnan(logloss) else round(logloss, 5),
                "examples_per_s": round(result.examples / max(seconds, 1e-9), 1), **extra}  # fmt: skip
        if result.pushed != result.examples:
            line["pushed"] = result.pushed
        if self.at_most and not final:
            line["at_most"] = True
        if estimated:
            line["estimated"] = True
        if self.plain:
            done = f" ({result.examples / total:.0%})" if total else ""
            bound = "at most " if line.get("at_most") else ""
            total_text = f"{bound}{'about ' if estimated else ''}{total:,}"
            loss = "" if line["logloss"] is None else f", train logloss {line['logloss']:.4f}"
            print(f"progress: {result.examples:,} of {total_text} examples{done}, {line['examples_per_s']:,.0f} "
                  f"examples/s{self._recent(result.examples, seconds, total, final or bool(bound) or estimated)}{loss}",
                  file=sys.stderr, flush=True)  # fmt: skip
            self.since = (result.examples, seconds)
        else:
            print(progress_line(line), flush=True)

    def _recent(self, examples: int, seconds: float, total: int, no_time_left: bool) -> str:
        """A plain line's rate since the line before and, unless no_time_left, the time left at that rate."""
        if self.since is None or seconds <= self.since[1]:
            return ""
        rate = (examples - self.since[0]) / (seconds - self.since[1])
        text = f" ({rate:,.0f} over the last {tqdm.format_interval(seconds - self.since[1])})"
        if not no_time_left and rate > 0 and total > examples:
            text += f", {tqdm.format_interval((total - examples) / rate)} left"
        return text


def bar_postfix(epoch: int, logloss: float, cache: dict) -> dict:
    """The figures beside the bar after a step: the epoch, the running train logloss, and the row source's cache
    hit rate and bytes saved where it has them (cache: its stats())."""
    postfix = {"epoch": epoch, "logloss": f"{logloss:.4f}"}
    if "cache_hit_rate" in cache:
        postfix["hits"] = f"{cache['cache_hit_rate']:.0%}"
    if "cache_bytes_saved" in cache:
        postfix["saved"] = human_bytes(cache["cache_bytes_saved"])
    return postfix

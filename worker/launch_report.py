"""What `ps-worker launch` reads from its workers and reports for the job: PROGRESS lines merged into one progress
bar or line, and the job's --metrics-out object.

PROGRESS lines: their grammar, writer and reader are worker/progress_lines.py.
--metrics-out (one JSON object):
    {"workers": N, "backends": [each worker's: "numpy", "torch" (CPU) or "torch:cuda"], "mode": async|sync|ssp|geo,
     "shards": S, "train_examples": sum over workers,
     ["skipped_lines": sum over workers of the malformed training lines each skipped per pass (never in
     train_examples); absent when none was], ["skipped_examples": sum over workers of the examples a stopped run
     had trained before each resumed (its --skip-examples, or its --resume-file's position; never in
     train_examples); absent when none resumed], ["max_examples": the job's --max-examples, "stopped_at_max_examples":
     true; when a worker's training stopped there], "train_seconds": the longest worker's, "examples_per_s":
     train_examples / train_seconds, ["eval_auc", "eval_logloss", "eval_examples", "eval_positive_rate",
     "eval_constant_logloss" (of predicting that rate for all): on --eval-data or the synthetic eval rows; absent
     when the job had no eval set], ["eval_error": why the final evaluation failed (a malformed
     --eval-data line past --max-bad-lines), in their place], ["oracle_auc", "oracle_logloss": synthetic data],
     ["dense_norm": the L2 norm of the MLP the servers held at the evaluation (worker/dense.py); a worker's
     object has its own MLP's, as it ended],
     ["cache_hit_rate": examples-weighted mean of the workers' that report one, "cache_bytes_saved": their sum],
     "per_worker": [worker i's --metrics-out object; of a worker whose --resume-file says its run had ended
     before, while others trained on: {"ended_before": true, "train_examples": 0, "skipped_examples": that run's
     examples, "train_seconds": 0.0}]}
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ps.bytesize import human_bytes
from worker.progress_lines import ABOUT_BAR_FORMAT, about_total
from worker.results import NOT_EVALUATED, eval_lines, oracle_lines, skipped_note


def weighted_mean(pairs: Sequence[tuple[float, float]]) -> float | None:
    """sum(value * weight) / sum(weight) of (value, weight) pairs; the plain mean when the weights sum to 0; None
    for no pairs."""
    if not pairs:
        return None
    weight = sum(w for _, w in pairs)
    if weight <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / weight


def _number(report: dict, key: str) -> float | None:
    value = report.get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def merge_progress(reports: Sequence[dict], workers: int) -> dict:
    """The workers' latest PROGRESS reports as one: examples and examples_per_s summed, total summed (0 while a
    worker has not reported or reports 0: unknown; at_most when any worker's is an upper bound; estimated when any
    worker's is an estimate, the sum then kept below 100% by about_total), logloss the mean,
    cache_hit_rate examples-weighted (None when none reports one)."""
    totals = [_number(r, "total") or 0 for r in reports]
    losses = [x for x in (_number(r, "logloss") for r in reports) if x is not None]
    hits = [(h, _number(r, "examples") or 0) for r in reports if (h := _number(r, "cache_hit_rate")) is not None]
    examples = int(sum(_number(r, "examples") or 0 for r in reports))
    total = int(sum(totals)) if len(reports) == workers and all(totals) else 0
    estimated = bool(total) and any(r.get("estimated") for r in reports)
    return {
        "examples": examples,
        "total": about_total(examples, total) if estimated else total,
        "at_most": any(r.get("at_most") for r in reports),
        "estimated": estimated,
        "examples_per_s": sum(_number(r, "examples_per_s") or 0 for r in reports),
        "logloss": sum(losses) / len(losses) if losses else None,
        "cache_hit_rate": weighted_mean(hits),
        "cache_bytes_saved": sum(_number(r, "cache_bytes_saved") or 0 for r in reports),
    }


def format_progress(m: dict) -> str:
    """One line of merge_progress's figures."""
    bound = ("at most " if m.get("at_most") else "") + ("about " if m.get("estimated") else "")
    done = f"{m['examples']:,}" + (f" / {bound}{m['total']:,} examples ({m['examples'] / m['total']:.0%})"
                                   if m["total"] else " examples")  # fmt: skip
    parts = [f"progress: {done}", f"{m['examples_per_s']:,.0f} examples/s"]
    if m["logloss"] is not None:
        parts.append(f"logloss {m['logloss']:.4f}")
    if m["cache_hit_rate"] is not None:
        parts.append(f"cache hit rate {m['cache_hit_rate']:.3f}")
    if m.get("cache_bytes_saved"):
        parts.append(f"{human_bytes(m['cache_bytes_saved'])} not pulled")
    return ", ".join(parts)


class MergedProgress:
    """The workers' output and PROGRESS reports, shown together: one tqdm bar (examples of all workers over the
    sum of their totals; postfix the mean logloss and the hit rate) or, without a bar, format_progress's line
    every every_s seconds (tick()) and at the end (close()). Thread-safe: the output threads call report() and
    print()."""

    def __init__(self, workers: int, bar: bool, every_s: float = 10.0, out: Any = None):
        self.workers, self.bar, self.every_s, self.out = workers, bar, every_s, out
        self._reports: dict[int, dict] = {}
        self._lock = threading.Lock()
        self._next_line_at = time.monotonic() + every_s
        self._last_line = ""  # the merged line printed last (close() does not print it again)
        self._bar: Any = None

    def open(self) -> None:
        """Shows the bar (tqdm starts a monitor thread: after the workers are started)."""
        if self.bar:
            from tqdm import tqdm

            with self._lock:
                self._bar = tqdm(total=None, unit="ex", unit_scale=True, smoothing=0.1, desc=f"{self.workers} workers")

    def merged(self) -> dict:
        with self._lock:
            return merge_progress(list(self._reports.values()), self.workers)

    def latest(self) -> dict[int, dict]:
        """Each worker's last PROGRESS report, by worker index (those that sent one)."""
        with self._lock:
            return dict(self._reports)

    def report(self, worker: int, report: dict) -> None:
        with self._lock:
            self._reports[worker] = report
            if self._bar is None:
                return
            m = merge_progress(list(self._reports.values()), self.workers)
            self._bar.total = m["total"] or None
            if m.get("estimated"):  # no time left shown: the total is a guess
                self._bar.bar_format = ABOUT_BAR_FORMAT
            postfix = {} if m["logloss"] is None else {"logloss": f"{m['logloss']:.4f}"}
            if m["cache_hit_rate"] is not None:
                postfix["hit"] = f"{m['cache_hit_rate']:.3f}"
            if m.get("cache_bytes_saved"):
                postfix["saved"] = human_bytes(m["cache_bytes_saved"])
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(max(0, m["examples"] - self._bar.n))

    def print(self, text: str) -> None:
        """A line on stdout (above the bar)."""
        with self._lock:
            out = self.out or sys.stdout
            if self._bar is not None:
                self._bar.write(text, file=out)
            else:
                print(text, file=out, flush=True)

    def tick(self, now: float) -> None:
        """Without a bar: the merged line, when every_s have passed since the last (and a worker has reported)."""
        if self.bar or now < self._next_line_at:
            return
        self._next_line_at = now + self.every_s
        if self._reports:
            self._last_line = format_progress(self.merged())
            self.print(self._last_line)

    def close(self) -> None:
        """Closes the bar; without one, the last merged line (unless tick() printed it already)."""
        if not self.bar and self._reports and format_progress(self.merged()) != self._last_line:
            self.print(format_progress(self.merged()))
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None


def merge_metrics(per_worker: Sequence[dict], backends: Sequence[str], mode: str, evaluation: dict,
                  shards: int) -> dict:  # fmt: skip
    """The job's --metrics-out object (grammar in the module docstring) from the workers' and the evaluation's."""
    examples = sum(int(m.get("train_examples", 0)) for m in per_worker)
    seconds = max((float(m.get("train_seconds", 0.0)) for m in per_worker), default=0.0)
    skipped = sum(int(m.get("skipped_lines", 0)) for m in per_worker)
    resumed = sum(int(m.get("skipped_examples", 0)) for m in per_worker)
    out = {"workers": len(per_worker), "backends": list(backends), "mode": mode, "shards": shards,
           "train_examples": examples, **({"skipped_lines": skipped} if skipped else {}),
           **({"skipped_examples": resumed} if resumed else {}), "train_seconds": seconds,
           "examples_per_s": examples / seconds if seconds > 0 else 0.0}  # fmt: skip
    stopped = [m for m in per_worker if m.get("stopped_at_max_examples")]
    if stopped:  # the limit is the job's: every worker's is the same
        out.update(max_examples=int(stopped[0]["max_examples"]), stopped_at_max_examples=True)
    out.update({k: v for k, v in evaluation.items() if k.startswith("eval_")})
    out.update({k: evaluation[k] for k in ("oracle_auc", "oracle_logloss", "dense_norm") if k in evaluation})
    hits = [
        (m["cache_hit_rate"], m.get("train_examples", 0)) for m in per_worker if m.get("cache_hit_rate") is not None
    ]
    if hits:
        out["cache_hit_rate"] = weighted_mean(hits)
    saved = [m["cache_bytes_saved"] for m in per_worker if m.get("cache_bytes_saved") is not None]
    if saved:
        out["cache_bytes_saved"] = int(sum(saved))
    out["per_worker"] = list(per_worker)
    return out


def format_summary(m: dict) -> str:
    """merge_metrics's figures as lines, as format_results (worker/results.py) writes a worker's."""

    lines = [f"launched {m['workers']} worker{'s' * (m['workers'] != 1)} ({', '.join(m['backends'])}; mode {m['mode']}) on {m['shards']} "
             f"shard{'s' * (m['shards'] != 1)}: {m['train_examples']:,} examples{skipped_note(m)} in {m['train_seconds']:.1f} s (the slowest "
             f"worker): {m['examples_per_s']:,.0f} examples/s"]  # fmt: skip
    lines += _uneven(m)
    lines += (eval_lines(m) or [NOT_EVALUATED]) + oracle_lines(m)
    if "cache_hit_rate" in m:
        lines.append(f"cache  hit rate {m['cache_hit_rate']:.3f} (examples-weighted over the workers)")
    return "\n".join(lines)


UNEVEN = 1.5  # the most trained worker's examples over the least's from which the summary lists each worker's


def _uneven(m: dict) -> list[str]:
    """A line listing each worker's trained examples and epochs when they differ by UNEVEN or more (each worker
    stops on its own: early stopping on its own validation split, or a share of another size; and a resumed worker
    trains what its stopped run left, said beside it), else none: none either where no worker trained any."""
    per = m.get("per_worker") or []
    counts = [int(w.get("train_examples", 0)) for w in per]
    if len(counts) < 2 or max(counts) == 0 or min(counts) * UNEVEN > max(counts):
        return []

    def said(i: int, n: int, w: dict) -> str:
        notes = [f"{w['epochs_run']} epoch{'s' * (w['epochs_run'] != 1)}"] if "epochs_run" in w else []
        notes += ["stopped early"] if w.get("stopped_early") else []
        if w.get("ended_before"):
            notes.append(f"its run had ended before, after {w['skipped_examples']:,}")
        elif w.get("skipped_examples"):
            notes.append(f"resumed after {w['skipped_examples']:,}")
        return f"worker {i} {n:,}" + (f" ({', '.join(notes)})" if notes else "")

    each = ", ".join(said(i, n, w) for i, (n, w) in enumerate(zip(counts, per)))
    resumed = (
        "; a resumed worker trains what its stopped run left" if any(w.get("skipped_examples") for w in per) else ""
    )
    return [
        f"uneven examples per worker: {each}; each worker stops on its own (its early stopping, on its own "
        f"validation split, or the end of its share){resumed}"
    ]

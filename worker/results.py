"""What `ps-worker train`, `eval` and `launch` print of a run's figures (train's and evaluate_servers' dicts,
worker/train.py and worker/served.py; a job's, worker/launch_report.py): one labelled line per fact, the label padded
to 6 characters."""

from __future__ import annotations

import json
import math
from typing import Any

from ps.bytesize import human_bytes
from worker.recipe import METRIC_NAMES, WEAKER_L2_DIVISOR

NO_AUC = "undefined (its examples hold one label only)"
UNTRAINED = "trains no example"  # the words of a worker's error when its share left it none (DataSource.untrained)


def auc_text(value: float | None) -> str:
    """An AUC to 4 places; NO_AUC for nan (or None, as json_figures writes it): the set scored holds one label."""
    return NO_AUC if value is None or math.isnan(value) else f"{value:.4f}"


def json_figures(value: Any) -> Any:
    """value with every nan float (an AUC of examples of one label) as None: JSON's null, where json.dump would
    write NaN, which strict JSON readers refuse."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_figures(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_figures(v) for v in value]
    return value


def write_metrics(path: str, figures: dict, what: str) -> str | None:
    """Writes json_figures(figures) to path (--metrics-out). For a write that fails (a full disk), the error to
    report once the run's figures are printed, naming the flag and `what` was not written ("the run's figures");
    else None."""
    try:
        with open(path, "w") as f:
            json.dump(json_figures(figures), f, indent=2)
    except OSError as e:
        return f"--metrics-out {path}: could not write {what}: {e}"
    return None


def ended_figures(examples: int) -> dict:
    """The --metrics-out figures of a worker whose --resume-file says its run ended before, after examples: it
    trains none in this run; its examples are the job's, trained before it resumed (a launcher's
    launch_report.merge_metrics counts them so)."""
    return {"ended_before": True, "train_examples": 0, "skipped_examples": examples, "train_seconds": 0.0}


def format_evaluation(e: dict) -> str:
    mark = "  (best so far)" if e.get("best") else ""
    return (f"epoch {e['epoch']} step {e['step']:,}: train logloss {e['train_logloss']:.4f}  validation AUC "
            f"{auc_text(e['validation_auc'])} logloss {e['validation_logloss']:.4f}{mark}")  # fmt: skip


SLOW_FIRST_STEP_S = 5.0  # a first step this long, and a quarter of the training time or more, is pointed out


def first_step_note(r: dict) -> str:
    """'' or, when the first step took much of the training time, a note saying so (and why it is often so)."""
    first, total = r.get("first_step_seconds", 0.0), r.get("train_seconds", 0.0)
    if first < SLOW_FIRST_STEP_S or first < total / 4:
        return ""
    return (
        f" (the first step took {first:.1f} s of it: a fresh checkout's first run builds the compiled loops, "
        "kept for the next runs)"
    )


def _examples(n: int) -> str:
    return f"{n:,} example{'s' * (n != 1)}"


def format_results(r: dict, launched: bool = False) -> str:
    """A run's figures (train's, evaluate_servers') as lines. launched: a worker of `ps-worker launch`, which
    scores the job's model after all its workers and says so: no line of this worker's skipped evaluation."""
    lines = [f"created tables {', '.join(r['created_tables'])} for model {r['model']}"] if "created_tables" in r else []
    if "train_examples" in r:
        shards = f"{r['shards']} shard{'s' * (r['shards'] != 1)}"
        lines.append(f"trained {r['model']} ({r['backend']}, {r['device']}, worker {r['worker']}) on "
                     f"{_examples(r['train_examples'])}{skipped_note(r)} with {shards} in "
                     f"{r['train_seconds']:.1f} s: {r['examples_per_s']:,.0f} examples/s{first_step_note(r)}")  # fmt: skip
    if r.get("final_eval_skipped"):
        lines += [] if launched else [EVAL_LEFT_TO_LAUNCH]
    else:
        lines += eval_lines(r) or ([NOT_EVALUATED] if "train_examples" in r else [])
    if "synthetic_eval_rows" in r:
        start, stop = r["synthetic_eval_rows"]
        lines.append(f"data   synthetic rows {start:,} to {stop - 1:,} of seed {r['synthetic_seed']}: held out only "
                     f"from a training run of --synthetic-rows {start:,} or fewer with the same --synthetic-* flags")  # fmt: skip
    if "table_rows" in r:
        lines.append(f"table  {r['table_rows']:,} trained rows, {r['pending_ids']:,} ids seen but not admitted")
    if "best_validation_auc" in r:
        stop = "stopped early" if r.get("stopped_early") else "ran to its end"
        if r.get("stopped_at_max_examples") and not r.get("stopped_early"):
            stop = "stopped at --max-examples"
        kept = "the model kept is this best one" if r.get("model_is_best") else "the model kept is the last one"
        if r.get("best_copy_limit_bytes") and not r.get("model_is_best"):
            kept += (": its trained rows are more than early stopping copies to put the best back "
                     f"({human_bytes(r['best_copy_limit_bytes'])})")  # fmt: skip
        if r.get("best_ids_not_restored"):
            kept += ", but for " + ", ".join(f"{n:,} ids of table {t}" for t, n in r["best_ids_not_restored"].items())
            kept += " (dropped by a Shrink since it, not admitted again: they hold their initial rows)"
        if _workers(r) > 1:
            kept = "this worker's evaluations; the servers keep the job's model, which every worker trains"
        if r.get("skipped_examples"):  # a resumed run: the stopped run's evaluations are not in its curve
            kept += "; of this resumed run's evaluations only, its steps counted from the resume"
        metric = METRIC_NAMES.get(r.get("early_stop_metric", ""))
        by = f"best by {metric}; " if metric else ""
        lines.append(f"best   validation AUC {auc_text(r['best_validation_auc'])}  logloss {r['best_validation_logloss']:.4f}"
                     f"  at epoch {r['best_epoch']}{at_step(r)} ({by}{stop}; {kept})")  # fmt: skip
        last = (r.get("curve") or [{}])[-1]
        cut_short = r.get("stopped_early") or r.get("stopped_at_max_examples")  # more epochs would not run
        if not cut_short and not r.get("skipped_examples") and last.get("best") and r["best_epoch"] > 1:
            lines.append(still_improving(metric or "logloss", r.get("weaker_l2_toml", "")))
    lines += oracle_lines(r)
    return "\n".join(lines)


def still_improving(metric: str, weaker_l2: str) -> str:
    """The line under the best one of a run whose last epoch was its best: more epochs may help, and so may a
    weaker sparse l2 where the run's tables have one (weaker_l2: the --table-config file that gives it,
    model_tables.weaker_l2_toml; "": none has), its lines indented to be copied."""
    line = f"       the last epoch was the best: validation {metric} was still improving, so a larger --epochs"
    if not weaker_l2:
        return line + " may give a better model"
    toml = "\n".join(f"         {s}" for s in weaker_l2.splitlines())
    return (f"{line}, or a weaker sparse l2, may give a better model: e.g. this run's divided by "
            f"{WEAKER_L2_DIVISOR}, a file for --table-config of\n{toml}")  # fmt: skip


def skipped_note(r: dict) -> str:
    """The note after the examples trained of a run's figures (or a job's), " (N malformed lines skipped per
    pass)", when they count skipped lines of the training data, with "resumed after N examples" for a run that
    skipped a stopped run's N (its --skip-examples, or its --resume-file's position) and "stopped at --max-examples
    N" for one its limit ended; else ""."""
    skipped = r.get("skipped_lines") or 0
    notes = [f"{skipped:,} malformed {'line' if skipped == 1 else 'lines'} skipped per pass"] if skipped else []
    if r.get("skipped_examples"):
        notes.append(f"resumed after {r['skipped_examples']:,} examples")
    if r.get("stopped_at_max_examples"):
        notes.append(f"stopped at --max-examples {r['max_examples']:,}{', the job total' if _workers(r) > 1 else ''}")
    return f" ({'; '.join(notes)})" if notes else ""


EVAL_LEFT_TO_LAUNCH = (
    "eval   skipped (--no-final-eval): ps-worker launch scores the job's model once, after all workers; "
    "elsewhere, ps-worker eval scores a model kept on --servers"
)
NOT_EVALUATED = "eval   none: no eval set (give --eval-data to score the model on a held-out file)"


def local_shards_gone(command: str) -> str:
    """The closing line of a `ps-worker train` or `launch` (command) on --local-shards, after its summary."""
    return (f"model  gone: it was on local shards, stopped with this run: {command} with --servers to keep it for "
            "eval, predict and export")  # fmt: skip


def model_kept(servers: str) -> str:
    """The closing line of a `ps-worker train` or `launch` on --servers (comma-separated), after its summary."""
    return (f"model  kept on the servers: ps-worker eval and predict read it with --servers {servers} and this "
            "run's model and data flags, export into their --checkpoint-root; a train with them trains it further")  # fmt: skip


def _workers(r: dict) -> int:
    """The job's worker count of a worker's figures ("worker": "i/n"); 1 for others."""
    return int(str(r.get("worker", "0/1")).partition("/")[2] or 1)


def at_step(r: dict) -> str:
    """ ", step N" of the best evaluation, where the run evaluated every --eval-every steps."""
    return f", step {r['best_step']:,}" if r.get("eval_every") and r.get("best_step") is not None else ""


def eval_lines(r: dict) -> list[str]:
    """The eval line of a run's (or a job's) figures, if they have one."""
    if "eval_error" in r:
        return [f"eval   failed: {r['eval_error']}"]
    if "eval_auc" not in r:
        return []
    when = ""
    if "train_examples" in r and _workers(r) > 1:
        when = "; the model as this worker finished, which others may have trained since: ps-worker eval scores the "
        when += "final one"
    if "eval_auc_tie_share" in r:  # past the examples kept exactly: the AUC of a histogram (ScoreStream)
        when += (f"; AUC over probability bins, within {r['eval_auc_tie_share'] / 2:.1e} of the exact one, past "
                 f"{r['eval_auc_exact_examples']:,} examples")  # fmt: skip
    if r.get("eval_bad_lines"):  # eval's own read (not a training run's, whose summary says its own)
        bad = r["eval_bad_lines"]
        when += f"; {bad:,} malformed line{'s' * (bad != 1)} skipped (--max-bad-lines)"
    line = f"eval   AUC {auc_text(r['eval_auc'])}  logloss {r['eval_logloss']:.4f}  ({_examples(r['eval_examples'])}{when})"
    return [line, *_baseline(r)]


def _baseline(r: dict) -> list[str]:
    """The line under the eval line: the eval set's share of positives and the logloss of predicting it for every
    example (AUC 0.5), which a model that learned anything beats (an eval set of one class has none: the line says
    so); none when the figures lack it."""
    if "eval_constant_logloss" not in r:
        return []
    rate = r["eval_positive_rate"]
    if rate in (0.0, 1.0):
        return [f"base   {rate:.1%} positive: the eval data holds one class, so no figure to beat: predicting "
                f"{rate:.0f} for every example gives logloss 0 (and AUC is undefined)"]  # fmt: skip
    auc = "" if r.get("eval_auc") != r.get("eval_auc") else " (AUC 0.5)"  # NaN: no AUC
    return [f"base   {rate:.1%} positive: predicting that rate for every example gives logloss "
            f"{r['eval_constant_logloss']:.4f}{auc}, the figure to beat"]  # fmt: skip


def oracle_lines(r: dict) -> list[str]:
    """The planted model's line and the gap to it, for figures on synthetic data."""
    if "oracle_auc" not in r:
        return []
    lines = [f"oracle AUC {auc_text(r['oracle_auc'])}  logloss {r['oracle_logloss']:.4f}  (the planted model)"]
    if "eval_auc" in r and not math.isnan(r["oracle_auc"] - r["eval_auc"]):
        lines.append(f"gap    AUC {r['oracle_auc'] - r['eval_auc']:+.4f}")
    return lines

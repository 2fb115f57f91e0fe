"""The training step and evaluation: rows of a batch per table, forward/backward locally, gradients pushed.

    for each batch:  ids of each table deduplicated across all of the batch's fields and bags (batch.table_ids)
                     rows = source.rows(step, ids)       # by mode (worker/steprows.py): pulled ahead on a thread
                                                         # with --prefetch k; async lays the rows its last pushes
                                                         # returned over them; sync and ssp pulls wait on the
                                                         # servers' clock; geo reads local copies
                     probs, row grads per table, dense grads = backend.forward_backward(ModelInputs, params, labels)
                     + dense_l2 * W on the dense weights (the sparse tables' L2 is the servers': TableConfig.l2)
                     source.push(step, per table: unique ids, summed grads, clicks, shows; with an inline dense
                                 path the MLP's gradients when a sync is due)   # one clock advance
                     dense.step(dense grads) otherwise   # background PS push, or allreduce (worker/allreduce.py)
A resumed run (--skip-examples N) reads and drops the first N examples of the stream before its first step; with
--max-examples the stream ends at the worker's limit (counted from the stream's start, over epochs, the skipped
examples included), part way through an epoch if need be, and the run ends as at its last epoch's end.
Every --eval-every steps (or at the end of each epoch) the validation set is evaluated: AUC and logloss, printed
and kept in the run's curve; with --early-stop P training stops once validation logloss has not improved for P
evaluations in a row. With restore_best (one worker, the PS dense path), the model the tables hold at the best
evaluation comes back at the end: at each new best the worker copies the rows of every id it has trained and the
dense parameters (BestModel), and at the end pushes best - current as add-delta pushes (the optimizer's state
stays as it is). Ids first trained after the best keep their values. When the loop ends (its data, or an early
stop), source.finish() tells the servers this worker is done, so that no other worker waits for it (when an
error, Ctrl-C or SIGTERM ends it before, worker.train has source.abandon tell them it stopped). A ValueError
raised while the training batches are read and prepared (a malformed line past --max-bad-lines, most often) comes
out as TrainingDataError, which says how many steps had pushed by then; a shard's refusal of a pull made there (a
PsError) comes out as it is. The training time (examples/s) leaves out
the evaluations.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from ps.errors import PsError
from ps.progress import CountProgress
from worker.batch import Batch, TableIds, table_ids
from worker.client import PushItem
from worker.dense import DensePath, DenseSync
from worker.dense import table_name as dense_table
from worker.metrics import RunningMean, auc, logloss
from worker.models.spec import FieldInput, ModelInputs, ModelSpec
from worker.pipeline import prefetched
from worker.progress_lines import ABOUT_BAR_FORMAT, JSON_EVERY_S, about_total, progress_line
from worker.steprows import AsyncRows, pull_rows
from worker.terminate import signals_after_step


@dataclass
class LoopSettings:
    """What run_epochs needs of the run's configuration."""

    epochs: int = 1
    prefetch: int = 1
    dense_l2: float = 0.0  # on the dense weights (not the biases)
    eval_every: int = 0  # steps between evaluations of the validation set (and at each epoch's end); 0: at the end of
    # each epoch only
    early_stop: int = 0  # stop after this many evaluations without a better validation logloss; 0: never
    restore_best: bool = False  # end with the model of the best evaluation (one worker only)
    progress: bool = True
    progress_lines: bool = False  # 'PROGRESS {json}' lines on stdout (for ps-worker launch)
    worker: int = 0  # this worker's id, in progress lines
    total_examples: int = 0  # the progress bar's total for one epoch
    total_estimated: bool = False  # total_examples is an estimate from the file's bytes (worker/linecount.py)
    skip_examples: int = 0  # the first examples of the stream (over epochs) dropped untrained: a resumed run's
    max_examples: int = 0  # the stream (over epochs, the skipped examples included) ends here; 0: no limit


@dataclass
class LoopResult:
    examples: int = 0  # trained: their pushes answered
    seconds: float = 0.0
    steps: int = 0
    epoch: int = 0  # the epoch being trained (from 1)
    trained_all: bool = False  # every step ran (what follows: the last pushes, putting the best model back)
    in_flight: int = 0  # examples of the step under way (its push may have reached the servers), 0 between steps
    train_logloss: float = math.nan
    curve: list[dict] = field(default_factory=list)  # one entry per evaluation of the validation set
    stopped_early: bool = False
    stopped_at_limit: bool = False  # the stream reached settings.max_examples
    best: dict | None = None  # the curve's entry with the lowest validation logloss
    restored_best: bool = False  # the tables hold the model of `best` (else the last one)
    source_stats: dict = field(default_factory=dict)  # the row source's: cache hit rate, bytes saved


def model_inputs(spec: ModelSpec, batch: Batch, tids: dict[str, TableIds], rows: dict[str, np.ndarray]) -> ModelInputs:
    """The backend's view of a batch whose tables' unique rows are `rows`."""
    fields = {}
    for f in spec.fields:
        bags = batch.fields[f.name]
        fields[f.name] = FieldInput(tids[f.table].index[f.name], bags.offsets, bags.weights, bags.is_one_per_example())
    return ModelInputs(rows, fields, batch.dense_or_empty())


def field_tables(spec: ModelSpec) -> dict[str, str]:
    return {f.name: f.table for f in spec.fields}


def predictions(
    tables: Any, spec: ModelSpec, backend: Any, dense_values: dict, batches: Iterable[Batch], prefetch: int = 1
) -> Iterator[tuple[Batch, np.ndarray]]:
    """(batch, its probabilities (n,)) of each batch, in order, as the model the tables hold now and dense_values
    give them. prefetch k: a pipeline of three stages, each up to k batches ahead of the next (worker/pipeline.py
    prefetched): one thread reads and parses the batches and finds their ids per table, another pulls their rows
    (a pull waits on the servers without the GIL), and the caller's thread scores one batch while both work
    ahead; 0: each batch read, pulled and scored in turn. Scoring pushes nothing, so a row pulled ahead is the row
    a pull in turn would give, unless another worker pushes meanwhile (as it may between pulls in turn)."""
    tmap = field_tables(spec)
    parsed = prefetched(batches, lambda batch: table_ids(batch, tmap), prefetch)  # (batch, tids)
    ahead = prefetched(parsed, lambda item: pull_rows(tables, spec, item[1]), prefetch)
    try:
        for (batch, tids), rows in ahead:
            yield batch, backend.predict(model_inputs(spec, batch, tids, rows), dense_values)
    finally:  # stopped early (an error, Ctrl-C): the thread stops reading
        ahead.close()


class ScoringProgress(CountProgress):
    """The progress of scoring a file (eval, predict) as train shows its own (ps.progress: a bar, or a plain
    'progress: ...' line). total: the lines of the file, an estimate (0: unknown); estimated: total is a guess from
    bytes (worker/linecount.py), shown with no time left and never as 100% until close()."""

    def __init__(self, total: int, on: bool, estimated: bool = False):
        self.estimated = estimated and total > 0
        super().__init__(total, on, unit="ex", bar_format=ABOUT_BAR_FORMAT if self.estimated else None)

    def advance_bar(self, n: int) -> None:
        _advance(self.bar, n, self.estimated)

    def line(self, rate: float) -> str:
        total = about_total(self.done, self.total) if self.estimated else max(self.total, self.done)
        about = "about " if self.estimated else ""
        of = f" of {about}{total:,} ({self.done / total:.0%})" if self.total else ""
        return f"progress: {self.done:,}{of} examples scored, {rate:,.0f} examples/s"

    def close(self) -> None:
        if not self.bar.disable:
            self.bar.total = self.bar.n
        super().close()


def evaluate(
    tables: Any,
    spec: ModelSpec,
    backend: Any,
    dense_values: dict,
    batches: Iterable[Batch],
    progress: ScoringProgress | None = None,
    prefetch: int = 1,
) -> dict:
    """AUC and logloss of the model the tables hold now, on batches (and the oracle's, for synthetic data);
    progress, when given, is advanced by each batch and closed at the end. Batches are read and their rows pulled
    up to `prefetch` ahead of the one scored (predictions)."""
    labels, preds, oracle = [], [], []
    scored = predictions(tables, spec, backend, dense_values, batches, prefetch)
    try:
        for batch, probs in scored:
            labels.append(batch.labels)
            preds.append(probs)
            if batch.probs is not None:
                oracle.append(batch.probs)
            if progress is not None:
                progress.update(len(batch))
    finally:
        scored.close()
        if progress is not None:
            progress.close()
    if not labels:
        return {}
    y, p = np.concatenate(labels), np.concatenate(preds)
    out = {"eval_examples": int(len(y)), "eval_auc": auc(y, p), "eval_logloss": logloss(y, p)}
    if oracle and len(oracle) == len(labels):
        q = np.concatenate(oracle)
        out.update(oracle_auc=auc(y, q), oracle_logloss=logloss(y, q))
    return out


STEP_GRACE_S = 5.0  # a signal inside a step waits this long at most for the step's push (signals_after_step)
MAX_BEST_FLOATS = 64 << 20  # BestModel copies at most this many floats (256 MiB); past it, no restore


class BestModel:
    """The ids trained so far per table and, at each new best, a copy of their rows and of the dense parameters;
    restore() pushes the difference back (see the module docstring)."""

    def __init__(self, tables: Any, spec: ModelSpec):
        self.tables, self.spec = tables, spec
        self.seen: dict[str, list[np.ndarray]] = {t: [] for t in spec.table_dims()}
        self.rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.dense: dict[str, np.ndarray] = {}
        self.too_big = False

    def add(self, tids: dict[str, TableIds]) -> None:
        for t, ti in tids.items():
            seen = self.seen[t]
            seen.append(ti.uniq)
            if len(seen) >= 64:
                self.seen[t] = [np.unique(np.concatenate(seen))]

    def keep(self, dense_values: dict[str, np.ndarray]) -> None:
        ids = {t: np.unique(np.concatenate(s)) if s else np.zeros(0, np.uint64) for t, s in self.seen.items()}
        self.seen = {t: [u] for t, u in ids.items()}
        floats = sum(len(u) * self.spec.row_dim(t) for t, u in ids.items())
        if floats > MAX_BEST_FLOATS:
            self.too_big, self.rows = True, {}
            return
        pulled = self.tables.pull_many(list(ids.items()))
        self.rows = {t: (u, r.copy()) for (t, u), r in zip(ids.items(), pulled)}
        self.dense = {k: v.copy() for k, v in dense_values.items()}

    def restore(self, dense: DenseSync) -> bool:
        """Pushes best - current for every kept row and dense parameter; False if nothing was kept."""
        if self.too_big or not self.rows:
            return False
        items = [(t, u) for t, (u, _) in self.rows.items()]
        now = self.tables.pull_many(items)
        pushes = [
            PushItem(t, u, self.rows[t][1] - cur, shows=np.zeros(len(u), np.float32)) for (t, u), cur in zip(items, now)
        ]
        current = dense.pull()  # a DenseSync (restore_best runs with the PS dense path only)
        for p in dense.params:
            name = p.name
            pushes.append(PushItem(dense_table(p), dense.ids[name], self.dense[name] - current[name],
                                   shows=np.zeros(p.shape[0], np.float32)))  # fmt: skip
        self.tables.push_many(pushes, add_delta=True)
        dense.pull()
        return True


class TrainingDataError(ValueError):
    """A ValueError raised while the training batches were read and prepared (a malformed line, most often), after
    `steps` steps of `examples` examples had pushed their updates to the tables."""

    def __init__(self, message: str, steps: int, examples: int):
        super().__init__(message)
        self.steps, self.examples = steps, examples


def _read_errors_named(batches: Iterable, result: LoopResult) -> Iterator:
    """batches, with a ValueError their iterator raises re-raised as TrainingDataError (steps so far); a shard's
    refusal of a pull made on the way (a PsError) passes as it is."""
    try:
        yield from batches
    except PsError:
        raise
    except ValueError as e:
        raise TrainingDataError(str(e), result.steps, result.examples) from e


class _Limit:
    """Passes on the first `left` examples of the batches it is given (the last batch cut to fit), over as many
    epochs' streams as that takes, then nothing; left 0: no limit. `reached`: the limit ended the stream."""

    def __init__(self, left: int):
        self.on, self.left, self.reached = left > 0, left, False

    def __call__(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        if not self.on:
            yield from batches
            return
        if self.reached:
            return
        it = iter(batches)
        try:
            for batch in it:
                if len(batch) >= self.left:
                    yield batch if len(batch) == self.left else batch.slice(0, self.left)
                    self.left, self.reached = 0, True
                    return
                self.left -= len(batch)
                yield batch
        finally:
            close = getattr(it, "close", None)
            if close is not None:  # a file's reader, left part way: closed now, not when collected
                close()


class _Skipping:
    """Drops the first `left` examples of the batches it is given, over as many epochs' streams as that takes;
    `seconds` is the time spent reading them."""

    def __init__(self, left: int):
        self.left, self.seconds = left, 0.0

    def __call__(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        started = time.perf_counter() if self.left else None
        for batch in batches:
            if self.left >= len(batch):
                self.left -= len(batch)
                continue
            if self.left:
                batch, self.left = batch.slice(self.left, len(batch)), 0
            if started is not None:
                self.seconds += time.perf_counter() - started
                started = None
            yield batch
        if started is not None:
            self.seconds += time.perf_counter() - started


class _Step:
    """One training step of a prepared batch: its rows from the source, forward/backward, the gradients pushed
    (with the MLP's when the dense path is inline and a sync is due), the MLP's step; returns the predictions."""

    def __init__(self, spec: ModelSpec, backend: Any, dense: DensePath, source: Any, dense_l2: float):
        self.spec, self.backend, self.dense, self.source, self.dense_l2 = spec, backend, dense, source, dense_l2
        self.pusher = ThreadPoolExecutor(1, thread_name_prefix="push")  # idle between steps; shut by the loop

    def __call__(self, item: _Prepared) -> np.ndarray:
        dense, source, batch, tids = self.dense, self.source, item.batch, item.tids
        rows = source.rows(item.step, tids, item.rows)
        probs, row_grads, dense_grads = self.backend.forward_backward(
            model_inputs(self.spec, batch, tids, rows), dense.values, batch.labels
        )
        if self.dense_l2:
            for name, g in dense_grads.items():
                if not name.endswith(".bias"):
                    g += np.float32(self.dense_l2) * dense.values[name]
        if dense.inline:  # the MLP's push goes with the rows' push when one is due
            due = dense.add(dense_grads)
            returned = source.push(item.step, tids, row_grads, dense.push_items() if due else [])
            if due:
                dense.take(returned)
        else:  # the rows' push in flight (on a thread) while the MLP's step runs here
            pushing = self.pusher.submit(source.push, item.step, tids, row_grads, [])
            dense.step(dense_grads)
            pushing.result()
        return probs


class _Prepared:
    __slots__ = ("step", "batch", "tids", "rows")

    def __init__(self, step: int, batch: Batch, tids: dict[str, TableIds], rows: dict[str, np.ndarray] | None):
        self.step, self.batch, self.tids, self.rows = step, batch, tids, rows


def _advance(bar: tqdm, n: int, estimated: bool = False) -> None:
    """bar.update(n), its total grown to the new count first when n would take it past the total (an estimate:
    the data's line count, the split's expected share), so that the bar never shows more than 100%; estimated
    (a total from bytes): never 100% either, until the run's end (about_total)."""
    if bar.total and estimated:
        bar.total = about_total(bar.n + n, bar.total)
    elif bar.total and bar.n + n > bar.total:
        bar.total = bar.n + n
    bar.update(n)


def _close_at_count(bar: tqdm) -> None:
    """Closes the bar at the true count: its total set to the examples trained (fewer than the estimate when
    lines were malformed or training stopped early)."""
    if not bar.disable:
        bar.total = bar.n
    bar.close()


class _ProgressLines:
    """PROGRESS lines on stdout every `every_s` seconds (ps-worker train --progress-lines, read by launch; grammar in
    worker/progress_lines.py); or, plain, 'progress: ...' lines for a person on stderr (a bar's redraws would fill
    a log file)."""

    JSON_EVERY_S, PLAIN_EVERY_S = JSON_EVERY_S, 30.0

    def __init__(self, worker: int, total: int, plain: bool = False, every_s: float | None = None,
                 at_most: bool = False, estimated: bool = False):  # fmt: skip
        self.worker, self.total, self.plain, self.at_most = worker, total, plain, at_most
        self.estimated = estimated and total > 0
        self.every_s = every_s if every_s is not None else self.PLAIN_EVERY_S if plain else self.JSON_EVERY_S
        self.last = time.perf_counter()

    def update(self, result: LoopResult, logloss: float, started: float, extra: dict, final: bool = False,
               stopped: bool = False) -> None:  # fmt: skip
        """A line every every_s seconds; at once when final (the run's end: its total the examples trained) or
        stopped (an error or a signal ended it: the total stays what the run meant to train)."""
        now = time.perf_counter()
        if not (final or stopped) and now - self.last < self.every_s:
            return
        self.last = now
        total = result.examples if final else max(self.total, result.examples)  # the total was an estimate
        estimated = self.estimated and not final
        total = about_total(result.examples, total) if estimated else total
        line = {"worker": self.worker, "examples": result.examples, "steps": result.steps, "total": total,
                "logloss": None if math.isnan(logloss) else round(logloss, 5),
                "examples_per_s": round(result.examples / max(now - started, 1e-9), 1), **extra}  # fmt: skip
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
                  f"examples/s{loss}", file=sys.stderr, flush=True)  # fmt: skip
        else:
            print(progress_line(line), flush=True)


def run_epochs(
    tables: Any,
    spec: ModelSpec,
    backend: Any,
    dense: DensePath,
    train_batches: Callable[[], Iterable[Batch]],
    settings: LoopSettings,
    validation: list[Batch] | None = None,
    telemetry: Any = None,
    on_eval: Callable[[dict], None] | None = None,
    source: Any = None,
    result: LoopResult | None = None,
) -> LoopResult:
    """Trains for settings.epochs passes over train_batches() (called once per epoch); returns what happened.
    `tables` is a Client (or anything with its pull_many / push_many); `dense` a dense path (worker/dense.py
    DenseSync, worker/allreduce.py AllReduceDense); `source` where rows come from and pushes go by mode
    (worker/steprows.py; default: AsyncRows). on_eval receives each curve entry. `result`, when given, is filled
    as training goes: a caller reads how far it got after an exception.

    settings.skip_examples: that many examples of the stream are read and dropped before the first step (whole
    epochs when it holds more; not training time); an epoch they cover whole is not validated.
    settings.max_examples: the stream (the skipped examples included) ends after that many examples, part way
    through an epoch if need be; the run then ends as at its last epoch's end (the validation set evaluated,
    result.stopped_at_limit)."""
    s = settings
    result = result if result is not None else LoopResult()
    running = RunningMean(0.95)
    started = time.perf_counter()
    plain = s.progress and not s.progress_lines and not sys.stderr.isatty()  # a log file: lines, not a bar
    planned = s.total_examples * s.epochs
    total = max(0, (min(planned, s.max_examples) if s.max_examples else planned) - s.skip_examples)
    skipping, limit = _Skipping(s.skip_examples), _Limit(s.max_examples)
    desc = f"skipping {s.skip_examples:,} examples" if s.skip_examples else None  # until the first step trains
    estimated = s.total_estimated and total > 0
    bar = tqdm(total=total, desc=desc, unit="ex", unit_scale=True, disable=not s.progress or plain, smoothing=0.1,
               bar_format=ABOUT_BAR_FORMAT if estimated else None)  # fmt: skip
    at_most = bool(s.early_stop) and s.epochs > 1  # early stopping may end the run before its last epoch
    lines = (_ProgressLines(s.worker, total, plain, at_most=at_most, estimated=estimated)
             if s.progress_lines or plain else None)  # fmt: skip
    tmap = field_tables(spec)
    source = source if source is not None else AsyncRows(tables, spec, s.prefetch)
    since_best = 0
    best_model = BestModel(tables, spec) if s.restore_best and validation else None
    step_counter = iter(range(1 << 62))  # the worker's steps over all epochs, numbered as its batches are read

    def prepare(batch: Batch) -> _Prepared:  # on the prefetch thread when depth > 0
        step = next(step_counter)
        tids = table_ids(batch, tmap)
        return _Prepared(step, batch, tids, source.prepare(step, tids))

    def evaluation(epoch: int) -> bool:
        """Evaluates the validation set; True when training should stop."""
        nonlocal since_best, eval_seconds
        if not validation:
            return False
        eval_started = time.perf_counter()
        if not dense.collective:  # the PS path: its pending gradients applied first (allreduce's values are
            dense.flush()  # current, and its flush is a step of every worker: not here)
        figures = evaluate(tables, spec, backend, dense.values, validation, prefetch=s.prefetch)
        entry = {"epoch": epoch, "step": result.steps, "examples": result.examples,
                 "train_logloss": running.value, "validation_auc": figures["eval_auc"],
                 "validation_logloss": figures["eval_logloss"]}  # fmt: skip
        improved = result.best is None or entry["validation_logloss"] < result.best["validation_logloss"]
        if improved:
            result.best, since_best = entry, 0
            if best_model is not None:
                best_model.keep(dense.values)
        else:
            since_best += 1
        entry["best"] = improved
        result.curve.append(entry)
        if on_eval is not None:
            on_eval(entry)
        eval_seconds += time.perf_counter() - eval_started
        return bool(s.early_stop) and since_best >= s.early_stop

    stop = False
    eval_seconds = 0.0  # evaluating the validation set: not training time
    step = _Step(spec, backend, dense, source, s.dense_l2)
    try:
        for epoch in range(s.epochs):
            step_started = time.perf_counter()
            result.epoch, steps_before = epoch + 1, result.steps
            source.start_epoch()
            batches = prefetched(skipping(limit(train_batches())), prepare, s.prefetch)
            try:
                for _, item in _read_errors_named(batches, result):
                    batch = item.batch
                    if best_model is not None:
                        best_model.add(item.tids)
                    with signals_after_step(STEP_GRACE_S):  # a Ctrl-C or SIGTERM here waits for the step's count
                        n = result.in_flight = len(batch)  # a stop inside the step may come after its push arrived
                        probs = step(item)  # its push answered: counted below
                        result.examples += n
                        result.steps += 1
                        result.in_flight = 0
                    running.update(logloss(batch.labels, probs))
                    if telemetry is not None:
                        now = time.perf_counter()
                        telemetry.step(n, now - step_started, running.value)
                        step_started = now
                    if desc is not None:  # the first step after a skip: the bar's clock and rate start here
                        desc = None
                        bar.set_description_str(None, refresh=False)
                        bar.reset(bar.total)
                    _advance(bar, n, estimated)
                    cache = source.stats()
                    postfix = {"epoch": epoch + 1, "logloss": f"{running.value:.4f}"}
                    if "cache_hit_rate" in cache:
                        postfix["hits"] = f"{cache['cache_hit_rate']:.0%}"
                    if "cache_bytes_saved" in cache:
                        postfix["saved"] = f"{cache['cache_bytes_saved'] / (1 << 20):,.0f}MiB"
                    bar.set_postfix(postfix, refresh=False)
                    if lines is not None:  # their rate leaves out the time a resumed run spent skipping
                        lines.update(result, running.value, started + skipping.seconds, cache)
                    if s.eval_every and result.steps % s.eval_every == 0 and evaluation(epoch + 1):
                        stop = True
                        break
            finally:
                if stop:  # this worker is done: no other worker waits for it, nor its own prefetched stamped pull
                    source.finish()
                batches.close()
            if stop:
                break
            validated = s.eval_every and result.steps % s.eval_every == 0  # its last step's evaluation was the end's
            if result.steps == steps_before and s.skip_examples:  # an epoch skipped whole
                continue
            if not validated and evaluation(epoch + 1):
                stop = True
                break
            if limit.reached:  # no epoch after it
                break
    except BaseException:  # how far it got, for launch (a stopped worker's last PROGRESS line)
        if lines is not None and not lines.plain:
            lines.update(result, running.value, started + skipping.seconds, {}, stopped=True)
        raise
    result.trained_all = True
    step.pusher.shutdown()
    source.finish()
    dense.finish()  # the MLP's last gradients applied (allreduce: with the others')
    result.seconds = time.perf_counter() - started - eval_seconds - skipping.seconds
    if best_model is not None and result.curve and not result.curve[-1]["best"]:
        result.restored_best = best_model.restore(dense)
    _close_at_count(bar)
    result.train_logloss = running.value
    result.stopped_early = stop
    result.stopped_at_limit = bool(s.max_examples) and s.skip_examples + result.examples >= s.max_examples
    result.source_stats = source.stats()
    if lines is not None:
        lines.update(result, running.value, started + skipping.seconds, result.source_stats, final=True)
    return result

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
and kept in the run's curve; with --early-stop P training stops once the validation figure of
--early-stop-metric (logloss, lower is better; or AUC, higher) has not improved for P evaluations in a row. With restore_best (one worker, the PS dense path), the model the tables hold at the best
evaluation comes back at the end (worker/best.py BestModel), before the worker says it is done: its job holds the
shards meanwhile, and the restore's deltas carry its stamp (source.push_apart), so they land in its own tables. When the loop ends (its data, or an early
stop), source.finish() tells the servers this worker is done, so that no other worker waits for it: after the
MLP's last pushes, when dense.finish calls it (allreduce: the MLP written before the last workers say so). When an
error, Ctrl-C or SIGTERM ends it before, source.abandon tells them it stopped (allreduce: the writer writes the MLP
before, save_dense_on_stop), and geo pushes the deltas it holds, before the stopped worker's last PROGRESS line;
an error in the pushes that end the run, geo's last deltas or the MLP's last gradients, ends it with that line
too, counting what the servers hold. A ValueError
raised while the training batches are read and prepared (a malformed line past --max-bad-lines, most often) comes
out as TrainingDataError, which says how many steps had pushed by then; a shard's refusal of a pull made there (a
PsError) comes out as it is. The training time (examples/s) leaves out
the evaluations.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ps.errors import PsError
from ps.terminate import signals_after_step
from worker.allreduce_stop import save_dense_on_stop
from worker.batch import Batch, table_ids
from worker.best import BestModel
from worker.dense import DensePath
from worker.loop_progress import _ProgressLines
from worker.metrics import RunningMean, logloss
from worker.models.spec import ModelSpec
from worker.pipeline import prefetched
from worker.progress_lines import ExamplesProgress
from worker.scoring import evaluate, field_tables
from worker.step import Prepared, Step
from worker.steprows import AsyncRows
from worker.stopping import abandon
from worker.train_stream import Limit, Skipping

log = logging.getLogger("worker.loop")


@dataclass
class LoopSettings:
    """What run_epochs needs of the run's configuration."""

    epochs: int = 1
    prefetch: int = 1
    dense_l2: float = 0.0  # on the dense weights (not the biases)
    eval_every: int = 0  # steps between evaluations of the validation set (and at each epoch's end); 0: at the end of
    # each epoch only
    early_stop: int = 0  # stop after this many evaluations without a better validation figure; 0: never
    early_stop_metric: str = "logloss"  # the figure the stop and the best evaluation go by: logloss or auc
    restore_best: bool = False  # end with the model of the best evaluation (one worker only)
    progress: bool = True
    progress_lines: bool = False  # 'PROGRESS {json}' lines on stdout (ps-worker launch merges them)
    worker: int = 0  # this worker's id, in progress lines
    total_examples: int = 0  # the progress bar's total for one epoch
    total_estimated: bool = False  # total_examples is an estimate from the file's bytes (worker/linecount.py)
    skip_examples: int = 0  # the first examples of the stream (over epochs) dropped untrained: a resumed run's
    max_examples: int = 0  # the stream (over epochs, the skipped examples included) ends here; 0: no limit
    weight_bounds: dict[str, float] = field(default_factory=dict)  # {table: weight_bound} of those with one
    half_at_rest: frozenset[str] = frozenset()  # the tables of values_at_rest "float16"


@dataclass
class LoopResult:
    examples: int = 0  # trained: their pushes answered
    pushed: int = 0  # of `examples`, those whose updates the servers hold (geo holds some steps' deltas locally)
    seconds: float = 0.0
    first_step_seconds: float = 0.0  # of `seconds`: the first step's (with a fresh checkout's compiling in it)
    steps: int = 0
    epoch: int = 0  # the epoch being trained (from 1)
    trained_all: bool = False  # every step ran (what follows: the last pushes, putting the best model back)
    in_flight: int = 0  # examples of the step under way (its push may have reached the servers), 0 between steps
    train_logloss: float = math.nan
    curve: list[dict] = field(default_factory=list)  # one entry per evaluation of the validation set
    stopped_early: bool = False
    stopped_at_limit: bool = False  # the stream reached settings.max_examples
    best: dict | None = None  # the curve's entry with the best validation figure (settings.early_stop_metric)
    restored_best: bool = False  # the tables hold the model of `best` (else the last one) ...
    best_not_restored: dict[str, int] = field(default_factory=dict)  # ... but these ids per table (worker/best.py)
    best_too_big_bytes: int = 0  # > 0: BestModel kept nothing, the rows trained being more than this many bytes
    source_stats: dict = field(default_factory=dict)  # the row source's: cache hit rate, bytes saved


STEP_GRACE_S = 5.0  # a signal inside a step waits this long at most for the step's push (signals_after_step)


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


def run_epochs(
    tables: Any,
    spec: ModelSpec,
    backend: Any,
    dense: DensePath,
    train_batches: Callable[[int], Iterable[Batch]],
    settings: LoopSettings,
    validation: list[Batch] | None = None,
    telemetry: Any = None,
    on_eval: Callable[[dict], None] | None = None,
    source: Any = None,
    result: LoopResult | None = None,
    on_pushed: Callable[[int], None] | None = None,
) -> LoopResult:
    """Trains for settings.epochs passes over train_batches(epoch) (called once per epoch, numbered from 1, an
    epoch skipped whole included: DataSource.train, whose shuffled order is the epoch's); returns what happened.
    `tables` is a Client (or anything with its pull_many / push_many); `dense` a dense path (worker/dense.py
    DenseSync, worker/allreduce.py AllReduceDense); `source` where rows come from and pushes go by mode
    (worker/steprows.py; default: AsyncRows). on_eval receives each curve entry. `result`, when given, is filled
    as training goes: a caller reads how far it got after an exception. on_pushed(n) is told result.pushed after
    every step (worker/resume.py keeps it).

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
    skipping, limit = Skipping(s.skip_examples), Limit(s.max_examples)
    desc = f"skipping {s.skip_examples:,} examples" if s.skip_examples else None  # until the first step trains
    estimated = s.total_estimated and total > 0
    # the bar alone, on a terminal (no tqdm where it is not shown): the loop's lines, plain in a log or PROGRESS
    # (--progress-lines), are _ProgressLines', whose rate leaves out evaluations and skipping
    bar = ExamplesProgress(total, s.progress and sys.stderr.isatty(), estimated, desc)
    at_most = bool(s.early_stop) and s.epochs > 1  # early stopping may end the run before its last epoch
    lines = (_ProgressLines(s.worker, total, plain, at_most=at_most, estimated=estimated)
             if s.progress_lines or plain else None)  # fmt: skip
    tmap = field_tables(spec)
    source = source if source is not None else AsyncRows(tables, spec, s.prefetch)
    since_best = 0
    best_model = (
        BestModel(tables, spec, s.weight_bounds, source, s.half_at_rest) if s.restore_best and validation else None
    )
    step_counter = iter(range(1 << 62))  # the worker's steps over all epochs, numbered as its batches are read

    holding = getattr(source, "holding", lambda: False)  # geo: steps whose deltas it has not pushed yet

    def prepare(batch: Batch) -> Prepared:  # on the prefetch thread when depth > 0
        step = next(step_counter)
        tids = table_ids(batch, tmap)
        return Prepared(step, batch, tids, source.prepare(step, tids))

    def evaluation(epoch: int) -> bool:
        """Evaluates the validation set; True when training should stop."""
        nonlocal since_best, eval_seconds
        if not validation:
            return False
        eval_started = time.perf_counter()
        source.settle()  # geo: its pending deltas pushed, so that the model validated is the one trained so far
        result.pushed = result.examples
        if not dense.collective:  # the PS path: its pending gradients applied first (allreduce's values are
            dense.flush()  # current, and its flush is a step of every worker: not here)
        figures = evaluate(tables, spec, backend, dense.values, validation, prefetch=s.prefetch)
        entry = {"epoch": epoch, "step": result.steps, "examples": result.examples,
                 "train_logloss": running.value, "validation_auc": figures["eval_auc"],
                 "validation_logloss": figures["eval_logloss"]}  # fmt: skip
        improved = result.best is None or better(entry, result.best, s.early_stop_metric)
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
    eval_seconds = 0.0  # evaluating the validation set (and putting the best back): not training time

    def training_s() -> float:
        """Seconds since the start less the evaluations and the skipping: result.seconds, and the lines' rate."""
        return time.perf_counter() - started - eval_seconds - skipping.seconds

    step = Step(spec, backend, dense, source, s.dense_l2)
    try:
        for epoch in range(s.epochs):
            step_started, skipped_by, evaluated_by = time.perf_counter(), skipping.seconds, eval_seconds
            result.epoch, steps_before = epoch + 1, result.steps
            source.start_epoch()
            batches = prefetched(skipping(limit(train_batches(epoch + 1))), prepare, s.prefetch)
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
                        if not holding():
                            result.pushed = result.examples
                    if on_pushed is not None:
                        on_pushed(result.pushed)
                    running.update(logloss(batch.labels, probs))
                    now = time.perf_counter()  # the step's time: less the examples --skip-examples skips, and
                    # an evaluation (--eval-every) since the step before
                    step_s = now - step_started - (skipping.seconds - skipped_by) - (eval_seconds - evaluated_by)
                    if result.steps == 1:
                        result.first_step_seconds = step_s
                    if telemetry is not None:
                        telemetry.step(n, step_s, running.value)
                    step_started, skipped_by, evaluated_by = now, skipping.seconds, eval_seconds
                    if desc is not None:  # the first step after a skip: the bar's clock and rate start here
                        bar.restart()
                    desc = None
                    bar.update(n)
                    cache = source.stats()
                    postfix = {"epoch": epoch + 1, "logloss": f"{running.value:.4f}"}
                    if "cache_hit_rate" in cache:
                        postfix["hits"] = f"{cache['cache_hit_rate']:.0%}"
                    if "cache_bytes_saved" in cache:
                        postfix["saved"] = f"{cache['cache_bytes_saved'] / (1 << 20):,.0f}MiB"
                    bar.postfix(postfix)
                    if lines is not None:  # their rate leaves out evaluations and a resumed run's skipping
                        lines.update(result, running.value, training_s(), cache)
                    if s.eval_every and result.steps % s.eval_every == 0 and evaluation(epoch + 1):
                        stop = True
                        break
            finally:  # this worker is done: no other worker waits for it, nor its own prefetched stamped pull (with
                if stop and best_model is None and not dense.collective:  # a best model to put back, or an MLP
                    source.finish()  # to write (allreduce): after that, below; the pull is left to the close)
                batches.close()
            if stop:
                break
            validated = s.eval_every and result.steps % s.eval_every == 0  # its last step's evaluation was the end's
            if result.steps == steps_before and s.skip_examples:  # an epoch skipped whole
                continue
            if not validated and evaluation(epoch + 1) and epoch + 1 < s.epochs:  # (after the last epoch, a
                stop = True  # patience run out there stops nothing early)
                break
            if limit.reached:  # no epoch after it
                break
        result.trained_all = True
        step.pusher.shutdown()
        if best_model is not None and result.curve and not result.curve[-1]["best"]:
            # before the worker's end, while its job holds the shards (its pushes carry the job's stamp: after the
            # end, another job may take the shards, and refuses them)
            put_back = time.perf_counter()
            if not dense.collective:  # the MLP's last gradients applied first (its stamped pushes)
                dense.flush()
            source.settle()  # geo: its last deltas pushed first
            result.restored_best = best_model.restore(dense)
            result.best_not_restored = {t: len(ids) for t, ids in best_model.not_restored.items()}
            eval_seconds += time.perf_counter() - put_back
        # the MLP's last gradients applied, then source.finish (geo: its last deltas pushed); allreduce: with the
        # others', a worker that waits for them finishing first, the MLP written before the last ones finish
        dense.finish(source.finish)
        result.pushed = result.examples
        result.seconds = training_s()
    except BaseException as e:  # this worker will not finish: its job's other workers need not wait for it
        try:  # the step's push and the MLP's background pushes end first (waited for a while): an async or geo
            step.settle()  # one applied after the stop would mark the worker running again, holding the shards
            if not dense.collective:  # for its job
                dense.close()
            else:  # allreduce: the writer writes the MLP of its last step, stamped, while its job holds the shards
                save_dense_on_stop(dense, e, source.stamp)
        finally:
            abandon(source, e)  # (geo: pushes the deltas it holds, unless they cannot land: GeoRows.abandon)
        if not holding():
            result.pushed = result.examples
        if lines is not None and not lines.plain:  # how far it got, for launch (a stopped worker's last line; also
            lines.update(result, running.value, training_s(), {}, stopped=True)  # after its last step)
        raise
    result.best_too_big_bytes = best_model.limit_bytes() if best_model is not None and best_model.too_big else 0
    bar.close()  # at the examples trained: fewer than the total when lines were malformed or training stopped early
    result.train_logloss = running.value
    result.stopped_early = stop
    result.stopped_at_limit = bool(s.max_examples) and s.skip_examples + result.examples >= s.max_examples
    result.source_stats = source.stats()
    if lines is not None:
        lines.update(result, running.value, result.seconds, result.source_stats, final=True)
    return result


def better(entry: dict, best: dict, metric: str) -> bool:
    """Whether curve entry `entry` beats `best` on metric: validation logloss lower, or AUC higher; a figure
    beats a NaN (a one-class validation set's AUC), and a NaN beats nothing."""
    new, old = entry[f"validation_{metric}"], best[f"validation_{metric}"]
    if math.isnan(old):
        return not math.isnan(new)
    return new > old if metric == "auc" else new < old

"""The training step and evaluation: rows of a batch per table, forward/backward locally, gradients pushed.

    for each batch:  ids of each table deduplicated across all of the batch's fields and bags (batch.table_ids)
                     rows = source.rows(step, ids)       # by mode (worker/steprows.py): pulled ahead on a thread
                                                         # with --prefetch k; async lays the rows its last pushes
                                                         # returned over them; sync and ssp pulls wait on the
                                                         # servers' clock; geo reads local copies
                     probs, row grads per table, dense grads = backend.forward_backward(ModelInputs, params, labels)
                     + dense_l2 * W on the MLP weights (the sparse tables' L2 is the servers': TableConfig.l2;
                                 sync: each worker's share, worker/job.py dense_l2_share)
                     source.push(step, per table: unique ids, summed grads, clicks, shows; with an inline dense
                                 path the MLP's gradients when a sync is due, and in the step before a
                                 validation and the last step)   # one clock advance
                     dense.step(dense grads) otherwise   # background PS push, or allreduce (worker/allreduce.py)
A resumed run (--skip-examples N) reads and drops the first N examples of the stream before its first step; with
--max-examples the stream ends at the worker's limit (counted from the stream's start, over epochs, the skipped
examples included), part way through an epoch if need be, and the run ends as at its last epoch's end.
Every --eval-every steps (or at the end of each epoch) the validation set is evaluated: AUC and logloss, printed
and kept in the run's curve; with --early-stop P training stops once the validation figure of
--early-stop-metric (logloss, lower is better; or AUC, higher) has not improved for P evaluations in a row. With
restore_best (one worker, the PS dense path), the model the tables hold at the best evaluation comes back at the end
(worker/best.py BestModel), before the worker says it is done: its job holds the shards meanwhile, and the restore's
deltas carry its stamp (source.push_apart), so they land in its own tables. When the loop ends (its data, or an early
stop), source.finish() tells the servers this worker is done, so that no other worker waits for it: after the MLP's last
pushes, when dense.finish calls it (allreduce: the MLP written before the last workers say so). When an error, Ctrl-C or
SIGTERM ends it before, source.abandon tells them it stopped (allreduce: the writer writes the MLP before,
save_dense_on_stop), and geo pushes the deltas it holds, before the stopped worker's last PROGRESS line; an error in the
pushes that end the run, geo's last deltas or the MLP's last gradients, ends it with that line too, counting what the
servers hold. A ValueError raised while the training batches are read and prepared (a malformed line past
--max-bad-lines, most often) comes out as TrainingDataError, which says how many steps had pushed by then; a shard's
refusal of a pull made there (a PsError) comes out as it is. The training time (examples/s) leaves out
the evaluations.
"""

from __future__ import annotations

import functools
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
from worker.loop_progress import ProgressLines, bar_postfix
from worker.metrics import RunningMean, logloss
from worker.models.spec import ModelSpec
from worker.pipeline import prefetched
from worker.progress_lines import ExamplesProgress
from worker.scoring import evaluate, field_tables
from worker.step import Prepared, Step
from worker.steprows import AsyncRows
from worker.stopping import abandon
from worker.train_stream import Limit, Skipping, marked_last

log = logging.getLogger("worker.loop")


@dataclass
class LoopSettings:
    """What run_epochs needs of the run's configuration."""

    epochs: int = 1
    prefetch: int = 1
    dense_l2: float = 0.0  # on the MLP weights (spec.mlp_weights), this worker's share (job.dense_l2_share)
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
    restoring_best: bool = False  # a stop came as the best model was put back: the tables hold the last model, or
    # part of the best one (some tables' or shards' deltas pushed, not others'), not the best
    best_too_big_bytes: int = 0  # > 0: BestModel kept nothing, the rows trained being more than this many bytes
    source_stats: dict = field(default_factory=dict)  # the row source's: cache hit rate, bytes saved

    @property
    def training_over(self) -> bool:
        """Every step ran and the servers hold every update it trained: a restart trains nothing (its position's
        `trained`, the stopped run's "nothing to resume")."""
        return self.trained_all and self.pushed == self.examples


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
    given = _LoopInputs(tables, spec, backend, dense, validation, telemetry, on_eval, source, on_pushed)
    run = _TrainingRun(given, settings, result if result is not None else LoopResult())
    try:
        for epoch in range(1, settings.epochs + 1):
            if not run.train_epoch(epoch, train_batches):  # an early stop, or the stream's limit reached
                break
        run.finish_training()
    except BaseException as e:  # this worker will not finish: its job's other workers need not wait for it
        run.stopped(e)
        raise
    return run.result_at_end()


@dataclass(frozen=True)
class _LoopInputs:
    """What run_epochs was given besides the batches and the settings (its docstring says what each is)."""

    tables: Any
    spec: ModelSpec
    backend: Any
    dense: DensePath
    validation: list[Batch] | None
    telemetry: Any
    on_eval: Callable[[dict], None] | None
    source: Any  # None: AsyncRows
    on_pushed: Callable[[int], None] | None


def _prepare(step_counter: Iterator[int], tmap: Any, source: Any, marked: tuple[Batch, bool]) -> Prepared:
    """A batch's step number, table ids and its rows' request started (source.prepare); marked: the batch and
    whether it is its epoch's last (train_stream.marked_last)."""
    batch, last = marked
    step = next(step_counter)
    tids = table_ids(batch, tmap)
    return Prepared(step, batch, tids, source.prepare(step, tids), last)


class _TrainingRun:
    """One run of run_epochs: the state its epochs share (the result filled as it goes, the running logloss, the
    clocks, the evaluations' early-stop count, the bar and lines) and its parts: an epoch, a step's bookkeeping,
    an evaluation and the stop it may call, the end of training, a stop by an exception, the result at the end."""

    def __init__(self, given: _LoopInputs, settings: LoopSettings, result: LoopResult) -> None:
        s = self.s = settings
        self.given, self.result, self.dense, self.validation = given, result, given.dense, given.validation
        self.running = RunningMean(0.95)
        self.started = time.perf_counter()
        plain = s.progress and not s.progress_lines and not sys.stderr.isatty()  # a log file: lines, not a bar
        planned = s.total_examples * s.epochs
        total = max(0, (min(planned, s.max_examples) if s.max_examples else planned) - s.skip_examples)
        # the skipped steps' dropout masks drawn too: the resumed run's steps draw the masks of a run never stopped
        self.skipping, self.limit = Skipping(s.skip_examples, given.backend.skip_masks), Limit(s.max_examples)
        self.desc = f"skipping {s.skip_examples:,} examples" if s.skip_examples else None  # until a step trains
        estimated = s.total_estimated and total > 0
        # the bar alone, on a terminal (no tqdm where it is not shown): the loop's lines, plain in a log or PROGRESS
        # (--progress-lines), are ProgressLines', whose rate leaves out evaluations and skipping
        self.bar = ExamplesProgress(total, s.progress and sys.stderr.isatty(), estimated, self.desc)
        at_most = bool(s.early_stop) and s.epochs > 1  # early stopping may end the run before its last epoch
        self.lines = (ProgressLines(s.worker, total, plain, at_most=at_most, estimated=estimated)
                      if s.progress_lines or plain else None)  # fmt: skip
        source = given.source if given.source is not None else AsyncRows(given.tables, given.spec, s.prefetch)
        self.source = source
        self.since_best = 0
        self.best_model = (BestModel(given.tables, given.spec, s.weight_bounds, source, s.half_at_rest)
                           if s.restore_best and given.validation else None)  # fmt: skip
        # the worker's steps over all epochs, numbered as batches are read (on the prefetch thread when depth > 0);
        # the prefetch thread holds only what it needs: a pull it leaves to end on its own keeps no more alive
        self.prepare = functools.partial(_prepare, iter(range(1 << 62)), field_tables(given.spec), source)
        self.holding = getattr(source, "holding", lambda: False)  # geo: steps whose deltas it has not pushed yet
        self.stop = False
        self.eval_seconds = 0.0  # evaluating the validation set (and putting the best back): not training time
        self.marks = (self.started, 0.0, 0.0)  # the step's start: the clock, skipping.seconds and eval_seconds then
        # (train_epoch sets them at each epoch's start)
        self.step = Step(given.spec, given.backend, self.dense, source, s.dense_l2)

    def training_s(self) -> float:
        """Seconds since the start less the evaluations and the skipping: result.seconds, and the lines' rate."""
        return time.perf_counter() - self.started - self.eval_seconds - self.skipping.seconds

    def train_epoch(self, epoch: int, train_batches: Callable[[int], Iterable[Batch]]) -> bool:
        """Trains epoch `epoch` (from 1), then evaluates the validation set unless its last step's evaluation was
        the end's or the epoch was skipped whole; False when the run ends with it (an early stop, or the stream's
        limit reached)."""
        self.marks = (time.perf_counter(), self.skipping.seconds, self.eval_seconds)
        self.result.epoch, steps_before = epoch, self.result.steps
        self.source.start_epoch()
        # a batch is marked last (one read ahead) only where a step's MLP gradients may wait for a later push
        look_ahead = self.dense.inline and self.dense.sync_every > 1
        marked = marked_last(self.skipping(self.limit(train_batches(epoch))), look_ahead)
        batches = prefetched(marked, self.prepare, self.s.prefetch)
        try:
            for _, item in _read_errors_named(batches, self.result):
                if self._train_step(item, epoch):  # an early stop: every step of the run ran
                    self._stop_early()
                    break
        finally:  # an early stop: this worker is done, so that no other worker waits for it, nor its own prefetched
            # stamped pull (with a best model to put back, or an MLP to write (allreduce): at the end, after that; the
            # pull is left to the close)
            if self.stop and self.best_model is None and not self.dense.collective:
                self.source.finish()
            batches.close()
        return not self.stop and self._epoch_end(epoch, steps_before)

    def _epoch_end(self, epoch: int, steps_before: int) -> bool:
        """After an epoch: the validation set evaluated (unless the epoch was skipped whole, or its last step's
        evaluation was the end's); False when the run ends there (an early stop, or the stream's limit reached)."""
        s, result = self.s, self.result
        validated = self._eval_due(result.steps)  # its last step's evaluation was the end's
        if result.steps == steps_before and s.skip_examples:  # an epoch skipped whole
            return True
        if not validated and self._evaluation(epoch) and epoch < s.epochs:  # (after the last epoch, a patience
            self._stop_early()  # run out there stops nothing early)
            return False
        return not self.limit.reached  # no epoch after it

    def _train_step(self, item: Prepared, epoch: int) -> bool:
        """One step and its bookkeeping: counts, timing, bar and lines; True when the evaluation due after it
        (--eval-every) says to stop."""
        result, batch = self.result, item.batch
        if self.best_model is not None:
            self.best_model.add(item.tids)
        with signals_after_step(STEP_GRACE_S):  # a Ctrl-C or SIGTERM here waits for the step's count
            n = result.in_flight = len(batch)  # a stop inside the step may come after its push arrived
            probs = self.step(item, self._flush_follows(item, epoch))  # its push answered: counted below
            result.examples += n
            result.steps += 1
            result.in_flight = 0
            if not self.holding():
                result.pushed = result.examples
        if self.given.on_pushed is not None:
            self.given.on_pushed(result.pushed)
        self.running.update(logloss(batch.labels, probs))
        self._timed(n)
        self._shown(n, epoch)
        return self._eval_due(result.steps) and self._evaluation(epoch)

    def _eval_due(self, steps: int) -> bool:
        """Whether an evaluation of the validation set follows step `steps` (--eval-every)."""
        return bool(self.s.eval_every) and steps % self.s.eval_every == 0

    def _stop_early(self) -> None:
        """An early stop: no step follows, and every step of the run ran."""
        self.stop = self.result.trained_all = True

    def _flush_follows(self, item: Prepared, epoch: int) -> bool:
        """Whether the MLP's gradients are flushed after item's step (a validation, --eval-every's or its epoch's,
        or the end of this worker's stream): the step then pushes them with its own push (Step's sync), so that
        under --mode sync they are the step's contribution, summed with the other workers' and applied once, as
        one worker's at the summed batch are."""
        if self.validation and self._eval_due(self.result.steps + 1):
            return True
        return item.last and (bool(self.validation) or epoch == self.s.epochs or self.limit.reached)

    def _timed(self, n: int) -> None:
        """The step's time, less the examples --skip-examples skips and an evaluation (--eval-every) since the step
        before: the first step's in the result, every step's to telemetry."""
        now = time.perf_counter()
        step_started, skipped_by, evaluated_by = self.marks
        step_s = now - step_started - (self.skipping.seconds - skipped_by) - (self.eval_seconds - evaluated_by)
        if self.result.steps == 1:
            self.result.first_step_seconds = step_s
        if self.given.telemetry is not None:
            self.given.telemetry.step(n, step_s, self.running.value)
        self.marks = (now, self.skipping.seconds, self.eval_seconds)

    def _shown(self, n: int, epoch: int) -> None:
        """The step's n examples on the bar, and the progress lines when one is due."""
        if self.desc is not None:  # the first step after a skip: the bar's clock and rate start here
            self.bar.restart()
        self.desc = None
        self.bar.update(n)
        cache = self.source.stats()
        self.bar.postfix(bar_postfix(epoch, self.running.value, cache))
        if self.lines is not None:  # their rate leaves out evaluations and a resumed run's skipping
            self.lines.update(self.result, self.running.value, self.training_s(), cache)

    def _evaluation(self, epoch: int) -> bool:
        """Evaluates the validation set; True when training should stop."""
        if not self.validation:
            return False
        eval_started = time.perf_counter()
        self.source.settle()  # geo: its pending deltas pushed, so that the model validated is the one trained so far
        result, dense = self.result, self.dense
        result.pushed = result.examples
        if not dense.collective:  # the PS path: its pending gradients applied first (allreduce's values are
            dense.flush()  # current, and its flush is a step of every worker: not here)
        figures = evaluate(self.given.tables, self.given.spec, self.given.backend, dense.values, self.validation,
                           prefetch=self.s.prefetch)  # fmt: skip
        entry = {"epoch": epoch, "step": result.steps, "examples": result.examples,
                 "train_logloss": self.running.value, "validation_auc": figures["eval_auc"],
                 "validation_logloss": figures["eval_logloss"]}  # fmt: skip
        improved = result.best is None or better(entry, result.best, self.s.early_stop_metric)
        if improved:
            result.best, self.since_best = entry, 0
            if self.best_model is not None:
                self.best_model.keep(dense.values)
        else:
            self.since_best += 1
        entry["best"] = improved
        result.curve.append(entry)
        if self.given.on_eval is not None:
            self.given.on_eval(entry)
        self.eval_seconds += time.perf_counter() - eval_started
        return bool(self.s.early_stop) and self.since_best >= self.s.early_stop

    def finish_training(self) -> None:
        """Every step ran: the best model put back (restore_best), the MLP's last gradients applied, the servers
        told this worker is done."""
        self.result.trained_all = True
        self.step.pusher.shutdown()
        if self.best_model is not None and self.result.curve and not self.result.curve[-1]["best"]:
            self._restore_best(self.best_model)
        # the MLP's last gradients applied, then source.finish (geo: its last deltas pushed); allreduce: with the
        # others', a worker that waits for them finishing first, the MLP written before the last ones finish
        self.dense.finish(self.source.finish)
        self.result.pushed = self.result.examples
        self.result.seconds = self.training_s()

    def _restore_best(self, best_model: BestModel) -> None:
        """The tables and the MLP put back to the best evaluation's model, before the worker's end, while its job
        holds the shards (its pushes carry the job's stamp: after the end, another job may take the shards, and
        refuses them)."""
        put_back = time.perf_counter()
        self.result.restoring_best = True  # cleared once restore() ends: a stop before then finds it set
        if not self.dense.collective:  # the MLP's last gradients applied first (its stamped pushes)
            self.dense.flush()
        self.source.settle()  # geo: its last deltas pushed first
        self.result.restored_best = best_model.restore(self.dense)
        self.result.best_not_restored = {t: len(ids) for t, ids in best_model.not_restored.items()}
        self.result.restoring_best = False
        self.eval_seconds += time.perf_counter() - put_back

    def stopped(self, e: BaseException) -> None:
        """An error, Ctrl-C or SIGTERM `e` ended the run: the servers told this worker stopped, and the stopped
        worker's last PROGRESS line."""
        try:  # the step's push and the MLP's background pushes end first (waited for a while): an async or geo
            self.step.settle()  # one applied after the stop would mark the worker running again, holding the
            if not self.dense.collective:  # shards for its job
                self.dense.close()
            else:  # allreduce: the writer writes the MLP of its last step, stamped, while its job holds the shards
                save_dense_on_stop(self.dense, e, self.source.stamp)
        finally:
            abandon(self.source, e)  # (geo: pushes the deltas it holds, unless they cannot land: GeoRows.abandon)
        if not self.holding():
            self.result.pushed = self.result.examples
        if self.lines is not None and not self.lines.plain:  # how far it got, for launch (a stopped worker's last
            # line; also after its last step)
            self.lines.update(self.result, self.running.value, self.training_s(), {}, stopped=True)

    def result_at_end(self) -> LoopResult:
        """The result of a run that ended without an exception, its bar closed and its last progress line."""
        result, best_model = self.result, self.best_model
        result.best_too_big_bytes = best_model.limit_bytes() if best_model is not None and best_model.too_big else 0
        self.bar.close()  # at the examples trained: fewer than the total when lines were malformed, or on a stop
        result.train_logloss = self.running.value
        result.stopped_early = self.stop
        s = self.s
        result.stopped_at_limit = bool(s.max_examples) and s.skip_examples + result.examples >= s.max_examples
        result.source_stats = self.source.stats()
        if self.lines is not None:
            self.lines.update(result, self.running.value, result.seconds, result.source_stats, final=True)
        return result


def better(entry: dict, best: dict, metric: str) -> bool:
    """Whether curve entry `entry` beats `best` on metric: validation logloss lower, or AUC higher; a figure
    beats a NaN (a one-class validation set's AUC), and a NaN beats nothing."""
    new, old = entry[f"validation_{metric}"], best[f"validation_{metric}"]
    if math.isnan(old):
        return not math.isnan(new)
    return new > old if metric == "auc" else new < old

"""The training step and evaluation: pull a batch's rows per table, forward/backward locally, push the gradients.

    for each batch:  ids of each table deduplicated across all of the batch's fields and bags (batch.table_ids)
                     rows = pull_many(every table's ids)            # ahead on a thread with --prefetch k, then
                                                                    # overlaid with the rows the last pushes returned
                     probs, row grads per table, dense grads = backend.forward_backward(ModelInputs, params, labels)
                     + dense_l2 * W on the dense weights (the sparse tables' L2 is the servers': TableConfig.l2)
                     push_many(per table: unique ids, summed grads, clicks, shows; the dense gradients when a
                               sync is due; one clock advance)      # returns the rows it updated
Every --eval-every steps (or at the end of each epoch) the validation set is evaluated: AUC and logloss, printed
and kept in the run's curve; with --early-stop P training stops once validation logloss has not improved for P
evaluations in a row. With restore_best (one worker), the model the tables hold at the best evaluation comes back
at the end: at each new best the worker copies the rows of every id it has trained and the dense parameters
(BestModel), and at the end pushes best - current as add-delta pushes (the optimizer's state stays as it is).
Ids first trained after the best keep their values.

Rows pulled ahead miss the pushes made meanwhile; laying the rows the last depth + 1 pushes returned over them
(worker/pipeline.py RecentRows, one per table) makes the rows a step computes with exactly those a pull just
before computing would give, for one worker (tests/test_pipeline.py).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from worker.batch import Batch, TableIds, table_ids
from worker.dense import DenseSync
from worker.dense import table_name as dense_table
from worker.metrics import RunningMean, auc, logloss
from worker.models.spec import FieldInput, ModelInputs, ModelSpec
from worker.pipeline import RecentRows, in_any, prefetched


@dataclass
class LoopSettings:
    """What run_epochs needs of the run's configuration."""

    epochs: int = 1
    prefetch: int = 1
    dense_l2: float = 0.0  # on the dense weights (not the biases)
    eval_every: int = 0  # steps between evaluations of the validation set; 0: at the end of each epoch
    early_stop: int = 0  # stop after this many evaluations without a better validation logloss; 0: never
    restore_best: bool = False  # end with the model of the best evaluation (one worker only)
    progress: bool = True
    total_examples: int = 0  # the progress bar's total for one epoch


@dataclass
class LoopResult:
    examples: int = 0
    seconds: float = 0.0
    steps: int = 0
    train_logloss: float = math.nan
    curve: list[dict] = field(default_factory=list)  # one entry per evaluation of the validation set
    stopped_early: bool = False
    best: dict | None = None  # the curve's entry with the lowest validation logloss
    restored_best: bool = False  # the tables hold the model of `best` (else the last one)


def model_inputs(spec: ModelSpec, batch: Batch, tids: dict[str, TableIds], rows: dict[str, np.ndarray]) -> ModelInputs:
    """The backend's view of a batch whose tables' unique rows are `rows`."""
    fields = {}
    for f in spec.fields:
        bags = batch.fields[f.name]
        fields[f.name] = FieldInput(tids[f.table].index[f.name], bags.offsets, bags.weights)
    return ModelInputs(rows, fields, batch.dense_or_empty())


def field_tables(spec: ModelSpec) -> dict[str, str]:
    return {f.name: f.table for f in spec.fields}


def pull_rows(
    tables: Any, spec: ModelSpec, tids: dict[str, TableIds], covered: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """{table: rows of its unique ids}, pulled in one pull_many; rows where covered[table] is True are left unset
    (the overlay of recent pushes fills them)."""
    wanted, out = [], {}
    for t, ti in tids.items():
        out[t] = np.empty((len(ti.uniq), spec.row_dim(t)), dtype=np.float32)
        mask = None if covered is None else ~covered[t]
        if mask is None or mask.any():
            wanted.append((t, ti.uniq if mask is None else ti.uniq[mask], mask))
    if wanted:
        for (t, _, mask), rows in zip(wanted, tables.pull_many([(t, ids) for t, ids, _ in wanted])):
            if mask is None:
                out[t] = rows
            else:
                out[t][mask] = rows
    return out


def evaluate(tables: Any, spec: ModelSpec, backend: Any, dense_values: dict, batches: Iterable[Batch]) -> dict:
    """AUC and logloss of the model the tables hold now, on batches (and the oracle's, for synthetic data)."""
    labels, preds, oracle = [], [], []
    tmap = field_tables(spec)
    for batch in batches:
        tids = table_ids(batch, tmap)
        rows = pull_rows(tables, spec, tids)
        labels.append(batch.labels)
        preds.append(backend.predict(model_inputs(spec, batch, tids, rows), dense_values))
        if batch.probs is not None:
            oracle.append(batch.probs)
    if not labels:
        return {}
    y, p = np.concatenate(labels), np.concatenate(preds)
    out = {"eval_examples": int(len(y)), "eval_auc": auc(y, p), "eval_logloss": logloss(y, p)}
    if oracle and len(oracle) == len(labels):
        q = np.concatenate(oracle)
        out.update(oracle_auc=auc(y, q), oracle_logloss=logloss(y, q))
    return out


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
        pushes = [(t, u, self.rows[t][1] - cur, None, np.zeros(len(u), np.float32)) for (t, u), cur in zip(items, now)]
        current = dense.pull()
        for p in dense.params:
            name = p.name
            pushes.append((dense_table(p), dense.ids[name], self.dense[name] - current[name], None,
                           np.zeros(p.shape[0], np.float32)))  # fmt: skip
        self.tables.push_many(pushes, add_delta=True)
        dense.pull()
        return True


class _Prepared:
    __slots__ = ("batch", "tids", "rows")

    def __init__(self, batch: Batch, tids: dict[str, TableIds], rows: dict[str, np.ndarray] | None):
        self.batch, self.tids, self.rows = batch, tids, rows


def run_epochs(
    tables: Any,
    spec: ModelSpec,
    backend: Any,
    dense: DenseSync,
    train_batches: Callable[[], Iterable[Batch]],
    settings: LoopSettings,
    validation: list[Batch] | None = None,
    telemetry: Any = None,
    on_eval: Callable[[dict], None] | None = None,
) -> LoopResult:
    """Trains for settings.epochs passes over train_batches() (called once per epoch); returns what happened.
    `tables` is a Client (or anything with its pull_many / push_many). on_eval receives each curve entry."""
    s = settings
    result = LoopResult()
    running = RunningMean(0.95)
    started = time.perf_counter()
    bar = tqdm(total=s.total_examples * s.epochs, unit="ex", unit_scale=True, disable=not s.progress, smoothing=0.1)
    tmap = field_tables(spec)
    depth = s.prefetch
    recent = {t: RecentRows(depth + 1) for t in spec.table_dims()}  # a pull runs up to depth + 1 batches ahead
    since_best = 0
    best_model = BestModel(tables, spec) if s.restore_best and validation else None

    def prepare(batch: Batch, window: deque) -> _Prepared:  # on the prefetch thread when depth > 0
        tids = table_ids(batch, tmap)
        if not depth:
            return _Prepared(batch, tids, None)
        covered = {t: in_any(ti.uniq, [w[t] for w in window if t in w]) for t, ti in tids.items()}
        window.append({t: ti.uniq for t, ti in tids.items()})
        return _Prepared(batch, tids, pull_rows(tables, spec, tids, covered))

    def evaluation(epoch: int) -> bool:
        """Evaluates the validation set; True when training should stop."""
        nonlocal since_best
        if not validation:
            return False
        figures = evaluate(tables, spec, backend, dense.values, validation)
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
        return bool(s.early_stop) and since_best >= s.early_stop

    stop = False
    for epoch in range(s.epochs):
        step_started = time.perf_counter()
        window: deque = deque(maxlen=depth + 1)  # the unique ids per table of the batches prepared last
        for _, item in prefetched(train_batches(), lambda b, window=window: prepare(b, window), depth):
            batch, tids, rows = item.batch, item.tids, item.rows
            if rows is None:  # no prefetch: pull the rows the last pushes did not return
                rows = pull_rows(tables, spec, tids, {t: recent[t].covered(ti.uniq) for t, ti in tids.items()})
            for t, ti in tids.items():
                recent[t].overlay(ti.uniq, rows[t])
            if best_model is not None:
                best_model.add(tids)
            probs, row_grads, dense_grads = backend.forward_backward(
                model_inputs(spec, batch, tids, rows), dense.values, batch.labels
            )
            pushes = [(t, ti.uniq, row_grads[t], ti.clicks, ti.shows) for t, ti in tids.items()]
            if s.dense_l2:
                for name, g in dense_grads.items():
                    if not name.endswith(".bias"):
                        g += np.float32(s.dense_l2) * dense.values[name]
            sync = dense.add(dense_grads)
            if sync:
                pushes += dense.push_items()
            returned = tables.push_many(pushes, advance_clock=1, return_rows=True)
            for (t, ti), updated in zip(tids.items(), returned):
                recent[t].add(ti.uniq, updated)
            if sync:
                dense.take(returned[len(tids) :])
            n = len(batch)
            running.update(logloss(batch.labels, probs))
            if telemetry is not None:
                now = time.perf_counter()
                telemetry.step(n, now - step_started, running.value)
                step_started = now
            result.examples += n
            result.steps += 1
            bar.update(n)
            bar.set_postfix(epoch=epoch + 1, logloss=f"{running.value:.4f}", refresh=False)
            if s.eval_every and result.steps % s.eval_every == 0 and evaluation(epoch + 1):
                stop = True
                break
        if stop:
            break
        if not s.eval_every and evaluation(epoch + 1):
            stop = True
            break
    dense.flush()
    if best_model is not None and result.curve and not result.curve[-1]["best"]:
        result.restored_best = best_model.restore(dense)
    bar.close()
    result.seconds = time.perf_counter() - started
    result.train_logloss = running.value
    result.stopped_early = stop
    return result

"""Scoring with the model the tables hold: a batch's model inputs, predictions over batches (rows pulled ahead),
evaluate (AUC and logloss), and ScoringProgress, the progress of scoring a file (eval, predict, train's final
evaluation).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from worker.batch import Batch, TableIds, table_ids
from worker.diverged import HUGE_NUMBERS_ADVICE
from worker.metrics import ScoreStream, logloss
from worker.models.spec import FieldInput, ModelInputs, ModelSpec
from worker.pipeline import prefetched
from worker.progress_lines import JSON_EVERY_S, ExamplesProgress, progress_line
from worker.steprows import pull_rows


def model_inputs(spec: ModelSpec, batch: Batch, tids: dict[str, TableIds], rows: dict[str, np.ndarray]) -> ModelInputs:
    """The backend's view of a batch whose tables' unique rows are `rows`."""
    fields = {}
    for f in spec.fields:
        bags = batch.fields[f.name]
        fields[f.name] = FieldInput(tids[f.table].index[f.name], bags.offsets, bags.weights, bags.is_one_per_example())
    return ModelInputs(rows, fields, batch.dense_or_empty())


def field_tables(spec: ModelSpec) -> dict[str, str]:
    return {f.name: f.table for f in spec.fields}


def checked_probabilities(batch: Batch, probs: np.ndarray) -> np.ndarray:
    """probs, the model's probabilities of batch's examples; ValueError naming the first example whose probability is
    NaN (its logit is NaN or Inf: numbers of the example, or the model's weights, overflow float32 in the model; the
    backends give such a logit a NaN probability, not a saturated 0 or 1), by its file and line where the batch has
    them."""
    nan = np.isnan(probs)
    if not nan.any():
        return probs
    i = int(np.flatnonzero(nan)[0])
    if batch.line_nos is None:
        where = f"example {i + 1} of a batch of {len(probs):,}"
    else:
        where = f"line {int(batch.line_nos[i])} of {batch.file_of(i) or 'its file'}"
    raise ValueError(
        f"the model's probability for the example of {where} is NaN ({int(nan.sum()):,} of the batch's "
        f"{len(probs):,} examples): the example's numbers, or the model's weights, overflow float32 in the model; "
        + HUGE_NUMBERS_ADVICE
    )


def predictions(
    tables: Any,
    spec: ModelSpec,
    backend: Any,
    dense_values: dict,
    batches: Iterable[Batch],
    prefetch: int = 1,
) -> Iterator[tuple[Batch, np.ndarray]]:
    """(batch, its probabilities (n,)) of each batch, in order, as the model the tables hold now and dense_values
    give them; a NaN probability is a ValueError naming its example's file and line (checked_probabilities).
    prefetch k: a pipeline of three stages, each up to k batches ahead of the next (worker/pipeline.py prefetched):
    one thread reads and parses the batches and finds their ids per table, another pulls their rows (a pull waits
    on the servers without the GIL), and the caller's thread scores one batch while both work ahead; 0: each batch read, pulled and scored in turn. Scoring pushes nothing, so a row pulled ahead is the row
    a pull in turn would give, unless another worker pushes meanwhile (as it may between pulls in turn)."""
    tmap = field_tables(spec)
    parsed = prefetched(batches, lambda batch: table_ids(batch, tmap), prefetch)  # (batch, tids)
    ahead = prefetched(parsed, lambda item: pull_rows(tables, spec, item[1]), prefetch)
    try:
        for (batch, tids), rows in ahead:
            with np.errstate(all="ignore"):  # no numpy RuntimeWarning: a NaN is checked_probabilities' to report
                probs = backend.predict(model_inputs(spec, batch, tids, rows), dense_values)
            yield batch, checked_probabilities(batch, probs)
    finally:  # stopped early (an error, Ctrl-C): the thread stops reading
        ahead.close()


class ScoringProgress(ExamplesProgress):
    """The progress of scoring a file (eval, predict) as train shows its own (ps.progress: a bar, or a plain
    'progress: ...' line). total: the lines of the file, an estimate (0: unknown); estimated: total is a guess from
    bytes (worker/linecount.py), shown with no time left and never as 100% until close(). worker: instead of
    either, that worker's PROGRESS lines of scoring on stdout, every JSON_EVERY_S seconds and one at close (train
    --progress-lines: its final evaluation; the grammar in worker/progress_lines.py)."""

    def __init__(self, total: int, on: bool, estimated: bool = False, worker: int | None = None):
        self.worker = worker
        super().__init__(total, on and worker is None, estimated)
        if on and worker is not None:
            self.plain, self.every_s = True, JSON_EVERY_S

    counted = "examples scored"

    def say(self, rate: float, finished: bool = False) -> None:
        if self.worker is None:
            super().say(rate)
            return
        report = {"worker": self.worker, "phase": "eval", "scored": self.done,
                  "total": self.done if finished else self.shown_total() if self.total else 0,
                  "examples_per_s": round(rate, 1)}  # fmt: skip
        if self.estimated and not finished:
            report["estimated"] = True
        print(progress_line(report), flush=True)

    def close(self, finished: bool = True) -> None:
        """finished: every example was scored (the count is the total); else an error or a signal stopped the
        scoring, and the total shown stays the one expected."""
        if self.plain and self.worker is not None:
            self.say(self.done / max(time.perf_counter() - self.started, 1e-9), finished)
        super().close(finished)


def evaluate(
    tables: Any,
    spec: ModelSpec,
    backend: Any,
    dense_values: dict,
    batches: Iterable[Batch],
    progress: ScoringProgress | None = None,
    prefetch: int = 1,
) -> dict:
    """AUC and logloss of the model the tables hold now, on batches (and the oracle's, for synthetic data), with
    the share of positive labels and the logloss of predicting that share for every example (the best constant);
    progress, when given, is advanced by each batch and closed at the end. Batches are read and their rows pulled
    up to `prefetch` ahead of the one scored (predictions). The figures are exact up to EXACT_AUC_EXAMPLES
    examples; past them the AUC comes from a histogram over probability bins (worker.metrics.ScoreStream), in
    bounded memory, and eval_auc_tie_share says how far it may be from the exact one (eval_auc_exact_examples:
    the examples past which it is binned)."""
    model, oracle = ScoreStream(), ScoreStream()
    scored = predictions(tables, spec, backend, dense_values, batches, prefetch)
    finished = False
    try:
        for batch, probs in scored:
            model.add(batch.labels, probs)
            if batch.probs is not None:
                oracle.add(batch.labels, batch.probs)
            if progress is not None:
                progress.update(len(batch))
        finished = True
    finally:
        scored.close()
        if progress is not None:
            progress.close(finished)
    if not model.examples:
        return {}
    rate = model.positives / model.examples  # the best constant prediction, a baseline that any model should beat
    at_rate = np.array([rate])  # the log loss of predicting it: a positive's share of it, and a negative's
    constant = rate * logloss(np.ones(1), at_rate) + (1 - rate) * logloss(np.zeros(1), at_rate)
    out = {"eval_examples": model.examples, "eval_auc": model.auc(), "eval_logloss": model.logloss(),
           "eval_positive_rate": rate, "eval_constant_logloss": constant}  # fmt: skip
    if not model.exact:
        out.update(eval_auc_tie_share=model.tie_share(), eval_auc_exact_examples=model.exact_examples)
    if oracle.examples == model.examples:  # every example scored had the planted model's probability
        out.update(oracle_auc=oracle.auc(), oracle_logloss=oracle.logloss())
    return out

"""One training step of a prepared batch (Prepared: its step number, ids per table, rows pulled ahead): its rows
from the row source, forward/backward, the gradients pushed, the MLP's step (see worker/loop.py). A failed MLP
step (a background push's error, an allreduce's) ends the step once the rows' push it ran beside has ended: the
loop then tells the shards the worker stopped, and no push of the worker may come after that. A forward or backward
pass that gives an Inf or NaN (a diverging model) ends the step before it pushes anything (DivergedError), with no
numpy RuntimeWarning (overflow, invalid value) printed before it; a logit that overflows to Inf is one such, its
probability NaN in both backends (worker/models/numpy_backend.py probabilities), not a saturated 0 or 1. Under
--dense allreduce the other workers' steps end with a DivergedError too, their MLP unchanged, while their rows' pushes
of that step, in flight beside the all_reduce, are applied (settle()), as where the MLP's step fails otherwise.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ps.rows.finite import first_non_finite
from ps.terminate import result_of
from worker.batch import Batch, TableIds
from worker.dense import DensePath
from worker.diverged import DIVERGED_ADVICE, DivergedError
from worker.models.spec import ModelSpec
from worker.scoring import model_inputs

log = logging.getLogger("worker.step")


class Step:
    """One training step of a prepared batch: its rows from the source, forward/backward, the gradients pushed
    (with the MLP's when the dense path is inline and a sync is due), the MLP's step; returns the predictions."""

    def __init__(self, spec: ModelSpec, backend: Any, dense: DensePath, source: Any, dense_l2: float):
        self.spec, self.backend, self.dense, self.source = spec, backend, dense, source
        # the weights --dense-l2 regularizes (none without it), and its float32, worked out once, not every step
        self._l2_weights, self._l2 = (spec.mlp_weights() if dense_l2 else []), np.float32(dense_l2)
        self.pusher = ThreadPoolExecutor(1, thread_name_prefix="push")  # idle between steps; shut by the loop
        self._pushing: Future | None = None  # the rows' push of the step on the pusher thread, until it ended

    def __call__(self, item: Prepared, sync: bool = False) -> np.ndarray:
        """sync: an inline dense path pushes the MLP's gradients added since its last sync with this step's push,
        due or not (a flush follows the step: a validation, or the worker's end; under --mode sync the push is the
        step's contribution, summed with the other workers')."""
        dense, source, batch, tids = self.dense, self.source, item.batch, item.tids
        rows = source.rows(item.step, tids, item.rows)
        with np.errstate(all="ignore"):  # no numpy RuntimeWarning: an Inf or NaN is check_finite's to report
            probs, row_grads, dense_grads = self.backend.forward_backward(
                model_inputs(self.spec, batch, tids, rows), dense.values, batch.labels
            )
            for name in self._l2_weights:
                dense_grads[name] += self._l2 * dense.values[name]
        try:
            check_finite(item.step, probs, row_grads, dense_grads)
        except DivergedError as e:  # an allreduce path's other workers wait for this one in the step's all_reduce
            dense.diverged(e)  # raises e, once they know (they raise one too)
            raise
        if dense.inline:  # the MLP's push goes with the rows' push when one is due
            due = dense.add(dense_grads, sync)
            returned = source.push(item.step, tids, row_grads, dense.push_items() if due else [])
            if due:
                dense.take(returned)
        else:  # the rows' push in flight (on a thread) while the MLP's step runs here
            pushing = self._pushing = self.pusher.submit(source.push, item.step, tids, row_grads, [])
            try:
                dense.step(dense_grads)
            except BaseException:  # the push ends first: the stop the loop then sends must come after it
                self.settle()
                raise
            try:
                result_of(pushing)  # a signal another thread received is handled meanwhile (ps.terminate)
            finally:
                if pushing.done():  # (its failure is the step's: settle() has nothing more to wait for)
                    self._pushing = None
        return probs

    def settle(self) -> None:
        """Waits for the rows' push a step left on the pusher thread (a signal ended the step's wait for it, or the
        MLP's step failed), as result_of does (a further signal is handled meanwhile); a failure of the push is
        logged, not raised (the error that stopped the step is the one to report). The loop calls it before it
        tells the shards the worker stopped: a push applied after the stop would mark the worker running again,
        and geo's deltas flushed while the step's push still adds to them would be pushed twice."""
        pushing, self._pushing = self._pushing, None
        if pushing is None:
            return
        try:
            result_of(pushing)
        except Exception as e:
            log.warning("the step's push failed too, as the step stopped: %s", e)


def check_finite(step: int, probs: np.ndarray, row_grads: dict[str, np.ndarray],
                 dense_grads: dict[str, np.ndarray]) -> None:  # fmt: skip
    """DivergedError naming the first of a step's predictions, rows' gradients (by table) and MLP gradients (by
    parameter) that holds an Inf or NaN, and what to change."""
    arrays = [("predictions", probs), *((f"gradients for table {t!r}", g) for t, g in row_grads.items()),
              *((f"gradients of dense parameter {n!r}", g) for n, g in dense_grads.items())]  # fmt: skip
    for what, a in arrays:
        a = np.asarray(a)
        if a.dtype == np.float32:  # a compiled scan, no mask (the common case)
            bad = first_non_finite(a)
        else:
            where = np.flatnonzero(~np.isfinite(a))
            bad = int(where[0]) if len(where) else -1
        if bad < 0:
            continue
        count = a.size - int(np.count_nonzero(np.isfinite(a)))
        raise DivergedError(
            f"training diverged in step {step + 1}: the model's {what} hold {float(a.flat[bad])} ({count:,} of "
            f"{a.size:,} values not finite): its weights, or the features fed to them, overflow float32. The step "
            f"pushed nothing. {DIVERGED_ADVICE}"
        )


class Prepared:
    """A batch ready for its step; last: the batch is its epoch's last (worker/loop.py reads one batch ahead)."""

    __slots__ = ("step", "batch", "tids", "rows", "last")

    def __init__(self, step: int, batch: Batch, tids: dict[str, TableIds], rows: dict[str, np.ndarray] | None,
                 last: bool = False):  # fmt: skip
        self.step, self.batch, self.tids, self.rows, self.last = step, batch, tids, rows, last

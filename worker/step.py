"""One training step of a prepared batch (Prepared: its step number, ids per table, rows pulled ahead): its rows
from the row source, forward/backward, the gradients pushed, the MLP's step (see worker/loop.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ps.terminate import result_of
from worker.batch import Batch, TableIds
from worker.dense import DensePath
from worker.models.spec import ModelSpec
from worker.scoring import model_inputs


class Step:
    """One training step of a prepared batch: its rows from the source, forward/backward, the gradients pushed
    (with the MLP's when the dense path is inline and a sync is due), the MLP's step; returns the predictions."""

    def __init__(self, spec: ModelSpec, backend: Any, dense: DensePath, source: Any, dense_l2: float):
        self.spec, self.backend, self.dense, self.source, self.dense_l2 = spec, backend, dense, source, dense_l2
        self.pusher = ThreadPoolExecutor(1, thread_name_prefix="push")  # idle between steps; shut by the loop

    def __call__(self, item: Prepared) -> np.ndarray:
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
            result_of(pushing)  # a signal another thread received is handled meanwhile (ps.terminate)
        return probs


class Prepared:
    __slots__ = ("step", "batch", "tids", "rows")

    def __init__(self, step: int, batch: Batch, tids: dict[str, TableIds], rows: dict[str, np.ndarray] | None):
        self.step, self.batch, self.tids, self.rows = step, batch, tids, rows

"""BestModel: early stopping's restore (LoopSettings.restore_best: one worker, the PS dense path).

At each new best evaluation the worker copies the rows of every id it has trained and the dense parameters, and at
the end of the loop pushes best - current as add-delta pushes (the optimizer's state stays as it is): the tables
then hold the model of the best evaluation. An id first trained after the best had then no row of its own: the
servers served its initial embedding (ps.rows.initializers, by its table's initializer), which it gets back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ps import codec
from ps.rows.initializers import init_rows
from worker.batch import TableIds
from worker.client import PushItem
from worker.dense import DenseSync
from worker.dense import table_name as dense_table
from worker.models.spec import ModelSpec

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
        best = dict(self.rows)
        for t, seen in self.seen.items():  # ids first trained after the best: their initial embedding then
            kept = best[t][0]
            later = np.setdiff1d(np.unique(np.concatenate(seen)) if seen else kept, kept)
            if len(later):
                spec = codec.table_config_from_proto(self.tables.describe_table(t)[0].spec)
                initial = np.zeros((len(later), spec.dim), np.float32)
                init_rows(spec.initializer, later, initial, spec.dim)
                best[t] = (np.concatenate([kept, later]), np.concatenate([best[t][1], initial]))
        items = [(t, u) for t, (u, _) in best.items()]
        now = self.tables.pull_many(items)
        pushes = [
            PushItem(t, u, best[t][1] - cur, shows=np.zeros(len(u), np.float32)) for (t, u), cur in zip(items, now)
        ]
        current = dense.pull()  # a DenseSync (restore_best runs with the PS dense path only)
        for p in dense.params:
            name = p.name
            pushes.append(PushItem(dense_table(p), dense.ids[name], self.dense[name] - current[name],
                                   shows=np.zeros(p.shape[0], np.float32)))  # fmt: skip
        self.tables.push_many(pushes, add_delta=True)
        dense.pull()
        return True

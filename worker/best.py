"""BestModel: early stopping's restore (LoopSettings.restore_best: one worker, the PS dense path).

At each new best evaluation the worker copies the rows of every id it has trained and the dense parameters; after
it, before a step trains an id first trained since, that id's row is pulled (its value at the best: its initial
row on fresh tables, an earlier run's on tables that held a model). At the end of the loop it pushes best - current
for all of them as add-delta pushes (the optimizer's state stays as it is): the tables then hold the model of the
best evaluation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from worker.batch import TableIds
from worker.client import PushItem
from worker.dense import DenseSync
from worker.dense import table_name as dense_table
from worker.models.spec import ModelSpec

MAX_BEST_FLOATS = 64 << 20  # BestModel copies at most this many floats (256 MiB); past it, no restore


class BestModel:
    """The ids trained so far per table and, at each new best, a copy of their rows and of the dense parameters;
    since the best, the rows of ids first trained then, as they were; restore() pushes the difference back (see
    the module docstring)."""

    def __init__(self, tables: Any, spec: ModelSpec):
        self.tables, self.spec = tables, spec
        self.seen: dict[str, list[np.ndarray]] = {t: [] for t in spec.table_dims()}
        self.rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # at the best: (sorted ids, their rows)
        self.later: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # ids first trained since, their rows then
        self.dense: dict[str, np.ndarray] = {}
        self.too_big = False

    def add(self, tids: dict[str, TableIds]) -> None:
        """The ids of a step about to be trained; once a best is kept, the rows of those first trained since are
        pulled first (their values at the best)."""
        if self.rows and not self.too_big:
            fresh = [(t, ti.uniq[~_among(ti.uniq, self.rows[t][0]) & ~_among(ti.uniq, self.later[t][0])])
                     for t, ti in tids.items()]  # fmt: skip
            fresh = [(t, ids) for t, ids in fresh if len(ids)]
            if fresh:
                for (t, ids), rows in zip(fresh, self.tables.pull_many(fresh)):
                    merged = np.concatenate([self.later[t][0], ids])
                    order = np.argsort(merged, kind="stable")
                    self.later[t] = (merged[order], np.concatenate([self.later[t][1], rows])[order])
                if self._floats() > MAX_BEST_FLOATS:
                    self.too_big, self.rows, self.later = True, {}, {}
        for t, ti in tids.items():
            seen = self.seen[t]
            seen.append(ti.uniq)
            if len(seen) >= 64:
                self.seen[t] = [np.unique(np.concatenate(seen))]

    def _floats(self) -> int:
        kept = [*self.rows.values(), *self.later.values()]
        return sum(rows.size for _, rows in kept)

    def keep(self, dense_values: dict[str, np.ndarray]) -> None:
        ids = {t: np.unique(np.concatenate(s)) if s else np.zeros(0, np.uint64) for t, s in self.seen.items()}
        self.seen = {t: [u] for t, u in ids.items()}
        floats = sum(len(u) * self.spec.row_dim(t) for t, u in ids.items())
        if floats > MAX_BEST_FLOATS:
            self.too_big, self.rows = True, {}
            return
        pulled = self.tables.pull_many(list(ids.items()))
        self.rows = {t: (u, r.copy()) for (t, u), r in zip(ids.items(), pulled)}
        self.later = {
            t: (np.zeros(0, np.uint64), np.zeros((0, r.shape[1]), np.float32)) for t, (_, r) in self.rows.items()
        }
        self.dense = {k: v.copy() for k, v in dense_values.items()}

    def restore(self, dense: DenseSync) -> bool:
        """Pushes best - current for every kept row and dense parameter; False if nothing was kept."""
        if self.too_big or not self.rows:
            return False
        best = {t: (np.concatenate([u, self.later[t][0]]), np.concatenate([r, self.later[t][1]]))
                for t, (u, r) in self.rows.items()}  # fmt: skip
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


def _among(ids: np.ndarray, sorted_ids: np.ndarray) -> np.ndarray:
    """bool per id: whether it is in sorted_ids (sorted, unique)."""
    if len(sorted_ids) == 0:
        return np.zeros(len(ids), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return sorted_ids[at] == ids

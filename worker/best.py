"""BestModel: early stopping's restore (LoopSettings.restore_best: one worker, the PS dense path).

At each new best evaluation the worker copies the rows of every id it has trained and the dense parameters; after
it, before a step trains an id first trained since, that id's row is pulled (its value at the best: its initial
row on fresh tables, an earlier run's on tables that held a model). At the end of the loop it pushes best - current
for all of them as add-delta pushes (the optimizer's state stays as it is, but FTRL's z is set to give the
embedding put back, so that training on from it starts there: ps.rows.optim.ftrl_match_state): the tables then
hold the model of the best evaluation. The pushes go through the worker's row source (push_apart), with its job's
stamp as the MLP's pushes apart from a step's: a shard that another job holds refuses them. Those pushes count no shows,
so an id not admitted (one a Shrink dropped since the best) stays so, with its initial row: the rows the pushes return
say which ids did not take the best row, and restore() keeps them per table (not_restored; the run's summary counts
them).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import numpy as np

from ps.config import HALF_MAX
from worker.batch import TableIds
from worker.client import PushItem
from worker.dense import DenseSync
from worker.dense import table_name as dense_table
from worker.models.spec import ModelSpec

log = logging.getLogger(__name__)

MAX_BEST_FLOATS = 64 << 20  # BestModel copies at most this many floats (256 MiB); past it, no restore
SEEN_MERGE_STEPS = 64  # the ids of this many steps are merged into the sorted ids trained before
# ps.storage.rowformat.to_half moves a normal value by at most a whole float16 step, this fraction of it (rounding
# to nearest moves it half that, and a value rounding took past the weight_bound goes to the next float16 toward
# zero), and a subnormal one by at most the smallest subnormal
HALF_STEP = 2.0**-10
HALF_SUBNORMAL_STEP = 2.0**-24


class BestModel:
    """The ids trained so far per table and, at each new best, a copy of their rows and of the dense parameters;
    since the best, the rows of ids first trained then, as they were; restore() pushes the difference back (see
    the module docstring)."""

    def __init__(
        self,
        tables: Any,
        spec: ModelSpec,
        weight_bounds: dict[str, float] | None = None,
        source: Any = None,
        half_at_rest: Collection[str] = (),
    ):
        """weight_bounds: {table: its weight_bound} of the tables that have one (the servers clip the rows a push
        admits to it, the restore's included). source: the worker's row source (worker/steprows.py), whose
        push_apart sends the restore's pushes with the job's stamp; None: tables.push_many, unstamped.
        half_at_rest: the tables of values_at_rest "float16", whose rows may come back from RocksDB rounded to
        float16 between the restore's pull and its push (_not_put_back allows for it)."""
        self.tables, self.spec, self.source = tables, spec, source
        self.weight_bounds = weight_bounds or {}
        self.half_at_rest = frozenset(half_at_rest)
        self.seen: dict[str, list[np.ndarray]] = {t: [] for t in spec.table_dims()}
        self.rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # at the best: (sorted ids, their rows)
        self.later: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # ids first trained since, their rows then
        self.dense: dict[str, np.ndarray] = {}
        self.too_big = False
        self.not_restored: dict[str, np.ndarray] = {}  # after restore(): per table, the ids not put back

    def add(self, tids: dict[str, TableIds]) -> None:
        """The ids of a step about to be trained; once a best is kept, the rows of those first trained since are
        pulled first (their values at the best). Once the ids trained so far hold more than MAX_BEST_FLOATS floats
        of rows, nothing is kept any more (too_big: no restore), so memory and time stay bounded in a long run."""
        if self.too_big:
            return
        if self.rows:
            fresh = [(t, ti.uniq[~_among(ti.uniq, self.rows[t][0]) & ~_among(ti.uniq, self.later[t][0])])
                     for t, ti in tids.items()]  # fmt: skip
            fresh = [(t, ids) for t, ids in fresh if len(ids)]
            if fresh:
                for (t, ids), rows in zip(fresh, self.tables.pull_many(fresh)):
                    merged = np.concatenate([self.later[t][0], ids])
                    order = np.argsort(merged, kind="stable")
                    self.later[t] = (merged[order], np.concatenate([self.later[t][1], rows])[order])
                if self._floats() > MAX_BEST_FLOATS:
                    self._give_up()
                    return
        merged = False
        for t, ti in tids.items():
            seen = self.seen[t]
            seen.append(ti.uniq)
            if len(seen) >= SEEN_MERGE_STEPS:
                self.seen[t], merged = [_merged_unique(seen)], True
        if merged and sum(len(s[0]) * self.spec.row_dim(t) for t, s in self.seen.items() if s) > MAX_BEST_FLOATS:
            self._give_up()

    def _give_up(self) -> None:
        """More rows trained than a restore may copy: nothing is kept from now on (restore() returns False)."""
        self.too_big, self.rows, self.later, self.dense = True, {}, {}, {}
        self.seen = {t: [] for t in self.seen}

    @staticmethod
    def limit_bytes() -> int:
        """The most bytes of rows a BestModel copies (MAX_BEST_FLOATS float32s)."""
        return 4 * MAX_BEST_FLOATS

    def _floats(self) -> int:
        kept = [*self.rows.values(), *self.later.values()]
        return sum(rows.size for _, rows in kept)

    def keep(self, dense_values: dict[str, np.ndarray]) -> None:
        if self.too_big:
            return
        ids = {t: _merged_unique(s) if s else np.zeros(0, np.uint64) for t, s in self.seen.items()}
        self.seen = {t: [u] for t, u in ids.items()}
        floats = sum(len(u) * self.spec.row_dim(t) for t, u in ids.items())
        if floats > MAX_BEST_FLOATS:
            self._give_up()
            return
        pulled = self.tables.pull_many(list(ids.items()))
        self.rows = {t: (u, r.copy()) for (t, u), r in zip(ids.items(), pulled)}
        self.later = {
            t: (np.zeros(0, np.uint64), np.zeros((0, r.shape[1]), np.float32)) for t, (_, r) in self.rows.items()
        }
        self.dense = {k: v.copy() for k, v in dense_values.items()}

    def restore(self, dense: DenseSync) -> bool:
        """Pushes best - current for every kept row and dense parameter; False if nothing was kept. The ids whose
        rows did not become the best ones (not admitted) go to not_restored, with a warning."""
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
        wanted = [(rows, cur) for (_, rows), cur in zip(best.values(), now)]
        for p in dense.params:
            name = p.name
            pushes.append(PushItem(dense_table(p), dense.ids[name], self.dense[name] - current[name],
                                   shows=np.zeros(p.shape[0], np.float32)))  # fmt: skip
            wanted.append((self.dense[name], current[name]))
        if self.source is not None:
            after = self.source.push_apart(pushes, add_delta=True)
        else:
            after = self.tables.push_many(pushes, add_delta=True, return_rows=True)
        for push, got, (want, cur) in zip(pushes, after, wanted, strict=True):
            bound, half = self.weight_bounds.get(push.table, 0.0), push.table in self.half_at_rest
            missed = push.ids[_not_put_back(got, want, cur, bound, half)]
            if len(missed):
                self.not_restored[push.table] = missed
                log.warning("early stopping put the best model back but for %s ids of table %s (%s): not admitted "
                            "(dropped by a Shrink since the best), they hold their initial rows", f"{len(missed):,}",
                            push.table, ", ".join(str(i) for i in missed[:5]) + ", ..." * (len(missed) > 5))  # fmt: skip
        dense.pull()
        return True


def _not_put_back(got: np.ndarray, want: np.ndarray, cur: np.ndarray, bound: float, half: bool = False) -> np.ndarray:
    """bool per row: whether got, the row after adding want - cur to cur (float32) and, where bound > 0 (the
    table's weight_bound), clipping it to [-bound, bound] as the servers clip an admitted row, is not want so
    clipped. Such an id was not admitted by the push (its row stays as it was, an initial row beyond the bound
    included); an admitted one is the clipped want but for the rounding of the delta and of its sum, each under
    half an ulp of |want| + |cur| (clipping both moves them no further apart). half: a table of values_at_rest
    "float16", where the push may find cur as RocksDB holds it (evicted after the pull, read back): clipped to
    +-HALF_MAX and rounded to float16 within the bound, at most HALF_STEP * |cur| + HALF_SUBNORMAL_STEP from it."""
    tol = np.finfo(np.float32).eps * (np.abs(want) + np.abs(cur))
    if half:
        tol += HALF_STEP * np.abs(cur) + HALF_SUBNORMAL_STEP + np.maximum(np.abs(cur) - HALF_MAX, 0.0)
    if bound > 0:
        want = np.clip(want, -np.float32(bound), np.float32(bound))
    return (np.abs(got - want) > tol).any(axis=1)


def _merged_unique(arrays: list[np.ndarray]) -> np.ndarray:
    """The sorted unique ids of arrays, the first of which is sorted and unique already (an earlier merge's, or
    one step's): the others are made unique and sorted, then merged with it by a stable sort, which finds the two
    sorted runs and merges them in linear time, where sorting all the ids again would grow with the run."""
    rest = np.unique(np.concatenate(arrays[1:])) if len(arrays) > 1 else np.zeros(0, arrays[0].dtype)
    merged = np.sort(np.concatenate([arrays[0], rest]), kind="stable")
    return merged[np.r_[True, merged[1:] != merged[:-1]]] if len(merged) else merged


def _among(ids: np.ndarray, sorted_ids: np.ndarray) -> np.ndarray:
    """bool per id: whether it is in sorted_ids (sorted, unique)."""
    if len(sorted_ids) == 0:
        return np.zeros(len(ids), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return sorted_ids[at] == ids

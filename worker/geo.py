"""GeoTables: GEO-SGD on a worker. It trains local copies of the rows it touches with each table's own optimizer
and pushes the accumulated deltas every `every` steps; the servers add them without their optimizer.

    rows(ids)     the local embeddings of the ids asked for; ids not held are pulled (one pull_many for every
                  table) and kept: local = [pulled embedding | Optimizer.init_state], base = pulled embedding
    apply(...)    one step of the table's optimizer (ps.rows.optim) on the local rows, in its layout
                  [embedding | optimizer state], then the clip to the table's weight_bound that the servers apply;
                  shows and clicks are summed per id
    end_step()    every `every` steps, one push_many (add_delta=True, return_rows=True, advance_clock: the steps
                  run since the last push, `every` but after a flush() mid-round, advanced on every shard in the
                  same PushBatch as the shard's deltas) of, per table,
                  every id changed since the last push: delta = (local embedding - base) / num_workers (the workers'
                  deltas of a row averaged, as Paddle's GEO-SGD does: each took its own steps from the same rows,
                  and their sum would move a row common to all, the bias first, N times as far as one step of
                  training; 3 workers summing on 30,000 rows end above the base rate's logloss), its shows and
                  its clicks (each clipped to what one push may carry per id, ps.rows.pushcheck.MAX_COUNT_PER_ID, as
                  a sync step's sum of its workers' counts is: a hot id's round can pass it). Then
                  base = local embedding = the rows returned, which carry the other workers' deltas too; the local
                  optimizer state stays. A round with nothing pending pushes nothing and advances no clock: the
                  next push advances it by its steps too.
    flush()       the same push now, of what is pending: a validation's, and the last, partial round's at the end
                  of a run (or of a stopped one); so a run's pushes advance every shard's clock by each of its
                  steps (but trailing steps that changed no row).
    memory        after a push, past capacity_bytes, held rows leave least frequently used first
                  (worker.idslots.evict_lfu; frequencies count rows() requests and halve every DECAY_STEPS steps);
                  a row coming back starts again from the pulled embedding and the initial optimizer state. Between
                  pushes every row changed since the last one stays (its delta is pending). After an eviction the
                  arrays of a table holding under half their slots shrink to its rows (IdSlots.compact_if_sparse),
                  so that rows which left (or a round's pending rows, pushed) leave no arrays of their size behind.

Bytes of one held row (row_bytes): local 4 (dim + state floats), base 4 dim, shows and clicks 8, changed flag 1,
and worker.idslots.SLOT_BYTES of bookkeeping.

What the servers do and the local step does not: the lazy L2 of TableConfig.l2 (it decays rows at optimizer
pushes; an add-delta push adds the delta as it is, so geo mode refuses tables with an l2: worker.model_tables);
admission (an id that the server has not admitted yet only counts its shows, and its delta is dropped: its row comes
back at its initial value); a Shrink (ps.engine.shrinkrule: TTL, score), whose drop of a held row this worker does not
learn of: the delta of a row dropped since its last refresh is added to the id's initial row (any push to a dropped
id trains its initial row), and that row (initial + delta) comes back as the local one, its local optimizer state
kept; the trained row is not brought back (Paddle's GEO-SGD table likewise creates a missing id's row before it adds
a delta to it).
Rows held but not changed between two pushes keep the embedding of their last refresh, a dropped one's too. FTRL
derives its embedding from its local state at each step, so for it the other workers' deltas last only until
this worker's next step on the row.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from ps.config import TableConfig
from ps.rows.optim import get_optimizer
from ps.rows.pushcheck import MAX_COUNT_PER_ID
from ps.stamp import WorkerStamp
from worker.client import PushItem
from worker.idslots import SLOT_BYTES, IdSlots, evict_lfu, grown

DECAY_STEPS = 64  # steps between halvings of the rows' use frequencies


@numba.njit(nogil=True, cache=True)
def _gather(src, slots, out):
    """out[i] = src[slots[i], :out.shape[1]]."""
    for i in range(slots.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = src[slots[i], j]


@numba.njit(nogil=True, cache=True)
def _scatter(dst, slots, src):
    """dst[slots[i], :src.shape[1]] = src[i]."""
    for i in range(slots.shape[0]):
        for j in range(src.shape[1]):
            dst[slots[i], j] = src[i, j]


def _gathered(src: np.ndarray, slots: np.ndarray, cols: int) -> np.ndarray:
    out = np.empty((len(slots), cols), src.dtype)
    _gather(src, slots, out)
    return out


class _LocalTable:
    """One table's held rows: slots from an IdSlots, and per slot the arrays of the module docstring."""

    def __init__(self, cfg: TableConfig, capacity_bytes: int, seed: int):
        self.cfg, self.dim = cfg, cfg.dim
        self.optimizer = get_optimizer(cfg.optimizer)
        self.width = cfg.dim + self.optimizer.state_floats(cfg.dim)
        self.row_bytes = 4 * self.width + 4 * cfg.dim + 8 + 1 + SLOT_BYTES
        self.slots = IdSlots(capacity_bytes // self.row_bytes, seed)
        self.local = np.zeros((0, self.width), np.float32)
        self.base = np.zeros((0, self.dim), np.float32)
        self.counts = np.zeros((0, 2), np.float32)  # shows, clicks since the last push
        self.changed = np.zeros(0, np.bool_)

    def hold(self, ids: np.ndarray, embeddings: np.ndarray) -> None:
        """Keeps ids (not held) with their pulled embeddings and the optimizer's initial state."""
        new = self.slots.add(ids)
        n = self.slots.capacity
        self.local, self.base = grown(self.local, n), grown(self.base, n)
        self.counts, self.changed = grown(self.counts, n), grown(self.changed, n)
        rows = np.zeros((len(ids), self.width), np.float32)
        rows[:, : self.dim] = embeddings
        self.optimizer.init_state(rows, self.dim)
        _scatter(self.local, new, rows)
        _scatter(self.base, new, np.ascontiguousarray(embeddings, np.float32))
        self.counts[new] = 0
        self.changed[new] = False

    def compact(self) -> None:
        """The arrays shrunk to the rows held, where they hold under half their slots (IdSlots.compact_if_sparse)."""
        self.local, self.base, self.counts, self.changed = self.slots.compact_if_sparse(
            self.local, self.base, self.counts, self.changed
        )

    def pending(self) -> np.ndarray:
        """Slots changed since the last push, in the order of their ids."""
        slots = np.flatnonzero(self.changed & (self.slots.live == 1))
        return slots[np.argsort(self.slots.keys[slots])]


class GeoTables:
    """Local rows of several tables over a Client (or anything with its pull_many / push_many); see the module
    docstring. Not thread-safe."""

    def __init__(self, tables: Any, configs: dict[str, TableConfig], every: int, capacity_bytes: int = 1 << 30,
                 num_workers: int = 1, stamp: WorkerStamp | None = None):  # fmt: skip
        """configs: the TableConfig of each table trained here (as the servers hold it); every: steps per push;
        num_workers: the job's workers, whose deltas the servers add (each pushes 1/num_workers of its own);
        stamp: the job's unclocked stamp, which the pushes carry (None: none)."""
        if every < 1:
            raise ValueError(f"GeoTables needs every >= 1 step per push, got {every}")
        if num_workers < 1:
            raise ValueError(f"GeoTables needs num_workers >= 1, got {num_workers}")
        self.tables, self.every, self.capacity_bytes = tables, every, int(capacity_bytes)
        self.stamp = stamp
        self.delta_scale = np.float32(1.0 / num_workers)
        self._local = {t: _LocalTable(cfg, self.capacity_bytes, i) for i, (t, cfg) in enumerate(configs.items())}
        self.steps = self.pushes = self.ids_pushed = self.pulls = self.ids_pulled = 0
        self.clocked_steps = 0  # steps whose clock advance a push carried

    @property
    def local_rows(self) -> int:
        return sum(len(L.slots) for L in self._local.values())

    @property
    def bytes_used(self) -> int:
        return sum(len(L.slots) * L.row_bytes for L in self._local.values())

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the arrays held for every table: local, base, counts, changed and the IdSlots'."""
        return sum(L.local.nbytes + L.base.nbytes + L.counts.nbytes + L.changed.nbytes + L.slots.nbytes
                   for L in self._local.values())  # fmt: skip

    def held(self, table: str, ids: np.ndarray) -> np.ndarray:
        """bool per id: whether its row is held here."""
        return self._local[table].slots.find(ids) >= 0

    def rows(self, tids: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{table: the local embeddings (n, dim) of its ids}, pulling (one pull_many) and keeping those not held."""
        found = {t: self._local[t].slots.find(ids) for t, ids in tids.items()}
        for t, slots in found.items():
            self._local[t].slots.touch(slots)
        missing = [(t, np.unique(np.asarray(tids[t], np.uint64)[slots < 0])) for t, slots in found.items()]
        missing = [(t, ids) for t, ids in missing if len(ids)]
        if missing:
            pulled = self.tables.pull_many(missing)
            self.pulls += 1
            for (t, ids), embeddings in zip(missing, pulled):
                self._local[t].hold(ids, embeddings)
                self.ids_pulled += len(ids)
        out = {}
        for t, ids in tids.items():
            local, slots = self._local[t], found[t]
            new = slots < 0
            if new.any():
                slots[new] = local.slots.find(np.asarray(ids, np.uint64)[new])
            out[t] = _gathered(local.local, slots, local.dim)
        return out

    def apply(self, table: str, ids: np.ndarray, grads: np.ndarray, shows: Any, clicks: Any) -> None:
        """One optimizer step on the local rows of ids (unique, held: rows() first) with grads (n, dim); shows
        and clicks (per id, or one value for all) are added to the ids' counts for the next push."""
        local = self._local[table]
        slots = local.slots.find(ids)
        if (slots < 0).any():
            raise KeyError(
                f"GeoTables.apply to {table!r}: {int((slots < 0).sum())} ids are not held; call rows() first"
            )
        rows = _gathered(local.local, slots, local.width)
        local.optimizer.apply(rows, np.ascontiguousarray(grads, np.float32).reshape(len(slots), local.dim))
        bound = local.cfg.weight_bound
        if bound > 0:
            np.clip(rows[:, : local.dim], -bound, bound, out=rows[:, : local.dim])
        _scatter(local.local, slots, rows)
        local.counts[slots, 0] += np.asarray(shows, np.float32)
        local.counts[slots, 1] += np.asarray(clicks, np.float32)
        local.changed[slots] = True

    def end_step(self) -> bool:
        """Counts a step; every `every` steps pushes what is pending (see the module docstring). True if it
        pushed."""
        self.steps += 1
        if self.steps % DECAY_STEPS == 0:
            for local in self._local.values():
                local.slots.decay()
        return self.steps % self.every == 0 and self.flush()

    def flush(self) -> bool:
        """Pushes every pending delta now (and, if anything is pending, advances every shard's clock by the steps
        run since the last push's advance, in the same push_many), refreshes those rows, then keeps memory within
        capacity_bytes. True if anything was pending."""
        plan = [(t, local, local.pending()) for t, local in self._local.items()]
        plan = [(t, local, slots) for t, local, slots in plan if len(slots)]
        if plan:
            items = []
            for t, local, slots in plan:
                delta = (_gathered(local.local, slots, local.dim) - local.base[slots]) * self.delta_scale
                counts = np.minimum(local.counts[slots], np.float32(MAX_COUNT_PER_ID))  # a push's limit per id
                items.append(PushItem(t, local.slots.keys[slots], delta, clicks=counts[:, 1], shows=counts[:, 0]))
            returned = self.tables.push_many(items, advance_clock=self.steps - self.clocked_steps, return_rows=True,
                                             add_delta=True, stamp=self.stamp)  # fmt: skip
            self.clocked_steps = self.steps
            for (_, local, slots), rows in zip(plan, returned):
                rows = np.ascontiguousarray(rows, np.float32)
                _scatter(local.local, slots, rows)
                _scatter(local.base, slots, rows)
                local.counts[slots] = 0
                local.changed[slots] = False
                self.ids_pushed += len(slots)
            self.pushes += 1
        over = self.bytes_used - self.capacity_bytes
        if over > 0:
            sets = list(self._local.values())
            evict_lfu([s.slots for s in sets], [s.row_bytes for s in sets], over, self.pushes)
            for local in sets:
                local.compact()
        return bool(plan)

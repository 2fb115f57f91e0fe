"""Table: one sparse table of one shard; rows in a RAM arena (IdIndex -> arena row) in front of the Store.

Row layout in the arena and on disk: `[embedding (dim) | optimizer state]`, float32, `width` floats.
- pull: look the ids up; misses are read from the Store with one multi_get, or initialized (a pure function
  of the id), and admitted to RAM; then one compiled gather of the embeddings.
- push: resolve rows the same way, gather them into a contiguous buffer, apply the optimizer there, write the
  buffer to RocksDB in one WriteBatch (durable before acknowledging), and only then scatter it into the arena.
  So a failure at any point before the scatter leaves the table as it was.
The RAM tier here is unbounded: it holds every row touched since the start (bounding it is the next step).
Thread-safety: one lock per table serializes pull and push.
"""

from __future__ import annotations

import threading

import numba
import numpy as np

from ps.config import TableConfig
from ps.errors import InvalidArgumentError
from ps.index import IdIndex
from ps.initializers import init_rows
from ps.optim import get_optimizer
from ps.store import Store


@numba.njit(nogil=True, cache=True)
def gather(arena, rows, cols, out):
    """out[i, :cols] = arena[rows[i], :cols]."""
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(cols):
            out[i, j] = arena[r, j]


@numba.njit(nogil=True, cache=True)
def scatter(arena, rows, buf):
    """arena[rows[i], :] = buf[i, :]."""
    width = buf.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(width):
            arena[r, j] = buf[i, j]


@numba.njit(nogil=True, cache=True)
def _first_duplicate(rows, stamps, stamp):
    """Index of the first entry of rows seen earlier in rows, or -1. stamps[r] holds the last stamp of row r."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if stamps[r] == stamp:
            return i
        stamps[r] = stamp
    return -1


class Table:
    def __init__(self, cfg: TableConfig, store: Store, capacity: int = 1024):
        self.cfg = cfg
        self.name = cfg.name
        self.dim = cfg.dim
        self.optimizer = get_optimizer(cfg.optimizer)
        self.width = cfg.dim + self.optimizer.state_floats(cfg.dim)
        self.store = store
        self.index = IdIndex(capacity)
        self.arena = np.empty((capacity, self.width), dtype=np.float32)
        self.ids_of_row = np.empty(capacity, dtype=np.uint64)
        self.stored = np.zeros(capacity, dtype=bool)  # the row exists in RocksDB
        self.stamps = np.zeros(capacity, dtype=np.int64)
        self.used = 0
        self.num_stored = store.count_rows(cfg.name)
        self.lock = threading.Lock()
        self.counters = {"pulls": 0, "pushes": 0, "ids_pulled": 0, "ids_pushed": 0}
        self._stamp = 0

    # ---- public API -----------------------------------------------------------------------------------
    def pull(self, ids: np.ndarray) -> np.ndarray:
        """(n, dim) embeddings of ids (duplicates allowed), in order."""
        with self.lock:
            rows = self._resolve(ids)
            out = np.empty((len(ids), self.dim), dtype=np.float32)
            gather(self.arena, rows, self.dim, out)
            self.counters["pulls"] += 1
            self.counters["ids_pulled"] += len(ids)
            return out

    def push(self, ids: np.ndarray, grads: np.ndarray) -> None:
        """Applies the optimizer to the rows of unique ids with finite (n, dim) grads; durable on return."""
        with self.lock:
            rows = self._resolve(ids)
            self._stamp += 1
            dup = _first_duplicate(rows, self.stamps, self._stamp)
            if dup >= 0:
                first = int(np.flatnonzero(ids == ids[dup])[0])
                raise InvalidArgumentError(
                    f"push to table {self.name!r} repeats id {int(ids[dup])} (positions {first} and {dup}); "
                    "ids must be unique: sum the gradients of duplicate ids before pushing"
                )
            buf = np.empty((len(ids), self.width), dtype=np.float32)
            gather(self.arena, rows, self.width, buf)
            self.optimizer.apply(buf, np.ascontiguousarray(grads, dtype=np.float32))
            new_stored = int(len(rows) - np.count_nonzero(self.stored[rows]))
            self.store.put_rows(self.name, ids, buf, total_rows=self.num_stored + new_stored)
            self.num_stored += new_stored
            self.stored[rows] = True
            scatter(self.arena, rows, buf)
            self.counters["pushes"] += 1
            self.counters["ids_pushed"] += len(ids)

    def peek(self, ids: np.ndarray) -> np.ndarray:
        """(n, width) full rows (embedding and optimizer state), for tests and tools."""
        with self.lock:
            rows = self._resolve(ids)
            out = np.empty((len(ids), self.width), dtype=np.float32)
            gather(self.arena, rows, self.width, out)
            return out

    # ---- RAM tier ---------------------------------------------------------------------------------------
    def _resolve(self, ids: np.ndarray) -> np.ndarray:
        """Arena row of each id, admitting missing ids from the store (or their initial value)."""
        rows = self.index.lookup(ids)
        miss = rows < 0
        if miss.any():
            missing, inverse = np.unique(ids[miss], return_inverse=True)
            rows[miss] = self._admit(missing)[inverse]
        return rows

    def _admit(self, ids: np.ndarray) -> np.ndarray:
        found, stored_rows = self.store.get_rows(self.name, ids, self.width)
        block = np.empty((len(ids), self.width), dtype=np.float32)
        block[found] = stored_rows
        fresh = ~found
        if fresh.any():
            new = np.empty((int(fresh.sum()), self.width), dtype=np.float32)
            init_rows(self.cfg.initializer, ids[fresh], new, self.dim)
            self.optimizer.init_state(new, self.dim)
            block[fresh] = new
        rows = self._allocate(len(ids))
        self.arena[rows] = block
        self.ids_of_row[rows] = ids
        self.stored[rows] = found
        self.index.insert(ids, rows)
        return rows

    def _allocate(self, n: int) -> np.ndarray:
        need = self.used + n
        if need > len(self.arena):
            cap = max(need, 2 * len(self.arena))
            self.arena = _grown(self.arena, cap)
            self.ids_of_row = _grown(self.ids_of_row, cap)
            self.stored = _grown(self.stored, cap)
            self.stamps = _grown(self.stamps, cap)
        rows = np.arange(self.used, need, dtype=np.int64)
        self.used = need
        return rows

    def stats(self) -> dict:
        return {"name": self.name, "dim": self.dim, "num_rows": self.num_stored, **self.counters}


def _grown(a: np.ndarray, capacity: int) -> np.ndarray:
    out = np.zeros((capacity,) + a.shape[1:], dtype=a.dtype)
    out[: len(a)] = a
    return out

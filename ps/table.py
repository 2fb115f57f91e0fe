"""Table: one sparse table of one shard: a bounded RAM Arena in front of the Store, with journaled pushes.

- pull: look the ids up in the arena; misses are read from RocksDB with one multi_get (or initialized from a
  hash of the id when RocksDB has no row) and admitted, evicting cold rows (dirty ones are written back first,
  in one WriteBatch); then one compiled gather.
- push: resolve rows the same way (a cache fill, no visible change), reject duplicate ids, compute the updated
  rows into a buffer (rejecting a float32 overflow), append the push to the journal (durable from here on),
  then scatter the buffer; the rows become dirty and carry the push's seq as their lsn. The Shard's flusher
  writes dirty rows to RocksDB in the background.
- replay (start-up): journal records after the last flush are applied again to the rows whose lsn is older.
A request bigger than half of what the table may hold is processed in chunks, so it never evicts its own rows.
Thread-safety: one lock per table serializes pull, push, flush.
"""

from __future__ import annotations

import threading

import numpy as np

from ps.arena import Arena, MemoryBudget
from ps.config import TableConfig
from ps.errors import InvalidArgumentError, ShardClosingError, StorageError
from ps.initializers import init_rows
from ps.journal import Journal, Record
from ps.layout import RowLayout
from ps.optim import get_optimizer
from ps.rowcopy import gather
from ps.store import Store

FLUSH_CHUNK_ROWS = 65536


class Table:
    def __init__(self, cfg: TableConfig, store: Store, journal: Journal, budget: MemoryBudget):
        self.cfg = cfg
        self.name = cfg.name
        self.dim = cfg.dim
        self.optimizer = get_optimizer(cfg.optimizer)
        self.layout = RowLayout(cfg.dim, self.optimizer.state_floats(cfg.dim))
        self.width = self.layout.width
        self.store = store
        self.journal = journal
        self.arena = Arena(self.width, budget)
        self.num_stored = store.count_rows(cfg.name)  # rows in RocksDB
        self.num_rows = self.num_stored  # rows that exist: in RocksDB, or pushed since (dirty)
        self.lock = threading.Lock()
        self.closed = False
        self.counters = {"pulls": 0, "pushes": 0, "ids_pulled": 0, "ids_pushed": 0, "cache_misses": 0}

    # ---- public API -----------------------------------------------------------------------------------
    def pull(self, ids: np.ndarray) -> np.ndarray:
        """(n, dim) embeddings of ids (duplicates allowed), in order."""
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        with self.lock:
            self._check_open()
            for lo, hi in self._chunks(len(ids)):
                if self.arena.gather_hits(ids[lo:hi], self.dim, out[lo:hi]):  # some missed: admit them
                    rows = self._resolve(ids[lo:hi], self.arena.new_stamp())
                    gather(self.arena.data, rows, self.dim, out[lo:hi])
            self.counters["pulls"] += 1
            self.counters["ids_pulled"] += len(ids)
        return out

    def push(self, ids: np.ndarray, grads: np.ndarray) -> int:
        """Applies the optimizer to the rows of unique ids with (n, dim) finite grads; durable on return.
        Returns the push's journal seq. Nothing changes if it is rejected (duplicate ids, a result that
        would not be finite) or the journal cannot be written."""
        ids = np.ascontiguousarray(ids, dtype="<u8")
        grads = np.ascontiguousarray(grads, dtype="<f4")
        if len(ids) == 0:
            return 0
        with self.lock:
            self._check_open()
            chunks = list(self._chunks(len(ids)))
            if len(chunks) > 1:  # chunks are resolved one by one: find duplicates across all of them first
                _, first, counts = np.unique(ids, return_index=True, return_counts=True)
                if (counts > 1).any():
                    self._raise_duplicate(ids, int(np.setdiff1d(np.arange(len(ids)), first)[0]))
            updates = []  # (lo, hi, rows, new rows): computed first, committed once the journal has the push
            for lo, hi in chunks:
                rows = self._resolve(ids[lo:hi], self.arena.new_stamp(), reject_duplicates=True)
                updates.append((lo, hi, rows, self._updated(rows, grads[lo:hi], ids[lo:hi])))
            seq = self.journal.append(self.name, ids, grads)
            for lo, hi, rows, buf in updates:
                if len(updates) > 1:  # an earlier chunk's rows may have been evicted (unchanged) since
                    rows = self._resolve(ids[lo:hi], self.arena.new_stamp())
                self._commit(rows, buf, seq)
            self.counters["pushes"] += 1
            self.counters["ids_pushed"] += len(ids)
            return seq

    def replay(self, record: Record) -> int:
        """Applies a journal record to the rows it has not reached yet (lsn < seq). Returns rows updated."""
        updated = 0
        with self.lock:
            for lo, hi in self._chunks(len(record.ids)):
                rows = self._resolve(record.ids[lo:hi], self.arena.new_stamp())
                todo = self.arena.lsn[rows] < np.uint64(record.seq)
                rows = rows[todo]
                self._commit(rows, self._updated(rows, np.ascontiguousarray(record.grads[lo:hi][todo])), record.seq)
                updated += len(rows)
        return updated

    def flush(self) -> int:
        """Writes every row that is dirty when the scan reaches it to RocksDB; returns rows written."""
        start, written = 0, 0
        while True:
            with self.lock:
                if self.closed:
                    return written
                rows, start = self.arena.collect_dirty(start, FLUSH_CHUNK_ROWS)
                if len(rows):
                    self._persist(rows)
                    written += len(rows)
                if start >= self.arena.used:
                    return written

    def peek(self, ids: np.ndarray) -> np.ndarray:
        """(n, width) full rows (embedding and optimizer state), for tests and tools."""
        out = np.empty((len(ids), self.width), dtype=np.float32)
        with self.lock:
            for lo, hi in self._chunks(len(ids)):
                rows = self._resolve(ids[lo:hi], self.arena.new_stamp())
                gather(self.arena.data, rows, self.width, out[lo:hi])
        return out

    def stats(self) -> dict:
        a = self.arena
        return {
            "name": self.name,
            "dim": self.dim,
            "num_rows": self.num_rows,
            "rows_in_ram": a.used,
            "rows_on_disk": self.num_stored,
            "dirty_rows": int(np.count_nonzero(a.dirty[: a.used])),
            "evictions": a.evictions,
            "ram_bytes": a.ram_bytes(),
            **self.counters,
        }

    # ---- internals (lock held) ----------------------------------------------------------------------
    def _chunks(self, n: int):
        step = self.arena.max_pinnable()
        for lo in range(0, max(n, 1), step):
            yield lo, min(n, lo + step)

    def _check_open(self) -> None:
        if self.closed:
            raise ShardClosingError(f"table {self.name!r}: the server is shutting down")

    def _raise_duplicate(self, ids: np.ndarray, dup: int):
        first = int(np.flatnonzero(ids == ids[dup])[0])
        raise InvalidArgumentError(
            f"push to table {self.name!r} repeats id {int(ids[dup])} (positions {first} and {dup}); "
            "ids must be unique: sum the gradients of duplicate ids before pushing"
        )

    def _resolve(self, ids: np.ndarray, stamp: int, reject_duplicates: bool = False) -> np.ndarray:
        """Arena row of each id; admits missing ids. With reject_duplicates, a repeated id raises
        InvalidArgumentError before anything is admitted."""
        rows, dup = self.arena.lookup(ids, stamp)
        miss = np.flatnonzero(rows < 0)
        missing = first = inverse = None
        if len(miss):
            missing, first, inverse = np.unique(ids[miss], return_index=True, return_inverse=True)
            if len(missing) < len(miss):
                repeated = int(miss[np.setdiff1d(np.arange(len(miss)), first)[0]])
                dup = repeated if dup < 0 else min(dup, repeated)
        if reject_duplicates and dup >= 0:
            self._raise_duplicate(ids, dup)
        if missing is not None:
            rows[miss] = self._admit(missing, stamp)[inverse.ravel()]
            self.counters["cache_misses"] += len(missing)
        return rows

    def _admit(self, ids: np.ndarray, stamp: int) -> np.ndarray:
        found, stored_rows, stored_lsn = self.store.get_rows(self.name, ids, self.width)
        block = np.empty((len(ids), self.width), dtype=np.float32)
        lsn = np.zeros(len(ids), dtype=np.uint64)
        block[found] = stored_rows
        lsn[found] = stored_lsn
        fresh = ~found
        if fresh.any():
            new = np.empty((int(fresh.sum()), self.width), dtype=np.float32)
            init_rows(self.cfg.initializer, ids[fresh], new, self.dim)
            self.optimizer.init_state(new, self.dim)
            block[fresh] = new
        rows = self._make_room(len(ids), stamp)
        self.arena.install(rows, ids, block, lsn, found.astype(np.uint8), stamp)
        return rows

    def _make_room(self, n: int, stamp: int) -> np.ndarray:
        rows = self.arena.grow(n, stamp)
        if len(rows) < n:
            victims = self.arena.victims(n - len(rows), stamp)
            if len(victims) < n - len(rows):
                raise StorageError(f"table {self.name!r}: no evictable rows for {n} ids (RAM tier too small)")
            dirty = victims[self.arena.dirty[victims] == 1]
            if len(dirty):
                self._persist(dirty)
            self.arena.forget(victims)
            rows = np.concatenate([rows, victims])
        return rows

    def _updated(self, rows: np.ndarray, grads: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        """The rows after the optimizer step (a new buffer; the arena is untouched). With ids, a result that
        is not finite (float32 overflow) raises InvalidArgumentError."""
        buf = np.empty((len(rows), self.width), dtype=np.float32)
        bad = self.optimizer.step(self.arena.data, rows, grads, buf)
        if ids is not None and bad >= 0:
            raise InvalidArgumentError(
                f"push to table {self.name!r} would make the row of id {int(ids[bad])} non-finite "
                f"(float32 overflow: gradient {grads[bad].tolist()[:8]}); nothing was applied"
            )
        return buf

    def _commit(self, rows: np.ndarray, buf: np.ndarray, seq: int) -> None:
        """Puts updated rows into the arena as dirty rows at lsn seq."""
        self.num_rows += self.arena.commit(rows, buf, seq)

    def _persist(self, rows: np.ndarray) -> None:
        """Writes rows (data + lsn) to RocksDB with the new row count, then marks them clean and stored."""
        a = self.arena
        buf = np.empty((len(rows), self.width), dtype=np.float32)
        gather(a.data, rows, self.width, buf)
        new = int(len(rows) - np.count_nonzero(a.stored[rows]))
        self.store.put_rows(self.name, a.ids[rows], buf, a.lsn[rows], total_rows=self.num_stored + new)
        self.num_stored += new
        a.stored[rows] = 1
        a.dirty[rows] = 0

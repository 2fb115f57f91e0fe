"""RowLoader: one table's miss path: the arena rows of a request's ids, the ids missing from RAM admitted first.

A missing id's row is what RocksDB holds of it (read with one multi_get over the store's reader threads, or taken
from a read ahead that is still current: ps.engine.readahead), else its initial row (a hash of the id, the
optimizer's initial state, zero statistics); an id that RocksDB holds only statistics of gets an initial row with
those statistics. Room for them is made by growing the arena, else by evicting cold rows (dirty ones handed to the
store's write-behind thread by the table's RowWriter: ps.engine.rowwriter). Its callers hold the table lock.
"""

from __future__ import annotations

import copy
from typing import NoReturn

import numpy as np

from ps.config import TableConfig
from ps.engine.readahead import ReadAhead
from ps.engine.rowwriter import RowWriter
from ps.errors import NOTHING_APPLIED, InvalidArgumentError, PsError, StorageError, TableBusyError
from ps.rows.initializers import init_rows
from ps.rows.optim import Optimizer
from ps.storage.arena import Arena

FRESH_ROWS = 4096  # initial rows made at once for a miss (a bounded copy beside the rows read)


def raise_duplicate(table: str, ids: np.ndarray, dup: int) -> NoReturn:
    """InvalidArgumentError for a push to `table` whose ids repeat ids[dup] (at a later position than its first)."""
    first = int(np.flatnonzero(ids == ids[dup])[0])
    raise InvalidArgumentError(
        f"push to table {table!r} repeats id {int(ids[dup])} (positions {first} and {dup}); "
        "ids must be unique: sum the gradients of duplicate ids before pushing"
    )


class RowLoader:
    """counters: the table's, whose "cache_misses" counts the ids admitted."""

    def __init__(self, cfg: TableConfig, optimizer: Optimizer, arena: Arena, writer: RowWriter, counters: dict):
        self.cfg = cfg
        self.name = cfg.name
        self.dim = cfg.dim
        self.optimizer = optimizer
        self.arena = arena
        self.writer = writer
        self.store = writer.store
        self.width = arena.width
        self.stats_col = writer.stats_col
        self.counters = counters

    def resolve(self, ids: np.ndarray, stamp: int, reject_duplicates: bool = False,
                ahead: ReadAhead | None = None) -> np.ndarray:  # fmt: skip
        """Arena row of each id; admits missing ids to RAM (with the rows `ahead` read, where still current). With
        reject_duplicates, a repeated id raises InvalidArgumentError before anything is admitted."""
        rows, dup = self.arena.lookup(ids, stamp)
        miss = np.flatnonzero(rows < 0)
        missing = first = inverse = None
        if len(miss):
            missing, first, inverse = np.unique(ids[miss], return_index=True, return_inverse=True)
            if len(missing) < len(miss):
                repeated = int(miss[np.setdiff1d(np.arange(len(miss)), first)[0]])
                dup = repeated if dup < 0 else min(dup, repeated)
        if reject_duplicates and dup >= 0:
            raise_duplicate(self.name, ids, dup)
        if missing is not None:
            rows[miss] = self._admit(missing, stamp, ahead)[inverse.ravel()]
            self.counters["cache_misses"] += len(missing)
        return rows

    def initial(self, ids: np.ndarray) -> np.ndarray:
        """Rows of ids never pushed: initial embedding, initial optimizer state, zero statistics."""
        block = np.zeros((len(ids), self.width), dtype=np.float32)
        init_rows(self.cfg.initializer, ids, block, self.dim)
        self.optimizer.init_state(block[:, : self.stats_col], self.dim)
        return block

    def _admit(self, ids: np.ndarray, stamp: int, ahead: ReadAhead | None = None) -> np.ndarray:
        """Rows for ids (unique, none in RAM): what RocksDB holds (or `ahead` read of it), else initial rows. The
        rows are made in the array the read filled (one row per id): initial rows where RocksDB holds none (or
        only statistics, kept), FRESH_ROWS at a time, so a miss holds its rows once (ps.engine.room's costs)."""
        found, block, lsn, complete = ReadAhead.expand(self.store, self.name, ids, self.width, ahead)
        full, partial = found & complete, found & ~complete
        fresh = np.flatnonzero(~full)
        stats = block[partial, self.stats_col :]  # a copy: the initial rows put zero statistics in their place
        for lo in range(0, len(fresh), FRESH_ROWS):
            at = fresh[lo : lo + FRESH_ROWS]
            block[at] = self.initial(ids[at])
        block[partial, self.stats_col :] = stats
        stored = np.zeros(len(ids), dtype=np.uint8)
        stored[partial], stored[full] = 1, 2
        rows = self.make_room(len(ids), stamp)
        self.arena.install(rows, ids, block, lsn, stored, stamp)
        return rows

    def make_room(self, n: int, stamp: int) -> np.ndarray:
        """n free arena rows: grown, else evicted (dirty victims written behind first); TableBusyError, or the
        error of the table that could not give rows back, where none are to be had. Nothing changes then."""
        rows = self.arena.grow(n, stamp)
        if len(rows) < n:
            victims = self.arena.victims(n - len(rows), stamp)
            if len(victims) < n - len(rows):  # e.g. another table took the budget since this request was chunked
                self.arena.give_back(rows)  # the victims stay as they are: live rows, still indexed
                if self.arena.failed:  # the rows exist, but could not be written to be given back
                    raise self._not_given_back(n, *self.arena.failed[0])
                if self.arena.busy:  # the rows exist: the tables that hold them were taking rows back themselves
                    raise TableBusyError(
                        f"table {self.name!r} needs rows for {n} ids, and the tables above their share of the RAM "
                        f"tier that hold them ({', '.join(map(repr, self.arena.busy))}) were busy taking rows back "
                        f"themselves: send the request again; {NOTHING_APPLIED}"
                    )
                share = self.arena.budget.share_bytes() // self.arena.row_charge
                raise TableBusyError(
                    f"table {self.name!r} needs rows for {n} ids and found none to evict: its share of the RAM tier "
                    f"is {share} rows, and the other tables took the rest while the request ran: send the request "
                    f"again (it is cut to the share it finds); {NOTHING_APPLIED}"
                )
            dirty = victims[self.arena.dirty[victims] == 1]
            if len(dirty):
                self.writer.persist(dirty, background=True)
            self.arena.forget(victims)
            rows = np.concatenate([rows, victims])
        return rows

    def _not_given_back(self, n: int, holder: str, e: Exception) -> Exception:
        """The refusal of a request that needs rows for n ids, which table `holder`, above its share of the RAM
        tier, could not give back: its give_up failed with e (most often writing its dirty rows). Of e's class (a
        StorageError, DiskFullError, ...), a StorageError where e is no PsError; nothing was applied."""
        what = str(e).removesuffix(f"; {NOTHING_APPLIED}") if isinstance(e, PsError) else f"{type(e).__name__}: {e}"
        error = copy.copy(e) if isinstance(e, PsError) else StorageError("")
        error.args = (
            f"table {self.name!r} needs rows for {n} ids, and table {holder!r}, which holds them above its share of "
            f"the RAM tier, could not give them back: {what}; {NOTHING_APPLIED}",
        )
        return error

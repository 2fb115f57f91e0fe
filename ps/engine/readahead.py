"""ReadAhead: a read of a table's missing rows from RocksDB done without the table lock, and ReadAheads, the reads
of one table in progress, which each write of rows to RocksDB tells of the ids it wrote (their read may be stale).

A pull of one chunk (ps.engine.table.Table.pull) starts a read ahead of the ids it misses under the table lock,
reads them with the lock released, and admits them under the lock again (ps.engine.rowloader.RowLoader.resolve),
where an id written to RocksDB meanwhile, or not missing when the read began, is read again.
"""

from __future__ import annotations

import numpy as np

from ps.storage.store import Store


class ReadAheads:
    """The reads ahead of one table in progress; its callers hold the table lock."""

    def __init__(self) -> None:
        self._active: set[ReadAhead] = set()

    def __len__(self) -> int:
        return len(self._active)

    def start(self, ids: np.ndarray, rows: np.ndarray) -> ReadAhead:
        """A read of the ids of a request missing from RAM now (rows: each id's arena row, -1 where missing), to
        read without the lock; from here until end(), those of them written to RocksDB are collected in its
        `written` (their read may be stale)."""
        missing = ids[rows < 0]
        if len(missing) > 1 and not (missing[1:] > missing[:-1]).all():  # a client sends them sorted and unique
            missing = np.unique(missing)
        ahead = ReadAhead(missing)
        self.add(ahead)
        return ahead

    def add(self, ahead: ReadAhead) -> None:
        """Watches the writes for ahead until end(ahead)."""
        self._active.add(ahead)

    def end(self, ahead: ReadAhead) -> None:
        """Stops collecting the writes for ahead (KeyError if it is not watched)."""
        self._active.remove(ahead)

    def note_written(self, ids: np.ndarray) -> None:
        """ids were written to RocksDB: each read ahead in progress reads those of them it read again."""
        for ahead in self._active:
            ahead.note_written(ids)


class ReadAhead:
    """A read of rows from RocksDB done without the table lock: the ids missing from RAM when it began
    (`missing`, sorted and unique), what the store returned for them (expanded to one entry per id), and `written`:
    the arrays of those of them the table wrote to RocksDB since it began (note_written keeps no other ids: a write
    of another row cannot make this read stale). Where the read is used, an id that was written meanwhile, or was
    not missing when it began, is read again (under the lock)."""

    def __init__(self, missing: np.ndarray):
        self.missing = missing
        self.written: list[np.ndarray] = []
        self.stored: tuple[np.ndarray, ...] | None = None

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mine bool (len(ids),): the ids this read is for, the index in `missing` of each id where mine).
        missing must not be empty."""
        ids = ids.astype(self.missing.dtype, copy=False)  # one dtype: mixed int64/uint64 would compare as floats
        at = np.minimum(np.searchsorted(self.missing, ids), len(self.missing) - 1)
        return self.missing[at] == ids, at

    def note_written(self, ids: np.ndarray) -> None:
        """ids were written to RocksDB: keeps those this read is for."""
        if len(self.missing) == 0 or len(ids) == 0:
            return
        mine = ids[self.find(ids)[0]]
        if len(mine):
            self.written.append(mine)

    def read(self, store: Store, table: str, width: int) -> None:
        self.stored = ReadAhead.expand(store, table, self.missing, width, None)

    @staticmethod
    def expand(store: Store, table: str, ids: np.ndarray, width: int, ahead: ReadAhead | None) -> tuple:
        """(found (n,), rows (n, width), lsn (n,), complete (n,)) of ids: from `ahead` where it is current, else
        read by store.get_rows. The arrays are the caller's (ps.engine.rowloader fills its fresh rows into them):
        where they are the read ahead's own, it hands them over (its `stored` is None after)."""
        n = len(ids)
        if ahead is not None and ahead.stored is not None and not ahead.written and np.array_equal(ids, ahead.missing):
            stored, ahead.stored = ahead.stored, None  # the read ahead is of exactly these ids, nothing was written
            return stored  # meanwhile: its arrays are the answer
        fresh = np.zeros(n, dtype=bool)
        if ahead is not None and ahead.stored is not None and len(ahead.missing):
            fresh, at = ahead.find(ids)
            if ahead.written:
                fresh &= ~np.isin(ids, np.concatenate(ahead.written))
        if not fresh.any():  # all read now, into arrays of one entry per id
            return store.get_rows(table, ids, width, every_id=True)
        src = at[fresh]
        found, rows = np.zeros(n, dtype=bool), np.zeros((n, width), dtype=np.float32)
        lsn, complete = np.zeros(n, dtype=np.uint64), np.zeros(n, dtype=bool)
        a_found, a_rows, a_lsn, a_complete = ahead.stored
        found[fresh], rows[fresh], lsn[fresh], complete[fresh] = a_found[src], a_rows[src], a_lsn[src], a_complete[src]
        rest = np.flatnonzero(~fresh)
        if len(rest):
            found[rest], rows[rest], lsn[rest], complete[rest] = store.get_rows(table, ids[rest], width, every_id=True)
        return found, rows, lsn, complete

"""RowWriter: what one table writes to RocksDB from its RAM tier, and what RocksDB holds of it by count.

It writes dirty rows (a flush's, an evicted victim's through the store's write-behind thread, rows an arena gives
back to the budget) and a Shrink's chunk (kept rows decayed, dropped rows deleted), each with the table's new
stored counts, then marks the rows clean and stored in the arena and tells the table's reads ahead which ids it
wrote (ps.engine.readahead). Its callers hold the table lock.

stored_counts: what RocksDB holds of the table, {"admitted": ids with a trained row, "pending": ids with only
statistics, "trained": whether any write ever stored one of them (a Shrink that drops them all leaves it true)}.
An arena row's `stored` flag says the same of its id: 0 none, 1 statistics only, 2 a trained row.
"""

from __future__ import annotations

import numpy as np

from ps.engine.readahead import ReadAheads
from ps.rows.layout import ADMITTED
from ps.rows.rowcopy import gather
from ps.storage.arena import Arena
from ps.storage.store import Store


class RowWriter:
    def __init__(self, arena: Arena, store: Store, stats_col: int, reads_ahead: ReadAheads, stored_counts: dict):
        self.arena = arena
        self.store = store
        self.name = arena.name
        self.width = arena.width
        self.stats_col = stats_col
        self.reads_ahead = reads_ahead
        self.stored_counts = stored_counts

    def persist(self, rows: np.ndarray, background: bool = False) -> None:
        """Writes rows (data + lsn) to RocksDB with the new counts, then marks them clean and stored.
        background: by the store's write-behind thread (reads see them at once), in parts of at most
        Store.background_rows, each copied out of the arena as it is handed over (which waits while the pending
        parts leave it no room): of one request's victims (up to half the RAM tier), at most one part waits in
        memory beyond the write-behind's bound."""
        if not background:
            self._persist_part(rows, False)
            return
        step = self.store.background_rows(self.width)
        for lo in range(0, len(rows), step):
            self._persist_part(rows[lo : lo + step], True)

    def _persist_part(self, rows: np.ndarray, background: bool) -> None:
        a = self.arena
        buf = np.empty((len(rows), self.width), dtype=np.float32)
        gather(a.data, rows, self.width, buf)
        complete = buf[:, self.stats_col + ADMITTED] > 0
        after = np.where(complete, 2, 1).astype(np.uint8)
        counts = self._counts_after(a.stored[rows], after)
        ids = a.ids[rows]
        self.store.put_rows(self.name, ids, buf, a.lsn[rows], complete, counts, background=background)
        self.reads_ahead.note_written(ids)
        self.stored_counts = counts
        a.stored[rows] = after
        a.dirty[rows] = 0

    def write_shrink(
        self,
        ids: np.ndarray,
        rows: np.ndarray,
        lsn: np.ndarray,
        complete: np.ndarray,
        in_ram: np.ndarray,
        drop: np.ndarray,
        keep: np.ndarray,
    ) -> None:
        """Writes a shrink chunk: the rows of `keep` (kept, decayed) written, dropped rows deleted, in RocksDB and
        RAM; the rest stay as they are. ids, rows, lsn, complete: the chunk as the scan read it (RAM's rows where
        in RAM); in_ram: each id's arena row, -1 where none; drop, keep: bool masks."""
        a = self.arena
        ram_rows = in_ram[in_ram >= 0]
        before = np.full(len(ids), 0, dtype=np.uint8)
        before[in_ram >= 0] = a.stored[ram_rows]
        before[in_ram < 0] = np.where(complete[in_ram < 0], 2, 1)
        after = np.where(drop, 0, np.where(keep, np.where(complete, 2, 1), before)).astype(np.uint8)
        counts = self._counts_after(before, after)
        self.store.put_rows(self.name, ids[keep], rows[keep], lsn[keep], complete[keep], counts, delete=ids[drop])
        self.reads_ahead.note_written(ids[keep | drop])  # the rest of RocksDB's rows are as a read ahead found them
        self.stored_counts = counts
        kept_ram, dropped_ram = in_ram[keep & (in_ram >= 0)], in_ram[drop & (in_ram >= 0)]
        a.data[kept_ram, : self.width] = rows[keep & (in_ram >= 0)]
        a.stored[kept_ram] = after[keep & (in_ram >= 0)]
        a.dirty[kept_ram] = 0
        if len(dropped_ram):
            a.release(dropped_ram)

    def _counts_after(self, before: np.ndarray, after: np.ndarray) -> dict:
        """Stored counts once rows whose stored flags are `before` are stored as `after` (0/1/2); trained once any
        write stored a row or a pending id, and so after a Shrink that drops them all."""
        c = dict(self.stored_counts)
        c["admitted"] += int(np.count_nonzero(after == 2)) - int(np.count_nonzero(before == 2))
        c["pending"] += int(np.count_nonzero(after == 1)) - int(np.count_nonzero(before == 1))
        c["trained"] = c["trained"] or bool((after > 0).any())
        return c

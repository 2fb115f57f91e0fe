"""StoredRows, Store's base over TableCatalog: a table's rows in RocksDB: read by MultiGet over the reader threads,
written in WriteBatches with the table's counts, now or by the write-behind thread, scanned in key order.

The grammar of a row's key and value is ps.storage.rowformat's. The rows still waiting for their background write
(ps.storage.writebehind) are laid over what RocksDB returns, so a read sees every write at once. The attributes declared
on the class are set by Store.__init__.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ps.rows.layout import KEY_BYTES, STATS_FLOATS, stored_sizes
from ps.sharding import slot_of
from ps.storage.meta import COUNT_PREFIX
from ps.storage.options import iter_items, iter_prefixed, read_in_calls
from ps.storage.rocks import WriteBatch
from ps.storage.rowformat import (
    ROWS_CF,
    as_stored,
    decode_ids,
    encode_keys,
    pack_rows,
    unpacked_rows,
    value_dtype,
)
from ps.storage.shardmeta import ShardMeta
from ps.storage.tablecatalog import TableCatalog
from ps.storage.writebehind import PendingBatch, WriteBehind


class StoredRows(TableCatalog):
    """The rows of every table of one shard, keyed by (table number, slot, id), and their writes in the background."""

    read_threads: int  # a multi_get of many keys is split over this many threads ...
    _readers: ThreadPoolExecutor | None  # ... these (None: one, the caller's)
    _behind: WriteBehind  # the rows written in the background
    meta: ShardMeta  # the shard's own records: lsn_high rises in the batch of the rows that raise it

    def get_rows(self, table: str, ids: np.ndarray, width: int, every_id: bool = False) -> tuple[np.ndarray, ...]:
        """(found bool (n,), rows float32 (found.sum(), width), lsn uint64, complete bool): MultiGet calls over the
        reader threads (read_in_calls), each call's values parsed by numpy on its reader thread as it returns,
        with the rows still waiting in the write-behind laid over them. A row that is not complete (an id not
        admitted yet) holds only its statistics, in its last STATS_FLOATS columns; its other columns are zero. No
        Python code runs per id. DataLossError for a stored value of neither size. every_id: rows, lsn and
        complete have an entry per id, zero (False) where none is stored: the arrays read into, not a copy of the
        found ones."""
        n = len(ids)
        sizes = np.full(n, -1, dtype=np.int64)  # bytes of each stored value; -1: none
        rows = np.zeros((n, width), dtype=np.float32)
        lsn = np.zeros(n, dtype=np.uint64)
        if n == 0:
            return sizes >= 0, rows, lsn, sizes >= 0
        half, bound = self._at_rest_of(table)
        full, short = value_dtype(width, half), value_dtype(STATS_FLOATS)
        allowed = stored_sizes(width, half)

        def parse(values: list, at: int) -> None:
            try:  # every key found and every value a trained row's, as for the misses of rows trained before:
                joined = b"".join(values)  # half the time of the general case below
            except TypeError:  # a None: some key absent
                joined = None
            if joined is not None and (np.fromiter(map(len, values), np.int64, len(values)) == full.itemsize).all():
                parsed = np.frombuffer(joined, dtype=full)
                sizes[at : at + len(values)] = full.itemsize
                rows[at : at + len(values)] = unpacked_rows(parsed)
                lsn[at : at + len(values)] = parsed["lsn"]
                return
            got = np.empty(len(values), dtype=object)
            got[:] = values
            where = np.flatnonzero(np.not_equal(got, None))
            lengths = np.fromiter(map(len, got[where]), dtype=np.int64, count=len(where))
            sizes[at + where] = lengths
            for dtype, floats in ((full, width), (short, STATS_FLOATS)):  # a value of neither size is left
                mine = lengths == dtype.itemsize  # unparsed; get_rows raises for it
                if mine.any():
                    parsed = np.frombuffer(b"".join(got[where[mine]]), dtype=dtype)
                    rows[at + where[mine], width - floats :] = unpacked_rows(parsed)
                    lsn[at + where[mine]] = parsed["lsn"]

        pending = self._behind.snapshot(table)  # before the read: a batch written since is in RocksDB
        with self._dir.rocksdb(f"reading rows of table {table!r}"):
            read_in_calls(self._rows(), encode_keys(self.table_number(table), ids), parse, self._readers,
                          self.read_threads)  # fmt: skip
        found = sizes >= 0
        bad = found & (sizes != allowed.trained) & (sizes != allowed.pending)
        if bad.any():
            size = int(sizes[bad][0])
            raise self._dir.damaged(
                f"table {table} holds a row of {size} bytes, expected {allowed.trained} (a trained row) "
                f"or {allowed.pending} (statistics only): its rows are damaged, or were written by another build's "
                f"row layout{self._layout(table).written_with(size)}"
            )
        complete = sizes == allowed.trained
        for batch in pending:  # oldest first: a later batch of the same id wins, as in RocksDB
            hit, at = batch.find(ids)
            if len(at):
                found[hit], lsn[hit], complete[hit] = True, batch.lsn[at], batch.complete[at]
                rows[hit] = np.where(batch.complete[at, None], batch.rows[at], 0.0)
                if half:  # as RocksDB will hold them once written
                    rows[hit, :half] = as_stored(rows[hit, :half], bound)
                rows[hit, width - STATS_FLOATS :] = batch.rows[at, width - STATS_FLOATS :]
        if every_id or found.all():  # every id stored, as for the misses of rows trained before: no copies
            return found, rows, lsn, complete
        return found, rows[found], lsn[found], complete[found]

    def put_rows(self, table: str, ids: np.ndarray, rows: np.ndarray, lsn: np.ndarray, complete: np.ndarray,
                 counts: dict, delete: np.ndarray | None = None, background: bool = False) -> None:  # fmt: skip
        """Writes rows (n, width) with their lsn for ids, deletes the rows of `delete`, and writes the table's
        counts, in one atomic WriteBatch, after every write still pending. Rows that are not complete are stored
        as their last STATS_FLOATS columns only. background: queued for the write-behind thread instead (the
        arrays must not change afterwards; no delete); get_rows sees the rows at once, RocksDB once drain()
        returns."""
        if background:
            if delete is not None:
                raise ValueError("put_rows(background=True) takes no deletes")
            self._behind.submit(PendingBatch(table, ids, rows, lsn, complete, counts))
            return
        self.drain()
        self._write_rows(table, ids, rows, lsn, complete, counts, delete)

    def drain(self) -> None:
        """Returns once every row written in the background is in RocksDB; a failed background write's
        StorageError otherwise."""
        self._behind.drain()

    @property
    def write_behind_bytes(self) -> int:
        """Bytes of rows waiting for their background write."""
        return self._behind.pending_bytes

    def background_rows(self, width: int) -> int:
        """The most `width`-float rows one put_rows(background=True) should hold: the write-behind's bound on
        pending bytes, in rows (at least one)."""
        return self._behind.rows_per_batch(width)

    def _write_pending(self, batch: PendingBatch) -> None:
        self._write_rows(batch.table, batch.ids, batch.rows, batch.lsn, batch.complete, batch.counts, None)

    def _write_rows(self, table: str, ids: np.ndarray, rows: np.ndarray, lsn: np.ndarray, complete: np.ndarray,
                    counts: dict, delete: np.ndarray | None) -> None:  # fmt: skip
        """One WriteBatch of the rows, in key order, and the deletes, with the table's counts. Evicted and flushed
        rows come in arena order, random in key order; RocksDB inserts a batch's keys into the memtable's skip list
        each from where the one before went in, so sorted keys are cheaper: in benchmarks/miss_path.py (uniform,
        3x10^7 rows, 96,000 evicted rows written per call) the write-behind thread's CPU was 0.7-0.8 us per row
        sorted, 1.1-1.8 unsorted."""
        order = np.lexsort((ids, slot_of(ids)))  # the key's order: table (one here), slot, id; stable
        ids, lsn, complete = ids[order], lsn[order], complete[order]  # rows are read through order: no copy
        values = np.empty(len(ids), dtype=object)
        half, bound = self._at_rest_of(table)
        for mask, part, dtype in ((complete, rows, value_dtype(rows.shape[1], half)),
                                  (~complete, rows[:, rows.shape[1] - STATS_FLOATS :], value_dtype(STATS_FLOATS))):  # fmt: skip
            where = np.flatnonzero(mask)
            if len(where):
                packed = np.empty(len(where), dtype=dtype)
                pack_rows(packed, part[order[where]], bound)
                packed["lsn"] = lsn[where]
                values[where] = packed.view(f"V{packed.dtype.itemsize}").tolist()
        number = self.table_number(table)
        handle = self._dir.db.get_column_family_handle(ROWS_CF)
        batch = WriteBatch(raw_mode=True)
        for key, value in zip(encode_keys(number, ids), values.tolist()):
            batch.put(key, value, handle)
        if delete is not None:
            for key in encode_keys(number, delete):
                batch.delete(key, handle)
        meta = self._dir.meta_handle()
        batch.put(COUNT_PREFIX + table.encode(), json.dumps(counts).encode(), meta)
        with self.meta.lsn_high_raised(batch, lsn), self._dir.rocksdb(f"writing rows of table {table!r}"):
            self._dir.db.write(batch, self._dir.write_opts)

    def scan(self, table: str, width: int, after: bytes | None, limit: int) -> tuple | None:
        """Up to `limit` stored rows after key `after` (None: from the start), in key order:
        (ids, rows, lsn, complete, last key) as get_rows returns them, or None at the end. Bounded memory."""
        self.drain()
        prefix = self.table_number(table).to_bytes(4, "big")
        keys = []
        with self._dir.rocksdb(f"scanning table {table!r}"):
            for key, _ in iter_items(self._rows(), after or prefix):
                if not key.startswith(prefix):
                    break
                if key != after:
                    keys.append(key)
                if len(keys) == limit:
                    break
        if not keys:
            return None
        ids = decode_ids(keys)
        _, rows, lsn, complete = self.get_rows(table, ids, width)
        return ids, rows, lsn, complete, keys[-1]

    def disk_bytes(self, table: str) -> int:
        """Bytes of the table's rows in RocksDB, keys and values, from its counts (before RocksDB's compression and
        its own overhead per key; ps.rows.layout.RowLayout.disk_bytes adds an estimate of that)."""
        layout, c, key = self._layout(table), self.counts(table), KEY_BYTES
        return c["admitted"] * (key + layout.value_bytes) + c["pending"] * (key + layout.pending_value_bytes)

    def iter_rows(self, table: str) -> Iterator[tuple[int, bytes]]:
        """(id, row bytes) of every stored row, in (slot, id) order. For tests and tools, not the hot path."""
        self.drain()
        prefix = self.table_number(table).to_bytes(4, "big")
        with self._dir.rocksdb(f"reading the rows of table {table!r}", "nothing was read"):
            for key, value in iter_prefixed(self._rows(), prefix):
                yield int.from_bytes(key[6:], "big"), value

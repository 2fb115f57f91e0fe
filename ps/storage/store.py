"""Store: one shard's RocksDB (via rocksdict), the system of record: its open and close, its checkpoints, and a
restore's copy of rows from one. Every table's config, number and counts are its base TableCatalog's
(ps.storage.tablecatalog), their rows StoredRows' (ps.storage.storedrows), and the shard's own records in it its
ShardMeta's (Store.meta, ps.storage.shardmeta).

Layout, one RocksDB per server data dir. Keys are bytes.
    column family "meta": each table's config, number and row counts (TableCatalog's), and the shard record, the
    cluster name, the clock, the journal's flushed position and its exactly-once table, the restore marks, the state
    id and the done workers of a job (ShardMeta's), each under its key (ps.storage.meta has their grammar, and reads
    each value by it)
    column family "rows": every table's rows, each under key table:u32be slot:u16be id:u64be, its value the row's
    floats and the lsn of the last push applied to it (ps.storage.rowformat has their grammar)
Every table's rows share the one "rows" column family: RocksDB rewrites and re-reads its OPTIONS file, which lists
every column family, each time one is created, so a column family per table would make each CreateTable slower than
the one before.
Beside RocksDB's files: shard.json, a second copy of the shard record, and the journal's mark
(ps.storage.sidefiles), and the journal/ directory (ps.storage.journal).

Damage: RocksDB opens with paranoid checks and refuses a write-ahead log damaged anywhere but in a torn last
record (what a crash leaves). Damage it meets later (a data block whose checksum fails, a missing file) is a
DataLossError naming the file, never a silent stop: every scan checks its iterator's status at the end. A meta
value that does not read as ps.storage.meta's grammar says is a DataLossError naming the key (meta_value), and in
a checkpoint a CheckpointDamagedError naming it, as is a row of neither size that a restore or an export reads
(import_slots, ps.storage.checkpointread.read_table: OddRows). ps.storage.verifyscan reads every block of every
column family, and every meta value as meta_value does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ps.accel.threadnames import name_os_thread
from ps.errors import CheckpointDamagedError
from ps.rows.layout import RowLayout
from ps.sharding import NUM_SLOTS
from ps.storage.checkpointread import admitted_counts
from ps.storage.datadir import OpenDataDir, checked_entries, open_rocksdb
from ps.storage.foreground import Foreground
from ps.storage.memory import DEFAULT_WRITE_BEHIND_BYTES, DEFAULT_WRITE_BUFFER_BYTES
from ps.storage.meta import (
    COUNT_PREFIX,
    META_CF,
    TABLE_CONFIG_PREFIX,
    TABLE_ID_PREFIX,
    first_unread,
    meta_value,
    table_ids,
    trained,
)
from ps.storage.options import (
    BLOCK_CACHE_BYTES,
    iter_items,
    iter_prefixed,
    rocksdb_options,
)
from ps.storage.readonly import OddRows, checkpoint_damaged, reading_checkpoint
from ps.storage.rocks import Checkpoint, Rdict, WriteBatch
from ps.storage.rowformat import PENDING_BYTES, ROWS_CF, AtRest
from ps.storage.shardmeta import ShardMeta
from ps.storage.sidefiles import remove_temporary_files
from ps.storage.storedrows import StoredRows
from ps.storage.writebehind import WriteBehind


class Store(StoredRows):
    """Rows of every table of one shard, keyed by (slot, id). Writes go through WriteBatches (atomic)."""

    def __init__(self, path: str, block_cache_bytes: int = BLOCK_CACHE_BYTES, sync: bool = False,
                 direct_reads: bool = False, read_threads: int = 1,
                 write_behind_bytes: int = DEFAULT_WRITE_BEHIND_BYTES,
                 write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES, index_in_cache: bool = False,
                 mmap_reads: bool = False, shard: tuple[int, int] | None = None):  # fmt: skip
        """shard: (shard_id, num_shards) this store is opened as, checked against the dir's shard.json before
        RocksDB is opened read-write (meta.check_identity checks the rest). read_threads: a multi_get of many keys
        is split over this many threads (RocksDB reads without Python's lock). write_behind_bytes: the bound of rows
        written in the background (put_rows(background=)). direct_reads, write_buffer_bytes, index_in_cache,
        mmap_reads: see rocksdb_options. sync: whether writes are synced (--sync; the ones a restart must find
        whatever it says always are). A dir this user may not write is a PermissionError (RocksDB's refusal to open
        it), which ps.engine.opening.start_error says as such."""
        entries = checked_entries(path)
        self.path = path
        self.created = "CURRENT" not in entries  # a new data dir: no RocksDB was there
        self._opts = rocksdb_options(block_cache_bytes, direct_reads, write_buffer_bytes, index_in_cache, mmap_reads)
        self._dir = OpenDataDir(open_rocksdb(path, self._opts, entries, shard), path, sync)  # shared with self.meta
        remove_temporary_files(path)  # a killed server's, now that this one holds the dir's LOCK
        self._numbers_lock = threading.RLock()  # _table_numbers', create_table's and _at_rest_of's (see _numbers)
        self._cfs: dict[str, Rdict] = {}
        self._at_rest: dict[str, AtRest] = {}  # {table: how its rows are at rest}, read from its config once
        self.read_threads = max(1, read_threads)
        self._readers = (
            ThreadPoolExecutor(self.read_threads, "ps-rocksdb-read", name_os_thread) if self.read_threads > 1 else None
        )
        self.foreground = Foreground()  # the shard's requests in progress: background writes wait for a pause
        self._behind = WriteBehind(self._write_pending, write_behind_bytes, self.foreground)
        self.meta = ShardMeta(self._dir, self.drain)  # the shard's records that are no table's (the tables' keys of
        # the meta column family are this store's)

    def memory_usage(self) -> dict[str, int]:
        """RocksDB's memory now: {"block_cache", "memtables", "table_readers"} bytes (its own estimates; index and
        filter blocks count in the block cache when cached there, else in table_readers)."""
        cfs = [self._dir.db, self._dir.meta_cf, *self._cfs.values()]

        def total(name: str, where: list) -> int:
            return sum(int(cf.property_int_value(name) or 0) for cf in where)

        with self._dir.rocksdb("reading RocksDB's memory use"):
            return {
                "block_cache": int(self._dir.db.property_int_value("rocksdb.block-cache-usage") or 0),
                "memtables": total("rocksdb.cur-size-all-mem-tables", cfs),
                "table_readers": total("rocksdb.estimate-table-readers-mem", cfs),
            }

    # ---- checkpoints --------------------------------------------------------------------------------
    def checkpoint(self, path: str) -> None:
        """A RocksDB checkpoint of everything written so far at path (hard links to the SST files, or copies of
        them on another file system). RocksDB removes what it wrote of a checkpoint that fails. A full disk is a
        DiskFullError: of this data dir while its memtables are flushed first, of path's while the checkpoint
        is written. DataLossError, before anything is written, while a table's number does not read or is missing:
        the checkpoint would copy the damage, and a restore of it would be refused."""
        first_unread(self._table_numbers()[1], self._dir.damaged, "; a checkpoint would copy it: nothing was saved")
        with self._dir.rocksdb(f"flushing its memtables for checkpoint {path}", "nothing was saved"):
            self.drain()
            self._dir.db.flush()
        with self._dir.rocksdb(f"writing checkpoint {path}", "nothing was saved", target=path):
            Checkpoint(self._dir.db).create_checkpoint(path)

    def import_slots(
        self,
        source: str,
        slots: tuple[int, int],
        tables: list[str],
        layouts: dict[str, RowLayout] | None = None,
        on_written: Callable[[int], None] | None = None,
        trained_from: bool = False,
    ) -> dict[str, dict]:
        """Copies the rows of slots [lo, hi) of each table from the RocksDB at `source` (a checkpoint, opened
        read-only) into this store, with their lsn reset to 0 (this store's journal starts anew). Returns
        {table: {"admitted": rows, "pending": ids}} copied. CheckpointDamagedError where RocksDB finds damage in
        source, or where source does not hold what the grammar and the manifest say: no table number for one of
        `tables` (before anything is copied from it), a meta value that does not read, a row of neither a pending
        id's size nor a trained row's of its table's layout (layouts: table -> its RowLayout, sizes_at_rest: named once
        the table's slots are read, nothing copied past the first). Values are copied as they are: the tables are
        created with the checkpoint's configs, values_at_rest included. What was copied stays: the caller
        undoes it. on_written: told the admitted rows of each batch written (it may raise to stop the copy there).
        trained_from: source owned some of these slots, so a table its counts say was trained (a Shrink may have
        dropped every id since) is trained here too."""
        lo, hi = slots
        copied = {}
        damaged = checkpoint_damaged(source)
        with reading_checkpoint(source) as (src, names, _):
            numbers = table_ids(src.get_column_family(META_CF), damaged) if META_CF in names else {}  # the checkpoint's
            missing = [t for t in tables if t not in numbers]
            if missing:
                raise damaged(f"its meta holds no table number for table(s) {', '.join(map(repr, missing[:10]))} of "
                              "its manifest (meta key tid/<table>): their rows cannot be found")  # fmt: skip
            meta = src.get_column_family(META_CF) if META_CF in names else None
            for table in tables:
                counts = {"admitted": 0, "pending": 0}
                key = COUNT_PREFIX + table.encode()
                raw = meta.get(key) if meta is not None and trained_from else None
                was_trained = raw is not None and trained(meta_value(key, raw, damaged))
                if ROWS_CF in names and table in numbers:
                    cf = src.get_column_family(ROWS_CF)
                    handle = self._dir.db.get_column_family_handle(ROWS_CF)
                    src_prefix, prefix = numbers[table].to_bytes(4, "big"), self.table_number(table).to_bytes(4, "big")
                    batch, admitted = WriteBatch(raw_mode=True), counts["admitted"]
                    odd = OddRows(layouts[table] if layouts and table in layouts else None)
                    for key, value in iter_items(cf, src_prefix + int(lo).to_bytes(2, "big")):
                        if not key.startswith(src_prefix) or int.from_bytes(key[4:6], "big") >= hi:
                            break
                        if odd.saw(key, value) or odd.count:  # past the first: only counted
                            continue
                        counts["admitted" if len(value) > PENDING_BYTES else "pending"] += 1
                        batch.put(prefix + key[4:], value[:-8] + bytes(8), handle)  # lsn := 0
                        if len(batch) >= 65536:
                            self._write_counted(batch, on_written, counts["admitted"] - admitted)
                            batch, admitted = WriteBatch(raw_mode=True), counts["admitted"]
                    odd.check(damaged, table, "" if (lo, hi) == (0, NUM_SLOTS) else f" in slots {lo}..{hi - 1}")
                    self._write_counted(batch, on_written, counts["admitted"] - admitted)
                old = self.counts(table)
                total = {k: old[k] + counts[k] for k in counts}
                total["trained"] = old["trained"] or was_trained or trained(total)
                with self._dir.rocksdb(f"writing the restored row counts of table {table!r}", "the restore stopped"):
                    self._dir.meta_cf.put(
                        COUNT_PREFIX + table.encode(), json.dumps(total).encode(), self._dir.write_opts
                    )
                copied[table] = counts
        return copied

    def _write_counted(self, batch: WriteBatch, on_written: Callable[[int], None] | None, admitted: int) -> None:
        with self._dir.rocksdb("writing restored rows", "the restore stopped"):
            self._dir.db.write(batch, self._dir.write_opts)
        if on_written is not None:
            on_written(admitted)

    def saved_counts(self, path: str) -> dict[str, int]:
        """admitted_counts of the checkpoint of this store just written at path (checkpoint), read back. Its files
        are this dir's (hard links to its SST files, or copies of them): damage met there is the dir's, a
        DataLossError naming it."""
        try:
            return admitted_counts(path)
        except CheckpointDamagedError as e:
            raise self._dir.damaged(f"its checkpoint just written to {path}, a copy of its files, does not read back: "
                                f"{e.what}") from None  # fmt: skip

    def forget_unfinished_restore(self) -> None:
        """Deletes, in one synced write, what a restore writes (every row, the tables' configs, numbers and counts,
        the clock, the note of a finished restore) and the mark of the unfinished one. RocksDB deletes the keys;
        no file is touched, and the shard record, the cluster name and the journal's flushed_seq stay."""
        with self._dir.rocksdb("deleting an unfinished restore's rows", "nothing was deleted"):
            meta = self._dir.meta_handle()
            batch = WriteBatch(raw_mode=True)
            try:
                rows = self._dir.db.get_column_family_handle(ROWS_CF)
            except Exception:  # no table was created: no rows
                rows = None
            if rows is not None:
                batch.delete_range(b"", b"\xff" * 16, rows)  # every row key (14 bytes)
            for prefix in (TABLE_CONFIG_PREFIX, TABLE_ID_PREFIX, COUNT_PREFIX):
                for key, _ in iter_prefixed(self._dir.meta_cf, prefix):
                    batch.delete(key, meta)
            self.meta.delete_restored(batch)
            self._dir.db.write(batch, self._dir.synced)
        with self._numbers_lock:  # after a read of the numbers from before the write has kept them
            self._numbers = None
        self._at_rest.clear()

    def flush(self) -> None:
        """Writes every column family's memtable to SST files (the rows written in the background first)."""
        self.drain()
        with self._dir.rocksdb("flushing its memtables", "what was written stays in its write-ahead log"):
            self._dir.db.flush()
            self._dir.meta_cf.flush()
            for cf in self._cfs.values():
                cf.flush()

    def close(self) -> None:
        """Writes the rows pending in the background (a failed write leaves them to the journal's replay), stops
        the threads and closes RocksDB (its failure a StorageError or DiskFullError, the store closed all the
        same)."""
        self._behind.close()
        if self._readers is not None:
            self._readers.shutdown()
        if self._dir.db is not None:
            try:  # a restore that failed: its mark, not the journal, recovers it
                pending = self.meta.restore_pending()
            except Exception:  # RocksDB failing already: the close says how
                pending = None
            outcome = (f"the restore from {pending} did not finish: a start with the same --restore starts it over"
                       if pending else "the rows it did not write are in the journal, replayed at the next start")  # fmt: skip
            self._cfs.clear()  # a column family held open keeps RocksDB's LOCK past the close
            self._dir.close(outcome)

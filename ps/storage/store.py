"""Store: one shard's RocksDB (via rocksdict), the system of record: its open and close, and every table's config,
number, counts and rows; the shard's own records in it are its ShardMeta's (Store.meta, ps.storage.shardmeta).

Layout, one RocksDB per server data dir. Keys are bytes.
    column family "meta": each table's config, number and row counts (the Store's), and the shard record, the
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

import bisect
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from rocksdict import Checkpoint, Rdict, WriteBatch

from ps.accel.threadnames import name_os_thread
from ps.config import TableConfig
from ps.errors import (
    CheckpointDamagedError,
    StorageError,
    TableNumbersExhaustedError,
)
from ps.rows.layout import KEY_BYTES, STATS_FLOATS, RowLayout, layout_of, stored_sizes
from ps.sharding import NUM_SLOTS, slot_of
from ps.storage.checkpointread import admitted_counts
from ps.storage.datadir import (
    OpenDataDir,
    checked_entries,
    open_rocksdb,
)
from ps.storage.foreground import Foreground
from ps.storage.memory import (
    DEFAULT_WRITE_BEHIND_BYTES,
    DEFAULT_WRITE_BUFFER_BYTES,
)
from ps.storage.meta import (
    COUNT_PREFIX,
    MAX_TABLE_NUMBER,
    META_CF,
    TABLE_CONFIG_PREFIX,
    TABLE_ID_PREFIX,
    first_unread,
    key_name,
    meta_value,
    missing_number,
    read_table_numbers,
    table_ids,
    trained,
)
from ps.storage.options import (
    BLOCK_CACHE_BYTES,
    iter_items,
    iter_prefixed,
    read_in_calls,
    rocksdb_options,
)
from ps.storage.readonly import (
    OddRows,
    checkpoint_damaged,
    reading_checkpoint,
)
from ps.storage.rowformat import (
    PENDING_BYTES,
    ROWS_CF,
    AtRest,
    as_stored,
    decode_ids,
    encode_keys,
    pack_rows,
    unpacked_rows,
    value_dtype,
)
from ps.storage.shardmeta import ShardMeta
from ps.storage.sidefiles import remove_temporary_files
from ps.storage.writebehind import PendingBatch, WriteBehind

# what Store.rows_of_no_table's rows are where every table's number reads: said by verify, a start and number_for
LOST_TABLE_ROWS = ("the rows of a table whose meta keys table/<name> and tid/<name> were lost. No request reads them "
                   "and no new table takes their numbers")  # fmt: skip


class Store:
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
        self._numbers_lock = threading.RLock()  # _table_numbers' and create_table's (see _numbers)
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

    # ---- table configs, numbers and counts ------------------------------------------------------------
    def load_tables(self) -> list[TableConfig]:
        """Every table's stored config; DataLossError for one that does not read as a config."""
        out = []
        with self._dir.rocksdb("reading the table configs"):
            for key, raw in iter_prefixed(self._dir.meta_cf, TABLE_CONFIG_PREFIX):
                out.append(meta_value(key, raw, self._dir.damaged))
        return out

    def create_table(self, cfg: TableConfig) -> None:
        """Records the table's config and its number (the prefix of its row keys) in one write; for a new name, the
        same write deletes a stray count/ value of it (counts: it counts no row of this table). The cost does not
        grow with the number of tables: the first table creates the shared "rows" column family, the others none."""
        with self._numbers_lock:  # a read of the numbers from meta comes before this write and its note, or after
            new = cfg.name not in self._table_numbers()[0]
            number = self.number_for(cfg.name)
            with self._dir.rocksdb(f"creating table {cfg.name!r}", "the table was not created"):
                self._rows(create=True)
                meta = self._dir.meta_handle()
                batch = WriteBatch(raw_mode=True)
                batch.put(TABLE_CONFIG_PREFIX + cfg.name.encode(), json.dumps(cfg.to_dict()).encode(), meta)
                batch.put(TABLE_ID_PREFIX + cfg.name.encode(), str(number).encode(), meta)
                if new:
                    batch.delete(COUNT_PREFIX + cfg.name.encode(), meta)
                self._dir.db.write(batch, self._dir.write_opts)
            self._table_numbers()[0][cfg.name] = number
            self._at_rest.pop(cfg.name, None)  # a replaced table's config is another's

    def number_for(self, table: str) -> int:
        """The number create_table records for table: its own, or for a new table the one after the highest in use,
        by a table or by stored rows (rows_of_no_table: the rows of a table whose meta keys were lost keep their
        number, so that no new table shares them). DataLossError, naming the key, while a table's number does not
        read or is missing: it may be any number, so that a new table given one could share its rows, and that table
        made again under a new one would lose them. TableNumbersExhaustedError for a new table where the highest
        number in use is MAX_TABLE_NUMBER."""
        numbers, unread = self._table_numbers()
        if table in numbers:
            return numbers[table]
        if table in unread:
            raise self._dir.damaged(f"{unread[table]}; the table is not created again under another number (its rows "
                                "are under the one it held)")  # fmt: skip
        first_unread(unread, self._dir.damaged, "; no new table is given a number while a table's is not known (the new "
                     "table could get it, and share that table's rows)")  # fmt: skip
        highest = max(numbers, key=numbers.__getitem__, default=None)
        top = -1 if highest is None else numbers[highest]
        orphans = self.rows_of_no_table()
        if orphans and orphans[-1] > top:
            top, holder = orphans[-1], (f"stored rows of no table ({LOST_TABLE_ROWS}; `ps-server verify "
                                        f"{self.path}` counts them) are under {orphans[-1]:,}")  # fmt: skip
        else:
            holder = f"table {highest!r} holds {top:,} (meta key tid/{highest})"
        if top == MAX_TABLE_NUMBER:  # (a "tid/" value above it does not read: meta_value)
            raise TableNumbersExhaustedError(
                f"no table number is left for new table {table!r}: a new table takes the number after the highest, "
                f"and {holder}, the largest a row key's table field takes. A shard numbers its tables from 0, one "
                "per new table, so that value was most likely damaged or written by hand; a checkpoint restored into "
                "a new data dir numbers its tables from 0. Nothing was created"
            )
        return top + 1

    def rows_of_no_table(self) -> list[int]:
        """The table numbers, ascending, that stored rows are under and no table's number (a "tid/" value that
        reads) is: the rows of a table whose meta keys were lost (LOST_TABLE_ROWS), or of a table whose number does
        not read or is missing (numbers_unread; nothing else leaves rows without their table). One seek to the first
        number in no table's hands, and one past each number in use found there: a single seek where the tables hold
        0..n-1 and no such rows are stored. A key shorter than a table number (damage) counts as if padded with zero
        bytes."""
        try:
            rows = self._rows()
        except StorageError:  # no table was ever created
            return []
        held = sorted(set(self._table_numbers()[0].values()))
        out, number = [], 0
        with self._dir.rocksdb("looking for stored rows of no table", "nothing was read"):
            it = rows.iter()
            while True:
                at = bisect.bisect_left(held, number)
                while at < len(held) and held[at] == number:  # the first number from here that no table holds
                    number, at = number + 1, at + 1
                if number > MAX_TABLE_NUMBER:
                    break
                it.seek(number.to_bytes(4, "big"))
                if not it.valid():
                    break
                number = int.from_bytes(it.key()[:4].ljust(4, b"\0"), "big")
                at = bisect.bisect_left(held, number)
                if at == len(held) or held[at] != number:
                    out.append(number)
                number += 1
            it.status()
        return out

    # {table: number} of the tables whose number reads, {table: what is damaged} of those whose number does not
    # read or whose config is stored without one: read from meta on first use (_table_numbers), under
    # _numbers_lock, which create_table holds from its read of them to its note of the new number: a read that
    # raced a create would keep numbers that lack its table
    _numbers: tuple[dict[str, int], dict[str, str]] | None = None

    def _table_numbers(self) -> tuple[dict[str, int], dict[str, str]]:
        read = self._numbers
        if read is not None:  # every row read asks: no lock once read
            return read
        with self._numbers_lock:
            if self._numbers is None:
                with self._dir.rocksdb("reading the table numbers"):
                    numbers, unread = read_table_numbers(self._dir.meta_cf)
                    for key, _ in iter_prefixed(self._dir.meta_cf, TABLE_CONFIG_PREFIX):
                        name = key_name(key)
                        if name not in numbers and name not in unread:
                            unread[name] = missing_number(name)
                self._numbers = numbers, unread
            return self._numbers

    def numbers_unread(self) -> dict[str, str]:
        """{table: what is damaged} of each table whose number does not read or whose config is stored without one
        (its rows, under a number no readable "tid/" value holds, are among rows_of_no_table's)."""
        return dict(self._table_numbers()[1])

    def table_number(self, table: str) -> int:
        """The table's number; DataLossError naming the key where it does not read or is missing (the other tables'
        numbers serve all the same)."""
        numbers, unread = self._table_numbers()
        if table not in numbers:
            raise self._dir.damaged(unread.get(table, missing_number(table)))
        return numbers[table]

    def counts(self, table: str) -> dict:
        """{"admitted": rows, "pending": ids, "trained": bool} stored for table (kept in meta, updated atomically
        with rows). A name no table has (no config, no number) has no rows: a count/ value of it is stray (damage,
        or another program's write; create_table deletes it) and counts none, but one that does not read is
        refused as damage all the same (DataLossError), as a table's is."""
        counts = self._dir.meta_get(COUNT_PREFIX + table.encode(), f"reading the row counts of table {table!r}",
                                {"admitted": 0, "pending": 0})  # fmt: skip
        numbers, unread = self._table_numbers()
        if table not in numbers and table not in unread:
            counts = {"admitted": 0, "pending": 0}
        return {**counts, "trained": trained(counts)}

    def _rows(self, create: bool = False) -> Rdict:
        """The "rows" column family (the first create_table creates it)."""
        cf = self._cfs.get(ROWS_CF)
        if cf is None:
            try:
                cf = self._dir.db.get_column_family(ROWS_CF)
            except Exception:
                if not create:
                    raise StorageError(f"{self.path}: column family {ROWS_CF} is missing") from None
                cf = self._dir.db.create_column_family(ROWS_CF, self._opts)
            self._cfs[ROWS_CF] = cf
        return cf

    def _config(self, table: str) -> TableConfig:
        cfg = self._dir.meta_get(TABLE_CONFIG_PREFIX + table.encode(), f"reading the config of table {table!r}")
        if cfg is None:
            raise self._dir.damaged(f"table {table!r} has no config (meta key table/{table})")
        return cfg

    def _layout(self, table: str) -> RowLayout:
        cfg = self._config(table)
        return layout_of(cfg.dim, cfg.optimizer.name, cfg.values_at_rest)

    def _at_rest_of(self, table: str) -> AtRest:
        """How the table's trained rows are at rest: their leading floats stored as float16, and its weight_bound."""
        at_rest = self._at_rest.get(table)
        if at_rest is None:
            cfg = self._config(table)
            half = layout_of(cfg.dim, cfg.optimizer.name, cfg.values_at_rest).half_floats
            at_rest = self._at_rest[table] = AtRest(half, cfg.weight_bound)
        return at_rest

    # ---- rows -----------------------------------------------------------------------------------------
    def get_rows(self, table: str, ids: np.ndarray, width: int) -> tuple[np.ndarray, ...]:
        """(found bool (n,), rows float32 (found.sum(), width), lsn uint64, complete bool): MultiGet calls over the
        reader threads (read_in_calls), each call's values parsed by numpy on its reader thread as it returns,
        with the rows still waiting in the write-behind laid over them. A row that is not complete (an id not
        admitted yet) holds only its statistics, in its last STATS_FLOATS columns; its other columns are zero. No
        Python code runs per id. DataLossError for a stored value of neither size."""
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
        if found.all():  # every id stored, as for the misses of rows trained before: no copies
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

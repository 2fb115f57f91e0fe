"""Store: one shard's RocksDB (via rocksdict, the only module that imports it). The system of record.

Layout, one RocksDB per server data dir:
    column family "meta":     b"shard"          -> JSON {"shard_id", "num_shards", "num_slots"}
                              b"table/" + name  -> JSON TableConfig.to_dict()
                              b"count/" + name  -> JSON {"admitted": rows, "pending": ids stored for table}
                              b"clock"          -> ASCII decimal: the shard's clock (steps)
                              b"flushed_seq"    -> ASCII decimal: journal records <= this are all in RocksDB
    column family "t." + name:  key   = slot:u16be id:u64be             (10 bytes; a slot is one key range)
                                value = row:f32le[width] lsn:u64le      (admitted; see ps.rows.layout)
                                      | stats:f32le[4] lsn:u64le        (not admitted yet)
Big-endian keys make byte order numeric order, so a slot's rows are one contiguous range to scan or move.
"""

from __future__ import annotations

import json
import os

import numpy as np
from rocksdict import AccessType, BlockBasedOptions, Cache, Checkpoint, Options, Rdict, WriteBatch, WriteOptions

from ps.config import TableConfig
from ps.errors import StorageError
from ps.rows.layout import STATS_FLOATS
from ps.sharding import NUM_SLOTS, slot_of

KEY_DTYPE = np.dtype([("slot", ">u2"), ("id", ">u8")])  # packed, 10 bytes
META_CF = "meta"
TABLE_CF_PREFIX = "t."


def encode_keys(ids: np.ndarray) -> list[bytes]:
    """RocksDB keys (slot:u16be id:u64be) of ids. `.view("V10")`, not "S10": S strips trailing NUL bytes."""
    keys = np.empty(len(ids), dtype=KEY_DTYPE)
    keys["slot"] = slot_of(ids)
    keys["id"] = ids
    return keys.view("V10").tolist()


def _open_read_only(source: str) -> tuple[Rdict, list[str]]:
    """A RocksDB (a checkpoint) opened read-only with all its column families, and their names."""
    opts = Options(raw_mode=True)
    names = Rdict.list_cf(source, opts)
    return Rdict(source, opts, column_families=dict.fromkeys(names, opts), access_type=AccessType.read_only()), names


def _decode_chunk(keys: list[bytes], values: list[bytes], width: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.frombuffer(b"".join(keys), dtype=KEY_DTYPE)["id"].astype(np.uint64)
    packed = np.frombuffer(b"".join(values), dtype=_value_dtype(width))
    return ids, np.ascontiguousarray(packed["row"])


def _value_dtype(width: int) -> np.dtype:
    return np.dtype([("row", "<f4", (width,)), ("lsn", "<u8")])


BLOCK_CACHE_BYTES = 128 << 20  # RocksDB's block cache per shard (uncompressed data blocks)


def rocksdb_options(block_cache_bytes: int = BLOCK_CACHE_BYTES, direct_reads: bool = False) -> Options:
    """The options a Store opens RocksDB with, for every column family; anything that reads a shard's files and
    should behave as the server does (benchmarks/cold_pull.py's multi_get reference) opens them with these.
    direct_reads: read SST files with O_DIRECT, past the OS page cache (RocksDB's block cache still applies), so
    that a read the block cache misses goes to the disk; for benchmarks and hosts that keep little page cache.
    The data dir's file system must accept O_DIRECT; where it does not, RocksDB's reads of its files fail."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_max_total_wal_size(256 << 20)  # flush the column families that pin old WAL files past this
    opts.set_write_buffer_size(16 << 20)  # memtables: RocksDB's share of RSS stays small beside the RAM tier
    opts.set_max_write_buffer_number(2)
    table = BlockBasedOptions()
    table.set_block_cache(Cache(block_cache_bytes))
    table.set_bloom_filter(8, False)  # ~2% false positives; at 10^8 keys 100 MB of filters instead of 125
    table.set_format_version(5)  # the newer, more accurate Bloom filter and delta-encoded index values
    table.set_index_block_restart_interval(16)  # prefix-compressed index blocks: table readers 17 -> 12 MB
    # at 10^7 rows (estimate-table-readers-mem)
    # index and filter blocks stay in table-reader memory (~2 bytes per key), outside the block cache, so a read
    # the block cache misses costs one data block, not an index or filter block first
    opts.set_block_based_table_factory(table)
    if direct_reads:
        opts.set_use_direct_reads(True)
    return opts


class Store:
    """Rows of every table of one shard, keyed by (slot, id). Writes go through WriteBatches (atomic)."""

    def __init__(self, path: str, block_cache_bytes: int = BLOCK_CACHE_BYTES, sync: bool = False,
                 direct_reads: bool = False):  # fmt: skip
        if os.path.exists(path) and not os.path.isdir(path):
            raise StorageError(f"data dir {path} is a file, not a directory")
        os.makedirs(path, exist_ok=True)
        entries = sorted(set(os.listdir(path)) - {"journal"})
        if entries and "CURRENT" not in entries:
            raise StorageError(
                f"data dir {path} is not empty and holds no sparseps data (it has {', '.join(entries[:5])}"
                f"{', ...' if len(entries) > 5 else ''}); give a new or empty directory, or this shard's own"
            )
        self.path = path
        self._opts = rocksdb_options(block_cache_bytes, direct_reads)
        try:  # rocksdict raises plain Exception
            existing = Rdict.list_cf(path, self._opts) if "CURRENT" in entries else []
            # Pass each column family's options explicitly: otherwise a reopen takes them from the OPTIONS file.
            cfs = dict.fromkeys(set(existing) | {META_CF}, self._opts)
            self._db = Rdict(path, self._opts, column_families=cfs)
        except Exception as e:
            raise StorageError(f"cannot open RocksDB at {path}: {e}") from e
        self._meta = self._db.get_column_family(META_CF)
        self._write_opts = WriteOptions()
        self._write_opts.sync = sync
        self._cfs: dict[str, Rdict] = {}

    # ---- shard identity and table configs -------------------------------------------------------------
    def check_identity(self, shard_id: int, num_shards: int) -> None:
        """Records (shard_id, num_shards) on first use; StorageError if the data dir belongs to another shard."""
        want = {"shard_id": shard_id, "num_shards": num_shards, "num_slots": NUM_SLOTS}
        raw = self._meta.get(b"shard")
        if raw is None:
            self._meta.put(b"shard", json.dumps(want).encode(), self._write_opts)
            return
        have = json.loads(raw)
        if have != want:
            raise StorageError(
                f"data dir {self.path} belongs to shard {have['shard_id']} of {have['num_shards']} "
                f"(num_slots {have['num_slots']}), but this server was started as shard {shard_id} of {num_shards}"
            )

    def load_tables(self) -> list[TableConfig]:
        out = []
        for key, raw in self._meta.items(from_key=b"table/"):
            if not key.startswith(b"table/"):
                break
            try:
                out.append(TableConfig.from_dict(json.loads(raw)))
            except (ValueError, KeyError, TypeError) as e:
                raise StorageError(f"{self.path}: table config {key!r} is unreadable: {e}") from e
        return out

    def create_table(self, cfg: TableConfig) -> None:
        self._cf(cfg.name, create=True)
        self._meta.put(b"table/" + cfg.name.encode(), json.dumps(cfg.to_dict()).encode(), self._write_opts)

    def _cf(self, table: str, create: bool = False) -> Rdict:
        cf = self._cfs.get(table)
        if cf is None:
            name = TABLE_CF_PREFIX + table
            try:
                cf = self._db.get_column_family(name)
            except Exception:
                if not create:
                    raise StorageError(f"{self.path}: column family {name} is missing") from None
                cf = self._db.create_column_family(name, self._opts)
            self._cfs[table] = cf
        return cf

    # ---- rows -----------------------------------------------------------------------------------------
    def get_rows(self, table: str, ids: np.ndarray, width: int) -> tuple[np.ndarray, ...]:
        """(found bool (n,), rows float32 (found.sum(), width), lsn uint64, complete bool), one multi_get.
        A row that is not complete (an id not admitted yet) holds only its statistics, in its last
        STATS_FLOATS columns; its other columns are zero."""
        full, short = _value_dtype(width), _value_dtype(STATS_FLOATS)
        if len(ids) == 0:
            z = np.zeros(0, dtype=bool)
            return z, np.zeros((0, width), dtype=np.float32), np.zeros(0, dtype=np.uint64), z
        values = self._cf(table).get(encode_keys(ids))
        present = [v for v in values if v is not None]
        found = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
        sizes = np.fromiter(map(len, present), dtype=np.int64, count=len(present))
        complete = sizes == full.itemsize
        bad = ~complete & (sizes != short.itemsize)
        if bad.any():
            raise StorageError(
                f"{self.path}: table {table} holds a row of {int(sizes[bad][0])} bytes, expected "
                f"{full.itemsize} (a trained row) or {short.itemsize} (statistics only)"
            )
        rows = np.zeros((len(present), width), dtype=np.float32)
        lsn = np.empty(len(present), dtype=np.uint64)
        for mask, dtype in ((complete, full), (~complete, short)):
            if mask.any():
                parsed = np.frombuffer(b"".join(v for v, m in zip(present, mask) if m), dtype=dtype)
                rows[mask, width - dtype["row"].shape[0] :] = parsed["row"]
                lsn[mask] = parsed["lsn"]
        return found, rows, lsn, complete

    def put_rows(self, table: str, ids: np.ndarray, rows: np.ndarray, lsn: np.ndarray, complete: np.ndarray,
                 counts: dict, delete: np.ndarray | None = None) -> None:  # fmt: skip
        """Writes rows (n, width) with their lsn for ids, deletes the rows of `delete`, and writes the table's
        counts, in one atomic WriteBatch. Rows that are not complete are stored as their last STATS_FLOATS
        columns only."""
        values = [None] * len(ids)
        for mask, part in ((complete, rows), (~complete, rows[:, rows.shape[1] - STATS_FLOATS :])):
            where = np.flatnonzero(mask)
            if len(where):
                packed = np.empty(len(where), dtype=_value_dtype(part.shape[1]))
                packed["row"] = part[where]
                packed["lsn"] = lsn[where]
                for i, v in zip(where.tolist(), packed.view(f"V{packed.dtype.itemsize}").tolist()):
                    values[i] = v
        handle = self._db.get_column_family_handle(TABLE_CF_PREFIX + table)
        batch = WriteBatch(raw_mode=True)
        for key, value in zip(encode_keys(ids), values):
            batch.put(key, value, handle)
        if delete is not None:
            for key in encode_keys(delete):
                batch.delete(key, handle)
        batch.put(b"count/" + table.encode(), json.dumps(counts).encode(), self._db.get_column_family_handle(META_CF))
        self._db.write(batch, self._write_opts)

    def scan(self, table: str, width: int, after: bytes | None, limit: int):
        """Up to `limit` stored rows after key `after` (None: from the start), in key order:
        (ids, rows, lsn, complete, last key) as get_rows returns them, or None at the end. Bounded memory."""
        it = self._cf(table).iter()
        if after is None:
            it.seek_to_first()
        else:
            it.seek(after)
            if it.valid() and it.key() == after:
                it.next()
        keys = []
        while it.valid() and len(keys) < limit:
            keys.append(it.key())
            it.next()
        del it
        if not keys:
            return None
        ids = np.array([int.from_bytes(k[2:], "big") for k in keys], dtype=np.uint64)
        _, rows, lsn, complete = self.get_rows(table, ids, width)
        return ids, rows, lsn, complete, keys[-1]

    # ---- checkpoints --------------------------------------------------------------------------------
    def checkpoint(self, path: str) -> None:
        """A RocksDB checkpoint of everything written so far at path (hard links to the SST files)."""
        self._db.flush()
        Checkpoint(self._db).create_checkpoint(path)

    def import_slots(self, source: str, slots: tuple[int, int], tables: list[str]) -> dict[str, dict]:
        """Copies the rows of slots [lo, hi) of each table from the RocksDB at `source` (a checkpoint, opened
        read-only) into this store, with their lsn reset to 0 (this store's journal starts anew). Returns
        {table: {"admitted": rows, "pending": ids}} copied."""
        src, names = _open_read_only(source)
        lo, hi = slots
        copied = {}
        try:
            for table in tables:
                counts = {"admitted": 0, "pending": 0}
                if TABLE_CF_PREFIX + table in names:
                    cf = src.get_column_family(TABLE_CF_PREFIX + table)
                    handle = self._db.get_column_family_handle(TABLE_CF_PREFIX + table)
                    batch = WriteBatch(raw_mode=True)
                    for key, value in cf.items(from_key=int(lo).to_bytes(2, "big")):
                        if int.from_bytes(key[:2], "big") >= hi:
                            break
                        counts["admitted" if len(value) > 4 * STATS_FLOATS + 8 else "pending"] += 1
                        batch.put(key, value[:-8] + bytes(8), handle)  # lsn := 0
                        if len(batch) >= 65536:
                            self._db.write(batch, self._write_opts)
                            batch = WriteBatch(raw_mode=True)
                    self._db.write(batch, self._write_opts)
                old = self.counts(table)
                self._meta.put(b"count/" + table.encode(), json.dumps(
                    {k: old[k] + counts[k] for k in counts}).encode(), self._write_opts)  # fmt: skip
                copied[table] = counts
        finally:
            src.close()
        return copied

    @staticmethod
    def read_table(source: str, table: str, width: int, chunk: int = 1 << 16):
        """Yields (ids, rows (n, width) float32) of the admitted rows of a table of the RocksDB at `source` (a
        checkpoint, opened read-only), in key order, chunk rows at a time; ids not admitted are skipped."""
        src, names = _open_read_only(source)
        try:
            if TABLE_CF_PREFIX + table not in names:
                return
            keys, values, size = [], [], 4 * width + 8
            for key, value in src.get_column_family(TABLE_CF_PREFIX + table).items():
                if len(value) == size:
                    keys.append(key)
                    values.append(value)
                if len(keys) == chunk:
                    yield _decode_chunk(keys, values, width)
                    keys, values = [], []
            if keys:
                yield _decode_chunk(keys, values, width)
        finally:
            src.close()

    def restore_pending(self) -> str | None:
        """The checkpoint a restore into this store started from and did not finish (None: none)."""
        raw = self._meta.get(b"restore_pending")
        return raw.decode() if raw is not None else None

    def set_restore_pending(self, directory: str | None) -> None:
        if directory is None:
            self._meta.delete(b"restore_pending", self._write_opts)
        else:
            self._meta.put(b"restore_pending", directory.encode(), self._write_opts)

    def flushed_seq(self) -> int:
        raw = self._meta.get(b"flushed_seq")
        return int(raw) if raw is not None else 0

    def set_flushed_seq(self, seq: int, applied: dict[int, tuple[int, int]] | None = None) -> None:
        """Records that every journal record <= seq is in RocksDB, and (if given) the journal's `applied` table
        of client requests as of seq, in one write (durably, if the store syncs)."""
        batch = WriteBatch(raw_mode=True)
        meta = self._db.get_column_family_handle(META_CF)
        batch.put(b"flushed_seq", str(seq).encode(), meta)
        if applied is not None:
            batch.put(b"applied", json.dumps({str(c): list(v) for c, v in applied.items()}).encode(), meta)
        self._db.write(batch, self._write_opts)
        if self._write_opts.sync:
            self._db.flush_wal(True)

    def applied(self) -> dict[int, tuple[int, int]]:
        """The journal's `applied` table stored by the last set_flushed_seq ({} if none)."""
        raw = self._meta.get(b"applied")
        return {int(c): (int(v[0]), int(v[1])) for c, v in json.loads(raw).items()} if raw is not None else {}

    def counts(self, table: str) -> dict:
        """{"admitted": rows, "pending": ids} stored for table (kept in meta, updated atomically with rows)."""
        raw = self._meta.get(b"count/" + table.encode())
        return json.loads(raw) if raw is not None else {"admitted": 0, "pending": 0}

    def clock(self) -> int:
        raw = self._meta.get(b"clock")
        return int(raw) if raw is not None else 0

    def set_clock(self, step: int) -> None:
        self._meta.put(b"clock", str(step).encode(), self._write_opts)

    def disk_bytes(self, table: str) -> int:
        """SST bytes of the table's column family (RocksDB's estimate; memtables not included)."""
        return int(self._cf(table).property_int_value("rocksdb.total-sst-files-size") or 0)

    def iter_rows(self, table: str):
        """(id, row bytes) of every stored row, in (slot, id) order. For tests and tools, not the hot path."""
        for key, value in self._cf(table).items():
            yield int.from_bytes(key[2:], "big"), value

    def flush(self) -> None:
        """Writes every column family's memtable to SST files."""
        self._db.flush()
        self._meta.flush()
        for cf in self._cfs.values():
            cf.flush()

    def close(self) -> None:
        if self._db is not None:
            self._cfs.clear()
            self._meta = None
            self._db.close()
            self._db = None

"""verify_rocksdb: the read of a whole RocksDB, changing nothing, that `ps-server verify` (ps.storage.verify) reports
on: every block of every column family with its checksum verified, every meta value read as ps.storage.meta's
grammar says, and the size of every stored row counted per table (RowSizes).

A verify reads every row, for minutes on a large data dir: it logs a line every ps.progress.LOG_EVERY_S seconds
meanwhile, with the rows read of about those the "rows" column family holds (RocksDB's estimate), their bytes, the
rate and the time left (ScanProgress), and a closing line with what it read and how long it took.
"""

from __future__ import annotations

import logging

import numpy as np

from ps.bytesize import human_bytes
from ps.errors import StorageError
from ps.progress import LoggedCount, pace
from ps.rows.layout import KEY_BYTES
from ps.storage.meta import (
    META_CF,
    META_GRAMMAR,
    TABLE_CONFIG_PREFIX,
    TABLE_ID_PREFIX,
    damaged_name,
    grammar_key,
    key_name,
    meta_value,
)
from ps.storage.options import iter_items, rocksdb_options, scan_read_options
from ps.storage.readonly import open_failure, opened_read_only
from ps.storage.rocks import ColumnFamily
from ps.storage.rowformat import KEY_DTYPE, ROWS_CF

VERIFY_CHUNK_ROWS = 1 << 16  # "rows" values whose sizes verify_rocksdb counts with numpy at once
ESTIMATED_KEYS = "rocksdb.estimate-num-keys"  # a column family's property: about how many keys it holds

log = logging.getLogger(__name__)


class ScanProgress:
    """The rows (and their bytes: keys and values) a verify has read of one RocksDB's "rows" column family, of
    `expected` (RocksDB's estimate; 0: unknown), logged every ps.progress.LOG_EVERY_S seconds."""

    def __init__(self, path: str, expected: int = 0):
        self.path, self.expected = path, expected
        self.bytes = 0
        self.rows = LoggedCount(log, self._line)

    def read(self, rows: int, nbytes: int) -> None:
        """Notes rows read, nbytes in all; logs "verifying D: 1,200,000 of about 3,000,000 rows read (40%, 96.0
        MiB), 400,000 rows/s, about 5 s left" every ps.progress.LOG_EVERY_S seconds (a total the read passed, or
        none known, shows the count so far as the total, with no time left)."""
        self.bytes += nbytes
        self.rows.add(rows)

    def _line(self, rows: int, took_s: float) -> str:
        rows_read = pace(rows, self.expected, took_s, "rows read", aside=f", {human_bytes(self.bytes)}")
        return f"verifying {self.path}: {rows_read}"

    def finished(self, other_keys: int, damaged: list[str]) -> None:
        """Logs the closing line: "verified D's RocksDB: 3,000,000 rows (240.0 MiB) and 9 other keys read in 7.5 s,
        every block's checksum verified" (or "; damage stopped the read of column family rows")."""
        took = self.rows.took_s()
        end = f"; damage stopped the read of column family {', '.join(damaged)}" if damaged else (
            ", every block's checksum verified")  # fmt: skip
        log.info("verified %s's RocksDB: %s rows (%s) and %s other keys read in %.1f s%s", self.path,
                 f"{self.rows.done:,}", human_bytes(self.bytes), f"{other_keys:,}", took, end)  # fmt: skip


class RowSizes:
    """What verify_rocksdb finds of the "rows" column family's keys and values: `sizes`, {(table number, value
    bytes): [rows, the first one's key]}, and `odd_keys`, [keys of another size than KEY_BYTES, the first one]. The
    scan's Python loop only keeps each key and its value's size; numpy counts them a chunk at a time."""

    def __init__(self, progress: ScanProgress | None = None) -> None:
        """progress: told of each chunk counted."""
        self.progress = progress
        self.count = 0  # keys read
        self.sizes: dict[tuple[int, int], list] = {}
        self.odd_keys: list = [0, b""]

    def read(self, cf: ColumnFamily) -> None:
        """Reads every key of cf with scan_read_options (RocksDB's error where the scan meets damage, what was read
        before it counted)."""
        keys: list[bytes] = []
        sizes: list[int] = []
        try:
            for key, value in iter_items(cf, None, scan_read_options()):
                keys.append(key)
                sizes.append(len(value))
                if len(keys) == VERIFY_CHUNK_ROWS:
                    self._count(keys, sizes)
                    keys, sizes = [], []
        finally:
            self._count(keys, sizes)

    def _count(self, keys: list[bytes], sizes: list[int]) -> None:
        self.count += len(keys)
        lengths = np.fromiter(map(len, keys), np.int64, len(keys))
        if self.progress is not None:
            self.progress.read(len(keys), int(lengths.sum()) + sum(sizes))
        odd = lengths != KEY_BYTES
        if odd.any():
            first = self.odd_keys[1] if self.odd_keys[0] else keys[int(np.argmax(odd))]
            self.odd_keys = [self.odd_keys[0] + int(odd.sum()), first]
            keys = [key for key, bad in zip(keys, odd.tolist()) if not bad]
            sizes = [size for size, bad in zip(sizes, odd.tolist()) if not bad]
        if not keys:
            return
        tables = np.frombuffer(b"".join(keys), dtype=KEY_DTYPE)["table"].astype(np.uint64)
        found = (tables << np.uint64(32)) | np.minimum(np.array(sizes, dtype=np.uint64), np.uint64(0xFFFFFFFF))
        codes, first, rows = np.unique(found, return_index=True, return_counts=True)
        for code, at, n in zip(codes.tolist(), first.tolist(), rows.tolist()):
            self.sizes.setdefault((code >> 32, code & 0xFFFFFFFF), [0, keys[at]])[0] += n


def verify_rocksdb(path: str) -> tuple[dict[str, tuple[int, str]], dict | None]:
    """Reads every key of every column family of the RocksDB at path, opened read-only with a Store's options,
    verifying every block's checksum and caching none, and every meta value read as its grammar says
    (meta_value, as a Store reads it). Returns ({column family: (keys read, the damage that stopped the read or
    "")}, {"shard": the shard record or None, "flushed_seq": int, "lsn_high": int (ShardMeta.written_seq), "tables":
    {name: its stored config}, "numbers": {name: its stored number}, "rows": the RowSizes of the "rows" column
    family (as far as it was read), "restore_pending": the checkpoint of a restore that did not finish, or None,
    "unreadable": {key: what is wrong, for each value that does not read (meta_value's text); a table's config or
    number is None then, another value as if absent}}); if RocksDB does not open, ({"": (0, why)}, None). Nothing
    is written."""
    progress = ScanProgress(path)
    meta = {"shard": None, "flushed_seq": 0, "lsn_high": 0, "tables": {}, "numbers": {}, "rows": RowSizes(progress),
            "restore_pending": None, "unreadable": {}}  # fmt: skip
    read_opts = scan_read_options()
    found = {}
    opened = False
    try:
        with opened_read_only(path, rocksdb_options(8 << 20)) as (db, names, view):
            opened = True
            for name in names:
                count, damage = 0, ""
                try:
                    if name == ROWS_CF:
                        rows = db.get_column_family(name)
                        progress.expected = _estimated_keys(rows)
                        meta["rows"].read(rows)
                    else:
                        for key, value in iter_items(db.get_column_family(name), None, read_opts):
                            count += 1
                            if name == META_CF:
                                _keep_meta(meta, key, value)
                except Exception as e:
                    damage = str(e).replace(view, path)
                found[name] = (meta["rows"].count if name == ROWS_CF else count, damage)
    except Exception as e:
        if opened:
            raise
        return {"": (0, f"RocksDB does not open: {open_failure(path, e)}")}, None
    other = sum(count for name, (count, _) in found.items() if name != ROWS_CF)
    progress.finished(other, [name for name, (_, damage) in found.items() if damage])
    return found, meta


def _estimated_keys(cf: ColumnFamily) -> int:
    """About how many keys cf holds (RocksDB's estimate; 0 where it gives none: the progress then shows no total)."""
    try:
        return int(cf.property_int_value(ESTIMATED_KEYS) or 0)
    except Exception:  # rocksdict raises plain Exception; a figure for the log is not worth a failed verify
        return 0


def _keep_meta(meta: dict, key: bytes, value: bytes) -> None:
    """What verify_rocksdb returns of a key of the meta column family."""
    if grammar_key(key) not in META_GRAMMAR:
        return
    try:
        value = meta_value(key, value, StorageError)
    except StorageError as e:
        meta["unreadable"][key] = str(e)
        value = None
    if key in (b"shard", b"flushed_seq", b"lsn_high", b"restore_pending"):
        if value is not None:
            meta[key.decode()] = value
    elif damaged_name(key):  # no table's: unreadable names it
        return
    elif key.startswith(TABLE_CONFIG_PREFIX):
        meta["tables"][key_name(key)] = value
    elif key.startswith(TABLE_ID_PREFIX):
        meta["numbers"][key_name(key)] = value

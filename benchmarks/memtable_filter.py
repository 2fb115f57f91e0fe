"""Reads of rows that are not in the memtable, with and without the memtable's Bloom filter, in the same run.

    python benchmarks/memtable_filter.py [--rows 1000000] [--memtable-rows 60000] [--ids 100000] [--reps 10]

Two RocksDB dirs (in a temporary directory) are filled alike: --rows keys of a table (ps.storage.rowformat.encode_keys,
ids 0, 2, 4, ...) with values of the size of a dim-16 Adagrad row, flushed and compacted into SST files; then
--memtable-rows other keys (odd ids) written and left in the memtable, as a server's write-behind leaves the rows
it wrote last. One dir is opened with ps.storage.options.rocksdb_options as a server opens it (a Bloom filter of each
memtable's keys), the other with the same options but that filter off (memtable_prefix_bloom_size_ratio 0). Each
request reads --ids random keys of the SST files with ps.storage.options.multi_get (the server's read: MultiGet
calls of at most 1,024 keys, one thread); the same keys go to both, in alternation (harness.alternate), so a
change in this shared machine's speed hits both alike. The figure is microseconds per key, median over --reps
requests; both dirs' files are read once first, so both read from the OS page cache.
Target: the filter makes a read no slower (filtered us per key <= unfiltered). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import harness  # before numpy: see its docstring
import numpy as np
from rocksdict import Rdict, WriteBatch

from ps.rows.layout import RowLayout
from ps.storage.options import multi_get, rocksdb_options
from ps.storage.rowformat import encode_keys

TABLE_NUMBER = 1
WRITE_BUFFER_BYTES = 64 << 20  # large enough that --memtable-rows stay in the memtable


def options(memtable_filter: bool):
    opts = rocksdb_options(write_buffer_bytes=WRITE_BUFFER_BYTES)
    if not memtable_filter:
        opts.set_memtable_prefix_bloom_ratio(0.0)
    return opts


def write(db: Rdict, ids: np.ndarray, value: bytes) -> None:
    for at in range(0, len(ids), 100_000):
        batch = WriteBatch(raw_mode=True)
        for key in encode_keys(TABLE_NUMBER, ids[at : at + 100_000]):
            batch.put(key, value)
        db.write(batch)


def fill(path: str, memtable_filter: bool, args: argparse.Namespace, value: bytes) -> Rdict:
    db = Rdict(path, options(memtable_filter))
    write(db, np.arange(args.rows, dtype=np.uint64) * 2, value)
    db.flush()
    db.compact_range(None, None)
    write(db, np.random.default_rng(2).choice(args.rows, args.memtable_rows, replace=False).astype(np.uint64) * 2 + 1,
          value)  # fmt: skip
    harness.read_into_page_cache(path)
    return db


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="keys in the SST files")
    p.add_argument("--memtable-rows", type=int, default=60_000, help="other keys left in the memtable")
    p.add_argument("--ids", type=int, default=100_000, help="keys read per request")
    p.add_argument("--reps", type=int, default=10, help="timed requests on each side")
    args = p.parse_args()
    value = os.urandom(RowLayout(16, 16).value_bytes)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="memtable-filter-") as tmp:
        dbs = {on: fill(os.path.join(tmp, f"filter-{on}"), on, args, value) for on in (True, False)}
        entries = {on: int(db.property_int_value("rocksdb.num-entries-active-mem-table")) for on, db in dbs.items()}
        files = {on: int(db.property_int_value("rocksdb.num-files-at-level0") or 0) for on, db in dbs.items()}
        keys: list = []

        def prepare() -> None:
            keys[:] = encode_keys(TABLE_NUMBER, np.sort(rng.choice(args.rows, args.ids, replace=False)) * 2)

        def read(on: bool):
            return lambda _: multi_get(dbs[on], keys)

        legs = [harness.Leg("filter", read(True), prepare), harness.Leg("no filter", read(False))]
        harness.alternate(legs, args.reps)
        us = {leg.name: 1e6 * statistics.median(leg.seconds) / args.ids for leg in legs}
        for db in dbs.values():
            db.close()
    print(f"{args.rows:,} keys in SST files, {entries[True]:,} other keys in the memtable (both dirs: {entries}), "
          f"level-0 files {files}; {args.ids:,} keys per request, {len(legs[0].seconds)} requests each")  # fmt: skip
    print(f"{'memtable':<12} {'us per key':>10}")
    for name, v in us.items():
        print(f"{name:<12} {v:>10.2f}")
    ratio = us["filter"] / us["no filter"]
    met = ratio <= 1.0
    print(f"target: with the filter no slower than without: {ratio:.2f}x, {'met' if met else 'MISSED'}")
    harness.emit({"rows": args.rows, "memtable_rows": entries[True], "ids": args.ids, "us_per_key": us,
                  "ratio": ratio, "met": met})  # fmt: skip


if __name__ == "__main__":
    main()

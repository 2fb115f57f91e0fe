"""Point reads of a table far larger than RocksDB's block cache, from the OS page cache: the server's read against
variants of the SST format and of how files are read, the same keys in the same run.

    python benchmarks/block_reads.py [--rows 10000000] [--ids 100000] [--reps 30] [--threads 2]
                                     [--memory-bytes 512M] [--variants pread,2K blocks,hash index,mmap]

Each variant is its own RocksDB dir (in a temporary directory) holding --rows keys of a table
(ps.storage.rowformat.encode_keys, ids 0..rows-1) with random values of a dim-16 Adagrad row's size, written in key
order (slot, id) to SST files of 500,000 rows and ingested (one sorted run in the last level, as a long-running
server's rows mostly are). Files are written and read with ps.storage.options.rocksdb_options as a server given
--memory-bytes opens its data dir (its block cache size from ps.storage.memory.plan_memory, index partitioned into
the block cache), except where the variant says:
    pread        the server's options: each block a read call into a buffer, inserted into the block cache
    2K blocks    data blocks of 2 KB instead of 4 KB (smaller reads and searches, twice the index)
    1K blocks    data blocks of 1 KB
    hash index   a hash index in each data block beside its binary-search restart points
    mmap         the server's options with mmap reads (ps-server --mmap-reads): blocks read from memory maps
    plain table  RocksDB's PlainTable format instead of blocks (mmap reads, a hash index of each file's (table,
                 slot) prefixes in memory), written by puts and one full compaction (SstFileWriter's PlainTable
                 files are refused at ingestion: "does not match existing comparator")
Every dir's files are read once first, so every variant reads from the page cache. Each request reads --ids
random keys (unique, sorted) with ps.storage.options.multi_get on --threads threads (the server's read: MultiGet
calls of at most 1,024 keys); the same keys go to every variant in turn (harness.alternate), so a change in this
shared machine's speed hits all alike. The figure is microseconds per key, median over --reps requests, and each
variant's ratio to pread. The process's RssFile after the reads shows what mmap reads leave resident (file pages).
No target: it informs the server's options. The last line is one JSON object.

PlainTable is not the server's format, whatever it reads at: it reads fast only through memory maps (its pages in
the server's RSS, outside --memory-bytes), keeps no checksums (it has no blocks), and a scan that seeks to a key
outside its prefix extractor's domain, as a scan of one table's rows does (4 bytes, not 6), ends early without an
error (rocksdict 0.3.29 refuses total-order seeks outright): the run counts what such a scan of the plain table
finds ("table scan"), against --rows.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import harness  # before numpy: see its docstring
import numpy as np
from rocksdict import DataBlockIndexType, Options, PlainTableFactoryOptions, Rdict, SliceTransform, WriteBatch

from ps.cli_server_flags import parse_bytes
from ps.rows.layout import layout_of
from ps.storage.memory import plan_memory
from ps.storage.options import iter_prefixed, multi_get, rocksdb_options, table_options
from ps.storage.rowformat import KEY_DTYPE, encode_keys, value_dtype

TABLE_NUMBER = 1
FILE_ROWS = 500_000
VARIANTS = ("pread", "2K blocks", "1K blocks", "hash index", "mmap", "plain table")
SLOT_PREFIX_BYTES = 6  # a key's table (u32) and slot (u16): ps.storage.rowformat.KEY_DTYPE


def options(variant: str, block_cache_bytes: int) -> Options:
    """The server's options under --memory-bytes, changed as the variant says (see the module)."""
    opts = rocksdb_options(block_cache_bytes, index_in_cache=True, mmap_reads=variant in ("mmap", "plain table"))
    if variant == "plain table":
        plain = PlainTableFactoryOptions()
        plain.user_key_length = KEY_DTYPE.itemsize
        plain.bloom_bits_per_key = 0  # its filter is of prefixes, and nearly every file holds every slot
        plain.hash_table_ratio = 0.75
        plain.index_sparseness = 16
        opts.set_prefix_extractor(SliceTransform.create_fixed_prefix(SLOT_PREFIX_BYTES))
        opts.set_plain_table_factory(plain)
    if variant in ("2K blocks", "1K blocks", "hash index"):
        table = table_options(block_cache_bytes, index_in_cache=True)
        if variant == "hash index":
            table.set_data_block_index_type(DataBlockIndexType.binary_and_hash())
        else:
            table.set_block_size(1024 * int(variant[0]))
        opts.set_block_based_table_factory(table)
    return opts


def build(path: str, opts: Options, rows: int, values: list[bytes], by_puts: bool) -> float:
    """Writes and ingests the table (see the module), or with by_puts writes it in batches of FILE_ROWS and
    compacts it into one sorted run; returns the seconds it took."""
    t0 = time.perf_counter()
    os.makedirs(path)
    db = Rdict(os.path.join(path, "db"), opts)
    ids = np.arange(rows, dtype=np.uint64)
    try:
        if by_puts:
            for lo in range(0, rows, FILE_ROWS):
                batch = WriteBatch(raw_mode=True)
                for key, value in zip(encode_keys(TABLE_NUMBER, ids[lo : lo + FILE_ROWS]), values, strict=False):
                    batch.put(key, value)
                db.write(batch)
            db.flush()
            db.compact_range(None, None)
        else:
            harness.ingest_in_key_order(db, opts, TABLE_NUMBER, ids, lambda k, part: values[: len(part)], path,
                                        FILE_ROWS)  # fmt: skip
    finally:
        db.close()
    return time.perf_counter() - t0


def data_blocks(db: Rdict) -> int:
    """The data blocks of db's SST files (its table properties)."""
    return int(re.search(r"# data blocks=(\d+)", db.property_value("rocksdb.aggregated-table-properties")).group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000, help="keys of the table")
    p.add_argument("--ids", type=int, default=100_000, help="keys read per request")
    p.add_argument("--reps", type=int, default=30, help="timed requests of each variant")
    p.add_argument("--threads", type=int, default=2, help="reader threads (the server's --read-threads)")
    p.add_argument("--memory-bytes", type=parse_bytes, default="512M", help="the server's --memory-bytes")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    args = p.parse_args()
    variants = [v.strip() for v in args.variants.split(",")]
    if unknown := set(variants) - set(VARIANTS):
        p.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if "pread" not in variants:
        variants.insert(0, "pread")
    cache = plan_memory(args.memory_bytes, None).block_cache_bytes
    rng = np.random.default_rng(1)
    value_bytes = value_dtype(layout_of(16, "adagrad").width).itemsize  # the store's value grammar: row, lsn
    values = [bytes(v) for v in rng.integers(0, 256, (FILE_ROWS, value_bytes), dtype=np.uint8)]
    pool = ThreadPoolExecutor(args.threads) if args.threads > 1 else None
    with tempfile.TemporaryDirectory(prefix="block-reads-") as tmp:
        dbs, disk, blocks = {}, {}, {}
        scanned = None  # rows a scan of the plain table from its table's prefix finds
        for variant in variants:
            opts = options(variant, cache)
            path = os.path.join(tmp, variant.replace(" ", "-"))
            took = build(path, opts, args.rows, values, variant == "plain table")
            dbs[variant] = Rdict(os.path.join(path, "db"), opts)
            blocks[variant] = data_blocks(dbs[variant])
            if variant == "plain table":
                scanned = sum(1 for _ in iter_prefixed(dbs[variant], TABLE_NUMBER.to_bytes(4, "big")))
                print(f"plain table: table scan (a seek to the table's 4-byte prefix) found {scanned:,} of "
                      f"{args.rows:,} rows", flush=True)  # fmt: skip
            disk[variant], _ = harness.read_into_page_cache(path)
            size = disk[variant] / 2**30
            print(f"{variant}: {args.rows:,} rows written in {took:.0f} s, {size:.2f} GiB", flush=True)
        keys: list = []

        def prepare() -> None:
            keys[:] = encode_keys(
                TABLE_NUMBER, np.sort(rng.choice(args.rows, args.ids, replace=False)).astype(np.uint64)
            )

        def read(variant: str):
            def call(_) -> None:
                if any(v is None for v in multi_get(dbs[variant], keys, pool, args.threads)):
                    raise RuntimeError(f"{variant}: a key of the table was not found")

            return call

        legs = [harness.Leg(v, read(v), prepare if i == 0 else (lambda: None)) for i, v in enumerate(variants)]
        harness.alternate(legs, args.reps, warmup=3)
        us = {leg.name: 1e6 * statistics.median(leg.seconds) / args.ids for leg in legs}
        low = {leg.name: 1e6 * min(leg.seconds) / args.ids for leg in legs}
        high = {leg.name: 1e6 * max(leg.seconds) / args.ids for leg in legs}
        file_rss = harness.file_rss_bytes(os.getpid())  # before the maps are closed with their dbs
        for db in dbs.values():
            db.close()
    if pool is not None:
        pool.shutdown()
    print(f"{args.rows:,} rows, block cache {cache >> 20} MiB (--memory-bytes {args.memory_bytes >> 20} MiB), "
          f"{args.ids:,} random keys per request on {args.threads} thread(s), "
          f"{len(legs[0].seconds)} requests each")  # fmt: skip
    print(f"{'variant':<12} {'us per key':>10} {'min-max':>13} {'vs pread':>9} {'GiB':>6} {'data blocks':>11}")
    for v in variants:
        print(f"{v:<12} {us[v]:>10.2f} {low[v]:>6.2f}-{high[v]:<6.2f} {us[v] / us['pread']:>8.2f}x "
              f"{disk[v] / 2**30:>6.2f} {blocks[v]:>11,}")  # fmt: skip
    print(f"RssFile after the reads: {file_rss / 2**20:,.0f} MiB")
    harness.emit({"rows": args.rows, "ids": args.ids, "threads": args.threads, "block_cache_bytes": cache,
                  "plain_table_scan_rows": scanned, "requests": len(legs[0].seconds), "us_per_key": us, "ratio_to_pread": {v: us[v] / us["pread"] for v
                  in variants}, "disk_bytes": disk, "data_blocks": blocks, "file_rss_bytes": file_rss})  # fmt: skip


if __name__ == "__main__":
    main()

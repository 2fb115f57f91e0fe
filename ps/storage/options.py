"""The RocksDB options a Store opens its data dir with, and how it reads: MultiGet calls over reader threads
(read_in_calls, multi_get) and scans that raise on damage (iter_items, iter_prefixed). Anything that reads a
shard's files and should behave as the server does (benchmarks, verify) opens and reads them with these.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from ps.storage.memory import (
    DEFAULT_BLOCK_CACHE_BYTES,
    DEFAULT_WRITE_BUFFER_BYTES,
    INFO_LOG_BYTES,
    KEEP_INFO_LOGS,
    MAX_WAL_BYTES,
)
from ps.storage.rocks import (
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    DBRecoveryMode,
    Options,
    Rdict,
    ReadOptions,
)

BLOCK_CACHE_BYTES = DEFAULT_BLOCK_CACHE_BYTES  # RocksDB's block cache per shard (uncompressed data blocks)
MAX_WRITE_BUFFERS = 2  # memtables per column family (ps.storage.memory counts them)
METADATA_BLOCK_BYTES = 4096  # index partitions of a bounded server's tables
MIN_KEYS_PER_READER = 2048  # a multi_get is split over reader threads only in parts of at least this many keys
MAX_KEYS_PER_GET = 1024  # keys of one RocksDB MultiGet call (see multi_get)
BLOOM_BITS = 8  # per key of every file's filter: ~2% false positives; at 10^8 keys 100 MB of filters, not 125
BLOOM_BITS_UPPER_LEVELS = 16  # ... where only the levels above the last keep filters (table_options): well under 1%
MEMTABLE_BLOOM_RATIO = 0.02  # of a memtable's bytes, for the Bloom filter of its keys


def table_options(block_cache_bytes: int = BLOCK_CACHE_BYTES, index_in_cache: bool = False,
                  bloom_bits: int | None = None) -> BlockBasedOptions:  # fmt: skip
    """The block-based table options of rocksdb_options (its arguments of the same names): the SST files' format
    and how their blocks are cached. bloom_bits: bits per key of each file's Bloom filter (0: no filter); by
    default BLOOM_BITS_UPPER_LEVELS with index_in_cache, else BLOOM_BITS."""
    table = BlockBasedOptions()
    table.set_block_cache(Cache(block_cache_bytes))
    if bloom_bits is None:
        bloom_bits = BLOOM_BITS_UPPER_LEVELS if index_in_cache else BLOOM_BITS
    if bloom_bits:
        table.set_bloom_filter(bloom_bits, False)
    table.set_format_version(5)  # the newer, more accurate Bloom filter and delta-encoded index values
    table.set_index_block_restart_interval(16)  # prefix-compressed index blocks: table readers 17 -> 12 MB
    # at 10^7 rows (estimate-table-readers-mem)
    # By default index and filter blocks stay in table-reader memory (~2 bytes per key), outside the block cache,
    # so a read the block cache misses costs one data block, not an index or filter block first.
    if index_in_cache:
        # In the block cache they compete with data blocks. A file's whole index block (hundreds of KB for a file
        # of 500,000 rows) evicted and read again for one key made random reads of a table 20x the cache copy 3x
        # more metadata than data: the index is partitioned into 4 KB blocks under a pinned top level, so a read
        # the cache misses costs at most one small index block besides its data block. The last level, where
        # nearly every row is, keeps no filter (optimize_filters_for_hits): filters of a table far larger than
        # the cache would be evicted before their next use, and a shard's reads are mostly of rows that exist.
        # The levels above keep whole filters, a few MB at 3x10^7 rows: partitioned, each of the (often 10 or
        # more) files a read probes first cost a top-level search too, and raw multi_get after a run of writes
        # took 15-18 us per key instead of 8-10. Those filters hold about a tenth of the keys, so they get twice
        # the bits (BLOOM_BITS_UPPER_LEVELS): a read probes every one of them (16 filters per key in a tree
        # with 15 files in level 0), and at 8 bits per key their false positives added 0.28 data block reads to
        # every 1.0 a read needs.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        table.set_index_type(BlockBasedIndexType.two_level_index_search())
        table.set_metadata_block_size(METADATA_BLOCK_BYTES)
        table.set_pin_top_level_index_and_filter(True)
    return table


def rocksdb_options(
    block_cache_bytes: int = BLOCK_CACHE_BYTES,
    direct_reads: bool = False,
    write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES,
    index_in_cache: bool = False,
    mmap_reads: bool = False,
) -> Options:
    """The options a Store opens RocksDB with, for every column family; anything that reads a shard's files and
    should behave as the server does (benchmarks/cold_pull.py's multi_get reference) opens them with these.
    direct_reads: read SST files with O_DIRECT, past the OS page cache (RocksDB's block cache still applies), so
    that a read the block cache misses goes to the disk; for benchmarks and hosts that keep little page cache.
    The data dir's file system must accept O_DIRECT; where it does not, RocksDB's reads of its files fail.
    index_in_cache: index and filter blocks are cached in the block cache (level 0's pinned), inside its bound,
    instead of in table-reader memory outside it (ps.storage.memory: a server given --memory-bytes).
    mmap_reads: read SST files through memory maps, without a read call and a copy per block: a point read of a
    file in the page cache takes about 0.6x the time (benchmarks/block_reads.py), but the pages read count in the
    process's RSS, and a file damaged or cut short under the running process raises SIGBUS instead of an error.
    ValueError with direct_reads, which it excludes."""
    if direct_reads and mmap_reads:
        raise ValueError("direct reads and mmap reads exclude each other")
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_max_total_wal_size(MAX_WAL_BYTES)  # flush the column families that pin old WAL files past this
    opts.set_write_buffer_size(write_buffer_bytes)  # memtables: RocksDB's share of RSS stays small beside the RAM
    opts.set_max_write_buffer_number(MAX_WRITE_BUFFERS)  # tier
    # Every read searches the memtables first, and nearly every key a read asks for is not in them: a Bloom filter
    # of each memtable's keys (about 30 bits per row, from the memtable's own memory) answers that without the
    # skip-list search, which cost about a third of a read with 60,000 rows in the memtable (benchmarks/
    # memtable_filter.py: 11.9 -> 8.3 us per key, one thread).
    opts.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
    opts.set_memtable_whole_key_filtering(True)
    # Rows are float32 values that hardly compress (about 1% with Snappy) while every read of a compressed block
    # pays its decompression: off, a point read from the page cache costs about half as much.
    opts.set_compression_type(DBCompressionType.none())
    opts.set_block_based_table_factory(table_options(block_cache_bytes, index_in_cache))
    if index_in_cache:
        opts.set_optimize_filters_for_hits(True)  # see table_options
    opts.set_keep_log_file_num(KEEP_INFO_LOGS)  # each open, a start's read-only check too, starts a new LOG
    opts.set_max_log_file_size(INFO_LOG_BYTES)  # and a long run's flushes and compactions fill one up to this
    opts.set_paranoid_checks(True)  # RocksDB refuses to open on the damage it can see (file sizes, the MANIFEST)
    # a torn last record in the write-ahead log is what a crash leaves; damage before it is refused, not dropped
    # with everything after it (the default, point-in-time recovery)
    opts.set_wal_recovery_mode(DBRecoveryMode.tolerate_corrupted_tail_records())
    if direct_reads:
        opts.set_use_direct_reads(True)
    if mmap_reads:
        opts.set_allow_mmap_reads(True)
    return opts


def multi_get(cf: Rdict, keys: list[bytes], readers: ThreadPoolExecutor | None = None, threads: int = 1) -> list:
    """The values of keys in cf (None where absent), in order: how a Store reads rows (read_in_calls), for anything
    that should read as it does (benchmarks/miss_path.py's reference)."""
    out: list = [None] * len(keys)

    def keep(values: list, at: int) -> None:
        out[at : at + len(values)] = values

    read_in_calls(cf, keys, keep, readers, threads)
    return out


def read_in_calls(cf: Rdict, keys: list[bytes], consume: Callable[[list, int], None],
                  readers: ThreadPoolExecutor | None = None, threads: int = 1) -> None:  # fmt: skip
    """Reads keys with RocksDB MultiGet calls of at most MAX_KEYS_PER_GET keys, handing each call's values (None
    where absent) and the index of its first key to consume, on the thread that read them. With readers, the keys
    are split over `threads` of its threads in parts of at least MIN_KEYS_PER_READER keys (RocksDB reads without
    the GIL), so consume must be safe to call for different parts at once. A MultiGet holds the data block of every
    key it found until it returns (past the block cache's capacity if need be): one call of 100,000 keys in
    distinct 4 KB blocks held 400 MB at once, and evicted every index block from the cache."""

    def read_part(lo: int, hi: int) -> None:
        for at in range(lo, hi, MAX_KEYS_PER_GET):
            consume(cf.get(keys[at : min(at + MAX_KEYS_PER_GET, hi)]), at)

    parts = min(threads, len(keys) // MIN_KEYS_PER_READER) if readers is not None else 1
    if parts <= 1:
        read_part(0, len(keys))
        return
    bounds = [len(keys) * i // parts for i in range(parts + 1)]
    for done in [readers.submit(read_part, lo, hi) for lo, hi in itertools.pairwise(bounds)]:
        done.result()


def iter_items(
    cf: Rdict, start: bytes | None = None, read_opts: ReadOptions | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of a column family in key order, from start (None: the first key). Raises RocksDB's error
    if the scan meets damage, where rocksdict's items() would end early without a word."""
    it = cf.iter(read_opts)
    if start is None:
        it.seek_to_first()
    else:
        it.seek(start)
    while it.valid():
        yield it.key(), it.value()
        it.next()
    it.status()


def iter_prefixed(cf: Rdict, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of every key of a column family that starts with prefix, in key order (iter_items)."""
    for key, value in iter_items(cf, prefix):
        if not key.startswith(prefix):
            return
        yield key, value


def scan_read_options() -> ReadOptions:
    """The ReadOptions of a scan that verifies every block's checksum and caches none (`ps-server verify`)."""
    read_opts = ReadOptions()
    read_opts.set_verify_checksums(True)
    read_opts.fill_cache(False)
    return read_opts

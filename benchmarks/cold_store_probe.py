"""A probe for the miss path (issue 19): can a cold store of fixed-size row slots, read with one pread per missed
row, read a row faster than RocksDB's point read, on this host? Nothing in ps/ uses such a store.

    python benchmarks/cold_store_probe.py [--rows 1000000] [--seconds 3] [--threads-list 1,2]
                                          [--distributions zipf,uniform] [--dir DIR]
    full size: --rows 3e7 --seconds 20 --write-requests 10 (a 5.7 GiB paged file, 3x10^7 / (25 x 0.8) pages of
    4 KB, and RocksDB's files beside it: both must fit in the page cache)

Two stores of the same N rows (ids 0..N-1, dim 16 Adagrad: 36 float32 and the row's lsn, the 152-byte value of
ps.storage.rowformat; each row's floats a hash of its id, so both sides hold the same bytes) under --dir:
- paged: one file of P pages of 4 KB; an id's home page is splitmix64(id) mod P, P = N / (25 x --load).
      page  := count:u32le flags:u32le id:u64le[25] value[25] (zero padding to 4096 bytes)
      value := f32le[36] lsn:u64le
  A page holds at most 25 rows; a row whose home page is full goes to the next page with room (linear probing),
  and every page it passed gets flags bit 0 ("overflowed": look further). A read of an id preads its home page
  (4096 bytes), finds the id among the page's ids, copies its value; only where the id is absent and the page
  overflowed it preads the next page. The id -> row map is the hash itself: no memory per row, so it fits any
  budget (the benchmark's --memory-bytes 547M leaves RocksDB a 68 MiB block cache).
- slot: the floor of any one-pread store: a pread of the 152 bytes of the row alone, at the offset the paged
  build placed it, from an id -> offset array in RAM (8 bytes per row, 229 MiB at 3x10^7 rows: over the budget;
  it says what a pread costs when nothing else is read).
- rocksdb: the rows in RocksDB as benchmarks/miss_path.py ingests them (column family "rows", keys of
  ps.storage.rowformat.encode_keys, SST files written with the options of the server's last level under
  --memory-bytes: no Bloom filter), opened with ps.storage.options.rocksdb_options as a server under the
  benchmark's default --memory-bytes (547M for a 256M RAM tier: a 68 MiB block cache, partitioned index blocks in
  it) and read with ps.storage.options.multi_get (MultiGet calls of at most 1,024 keys over reader threads),
  keys encoded before the clock starts.
Both preads run in numba-compiled code without the GIL (libc pread through ctypes), the keys split into as many
contiguous parts as threads, each part on a thread of a pool. Both files are read once, whole, before any timing
(RocksDB's by harness.read_into_page_cache; the paged file's page by page, --paged-warm, see warm_paged); their
sizes are printed beside MemAvailable, and how much of each file fincore finds in the page cache before the reads
and after them: where either side is under MIN_RESIDENT at either time, the ratios are withheld (printed as "-",
null in the JSON), as a side that reads from disk is not compared with one that reads from memory.
The paged and slot reads verify no checksum; RocksDB's verify each block's (its default): the output says so.

Requests: as benchmarks/miss_path.py's live reference draws them (request_ids there): 100,000 draws (--ids), fresh
per request, Zipf(1.1) over ranks mapped through a fixed random permutation of the ids, less the ranks a 256 MiB
RAM tier holds (rows x --tier-fraction, 1,065,220 at 3x10^7: the ids a miss reads), or uniform; the unique ones,
sorted. Per distribution and thread count: 2 untimed requests, then requests for --seconds (and on to a multiple
of 6), each read by every side in turn, the order going through all 6 (ORDERS), so that each side comes first, and
right after each other side, equally often (the slot side reads the file the paged side just read in a third of
the requests, as the paged side after the slot side), and a change of the machine's speed moves all sides alike.
Figures: us per key, median over the requests; the ratio to rocksdb's, and pages read per key (paged).
Writes (after all reads, one thread, --write-requests requests of Zipf keys): the rows of a request written back
in place by pwrite of each 152-byte value at its offset, against a RocksDB WriteBatch of put(key, value), one
Python call per row, and one write (the write-behind's write: WAL on, no sync; its db.write alone is shown too).
Not like for like: the pwrite side has no crash safety (no double-write file, no fsync: the durability below is
not built), where RocksDB writes its WAL; neither side syncs. The printed line says so. Beside them, how much the
machine's Dirty and Writeback pages rose per row pwritten: a hint of the bytes each slot write dirties (a 4 KB
page, or a large folio), not a measure (other processes' writes and the kernel's writeback move it too).
Every request's rows are checked equal across the three sides (RuntimeError if not). Progress goes to stderr; the
last line of stdout is one JSON object (harness.emit).

What an in-place store would need for durability (not built here): a 152-byte slot write is not atomic across
a crash (it can straddle a 512-byte sector, and the page cache writes back 4 KB pages in any order), so a torn
slot needs a copy to repair from: write each batch of dirty slots first to a sequential double-write file and
fsync it, then in place (or keep a per-slot checksum and rebuild torn slots from a checkpoint plus the journal).
Slots must not reach the disk before the journal records of the pushes they hold: fsync the journal up to a
batch's highest lsn before its in-place writes. Replay then starts at the oldest lsn that any slot not yet synced
may lack (the lsn of the last fsync of the slot file), and each slot's lsn skips the pushes it already holds, as
the RocksDB rows' lsn does now.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import harness  # before numpy: see its docstring
import numba
import numpy as np
from rocksdict import Options, Rdict, WriteBatch

from ps.rows.layout import layout_of
from ps.storage.memory import plan_memory, smallest_memory_bytes
from ps.storage.options import multi_get, rocksdb_options, table_options
from ps.storage.rowformat import ROWS_CF, encode_keys, value_dtype

DIM, OPTIMIZER, ZIPF_EXPONENT, TABLE_NUMBER = 16, "adagrad", 1.1, 1
WIDTH = layout_of(DIM, OPTIMIZER).width  # 36 floats
VALUE = value_dtype(WIDTH).itemsize  # 152 bytes: row lsn
PAGE, PER_PAGE, HEADER = 4096, 25, 8 + 8 * 25  # PER_PAGE x VALUE + HEADER <= PAGE
EMPTY = np.uint64(2**64 - 1)  # the id of a page's unused places
PAGE_DTYPE = np.dtype([("count", "<u4"), ("flags", "<u4"), ("ids", "<u8", (PER_PAGE,)), ("values", "u1", (PER_PAGE, VALUE)),
                       ("pad", "u1", (PAGE - HEADER - PER_PAGE * VALUE,))])  # fmt: skip
TIER_BYTES = 256 << 20  # the benchmark's RAM tier
PLAN = plan_memory(smallest_memory_bytes(TIER_BYTES), TIER_BYTES)
TIER_FRACTION = PLAN.ram_tier_bytes // layout_of(DIM, OPTIMIZER).ram_bytes / 30_000_000
INGEST_FILE_ROWS = 500_000
SIDES = ("paged", "slot", "rocksdb")
ORDERS = list(itertools.permutations(SIDES))  # a request's order of the sides: every one, in turn
MIN_RESIDENT = 0.99  # of each side's files in the page cache, before and after the reads, for a ratio to be shown
PAGED = lambda root: os.path.join(root, "paged", "pages")  # the paged file, alone in its dir
if PER_PAGE * VALUE + HEADER > PAGE:
    raise ImportError(f"{PER_PAGE} values of {VALUE} bytes and a {HEADER}-byte header exceed a {PAGE}-byte page")

_libc = ctypes.CDLL(None, use_errno=True)
pread, pwrite = _libc.pread, _libc.pwrite
for _f in (pread, pwrite):
    _f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64]
    _f.restype = ctypes.c_ssize_t


# ---- the rows and where they live ------------------------------------------------------------------------------
@numba.njit(nogil=True, cache=True)
def splitmix64(x: np.uint64) -> np.uint64:
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    return x ^ (x >> np.uint64(31))


@numba.njit(nogil=True, cache=True)
def values_of(ids: np.ndarray) -> np.ndarray:
    """The stored values (len(ids), VALUE) uint8 of ids: floats in [0, 1) hashed from the id, then lsn = id."""
    out = np.empty((len(ids), VALUE), np.uint8)
    for i in range(len(ids)):
        floats = out[i, : 4 * WIDTH].view(np.float32)
        for j in range(WIDTH):
            floats[j] = np.float32(splitmix64(ids[i] * np.uint64(64) + np.uint64(j)) >> np.uint64(40)) / 2**24
        out[i, 4 * WIDTH :].view(np.uint64)[0] = ids[i]
    return out


@numba.njit(nogil=True, cache=True)
def place(rows: int, pages: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offset of each id's value in the paged file, ids per page (pages, PER_PAGE), flags per page)."""
    offsets = np.empty(rows, np.int64)
    page_ids = np.full((pages, PER_PAGE), EMPTY, np.uint64)
    counts, flags = np.zeros(pages, np.int64), np.zeros(pages, np.uint32)
    for i in range(rows):
        p = np.int64(splitmix64(np.uint64(i)) % np.uint64(pages))
        while counts[p] == PER_PAGE:
            flags[p] = 1
            p = (p + 1) % pages
        page_ids[p, counts[p]] = i
        offsets[i] = p * PAGE + HEADER + counts[p] * VALUE
        counts[p] += 1
    return offsets, page_ids, flags


def build_paged(path: str, rows: int, load: float) -> tuple[np.ndarray, int]:
    """Writes the paged file of ids 0..rows-1; (offset of each id's value, pages)."""
    pages = max(1, int(np.ceil(rows / (PER_PAGE * load))))
    offsets, page_ids, flags = place(rows, pages)
    with open(path, "wb") as f:
        for lo in range(0, pages, 8192):
            ids = page_ids[lo : lo + 8192]
            page = np.zeros(len(ids), PAGE_DTYPE)
            used = ids != EMPTY
            page["count"], page["flags"], page["ids"] = used.sum(axis=1), flags[lo : lo + 8192], ids
            page["values"][used] = values_of(ids[used])
            f.write(page.tobytes())
        f.flush()
        os.fsync(f.fileno())  # on disk before any timing: a write to a page still under writeback waits for it
    return offsets, pages


def build_rocksdb(path: str, rows: int) -> Rdict:
    """RocksDB of ids 0..rows-1 in column family "rows", ingested in key order as benchmarks/miss_path.py does."""
    opts = reference_options()
    last = reference_options()
    last.set_block_based_table_factory(table_options(PLAN.block_cache_bytes, True, bloom_bits=0))
    db = Rdict(path, opts, column_families={ROWS_CF: opts})
    values = lambda k, part: values_of(part).view(f"V{VALUE}").ravel().tolist()
    harness.ingest_in_key_order(db.get_column_family(ROWS_CF), last, TABLE_NUMBER, np.arange(rows, dtype=np.uint64),
                                values, os.path.dirname(path), INGEST_FILE_ROWS)  # fmt: skip
    return db


def reference_options() -> Options:
    return rocksdb_options(block_cache_bytes=PLAN.block_cache_bytes, index_in_cache=True)


# ---- the reads and writes --------------------------------------------------------------------------------------
@numba.njit(nogil=True)  # not cached: numba does not cache code that calls ctypes functions
def read_paged(fd: int, ids: np.ndarray, pages: int, out: np.ndarray) -> int:
    """Values of ids into out (len(ids), VALUE); pages read, or -1 - i for the first id i not found."""
    buf = np.empty(PAGE, np.uint8)
    reads = 0
    for i in range(len(ids)):
        p = np.int64(splitmix64(ids[i]) % np.uint64(pages))
        while True:
            if pread(fd, buf.ctypes, PAGE, p * PAGE) != PAGE:
                return -1 - i
            reads += 1
            held = buf[8:HEADER].view(np.uint64)
            k = 0
            n = buf[:4].view(np.uint32)[0]
            while k < n and held[k] != ids[i]:
                k += 1
            if k < n:
                out[i] = buf[HEADER + k * VALUE : HEADER + (k + 1) * VALUE]
                break
            if buf[4] & 1 == 0:
                return -1 - i
            p = (p + 1) % pages
    return reads


@numba.njit(nogil=True)  # not cached: numba does not cache code that calls ctypes functions
def read_slots(fd: int, ids: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> int:
    """Values of ids into out by one pread of VALUE bytes each at offsets[id]; reads, or -1 - i on a short read."""
    for i in range(len(ids)):
        if pread(fd, out[i].ctypes, VALUE, offsets[ids[i]]) != VALUE:
            return -1 - i
    return len(ids)


@numba.njit(nogil=True)  # not cached: numba does not cache code that calls ctypes functions
def write_slots(fd: int, ids: np.ndarray, offsets: np.ndarray, values: np.ndarray) -> int:
    """values (len(ids), VALUE) written in place by pwrite at offsets[id]; writes, or -1 - i on a short write."""
    for i in range(len(ids)):
        if pwrite(fd, values[i].ctypes, VALUE, offsets[ids[i]]) != VALUE:
            return -1 - i
    return len(ids)


class Sides:
    """The three stores, read the same way: each side's read(ids) -> (values (n, VALUE) uint8, extra figure)."""

    def __init__(self, paged_path: str, offsets: np.ndarray, pages: int, db: Rdict, threads: int):
        self.fd, self.offsets, self.pages, self.threads = os.open(paged_path, os.O_RDWR), offsets, pages, threads
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)  # a read the cache misses fetches its page alone
        self.db, self.cf = db, db.get_column_family(ROWS_CF)
        self.pool = ThreadPoolExecutor(threads)

    def _split(self, kernel: Callable[..., int], ids: np.ndarray, out: np.ndarray, *args: object) -> int:
        bounds = np.linspace(0, len(ids), self.threads + 1).astype(np.int64)
        parts = [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
        done = [self.pool.submit(kernel, self.fd, ids[lo:hi], *args, out[lo:hi]) for lo, hi in parts]
        got = [d.result() for d in done]
        if any(g < 0 for g in got):
            raise RuntimeError(f"a pread found no row for an id of {len(ids):,} (results {got})")
        return sum(got)

    def paged(self, ids: np.ndarray) -> tuple[np.ndarray, float]:
        out = np.empty((len(ids), VALUE), np.uint8)
        return out, self._split(read_paged, ids, out, self.pages) / len(ids)

    def slot(self, ids: np.ndarray) -> tuple[np.ndarray, float]:
        out = np.empty((len(ids), VALUE), np.uint8)
        return out, self._split(read_slots, ids, out, self.offsets) / len(ids)

    def rocksdb(self, keys: list[bytes]) -> list:
        return multi_get(self.cf, keys, self.pool if self.threads > 1 else None, self.threads)

    def close(self) -> None:
        self.pool.shutdown()
        os.close(self.fd)


def request_ids(distribution: str, permutation: np.ndarray, n: int, seed: list[int], past_rank: int) -> np.ndarray:
    """benchmarks/miss_path.py's request_ids: the unique ids, sorted, of n draws (Zipf less ranks < past_rank)."""
    rng = np.random.default_rng(seed)
    if distribution == "zipf":
        ranks = harness.zipf_ids(rng, n, len(permutation), ZIPF_EXPONENT)
        return np.unique(permutation[ranks[ranks >= past_rank]])
    return np.unique(rng.integers(0, len(permutation), n, dtype=np.uint64))


def one_request(sides: Sides, ids: np.ndarray, turn: int) -> dict:
    """Every side reads ids, in the order ORDERS[turn % 6]; seconds per side, pages per key; RuntimeError if the
    rows read differ."""
    keys = encode_keys(TABLE_NUMBER, ids)
    got, seconds = {}, {}
    calls = {"paged": lambda: sides.paged(ids), "slot": lambda: sides.slot(ids), "rocksdb": lambda: sides.rocksdb(keys)}
    for name in ORDERS[turn % len(ORDERS)]:
        t = time.perf_counter()
        got[name] = calls[name]()
        seconds[name] = time.perf_counter() - t
    expected = values_of(ids)
    rocks = got["rocksdb"]
    if any(v is None for v in rocks) or not np.array_equal(np.frombuffer(b"".join(rocks), np.uint8), expected.ravel()):
        raise RuntimeError("RocksDB's rows differ from the rows written")
    for name in ("paged", "slot"):
        if not np.array_equal(got[name][0], expected):
            raise RuntimeError(f"the {name} store's rows differ from the rows written")
    return {"keys": len(ids), "seconds": seconds, "pages_per_key": got["paged"][1]}


def measure(sides: Sides, distribution: str, permutation: np.ndarray, args: argparse.Namespace, past: int) -> dict:
    """Two untimed requests, then requests for args.seconds, on to a multiple of len(ORDERS) (each order as often);
    us per key (median) of each side."""
    calls, start, k = [], time.perf_counter(), 0
    while k < 2 or time.perf_counter() - start < args.seconds or (k - 2) % len(ORDERS):
        ids = request_ids(distribution, permutation, args.ids, [args.seed, sides.threads, k], past)
        call = one_request(sides, ids, k - 2)
        if k >= 2:
            calls.append(call)
        else:
            start = time.perf_counter()
        k += 1
    r = {"distribution": distribution, "threads": sides.threads, "requests": len(calls),
         "keys_per_request": statistics.median(c["keys"] for c in calls),
         "paged_pages_per_key": statistics.median(c["pages_per_key"] for c in calls)}  # fmt: skip
    for name in SIDES:
        r[f"{name}_us_per_key"] = statistics.median(1e6 * c["seconds"][name] / c["keys"] for c in calls)
    r["paged_vs_rocksdb"] = r["paged_us_per_key"] / r["rocksdb_us_per_key"]
    r["slot_vs_rocksdb"] = r["slot_us_per_key"] / r["rocksdb_us_per_key"]
    return r


def measure_writes(sides: Sides, permutation: np.ndarray, args: argparse.Namespace, past: int) -> dict:
    """One thread: each request's rows written back by pwrite in place, and by one RocksDB WriteBatch (its
    db.write alone timed too)."""
    pw, wb, wb_write, keys, dirtied = [], [], [], [], []
    for k in range(args.write_requests):
        ids = request_ids("zipf", permutation, args.ids, [args.seed, 99, k], past)
        values, encoded = values_of(ids), encode_keys(TABLE_NUMBER, ids)
        raw = values.view(f"V{VALUE}").ravel().tolist()
        dirty, t = meminfo("Dirty") + meminfo("Writeback"), time.perf_counter()
        if write_slots(sides.fd, ids, sides.offsets, values) != len(ids):
            raise RuntimeError("a pwrite wrote short")
        pw.append(time.perf_counter() - t)
        dirtied.append((meminfo("Dirty") + meminfo("Writeback") - dirty) / 1024 / len(ids))
        t = time.perf_counter()
        batch, handle = WriteBatch(raw_mode=True), sides.db.get_column_family_handle(ROWS_CF)
        for key, value in zip(encoded, raw):
            batch.put(key, value, handle)
        t_write = time.perf_counter()
        sides.db.write(batch)
        wb.append(time.perf_counter() - t)
        wb_write.append(time.perf_counter() - t_write)
        keys.append(len(ids))
    each = lambda s: [1e6 * a / n for a, n in zip(s, keys)]
    us = lambda s: statistics.median(each(s))
    return {"requests": len(keys), "keys_per_request": statistics.median(keys), "pwrite_us_per_key": us(pw),
            "writebatch_us_per_key": us(wb), "writebatch_write_us_per_key": us(wb_write),
            "pwrite_vs_writebatch": us(pw) / us(wb),
            "pwrite_dirty_kb_per_key": statistics.median(dirtied), "pwrite_us_per_key_each": each(pw), "writebatch_us_per_key_each": each(wb)}  # fmt: skip


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def resident(path: str) -> tuple[int, int]:
    """(bytes of the files under path in the page cache, bytes of the files), by util-linux's fincore."""
    files = [os.path.join(d, name) for d, _, names in os.walk(path) for name in names]
    out = subprocess.run(["fincore", "-b", "-n", "-o", "RES,SIZE", *files], capture_output=True, text=True, check=True)
    pairs = [tuple(map(int, line.split())) for line in out.stdout.splitlines() if line.strip()]
    return sum(min(r, n) for r, n in pairs), sum(n for _, n in pairs)  # RES counts whole pages


def meminfo(name: str) -> int:
    """Bytes of a /proc/meminfo line (the whole machine's: other processes' writes move "Dirty" too)."""
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(f"{name}:"))


@numba.njit(nogil=True)  # not cached: numba does not cache code that calls ctypes functions
def read_pages(fd: int, pages: int) -> int:
    """Reads every page of the paged file by one pread each; bytes read."""
    buf, total = np.empty(PAGE, np.uint8), 0
    for p in range(pages):
        total += pread(fd, buf.ctypes, PAGE, p * PAGE)
    return total


def warm_paged(path: str, pages: int, how: str) -> tuple[int, float]:
    """The paged file into the page cache (bytes, seconds). "pages": dropped from it first, then each page read by
    one pread with readahead off (POSIX_FADV_RANDOM), as a store's random reads would fill it: the cache holds the
    file in 4 KB folios. "sequential": read whole, 8 MB at a time (harness.read_into_page_cache); readahead then
    fills the cache with large folios (tens of KB), and a later write of one 152-byte slot dirties its whole folio
    (the "dirty kB per row" of the writes)."""
    t = time.perf_counter()
    if how == "sequential":
        return harness.read_into_page_cache(os.path.dirname(path))[0], time.perf_counter() - t
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean after build_paged's fsync: every page goes
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return read_pages(fd, pages), time.perf_counter() - t
    finally:
        os.close(fd)


def warm_kernels(path: str) -> None:
    """Compiles the pread and pwrite kernels (calls of no ids), so that no timed call pays for it."""
    fd, none = os.open(path, os.O_RDWR), np.zeros(0, np.uint64)
    try:
        read_paged(fd, none, 1, np.zeros((0, VALUE), np.uint8))
        read_slots(fd, none, np.zeros(0, np.int64), np.zeros((0, VALUE), np.uint8))
        write_slots(fd, none, np.zeros(0, np.int64), np.zeros((0, VALUE), np.uint8))
    finally:
        os.close(fd)


def build(args: argparse.Namespace, root: str) -> tuple[np.ndarray, int, Rdict, dict]:
    """Both stores under root, read into the page cache; (offsets, pages, db, figures of the build)."""
    fig, t = {"rows": args.rows, "mem_available_before_bytes": meminfo("MemAvailable")}, time.perf_counter()
    os.mkdir(os.path.dirname(PAGED(root)))
    offsets, pages = build_paged(PAGED(root), args.rows, args.load)
    fig["paged_build_s"], t = time.perf_counter() - t, time.perf_counter()
    progress(f"paged file: {pages:,} pages, built in {fig['paged_build_s']:.0f} s; RocksDB ingest next")
    db = build_rocksdb(os.path.join(root, "rocksdb"), args.rows)
    fig["rocksdb_build_s"] = time.perf_counter() - t
    fig["pages"], fig["load"] = pages, args.rows / (pages * PER_PAGE)
    fig["paged_bytes"], fig["paged_read_s"] = warm_paged(PAGED(root), pages, args.paged_warm)
    fig["rocksdb_bytes"], fig["rocksdb_read_s"] = harness.read_into_page_cache(os.path.join(root, "rocksdb"))
    fig["mem_available_warm_bytes"] = meminfo("MemAvailable")
    record_residency(fig, root, "before_reads")
    warm_kernels(PAGED(root))
    return offsets, pages, db, fig


def record_residency(fig: dict, root: str, when: str) -> None:
    """fig[f"{side}_resident_{when}"]: the fraction of each side's files (the paged file, read by the paged and slot
    sides; RocksDB's) in the page cache now."""
    for name, where in (("paged", os.path.dirname(PAGED(root))), ("rocksdb", os.path.join(root, "rocksdb"))):
        held, size = resident(where)
        fig[f"{name}_resident_{when}"] = held / size


def shortfall(fig: dict) -> str:
    """Why the ratios are withheld: the sides' files under MIN_RESIDENT in the page cache, before or after the reads
    ("" where every one held at least that much both times)."""
    low = [f"{name} {fig[f'{name}_resident_{when}']:.1%} {when.replace('_', ' ')}" for when in
           ("before_reads", "after_reads") for name in ("paged", "rocksdb")
           if fig[f"{name}_resident_{when}"] < MIN_RESIDENT]  # fmt: skip
    return f"ratios withheld: in the page cache under {MIN_RESIDENT:.0%}: {', '.join(low)}" if low else ""


def withhold_ratios(reads: list[dict], writes: dict) -> None:
    """Each ratio of reads and writes set to None (printed "-")."""
    for r in reads:
        r["paged_vs_rocksdb"] = r["slot_vs_rocksdb"] = None
    writes["pwrite_vs_writebatch"] = None


def ratio(x: float | None, width: int) -> str:
    return f"{'-':>{width}} " if x is None else f"{x:{width}.3f}x"


def print_figures(build_fig: dict, reads: list[dict], writes: dict) -> None:
    gib, fig = lambda b: f"{b / 2**30:.2f} GiB", build_fig
    print(f"{build_fig['rows']:,} rows of {VALUE} bytes; paged file {gib(build_fig['paged_bytes'])} ({build_fig['pages']:,}"
          f" pages, load {build_fig['load']:.2f}), RocksDB {gib(build_fig['rocksdb_bytes'])}; MemAvailable "
          f"{gib(build_fig['mem_available_before_bytes'])} before the build, {gib(build_fig['mem_available_warm_bytes'])} "
          f"with both read into the page cache; RocksDB block cache {PLAN.block_cache_bytes / 2**20:.1f} MiB; in the "
          f"page cache before and after the reads (fincore): paged {fig['paged_resident_before_reads']:.1%} and "
          f"{fig['paged_resident_after_reads']:.1%}, RocksDB {fig['rocksdb_resident_before_reads']:.1%} and "
          f"{fig['rocksdb_resident_after_reads']:.1%}")  # fmt: skip
    print("checksums: RocksDB's reads verify each block's checksum; the paged and slot reads verify none")
    if shortfall(fig):
        print(shortfall(fig))
    print(
        "dist     threads  keys/req  paged us/key  pages/key  slot us/key  rocksdb us/key  paged/rocksdb  slot/rocksdb"
    )
    for r in reads:
        print(f"{r['distribution']:8} {r['threads']:7}  {r['keys_per_request']:8,.0f}  {r['paged_us_per_key']:12.2f}  "
              f"{r['paged_pages_per_key']:9.3f}  {r['slot_us_per_key']:11.2f}  {r['rocksdb_us_per_key']:14.2f}  "
              f"{ratio(r['paged_vs_rocksdb'], 12)}  {ratio(r['slot_vs_rocksdb'], 11)}")  # fmt: skip
    w = writes
    print(f"writes, 1 thread, {w['keys_per_request']:,.0f} rows per request, neither side synced: pwrite in place with "
          f"no crash safety (no double-write, no fsync) {w['pwrite_us_per_key']:.2f} us/row, against RocksDB with its "
          f"WAL, a WriteBatch of one Python batch.put per row {w['writebatch_us_per_key']:.2f} us/row (of which "
          f"db.write {w['writebatch_write_us_per_key']:.2f}) ({ratio(w['pwrite_vs_writebatch'], 0).strip()}); the "
          f"machine's Dirty + Writeback rose {w['pwrite_dirty_kb_per_key']:.1f} kB per row pwritten")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=lambda x: int(float(x)), default=1_000_000, help="rows in each store")
    p.add_argument("--load", type=float, default=0.8, help="rows / (pages x 25) of the paged file")
    p.add_argument("--threads-list", default="1,2", help="reader threads of each side, in turn")
    p.add_argument("--distributions", default="zipf,uniform", help="of the requests' ids: zipf, uniform")
    p.add_argument("--ids", type=int, default=100_000, help="draws per request")
    p.add_argument("--tier-fraction", type=float, default=TIER_FRACTION,
                   help="Zipf ranks below rows x this are not read (default: a 256 MiB tier at 3x10^7 rows)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=3.0, help="timed requests per distribution and thread count")
    p.add_argument("--write-requests", type=int, default=5, help="requests of rows written back, each way")
    p.add_argument("--dir", default=None, help="where the stores go (default: a temporary dir); removed after")
    p.add_argument("--paged-warm", choices=["pages", "sequential"], default="pages",
                   help="how the paged file enters the page cache (warm_paged: 4 KB folios, or large ones)")  # fmt: skip
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    threads = [int(t) for t in args.threads_list.split(",") if t.strip()]
    distributions = [d.strip() for d in args.distributions.split(",") if d.strip()]
    if not threads or min(threads) < 1 or any(d not in ("zipf", "uniform") for d in distributions) or args.rows < 1:
        p.error("--threads-list takes counts >= 1, --distributions zipf and/or uniform, --rows at least 1")
    if not 0 < args.load <= 1:
        p.error(f"--load must be in (0, 1], got {args.load}")
    root = tempfile.mkdtemp(prefix="cold_store_probe-", dir=args.dir)
    try:
        offsets, pages, db, build_fig = build(args, root)
        permutation = np.random.default_rng([args.seed, 2]).permutation(args.rows).astype(np.uint64)
        past, reads = int(args.rows * args.tier_fraction), []
        try:
            for n in threads:
                sides = Sides(PAGED(root), offsets, pages, db, n)
                try:
                    for distribution in distributions:
                        progress(f"{distribution}, {n} thread(s): {args.seconds:g} s of requests")
                        reads.append(measure(sides, distribution, permutation, args, past))
                finally:
                    sides.close()
            record_residency(build_fig, root, "after_reads")
            sides = Sides(PAGED(root), offsets, pages, db, 1)  # writes last: they change both stores
            try:
                writes = measure_writes(sides, permutation, args, past)
            finally:
                sides.close()
        finally:
            db.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if shortfall(build_fig):
        withhold_ratios(reads, writes)
    print_figures(build_fig, reads, writes)
    harness.emit({"build": build_fig, "past_rank": past, "reads": reads, "writes": writes,
                  "ratios_withheld": shortfall(build_fig)})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

"""The miss path: one server whose table outgrows its RAM tier, under requests that do not repeat themselves, next
to raw rocksdict multi_get of the same keys on the same files; and the server's peak memory against its budget.

    python benchmarks/miss_path.py [--rows-list 1000000,30000000] [--cache-bytes 256M] [--seconds 45]
                                   [--server-args "--memory-bytes 547M"] [--keep-data DIR]

For each size of --rows-list (the first is the baseline, a table that fits in RAM) one server (dim 16, Adagrad,
--cache-bytes, --read-threads of --threads, then --server-args, by default the least --memory-bytes that leaves
the RAM tier --cache-bytes) holds a table "big" of that many rows with random values. The fill (--fill):
    ingest  the default, and the fastest: a server creates the table and stops; the rows (random embeddings,
            Adagrad accumulators, one show, admitted, journal position 0) are written in RocksDB's key order
            (slot, id) to SST files with the server's RocksDB options as its compaction writes the last level
            (ServerFlags.last_level_options: under --memory-bytes, no Bloom filters), ingested into its "rows"
            column family, and the table's counts written through ps.storage.store.Store, with the server
            stopped. The files land fully compacted, as a long-running server's mostly are (most rows in the last
            level).
    push    the trainable path: PushBatch of --fill-ids new ids at a time, --fill-streams in flight (each stream
            its own client id), random gradients; then the server stops (its clean shutdown flushes every row).
Either way the first server started on the result must report exactly that many rows (and, after an ingest, the
embeddings written for a sample of ids). With --keep-data DIR the data dir of each size is DIR/rows-N and is
kept; a later run reuses it when a server started on it reports the right number of rows, and fills it again
otherwise. Then every file of the data dir is read once, so that both sides read from the OS page cache as they
would after a fill by pushes (SstFileWriter drops what it wrote from the page cache; a kept dir may have left
it): misses cost RocksDB's block reads from memory, not the disk's latency.

Then, for each distribution (--distributions; zipf, uniform), after a restart of the server:
- idle peak: VmHWM (harness.peak_rss_bytes) of the started server once it is idle plus --idle-s, before any
  request: the same flags and data, serving nothing.
- calls: pairs of one PullBatch and one PushBatch of the same ids (as a training step pushes the ids it pulled).
  Each pair's ids are drawn fresh: --ids draws from Zipf(1.1) over all N ids (harness.zipf_ids) mapped through a
  fixed random permutation of the ids (so the hot ids are spread over the key space, not ids 0..k), or uniform
  over the ids; the unique ones, sorted, as the client sends them. Gradients are random. Request bytes are built
  before the call, replies are not parsed. The table's cache_misses (Stats) is read between calls, so each call
  has its own count of ids read from RocksDB.
- warm-up: when the table fits in the RAM tier, a pull of every id first (the baseline is a table served from
  RAM); then pairs, unrecorded, until the RAM tier is full (the table's evictions in Stats > 0; at once when the
  table fits) and --warmup-s passed, or --warmup-max-s passed. Then pairs for --seconds (the live reference's
  reads not counted), recorded.
- CPU: the server's CPU seconds per second of the timed calls, in all and by thread (harness.thread_cpu_s),
  the live reference's reads (time and the server's CPU meanwhile) left out:
  ps-rpc serves the requests, ps-rocksdb-read reads misses, ps-write-behind writes evicted dirty rows, ps-flusher
  writes every dirty row each --flush-interval-s, rocksdb:low compacts, rocksdb:high flushes memtables.
- peak: VmHWM of the server after the calls, and its RssFile then ("file": resident pages of mapped files, part
  of the peak; with --mmap-reads, the pages of RocksDB's files it has read); then it stops cleanly.
- live reference: after each pair (warm-up pairs too, untimed), with the server idle between calls (once its Stats
  show no evicted row waiting for its write and no flush running: the server's background writes, which it does
  between requests, would otherwise run beside the reference's reads), a raw multi_get of the ids a miss reads: as
  many fresh draws of their own (not the ids the server just read, so neither side reads blocks the other just
  touched), less, for Zipf, the draws of the ranks the RAM tier can hold (its rows at --cache-bytes: what a perfect
  cache of the top ranks holds). The server never reads those from RocksDB, while a raw read of them often finds its
  block cache's copy: with them, a Zipf call's keys cost the reference about a tenth less per key (6.5 against 7.2
  us, the two read alternately in one run at 3x10^7 rows). Uniform draws are all read (the tier holds 3.6% of the
  ids of a call). They are read on the running server's files: its data dir opened as a RocksDB secondary instance
  (read-only; it catches up with the server's flushes and compactions before each read, untimed) with
  ps.storage.options.rocksdb_options as the server's flags set them (ps.storage.memory.plan_memory: its block cache
  size, index and filter blocks in the cache under --memory-bytes; --direct-reads) and a block cache of its own,
  with ps.storage.options.multi_get, the server's own read: the same parts over as many threads as its --read-threads,
  the same RocksDB MultiGet calls (Rdict.get of a key list) of at most MAX_KEYS_PER_GET keys. Alternated with the
  server's calls, it reads the same tree under the same background work (compaction), and a change of
  the machine's speed during a run moves both sides alike. --no-live leaves it out.
- reference after the stop: with the server stopped, its data dir is opened read-only with the same options and
  a block cache of its own, empty at first; all the ids of the timed pulls, drawn again from their seeds, are
  encoded (ps.storage.rowformat.encode_keys, not timed) and read the same way. The first --reference-warmup calls
  are untimed; then calls until --reference-s.
Rates are unique ids per second of a call, medians over the timed calls; ratios divide them by the rate of the
same distribution at the first size of the same run. The server's cost per missed id is
    bound  pull seconds / ids the pull read from RocksDB        (everything the call did, charged to its misses)
    net    (pull seconds - unique ids x the first size's seconds per pulled id) / misses
medians over the pulls that missed; `bound` is an upper bound of a miss's cost, `net` what a miss costs beyond
a hit. A reference's cost is multi_get seconds per key, median over its calls; `ref us/key` (the JSON's
reference_us_per_key) is the live reference's where it ran, else the one after the stop; both are printed.
`ref bound` is the pull ratio a server would reach if each of its misses cost `ref us/key` and each other id the
first size's seconds per pulled id (median ids and misses per call): what the pull targets ask of RocksDB's reads
alone.
Targets (checks at the end): at every size after the first, Zipf pulls >= 0.25x and uniform pulls >= 0.07x of the
first size's rate; server us per miss (bound) <= 1.5x `ref us/key`; peak RSS <= budget + idle peak +
64 MiB, where the budget is --memory-bytes when the server has it, else its RAM tier (--cache-bytes).
Progress goes to stderr; the last line of stdout is one JSON object (harness.emit).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import harness  # before numpy: see its docstring
import numpy as np
from rocksdict import AccessType, Options, Rdict

from protos import ps_pb2
from ps.accel.malloc import tune_malloc
from ps.cli_server_flags import build_parser, parse_bytes
from ps.config import TableConfig
from ps.errors import DataLossError
from ps.rows.layout import ADMITTED, SHOW, layout_of
from ps.storage.memory import MemoryPlan, plan_memory, smallest_memory_bytes
from ps.storage.meta import META_CF, table_ids
from ps.storage.options import multi_get, rocksdb_options, table_options
from ps.storage.rowformat import ROWS_CF, encode_keys, value_dtype
from ps.storage.store import Store
from worker.client import Client
from worker.cluster import LocalCluster

TABLE = "big"
DIM = 16
OPTIMIZER = "adagrad"
ZIPF_EXPONENT = 1.1
INGEST_FILE_ROWS = 500_000  # rows per SST file of the ingest fill
SAMPLE_IDS = 8  # ids whose rows are checked after an ingest fill
MiB = 1 << 20
TARGETS = {"zipf": 0.25, "uniform": 0.07}  # pull rate at each larger size / the first size's, at least
MISS_VS_REFERENCE = 1.5  # server us per miss (bound) / reference us per key, at most
QUIET_LIMIT_S = 10.0  # the longest wait for the server's background writes to end before a live read
RSS_SLACK = 64 * MiB


# ---- the server's flags and what they imply for the reference -------------------------------------------------
@dataclass(frozen=True)
class ServerFlags:
    """The flags every server of the run gets, and what the server makes of them (its own parser and plan)."""

    args: list[str]
    plan: MemoryPlan
    read_threads: int
    direct_reads: bool
    mmap_reads: bool = False

    def reference_options(self) -> Options:
        """RocksDB options as the server opens its data dir with these flags."""
        return rocksdb_options(block_cache_bytes=self.plan.block_cache_bytes, direct_reads=self.direct_reads,
                               index_in_cache=self.plan.bounded, mmap_reads=self.mmap_reads)  # fmt: skip

    def last_level_options(self) -> Options:
        """reference_options as the server's compaction writes its last level: under --memory-bytes without Bloom
        filters (optimize_filters_for_hits; see ps.storage.options.table_options)."""
        opts = self.reference_options()
        if self.plan.bounded:
            opts.set_block_based_table_factory(table_options(self.plan.block_cache_bytes, True, bloom_bits=0))
        return opts

    @property
    def budget(self) -> tuple[int, str]:
        """(bytes, name) of the memory bound the peak RSS check uses."""
        if self.plan.bounded:
            return self.plan.memory_bytes, "--memory-bytes"
        return self.plan.ram_tier_bytes, "RAM tier (--cache-bytes; the server has no --memory-bytes)"


def server_flags(cache_bytes: int, threads: int | None, extra: str) -> ServerFlags:
    """--cache-bytes (0: not given), --read-threads (None: the server's default), then extra; parsed by ps-server's
    own parser, so that the last of a repeated flag wins here as there."""
    args = ["--cache-bytes", str(cache_bytes)] if cache_bytes else []
    args += ["--read-threads", str(threads)] if threads is not None else []
    args += shlex.split(extra)
    parsed = build_parser().parse_args([*args, "--data-dir", "unused"])
    plan = plan_memory(parsed.memory_bytes, parsed.cache_bytes)
    return ServerFlags(args, plan, parsed.read_threads, parsed.direct_reads, parsed.mmap_reads)


# ---- the fill ------------------------------------------------------------------------------------------------
def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def create_table(cluster: LocalCluster) -> None:
    with Client(cluster.start(), timeout_s=600) as client:
        client.wait_ready()
        client.create_table(TableConfig(name=TABLE, dim=DIM))
    cluster.stop()


def random_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """n admitted rows as one Adagrad push leaves them: random embeddings, accumulators above their initial 0.1,
    one show."""
    lay = layout_of(DIM, OPTIMIZER)
    rows = np.zeros((n, lay.width), dtype=np.float32)
    rows[:, :DIM] = rng.standard_normal((n, DIM), dtype=np.float32) * 0.05
    rows[:, DIM : lay.stats_col] = 0.1 + rng.standard_normal((n, lay.state_floats), dtype=np.float32) ** 2
    rows[:, lay.stats_col + SHOW] = 1.0
    rows[:, lay.stats_col + ADMITTED] = 1.0
    return rows


def fill_ingest(
    cluster: LocalCluster, rows: int, rng: np.random.Generator, opts: Options
) -> tuple[np.ndarray, np.ndarray]:
    """Creates the table and ingests rows random rows (see the module docstring) written with opts, server stopped;
    returns a sample (ids, embeddings) of what was written."""
    create_table(cluster)
    path, t0, sample = cluster.data_dir(0), time.perf_counter(), []
    value = value_dtype(layout_of(DIM, OPTIMIZER).width)  # the store's value grammar: row, lsn

    def file_values(k: int, part: np.ndarray) -> list[bytes]:
        values = np.zeros(len(part), dtype=value)
        values["row"] = random_rows(rng, len(part))
        if k == 0:
            sample[:] = part[:SAMPLE_IDS].copy(), values["row"][:SAMPLE_IDS, :DIM].copy()
        return values.view(f"V{value.itemsize}").tolist()

    def wrote(done: int) -> None:
        progress(f"  wrote {done:,} of {rows:,} rows to SST files ({done / (time.perf_counter() - t0):,.0f}/s)")

    db = Rdict(path, opts, column_families=dict.fromkeys(Rdict.list_cf(path, opts), opts))
    try:
        number = table_ids(db.get_column_family(META_CF), DataLossError)[TABLE]
        harness.ingest_in_key_order(db.get_column_family(ROWS_CF), opts, number, np.arange(rows, dtype=np.uint64),
                                    file_values, cluster.root, INGEST_FILE_ROWS, wrote)  # fmt: skip
    finally:
        db.close()
    store = Store(path)  # the table's counts, in the store's own format (a write of no rows)
    try:
        width = layout_of(DIM, OPTIMIZER).width
        store.put_rows(TABLE, np.zeros(0, np.uint64), np.zeros((0, width), np.float32), np.zeros(0, np.uint64),
                       np.zeros(0, bool), {"admitted": rows, "pending": 0})  # fmt: skip
    finally:
        store.close()
    return tuple(sample)


def fill_push(cluster: LocalCluster, rows: int, batch: int, streams: int, rng: np.random.Generator) -> float:
    """Creates the table and pushes rows new ids, batch at a time, streams requests in flight; stops the server
    (which flushes every row). Returns the seconds the stop took."""
    address = cluster.start()[0]
    with Client([address], timeout_s=600) as client:
        client.wait_ready()
        client.create_table(TableConfig(name=TABLE, dim=DIM))
    push_batch = harness.raw_method(harness.channel(address), "PushBatch")
    grads = rng.standard_normal((batch, DIM), dtype=np.float32)
    t0, reported, done, lock = time.perf_counter(), [0.0], [0], threading.Lock()

    def stream(first: int) -> None:
        client_id = secrets.randbits(63) | 1  # a client's requests to a shard are applied in seq order: its own
        for seq, lo in enumerate(range(first * batch, rows, batch * streams), start=1):
            ids = np.arange(lo, min(lo + batch, rows), dtype=np.uint64)
            body = harness.push_batch_body(TABLE, ids, grads[: len(ids)])
            push_batch(body + harness.push_batch_tail(client_id, seq), timeout=600)
            with lock:
                done[0] += len(ids)
                if done[0] / rows < reported[0] + 0.1 and done[0] < rows:
                    continue
                reported[0] = done[0] / rows
                progress(f"  pushed {done[0]:,} of {rows:,} rows ({done[0] / (time.perf_counter() - t0):,.0f}/s), "
                         f"server RSS {harness.rss_bytes(cluster.procs[0].pid) / 2**30:.2f} GiB")  # fmt: skip

    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(stream, range(streams)))
    t1 = time.perf_counter()
    cluster.stop()  # the clean shutdown flushes every dirty row
    return time.perf_counter() - t1


def table_rows(cluster: LocalCluster) -> int:
    """Starts the server, returns the rows it reports for the table (-1: no such table, or another dim), stops it."""
    try:
        with Client(cluster.start(), timeout_s=600) as client:
            client.wait_ready()
            table = next((t for t in client.stats()[0].tables if t.name == TABLE and t.dim == DIM), None)
            return -1 if table is None else int(table.num_rows)
    finally:
        cluster.stop()


def check_fill(client: Client, rows: int, sample: tuple[np.ndarray, np.ndarray] | None) -> None:
    """RuntimeError unless the server reports rows rows and the sample's embeddings as written."""
    have = next((int(t.num_rows) for t in client.stats()[0].tables if t.name == TABLE and t.dim == DIM), -1)
    if have != rows:
        raise RuntimeError(f"the filled server reports {have:,} rows, not {rows:,}")
    if sample is not None and not np.array_equal(got := client.pull(TABLE, sample[0]), sample[1]):
        raise RuntimeError(f"the filled rows read back differ from those written: {got[0]} {sample[1][0]}")


@dataclass
class Fill:
    rows: int
    method: str
    seconds: float = 0.0  # the fill, server stopped (push: with its stop)
    stop_s: float = 0.0  # push: the stop that flushed the fill
    reused: bool = False
    data_bytes: int = 0  # the data dir's files
    read_s: float = 0.0  # reading them into the page cache
    sample: tuple[np.ndarray, np.ndarray] | None = None  # ids and embeddings written (ingest)
    checked: bool = False  # a server started on the data dir reported the rows (and the sample) as written


def prepare(cluster: LocalCluster, rows: int, args: argparse.Namespace, rng: np.random.Generator,
            flags: ServerFlags) -> Fill:  # fmt: skip
    """A data dir holding the table with rows rows: the kept one if it does, else filled anew."""
    fill = Fill(rows, args.fill)
    if os.path.isdir(cluster.data_dir(0)):
        have = table_rows(cluster)
        if have == rows:
            fill.reused = fill.checked = True
            progress(f"reusing {cluster.data_dir(0)}: {rows:,} rows")
            return fill
        progress(f"{cluster.data_dir(0)} holds {have:,} rows, not {rows:,}: filling it again")
        shutil.rmtree(cluster.root)
    progress(f"filling {rows:,} rows ({args.fill}) into {cluster.data_dir(0)}")
    t0 = time.perf_counter()
    if args.fill == "ingest":
        fill.sample = fill_ingest(cluster, rows, rng, flags.last_level_options())
    else:
        fill.stop_s = fill_push(cluster, rows, args.fill_ids, args.fill_streams, rng)
    fill.seconds = time.perf_counter() - t0
    progress(f"filled {rows:,} rows in {fill.seconds:.0f} s ({rows / fill.seconds:,.0f} rows/s)")
    return fill


# ---- the calls -------------------------------------------------------------------------------------------------
def request_ids(distribution: str, permutation: np.ndarray, n: int, seed: list[int], past_rank: int = 0) -> np.ndarray:
    """The unique ids, sorted, of n draws seeded by seed: Zipf over ranks mapped through permutation, or
    uniform. past_rank: Zipf draws of a lower rank are left out (the ids a cache of the top past_rank ranks holds)."""
    rng = np.random.default_rng(seed)
    rows = len(permutation)
    if distribution == "zipf":
        ranks = harness.zipf_ids(rng, n, rows, ZIPF_EXPONENT)
        drawn = permutation[ranks[ranks >= past_rank] if past_rank else ranks]
    else:
        drawn = rng.integers(0, rows, n, dtype=np.uint64)
    return np.unique(drawn)


@dataclass
class Phase:
    """One size and distribution: per timed pair its seed, unique ids, seconds and misses of pull and push."""

    rows: int
    distribution: str
    seeds: list[list[int]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    pull_s: list[float] = field(default_factory=list)
    push_s: list[float] = field(default_factory=list)
    pull_misses: list[int] = field(default_factory=list)
    push_misses: list[int] = field(default_factory=list)
    warmup_pairs: int = 0
    idle_peak: int = 0
    peak: int = 0
    file_rss: int = 0  # RssFile after the calls: pages of mapped files (--mmap-reads maps RocksDB's)
    start_s: float = 0.0
    stop_s: float = 0.0
    stats: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)  # the server's CPU seconds per second of the timed calls, by thread
    reference_keys: list[int] = field(default_factory=list)
    reference_s: list[float] = field(default_factory=list)
    live_keys: list[int] = field(default_factory=list)  # the live reference, one read after each timed pair
    live_s: list[float] = field(default_factory=list)
    quiet_s: list[float] = field(default_factory=list)  # waits for the server's write-behind before each live read


STAT_FIELDS = (  # memory figures of the server's Stats, those it has
    "memory_budget_bytes", "ram_budget_bytes", "ram_used_bytes", "block_cache_budget_bytes", "block_cache_used_bytes",
    "memtable_bytes", "table_reader_bytes", "write_behind_bytes", "journal_map_bytes", "request_room_bytes",
)  # fmt: skip


@dataclass
class Aside:
    """Wall seconds and the server's CPU seconds (in all, by thread) of the live reference's reads."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    threads: dict[str, float] = field(default_factory=dict)

    def add(self, wall_s: float, cpu_s: float, threads1: dict[str, float], threads0: dict[str, float]) -> None:
        self.wall_s += wall_s
        self.cpu_s += cpu_s
        for name, c in threads1.items():
            self.threads[name] = self.threads.get(name, 0.0) + c - threads0.get(name, 0.0)


class LiveReference:
    """multi_get of the ids a miss reads (see the module), after each pair, on the running server's files: its data
    dir opened as a RocksDB secondary instance (read-only, following the server's flushes and compactions:
    try_catch_up_with_primary before each read, untimed) with the server's options and a block cache of its own,
    read with ps.storage.options.multi_get on as many threads as the server's reader threads."""

    def __init__(self, path: str, flags: ServerFlags, scratch: str, server_pid: int, past_rank: int):
        """server_pid: the server, whose CPU during the reads (background work only) is kept apart (`aside`).
        past_rank: Zipf ranks below it are not read (request_ids)."""
        self.server_pid, self.past_rank = server_pid, past_rank
        self.aside = Aside()
        opts = flags.reference_options()
        self.db = Rdict(path, opts, column_families=dict.fromkeys(Rdict.list_cf(path, opts), opts),
                        access_type=AccessType.secondary(scratch))  # fmt: skip
        self.cf, self.number = (
            self.db.get_column_family(ROWS_CF),
            table_ids(self.db.get_column_family(META_CF), DataLossError)[TABLE],
        )
        self.threads = flags.read_threads
        self.pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None

    def read(self, ids: np.ndarray) -> float:
        """Seconds of the multi_get of ids; RuntimeError unless every id has a row."""
        threads0, cpu0, t0 = harness.thread_cpu_s(self.server_pid), harness.cpu_s(self.server_pid), time.perf_counter()
        self.db.try_catch_up_with_primary()
        keys = encode_keys(self.number, ids)
        t = time.perf_counter()
        found = multi_get(self.cf, keys, self.pool, self.threads)
        took = time.perf_counter() - t
        self.aside.add(time.perf_counter() - t0, harness.cpu_s(self.server_pid) - cpu0,
                       harness.thread_cpu_s(self.server_pid), threads0)  # fmt: skip
        if missing := sum(v is None for v in found):
            raise RuntimeError(f"the live reference found no row for {missing} of {len(keys)} ids")
        return took

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        self.db.close()


def serve(cluster: LocalCluster, phase: Phase, permutation: np.ndarray, args: argparse.Namespace, flags: ServerFlags,
          fill: Fill) -> None:  # fmt: skip
    """Starts the server, samples its idle peak, checks the fill (once), warms it up, runs the timed pairs of
    phase, stops it."""
    t0 = time.perf_counter()
    address = cluster.start()[0]
    pid = cluster.procs[0].pid
    with Client([address], timeout_s=600) as client:
        client.wait_ready()
        phase.start_s = time.perf_counter() - t0
        if not harness.wait_idle(pid, timeout_s=120):
            progress("  (the server was still busy 120 s after its start)")
        time.sleep(args.idle_s)
        phase.idle_peak = harness.peak_rss_bytes(pid)
        if not fill.checked:
            check_fill(client, fill.rows, fill.sample)
            fill.checked = True

        def table() -> ps_pb2.TableStats:
            return next(t for t in client.stats()[0].tables if t.name == TABLE)

        def quiet() -> float:
            """Waits until the server holds no evicted row waiting for its write and runs no flush; returns the
            seconds waited."""
            t = time.perf_counter()
            while time.perf_counter() - t < QUIET_LIMIT_S:
                s = client.stats()[0]
                if not (s.write_behind_bytes or s.flushing):
                    break
                time.sleep(0.001)
            return time.perf_counter() - t

        ch = harness.channel(address)
        pull_batch, push_batch = harness.raw_method(ch, "PullBatch"), harness.raw_method(ch, "PushBatch")
        fits = phase.rows * layout_of(DIM, OPTIMIZER).ram_bytes <= flags.plan.ram_tier_bytes
        live = None
        if args.live:  # it reads no id of the ranks the RAM tier can hold: the ids a miss reads
            tier_rows = 0 if fits else flags.plan.ram_tier_bytes // layout_of(DIM, OPTIMIZER).ram_bytes
            live = LiveReference(cluster.data_dir(0), flags, os.path.join(cluster.root, "secondary"), pid, tier_rows)
        if fits:  # every row into the RAM tier: the baseline is a table served from RAM
            for lo in range(0, phase.rows, args.ids):
                pull_batch(harness.pull_batch_bytes(TABLE, np.arange(lo, min(lo + args.ids, phase.rows))), timeout=600)
        client_id, grads_rng, seed = secrets.randbits(63) | 1, np.random.default_rng([args.seed, 1]), args.seed
        code = list(TARGETS).index(phase.distribution)
        start = time.perf_counter()
        while True:  # the warm-up: until the RAM tier is full (it evicts) and --warmup-s passed
            warm = fits or table().evictions > 0
            took = time.perf_counter() - start
            if (warm and took >= args.warmup_s) or took >= args.warmup_max_s:
                if not warm:
                    progress(f"  (the RAM tier did not fill in the {args.warmup_max_s:g} s of warm-up)")
                break
            pair(pull_batch, push_batch, phase, permutation, args, [seed, phase.rows % 2**32, code], client_id,
                 grads_rng, table, quiet, live, timed=False)  # fmt: skip
        aside = Aside()  # the live reference's reads: out of the CPU figures
        if live is not None:
            live.aside = aside
        threads0, cpu0, start = harness.thread_cpu_s(pid), harness.cpu_s(pid), time.perf_counter()
        while time.perf_counter() - start < args.seconds + aside.wall_s or len(phase.seeds) < 3:
            pair(pull_batch, push_batch, phase, permutation, args, [seed, phase.rows % 2**32, code], client_id,
                 grads_rng, table, quiet, live, timed=True)  # fmt: skip
        threads1, cpu1, wall = harness.thread_cpu_s(pid), harness.cpu_s(pid), time.perf_counter() - start
        wall -= aside.wall_s
        used = {
            name: c - threads0.get(name, 0.0) - aside.threads.get(name, 0.0) for name, c in sorted(threads1.items())
        }
        phase.cpu = {"all": (cpu1 - cpu0 - aside.cpu_s) / wall}
        phase.cpu |= {name: c / wall for name, c in used.items() if c >= 0.005 * wall}
        phase.peak, phase.file_rss = harness.peak_rss_bytes(pid), harness.file_rss_bytes(pid)
        stats = client.stats()[0]
        last = next(t for t in stats.tables if t.name == TABLE)
        phase.stats = {name: int(getattr(stats, name)) for name in STAT_FIELDS if hasattr(stats, name)}
        phase.stats |= {"rows_in_ram": int(last.rows_in_ram), "evictions": int(last.evictions)}
        ch.close()
        if live is not None:
            live.close()
    t = time.perf_counter()
    cluster.stop()
    phase.stop_s = time.perf_counter() - t


def pair(pull_batch: Callable, push_batch: Callable, phase: Phase, permutation: np.ndarray, args: argparse.Namespace,
         seed: list[int], client_id: int, grads_rng: np.random.Generator, table: Callable[[], ps_pb2.TableStats],
         quiet: Callable[[], float], live: LiveReference | None, timed: bool) -> None:  # fmt: skip
    """One PullBatch of fresh ids, then one PushBatch of random gradients for the same ids, then (with live) the
    live reference's read of as many draws of their own (seed + [its number, 1]: ids the server did not just
    read, so neither side reads blocks the other just touched), once quiet() found the server's write-behind
    empty and no flush running; recorded in phase if timed. Its ids are drawn from seed + [its number]: the
    reference draws them again."""
    k = phase.warmup_pairs + len(phase.seeds)
    call_seed = [*seed, k]
    ids = request_ids(phase.distribution, permutation, args.ids, call_seed)
    pull = harness.pull_batch_bytes(TABLE, ids)
    grads = grads_rng.standard_normal((len(ids), DIM), dtype=np.float32) * 0.01
    push = harness.push_batch_body(TABLE, ids, grads) + harness.push_batch_tail(client_id, k + 1)
    m0 = table().cache_misses
    t = time.perf_counter()
    pull_batch(pull, timeout=600)
    pull_s = time.perf_counter() - t
    m1 = table().cache_misses
    t = time.perf_counter()
    push_batch(push, timeout=600)
    push_s = time.perf_counter() - t
    m2 = table().cache_misses
    live_ids = live_s = quiet_s = None
    if live is not None:
        quiet_s = quiet()
        live_ids = request_ids(phase.distribution, permutation, args.ids, [*call_seed, 1], live.past_rank)
        live_s = live.read(live_ids) if len(live_ids) else None
    if not timed:
        phase.warmup_pairs += 1
        return
    phase.seeds.append(call_seed)
    phase.ids.append(len(ids))
    phase.pull_s.append(pull_s)
    phase.push_s.append(push_s)
    phase.pull_misses.append(int(m1 - m0))
    phase.push_misses.append(int(m2 - m1))
    if live_s is not None:
        phase.live_keys.append(len(live_ids))
        phase.live_s.append(live_s)
    if quiet_s is not None:
        phase.quiet_s.append(quiet_s)


def reference(path: str, flags: ServerFlags, phase: Phase, permutation: np.ndarray, args: argparse.Namespace) -> None:
    """multi_get of the ids of phase's timed pulls on the stopped server's files (see the module docstring)."""
    opts = flags.reference_options()
    db = Rdict(path, opts, column_families=dict.fromkeys(Rdict.list_cf(path, opts), opts),
               access_type=AccessType.read_only())  # fmt: skip
    threads = flags.read_threads
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        cf, number = db.get_column_family(ROWS_CF), table_ids(db.get_column_family(META_CF), DataLossError)[TABLE]

        start = time.perf_counter()
        for k, call_seed in enumerate(phase.seeds):
            keys = encode_keys(number, request_ids(phase.distribution, permutation, args.ids, call_seed))
            t = time.perf_counter()
            found = multi_get(cf, keys, pool, threads)
            took = time.perf_counter() - t
            missing = sum(v is None for v in found)
            if missing:
                raise RuntimeError(f"the reference found no row for {missing} of {len(keys)} ids")
            if k >= args.reference_warmup:
                phase.reference_keys.append(len(keys))
                phase.reference_s.append(took)
                if time.perf_counter() - start > args.reference_s:
                    break
    finally:
        if pool is not None:
            pool.shutdown()
        db.close()


# ---- figures -------------------------------------------------------------------------------------------------
def median_rate(n: list[int], seconds: list[float]) -> float:
    return statistics.median(a / s for a, s in zip(n, seconds))


def summary(phase: Phase, base: Phase | None, flags: ServerFlags) -> dict:
    """The figures of one phase; base: the same distribution at the first size (None: this is it)."""
    r = {"rows": phase.rows, "distribution": phase.distribution, "pairs": len(phase.seeds),
         "warmup_pairs": phase.warmup_pairs}  # fmt: skip
    r["pull_ids_per_s"] = median_rate(phase.ids, phase.pull_s)
    r["push_ids_per_s"] = median_rate(phase.ids, phase.push_s)
    ref = base or phase
    r["pull_ratio"] = r["pull_ids_per_s"] / median_rate(ref.ids, ref.pull_s)
    r["push_ratio"] = r["push_ids_per_s"] / median_rate(ref.ids, ref.push_s)
    r["unique_ids_per_call"] = statistics.median(phase.ids)
    r["misses_per_pull"] = statistics.median(phase.pull_misses)
    r["misses_per_push"] = statistics.median(phase.push_misses)
    hit_s = statistics.median(s / n for s, n in zip(ref.pull_s, ref.ids))  # per pulled id at the first size
    missed = [(s, n, m) for s, n, m in zip(phase.pull_s, phase.ids, phase.pull_misses) if m > 0]
    r["server_us_per_miss"] = statistics.median(1e6 * s / m for s, _, m in missed) if missed else None
    net = [1e6 * (s - n * hit_s) / m for s, n, m in missed]
    r["server_net_us_per_miss"] = statistics.median(net) if net and base is not None else None
    per_key = lambda keys, seconds: statistics.median(1e6 * s / n for s, n in zip(seconds, keys)) if seconds else None
    r["stopped_reference_us_per_key"] = per_key(phase.reference_keys, phase.reference_s)
    r["stopped_reference_calls"] = len(phase.reference_s)
    r["live_reference_us_per_key"] = per_key(phase.live_keys, phase.live_s)
    r["live_reference_calls"] = len(phase.live_s)
    r["quiet_wait_ms"] = statistics.median(phase.quiet_s) * 1e3 if phase.quiet_s else None
    # the reference the check and the bound use: the live one where it ran (the same moments as the server's calls)
    r["reference"] = "live" if phase.live_s else "stopped"
    r["reference_us_per_key"] = r[f"{r['reference']}_reference_us_per_key"]
    r["reference_bound_ratio"] = None  # the pull ratio if a miss cost the reference's us per key, a hit the base's
    if base is not None and r["reference_us_per_key"]:
        unique, misses = r["unique_ids_per_call"], r["misses_per_pull"]
        seconds = (unique - misses) * hit_s + misses * r["reference_us_per_key"] / 1e6
        r["reference_bound_ratio"] = unique / seconds / median_rate(ref.ids, ref.pull_s)
    budget, _ = flags.budget
    r |= {"peak_rss_bytes": phase.peak, "file_rss_bytes": phase.file_rss, "idle_peak_rss_bytes": phase.idle_peak,
          "budget_bytes": budget,
          "rss_limit_bytes": budget + phase.idle_peak + RSS_SLACK, "start_s": phase.start_s, "stop_s": phase.stop_s,
          "server_stats": phase.stats, "server_cpu_cores": phase.cpu}  # fmt: skip
    return r


def checks(results: list[dict], first_rows: int) -> list[dict]:
    """Each target with its figure: {check, figure, target, ok}."""
    out = []
    for r in results:
        where = f"{r['rows']:,} {r['distribution']}"
        if r["rows"] != first_rows and r["distribution"] in TARGETS:
            out.append({"check": f"{where}: pull rate / first size's", "figure": r["pull_ratio"],
                        "target": f">= {TARGETS[r['distribution']]}x",
                        "ok": r["pull_ratio"] >= TARGETS[r["distribution"]]})  # fmt: skip
        if r["server_us_per_miss"] is not None and r["reference_us_per_key"] and r["rows"] != first_rows:
            ratio = r["server_us_per_miss"] / r["reference_us_per_key"]
            out.append({"check": f"{where}: server us/miss (bound) / reference us/key", "figure": ratio,
                        "target": f"<= {MISS_VS_REFERENCE}x", "ok": ratio <= MISS_VS_REFERENCE})  # fmt: skip
        out.append({"check": f"{where}: peak RSS <= budget + idle peak + 64 MiB", "figure": r["peak_rss_bytes"],
                    "target": f"<= {r['rss_limit_bytes'] / MiB:,.0f} MiB",
                    "ok": r["peak_rss_bytes"] <= r["rss_limit_bytes"]})  # fmt: skip
    return out


def print_table(results: list[dict]) -> None:
    mib = lambda b: f"{b / MiB:,.0f}"
    us = lambda x: "-" if x is None else f"{x:.2f}"
    head = ("rows", "dist", "pull ids/s", "ratio", "push ids/s", "ratio", "ids/call", "miss/pull", "miss/push",
            "us/miss", "net", "ref us/key", "after stop", "ref bound", "peak MiB", "file MiB", "idle MiB",
            "limit MiB")  # fmt: skip
    lines = [head]
    for r in results:
        lines.append((
            f"{r['rows']:,}", r["distribution"], f"{r['pull_ids_per_s'] / 1e6:.3f}M", f"{r['pull_ratio']:.3f}x",
            f"{r['push_ids_per_s'] / 1e6:.3f}M", f"{r['push_ratio']:.3f}x", f"{r['unique_ids_per_call']:,.0f}",
            f"{r['misses_per_pull']:,.0f}", f"{r['misses_per_push']:,.0f}", us(r["server_us_per_miss"]),
            us(r["server_net_us_per_miss"]), us(r["reference_us_per_key"]), us(r["stopped_reference_us_per_key"]),
            "-" if r["reference_bound_ratio"] is None else f"{r['reference_bound_ratio']:.3f}x", mib(r["peak_rss_bytes"]),
            mib(r["file_rss_bytes"]), mib(r["idle_peak_rss_bytes"]), mib(r["rss_limit_bytes"]),
        ))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(cell.rjust(w) for cell, w in zip(line, widths)))


def default_server_args(cache_bytes: int) -> str:
    """--memory-bytes at the least that leaves the RAM tier cache_bytes (0: 512M, the tier what it leaves)."""
    return f"--memory-bytes {smallest_memory_bytes(cache_bytes) if cache_bytes else 512 << 20}"


def sizes(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows-list", type=sizes, default="1000000,30000000", help="table sizes; the first is the baseline")
    p.add_argument("--distributions", default="zipf,uniform", help="of the requests' ids: zipf, uniform")
    p.add_argument("--cache-bytes", type=lambda text: 0 if text.strip() == "0" else parse_bytes(text), default="256M",
                   help="the server's RAM tier (0: not given, the tier takes what --memory-bytes leaves)")  # fmt: skip
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="the server's --read-threads and the reference's threads (default: the server's default)",
    )
    p.add_argument("--server-args", default=None,
                   help='more ps-server flags (default: "--memory-bytes M", M the least that leaves the RAM tier '
                   "--cache-bytes (ps.storage.memory.smallest_memory_bytes: 547M for 256M; 512M without "
                   "--cache-bytes), the one memory bound the peak RSS check holds the server to; "
                   '"" for none: the check then uses the RAM tier)')  # fmt: skip
    p.add_argument("--ids", type=int, default=100_000, help="draws per request (its unique ids are sent)")
    p.add_argument("--seconds", type=float, default=45.0, help="timed calls per size and distribution")
    p.add_argument("--warmup-s", type=float, default=5.0, help="untimed calls before them, once the RAM tier is full")
    p.add_argument("--warmup-max-s", type=float, default=120.0, help="the warm-up, at most")
    p.add_argument("--idle-s", type=float, default=3.0, help="the idle server's wait before its peak is read")
    p.add_argument("--reference-s", type=float, default=8.0, help="the reference's timed calls, at most")
    p.add_argument("--reference-warmup", type=int, default=2, help="the reference's untimed first calls")
    p.add_argument(
        "--live",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the live reference: multi_get of fresh draws after each pair, on the running server's files",
    )
    p.add_argument("--fill", choices=["ingest", "push"], default="ingest")
    p.add_argument("--fill-ids", type=int, default=100_000, help="push fill: new ids per PushBatch")
    p.add_argument("--fill-streams", type=int, default=3, help="push fill: PushBatch requests in flight")
    p.add_argument("--keep-data", metavar="DIR", default=None, help="keep and reuse the data dirs, DIR/rows-N")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    distributions = [d.strip() for d in args.distributions.split(",") if d.strip()]
    if not args.rows_list or any(d not in TARGETS for d in distributions):
        p.error(f"--rows-list needs a size and --distributions names of {', '.join(TARGETS)}")
    tune_malloc()
    flags = server_flags(args.cache_bytes, args.threads, default_server_args(args.cache_bytes)
                         if args.server_args is None else args.server_args)  # fmt: skip
    t_run = time.perf_counter()
    fills, phases = [], []
    for rows in args.rows_list:
        root = os.path.join(args.keep_data, f"rows-{rows}") if args.keep_data else None
        cluster = LocalCluster(1, root=root, start_timeout_s=600, extra_args=flags.args)
        try:
            fill = prepare(cluster, rows, args, np.random.default_rng([args.seed, rows % 2**32]), flags)
            fill.data_bytes, fill.read_s = harness.read_into_page_cache(cluster.data_dir(0))
            progress(f"read the data dir ({fill.data_bytes / 2**30:.2f} GiB) in {fill.read_s:.1f} s")
            fills.append(fill)
            permutation = np.random.default_rng([args.seed, 2]).permutation(rows).astype(np.uint64)
            for distribution in distributions:
                phase = Phase(rows, distribution)
                progress(f"{rows:,} rows, {distribution}: warm-up {args.warmup_s:g} s, then {args.seconds:g} s")
                serve(cluster, phase, permutation, args, flags, fill)
                progress(f"  {len(phase.seeds)} timed pairs; reference multi_get of their pulls' ids")
                reference(cluster.data_dir(0), flags, phase, permutation, args)
                phases.append(phase)
        finally:
            cluster.cleanup()
    total_s = time.perf_counter() - t_run

    first = args.rows_list[0]
    base = {ph.distribution: ph for ph in phases if ph.rows == first}
    results = [summary(ph, None if ph.rows == first else base[ph.distribution], flags) for ph in phases]
    budget, budget_name = flags.budget
    print(f"one server, dim {DIM}, {OPTIMIZER}; flags: {shlex.join(flags.args)}; memory plan: {flags.plan.describe()}")
    print(f"requests: {args.ids:,} draws (Zipf({ZIPF_EXPONENT}) through a fixed permutation, or uniform), unique "
          f"ids sent; pull then push of the same ids; warm-up until the RAM tier is full and {args.warmup_s:g} s, "
          f"then {args.seconds:g} s timed per size and distribution, after a restart; reference: multi_get on "
          f"{flags.read_threads} thread(s)")  # fmt: skip
    for f in fills:
        how = "reused" if f.reused else f"{f.seconds:.0f} s ({f.rows / f.seconds:,.0f} rows/s)"
        if f.method == "push" and not f.reused:
            how += f", of which the stop that flushed it {f.stop_s:.0f} s"
        print(f"fill of {f.rows:,} rows ({f.method}): {how}; data dir {f.data_bytes / f.rows:.0f} bytes/row, read "
              f"into the page cache in {f.read_s:.1f} s")  # fmt: skip
    print(f"rates: unique ids/s, median per call; ratio: to {first:,} rows, same distribution. us/miss: pull "
          f"seconds / ids it read from RocksDB (an upper bound); net: less the first size's cost per pulled id. "
          f"limit: {budget_name} {budget / MiB:,.0f} MiB + idle peak + 64 MiB")  # fmt: skip
    print_table(results)
    for r in results:
        m = r["server_stats"]
        parts = ", ".join(f"{name.removesuffix('_bytes')} {m[name] / MiB:,.0f}" for name in STAT_FIELDS if name in m)
        print(f"Stats after {r['rows']:,} {r['distribution']} (MiB): {parts}; rows in RAM {m['rows_in_ram']:,}")
    for r in results:
        cores = dict(r["server_cpu_cores"])
        every = cores.pop("all", 0.0)
        parts = ", ".join(f"{name} {c:.2f}" for name, c in sorted(cores.items(), key=lambda kv: -kv[1]))
        print(f"server CPU during the timed calls, {r['rows']:,} {r['distribution']} (cores): {every:.2f}: {parts}")
        if r["quiet_wait_ms"] is not None:
            print(
                f"  median wait for the server's background writes to end before a live read: {r['quiet_wait_ms']:.1f} ms"
            )
    found = checks(results, first)
    for c in found:
        figure = f"{c['figure'] / MiB:,.0f} MiB" if "RSS" in c["check"] else f"{c['figure']:.3f}x"
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['check']}: {figure} (target {c['target']})")
    print(f"total: {total_s:.0f} s")
    fill_figures = [{k: v for k, v in f.__dict__.items() if k != "sample"} for f in fills]
    harness.emit({
        "server_args": flags.args, "memory_plan": flags.plan.parts() | {"memory_bytes": flags.plan.memory_bytes},
        "read_threads": flags.read_threads, "ids_per_request": args.ids, "seconds": args.seconds,
        "warmup_s": args.warmup_s, "fills": fill_figures, "results": results, "checks": found,
        "all_ok": all(c["ok"] for c in found), "total_s": total_s,
    })  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

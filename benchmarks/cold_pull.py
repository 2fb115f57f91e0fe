"""Pulls of ids that are in no cache, from a table 10x larger than the RAM tier, next to the server's own RocksDB read
(ps.storage.options.multi_get) of the same ids on the same files, opened with the server's options, on as many threads.

    python benchmarks/cold_pull.py [--rows 1000000] [--ids 100000] [--reps 8] [--read-threads 2] [--dir DIR]

One server (`--direct-reads`, --cache-bytes sized to hold a tenth of the table's rows) is filled by pushes (dim 16,
Adagrad), then stopped (every row flushed to RocksDB) and started again: an empty RAM tier and an empty block
cache. Its data dir is under --dir, or the first of /var/tmp and the temporary directory on a disk-backed file
system that reads with O_DIRECT (harness.direct_io_dir; the output names it). With direct reads, a read that
RocksDB's block cache misses goes to the disk, not to the OS page cache, on both sides, without dropping the
host's caches or outgrowing them.
No cache holds an id before its request: the ids, in RocksDB's key order (slot, id), are cut into one range per
request, and each request pulls --ids random ids of its own range, so no earlier request read a data block it
needs (a range's blocks are its own) or put its rows in the RAM tier.
The reference opens the same files read-only beside the restarted server (once it is idle), with
ps.storage.options.rocksdb_options (the server's block cache size, bloom filters, table format, direct reads; a
block cache of its own, as empty), and reads the same keys (ps.storage.rowformat.encode_keys) with
ps.storage.options.multi_get, the server's own read: MultiGet calls of at most 1,024 keys split over as many threads
as the server's --read-threads (ps.server_config.ServerConfig's default, 2; --read-threads sets both). Each request goes
to both, the server first for even requests and the reference first for odd ones, so a change in the machine's
or the disk's speed hits both alike. The server's rate counts the ids it fetched from RocksDB (the delta of its
table's cache_misses in Stats around each PullBatch; request bytes built before the call, reply unparsed); the
reference's counts the keys it asked for. Rates are medians over the requests after --warmup.
Target: cold pull >= 80% of the reference's rate.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import harness  # before numpy: see its docstring
import numpy as np
from rocksdict import AccessType, Rdict

from ps.accel.malloc import tune_malloc
from ps.config import TableConfig
from ps.errors import DataLossError
from ps.rows.layout import layout_of
from ps.server_config import ServerConfig
from ps.sharding import slot_of
from ps.storage.meta import table_ids
from ps.storage.options import multi_get, rocksdb_options
from ps.storage.rowformat import ROWS_CF, encode_keys
from worker.client import Client
from worker.cluster import LocalCluster

DIM = 16


def key_range_batches(rows: int, n: int, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """count requests of up to n ids each (sorted, as the client sends them), request k drawn from the k-th of
    count equal ranges of the ids 0..rows-1 in RocksDB's key order (slot, id)."""
    ids = np.arange(rows, dtype=np.uint64)
    in_key_order = ids[np.lexsort((ids, slot_of(ids)))]
    return [np.sort(rng.choice(part, min(n, len(part)), replace=False)) for part in np.array_split(in_key_order, count)]


def misses(client: Client) -> int:
    """Ids the shard's table has fetched from RocksDB since it started (Stats: cache_misses)."""
    return next(int(t.cache_misses) for t in client.stats()[0].tables if t.name == "cold")


def open_reference(path: str) -> Rdict:
    """The shard's RocksDB opened read-only (beside the running server) with the server's options, direct reads."""
    opts = rocksdb_options(direct_reads=True)
    return Rdict(path, opts, column_families=dict.fromkeys(Rdict.list_cf(path, opts), opts),
                 access_type=AccessType.read_only())  # fmt: skip


def measure(cluster: LocalCluster, batches: list[np.ndarray], warmup: int, threads: int) -> dict[str, list]:
    """Each request of batches pulled from the restarted server and read by the reference (multi_get on threads
    threads, as the server's --read-threads), which goes first in turn; per request after the first warmup: seconds
    and ids fetched from RocksDB of each side."""
    address = cluster.start()[0]
    out: dict[str, list] = {"server_s": [], "server_fetched": [], "reference_s": [], "reference_found": []}
    readers = ThreadPoolExecutor(threads) if threads > 1 else None
    with Client([address]) as client:
        client.wait_ready()
        if not harness.wait_idle(cluster.procs[0].pid, timeout_s=120):  # compactions after the restart: done
            print("  (the restarted server was still busy after 120 s)")
        pull_batch = harness.raw_method(harness.channel(address), "PullBatch")
        db = open_reference(cluster.data_dir(0))
        try:
            cf, number = db.get_column_family(ROWS_CF), table_ids(db.get_column_family("meta"), DataLossError)["cold"]
            for k, ids in enumerate(batches):
                request, keys, before = harness.pull_batch_bytes("cold", ids), encode_keys(number, ids), misses(client)
                found, took = [], {}
                for side in ("server", "reference") if k % 2 == 0 else ("reference", "server"):
                    t = time.perf_counter()
                    if side == "server":
                        pull_batch(request)
                    else:
                        found = multi_get(cf, keys, readers, threads)
                    took[side] = time.perf_counter() - t
                if k >= warmup:
                    out["server_s"].append(took["server"])
                    out["server_fetched"].append(misses(client) - before)
                    out["reference_s"].append(took["reference"])
                    out["reference_found"].append(sum(v is not None for v in found))
        finally:
            db.close()
            if readers is not None:
                readers.shutdown()
    cluster.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--ids", type=int, default=100_000)
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1, help="requests before the timed ones, on each side")
    p.add_argument("--read-threads", type=int, default=ServerConfig.read_threads,
                   help="the server's --read-threads and the reference's threads")  # fmt: skip
    p.add_argument("--dir", default=None, help="where the data dir goes (a disk that reads with O_DIRECT)")
    args = p.parse_args()
    tune_malloc()
    base, where = harness.direct_io_dir([args.dir] if args.dir else ["/var/tmp", tempfile.gettempdir()])
    ram_rows = args.rows // 10
    cache = ram_rows * layout_of(DIM, "adagrad").ram_bytes
    batches = key_range_batches(args.rows, args.ids, args.warmup + args.reps, np.random.default_rng(1))
    root = tempfile.mkdtemp(prefix="sparseps-cold-", dir=base)
    cluster = LocalCluster(1, root=root, extra_args=["--cache-bytes", str(cache), "--direct-reads",
                                                       "--read-threads", str(args.read_threads)])  # fmt: skip
    try:
        with Client(cluster.start()) as client:
            client.wait_ready()
            client.create_table(TableConfig(name="cold", dim=DIM))
            t0 = time.perf_counter()
            g = np.full((100_000, DIM), 0.01, dtype=np.float32)
            for lo in range(0, args.rows, 100_000):
                ids = np.arange(lo, min(lo + 100_000, args.rows), dtype=np.uint64)
                client.push("cold", ids, g[: len(ids)])
        print(f"filled {args.rows:,} rows in {time.perf_counter() - t0:.1f} s (RAM tier: {cache / 2**20:.0f} MiB, "
              f"~{ram_rows:,} rows); data dir under {where}", flush=True)  # fmt: skip
        cluster.stop()  # flushes every row; the restart starts with an empty RAM tier and block cache
        m = measure(cluster, batches, args.warmup, args.read_threads)
    finally:
        cluster.cleanup()
        shutil.rmtree(root, ignore_errors=True)

    asked = [len(b) for b in batches[args.warmup :]]
    cold_rates = [f / s for f, s in zip(m["server_fetched"], m["server_s"])]
    raw_rates = [a / s for a, s in zip(asked, m["reference_s"])]
    r = {
        "table_rows": args.rows,
        "ids_per_request": int(statistics.median(asked)),
        "ram_tier_rows": ram_rows,
        "read_threads": args.read_threads,
        "data_dir": where,
        "server_fetched_per_request": statistics.median(m["server_fetched"]),
        "reference_found_per_request": statistics.median(m["reference_found"]),
        "cold_pull_ids_per_s": statistics.median(cold_rates),
        "multiget_ids_per_s": statistics.median(raw_rates),
        "reps": len(asked),
    }
    r["cold_vs_multiget"] = r["cold_pull_ids_per_s"] / r["multiget_ids_per_s"]
    mega = lambda xs: f"median {statistics.median(xs) / 1e6:.3f}M/s (min-max {min(xs) / 1e6:.3f}-{max(xs) / 1e6:.3f}M)"
    print(f"{len(asked)} requests of {r['ids_per_request']:,} ids, each from its own key range, "
          f"after {args.warmup} untimed; direct reads on both sides, which goes first alternates; "
          f"{args.read_threads} read thread(s) on both sides")  # fmt: skip
    print(f"cold pull:        {mega(cold_rates)} ids fetched from RocksDB/s "
          f"({r['server_fetched_per_request']:,.0f} fetched per request)")  # fmt: skip
    print(f"server's read:    {mega(raw_rates)} keys/s (options.multi_get), same keys, same files, the server's options "
          f"({r['reference_found_per_request']:,.0f} found per request)")  # fmt: skip
    print(f"cold / its read:  {r['cold_vs_multiget']:.0%}")
    harness.emit(r)


if __name__ == "__main__":
    sys.exit(main())

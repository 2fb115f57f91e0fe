"""Pulls from a table 10x larger than the RAM tier, next to raw rocksdict multi_get of the same ids.

    python benchmarks/cold_pull.py [--rows 1000000] [--ids 100000] [--reps 5]

One server with --cache-bytes sized to hold a tenth of the table's rows. The table (dim 16, Adagrad) is filled
by pushes, flushed, and the server restarted (an empty RAM tier); each rep pulls --ids random ids, so ~90% of
them miss RAM. The reference opens the same RocksDB files read-only afterwards and multi_gets the same keys
(built with ps.storage.store.encode_keys) in the same batch size. Target: cold pull >= 80% of raw multi_get.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from common import create_table, emit, pull_request, push_request, rate, spread, stub, timed

from ps.accel.malloc import tune_malloc
from ps.rows.layout import layout_of
from ps.storage.store import TABLE_CF_PREFIX, encode_keys
from worker.cluster import LocalCluster


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--ids", type=int, default=100_000)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    tune_malloc()
    dim, n = 16, args.ids
    cache = args.rows // 10 * layout_of(dim, "adagrad").ram_bytes
    rng = np.random.default_rng(1)
    batches = [rng.choice(args.rows, n, replace=False).astype(np.uint64) for _ in range(args.reps + 2)]
    cluster = LocalCluster(1, extra_args=["--cache-bytes", str(cache)])
    try:
        s = stub(cluster.start()[0])
        create_table(s, "cold", dim)
        t0 = time.perf_counter()
        g = np.full((100_000, dim), 0.01, dtype=np.float32)
        for lo in range(0, args.rows, 100_000):
            ids = np.arange(lo, min(lo + 100_000, args.rows), dtype=np.uint64)
            s.Push(push_request("cold", ids, g[: len(ids)]))
        print(f"filled {args.rows:,} rows in {time.perf_counter() - t0:.1f} s (RAM tier: {cache / 2**20:.0f} MiB, "
              f"~{args.rows // 10:,} rows)")  # fmt: skip
        cluster.stop()  # flushes; the restart starts with an empty RAM tier
        s = stub(cluster.start()[0])
        reqs = iter([pull_request("cold", b) for b in batches])
        cold_s = timed(lambda: s.Pull(next(reqs)), args.reps)
        stats = s.Stats(__import__("protos.ps_pb2", fromlist=["x"]).StatsRequest()).tables[0]
        cluster.stop()

        from rocksdict import AccessType, Options, Rdict

        opts = Options(raw_mode=True)
        path = cluster.data_dir(0)
        db = Rdict(path, opts, column_families=dict.fromkeys(Rdict.list_cf(path, opts), opts),
                   access_type=AccessType.read_only())  # fmt: skip
        cf = db.get_column_family(TABLE_CF_PREFIX + "cold")
        keys = iter([encode_keys(b) for b in batches])
        raw_s = timed(lambda: cf.get(next(keys)), args.reps)
        db.close()
    finally:
        cluster.cleanup()

    r = {
        "table_rows": args.rows,
        "ids_per_request": n,
        "ram_tier_rows": args.rows // 10,
        "cache_misses": int(stats.cache_misses),
        "cold_pull_ids_per_s": rate(n, cold_s),
        "multiget_ids_per_s": rate(n, raw_s),
    }
    r["cold_vs_multiget"] = r["cold_pull_ids_per_s"] / r["multiget_ids_per_s"]
    print(f"cold pull:          {spread(n, cold_s)} ids/s ({stats.cache_misses:,} RocksDB reads in all)")
    print(f"raw multi_get:      {spread(n, raw_s)} keys/s, same ids, same files")
    print(f"cold / multi_get:   {r['cold_vs_multiget']:.0%}")
    emit(r)


if __name__ == "__main__":
    sys.exit(main())

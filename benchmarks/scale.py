"""Fill one server to N rows (dim 16, Adagrad), then report RSS, disk bytes per row, and pull/push throughput
under a Zipf-like access pattern.

    python benchmarks/scale.py --rows 1000000      (also 10000000 and 100000000; the last takes ~10 min, ~16 GB)

The table is filled by pushes of 100,000 new ids (the trainable path, not a bulk load). Then the server is
restarted (its clean shutdown flushes every dirty row), so throughput is measured on a quiescent server, not
one busy flushing: one process serving 100,000-id requests whose ids follow Zipf(1.1) over the N rows
(deduplicated; 8 such requests, warmed once, then repeated).
Targets: RSS <= --cache-bytes + 1 GiB; disk <= 1.5x the raw row bytes; hot throughput at 10^8 rows within
2x of 10^6.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from common import (
    create_table,
    dir_bytes,
    emit,
    pull_request,
    push_request,
    rate,
    rss_bytes,
    spread,
    stub,
    timed,
    zipf_ids,
)

from ps.__main__ import parse_bytes
from ps.accel.malloc import tune_malloc
from ps.rows.layout import KEY_BYTES, layout_of
from worker.cluster import LocalCluster

BATCH = 100_000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=float, required=True)
    p.add_argument("--cache-bytes", type=parse_bytes, default="2G")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    tune_malloc()
    rows, dim = int(args.rows), 16
    lay = layout_of(dim, "adagrad")
    rng = np.random.default_rng(2)
    cluster = LocalCluster(1, extra_args=["--cache-bytes", str(args.cache_bytes)])
    try:
        s = stub(cluster.start()[0])
        pid = cluster.procs[0].pid
        create_table(s, "big", dim)
        g = rng.standard_normal((BATCH, dim)).astype(np.float32)  # random rows: no flattering compression
        t0, next_report = time.perf_counter(), 0.1
        for lo in range(0, rows, BATCH):
            ids = np.arange(lo, min(lo + BATCH, rows), dtype=np.uint64)
            s.Push(push_request("big", ids, g[: len(ids)]), timeout=600)
            if (lo + BATCH) / rows >= next_report:
                done = min(lo + BATCH, rows)
                print(f"  filled {done:,} rows ({done / (time.perf_counter() - t0):,.0f} rows/s), "
                      f"RSS {rss_bytes(pid) / 2**30:.2f} GiB", flush=True)  # fmt: skip
                next_report += 0.1
        fill_s = time.perf_counter() - t0
        rss_filled = rss_bytes(pid)
        t1 = time.perf_counter()
        cluster.stop()  # the clean shutdown flushes every dirty row; measure a quiescent server, not its flusher
        s = stub(cluster.start()[0])
        pid = cluster.procs[0].pid
        restart_s = time.perf_counter() - t1
        batches = [np.unique(zipf_ids(rng, BATCH, rows)) for _ in range(8)]
        for b in batches:
            s.Pull(pull_request("big", b), timeout=600)  # warm: the hot set is admitted
        pulls = [pull_request("big", b) for b in batches]
        pushes = [push_request("big", b, rng.standard_normal((len(b), dim)).astype(np.float32)) for b in batches]
        k = iter(range(10**9))
        pull_s = timed(lambda: s.Pull(pulls[next(k) % 8], timeout=600), args.reps)
        push_s = timed(lambda: s.Push(pushes[next(k) % 8], timeout=600), args.reps)
        unique = int(np.mean([len(b) for b in batches]))
        rss = max(rss_filled, rss_bytes(pid))
        cluster.stop()  # clean shutdown: dirty rows flushed, journal trimmed
        disk = dir_bytes(cluster.data_dir(0))
    finally:
        cluster.cleanup()
    raw = KEY_BYTES + lay.value_bytes
    r = {
        "rows": rows,
        "cache_bytes": args.cache_bytes,
        "fill_rows_per_s": rows / fill_s,
        "rss_bytes": rss,
        "restart_s": restart_s,
        "disk_bytes": disk,
        "disk_bytes_per_row": disk / rows,
        "raw_bytes_per_row": raw,
        "unique_ids_per_request": unique,
        "zipf_pull_ids_per_s": rate(unique, pull_s),
        "zipf_push_ids_per_s": rate(unique, push_s),
    }
    print(f"{rows:,} rows, dim {dim}, adagrad; RAM tier budget {args.cache_bytes / 2**30:.2f} GiB")
    print(f"fill:  {r['fill_rows_per_s']:,.0f} rows/s ({fill_s:.0f} s)")
    print(f"RSS:   {rss / 2**30:.2f} GiB at most (budget + 1 GiB = {(args.cache_bytes + 2**30) / 2**30:.2f} GiB)")
    print(f"restart (flush every dirty row, stop, start): {restart_s:.0f} s")
    print(f"disk:  {disk / rows:.1f} bytes/row, raw row {raw} bytes -> {disk / rows / raw:.2f}x")
    print(f"zipf pull: {spread(unique, pull_s)} ids/s ({unique:,} unique ids per request)")
    print(f"zipf push: {spread(unique, push_s)} ids/s")
    emit(r)


if __name__ == "__main__":
    sys.exit(main())

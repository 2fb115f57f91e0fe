"""One server filled to N rows (dim 16, Adagrad): its peak RSS, disk bytes per row, and PullBatch / PushBatch
throughput under Zipf-distributed requests drawn afresh for every call.

    python benchmarks/scale.py --rows 1000000      (also 10000000, and 100000000: ~16 GB on disk)

The table is filled by Client.push of 100,000 new ids at a time (the trainable path, not a bulk load). Then the
server is stopped (its clean shutdown flushes every dirty row) and started again, so throughput is measured on a
server that is not busy flushing the fill. Every timed call draws 100,000 new ids with Zipf(1.1) frequencies over
all N ids (harness.zipf_ids; rank r is id r) and sends the unique ones, sorted, as one PullBatch, and the next
call as one PushBatch of random gradients (request bytes built before the call, reply unparsed; pulls and pushes
alternate). No request is repeated. The restarted server's RAM tier starts empty and, at the report's sizes
(--cache-bytes 2G: about 8 million rows of dim 16), the timed calls do not fill it: a call's misses (ids read
from RocksDB, from the page cache) are ids no call since the restart has touched, not rows the tier evicted, so
the rates are those of a server warming up after a restart, not of one whose table outgrew its RAM tier (that
is benchmarks/miss_path.py). The misses per call and the evictions (the table's Stats, read between calls,
untimed) are printed and in the JSON. Rates are unique ids per second, medians of the calls after --warmup.
Peak RSS is the largest VmHWM (/proc/PID/status) of the filling and the serving processes, read before each
stops; disk bytes are every file in the data dir after the final clean stop.
Targets: peak RSS <= --cache-bytes + 1 GiB; disk <= 1.5x the raw row bytes; Zipf throughput at 10^8 rows within
2x of 10^6 (two runs; benchmarks/report.py compares the sizes it runs).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time

import harness  # before numpy: see its docstring
import numpy as np

from ps.accel.malloc import tune_malloc
from ps.cli_server_flags import parse_bytes
from ps.config import TableConfig
from ps.rows.layout import KEY_BYTES, layout_of
from worker.client import Client
from worker.cluster import LocalCluster

BATCH = 100_000
DIM = 16


def fill(cluster: LocalCluster, rows: int, rng: np.random.Generator) -> tuple[float, int]:
    """Pushes rows new ids, BATCH at a time; (seconds, the filling server's peak RSS)."""
    pid = cluster.procs[0].pid
    g = rng.standard_normal((BATCH, DIM)).astype(np.float32)  # random rows: no flattering compression
    with Client(cluster.addresses, timeout_s=600) as client:
        client.wait_ready()
        client.create_table(TableConfig(name="big", dim=DIM))
        t0, next_report = time.perf_counter(), 0.1
        for lo in range(0, rows, BATCH):
            ids = np.arange(lo, min(lo + BATCH, rows), dtype=np.uint64)
            client.push("big", ids, g[: len(ids)])
            if (lo + BATCH) / rows >= next_report:
                done = min(lo + BATCH, rows)
                print(f"  filled {done:,} rows ({done / (time.perf_counter() - t0):,.0f} rows/s), "
                      f"RSS {harness.rss_bytes(pid) / 2**30:.2f} GiB", flush=True)  # fmt: skip
                next_report += 0.1
    return time.perf_counter() - t0, harness.peak_rss_bytes(pid)


def table_counts(client: Client) -> tuple[int, int]:
    """(cache_misses, evictions) of the table "big" so far (Stats)."""
    table = next(t for t in client.stats()[0].tables if t.name == "big")
    return int(table.cache_misses), int(table.evictions)


def zipf_calls(address: str, rows: int, reps: int, warmup: int, rng: np.random.Generator) -> dict[str, list]:
    """Alternated PullBatch and PushBatch calls of fresh Zipf ids; per call after warmup: unique ids, seconds,
    ids read from RocksDB (misses); and the table's evictions over the whole run."""
    ch = harness.channel(address)
    pull_batch, push_batch = harness.raw_method(ch, "PullBatch"), harness.raw_method(ch, "PushBatch")
    client_id = secrets.randbits(63) | 1
    out: dict[str, list] = {f"{kind}_{x}": [] for kind in ("pull", "push") for x in ("ids", "s", "misses")}
    with Client([address], timeout_s=600) as client:
        evictions0 = table_counts(client)[1]
        for k in range(warmup + reps):
            zipf_pair(client, pull_batch, push_batch, client_id, k, rows, rng, out if k >= warmup else None)
        out["evictions"] = [table_counts(client)[1] - evictions0]
    return out


def zipf_pair(client: Client, pull_batch, push_batch, client_id: int, k: int, rows: int, rng: np.random.Generator,
              out: dict[str, list] | None) -> None:  # fmt: skip
    """Pull k, then push k, of fresh Zipf ids; recorded in out unless it is None."""
    for kind in ("pull", "push"):
        ids = np.unique(harness.zipf_ids(rng, BATCH, rows))
        if kind == "pull":
            call, request = pull_batch, harness.pull_batch_bytes("big", ids)
        else:
            grads = (rng.standard_normal((len(ids), DIM)) * 0.01).astype(np.float32)
            body = harness.push_batch_body("big", ids, grads)
            call, request = push_batch, body + harness.push_batch_tail(client_id, k + 1)
        misses0 = table_counts(client)[0]
        t = time.perf_counter()
        call(request, timeout=600)
        took = time.perf_counter() - t
        if out is not None:
            out[f"{kind}_ids"].append(len(ids))
            out[f"{kind}_s"].append(took)
            out[f"{kind}_misses"].append(table_counts(client)[0] - misses0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=float, required=True)
    p.add_argument("--cache-bytes", type=parse_bytes, default="2G")
    p.add_argument("--reps", type=int, default=30, help="timed pulls, and as many pushes")
    p.add_argument("--warmup", type=int, default=5, help="pulls and pushes before the timed ones")
    args = p.parse_args()
    tune_malloc()
    rows = int(args.rows)
    lay = layout_of(DIM, "adagrad")
    rng = np.random.default_rng(2)
    cluster = LocalCluster(1, extra_args=["--cache-bytes", str(args.cache_bytes)])
    try:
        cluster.start()
        fill_s, peak_fill = fill(cluster, rows, rng)
        t1 = time.perf_counter()
        cluster.stop()  # the clean shutdown flushes every dirty row; measure a server that is not flushing them
        address = cluster.start()[0]
        pid = cluster.procs[0].pid
        restart_s = time.perf_counter() - t1
        calls = zipf_calls(address, rows, args.reps, args.warmup, rng)
        peak_serve = harness.peak_rss_bytes(pid)
        cluster.stop()  # clean shutdown: dirty rows flushed, journal trimmed
        disk = harness.dir_bytes(cluster.data_dir(0))
    finally:
        cluster.cleanup()
    raw = KEY_BYTES + lay.value_bytes
    pull_rates = [n / s for n, s in zip(calls["pull_ids"], calls["pull_s"])]
    push_rates = [n / s for n, s in zip(calls["push_ids"], calls["push_s"])]
    r = {
        "rows": rows,
        "cache_bytes": args.cache_bytes,
        "fill_rows_per_s": rows / fill_s,
        "peak_rss_bytes": max(peak_fill, peak_serve),
        "peak_rss_fill_bytes": peak_fill,
        "peak_rss_serve_bytes": peak_serve,
        "restart_s": restart_s,
        "disk_bytes": disk,
        "disk_bytes_per_row": disk / rows,
        "raw_bytes_per_row": raw,
        "unique_ids_per_request": statistics.median(calls["pull_ids"] + calls["push_ids"]),
        "zipf_pull_ids_per_s": statistics.median(pull_rates),
        "zipf_push_ids_per_s": statistics.median(push_rates),
        "misses_per_pull": statistics.median(calls["pull_misses"]),
        "misses_per_push": statistics.median(calls["push_misses"]),
        "evictions": calls["evictions"][0],
        "reps": len(pull_rates),
    }
    gib = lambda b: f"{b / 2**30:.2f} GiB"
    mega = lambda xs: f"median {statistics.median(xs) / 1e6:.2f}M/s (min-max {min(xs) / 1e6:.2f}-{max(xs) / 1e6:.2f}M)"
    print(f"{rows:,} rows, dim {DIM}, adagrad; RAM tier budget {gib(args.cache_bytes)}")
    print(f"fill:      {r['fill_rows_per_s']:,.0f} rows/s ({fill_s:.0f} s)")
    print(f"peak RSS:  {gib(r['peak_rss_bytes'])} (filling {gib(peak_fill)}, serving {gib(peak_serve)}; "
          f"budget + 1 GiB = {gib(args.cache_bytes + 2**30)})")  # fmt: skip
    print(f"restart (flush every dirty row, stop, start): {restart_s:.0f} s")
    print(f"disk:      {disk / rows:.1f} bytes/row, raw row {raw} bytes -> {disk / rows / raw:.2f}x")
    print(f"zipf pull: {mega(pull_rates)} ids/s, fresh requests of ~{r['unique_ids_per_request']:,.0f} unique ids, "
          f"{len(pull_rates)} calls")  # fmt: skip
    print(f"zipf push: {mega(push_rates)} ids/s")
    print(f"misses (ids read from RocksDB) per call, median: pull {r['misses_per_pull']:,.0f}, push "
          f"{r['misses_per_push']:,.0f}; evictions during the calls: {r['evictions']:,} (0: the RAM tier never "
          "filled, and the misses are ids first touched since the restart)")  # fmt: skip
    harness.emit(r)


if __name__ == "__main__":
    sys.exit(main())

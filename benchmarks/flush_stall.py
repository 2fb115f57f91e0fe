"""How long pushes take while the flusher writes dirty rows to RocksDB, next to the same pushes with no flush running.

    python benchmarks/flush_stall.py [--rows 1000000] [--ids 100000] [--chunk-rows 8192] [--pause-s 0.0005]

One in-process shard (no gRPC: the table lock is what is measured) holds --rows hot rows of dim 16 (Adagrad), all
of them dirty. One thread pushes --ids random ids at a time (8 such sets, drawn once, in turn), without pause;
first for two seconds with no flush (the reference), then while Shard.flush() writes every dirty row. The flusher takes the table lock for
--chunk-rows rows at a time (ps.engine.table.FLUSH_CHUNK_ROWS) and pauses --pause-s between holds
(FLUSH_PAUSE_S) so that a waiting push gets in; other values show what the chunk and the pause buy. This is the
foreground flush (a shutdown's, a checkpoint's): the background flusher's flush(background=True) also waits, before
each chunk, for a moment without requests, at most 50 ms (ps/storage/foreground.py), which this does not measure.
No fixed target: it reports the median and the worst push during the flush beside the median with none.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import harness  # before numpy: see its docstring
import numpy as np

import ps.engine.table
from ps.accel.malloc import tune_malloc
from ps.config import TableConfig
from ps.engine.shard import Shard
from ps.server_config import ServerConfig


def push_latencies(shard: Shard, batches: list[np.ndarray], grads: np.ndarray, until: threading.Event,
                   out: list[float]) -> None:  # fmt: skip
    """Pushes batches in turn until `until` is set, appending each push's seconds to out as it finishes."""
    k = 0
    while not until.is_set():
        t = time.perf_counter()
        shard.push("hot", batches[k % len(batches)], grads)
        out.append(time.perf_counter() - t)
        k += 1


def timed_pushes(shard: Shard, batches: list[np.ndarray], grads: np.ndarray,
                 during: Callable[[], object]) -> tuple[list[float], float]:  # fmt: skip
    """Latencies of the pushes that started while during() ran on this thread, and how long during() took."""
    stop, got = threading.Event(), []
    pusher = threading.Thread(target=push_latencies, args=(shard, batches, grads, stop, got))
    pusher.start()
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:  # the pusher is under way: its first push is done
        time.sleep(0.01)
    if not got:
        stop.set()
        raise RuntimeError("the pusher did not finish a push within 60 s")
    skip = len(got) + 1  # the push under way now started before during()
    t = time.perf_counter()
    during()
    took = time.perf_counter() - t
    stop.set()
    pusher.join()
    return got[skip:], took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--ids", type=int, default=100_000)
    p.add_argument("--chunk-rows", type=int, default=ps.engine.table.FLUSH_CHUNK_ROWS)
    p.add_argument("--pause-s", type=float, default=ps.engine.table.FLUSH_PAUSE_S)
    args = p.parse_args()
    tune_malloc()
    ps.engine.table.FLUSH_CHUNK_ROWS, ps.engine.table.FLUSH_PAUSE_S = args.chunk_rows, args.pause_s
    rng = np.random.default_rng(0)
    n, dim = args.ids, 16
    grads = (rng.standard_normal((n, dim)) * 0.01).astype(np.float32)
    batches = [rng.choice(args.rows, n, replace=False).astype(np.uint64) for _ in range(8)]
    with tempfile.TemporaryDirectory() as d:
        config = ServerConfig(data_dir=d, cache_bytes=4 << 30, flush_interval_s=3600, journal_flush_bytes=1 << 62)
        shard = Shard(config)  # the flusher never fires on its own: only the timed flush writes rows
        try:
            shard.create_table(TableConfig(name="hot", dim=dim))
            for lo in range(0, args.rows, n):  # every row in RAM and dirty
                ids = np.arange(lo, min(lo + n, args.rows), dtype=np.uint64)
                shard.push("hot", ids, grads[: len(ids)])
            quiet, _ = timed_pushes(shard, batches, grads, lambda: time.sleep(2.0))
            flushed = []
            during, flush_s = timed_pushes(shard, batches, grads, lambda: flushed.append(shard.flush()))
        finally:
            shard.close()
    ms = lambda xs: 1e3 * np.asarray(xs)
    r = {
        "ids_per_push": n,
        "rows_flushed": flushed[0],
        "flush_chunk_rows": args.chunk_rows,
        "flush_pause_s": args.pause_s,
        "flush_s": flush_s,
        "push_ms_median_no_flush": float(np.median(ms(quiet))),
        "push_ms_median_during_flush": float(np.median(ms(during))),
        "push_ms_max_during_flush": float(ms(during).max()),
        "pushes_during_flush": len(during),
    }
    print(
        f"{n:,}-id pushes, {args.rows:,} dirty rows, flushed {args.chunk_rows:,} rows per hold of the table lock, "
        f"{args.pause_s * 1e3:g} ms pause between holds"
    )
    print(f"no flush running: median {r['push_ms_median_no_flush']:.1f} ms per push ({len(quiet)} pushes)")
    print(f"during a {flush_s:.2f} s flush of {flushed[0]:,} rows: median {r['push_ms_median_during_flush']:.1f} ms, "
          f"max {r['push_ms_max_during_flush']:.1f} ms ({len(during)} pushes)")  # fmt: skip
    harness.emit(r)


if __name__ == "__main__":
    sys.exit(main())

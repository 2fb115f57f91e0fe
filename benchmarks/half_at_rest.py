"""Embeddings at rest as float16 against float32: the AUC a table of values_at_rest "float16" trains to, and its
bytes per row in RocksDB, on the planted-model data with a RAM tier that holds a fraction of the rows.

    python benchmarks/half_at_rest.py [--rows 300000] [--eval-rows 100000] [--shards 2] [--cache-bytes 4M]

Each run (table_variant.py) starts --shards fresh server processes (worker.cluster.LocalCluster) with --cache-bytes
each, and trains one epoch of an FM (numpy backend, recipe "large": batch 2048, learning rate 0.02, adagrad,
embedding dim 8, so table `fm` has dim 9) on --rows synthetic rows; values_at_rest is chosen with a table config
file (`ps-worker train --table-config`), as a user would. The RAM tier holds a fraction of the table, so most rows
are evicted to RocksDB and read back while training, each time through float16 in the float16 run: the AUC
difference is what the rounding costs. One run per setting, float32 first (training is deterministic: one worker,
seeded data). Per setting:

    eval AUC       on --eval-rows held-out rows, next to the planted model's (the oracle)
    read back      rows read back from RocksDB while training: the ids looked up there (Stats cache_misses) less
                   the rows trained (each row's first lookup, on fresh servers, finds no row there)
    disk B/row     RocksDB files (*.sst) after the servers stop, per trained row, with the layout's estimate
                   (uncompressed, as the server writes its blocks: ps.storage.options.rocksdb_options)

and, in the JSON line only, examples/s (one run each, the first paying for compiling the loops: not a comparison).

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import harness  # before numpy: see its docstring
from table_variant import TABLE, train_variant

from ps.accel.malloc import tune_malloc
from ps.rows.layout import layout_of
from worker.train_config import TrainConfig

SETTINGS = ("float32", "float16")
OPTIMIZER = "adagrad"


def one_run(cfg: TrainConfig, values_at_rest: str, shards: int, cache_bytes: str, tmp: str) -> dict:
    """Trains and evaluates cfg with the sparse table's values_at_rest on fresh servers; its figures."""
    keys = (f'values_at_rest = "{values_at_rest}"\n'
            f'optimizer = {{ name = "{OPTIMIZER}", learning_rate = {cfg.learning_rate} }}\n')  # fmt: skip
    run = train_variant(cfg, values_at_rest, keys, shards, tmp, server_args=["--cache-bytes", cache_bytes],
                        check=lambda t: t.values_at_rest == values_at_rest)  # fmt: skip
    stats = run.trained_stats  # before the evaluation's reads
    rows = sum(t.num_rows for t in stats)
    lay = layout_of(run.table.dim, OPTIMIZER, values_at_rest)
    misses = sum(t.cache_misses for t in stats)
    return {
        "values_at_rest": values_at_rest,
        "dim": run.table.dim,
        "examples_per_s": run.examples_per_s,
        "misses": misses,
        "evictions": sum(t.evictions for t in stats),
        "read_back": misses - rows,
        **run.scores,
        "rows": rows,
        "value_bytes": lay.value_bytes,
        "disk_bytes_per_row": run.sst_bytes / max(1, rows),
        "layout_disk_bytes_per_row": lay.disk_bytes,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--eval-rows", type=int, default=100_000)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--cache-bytes", default="4M", help="each server's --cache-bytes: its RAM tier")
    args = p.parse_args()
    tune_malloc()
    cfg = TrainConfig(model="fm", backend="numpy", synthetic_rows=args.rows, synthetic_eval_rows=args.eval_rows,
                      recipe="large", epochs=1, learning_rate=0.02, progress=False)  # fmt: skip
    runs = {}
    with tempfile.TemporaryDirectory(prefix="sparseps-half-") as tmp:
        for setting in SETTINGS:
            runs[setting] = r = one_run(cfg, setting, args.shards, args.cache_bytes, tmp)
            print(f"{setting:<8} eval AUC {r['eval_auc']:.6f}", flush=True)
    first = runs[SETTINGS[0]]
    print(f"FM (numpy), {args.rows:,} synthetic rows, one epoch, recipe large, learning rate 0.02, "
          f"{OPTIMIZER}, table {TABLE} dim {first['dim']}, {args.shards} shards of --cache-bytes {args.cache_bytes}; "
          f"oracle AUC {first['oracle_auc']:.4f}")  # fmt: skip
    print(f"{'at rest':<8} {'eval AUC':>9} {'- oracle':>8} {'rows':>9} {'read back':>10} {'value B':>7} "
          f"{'disk B/row':>10} {'(layout)':>8}")  # fmt: skip
    for s, r in runs.items():
        print(f"{s:<8} {r['eval_auc']:>9.6f} {r['eval_auc'] - r['oracle_auc']:>+8.4f} {r['rows']:>9,} "
              f"{r['read_back']:>10,} {r['value_bytes']:>7} {r['disk_bytes_per_row']:>10.1f} "
              f"{r['layout_disk_bytes_per_row']:>8}")  # fmt: skip
    half, full = runs["float16"], runs["float32"]
    print(f"float16 / float32: disk per row {half['disk_bytes_per_row'] / full['disk_bytes_per_row']:.2f}, AUC "
          f"{half['eval_auc'] - full['eval_auc']:+.1e}")  # fmt: skip
    harness.emit({"rows": args.rows, "shards": args.shards, "cache_bytes": args.cache_bytes,
                  "oracle_auc": first["oracle_auc"], **{s: dict(r) for s, r in runs.items()}})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rows per byte against AUC: the FM's embedding table trained with adagrad (an accumulator per dim) and with
adagrad_rowwise (one accumulator per row), on the same planted-model data with the same settings, in one run.

    python benchmarks/compact_rows.py [--rows 300000] [--eval-rows 100000] [--shards 2] [--repeats 2]

Each run (table_variant.py) starts --shards fresh server processes (worker.cluster.LocalCluster) and trains one
epoch of an FM (numpy backend, recipe "large": batch 2048, learning rate 0.02, embedding dim 8, so table `fm` has
dim 9) on --rows synthetic rows; the optimizer is chosen with a table config file
(`ps-worker train --table-config`), as a user would. The runs alternate, --repeats times each; the AUC and bytes
are the first run's (one worker trains the same rows in every run), examples/s is the median over the runs (a
shared machine's speed varies). Per optimizer:

    eval AUC       on --eval-rows held-out rows, next to the planted model's (the oracle)
    RAM B/row      the arena's bytes per row: Stats ram_bytes / rows_in_ram, summed over shards, with the
                   layout's figure (ps/rows/layout.py: line and index) beside it
    disk B/row     RocksDB files (*.sst) after the servers stop, per trained row, with the layout's estimate
                   (uncompressed, as the server writes its blocks: ps.storage.options.rocksdb_options)
    examples/s     training examples over the training time (evaluation excluded)

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

import harness  # before numpy: see its docstring
from table_variant import TABLE, train_variant

from ps.accel.malloc import tune_malloc
from ps.rows.layout import layout_of
from worker.train_config import TrainConfig

OPTIMIZERS = ("adagrad", "adagrad_rowwise")


def one_run(cfg: TrainConfig, optimizer: str, shards: int, tmp: str) -> dict:
    """Trains and evaluates cfg with `optimizer` for the sparse table on fresh servers; its figures."""
    keys = f'optimizer = {{ name = "{optimizer}", learning_rate = {cfg.learning_rate} }}\n'
    run = train_variant(cfg, optimizer, keys, shards, tmp, check=lambda t: t.optimizer.name == optimizer)
    stats = run.evaluated_stats
    rows = sum(t.num_rows for t in stats)
    lay = layout_of(run.table.dim, optimizer)
    return {
        "optimizer": optimizer,
        "dim": run.table.dim,
        "batch_size": run.batch_size,
        "examples_per_s": run.examples_per_s,
        **run.scores,
        "rows": rows,
        "ram_bytes_per_row": sum(t.ram_bytes for t in stats) / max(1, sum(t.rows_in_ram for t in stats)),
        "layout_ram_bytes_per_row": lay.ram_bytes,
        "disk_bytes_per_row": run.sst_bytes / max(1, rows),
        "layout_disk_bytes_per_row": lay.disk_bytes,
        "floats_per_row": lay.width,
    }


def summary(runs: list[dict]) -> dict:
    """The first run's figures with examples/s the median over the runs."""
    return {**runs[0], "examples_per_s": statistics.median(r["examples_per_s"] for r in runs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--eval-rows", type=int, default=100_000)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="runs per optimizer, alternated; median examples/s")
    args = p.parse_args()
    tune_malloc()
    cfg = TrainConfig(model="fm", backend="numpy", synthetic_rows=args.rows, synthetic_eval_rows=args.eval_rows,
                      recipe="large", epochs=1, learning_rate=0.02, progress=False)  # fmt: skip
    runs: dict[str, list[dict]] = {o: [] for o in OPTIMIZERS}
    with tempfile.TemporaryDirectory(prefix="sparseps-compact-") as tmp:
        for rep in range(args.repeats):  # alternated: a change in the machine's speed hits both
            for optimizer in OPTIMIZERS:
                r = one_run(cfg, optimizer, args.shards, tmp)
                runs[optimizer].append(r)
                print(f"run {rep + 1} {optimizer:<16} {r['examples_per_s']:>9,.0f} examples/s  eval AUC "
                      f"{r['eval_auc']:.4f}", flush=True)  # fmt: skip
    best = {o: summary(rs) for o, rs in runs.items()}
    first = best[OPTIMIZERS[0]]
    print(f"FM (numpy), {args.rows:,} synthetic rows, one epoch at batch {first['batch_size']}, learning rate "
          f"0.02, table {TABLE} dim {first['dim']}, {args.shards} shards; oracle AUC {first['oracle_auc']:.4f}")  # fmt: skip
    print(f"{'optimizer':<16} {'eval AUC':>8} {'- oracle':>8} {'floats':>6} {'RAM B/row':>9} {'(layout)':>8} "
          f"{'disk B/row':>10} {'(layout)':>8} {'rows':>9} {'examples/s':>10}")  # fmt: skip
    for o, r in best.items():
        print(f"{o:<16} {r['eval_auc']:>8.4f} {r['eval_auc'] - r['oracle_auc']:>+8.4f} {r['floats_per_row']:>6} "
              f"{r['ram_bytes_per_row']:>9.1f} {r['layout_ram_bytes_per_row']:>8} {r['disk_bytes_per_row']:>10.1f} "
              f"{r['layout_disk_bytes_per_row']:>8} {r['rows']:>9,} {r['examples_per_s']:>10,.0f}")  # fmt: skip
    rw, ada = best["adagrad_rowwise"], best["adagrad"]
    print(f"adagrad_rowwise / adagrad: RAM per row {rw['ram_bytes_per_row'] / ada['ram_bytes_per_row']:.2f}, disk "
          f"per row {rw['disk_bytes_per_row'] / ada['disk_bytes_per_row']:.2f}, AUC "
          f"{rw['eval_auc'] - ada['eval_auc']:+.4f}, examples/s {rw['examples_per_s'] / ada['examples_per_s']:.2f}")  # fmt: skip
    harness.emit({"rows": args.rows, "shards": args.shards, "repeats": args.repeats, "oracle_auc": first["oracle_auc"],
                  **{o: {k: v for k, v in r.items() if k != "optimizer"} for o, r in best.items()},
                  "runs_examples_per_s": {o: [r["examples_per_s"] for r in rs] for o, rs in runs.items()}})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

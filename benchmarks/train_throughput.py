"""Examples/s of DeepFM training against 2 local server processes, next to the same model trained in one
process on the server's table code called directly (no RPC), on the same data, in the same run.

    python benchmarks/train_throughput.py [--rows 200000] [--backend numpy] [--hidden 400,400,400]

Both runs use worker.train.run_epochs on the synthetic data (planted linear model), batch 2048, embedding dim 8,
Adagrad for the sparse table and Adam for the MLP, dense sync every step and one batch of prefetch. The in-process
reference is worker.inprocess.InProcessTables (a Shard in this process: RAM tier, optimizer, journal; no gRPC, no
serialization, no second process). Target: the PS run at >= 0.8 of the in-process rate. Each run also reports
the eval AUC next to the oracle's, to show both trained the same model.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from common import emit

from ps.wire import tune_malloc
from worker.client import Client
from worker.cluster import LocalCluster
from worker.dense import DenseSync
from worker.inprocess import InProcessTables
from worker.train import DataSource, TrainConfig, evaluate, make_backend, run_epochs, table_configs


def one_run(tables, cfg: TrainConfig) -> dict:
    data = DataSource(cfg)
    spec = data.spec()
    backend = make_backend(spec, cfg)
    for t in table_configs(cfg, spec):
        tables.create_table(t)
    dense = DenseSync(tables, spec.dense_params(), cfg.dense_sync_every)
    dense.pull()
    examples, seconds, _ = run_epochs(tables, spec, backend, dense, data, cfg)
    r = {"examples": examples, "seconds": seconds, "examples_per_s": examples / seconds}
    r.update(evaluate(tables, spec, backend, dense.pull(), data.eval()))
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--eval-rows", type=int, default=50_000)
    p.add_argument("--backend", default="numpy", choices=["numpy", "torch"])
    p.add_argument("--hidden", default="400,400,400")
    p.add_argument("--shards", type=int, default=2)
    args = p.parse_args()
    tune_malloc()
    cfg = TrainConfig(
        model="deepfm", backend=args.backend, synthetic_rows=args.rows, synthetic_eval_rows=args.eval_rows,
        hidden=tuple(int(h) for h in args.hidden.split(",")), progress=False,
    )  # fmt: skip
    with LocalCluster(args.shards) as cluster, Client(cluster.addresses) as client:
        client.wait_ready()
        ps = one_run(client, dataclasses.replace(cfg, servers=tuple(cluster.addresses)))
    with InProcessTables() as tables:
        local = one_run(tables, cfg)
    ratio = ps["examples_per_s"] / local["examples_per_s"]
    print(f"DeepFM ({args.backend}, hidden {args.hidden}), {args.rows:,} synthetic rows, batch {cfg.batch_size}")
    print(f"against {args.shards} server processes: {ps['examples_per_s']:,.0f} examples/s   eval AUC {ps['eval_auc']:.4f}")
    print(f"in-process tables:        {local['examples_per_s']:,.0f} examples/s   eval AUC {local['eval_auc']:.4f}")
    print(f"oracle AUC {ps['oracle_auc']:.4f}; PS / in-process = {ratio:.2f} (target >= 0.8)")
    emit({
        "model": "deepfm", "backend": args.backend, "rows": args.rows, "shards": args.shards,
        "ps_examples_per_s": ps["examples_per_s"], "inprocess_examples_per_s": local["examples_per_s"],
        "ps_vs_inprocess": ratio, "ps_eval_auc": ps["eval_auc"], "inprocess_eval_auc": local["eval_auc"],
        "oracle_auc": ps["oracle_auc"],
    })  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

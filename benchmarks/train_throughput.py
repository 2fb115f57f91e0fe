"""Examples/s of DeepFM training against local server processes, next to the same model trained in one process on
the server's table code called directly (no RPC), on the same data, in the same run.

    python benchmarks/train_throughput.py [--rows 200000] [--backend numpy] [--hidden 400,400,400] [--repeats 3]

Both runs use worker.loop.run_epochs on the synthetic data (planted linear model), batch 2048, embedding dim 8,
Adagrad for the sparse table and Adam for the MLP, dense sync every step and one batch of prefetch; the PS run
talks to --shards server processes through worker.client.Client. The in-process reference is
tests.inprocess.InProcessTables (a Shard in this process: RAM tier, optimizer, journal; no gRPC, no
serialization, no second process). The two runs alternate --repeats times and their medians are compared, since
the speed of a shared machine changes from one run to the next more than a single pair's ratio can show.
Before each run, every server kernel it uses runs once on look-alike tables (warm_up), so neither run times the
loading of compiled code. Each run also reports the eval AUC next to the oracle's, to show both trained the same
model.
Target: the PS run at >= 0.8 of the in-process rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import harness  # before numpy: see its docstring
import numpy as np

from ps.accel.malloc import tune_malloc
from ps.config import TableConfig
from tests.inprocess import InProcessTables
from worker.client import Client
from worker.cluster import LocalCluster
from worker.dense import DenseSync
from worker.job import loop_settings, make_backend, prepare
from worker.loop import run_epochs
from worker.model_tables import table_configs
from worker.scoring import evaluate
from worker.train_config import TrainConfig


def warm_up(tables: Client | InProcessTables, configs: list[TableConfig]) -> None:
    """Runs every server kernel the training will use once, on tables of the same configs under other names, so
    that neither run times the loading of compiled code (fresh server processes load theirs at their first
    push and pull; the in-process tables only in the first run): a few pushes that return their rows, and a pull."""
    ids = np.arange(1, 65, dtype=np.uint64)
    for cfg in configs:
        name = "warmup." + cfg.name
        tables.create_table(dataclasses.replace(cfg, name=name))
        grads = np.full((len(ids), cfg.dim), 1e-3, dtype=np.float32)
        for _ in range(2):
            tables.push_many([(name, ids, grads, np.zeros(len(ids)), np.ones(len(ids)))], advance_clock=1,
                             return_rows=True)  # fmt: skip
        tables.pull(name, ids)


def one_run(tables: Client | InProcessTables, cfg: TrainConfig) -> dict:
    cfg, data, spec, _ = prepare(cfg, needs_servers=False)
    backend = make_backend(spec, cfg)
    configs = table_configs(cfg, spec, data.schema.table_overrides())
    warm_up(tables, configs)
    for t in configs:
        tables.create_table(t)
    dense = DenseSync(tables, spec.dense_params(), cfg.dense_sync_every)
    dense.pull()
    loop = run_epochs(tables, spec, backend, dense, data.train, loop_settings(cfg, data))
    r = {
        "examples": loop.examples,
        "seconds": loop.seconds,
        "examples_per_s": loop.examples / loop.seconds,
        "batch_size": cfg.batch_size,
        "optimizer": cfg.optimizer,
        "learning_rate": cfg.learning_rate,
    }  # the recipe's
    r.update(evaluate(tables, spec, backend, dense.pull(), data.eval()))
    return r


def _median_run(runs: list[dict]) -> dict:
    """The run with the median examples/s (the upper middle one for an even count)."""
    return sorted(runs, key=lambda r: r["examples_per_s"])[len(runs) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--eval-rows", type=int, default=50_000)
    p.add_argument("--backend", default="numpy", choices=["numpy", "torch"])
    p.add_argument("--hidden", default="400,400,400")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="PS and in-process runs, alternated; medians compared")
    args = p.parse_args()
    tune_malloc()
    cfg = TrainConfig(
        model="deepfm", backend=args.backend, synthetic_rows=args.rows, synthetic_eval_rows=args.eval_rows,
        hidden=tuple(int(h) for h in args.hidden.split(",")), recipe="large", progress=False,
    )  # fmt: skip
    ps_runs, local_runs = [], []

    def ps_run() -> None:
        with LocalCluster(args.shards) as cluster, Client(cluster.addresses) as client:
            client.wait_ready()
            ps_runs.append(one_run(client, dataclasses.replace(cfg, servers=tuple(cluster.addresses))))

    def local_run() -> None:
        with InProcessTables() as tables:
            local_runs.append(one_run(tables, cfg))

    for rep in range(args.repeats):  # alternated, each first in every other pair, so a change in the machine's
        for run in (ps_run, local_run)[:: -1 if rep % 2 else 1]:  # speed during the run hits both alike
            run()
        print(
            f"run {rep + 1}: PS {ps_runs[-1]['examples_per_s']:,.0f}, in-process {local_runs[-1]['examples_per_s']:,.0f} "
            f"examples/s ({ps_runs[-1]['examples_per_s'] / local_runs[-1]['examples_per_s']:.2f})",
            flush=True,
        )
    ps, local = _median_run(ps_runs), _median_run(local_runs)
    ratio = ps["examples_per_s"] / local["examples_per_s"]
    print(
        f"DeepFM ({args.backend}, hidden {args.hidden}), {args.rows:,} synthetic rows, batch {ps['batch_size']}, "
        f"sparse {ps['optimizer']} {ps['learning_rate']}, median of {args.repeats} alternated runs each"
    )
    print(
        f"against {args.shards} server processes: {ps['examples_per_s']:,.0f} examples/s   eval AUC {ps['eval_auc']:.4f}"
    )
    print(f"in-process tables:        {local['examples_per_s']:,.0f} examples/s   eval AUC {local['eval_auc']:.4f}")
    print(f"oracle AUC {ps['oracle_auc']:.4f}; PS / in-process = {ratio:.2f} (target >= 0.8)")
    harness.emit({
        "model": "deepfm", "backend": args.backend, "rows": args.rows, "shards": args.shards,
        "batch_size": ps["batch_size"],
        "ps_examples_per_s": ps["examples_per_s"], "inprocess_examples_per_s": local["examples_per_s"],
        "ps_vs_inprocess": ratio, "ps_eval_auc": ps["eval_auc"], "inprocess_eval_auc": local["eval_auc"],
        "oracle_auc": ps["oracle_auc"], "repeats": args.repeats,
        "ps_runs_examples_per_s": [r["examples_per_s"] for r in ps_runs],
        "inprocess_runs_examples_per_s": [r["examples_per_s"] for r in local_runs],
    })  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

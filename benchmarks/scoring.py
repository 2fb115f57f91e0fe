"""Rows/s of `ps-worker eval` and `predict` (worker/train.py evaluate_servers, worker/predict.py predict_servers)
with the next batches read and pulled ahead while one is scored (--prefetch 1) and each batch in turn (0).

    python benchmarks/scoring.py [--rows 1000000] [--shards 2] [--rtt-ms 0,5] [--repeats 3]

An FM (dim 8) is trained on 50,000 synthetic Criteo rows on --shards local server processes; the next --rows
synthetic rows, written to a Criteo file, are then scored by eval and by predict, the two --prefetch settings
alternating --repeats times (harness.alternate: the speed of a shared machine changes between runs). --rtt-ms:
each list entry is a run in which every pull_many first sleeps that many milliseconds, a stand-in for servers
across a network (local shards answer in well under a millisecond, so on a machine whose cores the shards share
the overlap has little wait to hide). Each run checks that both settings give the same AUC, logloss and
predictions file, byte for byte.
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import os
import tempfile
import time

import harness  # before numpy: see its docstring

import worker.client as client_module
from worker.cluster import LocalCluster
from worker.predict import PredictConfig, predict_servers
from worker.served import evaluate_servers
from worker.synthetic import SyntheticConfig
from worker.synthetic_files import write_synthetic
from worker.train import train
from worker.train_config import TrainConfig

TRAIN_ROWS = 50_000


def with_rtt(rtt_ms: float) -> None:
    """Every Client.pull_many sleeps rtt_ms first (0: as it is)."""
    real = getattr(client_module.Client.pull_many, "__wrapped__", client_module.Client.pull_many)

    def slowed(self, *args, **kwargs):
        time.sleep(rtt_ms / 1e3)
        return real(self, *args, **kwargs)

    slowed.__wrapped__ = real
    client_module.Client.pull_many = slowed if rtt_ms else real


def scoring_legs(base: TrainConfig, scored: str, tmp: str, depth: int, figures: dict) -> list:
    """The eval leg (its figures kept in figures[depth]) and the predict leg (to tmp/p{depth}.csv) of --prefetch
    depth."""
    cfg = dataclasses.replace(base, eval_data=scored, prefetch=depth)
    out = os.path.join(tmp, f"p{depth}.csv")
    evaluate = harness.Leg(f"eval {depth}", lambda _: figures.update({depth: evaluate_servers(cfg)}))
    predict = harness.Leg(f"predict {depth}", lambda _: predict_servers(PredictConfig(cfg, scored, out, overwrite=True,
                                                                                      progress=False)))  # fmt: skip
    return [evaluate, predict]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--rtt-ms", default="0,5", help="comma-separated: a run per entry")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    result: dict = {"benchmark": "scoring", "rows": args.rows, "shards": args.shards}
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(args.shards) as cluster:
        data, scored = os.path.join(tmp, "train.tsv"), os.path.join(tmp, "score.tsv")
        synthetic = SyntheticConfig(rows=TRAIN_ROWS)
        write_synthetic(data, synthetic, 0, TRAIN_ROWS)
        write_synthetic(scored, synthetic, TRAIN_ROWS, TRAIN_ROWS + args.rows)
        base = TrainConfig(servers=tuple(cluster.addresses), data=data, model="fm", recipe="large", progress=False)
        train(base)
        for rtt in [float(x) for x in args.rtt_ms.split(",")]:
            with_rtt(rtt)
            figures: dict[int, dict] = {}
            legs = [leg for depth in (1, 0) for leg in scoring_legs(base, scored, tmp, depth, figures)]
            harness.alternate(legs, args.repeats, warmup=0)
            with_rtt(0)
            same = figures[0] == figures[1] and filecmp.cmp(*(os.path.join(tmp, f"p{d}.csv") for d in (0, 1)), False)
            print(f"pulls + {rtt:g} ms: same figures and predictions with and without prefetch: {same}")
            for leg in legs:
                print(f"  {leg.name:<10} {harness.spread(args.rows, leg.seconds).replace('M/s', 'M rows/s')}")
                result[f"{leg.name.replace(' ', '_prefetch_')}_rtt_{rtt:g}ms_rows_per_s"] = round(
                    harness.rate(args.rows, leg.seconds)
                )
            result[f"same_rtt_{rtt:g}ms"] = same
    harness.emit(result)


if __name__ == "__main__":
    main()

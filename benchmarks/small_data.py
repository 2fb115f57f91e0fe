"""Quality on small data: sparseps's small-data recipe against a tuned L2 logistic regression on the same rows.

Three regimes of the synthetic generator: the two ends of small data, "rare" (worker.synthetic.small_data_config:
~10K training rows over 10^5+ values, most seen once or twice, planted pairwise interactions) and "frequent"
(frequent_ids_config: the same rows over ~3,000 values, each seen ~120 times on average, strong weights), and
"imbalanced" (imbalanced_config: the frequent regime with weak weights and about 2.4% positives, as CTR data
mostly is). For
each regime and seed, TRAIN_ROWS training rows and TEST_ROWS test rows (or --train-rows and --test-rows) from a
disjoint range are written to files. Then, on the same files:

  reference  scikit-learn's LogisticRegression (L2, liblinear) on a one-hot encoding of the very ids sparseps
             trains on (read through the same schema; an id unseen in training has no column) plus the
             standardized numeric features; C chosen by 5-fold cross-validated AUC on the training rows over
             C_GRID, then refit on all of them.
  sparseps   `ps-worker train --data TRAIN --eval-data TEST --model M --local-shards 1`, every other setting left
             to the recipe the run picks for this size (the README's small-data recipe: batch 256 (2048 from
             100,000 rows), up to 50 epochs, each shuffled, a 10% validation split, early stopping), for M in lr, fm, deepfm.

With --against KEY=VALUE..., each model trains a second time on the same files with those settings too (the
recipe's earlier ones, say: `--train-rows 500000 --against batch_size=256`), and each line gives both runs' test
AUC, epochs and wall seconds (reading the data to the test AUC), then per regime and model the median AUC
difference and the seconds of each, over all seeds.

Then the order of a file: for one seed of each regime (--order-seed), lr and fm train on the training file and on
the same lines sorted by label, with --shuffle on (the recipe's) and off (file order); the test AUC of each, and
the sorted file's minus the unsorted one's. Sorted and read in file order, batches hold one label for long
stretches; shuffled, the order of the lines should not matter.

Prints each seed's test AUCs, then per regime and model the median over the seeds of (model AUC - reference AUC)
against the target (>= -0.005); the last line is one JSON object. Run: `python3 dev.py bench benchmarks/small_data.py`
(installs scikit-learn, the `bench` extra). Takes several minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from worker.batch import Batch
from worker.formats import read_batches
from worker.metrics import auc
from worker.schema_builtin import builtin_schema
from worker.synthetic import SyntheticConfig, small_data_config
from worker.synthetic_files import write_synthetic
from worker.train import train
from worker.train_config import TrainConfig

TRAIN_ROWS = 10_000
TEST_ROWS = 20_000
SEEDS = (1, 2, 3, 4, 5)
MODELS = ("lr", "fm", "deepfm")
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
TARGET = -0.005


def frequent_ids_config(seed: int) -> SyntheticConfig:
    """The other end of small data: TRAIN_ROWS rows over a few thousand values (vocabularies x 0.005), each seen
    often, with strong weights (std 0.5): a model that shrinks or stops too early underfits it."""
    return SyntheticConfig(rows=TRAIN_ROWS, seed=seed, vocab_scale=0.005, weight_scale=0.5)


def imbalanced_config(seed: int) -> SyntheticConfig:
    """Small data as most CTR data is: the frequent regime with weak weights (std 0.15) and a mean logit of -4,
    2.3-2.5% positives (about 240 of TRAIN_ROWS rows, 25 in the validation split), a tuned LR's AUC about 0.6."""
    return dataclasses.replace(frequent_ids_config(seed), weight_scale=0.15, bias=-4.0)


REGIMES = {"rare": small_data_config, "frequent": frequent_ids_config, "imbalanced": imbalanced_config}


def read_all(path: str) -> Batch:
    schema = builtin_schema("criteo", default_table="t", default_dim=8)
    return Batch.concat(list(read_batches(path, schema, 65536)))


def one_hot(batch: Batch, columns: dict[int, int] | None):
    """(CSR matrix: one column per training id, then the numeric features; the id -> column map)."""
    from scipy.sparse import csr_matrix, hstack

    names = [name for name in batch.fields if not name.startswith("_")]
    ids = np.stack([batch.fields[name].ids for name in names], axis=1)  # one id per field in this regime
    if columns is None:
        uniq = np.unique(ids)
        columns = dict(zip(uniq.tolist(), range(len(uniq))))
    n = len(batch)
    rows, cols = [], []
    for j in range(ids.shape[1]):
        col = np.array([columns.get(i, -1) for i in ids[:, j].tolist()])
        keep = col >= 0
        rows.append(np.flatnonzero(keep))
        cols.append(col[keep])
    r, c = np.concatenate(rows), np.concatenate(cols)
    sparse = csr_matrix((np.ones(len(r)), (r, c)), shape=(n, len(columns)))
    return hstack([sparse, csr_matrix(batch.dense_or_empty().astype(np.float64))]).tocsr(), columns


def tuned_lr(train_path: str, test_path: str) -> tuple[float, float]:
    """(test AUC of the cross-validated L2 logistic regression, the C it chose)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    train_b, test_b = read_all(train_path), read_all(test_path)
    mean, std = train_b.dense.mean(axis=0), train_b.dense.std(axis=0) + 1e-6
    train_b.dense, test_b.dense = (train_b.dense - mean) / std, (test_b.dense - mean) / std
    x, columns = one_hot(train_b, None)
    x_test, _ = one_hot(test_b, columns)
    scores = {}
    for c in C_GRID:
        model = LogisticRegression(C=c, solver="liblinear", max_iter=1000)
        scores[c] = float(np.mean(cross_val_score(model, x, train_b.labels, cv=5, scoring="roc_auc")))
    best = max(scores, key=scores.get)
    model = LogisticRegression(C=best, solver="liblinear", max_iter=1000).fit(x, train_b.labels)
    return auc(test_b.labels, model.predict_proba(x_test)[:, 1]), best


def sparseps_auc(train_path: str, test_path: str, model: str, extra: dict) -> dict:
    """{"auc": test AUC, "epochs": epochs run, "best_epoch", "stopped_early", "seconds": the run's wall time, from
    reading the data to the test AUC, "train_seconds": its training loop's} of one run."""
    cfg = TrainConfig(local_shards=1, data=train_path, eval_data=test_path, model=model, progress=False, **extra)
    started = time.perf_counter()
    r = train(cfg)
    return {"auc": r["eval_auc"], "epochs": r["epochs_run"], "best_epoch": r.get("best_epoch"),
            "stopped_early": r["stopped_early"], "seconds": time.perf_counter() - started,
            "train_seconds": r["train_seconds"]}  # fmt: skip


def write_files(tmp: str, regime: str, seed: int, rows: tuple[int, int]) -> tuple[str, str]:
    """(training file, test file) of one regime and seed, written into tmp: rows[0] training rows, then rows[1]
    test rows of the range after them (disjoint)."""
    train_rows, test_rows = rows
    cfg = dataclasses.replace(REGIMES[regime](seed), rows=train_rows)
    train_path, test_path = os.path.join(tmp, f"train{seed}.tsv"), os.path.join(tmp, f"test{seed}.tsv")
    write_synthetic(train_path, cfg, 0, train_rows)
    write_synthetic(test_path, cfg, train_rows, train_rows + test_rows)
    return train_path, test_path


def run_regime(
    regime: str,
    seeds: list[int],
    models: list[str],
    extra: dict,
    against: dict | None = None,
    rows: tuple[int, int] = (TRAIN_ROWS, TEST_ROWS),
) -> dict:
    """Every seed of one regime, `rows` (training, test) rows: the reference's and each model's test AUC, and per
    model the median gap; with `against`, each model's run with those settings too, and the median difference."""
    per_seed = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            train_path, test_path = write_files(tmp, regime, seed, rows)
            ref_auc, c = tuned_lr(train_path, test_path)
            row = {"seed": seed, "reference_auc": ref_auc, "reference_c": c}
            for m in models:
                row[m] = sparseps_auc(train_path, test_path, m, extra)
                if against is not None:
                    row[m]["against"] = sparseps_auc(train_path, test_path, m, {**extra, **against})
            per_seed.append(row)
            print(f"{regime} seed {seed}: tuned LR (C={c}) {ref_auc:.4f}  " + "  ".join(
                f"{m} {_run(row[m])}" + (f" against {_run(row[m]['against'])}" if against is not None else "")
                for m in models), flush=True)  # fmt: skip
    summary = {}
    for m in models:
        gaps = [r[m]["auc"] - r["reference_auc"] for r in per_seed]
        median = float(np.median(gaps))
        summary[m] = {"median_gap": median, "gaps": gaps, "meets_target": median >= TARGET}
        if against is not None:
            summary[m]["against"] = {
                "median_difference": float(np.median([r[m]["auc"] - r[m]["against"]["auc"] for r in per_seed])),
                "seconds": sum(r[m]["seconds"] for r in per_seed),
                "against_seconds": sum(r[m]["against"]["seconds"] for r in per_seed),
            }
    return {"per_seed": per_seed, "summary": summary}


def _run(r: dict) -> str:
    return f"{r['auc']:.4f} ({r['epochs']} ep, {r['seconds']:.0f} s)"


def order_effect(
    regime: str, seed: int, models: list[str], extra: dict, rows: tuple[int, int] = (TRAIN_ROWS, TEST_ROWS)
) -> dict:
    """{model: {"on"|"off": {"unsorted": test AUC, "sorted": test AUC}}}: --shuffle on and off, on the training
    file as written and with its lines sorted by label."""
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        train_path, test_path = write_files(tmp, regime, seed, rows)
        sorted_path = os.path.join(tmp, "sorted.tsv")
        with open(train_path) as f:
            lines = f.readlines()
        with open(sorted_path, "w") as f:
            f.writelines(sorted(lines, key=lambda line: line.split("\t", 1)[0]))  # stable: ties keep their order
        for m in models:
            out[m] = {}
            for shuffle in ("on", "off"):
                runs = {name: sparseps_auc(path, test_path, m, {**extra, "shuffle": shuffle == "on"})["auc"]
                        for name, path in (("unsorted", train_path), ("sorted", sorted_path))}  # fmt: skip
                out[m][shuffle] = runs
                print(f"{regime} seed {seed} {m} --shuffle {shuffle}: unsorted {runs['unsorted']:.4f}, sorted by "
                      f"label {runs['sorted']:.4f} ({runs['sorted'] - runs['unsorted']:+.4f})", flush=True)  # fmt: skip
    return out


def settings(pairs: list[str]) -> dict:
    """TrainConfig settings from key=value strings, each value of its field's type (a dict's as name:number pairs
    split by commas: optimizer_params=l2:1000,l1:1; a bool's true or false: mlp_output_zeros=false)."""
    out: dict = {}
    types = {f.name: str(f.type) for f in dataclasses.fields(TrainConfig)}
    for kv in pairs:
        key, value = kv.split("=", 1)
        if "dict" in types[key]:
            out[key] = {name: float(number) for name, number in (pair.split(":", 1) for pair in value.split(","))}
            continue
        if "bool" in types[key]:
            if value not in ("true", "false"):
                raise ValueError(f"{key}={value}: expected {key}=true or {key}=false")
            out[key] = value == "true"
            continue
        out[key] = tuple(int(x) for x in value.split(",")) if "tuple" in types[key] else (
            float(value) if "float" in types[key] else int(value) if "int" in types[key] else value)  # fmt: skip
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="*", default=list(SEEDS))
    p.add_argument("--models", nargs="*", default=list(MODELS))
    p.add_argument("--regimes", nargs="*", default=list(REGIMES), choices=list(REGIMES))
    p.add_argument("--set", nargs="*", default=[], help="extra TrainConfig settings, key=value (for exploring)")
    p.add_argument(
        "--against",
        nargs="*",
        default=None,
        help="TrainConfig settings, key=value, of a second run of each model, measured beside the first",
    )
    p.add_argument("--train-rows", type=int, default=TRAIN_ROWS)
    p.add_argument("--test-rows", type=int, default=TEST_ROWS)
    p.add_argument("--order-seed", type=int, default=1, help="the seed of the file-order runs (-1: none)")
    p.add_argument("--order-models", nargs="*", default=["lr", "fm"])
    args = p.parse_args()
    extra = settings(args.set)
    against = None if args.against is None else settings(args.against)
    rows = (args.train_rows, args.test_rows)
    started = time.perf_counter()
    regimes = {name: run_regime(name, args.seeds, args.models, extra, against, rows) for name in args.regimes}
    for name, r in regimes.items():
        for m, figures in r["summary"].items():
            median = figures["median_gap"]
            print(f"{name:8s} {m:7s} median AUC - tuned LR: {median:+.4f}  (target >= {TARGET}): "
                  f"{'met' if median >= TARGET else 'MISSED'}")  # fmt: skip
            if against is not None:
                a = figures["against"]
                print(f"{name:8s} {m:7s} median AUC - AUC with {' '.join(args.against)}: "
                      f"{a['median_difference']:+.4f}; {a['seconds']:.0f} s against {a['against_seconds']:.0f} s")  # fmt: skip
    order = {} if args.order_seed < 0 else {
        name: order_effect(name, args.order_seed, args.order_models, extra, rows) for name in args.regimes}  # fmt: skip
    for name, per_model in order.items():
        for m, runs in per_model.items():
            gaps = {k: v["sorted"] - v["unsorted"] for k, v in runs.items()}
            print(f"{name:8s} {m:7s} sorted by label minus unsorted: --shuffle on {gaps['on']:+.4f}, "
                  f"off {gaps['off']:+.4f}")  # fmt: skip
    out = {"benchmark": "small_data", "train_rows": args.train_rows, "test_rows": args.test_rows, "seeds": args.seeds,
           "settings": extra, "against": against, "seconds": time.perf_counter() - started, "regimes": regimes,
           "order_seed": args.order_seed, "order": order}  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

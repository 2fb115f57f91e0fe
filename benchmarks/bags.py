"""A multi-hot column end to end: DeepFM on data whose planted model reads a history bag, against the oracle.

The synthetic generator with --history writes a CSV (label, I1..I13, C1..C26, history: "|"-joined ids, some
bags empty) and the schema that reads it (history: multi_hot, mean pooling). On those files, with one local
shard per run and the settings below for every run:

  numpy    DeepFM, the full schema
  torch    DeepFM, the full schema, the torch backend (CPU)
  without  DeepFM, the same schema less the history column (the same rows, the bag unused)

and the oracle: the planted model's own probabilities on the eval rows. Targets: numpy and torch within 0.01
AUC of the oracle; `without` at least 0.005 below numpy. The last line is one JSON object.
Run: `python3 dev.py bench benchmarks/bags.py` (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from worker.metrics import auc, logloss
from worker.synthetic import SyntheticConfig, SyntheticData
from worker.synthetic_files import schema_text, write_synthetic
from worker.train import train
from worker.train_config import TrainConfig

SETTINGS = dict(model="deepfm", hidden=(64, 32), batch_size=1024, epochs=1, recipe="large")


def without_history(text: str) -> str:
    """The schema text less its history column (the [[columns]] entry named "history")."""
    entries = text.split("[[columns]]")
    kept = [e for e in entries[1:] if 'name = "history"' not in e]
    assert len(kept) == len(entries) - 2, "the schema has one history column"
    return "[[columns]]".join([entries[0], *kept])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--eval-rows", type=int, default=100_000)
    p.add_argument("--history", type=float, default=1.0)
    args = p.parse_args()
    cfg = SyntheticConfig(rows=args.rows, history=args.history)
    started = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        train_path, eval_path = os.path.join(tmp, "train.csv"), os.path.join(tmp, "eval.csv")
        write_synthetic(train_path, cfg, 0, args.rows)
        write_synthetic(eval_path, cfg, args.rows, args.rows + args.eval_rows)
        full, less = os.path.join(tmp, "full.toml"), os.path.join(tmp, "less.toml")
        with open(full, "w") as f:
            f.write(schema_text(cfg))
        with open(less, "w") as f:
            f.write(without_history(schema_text(cfg)))
        data = SyntheticData(cfg)
        batches = list(data.batches(65536, args.rows, args.rows + args.eval_rows))
        y = np.concatenate([b.labels for b in batches])
        q = np.concatenate([b.probs for b in batches])
        results["oracle"] = {"auc": auc(y, q), "logloss": logloss(y, q)}
        for name, backend, schema in (("numpy", "numpy", full), ("torch", "torch", full), ("without", "numpy", less)):
            r = train(TrainConfig(local_shards=1, data=train_path, eval_data=eval_path, schema=schema, backend=backend,
                                  progress=False, **SETTINGS))  # fmt: skip
            results[name] = {"auc": r["eval_auc"], "logloss": r["eval_logloss"], "examples_per_s": r["examples_per_s"]}
            print(f"{name:8s} AUC {r['eval_auc']:.4f}  logloss {r['eval_logloss']:.4f}  "
                  f"{r['examples_per_s']:,.0f} examples/s", flush=True)  # fmt: skip
    oracle = results["oracle"]["auc"]
    checks = {
        "numpy_within_0.01_of_oracle": oracle - results["numpy"]["auc"] <= 0.01,
        "torch_within_0.01_of_oracle": oracle - results["torch"]["auc"] <= 0.01,
        "without_history_0.005_lower": results["numpy"]["auc"] - results["without"]["auc"] >= 0.005,
    }
    print(f"oracle   AUC {oracle:.4f}")
    for k, ok in checks.items():
        print(f"{k}: {'met' if ok else 'MISSED'}")
    print(json.dumps({"benchmark": "bags", "rows": args.rows, "eval_rows": args.eval_rows, "history": args.history,
                      "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in SETTINGS.items()},
                      "results": results, "checks": checks, "seconds": time.perf_counter() - started}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""sparseps against what a user would pick instead while the table fits in RAM: the same DNN in plain PyTorch, in
one process, on the same rows, in the same run.

    python benchmarks/vs_pytorch.py [--rows 300000] [--test-rows 50000] [--repeats 2] [--sparseps-args "..."]

Data: write_synthetic (worker/synthetic_files.py; the planted linear model: worker/synthetic.py; seed --seed) writes --rows training rows
and --test-rows test rows (the next range) as Criteo files. Both systems read the same ids: the built-in criteo
schema's, features.example_ids (13 bucketed integer fields and 26 categorical fields, plus the bias id), checked here
against the generator's ids, and its 13 numeric features log(1 + x).

The model, in both (worker/models/spec.py, model dnn): 40 fields (the 39 above and the bias) x embedding dim 10,
concatenated with the 13 numeric features (413 inputs), an MLP 400-400-400-1 with ReLU, batch 1000, one epoch
in file order, loss the sum of the batch's logloss (sparseps' convention, which its optimizers' steps assume).
Sparse Adagrad at the large-data recipe's learning rate (worker/recipe.py) with sparseps' initial accumulator and
epsilon (ps/config.py OPTIMIZER_PARAMS, the rule of ps/rows/optim.py), embeddings initialized uniform in +-0.01;
dense Adam (lr 0.001, sparseps' betas and epsilon), weights Glorot-uniform, biases 0.

  plain PyTorch  a child process of this script: `nn.Embedding(num_ids, 10, sparse=True)` over the ids remapped to
                 0..num_ids-1 (np.unique over the train and test ids, computed before timing starts),
                 torch.optim.Adagrad (sparse gradients, duplicates summed) and torch.optim.Adam; torch's default
                 thread count, which is what sparseps' torch worker runs with (it never sets one); the user's
                 environment, without the thread-wait settings that importing sparseps' worker package adds.
  sparseps       `python -m worker train --model dnn --backend torch --recipe large --local-shards 2 ...` on the
                 files, as a subprocess; its examples/s and test AUC from --metrics-out. One run per variant:
                 the extra flags of each --sparseps-args (default: DEFAULT_VARIANTS). A variant using a flag that
                 `ps-worker train --help` does not list is skipped with a note.

The runs alternate (plain, each variant, plain, ...) --repeats times, since this 2-core machine's speed varies
by +-20% from one run to the next; medians are compared. Prints a table (examples/s median and per run, test AUC,
ratio to plain PyTorch), the parameter counts of both models, the planted model's (oracle) AUC, and the target:
the best sparseps variant at >= 0.6 x plain PyTorch's examples/s, with test AUCs within about 0.01. The last line
is one JSON object with every figure. Run: `python3 dev.py bench benchmarks/vs_pytorch.py`; the default run takes a
few minutes on 2 cores. To compare more sparseps settings, add entries to DEFAULT_VARIANTS (`--dense allreduce`,
`--dense-staleness 4`) or give --sparseps-args once per variant.

Caveats, read the figures with them:
- The two timed loops do different work. Plain PyTorch's starts from index tensors in memory; sparseps' includes
  reading and hashing the file, deduplicating each batch's ids, and a pull and a push per step to 2 server
  processes, which share the machine's 2 cores with the worker. The ratio is the price of the parameter server
  where one process would do; it says nothing of what sparseps is for (tables beyond one machine's RAM, many
  workers), which one PyTorch process does not attempt.
- The synthetic data's Zipf-distributed values give a small table (about 80,000 ids at the default size, a few
  MB), which stays in cache for both; the planted model is linear, so the MLP has little to find beyond it.
- examples/s counts the training loop only: sparseps' server start-up, table creation and evaluation are outside
  it (each run's wall time is in the JSON), as plain PyTorch's start-up and data loading are.
- Plain PyTorch's table has a row for every id of the train and test data; sparseps creates rows for pushed
  (training) ids only and serves test-only ids their initial value. Both score such ids with an untrained initial
  row, drawn by different generators, so the AUCs differ by that noise as well as by float rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported at run time inside main(), after the user's environment is taken
    from worker.models.spec import FieldSpec, ModelSpec
    from worker.schema import Schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# one run of sparseps per entry: its extra `ps-worker train` flags
DEFAULT_VARIANTS = ("--dense ps", "--dense allreduce")
EMBEDDING_DIM = 10
HIDDEN = (400, 400, 400)
BATCH_SIZE = 1000
PLAIN = "plain PyTorch"
TARGET = 0.6  # the best variant's examples/s over plain PyTorch's
AUC_TOLERANCE = 0.01
CHECKED_ROWS = 4096  # rows whose ids read through the schema are compared with the generator's


def write_data(tmp: str, rows: int, test_rows: int, seed: int) -> tuple[str, str, float]:
    """(train file, test file, the planted model's AUC on the test rows)."""
    from worker.metrics import auc
    from worker.synthetic import SyntheticConfig, SyntheticData
    from worker.synthetic_files import write_synthetic

    cfg = SyntheticConfig(rows=rows, seed=seed)
    train, test = os.path.join(tmp, "train.tsv"), os.path.join(tmp, "test.tsv")
    write_synthetic(train, cfg, 0, rows)
    write_synthetic(test, cfg, rows, rows + test_rows)
    truth = SyntheticData(cfg).raw(rows, rows + test_rows)
    return train, test, auc(truth.labels, truth.probs)


def read_features(
    path: str, schema: Schema, fields: tuple[FieldSpec, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids uint64 (n, len(fields)) in the model's field order, numeric features float32 (n, 13), labels float32)
    of a file read through the schema sparseps reads it with."""
    from worker.formats import read_batches

    ids, dense, labels = [], [], []
    for batch in read_batches(path, schema, 65536):
        columns = []
        for f in fields:
            bags = batch.fields[f.name]
            if len(bags.ids) != len(batch):
                raise ValueError(f"{path}: field {f.name} has {len(bags.ids)} ids for {len(batch)} examples")
            columns.append(bags.ids)
        ids.append(np.stack(columns, axis=1))
        dense.append(batch.dense_or_empty())
        labels.append(batch.labels)
    return np.concatenate(ids), np.concatenate(dense), np.concatenate(labels)


def check_ids(train_ids: np.ndarray, rows: int, seed: int) -> None:
    """ValueError unless the first rows' ids equal the generator's (features.example_ids), column for column."""
    from worker.synthetic import SyntheticConfig, SyntheticData

    n = min(CHECKED_ROWS, rows)
    expected = SyntheticData(SyntheticConfig(rows=rows, seed=seed)).raw(0, n).ids
    if expected.shape != train_ids[:n].shape or not np.array_equal(expected, train_ids[:n]):
        raise ValueError(f"the schema's ids of the first {n} rows differ from features.example_ids'")


def remap(train_ids: np.ndarray, test_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(train rows int64, test rows int64, num_ids over both, distinct ids in train): each id's row in 0..num_ids-1."""
    uniq, inverse = np.unique(np.concatenate([train_ids.ravel(), test_ids.ravel()]), return_inverse=True)
    inverse = inverse.reshape(-1).astype(np.int64)
    split = train_ids.size
    train_rows, test_rows = inverse[:split].reshape(train_ids.shape), inverse[split:].reshape(test_ids.shape)
    return train_rows, test_rows, len(uniq), len(np.unique(train_rows))


# ---- plain PyTorch: the child process ------------------------------------------------------------------------
def plain_torch(job_path: str) -> None:
    """The child: trains the job's model on its arrays, writes the test probabilities and the timing. Imports only
    numpy and torch: nothing of sparseps runs in it."""
    import torch
    import torch.nn.functional as F

    with open(job_path) as f:
        job = json.load(f)
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    torch.manual_seed(job["seed"])
    data = np.load(job["arrays"])
    train_rows, train_x, train_y = (torch.from_numpy(data[k]) for k in ("train_rows", "train_dense", "train_labels"))
    test_rows, test_x = torch.from_numpy(data["test_rows"]), torch.from_numpy(data["test_dense"])
    dim, num_fields = job["dim"], train_rows.shape[1]
    embedding = torch.nn.Embedding(job["num_ids"], dim, sparse=True)
    torch.nn.init.uniform_(embedding.weight, -job["init_scale"], job["init_scale"])
    widths = [num_fields * dim + train_x.shape[1], *job["hidden"], 1]
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        linear = torch.nn.Linear(a, b)
        torch.nn.init.xavier_uniform_(linear.weight)  # uniform in +-sqrt(6 / (in + out)): spec's "glorot"
        torch.nn.init.zeros_(linear.bias)
        layers += [linear] if i == len(widths) - 2 else [linear, torch.nn.ReLU()]
    mlp = torch.nn.Sequential(*layers)
    ada, adam = job["adagrad"], job["adam"]
    sparse_opt = torch.optim.Adagrad(embedding.parameters(), lr=job["learning_rate"],
                                     initial_accumulator_value=ada["initial_accumulator"], eps=ada["epsilon"])  # fmt: skip
    dense_opt = torch.optim.Adam(mlp.parameters(), lr=job["dense_learning_rate"],
                                 betas=(adam["beta1"], adam["beta2"]), eps=adam["epsilon"])  # fmt: skip

    def logits(rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return mlp(torch.cat([embedding(rows).reshape(len(rows), -1), x], dim=1))[:, 0]

    n, batch = len(train_y), job["batch_size"]
    started = time.perf_counter()
    for lo in range(0, n, batch):
        hi = min(lo + batch, n)
        loss = F.binary_cross_entropy_with_logits(logits(train_rows[lo:hi], train_x[lo:hi]), train_y[lo:hi],
                                                  reduction="sum")  # fmt: skip
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
    seconds = time.perf_counter() - started
    with torch.no_grad():
        probs = torch.cat([torch.sigmoid(logits(test_rows[i : i + 8192], test_x[i : i + 8192]))
                           for i in range(0, len(test_rows), 8192)])  # fmt: skip
    np.save(job["probs_out"], probs.numpy())
    result = {"examples": n, "seconds": seconds, "threads": torch.get_num_threads(),
              "embedding_params": embedding.weight.numel(), "mlp_params": sum(p.numel() for p in mlp.parameters())}  # fmt: skip
    with open(job["result_out"], "w") as f:
        json.dump(result, f)


def run_plain(job: dict, env: dict[str, str], test_labels: np.ndarray) -> dict:
    """One plain PyTorch run in a fresh child process; its figures, the test AUC computed here."""
    from ps.terminate import how_it_ended
    from worker.metrics import auc, logloss

    with open(job["job_path"], "w") as f:
        json.dump(job, f)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "plain-torch", job["job_path"]], env=env,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the plain PyTorch run {how_it_ended(done.returncode)}:\n{done.stdout}{done.stderr}")
    with open(job["result_out"]) as f:
        r = json.load(f)
    probs = np.load(job["probs_out"])
    r.update(examples_per_s=r["examples"] / r["seconds"], wall_s=time.perf_counter() - started,
             eval_auc=auc(test_labels, probs), eval_logloss=logloss(test_labels, probs))  # fmt: skip
    return r


# ---- sparseps ------------------------------------------------------------------------------------------------
def train_help() -> str:
    from ps.terminate import how_it_ended

    done = subprocess.run([sys.executable, "-m", "worker", "train", "--help"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`python -m worker train --help` {how_it_ended(done.returncode)}:\n{done.stderr}")
    return done.stdout


def unlisted_flags(variant: str, help_text: str) -> list[str]:
    """The flags (--name or --name=value) of a variant's arguments that help_text does not list."""
    flags = [arg.split("=", 1)[0] for arg in shlex.split(variant) if arg.startswith("--")]
    return [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", help_text)]


def run_sparseps(train: str, test: str, variant: str, settings: dict, out: str) -> dict:
    """One `python -m worker train` run with the variant's extra flags; its figures from --metrics-out."""
    from ps.terminate import how_it_ended

    metrics = os.path.join(out, "metrics.json")
    command = [sys.executable, "-m", "worker", "train", "--data", train, "--eval-data", test, "--model", "dnn",
               "--embedding-dim", str(settings["dim"]), "--hidden", ",".join(map(str, settings["hidden"])),
               "--batch-size", str(settings["batch_size"]), "--optimizer", "adagrad",
               "--learning-rate", str(settings["learning_rate"]), "--epochs", "1", "--recipe", "large",
               "--backend", "torch", "--local-shards", str(settings["shards"]), "--metrics-out", metrics,
               "--no-progress", *shlex.split(variant)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} {how_it_ended(done.returncode)}:\n{done.stdout}{done.stderr}")
    with open(metrics) as f:
        m = json.load(f)
    keys = ("examples_per_s", "train_examples", "train_seconds", "eval_auc", "eval_logloss", "table_rows")
    return {"wall_s": time.perf_counter() - started, **{k: m[k] for k in keys}}


# ---- the run -------------------------------------------------------------------------------------------------
@dataclass
class Prepared:
    """The data of a run: the files sparseps reads, and the arrays plain PyTorch reads (rows remapped)."""

    train: str
    test: str
    arrays: str  # .npz: train_rows, train_dense, train_labels, test_rows, test_dense
    test_labels: np.ndarray
    num_ids: int
    train_ids: int  # distinct ids in the training rows
    oracle_auc: float


def prepare(tmp: str, rows: int, test_rows: int, seed: int, schema: Schema, spec: ModelSpec) -> Prepared:
    """Writes the files, reads them back through the schema and remaps their ids (all before any timing)."""
    started = time.perf_counter()
    train, test, oracle_auc = write_data(tmp, rows, test_rows, seed)
    train_ids, train_dense, train_labels = read_features(train, schema, spec.fields)
    test_ids, test_dense, test_labels = read_features(test, schema, spec.fields)
    check_ids(train_ids, rows, seed)
    train_index, test_index, num_ids, train_distinct = remap(train_ids, test_ids)
    arrays = os.path.join(tmp, "arrays.npz")
    np.savez(arrays, train_rows=train_index, train_dense=train_dense, train_labels=train_labels,
             test_rows=test_index, test_dense=test_dense)  # fmt: skip
    print(f"data: {rows:,} training rows, {test_rows:,} test rows, {len(spec.fields)} fields; {num_ids:,} distinct "
          f"ids ({train_distinct:,} in training); prepared in {time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    return Prepared(train, test, arrays, test_labels, num_ids, train_distinct, oracle_auc)


def runnable_variants(requested: list[str]) -> list[str]:
    """The requested variants whose flags `ps-worker train --help` lists; a note for each of the others."""
    help_text, out = train_help(), []
    for v in requested:
        missing = unlisted_flags(v, help_text)
        if missing:
            print(f"skipping sparseps variant {v!r}: `ps-worker train --help` does not list {', '.join(missing)}")
        else:
            out.append(v)
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=300_000, help="training rows")
    p.add_argument("--test-rows", type=int, default=50_000)
    p.add_argument("--repeats", type=int, default=2, help="runs of each system, alternated; medians compared")
    p.add_argument("--seed", type=int, default=0, help="of the synthetic data and of plain PyTorch's initial values")
    p.add_argument("--learning-rate", type=float, default=None, help="sparse Adagrad's (default: the large recipe's)")
    p.add_argument("--shards", type=int, default=2, help="sparseps' --local-shards")
    p.add_argument("--threads", type=int, default=0, help="plain PyTorch's torch threads (0: torch's default)")
    p.add_argument("--sparseps-args", action="append", default=None, metavar="ARGS",
                   help=f"one sparseps variant: extra `ps-worker train` flags (repeat for more; default {list(DEFAULT_VARIANTS)})")  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    user_env = dict(os.environ)  # before worker is imported, which sets how torch's threads wait (worker/__init__.py)
    args = parse_args(argv)
    sys.path.insert(0, ROOT)
    import harness  # imports worker: after user_env was taken

    from ps.config import OPTIMIZER_PARAMS, InitializerConfig
    from worker.dense import DEFAULT_OPTIMIZER
    from worker.models.spec import ModelSpec
    from worker.recipe import LARGE
    from worker.schema_builtin import builtin_schema

    schema = builtin_schema("criteo", default_table="dnn", default_dim=EMBEDDING_DIM)  # what `train` builds
    spec = ModelSpec("dnn", schema.model_fields(), len(schema.dense_columns()), HIDDEN)
    settings = {"dim": EMBEDDING_DIM, "hidden": list(HIDDEN), "batch_size": BATCH_SIZE, "shards": args.shards,
                "learning_rate": LARGE.learning_rate if args.learning_rate is None else args.learning_rate}  # fmt: skip
    variants = runnable_variants(args.sparseps_args if args.sparseps_args is not None else list(DEFAULT_VARIANTS))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vs_pytorch-") as tmp:
        data = prepare(tmp, args.rows, args.test_rows, args.seed, schema, spec)
        job = {**settings, "arrays": data.arrays, "num_ids": data.num_ids, "seed": args.seed, "threads": args.threads,
               "init_scale": InitializerConfig().scale, "adagrad": OPTIMIZER_PARAMS["adagrad"],
               "adam": OPTIMIZER_PARAMS["adam"], "dense_learning_rate": DEFAULT_OPTIMIZER.learning_rate,
               "job_path": os.path.join(tmp, "job.json"), "probs_out": os.path.join(tmp, "probs.npy"),
               "result_out": os.path.join(tmp, "plain.json")}  # fmt: skip
        runs: dict[str, list[dict]] = {PLAIN: [], **{f"sparseps {v}".strip(): [] for v in variants}}
        systems = [PLAIN, *variants]
        for rep in range(args.repeats):  # alternated, each system first in turn, so a change in the machine's speed
            for v in systems[rep % len(systems) :] + systems[: rep % len(systems)]:  # hits every system alike
                if v == PLAIN:
                    runs[PLAIN].append(run_plain(job, user_env, data.test_labels))
                    continue
                out = os.path.join(tmp, f"sparseps-{rep}")
                os.makedirs(out, exist_ok=True)
                runs[f"sparseps {v}".strip()].append(run_sparseps(data.train, data.test, v, settings, out))
            print(f"run {rep + 1}: " + ", ".join(f"{name} {r[-1]['examples_per_s']:,.0f}" for name, r in runs.items())
                  + " examples/s", flush=True)  # fmt: skip
    result = report(runs, spec, data, args, settings)
    result["seconds"] = time.perf_counter() - started
    harness.emit(result)
    return 0


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Prints a line per system (median examples/s, each run's, median test AUC, ratio to plain PyTorch's)."""
    plain = statistics.median(r["examples_per_s"] for r in runs[PLAIN])
    print(f"{'system':34s} {'examples/s':>11s}  {'each run':24s} {'test AUC':>8s}  {'x plain':>7s}")
    summary = {}
    for name, rs in runs.items():
        rate, auc = statistics.median(r["examples_per_s"] for r in rs), statistics.median(r["eval_auc"] for r in rs)
        each = ", ".join(f"{r['examples_per_s']:,.0f}" for r in rs)
        print(f"{name:34s} {rate:>11,.0f}  {each:24s} {auc:>8.4f}  {rate / plain:>7.2f}")
        summary[name] = {"examples_per_s": rate, "eval_auc": auc, "vs_plain": rate / plain, "runs": rs}
    return summary


def model_checks(runs: dict[str, list[dict]], spec: ModelSpec, data: Prepared, dim: int) -> dict[str, bool]:
    """Prints both models' parameter counts; {check: passed}: the MLPs have as many parameters, and every sparseps
    run trained one row per distinct training id, as plain PyTorch's table trains those rows."""
    mlp = sum(int(np.prod(p.shape)) for p in spec.dense_params() if p.name.startswith("mlp."))
    plain_mlp = runs[PLAIN][0]["mlp_params"]
    print(f"parameters: {PLAIN} {data.num_ids:,} rows x {dim} ({data.train_ids:,} of them ids in training) + MLP "
          f"{plain_mlp:,} (torch threads: {runs[PLAIN][0]['threads']}); sparseps' model: MLP {mlp:,}")  # fmt: skip
    checks = {"mlp_params_equal": plain_mlp == mlp}
    for name, rs in runs.items():
        if name != PLAIN:
            rows = [r["table_rows"] for r in rs]
            print(f"  {name}: trained rows {', '.join(f'{x:,}' for x in rows)} x {dim} (expected {data.train_ids:,}:"
                  " one per id in training)")  # fmt: skip
            checks[f"{name}: trained_rows_equal"] = all(x == data.train_ids for x in rows)
    return checks


def report(runs: dict[str, list[dict]], spec: ModelSpec, data: Prepared, args: argparse.Namespace,
           settings: dict) -> dict:  # fmt: skip
    """Prints the table, the parameter counts and the target; returns every figure."""
    print(f"\nDNN {len(spec.fields)} fields x {settings['dim']} + {spec.num_dense} numeric, MLP "
          f"{'-'.join(map(str, HIDDEN))}, batch {BATCH_SIZE}, sparse Adagrad {settings['learning_rate']}, dense Adam; "
          f"{args.rows:,} training rows, {args.test_rows:,} test rows; median of {args.repeats} alternated runs")  # fmt: skip
    summary = summarize(runs)
    print(f"{'oracle (the planted model)':34s} {'':>11s}  {'':24s} {data.oracle_auc:>8.4f}")
    checks = model_checks(runs, spec, data, settings["dim"])
    variants = {k: v for k, v in summary.items() if k != PLAIN}
    best = max(variants, key=lambda k: variants[k]["examples_per_s"]) if variants else None
    if best is not None:
        b, plain_auc = variants[best], summary[PLAIN]["eval_auc"]
        checks["auc_within_tolerance"] = abs(b["eval_auc"] - plain_auc) <= AUC_TOLERANCE
        print(f"target: {best} at {b['vs_plain']:.2f} x {PLAIN}'s examples/s (target >= {TARGET}): "
              f"{'met' if b['vs_plain'] >= TARGET else 'MISSED'}; test AUC {b['eval_auc']:.4f} vs {plain_auc:.4f} "
              f"({b['eval_auc'] - plain_auc:+.4f}, expected within {AUC_TOLERANCE})")  # fmt: skip
    failed = [k for k, ok in checks.items() if not ok]
    print("checks: " + (f"FAILED {', '.join(failed)}" if failed else f"all passed ({', '.join(checks)})"))
    return {"benchmark": "vs_pytorch", "rows": args.rows, "test_rows": args.test_rows, "repeats": args.repeats,
            "seed": args.seed, "settings": settings, "num_ids": data.num_ids, "train_ids": data.train_ids,
            "mlp_params": sum(int(np.prod(p.shape)) for p in spec.dense_params() if p.name.startswith("mlp.")),
            "plain_mlp_params": runs[PLAIN][0]["mlp_params"], "oracle_auc": data.oracle_auc, "target": TARGET,
            "best_variant": best, "best_vs_plain": variants[best]["vs_plain"] if best else None,
            "meets_target": bool(best and variants[best]["vs_plain"] >= TARGET), "checks": checks,
            "systems": summary}  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["plain-torch"]:
        plain_torch(sys.argv[2])
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))

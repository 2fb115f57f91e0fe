"""The training loop: pull a batch's rows, forward/backward locally, push the gradients; then evaluate.

    for each batch:  rows = client.pull(table, ids)            # (n * fields, dim), deduped and routed
                     probs, grads = model.forward_backward(rows, labels)
                     client.push(table, ids, grads)            # duplicates summed, then the server optimizer
Evaluation pulls only. With synthetic data the planted model's probabilities give the oracle AUC and logloss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from ps.config import OptimizerConfig, TableConfig, table_configs_from_toml
from worker.client import Client
from worker.cluster import LocalCluster
from worker.criteo import read_criteo
from worker.metrics import RunningMean, auc, logloss
from worker.models import MODELS, Model
from worker.synthetic import SyntheticConfig, SyntheticData

log = logging.getLogger("worker.train")


@dataclass(frozen=True)
class TrainConfig:
    servers: tuple[str, ...] = ()
    local_shards: int = 2
    data: str | None = None
    eval_data: str | None = None
    synthetic_rows: int = 2_000_000
    synthetic_eval_rows: int = 100_000
    synthetic_interactions: float = 0.0
    synthetic_seed: int = 0
    model: str = "fm"
    embedding_dim: int = 8
    optimizer: str = "adagrad"
    learning_rate: float = 0.05
    batch_size: int = 2048
    epochs: int = 1
    timeout_s: float = 60.0
    table_config: str | None = None  # TOML: overrides the model table's initializer, optimizer, admission, ...
    metrics_out: str | None = None
    progress: bool = True

    def validate(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"--model {self.model!r} is unknown; expected one of {sorted(MODELS)}")
        if self.eval_data and not self.data:
            raise ValueError("--eval-data needs --data (without --data the run uses synthetic data)")
        for path in (self.data, self.eval_data):
            if path and not os.path.isfile(path):
                raise ValueError(f"data file {path} does not exist")
        if self.batch_size < 1 or self.epochs < 1:
            raise ValueError("--batch-size and --epochs must be >= 1")
        if not self.servers and self.local_shards < 1:
            raise ValueError("give --servers, or --local-shards >= 1")
        if self.table_config and not os.path.isfile(self.table_config):
            raise ValueError(f"table config {self.table_config} does not exist")


class DataSource:
    """Train and eval batches from files or from the synthetic generator; `total` training examples."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.synthetic = None
        if cfg.data is None:
            self.synthetic = SyntheticData(
                SyntheticConfig(rows=cfg.synthetic_rows, seed=cfg.synthetic_seed, interactions=cfg.synthetic_interactions)
            )
            self.total = cfg.synthetic_rows
        else:
            self.total = count_lines(cfg.data)

    def train(self):
        if self.synthetic is not None:
            return self.synthetic.batches(self.cfg.batch_size, 0, self.cfg.synthetic_rows)
        return read_criteo(self.cfg.data, self.cfg.batch_size)

    def eval(self):
        if self.synthetic is not None:
            rows = self.cfg.synthetic_rows
            return self.synthetic.batches(self.cfg.batch_size, rows, rows + self.cfg.synthetic_eval_rows)
        if self.cfg.eval_data:
            return read_criteo(self.cfg.eval_data, self.cfg.batch_size)
        return iter(())


def count_lines(path: str) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return n


@contextlib.contextmanager
def cluster_addresses(cfg: TrainConfig):
    """The servers to use: --servers as given, or a LocalCluster started (and stopped) here."""
    if cfg.servers:
        yield list(cfg.servers)
        return
    with LocalCluster(cfg.local_shards) as cluster:
        log.info("started %d local shards: %s (data in %s)", cfg.local_shards, cluster.addresses, cluster.root)
        yield cluster.addresses


def make_model(cfg: TrainConfig) -> Model:
    opt = OptimizerConfig(cfg.optimizer, cfg.learning_rate)
    return MODELS[cfg.model](cfg.embedding_dim, opt)


def table_configs(cfg: TrainConfig, model: Model) -> list[TableConfig]:
    """The model's tables, with the settings of --table-config applied to the tables it names."""
    tables = model.table_configs()
    if not cfg.table_config:
        return tables
    with open(cfg.table_config) as f:
        overrides = table_configs_from_toml(f.read(), cfg.table_config)
    unknown = sorted(set(overrides) - {t.name for t in tables})
    if unknown:
        raise ValueError(f"{cfg.table_config} names tables {unknown}; model {cfg.model} has {[t.name for t in tables]}")
    out = []
    for t in tables:
        fields = dict(overrides.get(t.name, {}))
        if fields.get("dim", t.dim) != t.dim:
            raise ValueError(f"{cfg.table_config}: table {t.name} has dim {fields['dim']}, model {cfg.model} needs {t.dim}")
        out.append(dataclasses.replace(t, **fields).normalized())
    return out


def run_epochs(client: Client, model: Model, data: DataSource, cfg: TrainConfig) -> tuple[int, float, float]:
    """Trains; returns (examples, seconds, running logloss at the end)."""
    running = RunningMean(0.95)
    examples, started = 0, time.perf_counter()
    bar = tqdm(total=data.total * cfg.epochs, unit="ex", unit_scale=True, disable=not cfg.progress, smoothing=0.1)
    for epoch in range(cfg.epochs):
        for batch in data.train():
            n, fields = batch.ids.shape
            rows = client.pull(model.table, batch.ids).reshape(n, fields, model.dim)
            probs, grads = model.forward_backward(rows, batch.labels)
            clicks = np.repeat(batch.labels, fields)  # each id of a clicked example is clicked once
            client.push(model.table, batch.ids, grads.reshape(n * fields, model.dim), clicks)
            client.advance_clock()
            running.update(logloss(batch.labels, probs))
            examples += n
            bar.update(n)
            bar.set_postfix(epoch=epoch, logloss=f"{running.value:.4f}", refresh=False)
    bar.close()
    return examples, time.perf_counter() - started, running.value


def evaluate(client: Client, model: Model, data: DataSource) -> dict:
    labels, preds, oracle = [], [], []
    for batch in data.eval():
        n, fields = batch.ids.shape
        rows = client.pull(model.table, batch.ids).reshape(n, fields, model.dim)
        labels.append(batch.labels)
        preds.append(model.predict(rows))
        if batch.probs is not None:
            oracle.append(batch.probs)
    if not labels:
        return {}
    y, p = np.concatenate(labels), np.concatenate(preds)
    out = {"eval_examples": int(len(y)), "eval_auc": auc(y, p), "eval_logloss": logloss(y, p)}
    if oracle:
        q = np.concatenate(oracle)
        out.update(oracle_auc=auc(y, q), oracle_logloss=logloss(y, q))
    return out


def train(cfg: TrainConfig) -> dict:
    """Runs a whole job and returns its figures (also written to cfg.metrics_out as JSON)."""
    cfg.validate()
    model = make_model(cfg)
    data = DataSource(cfg)
    with cluster_addresses(cfg) as addresses, Client(addresses, timeout_s=cfg.timeout_s) as client:
        client.wait_ready()
        for table in table_configs(cfg, model):
            client.create_table(table)
        examples, seconds, train_logloss = run_epochs(client, model, data, cfg)
        results = {
            "model": cfg.model,
            "shards": len(addresses),
            "train_examples": examples,
            "train_seconds": seconds,
            "examples_per_s": examples / seconds if seconds > 0 else 0.0,
            "train_logloss": train_logloss,
        }
        results.update(evaluate(client, model, data))
        tables = [t for shard in client.stats() for t in shard.tables]
        results["table_rows"] = sum(t.num_rows for t in tables)  # ids with a trained row
        results["pending_ids"] = sum(t.pending_ids for t in tables)  # ids seen but not admitted
    if cfg.metrics_out:
        with open(cfg.metrics_out, "w") as f:
            json.dump({"config": dataclasses.asdict(cfg), **results}, f, indent=2)
    return results


def format_results(r: dict) -> str:
    lines = [f"trained {r['model']} on {r['train_examples']:,} examples with {r['shards']} shards "
             f"in {r['train_seconds']:.1f} s: {r['examples_per_s']:,.0f} examples/s"]  # fmt: skip
    if "eval_auc" in r:
        lines.append(f"eval   AUC {r['eval_auc']:.4f}  logloss {r['eval_logloss']:.4f}  ({r['eval_examples']:,} examples)")
    if "table_rows" in r:
        lines.append(f"table  {r['table_rows']:,} trained rows, {r['pending_ids']:,} ids seen but not admitted")
    if "oracle_auc" in r:
        lines.append(f"oracle AUC {r['oracle_auc']:.4f}  logloss {r['oracle_logloss']:.4f}  (the planted model)")
        lines.append(f"gap    AUC {r['oracle_auc'] - r['eval_auc']:+.4f}")
    return "\n".join(lines)

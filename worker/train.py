"""The training loop: pull a batch's rows, forward/backward locally (numpy or torch), push the gradients.

    for each batch:  rows = tables.pull(model, ids)              # pulled ahead on a thread, overlaid with the
                                                                 # rows the last pushes returned
                     probs, row_grads, dense_grads = backend.forward_backward(rows, dense_x, dense params, labels)
                     tables.push(model, ids, row_grads)          # duplicates summed, then the server optimizer;
                                                                 # returns the rows it updated
                     (dense gradients pushed, new values returned, with these every --dense-sync-every steps)
Evaluation pulls only. With synthetic data the planted model's probabilities give the oracle AUC and logloss.
Worker i of n trains on its own share of the data (--worker-id, --num-workers); all workers share the tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from ps.config import InitializerConfig, OptimizerConfig, TableConfig, table_configs_from_toml
from worker.client import Client, segment_sum
from worker.cluster import LocalCluster
from worker.dense import DenseSync
from worker.dense import table_config as dense_table_config
from worker.features import Batch
from worker.flags import check_input_file, check_output_file
from worker.metrics import RunningMean, auc, logloss
from worker.models.spec import DEFAULT_HIDDEN, MODEL_NAMES, ModelSpec
from worker.pipeline import RecentRows, in_any, prefetched
from worker.synthetic import SyntheticConfig, SyntheticData

log = logging.getLogger("worker.train")
FORMATS = ("criteo", "csv", "libsvm")


@dataclass(frozen=True)
class TrainConfig:
    servers: tuple[str, ...] = ()
    local_shards: int | None = None  # train on this many throwaway shards started here instead of on `servers`
    data: str | None = None
    eval_data: str | None = None
    format: str = "criteo"
    label_column: str | None = None
    drop_columns: tuple[str, ...] = ()
    numeric_columns: tuple[str, ...] = ()
    max_bad_lines: int = 0
    libsvm_fields: int | None = None  # libsvm: fields per example; None: those of the first line of `data`
    synthetic_rows: int = 2_000_000
    synthetic_eval_rows: int = 100_000
    synthetic_interactions: float = 0.0
    synthetic_seed: int = 0
    model: str = "fm"
    backend: str = "numpy"
    device: str = "cpu"
    embedding_dim: int = 8
    hidden: tuple[int, ...] = DEFAULT_HIDDEN
    optimizer: str = "adagrad"
    learning_rate: float = (
        0.02  # sparse; 0.05 trains FM embeddings worse and is fragile under staleness (docs/training.md)
    )
    dense_optimizer: str = "adam"
    dense_learning_rate: float = 0.001
    dense_sync_every: int = 1
    batch_size: int = 2048
    epochs: int = 1
    prefetch: int = 1
    worker_id: int = 0
    num_workers: int = 1
    timeout_s: float = 60.0
    server_timeout_s: float = 300.0  # how long a down server is waited for (retrying) before the run fails
    tls_ca: str | None = None  # TLS to the servers (ps/security.py)
    tls_cert: str | None = None
    tls_key: str | None = None
    auth_token_file: str | None = None
    table_config: str | None = None  # TOML: overrides the model tables' initializer, optimizer, admission, ...
    metrics_out: str | None = None
    metrics_port: int | None = None  # serve Prometheus metrics of the run (worker/telemetry.py)
    metrics_host: str = "127.0.0.1"  # where they listen: plain HTTP, no token
    progress: bool = True
    create_tables_only: bool = False  # create the model's tables and stop (a deployment's one-shot setup job)

    def validate(self) -> None:
        """ValueError naming the flag at fault (and what it expects) for the first setting that is wrong."""
        if self.model not in MODEL_NAMES:
            raise ValueError(f"--model {self.model!r} is unknown; expected one of {list(MODEL_NAMES)}")
        if self.backend not in ("numpy", "torch"):
            raise ValueError(f"--backend {self.backend!r} is unknown; expected numpy or torch")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device {self.device!r} is unknown; expected cpu or cuda")
        if self.device == "cuda" and self.backend != "torch":
            raise ValueError("--device cuda needs --backend torch (the numpy backend runs on the CPU)")
        if self.format not in FORMATS:
            raise ValueError(f"--format {self.format!r} is unknown; expected one of {list(FORMATS)}")
        if self.eval_data and not self.data:
            raise ValueError("--eval-data needs --data (without --data the run uses synthetic data)")
        data_file = f"a {self.format} data file (.gz read through gzip)"
        check_input_file("--data", self.data, data_file)
        check_input_file("--eval-data", self.eval_data, data_file)
        check_input_file("--table-config", self.table_config, "a TOML file of table settings")
        check_output_file("--metrics-out", self.metrics_out)
        self._check_numbers()
        if not 0 <= self.worker_id < self.num_workers:
            raise ValueError(f"--worker-id {self.worker_id} must be in [0, --num-workers {self.num_workers})")
        if self.libsvm_fields is not None and (self.format != "libsvm" or self.libsvm_fields < 1):
            raise ValueError(f"--libsvm-fields {self.libsvm_fields}: expected >= 1, with --format libsvm")
        if self.servers and self.local_shards is not None:
            raise ValueError("give --servers or --local-shards, not both")
        if not self.servers and self.local_shards is None:
            raise ValueError("no servers: give --servers host:port,... (in shard order), or --local-shards N to "
                             "train on N throwaway shards started here and stopped, with the model, at the end")  # fmt: skip

    def _check_numbers(self) -> None:
        """ValueError naming the flag of a count, a time or a port out of its range (NaN included)."""
        at_least = [("--batch-size", self.batch_size, 1), ("--epochs", self.epochs, 1),
                    ("--dense-sync-every", self.dense_sync_every, 1), ("--prefetch", self.prefetch, 0),
                    ("--num-workers", self.num_workers, 1), ("--embedding-dim", self.embedding_dim, 1),
                    ("--max-bad-lines", self.max_bad_lines, 0), ("--synthetic-eval-rows", self.synthetic_eval_rows, 0),
                    ("--synthetic-rows", self.synthetic_rows if self.data is None else 1, 1),
                    ("--local-shards", 1 if self.local_shards is None else self.local_shards, 1)]  # fmt: skip
        for flag, value, lowest in at_least:
            if value < lowest:
                raise ValueError(f"{flag} {value}: expected an integer >= {lowest}")
        if any(width < 1 for width in self.hidden):
            raise ValueError(f"--hidden {','.join(map(str, self.hidden))}: expected widths >= 1")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"--timeout-s {self.timeout_s}: expected seconds > 0")
        if not (math.isfinite(self.server_timeout_s) and self.server_timeout_s >= 0):
            raise ValueError(f"--server-timeout {self.server_timeout_s}: expected seconds >= 0 (0: no retries)")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError(f"--metrics-port {self.metrics_port}: expected a port in 0..65535 (0: a free one)")


class DataSource:
    """This worker's training batches and every eval batch, from files or from the synthetic generator."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.synthetic = None
        self.read_stats = []
        if cfg.data is None:
            self.synthetic = SyntheticData(
                SyntheticConfig(
                    rows=cfg.synthetic_rows, seed=cfg.synthetic_seed, interactions=cfg.synthetic_interactions
                )
            )
            n, i = cfg.synthetic_rows, cfg.worker_id
            self.share = (n * i // cfg.num_workers, n * (i + 1) // cfg.num_workers)
            self.total = self.share[1] - self.share[0]
        else:
            self.total = count_lines(cfg.data, header=cfg.format == "csv") // cfg.num_workers
        self.libsvm_fields = cfg.libsvm_fields
        if cfg.format == "libsvm" and cfg.data and self.libsvm_fields is None:
            from worker.formats import libsvm_field_count

            self.libsvm_fields = libsvm_field_count(cfg.data)  # train and eval files read with the same fields

    def _read(self, path: str, worker_id: int, num_workers: int, track: bool = True):
        from worker.formats import ReadStats, read_batches

        stats = ReadStats()
        if track:  # reported at the end of the run
            self.read_stats.append((path, stats))
        c = self.cfg
        return read_batches(
            path, c.format, c.batch_size, worker_id=worker_id, num_workers=num_workers,
            max_bad_lines=c.max_bad_lines, label_column=c.label_column, drop_columns=c.drop_columns,
            numeric_columns=c.numeric_columns, libsvm_fields=self.libsvm_fields, stats=stats,
        )  # fmt: skip

    def train(self) -> Iterator[Batch]:
        if self.synthetic is not None:
            return self.synthetic.batches(self.cfg.batch_size, *self.share)
        return self._read(self.cfg.data, self.cfg.worker_id, self.cfg.num_workers)

    def eval(self) -> Iterator[Batch]:
        if self.synthetic is not None:
            rows = self.cfg.synthetic_rows
            return self.synthetic.batches(self.cfg.batch_size, rows, rows + self.cfg.synthetic_eval_rows)
        if self.cfg.eval_data:
            return self._read(self.cfg.eval_data, 0, 1)
        return iter(())

    def spec(self) -> ModelSpec:
        """The model's shape for this data: fields and numeric features are read off the first batch."""
        first = next(iter(self.eval() if self.cfg.data is None else self._read(self.cfg.data, 0, 1, track=False)), None)
        if first is None:
            raise ValueError(f"{self.cfg.data}: no examples to train on")
        c = self.cfg
        return ModelSpec(c.model, first.ids.shape[1], first.dense_or_empty().shape[1], c.embedding_dim, c.hidden)

    def bad_lines_report(self) -> list[str]:
        return [
            f"{path}: skipped {s.bad_lines:,} malformed lines of {s.lines_read:,} (first: {s.first_bad})"
            for path, s in self.read_stats
            if s.bad_lines
        ]


def count_lines(path: str, header: bool = False) -> int:
    """Lines of a file (gzip read through), less a header line: the progress bar's total."""
    from worker.formats import open_data

    n = 0
    with open_data(path) as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return max(0, n - header)


@contextlib.contextmanager
def cluster_addresses(cfg: TrainConfig) -> Iterator[list[str]]:
    """The servers to use: --servers as given, or a LocalCluster started (and stopped) here."""
    if cfg.servers:
        yield list(cfg.servers)
        return
    with LocalCluster(cfg.local_shards) as cluster:
        log.info("started %d local shards: %s (data in %s)", cfg.local_shards, cluster.addresses, cluster.root)
        yield cluster.addresses


def client_for(cfg: TrainConfig, addresses: list[str]) -> Client:
    """A Client with the run's deadlines and security settings."""
    from ps.security import read_token

    token = read_token(cfg.auth_token_file) if cfg.auth_token_file else None
    return Client(addresses, timeout_s=cfg.timeout_s, server_timeout_s=cfg.server_timeout_s, tls_ca=cfg.tls_ca,
                  tls_cert=cfg.tls_cert, tls_key=cfg.tls_key, auth_token=token)  # fmt: skip


def make_backend(spec: ModelSpec, cfg: TrainConfig) -> Any:
    """The forward/backward implementation: numpy (CPU) or torch (cpu or cuda); both take and return numpy."""
    if cfg.backend == "numpy":
        from worker.models.numpy_backend import NumpyModel

        return NumpyModel(spec)
    try:
        from worker.models.torch_backend import TorchModel
    except ImportError as e:
        raise ValueError(f"--backend torch needs PyTorch: pip install 'sparseps[torch]' ({e})") from None
    return TorchModel(spec, cfg.device)


def sparse_table_config(spec: ModelSpec, cfg: TrainConfig) -> TableConfig:
    """The model's sparse table, named after the model: LR weights start at 0, embeddings small and random."""
    init = InitializerConfig("zeros", 0.0) if spec.name == "lr" else InitializerConfig("uniform", 0.01, seed=0)
    return TableConfig(spec.name, spec.sparse_dim, init, OptimizerConfig(cfg.optimizer, cfg.learning_rate))


def table_configs(cfg: TrainConfig, spec: ModelSpec) -> list[TableConfig]:
    """The model's tables (sparse, then one per dense parameter), with --table-config applied to those it names."""
    dense_opt = OptimizerConfig(cfg.dense_optimizer, cfg.dense_learning_rate)
    tables = [sparse_table_config(spec, cfg)] + [dense_table_config(p, dense_opt) for p in spec.dense_params()]
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
            raise ValueError(
                f"{cfg.table_config}: table {t.name} has dim {fields['dim']}, model {cfg.model} needs {t.dim}"
            )
        out.append(dataclasses.replace(t, **fields).normalized())
    return out


def run_epochs(
    tables: Any,
    spec: ModelSpec,
    backend: Any,
    dense: DenseSync,
    data: DataSource,
    cfg: TrainConfig,
    telemetry: Any = None,
) -> tuple[int, float, float]:
    """Trains; returns (examples, seconds, running logloss at the end). `tables` is a Client (or anything with
    its pull / push_many).

    One round trip per step: a push_many of the sparse gradients (summed per unique id), the dense gradients
    when a sync is due and the clock advance, which returns the rows it updated. The rows of the next batch
    come from the last pushes where they returned them and from a pull otherwise: made ahead on a thread with
    --prefetch k, in the step without. For one worker both give exactly the rows a pull just before computing
    would (tests/test_pipeline.py)."""
    running = RunningMean(0.95)
    examples, started = 0, time.perf_counter()
    bar = tqdm(total=data.total * cfg.epochs, unit="ex", unit_scale=True, disable=not cfg.progress, smoothing=0.1)
    name, dim = spec.name, spec.sparse_dim
    recent = RecentRows(cfg.prefetch + 1)  # a pull runs up to depth + 1 batches ahead: depth queued, one in hand

    def pull_uncovered(uniq: np.ndarray, covered: np.ndarray) -> np.ndarray:
        """Rows of uniq, pulled where not covered; covered rows stay unset: recent.overlay lays over them the
        rows that recent pushes returned (so they are not pulled for nothing)."""
        rows = np.empty((len(uniq), dim), dtype=np.float32)
        if not covered.all():
            rows[~covered] = tables.pull(name, uniq[~covered])
        return rows

    def prepare(batch, window: deque):  # on the prefetch thread when cfg.prefetch > 0
        """(unique ids, inverse, their rows pulled now or None). Ids that one of the depth + 1 batches before
        this one has too are covered: by the time this batch is computed, their pushes have returned them."""
        uniq, inverse = np.unique(batch.ids, return_inverse=True)
        if not cfg.prefetch:
            return uniq, inverse.ravel(), None
        covered = in_any(uniq, window)
        window.append(uniq)
        return uniq, inverse.ravel(), pull_uncovered(uniq, covered)

    for epoch in range(cfg.epochs):
        step_started = time.perf_counter()
        window: deque = deque(maxlen=cfg.prefetch + 1)  # the unique ids of the batches prepared last
        batches = prefetched(data.train(), lambda b, window=window: prepare(b, window), cfg.prefetch)
        for batch, (uniq, inverse, uniq_rows) in batches:
            if uniq_rows is None:  # no prefetch: pull the rows the last push did not return
                uniq_rows = pull_uncovered(uniq, recent.covered(uniq))
            recent.overlay(uniq, uniq_rows)
            n, fields = batch.ids.shape
            probs, row_grads, dense_grads = backend.forward_backward(
                uniq_rows[inverse].reshape(n, fields, dim), batch.dense_or_empty(), dense.values, batch.labels
            )
            # summed per unique id here (the Client would sort the ids again): each occurrence is one show, and
            # one click if its example was clicked
            summed = np.zeros((len(uniq), dim), dtype=np.float32)
            segment_sum(inverse, np.ascontiguousarray(row_grads, dtype=np.float32).reshape(n * fields, dim), summed)
            shows = np.bincount(inverse, minlength=len(uniq))
            clicks = np.bincount(inverse, weights=np.repeat(batch.labels, fields), minlength=len(uniq))
            pushes = [(name, uniq, summed, clicks, shows)]
            sync = dense.add(dense_grads)
            if sync:
                pushes += dense.push_items()
            returned = tables.push_many(pushes, advance_clock=1, return_rows=True)
            recent.add(uniq, returned[0])
            if sync:
                dense.take(returned[1:])
            running.update(logloss(batch.labels, probs))
            if telemetry is not None:
                now = time.perf_counter()
                telemetry.step(n, now - step_started, running.value)
                step_started = now
            examples += n
            bar.update(n)
            bar.set_postfix(epoch=epoch, logloss=f"{running.value:.4f}", refresh=False)
    dense.flush()
    bar.close()
    return examples, time.perf_counter() - started, running.value


def evaluate(tables: Any, spec: ModelSpec, backend: Any, dense_values: dict, batches: Iterable[Batch]) -> dict:
    """AUC and logloss of the model the tables hold now, on batches (and the oracle's, for synthetic data)."""
    labels, preds, oracle = [], [], []
    for batch in batches:
        n, fields = batch.ids.shape
        rows = tables.pull(spec.name, batch.ids).reshape(n, fields, spec.sparse_dim)
        labels.append(batch.labels)
        preds.append(backend.predict(rows, batch.dense_or_empty(), dense_values))
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
    data = DataSource(cfg)
    spec = data.spec()
    backend = make_backend(spec, cfg)
    with cluster_addresses(cfg) as addresses, client_for(cfg, addresses) as client:
        client.wait_ready()
        for table in table_configs(cfg, spec):
            client.create_table(table)
        if cfg.create_tables_only:
            return {"model": cfg.model, "created_tables": [t.name for t in table_configs(cfg, spec)]}
        dense = DenseSync(client, spec.dense_params(), cfg.dense_sync_every)
        dense.pull()
        telemetry = None
        if cfg.metrics_port is not None:
            from worker.telemetry import TrainTelemetry

            telemetry = TrainTelemetry()
            port = telemetry.serve(cfg.metrics_port, cfg.metrics_host)
            log.warning("Prometheus metrics on http://%s:%d/metrics", cfg.metrics_host, port)
        try:
            examples, seconds, train_logloss = run_epochs(client, spec, backend, dense, data, cfg, telemetry)
        finally:
            if telemetry is not None:
                telemetry.close()
        results = {
            "model": cfg.model,
            "backend": cfg.backend,
            "device": cfg.device,
            "worker": f"{cfg.worker_id}/{cfg.num_workers}",
            "shards": len(addresses),
            "train_examples": examples,
            "train_seconds": seconds,
            "examples_per_s": examples / seconds if seconds > 0 else 0.0,
            "train_logloss": train_logloss,
            "dense_syncs": dense.syncs,
        }
        results.update(evaluate(client, spec, backend, dense.pull(), data.eval()))
        tables = [t for shard in client.stats() for t in shard.tables if t.name == spec.name]
        results["table_rows"] = sum(t.num_rows for t in tables)  # ids with a trained row
        results["pending_ids"] = sum(t.pending_ids for t in tables)  # ids seen but not admitted
    for line in data.bad_lines_report():
        log.warning(line)
    results["bad_lines"] = sum(s.bad_lines for _, s in data.read_stats)
    if cfg.metrics_out:
        with open(cfg.metrics_out, "w") as f:
            json.dump({"config": dataclasses.asdict(cfg), **results}, f, indent=2)
    return results


def evaluate_servers(cfg: TrainConfig) -> dict:
    """`ps-worker eval`: the AUC and logloss of the model the servers hold, on --data (or synthetic eval rows)."""
    cfg.validate()
    data = DataSource(cfg)
    spec = data.spec()
    backend = make_backend(spec, cfg)
    eval_batches = data.eval() if cfg.data is None else data._read(cfg.data, 0, 1)
    with cluster_addresses(cfg) as addresses, client_for(cfg, addresses) as client:
        client.wait_ready()
        for t in table_configs(cfg, spec):
            if client.dim(t.name) != t.dim:
                raise ValueError(
                    f"table {t.name} on the servers has dim {client.dim(t.name)}, model {cfg.model} with "
                    f"--embedding-dim {cfg.embedding_dim} needs {t.dim}"
                )
        dense = DenseSync(client, spec.dense_params())
        results = {
            "model": cfg.model,
            "shards": len(addresses),
            **evaluate(client, spec, backend, dense.pull(), eval_batches),
        }
    return results


def format_results(r: dict) -> str:
    lines = [f"created tables {', '.join(r['created_tables'])} for model {r['model']}"] if "created_tables" in r else []
    if "train_examples" in r:
        lines.append(f"trained {r['model']} ({r['backend']}, {r['device']}, worker {r['worker']}) on "
                     f"{r['train_examples']:,} examples with {r['shards']} shards in {r['train_seconds']:.1f} s: "
                     f"{r['examples_per_s']:,.0f} examples/s")  # fmt: skip
    if "eval_auc" in r:
        lines.append(
            f"eval   AUC {r['eval_auc']:.4f}  logloss {r['eval_logloss']:.4f}  ({r['eval_examples']:,} examples)"
        )
    if "table_rows" in r:
        lines.append(f"table  {r['table_rows']:,} trained rows, {r['pending_ids']:,} ids seen but not admitted")
    if "oracle_auc" in r:
        lines.append(f"oracle AUC {r['oracle_auc']:.4f}  logloss {r['oracle_logloss']:.4f}  (the planted model)")
        lines.append(f"gap    AUC {r['oracle_auc'] - r['eval_auc']:+.4f}")
    return "\n".join(lines)

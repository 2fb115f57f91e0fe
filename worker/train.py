"""A training job: settings (TrainConfig), the model and its tables from the data's schema, the loop, the results.

    train(cfg):  data = DataSource(cfg)                    # files through the schema, or synthetic data
                 recipe fills the flags left unset          # worker/recipe.py: small or large data
                 spec = ModelSpec(model, schema's fields, numeric features, hidden, dropout)
                 read the validation set (at most 200,000 examples, kept in memory) and --eval-data's start: a
                 malformed line there fails here, before any server is touched
                 create the tables (one per schema table, one per dense parameter) on the servers
                 run_epochs (worker/loop.py), evaluating the validation set as it goes
                 evaluate the eval set, read batch by batch as it is scored; results printed, and written to
                 --metrics-out as JSON
Malformed lines of --data met while training are skipped and counted; one past --max-bad-lines fails the run; with --servers its message says that the servers
hold the partly trained model. One of --eval-data past its start is met in the final evaluation (past
--max-bad-lines, it fails the run then, saying that the training had finished).
Worker i of n trains on its own share of the data (--worker-id, --num-workers); all workers share the tables.
With synthetic data the planted model's probabilities give the oracle AUC and logloss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import math
import os
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from ps.config import (
    DEFAULT_LEARNING_RATES,
    MAX_BARRIER_S,
    MAX_HYPERPARAMETER,
    MAX_INTERVAL_S,
    InitializerConfig,
    OptimizerConfig,
    TableConfig,
    table_configs_from_toml,
)
from ps.errors import PsError
from worker.client import Client
from worker.cluster import LocalCluster
from worker.data import DataSource
from worker.datafiles import check_data_input, data_files
from worker.dense import DensePath, DenseSync, dense_norm
from worker.dense import table_config as dense_table_config
from worker.flags import check_input_file, check_not_an_input, check_output_file
from worker.formats import file_has_labels
from worker.linecount import SCORING_COUNT_LINES, count_files_upto
from worker.loop import LoopResult, LoopSettings, ScoringProgress, TrainingDataError, evaluate, run_epochs
from worker.models.spec import DEFAULT_HIDDEN, MLP_MODELS, MODEL_NAMES, ModelSpec
from worker.recipe import LARGE, RECIPES, choose, describe
from worker.results import format_evaluation
from worker.schema import FORMATS, Schema
from worker.steprows import abandon, row_source
from worker.tables import check_tables
from worker.temp_dirs import remove_stale_temp_dirs

log = logging.getLogger("worker.train")
MODES = ("async", "sync", "ssp", "geo")  # how workers agree: worker/loop.py
DENSE_PATHS = ("ps", "allreduce")  # where the MLP is trained: worker/dense.py, worker/allreduce.py
TORCH_HINT = "pip install torch==2.13.0 (a CPU build; `python3 dev.py test` installs it into ./.venv)"
DEFAULT_ROW_CACHE_BYTES = 64 << 20  # ssp
DEFAULT_STALENESS = 4  # ssp
DEFAULT_GEO_EVERY = 4  # geo


@dataclass(frozen=True)
class TrainConfig:
    servers: tuple[str, ...] = ()
    local_shards: int | None = None  # train on this many throwaway shards started here instead of on `servers`
    data: str | None = None
    eval_data: str | None = None
    schema: str | None = None  # TOML feature schema (worker/schema.py); None: the built-in one of `format`
    format: str = "criteo"
    label_column: str | None = None
    drop_columns: tuple[str, ...] = ()
    numeric_columns: tuple[str, ...] = ()
    max_bad_lines: int | None = None  # None: the recipe's (0 for small data, 1,000 for large)
    libsvm_fields: int | None = None  # libsvm: fields per example; None: those of the first line of `data`
    synthetic_rows: int = 2_000_000
    synthetic_eval_rows: int = 100_000
    synthetic_interactions: float = 0.0
    synthetic_history: float = 0.0  # strength of the planted multi-hot history column; 0: no such column
    synthetic_seed: int = 0
    model: str = "fm"
    backend: str = "numpy"
    device: str = "cpu"
    embedding_dim: int = 8
    hidden: tuple[int, ...] = DEFAULT_HIDDEN
    dropout: float | None = None  # of the MLP's hidden units; None: the recipe's
    optimizer: str | None = None  # sparse; None: the recipe's (ftrl for small data, adagrad for large)
    learning_rate: float | None = None  # None: the recipe's, or DEFAULT_LEARNING_RATES of --optimizer
    optimizer_params: dict | None = None  # e.g. ftrl's l1, l2; None: the recipe's when it picks the optimizer
    l2: float | None = None  # the sparse tables' lazy L2 (TableConfig.l2, applied by the servers); None: the recipe's
    dense_optimizer: str = "adam"
    dense_learning_rate: float = 0.001
    dense_l2: float | None = None  # on the MLP weights; None: the recipe's
    dense_sync_every: int = 1
    recipe: str = "auto"  # worker/recipe.py: auto picks small or large by the number of training examples
    batch_size: int | None = None  # None: the recipe's
    epochs: int | None = None  # the most epochs; None: the recipe's
    validation_fraction: float | None = None  # of the training examples held out; None: the recipe's
    validation_data: str | None = None  # a file to validate on instead of a split
    eval_every: int = 0  # steps between validations; 0: after every epoch
    skip_examples: int = 0  # the first training examples of this worker's stream (over epochs) left out: a resumed run
    max_examples: int = 0  # the job's training examples, at most (over epochs; worker_max_examples); 0: no limit
    early_stop: int | None = None  # validations without a better logloss before stopping; 0: never; None: recipe
    prefetch: int = 1
    worker_id: int = 0
    num_workers: int = 1
    mode: str = "async"  # MODES
    staleness: int | None = None  # ssp: steps a worker may run ahead of the slowest; None: DEFAULT_STALENESS
    geo_every: int | None = None  # geo: steps between pushes of the local rows' deltas; None: DEFAULT_GEO_EVERY
    barrier_timeout_s: float = 60.0  # the longest a sync or ssp wait for another worker may last
    job_id: int | None = None  # the job's id, the same on all its workers (sync, ssp); None: one is made up
    row_cache_bytes: int | None = None  # ssp's worker row cache; None: DEFAULT_ROW_CACHE_BYTES for ssp, else 0
    dense: str = "ps"  # DENSE_PATHS
    dense_staleness: int | None = None  # --dense ps: steps the MLP may lag on a background thread; None: 0
    timeout_s: float = 60.0
    server_timeout_s: float = 300.0  # how long a down server is waited for (retrying) before the run fails
    tls_ca: str | None = None  # TLS to the servers (ps/security.py)
    tls_cert: str | None = None
    tls_key: str | None = None
    auth_token_file: str | None = None
    table_config: str | None = None  # TOML: overrides the tables' initializer, optimizer, admission, ...
    metrics_out: str | None = None
    metrics_port: int | None = None  # serve Prometheus metrics of the run (worker/telemetry.py)
    metrics_host: str = "127.0.0.1"  # where they listen: plain HTTP, no token
    progress: bool = True
    progress_lines: bool = False  # 'PROGRESS {json}' lines on stdout instead of a bar (for ps-worker launch)
    final_eval: bool = True  # score the eval set after training; launch's workers do not: launch scores it once
    create_tables_only: bool = False  # create the model's tables and stop (a deployment's one-shot setup job)

    def validate(self, needs_servers: bool = True) -> None:
        """ValueError naming the flag at fault (and what it expects) for the first setting that is wrong
        (needs_servers: that --servers or --local-shards is given)."""
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
        if self.mode not in MODES:
            raise ValueError(f"--mode {self.mode!r} is unknown; expected one of {list(MODES)}")
        if self.dense not in DENSE_PATHS:
            raise ValueError(f"--dense {self.dense!r} is unknown; expected one of {list(DENSE_PATHS)}")
        if self.dense == "allreduce" and self.mode == "sync":
            raise ValueError("--mode sync sums every worker's gradients on the servers; its MLP goes with them: "
                             "use --dense ps (the default) with --mode sync")  # fmt: skip
        if self.mode == "sync" and self.dense_staleness:
            raise ValueError(f"--dense-staleness {self.dense_staleness} with --mode sync: a sync step's MLP "
                             "gradients are summed with its rows', so the MLP cannot lag (give 0 or leave it unset)")  # fmt: skip
        only = [("--staleness", self.staleness, self.mode == "ssp", "ssp's (sync is staleness 0)"),
                ("--geo-every", self.geo_every, self.mode == "geo", "geo's"),
                ("--dense-staleness", self.dense_staleness, self.dense == "ps", "the --dense ps path's")]  # fmt: skip
        for flag, value, applies, whose in only:
            if value is not None and not applies:
                raise ValueError(f"{flag} {value} is {whose} setting; this run has --mode {self.mode} --dense "
                                 f"{self.dense}, which would ignore it")  # fmt: skip
        if self.dense_sync_every > 1 and (self.dense == "allreduce" or self.dense_staleness):
            raise ValueError(f"--dense-sync-every {self.dense_sync_every} applies to the --dense ps path in the step "
                             "(--dense-staleness 0) only")  # fmt: skip
        if self.local_shards is not None and self.num_workers > 1:
            raise ValueError(f"--local-shards with --num-workers {self.num_workers}: each worker would start shards "
                             "of its own; `ps-worker launch --workers N --local-shards S` starts one set for all")  # fmt: skip
        if self.num_workers > 1 and self.mode in ("sync", "ssp") and not self.job_id:
            raise ValueError(f"--mode {self.mode} with {self.num_workers} workers needs --job-id: the same for all "
                             "the job's workers, a new one per job (`ps-worker launch` and torchrun give one)")  # fmt: skip
        if self.row_cache_bytes and self.mode != "ssp":
            raise ValueError(f"--row-cache-bytes serves rows within ssp's staleness bound; --mode {self.mode} "
                             "has none (geo keeps its own local rows)")  # fmt: skip
        if self.recipe not in RECIPES:
            raise ValueError(f"--recipe {self.recipe!r} is unknown; expected one of {list(RECIPES)}")
        if self.eval_data and not self.data:
            raise ValueError("--eval-data needs --data (without --data the run uses synthetic data)")
        if self.schema and not self.data:
            raise ValueError("--schema needs --data (synthetic data has its own schema)")
        if self.validation_data and self.validation_fraction:
            raise ValueError("give --validation-data or --validation-fraction, not both")
        data_file = "a data file" if self.schema else f"a {self.format} data file"
        data_file += " (.gz read through gzip), or a directory, glob or comma-separated list of them"
        check_data_input("--data", self.data, data_file)
        check_data_input("--eval-data", self.eval_data, data_file)
        check_data_input("--validation-data", self.validation_data, data_file)
        check_input_file("--schema", self.schema, "a TOML feature schema (ps-worker schema --data FILE writes one)")
        check_input_file("--table-config", self.table_config, "a TOML file of table settings")
        check_output_file("--metrics-out", self.metrics_out)
        check_not_an_input("--metrics-out", self.metrics_out, self.input_files())
        self._check_numbers()
        if not 0 <= self.worker_id < self.num_workers:
            raise ValueError(f"--worker-id {self.worker_id} must be in [0, --num-workers {self.num_workers})")
        if self.libsvm_fields is not None and (self.format != "libsvm" or self.libsvm_fields < 1):
            raise ValueError(f"--libsvm-fields {self.libsvm_fields}: expected >= 1, with --format libsvm")
        if self.servers and self.local_shards is not None:
            raise ValueError("give --servers or --local-shards, not both")
        limit = self.worker_max_examples()
        if self.max_examples and self.max_examples < self.num_workers:
            raise ValueError(f"--max-examples {self.max_examples} is the job's total, shared by its {self.num_workers} "
                             "workers: expected at least one example a worker (or 0: no limit)")  # fmt: skip
        if limit and self.skip_examples >= limit:
            raise ValueError(f"--skip-examples {self.skip_examples:,} reaches this worker's --max-examples limit "
                             f"({limit:,} examples of its stream): nothing would be trained")  # fmt: skip
        if self.skip_examples and self.local_shards is not None:
            raise ValueError("--skip-examples resumes training a model that servers hold; --local-shards starts new, "
                             "empty ones (give --servers)")  # fmt: skip
        if needs_servers and not self.servers and self.local_shards is None:
            raise ValueError("no servers: give --servers host:port,... (in shard order), or --local-shards N to "
                             "train on N throwaway shards started here and stopped, with the model, at the end")  # fmt: skip

    def worker_max_examples(self) -> int:
        """The position in this worker's stream of training examples (counted over epochs, the examples
        --skip-examples skips included) where its training stops: worker i of n takes its share of the job's
        --max-examples N, N*(i+1)//n - N*i//n; 0: no limit."""
        n, i = self.num_workers, self.worker_id
        return self.max_examples * (i + 1) // n - self.max_examples * i // n

    def input_files(self) -> dict[str, str | None]:
        """The files the run reads, by flag (None: not given)."""
        return {"--data": self.data, "--eval-data": self.eval_data, "--validation-data": self.validation_data,
                "--schema": self.schema, "--table-config": self.table_config, "--tls-ca": self.tls_ca,
                "--tls-cert": self.tls_cert, "--tls-key": self.tls_key, "--auth-token-file": self.auth_token_file}  # fmt: skip

    def _check_numbers(self) -> None:
        """ValueError naming the flag of a count, a rate, a time or a port out of its range (NaN included)."""

        def unset_or(value, default):
            return default if value is None else value

        at_least = [("--batch-size", unset_or(self.batch_size, 1), 1), ("--epochs", unset_or(self.epochs, 1), 1),
                    ("--dense-sync-every", self.dense_sync_every, 1), ("--prefetch", self.prefetch, 0),
                    ("--num-workers", self.num_workers, 1), ("--embedding-dim", self.embedding_dim, 1),
                    ("--max-bad-lines", unset_or(self.max_bad_lines, 0), 0), ("--synthetic-eval-rows", self.synthetic_eval_rows, 0),
                    ("--synthetic-rows", self.synthetic_rows if self.data is None else 1, 1),
                    ("--eval-every", self.eval_every, 0), ("--skip-examples", self.skip_examples, 0), ("--max-examples", self.max_examples, 0), ("--early-stop", unset_or(self.early_stop, 0), 0),
                    ("--staleness", unset_or(self.staleness, 0), 0), ("--geo-every", unset_or(self.geo_every, 1), 1),
                    ("--dense-staleness", unset_or(self.dense_staleness, 0), 0),
                    ("--row-cache-bytes", unset_or(self.row_cache_bytes, 0), 0),
                    ("--local-shards", 1 if self.local_shards is None else self.local_shards, 1)]  # fmt: skip
        for flag, value, lowest in at_least:
            if value < lowest:
                raise ValueError(f"{flag} {value}: expected an integer >= {lowest}")
        if any(width < 1 for width in self.hidden):
            raise ValueError(f"--hidden {','.join(map(str, self.hidden))}: expected widths >= 1")
        ranges = [("--validation-fraction", unset_or(self.validation_fraction, 0.0), 0.0, 0.5),
                  ("--dropout", unset_or(self.dropout, 0.0), 0.0, 0.95), ("--l2", unset_or(self.l2, 0.0), 0.0, 1e6),
                  ("--dense-l2", unset_or(self.dense_l2, 0.0), 0.0, 1e6), ("--synthetic-history", self.synthetic_history, 0.0, 1e3)]  # fmt: skip
        for flag, value, low, high in ranges:
            if not (math.isfinite(value) and low <= value <= high):
                raise ValueError(f"{flag} {value}: expected a number in [{low}, {high}]")
        rates = [
            ("--learning-rate", unset_or(self.learning_rate, 1.0)),
            ("--dense-learning-rate", self.dense_learning_rate),
        ]
        for flag, value in rates:
            if not (math.isfinite(value) and 0 < value <= MAX_HYPERPARAMETER):
                raise ValueError(f"{flag} {value}: expected a number > 0 and <= {MAX_HYPERPARAMETER:g}")
        if not 0 < self.timeout_s <= MAX_INTERVAL_S:
            raise ValueError(f"--timeout-s {self.timeout_s}: expected seconds > 0 and <= {MAX_INTERVAL_S:g}")
        if not 0 < self.barrier_timeout_s <= MAX_BARRIER_S:
            raise ValueError(
                f"--barrier-timeout {self.barrier_timeout_s}: expected seconds > 0 and <= {MAX_BARRIER_S:g}"
            )
        if not 0 <= self.server_timeout_s <= MAX_INTERVAL_S:
            raise ValueError(f"--server-timeout {self.server_timeout_s}: expected seconds >= 0 (0: no retries) and <= "
                             f"{MAX_INTERVAL_S:g}")  # fmt: skip
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError(f"--metrics-port {self.metrics_port}: expected a port in 0..65535 (0: a free one)")

    def with_recipe(
        self, examples: int, unit: str = "training examples", at_least: bool = False
    ) -> tuple[TrainConfig, str]:
        """This config with the unset flags taken from the recipe for `examples` training examples (all
        workers together), and the line that says so (`unit`: what `examples` counts; at_least: the count
        stopped there, and there are more; see recipe.describe)."""
        r = choose(self.recipe, examples)
        geo_instead = self.mode == "geo" and r.optimizer == "ftrl" and self.optimizer is None  # (GEO_FTRL)
        if geo_instead:
            r = dataclasses.replace(
                r, optimizer=LARGE.optimizer, learning_rate=LARGE.learning_rate, optimizer_params={}
            )
        optimizer, rate, params = self.optimizer, self.learning_rate, self.optimizer_params
        if optimizer is None:
            optimizer, params = r.optimizer, r.optimizer_params if params is None else params
            rate = r.learning_rate if rate is None else rate
        rate = DEFAULT_LEARNING_RATES.get(optimizer, 0.01) if rate is None else rate
        fraction = self.validation_fraction
        if fraction is None:
            fraction = 0.0 if self.validation_data else r.validation_fraction
        resolved = dataclasses.replace(
            self,
            batch_size=r.batch_size if self.batch_size is None else self.batch_size,
            epochs=r.epochs if self.epochs is None else self.epochs,
            validation_fraction=fraction,
            early_stop=r.early_stop if self.early_stop is None else self.early_stop,
            max_bad_lines=r.max_bad_lines if self.max_bad_lines is None else self.max_bad_lines,
            l2=r.l2 if self.l2 is None else self.l2,
            dropout=r.dropout if self.dropout is None else self.dropout,
            dense_l2=r.dense_l2 if self.dense_l2 is None else self.dense_l2,
            optimizer=optimizer,
            learning_rate=rate,
            optimizer_params=dict(params or {}),
            dense_staleness=self.dense_staleness_or_default() if self.dense == "ps" else None,
            staleness=DEFAULT_STALENESS if self.staleness is None and self.mode == "ssp" else self.staleness,
            geo_every=DEFAULT_GEO_EVERY if self.geo_every is None and self.mode == "geo" else self.geo_every,
            row_cache_bytes=(DEFAULT_ROW_CACHE_BYTES if self.mode == "ssp" else 0) if self.row_cache_bytes is None
            else self.row_cache_bytes,
            job_id=self.job_id or (secrets.randbits(63) | 1),
        )  # fmt: skip
        given = [(flag, value) for flag, value in (("--batch-size", self.batch_size), ("--epochs", self.epochs),
                 ("--optimizer", self.optimizer), ("--learning-rate", self.learning_rate), ("--dropout", self.dropout),
                 ("--dense-l2", self.dense_l2), ("--validation-fraction", self.validation_fraction),
                 ("--early-stop", self.early_stop), ("--l2", self.l2), ("--max-bad-lines", self.max_bad_lines))
                 if value is not None]  # fmt: skip
        line = describe(r, examples, self.recipe == "auto", mlp=self.model in MLP_MODELS, unit=unit,
                        files=self.data is not None, validation_file=self.validation_data, at_least=at_least)  # fmt: skip
        if geo_instead:
            line += f"; sparse {r.optimizer}, not ftrl, in geo mode (see --mode)"
        if given:
            line += "; instead, as given: " + ", ".join(f"{flag} {value:g}" if isinstance(value, float)
                                                         else f"{flag} {value}" for flag, value in given)  # fmt: skip
        return resolved, line

    def dense_staleness_or_default(self) -> int:
        if self.dense_staleness is not None:
            return self.dense_staleness
        return 0  # in the step, with the rows' push: on 2 cores the background thread measured slower (README)


@contextlib.contextmanager
def cluster_addresses(cfg: TrainConfig) -> Iterator[list[str]]:
    """The servers to use: --servers as given, or a LocalCluster started (and stopped) here."""
    if cfg.servers:
        yield list(cfg.servers)
        return
    remove_stale_temp_dirs()  # those of earlier runs killed by SIGKILL
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
    seed = cfg.synthetic_seed * 1_000 + cfg.worker_id  # dropout masks: distinct per worker
    if cfg.backend == "numpy":
        from worker.models.numpy_backend import NumpyModel

        return NumpyModel(spec, seed=seed)
    try:
        from worker.models.torch_backend import TorchModel
    except ImportError as e:
        raise ValueError(f"--backend torch needs PyTorch ({e}): {TORCH_HINT}") from None
    return TorchModel(spec, cfg.device, seed=seed)


def model_spec(cfg: TrainConfig, data: DataSource) -> ModelSpec:
    """The model over the data's schema: its sparse fields and tables, its numeric features."""
    schema = data.schema
    return ModelSpec(cfg.model, schema.model_fields(), len(schema.dense_columns()), cfg.hidden, cfg.dropout or 0.0)


def sparse_table_configs(
    spec: ModelSpec, cfg: TrainConfig, schema_overrides: dict[str, dict], warn: bool = True
) -> list[TableConfig]:
    """One table per schema table: LR weights start at 0, embeddings small and random, --l2 as the table's lazy
    L2 (applied by the servers to the rows a push touches, for the steps since their last push); the schema's
    settings of a table (optimizer, initializer, l2, admission, ...) win over these defaults. warn: log that --l2
    does not apply to an ftrl table."""
    out = []
    for name in spec.table_dims():
        init = InitializerConfig("zeros", 0.0) if spec.name == "lr" else InitializerConfig("uniform", 0.01, seed=0)
        t = TableConfig(
            name,
            spec.row_dim(name),
            init,
            OptimizerConfig(cfg.optimizer, cfg.learning_rate, dict(cfg.optimizer_params or {})),
            l2=cfg.l2 or 0.0,
        )
        fields = {k: v for k, v in schema_overrides.get(name, {}).items() if k not in ("name", "dim")}
        t = dataclasses.replace(t, **fields)
        if t.optimizer.name == "ftrl" and t.l2 and "l2" not in fields:
            if warn:
                log.warning("--l2 does not apply to table %s: its optimizer is ftrl, which has its own l2", name)
            t = dataclasses.replace(t, l2=0.0)
        out.append(t.normalized())
    return out


def table_configs(
    cfg: TrainConfig, spec: ModelSpec, schema_overrides: dict[str, dict] | None = None, features: str = ""
) -> list[TableConfig]:
    """The model's tables (sparse, then one per dense parameter), with --table-config applied to those it names;
    features: what their rows mean (Schema.fingerprint), set on every one of them."""
    dense_opt = OptimizerConfig(cfg.dense_optimizer, cfg.dense_learning_rate)
    tables = sparse_table_configs(spec, cfg, schema_overrides or {})
    tables += [dense_table_config(p, dense_opt) for p in spec.dense_params()]
    tables = [dataclasses.replace(t, features=features) for t in tables]
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


def table_config_note(cfg: TrainConfig, spec: ModelSpec, schema_overrides: dict[str, dict],
                      tables: list[TableConfig]) -> str:  # fmt: skip
    """ "; --table-config sets ..." naming the sparse tables whose optimizer or l2 --table-config changed from what
    the recipe and flags chose (tables: table_configs of cfg), with what they use; "" if none."""
    if not cfg.table_config:
        return ""
    chosen = {t.name: t for t in sparse_table_configs(spec, cfg, schema_overrides, warn=False)}
    changed = []
    for t in tables:
        if t.name not in chosen:
            continue
        before, parts = chosen[t.name].normalized(), []
        if t.optimizer != before.optimizer:
            params = "".join(f" {k}={v:g}" for k, v in sorted(t.optimizer.params.items()))
            parts.append(f"{t.optimizer.name} {t.optimizer.learning_rate:g}{params}")
        if t.l2 != before.l2:
            parts.append(f"lazy l2 {t.l2:g}")
        if parts:
            changed.append(f"{t.name}: {', '.join(parts)}")
    return f"; --table-config sets table {'; '.join(changed)} instead" if changed else ""


def prepare(
    cfg: TrainConfig, needs_servers: bool = True, training: bool = True, labels_optional: bool = False
) -> tuple[TrainConfig, DataSource, ModelSpec, str]:
    """Checks the config, opens the data (ValueError when it holds no example), applies the recipe: (resolved
    config, data, model, recipe line). training=False (eval, predict): standardized columns must have their
    statistics in the schema, since the training data's cannot be recomputed from another file. labels_optional
    (predict): files without labels are read as such (DataSource)."""
    cfg.validate(needs_servers)
    # eval and predict (training=False) read --data for its schema only: no pass over the file to count its lines
    data = DataSource(
        cfg, default_table=cfg.model, standardize_here=training, labels_optional=labels_optional, count=training
    )
    job_examples = cfg.synthetic_rows if cfg.data is None else data.examples * cfg.num_workers  # equal on every worker
    counted = data.line_count
    at_least = counted is not None and counted.more  # the count stopped at the recipe's threshold
    # a file's count is of its lines, read before training: its malformed lines are found (and skipped) later
    cfg, recipe_line = cfg.with_recipe(
        counted.lines if at_least else job_examples,
        "training examples" if cfg.data is None else "lines of training data",
        at_least=at_least,
    )
    data.cfg, data.batch_size = cfg, cfg.batch_size
    data.first_batch()
    if not data.schema.columns:
        raise ValueError(no_features_message(cfg, data.schema))
    bucketized = {c.source for c in data.schema.sparse_columns() if c.kind == "numeric"}
    unused = [c.name for c in data.schema.dense_columns() if c.source not in bucketized]
    if unused and cfg.model not in MLP_MODELS:
        log.warning("%s uses sparse fields only: the numeric features %s are not used; bucketize them (transform = "
                    "\"bucketize\" in a schema: `ps-worker schema` writes a bucketized twin of each numeric column), "
                    "or train deepfm or dnn", cfg.model, ", ".join(unused[:10]) + (" ..." if len(unused) > 10 else ""))  # fmt: skip
    return cfg, data, model_spec(cfg, data), recipe_line


def no_features_message(cfg: TrainConfig, schema: Schema) -> str:
    """Why a run whose schema reads no feature column (only the label) is refused."""
    if schema.format == "libsvm":
        why = "no line of it has an id:value token"
    elif schema.format == "csv" and not cfg.schema:
        dropped = f", and --drop-columns drops {', '.join(cfg.drop_columns)}" if cfg.drop_columns else ""
        why = f"its header has no column besides the label {schema.label!r}{dropped}"
    else:
        why = "the schema has no column besides the label"
    return f"{cfg.data}: no feature to train on: {why}; a model needs at least one feature"


def loop_settings(cfg: TrainConfig, data: DataSource) -> LoopSettings:
    """The loop's settings of a resolved config (after prepare)."""
    return LoopSettings(
        epochs=cfg.epochs, prefetch=cfg.prefetch, dense_l2=cfg.dense_l2 or 0.0,
        eval_every=cfg.eval_every, early_stop=cfg.early_stop or 0, progress=cfg.progress and not cfg.progress_lines,
        restore_best=bool(cfg.early_stop) and cfg.num_workers == 1 and cfg.dense == "ps",
        progress_lines=cfg.progress_lines, worker=cfg.worker_id,
        total_examples=int(data.examples * (1 - (cfg.validation_fraction or 0.0))), skip_examples=cfg.skip_examples,
        max_examples=cfg.worker_max_examples(),
        total_estimated=data.line_count is not None and data.line_count.more,
    )  # fmt: skip


def dense_path(cfg: TrainConfig, tables: Any, spec: ModelSpec) -> DensePath:
    """The MLP's path of a resolved config: on the servers (DenseSync: in the step, or on a background thread
    within --dense-staleness steps), or averaged among torch workers (AllReduceDense)."""
    dense_opt = OptimizerConfig(cfg.dense_optimizer, cfg.dense_learning_rate)
    if cfg.dense == "allreduce":
        from worker.allreduce import AllReduceDense

        if importlib.util.find_spec("torch") is None:
            raise ValueError(f"--dense allreduce needs PyTorch (torch.distributed): {TORCH_HINT}")
        if cfg.num_workers == 1 and "WORLD_SIZE" not in os.environ:  # a group of one needs no launcher
            from worker.cluster import free_port

            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
        return AllReduceDense(
            tables, spec.dense_params(), dense_opt, device=cfg.device, timeout_s=cfg.barrier_timeout_s
        )
    return DenseSync(tables, spec.dense_params(), cfg.dense_sync_every, cfg.dense_staleness_or_default())


def mode_line(cfg: TrainConfig) -> str:
    """What the run's mode means, in one line of output."""
    who = f"worker {cfg.worker_id} of {cfg.num_workers}"
    what = {
        "async": "async: each push applied as it arrives",
        "sync": f"sync: each step's pushes of all workers summed, applied once (waits up to {cfg.barrier_timeout_s:g} s)",
        "ssp": f"ssp: at most {cfg.staleness} steps ahead of the slowest worker (waits up to {cfg.barrier_timeout_s:g} s)"
        + (f", row cache {cfg.row_cache_bytes / (1 << 20):.0f} MiB" if cfg.row_cache_bytes else ""),
        "geo": f"geo: local rows, their deltas pushed every {cfg.geo_every} steps",
    }[cfg.mode]
    dense = (
        "allreduce among the torch workers"
        if cfg.dense == "allreduce"
        else (
            f"on the servers, at most {cfg.dense_staleness} steps behind"
            if cfg.dense_staleness
            else "on the servers, in the step"
        )
    )
    return f"{who}, mode {what}" + (f"; MLP {dense}" if cfg.model in MLP_MODELS else "")


GEO_FTRL = (
    "FTRL derives a row's embedding from its optimizer state at each step, so in geo mode the other workers' "
    "deltas last only until this worker's next step on the row: their learning is mostly lost"
)


def check_geo_optimizers(tables: list[TableConfig], spec: ModelSpec) -> None:
    """ValueError for a sparse table trained with ftrl in geo mode (GEO_FTRL), before any server is touched."""
    ftrl = [t.name for t in tables if t.name in spec.table_dims() and t.optimizer.name == "ftrl"]
    if ftrl:
        raise ValueError(f"--mode geo cannot train table(s) {', '.join(ftrl)} with ftrl: {GEO_FTRL}; give them "
                         "another optimizer (--optimizer adagrad, or in --table-config / the schema), or another "
                         "--mode")  # fmt: skip


def open_job(cfg: TrainConfig, tables: Any) -> tuple[TrainConfig, DataSource, ModelSpec, Any, DenseSync]:
    """prepare, the backend, the tables created on `tables` (a Client or alike), the dense parameters pulled:
    what run_epochs needs, for tests that drive it themselves."""
    cfg, data, spec, _ = prepare(cfg, needs_servers=False)
    for table in table_configs(cfg, spec, data.schema.table_overrides(), data.schema.fingerprint()):
        tables.create_table(table)
    dense = DenseSync(tables, spec.dense_params(), cfg.dense_sync_every)
    dense.pull()
    return cfg, data, spec, make_backend(spec, cfg), dense


def train(cfg: TrainConfig) -> dict:
    """Runs a whole job and returns its figures (also written to cfg.metrics_out as JSON)."""
    cfg, data, spec, recipe_line = prepare(cfg)
    if not cfg.create_tables_only:  # read before any server is touched: a malformed line fails the run here
        data.validation()
        data.check_eval()  # --eval-data's start only: the file is read as it is scored, after training
    backend = make_backend(spec, cfg)
    tables_cfg = table_configs(cfg, spec, data.schema.table_overrides(), data.schema.fingerprint())
    own = sorted(t for t, o in data.schema.table_overrides().items() if "optimizer" in o and t in spec.table_dims())
    if own:
        recipe_line += f"; tables {', '.join(own)} use their schema's optimizer instead"
    recipe_line += table_config_note(cfg, spec, data.schema.table_overrides(), tables_cfg)
    if cfg.mode == "geo":
        check_geo_optimizers(tables_cfg, spec)
    with cluster_addresses(cfg) as addresses, client_for(cfg, addresses) as client:
        client.wait_ready()
        check_tables(client, tables_cfg, "nothing was created")
        held = 0
        if cfg.num_workers == 1 and not cfg.create_tables_only:
            shard_stats = client.stats()
            held = sum(t.num_rows for t in sparse_table_stats(client, spec, shard_stats))
            for warning in missing_shares(shard_stats, spec, client.servers):
                log.warning("%s", warning)
        for table in tables_cfg:
            client.create_table(table)
        if cfg.create_tables_only:
            return {"model": cfg.model, "created_tables": [t.name for t in tables_cfg]}
        _say(recipe_line, cfg)
        if cfg.skip_examples:
            _say(f"resuming: the first {cfg.skip_examples:,} training examples are read and skipped", cfg)
            if held == 0 and cfg.num_workers == 1:
                log.warning("--skip-examples %d, but the servers hold no trained row of this model: those examples "
                            "will not be trained (is --servers the cluster of the run this resumes?)",
                            cfg.skip_examples)  # fmt: skip
        elif held:
            _say(f"the servers hold this model's tables with {held:,} trained rows already: this run trains that "
                 "model further (for a new one, use other servers or start them on new data dirs)", cfg)  # fmt: skip
        if cfg.num_workers > 1 or cfg.mode != "async":
            _say(mode_line(cfg), cfg)
        dense = dense_path(cfg, client, spec)
        dense.pull()
        source = row_source(cfg, client, spec, tables_cfg)
        telemetry = None
        if cfg.metrics_port is not None:
            from worker.telemetry import TrainTelemetry

            telemetry = TrainTelemetry()
            port = telemetry.serve(cfg.metrics_port, cfg.metrics_host)
            log.warning("Prometheus metrics on http://%s:%d/metrics", cfg.metrics_host, port)
        validation = data.validation()
        if validation:
            named = f" of {cfg.validation_data}" if cfg.validation_data else ""
            _say(f"validating on {sum(len(b) for b in validation):,} held-out examples{named}", cfg)
            few = validation_too_small(validation)
            if few:
                log.warning("%s", few)
        settings = loop_settings(cfg, data)
        loop = LoopResult()
        try:
            run_epochs(client, spec, backend, dense, data.train, settings, validation, telemetry,
                       on_eval=lambda e: _say(format_evaluation(e), cfg), source=source, result=loop)  # fmt: skip
        except BaseException as e:  # this worker will not finish: its job's other workers need not wait for it
            abandon(source, e)
            if isinstance(e, TrainingDataError):
                raise ValueError(stopped_message(e, cfg)) from None
            told = loop.examples or cfg.skip_examples
            if told and not cfg.local_shards and not cfg.progress_lines:  # launch's says it for the job
                print(resume_hint(loop, cfg), file=sys.stderr, flush=True)
            raise
        finally:
            dense.close()
            if telemetry is not None:
                telemetry.close()
        if cfg.skip_examples and not loop.examples:
            raise ValueError(f"--skip-examples {cfg.skip_examples:,} skips every training example of this worker's "
                             f"{cfg.epochs} epoch{'s' * (cfg.epochs != 1)}: nothing was trained")  # fmt: skip
        results = {
            "model": cfg.model,
            "backend": cfg.backend,
            "device": cfg.device,
            "worker": f"{cfg.worker_id}/{cfg.num_workers}",
            "shards": len(addresses),
            "recipe": recipe_line,
            "batch_size": cfg.batch_size,
            "epochs_run": loop.curve[-1]["epoch"] if loop.curve else loop.epoch,
            "train_examples": loop.examples,
            "skipped_examples": cfg.skip_examples,
            "train_seconds": loop.seconds,
            "examples_per_s": loop.examples / loop.seconds if loop.seconds > 0 else 0.0,
            "train_logloss": loop.train_logloss,
            "mode": cfg.mode,
            "dense": cfg.dense,
            "dense_syncs": dense.syncs,
            **loop.source_stats,
            "stopped_early": loop.stopped_early,
            "max_examples": cfg.max_examples,
            "stopped_at_max_examples": loop.stopped_at_limit,
            "eval_every": cfg.eval_every,
            "restored_best": loop.restored_best,
            "model_is_best": loop.restored_best or bool(cfg.num_workers == 1 and loop.curve and loop.curve[-1]["best"]),
            "curve": loop.curve,
        }
        if loop.best is not None:
            results.update(best_validation_auc=loop.best["validation_auc"],
                           best_validation_logloss=loop.best["validation_logloss"], best_epoch=loop.best["epoch"],
                           best_step=loop.best["step"])  # fmt: skip
        try:
            final_dense = dense.pull() if cfg.dense == "ps" else dense.values  # the PS path: all workers' updates
            if final_dense:  # the MLP this worker ended with
                results["dense_norm"] = dense_norm(final_dense)
            if cfg.final_eval:
                results.update(final_evaluation(cfg, data, client, spec, backend, final_dense))
            else:  # --no-final-eval: ps-worker launch scores the job's model once, after all its workers
                results["final_eval_skipped"] = True
            stats = sparse_table_stats(client, spec)
        except BaseException:  # a Ctrl-C, say: the training is done and kept
            if not cfg.local_shards and not cfg.progress_lines:
                print(f"ps-worker: the run had trained all its {cfg.skip_examples + loop.examples:,} examples when it "
                      "stopped, in its final evaluation: nothing to resume (ps-worker eval scores the model the "
                      "servers hold)", file=sys.stderr, flush=True)  # fmt: skip
            raise
        results["table_rows"] = sum(t.num_rows for t in stats)  # ids with a trained row
        results["pending_ids"] = sum(t.pending_ids for t in stats)  # ids seen but not admitted
    for line in data.bad_lines_report():
        log.warning(line)
    results["bad_lines"] = sum(s.bad_lines for _, s in data.read_stats)  # every file's: training, validation, eval
    results["skipped_lines"] = data.skipped_lines()  # the training data's, one pass; never in train_examples
    if cfg.metrics_out:
        with open(cfg.metrics_out, "w") as f:
            config = {**dataclasses.asdict(cfg), "format": data.schema.format}  # a --schema file's, if given
            json.dump({"config": config, **results}, f, indent=2)
    return results


def final_evaluation(cfg: TrainConfig, data: DataSource, client: Client, spec: ModelSpec, backend: Any,
                     dense_values: dict) -> dict:  # fmt: skip
    """evaluate() on data.eval(), read as it is scored, with its own progress (a large eval file takes minutes);
    a malformed line of --eval-data past --max-bad-lines (met only now: check_eval read its start) comes out as a
    ValueError that says the training had finished."""
    progress = None
    if cfg.progress and not cfg.progress_lines:
        counted = data.eval_count()  # None: the synthetic eval rows, or no --eval-data
        total = cfg.synthetic_eval_rows if data.synthetic is not None else counted.estimate if counted else 0
        progress = ScoringProgress(total, True, estimated=bool(counted and counted.more)) if total else None
    try:
        return evaluate(client, spec, backend, dense_values, data.eval(), progress, cfg.prefetch)
    except PsError:
        raise
    except ValueError as e:
        raise ValueError(
            f"{e}; in the final evaluation on --eval-data, after training had finished (ps-worker eval "
            "scores the model the servers hold once the file is fixed or --max-bad-lines raised)"
        ) from None


def stopped_message(e: TrainingDataError, cfg: TrainConfig) -> str:
    """The error of a run that stopped on bad training data, saying what its pushes left on the servers."""
    if not e.steps or cfg.local_shards:  # local shards go, with what was pushed to them
        return str(e)
    if cfg.progress_lines:  # under launch, which says where the job's workers can resume
        return f"{e}; the run stopped after {e.steps:,} steps ({e.examples:,} examples) had pushed their updates"
    return (f"{e}; the run stopped after {e.steps:,} steps ({e.examples:,} examples) had pushed their updates: the "
            f"servers now hold a partly trained model (once the line is fixed or --max-bad-lines raised, "
            f"{_resume_flags(cfg.skip_examples + e.examples, cfg)} trains on from there)")  # fmt: skip


def resume_hint(loop: LoopResult, cfg: TrainConfig) -> str:
    """What an interrupted run trained, and the flags that train on from there (none: it had trained every
    example)."""
    done = cfg.skip_examples + loop.examples
    if not loop.examples:
        return (f"ps-worker: stopped before its first step, while reading the {done:,} examples it skips: to train on, "
                f"run the same command again ({_resume_flags(done, cfg)})")  # fmt: skip
    if loop.trained_all:
        return (f"ps-worker: the run had trained all its {done:,} examples when it stopped (after its last step): "
                "nothing to resume")  # fmt: skip
    flight = (f" (the step under way as it stopped, {loop.in_flight:,} examples more, may have reached some shards "
              "too: a resumed run trains it again)") if loop.in_flight else ""  # fmt: skip
    return (f"ps-worker: stopped in epoch {loop.epoch} of {cfg.epochs} after {done:,} training examples (this run's "
            f"{loop.examples:,} in {loop.steps:,} steps) had pushed their updates, which the servers keep{flight}; "
            f"to train on from there, run the same command with {_resume_flags(done, cfg)}")  # fmt: skip


def _resume_flags(done: int, cfg: TrainConfig) -> str:
    """The flags of a run that resumes after `done` training examples."""
    job = (
        " (and a new --job-id, if you gave one: each worker of the job resumed with its own count)"
        if cfg.mode in ("sync", "ssp")
        else ""
    )
    return f"--skip-examples {done}{job}"


MIN_VALIDATION_CLASS = 30  # of each label: fewer, and the validation AUC's noise picks the epochs


def validation_too_small(validation: list) -> str | None:
    """A warning when the validation batches hold fewer than MIN_VALIDATION_CLASS examples of either label, else
    None."""
    n = sum(len(b) for b in validation)
    ones = int(sum(float(b.labels.sum()) for b in validation))
    if min(ones, n - ones) >= MIN_VALIDATION_CLASS:
        return None
    return (f"the validation set holds {ones:,} positive and {n - ones:,} negative examples: too few to tell epochs "
            "apart (its AUC moves by chance), so early stopping and the best epoch follow noise; give "
            "--validation-data a larger held-out file, a larger --validation-fraction, or --epochs with "
            "--early-stop 0")  # fmt: skip


def sparse_table_stats(client: Client, spec: ModelSpec, shard_stats: list | None = None) -> list:
    """Every shard's Stats of the model's sparse tables (none where they do not exist yet); shard_stats: the
    shards' StatsResponses when the caller has them."""
    names = set(spec.table_dims())
    return [t for shard in (shard_stats or client.stats()) for t in shard.tables if t.name in names]


MISSING_SHARE = 0.1  # a shard holding less than this share of a table's rows per shard is named


def missing_shares(shard_stats: list, spec: ModelSpec, servers: list[str]) -> list[str]:
    """Warnings for the shards that hold (almost) none of a trained table's rows while the others hold many: ids
    spread evenly over the shards, so such a shard was most likely started on a new or another --data-dir, and
    the model the run continues lacks its part."""
    out = []
    for name in spec.table_dims():
        rows = [next((t.num_rows for t in shard.tables if t.name == name), 0) for shard in shard_stats]
        per_shard = sum(rows) / max(len(rows), 1)
        if len(rows) < 2 or per_shard < 100:
            continue
        for i, (n, shard) in enumerate(zip(rows, shard_stats)):
            if n < MISSING_SHARE * per_shard:
                others = sum(rows) - n
                out.append(f"shard {i} at {servers[i]} holds {n:,} rows of table {name!r} while the other shards "
                           f"hold {others:,}, and its clock is {shard.clock:,}: was it started on a new or another "
                           f"--data-dir (its: {shard.data_dir or 'unknown'})? The model this run trains further lacks "
                           "that shard's rows")  # fmt: skip
    return out


def _say(line: str, cfg: TrainConfig) -> None:
    """A line of the run's story on stdout (above the progress bar when there is one)."""
    if cfg.progress:
        tqdm.write(line)
    else:
        print(line, flush=True)


@dataclass
class ServedModel:
    """What eval and predict score with: the resolved config, its data and model, the backend, a client of the
    servers, the dense parameters they hold, the shard count."""

    cfg: TrainConfig
    data: DataSource
    spec: ModelSpec
    backend: Any
    client: Client
    dense_values: dict
    shards: int


@contextlib.contextmanager
def served_model(cfg: TrainConfig, doing: str, labels_optional: bool = False) -> Iterator[ServedModel]:
    """The model of cfg's flags as the servers hold it, for eval and predict: prepare (the large recipe, no
    validation split: --max-bad-lines 1,000 unless given), then, once the servers answer, ValueError unless they
    hold every table of that model with its shapes (check_tables for_eval; doing: what was not done, for the
    message), and the dense parameters pulled. labels_optional: as prepare's."""
    cfg = dataclasses.replace(cfg, recipe="large", validation_fraction=0.0)
    cfg, data, spec, _ = prepare(cfg, training=False, labels_optional=labels_optional)
    backend = make_backend(spec, cfg)
    with cluster_addresses(cfg) as addresses, client_for(cfg, addresses) as client:
        client.wait_ready()
        check_tables(
            client,
            table_configs(cfg, spec, data.schema.table_overrides(), data.schema.fingerprint()),
            doing,
            for_eval=True,
        )
        dense_values = DenseSync(client, spec.dense_params()).pull()
        yield ServedModel(cfg, data, spec, backend, client, dense_values, len(addresses))


def evaluate_servers(cfg: TrainConfig) -> dict:
    """`ps-worker eval` and launch's final evaluation: the AUC and logloss of the model the servers hold, on
    --eval-data, else on --data, else on the synthetic eval rows. --data (when given) fixes the schema."""
    with served_model(cfg, "nothing was evaluated") as m:
        cfg, data = m.cfg, m.data
        scored = cfg.eval_data or cfg.data
        if scored is not None and not file_has_labels(scored, data.schema):
            raise ValueError(f"{scored} holds no labels (as its first lines show): eval scores a model against them; "
                             "`ps-worker predict` writes the model's probability for each row of a file without "
                             "labels; nothing was evaluated")  # fmt: skip
        eval_batches = data.eval() if cfg.data is None or cfg.eval_data else data.read_whole(cfg.data)
        progress = None
        if cfg.progress:  # total: the file's lines, an estimate of its examples (bad and empty lines among them)
            header = data.schema.format == "csv"
            counted = None if scored is None else count_files_upto(data_files(scored), SCORING_COUNT_LINES, header)
            total = cfg.synthetic_eval_rows if counted is None else counted.estimate
            progress = ScoringProgress(total, True, estimated=counted is not None and counted.more)
        results = {
            "model": cfg.model,
            "shards": m.shards,
            **evaluate(m.client, m.spec, m.backend, m.dense_values, eval_batches, progress, cfg.prefetch),
        }
        if m.dense_values:  # the MLP the servers hold
            results["dense_norm"] = dense_norm(m.dense_values)
    for line in data.bad_lines_report():
        log.warning(line)
    results["bad_lines"] = sum(s.bad_lines for _, s in data.read_stats)
    if "eval_examples" not in results and (cfg.eval_data or cfg.data):
        raise ValueError(f"{cfg.eval_data or cfg.data}: no examples to evaluate on (the file is empty, or holds only "
                         "a header or malformed lines)")  # fmt: skip
    if data.synthetic is not None and cfg.synthetic_eval_rows:  # they follow the training rows of --synthetic-rows
        results["synthetic_eval_rows"] = [cfg.synthetic_rows, cfg.synthetic_rows + cfg.synthetic_eval_rows]
        results["synthetic_seed"] = cfg.synthetic_seed
    return results

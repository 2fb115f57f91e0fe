"""TrainConfig: the settings of a training job (`ps-worker train`'s flags), their checks, and the recipe's defaults.

    TrainConfig.validate()        ValueError naming the flag at fault, for the first setting that is wrong
    TrainConfig.with_recipe(n)    the flags left unset (None) taken from the recipe for n training examples
                                  (worker/recipe.py), the line that says what it chose, and that recipe
Eval and predict take the same config (worker/served.py); launch's workers are `ps-worker train` runs of it.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from dataclasses import dataclass

from ps.config import DEFAULT_LEARNING_RATES
from worker.datafiles import check_data_input
from worker.flags import check_input_file, check_not_an_input, check_output_file, same_file
from worker.models.spec import DEFAULT_HIDDEN, MLP_MODELS, MODEL_NAMES
from worker.recipe import EARLY_STOP_METRICS, LARGE, MAX_BAD_SHARE, RECIPES, Recipe, choose, describe
from worker.schema_columns import AUTO_FORMAT, DEFAULT_FORMAT, FORMAT_CHOICES, LIBSVM_VALUES, MAX_LIBSVM_FIELDS
from worker.train_config_ignored import DEFAULT_METRICS_HOST, check_model_settings, ignored_setting
from worker.train_numbers import check_numbers

MODES = ("async", "sync", "ssp", "geo")  # how workers agree: worker/loop.py
DENSE_PATHS = ("ps", "allreduce")  # where the MLP is trained: worker/dense.py, worker/allreduce.py
DEFAULT_ROW_CACHE_BYTES = 64 << 20  # ssp
DEFAULT_STALENESS = 4  # ssp
DEFAULT_GEO_EVERY = 4  # geo
GEO_L2 = (
    "geo pushes its rows' deltas as add-delta pushes, which the servers add as they are: the lazy L2 they apply at "
    "optimizer pushes never reaches the rows geo trains"
)
RESUME_WORKER = "{worker}"  # in --resume-file's name: each worker's id takes its place (worker/resume.py)
GEO_FTRL = (
    "FTRL derives a row's embedding from its optimizer state at each step, so in geo mode the other workers' "
    "deltas last only until this worker's next step on the row: their learning is mostly lost"
)


def new_job_id() -> int:
    """A job id for a run given none (no --job-id, no --resume-file that keeps one): random, nonzero, 63 bits."""
    return secrets.randbits(63) | 1


def new_worker_token() -> int:
    """A worker process's token (WorkerStamp.token) where no --resume-file keeps one: random, nonzero, 63 bits."""
    return secrets.randbits(63) | 1


def resume_file_of(resume_file: str, worker_id: int) -> str:
    """Worker worker_id's --resume-file: resume_file with RESUME_WORKER replaced by its id."""
    return resume_file.replace(RESUME_WORKER, str(worker_id))


@dataclass(frozen=True)
class TrainConfig:
    servers: tuple[str, ...] = ()
    local_shards: int | None = None  # train on this many throwaway shards started here instead of on `servers`
    data: str | None = None
    eval_data: str | None = None
    schema: str | None = None  # TOML feature schema (worker/schema.py); None: the built-in one of `format`
    format: str = DEFAULT_FORMAT
    label_column: str | None = None
    drop_columns: tuple[str, ...] = ()
    numeric_columns: tuple[str, ...] = ()
    max_bad_lines: int | None = None  # None: the recipe's (0 for small data, 1,000 for large)
    # of the lines read, the share that may be malformed (past readers.share.BAD_SHARE_AFTER bad records); None: the
    # recipe's (recipe.MAX_BAD_SHARE where max_bad_lines is unset, else 1.0: --max-bad-lines alone bounds them)
    max_bad_share: float | None = None
    libsvm_fields: int | None = None  # libsvm: fields per example; None: the most of a line of `data`'s first 10,000
    # libsvm: a feature's value as its weight ("weights") or left out ("one-hot"); "auto": weights where the first
    # 10,000 lines of data of `data` carry a value other than 0 and 1 (schema_builtin.resolve_schema)
    libsvm_values: str = "auto"
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
    fm_init_scale: float | None = None  # fm's rows start uniform in +-this (no flag: --table-config's initializer
    # wins); None: the recipe's
    mlp_output_zeros: bool | None = None  # the MLP's output layer (its last weight) starts at zeros; None: the
    # recipe's, for this model (no flag: --table-config's initializer wins)
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
    resume_file: str | None = None  # this worker's position, read at start and kept as it trains (worker/resume.py)
    resume_started_from: int | None = None  # skip_examples is a --resume-file position (it may be the whole stream),
    # and this the --skip-examples the run first started from (no flag: worker/resume.py); None: the flag's
    resume_state_ids: tuple[int, ...] = ()  # the shards' model state ids the --resume-file's position was trained
    # into (empty: not known)
    resume_trained: bool = False  # the --resume-file says training is over: only the final evaluation runs
    resume_rejoins: bool = False  # with resume_trained: a sync or ssp job resumed under a new job id, which this
    # worker tells it is done before it evaluates (worker/resume.py rejoins)
    resume_best_not_put_back: bool = False  # the --resume-file's (recorded with trained; read where resume_trained):
    # the run stopped as early stopping's best model was put back, so the tables hold the last model or part of the
    # best (worker/resume.py best_not_put_back)
    max_examples: int = 0  # the job's training examples, at most (over epochs; worker_max_examples); 0: no limit
    early_stop: int | None = None  # validations without a better figure before stopping; 0: never; None: recipe
    early_stop_metric: str | None = None  # EARLY_STOP_METRICS: what the stop and the best model go by; None: recipe
    shuffle: bool | None = None  # each epoch in a fresh random order (held in memory: worker/data.py); None: recipe
    prefetch: int = 1
    worker_id: int = 0
    num_workers: int = 1
    mode: str = "async"  # MODES
    staleness: int | None = None  # ssp: steps a worker may run ahead of the slowest; None: DEFAULT_STALENESS
    geo_every: int | None = None  # geo: steps between pushes of the local rows' deltas; None: DEFAULT_GEO_EVERY
    barrier_timeout_s: float = 60.0  # the longest a sync or ssp wait for another worker may last
    job_id: int | None = None  # the job's id, the same on all its workers; None: one is made up (one worker)
    job_name: str = ""  # the --job-id text job_id is the hash of, which the shards name the job by; "": none
    worker_token: int = 0  # this worker process's (an async or geo stamp's token); 0: one is made up (the
    # --resume-file keeps it: a restart with the file is the same process)
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
    metrics_host: str = DEFAULT_METRICS_HOST  # where they listen: plain HTTP, no token
    progress: bool = True
    progress_lines: bool = False  # 'PROGRESS {json}' lines on stdout instead of a bar (worker/progress_lines.py)
    launched: bool = False  # a worker of ps-worker launch, which says the job's warnings and lines (worker/job.py
    # check_training, job_lines), where its workers can resume, and where the model is, once itself
    final_eval: bool = True  # score the eval set after training; launch's workers do not: launch scores it once
    create_tables_only: bool = False  # create the model's tables and stop (a deployment's one-shot setup job)

    def validate(self, needs_servers: bool = True) -> None:
        """ValueError naming the flag at fault (and what it expects) for the first setting that is wrong
        (needs_servers: that --servers or --local-shards is given)."""
        self._check_choices()
        self._check_modes()
        self._check_data_flags()
        self._check_files()
        check_numbers(self)
        check_model_settings(self)
        self._check_workers()
        self._check_libsvm()
        if self.servers and self.local_shards is not None:
            raise ValueError("give --servers or --local-shards, not both (either may come from its flag, its variable "
                             "PS_SERVERS or PS_LOCAL_SHARDS, or a config file)")  # fmt: skip
        self._check_shares()
        if self.resume_file is not None:
            self._check_resume_file()
        self._check_servers(needs_servers)

    def _check_choices(self) -> None:
        """ValueError for a --model, --backend, --device, --format, --mode or --dense that is unknown, or cuda without
        torch."""
        if self.model not in MODEL_NAMES:
            raise ValueError(f"--model {self.model!r} is unknown; expected one of {list(MODEL_NAMES)}")
        if self.backend not in ("numpy", "torch"):
            raise ValueError(f"--backend {self.backend!r} is unknown; expected numpy or torch")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device {self.device!r} is unknown; expected cpu or cuda")
        if self.device == "cuda" and self.backend != "torch":
            raise ValueError("--device cuda needs --backend torch (the numpy backend runs on the CPU)")
        if self.format not in FORMAT_CHOICES:
            raise ValueError(f"--format {self.format!r} is unknown; expected one of {list(FORMAT_CHOICES)}")
        if self.mode not in MODES:
            raise ValueError(f"--mode {self.mode!r} is unknown; expected one of {list(MODES)}")
        if self.dense not in DENSE_PATHS:
            raise ValueError(f"--dense {self.dense!r} is unknown; expected one of {list(DENSE_PATHS)}")

    def _check_modes(self) -> None:
        """ValueError for a setting the --mode or --dense of this run refuses or would ignore."""
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
                raise ValueError(ignored_setting(flag, value, whose, f"--mode {self.mode} --dense {self.dense}"))
        if self.dense_sync_every > 1 and (self.dense == "allreduce" or self.dense_staleness):
            raise ValueError(f"--dense-sync-every {self.dense_sync_every} applies to the --dense ps path in the step "
                             "(--dense-staleness 0) only")  # fmt: skip
        if self.local_shards is not None and self.num_workers > 1:
            raise ValueError(f"--local-shards with --num-workers {self.num_workers}: each worker would start shards "
                             "of its own; `ps-worker launch --workers N --local-shards S` starts one set for all")  # fmt: skip
        if self.mode == "geo" and self.optimizer == "ftrl" and not (self.table_config or self.schema):
            raise ValueError(f"--mode geo cannot train with --optimizer ftrl: {GEO_FTRL}; give another optimizer "
                             "(adagrad), or another --mode")  # fmt: skip
        if self.mode == "geo" and self.l2:
            raise ValueError(f"--l2 {self.l2:g} with --mode geo: {GEO_L2}; leave --l2 out, or use another --mode")
        if self.row_cache_bytes and self.mode != "ssp":
            raise ValueError(f"--row-cache-bytes serves rows within ssp's staleness bound; --mode {self.mode} "
                             "has none (geo keeps its own local rows)")  # fmt: skip

    def _check_data_flags(self) -> None:
        """ValueError for an unknown --recipe or --early-stop-metric, or a data flag that needs --data or excludes
        another."""
        if self.recipe not in RECIPES:
            raise ValueError(f"--recipe {self.recipe!r} is unknown; expected one of {list(RECIPES)}")
        if self.early_stop_metric is not None and self.early_stop_metric not in EARLY_STOP_METRICS:
            raise ValueError(f"--early-stop-metric {self.early_stop_metric!r} is unknown; expected one of "
                             f"{list(EARLY_STOP_METRICS)}")  # fmt: skip
        if self.eval_data and not self.data:
            raise ValueError("--eval-data needs --data (without --data the run uses synthetic data)")
        if self.schema and not self.data:
            raise ValueError("--schema needs --data (synthetic data has its own schema)")
        if self.validation_data and self.validation_fraction:
            raise ValueError("give --validation-data or --validation-fraction, not both")

    def _check_files(self) -> None:
        """ValueError for a data, schema or table config file that cannot be read, or a --metrics-out that cannot be
        written."""
        data_file = "a data file" if self.schema or self.format == AUTO_FORMAT else f"a {self.format} data file"
        data_file += " (.gz read through gzip), or a directory, glob or comma-separated list of them"
        check_data_input("--data", self.data, data_file)
        check_data_input("--eval-data", self.eval_data, data_file)
        check_data_input("--validation-data", self.validation_data, data_file)
        check_input_file("--schema", self.schema, "a TOML feature schema (ps-worker schema --data FILE writes one)")
        check_input_file("--table-config", self.table_config, "a TOML file of table settings")
        check_output_file("--metrics-out", self.metrics_out)
        check_not_an_input("--metrics-out", self.metrics_out, self.input_files())

    def _check_workers(self) -> None:
        """ValueError for a --worker-id outside --num-workers, or a job of several workers without a --job-id."""
        if not 0 <= self.worker_id < self.num_workers:
            raise ValueError(f"--worker-id {self.worker_id} must be in [0, --num-workers {self.num_workers})")
        if self.num_workers > 1 and not self.job_id:
            raise ValueError(f"--num-workers {self.num_workers} needs --job-id: the same for all the job's workers, "
                             "a new one per job (the shards train one job at a time, and tell its workers by it; "
                             "`ps-worker launch` gives one, and so does torchrun given a --rdzv-id, or --standalone)")  # fmt: skip

    def _check_libsvm(self) -> None:
        """ValueError for a --libsvm-fields or --libsvm-values out of range or given for another format."""
        if self.libsvm_fields is not None and self.format not in ("libsvm", AUTO_FORMAT) and not self.schema:
            # (--schema: its own refusal; auto: resolve_schema's, once the format is known)
            raise ValueError(f"--libsvm-fields is for --format libsvm data only (the format here is {self.format!r}): "
                             "leave it out")  # fmt: skip
        if self.libsvm_values not in LIBSVM_VALUES:
            raise ValueError(f"--libsvm-values {self.libsvm_values!r}: expected one of {', '.join(LIBSVM_VALUES)}")
        if self.libsvm_values != "auto" and self.format not in ("libsvm", AUTO_FORMAT) and not self.schema:
            raise ValueError(f"--libsvm-values is for --format libsvm data only (the format here is {self.format!r}): "
                             "leave it out")  # fmt: skip
        if self.libsvm_fields is not None and not 1 <= self.libsvm_fields <= MAX_LIBSVM_FIELDS:
            raise ValueError(f"--libsvm-fields {self.libsvm_fields}: expected 1..{MAX_LIBSVM_FIELDS}")

    def _check_shares(self) -> None:
        """ValueError for a --max-examples or --synthetic-rows that leaves a worker none, or a --skip-examples past this
        worker's limit."""
        limit = self.worker_max_examples()
        if self.max_examples and self.max_examples < self.num_workers:
            raise ValueError(f"--max-examples {self.max_examples} is the job's total, shared by its {self.num_workers} "
                             "workers: expected at least one example a worker (or 0: no limit)")  # fmt: skip
        if self.data is None and 0 < self.synthetic_rows < self.num_workers:
            raise ValueError(f"--synthetic-rows {self.synthetic_rows} are the job's rows, shared by its "
                             f"{self.num_workers} workers: expected at least one a worker")  # fmt: skip
        if limit and self.skip_examples >= limit and self.resume_started_from is None:
            raise ValueError(f"--skip-examples {self.skip_examples:,} reaches this worker's --max-examples limit "
                             f"({limit:,} examples of its stream): nothing would be trained")  # fmt: skip

    def _check_resume_file(self) -> None:
        """ValueError for a --resume-file that cannot be read and replaced as the position, or one --local-shards or
        --metrics-out rules out."""
        check_output_file("--resume-file", self.worker_resume_file())
        if os.path.exists(self.worker_resume_file()) and not os.path.isfile(self.worker_resume_file()):
            raise ValueError(f"--resume-file {self.worker_resume_file()} is not a regular file (a device, a FIFO): "
                             "it is read as the position and replaced by it; give the name of a regular file, or "
                             "a new one")  # fmt: skip
        if self.local_shards is not None:
            raise ValueError("--resume-file resumes training a model that servers hold; --local-shards starts new, "
                             "empty ones (give --servers)")  # fmt: skip
        check_not_an_input("--resume-file", self.resume_file, self.input_files())
        if self.metrics_out is not None and same_file(self.metrics_out, self.worker_resume_file()):
            raise ValueError(f"--metrics-out {self.metrics_out} is the file of --resume-file {self.resume_file}: "
                             "each would replace the other (the run's figures lost, or its position read from "
                             "them); give two file names")  # fmt: skip

    def _check_servers(self, needs_servers: bool) -> None:
        """ValueError for a flag of servers that outlive the run given --local-shards, or (needs_servers) no servers."""
        if self.skip_examples and self.local_shards is not None:
            raise ValueError("--skip-examples resumes training a model that servers hold; --local-shards starts new, "
                             "empty ones (give --servers)")  # fmt: skip
        if self.create_tables_only and self.local_shards is not None:
            raise ValueError("--create-tables-only sets up tables on servers that outlive the run; --local-shards "
                             "starts throwaway ones, stopped with their tables at the end (give --servers)")  # fmt: skip
        if needs_servers and not self.servers and self.local_shards is None:
            raise ValueError("no servers: give --servers host:port,... (in shard order), or --local-shards N to "
                             "train on N throwaway shards started here and stopped, with the model, at the end")  # fmt: skip

    def worker_resume_file(self) -> str | None:
        """resume_file with RESUME_WORKER replaced by this worker's id."""
        return None if self.resume_file is None else resume_file_of(self.resume_file, self.worker_id)

    def worker_max_examples(self) -> int:
        """The position in this worker's stream of training examples (counted over epochs, the examples
        --skip-examples skips included) where its training stops: worker i of n takes its share of the job's
        --max-examples N, the count of i, i + n, i + 2n, ... below N: (N - i + n - 1) // n (worker i reads the
        lines i, i + n, ... of a file, so the job trains its first N lines); 0: no limit."""
        n, i = self.num_workers, self.worker_id
        return (self.max_examples - i + n - 1) // n if self.max_examples else 0

    def input_files(self) -> dict[str, str | None]:
        """The files the run reads, by flag (None: not given)."""
        return {"--data": self.data, "--eval-data": self.eval_data, "--validation-data": self.validation_data,
                "--schema": self.schema, "--table-config": self.table_config, "--tls-ca": self.tls_ca,
                "--tls-cert": self.tls_cert, "--tls-key": self.tls_key, "--auth-token-file": self.auth_token_file}  # fmt: skip

    def unused_synthetic_settings(self) -> list[str]:
        """The synthetic data's settings given (other than their defaults, as flags: '--synthetic-rows 5000') while
        --data names the data: the run does not use them (--synthetic-seed is not one of them: it seeds the dropout
        masks and the --shuffle order too). Not refused, so that PS_SYNTHETIC_* may stay set."""
        if self.data is None:
            return []
        return [f"--{f.name.replace('_', '-')} {getattr(self, f.name)}" for f in dataclasses.fields(self)
                if f.name.startswith("synthetic_") and f.name != "synthetic_seed"
                and getattr(self, f.name) != f.default]  # fmt: skip

    def with_recipe(
        self, examples: int, unit: str = "training examples", at_least: bool = False
    ) -> tuple[TrainConfig, str, Recipe]:
        """This config with the unset flags taken from the recipe for `examples` training examples (all
        workers together), the line that says so (`unit`: what `examples` counts; at_least: the count
        stopped there, and there are more; see recipe.describe), and the recipe."""
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
        mlp = self.model in MLP_MODELS  # the recipe's dropout and dense L2 are the MLP's: None for a model without one
        fraction = self.validation_fraction
        if fraction is None:
            fraction = 0.0 if self.validation_data else r.validation_fraction
        resolved = dataclasses.replace(
            self,
            batch_size=r.batch_size if self.batch_size is None else self.batch_size,
            epochs=r.epochs if self.epochs is None else self.epochs,
            validation_fraction=fraction,
            early_stop=r.early_stop if self.early_stop is None else self.early_stop,
            early_stop_metric=r.early_stop_metric if self.early_stop_metric is None else self.early_stop_metric,
            shuffle=r.shuffle if self.shuffle is None else self.shuffle,
            max_bad_lines=r.max_bad_lines if self.max_bad_lines is None else self.max_bad_lines,
            max_bad_share=self.max_bad_share if self.max_bad_share is not None
            else MAX_BAD_SHARE if self.max_bad_lines is None else 1.0,
            l2=r.l2 if self.l2 is None else self.l2,
            dropout=(r.dropout if mlp else None) if self.dropout is None else self.dropout,
            dense_l2=(r.dense_l2 if mlp else None) if self.dense_l2 is None else self.dense_l2,
            fm_init_scale=r.fm_init_scale if self.fm_init_scale is None else self.fm_init_scale,
            mlp_output_zeros=self.model in r.mlp_output_zeros if self.mlp_output_zeros is None
            else self.mlp_output_zeros,
            optimizer=optimizer,
            learning_rate=rate,
            optimizer_params=dict(params or {}),
            dense_staleness=self.dense_staleness_or_default() if self.dense == "ps" else None,
            staleness=DEFAULT_STALENESS if self.staleness is None and self.mode == "ssp" else self.staleness,
            geo_every=DEFAULT_GEO_EVERY if self.geo_every is None and self.mode == "geo" else self.geo_every,
            row_cache_bytes=(DEFAULT_ROW_CACHE_BYTES if self.mode == "ssp" else 0) if self.row_cache_bytes is None
            else self.row_cache_bytes,
            job_id=self.job_id or new_job_id(),
            worker_token=self.worker_token or new_worker_token(),
        )  # fmt: skip
        given = [(flag, value) for flag, value in (("--batch-size", self.batch_size), ("--epochs", self.epochs),
                 ("--optimizer", self.optimizer), ("--learning-rate", self.learning_rate), ("--dropout", self.dropout),
                 ("--dense-l2", self.dense_l2), ("--validation-fraction", self.validation_fraction),
                 ("--early-stop", self.early_stop), ("--early-stop-metric", self.early_stop_metric), ("--l2", self.l2), ("--max-bad-lines", self.max_bad_lines),
                 ("--shuffle", None if self.shuffle is None else ("on" if self.shuffle else "off")))
                 if value is not None]  # fmt: skip
        line = describe(r, examples, self.recipe == "auto", mlp=self.model in MLP_MODELS, fm=self.model == "fm", unit=unit,
                        files=self.data is not None, validation_file=self.validation_data, at_least=at_least,
                        zero_output=bool(resolved.mlp_output_zeros))  # fmt: skip
        if geo_instead:
            line += f"; sparse {r.optimizer}, not ftrl, in geo mode (see --mode)"
        if given:
            line += "; instead, as given: " + ", ".join(f"{flag} {value:g}" if isinstance(value, float)
                                                         else f"{flag} {value}" for flag, value in given)  # fmt: skip
        return resolved, line, r

    def dense_staleness_or_default(self) -> int:
        if self.dense_staleness is not None:
            return self.dense_staleness
        return 0  # in the step, with the rows' push: on 2 cores the background thread measured slower (README)

"""A job's parts from its TrainConfig: the data, model and recipe (prepare), the servers, a client, the backend,
the MLP's path, the loop's settings; what train, eval and predict share.

    prepare(cfg)          checks the config, opens the data, applies the recipe: (resolved config, data, model, line)
    check_training(cfg)   prepare and the rest of a training run's checks that hold for every worker of its job,
                          before any server is touched: a CheckedJob; job_lines(job): what the run says of them
    job_client(cfg)       a Client of --servers, or of --local-shards started here and stopped at the end
    client_for, make_backend, dense_path, loop_settings    of a resolved config
    open_job(cfg, tables) all of it on a Client or alike, for tests that drive run_epochs themselves
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from ps.config import HALF_AT_REST, OptimizerConfig, TableConfig
from worker.client import Client
from worker.cluster import LocalCluster
from worker.data import DataSource
from worker.datafiles import check_held_out, describe_files
from worker.dense import DensePath, DenseSync
from worker.formats import first_with_content, read_csv_header
from worker.loop import LoopSettings
from worker.model_tables import (
    check_allreduce_tables,
    check_geo_tables,
    table_config_note,
    table_configs,
    warn_of_geo_ttl,
)
from worker.models.spec import MLP_MODELS, ModelSpec
from worker.recipe import few_steps
from worker.schema import Schema
from worker.schema_notes import columns_line, format_note, libsvm_note
from worker.temp_dirs import remove_stale_temp_dirs
from worker.train_config import TrainConfig
from worker.validation_split import held_out

log = logging.getLogger("worker.train")  # the training job's logger (log lines read "worker.train: ...")
TORCH_HINT = "pip install torch==2.13.0 (a CPU build; `python3 dev.py test` installs it into ./.venv)"


@contextlib.contextmanager
def job_client(cfg: TrainConfig) -> Iterator[Client]:
    """A Client of the job's servers: --servers, or --local-shards started here and stopped at the end (a call to
    a local shard whose process died fails at once, saying so: nothing restarts it)."""
    if cfg.servers:
        with client_for(cfg, list(cfg.servers)) as client:
            yield client
        return
    remove_stale_temp_dirs()  # those of earlier runs killed by SIGKILL
    with LocalCluster(cfg.local_shards) as cluster:
        log.info("started %d local shards: %s (data in %s)", cfg.local_shards, cluster.addresses, cluster.root)
        with client_for(cfg, cluster.addresses, cluster.gone) as client:
            yield client


def client_for(cfg: TrainConfig, addresses: list[str], shard_gone: Callable[[int], str | None] | None = None) -> Client:
    """A Client with the run's deadlines and security settings (none for --local-shards: they take no TLS or
    token, worker/cluster.py); shard_gone: as Client's."""
    from worker.channels import client_token

    if cfg.local_shards is not None:
        return Client(addresses, timeout_s=cfg.timeout_s, server_timeout_s=cfg.server_timeout_s, shard_gone=shard_gone)
    token = client_token(cfg.auth_token_file, cfg.tls_key)
    return Client(addresses, timeout_s=cfg.timeout_s, server_timeout_s=cfg.server_timeout_s, tls_ca=cfg.tls_ca,
                  tls_cert=cfg.tls_cert, tls_key=cfg.tls_key, auth_token=token)  # fmt: skip


def make_backend(spec: ModelSpec, cfg: TrainConfig) -> Any:
    """The forward/backward implementation: numpy (CPU) or torch (cpu or cuda); both take and return numpy."""
    seed = cfg.synthetic_seed * 1_000 + cfg.worker_id  # dropout masks: distinct per worker
    if cfg.backend == "numpy":
        from worker.models.numpy_backend import NumpyModel

        return NumpyModel(spec, seed=seed)
    try:
        from worker.models.torch_backend import TorchModel, worker_device
    except ImportError as e:
        raise ValueError(f"--backend torch needs PyTorch ({e}): {TORCH_HINT}") from None
    # a GPU of its own under allreduce (the group's, where its dropout generator lives); else its LOCAL_RANK's
    return TorchModel(spec, worker_device(cfg.device, exclusive=cfg.dense == "allreduce"), seed=seed)


def model_spec(cfg: TrainConfig, data: DataSource) -> ModelSpec:
    """The model over the data's schema: its sparse fields and tables, its numeric features."""
    schema = data.schema
    return ModelSpec(cfg.model, schema.model_fields(), len(schema.dense_columns()), cfg.hidden, cfg.dropout or 0.0)


def prepare(
    cfg: TrainConfig,
    needs_servers: bool = True,
    training: bool = True,
    labels_optional: bool = False,
    trained_on_data: bool = False,
    warn: bool = True,
) -> tuple[TrainConfig, DataSource, ModelSpec, str]:
    """Checks the config, opens the data (ValueError when it holds no example), applies the recipe: (resolved
    config, data, model, recipe line). training=False (eval, predict): standardized columns must have their
    statistics in the schema, since the training data's cannot be recomputed from another file, unless
    trained_on_data says --data is the data the model was trained on (launch's final evaluation): they are then
    computed over it, as training computed them. labels_optional (predict): files without labels are read as such
    (DataSource). Its warnings (the schema's, settings it leaves unused) are of the flags and the data, the same
    on every worker of a job; warn=False drops them (logging.disable, WARNING and below, while it runs): for
    launch's workers and final evaluation, whose launch said them once, as it checked the job."""
    if not warn:
        before = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            return prepare(cfg, needs_servers, training, labels_optional, trained_on_data)
        finally:
            logging.disable(before)
    cfg.validate(needs_servers)
    unused = cfg.unused_synthetic_settings()
    if unused:
        log.warning("%s not used: --data %s is read (those settings make the data of a run without --data)",
                    ", ".join(unused), cfg.data)  # fmt: skip
    # eval and predict (training=False) read --data for its schema only: no pass over the file to count its lines
    data = DataSource(
        cfg,
        default_table=cfg.model,
        standardize_here=training or trained_on_data,
        labels_optional=labels_optional,
        count=training,
    )
    job_examples = data.job_examples  # the same on every worker
    counted = data.line_count
    at_least = counted is not None and counted.more  # the count stopped at the recipe's threshold
    # a file's count is of its lines, read before training: its malformed lines are found (and skipped) later
    given = cfg
    n, unit = (
        counted.lines if at_least else job_examples,
        "training examples" if cfg.data is None else "lines of training data",
    )
    cfg, recipe_line, chosen = cfg.with_recipe(n, unit, at_least=at_least)
    data.cfg, data.batch_size = cfg, cfg.batch_size
    if training:
        check_validation_flags(given, cfg)
        split = held_out(n, cfg.validation_fraction or 0.0, data.max_validation * cfg.num_workers)
        few = few_steps(chosen, n, cfg.batch_size, cfg.epochs, unit, cfg.max_examples, split, at_least)  # small data
        if few:
            log.warning("%s", few)
    if training and cfg.model == "dnn" and recipe_line.startswith("small-data"):
        log.warning("dnn has no first-order (linear) term: every id reaches the prediction through the MLP only, "
                    "which small data cannot train well (benchmarks/small_data.py, 10,000 rows, 2 seeds: AUC 0.11 under a "
                    "tuned logistic regression where ids are rare, 0.014 where they are frequent); deepfm adds "
                    "the linear and FM terms and stays within 0.005 of it")  # fmt: skip
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


class CheckedJob(NamedTuple):
    """A training run's parts, checked before it touches any server (check_training)."""

    cfg: TrainConfig  # resolved: the recipe's settings filled in
    data: DataSource
    spec: ModelSpec
    recipe_line: str  # the recipe's choice, and the tables' optimizers the schema or --table-config set instead
    tables: list[TableConfig]
    recipe_optimizer: bool  # the sparse tables' optimizer is the recipe's: no flag, --table-config or schema set one


def check_training(cfg: TrainConfig, warn: bool = True) -> CheckedJob:
    """prepare (warn: as its), then the other checks a training run makes before it touches any server that hold
    for every worker of its job: --validation-data or --eval-data that is training data too (check_held_out),
    --validation-data read (the examples it holds), --eval-data's start (DataSource.check_eval; a small file
    whole), the tables' settings (--table-config, the schema's; those --mode geo and --dense allreduce refuse; geo:
    worker 0, warn given, warns of a ttl_steps under which a Shrink drops rows still trained: warn_of_geo_ttl).
    A worker's own share (its validation split, its labels) is train's to read. `ps-worker launch` runs it once
    for its job before it starts anything, and its workers run it again with warn=False."""
    optimizer_given = cfg.optimizer is not None or cfg.table_config is not None  # else the recipe's, unless a schema's
    cfg, data, spec, recipe_line = prepare(cfg, warn=warn)  # (cfg validated: its files are there)
    check_held_out(cfg.data, cfg.validation_data, cfg.eval_data)
    if not cfg.create_tables_only:  # read before any server is touched: a malformed line fails the run here
        if cfg.validation_data:  # read whole, the same file on every worker (a split is of the worker's share)
            data.validation()
        data.check_eval()  # a small --eval-data whole, a larger one's start: scored as it is read, after training
    tables = table_configs(cfg, spec, data.schema.table_overrides(), data.schema.fingerprint())
    own = sorted(t for t, o in data.schema.table_overrides().items() if "optimizer" in o and t in spec.table_dims())
    if own:
        recipe_line += f"; tables {', '.join(own)} use their schema's optimizer instead"
    recipe_line += table_config_note(cfg, spec, data.schema.table_overrides(), tables)
    if cfg.mode == "geo":
        check_geo_tables(tables, spec)
        if warn and cfg.worker_id == 0:  # one worker speaks for the job
            warn_of_geo_ttl(tables, spec, cfg.num_workers, cfg.geo_every)
    if cfg.dense == "allreduce":
        check_allreduce_tables(tables, spec, cfg)
    return CheckedJob(cfg, data, spec, recipe_line, tables, not (optimizer_given or own))


def job_lines(job: CheckedJob) -> list[str]:
    """What a training run says of its job before it trains, the same on every worker: the recipe's choice (and
    the format --format auto took); for worker 0 only, as one worker speaks for the job, how a csv file's columns
    are read and which files a directory, glob or list names."""
    cfg, schema = job.cfg, job.data.schema
    notes = [format_note(schema) if schema.format != "csv" else "", libsvm_note(schema)]  # csv: on the columns line
    lines = [job.recipe_line + "".join(f"; {note}" for note in notes if note)]
    if cfg.worker_id != 0:
        return lines
    if schema.format == "csv" and cfg.data is not None:
        lines.append(columns_line(schema, read_csv_header(first_with_content(cfg.data), schema.delimiter)))
    for flag, given in (("--data", cfg.data), ("--validation-data", cfg.validation_data),
                        ("--eval-data", cfg.eval_data)):  # fmt: skip
        files = describe_files(flag, given)
        if files:
            lines.append(files)
    return lines


def check_validation_flags(given: TrainConfig, resolved: TrainConfig) -> None:
    """ValueError for --early-stop, --early-stop-metric or --eval-every given to a run that holds no validation set
    (they would do nothing)."""
    if resolved.validation_fraction or resolved.validation_data:
        return
    unused = [f"{flag} {value}" for flag, value in (("--early-stop", given.early_stop),
                                                    ("--early-stop-metric", given.early_stop_metric),
                                                    ("--eval-every", given.eval_every)) if value]  # fmt: skip
    if unused:
        whose = "" if given.validation_fraction is not None else ", the recipe's"
        verb = "act" if len(unused) > 1 else "acts"
        raise ValueError(f"{' and '.join(unused)} {verb} on a validation set, and this run has none (--validation-fraction "
                         f"0{whose}): give --validation-fraction F (a share of --data held out) or --validation-data "
                         "FILE")  # fmt: skip


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


def loop_settings(cfg: TrainConfig, data: DataSource, tables: Sequence[TableConfig] = ()) -> LoopSettings:
    """The loop's settings of a resolved config (after prepare); tables: the model's table configs (their
    weight_bounds and values_at_rest, for early stopping's restore)."""
    return LoopSettings(
        epochs=cfg.epochs, prefetch=cfg.prefetch, dense_l2=dense_l2_share(cfg),
        eval_every=cfg.eval_every, early_stop=cfg.early_stop or 0, early_stop_metric=cfg.early_stop_metric or "logloss",
        progress=cfg.progress and not cfg.progress_lines,
        restore_best=bool(cfg.early_stop) and cfg.num_workers == 1 and cfg.dense == "ps",
        progress_lines=cfg.progress_lines, worker=cfg.worker_id,
        total_examples=data.examples - split_held_out(cfg, data),
        skip_examples=cfg.skip_examples,
        max_examples=cfg.worker_max_examples(),
        total_estimated=data.line_count is not None and data.line_count.more,
        weight_bounds={t.name: t.weight_bound for t in tables if t.weight_bound > 0},
        half_at_rest=frozenset(t.name for t in tables if t.values_at_rest == HALF_AT_REST),
    )  # fmt: skip


def split_held_out(cfg: TrainConfig, data: DataSource) -> int:
    """The examples of this worker's share that the validation split holds out, as it picked them (the picks are by
    a hash, so about --validation-fraction of them: worker/validation_split.py); 0 without a split (no
    --validation-fraction, or --validation-data's file instead)."""
    if not cfg.validation_fraction or cfg.validation_data:
        return 0
    return sum(len(b) for b in data.validation())  # read once: the loop validates on these


def dense_l2_share(cfg: TrainConfig) -> float:
    """The dense L2 a worker adds to its MLP weights' gradients at each step: --dense-l2 (0 unset), over the
    workers under --mode sync, whose step's pushes the servers sum: while every worker pushes, the sum holds l2 * W
    once, as one worker's step at the summed batch does. A step of fewer workers (the others' shares ended, or they
    stopped) holds that fraction of it."""
    l2 = cfg.dense_l2 or 0.0
    return l2 / cfg.num_workers if cfg.mode == "sync" else l2


def dense_path(cfg: TrainConfig, tables: Any, spec: ModelSpec, source: Any = None) -> DensePath:
    """The MLP's path of a resolved config: on the servers (DenseSync: in the step, or on a background thread
    within --dense-staleness steps), or averaged among torch workers (AllReduceDense); the pushes either sends apart
    from a step's go through source, the worker's row source: stamped with its job."""
    dense_opt = OptimizerConfig(cfg.dense_optimizer, cfg.dense_learning_rate)
    if cfg.dense == "allreduce":
        from worker.allreduce import AllReduceDense

        if importlib.util.find_spec("torch") is None:
            raise ValueError(f"--dense allreduce needs PyTorch (torch.distributed): {TORCH_HINT}")
        group: dict[str, str] = {}  # a group of one needs no launcher: its rendezvous, set while it forms
        if cfg.num_workers == 1 and "WORLD_SIZE" not in os.environ:
            from worker.cluster import free_port

            group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
        os.environ.update(group)
        try:
            return AllReduceDense(
                tables,
                spec.dense_params(),
                dense_opt,
                device=cfg.device,
                timeout_s=cfg.barrier_timeout_s,
                source=source,
            )
        finally:  # a later run in this process (a test's) or a child it starts does not inherit them
            for name in group:
                os.environ.pop(name, None)
    return DenseSync(tables, spec.dense_params(), cfg.dense_sync_every, cfg.dense_staleness_or_default(), source)


def open_job(cfg: TrainConfig, tables: Any) -> tuple[TrainConfig, DataSource, ModelSpec, Any, DenseSync]:
    """prepare, the backend, the tables created on `tables` (a Client or alike), the dense parameters pulled:
    what run_epochs needs, for tests that drive it themselves."""
    cfg, data, spec, _ = prepare(cfg, needs_servers=False)
    for table in table_configs(cfg, spec, data.schema.table_overrides(), data.schema.fingerprint()):
        tables.create_table(table)
    dense = DenseSync(tables, spec.dense_params(), cfg.dense_sync_every)
    dense.pull()
    return cfg, data, spec, make_backend(spec, cfg), dense

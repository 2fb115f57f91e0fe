"""Parsed `ps-worker train` and `eval` arguments (and the ones predict shares) made into the TrainConfig they run
with: list flags split, the job id of --job-id, the worker's place from the flags or torchrun's variables."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping

from ps.flagtypes import is_plain_number, not_plain
from ps.settings import add_config_flag, apply_defaults
from ps.stamp import is_job_name, job_hash
from worker.cli_train_flags import add_train_parser
from worker.flags import server_list
from worker.models.spec import DEFAULT_HIDDEN
from worker.train_config import TrainConfig
from worker.train_config_ignored import DEFAULT_METRICS_HOST, check_given_hidden, check_given_metrics_host


def names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def hidden_widths(text: str | None, model: str) -> tuple[int, ...]:
    """The widths of --hidden (DEFAULT_HIDDEN where not given, or given empty); ValueError for text that is no
    list of integers, or given to a model without an MLP."""
    if text is None or not text.strip():  # PS_HIDDEN= (empty): not given, as elsewhere
        return DEFAULT_HIDDEN
    parts = [s.strip() for s in text.split(",")]
    try:
        widths = tuple(int(s) for s in parts if is_plain_number(s))
    except ValueError:
        widths = ()
    if len(widths) != len(parts):
        raise ValueError(f"--hidden {text!r}: expected comma-separated integers, e.g. 400,400,400{not_plain(text)}")
    check_given_hidden(widths, model)
    return widths


def common_config(args: argparse.Namespace) -> dict:
    """TrainConfig fields that train, eval and predict share (predict's synthetic ones left at their defaults)."""
    synthetic = ("synthetic_history", "synthetic_rows", "synthetic_eval_rows", "synthetic_interactions",
                 "synthetic_seed")  # fmt: skip
    return dict(
        **{k: getattr(args, k) for k in synthetic if hasattr(args, k)},
        servers=server_list(args.servers), data=args.data, eval_data=getattr(args, "eval_data", None),
        format=args.format, label_column=args.label_column, drop_columns=names(args.drop_columns),
        numeric_columns=names(args.numeric_columns), max_bad_lines=args.max_bad_lines,
        libsvm_fields=args.libsvm_fields, libsvm_values=args.libsvm_values, schema=args.schema, model=args.model, backend=args.backend,
        device=args.device, embedding_dim=args.embedding_dim,
        hidden=hidden_widths(args.hidden, args.model), batch_size=args.batch_size, timeout_s=args.timeout_s,
        server_timeout_s=args.server_timeout, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
        auth_token_file=args.auth_token_file,
    )  # fmt: skip


UNNAMED_RUN = "none"  # torchrun's TORCHELASTIC_RUN_ID when given no --rdzv-id


def job_id(text: str | None) -> tuple[int | None, str]:
    """The job id of --job-id (an integer, or any other text hashed to one), else torchrun's TORCHELASTIC_RUN_ID
    hashed, else None; with the job's name: that text where it is no integer and fits a stamp's job_name
    (ps.stamp is_job_name: the shards' messages name the job by it), else "" (they name it by its id).
    TORCHELASTIC_RUN_ID "none" is no job's: it is torchrun's --rdzv-id when none is given (its static rendezvous, of
    several nodes or a --master-port), the same for every run, so that a second job under it would be refused as a
    run of the first (ps.engine.jobs: a job id is for one run)."""
    if text is None:
        text = os.environ.get("TORCHELASTIC_RUN_ID")
        if text == UNNAMED_RUN:
            return None, ""
    if text is None:
        return None, ""
    name = ""
    try:
        value = int(text, 0)
    except ValueError:
        value = job_hash(text)
        name = text if is_job_name(text) else ""
    if not 0 < value < 2**64:
        raise ValueError(f"--job-id {text}: expected an integer in [1, 2**64) or a name")
    return value, name


def _from_env(value: int | None, variable: str, default: int) -> int:
    """A flag's value, else the environment variable torchrun sets, else default."""
    if value is not None:
        return value
    text = os.environ.get(variable)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"${variable} is {text!r}: expected an integer") from None


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of parsed `train` arguments (--worker-id and --num-workers default to torchrun's $RANK and
    $WORLD_SIZE)."""
    worker_id = _from_env(args.worker_id, "RANK", 0)
    num_workers = _from_env(args.num_workers, "WORLD_SIZE", 1)
    job, job_name = job_id(args.job_id)
    from_env = [f"${v} is {os.environ[v]}" for given, v in ((args.worker_id, "RANK"), (args.num_workers, "WORLD_SIZE"))
                if given is None and v in os.environ]  # fmt: skip
    if from_env and not 0 <= worker_id < num_workers:  # validate's message would name flags not given
        raise ValueError(f"worker {worker_id} of {num_workers} is no worker of the job: {' and '.join(from_env)} "
                         "(torchrun's variables, the defaults of --worker-id and --num-workers); expected 0 <= RANK < "
                         "WORLD_SIZE: give --worker-id and --num-workers, or unset the variables")  # fmt: skip
    if getattr(args, "dense", None) == "allreduce":  # the data share follows the flags, the group's rank the env
        for flag, value, variable in (("--worker-id", worker_id, "RANK"), ("--num-workers", num_workers, "WORLD_SIZE")):
            if os.environ.get(variable) not in (None, str(value)):
                raise ValueError(f"{flag} {value} but ${variable} is {os.environ[variable]}: --dense allreduce takes "
                                 f"its rank from ${variable}, so the worker would train one share and average as "
                                 "another; leave the flag out, or make them agree")  # fmt: skip
    if not args.create_tables_only:  # a deployment's create-tables job shares the workers' settings, not their port
        check_given_metrics_host(args.metrics_host, args.metrics_port)
    return TrainConfig(
        **common_config(args),
        local_shards=args.local_shards,
        worker_id=worker_id,
        num_workers=num_workers,
        prefetch=args.prefetch,
        optimizer=args.optimizer,
        learning_rate=args.learning_rate,
        dense_optimizer=args.dense_optimizer,
        dense_learning_rate=args.dense_learning_rate,
        dense_sync_every=args.dense_sync_every,
        epochs=args.epochs,
        recipe=args.recipe,
        validation_fraction=args.validation_fraction,
        validation_data=args.validation_data,
        eval_every=args.eval_every,
        skip_examples=args.skip_examples,
        resume_file=args.resume_file or None,  # PS_RESUME_FILE= (empty): none
        max_examples=args.max_examples,
        early_stop=args.early_stop,
        early_stop_metric=args.early_stop_metric,
        shuffle=None if args.shuffle == "auto" else args.shuffle == "on",
        l2=args.l2,
        dense_l2=args.dense_l2,
        dropout=args.dropout,
        metrics_out=args.metrics_out,
        metrics_port=args.metrics_port,
        metrics_host=DEFAULT_METRICS_HOST if args.metrics_host is None else args.metrics_host,
        table_config=args.table_config,
        progress=not args.no_progress,
        create_tables_only=args.create_tables_only,
        mode=args.mode,
        staleness=args.staleness,
        geo_every=args.geo_every,
        barrier_timeout_s=args.barrier_timeout,
        job_id=job,
        job_name=job_name,
        row_cache_bytes=args.row_cache_bytes,
        dense=args.dense,
        dense_staleness=args.dense_staleness,
        progress_lines=args.progress_lines,
        launched=args.launched,
        final_eval=not args.no_final_eval,
    )


def train_config_from_argv(argv: list[str], environ: Mapping[str, str] | None = None) -> TrainConfig:
    """The TrainConfig `ps-worker train ARGV` would run with in environ (default: os.environ's PS_* variables);
    ValueError, or SystemExit from argparse, when the arguments are wrong."""
    parser = argparse.ArgumentParser(prog="ps-worker")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_config_flag(sub.choices["train"])
    apply_defaults(parser, ["train", *argv], environ=environ)
    return train_config(parser.parse_args(["train", *argv]))


def eval_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of parsed `eval` arguments: --eval-data alone also stands for --data (the file whose first
    lines give the schema)."""
    cfg = TrainConfig(**common_config(args), prefetch=args.prefetch, progress=not args.no_progress)
    if cfg.data is None and cfg.eval_data is not None:
        cfg = dataclasses.replace(cfg, data=cfg.eval_data)
    return cfg

"""The `train` and `eval` commands of ps-worker: their flags, the TrainConfig they make, and running them; the flag
groups `predict` (worker/cli_predict.py) shares with them."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Mapping

from ps.config import (
    DEFAULT_LEARNING_RATES,
    MAX_BARRIER_S,
    MAX_HYPERPARAMETER,
    MAX_INTERVAL_S,
    MAX_MEMORY_BYTES,
    MAX_MEMORY_TEXT,
    OPTIMIZER_PARAMS,
)
from ps.settings import HelpFormatter, add_config_flag, apply_defaults, byte_size, integer, number
from ps.stamp import is_job_name, job_hash
from worker.flags import server_list
from worker.models.spec import MODEL_NAMES
from worker.progress_lines import JSON_EVERY_S
from worker.readers.share import BAD_SHARE_AFTER
from worker.recipe import BIG_BATCH_EXAMPLES, EARLY_STOP_METRICS, LARGE, MAX_BAD_SHARE, RECIPES, SMALL
from worker.results import format_results, json_figures, local_shards_gone, model_kept
from worker.schema import FORMAT_CHOICES, LABEL_NAMES, LIBSVM_VALUES
from worker.train_config import DEFAULT_GEO_EVERY, DEFAULT_STALENESS, DENSE_PATHS, MODES, TrainConfig

SECONDS = number(0, MAX_INTERVAL_S, above=True)  # argparse types of the train and eval flags
SECONDS_OR_0 = number(0, MAX_INTERVAL_S)
RATE = number(0, MAX_HYPERPARAMETER, above=True)

log = logging.getLogger("worker.cli_train")


def _size(text: str) -> int:
    """Bytes of a size flag, 0 to MAX_MEMORY_BYTES, spelled as the server's sizes are (ps.settings.byte_size)."""
    try:
        value = byte_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of bytes, e.g. 67108864, or 64M") from None
    if not 0 <= value <= MAX_MEMORY_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r}: expected bytes from 0 to {MAX_MEMORY_TEXT}")
    return value


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    d = TrainConfig()
    p = sub.add_parser(
        "train",
        help="train a CTR model against parameter servers",
        description="Train a CTR model (LR, FM, DeepFM or DNN; numpy on the CPU or PyTorch on the CPU or a GPU) on "
        "Criteo, CSV or libsvm files, or on synthetic data with a planted model. Sparse rows and dense (MLP) "
        "parameters live on the servers, so workers of either backend can train one model together. With "
        "--local-shards N instead of --servers it starts N server processes on 127.0.0.1 and stops them, with the "
        "model, at the end. Prints eval AUC / logloss / examples per second (and the oracle's, for synthetic data).",
        formatter_class=HelpFormatter,
    )
    where = p.add_argument_group("servers")
    where.add_argument("--servers", default=None, help="comma-separated host:port list, in shard order")
    where.add_argument(
        "--local-shards", type=integer(1), default=None,
        help="instead of --servers: train on N throwaway shards started on 127.0.0.1 (the model goes with them)",
    )  # fmt: skip
    where.add_argument("--timeout-s", type=SECONDS, default=d.timeout_s, help="deadline of every server call")
    add_security_args(p)
    where.add_argument(
        "--server-timeout",
        type=SECONDS_OR_0,
        default=d.server_timeout_s,
        help="how long a server may stay down, counted from the first failed call to it, before the run exits with an "
        "error (its calls are sent again meanwhile, and the worker logs which server it waits for)",
    )
    add_data_args(p, d, "train")
    work = p.add_argument_group("workers")
    work.add_argument("--worker-id", type=integer(0), default=None,
                      help="this worker's index: it trains on its share of the data (default: $RANK, else 0)")  # fmt: skip
    work.add_argument("--num-workers", type=integer(1), default=None,
                      help="workers sharing the data and the tables (default: $WORLD_SIZE, else 1)")  # fmt: skip
    work.add_argument(
        "--prefetch",
        type=integer(0),
        default=d.prefetch,
        help="batches whose rows are pulled ahead on a thread while one computes; rows the last pushes returned are laid over them, so training sees the rows a pull just before computing would (0: pull in the step)",
    )
    modes = p.add_argument_group(
        "training modes (several workers)",
        "How workers agree, on the servers' clock: async (each push applied as it comes), sync (a step's pushes of "
        "all workers summed and applied once, before any worker's next pull), ssp (no worker more than --staleness "
        "steps ahead of the slowest), geo (each worker trains local copies of its rows and pushes their deltas "
        "every --geo-every steps; not with ftrl, whose other workers' deltas it would lose: the small-data recipe takes "
        "adagrad under it). A wait has a deadline (--barrier-timeout): past it the job stops, naming the "
        "worker it waited for. `ps-worker launch` starts several workers with one command.",
    )
    modes.add_argument(
        "--mode",
        default=d.mode,
        choices=list(MODES),
        help="how the workers agree: async, sync, ssp or geo (see the group's description in --help)",
    )
    modes.add_argument("--staleness", type=integer(0), default=None,
                       help=f"ssp: steps a worker may run ahead of the slowest (default {DEFAULT_STALENESS})")  # fmt: skip
    modes.add_argument("--geo-every", type=integer(1), default=None,
                       help=f"geo: steps between pushes of the local rows' deltas (default {DEFAULT_GEO_EVERY})")  # fmt: skip
    modes.add_argument("--barrier-timeout", type=number(0, MAX_BARRIER_S, above=True), default=d.barrier_timeout_s,
                       help="seconds a sync or ssp wait for another worker may last before the job stops, and "
                       "a job not heard from holds the shards")  # fmt: skip
    modes.add_argument("--job-id", default=None,
                       help="the job's id, the same for all its workers: an integer, or a name, which the servers' "
                       "messages then name the job by (up to 100 printable ASCII characters) (needed with several "
                       "workers; a new one per job; torchrun's TORCHELASTIC_RUN_ID when set, but for its 'none' (no "
                       "--rdzv-id); `ps-worker launch` picks one; else the one --resume-file keeps (async, geo: a sync or "
                       "ssp job resumes under a new one), else a random one)")  # fmt: skip
    modes.add_argument("--row-cache-bytes", type=_size, default=None,
                       help="ssp: a worker cache of rows served while within the staleness bound, evicting the "
                       "least frequently used (e.g. 64M; default 64M for ssp, 0 otherwise)")  # fmt: skip
    modes.add_argument("--dense", default=d.dense, choices=list(DENSE_PATHS),
                       help="ps: the MLP on the servers; allreduce: on each worker, gradients averaged with "
                       "torch.distributed (needs PyTorch; env:// rendezvous, as torchrun or `ps-worker launch` set it)")  # fmt: skip
    modes.add_argument("--dense-staleness", type=integer(0), default=None,
                       help="--dense ps: steps the MLP weights may lag, pushed and fetched on a background thread "
                       "(default 0: in the step, sent with the rows' push; not with --mode sync)")  # fmt: skip
    add_model_args(p, d)
    model = p.add_argument_group("optimizer")
    model.add_argument(
        "--optimizer",
        default=None,
        choices=sorted(OPTIMIZER_PARAMS),
        help="server-side optimizer of the sparse tables (default: the recipe's: ftrl with l2 300 for small data, "
        "adagrad for large)",
    )
    model.add_argument("--learning-rate", type=RATE, default=None,
                       help="sparse optimizer step size (default: the recipe's, or the optimizer's: "
                       + ", ".join(f"{rate:g} {name}" for name, rate in DEFAULT_LEARNING_RATES.items()) + ")")  # fmt: skip
    model.add_argument(
        "--dense-optimizer",
        default=d.dense_optimizer,
        choices=["adam", "sgd", "adagrad"],
        help="server-side optimizer of the MLP",
    )
    model.add_argument(
        "--dense-learning-rate", type=RATE, default=d.dense_learning_rate, help="dense optimizer step size"
    )
    model.add_argument(
        "--dense-sync-every",
        type=integer(1),
        default=d.dense_sync_every,
        help="push summed dense gradients and pull new MLP weights every k steps",
    )
    model.add_argument(
        "--l2",
        type=number(0, 1e6),
        default=None,
        help="lazy L2 of the sparse tables: a row's embedding decays by (1 - learning rate * l2) per clock step, "
        "applied by the servers when the row is next pushed (not with ftrl, which has its own, nor --mode geo, whose "
        f"deltas it never reaches; default: the recipe's: {SMALL.l2:g} for small data, {LARGE.l2:g} for large)",
    )
    model.add_argument("--dense-l2", type=number(0, 1e6), default=None,
                       help=f"L2 penalty on the MLP weights (default: the recipe's: {SMALL.dense_l2:g} for small data, "
                       f"{LARGE.dense_l2:g} for large)")  # fmt: skip
    model.add_argument(
        "--dropout",
        type=number(0, 0.95),
        default=None,
        help=f"dropout rate of the MLP's hidden units in training (default: the recipe's: {SMALL.dropout:g} for "
        f"small data, {LARGE.dropout:g} for large)",
    )
    fit = p.add_argument_group(
        "schedule and validation",
        "Unset flags here come from a recipe for the data's size: small data (under 1M training examples) "
        f"trains in batches of {SMALL.batch_size} ({LARGE.batch_size} from {BIG_BATCH_EXAMPLES:,}) for up to "
        f"{SMALL.epochs} epochs, validates on a 10% split after each and stops after "
        f"{SMALL.early_stop} without improvement; large data trains one epoch in batches of 2048. The run prints its "
        "choice.",
    )
    fit.add_argument(
        "--recipe",
        default=d.recipe,
        choices=list(RECIPES),
        help="auto: small or large by the number of training examples",
    )
    fit.add_argument(
        "--batch-size",
        type=integer(1),
        default=None,
        help=f"examples per step (default: small: {SMALL.batch_size}, {LARGE.batch_size} from "
        f"{BIG_BATCH_EXAMPLES:,} training examples; large: {LARGE.batch_size})",
    )
    fit.add_argument(
        "--epochs",
        type=integer(1),
        default=None,
        help=f"passes over the training data, at most (default: small: {SMALL.epochs}, large: {LARGE.epochs})",
    )
    fit.add_argument(
        "--shuffle",
        choices=["auto", "on", "off"],
        default="auto",
        help="on: hold this worker's training examples in memory and train each epoch in a fresh random order "
        "(seeded by --synthetic-seed and the worker id); off: in the data's order, read as it trains (auto: the "
        "recipe's: on for small data, off for large)",
    )
    fit.add_argument(
        "--validation-fraction",
        type=number(0, 0.5),
        default=None,
        help="share of the training examples held out to validate on (default: small: 0.1, large: 0)",
    )
    fit.add_argument("--validation-data", default=None, help="data to validate on instead of a split (a file, or "
                     "many as --data)")  # fmt: skip
    fit.add_argument(
        "--eval-every",
        type=integer(0),
        default=d.eval_every,
        help="steps between validations, and one at each epoch's end (0: at each epoch's end only)",
    )
    fit.add_argument(
        "--early-stop",
        type=integer(0),
        default=None,
        help=f"stop after this many validations without a better one (--early-stop-metric; 0: never; default: small: {SMALL.early_stop}, "
        f"large: {LARGE.early_stop})",
    )
    fit.add_argument(
        "--early-stop-metric",
        choices=list(EARLY_STOP_METRICS),
        default=None,
        help="the validation figure early stopping and the best model kept go by: logloss (lower is better) or "
        f"auc (higher) (default: the recipe's: {SMALL.early_stop_metric})",
    )
    fit.add_argument(
        "--skip-examples",
        type=integer(0),
        default=d.skip_examples,
        help="resume a stopped run: read and skip the first N training examples of this worker's share (counted "
        "over epochs) and train on from there, on the servers that hold that run's model; a stopped run prints its N",
    )
    fit.add_argument(
        "--resume-file",
        default=None,
        help="keep this worker's position in FILE (as it starts, every 10 s, and as it stops or ends) and, when FILE exists, "
        "train on from it: the same command started again (a restart policy's, a Job's retry) resumes instead of "
        "training from the start; refused where FILE is another run's, or in use by a run still going; {worker} in the name: the worker's id; "
        "--mode sync or ssp: the job resumes whole, every worker under a new --job-id; not used (a warning) with "
        "--dense allreduce",
    )
    fit.add_argument(
        "--max-examples",
        type=integer(0),
        default=d.max_examples,
        help="stop training after N examples, counted over epochs from the data's start, and end the run as at its "
        "last epoch (validation, final evaluation, summary); N is the job's total: worker i of n (--num-workers, "
        "launch's --workers) stops at its share, (N - i + n - 1)//n examples of its own stream; a resumed run's "
        "--skip-examples count toward it, so the same N ends it where the stopped run would have ended (0: no limit)",
    )
    model.add_argument(
        "--table-config", help="TOML file with table settings (optimizer and its parameters, initializer, weight "
        "bound, admission, eviction) that override the model's defaults; see docs/tables.md",
    )  # fmt: skip
    out = p.add_argument_group("output")
    out.add_argument(
        "--metrics-out", help="write the final figures as one JSON object to this file (replaced if it exists)"
    )
    out.add_argument(
        "--create-tables-only",
        action="store_true",
        help="create the model's tables on the servers (idempotent) and exit: a one-shot setup job",
    )
    out.add_argument(
        "--metrics-port",
        type=integer(0, 65535),
        default=None,
        help="serve Prometheus metrics of the run at http://HOST:PORT/metrics, plain HTTP with no token (0: a free "
        "port; HOST: --metrics-host)",
    )
    out.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the --metrics-port endpoint listens on (0.0.0.0: every interface; see docs/security.md)",
    )
    out.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (when stderr is no terminal, a plain progress line every 30 s takes the bar's place)",
    )
    out.add_argument("--no-final-eval", action="store_true",
                     help="no evaluation of the eval set after training (`ps-worker launch` gives it to its workers and "
                     "scores the job's model once, after all of them)")  # fmt: skip
    out.add_argument("--progress-lines", action="store_true",
                     help=f"instead of a bar, a line 'PROGRESS {{json}}' on stdout every {JSON_EVERY_S:g} s, of training "
                     "(what `ps-worker launch` merges) then of the final evaluation's scoring; a dashboard can read "
                     "them too")  # fmt: skip
    out.add_argument("--launched", action="store_true",
                     help="for `ps-worker launch`'s workers: not what launch says once for the job (the data's "
                     "warnings, the recipe, a csv's columns, where the workers can resume, where the model is)")  # fmt: skip


def add_data_args(p: argparse.ArgumentParser, d: TrainConfig, command: str) -> None:
    """The data flags of `train`, `eval` or `predict` (command); predict has no synthetic data."""
    bad_share = (
        f"at most 1 in {round(1 / MAX_BAD_SHARE)} of the lines read once more than {BAD_SHARE_AFTER} are malformed"
    )
    data = p.add_argument_group("data")
    if command in ("eval", "predict"):
        other = f"--{command}-data"
        data.add_argument("--data", help="the training data, whose first file's first lines give the schema (a csv "
                          f"header, libsvm's field count); scored when no {other} is given; .gz read transparently; "
                          "a file, or many as for train")  # fmt: skip
        if command == "eval":
            data.add_argument("--eval-data", help="the data to score, in the training data's format (a file, or many "
                              "as --data)")  # fmt: skip
        else:
            data.add_argument("--predict-data", help="the data to score (a file, or many as --data: the output then "
                              "names each row's file), in the training data's format, with or without labels (csv: no "
                              "label column; criteo: 39 columns; libsvm: no label token)")  # fmt: skip
    else:
        data.add_argument("--data", help="training data: a file (.gz is read transparently), or many read in order as "
                          "one stream: a directory (its files by name; hidden files, names starting with '_' and "
                          "non-data suffixes such as .crc/.md/.json skipped), a quoted glob ('day_*.gz'), or a comma-separated list of these; all in one "
                          "format (without it: synthetic data)")  # fmt: skip
        data.add_argument("--eval-data", help="held-out data (a file, or many as --data), same format, scored after "
                          "training (the eval line)")  # fmt: skip
    data.add_argument(
        "--schema",
        default=None,
        help="TOML feature schema: columns, kinds (categorical, multi_hot, weighted, numeric), tables "
        "and widths, pooling, transforms (worker/schema.py; `ps-worker schema --data FILE` writes a "
        "starting one); without it --format and the column flags make a built-in one; its own `format` is read",
    )
    data.add_argument("--format", default=d.format, choices=list(FORMAT_CHOICES),
                      help="auto: told by the first line of --data's first file (train prints it): libsvm, criteo "
                      "(40 tab-separated columns, 0/1 first), csv (a header line of names separated by commas, tabs, "
                      "; or |: the delimiter said too); criteo: tab-separated label, 13 ints, 26 hex, no header; "
                      "csv: a header of comma-separated names, see the column flags; "
                      "libsvm: 'label id:value ...' (labels 0/1 or -1/+1)")  # fmt: skip
    data.add_argument("--label-column", help="csv: the label column (default: the one column holding 0 and 1 named "
                      f"{', '.join(LABEL_NAMES[:-1])} or {LABEL_NAMES[-1]}, any case, or, where none is, whose name "
                      "holds a label's word such as click; else the first column if it holds 0 and 1)")  # fmt: skip
    data.add_argument("--drop-columns", default="", help="csv: comma-separated columns to ignore")
    data.add_argument(
        "--numeric-columns",
        default="",
        help="csv: comma-separated numeric columns (dense features, which only deepfm and dnn use, each read as "
        "log(1 + x), a value below 0 as 0; `ps-worker schema` writes a schema that bucketizes them for lr and fm too "
        "and standardizes columns with values below 0); the others are categorical",
    )
    data.add_argument(
        "--libsvm-fields",
        type=integer(1),
        default=None,
        help="libsvm: the number of fields K (default: the most features of a line among the first 10,000 of --data; give the training file's K to eval)",
    )
    data.add_argument(
        "--libsvm-values",
        default=d.libsvm_values,
        choices=list(LIBSVM_VALUES),
        help="libsvm: weights reads each feature's value as its weight, one-hot leaves values out (the id alone); "
        "auto: weights where the first 10,000 lines of data of --data carry a value other than 0 and 1, else "
        "one-hot, warning of a later line that carries one; give eval and predict the training run's",
    )
    data.add_argument(
        "--max-bad-lines",
        type=integer(0),
        default=d.max_bad_lines,
        help="malformed lines skipped (and reported) before the run fails (default: the recipe's: "
        f"{SMALL.max_bad_lines:,} for small data, read whole before the first push to take a validation split; "
        f"{LARGE.max_bad_lines:,} for large data, which is read as it trains, while they are {bad_share}; a number "
        "given here bounds them alone)"
        if command == "train"
        else f"malformed lines skipped (and reported) before {'the evaluation' if command == 'eval' else 'predict'} "
        f"fails (default: {LARGE.max_bad_lines:,}, while they are {bad_share}; a number given here bounds them alone)",
    )
    if command == "predict":
        return
    data.add_argument(
        "--synthetic-rows", type=integer(1), default=d.synthetic_rows, help="synthetic training rows (no --data)"
    )
    data.add_argument(
        "--synthetic-eval-rows", type=integer(0), default=d.synthetic_eval_rows, help="synthetic eval rows"
    )
    data.add_argument(
        "--synthetic-interactions", type=number(-1e3, 1e3), default=d.synthetic_interactions,
        help="strength of the planted pairwise field interactions (0 = a purely linear planted model)",
    )  # fmt: skip
    data.add_argument(
        "--synthetic-history", type=number(0, 1e3), default=d.synthetic_history,
        help="strength of a planted multi-hot history column (0 = no such column)",
    )  # fmt: skip
    also = ", and of the dropout masks and the --shuffle order" if command == "train" else ""
    data.add_argument(
        "--synthetic-seed",
        type=integer(0, 2**63 - 1),
        default=d.synthetic_seed,
        help=f"seed of the synthetic data{also}",
    )


def add_model_args(p: argparse.ArgumentParser, d: TrainConfig) -> None:
    model = p.add_argument_group("model")
    model.add_argument("--model", default=d.model, choices=list(MODEL_NAMES),
                       help="lr: logistic regression; fm: factorization machine; deepfm: FM + MLP; dnn: embeddings + MLP")  # fmt: skip
    model.add_argument(
        "--backend",
        default=d.backend,
        choices=["numpy", "torch"],
        help="where forward/backward run: numpy (CPU) or PyTorch",
    )
    model.add_argument(
        "--device", default=d.device, choices=["cpu", "cuda"], help="torch device (cuda needs --backend torch)"
    )
    model.add_argument(
        "--embedding-dim", type=integer(1), default=d.embedding_dim, help="embedding (FM latent) floats per id"
    )
    model.add_argument("--hidden", default=",".join(map(str, d.hidden)), help="MLP hidden widths (deepfm, dnn)")


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate the model the servers hold",
        description="Pull the rows and dense parameters the servers hold and report AUC and logloss on --eval-data, "
        "else on --data (or, with neither, on the synthetic eval rows). The model and data flags must be those the "
        "model was trained with.",
        formatter_class=HelpFormatter,
    )
    add_served_model_args(p, "eval")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (when stderr is no terminal, a plain progress line every 30 s takes the bar's place)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_served_model_args(p: argparse.ArgumentParser, command: str) -> None:
    """The flags of `eval` and `predict` (command) that find the servers and rebuild the model they hold."""
    d = TrainConfig()
    p.add_argument("--servers", required=True, help="comma-separated host:port list, in shard order")
    p.add_argument("--timeout-s", type=SECONDS, default=d.timeout_s, help="deadline of every server call")
    p.add_argument(
        "--server-timeout",
        type=SECONDS_OR_0,
        default=d.server_timeout_s,
        help="how long a server may stay down, counted from the first failed call to it, before exiting with an error",
    )
    add_security_args(p)
    p.add_argument("--batch-size", type=integer(1), default=2048, help="examples per pull")
    p.add_argument("--prefetch", type=integer(0), default=d.prefetch,
                   help="batches read and their rows pulled ahead on a thread while one is scored (0: each in turn); "
                   "the scores are the same")  # fmt: skip
    add_data_args(p, d, command)
    add_model_args(p, d)


def names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def hidden_widths(text: str) -> tuple[int, ...]:
    parts = [s.strip() for s in text.split(",")] if text.strip() else []
    try:
        if "" in parts:
            raise ValueError("an empty entry")
        return tuple(int(s) for s in parts)
    except ValueError:
        raise ValueError(f"--hidden {text!r}: expected comma-separated integers, e.g. 400,400,400") from None


def add_security_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (servers started with TLS or a token)")
    g.add_argument("--tls-ca", default=None, help="PEM CA to verify the servers' TLS certificates (turns TLS on)")
    g.add_argument("--tls-cert", default=None, help="PEM client certificate, for servers that require one (mutual TLS)")
    g.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    g.add_argument("--auth-token-file", default=None, help="file holding the token the servers require")


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
        hidden=hidden_widths(args.hidden), batch_size=args.batch_size, timeout_s=args.timeout_s,
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
        metrics_host=args.metrics_host,
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


def run_train(args: argparse.Namespace) -> int:
    from worker.train import train

    cfg = train_config(args)
    with contextlib.ExitStack() as stack:
        if cfg.resume_file is not None and not cfg.create_tables_only:  # (a setup job in the workers' environment)
            cfg = resumed(cfg, stack)
            if cfg is None:
                return 0
        results = train(cfg)
    print(format_results(results, launched=cfg.launched), flush=True)
    if cfg.metrics_out and not cfg.launched and "metrics_error" not in results:  # launch reads the file (and
        print(f"metrics written to {cfg.metrics_out}")  # removes it)
    if cfg.local_shards is not None:
        print(local_shards_gone("train"), flush=True)
    elif not cfg.launched and "created_tables" not in results:  # a launcher's worker: launch says it
        print(model_kept(",".join(cfg.servers)), flush=True)
    failed = [results[k] for k in ("eval_error", "metrics_error") if k in results]
    for error in failed:  # the training is done and reported; its evaluation, or its figures' file, is not
        print(f"ps-worker: error: {error}", file=sys.stderr, flush=True)
    return 2 if failed else 0


def resumed(cfg: TrainConfig, stack: contextlib.ExitStack | None = None) -> TrainConfig | None:
    """cfg to run under --resume-file: with --skip-examples from the file's position (worker/resume.py; only the
    final evaluation when its training was over; sync and ssp under a new job id, a worker whose training was over
    telling it that it is done: resume_rejoins), as given when there is no file yet, without the file where one
    worker cannot resume alone (a warning says why); None (said) when the file says the run ended. ValueError for a
    file of another run, for a --skip-examples other than the one the file's run started from, and, with a stack,
    for a file another run holds (the stack then holds it, worker.resume.held, until it closes)."""
    from ps.stamp import job_named
    from worker.resume import held, read_position, rejoins, resume_path, resumes_whole, unused_because

    cfg.validate()
    why = unused_because(cfg)
    if why:
        log.warning("--resume-file %s is not used: %s", cfg.resume_file, why)
        return dataclasses.replace(cfg, resume_file=None)
    cfg = dataclasses.replace(cfg, resume_file=resume_path(cfg))
    if stack is not None:
        stack.enter_context(held(cfg.resume_file))
    position = read_position(cfg)
    # the job id the file keeps, unless one is given (read_position refused another): a worker killed without a
    # word leaves its job holding the shards, which let only that job push; the job's name the file keeps, unless
    # one is given (an integer --job-id, the file's id, gives none); and the worker's token, which makes a
    # restart the same process for them (none: TrainConfig.with_recipe makes the run's up, and the file keeps them
    # from before its first CreateTable on: worker/train.py)
    # (sync and ssp resume under a new job id, never the file's: read_position refused it where it was given)
    job = cfg.job_id or (position and not resumes_whole(cfg) and position.job_id) or None
    kept_name = position.job_name if position and position.job_id == job else ""
    cfg = dataclasses.replace(cfg, job_id=job, job_name=cfg.job_name or kept_name,
                              worker_token=cfg.worker_token or (position and position.token) or 0)  # fmt: skip
    if position is None:
        print(f"--resume-file {cfg.resume_file}: no position yet; this run keeps it there", flush=True)
        return cfg
    if cfg.skip_examples != position.started_from:  # the same command gives the same value again
        raise ValueError(f"--skip-examples {cfg.skip_examples} and --resume-file {cfg.resume_file}, the position "
                         f"({position.examples:,} examples) of a run started with --skip-examples "
                         f"{position.started_from}: give that run's command (the file's position then wins), or "
                         "remove the file")  # fmt: skip
    rejoin = rejoins(cfg, position)  # its peers wait for it unless it says it is done
    if position.finished and not rejoin:
        print(f"--resume-file {cfg.resume_file}: this worker's run ended before, after {position.examples:,} "
              "examples; nothing to do (remove the file to train again)", flush=True)  # fmt: skip
        return None
    if position.trained and rejoin:
        before, now = job_named(position.job_id or 0, position.job_name), job_named(job, cfg.job_name)
        print(f"--resume-file {cfg.resume_file}: this worker's training ended after {position.examples:,} examples, "
              f"in job {before}; telling job {now} (its workers resumed) that this worker is done, then evaluating"
              f"{' again' if position.finished else ''}", flush=True)  # fmt: skip
    elif position.trained:
        print(f"--resume-file {cfg.resume_file}: this worker's training ended after {position.examples:,} examples, "
              "its final evaluation did not: evaluating", flush=True)  # fmt: skip
    else:
        print(f"--resume-file {cfg.resume_file}: resuming after {position.examples:,} training examples", flush=True)
    return dataclasses.replace(cfg, skip_examples=position.examples, resume_started_from=position.started_from,
                               resume_trained=position.trained, resume_state_ids=position.state_ids,
                               resume_rejoins=rejoin and position.trained)  # fmt: skip


def eval_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of parsed `eval` arguments: --eval-data alone also stands for --data (the file whose first
    lines give the schema)."""
    cfg = TrainConfig(**common_config(args), prefetch=args.prefetch, progress=not args.no_progress)
    if cfg.data is None and cfg.eval_data is not None:
        cfg = dataclasses.replace(cfg, data=cfg.eval_data)
    return cfg


def run_eval(args: argparse.Namespace) -> int:
    import json

    from worker.served import evaluate_servers

    r = evaluate_servers(eval_config(args))
    print(json.dumps(json_figures(r)) if args.json else format_results(r), flush=True)
    return 0

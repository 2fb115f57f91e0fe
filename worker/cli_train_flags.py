"""The parsers of `ps-worker train` and `ps-worker eval`: every flag, its type, default and help (the groups
they share with predict: worker/cli_flags.py)."""

from __future__ import annotations

import argparse

from ps.config import (
    DEFAULT_LEARNING_RATES,
    MAX_BARRIER_S,
    MAX_MEMORY_BYTES,
    MAX_MEMORY_TEXT,
    OPTIMIZER_PARAMS,
)
from ps.flagtypes import HelpFormatter, integer, number, plain_float, size_flag
from worker.cli_flags import (
    SECONDS,
    SECONDS_OR_0,
    add_data_args,
    add_model_args,
    add_security_args,
    add_served_model_args,
)
from worker.progress_lines import JSON_EVERY_S
from worker.recipe import BIG_BATCH_EXAMPLES, EARLY_STOP_METRICS, LARGE, RECIPES, SMALL
from worker.train_config import DEFAULT_GEO_EVERY, DEFAULT_STALENESS, DENSE_PATHS, MODES, TrainConfig
from worker.train_config_ignored import DEFAULT_METRICS_HOST
from worker.train_numbers import rate_refusal


def rate(text: str) -> float:
    """An argparse type: a learning rate (worker.train_numbers.rate_refusal says which)."""
    try:
        value = plain_float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    refusal = rate_refusal("a learning rate", value)
    if refusal:
        raise argparse.ArgumentTypeError(refusal)
    return value


_size = size_flag(0, MAX_MEMORY_BYTES, MAX_MEMORY_TEXT)  # bytes of --row-cache-bytes, spelled as the server's are


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
    model.add_argument("--learning-rate", type=rate, default=None,
                       help="sparse optimizer step size (default: the recipe's, or the optimizer's: "
                       + ", ".join(f"{rate:g} {name}" for name, rate in DEFAULT_LEARNING_RATES.items()) + ")")  # fmt: skip
    model.add_argument(
        "--dense-optimizer",
        default=d.dense_optimizer,
        choices=["adam", "sgd", "adagrad"],
        help="server-side optimizer of the MLP",
    )
    model.add_argument(
        "--dense-learning-rate", type=rate, default=d.dense_learning_rate, help="dense optimizer step size"
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
        default=None,
        help=f"address the --metrics-port endpoint listens on (default: {DEFAULT_METRICS_HOST}; 0.0.0.0: every "
        "interface; see docs/security.md)",
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

"""The flag groups that `ps-worker train`, `eval` and `predict` share: the servers' (their list, deadlines and
security), the data's and the model's, and the argparse types of their seconds. Each command's own parser is in
worker/cli_train_flags.py (train, eval) or worker/cli_predict.py (predict)."""

from __future__ import annotations

import argparse

from ps.config import MAX_INTERVAL_S
from ps.flagtypes import integer, number
from worker.models.spec import MODEL_NAMES
from worker.readers.share import BAD_SHARE_AFTER
from worker.recipe import LARGE, MAX_BAD_SHARE, SMALL
from worker.schema_columns import FORMAT_CHOICES, LABEL_NAMES, LIBSVM_VALUES
from worker.train_config import TrainConfig

SECONDS = number(0, MAX_INTERVAL_S, above=True)  # argparse types of the worker commands' flags
SECONDS_OR_0 = number(0, MAX_INTERVAL_S)


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
    model.add_argument("--hidden", default=None,
                       help=f"MLP hidden widths (deepfm, dnn; default: {','.join(map(str, d.hidden))})")  # fmt: skip


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


def add_security_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (servers started with TLS or a token)")
    g.add_argument("--tls-ca", default=None, help="PEM CA to verify the servers' TLS certificates (turns TLS on)")
    g.add_argument("--tls-cert", default=None, help="PEM client certificate, for servers that require one (mutual TLS)")
    g.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    g.add_argument("--auth-token-file", default=None, help="file holding the token the servers require")

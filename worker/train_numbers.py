"""check_numbers(cfg): a TrainConfig's counts, rates, times and ports in their ranges (TrainConfig.validate, in
worker/train_config.py, runs it after the flags' choices and files)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ps.config import MAX_BARRIER_S, MAX_DIM, MAX_INTERVAL_S, check_hyperparameter
from ps.errors import InvalidArgumentError
from worker.models.spec import MODEL_NAMES, row_floats

if TYPE_CHECKING:
    from worker.train_config import TrainConfig


def check_numbers(cfg: TrainConfig) -> None:
    """ValueError naming the flag of a count, a rate, a time or a port out of its range (NaN included)."""

    def unset_or(value, default):
        return default if value is None else value

    at_least = [("--batch-size", unset_or(cfg.batch_size, 1), 1), ("--epochs", unset_or(cfg.epochs, 1), 1),
                ("--dense-sync-every", cfg.dense_sync_every, 1), ("--prefetch", cfg.prefetch, 0),
                ("--num-workers", cfg.num_workers, 1), ("--embedding-dim", cfg.embedding_dim, 1),
                ("--max-bad-lines", unset_or(cfg.max_bad_lines, 0), 0), ("--synthetic-eval-rows", cfg.synthetic_eval_rows, 0),
                ("--synthetic-rows", cfg.synthetic_rows if cfg.data is None else 1, 1),
                ("--eval-every", cfg.eval_every, 0), ("--skip-examples", cfg.skip_examples, 0), ("--max-examples", cfg.max_examples, 0), ("--early-stop", unset_or(cfg.early_stop, 0), 0),
                ("--staleness", unset_or(cfg.staleness, 0), 0), ("--geo-every", unset_or(cfg.geo_every, 1), 1),
                ("--dense-staleness", unset_or(cfg.dense_staleness, 0), 0),
                ("--row-cache-bytes", unset_or(cfg.row_cache_bytes, 0), 0),
                ("--local-shards", 1 if cfg.local_shards is None else cfg.local_shards, 1)]  # fmt: skip
    for flag, value, lowest in at_least:
        if value < lowest:
            raise ValueError(f"{flag} {value}: expected an integer >= {lowest}")
    if any(not 1 <= width <= MAX_DIM for width in cfg.hidden):
        raise ValueError(f"--hidden {','.join(map(str, cfg.hidden))}: expected widths in 1..{MAX_DIM} (a layer's "
                         f"parameters are rows of its width, and a server holds rows of at most {MAX_DIM} floats)")  # fmt: skip
    past = rows_past_a_server(cfg.model, cfg.embedding_dim)
    if past:
        raise ValueError(f"--embedding-dim {cfg.embedding_dim}: {past}")
    ranges = [("--validation-fraction", unset_or(cfg.validation_fraction, 0.0), 0.0, 0.5),
              ("--dropout", unset_or(cfg.dropout, 0.0), 0.0, 0.95), ("--l2", unset_or(cfg.l2, 0.0), 0.0, 1e6),
              ("--dense-l2", unset_or(cfg.dense_l2, 0.0), 0.0, 1e6), ("--synthetic-history", cfg.synthetic_history, 0.0, 1e3)]  # fmt: skip
    for flag, value, low, high in ranges:
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"{flag} {value}: expected a number in [{low}, {high}]")
    rates = [
        ("--learning-rate", unset_or(cfg.learning_rate, 1.0)),
        ("--dense-learning-rate", cfg.dense_learning_rate),
    ]
    for flag, value in rates:
        refusal = rate_refusal(flag, value)
        if refusal:
            raise ValueError(refusal)
    if not 0 < cfg.timeout_s <= MAX_INTERVAL_S:
        raise ValueError(f"--timeout-s {cfg.timeout_s}: expected seconds > 0 and <= {MAX_INTERVAL_S:g}")
    if not 0 < cfg.barrier_timeout_s <= MAX_BARRIER_S:
        raise ValueError(f"--barrier-timeout {cfg.barrier_timeout_s}: expected seconds > 0 and <= {MAX_BARRIER_S:g}")
    if not 0 <= cfg.server_timeout_s <= MAX_INTERVAL_S:
        raise ValueError(f"--server-timeout {cfg.server_timeout_s}: expected seconds >= 0 (0: no retries) and <= "
                         f"{MAX_INTERVAL_S:g}")  # fmt: skip
    if cfg.metrics_port is not None and not 0 <= cfg.metrics_port < 65536:
        raise ValueError(f"--metrics-port {cfg.metrics_port}: expected a port in 0..65535 (0: a free one)")


def rate_refusal(what: str, value: float) -> str | None:
    """Why `value` is no learning rate (--learning-rate, --dense-learning-rate), in words naming it `what` (the flag);
    None where it is one. The rule is ps.config.check_hyperparameter's for a factor > 0, the one a table's
    learning_rate meets: finite, at least MIN_POSITIVE_HYPERPARAMETER and at most MAX_HYPERPARAMETER."""
    try:
        check_hyperparameter(what, value, low_inclusive=False)
    except InvalidArgumentError as e:
        return str(e)
    return None


def rows_past_a_server(model: str, dim: int) -> str | None:
    """Why a table of embeddings `dim` wide (--embedding-dim, a schema's [tables.<name>] dim) has rows of `model`
    that a server cannot hold (MAX_DIM floats), with the widest it may be; None where they fit. fm's and deepfm's
    rows hold the linear term's weight too (worker.models.spec.row_floats), dnn's the embedding alone; lr's rows are
    one float whatever dim is."""
    if model not in MODEL_NAMES or row_floats(model, dim) <= MAX_DIM:
        return None
    linear = row_floats(model, dim) - dim
    rows = f" and {linear} of the linear term: {dim + linear}," if linear else ","
    return (f"expected 1..{MAX_DIM - linear} for --model {model} (its rows hold the {dim} floats of an embedding{rows} "
            f"and a server holds rows of at most {MAX_DIM})")  # fmt: skip

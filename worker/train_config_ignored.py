"""Flags a run would ignore, refused naming the flag and why: whose setting each is, and the run's that ignores it.

    --hidden, --dropout,         the MLP's: --model deepfm and dnn (lr and fm have none; --dense-l2 reaches the MLP's
    --dense-l2                   weights only, not lr's logit bias nor fm's projections, ModelSpec.mlp_weights)
    --metrics-host               the --metrics-port endpoint's
    (--dense-sync-every reaches every model: the logit bias is a dense parameter of each)
TrainConfig.validate refuses --dropout and --dense-l2 (None: not given, and not filled in by a recipe for a model
without an MLP: TrainConfig.with_recipe); worker/cli_train_config.py refuses
--hidden and --metrics-host, whose defaults are values, where the flag was given (and an empty --metrics-host, which
would widen the endpoint to every address).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ps.emptyflags import refuse_empty_host
from worker.models.spec import MLP_MODELS

if TYPE_CHECKING:
    from worker.train_config import TrainConfig

MLP_SETTING = f"the MLP's (--model {', '.join(MLP_MODELS)})"
METRICS_HOST_SETTING = "the --metrics-port endpoint's"
DEFAULT_METRICS_HOST = "127.0.0.1"  # where --metrics-port listens: the loopback (docs/security.md)


def ignored_setting(flag: str, value: object, whose: str, run: str) -> str:
    """The refusal of `flag value` given to a run that would ignore it: whose setting it is, and what the run has
    that ignores it (its --mode and --dense, its --model, ...)."""
    return f"{flag} {value} is {whose} setting; this run has {run}, which would ignore it"


def check_model_settings(cfg: TrainConfig) -> None:
    """ValueError for a --dropout or --dense-l2 given (not None) to a --model that would ignore it."""
    if cfg.model in MLP_MODELS:
        return
    if cfg.dropout is not None:
        raise ValueError(ignored_setting("--dropout", cfg.dropout, MLP_SETTING, f"--model {cfg.model}"))
    if cfg.dense_l2 is not None:
        raise ValueError(ignored_setting("--dense-l2", cfg.dense_l2, MLP_SETTING, f"--model {cfg.model}"))


def check_given_hidden(hidden: tuple[int, ...] | None, model: str) -> None:
    """ValueError for a --hidden given (not None) to a --model without an MLP."""
    if hidden is not None and model not in MLP_MODELS:
        raise ValueError(ignored_setting("--hidden", ",".join(map(str, hidden)), MLP_SETTING, f"--model {model}"))


def check_given_metrics_host(host: str | None, port: int | None) -> None:
    """ValueError for a --metrics-host given (not None) without a --metrics-port: no endpoint listens on it; or
    given empty: the endpoint, plain HTTP with no token, would listen on every address (as ps-server's --host)."""
    if host is not None and port is None:
        raise ValueError(ignored_setting("--metrics-host", host, METRICS_HOST_SETTING, "no --metrics-port"))
    refuse_empty_host("--metrics-host", host, DEFAULT_METRICS_HOST)

"""training_figures: the figures of a training run that train() (worker/train.py) returns, prints and writes to
--metrics-out, from its settings and its loop's result (the final evaluation's and the data's counts are added by
train())."""

from __future__ import annotations

from worker.loop import LoopResult
from worker.train_config import TrainConfig


def training_figures(cfg: TrainConfig, recipe_line: str, shards: int, loop: LoopResult, dense_syncs: int,
                     weaker_l2: str) -> dict:  # fmt: skip
    """The training's figures: cfg's settings, the loop's counts and curve, its best validation if it kept one,
    the recipe's line, the number of shards, the dense path's syncs, and weaker_l2 (model_tables.weaker_l2_toml:
    the hint of a run whose last epoch was its best)."""
    results = {
        "model": cfg.model,
        "backend": cfg.backend,
        "device": cfg.device,
        "worker": f"{cfg.worker_id}/{cfg.num_workers}",
        "shards": shards,
        "recipe": recipe_line,
        "batch_size": cfg.batch_size,
        "epochs_run": loop.curve[-1]["epoch"] if loop.curve else loop.epoch,
        "train_examples": loop.examples,
        "skipped_examples": cfg.skip_examples,
        "train_seconds": loop.seconds,
        "first_step_seconds": loop.first_step_seconds,
        "examples_per_s": loop.examples / loop.seconds if loop.seconds > 0 else 0.0,
        "train_logloss": loop.train_logloss,
        "mode": cfg.mode,
        "dense": cfg.dense,
        "dense_syncs": dense_syncs,
        **loop.source_stats,
        "stopped_early": loop.stopped_early,
        "max_examples": cfg.max_examples,
        "stopped_at_max_examples": loop.stopped_at_limit,
        "eval_every": cfg.eval_every,
        "restored_best": loop.restored_best,
        **({"best_copy_limit_bytes": loop.best_too_big_bytes} if loop.best_too_big_bytes else {}),
        **({"best_ids_not_restored": loop.best_not_restored} if loop.best_not_restored else {}),
        "model_is_best": loop.restored_best or bool(cfg.num_workers == 1 and loop.curve and loop.curve[-1]["best"]),
        "curve": loop.curve,
        "weaker_l2_toml": weaker_l2,
    }
    if loop.best is not None:
        results.update(best_validation_auc=loop.best["validation_auc"],
                       best_validation_logloss=loop.best["validation_logloss"], best_epoch=loop.best["epoch"],
                       best_step=loop.best["step"], early_stop_metric=cfg.early_stop_metric)  # fmt: skip
    return results

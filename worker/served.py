"""The model the servers hold, as eval and predict score with it: served_model, and `ps-worker eval`
(evaluate_servers; predict: worker/predict.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.client import Client
from worker.data import DataSource
from worker.datafiles import data_files
from worker.dense import TABLE_PREFIX, DenseSync, dense_norm, table_name
from worker.formats import file_has_labels
from worker.job import job_client, make_backend, prepare
from worker.linecount import SCORING_COUNT_LINES, count_data_upto
from worker.model_tables import (
    held_features,
    model_flags,
    other_models,
    sparse_table_stats,
    table_configs,
    trained_tables,
)
from worker.models.spec import LOGIT_BIAS, ModelSpec
from worker.readers.share import ReadStats
from worker.scoring import ScoringProgress, evaluate
from worker.tables import NEVER_TRAINED, check_tables
from worker.train_config import TrainConfig

log = logging.getLogger("worker.train")  # the training job's logger (log lines read "worker.train: ...")


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
def served_model(cfg: TrainConfig, doing: str, labels_optional: bool = False, trained_on_data: bool = False,
                 warn: bool = True) -> Iterator[ServedModel]:  # fmt: skip
    """The model of cfg's flags as the servers hold it, for eval and predict: prepare (the large recipe, no
    validation split: --max-bad-lines 1,000 unless given), then, once the servers answer, ValueError unless they
    hold every table of that model with its shapes (check_tables for_eval; doing: what was not done, for the
    message) and a trained row in them (check_trained), its dense parameter tables trained too
    (_check_dense_trained), and the dense parameters pulled. labels_optional, trained_on_data, warn: as prepare's.
    The checks read the shards' Stats once, as wait_ready reads them."""
    cfg = dataclasses.replace(cfg, recipe="large", validation_fraction=0.0)
    cfg, data, spec, _ = prepare(cfg, training=False, labels_optional=labels_optional, trained_on_data=trained_on_data,
                                 warn=warn)  # fmt: skip
    backend = make_backend(spec, cfg)
    with job_client(cfg) as client:
        shard_stats = client.wait_ready()
        wanted = table_configs(cfg, spec, data.schema.table_overrides())
        features = held_features(client, data.schema, [t.name for t in wanted], shard_stats)
        wanted = [dataclasses.replace(t, features=features) for t in wanted]
        params = spec.dense_params()
        (bias,) = [p for p in params if p.name == LOGIT_BIAS]
        without_bias = table_name(bias) not in {t.name for t in shard_stats[0].tables}
        if without_bias:
            _check_no_other_model(client, cfg.model, table_name(bias), features, shard_stats, doing)
            wanted = [t for t in wanted if t.name != table_name(bias)]
            params = [p for p in params if p is not bias]
        check_tables(client, wanted, doing, for_eval=True,  # the rest of the model is there, in its shapes
                     dense_rows={table_name(p): p.shape[0] for p in params}, shard_stats=shard_stats)  # fmt: skip
        check_trained(client, spec, cfg.model, doing, shard_stats)
        _check_dense_trained(client, spec, features, shard_stats, doing)
        if without_bias:
            log.warning("the servers hold no table %s: the model was trained before models had a logit bias; it is "
                        "scored with that bias at 0, as it was trained", table_name(bias))  # fmt: skip
        dense_values = DenseSync(client, params).pull()
        dense_values.setdefault(LOGIT_BIAS, np.zeros(bias.shape, dtype=np.float32))
        yield ServedModel(cfg, data, spec, backend, client, dense_values, len(client.servers))


def _check_no_other_model(client: Client, model: str, bias_table: str, features: str, shard_stats: list,
                          doing: str) -> None:  # fmt: skip
    """ValueError where the servers, which hold no table bias_table (model's logit bias), hold dense parameter
    tables of another model made with this run's schema (model_tables.other_models): the sparse tables are that
    model's, trained by it (deepfm's read as fm's would score without its MLP, with b = 0); a model trained before
    models had a logit bias holds no other model's. doing: what was not done, for the message."""
    others = other_models(client, model, features, shard_stats)
    if others:
        flags = model_flags(others)
        held = ", ".join(f"{TABLE_PREFIX}{m}.*" for m in others)
        raise ValueError(f"the servers hold no table {bias_table}, the logit bias of {model}, and hold the dense "
                         f"parameter tables of {', '.join(others)} ({held}) "
                         f"made with this run's schema ({features}), whose sparse tables these are: the model the "
                         f"servers hold was trained with {flags}, not --model {model}; give its flags ({flags}, its "
                         f"--hidden and --embedding-dim): {doing}")  # fmt: skip


def _check_dense_trained(client: Client, spec: ModelSpec, features: str, shard_stats: list, doing: str) -> None:
    """ValueError for a dense parameter table of spec's model that the servers hold and no shard ever trained
    (TableStats.trained), called once its sparse tables are known trained (check_trained): every run of the model
    pushes its dense parameters, so those sparse tables were trained by another model that shares them
    (model_tables.other_models), and this one's tables were made by `train --create-tables-only` or a train that
    failed before its first step's push; its scores would take those parameters at their initial values. doing:
    what was not done, for the message."""
    held = {t.name for t in shard_stats[0].tables}
    trained = trained_tables(shard_stats)
    never = [table_name(p) for p in spec.dense_params() if table_name(p) in held - trained]
    if not never:
        return
    others = other_models(client, spec.name, features, shard_stats)
    by = model_flags(others) if others else "another model"
    raise ValueError(f"the servers hold the sparse tables of {spec.name} ({', '.join(sorted(spec.table_dims()))}) "
                     f"trained, but never trained its dense parameter table{'s' * (len(never) > 1)} "
                     f"{', '.join(never)} (made by `ps-worker train --create-tables-only`, or by a train that failed "
                     f"before its first push): the sparse tables were trained by {by}, and these scores would take "
                     f"{spec.name}'s parameters at their initial values; give the flags of the run that trained "
                     f"them, or train {spec.name}: {doing}")  # fmt: skip


def check_trained(client: Client, spec: ModelSpec, model: str, doing: str, shard_stats: list | None = None) -> None:
    """ValueError when no shard ever trained the model's sparse tables (TableStats.trained: nothing was ever pushed
    to them): a model never trained there, whose every score is its initial one, is not scored (doing: what was
    not done, for the message). Ids pending admission count as trained: their pushes trained the MLP; so do tables
    trained and then emptied by a Shrink, which a warning names (their ids score by their initial rows).
    shard_stats: the shards' StatsResponses when the caller has them."""
    stats = sparse_table_stats(client, spec, shard_stats)
    names = ", ".join(sorted(spec.table_dims()))
    if any(t.trained for t in stats):
        if not sum(t.num_rows + t.pending_ids for t in stats):
            log.warning("the servers' tables of %s (%s) were trained and are now empty: a Shrink dropped every id, "
                        "so every id scores by its table's initial row", model, names)  # fmt: skip
        return
    raise ValueError(f"the servers hold the tables of {model} ({names}) but no trained row in them: {NEVER_TRAINED} "
                     f"({', '.join(client.servers)}); its scores would all be its initial ones: {doing}")  # fmt: skip


def evaluate_servers(cfg: TrainConfig, trained_on_data: bool = False, warn: bool = True) -> dict:
    """`ps-worker eval` and launch's final evaluation: the AUC and logloss of the model the servers hold, on
    --eval-data, else on --data, else on the synthetic eval rows. --data (when given) fixes the schema;
    trained_on_data (launch's job, whose workers trained on --data): standardized columns without a mean and std
    in the schema get them from a pass over --data, as the workers did (prepare); warn=False: prepare's warnings
    dropped (launch said them as it started the job)."""
    with served_model(cfg, "nothing was evaluated", trained_on_data=trained_on_data, warn=warn) as m:
        cfg, data = m.cfg, m.data
        scored = cfg.eval_data or cfg.data
        if scored is not None and not file_has_labels(scored, data.schema):
            raise ValueError(f"{scored} holds no labels (as its first lines show): eval scores a model against them; "
                             "`ps-worker predict` writes the model's probability for each row of a file without "
                             "labels; nothing was evaluated")  # fmt: skip
        eval_batches = data.eval() if cfg.data is None or cfg.eval_data else data.read_whole(cfg.data)
        progress = None
        if cfg.progress:  # total: the file's lines, an estimate of its examples (bad ones among them: count_data_upto)
            fmt, delimiter = data.schema.format, data.schema.delimiter
            counted = None if scored is None else count_data_upto(data_files(scored), SCORING_COUNT_LINES, fmt,
                                                                  delimiter=delimiter)  # fmt: skip
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
    if results["bad_lines"]:  # said on the eval line too (worker/results.py)
        results["eval_bad_lines"] = results["bad_lines"]
    if "eval_examples" not in results and scored is not None:
        read = next((s for path, s in data.read_stats if path == scored), ReadStats())
        raise ValueError(f"{scored}: no examples to evaluate on ({data.no_examples_held(scored, read)})")
    if data.synthetic is not None and cfg.synthetic_eval_rows:  # they follow the training rows of --synthetic-rows
        results["synthetic_eval_rows"] = [cfg.synthetic_rows, cfg.synthetic_rows + cfg.synthetic_eval_rows]
        results["synthetic_seed"] = cfg.synthetic_seed
    return results

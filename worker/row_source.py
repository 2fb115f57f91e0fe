"""The row source a worker trains with, built for its --mode (worker/steprows.py's classes), and the job setup its
stamp carries: what every worker of the job must run alike.
"""

from __future__ import annotations

import hashlib
from typing import Any

from worker.models.spec import ModelSpec
from worker.steprows import AsyncRows, ClockedRows, GeoRows


def job_setup(cfg: Any, spec: ModelSpec) -> str:
    """What every worker of a job must run alike, as the stamp's key=value pairs (the shards refuse a worker whose
    pairs differ from the job's: ps.engine.tenancy): the mode (and ssp's staleness, geo's steps per push), the
    model, its fields (their count and a digest of each field's name, table, width and pooling), the numeric
    features, and for a model with dense parameters their path (and the MLP's widths; allreduce: the local optimizer;
    sync: the steps between the MLP's pushes, which a step's sum takes alike from every worker). Left out
    on purpose: what a worker may choose for its own hardware or share (backend, device, batch size, epochs,
    prefetch, its data)."""
    fields = hashlib.blake2b(repr(spec.fields).encode(), digest_size=4).hexdigest()
    pairs = [f"mode={cfg.mode}"] + ([f"staleness={cfg.staleness}"] if cfg.mode == "ssp" else [])
    pairs += [f"geo_every={cfg.geo_every}"] if cfg.mode == "geo" else []
    pairs += [f"model={spec.name}", f"fields={len(spec.fields)}:{fields}", f"numeric={spec.num_dense}"]
    if spec.has_mlp:
        pairs.append("hidden=" + ",".join(map(str, spec.hidden)))
    if spec.dense_params():
        pairs.append(f"dense={cfg.dense}")
        if cfg.mode == "sync":  # the steps whose sums carry the MLP's gradients
            pairs.append(f"dense_sync_every={cfg.dense_sync_every}")
        if cfg.dense == "allreduce":
            pairs.append(f"dense_optimizer={cfg.dense_optimizer}:{cfg.dense_learning_rate:g}")
    return " ".join(pairs)


def row_source(cfg: Any, tables: Any, spec: ModelSpec, table_configs: list) -> Any:
    """The row source of a resolved TrainConfig's --mode (table_configs: the model's sparse tables, for geo's
    local optimizers); every mode's worker stamps its pushes with the job (async and geo: unclocked), and the run
    its CreateTable requests with the source's stamp (worker/train.py)."""
    from worker.client import WorkerStamp

    stamp = WorkerStamp(
        job=cfg.job_id,
        job_name=cfg.job_name,
        worker=cfg.worker_id,
        num_workers=cfg.num_workers,
        step=0,
        staleness=cfg.staleness if cfg.mode == "ssp" else 0,
        sync=cfg.mode == "sync",
        barrier_timeout_s=cfg.barrier_timeout_s,
        setup=job_setup(cfg, spec),
        unclocked=cfg.mode in ("async", "geo"),
        token=cfg.worker_token if cfg.mode in ("async", "geo") else 0,  # (a clocked stamp's process: its client id)
    )
    if cfg.mode == "async":
        return AsyncRows(tables, spec, cfg.prefetch, stamp)
    if cfg.mode == "geo":
        from worker.geo import GeoTables

        configs = {t.name: t for t in table_configs if t.name in spec.table_dims()}
        return GeoRows(tables, GeoTables(tables, configs, cfg.geo_every, num_workers=cfg.num_workers, stamp=stamp),
                       stamp)  # fmt: skip
    cache = None
    if cfg.row_cache_bytes:
        from worker.rowcache import RowCache

        cache = RowCache(cfg.row_cache_bytes, {t: spec.row_dim(t) for t in spec.table_dims()})
    return ClockedRows(tables, spec, stamp, cache, cfg.prefetch)

"""The tables of a model: their configs from the flags, the schema and --table-config, and what the shards hold.

table_configs(cfg, spec, ...)    sparse tables (one per schema table), then one per dense parameter (float32 at rest,
                                 no eviction)
table_config_note                what --table-config changed of the recipe's and the flags' choice
initializers_given               the tables whose initializer --table-config sets
check_geo_tables                 geo mode refuses an ftrl table (GEO_FTRL) and a table's lazy l2 (GEO_L2)
geo_ttl_bound, warn_of_geo_ttl   how old a row geo trains can look to a Shrink's TTL; the warning for a ttl_steps
                                 within GEO_TTL_MARGIN times that
check_allreduce_tables           --dense allreduce refuses MLP tables' settings only the servers would apply
weaker_l2_toml                   a --table-config file dividing the sparse tables' l2 by WEAKER_L2_DIVISOR
sparse_table_stats, missing_shares    what the shards hold of the model's tables, and a shard that lacks its part
other_models, check_not_others_tables  the models whose dense tables share the run's schema, and a new model's
                                 run refused on the sparse tables another model trained
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ps.config import FULL_AT_REST, OPTIMIZER_PARAMS, EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.table_toml import table_configs_from_toml
from worker.client import Client
from worker.dense import TABLE_PREFIX
from worker.dense import table_config as dense_table_config
from worker.dense import table_name as dense_table_name
from worker.models.spec import ModelSpec
from worker.recipe import EMBEDDING_INIT_SCALE, WEAKER_L2_DIVISOR
from worker.schema_toml import toml_key
from worker.train_config import GEO_FTRL, GEO_L2, TrainConfig

log = logging.getLogger("worker.train")  # the training job's logger (log lines read "worker.train: ...")

DENSE_EVICTION = ("a Shrink (ps-worker shrink, of every table) would drop rows of the MLP's weights, which the "
                  "servers would then serve at their initial values; the MLP's tables keep every row")  # fmt: skip
DENSE_AT_REST = ("the servers would hold its values rounded to float16 once they go through RocksDB, another MLP "
                 "than the one the job trained and scored, which training on, eval, predict and export read")  # fmt: skip


def sparse_table_configs(
    spec: ModelSpec, cfg: TrainConfig, schema_overrides: dict[str, dict], warn: bool = True,
    file_overrides: dict[str, dict] | None = None,
) -> list[TableConfig]:  # fmt: skip
    """One table per schema table: LR weights start at 0, embeddings small and random (uniform in
    +-EMBEDDING_INIT_SCALE; fm's in +-cfg.fm_init_scale, the recipe's, where set), --l2 as the table's lazy
    L2 (applied by the servers to the rows a push touches, for the steps since their last push); the schema's
    settings of a table (optimizer, initializer, l2, admission, ...) win over these defaults, and file_overrides
    (--table-config's) over those. --l2 is left out of a table whose optimizer, so chosen, is ftrl; warn: log that
    it is."""
    out = []
    scale = (cfg.fm_init_scale or EMBEDDING_INIT_SCALE) if spec.name == "fm" else EMBEDDING_INIT_SCALE
    for name in spec.table_dims():
        init = InitializerConfig("zeros", 0.0) if spec.name == "lr" else InitializerConfig("uniform", scale, seed=0)
        t = TableConfig(
            name,
            spec.row_dim(name),
            init,
            OptimizerConfig(cfg.optimizer, cfg.learning_rate, dict(cfg.optimizer_params or {})),
            l2=cfg.l2 or 0.0,
        )
        fields = {k: v for k, v in schema_overrides.get(name, {}).items() if k not in ("name", "dim")}
        from_file = {k: v for k, v in (file_overrides or {}).get(name, {}).items() if k not in ("name", "dim")}
        fields.update(from_file)
        t = dataclasses.replace(t, **fields)
        if t.optimizer.name == "ftrl" and t.l2 and "l2" not in fields:
            if warn:
                log.warning("--l2 does not apply to table %s: its optimizer is ftrl, which has its own l2", name)
            t = dataclasses.replace(t, l2=0.0)
        try:
            out.append(t.normalized())
        except ValueError as e:
            if not from_file:
                raise
            raise ValueError(f"{cfg.table_config}: table {name}: {e}") from None
    return out


def table_configs(
    cfg: TrainConfig, spec: ModelSpec, schema_overrides: dict[str, dict] | None = None, features: str = ""
) -> list[TableConfig]:
    """The model's tables (sparse, then one per dense parameter), with --table-config applied to those it names;
    features: what their rows mean (Schema.fingerprint), set on every one of them."""
    overrides = {}
    if cfg.table_config:
        with open(cfg.table_config) as f:
            overrides = table_configs_from_toml(f.read(), cfg.table_config)
    dense_opt, zero_output = OptimizerConfig(cfg.dense_optimizer, cfg.dense_learning_rate), bool(cfg.mlp_output_zeros)
    dense = [dense_table_config(p, dense_opt, zeros=zero_output and p.name == spec.mlp_output)
             for p in spec.dense_params()]  # fmt: skip
    dims = {**{name: spec.row_dim(name) for name in spec.table_dims()}, **{t.name: t.dim for t in dense}}
    unknown = sorted(set(overrides) - set(dims))
    if unknown:
        raise ValueError(f"{cfg.table_config} names tables {unknown}; model {cfg.model} has {list(dims)}")
    for name, fields in overrides.items():
        if fields.get("dim", dims[name]) != dims[name]:
            raise ValueError(f"{cfg.table_config}: table {name} has dim {fields['dim']}, model {cfg.model} needs "
                             f"{dims[name]}")  # fmt: skip
    tables = sparse_table_configs(spec, cfg, schema_overrides or {}, file_overrides=overrides)
    for t in dense:  # as they are without --table-config; with one, validated with its settings applied
        fields = {k: v for k, v in overrides.get(t.name, {}).items() if k not in ("name", "dim")}
        try:
            tables.append(dataclasses.replace(t, **fields).normalized() if cfg.table_config else t)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{cfg.table_config}: table {t.name}: {e}") from None
        if tables[-1].as_new().values_at_rest != FULL_AT_REST:  # the only one of an MLP table
            raise ValueError(f"{cfg.table_config}: table {t.name}: values_at_rest {tables[-1].values_at_rest!r} is "
                             f"not for an MLP table: {DENSE_AT_REST}; leave it out (the MLP's tables are "
                             f"{FULL_AT_REST!r})")  # fmt: skip
        if not tables[-1].eviction.is_off:  # whichever --dense path trains it
            evict, off = dataclasses.asdict(tables[-1].eviction), dataclasses.asdict(EvictionConfig())
            given = " ".join(f"{k}={v:g}" for k, v in evict.items() if v != off[k])
            raise ValueError(f"{cfg.table_config}: table {t.name}: eviction {given} is not for an MLP table: "
                             f"{DENSE_EVICTION}; leave it out")  # fmt: skip
    return [dataclasses.replace(t, features=features) for t in tables]


def initializers_given(cfg: TrainConfig) -> frozenset[str]:
    """The names of the tables whose initializer cfg's --table-config file sets (none without one)."""
    if not cfg.table_config:
        return frozenset()
    with open(cfg.table_config) as f:
        overrides = table_configs_from_toml(f.read(), cfg.table_config)
    return frozenset(name for name, fields in overrides.items() if "initializer" in fields)


def table_config_note(cfg: TrainConfig, spec: ModelSpec, schema_overrides: dict[str, dict],
                      tables: list[TableConfig]) -> str:  # fmt: skip
    """ "; --table-config sets ..." naming the sparse tables whose optimizer or l2 --table-config changed from what
    the recipe and flags chose (tables: table_configs of cfg), with what they use; "" if none."""
    if not cfg.table_config:
        return ""
    chosen = {t.name: t for t in sparse_table_configs(spec, cfg, schema_overrides, warn=False)}
    changed = []
    for t in tables:
        if t.name not in chosen:
            continue
        before, parts = chosen[t.name].normalized(), []
        if t.optimizer != before.optimizer:
            params = "".join(f" {k}={v:g}" for k, v in sorted(t.optimizer.params.items()))
            parts.append(f"{t.optimizer.name} {t.optimizer.learning_rate:g}{params}")
        if t.l2 != before.l2:
            parts.append(f"lazy l2 {t.l2:g}")
        if parts:
            changed.append(f"{t.name}: {', '.join(parts)}")
    return f"; --table-config sets table {'; '.join(changed)} instead" if changed else ""


def weaker_l2_toml(tables: list[TableConfig], spec: ModelSpec) -> str:
    """The text of a --table-config file that gives each sparse table of tables (a model's, as trained) its l2
    divided by WEAKER_L2_DIVISOR (worker.recipe) and keeps the rest of its optimizer: an ftrl table's own
    `params.l2`, another table's lazy `l2`; "" where no sparse table has an l2. Its params list only those that
    differ from the optimizer's defaults."""
    sections = []
    for t in tables:
        if t.name not in spec.table_dims():
            continue
        opt = t.optimizer
        if opt.name == "ftrl" and opt.params.get("l2"):
            defaults = OPTIMIZER_PARAMS["ftrl"]
            kept = {k: v for k, v in sorted(opt.params.items()) if k != "l2" and v != defaults.get(k)}
            params = ", ".join(
                f"{k} = {_toml_number(v)}" for k, v in {**kept, "l2": opt.params["l2"] / WEAKER_L2_DIVISOR}.items()
            )
            sections.append(f'[{toml_key(t.name)}]\noptimizer = {{ name = "ftrl", learning_rate = '
                            f"{_toml_number(opt.learning_rate)}, params = {{ {params} }} }}")  # fmt: skip
        elif t.l2:
            sections.append(f"[{toml_key(t.name)}]\nl2 = {_toml_number(t.l2 / WEAKER_L2_DIVISOR)}")
    return "\n".join(sections)


def _toml_number(value: float) -> str:
    """value as a TOML number that reads back as value: 30 for 30.0, 0.05, 1e-07."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def check_geo_tables(tables: list[TableConfig], spec: ModelSpec) -> None:
    """ValueError, before any server is touched, for a sparse table that geo mode cannot train as configured: with
    ftrl (GEO_FTRL), or with a lazy l2 (GEO_L2)."""
    sparse = [t for t in tables if t.name in spec.table_dims()]
    ftrl = [t.name for t in sparse if t.optimizer.name == "ftrl"]
    if ftrl:
        raise ValueError(f"--mode geo cannot train table(s) {', '.join(ftrl)} with ftrl: {GEO_FTRL}; give them "
                         "another optimizer (--optimizer adagrad, or in --table-config / the schema), or another "
                         "--mode")  # fmt: skip
    decayed = [f"{t.name} (l2 {t.l2:g})" for t in sparse if t.l2]
    if decayed:
        raise ValueError(f"--mode geo cannot apply the lazy l2 of table(s) {', '.join(decayed)}: {GEO_L2}; set "
                         "their l2 to 0 (--l2, --table-config or the schema), or use another --mode")  # fmt: skip


# The factor on geo_ttl_bound under which a ttl_steps is warned of: the bound holds for workers in lock-step; one
# worker at half its peers' pace sees its row reach (2N - 1) x geo-every steps old (tests/test_geo_ttl.py), still
# under 2 x the bound, so a ttl_steps of 2 x the bound keeps the rows of workers whose paces differ up to twofold.
GEO_TTL_MARGIN = 2


def geo_ttl_bound(num_workers: int, geo_every: int) -> int:
    """The clock steps old a row that one worker of a geo job trains every step looks to its shard just before
    that worker's next push, the workers in lock-step: a row's last_step is the clock before its push's own
    advance, and by that next push every worker has advanced the clock by geo_every (tests/test_geo_ttl.py).
    A Shrink drops a row more than its table's ttl_steps old (ps.engine.shrinkrule)."""
    return num_workers * geo_every


def warn_of_geo_ttl(tables: list[TableConfig], spec: ModelSpec, num_workers: int, geo_every: int) -> None:
    """Logs one warning naming the sparse tables whose eviction ttl_steps (on) is under GEO_TTL_MARGIN times
    geo_ttl_bound: a Shrink would drop rows that the job is still training, and the deltas pushed to them after
    land on their initial rows (worker.geo). Nothing where every such table is safe."""
    bound = geo_ttl_bound(num_workers, geo_every)
    safe = GEO_TTL_MARGIN * bound
    short = [t for t in tables if t.name in spec.table_dims() and 0 < t.eviction.ttl_steps < safe]
    if not short:
        return
    named = ", ".join(f"{t.name} (ttl_steps {t.eviction.ttl_steps:,})" for t in short)
    every = min(t.eviction.ttl_steps for t in short) // (GEO_TTL_MARGIN * num_workers)
    lower = f", or lower --geo-every to {every:,} or less" if every >= 1 else ""
    workers = f"{num_workers} worker{'s' if num_workers != 1 else ''}"
    lose = "would lose" if any(t.eviction.ttl_steps < bound for t in short) else "may lose, where paces differ,"
    log.warning("--mode geo, %s pushing every %s steps (--geo-every): a row that one worker trains every step can "
                "be %s clock steps old on its shard before that worker's next push (%s x %s, the workers in "
                "lock-step; %s keeps the rows of workers whose paces differ up to %s-fold), and a Shrink drops rows "
                "more than their table's ttl_steps old: table(s) %s %s rows the job is still training; raise "
                "their ttl_steps to %s or more (--table-config or the schema's eviction)%s", workers,
                f"{geo_every:,}", f"{bound:,}", num_workers, geo_every, f"{safe:,}", GEO_TTL_MARGIN, named,
                lose, f"{safe:,}", lower)  # fmt: skip


ALLREDUCE_SERVERS_ONLY = ("optimizer", "weight_bound", "l2", "admission")  # a dense table's, applied by no worker


def check_allreduce_tables(tables: list[TableConfig], spec: ModelSpec, cfg: TrainConfig) -> None:
    """ValueError, before any server is touched, for a dense table (one of spec's MLP) whose --table-config settings
    the workers of --dense allreduce do not apply (ALLREDUCE_SERVERS_ONLY): they train the MLP themselves, with
    --dense-optimizer and --dense-learning-rate, and write its values to the servers, whose rules (another
    optimizer, a weight bound, a lazy l2, admission) would leave them holding another MLP than the one the job
    trained and its final evaluation scored, which eval, predict and export then read. An initializer is taken:
    every worker starts from the values the servers hold."""
    dense_opt = OptimizerConfig(cfg.dense_optimizer, cfg.dense_learning_rate)
    applied = {t.name: t.normalized() for t in (dense_table_config(p, dense_opt) for p in spec.dense_params())}
    found = []
    for t in tables:
        if t.name not in applied:
            continue
        given = t.normalized()
        for key in ALLREDUCE_SERVERS_ONLY:
            value = getattr(given, key)
            if value != getattr(applied[t.name], key):
                shown = (f"{value.name} {value.learning_rate:g}" if key == "optimizer" else
                         " ".join(f"{k}={v:g}" for k, v in dataclasses.asdict(value).items())
                         if key == "admission" else f"{value:g}")  # fmt: skip
                found.append(f"{t.name}: {key} {shown}")
    if found:
        raise ValueError(f"--dense allreduce trains the MLP on the workers, with --dense-optimizer "
                         f"{dense_opt.name} {dense_opt.learning_rate:g}, and writes its values to the servers: --table-config "
                         f"sets {'; '.join(found)}, which only the servers would apply, leaving eval, predict and "
                         "export with another MLP than the one trained; leave them out (an initializer is taken), or "
                         "use --dense ps")  # fmt: skip


def sparse_table_stats(client: Client, spec: ModelSpec, shard_stats: list | None = None) -> list:
    """Every shard's Stats of the model's sparse tables (none where they do not exist yet); shard_stats: the
    shards' StatsResponses when the caller has them."""
    names = set(spec.table_dims())
    return [t for shard in (shard_stats or client.stats()) for t in shard.tables if t.name in names]


MISSING_SHARE = 0.1  # a shard holding less than this share of a table's rows per shard is named


def missing_shares(shard_stats: list, spec: ModelSpec, servers: list[str]) -> list[str]:
    """Warnings for the shards that hold (almost) none of a trained table's rows while the others hold many: ids
    spread evenly over the shards, so such a shard was most likely started on a new or another --data-dir, and
    the model the run continues lacks its part."""
    out = []
    for name in spec.table_dims():
        rows = [next((t.num_rows for t in shard.tables if t.name == name), 0) for shard in shard_stats]
        per_shard = sum(rows) / max(len(rows), 1)
        if len(rows) < 2 or per_shard < 100:
            continue
        for i, (n, shard) in enumerate(zip(rows, shard_stats)):
            if n < MISSING_SHARE * per_shard:
                others = sum(rows) - n
                out.append(f"shard {i} at {servers[i]} holds {n:,} rows of table {name!r} while the other shards "
                           f"hold {others:,}, and its clock is {shard.clock:,}: was it started on a new or another "
                           f"--data-dir (its: {shard.data_dir or 'unknown'})? The model this run trains further lacks "
                           "that shard's rows")  # fmt: skip
    return out


def trained_tables(shard_stats: list) -> set[str]:
    """The names of the tables some shard of shard_stats (StatsResponses) says were ever trained."""
    return {t.name for shard in shard_stats for t in shard.tables if t.trained}


def model_flags(models: list[str]) -> str:
    """The --model flags of models, as a message offers them: "--model fm or --model deepfm"."""
    return " or ".join(f"--model {m}" for m in models)


def other_models(client: Client, model: str, features: str, shard_stats: list) -> list[str]:
    """The models other than `model` whose dense parameter tables (dense.<other>.<name>) the servers hold made with
    features, the run's schema: where its tables are named in the schema file, not after the model, those models
    share the run's sparse tables. One table of each is described, on shard 0 (shard_stats: the shards'
    StatsResponses)."""
    first: dict[str, str] = {}  # {other model: one of its dense tables}
    for t in sorted(shard_stats[0].tables, key=lambda t: t.name):
        if t.name.startswith(TABLE_PREFIX):
            other = t.name[len(TABLE_PREFIX) :].split(".", 1)[0]
            if other != model:
                first.setdefault(other, t.name)
    shard = [shard_stats[0].shard_id]
    return [m for m, name in first.items() if client.describe_table(name, shard)[0].spec.features == features]


def check_not_others_tables(client: Client, spec: ModelSpec, features: str, shard_stats: list) -> None:
    """ValueError, before anything is created, where the servers hold spec's sparse tables trained, no dense
    parameter table of spec's model trained (a model new there), and the dense tables of another model made with
    this schema (other_models): those rows are that model's, and this run would train them as its own, changing
    the model the other's eval and predict score."""
    trained = trained_tables(shard_stats)
    if not set(spec.table_dims()) & trained or {dense_table_name(p) for p in spec.dense_params()} & trained:
        return
    others = other_models(client, spec.name, features, shard_stats)
    if others:
        flags = model_flags(others)
        raise ValueError(f"the servers hold the sparse tables of this run ({', '.join(sorted(spec.table_dims()))}) "
                         f"trained by {flags} (its dense tables {', '.join(f'{TABLE_PREFIX}{m}.*' for m in others)} "
                         f"were made with this run's schema, {features}), and no trained dense table of "
                         f"{spec.name}: this run would train those rows as {spec.name}'s, changing the model that eval "
                         f"and predict with {flags} score. Train that model further with {flags}, or give {spec.name} "
                         "tables of its own (other names under the schema's [tables], or other servers); nothing "
                         "was created")  # fmt: skip


def held_features(client: Client, schema: Any, tables: list[str], shard_stats: list | None = None) -> str:
    """The fingerprint the run's tables carry: schema.fingerprint(), or its legacy_fingerprint where the servers
    hold the model's tables under that one (made before libsvm's K was part of it: they are read as they were
    trained, without a check of K). ValueError where they hold them under the fingerprint of schema.as_written
    (trained on the built-in csv schema of the header as written, spaces and all, whose ids this run's trimmed
    names would hash otherwise): it names the schema file that reads them; and where they hold them under its
    libsvm_fingerprint, the libsvm fields read the other way (trained on a libsvm file read one-hot, which this
    run reads with its values as weights, or the other way round: the file read here, whose first lines carry
    only values of 0 and 1, reads one-hot). shard_stats: the shards' StatsResponses when the caller has them."""
    legacy, written = schema.legacy_fingerprint(), schema.as_written
    one_hot, weighted = schema.libsvm_fingerprint(weighted=False), schema.libsvm_fingerprint(weighted=True)
    if legacy is None and written is None and one_hot is None and weighted is None:
        return schema.fingerprint()
    held, name = None, None
    for shard in shard_stats or client.stats():
        for t in shard.tables:
            if held is None and t.name in tables:
                held, name = client.describe_table(t.name, [shard.shard_id])[0].spec.features, t.name
    if written is not None and held == written.fingerprint():
        raise ValueError(
            f"the servers hold this model's tables trained on the built-in csv schema of a header whose names have "
            f"spaces around them, as the worker read such names before it trimmed them ({held}): their ids were "
            "hashed under the names as written, which this run's names, trimmed, would not find. Give --schema a "
            "file that names the columns as written, this one (the same ids, read from the same cells):\n"
            + written.to_toml()
        )
    if one_hot is not None and held == one_hot:
        raise ValueError(ONE_HOT_HELD.format(table=name))
    if weighted is not None and held == weighted:
        raise ValueError(WEIGHTED_HELD.format(table=name))
    return legacy if legacy is not None and held == legacy else schema.fingerprint()


ONE_HOT_HELD = (
    "the servers hold table {table} trained on libsvm data read one-hot (each feature's value left out), and this "
    "run reads the data's values as weights (its values are not all 0 and 1, or --libsvm-values weights says to): "
    "the rows stand for other features. "
    "Train the model anew (on servers without these tables), or read the data as it was trained: --libsvm-values "
    'one-hot, or `ps-worker schema --data FILE > schema.toml`, each column\'s kind = "weighted" changed to '
    '"categorical", then --schema schema.toml; nothing was done'
)
WEIGHTED_HELD = (
    "the servers hold table {table} trained on libsvm data read with its values as weights (the training file's "
    "values are not all 0 and 1), and this run reads its file one-hot: the values of that file's first 10,000 "
    "lines of data are all 0 and 1, so the built-in schema reads them so (or --libsvm-values one-hot says to). Read "
    "it as the model was trained: --libsvm-values weights, --data the training file (eval and predict take the "
    "schema from its lines), or --schema the training file's schema "
    '(`ps-worker schema --data TRAINING_FILE --out schema.toml`, whose columns say kind = "weighted"); nothing '
    "was done"
)

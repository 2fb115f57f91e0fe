"""The model's tables against those the servers hold, compared before a run creates or reads any of them.

A run creates its tables one at a time (CreateTable is idempotent for the same spec); a run whose settings differ
from the run that made the tables (another --embedding-dim, --hidden, optimizer, schema) would otherwise create
the first missing ones, then be refused at the first that differs, and leave tables behind that the next run,
with the right settings, is refused by. check_tables finds every difference first. Tables of other settings that
no shard ever trained (TableStats.trained: made by a run stopped before it trained: Ctrl-C at its start, a flag
refused after the tables were made) do not bind a run of one worker: it replaces them (CreateTable's
replace_untrained; a shard refuses the replace of a table it trained, even one a Shrink has emptied since).
An MLP parameter table the servers hold trained and whole (every row pushed) is taken with the initializer it was
made with (keep_held_initializers): no row of it is made any more, so a run whose recipe starts a new one otherwise
(the small-data recipe's MLP output layer at zeros) trains it further; one whose --table-config gives it another
initializer is refused (INITIALIZER_UNUSED). A job's start describes each table the shards hold once (held_specs)
and hands the specs to keep_held_initializers and check_tables alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from ps import codec
from ps.config import TableConfig
from ps.errors import TableNotFoundError
from worker.dense import TABLE_PREFIX
from worker.schema_toml import toml_key, toml_value

SHAPE_FIELDS = ("dim", "features")  # what a forward pass depends on (features: the schema that gave the rows their
# meaning); a dense parameter's rows, its input width, are compared too (check_tables' dense_rows)


def _partly_held(shard_stats: list, names: set[str] | None) -> Iterator[tuple[str, list[int], list[int], int, bool]]:
    """(table, the shards that hold it, those that do not, its rows and pending ids over the shards, whether any of
    them trained it: TableStats.trained) of each table (of `names`, else any) that some shards hold and others do
    not, in name order."""
    held = [{s.name: s for s in shard.tables} for shard in shard_stats]
    every = set().union(*held)
    for name in sorted(every if names is None else every & names):
        on = [i for i, tables in enumerate(held) if name in tables]
        if len(on) < len(held):
            rows = sum(held[i][name].num_rows + held[i][name].pending_ids for i in on)
            yield name, on, [i for i in range(len(held)) if i not in on], rows, any(held[i][name].trained for i in on)


def lost_tables(shard_stats: list, names: set[str] | None = None) -> str:
    """A message naming the tables (of `names`, else any) that some shards hold trained (rows or pending ids, or
    all dropped since by a Shrink) while others hold no such table at all, else "". Client.create_table puts a
    table on every shard (each checks the request first), so a trained table one shard lacks is not a run's settings:
    that shard started on a new, empty data dir (its dir deleted, its volume lost or replaced) and its part of the table
    is gone."""
    lost = []
    for name, _, lacking, rows, trained in _partly_held(shard_stats, names):
        if trained:
            lost.append(f"table {name} ({rows:,} rows and pending ids on the other shards) is on no data dir of "
                        f"shard{'s' * (len(lacking) > 1)} {', '.join(map(str, lacking))}")  # fmt: skip
    if not lost:
        return ""
    return ("; ".join(lost) + ": a shard that lacks a trained table started on a new, empty data dir (its dir "
            "deleted, its volume lost or replaced), and that part of the model is gone. Restore every shard from "
            "a checkpoint (ps-server --restore, into new data dirs), or start the cluster anew on empty data dirs "
            "(the tables are then trained from scratch)")  # fmt: skip


def untrained_on_some_shards(shard_stats: list, names: set[str] | None = None) -> str:
    """A message naming the tables (of `names`, else any) that some shards hold never trained (TableStats.trained)
    while others hold no such table at all, else "" (lost_tables names the trained ones). A checkpoint
    describes each table on every shard; one on some shards only was made on them alone (a CreateTable sent to
    some shards), or the others started on new, empty data dirs since it was made: nothing of it is lost."""
    found = []
    for name, on, lacking, _, trained in _partly_held(shard_stats, names):
        if not trained:
            found.append(f"table {name} is on shard{'s' * (len(on) > 1)} {', '.join(map(str, on))} only, not on "
                         f"shard{'s' * (len(lacking) > 1)} {', '.join(map(str, lacking))}")  # fmt: skip
    if not found:
        return ""
    return ("; ".join(found) + ": such a table holds no row yet (it was made on some shards alone, or the others "
            "started on new, empty data dirs since), and a checkpoint describes each table on every shard. A run "
            "that uses it creates it on every shard (a shard that holds it takes the same CreateTable again); "
            "`ps-worker export --tables` that leaves it out (without --keep-checkpoint) is not refused for it")  # fmt: skip


NEVER_TRAINED = (
    "the model was never trained on these servers (its tables made by `ps-worker train "
    "--create-tables-only`, or by a train that failed before its first push), or --servers names other "
    "servers than those it was trained on"
)  # why a model's tables hold no trained row

NEVER_RESTORED = "(never restored, or a server version that does not say)"  # restored_sha256 empty


def mixed_restores(shard_stats: list) -> str:
    """A message naming what each shard was restored from when the shards disagree (StatsResponse restored_sha256:
    one checkpoint's manifest, or none), else "". Shards restored from two checkpoints, or some restored and some
    not, hold two cuts of the model: a lost shard restored alone from a checkpoint the others were not restored
    from, or --restore differing between pods. Not found: a lost shard restored alone from the very checkpoint
    the others were restored from before they trained on (every shard names the same one)."""
    origins = [s.restored_sha256 for s in shard_stats]
    if len(set(origins)) < 2:
        return ""
    said = ", ".join(f"shard {s.shard_id} from {s.restored_from or NEVER_RESTORED}"
                     + (f" (manifest {s.restored_sha256[:12]})" if s.restored_sha256 else "")
                     for s in shard_stats)  # fmt: skip
    return (f"the shards were not restored from one checkpoint: {said}; together they hold two cuts of the model, "
            "not one. Restore every shard from one checkpoint (ps-server --restore, into new data dirs), or start "
            "the cluster anew on empty data dirs")  # fmt: skip


def cluster_damage(shard_stats: list, names: set[str] | None = None) -> str:
    """What lost_tables and mixed_restores say of these shards, joined, or "" when neither finds anything."""
    return "; ".join(m for m in (lost_tables(shard_stats, names), mixed_restores(shard_stats)) if m)


def held_specs(client: Any, names: list[str], shard_stats: list) -> dict[str, TableConfig]:
    """{name: the spec the servers hold it with (DescribeTable of every shard, shard 0's spec)} of each table of
    names that every shard holds by shard_stats (the shards' StatsResponses); one some shard lacks, or dropped
    since the Stats, is left out."""
    held = [{s.name for s in shard.tables} for shard in shard_stats]
    out = {}
    for name in dict.fromkeys(names):
        if not all(name in tables for tables in held):  # a table's absence is no refused call
            continue
        try:
            out[name] = codec.table_config_from_proto(client.describe_table(name)[0].spec)
        except TableNotFoundError:  # dropped since the Stats
            continue
    return out


def held_tables(client: Any, wanted: list[TableConfig], fields: tuple[str, ...] | None = None,
                find_untrained: bool = False, dense_rows: dict[str, int] | None = None,
                shard_stats: list | None = None,
                specs: dict[str, TableConfig] | None = None) -> tuple[dict[str, list[str]], list[str], set[str]]:  # fmt: skip
    """({name: its differences, "field: on the servers != this run"} for each table the servers hold with
    another spec, only in `fields` where given (sparse tables: dim and features alone), [names of the tables some
    shard lacks], {names of the tables of `differ` that no shard ever trained (TableStats.trained): with
    find_untrained, else empty}). dense_rows {table: the rows of its dense parameter, its input width}: such a
    table whose shards hold trained rows must hold exactly that many ("rows: ..." otherwise; one untrained is
    compared by its initializer's scale, which its shape sets). ValueError (cluster_damage) for a table of
    `wanted` that some shards hold trained and others lack, or shards restored from different checkpoints.
    shard_stats: the shards' StatsResponses when the caller has them (else asked for here); specs: held_specs of
    them when the caller has them (else asked for here)."""
    differ, missing, untrained = {}, [], set()
    shard_stats = shard_stats or client.stats()
    lost = cluster_damage(shard_stats, {t.name for t in wanted})
    if lost:
        raise ValueError(lost)
    held = [{s.name: s for s in shard.tables} for shard in shard_stats]
    specs = held_specs(client, [t.name for t in wanted], shard_stats) if specs is None else specs
    for t in wanted:
        if t.name not in specs:
            missing.append(t.name)
            continue
        diff = specs[t.name].normalized().differences(t.normalized())
        if fields is not None:
            keep = fields
            if dense_rows is not None and t.name in dense_rows:
                rows = sum(tables[t.name].num_rows for tables in held)
                if rows and rows != dense_rows[t.name]:
                    diff.append(f"rows: {rows:,} != {dense_rows[t.name]:,}")
                keep = (*fields, "rows") if rows else (*fields, "initializer.scale")
            diff = [d for d in diff if d.split(":")[0] in keep]
        if diff:
            differ[t.name] = diff
    if differ and find_untrained:  # never trained on any shard (a table a Shrink emptied was trained)
        untrained = {name for name in differ if all(name in tables and not tables[name].trained for tables in held)}
    return differ, missing, untrained


def keep_held_initializers(wanted: list[TableConfig], dense_rows: dict[str, int], shard_stats: list,
                           specs: dict[str, TableConfig], given: str = "", given_names: frozenset[str] = frozenset()
                           ) -> list[TableConfig]:  # fmt: skip
    """wanted, with each MLP parameter table (of dense_rows {table: the rows of its dense parameter}) that the
    servers hold trained and whole (every row on some shard) given the initializer they hold it with. An
    initializer makes the rows never pushed, and such a table has none left: a run trains it further whatever
    initializer its recipe gives a new one (the small-data recipe starts deepfm's MLP output layer at zeros, the
    large one uniform: worker/recipe.py). A sparse table's initializer makes the rows of ids not seen yet: another
    is refused (check_tables), and so is an MLP table of another shape or not held whole. shard_stats: the shards'
    StatsResponses; specs: held_specs of them. given_names: the tables whose initializer the --table-config file
    `given` sets: ValueError (INITIALIZER_UNUSED) for one held whole with another initializer."""
    held = [{s.name: s for s in shard.tables} for shard in shard_stats]
    out = []
    for t in wanted:
        stats = [tables[t.name] for tables in held if t.name in tables]
        whole = (t.name in dense_rows and len(stats) == len(held) and any(s.trained for s in stats)
                 and sum(s.num_rows for s in stats) == dense_rows[t.name])  # fmt: skip
        init = specs[t.name].initializer if whole and t.name in specs else None  # (one dropped since the Stats:
        # check_tables finds it missing)
        if init is not None and t.name in given_names and t.initializer.normalized() != init.normalized():
            raise ValueError(INITIALIZER_UNUSED.format(file=given, table=t.name, section=toml_key(t.name),
                                                       rows=dense_rows[t.name],
                                                       given=toml_value(dataclasses.asdict(t.initializer)),
                                                       held=toml_value(dataclasses.asdict(init))))  # fmt: skip
        out.append(t if init is None else dataclasses.replace(t, initializer=init))
    return out


INITIALIZER_UNUSED = (
    "{file}: table {table}: initializer {given} would make no row: the servers hold this MLP parameter table "
    "trained and whole (all {rows:,} rows pushed, made with initializer {held}), and this run trains those rows "
    "further. Leave `initializer` out of [{section}] in {file} (the run takes the table as held), or train a new model "
    "with it (other servers, or servers started on new data dirs); nothing was created"
)


def check_tables(client: Any, wanted: list[TableConfig], doing: str, for_eval: bool = False,
                 replace_untrained: bool = False, recipe_line: str = "", dense_rows: dict[str, int] | None = None,
                 shard_stats: list | None = None, specs: dict[str, TableConfig] | None = None
                 ) -> dict[str, list[str]]:  # fmt: skip
    """ValueError, naming every table the servers hold with another spec than `wanted`, before anything is
    created. for_eval: only what the forward pass depends on is compared (SHAPE_FIELDS, and the dense parameters'
    rows where dense_rows gives them: see held_tables), and a missing table is an error too. doing: what the run was
    about to do ("nothing was created"). replace_untrained: if every such table was never trained (a run stopped before
    it trained made them), returns {name: its differences} of them, to be created with
    Client.create_table(replace_untrained=True) (a shard may still refuse that: another job holds it), and once they
    are, replaced_warning says so; else {}. recipe_line: the run's recipe line (worker/recipe.py describe), quoted where
    an optimizer differs, for a run whose optimizer is its recipe's (none given): a recipe picks it by the data's size,
    so a run on more or less data than the first picks another. shard_stats, specs: the shards' StatsResponses and
    held_specs when the caller has them (held_tables)."""
    differ, missing, untrained = held_tables(client, wanted, SHAPE_FIELDS if for_eval else None, replace_untrained,
                                             dense_rows, shard_stats, specs)  # fmt: skip
    if replace_untrained and differ and set(differ) <= untrained:
        return dict(sorted(differ.items()))
    parts = []
    schema, differ = _other_schema(differ)
    if schema:
        parts.append(schema)
    if differ:
        lines = [f"  {name}: {'; '.join(diff)}{_dense_hint(name, diff) or _dim_hint(diff)}"
                 for name, diff in differ.items()]  # fmt: skip
        parts.append("the servers hold tables of this model with other settings than this run's (on the servers "
                     "!= this run):\n" + "\n".join(lines))  # fmt: skip
    if for_eval and missing:
        parts.append(f"the servers hold no table {', '.join(missing)} (tables a run with these settings trains)"
                     f"{_tables_held(client)}")  # fmt: skip
    recipe_note = ""
    if recipe_line and any(d.startswith("optimizer") for diff in differ.values() for d in diff):
        recipe_note = (f"\nthis run's {recipe_line}.\nA run that names no optimizer gets its recipe's, by the size of "
                       "its data: to train these tables further give theirs (--recipe, or --optimizer, "
                       "--learning-rate and the params in --table-config)")  # fmt: skip
    if parts:
        settings = "--model, --embedding-dim, --hidden, the schema and its data"  # those eval has: shapes only
        if not for_eval:
            settings += ", --table-config, the optimizers"
        raise ValueError("; ".join(parts) + recipe_note + f"\n{doing}: give the settings of the run that made the tables "
                         f"({settings}), or other servers")  # fmt: skip
    return {}


MLP_SHAPE_FIELDS = ("rows", "dim", "initializer.scale")  # of an MLP parameter table: its shape, and the scale it sets


def _other_schema(differ: dict[str, list[str]]) -> tuple[str, dict[str, list[str]]]:
    """Where tables of differ ({name: its differences}) hold another schema's fingerprint: (one line saying so, with
    FEATURES_HINT and the fix once, naming those tables compactly and the MLP parameter tables' shape differences
    (MLP_SHAPE_FIELDS), which the schema most likely causes: an MLP's input width follows from its fields; the
    other differences, each table's others included (an optimizer, a sparse table's dim), left to list one a line).
    Else ("", differ)."""
    other = {name: diff for name, diff in differ.items() if any(d.startswith("features:") for d in diff)}
    if not other:
        return "", differ
    held = next(d for d in next(iter(other.values())) if d.startswith("features:")).split(": ", 1)[1]
    sparse = [name for name in other if not name.startswith(TABLE_PREFIX)]
    dense = len(other) - len(sparse)
    tables = ", ".join(sparse) + (" and " if sparse and dense else "")
    tables += f"{dense} MLP parameter table{'s' * (dense != 1)}" if dense else ""
    shapes, rest = {}, {}
    for name, diff in differ.items():
        diff = [d for d in diff if not d.startswith("features:")]
        shaped = [d for d in diff if name.startswith(TABLE_PREFIX) and d.split(":")[0] in MLP_SHAPE_FIELDS]
        if name in other and shaped:
            shapes[name] = shaped
            diff = [d for d in diff if d not in shaped]
        if diff:
            rest[name] = diff
    also = "; ".join(f"{name}: {'; '.join(diff)}" for name, diff in shapes.items())
    also = f"; shapes differ too, as the schemas do: {also}" if also else ""
    line = (f"the servers hold this model's tables trained with another schema ({held}, on the servers != this run): "
            f"{FEATURES_HINT}; read the data with the schema the model was trained with (--schema as trained, or the "
            f"data and flags that built it) (tables {tables}{also})")  # fmt: skip
    return line, rest


def replaced_warning(replaced: dict[str, list[str]]) -> str:
    """What a run says once it has replaced the tables check_tables returned (never trained, of other settings)."""
    return (f"the servers held {len(replaced)} of this model's tables with other settings than this run's, none of "
            "them trained (a run that stopped before it trained made them): this run replaced them. "
            + "; ".join(f"{name}: {'; '.join(diff)}" for name, diff in replaced.items()))  # fmt: skip


def _tables_held(client: Any) -> str:
    """ "; they hold ..." naming the tables shard 0 holds (the dense parameters' counted, not named), for a
    message."""
    names = sorted(t.name for t in client.stats()[0].tables)
    sparse = [n for n in names if not n.startswith(TABLE_PREFIX)]
    dense = len(names) - len(sparse)
    if not names:
        return "; they hold no table at all (a model is trained first, by ps-worker train)"
    held = ", ".join(sparse) + (f" and {dense} dense parameter table{'s' * (dense != 1)}" if dense else "")
    return f"; they hold {held} (is --model that of the run that trained them?)"


FEATURES_HINT = (
    "its label column, or its columns, their order, kinds, id spaces or buckets, differ from this run's, so the "
    "same ids would stand for other features or another target (a schema inferred anew, or one of another "
    "dataset? a csv's label, unless --label-column or the schema's `label` names it, is the first column of the "
    "file the run reads its header from: --data, else the file scored; a libsvm schema's field count K is the most "
    "features of a line in that file, unless --libsvm-fields gives the training run's; its values are weights where "
    "that file's first 10,000 lines of data carry one other than 0 and 1, unless --libsvm-values gives the training "
    "run's)"
)


def _dim_hint(diff: list[str]) -> str:
    """A note for a sparse table whose rows differ in width: a row is not --embedding-dim floats wide."""
    if not any(d.startswith("dim:") for d in diff):
        return ""
    return (" (a row's floats: fm and deepfm hold --embedding-dim plus 1 for the linear term, dnn --embedding-dim, "
            "lr 1)")  # fmt: skip


def _dense_hint(name: str, diff: list[str]) -> str:
    """A note for an MLP parameter table whose shape differs (MLP_SHAPE_FIELDS in diff): what sets it."""
    if not name.startswith(TABLE_PREFIX) or not any(d.split(":")[0] in MLP_SHAPE_FIELDS for d in diff):
        return ""
    return (" (an MLP parameter of another shape: --hidden, or the MLP's input, the fields' widths and numeric "
            "columns, differ; its rows are its layer's inputs, and another shape also shows as another initializer "
            "scale)")  # fmt: skip

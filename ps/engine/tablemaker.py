"""TableMaker: the CreateTable of one shard: a new table, the existing one of the same spec, or a table of another
spec replaced while it was never trained; and what a create would answer, changing nothing.

The shard (ps.engine.shard.Shard.create_table, check_create) checks the request's stamp and holds its lock around
each call; the tables dict is the shard's, changed here in place. create returns the line the shard logs of what
it made, once it released that lock (a stalled log stalls no request waiting for the lock).
"""

from __future__ import annotations

from collections.abc import Callable

from ps.config import TableConfig
from ps.engine.table import Table, layout_for
from ps.errors import TableExistsError
from ps.newtable import check_new
from ps.rows.layout import RowLayout
from ps.storage.budget import MemoryBudget
from ps.storage.journal import Journal
from ps.storage.store import Store


class TableMaker:
    def __init__(self, shard_id: int, tables: dict[str, Table], store: Store, journal: Journal, budget: MemoryBudget):
        self.shard_id = shard_id
        self.tables = tables
        self.store = store
        self.journal = journal
        self.budget = budget

    def create(
        self, cfg: TableConfig, replace_untrained: bool, check_replace: Callable[[str], None] | None
    ) -> tuple[Table, str]:
        """Shard.create_table's work, cfg normalized, the shard's lock held: the existing table of cfg's spec, or a
        new one (its spec checked by ps.newtable.check_new, then its number, stored counts and RAM tier as
        _layout_with_room checks them), or `replace_untrained`'s; and the line to log of the table made or replaced
        ("" for the existing one). check_replace(name): the shard's job refusing a replace (JobConflictError); None:
        a create stamped by a job's worker, never refused so."""
        table, diff, cfg = self._existing(cfg)
        if table is not None and not diff:
            return table, ""
        if diff:
            return self._replace_untrained(table, cfg, diff, replace_untrained, check_replace)
        # the first refusal _layout_with_room checks; Table() meets the others (counts, RAM budget)
        self.store.number_for(cfg.name)
        table = self._stored(cfg)
        self.tables[cfg.name] = table
        return table, f"created table {cfg.name}: dim {cfg.dim}, {cfg.optimizer.name}"

    def _stored(self, cfg: TableConfig) -> Table:
        """A Table of cfg (it joins the RAM budget) whose config is then stored (Store.create_table, under its
        name's number); a failed write leaves the budget again."""
        table = Table(cfg, self.store, self.journal, self.budget)
        try:
            self.store.create_table(cfg)
        except BaseException:
            self.budget.leave(table.arena)
            raise
        return table

    def check_create(
        self, cfg: TableConfig, replace_untrained: bool, check_replace: Callable[[str], None] | None
    ) -> tuple[TableConfig, int, int]:
        """Shard.check_create's work, cfg normalized, the shard's lock held: (config, trained rows, row floats) of
        the table create would return, or the error it would raise (all but a failed RocksDB write's)."""
        table, diff, cfg = self._existing(cfg)
        if table is not None and not diff:
            return table.cfg, table.num_rows, table.width
        if diff:
            with table.lock:
                self._refuse_other_spec(table, cfg, diff, replace_untrained, check_replace)
        return cfg, 0, self._layout_with_room(cfg, table if diff else None).width

    def _existing(self, cfg: TableConfig) -> tuple[Table | None, list[str], TableConfig]:
        """(the table of cfg's name, or None; how its config differs from cfg; cfg, or, unless that table is of
        cfg's spec, the config a table made of it gets, TableConfig.as_new). Unless that table is of cfg's spec,
        cfg is checked as a new table's first (ps.newtable.check_new)."""
        table = self.tables.get(cfg.name)
        diff = table.cfg.differences(cfg) if table is not None else []
        if table is None or diff:
            check_new(cfg)
            cfg = cfg.as_new()
        return table, diff, cfg

    def _layout_with_room(self, cfg: TableConfig, replacing: Table | None) -> RowLayout:
        """The refusals of a create of a table of cfg (new, or `replacing` one of its name) left once its spec is
        accepted, checked in the one order that create and check_create meet them, changing nothing: the
        table's number (Store.number_for: DataLossError while a number does not read, TableNumbersExhaustedError),
        its stored counts (Store.counts, which its Table reads: DataLossError where they do not read), then the RAM
        tier (RamTierTooSmallError, once `replacing` left it; a new table's create meets the last two in Table(),
        which reads the counts and then joins the budget). Returns cfg's layout."""
        self.store.number_for(cfg.name)
        self.store.counts(cfg.name)
        layout = layout_for(cfg)
        self.budget.check_join(layout.ram_bytes, replacing=replacing.arena if replacing is not None else None)
        return layout

    def _refuse_other_spec(
        self,
        table: Table,
        cfg: TableConfig,
        diff: list[str],
        replace_untrained: bool,
        check_replace: Callable[[str], None] | None,
    ) -> None:
        """TableExistsError unless `table`, whose config differs from cfg by diff, may be replaced: with
        replace_untrained, and never trained (Table.trained); then check_replace(cfg.name), if given (a create
        without a stamp: JobConflictError while a job holds the shard, JobClocks.check_replace). The table's lock
        held."""
        if not replace_untrained:
            raise TableExistsError(
                f"table {cfg.name!r} exists on shard {self.shard_id} with a different spec "
                f"(existing != requested): {'; '.join(diff)}"
            )
        if table.trained:
            held = (
                f"it holds {table.num_rows:,} trained rows and {table.num_pending:,} ids pushed but not admitted"
                if table.num_rows or table.num_pending
                else "it was trained, and a Shrink has dropped every id"
            )
            raise TableExistsError(
                f"table {cfg.name!r} exists on shard {self.shard_id} with a different spec (existing != "
                f"requested): {'; '.join(diff)}; {held}, and only a table never trained is replaced; nothing was "
                "changed"
            )
        if check_replace is not None:
            check_replace(cfg.name)

    def _replace_untrained(
        self,
        old: Table,
        cfg: TableConfig,
        diff: list[str],
        replace_untrained: bool,
        check_replace: Callable[[str], None] | None,
    ) -> tuple[Table, str]:
        """create for a table of another config, `old`: refused unless it may be replaced (_refuse_other_spec) and
        its number and the RAM tier take it (_layout_with_room); then the old one is closed (its requests from now
        on get ShardClosingError) and leaves the RAM budget, the new one takes its name, number and counts
        (Table.count_on). A failure puts a table of the old config back, as it was (untrained, its RAM tier empty).
        Returns (the new table, the line to log of it)."""
        with old.lock:
            self._refuse_other_spec(old, cfg, diff, replace_untrained, check_replace)
            self._layout_with_room(cfg, old)
            old.closed = True
            old.replaced = True
            self.budget.leave(old.arena)  # under its lock: a reclaim() that waited for it finds it gone
        try:
            new = self._stored(cfg)  # the config under the same table number
        except BaseException:
            restored = Table(old.cfg, self.store, self.journal, self.budget)
            restored.count_on(old)  # before it is published: a Stats call never sees its counts go down
            self.tables[cfg.name] = restored
            raise
        new.count_on(old)
        new.replaced_dims = old.replaced_dims | {old.dim}
        self.tables[cfg.name] = new
        changes = "; ".join(diff)
        return (
            new,
            f"replaced table {cfg.name}, never trained, by one of another spec (existing != requested): {changes}",
        )

"""TableCatalog, Store's base: every table's config, number and counts in a shard's RocksDB, and the "rows" column
family all their rows share.

A table's number is the prefix of its row keys (ps.storage.rowformat): create_table gives a new table the one after the
highest in use, by a table or by stored rows (rows_of_no_table), and the numbers are read from meta once and kept
(_table_numbers). The meta keys and the grammar of their values are ps.storage.meta's; the layout of the whole RocksDB
is ps.storage.store's. The attributes declared on the class are set by Store.__init__, which opens the dir.
"""

from __future__ import annotations

import bisect
import json
import threading

from ps.config import TableConfig
from ps.errors import StorageError, TableNumbersExhaustedError
from ps.rows.layout import RowLayout, layout_of
from ps.storage.datadir import OpenDataDir
from ps.storage.meta import (
    COUNT_PREFIX,
    MAX_TABLE_NUMBER,
    TABLE_CONFIG_PREFIX,
    TABLE_ID_PREFIX,
    first_unread,
    key_name,
    meta_value,
    missing_number,
    read_table_numbers,
    trained,
)
from ps.storage.options import iter_prefixed
from ps.storage.rocks import Options, Rdict, WriteBatch
from ps.storage.rowformat import ROWS_CF, AtRest

# what Store.rows_of_no_table's rows are where every table's number reads: said by verify, a start and number_for
LOST_TABLE_ROWS = ("the rows of a table whose meta keys table/<name> and tid/<name> were lost. No request reads them "
                   "and no new table takes their numbers")  # fmt: skip


class TableCatalog:
    """The tables of one shard's RocksDB: their configs, numbers and row counts, and the column family of their rows."""

    path: str  # the data dir
    _dir: OpenDataDir  # its open RocksDB, shared with Store.meta
    _opts: Options  # what the "rows" column family is created with
    _numbers_lock: threading.RLock  # _table_numbers', create_table's and _at_rest_of's (see _numbers)
    _cfs: dict[str, Rdict]  # the column families held open ("rows", once used)
    _at_rest: dict[str, AtRest]  # {table: how its rows are at rest}, read from its config once

    def load_tables(self) -> list[TableConfig]:
        """Every table's stored config; DataLossError for one that does not read as a config."""
        out = []
        with self._dir.rocksdb("reading the table configs"):
            for key, raw in iter_prefixed(self._dir.meta_cf, TABLE_CONFIG_PREFIX):
                out.append(meta_value(key, raw, self._dir.damaged))
        return out

    def create_table(self, cfg: TableConfig) -> None:
        """Records the table's config and its number (the prefix of its row keys) in one write; for a new name, the
        same write deletes a stray count/ value of it (counts: it counts no row of this table). The cost does not
        grow with the number of tables: the first table creates the shared "rows" column family, the others none."""
        with self._numbers_lock:  # a read of the numbers from meta comes before this write and its note, or after
            new = cfg.name not in self._table_numbers()[0]
            number = self.number_for(cfg.name)
            with self._dir.rocksdb(f"creating table {cfg.name!r}", "the table was not created"):
                self._rows(create=True)
                meta = self._dir.meta_handle()
                batch = WriteBatch(raw_mode=True)
                batch.put(TABLE_CONFIG_PREFIX + cfg.name.encode(), json.dumps(cfg.to_dict()).encode(), meta)
                batch.put(TABLE_ID_PREFIX + cfg.name.encode(), str(number).encode(), meta)
                if new:
                    batch.delete(COUNT_PREFIX + cfg.name.encode(), meta)
                self._dir.db.write(batch, self._dir.write_opts)
            self._table_numbers()[0][cfg.name] = number
            self._at_rest.pop(cfg.name, None)  # a replaced table's config is another's

    def number_for(self, table: str) -> int:
        """The number create_table records for table: its own, or for a new table the one after the highest in use,
        by a table or by stored rows (rows_of_no_table: the rows of a table whose meta keys were lost keep their
        number, so that no new table shares them). DataLossError, naming the key, while a table's number does not
        read or is missing: it may be any number, so that a new table given one could share its rows, and that table
        made again under a new one would lose them. TableNumbersExhaustedError for a new table where the highest
        number in use is MAX_TABLE_NUMBER."""
        numbers, unread = self._table_numbers()
        if table in numbers:
            return numbers[table]
        if table in unread:
            raise self._dir.damaged(f"{unread[table]}; the table is not created again under another number (its rows "
                                "are under the one it held)")  # fmt: skip
        first_unread(unread, self._dir.damaged, "; no new table is given a number while a table's is not known (the new "
                     "table could get it, and share that table's rows)")  # fmt: skip
        highest = max(numbers, key=numbers.__getitem__, default=None)
        top = -1 if highest is None else numbers[highest]
        orphans = self.rows_of_no_table()
        if orphans and orphans[-1] > top:
            top, holder = orphans[-1], (f"stored rows of no table ({LOST_TABLE_ROWS}; `ps-server verify "
                                        f"{self.path}` counts them) are under {orphans[-1]:,}")  # fmt: skip
        else:
            holder = f"table {highest!r} holds {top:,} (meta key tid/{highest})"
        if top == MAX_TABLE_NUMBER:  # (a "tid/" value above it does not read: meta_value)
            raise TableNumbersExhaustedError(
                f"no table number is left for new table {table!r}: a new table takes the number after the highest, "
                f"and {holder}, the largest a row key's table field takes. A shard numbers its tables from 0, one "
                "per new table, so that value was most likely damaged or written by hand; a checkpoint restored into "
                "a new data dir numbers its tables from 0. Nothing was created"
            )
        return top + 1

    def rows_of_no_table(self) -> list[int]:
        """The table numbers, ascending, that stored rows are under and no table's number (a "tid/" value that
        reads) is: the rows of a table whose meta keys were lost (LOST_TABLE_ROWS), or of a table whose number does
        not read or is missing (numbers_unread; nothing else leaves rows without their table). One seek to the first
        number in no table's hands, and one past each number in use found there: a single seek where the tables hold
        0..n-1 and no such rows are stored. A key shorter than a table number (damage) counts as if padded with zero
        bytes."""
        try:
            rows = self._rows()
        except StorageError:  # no table was ever created
            return []
        held = sorted(set(self._table_numbers()[0].values()))
        out, number = [], 0
        with self._dir.rocksdb("looking for stored rows of no table", "nothing was read"):
            it = rows.iter()
            while True:
                at = bisect.bisect_left(held, number)
                while at < len(held) and held[at] == number:  # the first number from here that no table holds
                    number, at = number + 1, at + 1
                if number > MAX_TABLE_NUMBER:
                    break
                it.seek(number.to_bytes(4, "big"))
                if not it.valid():
                    break
                number = int.from_bytes(it.key()[:4].ljust(4, b"\0"), "big")
                at = bisect.bisect_left(held, number)
                if at == len(held) or held[at] != number:
                    out.append(number)
                number += 1
            it.status()
        return out

    # {table: number} of the tables whose number reads, {table: what is damaged} of those whose number does not
    # read or whose config is stored without one: read from meta on first use (_table_numbers), under
    # _numbers_lock, which create_table holds from its read of them to its note of the new number: a read that
    # raced a create would keep numbers that lack its table
    _numbers: tuple[dict[str, int], dict[str, str]] | None = None

    def _table_numbers(self) -> tuple[dict[str, int], dict[str, str]]:
        read = self._numbers
        if read is not None:  # every row read asks: no lock once read
            return read
        with self._numbers_lock:
            if self._numbers is None:
                with self._dir.rocksdb("reading the table numbers"):
                    numbers, unread = read_table_numbers(self._dir.meta_cf)
                    for key, _ in iter_prefixed(self._dir.meta_cf, TABLE_CONFIG_PREFIX):
                        name = key_name(key)
                        if name not in numbers and name not in unread:
                            unread[name] = missing_number(name)
                self._numbers = numbers, unread
            return self._numbers

    def numbers_unread(self) -> dict[str, str]:
        """{table: what is damaged} of each table whose number does not read or whose config is stored without one
        (its rows, under a number no readable "tid/" value holds, are among rows_of_no_table's)."""
        return dict(self._table_numbers()[1])

    def table_number(self, table: str) -> int:
        """The table's number; DataLossError naming the key where it does not read or is missing (the other tables'
        numbers serve all the same)."""
        numbers, unread = self._table_numbers()
        if table not in numbers:
            raise self._dir.damaged(unread.get(table, missing_number(table)))
        return numbers[table]

    def counts(self, table: str) -> dict:
        """{"admitted": rows, "pending": ids, "trained": bool} stored for table (kept in meta, updated atomically
        with rows). A name no table has (no config, no number) has no rows: a count/ value of it is stray (damage,
        or another program's write; create_table deletes it) and counts none, but one that does not read is
        refused as damage all the same (DataLossError), as a table's is."""
        counts = self._dir.meta_get(COUNT_PREFIX + table.encode(), f"reading the row counts of table {table!r}",
                                {"admitted": 0, "pending": 0})  # fmt: skip
        numbers, unread = self._table_numbers()
        if table not in numbers and table not in unread:
            counts = {"admitted": 0, "pending": 0}
        return {**counts, "trained": trained(counts)}

    def _rows(self, create: bool = False) -> Rdict:
        """The "rows" column family (the first create_table creates it)."""
        cf = self._cfs.get(ROWS_CF)
        if cf is None:
            try:
                cf = self._dir.db.get_column_family(ROWS_CF)
            except Exception:
                if not create:
                    raise StorageError(f"{self.path}: column family {ROWS_CF} is missing") from None
                cf = self._dir.db.create_column_family(ROWS_CF, self._opts)
            self._cfs[ROWS_CF] = cf
        return cf

    def _config(self, table: str) -> TableConfig:
        cfg = self._dir.meta_get(TABLE_CONFIG_PREFIX + table.encode(), f"reading the config of table {table!r}")
        if cfg is None:
            raise self._dir.damaged(f"table {table!r} has no config (meta key table/{table})")
        return cfg

    def _layout(self, table: str) -> RowLayout:
        cfg = self._config(table)
        return layout_of(cfg.dim, cfg.optimizer.name, cfg.values_at_rest)

    def _at_rest_of(self, table: str) -> AtRest:
        """How the table's trained rows are at rest: their leading floats stored as float16, and its weight_bound.
        Read from the config and kept under _numbers_lock, which create_table holds from its write of a config to
        its drop of what was kept of the name: a read of a config that a replace (another spec, the same name)
        writes meanwhile keeps it before that drop, not after it."""
        at_rest = self._at_rest.get(table)
        if at_rest is None:
            with self._numbers_lock:
                at_rest = self._at_rest.get(table)
                if at_rest is None:
                    cfg = self._config(table)
                    half = layout_of(cfg.dim, cfg.optimizer.name, cfg.values_at_rest).half_floats
                    at_rest = self._at_rest[table] = AtRest(half, cfg.weight_bound)
        return at_rest

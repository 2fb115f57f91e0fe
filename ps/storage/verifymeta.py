"""A verify report (VerifyReport), and its findings of the meta column family and the rows that a RocksDB scan read
(ps.storage.verifyscan.verify_rocksdb): every meta value read as the server reads it (meta_values), each table's
number and every stored row's size against its layout, and the rows of no table (table_rows).
"""

from __future__ import annotations

from ps.config import TableConfig
from ps.rows.layout import KEY_BYTES, layout_of
from ps.storage.datadir import RESTORE_DIR
from ps.storage.meta import COUNT_PREFIX, TABLE_ID_PREFIX, key_name
from ps.storage.shardmeta import JOB_DONE_REMEDY
from ps.storage.tablecatalog import LOST_TABLE_ROWS
from ps.storage.verifyscan import RowSizes

_READ_REFUSED = "a restore or an export of the checkpoint is refused"  # what damage that both read makes fail


class VerifyReport:
    """The lines of a verify report, and whether any says DAMAGED."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.damaged = False

    def found(self, ok: bool, text: str) -> None:
        self.damaged |= not ok
        self.lines.append(f"{'ok     ' if ok else 'DAMAGED'} {text}")

    def note(self, text: str) -> None:
        """A finding that is no damage."""
        self.lines.append(f"note    {text}")

    def finish(self, title: str) -> tuple[list[str], bool]:
        """(the lines with a last one, `title: N damaged` or `title: nothing damaged`, whether anything is)."""
        problems = sum(line.startswith("DAMAGED") for line in self.lines)
        self.lines.append(f"{title}: {f'{problems} damaged' if self.damaged else 'nothing damaged'}")
        return self.lines, self.damaged


def _follows(key: bytes, checkpoint: bool) -> str | None:
    """What a meta value that does not read as ps.storage.meta's grammar says makes fail, in a data dir or a
    checkpoint; None where nothing reads it (a checkpoint's values other than its tables' numbers and counts:
    a restore takes the rest from the manifest)."""
    if checkpoint:
        if key.startswith(TABLE_ID_PREFIX):
            return _READ_REFUSED
        return "a restore of the checkpoint is refused" if key.startswith(COUNT_PREFIX) else None
    if key.startswith(TABLE_ID_PREFIX):
        return (
            "a request that reads its rows fails with DATA_LOSS, as do a start replaying a push to it, a "
            "checkpoint save, a Shrink of every table and the creation of a new table (the number it held is not "
            "known); the other tables serve"
        )
    return "Stats, and a start given --restore, fail with DATA_LOSS" if key == b"restored" else (
        "a server refuses to start on it")  # fmt: skip


def meta_values(meta: dict, report: VerifyReport, checkpoint: bool, at: str = "") -> None:
    """A finding for each meta value that does not read as ps.storage.meta's grammar says (as the server reads
    it), but the number of a table whose config is stored: table_rows names that with the table."""
    for key, what in sorted(meta["unreadable"].items()):
        if key.startswith(TABLE_ID_PREFIX) and key_name(key) in meta["tables"]:
            continue
        if key == b"job_done" and not checkpoint:  # read by a shard that follows a job (ps.engine.followedjob)
            report.note(f"{at}{what}: {JOB_DONE_REMEDY}")
            continue
        follows = _follows(key, checkpoint)
        if key.startswith(COUNT_PREFIX) and not checkpoint and key_name(key) not in meta["tables"]:
            follows = (f"no table {key_name(key)!r} is stored, so a start and every request leave it unread but a "
                       "CreateTable of that name, which fails with DATA_LOSS")  # fmt: skip
        if follows is None:
            report.note(f"{at}{what}: no restore or export reads it")
        else:
            report.found(False, f"{at}{what}: {follows}")


def table_rows(meta: dict, report: VerifyReport, checkpoint: bool, at: str = "") -> dict[str, int | None]:
    """Each table's number, and the size of every stored row of it against its config's layout: a trained row's
    or a pending id's (ps.rows.layout.RowLayout.sizes_at_rest; Store.get_rows refuses a row of another size with
    DATA_LOSS; a size the other values_at_rest makes is said to be one, RowLayout.written_with, as a pull's and a
    restore's are); the rows of a table number no table config has (a lost table's, which no server reads: damage in a
    data dir, a note in a checkpoint, which no restore or export reads them from), said instead with the one table whose
    number is absent or does not read, if there is one (with several such tables, said to be most likely theirs).
    meta: verify_rocksdb's, of a meta column family read whole. Returns {table: its dim, None where its config does
    not read}."""
    found = report.found
    rows, checked, bad_tables = meta["rows"], {}, 0
    dims = {table: cfg.dim if cfg is not None else None for table, cfg in meta["tables"].items()}
    numbers: set[int] = set()  # of the tables whose config is stored (readable or not) and whose number reads
    lost = []  # (table, why, what follows) of the tables whose config is stored and whose number is absent or not read
    for table, cfg in sorted(meta["tables"].items()):
        number = meta["numbers"].get(table)
        if number is None:  # (meta_values leaves a number that does not read to this finding)
            why = meta["unreadable"].get(TABLE_ID_PREFIX + table.encode())
            why = why or f"its config is stored without its number (meta key tid/{table})"  # (the line names it)
            lost.append((table, why, _follows(TABLE_ID_PREFIX, checkpoint)))
            bad_tables += 1
            continue
        numbers.add(number)
        if cfg is None:  # named by meta_values
            continue
        mine = {size: seen for (t, size), seen in rows.sizes.items() if t == number}
        checked[table] = sum(n for n, _ in mine.values())
        bad_tables += _bad_sizes(table, cfg, mine, report, checkpoint, at)
    _lost_and_orphans(lost, _orphans(rows, numbers), report, checkpoint, at)
    odd, first = rows.odd_keys
    if odd:
        found(False, f"{at}column family rows: {odd:,} keys of another size than {KEY_BYTES} bytes (table, slot, id), "
                     f"the first {first.hex()}")  # fmt: skip
    if checked and not bad_tables and not odd:
        found(True, f"{at}row sizes: {sum(checked.values()):,} stored rows of {len(checked)} table(s), each of its "
                    "table's trained row or pending id size")  # fmt: skip
    return dims


def _bad_sizes(table: str, cfg: TableConfig, mine: dict, report: VerifyReport, checkpoint: bool, at: str) -> bool:
    """Says the stored rows of table (mine: {row size: [rows, the first one's key]}) of a size its layout does not
    make, if any; whether there are any."""
    layout = layout_of(cfg.dim, cfg.optimizer.name, cfg.values_at_rest)
    sizes = layout.sizes_at_rest
    bad = {size: seen for size, seen in sorted(mine.items()) if size not in sizes}
    if not bad:
        return False
    first = min(key for _, key in bad.values())
    shown = ", ".join(f"{n:,} of {size:,} bytes{layout.written_with(size)}"
                      for size, (n, _) in list(bad.items())[:5])  # fmt: skip
    refused = _READ_REFUSED if checkpoint else "a pull of them is refused with DATA_LOSS"
    report.found(False, f"{at}table {table!r}: {sum(n for n, _ in bad.values()):,} stored rows of a size its layout "
                        f"does not make ({shown}{', ...' if len(bad) > 5 else ''}; a trained row is {sizes.trained} "
                        f"bytes, a pending id {sizes.pending}), the first of id {int.from_bytes(first[6:], 'big')} "
                        f"(key {first.hex()}): {refused}")  # fmt: skip
    return True


def _orphans(rows: RowSizes, numbers: set[int]) -> dict[int, list]:
    """{table number: [rows, the first one's key]} of the stored rows of a table number not in numbers."""
    orphans: dict[int, list] = {}
    for (number, _), (n, key) in rows.sizes.items():
        if number not in numbers:
            seen = orphans.setdefault(number, [0, key])
            seen[0], seen[1] = seen[0] + n, min(seen[1], key)
    return orphans


def _lost_and_orphans(lost: list[tuple[str, str, str]], orphans: dict[int, list], report: VerifyReport, checkpoint: bool,
                      at: str) -> None:  # fmt: skip
    """Says the tables whose number is absent or does not read (lost: (table, why, what follows)), and the rows of
    no table (orphans: _orphans'), with the one lost table they most likely are of, if there is one."""
    found = report.found
    shown = ", ".join(f"{number} ({n:,} rows)" for number, (n, _) in sorted(orphans.items())[:5])
    orphan_rows = (f"{sum(n for n, _ in orphans.values()):,} stored rows of table number(s) {shown}"
                   f"{', ...' if len(orphans) > 5 else ''}")  # fmt: skip
    first_orphan = min((key for _, key in orphans.values()), default=b"").hex()
    for table, why, follows in lost:  # the rows of the one such table are among the orphans: said here, once
        among = (f". Its rows, if it has any, are among the {orphan_rows}, which no other table has; the first key "
                 f"{first_orphan}" if orphans and len(lost) == 1 else "")  # fmt: skip
        found(False, f"{at}table {table!r}: {why}: none of its rows can be found; {follows}{among}")
    if orphans and len(lost) != 1:  # with two tables or more without their numbers, whose rows are whose is unknown
        said = (f"{at}rows of no table: {orphan_rows}, which no readable table config has (meta keys table/<name>, "
                f"tid/<name>); the first key {first_orphan}")  # fmt: skip
        if checkpoint:
            report.note(f"{said}: no restore or export reads them")
        elif lost:  # the tables above without a number that reads hold them, or some of them
            found(False, f"{said}: most likely the rows of the tables above whose numbers are missing or do not read "
                         f"({', '.join(repr(t) for t, _, _ in lost)}), which of them whose is not known")  # fmt: skip
        else:  # nothing but a table's lost meta keys leaves rows without their table
            found(False, f"{said}: {LOST_TABLE_ROWS}; {RESTORE_DIR} to get the table back, or, to drop them, save "
                         "a checkpoint and restore it into a new data dir (a restore copies only the tables it "
                         "names)")  # fmt: skip

"""A CSV header read: its column names and their positions, the label column, and what a bad label's message says."""

from __future__ import annotations

import math
from dataclasses import dataclass

from worker.cells import is_missing_text
from worker.csv_fast import BOOL_LABELS, label_value
from worker.schema import Schema
from worker.schema_columns import is_label_name, labels_by_name

DELIMITERS = (",", "\t", ";", "|")  # the delimiters --format auto tells (csv_dialect), and a one-column header's
# hint names (_delimiter_hint)


def delimiter_name(delimiter: str) -> str:
    """How messages name a delimiter: comma, tab, ';'."""
    return {",": "comma", "\t": "tab"}.get(delimiter, repr(delimiter))


def header_names(name: str, cells: list[str]) -> list[str]:
    """The column names of the header line of file `name` (cells: as the csv module reads them): each cell with the
    spaces around it left out, or ValueError where two cells that differ so name one column (` a` and `a`; two
    cells written alike stay two of one name, refused where a column reads them: header_positions)."""
    names = [c.strip() for c in cells]
    written: dict[str, str] = {}
    for cell, n in zip(cells, names):
        if n and written.setdefault(n, cell) != cell:
            raise ValueError(f"{name}: the header's cells {written[n]!r} and {cell!r} both name column {n!r} (the "
                             "spaces around a name are no part of it): rename one of them")  # fmt: skip
    return names


@dataclass(frozen=True)
class LabelColumn:
    """The label column of a header as a file is read: at, its index (None: no label read), name, and origin,
    where the schema took it (Schema.label_from); problem() says what is wrong with a bad label."""

    at: int | None
    name: str | None
    origin: str
    header: list[str]
    blank_ok: bool = False  # a label cell other than 0 or 1 is no label, NaN (predict; but a repeated header's)

    def good(self, cell: str) -> bool:
        """Whether a label cell is a label (0 or 1), or, blank_ok, a blank one (empty, or NA, ?:
        cells.MISSING_TEXTS)."""
        return label_value(cell) in (0.0, 1.0) or (self.blank_ok and (not cell.strip() or is_missing_text(cell)))

    def unread(self, row: list[str]) -> bool:
        """Whether a record (row: its cells) whose label cell is not good is read all the same, its label NaN:
        blank_ok, and not a repeated header (predict reads no label: a row of good features is scored)."""
        return self.blank_ok and not self._repeated_header(row)

    def _repeated_header(self, row: list[str]) -> bool:
        return [c.strip() for c in ([row[0].removeprefix("\ufeff"), *row[1:]] if row else row)] == self.header

    def problem(self, cell: str, row: list[str]) -> str:
        """Why a record (row: its cells) whose label cell is `cell` is bad."""
        if self._repeated_header(row):
            return "a repeated header line (files concatenated?)"
        what = f"label {cell!r}" if cell.strip() else "an empty label"
        if self.origin in ("schema", "--label-column"):
            given = "the schema's label" if self.origin == "schema" else "given by --label-column"
            return f"{what}, expected 0 or 1 (column {self.name!r}, {given}){_other_coding(cell)}"
        if self.origin != "first column":  # a column the built-in schema took for its name (schema_builtin.csv_label)
            return (f"{what}, expected 0 or 1 (column {self.name!r}, {self.origin}: --label-column or the schema's "
                    f"`label` names another){_other_coding(cell)}")  # fmt: skip
        if is_label_name(self.name) and _other_coding(cell):  # the label it is, its values written otherwise
            return f"{what}, expected 0 or 1 (column {self.name!r}, the first column){_other_coding(cell)}"
        named = labels_by_name([h for h in self.header if h != self.name])
        hint = f"; the header has {named[0]!r}: --label-column {named[0]}?" if len(named) == 1 else ""
        if len(named) > 1:
            shown = ", ".join(map(repr, named[:-1])) + f" and {named[-1]!r}"
            hint = f"; the header has {shown}, named like a label: --label-column names the one to predict"
        return (f"{what}, expected 0 or 1 (column {self.name!r}, the first column, the built-in default: "
                f"--label-column or the schema's `label` names another{hint})")  # fmt: skip


def _other_coding(cell: str) -> str:
    """For a label cell of the label column that is -1 or a word (not a missing value's text), as labels coded -1
    and 1, or with words other than label_value's (clicked and not), are: how to write them; else ""."""
    value = label_value(cell)
    if value != -1 and not (math.isnan(value) and cell.strip() and not is_missing_text(cell)):
        return ""
    return (": rewrite the column as 1 for the outcome the model predicts and 0 for the other (" + BOOL_LABELS +
            " are read as 1 and 0 too)")  # fmt: skip


def _delimiter_hint(header: list[str], delimiter: str) -> str:
    """A hint for a header read as one column that another delimiter would split, else ""."""
    if len(header) != 1:
        return ""
    for other in DELIMITERS:
        if other != delimiter and other in header[0]:
            return (f" (the header looks {delimiter_name(other)}-separated: --format auto tells a header's delimiter, "
                    "a schema's `delimiter` names it)")  # fmt: skip
    return ""


def csv_columns(name: str, header: list[str], schema: Schema, labeled: bool = True, blank_ok: bool = False
                ) -> tuple[LabelColumn, dict[str, int]]:  # fmt: skip
    """(the label column, {source: index}) of a header, or ValueError naming what the schema needs that it lacks;
    labeled=False: no label is read (index None); blank_ok: a blank label cell is no label (LabelColumn)."""
    if not header:
        raise ValueError(f"{name}: the header line names no columns")
    label = schema.label if schema.label is not None else (header[0] if header else None)
    sources = list(dict.fromkeys(c.source for c in schema.columns))
    if not labeled:
        label = None
    named = [label, *sources] if labeled else sources
    at = header_positions(name, header, named, schema.delimiter)
    if label in sources:
        raise ValueError(f"{name}: column {label!r} is the label (the first column) and a column of the schema")
    origin = schema.label_from if schema.label is not None else "first column"
    label_at = at.pop(0) if labeled else None
    return LabelColumn(label_at, label, origin, header, blank_ok), dict(zip(sources, at))


def header_positions(name: str, header: list[str], columns: list[str], delimiter: str) -> list[int]:
    """The position in the header of file `name` of each of columns, or ValueError naming those it lacks (with
    _delimiter_hint's hint) or names more than once."""
    unknown = [c for c in columns if c not in header]
    if unknown:
        raise ValueError(f"{name}: columns {unknown} are not in the header; its columns are {header}"
                         f"{_delimiter_hint(header, delimiter)}")  # fmt: skip
    repeated = [c for c in columns if header.count(c) > 1]
    if repeated:
        raise ValueError(f"{name}: columns {repeated} appear more than once in the header {header}")
    return [header.index(c) for c in columns]

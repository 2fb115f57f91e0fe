"""The built-in schemas: `--format criteo|csv|libsvm` and the column flags as a Schema (worker/schema.py), so every
run reads its data through one; resolve_schema picks between them (`--format auto`: by the data's first line) and
a --schema file."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from worker.csv_fast import BOOL_LABELS
from worker.features import NUM_INT_FIELDS
from worker.readers.csv_header import header_names
from worker.readers.csv_records import read_header_cells
from worker.schema import Schema, TableSchema
from worker.schema_columns import (
    AUTO_FORMAT,
    CRITEO_COLUMNS,
    FORMATS,
    MAX_LIBSVM_FIELDS,
    Column,
    labels_by_name,
    libsvm_column,
)
from worker.schema_file import load_schema
from worker.schema_hints import HINT_SAMPLE_ROWS, warn_of_csv_columns, warn_of_negative_logs_in_schema

log = logging.getLogger("worker.schema_builtin")


def builtin_schema(
    fmt: str,
    *,
    default_table: str,
    default_dim: int,
    header: list[str] | None = None,
    label_column: str | None = None,
    drop_columns: tuple[str, ...] | list[str] = (),
    numeric_columns: tuple[str, ...] | list[str] = (),
    libsvm_fields: int | None = None,
    libsvm_weighted: bool = False,
    delimiter: str = ",",
) -> Schema:
    """The schema of `--format fmt` and the column flags, every sparse column on default_table (csv: its
    delimiter, that of the header given):

    criteo  sparse fields I1..I13 (log_buckets of the integer) and C1..C26 (categorical), then the numeric
            features I1_log..I13_log (log): the ids of features.example_ids and the dense_features.
    csv     the header's columns other than the label (label_column, default the first) and drop_columns:
            numeric_columns are numeric features (log) in the order given, the others categorical sparse
            fields in header order (id space f for the f-th of them).
    libsvm  fields f0..f{K-1} (K = libsvm_fields), categorical: the k-th token's id, all in one id space
            (schema_columns.LIBSVM_ID_SPACE); libsvm_weighted (a file whose values are not all 0 and 1:
            libsvm_reader.libsvm_sample): weighted, that id with the token's value as its weight (pooling sum).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is unknown; expected one of {list(FORMATS)}")
    if fmt != "csv" and (label_column is not None or drop_columns or numeric_columns or delimiter != ","):
        raise ValueError(f"label_column, drop_columns, numeric_columns and delimiter apply to csv only, not {fmt}")
    if libsvm_fields is not None and (fmt != "libsvm" or libsvm_fields < 0):
        raise ValueError(f"libsvm_fields is {libsvm_fields} for format {fmt}; expected libsvm and >= 0")
    if libsvm_weighted and fmt != "libsvm":
        raise ValueError(f"libsvm_weighted for format {fmt}; expected libsvm")
    t = default_table
    label: str | None = "label"
    if fmt == "criteo":
        ints, cats = CRITEO_COLUMNS[1 : 1 + NUM_INT_FIELDS], CRITEO_COLUMNS[1 + NUM_INT_FIELDS :]
        columns = [Column(s, s, "numeric", t, s, transform="log_buckets") for s in ints]
        columns += [Column(s, s, "categorical", t, s) for s in cats]
        columns += [Column(f"{s}_log", s, "numeric", transform="log") for s in ints]
    elif fmt == "libsvm":
        if libsvm_fields is None:
            raise ValueError("the built-in libsvm schema needs libsvm_fields, the number of fields K")
        if libsvm_fields > MAX_LIBSVM_FIELDS:
            raise ValueError(f"{libsvm_fields} libsvm fields, more than {MAX_LIBSVM_FIELDS}: a field is a position "
                             "(f<k>: a line's k-th feature token), which suits lines of up to a few "
                             "dozen one-hot features; a long list of ids per line is one multi_hot column of a CSV "
                             "file (a bag)")  # fmt: skip
        columns = [libsvm_column(f"f{k}", t, weighted=libsvm_weighted) for k in range(libsvm_fields)]
    else:
        label, numeric, categorical = _csv_roles(header, label_column, tuple(drop_columns), tuple(numeric_columns))
        columns = [Column(h, h, "categorical", t, h) for h in categorical]
        columns += [Column(h, h, "numeric", transform="log") for h in numeric]
    label_from = "--label-column" if label_column is not None else "first column" if fmt == "csv" else "schema"
    return Schema(fmt, delimiter, label, tuple(columns), {t: TableSchema(default_dim)}, t, label_from)


def _csv_roles(
    header: list[str] | None, label_column: str | None, drop: tuple[str, ...], numeric: tuple[str, ...]
) -> tuple[str, list[str], list[str]]:
    """(label, numeric columns in the order given, categorical columns in header order) of a csv header (its
    names trimmed, as csv_header.header_names reads them; a cell with spaces around it is named by its trimmed
    text too); the names given are trimmed alike (` clicked` names `clicked`) and name the header's column of
    that name."""
    if not header:
        raise ValueError("the header line names no columns")
    by_name = {h.strip(): h for h in header}  # (cells that differ and name one column: refused, header_names)
    label_column = by_name.get(label_column.strip(), label_column.strip()) if label_column is not None else None
    drop, numeric = (tuple(by_name.get(c.strip(), c.strip()) for c in given) for given in (drop, numeric))
    named = ([label_column] if label_column is not None else []) + list(drop) + list(numeric)
    unknown = [c for c in dict.fromkeys(named) if c not in header]
    if unknown:
        raise ValueError(f"columns {unknown} are not in the header; its columns are {header}")
    label = header[0] if label_column is None else label_column
    roles = {"label": {label}, "drop": set(drop), "numeric": set(numeric)}
    for a, b in (("label", "drop"), ("label", "numeric"), ("drop", "numeric")):
        if roles[a] & roles[b]:
            raise ValueError(f"columns {sorted(roles[a] & roles[b])} are both {a} and {b} columns")
    used = [h for h in header if h not in roles["drop"] and h != label]
    repeated = sorted({h for h in [label, *used] if header.count(h) > 1})
    if repeated:
        raise ValueError(
            f"columns {repeated} appear more than once in the header {header}; drop them or write a schema"
        )
    if not label.strip():
        raise ValueError(
            f"the label column {header.index(label) + 1} of the header {header} has no name (a row index that "
            "pandas' to_csv wrote?): give --label-column, and name that column in the header or write a schema "
            "without it (ps-worker schema --data FILE)"
        )
    unnamed = [k + 1 for k, h in enumerate(header) if not h.strip() and h in used]
    if unnamed:
        why = (
            "a delimiter at the end of each line?"
            if unnamed == [len(header)]
            else "a row index that pandas' to_csv wrote?"
        )
        raise ValueError(
            f"column{'s' if len(unnamed) > 1 else ''} {', '.join(map(str, unnamed))} of the header {header} "
            f"ha{'ve' if len(unnamed) > 1 else 's'} no name ({why}), so no flag can name it: name it in the header, "
            "or write a schema without it (ps-worker schema --data FILE)"
        )
    bad = [h for h in used if not h or h.startswith("_")]
    if bad:
        raise ValueError(
            f"columns {bad}: a field name must be non-empty and not start with '_'; drop them or write a schema"
        )
    return label, list(numeric), [h for h in used if h not in roles["numeric"]]


def separator_of_one_column(header: list[str], first: list[str], delimiter: str, separators: str) -> str | None:
    """The first of separators (other than delimiter) that a one-column header and the first record's cell (first:
    its cells) both hold: a file separated by it, read with delimiter. None if there is none, or no record."""
    if len(header) != 1 or not first:
        return None
    return next((d for d in separators if d != delimiter and d in header[0] and d in first[0]), None)


def resolve_schema(
    data: str | None,
    *,
    schema_path: str | None,
    fmt: str,
    label_column: str | None,
    drop_columns: tuple[str, ...] | list[str],
    numeric_columns: tuple[str, ...] | list[str],
    libsvm_fields: int | None,
    default_table: str,
    default_dim: int,
    libsvm_values: str = "auto",
    model: str | None = None,
    training: bool = True,
) -> Schema:
    """The run's schema: the --schema file (its format wins over fmt), or the built-in one of fmt and the
    column flags, reading the csv header or the libsvm field count K from the file `data` (of many, the first
    with content: formats.first_with_content; a csv's sample records from the first holding some:
    formats.csv_records). fmt "auto": the format format_detection.detect_format tells by data's first
    line (said in the schema's format_from); a column flag of another format is refused. csv without label_column:
    the label column csv_label picks (the first column by default). libsvm: libsvm_values (schema_columns.LIBSVM_VALUES)
    says whether its fields read values as weights; auto: where libsvm_sample finds a value other than 0 and 1.
    A csv --schema file's log columns holding numbers below 0 in a sample of data are warned of, as --numeric-columns'
    are (schema_hints.warn_of_negative_logs_in_schema); its tables' dims are checked to fit model's rows. training
    False (eval, predict): of the built-in csv schema's warnings, those of data alone (warn_of_csv_columns)."""
    spec = data  # the data's files, where it names many (their hints name them all)
    if data is not None:
        from worker.formats import first_with_content

        data = first_with_content(data)
    if schema_path is not None:
        flags = {"--label-column": label_column is not None, "--drop-columns": bool(drop_columns),
                 "--numeric-columns": bool(numeric_columns), "--libsvm-fields": libsvm_fields is not None,
                 "--libsvm-values": libsvm_values != "auto"}  # fmt: skip
        schema = _schema_file(schema_path, data, fmt, [flag for flag, on in flags.items() if on], default_table,
                              default_dim, model)  # fmt: skip
        if data is not None:
            warn_of_negative_logs_in_schema(spec, schema, schema_path)
        return schema
    format_from, delimiter = "", ","
    if fmt == AUTO_FORMAT:
        fmt, seen, delimiter = _detected_format(spec, data)
        format_from = f"detected: {seen}"
        _check_column_flags(data, fmt, seen, label_column, drop_columns, numeric_columns, libsvm_fields, libsvm_values)
    if data is None and (fmt == "csv" or (fmt == "libsvm" and libsvm_fields is None)):
        raise ValueError(f"the built-in {fmt} schema needs the data file (its header or field count); none given")
    # cells: the header's as written; picked: csv_label's
    header, cells, rows, picked = (
        _csv_header(data, spec, delimiter, label_column) if fmt == "csv" else (None, None, [], None)
    )
    libsvm_fields, weighted = _libsvm_fields(fmt, data, libsvm_fields, libsvm_values)
    named = picked is not None and picked[1] != "first column"  # a column taken for its name
    label_column = picked[0] if named else label_column
    try:
        schema = builtin_schema(fmt, default_table=default_table, default_dim=default_dim, header=header,
                                label_column=label_column, drop_columns=drop_columns,
                                numeric_columns=numeric_columns, libsvm_fields=libsvm_fields,
                                libsvm_weighted=weighted, delimiter=delimiter)  # fmt: skip
    except ValueError as e:
        raise ValueError(f"{data}: {e}" if data is not None else str(e)) from None
    as_written = _as_written(schema, header, cells) if fmt == "csv" else None
    schema = dataclasses.replace(schema, format_from=format_from, as_written=as_written,
                                 libsvm_values=libsvm_values if fmt == "libsvm" else None,
                                 **({"label_from": picked[1]} if named else {}))  # fmt: skip
    if fmt == "csv":
        warn_of_csv_columns(spec, header, rows, schema, label_column is None and not named, not numeric_columns,
                            training)  # fmt: skip
    return schema


def _detected_format(spec: str | None, data: str | None) -> tuple[str, str, str]:
    """(the format, why, the delimiter: a csv's told, else ",") format_detection.detect_format tells of spec's
    files; refused without data."""
    from worker.format_detection import detect_format

    if data is None:
        raise ValueError("--format auto tells the format by the data file's first line; none given")
    fmt, told, seen = detect_format(spec)
    return fmt, seen, told or ","


def _schema_file(schema_path: str, data: str | None, fmt: str, given: list[str], default_table: str,
                 default_dim: int, model: str | None) -> Schema:  # fmt: skip
    """resolve_schema of a --schema file: refused with column flags given; --format other than its format said
    unused; a csv schema of no label takes the first column of data's header (for every file read through it)."""
    if given:
        raise ValueError(f"--schema {schema_path} describes the columns; it cannot be combined with {given}")
    schema = load_schema(schema_path, default_table=default_table, default_dim=default_dim, model=model)
    if fmt != schema.format and fmt != AUTO_FORMAT:  # the default is no choice of the user's
        log.warning("--format %s is not used: --schema %s says format = %r", fmt, schema_path, schema.format)
    if schema.format == "csv" and schema.label is None and data is not None:  # the training file's first
        from worker.formats import read_csv_header  # column, for every file read through it (eval's too)

        header = read_csv_header(data, schema.delimiter)
        if header:
            schema = dataclasses.replace(schema, label=header[0], label_from="first column")
    return schema


def _csv_header(data: str, spec: str, delimiter: str, label_column: str | None) -> tuple[
    list[str], list[str], list[list[str]], tuple[str, str] | None
]:  # fmt: skip
    """(the header's names, its cells as written, sample records of spec's files, csv_label's pick or None) of a
    csv file read with delimiter; refused where it is empty, its header reads as of another separator, or no column
    can be the label (_check_a_label_is_named)."""
    from worker.formats import csv_records

    cells = read_header_cells(data, delimiter)
    if cells is None:
        raise ValueError(f"{data}: the file is empty; a csv file starts with a header line")
    header = header_names(data, cells)
    _, rows = csv_records(spec, delimiter, HINT_SAMPLE_ROWS)  # past header-only files
    other = separator_of_one_column(header, rows[0] if rows else [], ",", "\t;|")  # a label-only file's row: none
    if other:
        raise ValueError(
            f"{data}: its header line is one column holding {other!r} and no ',': a {other!r}-separated "
            "file? --format csv reads commas; --format auto (the default) tells the delimiter of a header line "
            "of names (or --format criteo for Criteo TSV, which has no header)"
        )
    picked = None
    if label_column is None and header:
        picked = csv_label(header, rows)
        if picked is None:
            _check_a_label_is_named(data, header, rows)
    return header, cells, rows, picked


def _libsvm_fields(
    fmt: str, data: str | None, libsvm_fields: int | None, libsvm_values: str
) -> tuple[int | None, bool]:
    """(the libsvm field count: libsvm_fields, else counted in data's sample; whether the fields read values as
    weights, as libsvm_values says of that sample); --libsvm-values refused for another format."""
    from worker.readers.libsvm_reader import libsvm_sample, libsvm_values_read_as

    sampled = False  # whether the libsvm sample holds a value other than 0 and 1 (none taken without data)
    if fmt == "libsvm" and (libsvm_fields is None or data is not None):
        counted, sampled = libsvm_sample(data)
        libsvm_fields = counted if libsvm_fields is None else libsvm_fields
    weighted = libsvm_values_read_as(libsvm_values, sampled) == "weights"
    if fmt != "libsvm" and libsvm_values != "auto":
        raise ValueError(f"--libsvm-values is for libsvm data, not {fmt}; leave it out")
    return libsvm_fields, weighted


def _as_written(schema: Schema, header: list[str], cells: list[str]) -> Schema | None:
    """Schema.as_written of the built-in csv schema of a header (header: its names, trimmed; cells: as written):
    the same schema with the label and each column's name, source and id space the cell as written, as the schema
    built from the cells reads; None where no cell has spaces around it."""
    if cells == header:
        return None
    written = dict(zip(header, cells))  # (cells that name one column but for their spaces: refused, header_names)

    def spaced(name: str | None) -> str | None:
        return written.get(name, name) if name is not None else None

    columns = tuple(
        dataclasses.replace(c, name=spaced(c.name), source=spaced(c.source), id_space=spaced(c.id_space))
        for c in schema.columns
    )
    return dataclasses.replace(schema, label=spaced(schema.label), columns=columns)


def _check_column_flags(data: str, fmt: str, seen: str, label_column: str | None, drop_columns: Sequence[str],
                        numeric_columns: Sequence[str], libsvm_fields: int | None, libsvm_values: str = "auto"
                        ) -> None:  # fmt: skip
    """ValueError when a flag of another format's columns is given for data detected as fmt (seen: why)."""
    flags = (("--label-column", label_column is not None, "csv"), ("--drop-columns", bool(drop_columns), "csv"),
             ("--numeric-columns", bool(numeric_columns), "csv"), ("--libsvm-fields", libsvm_fields is not None,
             "libsvm"), ("--libsvm-values", libsvm_values != "auto", "libsvm"))  # fmt: skip
    for flag, given, whose in flags:
        if given and fmt != whose:
            raise ValueError(f"{data} reads as {fmt} ({seen}), and {flag} is for {whose} data: give --format {whose} "
                             f"to read it as {whose}, or leave {flag} out")  # fmt: skip


def holds_labels(cells: Sequence[str]) -> bool:
    """Whether CSV cells hold labels: each 0 or 1 as the CSV readers read a label (csv_fast.label_value: true and
    false, yes and no too) or blank (empty, NA, ?: cells.MISSING_TEXTS, a row to score), and at least one 0 or 1."""
    from worker.cells import is_missing_text
    from worker.csv_fast import label_value

    labels = [label_value(c) in (0.0, 1.0) for c in cells]
    return any(labels) and all(y or not c.strip() or is_missing_text(c) for y, c in zip(labels, cells))


def csv_label(header: list[str], rows: list[list[str]]) -> tuple[str, str] | None:
    """(the label column, why: Schema.label_from) of the built-in csv schema without --label-column, told by a
    sample of the file's records (rows): the one column whose cells hold labels (holds_labels) that
    schema_columns.labels_by_name takes (as `ps-worker schema` takes it, before a first column of 0 and 1 not named so:
    is_mobile,click); else the first column where its cells hold labels, "first column". None where neither is
    (no such column, or several): the first column is then the label, whose reader refuses its
    first bad label, naming the columns named like a label (resolve_schema refuses at once where none of those
    holds labels either: _check_a_label_is_named)."""
    holding = [i for i in range(len(header)) if holds_labels([row[i] for row in rows])]
    named = labels_by_name([header[i] for i in holding])
    if len(named) == 1 and named[0] != header[0]:
        first = "holds 0 and 1 too but is not named like a label" if 0 in holding else "holds other values"
        return named[0], (f"named like a label and holding 0 and 1 in {_first_rows(rows)}, where the first "
                          f"column, {header[0]!r}, {first}")  # fmt: skip
    return (header[0], "first column") if 0 in holding else None


def _check_a_label_is_named(data: str, header: list[str], rows: list[list[str]]) -> None:
    """ValueError where the sample rows show no column can be the label: the first column's cells, and those of each
    other column named like a label (schema_columns.labels_by_name), hold values other than 0 and 1 (a count of clicks,
    say), so the reader's refusal would point to a column that cannot be it either. Where no other column is named
    so, that refusal of the first column's first bad label says what is wrong."""
    by_name = set(labels_by_name(header[1:]))
    named = {i: h for i, h in enumerate(header) if i and h in by_name}
    if not rows or not named or any(holds_labels([r[i] for r in rows]) for i in named):
        return
    holds = [f"the first column, {header[0]!r}, {_not_labels([r[0] for r in rows])}"]
    holds += [f"{h!r}, named like a label, {_not_labels([r[i] for r in rows])}" for i, h in named.items()]
    other = next((h for i, h in enumerate(header) if holds_labels([r[i] for r in rows])), None)
    flag = (f"; or, where {other!r}, of 0 and 1 already, is the outcome to predict, give --label-column {other}"
            if other is not None else "")  # fmt: skip
    raise ValueError(f"{data}: no column can be the label (0 or 1, or {BOOL_LABELS}): in {_first_rows(rows)}, "
                     f"{'; '.join(holds)}. No flag reads these values as labels: write the column to predict as 0 "
                     "and 1 (-1 as 0, a count as 1 where it is above 0), then train on the rewritten file with "
                     f"--label-column naming that column{flag}")  # fmt: skip


def _first_rows(rows: list[list[str]]) -> str:
    """The sample rows, as a message names them."""
    return "the first row" if len(rows) == 1 else f"the first {len(rows):,} rows"


_SHOWN_VALUES = 4  # distinct values of a column _not_labels names, at most


def _not_labels(cells: list[str]) -> str:
    """What cells that are no labels (holds_labels) hold: their distinct values, in the order met (-1 and 1, not -1
    alone: the 1 is no label either, beside them), up to _SHOWN_VALUES and a count of the others; or that they are
    blank."""
    from worker.cells import is_missing_text

    values = list(dict.fromkeys(c for c in cells if c.strip() and not is_missing_text(c)))
    if not values:
        return "is blank"
    shown = list(map(repr, values[:_SHOWN_VALUES]))
    if len(values) > _SHOWN_VALUES:
        return f"holds {', '.join(shown)} and {len(values) - _SHOWN_VALUES:,} others"
    return "holds " + (f"{', '.join(shown[:-1])} and {shown[-1]}" if len(shown) > 1 else shown[0])

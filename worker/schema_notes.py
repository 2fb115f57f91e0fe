"""What a run says of its schema: the format --format auto chose, a libsvm schema's weighted fields, and the
line of how a csv run reads the file's columns."""

from __future__ import annotations

from worker.readers.csv_header import delimiter_name
from worker.schema import Schema
from worker.schema_columns import TIME_TRANSFORMS

_SHOWN_NAMES = 6  # names of a kind the columns line shows, at most


def format_note(schema: Schema) -> str:
    """What a run says of its format where --format auto chose it (schema.format_from), else ""."""
    return f"format {schema.format} ({schema.format_from}; --format sets it)" if schema.format_from else ""


def libsvm_note(schema: Schema) -> str:
    """What a run says of a libsvm schema whose fields are weighted (the built-in one of a file whose values are
    not all 0 and 1), else ""."""
    weighted = [c.name for c in schema.columns if schema.format == "libsvm" and c.kind == "weighted"]
    if not weighted:
        return ""
    return (f"libsvm fields {weighted[0]}..{weighted[-1]} weighted: each feature's value is its weight (the file's "
            "values are not all 0 and 1); a value of 0 is a missing feature")  # fmt: skip


def columns_line(schema: Schema, header: list[str] | None) -> str:
    """One line of a csv run's story saying how it reads the file's columns (header: the training file's): the
    format where --format auto chose it (format_note, which names the delimiter), else a delimiter other than a
    comma, the label and where it was taken from, the fields by kind
    and transform (names shown up to _SHOWN_NAMES a kind), the columns of times read only as their hours of day
    and weekdays (not as numbers), and the header's columns no field reads."""
    origin = {"first column": "the first column, the built-in default", "schema": "the schema's `label`",
              "--label-column": "--label-column"}  # fmt: skip
    label = schema.label if schema.label is not None else (header or ["?"])[0]
    why = origin.get(schema.label_from, f"{schema.label_from}; --label-column sets it")
    parts = [f"label {label!r} ({why})"]
    if schema.format_from:  # (a detected delimiter said in it)
        parts.insert(0, format_note(schema))
    elif schema.delimiter != ",":
        parts.insert(0, f"{delimiter_name(schema.delimiter)}-separated")
    kinds: dict[str, list[str]] = {}
    for c in schema.columns:
        kind = "categorical, each value an id" if c.kind == "categorical" else c.kind
        if c.kind == "numeric":
            kind = f"{'bucketized' if c.is_sparse else 'numeric'} ({c.transform})"
        if c.transform in TIME_TRANSFORMS:
            kind = "hour of day or weekday of a time, each an id"
        kinds.setdefault(kind, []).append(c.name)
    for kind, names in kinds.items():
        more = f" and {len(names) - _SHOWN_NAMES} more" if len(names) > _SHOWN_NAMES else ""
        parts.append(f"{len(names)} {kind}: {', '.join(names[:_SHOWN_NAMES])}{more}")
    times = {c.source for c in schema.columns if c.transform in TIME_TRANSFORMS}
    times -= {c.source for c in schema.columns if c.transform not in TIME_TRANSFORMS}
    if times:
        parts.append(f"time{'s' if len(times) > 1 else ''} {', '.join(sorted(times))} read as hour of day and "
                     "weekday only, not as a number")  # fmt: skip
    read = {label} | {c.source for c in schema.columns}
    unread = [h for h in header or [] if h not in read]
    parts.append(f"not read: {', '.join(unread) if unread else 'none'}")
    return "columns  " + "; ".join(parts)

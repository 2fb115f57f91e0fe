"""A data file's format told by its start (worker/formats.py reads it): --format auto's detection, and the check that
every file of the data is in the first one's format.

    detect_format(path) -> (format, delimiter, what was seen)   # --format auto: told by the data's first line
    check_same_format(path, schema)             # ValueError naming the first file unlike the first one
"""

from __future__ import annotations

import os

from worker.criteo import NUM_COLUMNS, libsvm_like, libsvm_tokens, other_format_hint
from worker.datafiles import data_files
from worker.formats import file_has_labels, first_with_content
from worker.readers import criteo_reader, libsvm_reader
from worker.readers.csv_dialect import csv_delimiter
from worker.readers.csv_header import DELIMITERS, delimiter_name
from worker.readers.csv_records import read_csv_header, read_header_cells
from worker.readers.share import LABEL_PROBE_LINES, first_line, has_control_bytes, is_blank
from worker.schema import Schema
from worker.schema_hints import header_reads_like_an_example


def check_same_format(path: str | os.PathLike, schema: Schema) -> None:
    """ValueError naming the first file of `path` (many files, see worker/datafiles.py) whose format differs from
    the first file's with content, and how: a CSV header other than the first's; a first data line the format
    cannot split (Criteo: 39 or 40 tab-separated columns; libsvm: label and id:value tokens); labels where the
    first file has none, or none where it has them. Files of no content (share.is_blank) are left out; ValueError
    if every file is such. Read as criteo, the first file with content (a single file: that file) whose line 1 has
    no tab and looks like another format (CSV, another delimiter, libsvm: criteo.other_format_hint) is refused too,
    with that format's flag: every line would be malformed, so it is said at once, not after --max-bad-lines of
    them. Where --format auto told the schema's format (schema.format_from: the training data's), a first file with
    content that detect_format tells as another format, or as CSV of another delimiter, is refused naming both
    (--eval-data of Criteo TSV for a CSV run, say). Only each file's start is read."""
    listed = data_files(path)
    name = first_with_content(path) if listed else None
    if name is not None and schema.format_from:  # --format auto told the training data's: another format, said so
        try:
            fmt, delimiter, seen = detect_format(name)
        except ValueError:  # nothing told: the checks of schema.format below say what is wrong, as the reader would
            fmt, delimiter = schema.format, schema.delimiter
        if fmt != schema.format or (fmt == "csv" and delimiter != schema.delimiter):
            raise ValueError(f"{name} reads as {fmt} ({seen}), but the training data as {schema.format} "
                             f"({schema.format_from}): every file a run reads must be in the training data's "
                             "format; nothing was read")  # fmt: skip
    if name is not None and schema.format == "criteo":
        other = criteo_reader.other_format_first_line(name)
        if other:  # every line would be malformed: said at once, not after --max-bad-lines of them
            raise ValueError(f"{name} line 1: {other}; a file of no tab is no Criteo TSV: nothing was read")
    if len(listed) < 2:
        return
    files = [name for name in listed if not is_blank(name)]
    if not files:
        raise ValueError(f"{os.fspath(path)}: its {len(listed)} files are all empty: no examples to read")
    first, labeled = files[0], file_has_labels(files[0], schema)
    header = read_csv_header(first, schema.delimiter) if schema.format == "csv" else None
    for name in files:
        if schema.format == "csv":
            other = read_csv_header(name, schema.delimiter)
            if other != header:
                raise ValueError(f"{name}: its CSV header {other} differs from that of {first}, {header}: every "
                                 "file of the data must have the same columns in the same order")  # fmt: skip
        else:
            problem = (
                criteo_reader.first_line_problem(name)
                if schema.format == "criteo"
                else libsvm_reader.first_line_problem(name, labeled)
            )
            if problem and name == first:
                raise ValueError(f"{name}: {problem}: the data must be {schema.format} (is --format right?)")
            if problem:
                raise ValueError(f"{name}: {problem}, unlike {first}: every file of the data must be {schema.format}")
        if file_has_labels(name, schema) != labeled:
            has = "has no labels" if labeled else "has labels"
            raise ValueError(f"{name} {has}, unlike {first}: every file of the data must be alike")


def detect_format(path: str | os.PathLike) -> tuple[str, str | None, str]:
    """(format, delimiter, what was seen) of `--format auto`, told by the first file with content of path
    (first_with_content); the delimiter is a CSV's, None for the other formats:
      libsvm  its first line with content, past lines of a comment only (# ...), is a label and id:value tokens
              (criteo.libsvm_like: SVMlight's qid and comments as the reader reads them)
      criteo  that line is 40 tab-separated columns, 0 or 1 first, or blank with integers or blank cells after it
              (a file to score; or 39, a file without labels: the first an integer or empty): Criteo TSV, which has
              no header line
      csv     its first line is a header: two or more names (read by the csv module, quotes and all) separated by
              commas, tabs, ';' or '|' (the one the records under it agree with: readers/csv_dialect.py), not an
              example (schema_hints.header_reads_like_an_example: a label, 0 or 1, first, mostly numbers, or
              numbers only)
    ValueError for a file of no content; naming --format and what was seen, for anything else: a first line that
    reads like an example (a CSV without a header line; tab-separated: not Criteo's 40 columns, or Criteo's of
    another label), a delimiter the records refuse or do not tell, blank lines above a header, a line of one
    column, a line of control bytes (a binary file). Only the file's start is read (LABEL_PROBE_LINES lines at
    most, and the first csv_dialect.CHECKED_RECORDS records)."""
    name = first_with_content(path)
    line = first_line(name, lambda line: bool(line.strip()))
    cannot = f"{name}: --format auto cannot tell its format"
    if line is None and is_blank(name):
        raise ValueError(f"{name}: no examples in it (it is empty): no line to tell its format by")
    if line is None:
        raise ValueError(f"{cannot}: its first {LABEL_PROBE_LINES:,} lines are blank; give --format (criteo, csv, "
                         "libsvm)")  # fmt: skip
    body = line.rstrip(b"\r\n")
    shown = repr(body.decode("utf-8", "replace")[:100])
    if has_control_bytes(body):
        raise ValueError(f"{cannot}: its first line ({shown}) holds control bytes, which text does not: a binary "
                         "file, or a damaged one? Data files are text: Criteo TSV, CSV with a header line, libsvm")  # fmt: skip
    cells = body.split(b"\t")
    first = cells[0].strip()
    past_comments = first_line(name, lambda line: bool(libsvm_tokens(line))) or b""  # (lines of a comment: # ...)
    if libsvm_like(past_comments.rstrip(b"\r\n")):  # (whitespace-separated: tabs too, as the reader splits it)
        first = "its first line" if past_comments == line else "its first data line, below comment lines (# ...),"
        return "libsvm", None, f"{first} is a label and id:value tokens"
    criteo_ints = len(cells) == NUM_COLUMNS and all(not c or c.lstrip(b"-").isdigit() for c in cells[1:14])
    seen = _criteo_seen(cells, criteo_ints)
    if seen:
        return "criteo", None, seen
    if not criteo_ints and not read_header_cells(name, ",") and any(d.encode() in body for d in DELIMITERS):
        raise ValueError(f"{cannot}: its first line is blank, and the first with content ({shown}) is further down: "
                         "a CSV file's header is its first line; remove the blank lines above it")  # fmt: skip
    try:
        found = None if criteo_ints else csv_delimiter(name)  # (a Criteo line of another label: said below)
    except ValueError as e:
        raise ValueError(f"{cannot}: its first line ({shown}) {e}; give --format (criteo, csv, libsvm), or "
                         "--schema naming the delimiter (`ps-worker schema --data FILE --delimiter ...` writes "
                         "one)") from None  # fmt: skip
    if found is not None:
        delimiter, header = found
        example = header_reads_like_an_example(path, header, delimiter=delimiter)
        if not example:
            return "csv", delimiter, f"a header line of {len(header)} {delimiter_name(delimiter)}-separated names"
        if delimiter != "\t":  # (tab-separated numbers: said as columns that are not Criteo's, below)
            raise ValueError(f"{cannot}: {example.removeprefix(f'{name}: ')}")
    if len(cells) in (NUM_COLUMNS - 1, NUM_COLUMNS):
        what = f"{len(cells)} tab-separated columns, {first.decode('utf-8', 'replace')!r} first, not a label (0 or 1)"
    else:
        what = f"{len(cells)} tab-separated columns, not Criteo's {NUM_COLUMNS}" if len(cells) > 1 else "one column"
    raise ValueError(f"{cannot}: its first line ({shown}) is {what}{other_format_hint(body)}; it tells libsvm, "
                     "Criteo TSV and CSV with a header line of names (separated by commas, tabs, ';' or '|'): give "
                     "--format (criteo, csv, libsvm), or --schema for another layout (`ps-worker schema --data FILE "
                     "--delimiter ...` writes one)")  # fmt: skip


def _criteo_seen(cells: list[bytes], criteo_ints: bool) -> str:
    """What detect_format sees in a first line of Criteo TSV (cells: split at tabs; criteo_ints: 40 of them, those of
    I1..I13 integers or blank), else ""."""
    first = cells[0].strip()
    if len(cells) == NUM_COLUMNS and first in (b"0", b"1"):
        return f"its first line is {NUM_COLUMNS} tab-separated columns, a label (0 or 1) first, no header"
    if len(cells) == NUM_COLUMNS - 1 and (not first or first.lstrip(b"-").isdigit()):
        return f"its first line is {NUM_COLUMNS - 1} tab-separated columns, Criteo TSV without labels"
    if criteo_ints and not first:
        return (f"its first line is {NUM_COLUMNS} tab-separated columns, a blank label first (a file to score), "
                "integers next")  # fmt: skip
    return ""

"""What the built-in schema (worker/schema_builtin.py) may read wrong in a file, warned of as a run starts: a first
line that reads like an example (a CSV without a header line: also format_detection.detect_format's refusal and
`ps-worker schema`'s check), a label the header names elsewhere, columns of lists read as one id per cell, a row's
own id read as a feature, columns of numbers read as ids (plain, or written as 1,234 or 0,5), --numeric-columns'
logs of numbers below 0; and of a csv --schema file, its logs of numbers below 0 (but where a log_buckets field
reads the column too)."""

from __future__ import annotations

import logging
import os
import shlex
from codecs import BOM_UTF8

from worker.datafiles import data_files, takes_in
from worker.formats import csv_records, first_with_content
from worker.readers.share import open_data
from worker.schema import Schema
from worker.schema_columns import LABEL_NAMES, LABEL_WORDS
from worker.timestamps import time_format

log = logging.getLogger("worker.schema_hints")

HINT_SAMPLE_ROWS = 1000  # rows of a file the built-in schema's hints look at


def warn_of_csv_columns(data: str, header: list[str], rows: list[list[str]], schema: Schema, label_guessed: bool,
                         no_numeric: bool, training: bool = True) -> None:  # fmt: skip
    """Warnings for what the built-in csv schema may read wrong in data (a file or many; rows: a sample of the records
    of the first file holding some, formats.csv_records): the first column taken as the label where another column is
    named like one (label_guessed: the first column taken by default; not where no file holds a record, which the run
    refuses, so the refusal is what it says), columns of times or of numbers (plain, or written with thousands
    separators or decimal commas: column_infer.written_numbers) read as categories
    (no_numeric: no --numeric-columns) where `ps-worker schema` would read their hours of day and weekdays, or read
    them as numbers. training False (eval, predict): the first-line warning alone, which is of this data; the others
    advise a schema to train with, and the model these commands read was trained with this one (its tables'
    fingerprint holds them to it), so its training run gave them."""
    from worker.column_infer import infer_column, written_numbers
    from worker.schema_infer import is_binary

    label = schema.label if schema.label is not None else header[0]
    no_header = header_reads_like_an_example(data, header, None if label_guessed else schema.label, schema.delimiter)
    if no_header:
        log.warning("%s", no_header)
    if not training:
        return
    if label_guessed and rows and label.lower() not in LABEL_NAMES:  # (no rows: the run is refused, for that)
        named = [h for h in header if h.lower() in LABEL_NAMES and h != label]
        if not named and not LABEL_WORDS.search(label):  # is_click, converted: named so and holding only 0 and 1
            named = [h for i, h in enumerate(header) if h != label and LABEL_WORDS.search(h)
                     and is_binary([row[i] for row in rows])]  # fmt: skip
        if named:
            log.warning("%s: the label is the first column, %r (the built-in csv schema's default), but the header "
                        "also has %r, named like a label: give --label-column %s if that is the label", data, label,
                        named[0], named[0])  # fmt: skip
    categorical = {c.source for c in schema.columns if c.kind == "categorical"}
    told = _warn_of_lists_and_row_ids(data, header, rows, categorical, schema.delimiter)
    if not no_numeric:
        _warn_of_negative_logs(data, header, schema, rows, "--numeric-columns",
                               f"Shift the column to 0 and above, or write a schema (`ps-worker schema --data {data} "
                               "> schema.toml`, then --schema schema.toml), which standardizes such columns")  # fmt: skip
        return
    cells = {name: [row[i] for row in rows] for i, name in enumerate(header) if name in categorical - told}
    times = [name for name, column in cells.items() if time_format(name, column)]
    if times:
        log.warning("%s: %s %s %s times (a sample of %s): the built-in csv schema reads each value as an id of its "
                    "own, and a later day's values are ids never trained. `ps-worker schema --data %s > schema.toml`, "
                    "then --schema schema.toml, reads their hour of day and weekday", data,
                    "columns" if len(times) > 1 else "column", ", ".join(map(repr, times)),
                    "hold" if len(times) > 1 else "holds", _rows(rows), data)  # fmt: skip
    for name, column in cells.items():
        written = written_numbers(column) if name not in times else None
        if written:
            log.warning("%s: column %r holds %s (a sample of %s): the built-in csv schema reads each value as an id "
                        "of its own, not as a number. If they are numbers, %s; then `ps-worker schema --data %s > "
                        "schema.toml`, and --schema schema.toml, reads them as numbers%s", data, name, written[0],
                        _rows(rows), written[1], data, written[2])  # fmt: skip
    numeric = [name for name, column in cells.items() if name not in times
               and infer_column(name, name, column, sampled=True)[0].kind == "numeric"]  # fmt: skip
    if numeric:
        shown = ", ".join(repr(n) for n in numeric[:8]) + (f" and {len(numeric) - 8} more" if len(numeric) > 8 else "")
        them = "columns %s hold" if len(numeric) > 1 else "column %s holds"
        log.warning("%s: " + them + " numbers of many values (a sample of %s): the built-in csv schema reads "
                    "each value as an id of its own. `ps-worker schema --data %s > schema.toml`, then --schema "
                    "schema.toml, reads them as numbers and their buckets", data, shown, _rows(rows), data)  # fmt: skip


ROW_ID_MIN_CELLS = 100  # a column of another value in each of fewer sampled cells is not warned of: too few to tell


def _warn_of_lists_and_row_ids(data: str, header: list[str], rows: list[list[str]], categorical: set[str],
                               delimiter: str) -> set[str]:  # fmt: skip
    """A warning for each column of the built-in csv schema's categorical ones that `ps-worker schema` reads or
    marks otherwise, by its rules (worker/column_infer.py). Lists in its cells (multi_hot, or weighted:
    infer_column), which the built-in schema reads as one id per whole cell (returned: the columns of lists); or,
    in a column it infers categorical, of no times or numbers written with separators (which other warnings tell),
    another value in each of its ROW_ID_MIN_CELLS or more non-empty cells (every_value_distinct): a row's own id,
    which the built-in schema trains as a feature of ids that never come back. A column of which a cell of rows (a
    sample) holds a list separator is judged on the sample `ps-worker schema` takes (SAMPLE_ROWS): in fewer rows, a
    list's items may not repeat yet; the other columns on rows (up to HINT_SAMPLE_ROWS records: fewer only where the
    file ends)."""
    from worker.column_infer import BAG_SEPARATORS, every_value_distinct, infer_column, written_numbers
    from worker.schema_infer import SAMPLE_ROWS

    at = {name: i for i, name in enumerate(header) if name in categorical}
    separated = {name for name, i in at.items() if any(sep in row[i] for row in rows for sep in BAG_SEPARATORS)}
    larger = csv_records(data, delimiter, SAMPLE_ROWS)[1] if separated else rows
    single_file, told = len(data_files(data)) == 1, set()
    for name, i in at.items():
        sample = larger if name in separated else rows
        cells = [row[i] for row in sample]
        column = infer_column(name, name, cells, sampled=True)[0]
        if column.kind in ("multi_hot", "weighted"):
            example = next(row[i] for row in sample if column.separator in row[i])
            log.warning("%s: column %r holds lists split by %r (as %r; a sample of %s): the built-in csv schema reads "
                        "each whole cell as one id, so the model never sees a list's items. `ps-worker schema --data "
                        "%s > schema.toml`, then --schema schema.toml, reads each item as an id of its own (kind "
                        "%s)", data, name, column.separator, example, _rows(sample), data, column.kind)  # fmt: skip
            told.add(name)
            continue
        filled = sum(bool(c.strip()) for c in cells)
        row_ids = column.kind == "categorical" and not time_format(name, cells) and not written_numbers(cells)
        if row_ids and filled >= ROW_ID_MIN_CELLS and every_value_distinct(name, cells):
            whole = single_file and len(sample) < (SAMPLE_ROWS if name in separated else HINT_SAMPLE_ROWS)
            _warn_of_row_ids(data, name, filled, _rows(sample), whole)
    return told


def _warn_of_row_ids(data: str, name: str, filled: int, sample: str, whole: bool) -> None:
    """The warning of column name of data, of another value in each of its `filled` non-empty cells in the rows read
    (sample: how many): a row's own id, to leave out, where those rows are the whole file (whole: one file, read to
    its end, as `ps-worker schema` tells it); else, as that command says of such a column in a sample
    (column_infer.SAMPLED_DISTINCT), ids that may come back over the whole file."""
    from worker.column_infer import SAMPLED_DISTINCT

    if whole:
        log.warning("%s: column %r holds another value in each of its %s non-empty cells (a sample of %s): a row's "
                    "own id? The built-in csv schema trains it as a feature, each value an id seen once that a later "
                    "row never has. If it is, leave it out: --drop-columns %s, or `ps-worker schema --data %s > "
                    "schema.toml` (which marks it: delete its entry), then --schema schema.toml", data, name,
                    f"{filled:,}", sample, name, data)  # fmt: skip
        return
    log.warning("%s: column %r holds another value in each of its %s non-empty cells (a sample of %s): a row's own "
                "id, which the built-in csv schema trains as a feature of ids seen once? `ps-worker schema --data %s > "
                "schema.toml` writes its entry and says: %s; then --schema schema.toml", data, name, f"{filled:,}",
                sample, data, SAMPLED_DISTINCT)  # fmt: skip


def header_reads_like_an_example(data: str, header: list[str], label_column: str | None = None,
                                 delimiter: str = ",") -> str:  # fmt: skip
    """A warning when the first line of csv data (a file or many, worker/datafiles.py: of the first file with
    content; its cells split at delimiter), taken as its header, reads like an example: its first cell 0 or 1 (a
    label's value), or most cells numbers, or every cell a number. "" otherwise, and where the line is plainly names:
    it holds label_column (--label-column named a cell of it), or names among its numbers, which are a run of
    integers (pandas' column numbers after a name, `,0,1,2` or `0,1,2,label`; years `user,2019,2020`). A line of
    numbers only is an example, a run too (`0,1,2,3`, a first row of small values, is as likely as pandas' column
    numbers of a frame without names): said with what to do if it is such a header. The warning gives a shell
    command writing the data with a header line (_header_command)."""
    numbers = [h.strip() for h in header if _is_number(h)]
    if label_column is not None and label_column in header:
        return ""
    run = (
        numbers
        and all(n.isdigit() for n in numbers)
        and [int(n) for n in numbers] == list(range(int(numbers[0]), int(numbers[0]) + len(numbers)))
    )
    if run and len(numbers) < len(header):
        return ""
    if header[0].strip().lower() not in ("0", "1", "true", "false") and len(numbers) * 2 <= len(header):
        return ""
    columns = (" (if those are column numbers, as pandas writes for a frame without column names, name the columns "
               "before writing it: df.columns = [...])" if run else "")  # fmt: skip
    names = ["label", *(f"c{k}" for k in range(1, len(header)))]
    name = first_with_content(data)
    with open_data(name) as f:
        bom = f.read(len(BOM_UTF8)) == BOM_UTF8
    command, written = _header_command(data, delimiter.join(names), bom)
    return (
        f"{name}: its first line ({delimiter.join(header)[:120]}) reads like an example, not a header: a file without "
        f"a header line? A csv file's first line gives the column names: add a header line{columns}; `{command}` "
        f"writes {written}, naming the first column `label` (where the label is another column, name that one `label` "
        "instead)"
    )


def _header_command(data: str, header: str, bom: bool) -> tuple[str, str]:
    """(a shell command, what it writes): copies of the data's files (worker/datafiles.py) with the line header
    first, gzip'ed where a name ends in .gz. One file: beside it, NAME-with-header.SUFFIXES, unless data's directory
    or glob would take the copy in too (datafiles.takes_in). Many (every file needs a header: each file's first
    line is its header), or one such: into a new folder beside the first file's, FOLDER-with-header, each copy named
    K-NAME (K from 1: the copies are read in the files' order, and two files of one name in two folders stay two).
    bom (the first file starts with a UTF-8 BOM, which the reader leaves out only at a file's start): a file's BOM
    is left out, not kept at the start of its first example."""
    text = header.replace("\\", "\\\\").replace("%", "%%").replace("\t", "\\t") + "\\n"  # printf's format
    strip = " | LC_ALL=C sed \"1s/^$(printf '\\357\\273\\277')//\"" if bom else ""  # (the BOM's bytes, for any sed)
    files = data_files(data)
    folder, name = os.path.split(files[0])
    stem, dot, suffixes = name.partition(".")
    new = os.path.join(folder, f"{stem}-with-header{dot}{suffixes}")
    if len(files) == 1 and not takes_in(data, new):
        gz = name.endswith(".gz")
        read = f"gzip -dc {shlex.quote(files[0])}" if gz else f"cat {shlex.quote(files[0])}"
        command = f"{{ printf {shlex.quote(text)}; {read}{strip}; }}{' | gzip' if gz else ''} > {shlex.quote(new)}"
        return command, "the file with one"
    new = os.path.abspath(folder or ".") + "-with-header"
    command = (f"mkdir {shlex.quote(new)} && k=0 && for f in {' '.join(map(shlex.quote, files))}; do k=$((k + 1)); "
               f"{{ printf {shlex.quote(text)}; gzip -dcf \"$f\"{strip}; }} | case \"$f\" in *.gz) gzip;; *) cat;; "
               f"esac > {shlex.quote(new)}/\"$k-${{f##*/}}\"; done")  # fmt: skip
    copies = f"a copy of each of the {len(files)} data files" if len(files) > 1 else "a copy of the data's file"
    return command, f"{copies} with one into {new} (then give --data {new})"


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def warn_of_negative_logs_in_schema(data: str, schema: Schema, schema_path: str) -> None:
    """A warning for each column a csv --schema file reads with transform = "log" that holds numbers below 0 in a
    sample of data's records (formats.csv_records), as --numeric-columns' columns are warned of."""
    if schema.format != "csv" or not any(c.kind == "numeric" and c.transform == "log" for c in schema.columns):
        return
    header, rows = csv_records(data, schema.delimiter, HINT_SAMPLE_ROWS)
    _warn_of_negative_logs(data, header, schema, rows, f'the schema {schema_path} (transform = "log")',
                           f'Shift the column to 0 and above, or give it transform = "standardize" in {schema_path} '
                           f"(as `ps-worker schema --data {data}` writes such a column)")  # fmt: skip


def _warn_of_negative_logs(data: str, header: list[str], schema: Schema, rows: list[list[str]], reader: str,
                           fix: str) -> None:  # fmt: skip
    """A warning for each column read with transform log (log(1 + x), x below 0 read as 0) holding numbers below 0
    in the sample rows: those values all read as one. Not for a column a log_buckets field reads too, whose ids keep
    each value up to 2, the negative ones included, apart (features.int_bucket), as the Criteo treatment of
    worker.synthetic's I2 (reaching -3) does in its CSV's schema. reader: what reads it so; fix: what to do. A cell
    that is no number is the encoder's to refuse; a source the header lacks the reader's."""
    from worker.cells import float_or_nan

    bucketed = {c.source for c in schema.columns if c.kind == "numeric" and c.transform == "log_buckets"}
    sources = dict.fromkeys(c.source for c in schema.columns
                            if c.kind == "numeric" and c.transform == "log" and c.source not in bucketed)  # fmt: skip
    for source in (s for s in sources if s in header):
        i = header.index(source)
        negative = [v for v in (float_or_nan(row[i]) for row in rows) if v < 0]
        if negative:
            log.warning("%s: column %r holds numbers below 0 (%d of a sample of %s, the least %g): %s reads a "
                        "number as log(1 + x) and every x below 0 as 0, so those values are lost to the model. %s",
                        data, source, len(negative), _rows(rows), min(negative), reader, fix)  # fmt: skip


def _rows(rows: list) -> str:
    """'1 row', '300 rows': a sample's size as the warnings name it."""
    return f"{len(rows):,} row{'s' * (len(rows) != 1)}"

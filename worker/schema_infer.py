"""`ps-worker schema --data FILE`: a starting feature schema (worker/schema.py) inferred from a sample of a file.

The label: a column named like LABEL_NAMES holding only 0 and 1 (or true and false, yes and no, any case), else such a
column whose name holds one of LABEL_WORDS (`has_clicked`, `purchased`), else the first such column, else the first
column; the last two are guesses, and so is a pick among several columns named like a label: said in the schema and on
stderr. Every other column gets the entries worker/column_infer.py infers from its cells, but one whose name the
header gives twice: it is left out, said in the schema and on stderr; one of no name (pandas' row index, first) is
read as column<k>, said so too. criteo and libsvm files get their built-in
schema, written out. The TOML says in comments what was inferred
from how many rows, for a person to review before training.
"""

from __future__ import annotations

import csv

from worker.column_infer import column_entries
from worker.criteo import other_format_hint
from worker.csv_fast import BOOL_LABELS, label_value
from worker.datafiles import data_files
from worker.readers.csv_sample import Misfits
from worker.schema_builtin import builtin_schema, separator_of_one_column
from worker.schema_columns import AUTO_FORMAT, FORMAT_CHOICES, is_label_name, labels_by_name
from worker.schema_hints import header_reads_like_an_example
from worker.schema_toml import column_entry, toml_value

SAMPLE_ROWS = 10_000  # rows of a csv sample a schema is inferred from, where not told (`ps-worker schema --rows`)
SAMPLED_FILES = 8  # files of many a csv sample is taken from, at most (spread evenly over their list)


def _sample_files(path: str, delimiter: str, rows: int) -> tuple[list[str], list[list[str]], bool, list[str]]:
    """read_csv_sample's (header, records) of one file; of many (worker/datafiles.py), rows / m records from each
    of m = SAMPLED_FILES of them at most, spread over the list, refusing one whose header differs from the first's;
    whether the records are every record of every file (fewer than asked of each, every file sampled); and a
    warning for each file whose records read in order hold some of another column count (_misfit_warning)."""
    from worker.formats import read_csv_header, read_csv_sample

    files = data_files(path)
    files = [f for f in files if read_csv_header(f, delimiter) is not None] or files  # less part files of no content
    m = min(len(files), SAMPLED_FILES)
    picked = [files[j * len(files) // m] for j in range(m)]
    header, sample, whole, warnings = None, [], m == len(files), []
    for name in picked:
        misfits = Misfits()
        h, records = read_csv_sample(name, delimiter, -(-rows // m), misfits)
        if header is not None and h != header:
            raise ValueError(f"{name}: its CSV header {h} differs from that of {picked[0]}, {header}")
        header, sample, whole = h, sample + records, whole and len(records) < -(-rows // m)
        if misfits.count:
            warnings.append(_misfit_warning(name, len(h), misfits))
    return header, sample[:rows], whole and len(sample) <= rows, warnings


def _misfit_warning(name: str, width: int, misfits: Misfits) -> str:
    """What `ps-worker schema` says of a file whose records read from its start hold misfits: records of another
    column count than the header's width, which the sample leaves out and training stops at."""
    fix = ("the schema is inferred without {0}, but `ps-worker train` stops at such a line (--max-bad-lines N skips "
           "up to N of them): fix or remove {0}")  # fmt: skip
    if misfits.count == 1:
        return (f"{name}: line {misfits.first_line:,} has {misfits.first_width} columns, where the header has "
                f"{width}: {fix.format('it')}")  # fmt: skip
    return (f"{name}: {misfits.count:,} of the lines sampled from its start have another column count than the "
            f"header's {width} (the first, line {misfits.first_line:,}, has {misfits.first_width}): "
            f"{fix.format('them')}")  # fmt: skip


def _check_utf8_header(path: str, header: list[str]) -> None:
    """ValueError when a header name holds bytes that are not UTF-8 (read as surrogate escapes): a schema names its
    columns in UTF-8 text, so they could not be written into one."""
    bad = [h for h in header if any("\udc80" <= ch <= "\udcff" for ch in h)]
    if bad:
        shown = ", ".join(ascii(h.encode("utf-8", "surrogateescape"))[1:] for h in bad[:3])
        raise ValueError(f"{path}: the header's column name{'s' if len(bad) > 1 else ''} {shown} "
                         f"{'are' if len(bad) > 1 else 'is'} not UTF-8 text (a Latin-1 or Windows-1252 export writes é "
                         "as the byte 0xe9, say): a schema names its columns in UTF-8. Save the file as UTF-8 (`iconv "
                         "-f cp1252 -t utf-8 FILE > NEW`) and run this again")  # fmt: skip


def _first_record_width(path: str, delimiter: str) -> int | None:
    """The column count of the first record after the header that holds more than blank cells (the first file
    with content of path), or None when there is none."""
    from worker.formats import first_with_content
    from worker.readers.csv_records import open_csv

    try:
        with open_csv(first_with_content(path), delimiter) as reader:
            next(reader, None)
            return next((len(row) for row in reader if any(cell.strip() for cell in row)), None)
    except csv.Error:  # a record the csv module cannot read: the plain message stands
        return None


def infer_schema_text(path: str, *, fmt: str = "csv", delimiter: str = ",", sample_rows: int = SAMPLE_ROWS) -> str:
    """A starting schema for a data file, as TOML with comments saying what was inferred from how many rows.
    csv: from the header and sample_rows records (read_csv_sample: half the file's first, half spread over the rest
    of an uncompressed file; see worker/column_infer.py for the rules); criteo and
    libsvm: their built-in schema, written out."""
    return infer_schema(path, fmt=fmt, delimiter=delimiter, sample_rows=sample_rows)[0]


def infer_schema(
    path: str, *, fmt: str = "csv", delimiter: str = ",", sample_rows: int = SAMPLE_ROWS
) -> tuple[str, list[str]]:
    """(infer_schema_text's TOML, what a person must check before training: a label that is a guess). fmt "auto":
    the format format_detection.detect_format tells (csv: and the delimiter), said in a comment."""
    from worker.format_detection import detect_format

    if fmt not in FORMAT_CHOICES:
        raise ValueError(f"format {fmt!r} is unknown; expected one of {list(FORMAT_CHOICES)}")
    lines = [f"# A starting schema for {path} (ps-worker schema); see worker/schema.py for every key."]
    if fmt == AUTO_FORMAT:
        fmt, told, seen = detect_format(path)
        delimiter = told or delimiter
        lines.append(f"# Format {fmt} (detected: {seen}; --format sets it).")
    if fmt != "csv":
        return _builtin_schema_text(path, fmt, lines), []
    return _csv_schema(path, delimiter, sample_rows, lines)


def _builtin_schema_text(path: str, fmt: str, lines: list[str]) -> str:
    """lines, then the built-in schema of a criteo or libsvm file (libsvm: its field count and whether its values
    are weighted, as train counts their fields and reads their values), as TOML."""
    from worker.formats import first_with_content
    from worker.readers.libsvm_reader import libsvm_sample

    k, weighted = libsvm_sample(first_with_content(path)) if fmt == "libsvm" else (None, False)
    schema = builtin_schema(fmt, default_table="default", default_dim=1, libsvm_fields=k,
                            libsvm_weighted=weighted)  # fmt: skip
    fields = "" if k is None else f" ({k:,} fields{', weighted: the values are not all 0 and 1' if weighted else ''})"
    lines = [*lines, f"# The built-in {fmt} schema{fields}.", f'format = "{fmt}"']
    for c in schema.columns:
        lines += ["", "[[columns]]", *column_entry(c, with_table=False)]
    return "\n".join(lines) + "\n"


def _csv_schema(path: str, delimiter: str, sample_rows: int, lines: list[str]) -> tuple[str, list[str]]:
    """infer_schema of a csv file: lines, then the label and each column's entries inferred from a sample of
    sample_rows records, and what a person must check."""
    header, rows, whole, misfit_warnings = _sample_files(path, delimiter, sample_rows)
    _check_separator(path, header, delimiter, rows[0] if rows else [])
    _check_utf8_header(path, header)
    if not rows:
        raise ValueError(_no_rows(path, header, delimiter))
    columns = {h: [r[j] for r in rows] for j, h in reversed(list(enumerate(header)))}  # the first of a repeated name
    label, guess = _pick_label(header, columns, len(rows))
    sample = f"{len(rows):,} row{'s' * (len(rows) != 1)}"
    lines.append(f"# Inferred from the header and a sample of {sample} (worker/readers/csv_sample.py read_csv_sample).")
    lines += ['format = "csv"'] + ([f"delimiter = {toml_value(delimiter)}"] if delimiter != "," else [])
    checks = [*misfit_warnings, *([guess] if guess else [])]
    no_header = header_reads_like_an_example(path, header, delimiter=delimiter)
    if no_header:
        checks.insert(0, no_header)
    if guess:
        lines.append(f"# CHECK: {guess}.")
    lines.append(f"label = {toml_value(label)}")
    entries, column_checks = _column_lines(header, label, columns, whole)
    lines += entries
    checks += column_checks
    if "[[columns]]" not in lines:  # load_schema refuses a schema of no column: said now, with why
        raise ValueError(_no_columns(path, header, label, delimiter))
    return "\n".join(lines) + "\n", checks


def _no_rows(path: str, header: list[str], delimiter: str) -> str:
    """Why a csv file whose sample holds no record gives no schema: its records have another column count than
    the header (a delimiter at the end of each row, say), or it has none."""
    width = _first_record_width(path, delimiter)
    if width is not None:
        return (f"{path}: no sampled row has the header's {len(header)} columns (the first has {width}"
                f"{': a delimiter at the end of each row?' if width == len(header) + 1 else ''}): "
                "nothing to tell each column's kind from")  # fmt: skip
    return (f"{path}: a header and no data rows: nothing to tell each column's kind (or the label) "
            "from; give a file with rows")  # fmt: skip


def _pick_label(header: list[str], columns: dict[str, list[str]], num_rows: int) -> tuple[str, str | None]:
    """(the label column, what a person must check of it or None): a column named like a label of only 0 and 1,
    else the first that holds them but in empty cells, else the first of two other values, else a guess
    (_guessed_label); a note where several columns are named like a label, or the label is one value."""
    binary = [h for h in header if is_binary(columns[h])]
    label, guess = next(iter(labels_by_name(binary)), None), None
    if label is None:  # a label column with some cells empty (rows not labelled yet, say) is still the label
        label, guess = _label_with_blanks(header, columns, num_rows)
    if label is None:
        label, guess = _label_of_two_words(header, columns)
    if label is None:
        label, guess = _guessed_label(header, columns, binary)
    named = [h for h in binary if is_label_name(h)]
    if guess is None and len(named) > 1:
        guess = (f"the label is {label!r}, the first of the columns named like a label that hold only 0 and 1 "
                 f"({', '.join(map(repr, named))}): check `label`, the column the model predicts; the others are "
                 "features here (delete the entry of one that is another outcome, known only after the click)")  # fmt: skip
    kept = {label_value(c) for c in columns[label] if c.strip()} if guess is None else set()  # 0 and 1: a label
    if len(kept) == 1:
        guess = (f"{label!r} is {next(iter(kept)):g} in every row of the sample: a model learns nothing but that "
                 "rate unless the file holds the other label further on (train refuses a file of one label)")  # fmt: skip
    return label, guess


def _label_with_blanks(
    header: list[str], columns: dict[str, list[str]], num_rows: int
) -> tuple[str | None, str | None]:
    """The first column named like a label whose non-empty cells are 0 and 1, with a check counting its empty
    cells; (None, None) when there is none."""
    blank = [h for h in header if is_label_name(h)]
    blank = [h for h in blank if is_binary([c for c in columns[h] if c.strip()])]
    if not blank:
        return None, None
    label = blank[0]
    empty = sum(not c.strip() for c in columns[label])
    return label, (f"{empty:,} of the sample's {num_rows:,} rows have no label (an empty {label!r} cell): training "
                   "stops at the first such line, unless --max-bad-lines lets it skip them: remove those rows")  # fmt: skip


def _label_of_two_words(header: list[str], columns: dict[str, list[str]]) -> tuple[str | None, str | None]:
    """The first column named like a label whose two values are other words than label_value reads (0/1,
    true/false, yes/no), with a check saying so; (None, None) when there is none."""
    words = [h for h in header if is_label_name(h)
             and len({c.strip() for c in columns[h] if c.strip()}) == 2]  # fmt: skip
    if not words:
        return None, None
    label = words[0]
    values = " and ".join(repr(v) for v in sorted({c.strip() for c in columns[label] if c.strip()}))
    return label, (f"{label!r} holds {values}, not 0 and 1: the readers take a label as 0 or 1 (or {BOOL_LABELS}) "
                   "only, so training stops at its first line: write its values as 1 for the outcome the model "
                   "predicts and 0 for the other")  # fmt: skip


def _guessed_label(header: list[str], columns: dict[str, list[str]], binary: list[str]) -> tuple[str, str]:
    """(a guessed label, the check saying why): the first column of only 0 and 1 (binary), else the first column
    named like a label (labels_by_name) that holds values (counts, ratings, a regression's target: no label, but
    the column the file means to predict, not a feature), else the first column."""
    held = [h for h in labels_by_name(header) if any(c.strip() for c in columns[h])]
    if not binary and held:
        return held[0], (f"{_held_values(held[0], columns)}: the readers take a label as 0 or 1 (or {BOOL_LABELS}) "
                         "only, so training stops at its first line of another: write the outcome the model predicts as 1, the "
                         "others as 0 (a count as 1 where it is above 0), and infer the schema again")  # fmt: skip
    if not binary:
        return header[0], (f"the label is a guess: no column holds only 0 and 1, so the first column, {header[0]!r}, "
                           "is taken: check `label`, the column the model predicts (its values must be 0 or 1)")  # fmt: skip
    label = binary[0]
    others = f" (of {', '.join(map(repr, binary))})" if len(binary) > 1 else ""
    named_so = [h for h in header if is_label_name(h)]
    if named_so:  # named like a label, of other values (0, 1 and 2, say)
        empty = not any(c.strip() for c in columns[named_so[0]])
        why = (f"{named_so[0]!r}, named like a label, is empty in every row of the sample" if empty else
               f"{_held_values(named_so[0], columns)} (a label is 0 or 1: write the outcome the model predicts as 1, "
               "the others as 0)")  # fmt: skip
    else:
        why = "no column is named like a label (click, label, target, ...)"
    return label, (f"the label is a guess: {label!r} is the first column holding only 0 and 1{others}, and {why}: "
                   "check `label`, the column the model predicts")  # fmt: skip


def _held_values(name: str, columns: dict[str, list[str]]) -> str:
    """What a column named like a label holds, the first 5 of its sorted values shown: "'clicks', named like a
    label, holds 3 distinct values ('0', '1', '2'), not only 0 and 1"."""
    values = sorted({c.strip() for c in columns[name] if c.strip()})
    shown = ", ".join(map(repr, values[:5])) + (", ..." if len(values) > 5 else "")
    return f"{name!r}, named like a label, holds {len(values):,} distinct values ({shown}), not only 0 and 1"


def _column_lines(
    header: list[str], label: str, columns: dict[str, list[str]], whole: bool
) -> tuple[list[str], list[str]]:
    """(the TOML lines of every column but the label, what a person must check of them): column_entries' of each,
    a comment for a name the header gives twice (left out: the reader cannot tell such columns apart), and a
    check for a column of no name (read as column<k>)."""
    lines: list[str] = []
    checks: list[str] = []
    repeated: set[str] = set()
    for j, h in enumerate(header):
        if h == label:
            continue
        if header.count(h) > 1:  # the reader cannot tell such columns apart
            lines += ["", f"# column {j}: the header names {header.count(h)} columns {h!r}: left out (rename them)"]
            if h not in repeated:
                repeated.add(h)
                checks.append(f"the header names {header.count(h)} columns {h!r}: they are left out (rename them)")
            continue
        name = h if h and not h.startswith("_") else f"column{j}"
        entries, column_checks = column_entries(name, h, columns[h], set(header), sampled=not whole)
        if not h:  # (the built-in csv schema refuses it: schema_builtin)
            index = " (a row index that pandas' to_csv wrote?)" if j == 0 else ""
            note = (f"column {j + 1} of the header has no name{index}: read as {name!r} here; delete its entries "
                    "if it is no feature")  # fmt: skip
            entries.insert(1, f"# CHECK: {note}.")
            column_checks.append(note)
        lines += entries
        checks += column_checks
    return lines, checks


def _no_columns(path: str, header: list[str], label: str, delimiter: str) -> str:
    """Why a csv file gives a schema of no column (the header is the label alone, or its other names repeat),
    with a hint where its one-column header reads as another format (libsvm, another delimiter)."""
    if len(header) > 1:
        return (f"{path}: no column to read features from: the header {header}'s columns other than the label "
                f"{label!r} repeat a name, and the reader cannot tell such columns apart: rename them")  # fmt: skip
    hint = ""
    if other_format_hint(header[0].encode()).startswith(" (it looks like libsvm"):
        hint = ": its first line looks like libsvm (`label id:value ...`): give --format libsvm"
    elif delimiter != "," and "," in header[0]:
        hint = ": its first line has ',': a comma-separated file? Leave --delimiter out"
    return (f"{path}: no column to read features from: the header is one column, {header[0]!r}, taken as the label"
            f"{hint or ' (a schema needs at least one [[columns]] entry)'}")  # fmt: skip


def _check_separator(path: str, header: list[str], delimiter: str, first: list[str]) -> None:
    """ValueError when the header is one column holding tabs, or ';' or '|' that the first record (first) holds
    too: a file separated by them read with another delimiter, whose schema would be a label made of the whole
    first line."""
    if delimiter != "\t" and len(header) == 1 and "\t" in header[0]:
        raise ValueError(f"{path}: its first line has tabs and no {delimiter!r}: a tab-separated file? Give --format "
                         "criteo for Criteo TSV (label, 13 ints, 26 hex; no header line), or --delimiter $'\\t' for a "
                         "tab-separated file with a header line")  # fmt: skip
    other = separator_of_one_column(header, first, delimiter, ";|")
    if other is not None:
        raise ValueError(f"{path}: its first line has {other!r} and no {delimiter!r}: a {other!r}-separated file? "
                         f"Give --delimiter {other!r}")  # fmt: skip


def is_binary(cells: list[str]) -> bool:
    """Whether every cell is 0 or 1 as the CSV readers read a label (csv_fast.label_value: true and false, yes and no
    too)."""
    return bool(cells) and all(label_value(c) in (0.0, 1.0) for c in cells)

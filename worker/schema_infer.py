"""`ps-worker schema --data FILE`: a starting feature schema (worker/schema.py) inferred from a sample of a file.

The label: a column named like LABEL_NAMES holding only 0 and 1 (or true and false, any case), else such a column
whose name holds one of LABEL_WORDS (`has_clicked`, `purchased`), else the first such column, else the first column;
the last two are guesses, and so is a pick among several columns named like a label: said in the schema and on
stderr. The rules, per other CSV column of the sample (a cell that is empty or one of cells.MISSING_TEXTS is
missing; a number is what the readers take as one: finite, |x| <= 3.4e38, float32's largest):
    a time: a name with the word hour, time, date, datetime, timestamp or ts, and eight digits YYMMDDHH (a valid
    month, day and hour: Avazu's `hour`; not where every one is a date YYYYMMDD too, 20120315) or ten digits of
    unix seconds in every non-empty cell (timestamps.time_format)
                                      `<name>_hour_of_day` and `<name>_weekday`, sparse fields (transforms
                                      yymmddhh_hour and yymmddhh_weekday, or unix_...: worker/timestamps.py);
                                      the time itself is no feature (as a number or as ids, its values are
                                      new on each later day)
    numbers in every non-empty cell   few distinct integers, integers in a column named like an id (`id`,
                                      `user_id`, `itemId`, `uid`, `userid`), or integers written with leading
                                      zeros (codes: `02415`) -> categorical;
                                      non-negative and heavy-tailed (skewness > 1) -> numeric, log; else
                                      numeric, standardize with the sample's mean and std; and beside it
                                      `<name>_bucket`, the same cells bucketized at the sample's 16-quantiles,
                                      a sparse field: lr and fm use sparse fields only, and an MLP gets both;
                                      integers of at most _MANY_CODES values, each seen _CODE_REPEATS times on
                                      average (codes, or small counts), also `<name>_code`: each value its own id
    numbers with a decimal comma (`0,6792` in most cells), or numbers with thousands separators (`1,234,567`
    in some cells, numbers in nine in ten; `49,490` reads either way)
                                      categorical, and on stderr: how to convert them to plain numbers
    cells with | ; or , (in at least a tenth of the non-empty cells) whose tokens repeat, and for ',' not
    prose (most of its commas followed by a space)
                                      multi_hot (weighted when every token is id:number)
    numbers in nine in ten of its non-empty cells, not all (`-`, `#N/A`, `inf`, `1e40` in the others)
                                      categorical, and in the schema and on stderr: those cells, and to empty
                                      them (a missing number) for numbers
    anything else                     categorical
A column whose name the header gives twice is left out, said in the schema and on stderr.
criteo and libsvm files get their built-in schema, written out. The TOML says in comments what was inferred
from how many rows, for a person to review before training.
"""

from __future__ import annotations

import collections
import csv
import math
import re

from worker.cells import FLOAT32_MAX, is_missing_text
from worker.criteo import other_format_hint
from worker.csv_fast import label_value
from worker.datafiles import data_files
from worker.schema import AUTO_FORMAT, FORMAT_CHOICES, Column, _entry, _toml, is_label_name, labels_by_name
from worker.schema_builtin import builtin_schema, separator_of_one_column
from worker.schema_hints import header_reads_like_an_example
from worker.timestamps import time_format

_BAG_SEPARATORS = "|;,"
_FEW_INTEGERS = 20  # a numeric column of at most this many distinct integers is categorical
_HEAVY_SKEW = 1.0  # a non-negative numeric column skewed more than this is log-transformed
_BAG_SHARE = 0.1  # a column is a list when at least this share of its non-empty cells holds the separator
_BUCKETS = 16  # a numeric column's twin is bucketized at the sample's quantiles k / _BUCKETS
_MANY_CODES = 1000  # an integer column of at most this many distinct values ...
_CODE_REPEATS = 10  # ... each seen this many times on average in the sample gets a categorical twin
_DECIMAL_COMMA = re.compile(r"\s*[-+]?\d+,\d+\s*")  # 0,6792: a number written with a decimal comma
_THOUSANDS = re.compile(r"\s*[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?\s*")  # 1,234,567.5: thousands separators
_DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}/\d{1,2}/\d{2,4}")  # 2023-12-02 (19:26:40), 12/02/2023
_ID_NAME = re.compile(r"(?:^|[_\-. ])(?:id|Id|ID)$|[a-z0-9](?:Id|ID)$")  # id, user_id, itemId, userID; not paid
_ID_WORD = re.compile(  # uid, userid, itemid, adid, ...: an id run into its noun, in one word
    r"(?i)(?:u|uu|gu|user|item|ad|doc|product|session|device|campaign|query|shop|cat|category|creative|advertiser|"
    r"account|customer|member|video|song|movie|news|page|site|app|publisher|order|sku|vendor|seller|buyer)_?id"
)


SAMPLED_FILES = 8  # files of many a csv sample is taken from, at most (spread evenly over their list)


def _sample_files(path: str, delimiter: str, rows: int) -> tuple[list[str], list[list[str]], bool]:
    """read_csv_sample's (header, records) of one file; of many (worker/datafiles.py), rows / m records from each
    of m = SAMPLED_FILES of them at most, spread over the list, refusing one whose header differs from the first's;
    and whether the records are every record of every file (fewer than asked of each, every file sampled)."""
    from worker.formats import read_csv_header, read_csv_sample

    files = data_files(path)
    files = [f for f in files if read_csv_header(f, delimiter) is not None] or files  # less part files of no content
    m = min(len(files), SAMPLED_FILES)
    picked = [files[j * len(files) // m] for j in range(m)]
    header, sample, whole = None, [], m == len(files)
    for name in picked:
        h, records = read_csv_sample(name, delimiter, -(-rows // m))
        if header is not None and h != header:
            raise ValueError(f"{name}: its CSV header {h} differs from that of {picked[0]}, {header}")
        header, sample, whole = h, sample + records, whole and len(records) < -(-rows // m)
    return header, sample[:rows], whole and len(sample) <= rows


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
    from worker.readers.csv_reader import open_csv

    try:
        with open_csv(first_with_content(path), delimiter) as reader:
            next(reader, None)
            return next((len(row) for row in reader if any(cell.strip() for cell in row)), None)
    except csv.Error:  # a record the csv module cannot read: the plain message stands
        return None


def infer_schema_text(path: str, *, fmt: str = "csv", delimiter: str = ",", sample_rows: int = 10000) -> str:
    """A starting schema for a data file, as TOML with comments saying what was inferred from how many rows.
    csv: from the header and sample_rows records (read_csv_sample: half the file's first, half spread over the rest
    of an uncompressed file; see _infer_column for the rules); criteo and
    libsvm: their built-in schema, written out."""
    return infer_schema(path, fmt=fmt, delimiter=delimiter, sample_rows=sample_rows)[0]


def infer_schema(
    path: str, *, fmt: str = "csv", delimiter: str = ",", sample_rows: int = 10000
) -> tuple[str, list[str]]:
    """(infer_schema_text's TOML, what a person must check before training: a label that is a guess). fmt "auto":
    the format formats.detect_format tells (csv: and the delimiter), said in a comment."""
    from worker.formats import detect_format, first_with_content, libsvm_field_count

    if fmt not in FORMAT_CHOICES:
        raise ValueError(f"format {fmt!r} is unknown; expected one of {list(FORMAT_CHOICES)}")
    lines = [f"# A starting schema for {path} (ps-worker schema); see worker/schema.py for every key."]
    if fmt == AUTO_FORMAT:
        fmt, told, seen = detect_format(path)
        delimiter = told or delimiter
        lines.append(f"# Format {fmt} (detected: {seen}; --format sets it).")
    if fmt != "csv":
        k = libsvm_field_count(first_with_content(path)) if fmt == "libsvm" else None  # as train counts them
        schema = builtin_schema(fmt, default_table="default", default_dim=1, libsvm_fields=k)
        lines += [f"# The built-in {fmt} schema{f' ({k} fields)' if k is not None else ''}.", f'format = "{fmt}"']
        for c in schema.columns:
            lines += ["", "[[columns]]", *_entry(c, with_table=False)]
        return "\n".join(lines) + "\n", []
    header, rows, whole = _sample_files(path, delimiter, sample_rows)
    _check_separator(path, header, delimiter, rows[0] if rows else [])
    _check_utf8_header(path, header)
    if not rows:
        width = _first_record_width(path, delimiter)
        if width is not None:
            raise ValueError(f"{path}: no sampled row has the header's {len(header)} columns (the first has {width}"
                             f"{': a delimiter at the end of each row?' if width == len(header) + 1 else ''}): "
                             "nothing to tell each column's kind from")  # fmt: skip
        raise ValueError(f"{path}: a header and no data rows: nothing to tell each column's kind (or the label) "
                         "from; give a file with rows")  # fmt: skip
    columns = {h: [r[j] for r in rows] for j, h in reversed(list(enumerate(header)))}  # the first of a repeated name
    binary = [h for h in header if is_binary(columns[h])]
    label = next(iter(labels_by_name(binary)), None)
    lines.append(f"# Inferred from the header and a sample of {len(rows)} rows (worker/formats.py read_csv_sample).")
    lines += ['format = "csv"'] + ([f"delimiter = {_toml(delimiter)}"] if delimiter != "," else [])
    guess = None
    if label is None:  # a label column with some cells empty (rows not labelled yet, say) is still the label
        blank = [h for h in header if is_label_name(h)]
        blank = [h for h in blank if is_binary([c for c in columns[h] if c.strip()])]
        if blank:
            label = blank[0]
            empty = sum(not c.strip() for c in columns[label])
            guess = (f"{empty:,} of the sample's {len(rows):,} rows have no label (an empty {label!r} cell): training "
                     "stops at the first such line, unless --max-bad-lines lets it skip them: remove those rows")  # fmt: skip
    if label is None:  # a label named so whose two values are words: said, as the readers take 0/1, true/false only
        words = [h for h in header if is_label_name(h)
                 and len({c.strip() for c in columns[h] if c.strip()}) == 2]  # fmt: skip
        if words:
            label = words[0]
            values = " and ".join(repr(v) for v in sorted({c.strip() for c in columns[label] if c.strip()}))
            guess = (f"{label!r} holds {values}, not 0 and 1: the readers take a label as 0 or 1 (or true and "
                     "false) only, so training stops at its first line: write its values as 1 for the outcome the "
                     "model predicts and 0 for the other")  # fmt: skip
    if label is None and binary:
        label = binary[0]
        others = f" (of {', '.join(map(repr, binary))})" if len(binary) > 1 else ""
        named_so = [h for h in header if is_label_name(h)]
        if named_so:  # named like a label, of other values (0, 1 and 2, say)
            values = sorted({c.strip() for c in columns[named_so[0]] if c.strip()})
            shown = ", ".join(map(repr, values[:5])) + (", ..." if len(values) > 5 else "")
            why = (f"{named_so[0]!r}, named like a label, holds {len(values):,} distinct values ({shown}), not only "
                   "0 and 1 (a label is 0 or 1: write the outcome the model predicts as 1, the others as 0)"
                   if values else f"{named_so[0]!r}, named like a label, is empty in every row of the sample")  # fmt: skip
        else:
            why = "no column is named like a label (click, label, target, ...)"
        guess = (f"the label is a guess: {label!r} is the first column holding only 0 and 1{others}, and {why}: "
                 "check `label`, the column the model predicts")  # fmt: skip
    elif label is None:
        label = header[0]
        guess = (f"the label is a guess: no column holds only 0 and 1, so the first column, {label!r}, is taken: "
                 "check `label`, the column the model predicts (its values must be 0 or 1)")  # fmt: skip
    named = [h for h in binary if is_label_name(h)]
    if guess is None and len(named) > 1:
        guess = (f"the label is {label!r}, the first of the columns named like a label that hold only 0 and 1 "
                 f"({', '.join(map(repr, named))}): check `label`, the column the model predicts; the others are "
                 "features here (delete the entry of one that is another outcome, known only after the click)")  # fmt: skip
    kept = {label_value(c) for c in columns[label] if c.strip()} if guess is None else set()  # 0 and 1: a label
    if len(kept) == 1:
        guess = (f"{label!r} is {next(iter(kept)):g} in every row of the sample: a model learns nothing but that "
                 "rate unless the file holds the other label further on (train refuses a file of one label)")  # fmt: skip
    checks = [guess] if guess else []
    no_header = header_reads_like_an_example(path, header, delimiter=delimiter)
    if no_header:
        checks.insert(0, no_header)
    if guess:
        lines.append(f"# CHECK: {guess}.")
    lines.append(f"label = {_toml(label)}")
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
        times = time_format(h, columns[h])
        if times is not None:
            lines += ["", *_time_entries(name, h, times, columns[h], set(header))]
            continue
        column, comment = infer_column(name, h, columns[h], sampled=not whole)
        lines += ["", f"# {h!r}: {comment}", "[[columns]]", *_entry(column, with_table=False)]
        commas = _comma_numbers(columns[h])
        if commas:
            checks.append(f"{h!r} holds {commas[0]}: read as text they are categories; {commas[1]}")
        if column.kind == "categorical" and ". CHECK " in comment:  # a column of numbers made text by a few cells
            checks.append(comment.split(". CHECK ", 1)[1])
        if column.kind == "numeric":
            values = _floats([c for c in columns[h] if not is_missing_text(c)])
            twin = _bucket_twin(column, values, set(header))
            lines += [f"# {h!r} bucketized at the sample's quantiles: a sparse field (lr and fm use no numeric "
                      "feature)", "[[columns]]", *_entry(twin, with_table=False)]  # fmt: skip
            code = _code_twin(column, values, set(header) | {twin.name})
            if code is not None:
                lines += [f"# {h!r}: {len(set(values))} distinct integers, each seen {len(values) / len(set(values)):.0f} "
                          "times on average: codes or small counts; each value its own id too (delete this entry if "
                          "they are plain quantities)", "[[columns]]", *_entry(code, with_table=False)]  # fmt: skip
    if "[[columns]]" not in lines:  # load_schema refuses a schema of no column: said now, with why
        raise ValueError(_no_columns(path, header, label, delimiter))
    return "\n".join(lines) + "\n", checks


def _time_entries(name: str, source: str, fmt: str, cells: list[str], taken: set[str]) -> list[str]:
    """The comment and the two [[columns]] entries of a column of times (timestamps.time_format): its hour of day
    and its weekday, named <name>_hour_of_day and <name>_weekday (or ..2, ... past a name in taken)."""
    present = [c.strip() for c in cells if not is_missing_text(c)]
    what = "YYMMDDHH (Avazu's hour: 14102100 is 2014-10-21, hour 00)" if fmt == "yymmddhh" else "unix seconds (UTC)"
    out = [f"# {source!r}: times, {what} ({len(present)} of {len(cells)} cells non-empty, {len(set(present))} "
           "distinct): read as the hour of day and the weekday, each a sparse field; the time itself is no feature "
           "(as a number or as ids, its values are new on each later day)"]  # fmt: skip
    for part, suffix in (("hour", "hour_of_day"), ("weekday", "weekday")):
        field, k = f"{name}_{suffix}", 2
        while field in taken:
            field, k = f"{name}_{suffix}{k}", k + 1
        taken = taken | {field}
        out += ["[[columns]]", *_entry(Column(field, source, "numeric", transform=f"{fmt}_{part}"), with_table=False)]
    return out


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


def _bucket_twin(column: Column, values: list[float], taken: set[str]) -> Column:
    """A bucketize column reading column's cells, at the distinct _BUCKETS-quantiles of values (6 significant
    digits), named <name>_bucket (or _bucket2, ... past a name in taken)."""
    ordered = sorted(values)
    cuts = sorted({float(f"{ordered[len(ordered) * k // _BUCKETS]:.6g}") for k in range(1, _BUCKETS)})
    name, k = f"{column.name}_bucket", 2
    while name in taken:
        name, k = f"{column.name}_bucket{k}", k + 1
    return Column(name, column.source, "numeric", transform="bucketize", boundaries=tuple(cuts))


def _comma_numbers(cells: list[str]) -> tuple[str, str] | None:
    """What the cells hold and how to make them plain numbers, where they are numbers written with commas: thousands
    separators (1,234,567 in some of the cells that are not empty or missing, numbers in nine in ten; 49,490 in all
    of them reads as decimal commas too), else decimal commas in nine in ten of them (0,6792); else None."""
    cells = [c.strip() for c in cells if c.strip() and not is_missing_text(c)]
    commas = [c for c in cells if "," in c]
    if not commas:
        return None
    grouped = sum(bool(_THOUSANDS.fullmatch(c)) or _floats([c]) is not None for c in cells) >= 0.9 * len(cells)
    if grouped and all(_THOUSANDS.fullmatch(c) for c in commas):
        lists = ' (lists of 3-digit ids look the same: then make it kind = "multi_hot", separator = ",")'
        other = [c for c in commas if not _DECIMAL_COMMA.fullmatch(c)]
        if other:
            return (f"numbers with thousands separators (as {other[0]!r})", "remove the separators (pandas: "
                    f"read_csv(..., thousands=',') then to_csv) and infer the schema again{lists}")  # fmt: skip
        return (f"numbers written with a comma, a thousands separator or a decimal comma (as {commas[0]!r})",
                "write them as plain numbers (pandas: read_csv(..., thousands=',') or read_csv(..., decimal=','), "
                f"then to_csv) and infer the schema again{lists}")  # fmt: skip
    if sum(bool(_DECIMAL_COMMA.fullmatch(c)) for c in cells) >= 0.9 * len(cells):
        return (f"numbers written with a decimal comma (as {commas[0]!r})", "convert them to decimal points "
                "(pandas: read_csv(..., decimal=',') then to_csv) and infer the schema again")  # fmt: skip
    return None


def _code_twin(column: Column, values: list[float], taken: set[str]) -> Column | None:
    """A categorical column reading column's cells, named <name>_code (or _code2, ... past a name in taken), when
    its values are integers of at most _MANY_CODES distinct ones seen _CODE_REPEATS times each on average; else
    None."""
    distinct = len(set(values))
    if not values or not all(v.is_integer() for v in values) or distinct > _MANY_CODES or \
            distinct * _CODE_REPEATS > len(values):  # fmt: skip
        return None
    name, k = f"{column.name}_code", 2
    while name in taken:
        name, k = f"{column.name}_code{k}", k + 1
    return Column(name, column.source, "categorical")


def _floats(cells: list[str]) -> list[float] | None:
    """The cells as numbers the readers take (finite, |x| <= FLOAT32_MAX: worker/cells.py float_values), or None if
    one is not."""
    try:
        values = [float(c) for c in cells]
    except ValueError:
        return None
    return values if all(abs(v) <= FLOAT32_MAX for v in values) else None


def _mostly_numbers(cells: list[str]) -> list[str]:
    """The cells that are not finite numbers, where nine in ten of cells are (a column of numbers with some junk:
    '-', '#N/A', 'inf'), else []."""
    others = [c for c in cells if _floats([c]) is None]
    return others if others and len(others) <= 0.1 * len(cells) else []


def _junk_making_text(name: str, source: str, numbers: list[str], sampled: bool) -> str:
    """_junk_note where a few cells that are not numbers (_mostly_numbers) make a column of numbers text, and the
    column without them would be read as numbers; else ""."""
    junk = _mostly_numbers(numbers)
    if not junk:
        return ""
    junk_cells = set(junk)
    kept = [c for c in numbers if c not in junk_cells]
    numeric = infer_column(name, source, kept, sampled)[0].kind == "numeric"
    return _junk_note(name, junk, len(numbers)) if numeric else ""


def _junk_note(name: str, junk: list[str], cells: int) -> str:
    """What a column of numbers with some other cells (junk) needs: those cells named, the fix."""
    counts = collections.Counter(c.strip() for c in junk)
    shown = ", ".join(f"{v!r} ({n})" for v, n in counts.most_common(3)) + (", ..." if len(counts) > 3 else "")
    return (
        f"{name!r}: {cells - len(junk):,} of its {cells:,} filled cells in the sample are numbers, the others are "
        f"not ({shown}), so it is read as text: each value its own id. Empty those cells (an empty cell is a "
        "missing number) and infer the schema again to read it as numbers"
    )


def is_binary(cells: list[str]) -> bool:
    """Whether every cell is 0 or 1 as the CSV readers read a label (csv_fast.label_value: true and false too)."""
    return bool(cells) and all(label_value(c) in (0.0, 1.0) for c in cells)


def _leading_zeros(cells: list[str]) -> bool:
    """Whether some cell is an integer written with a leading zero ("02415"): a code, which a number would lose."""
    return any(len(c) > 1 and c[0] == "0" and c.isdigit() for c in (c.strip() for c in cells))


def infer_column(name: str, source: str, cells: list[str], sampled: bool = False) -> tuple[Column, str]:
    """The column and a comment, by the rules of the module docstring. sampled: the cells are a sample of a larger
    file, where values seen once here may come back (a user id seen a few times in all is distinct in a sample)."""
    present = [c for c in cells if c.strip()]  # a categorical's NA is a value; a number's is missing
    numbers = [c for c in present if not is_missing_text(c)]
    values = _floats(numbers) if numbers else None
    distinct = len(set(present))
    seen = f"{len(present)} of {len(cells)} cells non-empty, {distinct} distinct"
    if values is not None and len(numbers) < len(present):  # a number column: its NA cells are missing values
        seen = (f"{len(present)} of {len(cells)} cells non-empty, {len(present) - len(numbers)} of them NA or "
                f"another missing value; {distinct} distinct")  # fmt: skip
    if not present:
        seen += "; no value at all: it carries nothing, delete this entry"
    elif distinct == 1:
        seen += "; one value only: it carries nothing, delete this entry"
    elif _DATE.match(present[0] if present else "") and sum(bool(_DATE.match(c)) for c in present) >= 0.9 * len(
        present
    ):
        seen += ("; dates or times: as ids, nearly every value is new; derive columns such as the hour or the weekday "
                 "from it, and delete this entry")  # fmt: skip
    elif values is not None and not all(v.is_integer() for v in values):
        pass  # measurements: distinct values say nothing of an identifier
    elif sampled and len(present) > 1 and distinct >= (1.0 if values is not None else 0.9) * len(present):
        seen += (f"; {'every' if distinct == len(present) else 'nearly every'} value distinct in the sample: ids "
                 "that come back a few times over the whole file (a user, an item) look like this in a sample too; "
                 "delete this entry only if its values are new on nearly every row (a row's own id, a time)")  # fmt: skip
    elif len(present) > 1 and distinct == len(present):
        seen += "; every value distinct: an identifier? then delete this entry"
    elif values is None and len(present) >= 100 and distinct >= 0.9 * len(present):
        seen += "; nearly every value distinct: an identifier or a time? such ids rarely come back"
    present = numbers if values is not None else present
    if present and values is not None:
        if all(v.is_integer() for v in values) and len(set(values)) <= _FEW_INTEGERS:
            return Column(name, source, "categorical"), f"few distinct integers ({seen}): categorical"
        if _leading_zeros(present):
            return Column(name, source, "categorical"), f"integers with leading zeros, codes ({seen}): categorical"
        if all(v.is_integer() for v in values) and (_ID_NAME.search(source) or _ID_WORD.fullmatch(source)):
            return Column(name, source, "categorical"), f"integers in a column named like an id ({seen}): categorical"
        n = len(values)
        mean = sum(values) / n
        deviations = [v - mean for v in values]
        scale = max(map(abs, deviations))  # powers of deviations scaled to at most 1: 1e-110 cubed is no 0.0
        std = scale * math.sqrt(sum((d / scale) ** 2 for d in deviations) / n) if scale > 0 else 0.0
        skew = sum((d / std) ** 3 for d in deviations) / n if std > 0 else 0.0
        if all(v.is_integer() for v in values):  # counts, or codes? a person knows
            seen += '; if these integers are codes or ids, not quantities, make it kind = "categorical"'
        if min(values) >= 0 and skew > _HEAVY_SKEW:
            return Column(
                name, source, "numeric", transform="log"
            ), f"non-negative numbers, skewness {skew:.1f} ({seen}): log"
        return (
            Column(name, source, "numeric", transform="standardize", mean=mean, std=std if std > 0 else 1.0),
            f"numbers, skewness {skew:.1f} ({seen}): standardize with the sample's mean and std below (if you "
            "delete them, train computes them in a pass over its whole file before training and prints them: eval "
            "and predict need them back in the schema)",
        )
    commas = _comma_numbers(present)
    if commas:
        return Column(name, source, "categorical"), f"{commas[0]} ({seen}): categorical, as text; {commas[1]}"
    for sep in _BAG_SEPARATORS:
        holding = [c for c in present if sep in c]
        if sep == "," and holding and sum(", " in c for c in holding) >= 0.5 * len(holding):
            continue  # prose ("Big sale, 50% off"), not a list
        tokens = [t for c in present for t in c.split(sep) if t]
        weighted = bool(tokens) and all(t.rpartition(":")[0] and _floats([t.rpartition(":")[2]]) for t in tokens)
        keys = [t.rpartition(":")[0] for t in tokens] if weighted else tokens
        if present and sum(sep in c for c in present) >= _BAG_SHARE * len(present) and len(set(keys)) <= len(keys) / 2:
            kind = "weighted" if weighted else "multi_hot"
            longest = max(len(c.split(sep)) for c in present)
            comment = f"lists split by {sep!r} whose ids repeat ({seen}; up to {longest} tokens): {kind}"
            return Column(name, source, kind, separator=sep), comment
    note = _junk_making_text(name, source, numbers, sampled)
    comment = f"text ({seen}): categorical" + (f". CHECK {note}" if note else "")
    return Column(name, source, "categorical"), comment

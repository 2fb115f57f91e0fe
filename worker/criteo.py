"""The Criteo Kaggle text format: its line grammar, a vectorized line parser, and the writer.

File grammar (one example per line, UTF-8):

    file    := line*                                    # the last line's NEWLINE may be missing
    line    := label TAB int{13} cat{26} NEWLINE        # 40 tab-separated columns; TAB between columns
    NEWLINE := "\n" | "\r\n"
    label   := "0" | "1"
    int     := "" | a base-10 integer (Python int() syntax, within int64; not -2**63, which means missing)
             | a missing text (blank, or NA, nan, null, none, ? in any case: cells.MISSING_TEXTS): missing
    cat     := "" | a string without TAB or NEWLINE     # Criteo: 8 lowercase hex digits

The columns are named label, I1..I13, C1..C26 (schema_columns.CRITEO_COLUMNS). An empty column is a missing value.
parse_lines checks the column count and the label; the integer columns are checked where a schema reads them
as numbers (worker/encode.py), and the built-in Criteo schema (schema.builtin_schema) turns a line into the ids
and numeric features of worker/features.py. worker/criteo_fast.py reads the lines common data is made of in one
compiled scan, giving what these functions and worker/encode.py give; parse_lines and parse_share judge the rest
(bad lines and their messages). The writer emits integers in base 10 and categoricals as lowercase
hex, 8 digits for values < 2**32 and 16 otherwise; reading a written file through the built-in schema gives
exactly the ids computed from the raw values.
"""

from __future__ import annotations

import os
import re

import numpy as np

from worker.cells import is_missing_text
from worker.features import MISSING_CAT, MISSING_INT, NUM_CAT_FIELDS, NUM_FIELDS, NUM_INT_FIELDS

NUM_COLUMNS = 1 + NUM_FIELDS  # label + features
_WRITE_ROWS = 65536  # rows formatted at a time by write_criteo
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)

EMPTY_LINE = "empty line"  # a line of nothing but whitespace: skipped, not a bad line (worker/formats.py)
COMMENT_LINE = "comment line"  # a libsvm line of a comment or query id only: skipped as empty
BLANK_CELLS = "row of blank cells"  # a CSV record of blank cells (",,,", a spreadsheet's empty row): skipped as empty
EMPTY_PROBLEMS = (EMPTY_LINE, COMMENT_LINE, BLANK_CELLS)  # a reader's problems of a line skipped as empty
CR_ALONE = "it holds carriage returns: are its lines ended by CR alone? (`tr '\\r' '\\n'` converts them)"
# said of a bad line of a line file (Criteo, libsvm) with a CR inside: lines ended by CR alone read as one line


def parse_lines(chunk: bytes, name: str, first_line: int) -> tuple[np.ndarray, np.ndarray]:
    """(labels float32 (n,), columns bytes (n, 40)) of whole lines (the last newline optional; LF or CRLF),
    vectorized: one split of the chunk. ValueError "<name> line <L>: <problem>" at the first line with a column
    count other than 40 or a label other than 0/1, L counted from first_line."""
    if not chunk.endswith(b"\n"):
        chunk += b"\n"
    if b"\r" in chunk:
        chunk = chunk.replace(b"\r\n", b"\n")
    buf = np.frombuffer(chunk, dtype=np.uint8)
    ends = np.flatnonzero((buf == ord("\t")) | (buf == ord("\n")))  # where each field ends
    line_ends = np.flatnonzero(buf[ends] == ord("\n"))  # the fields that end a line
    counts = np.diff(line_ends, prepend=-1)
    bad = np.flatnonzero(counts != NUM_COLUMNS)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{name} line {first_line + i}: {counts[i]} tab-separated columns, expected {NUM_COLUMNS}")
    width = max(int((np.diff(ends, prepend=-1) - 1).max()), 1)  # numpy fills a known width twice as fast
    fields = chunk[:-1].replace(b"\n", b"\t").split(b"\t")
    columns = np.array(fields, dtype=f"S{width}").reshape(len(line_ends), NUM_COLUMNS)
    label_col = columns[:, 0]
    is_one = label_col == b"1"
    bad = np.flatnonzero(~is_one & (label_col != b"0"))
    if len(bad):
        i, line_no = int(bad[0]), first_line + int(bad[0])
        raise ValueError(f"{name} line {line_no}: {_label_problem(label_col[i], columns[i, 1], line_no)}")
    return is_one.astype(np.float32), columns


def _label_problem(label: bytes, first_int: bytes, line_no: int) -> str:
    """The problem of line line_no whose label cell is not 0 or 1 (first_int: its I1 cell); when both cells are
    words (not empty, not numbers), as in a header line (`label<TAB>I1...`), what to do with such a line: at line
    1, remove it or read the file as a CSV; further on (files joined with their headers), remove every such line."""
    problem = f"label {_text(label)!r}, expected '0' or '1'"
    if not (_is_word(label) and _is_word(first_int)):
        return problem
    if line_no > 1:
        return f"{problem} (a header line, of files joined with their headers? Criteo TSV has none: remove each)"
    return problem + (" (a header line? Criteo TSV has none: remove it, `tail -n +2 FILE > NEW`, or read the file "
                      "as a tab-separated CSV with a header: --format auto does)")  # fmt: skip


def _is_word(cell: bytes) -> bool:
    """Whether a cell is text other than a number or a missing value's (NA, null, ?: an I1 cell may hold those)."""
    try:
        float(cell)
    except ValueError:
        return not is_missing_text(cell)
    return False


def _text(field: bytes) -> str:
    return field.decode("utf-8", "replace")


def format_criteo(labels: np.ndarray, int_values: np.ndarray, cat_values: np.ndarray) -> str:
    """The file text of n examples: labels (n,) in {0, 1}; int_values int64 (n, 13), MISSING_INT -> empty;
    cat_values uint64 (n, 26), MISSING_CAT -> empty. Every line ends with a newline."""
    labels = np.asarray(labels)
    int_values = np.asarray(int_values, dtype=np.int64)
    cat_values = np.asarray(cat_values, dtype=np.uint64)
    n = len(labels)
    if labels.shape != (n,) or int_values.shape != (n, NUM_INT_FIELDS) or cat_values.shape != (n, NUM_CAT_FIELDS):
        raise ValueError(
            f"labels {labels.shape}, int_values {int_values.shape}, cat_values {cat_values.shape}; "
            f"expected ({n},), ({n}, {NUM_INT_FIELDS}), ({n}, {NUM_CAT_FIELDS})"
        )
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must all be 0 or 1")
    if n == 0:
        return ""
    columns = np.empty((n, NUM_COLUMNS), dtype=object)
    columns[:, 0] = np.where(labels == 1, "1", "0")
    columns[:, 1 : 1 + NUM_INT_FIELDS] = np.where(int_values == MISSING_INT, "", int_values.astype(np.str_))
    columns[:, 1 + NUM_INT_FIELDS :] = hex_strings(cat_values)
    return "".join("\t".join(row) + "\n" for row in columns.tolist())


def hex_strings(values: np.ndarray) -> np.ndarray:
    """uint64 -> lowercase hex str, 8 digits below 2**32 else 16; MISSING_CAT -> '' (features.cat_values reads
    each back to its value)."""
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    digits = _HEX[((values[..., None] >> shifts) & np.uint64(15)).astype(np.intp)]  # (..., 16) ASCII
    digits = np.ascontiguousarray(digits)
    long = digits.view("S16")[..., 0].astype(np.str_)
    short = np.ascontiguousarray(digits[..., 8:]).view("S8")[..., 0].astype(np.str_)
    out = np.where(values < np.uint64(2**32), short, long)
    return np.where(values == MISSING_CAT, "", out)


def write_criteo(path: str | os.PathLike, labels: np.ndarray, int_values: np.ndarray, cat_values: np.ndarray) -> None:
    """Write n examples to path in the Criteo format (see format_criteo for the arrays), replacing the file."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for lo in range(0, max(len(labels), 1), _WRITE_ROWS):
            hi = lo + _WRITE_ROWS
            f.write(format_criteo(labels[lo:hi], int_values[lo:hi], cat_values[lo:hi]))


def parse_share(
    lines: list[bytes], first: int, step: int, name: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """parse_lines for the lines of a worker's share that may hold bad ones: (labels, columns, line numbers
    int64 (n,), [(line number, problem)] of the bad lines), line k being file line first + k * step. The chunk
    is parsed at once; when that fails, each line's column count and label are checked in Python and the lines
    that pass are parsed together (by bisection should parse_lines still reject some: it is the judge)."""
    try:
        labels, columns = parse_lines(b"".join(lines), name, first)
        return labels, columns, first + step * np.arange(len(labels), dtype=np.int64), []
    except ValueError:
        pass
    good: list[tuple[int, bytes]] = []
    problems: list[tuple[int, str]] = []
    for k, line in enumerate(lines):
        line_no, line = first + k * step, line if line.endswith(b"\n") else line + b"\n"
        problem = shape_problem(line, line_no)
        if problem is None:
            good.append((line_no, line))
        else:
            problems.append((line_no, problem))
    parts = _bisect(good, name, problems) if good else []
    if not parts:
        return np.zeros(0, np.float32), np.zeros((0, NUM_COLUMNS), np.bytes_), np.zeros(0, np.int64), problems
    labels, columns, line_nos = (np.concatenate(p) for p in zip(*parts))
    return labels, columns, line_nos, problems


def _bisect(lines: list[tuple[int, bytes]], name: str, problems: list[tuple[int, str]]) -> list[tuple]:
    """[(labels, columns, line numbers)] of the lines that parse (in order); the others' problems appended to
    `problems`. A block that fails is halved, so b bad lines among n cost O(b log n) vectorized parses."""
    try:
        labels, columns = parse_lines(b"".join(line for _, line in lines), name, lines[0][0])
        return [(labels, columns, np.array([no for no, _ in lines], dtype=np.int64))]
    except ValueError as e:
        if len(lines) == 1:
            line_no = lines[0][0]
            problems.append((line_no, str(e).removeprefix(f"{name} line {line_no}: ")))
            return []
    mid = len(lines) // 2
    return _bisect(lines[:mid], name, problems) + _bisect(lines[mid:], name, problems)


def shape_problem(line: bytes, line_no: int) -> str | None:
    """What is wrong with line line_no's column count or label (worded as parse_lines words it, with a hint for a line
    that looks like another format or another tab-separated layout), or None."""
    body = line[:-1]  # the line ends with "\n"
    if body.endswith(b"\r"):
        body = body[:-1]
    if not body.strip(b" "):  # (a line of tabs is 40 empty columns: a bad label)
        return EMPTY_LINE
    columns = body.count(b"\t") + 1
    if columns != NUM_COLUMNS and b"\r" in body:  # lines ended by CR alone, read as one
        return f"{columns} tab-separated columns, expected {NUM_COLUMNS}; {CR_ALONE}"
    if columns != NUM_COLUMNS:
        hint = other_format_hint(body)
        if not hint and columns > 1 and abs(columns - NUM_COLUMNS) > 1:  # not a Criteo line, a column lost or added
            hint = " (another tab-separated layout? with a header line, --format auto reads it as CSV)"
        return f"{columns} tab-separated columns, expected {NUM_COLUMNS}{hint}"
    label, first_int = (cell.rstrip(b"\0") for cell in body.split(b"\t", 2)[:2])  # as numpy's bytes arrays hold them
    if label not in (b"0", b"1"):
        return _label_problem(label, first_int, line_no)
    return None


LIBSVM_TOKEN = re.compile(rb"[^:\s]+:[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")  # id:value


def other_format_hint(body: bytes) -> str:
    """For a line with no tab (no Criteo TSV line, whatever else is wrong with it), the format it looks like, as a
    hint to append to its problem: comma-separated (--format csv), separated by ';' or '|' (--format auto, which
    tells the delimiter), or libsvm (`label id:value ...`); "" for a line with a tab or none of these."""
    if b"\t" in body:
        return ""
    if b"," in body:
        return " (it looks comma-separated: --format csv reads a CSV file with a header)"
    for delimiter in ";|":
        if delimiter.encode() in body:
            return f" (it looks {delimiter}-separated: with a header line, --format auto reads it as CSV)"
    if libsvm_like(body):
        return " (it looks like libsvm, `label id:value ...`: --format libsvm reads it)"
    return ""


_QID = re.compile(rb"qid:[0-9]+")  # SVMlight's query id, which groups lines for ranking: no feature


def libsvm_tokens(line: bytes) -> list[bytes]:
    """The whitespace-separated tokens of a libsvm line, as SVMlight writes them too: a comment from "#" to the
    line's end left out, and so is a query id, qid:<digits>, second (after the label) or first (a line without
    its label, in a file to score)."""
    tokens = line.partition(b"#")[0].split()
    if len(tokens) > 1 and _QID.fullmatch(tokens[1]):
        return tokens[:1] + tokens[2:]
    return tokens[1:] if tokens and _QID.fullmatch(tokens[0]) else tokens


def libsvm_like(body: bytes) -> bool:
    """Whether a line (without its line end) reads as libsvm: a first token (the label) and id:value tokens (after
    libsvm_tokens)."""
    tokens = libsvm_tokens(body)
    return len(tokens) > 1 and all(LIBSVM_TOKEN.fullmatch(token) for token in tokens[1:])

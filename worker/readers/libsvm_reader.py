"""The libsvm reader: a worker's share of a libsvm file as chunks of cells (worker/formats.py reads them).

libsvm  label id:value id:value ...   (whitespace-separated). Labels 0 or 1, or -1 (-> 0) or +1 (-> 1).
        SVMlight's additions are read too (criteo.libsvm_tokens): a comment from "#" to the line's end is left
        out, and so is a query id, qid:<digits>, after the label (first on a line without one): a line of a
        comment or a query id only is an empty line. An empty line is no line of data: the line counts
        (linecount.count_data_upto) and libsvm_sample pass it.
        Column f<k> holds the id of the k-th feature token, or nothing when the token's value is 0 (missing):
        a chunk's Parsed holds every column's ids as a hashed categorical column reads them (the id itself), its
        cells the decimal text of those of columns with raw ids ('' where missing), so f<k> is the id whether the
        schema hashes it or takes it raw. A categorical column takes the id alone (one-hot: any other finite
        value is ignored; where the built-in schema chose so by --libsvm-values auto, the first good line holding
        one is named: Cells.left_value); a weighted one takes it with the token's value as its weight
        (Parsed.weights: 0 where missing, the column's bag then empty); a value beyond float32's range is then a
        bad line.
        K = 1 + the largest k among the schema's columns (0 without any; at most schema_columns.MAX_LIBSVM_FIELDS): a
        line with fewer than K features has empty cells in its last columns; one with more is a bad line. Ids are
        integers 0 <= id < 2**64 - 1, written as decimal digits.
        Bad: a bad label, a token other than id:value, more than K features. blank_labels (predict): a first
        token other than a label that holds no ":" is read as no label (NaN), the line's other tokens its features.
Without labels: id:value id:value ...: every token a feature. Bad: a token other than id:value, more than K
        features. A file is without labels when the first of its first LABEL_PROBE_LINES lines whose first
        token is id:value (a non-negative integer id) or has no ":" (a label) is the former (has_labels).
        libsvm_field_count counts the features of such a file's lines the same way (the most of a line among the
        first FIELD_COUNT_LINES lines of data).
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterator

import numpy as np

from worker.cells import FLOAT32_MAX
from worker.criteo import COMMENT_LINE, CR_ALONE, EMPTY_LINE, EMPTY_PROBLEMS, libsvm_tokens
from worker.encode import Parsed
from worker.features import MISSING_CAT
from worker.readers.share import Cells, Share, bounded_lines, first_line, open_data
from worker.schema import Schema
from worker.schema_columns import LIBSVM_COLUMN, MAX_LIBSVM_FIELDS

_MISSING = int(MISSING_CAT)
_LIBSVM_LABELS = {b"0": 0.0, b"1": 1.0, b"-1": 0.0, b"+1": 1.0}


def libsvm_cells(name: str, schema: Schema, size: int, share: Share, labeled: bool = True,
                 blank_labels: bool = False) -> Iterator[Cells]:  # fmt: skip
    """Chunks of `size` lines of the share as cells, by the module docstring's rules (labeled=False: without
    labels; blank_labels: a first token that is no label, nor id:value, is no label)."""
    wanted = sorted({int(LIBSVM_COLUMN.fullmatch(c.source)[1]) for c in schema.columns})
    raw = sorted({int(LIBSVM_COLUMN.fullmatch(c.source)[1]) for c in schema.columns if c.ids == "raw"})
    weighted = sorted({int(LIBSVM_COLUMN.fullmatch(c.source)[1]) for c in schema.columns if c.kind == "weighted"})
    k_fields = wanted[-1] + 1 if wanted else 0
    watch = schema.libsvm_values == "auto" and not weighted  # values a one-hot read chosen by a sample leaves out
    with open_data(name) as f:
        for lines, first in share.chunks(bounded_lines(f, name), size):
            labels: list[float] = []
            rows: list[list[int]] = []
            weights: list[list[float]] = []
            line_nos: list[int] = []
            problems: list[tuple[int, str]] = []
            unread: dict[int, str] = {}
            for k, line in enumerate(lines):
                line_no = first + k * share.num_workers
                parsed = _libsvm_line(line, labeled, blank_labels, with_values=bool(weighted))
                if isinstance(parsed, str):
                    problems.append((line_no, parsed))
                elif len(parsed[1]) > k_fields:
                    problems.append((line_no, f"{len(parsed[1])} features, more than the schema's {k_fields} fields "
                                              "(the built-in schema's count is the most of a line among the training "
                                              "file's first 10,000; --libsvm-fields sets it)"))  # fmt: skip
                else:
                    if labeled and parsed[0] != parsed[0]:  # NaN: a token read as no label
                        unread[line_no] = _text(line.split()[0])
                    labels.append(parsed[0])
                    rows.append(parsed[1])
                    if weighted:
                        weights.append(parsed[2])
                    line_nos.append(line_no)
            values = _libsvm_values(rows, k_fields, MISSING_CAT, np.uint64)
            labels_f32, line_nos_i64 = np.array(labels, dtype=np.float32), np.array(line_nos, dtype=np.int64)
            w = _libsvm_values(weights, k_fields, 0.0, np.float64) if weighted else None
            large = _too_large(w, weighted) if weighted else None
            if large is not None and large.any():  # bad lines, their problems in line order among the others
                problems = sorted(problems + _large_problems(w, weighted, large, line_nos_i64), key=lambda p: p[0])
                for line_no in line_nos_i64[large].tolist():
                    unread.pop(line_no, None)
                values, w, labels_f32, line_nos_i64 = (a[~large] for a in (values, w, labels_f32, line_nos_i64))
            cells = {f"f{k}": _decimal_strings(values[:, k]) for k in raw}
            parsed = Parsed(cats={f"f{k}": np.ascontiguousarray(values[:, k]) for k in wanted},
                            weights={f"f{k}": w[:, k].astype(np.float32) for k in weighted})  # fmt: skip
            left = None
            if watch and share.bad.stats.first_left_value is None:  # (once found, not looked for again)
                left = _left_value(lines, line_nos_i64, first, share.num_workers, labeled, blank_labels)
            yield Cells(labels_f32, cells, line_nos_i64, problems, parsed, unread, left)


# ":" and a token's value other than 0 or 1 as libsvm files write them (0, 1, 1.0, ...), in lines without their
# comments and query ids (criteo.libsvm_tokens leaves them out: _COMMENT, _QID_TOKEN): a chunk of one-hot lines holds
# none, so a search of its bytes passes it; a match (1e0, +1, a bad line's) is then parsed to be sure
_NOT_BINARY = re.compile(rb":(?![01](?:\.0*)?(?:[ \t\r\n\x0b\x0c]|$))")
_COMMENT = re.compile(rb"#[^\n]*")
_QID_TOKEN = re.compile(rb"qid:[0-9]+")  # (one apart from a line's second token makes the line bad: not looked at)


def _left_value(lines: list[bytes], good: np.ndarray, first: int, step: int, labeled: bool, blank_labels: bool
                ) -> tuple[int, float] | None:  # fmt: skip
    """(line number, value) of the first of the chunk's good lines (their numbers: good) holding a feature value
    other than 0 and 1, or None: found by one search of the chunk's bytes where it has none (lines: the chunk's,
    the k-th at line first + k * step, read as libsvm_cells reads them)."""
    joined = _features(b"".join(lines))
    binary = sum(joined.count(b":" + v + end) for v in (b"0", b"1") for end in (b" ", b"\n"))
    if binary == joined.count(b":") or _NOT_BINARY.search(joined) is None:  # (the counts: the common case, faster)
        return None
    kept = set(good.tolist())
    for k, line in enumerate(lines):
        if first + k * step in kept and _NOT_BINARY.search(_features(line)):
            parsed = _libsvm_line(line, labeled, blank_labels, with_values=True)
            value = next((v for v in parsed[2] if v not in (0.0, 1.0)), None)
            if value is not None:
                return first + k * step, value
    return None


def _features(text: bytes) -> bytes:
    """Lines without their comments and query ids (their ":"s are no feature's)."""
    text = _COMMENT.sub(b"", text) if b"#" in text else text
    return _QID_TOKEN.sub(b"", text) if b"qid:" in text else text


def _decimal_strings(ids: np.ndarray) -> np.ndarray:
    """uint64 ids -> their decimal str; MISSING_CAT -> '' (an empty cell)."""
    return np.where(ids == MISSING_CAT, "", ids.astype(np.str_))


def _too_large(weights: np.ndarray, weighted: list[int]) -> np.ndarray:
    """bool (n,): the lines of a chunk's (n, K) float64 values whose value at one of the positions `weighted` is
    beyond float32's range (a weight that would be inf)."""
    return (np.abs(weights[:, weighted]) > FLOAT32_MAX).any(axis=1)


def _large_problems(weights: np.ndarray, weighted: list[int], large: np.ndarray, line_nos: np.ndarray
                    ) -> list[tuple[int, str]]:  # fmt: skip
    """The problem of each line marked in `large` (_too_large's), naming its first value beyond float32's range at
    the positions `weighted` (ascending) of weights, float64 (n, K)."""
    out = []
    for i in np.flatnonzero(large).tolist():
        at = weighted[int(np.argmax(np.abs(weights[i, weighted]) > FLOAT32_MAX))]
        value = float(weights[i, at])
        out.append((int(line_nos[i]), f"feature {value!r}: a weight beyond float32's range (|x| <= 3.4e38)"))
    return out


def _libsvm_line(line: bytes, labeled: bool = True, blank_labels: bool = False,
                 with_values: bool = False) -> tuple[float, list[int], list[float]] | str:  # fmt: skip
    """(label, the id of each feature token, MISSING_CAT for a value of 0, and with_values each token's value, else
    []), or what is wrong (a CR before the line's end is: lines ended by CR alone read as one line, whose tokens
    would make one example of them all); labeled=False: every token is a feature, the label NaN; blank_labels: a
    first token that is no label and holds no ":" is no label, NaN."""
    if b"\r" in line.rstrip(b"\r\n"):
        return CR_ALONE
    tokens = libsvm_tokens(line)
    if not tokens:
        return COMMENT_LINE if line.strip() else EMPTY_LINE
    label = _LIBSVM_LABELS.get(tokens[0]) if labeled else math.nan
    if label is None:
        try:
            v = float(tokens[0])
        except ValueError:
            v = math.nan
        if v not in (0.0, 1.0, -1.0) and not (blank_labels and b":" not in tokens[0]):
            return f"label {_text(tokens[0])!r}, expected 0, 1, -1 or +1"
        label = float(v == 1.0) if v in (0.0, 1.0, -1.0) else math.nan
    ids: list[int] = []
    values: list[float] = []
    add_id, add_value = ids.append, values.append  # (bound once: this loop is most of the reader's time)
    for tok in tokens[1:] if labeled else tokens:
        key, sep, value = tok.partition(b":")
        if not sep or not key.isdigit():
            return f"feature {_text(tok)!r}, expected id:value with a non-negative integer id"
        ident = int(key)
        if ident >= _MISSING:
            return f"feature {_text(tok)!r}: id too large, expected < 2**64 - 1"
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if not math.isfinite(v):
            return f"feature {_text(tok)!r}: value {_text(value)!r}, expected a finite number"
        add_id(ident if v != 0 else _MISSING)
        if with_values:
            add_value(v)
    return label, ids, values


def _libsvm_values(rows: list[list], k_fields: int, missing: object, dtype: type) -> np.ndarray:
    """(n, K) of dtype: the rows' values, `missing` past a row's last feature."""
    n = len(rows)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.intp, count=n)
    values = np.full((n, k_fields), missing, dtype=dtype)
    present = np.arange(k_fields)[None, :] < lengths[:, None]
    values[present] = np.fromiter(itertools.chain.from_iterable(rows), dtype=dtype, count=int(lengths.sum()))
    return values


FIELD_COUNT_LINES = 10_000  # libsvm_sample reads this many data lines: lines of a file differ in their lengths


def libsvm_field_count(path: str | os.PathLike) -> int:
    """K of a libsvm file: the most features of a good line among its first FIELD_COUNT_LINES data lines, else 0
    (libsvm_sample's first)."""
    return libsvm_sample(path)[0]


def libsvm_sample(path: str | os.PathLike) -> tuple[int, bool]:
    """(K, weighted) of a libsvm file, from its first FIELD_COUNT_LINES data lines (lines it reads empty are
    none; read without a label when the file has none, as has_labels tells; bad lines skipped),
    in one pass. K: the most features of a line. Lines of more
    than schema_columns.MAX_LIBSVM_FIELDS features count only where no line has fewer (the schema then refuses the file,
    saying why): among shorter lines such a line is a bad line, not a reason to refuse the whole file. weighted:
    whether a feature token has a value other than 0 and 1, a file the built-in schema reads with its values as
    weights."""
    labeled = has_labels(os.fspath(path))
    most = most_within = 0
    weighted = False
    with open_data(os.fspath(path)) as f:
        parsed_lines = (_libsvm_line(line, labeled, with_values=True) for line in bounded_lines(f, os.fspath(path)))
        for parsed in itertools.islice((p for p in parsed_lines if p not in EMPTY_PROBLEMS), FIELD_COUNT_LINES):
            if not isinstance(parsed, str):
                most = max(most, len(parsed[1]))
                if len(parsed[1]) <= MAX_LIBSVM_FIELDS:
                    most_within = max(most_within, len(parsed[1]))
                weighted = weighted or any(v not in (0.0, 1.0) for v in parsed[2])
    return most_within or most, weighted


def libsvm_values_read_as(libsvm_values: str, sampled_weights: bool) -> str:
    """What libsvm data is read as under --libsvm-values libsvm_values (schema_columns.LIBSVM_VALUES): "weights" or
    "one-hot" as given; auto: "weights" where the data's sample holds a value other than 0 and 1 (sampled_weights,
    libsvm_sample's weighted), else "one-hot"."""
    if libsvm_values == "auto":
        return "weights" if sampled_weights else "one-hot"
    return libsvm_values


def has_labels(name: str) -> bool:
    """Whether a libsvm file's lines start with a label (see the module docstring); True for an empty file."""

    def first_token(line: bytes) -> bytes:
        return (libsvm_tokens(line) or [b""])[0]

    def fits(line: bytes) -> bool:  # a label (any token without ":") or an id:value
        token = first_token(line)
        return (bool(token) and b":" not in token) or token.partition(b":")[0].isdigit()

    line = first_line(name, fits)
    return line is None or b":" not in first_token(line)


def first_line_problem(name: str, labeled: bool) -> str | None:
    """Why the first line of a file with tokens (not empty, nor a comment only) is not libsvm (read with a label or
    without), or None."""
    line = first_line(name, lambda line: bool(libsvm_tokens(line)))
    if line is None:
        return None
    parsed = _libsvm_line(line, labeled)
    return f"its first line is not libsvm: {parsed}" if isinstance(parsed, str) else None


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")

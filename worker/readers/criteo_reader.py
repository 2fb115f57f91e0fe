"""The Criteo TSV reader: a worker's share of a Criteo file as chunks of cells (worker/formats.py reads them).

criteo  label TAB I1..I13 TAB C1..C26 (worker/criteo.py): columns I1..I13, C1..C26. Bad: a column count
        other than 40, a label other than 0/1 (blank_labels: such a label is no label, NaN, worker/formats.py's
        "Blank labels"). A chunk is read a piece at a time (lines x the longest within CHUNK_BYTES: cells are
        padded to the longest in numpy's arrays), each by worker/criteo_fast.py's compiled scan, or when it
        holds a line the scan does not handle, by criteo.parse_share (with the same result).
Without labels: I1..I13 TAB C1..C26: 39 columns. Bad: a column count other than 39. A file is without labels
        when more of its first LABEL_PROBE_LINES lines have 39 columns than 40 (has_labels).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import numpy as np

from worker.criteo import NUM_COLUMNS, other_format_hint, parse_share, shape_problem
from worker.criteo_fast import scan_lines
from worker.encode import parsed_sources
from worker.readers.share import LABEL_PROBE_LINES, Cells, Share, bounded_lines, first_line, open_data
from worker.schema import Schema
from worker.schema_columns import CRITEO_COLUMNS

CRITEO_SCAN = True  # criteo chunks through criteo_fast.scan_lines first; False: criteo.parse_share alone
CHUNK_BYTES = 1 << 22  # lines x the longest of them read at a time, at most (_pieces): numpy's bytes arrays pad
# every cell to the longest, so one 1 MB cell among 200 lines took 16 GB


def criteo_cells(name: str, schema: Schema, size: int, share: Share, labeled: bool = True,
                 blank_labels: bool = False) -> Iterator[Cells]:  # fmt: skip
    """Chunks of `size` lines of the share as cells, by the module docstring's rules. labeled=False: each non-empty
    line is read as if a label column "0" began it (so a good line has 40 columns), its label then NaN, and a
    column count in a bad line's problem told without that column. blank_labels: a line whose label column is
    empty (it starts with a tab), or holds anything but 0 or 1, is read the same way, as one without a label (the
    latter named in Cells.unread_labels)."""
    int_sources, cat_sources, _ = parsed_sources(schema)
    with open_data(name) as f:
        for chunk, start in share.chunks(bounded_lines(f, name), size):
            for lines, first in _pieces(chunk, start, share.num_workers):
                yield _cells(name, lines, first, share.num_workers, int_sources, cat_sources, labeled, blank_labels)


def _pieces(lines: list[bytes], first: int, step: int) -> Iterator[tuple[list[bytes], int]]:
    """The lines of a chunk (line k at first + k * step) in runs where lines x the longest of them stays within
    CHUNK_BYTES (one line alone may pass it), each with its first line's number."""
    if max(map(len, lines), default=0) * len(lines) <= CHUNK_BYTES:
        yield lines, first
        return
    lo = longest = 0
    for k, line in enumerate(lines):
        if k > lo and max(longest, len(line)) * (k - lo + 1) > CHUNK_BYTES:
            yield lines[lo:k], first + lo * step
            lo, longest = k, 0
        longest = max(longest, len(line))
    yield lines[lo:], first + lo * step


def _cells(name: str, lines: list[bytes], first: int, step: int, int_sources: set[str], cat_sources: set[str],
           labeled: bool, blank_labels: bool) -> Cells:  # fmt: skip
    """The Cells of lines first, first + step, ... (criteo_cells' rules)."""
    if not labeled:
        lines = [b"0\t" + line if _body(line).strip(b" ") else line for line in lines]  # not EMPTY_LINE
    unread = _read_as_unlabeled(lines) if labeled and blank_labels else {}
    blank = list(unread)
    unread = {first + step * k: cell for k, cell in unread.items() if cell.strip()}
    scanned = scan_lines(lines, int_sources, cat_sources) if CRITEO_SCAN else None
    if scanned is not None:
        line_nos = first + step * np.arange(len(lines), dtype=np.int64)
        labels = scanned.labels if labeled else np.full(len(lines), np.nan, np.float32)
        labels[blank] = np.nan
        return Cells(labels, scanned.cells, line_nos, [], scanned.parsed, unread)
    labels, columns, line_nos, problems = parse_share(lines, first, step, name)
    cells = {CRITEO_COLUMNS[j]: columns[:, j] for j in range(1, NUM_COLUMNS)}
    if not labeled:
        labels = np.full(len(labels), np.nan, np.float32)
        problems = [(line_no, _without_label(problem)) for line_no, problem in problems]
    if blank:
        labels[np.isin(line_nos, first + step * np.array(blank, dtype=np.int64))] = np.nan
    return Cells(labels, cells, line_nos, problems, None, unread)


def _read_as_unlabeled(lines: list[bytes]) -> dict[int, str]:
    """{k: its label cell} of the lines whose label cell (before their first tab) is other than 0 or 1: blank
    (empty) or not a label; each such line's label cell is made "0" in place, to be read as a good line is, its
    label then NaN (criteo_cells' blank_labels). A line of no tab is left as it is (a bad line)."""
    unread = {}
    for k, line in enumerate(lines):
        if line[:2] in (b"0\t", b"1\t"):
            continue
        tab = line.find(b"\t")
        if tab >= 0:
            unread[k] = line[:tab].decode("utf-8", "replace")
            lines[k] = b"0" + line[tab:]
    return unread


_COLUMN_COUNT = re.compile(rf"(\d+) tab-separated columns, expected {NUM_COLUMNS}")  # criteo.py's wording


def _without_label(problem: str) -> str:
    """A criteo problem of a line read with a label column put before it, told of the line as it is."""
    m = _COLUMN_COUNT.match(problem)
    if m is None:
        return problem
    return (f"{int(m[1]) - 1} tab-separated columns, expected {NUM_COLUMNS - 1} (a file without labels, as most "
            f"of its first lines are){problem[m.end():]}")  # fmt: skip


def has_labels(name: str) -> bool:
    """Whether a Criteo file's lines start with a label (see the module docstring): True unless more of its first
    LABEL_PROBE_LINES lines have 39 columns than 40 (True for an empty file). Not the first such line alone: a
    labeled line whose last column was empty loses that tab to a tool that strips trailing whitespace, and the
    whole file would be read shifted by a column."""
    counts = {NUM_COLUMNS - 1: 0, NUM_COLUMNS: 0}
    with open_data(name) as f:
        for line in itertools.islice(bounded_lines(f, name), LABEL_PROBE_LINES):
            columns = _body(line).count(b"\t") + 1
            if columns in counts:
                counts[columns] += 1
    return counts[NUM_COLUMNS] >= counts[NUM_COLUMNS - 1]


def first_line_problem(name: str) -> str | None:
    """Why the first non-empty line of a file is not Criteo TSV (39 or 40 columns), or None."""
    line = first_line(name, lambda line: bool(line.strip()))
    if line is None:
        return None
    columns = _body(line).count(b"\t") + 1
    return None if columns in (NUM_COLUMNS - 1, NUM_COLUMNS) else f"its first line has {columns} tab-separated " \
        f"columns, expected {NUM_COLUMNS} (Criteo TSV)"  # fmt: skip


def other_format_first_line(name: str) -> str | None:
    """What is wrong with a file's line 1, worded as the reader words a bad line, when it has no tab and looks like
    another format (criteo.other_format_hint: CSV, another delimiter, libsvm), whose every line read as Criteo TSV
    would be malformed; else None."""
    line = first_line(name, lambda line: True)
    if line is None or not other_format_hint(_body(line)):
        return None
    return shape_problem(_body(line) + b"\n", 1)  # the reader's own wording of that line


def _body(line: bytes) -> bytes:
    """A Criteo line without its line end."""
    return line.rstrip(b"\n").removesuffix(b"\r")

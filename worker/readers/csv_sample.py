"""A sample of a CSV file's records, spread over the file, for schema inference (worker/schema_infer.py)."""

from __future__ import annotations

import csv
import io
import itertools
import os
import re
from dataclasses import dataclass
from typing import Any

from worker.readers.csv_header import header_names
from worker.readers.csv_records import BoundedReader, open_csv
from worker.readers.share import is_blank

SAMPLE_SPOTS = 32  # places of a large file read_csv_sample takes records from, past its first half-sample
SPREAD_MIN_BYTES = SAMPLE_SPOTS << 15  # ... when at least this much of the file lies past that half-sample
SAMPLE_EXAMINED = 10  # records read at most per record sampled (see _good_records)
MAX_SPOT_BYTES = 4 << 20  # read of one spot's span, at most
_LINE_END = re.compile(rb"\r\n|\r|\n")  # a physical line's end, as csv_fast.CsvLines splits lines


@dataclass
class Misfits:
    """The records of a file, read in order from its start, that have another column count than its header and a
    cell that is not blank (the readers' bad lines: `ps-worker train` stops at one, or skips it under
    --max-bad-lines): how many, and the first one's line (from 1: the header's is 1) and column count."""

    count: int = 0
    first_line: int = 0
    first_width: int = 0

    def add(self, line: int, width: int) -> None:
        if not self.count:
            self.first_line, self.first_width = line, width
        self.count += 1


def read_csv_sample(
    path: str | os.PathLike, delimiter: str, rows: int, misfits: Misfits | None = None
) -> tuple[list[str], list[list[str]]]:
    """(header, up to `rows` records that have the header's column count; header_names). ValueError for a file of no
    content (share.is_blank: empty, or whitespace only). The first
    half are the file's first records; the other half follow them, or, in an uncompressed file with at least
    SPREAD_MIN_BYTES more, come from SAMPLE_SPOTS places spread evenly over the rest (each from the line after a
    byte offset), so that a file sorted by time or by label is seen whole. A spot's start may fall inside a quoted
    field over lines, whose rest reads as a record of made-up cells, perhaps of the header's count: a file whose
    half-sample, or one of whose spots, holds a record over lines (BoundedReader.spanned) is sampled from its
    start only. misfits, where given, counts the records of the wrong column count read in order from the file's
    start (not a spot's, which may be cut)."""
    name = os.fspath(path)
    if is_blank(name):
        raise ValueError(f"{name}: the file is empty; expected a header line")
    opened = open_csv(name, delimiter)
    with opened as reader:
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{name}: the file is empty; expected a header line")
        header = header_names(name, header)
        sample = _good_records(reader, len(header), rows - rows // 2, misfits)
        start = opened.raw.tell()  # past the half-sample (by at most the text layer's read-ahead)
        spread = len(sample) == rows - rows // 2 and not name.endswith(".gz") and not reader.spanned
        spread = spread and os.path.getsize(name) - start >= SPREAD_MIN_BYTES
        spots = _spread_records(name, delimiter, len(header), rows - len(sample), start) if spread else None
        sample += spots if spots is not None else _good_records(reader, len(header), rows - len(sample), misfits)
    return header, sample


def _good_records(reader: Any, width: int, limit: int, misfits: Misfits | None = None) -> list[list[str]]:
    """Up to `limit` records of the reader with `width` columns and a cell that is not blank (the csv module's
    errors, and the empty rows the readers skip, left out; misfits, where given, counts those of another width
    with a cell that is not blank), from at most SAMPLE_EXAMINED x limit + 1,000 records: a file with no record
    of the header's width is not read to its end for a sample."""
    out: list[list[str]] = []
    for _ in range(SAMPLE_EXAMINED * limit + 1000):
        if len(out) >= limit:
            break
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error:
            continue
        if not any(cell.strip() for cell in row):
            continue
        if len(row) == width:
            out.append(row)
        elif misfits is not None:
            misfits.add(reader.record_line, len(row))
    return out


def _spread_records(name: str, delimiter: str, width: int, want: int, start: int) -> list[list[str]] | None:
    """Up to `want` records of `width` columns from SAMPLE_SPOTS spans spread evenly over bytes [start, end): each
    span's whole lines (ended by LF, CRLF or a lone CR, as the readers end them; the one its start cuts into, and
    the one its end cuts, left out), at most want/SAMPLE_SPOTS records of it, so no record is read twice. None
    where a span's records read hold one over lines: where a record starts is then not told by a line's start."""
    size = os.path.getsize(name)
    out: list[list[str]] = []
    per_spot = -(-want // SAMPLE_SPOTS)
    bounds = [start + (size - start) * k // SAMPLE_SPOTS for k in range(SAMPLE_SPOTS + 1)]
    with open(name, "rb") as f:
        for lo, hi in itertools.pairwise(bounds):
            f.seek(lo)
            span = f.read(min(hi - lo, MAX_SPOT_BYTES))
            end = lo + len(span)
            first = _LINE_END.search(span)  # the line the offset fell in is the span before's
            span = span[first.end() :] if first else b""
            if end < size:  # a line the span's end cuts is the next span's
                span = span[: max(span.rfind(b"\n"), span.rfind(b"\r")) + 1]
            reader = BoundedReader(io.StringIO(span.decode("utf-8", errors="surrogateescape"), newline=""), delimiter)
            out += _good_records(reader, width, min(per_spot, want - len(out)))
            if reader.spanned:
                return None
            if len(out) >= want:
                break
    return out

"""A CSV file's records: the csv reader bounded to MAX_RECORD_LINES lines a record, the header line, the cells of
some columns, and where the records of data stand."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from worker.csv_fast import CsvLines
from worker.readers.csv_header import header_names, header_positions
from worker.readers.share import is_blank, open_data

MAX_CSV_FIELD = 1 << 30  # the csv module's default limit (128 KiB) would turn a long bag cell into a bad line
MAX_RECORD_LINES = 100  # physical lines of one CSV record at most: more is a quote left open (BoundedReader)


class RecordTooLongError(csv.Error):
    """A CSV record cut at MAX_RECORD_LINES physical lines (BoundedReader)."""


class BoundedReader:
    """A csv.reader over lines (an iterable of text lines with their line ends) whose records span at most
    MAX_RECORD_LINES physical lines. A quote left open makes the csv module read every line after it into one
    field, up to MAX_CSV_FIELD characters (a 600 MB file took 3 GB of memory for one stray quote): here the
    record is cut there and raises RecordTooLongError, a csv.Error like any unreadable record, and the next
    record starts on the line after (the csv module starts each record afresh). spanned: whether a record read
    so far took more than one line (a quoted field holding a line end, or a quote left open)."""

    def __init__(self, lines: Iterable[str], delimiter: str):
        csv.field_size_limit(MAX_CSV_FIELD)  # long bag cells are read (then cut to max_length), not bad lines
        self._lines = iter(lines)
        self._taken = 0  # lines read so far
        self._start = 0  # lines read before the record being read
        self.spanned = False
        # iter(callable, sentinel) ends at the lines' StopIteration; _RecordCut goes through the csv module
        self._reader = csv.reader(iter(self._line, None), delimiter=delimiter)

    def __iter__(self) -> BoundedReader:
        return self

    @property
    def record_line(self) -> int:
        """The line, from 1, of the lines given, that the record read last starts on."""
        return self._start + 1

    def __next__(self) -> list[str]:
        self._start = self._taken
        try:
            return next(self._reader)
        except _RecordCut:
            raise RecordTooLongError(f"a record of more than {MAX_RECORD_LINES} lines, cut there") from None
        finally:
            self.spanned = self.spanned or self._taken - self._start > 1

    def _line(self) -> str:
        if self._taken - self._start >= MAX_RECORD_LINES:
            raise _RecordCut
        line = next(self._lines)  # StopIteration: the end of the lines
        self._taken += 1
        return line


class _RecordCut(Exception):
    """Raised through the csv module by BoundedReader's lines, to end a record."""


class open_csv:
    """A context manager giving a csv reader (BoundedReader) over a file (gzip read through), UTF-8 with a BOM
    ignored; raw: the file in bytes."""

    def __init__(self, name: str, delimiter: str):
        self.raw = open_data(name)
        text = io.TextIOWrapper(self.raw, encoding="utf-8-sig", errors="surrogateescape", newline="")
        self.reader = BoundedReader(text, delimiter)

    def __enter__(self) -> Any:  # the csv.reader
        return self.reader

    def __exit__(self, *exc: object) -> None:
        self.raw.close()


def read_csv_header(path: str | os.PathLike, delimiter: str) -> list[str] | None:
    """The header's column names of a csv file (header_names: refused where two cells differ only by the spaces
    around them), or None for a file of no content (share.is_blank: empty, or whitespace only)."""
    cells = read_header_cells(path, delimiter)
    return None if cells is None else header_names(os.fspath(path), cells)


def read_header_cells(path: str | os.PathLike, delimiter: str) -> list[str] | None:
    """The header line's cells of a csv file as the file writes them, the spaces around them kept, or None for a
    file of no content (share.is_blank: empty, or whitespace only). Nothing is refused: the delimiter probe
    (csv_dialect) reads every candidate's cells so, and the readers that use the names check them (header_names)."""
    name = os.fspath(path)
    if is_blank(name):
        return None
    with open_csv(name, delimiter) as reader:
        return next(reader, None)


def column_cells(name: str, delimiter: str, columns: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(first physical line, cells of columns) of each record of a csv file past its header, in file order and
    numbered as csv_cells numbers them (the header is line 1), the cells as the csv module reads them; a record of
    another width than the header's, or one the csv module cannot read (bad lines, to csv_cells), gives none. The
    header must hold each of the columns once (header_positions' ValueError otherwise)."""
    with open_data(name) as raw:
        lines = CsvLines(raw)
        reader = BoundedReader(lines.texts(), delimiter)
        header = header_names(name, next(reader, None) or [])
        at = header_positions(name, header, columns, delimiter)
        while True:
            start = lines.consumed + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error:
                continue
            if len(row) == len(header):
                yield start, [row[i] for i in at]


@dataclass(frozen=True)
class CsvDataPlaces:
    """Where a csv file's records of data (_records_hold_data) stand among its records past the header: residues,
    the residues mod a modulus of their 0-based indices (where a worker's share, every modulus-th record, records of
    no data included, finds data); records and data, its records and of them those of data, where the read went to
    the end (some residue not found), else None."""

    residues: frozenset[int]
    records: int | None
    data: int | None


def csv_data_places(name: str, delimiter: str, modulus: int) -> CsvDataPlaces:
    """CsvDataPlaces of a csv file, read once, until every residue mod `modulus` is found (then without the counts)
    or to its end; no residue and no record for a file of no content."""
    found: set[int] = set()
    records = data = 0
    for records, holds_data in enumerate(_records_hold_data(name, delimiter), start=1):
        if holds_data:
            data += 1
            found.add((records - 1) % modulus)
            if len(found) == modulus:
                return CsvDataPlaces(frozenset(found), None, None)
    return CsvDataPlaces(frozenset(found), records, data)


def _records_hold_data(name: str, delimiter: str) -> Iterator[bool]:
    """Whether each record of a csv file past its header holds data, in file order: the records split as csv_cells
    splits them (BoundedReader: a quoted field may span lines), one of data when the csv module reads it and some
    cell of it is not blank (not a blank line or a row of blank cells, ",,,", which the reader skips as empty;
    nor a record it cannot read). Nothing for a file of no content. The places of a worker's share are these records,
    those of no data included."""
    with open_data(name) as raw:
        reader = BoundedReader(CsvLines(raw).texts(), delimiter)
        if header_record(reader, name) is None:
            return
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error:
                yield False
                continue
            yield not blank_record(row)


def header_record(reader: BoundedReader, name: str) -> list[str] | None:
    """The first record of file `name` read from `reader`, its header; None for a file of no content (no record,
    or a blank first record of a file that share.is_blank finds empty or whitespace only)."""
    header = next(reader, None)
    if header is None or (not "".join(header).strip() and is_blank(name)):
        return None
    return header


def blank_record(row: list[str]) -> bool:
    """Whether a record is empty to the reader: no cell, or only blank ones (a blank line, ",,,")."""
    return not any(cell.strip() for cell in row)

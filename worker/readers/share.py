"""What every format reader shares: ReadStats, a worker's share of a file, bad-line accounting, opening files.

A reader (worker/readers/*_reader.py) turns a file into chunks of Cells: the labels, cells and line numbers of a
chunk's good lines, and the problems of its bad ones; worker/formats.py encodes them into Batches, counting the
bad lines through the Share's BadLines, which raises past the limit. The rules (which lines are a worker's share,
the message past the limit) are worker/formats.py's module docstring.
"""

from __future__ import annotations

import gzip
import itertools
import zlib
from codecs import BOM_UTF8
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from worker.criteo import CR_ALONE
from worker.encode import Parsed

BAD_SHARE_AFTER = 10  # bad records before BadLines' share applies
LABEL_PROBE_LINES = 1000  # lines file_has_labels reads at most (first_line)
MAX_LINE_BYTES = 64 << 20  # a line file's line, at most (bounded_lines)


@dataclass
class ReadStats:
    """Filled in by read_batches as it reads (after each chunk of max(batch_size, 4096) lines it splits)."""

    lines_read: int = 0  # data lines of this worker's share read so far, bad ones included
    bad_lines: int = 0  # of which malformed (skipped)
    bad_records: int = 0  # the malformed records they make up (a CSV record over several lines counts once)
    empty_lines: int = 0  # of which empty (skipped, not bad) ...
    comment_lines: int = 0  # ... of them libsvm lines of a comment or query id only (criteo.COMMENT_LINE)
    blank_cell_rows: int = 0  # ... of them CSV records of blank cells, ",,," (criteo.BLANK_CELLS)
    headers: int = 0  # CSV header lines read (one a file of content)
    first_bad: str | None = None  # the first problem: "<file> line <L>: <what was wrong>"
    truncated_bags: int = 0  # bags of the good lines cut to their column's max_length
    stopped: bool = False  # a bad line past --max-bad-lines ended the reading (its ValueError says so)
    unread_labels: int = 0  # good lines whose label cell was no label, read as none (blank_labels: predict)
    first_unread_label: str | None = None  # the first of them: "<file> line <L>: label <cell>"
    # libsvm read one-hot by --libsvm-values auto: the first good line holding a value other than 0 and 1, left out
    first_left_value: str | None = None  # "<file> line <L>: value <v>"


@dataclass
class Cells:
    """A chunk of a worker's share: labels float32 (m,), cells {column: (m,)} and line numbers int64 (m,) of
    its good lines as the format splits them; problems [(line number, problem[, lines])] of the others (lines:
    the physical lines the bad record took, 1 unless given); parsed: the
    columns the format has already read for encode_examples, if any; unread_labels {line number: label cell} of
    the lines whose label cell was no label (0 or 1) nor blank, read as no label (NaN) under blank_labels (it may
    name lines of other chunks: the lines of this one count); left_value (libsvm read one-hot by --libsvm-values
    auto): the first good line of the chunk holding a value other than 0 and 1, and that value, which the read
    leaves out."""

    labels: np.ndarray
    cells: Mapping[str, np.ndarray]
    line_nos: np.ndarray
    problems: list[tuple[int, str]]
    parsed: Parsed | None = None
    unread_labels: Mapping[int, str] = field(default_factory=dict)
    left_value: tuple[int, float] | None = None


GZIP_MAGIC = b"\x1f\x8b"  # the first bytes of a gzip file (never of UTF-8 text: 0x8b is a continuation byte)
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # UTF-16's byte order marks, little and big endian (never UTF-8 text)
UTF32_BOMS = (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")  # UTF-32's
OTHER_COMPRESSION = (  # (name, what decompresses it, a test of a file's first 10 bytes): not read
    ("bzip2", "bunzip2", lambda b: b[:3] == b"BZh" and b[3:4] in b"123456789" and b[4:10] == b"1AY&SY"),
    ("xz", "unxz", lambda b: b[:6] == b"\xfd7zXZ\x00"),
    ("zstd", "unzstd", lambda b: b[:4] == b"\x28\xb5\x2f\xfd"),
    ("zip", "unzip", lambda b: b[:4] == b"PK\x03\x04"),
)
BINARY_FORMATS = (  # (name, its magic): table formats of their own, not text: not read, where a control byte
    ("Parquet", b"PAR1"),  # follows in the first 10 bytes (binary_format: a text header "ORCID,..." is text)
    ("ORC", b"ORC"),
    ("Avro", b"Obj\x01"),
    ("Arrow/Feather", b"ARROW1"),
)


def binary_format(first: bytes) -> str | None:
    """The name of the binary table format (BINARY_FORMATS) whose magic a file's first 10 bytes start with, where
    they also hold a control byte that text does not (below tab, or 0x0e-0x1f); else None."""
    binary = has_control_bytes(first)
    return next((kind for kind, magic in BINARY_FORMATS if binary and first.startswith(magic)), None)


def has_control_bytes(data: bytes) -> bool:
    """Whether data holds a control byte that text does not: below tab, or 0x0e-0x1f."""
    return any(b < 0x09 or 0x0E <= b < 0x20 for b in data)


def open_data(name: str) -> BinaryIO:
    """A data file opened for binary reading, through gzip if its name ends in .gz; ValueError for gzip data under
    another name, data of another compression (OTHER_COMPRESSION), a binary table format (BINARY_FORMATS), or
    UTF-16 text (read as UTF-8, any of them would be named malformed or of another format)."""
    if name.endswith(".gz"):
        return _GzipData(name, "rb")
    with open(name, "rb") as f:
        first = f.read(10)
    start = first[:4]
    kind = binary_format(first)
    if kind is not None:
        raise ValueError(f"{name}: a {kind} file, which data files are not: they are text (csv, Criteo TSV, "
                         "libsvm). Write it out as CSV (pandas: pd.read_parquet(FILE).to_csv(OUT, index=False); "
                         "Spark: df.write.csv(OUT, header=True)), then train on that")  # fmt: skip
    for compression, tool, matches in OTHER_COMPRESSION:
        if matches(first):
            raise ValueError(f"{name}: it holds {compression}-compressed data, which data files are not read as: "
                             f"decompress it ({tool}), or compress it with gzip instead (.gz files are read through "
                             "gzip)")  # fmt: skip
    if start[:2] == GZIP_MAGIC or start[:2] in UTF16_BOMS or start in UTF32_BOMS:
        if start[:2] != GZIP_MAGIC:
            utf = "UTF-32" if start in UTF32_BOMS else "UTF-16"
            raise ValueError(f"{name}: {utf} text (it starts with {utf}'s byte order mark); data files are read as "
                             "UTF-8: save it as UTF-8")  # fmt: skip
        raise ValueError(f"{name}: it holds gzip-compressed data, but its name does not end in .gz (how a data file "
                         "is read through gzip): rename it, or decompress it")  # fmt: skip
    return open(name, "rb")


class _GzipData(gzip.GzipFile):
    """A .gz file whose read errors (not gzip, damaged, cut short) are ValueErrors that name it: gzip's own
    name neither the file nor gzip. Iteration and io.TextIOWrapper read through these methods."""

    def read(self, size: int = -1) -> bytes:
        return self._named(super().read, size)

    def read1(self, size: int = -1) -> bytes:
        return self._named(super().read1, size)

    def peek(self, n: int = 0) -> bytes:
        return self._named(super().peek, n)

    def readline(self, size: int = -1) -> bytes:
        return self._named(super().readline, size)

    def _named(self, method, arg: int) -> bytes:
        try:
            return method(arg)
        except (OSError, EOFError, zlib.error) as e:
            raise gzip_error(self.name, e) from None


def gzip_error(name: str, error: Exception | None) -> ValueError:
    """The ValueError of a .gz file that does not read to its end, for every reader of one (this module's, and
    worker/linecount.py's count): error None or an EOFError (gzip's: its data ends inside a member) is a file cut
    short, a copy or download that stopped; any other (gzip's or zlib's words) a file that is not gzip, or damaged."""
    if error is None or isinstance(error, EOFError):
        return ValueError(f"{name}: the gzip file is cut short (its compressed data stops part way, as a copy or "
                          "download that did not finish leaves it): copy it again from its source (`gzip -t` "
                          "checks a copy), or leave it out of the data")  # fmt: skip
    return ValueError(f"{name}: its name ends in .gz, but it does not read as gzip: {error}")


class BadLines:
    """The bad lines of one file of a stream, counted into stats (those of the whole stream) against the limit
    and, given a share, its bad records against that share of the lines read once more than BAD_SHARE_AFTER
    records are bad. Past either, the ValueError names the stream's first bad line (where the trouble starts) and
    the count; labels: whether the lines are read for their labels (training, eval; not predict), which its hint
    past the share names."""

    def __init__(self, name: str, limit: int, stats: ReadStats, share: float | None = None, labels: bool = True):
        self.name, self.limit, self.stats, self.labels = name, limit, stats, labels
        self.share = None if share is None or share >= 1 else share

    def add(self, line_no: int, problem: str, lines: int = 1) -> None:
        """Counts a bad record of `lines` physical lines from line_no; ValueError past the limit or the share."""
        s = self.stats
        s.bad_lines += lines
        s.bad_records += 1
        if s.first_bad is None:
            s.first_bad = f"{self.name} line {line_no}: {problem}"
        if s.bad_lines > self.limit:
            s.stopped = True
            lines = f"{s.bad_lines:,} bad line{'s' if s.bad_lines != 1 else ''}"
            raise ValueError(f"{s.first_bad}; {lines}, more than --max-bad-lines {self.limit}")
        if self.share is not None and s.bad_records > BAD_SHARE_AFTER and s.bad_records > self.share * s.lines_read:
            s.stopped = True  # records, not lines: one stray quote (up to MAX_RECORD_LINES bad lines) is one
            labels = ", with labels of 0 and 1" if self.labels else ""
            raise ValueError(
                f"{s.first_bad}; {s.bad_records:,} bad records of the first {s.lines_read:,} lines read, more than 1 "
                f"in {round(1 / self.share)}: is the data in this format{labels}? (--max-bad-lines N skips up to N "
                "bad lines, whatever their share)"
            )


@dataclass
class Share:
    """A worker's share of one file: its lines whose number % num_workers == worker_id; bad counts its bad lines."""

    worker_id: int
    num_workers: int
    bad: BadLines

    def chunks(self, lines: Iterable[bytes], size: int) -> Iterator[tuple[list[bytes], int]]:
        """This worker's lines of a headerless line file (bounded_lines), in chunks of up to `size`, each with the
        1-based line number of its first line (the k-th line of a chunk is at first + k * num_workers)."""
        mine = itertools.islice(lines, self.worker_id, None, self.num_workers)
        first = self.worker_id + 1
        while chunk := list(itertools.islice(mine, size)):
            self.bad.stats.lines_read += len(chunk)
            yield chunk, first
            first += len(chunk) * self.num_workers


def bounded_lines(f: BinaryIO, name: str) -> Iterator[bytes]:
    """The lines of a binary file, each with its line end, as iterating the file gives them (a UTF-8 BOM that
    starts the file left out, as the CSV reader leaves it out: Windows tools write one), but ValueError at a line
    of MAX_LINE_BYTES with no line end: a file whose lines end in CR alone (or that has no line end) would
    otherwise be read into memory whole, as one line, before it is found to be no data."""
    number = 0
    while line := f.readline(MAX_LINE_BYTES):
        number += 1
        if len(line) == MAX_LINE_BYTES and not line.endswith(b"\n"):
            cr = b"\r" in line
            raise ValueError(
                f"{name} line {number:,}: {MAX_LINE_BYTES:,} bytes with no line end"
                + (f"; {CR_ALONE}" if cr else "; is it a line file of this format?") + " Nothing more was read"
            )  # fmt: skip
        yield line.removeprefix(BOM_UTF8) if number == 1 else line


def is_blank(name: str) -> bool:
    """Whether a data file holds nothing but whitespace (after a UTF-8 BOM), or nothing at all, as the gzip'ed
    part file Spark writes for an empty partition: a file of no examples (and, CSV, no header). Reads up to the
    first other byte."""
    with open_data(name) as f:
        start = True
        while block := f.read(1 << 16):
            if (block.removeprefix(BOM_UTF8) if start else block).strip():
                return False
            start = False
    return True


def first_line(name: str, fits: Callable[[bytes], bool]) -> bytes | None:
    """The first of the first LABEL_PROBE_LINES lines of a line file that fits, or None."""
    with open_data(name) as f:
        lines = itertools.islice(bounded_lines(f, name), LABEL_PROBE_LINES)
        return next((line for line in lines if fits(line)), None)

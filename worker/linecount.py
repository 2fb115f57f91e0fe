"""How many lines a training file holds, counted no further than a limit, with an estimate from bytes beyond it.

`ps-worker train` needs the count twice before its first step: to choose the recipe (worker/recipe.py: small under
SMALL_DATA_EXAMPLES lines, large otherwise) and to give the progress bar a total. Counting a 5 GB file takes as long as
reading it (about 15 s; a 10^9-line file, minutes), so the count stops at the recipe's threshold: a file that reaches it
is large whatever follows, and its total is estimated from the bytes the counted lines took (uncompressed files: the
file's size; gzip: the compressed bytes read, since the uncompressed size is unknown until the end, and the compressed
bytes a line takes are known as it is read). A count to the end also gives each file's lines (LineCount.per_file) and,
given a modulus (the job's workers), the residues of its lines of data's places among its lines
(LineCount.per_file_residues), by which worker/data_checks.py refuses data that leaves some worker's share
(worker/formats.py: every num_workers-th line of each file) without a line of data (a CSV's shares are of records, not
lines: its residues are csv_records.csv_data_places', and none are given here); beyond the threshold nothing needs them:
the validation split is a hash of an example's index (worker/validation_split.py). Lines of data are counted
(count_data_upto), in every format a line its reader skips as empty left out (no_data): a line of whitespace (criteo: of
spaces), a libsvm line of a query id or a comment only, and a csv row of blank cells (`,,,`, `"",""`, by the file's
delimiter); a csv file's header line is none either. The shares of the other formats take every num_workers-th line,
lines of no data included, so their residues are those of the data lines' indices among all the file's lines.

A CSV's count is of lines, not records: its quotes are not read, so a record whose quoted cell spans lines counts each
of its lines, by the rule of one line. The count is then an estimate of its examples, high by those extra lines, as it
is of every format's (malformed lines are counted too), and only estimates use it: the recipe's choice of small or large
data and its few-steps warning, the validation split's expected size (worker/validation_split.py held_out), progress
totals, and whether --eval-data is read whole before training. Nothing finds a record by a line's number: a CSV's shares
and their residues are of records (csv_reader.csv_cells, csv_records.csv_data_places), and the validation split picks
by an example's index among the share's good examples."""

from __future__ import annotations

import functools
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from worker.readers.share import gzip_error

SCORING_COUNT_LINES = 1_000_000  # eval and predict: lines counted for a progress total, an estimate past them
CHUNK_BYTES = 1 << 16  # read at a time: past the limit's line, at most this many bytes more are read


@dataclass(frozen=True)
class LineCount:
    """lines: the lines counted (less a header line): the file's exact count when not `more`, else the limit;
    more: the file has at least `limit` lines, and the count stopped there; estimate: the file's lines, exact
    when not `more`, else from bytes (an estimate, never below lines); bytes_read: the bytes of the file read
    (compressed bytes for gzip)."""

    lines: int
    more: bool
    estimate: int
    bytes_read: int
    per_file: tuple[int, ...] = ()  # count_files_upto: the lines of each file it counted to the end, in order
    # given a modulus and counted to the end: the residues mod modulus of the 0-based indices of the file's lines of
    # data among all its lines (empty: its lines of no data keep their places); none for a file with a header
    residues: frozenset[int] | None = None
    per_file_residues: tuple[frozenset[int], ...] = ()  # count_files_upto: `residues` of each file of per_file


def count_lines_upto(path: str, limit: int | None, header: bool = False, empty: NoData | None = None,
                     modulus: int | None = None) -> LineCount:  # fmt: skip
    """The lines of a file (gzip read through, a header line left out), counted until `limit` of them (None: to
    the end). A line ends in LF; in a file with a header (CSV, whose reader takes every kind of line end) in LF,
    CRLF or a lone CR; a last line without a line end counts too, as the readers read it. empty (a format's lines
    of no data, no_data's): a line its reader reads empty (whitespace; libsvm: a query id qid:N, a comment # ...;
    csv: blank cells) is no data line and not counted.
    modulus (>= 1): a count to the end of a file without a header gives LineCount.residues (a CSV's shares are of
    records: csv_records.csv_data_places). ValueError names a .gz file that does not read
    as gzip, or is cut short (share.gzip_error)."""
    target = None if limit is None else limit + header  # line ends to reach, header included
    newlines = read = head = 0  # read: file bytes (compressed for gzip) up to the last line end counted
    after_cr = False  # header: the chunk before ended in CR, so a LF starting this one ends no line of its own
    last = b""  # the file's last byte; empty: its last line, when it has no line end
    no_data_lines = empty
    residues = _Residues(None if header or not empty else modulus)
    with open(path, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        chunks = _chunks(raw, path)
        if empty and header:  # CR and CRLF made LF, as the csv reader ends lines: lines are then cut at LF
            chunks = _lf_line_ends(chunks)
        chunks = _whole_lines(chunks) if empty else chunks
        lf_only = bool(empty) or not header  # the chunks' lines end in LF alone
        for chunk, chunk_bytes in chunks:
            last = (chunk if empty and not chunk.endswith(b"\n") else chunk[-1:]) or last
            skip = int(after_cr and chunk.startswith(b"\n"))
            n = chunk.count(b"\n") + (0 if lf_only else chunk.count(b"\r") - chunk.count(b"\r\n") - skip)
            if no_data_lines is not None:
                no_data = no_data_lines.starts(chunk)
                n -= len(no_data)
                residues.add(chunk, no_data, no_data_lines.line)
            after_cr = not lf_only and chunk.endswith(b"\r")
            if header and not head and n:  # (the header: the first line of data, to these counts)
                head = (_nth_end(chunk, 1, not lf_only, skip) + 1) * chunk_bytes / len(chunk)  # the header's share
            if target is not None and newlines + n >= target:  # the limit's line is in this chunk
                k = target - newlines
                if no_data_lines is not None:
                    end = _nth_data_end(chunk, k, no_data_lines.line)
                else:
                    end = _nth_end(chunk, k, not lf_only, skip)
                read += (end + 1) * chunk_bytes / len(chunk)
                estimate = round(limit * (size - head) / max(read - head, 1))
                return LineCount(limit, True, max(limit, estimate), raw.tell())
            newlines += n
            read += chunk_bytes
        unended = int(last != b"" and last not in (b"\n" if lf_only else b"\r\n"))  # a last line without its end
        if no_data_lines is not None and unended:  # ... of data
            unended = int(no_data_lines.line.fullmatch(last) is None)
        lines = max(0, newlines + unended - header)
        if limit is not None and lines >= limit:  # that last line is the limit's
            return LineCount(limit, True, limit, raw.tell())
        found = residues.found if empty else frozenset(range(min(lines, modulus or 0)))
        return LineCount(lines, False, lines, raw.tell(), residues=None if modulus is None or header else found)


def count_files_upto(paths: Sequence[str], limit: int | None, header: bool = False, empty: NoData | None = None,
                     modulus: int | None = None) -> LineCount:  # fmt: skip
    """count_lines_upto over files read one after another (worker/datafiles.py: a data input of several files,
    each with its own header line when header; empty: their format's lines of no data not counted; modulus: each file
    counted to the end gives its residues): the count stops once `limit` lines are counted in all. The files
    not reached then are estimated from their sizes at the lines per byte of the files of their kind (gzip'ed or
    not) counted so far, the file where the count stopped included."""
    lines = read = 0
    per_file: list[int] = []
    per_file_residues: list[frozenset[int]] = []
    per_kind: dict[bool, list[float]] = {True: [0.0, 0.0], False: [0.0, 0.0]}  # gzip'ed? -> [lines, bytes]
    for i, path in enumerate(paths):
        count = count_lines_upto(path, None if limit is None else limit - lines, header, empty, modulus)
        read += count.bytes_read
        kind = per_kind[path.endswith(".gz")]
        kind[0] += count.estimate
        kind[1] += os.path.getsize(path)
        if count.more:
            rest = 0.0
            for other in paths[i + 1 :]:
                seen_lines, seen_bytes = per_kind[other.endswith(".gz")]
                if not seen_bytes:  # no file of its kind counted: the one where the count stopped tells
                    seen_lines, seen_bytes = kind
                rest += os.path.getsize(other) * seen_lines / max(seen_bytes, 1.0)
            more = lines + count.estimate + round(rest)
            return LineCount(lines + count.lines, True, more, read, tuple(per_file), None, tuple(per_file_residues))
        lines += count.lines
        per_file.append(count.lines)
        if count.residues is not None:
            per_file_residues.append(count.residues)
    return LineCount(lines, False, lines, read, tuple(per_file), None, tuple(per_file_residues))


def count_data_upto(paths: Sequence[str], limit: int | None, fmt: str, modulus: int | None = None,
                    delimiter: str = ",") -> LineCount:  # fmt: skip
    """count_files_upto of the data lines of files in format fmt (schema.format; a csv file's cells separated by
    delimiter, schema.delimiter): a csv file's header line left out, and the lines its reader reads empty
    (no_data); modulus: with each file's residues (LineCount.per_file_residues), but a csv file's
    (csv_records.csv_data_places)."""
    empty = no_data(fmt, delimiter)
    return count_files_upto(paths, limit, header=fmt == "csv", empty=empty, modulus=modulus)


class _Residues:
    """The residues mod `modulus` of the 0-based indices of a file's lines of data among all its lines (found),
    fed its chunks of whole lines in order (_whole_lines'); modulus None: none are looked for. Once every residue is
    found, the chunks are not looked at."""

    def __init__(self, modulus: int | None):
        self.modulus, self.lines, self.found = modulus, 0, frozenset()

    def add(self, chunk: bytes, no_data: list[int], no_data_line: re.Pattern) -> None:
        """chunk: the next whole lines (the file's last without its LF, if it has none); no_data: the offsets in
        b"\n" + chunk of the LF before each of its lines of no data (NoData.within's matches), as in chunk where
        each such line starts; no_data_line: NoData.line."""
        if self.modulus is None or len(self.found) == self.modulus:
            return
        ends = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 0x0A)
        count = len(ends) + (not chunk.endswith(b"\n"))  # a last line without its LF is a line
        data = np.ones(count, dtype=bool)
        data[np.searchsorted(ends, no_data)] = False  # a line's index: the LFs before its start
        if not chunk.endswith(b"\n") and no_data_line.fullmatch(chunk, int(ends[-1]) + 1 if len(ends) else 0):
            data[-1] = False
        self.found |= frozenset(((self.lines + np.flatnonzero(data)) % self.modulus).tolist())
        self.lines += count


def _chunks(raw: BinaryIO, path: str) -> Iterator[tuple[bytes, int]]:
    """The file's bytes (decompressed when its name ends in .gz, every gzip member; zero bytes after a member are
    padding, skipped as Python's gzip module skips them), each chunk with the number of file bytes it came from
    (decompressing in small pieces keeps that close)."""
    if not path.endswith(".gz"):
        while chunk := raw.read(CHUNK_BYTES):
            yield chunk, len(chunk)
        return
    z, open_member, after_member = zlib.decompressobj(wbits=31), False, False
    try:
        while packed := raw.read(CHUNK_BYTES // 4):
            while packed:
                if after_member:
                    packed = packed.lstrip(b"\0")
                    if not packed:
                        break
                open_member, after_member = True, False
                chunk = z.decompress(packed)
                used, packed = len(packed) - len(z.unused_data), z.unused_data
                if z.eof:  # another member, or padding, may follow
                    z, open_member, after_member = zlib.decompressobj(wbits=31), False, True
                if chunk:
                    yield chunk, used
    except zlib.error as e:
        raise gzip_error(path, e) from None
    if open_member:
        raise gzip_error(path, None)


_ANY_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True)
class NoData:
    """A format's lines of no data, which its reader skips as empty, from a regex of one such line's body (before
    its LF): within, matched with the line end before it, so that finditer over LF + whole lines finds each once (a
    match takes no LF of the line after); line: one such line, its LF or none; first: a table of the bytes such a
    line may start with, LF (an empty line) included; a byte the body can start with must be in it, or starts
    misses the lines it starts (a byte too many only costs time); look: starts looks at first bytes (False: the regex
    searches every chunk, as tests and benchmarks/line_count.py compare, dataclasses.replace(no_data(...),
    look=False))."""

    within: re.Pattern
    line: re.Pattern
    first: np.ndarray  # bool (256,), by byte value
    look: bool = True

    @classmethod
    def of(cls, body: bytes, first: bytes) -> NoData:
        table = np.zeros(256, dtype=bool)
        table[list(first + b"\n")] = True
        return cls(re.compile(rb"\n" + body + rb"(?=\n)"), re.compile(body + rb"\n?"), table)

    def starts(self, chunk: bytes) -> list[int]:
        """The offsets in chunk (whole lines, the last maybe without its LF) where its lines of no data that end in
        LF start: within's matches in LF + chunk. A chunk where no line starts with a byte of `first` holds none,
        told by a look at each line's first byte where `look` (numpy: a few times faster than the regex over the chunk,
        which runs only where some line may be one)."""
        data = np.frombuffer(chunk, dtype=np.uint8)
        if self.look and not self.first[data[:1]].any() and not self.first[data[1:][data[:-1] == 0x0A]].any():
            return []
        return [m.start() for m in self.within.finditer(b"\n" + chunk)]


NO_DATA = {
    # libsvm_reader: whitespace, a query id (qid:<digits>) and a comment (# ...), each or all left out
    "libsvm": NoData.of(rb"[ \t\x0b\x0c]*(?:qid:[0-9]+[ \t\x0b\x0c]*)?(?:#[^\r\n]*)?\r*", b" \t\x0b\x0cq#\r"),
    "criteo": NoData.of(rb" *\r?", b" \r"),  # criteo.shape_problem's EMPTY_LINE: spaces (a line of tabs is a bad line)
}
# the ASCII bytes a blank csv cell may hold, what str.strip() strips but line ends (made LF): csv_records.blank_record
_CSV_SPACE = b" \t\x0b\x0c\x1c\x1d\x1e\x1f"


def _blank_cell(delimiter: bytes) -> bytes:
    """A regex of a blank csv cell as the csv module reads it: whitespace, or a quote at its start, whitespace (the
    delimiter included), a quote, whitespace. Outside the quotes the whitespace leaves out the delimiter, which ends
    the cell there, so that a line has one way to match (a delimiter that is whitespace, in both a cell and between
    cells, would give a line of n cells some 2^n ways to try, and a line of data among them a regex search as long)."""
    inside = b"[" + _CSV_SPACE + b"]*"  # (whitespace bytes, none special in a class)
    outside = b"[" + _CSV_SPACE.replace(delimiter, b"") + b"]*"
    return rb'(?:"' + inside + rb'"' + outside + rb"|" + outside + rb")"


@functools.lru_cache(maxsize=8)
def no_data(fmt: str, delimiter: str = ",") -> NoData:
    """A format's lines of no data: NO_DATA's; a csv file's, by its delimiter, a line of blank cells (,,, ; a blank
    line; "",""), which its reader skips as empty (csv_records.blank_record: every cell blank). A cell's blank is
    ASCII whitespace (_CSV_SPACE): a line whose cells hold a non-ASCII space (U+00A0, U+3000, ...), which the reader
    strips too, is a line of data to the count."""
    if fmt != "csv":
        return NO_DATA[fmt]
    between = delimiter.encode()
    cell = _blank_cell(between)
    return NoData.of(cell + rb"(?:" + re.escape(between) + cell + rb")*", _CSV_SPACE + b'"' + between[:1])


def _whole_lines(chunks: Iterator[tuple[bytes, int]]) -> Iterator[tuple[bytes, int]]:
    """The chunks cut after their last LF, the rest carried into the next (the file's last line without its end,
    if any, last, of no file bytes), each with its file bytes as _chunks gives them."""
    carry = b""
    for chunk, chunk_bytes in chunks:
        chunk = carry + chunk
        cut = chunk.rfind(b"\n") + 1
        carry = chunk[cut:]
        if cut:
            yield chunk[:cut], chunk_bytes
    if carry:
        yield carry, 0


def _lf_line_ends(chunks: Iterator[tuple[bytes, int]]) -> Iterator[tuple[bytes, int]]:
    """The chunks with each CRLF and lone CR made LF (a CRLF cut by a chunk's end included), each with its file
    bytes as _chunks gives them."""
    after_cr = False
    for chunk, chunk_bytes in chunks:
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        after_cr = chunk.endswith(b"\r")
        yield (chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n") if b"\r" in chunk else chunk), chunk_bytes


def _nth_data_end(chunk: bytes, k: int, no_data_line: re.Pattern) -> int:
    """The offset of the LF that ends the k-th line of data (not no_data_line's) of a chunk of whole lines (k >= 1,
    and the chunk holds at least k); -1 for k = 0."""
    start = 0
    while k and (end := chunk.find(b"\n", start)) >= 0:
        k -= no_data_line.fullmatch(chunk, start, end + 1) is None
        if not k:
            return end
        start = end + 1
    if k:
        raise ValueError(f"the chunk holds fewer than {k} lines of data")
    return -1


def _nth_end(chunk: bytes, k: int, universal: bool, skip: int) -> int:
    """The offset of the last byte of the k-th line end of chunk (k >= 1, and chunk holds at least k): LF, or with
    universal LF, CRLF or CR, from offset skip on."""
    if not universal:
        at = -1
        for _ in range(k):
            at = chunk.index(b"\n", at + 1)
        return at
    for i, match in enumerate(_ANY_LINE_END.finditer(chunk, skip), start=1):
        if i == k:
            return match.end() - 1
    raise ValueError(f"the chunk holds fewer than {k} line ends")

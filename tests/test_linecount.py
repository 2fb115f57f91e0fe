"""worker/linecount.py's count of lines of data against the plain per-line rule, on random small files."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker import linecount
from worker.linecount import count_data_upto, count_files_upto, no_data
from worker.readers.share import open_data

# every byte a line of no data may start with (NoData.first), line ends of each kind, and pieces of data lines; a
# csv file's delimiter joins them
PIECES = [
    b" ",
    b"\t",
    b"\x0b",
    b"\x0c",
    b"\x1c",
    b"\x1f",
    "\xa0".encode(),
    b"\r",
    b"\n",
    b"\r\n",
    b"\n\n",
    b"qid:3",
    b"q",
    b"#c",
    b"1 1:1",
    b"x",
    b",",
    b'"',
]
DELIMITERS = [",", ";", "\t", "|", " ", "\x1f", "§"]
ASCII_SPACE = "".join(c for c in map(chr, range(128)) if c.isspace())  # what str.strip() strips of ASCII


def per_line(data: bytes, fmt: str, modulus: int) -> tuple[int, frozenset[int]]:
    """(lines of data, the residues mod modulus of their indices among all lines) by the rule read line by line: a
    line ends in LF; a last line without its LF counts; a line is of no data where no_data(fmt).line matches it
    whole. (libsvm and criteo; a csv file's rule is csv_per_line's.)"""
    lines = data.split(b"\n")
    if lines[-1] == b"":  # the last line ends in LF, or there is none
        lines.pop()
    at = [i for i, line in enumerate(lines) if no_data(fmt).line.fullmatch(line) is None]
    return len(at), frozenset(i % modulus for i in at)


def csv_per_line(data: bytes, delimiter: str) -> int:
    """The lines of data of a csv file by the csv module read one line at a time: CRLF and lone CR are line ends as
    LF, the first line (the header) is none, a last line without its end counts; a line is of no data where the csv
    module reads it alone (its quotes closed within it) as cells str.strip() of ASCII whitespace leaves empty, as
    csv_reader reads a blank record. A line that leaves a quote open is of data; so is one with a non-ASCII space."""
    lines = data.decode().replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    count = 0
    for line in lines[1:]:
        rows = list(csv.reader([line + "\n", "next\n"], delimiter=delimiter))
        closed = len(rows) == 2  # else the quote left open took the next line into the record
        count += not (closed and not any(cell.strip(ASCII_SPACE) for cell in rows[0]))
    return count


@pytest.mark.parametrize("fmt", ["libsvm", "criteo", "csv"])
@settings(max_examples=150, deadline=None)
@given(
    chunk_bytes=st.sampled_from([1, 2, 3, 7, 64, 1 << 16]),
    modulus=st.integers(1, 4),
    look=st.booleans(),
    data=st.data(),
)
def test_the_count_of_lines_of_data_is_the_per_line_rules(fmt, chunk_bytes, modulus, look, data):
    """count_data_upto, with NoData.starts' look at first bytes or without it (the regex on every chunk), read in
    chunks of any size: its lines and residues (none for a CSV, whose shares are of records) are the per-line
    rule's (a CSV's, by a delimiter drawn, the csv module's); a count to a limit at most the lines stops there, one
    past them does not."""
    delimiter = data.draw(st.sampled_from(DELIMITERS), label="delimiter") if fmt == "csv" else ","
    pieces = data.draw(st.lists(st.sampled_from([*PIECES, delimiter.encode()]), max_size=40), label="pieces")
    text = b"h" * (fmt == "csv") + b"".join(pieces)  # a CSV's header line is not blank (its reader refuses one)
    if fmt == "csv":
        expected, residues = csv_per_line(text, delimiter), frozenset()
    else:
        expected, residues = per_line(text, fmt, modulus)
    fd, path = tempfile.mkstemp(suffix=f".{fmt}")
    empty = dataclasses.replace(no_data(fmt, delimiter), look=look)  # count_data_upto's, looking or not
    saved = linecount.CHUNK_BYTES
    try:
        os.write(fd, text)
        os.close(fd)
        linecount.CHUNK_BYTES = chunk_bytes
        counted = count_files_upto([path], None, header=fmt == "csv", empty=empty, modulus=modulus)
        assert (counted.lines, counted.more) == (expected, False)
        assert counted.per_file_residues == (() if fmt == "csv" else (residues,))
        assert count_data_upto([path], None, fmt, modulus=modulus, delimiter=delimiter) == counted
        limit = data.draw(st.integers(1, expected + 1), label="limit")
        upto = count_files_upto([path], limit, header=fmt == "csv", empty=empty)
        assert (upto.lines, upto.more) == ((limit, True) if limit <= expected else (expected, False))
    finally:
        linecount.CHUNK_BYTES = saved
        os.remove(path)


@pytest.mark.parametrize("fmt", ["libsvm", "criteo", "csv"])
def test_a_chunk_is_searched_where_a_line_of_it_starts_with_a_byte_a_line_of_no_data_can_start_with(fmt):
    """NoData.starts finds nothing in a chunk none of whose lines may be of no data, and finds a line of no data
    among lines of data wherever it stands: first, inside, last, and after a line without data's first bytes."""
    lines_of_no_data = no_data(fmt)
    blank = {"libsvm": b"qid:3 # q", "criteo": b"  \r", "csv": b' \t,"" '}[fmt]
    assert lines_of_no_data.starts(b"1 1:1\n0,x\n") == []
    for lines, at in [([blank, b"1"], [0]), ([b"1", blank, b"0"], [2]), ([b"1", blank], [2]), ([b"1", b""], [2])]:
        assert lines_of_no_data.starts(b"\n".join(lines) + b"\n") == at, lines


@pytest.mark.parametrize("delimiter", ["\t", " ", "\x0b", "\x0c", "\x1c", "\x1f"])
def test_a_csv_line_of_many_empty_cells_by_a_whitespace_delimiter_is_counted(delimiter, tmp_path):
    """By a delimiter that is whitespace, a line of 64 empty cells then data is a line of data, and lines of 64 blank
    cells (quoted ones among them) are none; the blank-cell regex has one way to match such a line (with the
    delimiter in a cell's whitespace too, some 2^64, and this test would not end)."""
    d = delimiter
    lines = [f"a{d}b", d * 64 + "x", d * 64, f'""{d}"{d} "{d * 2}  {d}" "' + d * 62, f'"{d}"' + d * 63 + '"x"']
    path = tmp_path / "data.csv"
    path.write_text("\n".join(lines) + "\n")
    assert count_data_upto([str(path)], None, "csv", delimiter=d).lines == 2
    upto = count_data_upto([str(path)], 2, "csv", delimiter=d)
    assert (upto.lines, upto.more) == (2, True)


def test_a_csv_cell_of_the_ascii_separators_str_strip_strips_is_blank(tmp_path):
    """A cell of 0x1c-0x1f (which str.strip() strips, as the csv reader does) among spaces is blank to the count, as
    to the reader; a non-ASCII space (U+00A0) is data to the count."""
    lines = ["a,b", "\x1c,\x1d \x1e", '"\x1f\x1c" \x1d,\x1e', "\x1f,x", "\xa0,"]
    path = tmp_path / "data.csv"
    path.write_text("\n".join(lines) + "\n")
    assert count_data_upto([str(path)], None, "csv").lines == 2


@pytest.mark.parametrize("keep", [3, 12, 0.5, -4])  # in the header, past it, half way, in the trailer
def test_a_gz_file_cut_short_is_said_so_alike_by_the_count_and_the_readers(tmp_path, keep):
    """A .gz file cut short (a copy that stopped) is named cut short, with what to do, by the count and by a reader
    (share.open_data) in the same words; a damaged one (a CRC flipped) does not read as gzip, to both."""
    packed = gzip.compress(b"1,a\n" * 5000)
    at = int(len(packed) * keep) if isinstance(keep, float) else keep % len(packed)
    cases = {"cut": packed[:at], "damaged": packed[:-6] + bytes([packed[-6] ^ 0xFF]) + packed[-5:]}
    said = {}
    for case, data in cases.items():
        path = tmp_path / f"{case}.csv.gz"
        path.write_bytes(data)
        with pytest.raises(ValueError) as counted:
            linecount.count_lines_upto(str(path), None)
        with pytest.raises(ValueError) as read, open_data(str(path)) as f:
            f.read()
        said[case] = (str(counted.value), str(read.value), str(path))
    counted, read, path = said["cut"]
    assert counted == read == (f"{path}: the gzip file is cut short (its compressed data stops part way, as a copy or "
                               "download that did not finish leaves it): copy it again from its source (`gzip -t` "
                               "checks a copy), or leave it out of the data")  # fmt: skip
    counted, read, path = said["damaged"]
    assert counted.startswith(f"{path}: its name ends in .gz, but it does not read as gzip: ")
    assert read.startswith(f"{path}: its name ends in .gz, but it does not read as gzip: ")

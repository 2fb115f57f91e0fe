"""Tests for worker/csv_fast.py: reading CSV files with the compiled scan of plain lines gives exactly what the csv
module alone gives (csv_reader.CSV_SCAN = False): the same batches (labels, ids, weights, dense features, line
numbers), bad-line counts, first problems and errors, over random files (quotes, delimiters and newlines inside
quotes, CRLF and lone CR line ends, empty and blank lines, bad column counts, labels and cells, non-ASCII text,
bytes that are not UTF-8, a BOM, a missing last newline, gzip) with several workers and chunk sizes, and over
hand-made cases (a header over two lines, files without labels, a label-only file, CHUNK_CHARS cuts, other
delimiters). The scan is also shown to be the path that plain data takes."""

import gzip
import io
import tracemalloc

import numpy as np
import pytest

from worker import cells_fast, csv_fast, formats
from worker.cells import float_values, int_values
from worker.column_infer import infer_column
from worker.features import cat_values
from worker.formats import ReadStats, read_batches
from worker.readers import csv_reader
from worker.readers.share import BadLines, Share
from worker.schema_builtin import builtin_schema
from worker.schema_file import load_schema

HEADER = ["y", "c1", "raw", "n1", "n2", "n3", "tags", "wt", "skip"]
SCHEMA_TEXT = """format = "csv"
delimiter = "{delimiter}"
label = "y"
[[columns]]
name = "c1"
kind = "categorical"
[[columns]]
name = "raw"
kind = "categorical"
ids = "raw"
[[columns]]
name = "n1"
kind = "numeric"
transform = "log"
[[columns]]
name = "n2"
kind = "numeric"
transform = "bucketize"
boundaries = [0.0, 1.5, 10.0]
[[columns]]
name = "n3"
kind = "numeric"
transform = "log_buckets"
[[columns]]
name = "tags"
kind = "multi_hot"
max_length = 3
[[columns]]
name = "wt"
kind = "weighted"
[[columns]]
name = "c1_again"
source = "c1"
kind = "categorical"
"""
# (good cells, bad or odd ones) per column kind
LABELS = (["0", "1"], ["1.0", " 0", "+1", "2", "x", "", "0e0", "nan", "True", "false", " TRUE ", "tru", "yes"])
CATS = (["", "0", "a", "68fd1e64", "DEADBEEF", "fedcba9876543210", "word", "café", "東京"],
        ["f" * 16, "f" * 17, "g", " a", "a b", "-", "0x1f", "\x00"])  # fmt: skip
RAWS = (["", "0", "12", "18446744073709551614"], ["18446744073709551615", "x", "1.5", "٣"])
NUMBERS = (
    [
        "",
        "0",
        "1",
        "-3",
        "2.5",
        "0.3",
        "-0",
        "123.456",
        "-0.000123",
        "3.14159265358979",
        ".5",
        "5.",
        "99999999999999.9",
        "007.70",
        "1e3",
    ],
    [" 4 ", "nan", "NA", "?", "inf", "1e40", "abc", "1_000", "+7", "٣"],
)
INTS = (["", "0", "1", "-3", "12"], ["2.5", "x", " 4", "99999999999999999999"])
TAGS = (["", "a", "a|b", "é|ü"], ["a|b|c|d", "|", "x||y"])
WEIGHTS = (["", "u:1", "u:2|v:0.5"], ["u", "u:x", ":1", "a:b:2"])
QUOTED = ['"a,b"', '"line\nbreak"', '"say ""hi"""', '""', '"x"y', 'a"b', '"open']
POOLS = [LABELS, CATS, RAWS, NUMBERS, NUMBERS, INTS, TAGS, WEIGHTS, CATS]
ENDS = ["\n"] * 12 + ["\r\n"] * 4 + ["\r"]


def random_csv(rng: np.random.Generator, rows: int, delimiter: str = ",", plain: float = 0.97, ends=ENDS) -> bytes:
    """A random CSV file (see the module docstring); `plain` is the chance that a line holds no quote."""
    out = [delimiter.join(HEADER) + "\n"]
    for _ in range(rows):
        kind = rng.random()
        if kind < 0.03:
            out.append(rng.choice(["", "  ", "\t", "\u3000"]) + str(rng.choice(ends)))
            continue
        cells = [str(rng.choice(good if rng.random() < 0.95 else bad)) for good, bad in POOLS]
        if kind < 0.05:
            cells = cells[: rng.integers(1, len(cells))] if rng.random() < 0.5 else cells + ["extra"]
        elif kind < 0.06:
            cells = list(HEADER)  # a repeated header line
        if rng.random() > plain:
            cells[rng.integers(len(cells))] = str(rng.choice(QUOTED))
        out.append(delimiter.join(cells) + str(rng.choice(ends)))
    text = "".join(out)
    if rng.random() < 0.3:
        text = text.rstrip("\r\n")  # no line end at the end
    data = text.encode()
    if rng.random() < 0.3:
        data = b"\xef\xbb\xbf" + data
    if rng.random() < 0.1:
        at = data.index(b"\n") + 1 + int(rng.integers(len(data) // 2))
        data = data[:at] + b"\xff" + data[at:]  # not UTF-8
    return data


def schema(tmp_path, delimiter=","):
    path = tmp_path / "s.toml"
    path.write_text(SCHEMA_TEXT.format(delimiter=delimiter.replace("\t", "\\t")))
    return load_schema(str(path), default_table="t", default_dim=4)


def read(path, schema, batch_size, *, scan=True, **kw):
    """(batches, stats, error message or None) of a read with or without the scan."""
    stats, batches, error = ReadStats(), [], None
    saved, csv_reader.CSV_SCAN = csv_reader.CSV_SCAN, scan
    try:
        for b in read_batches(path, schema, batch_size, stats=stats, **kw):
            batches.append(b)
    except ValueError as e:
        error = str(e)
    finally:
        csv_reader.CSV_SCAN = saved
    return batches, stats, error


def assert_same_reads(path, schema, batch_size=5, **kw):
    """The scan and the csv module read path alike; returns the scan's read."""
    fast, reference = read(path, schema, batch_size, **kw), read(path, schema, batch_size, scan=False, **kw)
    assert fast[1:] == reference[1:]  # stats and error
    assert len(fast[0]) == len(reference[0])
    for a, b in zip(fast[0], reference[0]):
        np.testing.assert_array_equal(a.labels, b.labels, strict=True)
        np.testing.assert_array_equal(a.line_nos, b.line_nos, strict=True)
        assert list(a.fields) == list(b.fields)
        for name in a.fields:
            np.testing.assert_array_equal(a.fields[name].ids, b.fields[name].ids, strict=True)
            np.testing.assert_array_equal(a.fields[name].offsets, b.fields[name].offsets, strict=True)
            assert (a.fields[name].weights is None) == (b.fields[name].weights is None)
            if a.fields[name].weights is not None:
                np.testing.assert_array_equal(a.fields[name].weights, b.fields[name].weights, strict=True)
        assert (a.dense is None) == (b.dense is None)
        if a.dense is not None:
            assert a.dense.tobytes() == b.dense.tobytes() and a.dense.shape == b.dense.shape
    return fast


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few records, so that a small file has plain chunks, chunks with quotes, and runs cut by them."""
    monkeypatch.setattr(formats, "_MIN_CHUNK", 7)


@pytest.mark.parametrize("seed", range(40))
def test_random_files_read_alike(tmp_path, small_chunks, seed):
    rng = np.random.default_rng(seed)
    delimiter = str(rng.choice([",", ",", ";", "\t"]))
    data = random_csv(rng, int(rng.integers(1, 120)), delimiter, plain=float(rng.choice([1.0, 0.97, 0.8])))
    path = tmp_path / ("d.csv.gz" if seed % 5 == 0 else "d.csv")
    path.write_bytes(gzip.compress(data) if seed % 5 == 0 else data)
    s = schema(tmp_path, delimiter)
    for num_workers in (1, 3):
        for worker_id in range(num_workers):
            kw = dict(worker_id=worker_id, num_workers=num_workers)
            assert_same_reads(path, s, int(rng.integers(1, 9)), max_bad_lines=10**6, **kw)
            assert_same_reads(path, s, 4, max_bad_lines=int(rng.integers(0, 6)), **kw)  # stops at a bad line


def test_plain_files_take_the_scan_and_quoted_chunks_the_csv_module(tmp_path, small_chunks, monkeypatch):
    scans = []
    real = csv_reader.scan_plain
    monkeypatch.setattr(csv_reader, "scan_plain", lambda plain, *a: scans.append(plain.count) or real(plain, *a))
    path = tmp_path / "d.csv"
    path.write_bytes(random_csv(np.random.default_rng(0), 100, plain=1.0, ends=["\n", "\r\n"]))
    (batches, stats, error) = assert_same_reads(path, schema(tmp_path), max_bad_lines=10**6)
    assert sum(scans) == stats.lines_read == 100 and error is None and batches
    scans.clear()
    text = path.read_text().split("\n")
    text[30] = text[30].replace(",", ',"q",', 1)  # line 31: a quote, in the chunk of records 28..34 (lines 30..36)
    path.write_text("\n".join(text))
    assert_same_reads(path, schema(tmp_path), max_bad_lines=10**6)
    assert sum(scans) == 100 - 7 and len(scans) == 14  # that chunk, all of it, through the csv module


@pytest.mark.parametrize("scan", [True, False])
def test_a_known_file_reads_as_written(tmp_path, scan):
    path = tmp_path / "d.csv"
    path.write_bytes(b"\xef\xbb\xbfy,c1,raw,n1,n2,n3,tags,wt,skip\r\n1,a,12,0,2,3,a|b,u:2,\r\n\r\n"
                     b'0,"b,c",,,,,,,\r\n2,a,1,1,1,1,,,\r\n1,a,1\n0,caf\xc3\xa9,5,1,1,1,x,,z')  # fmt: skip
    stats = ReadStats()
    batches, stats, error = read(path, schema(tmp_path), 10, scan=scan, max_bad_lines=2)
    (b,) = batches
    assert error is None and b.labels.tolist() == [1, 0, 0] and b.line_nos.tolist() == [2, 4, 7]
    assert (stats.lines_read, stats.bad_lines, stats.empty_lines) == (6, 2, 1)
    assert stats.first_bad.endswith("line 5: label '2', expected 0 or 1 (column 'y', the schema's label)")
    assert b.fields["raw"].ids.tolist() == [12, 2**64 - 1, 5]


def test_a_header_over_two_lines_and_a_file_without_labels(tmp_path, small_chunks):
    path = tmp_path / "d.csv"
    body = random_csv(np.random.default_rng(1), 60, plain=1.0, ends=["\n"]).split(b"\n", 1)[1]
    path.write_bytes(b'y,"c\n1",c1,raw,n1,n2,n3,tags,wt,skip\n' + body.replace(b",", b",0,", 1))
    s = schema(tmp_path)
    assert_same_reads(path, s, max_bad_lines=10**6)
    header = b"c1,raw,n1,n2,n3,tags,wt,skip\n"
    path.write_bytes(header + b"".join(line.split(b",", 1)[-1] + b"\n" for line in body.split(b"\n")))
    (batches, stats, _) = assert_same_reads(path, s, labeled=False, max_bad_lines=10**6)
    assert all(np.isnan(b.labels).all() for b in batches) and stats.lines_read > 0


def test_a_label_only_file_and_blank_lines(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("y\n1\n0\n \n\n1.0\nx\n0,1\n")
    s = builtin_schema("csv", default_table="t", default_dim=4, header=["y"])
    (batches, stats, _) = assert_same_reads(path, s, max_bad_lines=10)
    assert [b.labels.tolist() for b in batches] == [[1, 0, 1]] and (stats.empty_lines, stats.bad_lines) == (2, 2)


def pieces(path, schema, size, *, scan):
    """[(line numbers, problems)] of the chunks formats cuts the file into."""
    share = Share(0, 1, BadLines(str(path), 10**9, ReadStats()))
    saved, csv_reader.CSV_SCAN = csv_reader.CSV_SCAN, scan
    try:
        return [(c.line_nos.tolist(), c.problems) for c in formats._cell_chunks(str(path), schema, size, share)]
    finally:
        csv_reader.CSV_SCAN = saved


def test_long_cells_cut_chunks_alike(tmp_path, monkeypatch):
    monkeypatch.setattr(csv_reader, "CHUNK_CHARS", 200)
    path = tmp_path / "d.csv"
    data = random_csv(np.random.default_rng(2), 300, plain=1.0, ends=["\n"]).split(b"\n")
    for k in (5, 40, 41, 90, 200):  # long cells, in characters fewer than in bytes
        data[k] = b",".join([b"1", "é".encode() * (20 + k % 7), *data[k].split(b",")[2:]])
    path.write_bytes(b"\n".join(data))
    s = schema(tmp_path)
    cut = pieces(path, s, 64, scan=True)
    assert cut == pieces(path, s, 64, scan=False) and len(cut) > 300 // 64 + 3
    assert_same_reads(path, s, max_bad_lines=10**6)


def test_the_scan_splits_lines_as_the_csv_module(tmp_path):
    lines = csv_fast.CsvLines(_Raw(b"\xef\xbb\xbfa\r\n\rb\r\rc\n\nd\r"))
    assert list(lines.texts()) == ["a\r\n", "\r", "b\r", "\r", "c\n", "\n", "d\r"] and lines.consumed == 7
    lines = csv_fast.CsvLines(_Raw(b"a\r\nb,c\n\nd\ne"))
    plain = lines.take_plain(1, 2, 0, 10)
    assert plain.buf.tobytes() == b"b,c\nd\n" and (plain.count, plain.lines, plain.first) == (2, 5, 1)
    assert not plain.stopped and plain.ascii and lines.consumed == 5
    lines = csv_fast.CsvLines(_Raw(b'a\nb\n"c\nd\n'))
    plain = lines.take_plain(0, 1, 0, 10)
    assert plain.stopped and plain.buf.tobytes() == b"a\nb\n" and list(lines.texts()) == ['"c\n', "d\n"]


class _Counted(io.BytesIO):
    """A binary file that counts the bytes read from it."""

    taken = 0

    def read(self, n: int = -1) -> bytes:
        out = super().read(n)
        self.taken += len(out)
        return out

    def readline(self, n: int = -1) -> bytes:
        out = super().readline(n)
        self.taken += len(out)
        return out


@pytest.mark.parametrize("seed", range(6))
def test_lines_are_split_as_the_csv_module_sees_them_across_blocks(monkeypatch, seed):
    """Blocks are cut only at line ends (CRLF never between its CR and LF): the lines are those io.TextIOWrapper
    (newline="") gives, whatever the block size; a file of lines ended by CR alone is read a block at a time, not
    whole before its first line."""
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(csv_fast, "BLOCK_BYTES", int(rng.integers(1, 12)))
    ends = ["\n", "\r\n", "\r"] if seed % 2 else ["\r"]
    text = "".join(str(rng.choice(["", "a", "bc,d", "é"])) + str(rng.choice(ends)) for _ in range(300))
    data = text.encode() + (b"tail" if seed % 3 else b"")
    expected = list(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline=""))
    raw = _Counted(data)
    texts = csv_fast.CsvLines(raw).texts()
    assert next(texts) == expected[0] and raw.taken <= len(expected[0]) + 2 * csv_fast.BLOCK_BYTES
    assert [expected[0], *texts] == expected
    raw = _Counted(data)
    lines = csv_fast.CsvLines(raw)
    plain = lines.take_plain(0, 1, 0, 10**6)
    assert [line + "\n" for line in plain.buf.tobytes().decode().split("\n")[:-1]] + list(lines.texts()) == [
        line.rstrip("\r\n") + "\n" if k < plain.count else line for k, line in enumerate(expected)
    ]


class _Raw:
    """A binary file of some bytes, read in small pieces (lines cut across reads)."""

    def __init__(self, data: bytes):
        self.data = data

    def read(self, n: int) -> bytes:
        out, self.data = self.data[:3], self.data[3:]
        return out

    def readline(self) -> bytes:
        at = self.data.find(b"\n") + 1 or len(self.data)
        out, self.data = self.data[:at], self.data[at:]
        return out


def test_the_scan_reads_cells_as_encode_does(tmp_path):
    """Cell by cell, bit for bit: floats as float_values, ints as int_values, cats as cat_values read them."""
    rng = np.random.default_rng(3)
    digits = ["".join(rng.choice(list("0123456789"), rng.integers(1, 18))) for _ in range(3000)]
    floats = [str(rng.choice(["", "-", "+"])) + d[:k] + "." + d[k:] for d in digits for k in [rng.integers(len(d) + 1)]]
    floats += digits + ["", "-0", "0.1", "0.3", "1e3", " 1", "1_0", ".", "-", "nan", "9" * 15, "9" * 16]
    ints = digits + ["-" + d for d in digits] + ["", "-0", "+5", str(2**63 - 1), str(-(2**63)), "1.0", " 2"]
    cats = CATS[0] + CATS[1][:-1] + [f"{v:x}" for v in rng.integers(0, 2**63, 500)]  # no NUL: plain lines
    m = max(len(floats), len(ints), len(cats))
    columns = [[c[k % len(c)] for k in range(m)] for c in (floats, ints, cats)]
    lines = csv_fast.CsvLines(io.BytesIO("".join(f"{f};{i};{c}\n" for f, i, c in zip(*columns)).encode()))
    plain = lines.take_plain(0, 1, 0, m)
    assert plain.count == m
    scanned = csv_fast.scan_plain(plain, ";", 3, None, {"f": 0, "i": 1, "c": 2}, ({"i"}, {"c"}, {"f"}))
    values, missing, simple = scanned.floats["f"]
    want, want_missing, ok = float_values(np.array(columns[0]))
    assert simple.mean() > 0.5 and (ok | ~simple).all()
    np.testing.assert_array_equal(values[simple].view(np.uint64), want[simple].view(np.uint64))
    np.testing.assert_array_equal(missing[simple], want_missing[simple])
    values, simple = scanned.ints["i"]
    want, ok = int_values(np.array(columns[1]))
    assert simple.mean() > 0.5 and (ok | ~simple).all()
    np.testing.assert_array_equal(values[simple], want[simple])
    np.testing.assert_array_equal(scanned.cats["c"], cat_values(np.array(columns[2])))


@pytest.mark.parametrize("labeled", [True, False])
def test_a_row_of_blank_cells_is_an_empty_line_on_both_paths(tmp_path, labeled):
    """A spreadsheet's empty row (',,,', maybe with spaces or a CR) is no example and no bad line, labeled or not."""
    path = tmp_path / "d.csv"
    head = "y,a,n\n" if labeled else "a,n\n"
    row = "1,x,2\n" if labeled else "x,2\n"
    blanks = ",,\n , ,\r\n,\n" if labeled else ",\n , \r\n\n"
    blanks += "\x1f,\u00a0,\u3000\n" if labeled else "\x1f,\u00a0\n\u3000,\u2003\n"  # what str.strip() strips
    path.write_text(head + row + blanks + row)
    s = load_schema_text(tmp_path, 'format = "csv"\nlabel = "y"\n[[columns]]\nname = "a"\nkind = "categorical"\n'
                         '[[columns]]\nname = "n"\nkind = "numeric"\ntransform = "log"\n')  # fmt: skip
    (batches, stats, _) = assert_same_reads(path, s, labeled=labeled, max_bad_lines=0)
    assert sum(len(b) for b in batches) == 2
    assert (stats.bad_lines, stats.empty_lines) == ((0, 4) if labeled else (0, 5))


def test_a_blank_categorical_cell_is_missing_on_both_paths_as_inference_takes_it(tmp_path, small_chunks):
    """A cell of spaces (a tab, U+00A0) is a missing value, the column's missing id, as an empty one: in a plain run
    (the scan) and a quoted one (the csv module), as schema inference's count of non-empty cells takes it."""
    path = tmp_path / "d.csv"
    cells = ["x", "", "  ", "\t", "\u00a0", '" "', "y"]
    path.write_text("y,a\n" + "".join(f"1,{c}\n" for c in cells * 3))
    s = load_schema_text(tmp_path, 'format = "csv"\nlabel = "y"\n[[columns]]\nname = "a"\nkind = "categorical"\n')
    batches, stats, _ = assert_same_reads(path, s, max_bad_lines=0)
    ids = np.concatenate([b.fields["a"].ids for b in batches]).reshape(3, len(cells))
    assert (ids[:, 1:6] == ids[0, 1]).all() and len(set(ids[0].tolist())) == 3  # x, missing, y
    column, comment = infer_column("a", "a", [c.strip('"') for c in cells], sampled=True)
    assert column.kind == "categorical" and "2 of 7 cells non-empty, 2 distinct" in comment, comment


def load_schema_text(tmp_path, text):
    (tmp_path / "s.toml").write_text(text)
    return load_schema(str(tmp_path / "s.toml"), default_table="t", default_dim=4)


@pytest.mark.parametrize("delimiter", [",", "\t", ";", "|", " "])
def test_the_blank_line_kernel_is_str_strip(delimiter):
    """csv_fast._blank_lines says a line is blank exactly where str.strip() leaves nothing of it but delimiters:
    every byte but the line ends and the quote, and the Unicode spaces and some characters that are not."""
    chars = [chr(c) for c in range(1, 256) if chr(c) not in '\n\r"'] + [
        chr(c) for c in (0x1680, 0x2000, 0x200A, 0x200B, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF, 0x4E2D)
    ]
    lines = [a + delimiter + b for a in chars for b in (" ", "\u3000", "x", "")]
    encoded = [line.encode() + b"\n" for line in lines]
    bounds = np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.int64)
    out = np.empty(len(lines), dtype=np.bool_)
    csv_fast._blank_lines(np.frombuffer(b"".join(encoded), dtype=np.uint8), bounds, ord(delimiter), out)
    expected = [not line.replace(delimiter, "").strip() for line in lines]
    assert out.tolist() == expected and 0 < sum(expected) < len(lines)


def test_cells_not_hex_are_gathered_by_like_widths_as_one_gather_reads_them(monkeypatch):
    """gathered_cat_values gives cat_values of the gathered cells (the oracle), calling it on groups of at most
    GATHER_BYTES (cells x the widest) unless one cell is wider."""
    rng = np.random.default_rng(5)
    widths = rng.choice([0, 1, 3, 8, 16, 17, 40, 300, 1500], size=500)
    buf = np.frombuffer(bytes(rng.choice(list(b"0123456789abcdefxyz\x00"), int(widths.sum()))), np.uint8)
    ends = np.cumsum(widths)
    starts = ends - widths
    expected = cat_values(cells_fast.gathered(buf, starts, ends))
    calls = []
    real = cells_fast.cat_values
    monkeypatch.setattr(cells_fast, "cat_values", lambda cells: calls.append(cells.nbytes) or real(cells))
    monkeypatch.setattr(cells_fast, "GATHER_BYTES", 1000)
    np.testing.assert_array_equal(cells_fast.gathered_cat_values(buf, starts, ends), expected, strict=True)
    assert len(calls) > 1 and all(c <= 1000 or c == 1500 for c in calls)  # a 1,500-byte cell alone


def test_a_long_cell_of_a_plain_run_costs_about_its_own_size(tmp_path, monkeypatch):
    """A categorical cell much longer than the others, in a plain run: the scan's cells that are not hex are
    gathered by like widths (cells_fast.gathered_cat_values), not every one padded to the longest."""
    path = tmp_path / "d.csv"
    rows = [f"{i % 2},w{i % 7},{i}" for i in range(3000)]
    rows[1500] = "1," + "x" * 20_000 + ",5"
    path.write_text("y,c,n\n" + "\n".join(rows) + "\n")
    s = builtin_schema("csv", default_table="t", default_dim=4, header=["y", "c", "n"])
    monkeypatch.setattr(csv_reader, "CHUNK_CHARS", 1 << 16)
    monkeypatch.setattr(cells_fast, "GATHER_BYTES", 1 << 16)
    tracemalloc.start()
    try:
        fast = assert_same_reads(path, s, batch_size=4096)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(map(len, fast[0])) == 3000 and peak < 16 << 20  # gathered whole: 3,000 x 20,000 bytes, 60 MB, twice

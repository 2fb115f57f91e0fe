"""Tests for worker/criteo_fast.py: reading Criteo files through the compiled scan gives exactly what the
reference path (criteo.parse_share, then encode on bytes cells; criteo_reader.CRITEO_SCAN = False) gives: the same
batches, bad-line counts, first problems and errors, on synthetic data, hand-made edge cases, worker shares,
gzip, other schemas over the criteo columns and random lines. The scan is also checked cell by cell against
parse_lines with int_values and cat_values, and the chunks it leaves to the reference path are the ones its
grammar excludes."""

import gzip
import tracemalloc

import numpy as np
import pytest

from worker import cells_fast
from worker.cells import int_values
from worker.criteo import parse_lines
from worker.criteo_fast import scan_lines
from worker.encode import parsed_sources
from worker.features import cat_values
from worker.formats import ReadStats, column_stats, read_batches
from worker.readers import criteo_reader
from worker.schema_builtin import builtin_schema
from worker.schema_columns import CRITEO_COLUMNS
from worker.schema_file import schema_from_text
from worker.synthetic import SyntheticConfig
from worker.synthetic_files import write_synthetic

SCHEMA = builtin_schema("criteo", default_table="t", default_dim=4)
INTS, CATS, _ = parsed_sources(SCHEMA)
GOOD_INTS = ["", "0", "7", "-3", "+5", "-0", "007", "123456789", str(2**63 - 1), str(-(2**63 - 1))]
DIGITS = list("0123456789")
GOOD_CATS = ["", "0", "a", "68fd1e64", "80e26c9b", "DEADBEEF", "aBcD", "fedcba9876543210", "f" * 15]


def line(label="1", ints=None, cats=None) -> bytes:
    """A Criteo line (with its newline) of str cells; defaults: ints 1..13, cats 8-digit hex."""
    ints = ints if ints is not None else [str(i) for i in range(1, 14)]
    cats = cats if cats is not None else [f"{0x1000 * c + 17:08x}" for c in range(26)]
    return "\t".join([label, *ints, *cats]).encode() + b"\n"


def first_int(cell: str) -> list[str]:
    """13 integer cells: cell, then 12 good ones."""
    return [cell, *(str(i) for i in range(12))]


def random_good_lines(rng: np.random.Generator, n: int) -> list[bytes]:
    return [
        line(str(rng.integers(2)), list(rng.choice(GOOD_INTS, 13)), list(rng.choice(GOOD_CATS, 26))) for _ in range(n)
    ]


def read(path, schema=SCHEMA, batch_size=7, *, scan=True, **kw):
    """(batches, stats, error message or None) of a read with or without the scan."""
    stats, batches, error = ReadStats(), [], None
    saved, criteo_reader.CRITEO_SCAN = criteo_reader.CRITEO_SCAN, scan
    try:
        for b in read_batches(path, schema, batch_size, stats=stats, **kw):
            batches.append(b)
    except ValueError as e:
        error = str(e)
    finally:
        criteo_reader.CRITEO_SCAN = saved
    return batches, stats, error


def assert_same_reads(path, schema=SCHEMA, batch_size=7, **kw):
    """The scan and the reference path read path alike; returns the scan's read."""
    fast, reference = read(path, schema, batch_size, **kw), read(path, schema, batch_size, scan=False, **kw)
    assert fast[1:] == reference[1:]  # stats and error
    assert_batches_equal(fast[0], reference[0])
    return fast


def assert_batches_equal(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a.labels, b.labels, strict=True)
        assert list(a.fields) == list(b.fields)
        for name in a.fields:
            np.testing.assert_array_equal(a.fields[name].ids, b.fields[name].ids, strict=True)
            np.testing.assert_array_equal(a.fields[name].offsets, b.fields[name].offsets, strict=True)
            assert (a.fields[name].weights is None) == (b.fields[name].weights is None)
            if a.fields[name].weights is not None:
                np.testing.assert_array_equal(a.fields[name].weights, b.fields[name].weights, strict=True)
        assert (a.dense is None) == (b.dense is None) and a.probs is None and b.probs is None
        if a.dense is not None:
            assert a.dense.tobytes() == b.dense.tobytes() and a.dense.shape == b.dense.shape


@pytest.fixture
def scanned_chunks(monkeypatch):
    """[True/False per chunk]: whether scan_lines read it (False: left to the reference path)."""
    seen = []

    def spy(lines, int_sources, cat_sources):
        out = scan_lines(lines, int_sources, cat_sources)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(criteo_reader, "scan_lines", spy)
    return seen


# --- the scan against its oracles ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_scan_gives_parse_lines_cells_and_the_values_encode_reads(seed):
    rng = np.random.default_rng(seed)
    lines = random_good_lines(rng, 300)
    lines[5] = lines[5][:-1] + b"\r\n"  # CRLF
    lines[-1] = lines[-1][:-1]  # no final newline
    labels, columns = parse_lines(b"".join(lines), "f", 1)
    got = scan_lines(lines, INTS, CATS)
    assert got is not None
    np.testing.assert_array_equal(got.labels, labels, strict=True)
    for j, source in enumerate(CRITEO_COLUMNS[1:], start=1):
        assert got.cells[source].tolist() == columns[:, j].tolist()
        if source in INTS:
            values, ok = int_values(columns[:, j])
            assert ok.all()
            np.testing.assert_array_equal(got.parsed.ints[source], values, strict=True)
        else:
            np.testing.assert_array_equal(got.parsed.cats[source], cat_values(columns[:, j]), strict=True)
    assert set(got.parsed.ints) == INTS and set(got.parsed.cats) == CATS
    assert sorted(got.cells) == sorted(CRITEO_COLUMNS[1:]) and "label" not in got.cells


def test_cells_the_scan_does_not_read_as_hex_go_through_cat_values():
    odd = ["xyz", "ffffffffffffffff", "FFFFFFFFFFFFFFFF", "0" * 17, "1 ", "é", "ab\0", "a\0b", "\0", "a\rb"]
    lines = [line(cats=[odd[(k + r) % len(odd)] for k in range(26)]) for r in range(len(odd))]
    got = scan_lines(lines, INTS, CATS)
    assert got is not None
    _, columns = parse_lines(b"".join(lines), "f", 1)
    for j, source in enumerate(CRITEO_COLUMNS[14:], start=14):
        np.testing.assert_array_equal(got.parsed.cats[source], cat_values(columns[:, j]), strict=True)


@pytest.mark.parametrize(
    "bad",
    [
        line(label="2"),
        line(label="1\0"),  # the reference reads it as 1: numpy drops trailing NULs
        line(label=""),
        b"\n",
        line()[:-1] + b"\tx\n",  # 41 columns
        line().replace(b"\t", b"", 1),  # 39
        line(ints=first_int("1.5")),
        line(ints=first_int(" 5")),
        line(ints=first_int("1_000")),
        line(ints=first_int("5\0")),
        line(ints=first_int("-")),
        line(ints=first_int(str(2**63))),
        line(ints=first_int(str(-(2**63)))),
    ],
)
def test_a_line_outside_the_grammar_leaves_the_chunk_to_the_reference_path(bad):
    good = [line()] * 3
    assert scan_lines(good, INTS, CATS) is not None
    assert scan_lines([*good, bad, *good], INTS, CATS) is None


def test_hex_cells_are_read_by_the_scan_alone_crlf_lines_included(monkeypatch):
    calls = []
    monkeypatch.setattr("worker.cells_fast.cat_values", lambda cells: calls.append(cells) or cat_values(cells))
    lines = [line(cats=[f"{c:x}" * (1 + c % 4) for c in range(26)]), line(cats=["C0FFEE"] * 26)]
    for ending in (b"\n", b"\r\n"):
        got = scan_lines([one[:-1] + ending for one in lines], INTS, CATS)
        assert got is not None and got.parsed.cats["C26"].tolist() == [0x1919, 0xC0FFEE]
    assert calls == []
    got = scan_lines([line(cats=["C0FFEE"] * 25 + ["C0FFEEX"])], INTS, CATS)
    assert [c.tolist() for c in calls] == [[b"C0FFEEX"]] and got.parsed.cats["C26"] == cat_values(calls[0])


def test_a_list_that_is_not_one_line_per_item_leaves_the_chunk_to_the_reference_path():
    one, two = line(), line(label="0")
    assert scan_lines([one + two], INTS, CATS) is None  # two lines in one item
    assert scan_lines([one[:-1], two], INTS, CATS) is None  # an item without its newline, not the last
    assert scan_lines([one, two[:-1]], INTS, CATS) is not None


def test_an_integer_column_read_as_a_float_only_is_not_checked_as_an_integer():
    schema = schema_from_text(
        'format = "criteo"\n[[columns]]\nname = "I1"\nkind = "numeric"\ntransform = "log"\n',
        "s",
        default_table="t",
        default_dim=4,
    )
    ints, cats, _ = parsed_sources(schema)
    assert (ints, cats) == (set(), set())
    got = scan_lines([line(ints=first_int("1.5e3"))], ints, cats)
    assert got is not None and got.cells["I1"].tolist() == [b"1.5e3"]


# --- files: the scan and the reference path read alike -----------------------------------------------------


@pytest.mark.parametrize("batch_size", [1000, 4099])
def test_synthetic_data_reads_alike(tmp_path, scanned_chunks, batch_size):
    path = tmp_path / "s.tsv"
    write_synthetic(path, SyntheticConfig(rows=9000, seed=3))  # what `python -m worker synth` writes
    batches, stats, error = assert_same_reads(path, batch_size=batch_size)
    assert sum(len(b) for b in batches) == 9000 and stats.bad_lines == 0 and error is None
    assert scanned_chunks and all(scanned_chunks)


def edge_lines() -> list[tuple[bytes, bool]]:
    """(line, whether the scan reads it): good lines with every kind of cell the scan reads or hands on to
    cat_values, and lines it leaves to the reference path, bad ones and good ones."""
    return [
        (line(), True),
        (line("0", ints=[""] * 13, cats=[""] * 26), True),
        (line(ints=GOOD_INTS + ["-1", "-2", "3"]), True),
        (line(cats=GOOD_CATS * 2 + ["ABCDEF01", "0" * 16, "1" * 16, "f" * 16, "F" * 16, "q", "x" * 40, "é"]), True),
        (line(cats=["ab\0", "a\0b", "\0", "\0\0", "a\rb", "\r", "1 ", " 1", "0x1f", "-1"] + [""] * 16), True),
        (line()[:-1] + b"\r\n", True),
        (line(cats=[""] * 26)[:-1] + b"\r\n", True),
        (line(cats=["abc"] * 25 + ["abc\r"])[:-1] + b"\r\n", True),  # a CR left in the cell after the one cut
        (line(ints=first_int("0" * 25 + "12")), True),
        (line(label="2"), False),
        (line(label="1\0"), False),  # good: numpy drops the trailing NUL
        (b"\n", False),
        (line()[:-1] + b"\textra\n", False),
        (line(ints=first_int("1.5")), False),
        (line(ints=first_int(" 5 ")), False),  # good: int() takes blanks
        (line(ints=first_int("5\0")), False),  # good
        (line(ints=first_int("1_000")), False),  # good: int() takes underscores
        (line(ints=first_int("9" * 19)), False),
        (line(ints=first_int("-" + "9" * 19)), False),
        (line(ints=first_int(str(2**64))), False),
        (line(ints=first_int("--1")), False),
        (line(ints=first_int("٣")), False),  # good: int() takes other scripts' digits
        (line(ints=[str(i) for i in range(12)] + [str(-(2**63))]), False),
        (b"\xff\xfe\t" * 39 + b"\xff\n", False),
        (line(label="0"), True),
    ]


@pytest.mark.parametrize("max_bad_lines", [100, 3, 0])
def test_edge_cases_read_alike(tmp_path, max_bad_lines):
    rng = np.random.default_rng(0)
    good = random_good_lines(rng, 20)
    path = tmp_path / "e.tsv"
    path.write_bytes(b"".join(good + [one for one, _ in edge_lines()] + good))
    for batch_size in (1, 5, 1000):
        assert_same_reads(path, batch_size=batch_size, max_bad_lines=max_bad_lines)


def test_each_edge_line_reads_alike_by_the_path_it_belongs_to(tmp_path, scanned_chunks):
    for k, (one, scanned) in enumerate(edge_lines()):
        path = tmp_path / f"e{k}.tsv"
        path.write_bytes(line() + one + line(label="0")[:-1])  # the last line without its newline
        scanned_chunks.clear()
        assert_same_reads(path, max_bad_lines=5)
        assert scanned_chunks == [scanned], one


@pytest.mark.parametrize("num_workers", [1, 3])
def test_worker_shares_and_gzip_read_alike(tmp_path, num_workers):
    rng = np.random.default_rng(1)
    lines = random_good_lines(rng, 5000)
    for at, (bad, _) in zip(rng.choice(len(lines), 20, replace=False), edge_lines()[9:]):
        lines[at] = bad
    path = tmp_path / "w.tsv"
    path.write_bytes(b"".join(lines))
    gz = tmp_path / "w.tsv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    for p in (path, gz):
        for worker_id in range(num_workers):
            for limit in (0, 2, 100):
                share = {"worker_id": worker_id, "num_workers": num_workers, "max_bad_lines": limit}
                assert_same_reads(p, batch_size=1000, **share)


OTHER_SCHEMA = """
format = "criteo"

[[columns]]
name = "I1"
kind = "numeric"
transform = "log_buckets"
[[columns]]
name = "I1_cat"
source = "I1"
kind = "categorical"
[[columns]]
name = "I2"
kind = "numeric"
transform = "bucketize"
boundaries = [0.0, 5.0, 100.0]
[[columns]]
name = "I3"
kind = "numeric"
transform = "none"
[[columns]]
name = "I4"
kind = "numeric"
transform = "standardize"
[[columns]]
name = "C1"
kind = "multi_hot"
separator = "a"
max_length = 2
[[columns]]
name = "C2"
kind = "categorical"
ids = "raw"
[[columns]]
name = "C3"
kind = "weighted"
separator = "b"
[[columns]]
name = "C4"
kind = "categorical"
"""


def test_other_schemas_over_the_criteo_columns_read_alike(tmp_path, scanned_chunks):
    rng = np.random.default_rng(2)
    lines = random_good_lines(rng, 3000)
    lines[10] = line(ints=["", "1e300", "x", "2.5"] + GOOD_INTS[:9], cats=["1a2a3a4"] * 26)  # bad cells
    lines[11] = line(cats=["aaa", "123", "5:0.5b6:x"] + [""] * 23)
    path = tmp_path / "o.tsv"
    path.write_bytes(b"".join(lines))
    schema = schema_from_text(OTHER_SCHEMA, "s", default_table="t", default_dim=4)
    fast_stats, reference_stats = column_stats(path, schema), None
    saved, criteo_reader.CRITEO_SCAN = criteo_reader.CRITEO_SCAN, False
    try:
        reference_stats = column_stats(path, schema)
    finally:
        criteo_reader.CRITEO_SCAN = saved
    assert fast_stats == reference_stats
    schema = schema.with_stats(fast_stats)
    scanned_chunks.clear()
    for batch_size in (3, 1000):
        _, stats, _ = assert_same_reads(path, schema, batch_size, max_bad_lines=10000)
        assert stats.bad_lines > 1000  # C2 raw ids: most hex cells are not decimals
    for worker_id in range(3):
        assert_same_reads(path, schema, 1000, worker_id=worker_id, num_workers=3, max_bad_lines=10000)
        assert_same_reads(path, schema, 1000, worker_id=worker_id, num_workers=3, max_bad_lines=20)
    assert all(scanned_chunks)


@pytest.mark.parametrize("seed", range(4))
def test_random_lines_read_alike(tmp_path, seed):
    """Lines of random cells, some good, some not, a few with the wrong column count."""
    rng = np.random.default_rng(seed)
    labels = ["0", "1", "1", "0", "2", "", "1\0", " 1"]
    ints = GOOD_INTS * 3 + ["1.5", "abc", " 3", "4\0", "1e3", str(2**63), "--1", "٣", "+"]
    cats = GOOD_CATS * 3 + ["xyz", "ffffffffffffffff", "0" * 17, "é", "ab\0", "\0", "a b", "\r", "-1"]
    lines = []
    for _ in range(6000):
        row = [rng.choice(labels), *rng.choice(ints, 13), *rng.choice(cats, 26)]
        if rng.random() < 0.002:
            row = row[: rng.integers(0, 40)] if rng.random() < 0.5 else row + ["1"]
        text = "\t".join(row).encode()
        lines.append(text + (b"\r\n" if rng.random() < 0.1 else b"\n"))
    path = tmp_path / "r.tsv"
    path.write_bytes(b"".join(lines))
    for batch_size, limit in ((1000, 10**6), (4097, 10**6), (1000, 50)):
        assert_same_reads(path, batch_size=batch_size, max_bad_lines=limit)
    good = tmp_path / "g.tsv"  # mostly lines the scan reads, a few it does not
    good.write_bytes(b"".join(random_good_lines(rng, 9000) + lines[:3]))
    assert_same_reads(good, batch_size=1000, max_bad_lines=10**6)


@pytest.mark.parametrize("seed", range(3))
def test_random_characters_read_alike(tmp_path, scanned_chunks, seed):
    """Categorical cells of random characters of the kinds the scan tells apart, integer cells of random signs
    and digits; odd integer cells and labels only in the last of three chunks, which the scan leaves."""
    rng = np.random.default_rng(seed)
    alphabet = list("0123456789abcdefABCDEF0000011111+-. \0\rx_é٣")

    def pool(size, chars, lengths):
        return np.array(["".join(rng.choice(chars, k)) for k in rng.choice(lengths, size)], dtype=object)

    cats = pool(3000, alphabet, [0, 1, 2, 8, 8, 8, 16, 17, 20])
    ints = pool(3000, DIGITS, range(1, 19))
    ints = np.where(rng.random(3000) < 0.2, "", rng.choice(["", "-", "+"], 3000) + ints)
    odd = pool(300, alphabet, range(0, 21))
    rows = np.concatenate(
        [rng.choice(["0", "1"], (9000, 1)), rng.choice(ints, (9000, 13)), rng.choice(cats, (9000, 26))], axis=1
    )
    for k in range(8200, 9000, 20):  # odd lines
        rows[k, rng.integers(0, 14)] = rng.choice(odd)
    endings = rng.choice([b"\n", b"\r\n"], 9000)
    lines = ["\t".join(row).encode() + end for row, end in zip(rows.tolist(), endings.tolist())]
    lines[-1] = lines[-1].rstrip(b"\n")  # "\r" or nothing at the end of the file
    path = tmp_path / "c.tsv"
    path.write_bytes(b"".join(lines))
    for batch_size, limit in ((1000, 10**6), (4097, 10**6), (1000, 10)):
        scanned_chunks.clear()
        _, stats, _ = assert_same_reads(path, batch_size=batch_size, max_bad_lines=limit)
        assert scanned_chunks == [True, True, False] and stats.bad_lines > 0


def peak_bytes(read) -> tuple[object, int]:
    """(read(), the most memory traced while it ran: numpy's arrays included)."""
    tracemalloc.start()
    try:
        return read(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("scan", [True, False])
def test_a_long_cell_is_read_in_pieces_of_bounded_size_alike(tmp_path, monkeypatch, scan):
    """numpy pads every cell of a bytes array to the longest: lines are read a piece at a time, lines x the longest
    within CHUNK_BYTES, and the scan's cells that are not hex are gathered by like widths, so one long cell costs
    about its own size, not the chunk's lines x 40 times it; the batches, counts and errors are those of a read
    with no such cut (the oracle), for each worker's share."""
    lines = [line(cats=[f"w{i % 7}"] * 26) for i in range(300)]
    lines[150] = line(cats=["x" * 30_000] * 2 + [f"{c:x}" for c in range(24)])  # a long categorical cell (hashed)
    lines[200] = line(ints=first_int("9" * 30_000))  # a long integer cell: a bad line
    lines[251] = line(label="2")  # a bad line after it, of the other worker's share
    path = tmp_path / "long.tsv"
    path.write_bytes(b"".join(lines))
    kw = dict(schema=SCHEMA, batch_size=512, scan=scan, num_workers=2, max_bad_lines=5)
    monkeypatch.setattr(criteo_reader, "CHUNK_BYTES", 1 << 40)
    monkeypatch.setattr(cells_fast, "GATHER_BYTES", 1 << 40)
    whole = [read(path, worker_id=w, **kw) for w in range(2)]
    assert [sum(map(len, w[0])) for w in whole] == [149, 149] and [w[1].bad_lines for w in whole] == [1, 1]
    monkeypatch.setattr(criteo_reader, "CHUNK_BYTES", 1 << 16)
    monkeypatch.setattr(cells_fast, "GATHER_BYTES", 1 << 16)
    for w in range(2):
        pieces, peak = peak_bytes(lambda w=w: read(path, worker_id=w, **kw))
        assert pieces[1:] == whole[w][1:]
        assert_batches_equal(pieces[0], whole[w][0])
        assert peak < 8 << 20  # read whole: a (lines, 40) array of 30,000-byte cells, about 180 MB

"""Tests for worker/criteo.py: round trips through written files (read through the built-in schema), hand-written
lines, the parser's checks and the bad lines of a share."""

import numpy as np
import pytest

from worker.batch import Batch
from worker.criteo import NUM_COLUMNS, format_criteo, hex_strings, parse_lines, parse_share, write_criteo
from worker.features import (
    BIAS_ID,
    INT_MISSING_BUCKET,
    MISSING_CAT,
    MISSING_INT,
    NUM_CAT_FIELDS,
    NUM_FIELDS,
    NUM_INT_FIELDS,
    cat_values,
    example_ids,
    field_ids,
    int_bucket,
)
from worker.formats import read_batches
from worker.schema_builtin import builtin_schema

SCHEMA = builtin_schema("criteo", default_table="t", default_dim=4)


def read_criteo(path, batch_size, max_bad_lines=0):
    return list(read_batches(path, SCHEMA, batch_size, max_bad_lines=max_bad_lines))


def ids_of(batch: Batch) -> np.ndarray:
    """(n, 40) ids of the built-in schema's one-id fields and the bias."""
    return np.stack([batch.fields[f.name].ids for f in SCHEMA.model_fields()], axis=1)


def random_rows(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=n).astype(np.float32)
    ints = rng.integers(-5, 10**6, size=(n, NUM_INT_FIELDS))
    ints[rng.random(ints.shape) < 0.1] = np.iinfo(np.int64).max
    ints[rng.random(ints.shape) < 0.2] = MISSING_INT
    cats = rng.integers(0, 2**32, size=(n, NUM_CAT_FIELDS), dtype=np.uint64)  # Criteo's 8 hex digits
    wide = rng.random(cats.shape) < 0.3
    cats[wide] = rng.integers(0, 2**64 - 1, size=int(wide.sum()), dtype=np.uint64)  # 16 hex digits
    cats[0, :3] = [0, 2**32 - 1, 2**64 - 2]
    cats[rng.random(cats.shape) < 0.2] = MISSING_CAT
    ints[1] = MISSING_INT  # one row with every feature empty
    cats[1] = MISSING_CAT
    return labels, ints, cats


def read_all(path, batch_size):
    batches = read_criteo(path, batch_size)
    return batches, np.concatenate([b.labels for b in batches]), np.concatenate([ids_of(b) for b in batches])


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_round_trip_gives_the_ids_of_the_raw_values(tmp_path, batch_size):
    labels, ints, cats = random_rows(300)
    path = tmp_path / "data.txt"
    write_criteo(path, labels, ints, cats)
    batches, got_labels, got_ids = read_all(path, batch_size)
    assert [len(b) for b in batches[:-1]] == [batch_size] * (len(batches) - 1) and len(batches[-1]) <= batch_size
    assert all(b.probs is None and b.labels.dtype == np.float32 for b in batches)
    assert np.array_equal(got_labels, labels)
    assert np.array_equal(got_ids, example_ids(ints, cats))


def test_written_text_format():
    ints = np.full((1, NUM_INT_FIELDS), MISSING_INT)
    ints[0, :3] = [5, -1, 0]
    cats = np.full((1, NUM_CAT_FIELDS), MISSING_CAT, dtype=np.uint64)
    cats[0, :3] = [0x68FD1E64, 10, 2**32]
    text = format_criteo(np.array([1]), ints, cats)
    assert text == "1\t5\t-1\t0" + "\t" * 10 + "\t68fd1e64\t0000000a\t0000000100000000" + "\t" * 23 + "\n"
    assert text.count("\t") == NUM_FIELDS
    with pytest.raises(ValueError, match="0 or 1"):
        format_criteo(np.array([2]), ints, cats)
    with pytest.raises(ValueError, match="expected"):
        format_criteo(np.array([1, 0]), ints, cats)


def test_hand_written_lines(tmp_path):
    ints = ["1", "", "-2", "9"] + [""] * 9
    cats = ["68fd1e64", "", "not-hex"] + [""] * 23
    line = "\t".join(["0"] + ints + cats)
    path = tmp_path / "hand.txt"
    path.write_bytes((line + "\r\n" + line + "\n").encode())  # CRLF line endings are accepted too
    (batch,) = read_criteo(path, 10)
    assert batch.labels.tolist() == [0.0, 0.0]
    assert np.array_equal(ids_of(batch)[0], ids_of(batch)[1])
    ids = ids_of(batch)[0]
    assert ids[-1] == BIAS_ID and len(ids) == NUM_FIELDS + 1
    assert ids[0] == field_ids(0, int_bucket(np.array([1])))[0]
    assert ids[1] == field_ids(1, np.array([INT_MISSING_BUCKET]))[0]
    assert ids[2] == field_ids(2, np.array([(-2) % 2**64], dtype=np.uint64))[0]
    assert ids[3] == field_ids(3, np.array([3 + 4], dtype=np.uint64))[0]  # floor(ln(9)^2) = 4
    assert ids[13] == field_ids(13, np.array([0x68FD1E64], dtype=np.uint64))[0]
    assert ids[14] == field_ids(14, np.array([MISSING_CAT]))[0]
    assert ids[15] != field_ids(15, np.array([MISSING_CAT]))[0]


def test_empty_file_yields_nothing(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("")
    assert read_criteo(path, 4) == []
    write_criteo(tmp_path / "none.txt", np.zeros(0), np.zeros((0, 13), np.int64), np.zeros((0, 26), np.uint64))
    assert (tmp_path / "none.txt").read_text() == ""


GOOD = "\t".join(["1"] + ["3"] * 13 + ["abc"] * 26)


def with_ints(label: str, ints: list[str]) -> str:
    return "\t".join([label] + ints + ["3"] * (13 - len(ints)) + ["abc"] * 26)


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("\t".join(GOOD.split("\t")[:-1]), "39 tab-separated columns, expected 40"),
        (GOOD + "\textra", "41 tab-separated columns, expected 40"),
        ("", "1 tab-separated columns, expected 40"),
        ("2" + GOOD[1:], "label '2', expected '0' or '1'"),
    ],
)
def test_parse_lines_names_file_line_and_expectation(bad_line, message):
    text = ("\n".join([GOOD] * 4 + [bad_line] + [GOOD]) + "\n").encode()
    with pytest.raises(ValueError) as info:
        parse_lines(text, "data.txt", 3)
    assert str(info.value) == f"data.txt line 7: {message}"
    labels, columns = parse_lines(("\n".join([GOOD] * 5)).encode(), "data.txt", 1)
    assert labels.tolist() == [1.0] * 5 and columns.shape == (5, NUM_COLUMNS) and columns[0, 14] == b"abc"


@pytest.mark.parametrize(
    "ints, message",
    [
        (["1.5"], "integer column 'I1' is '1.5'"),
        (["3"] * 12 + ["x"], "integer column 'I13' is 'x'"),
        (["3", "99999999999999999999"], "integer column 'I2' is '99999999999999999999'"),
        (["-9223372036854775808"], "integer column 'I1' is '-9223372036854775808'"),
    ],
)
def test_bad_integers_are_bad_lines_of_the_builtin_schema(tmp_path, ints, message):
    path = tmp_path / "data.txt"
    path.write_text("\n".join([GOOD] * 4 + [with_ints("0", ints)] + [GOOD]) + "\n")
    with pytest.raises(ValueError) as info:
        read_criteo(path, batch_size=3)
    assert f"data.txt line 5: {message}, expected empty, NA (missing) or a base-10 integer in (" in str(info.value)


HEADER_HINT = (
    " (a header line? Criteo TSV has none: remove it, `tail -n +2 FILE > NEW`, or read the file as a "
    "tab-separated CSV with a header: --format auto does)"
)
JOINED_HINT = " (a header line, of files joined with their headers? Criteo TSV has none: remove each)"


@pytest.mark.parametrize("file_line", [1, 4])
def test_a_header_line_is_a_bad_line_that_says_what_to_do_with_it(tmp_path, file_line):
    """A line of column names (label, I1, ...; a header written by mistake, or a concatenated file's) is a bad
    label, said to be a header line: at line 1 with the two ways to read the file, further on to be removed (the
    first line's tail -n +2 and CSV reading would not do); a bad label of numbers is not."""
    header = "\t".join(["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)])
    lines = [GOOD] * 5
    lines.insert(file_line - 1, header)
    path = tmp_path / "data.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as info:
        read_criteo(path, batch_size=3)
    hint = HEADER_HINT if file_line == 1 else JOINED_HINT  # line 1's ways to read the file apply to no other
    assert str(info.value).startswith(f"{path} line {file_line}: label 'label', expected '0' or '1'{hint}; ")
    with pytest.raises(ValueError) as info:
        parse_lines((header + "\n").encode(), "f", 1)
    assert str(info.value) == f"f line 1: label 'label', expected '0' or '1'{HEADER_HINT}"
    # a cell of a number, an empty one or a missing value's text (an I1 of NA is a Criteo value): no header
    for label, first_int in (("yes", "3"), ("2", "I1"), ("", "I1"), ("yes", "NA"), ("?", "I1")):
        line = "\t".join([label, first_int] + GOOD.split("\t")[2:])
        assert parse_share([(line + "\n").encode()], 1, 1, "f")[3] == [(1, f"label {label!r}, expected '0' or '1'")]


def test_parse_share_reports_bad_lines_and_parses_the_rest():
    lines = [
        (GOOD + "\n").encode(),
        b"1\tshort\n",
        (GOOD.replace("1", "0", 1) + "\r\n").encode(),
        b"2" + GOOD[1:].encode(),
    ]
    labels, columns, line_nos, problems = parse_share(lines, 5, 3, "f")  # file lines 5, 8, 11, 14
    assert labels.tolist() == [1.0, 0.0] and line_nos.tolist() == [5, 11] and columns.shape == (2, NUM_COLUMNS)
    layout = " (another tab-separated layout? with a header line, --format auto reads it as CSV)"
    assert problems == [(8, f"2 tab-separated columns, expected 40{layout}"), (14, "label '2', expected '0' or '1'")]
    labels, columns, line_nos, problems = parse_share([b"x\n"], 1, 1, "f")
    assert (
        len(labels) == 0
        and columns.shape == (0, NUM_COLUMNS)
        and problems == [(1, "1 tab-separated columns, expected 40")]
    )


def test_hex_strings_read_back_to_their_values():
    values = np.array([0, 10, 2**32 - 1, 2**32, 2**64 - 2, MISSING_CAT], dtype=np.uint64)
    text = hex_strings(values)
    assert text.tolist() == ["00000000", "0000000a", "ffffffff", "0000000100000000", "fffffffffffffffe", ""]
    np.testing.assert_array_equal(cat_values(text), values)


def test_a_line_with_no_tab_gets_the_hint_of_the_format_it_looks_like_and_no_other():
    from worker.criteo import other_format_hint

    assert "comma-separated" in other_format_hint(b"1,a,b")
    assert "looks ;-separated" in other_format_hint(b"1;a;b") and "looks |-separated" in other_format_hint(b"1|a|b")
    assert "libsvm" in other_format_hint(b"1 3:1 7:0.5") and "libsvm" in other_format_hint(b"0 u_12:1e-3 x:.5")
    for line in (b"1 2024-01-01T12:00:00", b"1 a:b", b"hello", b"1\ta,b;c|d"):  # a tab: Criteo's, whatever else
        assert other_format_hint(line) == "", line

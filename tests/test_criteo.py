"""Tests for worker/criteo.py: round trips through written files, hand-written lines, and malformed input."""

import numpy as np
import pytest

from worker.criteo import format_criteo, read_criteo, write_criteo
from worker.features import (
    BIAS_ID,
    INT_MISSING_BUCKET,
    MISSING_CAT,
    MISSING_INT,
    NUM_CAT_FIELDS,
    NUM_FIELDS,
    NUM_INT_FIELDS,
    example_ids,
    field_ids,
    int_bucket,
)


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
    batches = list(read_criteo(path, batch_size))
    return batches, np.concatenate([b.labels for b in batches]), np.concatenate([b.ids for b in batches])


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_round_trip_gives_the_ids_of_the_raw_values(tmp_path, batch_size):
    labels, ints, cats = random_rows(300)
    path = tmp_path / "data.txt"
    write_criteo(path, labels, ints, cats)
    batches, got_labels, got_ids = read_all(path, batch_size)
    assert [len(b) for b in batches[:-1]] == [batch_size] * (len(batches) - 1) and len(batches[-1]) <= batch_size
    assert all(b.probs is None and b.labels.dtype == np.float32 and b.ids.dtype == np.uint64 for b in batches)
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
    assert np.array_equal(batch.ids[0], batch.ids[1])
    ids = batch.ids[0]
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
    assert list(read_criteo(path, 4)) == []
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
        (with_ints("1", ["1.5"]), "integer feature I1 is '1.5'"),
        (with_ints("0", ["3"] * 12 + ["x"]), "integer feature I13 is 'x'"),
        (with_ints("0", ["3", "99999999999999999999"]), "integer feature I2 is '99999999999999999999'"),
        (with_ints("0", ["-9223372036854775808"]), "integer feature I1 is '-9223372036854775808'"),
    ],
)
def test_malformed_line_names_file_line_and_expectation(tmp_path, bad_line, message):
    path = tmp_path / "data.txt"
    path.write_text("\n".join([GOOD] * 4 + [bad_line] + [GOOD]) + "\n")
    with pytest.raises(ValueError) as info:
        for _ in read_criteo(path, batch_size=3):  # the bad line is in the second chunk
            pass
    assert f"data.txt line 5: {message}" in str(info.value)

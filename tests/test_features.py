"""Tests for worker/features.py against per-value Python oracles of the documented contract."""

import hashlib
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.features import (
    BIAS_ID,
    INT_MISSING_BUCKET,
    MISSING_CAT,
    MISSING_INT,
    NUM_CAT_FIELDS,
    NUM_FIELDS,
    NUM_INT_FIELDS,
    blank_strings,
    cat_values,
    dense_features,
    example_ids,
    field_ids,
    int_bucket,
    space_ids,
)

M64 = 2**64 - 1
INT64 = st.integers(-(2**63), 2**63 - 1)
U64 = st.integers(0, M64)


def mix64_py(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def field_id_py(field: int, value: int) -> int:
    return mix64_py(mix64_py(value) ^ (((field + 1) * 0x9E3779B97F4A7C15) & M64))


def int_bucket_py(v: int) -> int:
    if v == -(2**63):
        return 2**63
    if v <= 2:
        return v & M64
    return 3 + math.floor(math.log(v) ** 2)


def cat_value_py(s: str | bytes) -> int:
    """A cell's raw value from its bytes in the file (a str: its UTF-8, as a reader found it)."""
    raw = s if isinstance(s, bytes) else s.encode("utf-8")
    if raw == b"" or raw.decode("utf-8", "surrogateescape").isspace():  # empty or blank: missing
        return 2**64 - 1
    if re.fullmatch(rb"[0-9a-fA-F]{1,16}", raw) and int(raw, 16) != M64:
        return int(raw, 16)
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


def test_schema_constants():
    assert (NUM_INT_FIELDS, NUM_CAT_FIELDS, NUM_FIELDS) == (13, 26, 39)
    assert int(MISSING_CAT) == M64 and int(MISSING_INT) == -(2**63) and int(INT_MISSING_BUCKET) == 2**63
    assert int(BIAS_ID) == field_id_py(NUM_FIELDS, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(INT64, st.integers(-5, 30)), min_size=1, max_size=50))
def test_int_bucket_matches_oracle(values):
    got = int_bucket(np.array(values, dtype=np.int64))
    assert got.dtype == np.uint64
    assert [int(b) for b in got] == [int_bucket_py(v) for v in values]


def test_int_buckets_keep_small_large_and_missing_apart():
    small = np.arange(-1000, 3, dtype=np.int64)
    large = np.array([3, 4, 7, 8, 20, 10**6, 2**63 - 1], dtype=np.int64)
    buckets = int_bucket(np.concatenate([small, large, [MISSING_INT]]))
    small_b, large_b, missing_b = buckets[: len(small)], buckets[len(small) : -1], buckets[-1]
    assert len(set(small_b.tolist())) == len(small)  # every small value is its own bucket
    assert not set(small_b.tolist()) & set(large_b.tolist())
    assert missing_b == INT_MISSING_BUCKET and missing_b not in set(buckets[:-1].tolist())
    assert np.all(np.diff(large_b.astype(np.int64)) >= 0)  # monotone above 2
    assert int_bucket(np.array([[3, 7], [8, 2]])).shape == (2, 2)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, NUM_FIELDS), st.lists(st.one_of(U64, st.sampled_from([0, 1, 256, M64])), max_size=20))
def test_field_ids_match_oracle(field, values):
    got = field_ids(field, np.array(values, dtype=np.uint64))
    assert [int(i) for i in got] == [field_id_py(field, v) for v in values]


def test_same_value_in_different_fields_gives_different_ids():
    values = np.array([0, 1, 2**63, M64, int(INT_MISSING_BUCKET)], dtype=np.uint64)
    per_field = np.stack([field_ids(f, values) for f in range(NUM_FIELDS + 1)])  # (40, 5)
    for j in range(len(values)):
        assert len(set(per_field[:, j].tolist())) == NUM_FIELDS + 1
    with pytest.raises(ValueError, match="field 40"):
        field_ids(NUM_FIELDS + 1, values)
    with pytest.raises(ValueError):
        field_ids(-1, values)


def test_example_ids_columns_are_field_ids_and_bias():
    rng = np.random.default_rng(1)
    ints = rng.integers(-3, 10**5, size=(50, NUM_INT_FIELDS))
    ints[rng.random(ints.shape) < 0.2] = MISSING_INT
    cats = rng.integers(0, 2**64, size=(50, NUM_CAT_FIELDS), dtype=np.uint64)
    cats[rng.random(cats.shape) < 0.2] = MISSING_CAT
    ids = example_ids(ints, cats)
    assert ids.shape == (50, NUM_FIELDS + 1) and ids.dtype == np.uint64
    assert np.all(ids[:, -1] == BIAS_ID)
    for f in range(NUM_INT_FIELDS):
        assert np.array_equal(ids[:, f], field_ids(f, int_bucket(ints[:, f])))
    for c in range(NUM_CAT_FIELDS):
        assert np.array_equal(ids[:, NUM_INT_FIELDS + c], field_ids(NUM_INT_FIELDS + c, cats[:, c]))
    # Each field has its own "missing" id.
    all_missing = example_ids(np.full((1, 13), MISSING_INT), np.full((1, 26), MISSING_CAT, dtype=np.uint64))
    assert len(set(all_missing[0].tolist())) == NUM_FIELDS + 1
    with pytest.raises(ValueError):
        example_ids(ints[:, :12], cats)


CAT_STRINGS = st.one_of(
    st.text(alphabet="0123456789abcdefABCDEFgx \t_-é", max_size=20),  # mostly hex, some almost-hex
    # numpy str drops trailing NULs; text no reader makes (lone surrogates) is left to the tests of bytes below
    st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=6),
    st.sampled_from(["", "0", "ffffffffffffffff"]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(CAT_STRINGS, max_size=30))
def test_cat_values_match_oracle(strings):
    got = cat_values(np.array(strings, dtype=object))
    assert got.dtype == np.uint64 and got.shape == (len(strings),)
    assert [int(v) for v in got] == [cat_value_py(s) for s in strings]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=8).map(lambda b: b.rstrip(b"\0")), max_size=30))
def test_cat_values_of_any_bytes_are_those_of_their_text_read_with_surrogate_escapes(cells):
    """A cell hashes as its bytes in the file, whether a reader passes them as bytes (Criteo's) or as text
    decoded with surrogate escapes (the csv module's): UTF-8 or not, the two agree, with the oracle's."""
    as_bytes = cat_values(np.array(cells, dtype="S8"))
    as_text = cat_values(np.array([c.decode("utf-8", "surrogateescape") for c in cells], dtype=object))
    assert as_bytes.tolist() == as_text.tolist() == [cat_value_py(c) for c in cells]


def test_cat_values_specific_strings_and_shapes():
    strings = np.array(
        [
            ["68fd1e64", "", "0"],
            ["FFFFFFFFFFFFFFFF", "fffffffffffffffe", "0x1f"],
            ["abcdef0123456789a", "68fd1e64", "é"],
        ]
    )
    got = cat_values(strings)
    assert got.shape == (3, 3)
    assert got[0, 0] == 0x68FD1E64 == got[2, 1]
    assert got[0, 1] == MISSING_CAT and got[0, 2] == 0
    assert got[1, 0] != MISSING_CAT  # the reserved number is hashed like a non-hex string
    assert got[1, 1] == 2**64 - 2
    assert [int(v) for v in got.ravel()] == [cat_value_py(s) for s in strings.ravel().tolist()]
    assert cat_values(np.array(["a\ud800"], dtype=object))[0] == cat_value_py(b"a\xed\xa0\x80")  # no reader's text
    assert cat_values(np.array([], dtype=str)).shape == (0,)
    assert np.all(cat_values(np.array(["", ""])) == MISSING_CAT)


def test_a_blank_string_is_missing_as_an_empty_one_in_both_kinds():
    """Whitespace only, by str.isspace of the text (what str.strip() strips: \\x1c, U+00A0, U+3000 too), is
    MISSING_CAT; a string with anything else in it is a value of its own."""
    blank = [" ", "  ", "\t", " \r\n", "\x1c", "\u00a0", "\u3000 ", "\u2003\x85"]
    other = ["", " a", "\u00a0x", "\u200b", "0 ", "\udc80 "]  # U+200B is no whitespace to str.isspace
    strings = np.array(blank + other)
    cells = np.array([s.encode("utf-8", "surrogateescape") for s in blank + other])
    want = [True] * len(blank) + [False] * len(other)
    assert blank_strings(strings).tolist() == want == blank_strings(cells).tolist()
    assert all(s.isspace() == w for s, w in zip(blank + other, want))
    assert blank_strings(strings.reshape(2, 7)).shape == (2, 7) and blank_strings(np.array([], "S")).shape == (0,)
    for values in (cat_values(strings), cat_values(cells)):
        assert (values[: len(blank)] == MISSING_CAT).all() and (values[len(blank) + 1 :] != MISSING_CAT).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=6).map(lambda b: b.rstrip(b"\0")) | st.text(" \t\x1c\x85\xa0\u3000a", max_size=4)
                .map(lambda t: t.encode()), max_size=30))  # fmt: skip
def test_blank_strings_match_str_isspace(cells):
    text = [c.decode("utf-8", "surrogateescape") for c in cells]
    want = [t.isspace() for t in text]
    assert blank_strings(np.array(cells, dtype="S")).tolist() == want == blank_strings(np.array(text, "U")).tolist()


def space_id_py(space: int, value: int) -> int:
    salt_index = space + 1 + (space >= NUM_FIELDS)  # the bias's salt index NUM_FIELDS + 1 is skipped
    return mix64_py(mix64_py(value) ^ ((salt_index * 0x9E3779B97F4A7C15) & M64))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 200), st.lists(st.one_of(U64, st.sampled_from([0, 1, 256, M64])), max_size=10))
def test_space_ids_match_oracle(space, values):
    got = space_ids(space, np.array(values, dtype=np.uint64))
    assert [int(i) for i in got] == [space_id_py(space, v) for v in values]


def test_space_ids_are_field_ids_below_39_and_never_the_bias_salt():
    values = np.array([0, 7, M64], dtype=np.uint64)
    for f in range(NUM_FIELDS):
        np.testing.assert_array_equal(space_ids(f, values), field_ids(f, values))
    zeros = np.zeros(1, np.uint64)
    assert BIAS_ID not in {int(space_ids(s, zeros)[0]) for s in range(200)}
    assert space_ids(NUM_FIELDS, zeros)[0] == space_id_py(NUM_FIELDS, 0) != BIAS_ID
    with pytest.raises(ValueError, match="id space -1"):
        space_ids(-1, zeros)


def test_dense_features_are_log1p_of_present_nonnegative_ints():
    ints = np.array([[0, 1, -5, MISSING_INT, 1000]], dtype=np.int64)
    np.testing.assert_allclose(dense_features(ints), [[0, np.log(2), 0, 0, np.log(1001)]], rtol=1e-6)

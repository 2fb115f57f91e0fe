"""Tests for worker/encode.py against per-cell Python oracles of its docstring: bags (empty cells, repeats,
truncation, weights, raw ids, id spaces), numeric transforms, bucket edges, and bad examples left out."""

import numpy as np
import pytest

from worker.cells import float_values, int_values, raw_ids
from worker.encode import encode, encode_examples
from worker.features import BIAS_ID, MISSING_CAT, MISSING_INT, cat_values, int_bucket, space_ids
from worker.models.spec import BIAS_FIELD
from worker.schema import Schema, TableSchema
from worker.schema_columns import Column


def schema_of(*columns: Column) -> Schema:
    return Schema("csv", ",", "y", tuple(columns), {"t": TableSchema(4)}, "t")


def cat(name, source=None, space=None, **kw):
    return Column(name, source or name, "categorical", "t", None if kw.get("ids") == "raw" else space or name, **kw)


def bag(name, source=None, space=None, kind="multi_hot", **kw):
    return Column(name, source or name, kind, "t", None if kw.get("ids") == "raw" else space or name, **kw)


def num(name, transform, source=None, **kw):
    sparse = transform in ("bucketize", "log_buckets")
    return Column(name, source or name, "numeric", "t" if sparse else None, name if sparse else None,
                  transform=transform, **kw)  # fmt: skip


def value_py(token: str) -> int:
    return int(cat_values(np.array([token]))[0])


def bag_py(cell: str, sep: str, max_length: int, weighted: bool):
    """(tokens, weights, cut) of one cell, as the module docstring says."""
    tokens = [t for t in cell.split(sep) if t]
    cut = len(tokens) > max_length
    tokens = tokens[:max_length]
    if not weighted:
        return tokens, None, cut
    pairs = [t.rpartition(":") for t in tokens]
    return [p[0] for p in pairs], [float(p[2]) for p in pairs], cut


def test_fields_in_schema_order_with_the_bias_last_and_no_dense():
    s = schema_of(cat("b"), cat("a"))
    b = encode(s, np.array([1, 0], np.float32), {"a": np.array(["x", ""]), "b": np.array(["x", "y"])})
    assert list(b.fields) == ["b", "a", BIAS_FIELD] and b.dense is None
    assert b.fields[BIAS_FIELD].ids.tolist() == [BIAS_ID, BIAS_ID]
    assert b.fields["a"].ids[1] == space_ids(1, np.array([MISSING_CAT]))[0]  # an empty cell: the missing value
    assert b.fields["b"].ids[0] == space_ids(0, cat_values(np.array(["x"])))[0] != b.fields["a"].ids[0]


@pytest.mark.parametrize("as_bytes", [False, True])
@pytest.mark.parametrize("kind", ["multi_hot", "weighted"])
def test_bags_match_the_oracle(kind, as_bytes):
    rng = np.random.default_rng(3)
    weighted = kind == "weighted"
    words = ["a", "b", "é", "0x1", "ff", "long-token"]
    cells = []
    for _ in range(300):
        k = int(rng.integers(0, 9))
        tokens = [f"{rng.choice(words)}:{rng.normal():.3f}" if weighted else str(rng.choice(words)) for _ in range(k)]
        tokens += [""] * int(rng.integers(0, 2))  # empty tokens, dropped
        rng.shuffle(tokens)
        cells.append(";".join(tokens))
    col = bag("h", kind=kind, separator=";", max_length=5, space="shared")
    arr = np.array(cells)
    if as_bytes:
        arr = np.array([c.encode() for c in cells])
    out = encode_examples(schema_of(col), np.zeros(len(cells), np.float32), {"h": arr})
    got = out.batch.fields["h"]
    assert len(out.bad) == 0
    expected = [bag_py(c, ";", 5, weighted) for c in cells]
    assert got.lengths().tolist() == [len(t) for t, _, _ in expected]
    flat = [t for t, _, _ in expected for t in t]
    np.testing.assert_array_equal(got.ids, space_ids(0, cat_values(np.array(flat, dtype=str))))
    if weighted:
        np.testing.assert_array_equal(got.weights, np.array([w for _, ws, _ in expected for w in ws], np.float32))
    else:
        assert got.weights is None
    assert out.truncated_bags == sum(cut for _, _, cut in expected) > 0


def test_bag_edge_cases():
    col = bag("h", max_length=2)
    cells = np.array(["", "|||", "a|a|a", "b", "a|b|c|d"])
    out = encode_examples(schema_of(col), np.zeros(5, np.float32), {"h": cells})
    h = out.batch.fields["h"]
    a, b = space_ids(0, cat_values(np.array(["a", "b"])))
    assert h.offsets.tolist() == [0, 0, 0, 2, 3, 5] and h.ids.tolist() == [a, a, b, a, b]
    assert out.truncated_bags == 2
    empty = encode_examples(schema_of(col), np.zeros(0, np.float32), {"h": np.array([], dtype=str)})
    assert len(empty.batch) == 0 and empty.batch.fields["h"].offsets.tolist() == [0]


@pytest.mark.parametrize("kind", ["U", "S"])
def test_a_blank_cell_is_missing_as_an_empty_one(kind):
    """Whitespace only is no value: a categorical cell's missing id (hashed or raw), no token of a bag."""
    s = schema_of(cat("a"), cat("r", ids="raw"), bag("h"), bag("w", kind="weighted"))
    cells = {"a": ["", "  ", "\t", "x"], "r": ["", "  ", "\t", "7"], "h": ["", "  ", "x| |\t|y", "x|y"],
             "w": ["", " ", "x:2| ", "x:2"]}  # fmt: skip
    b = encode(s, np.zeros(4, np.float32), {k: np.array(v, dtype=kind) for k, v in cells.items()})
    missing = space_ids(0, np.array([MISSING_CAT]))[0]
    assert b.fields["a"].ids.tolist() == [missing] * 3 + [space_ids(0, cat_values(np.array(["x"])))[0]]
    assert b.fields["r"].ids.tolist() == [2**64 - 1] * 3 + [7]
    assert (
        b.fields["h"].offsets.tolist() == [0, 0, 0, 2, 4]
        and b.fields["h"].ids[2:].tolist() == b.fields["h"].ids[:2].tolist()
    )
    assert b.fields["w"].offsets.tolist() == [0, 0, 0, 1, 2] and b.fields["w"].weights.tolist() == [2, 2]


@pytest.mark.parametrize("ids", ["hashed", "raw"])
@pytest.mark.parametrize("kind", ["U", "S"])
def test_a_weighted_token_of_a_blank_id_is_bad_as_one_of_an_empty_id(kind, ids):
    """A bag has no missing id: a token whose id is whitespace only has no id, as ':2' has none, so its example is
    bad, not one holding the missing id with that weight."""
    s = schema_of(bag("w", kind="weighted", ids=ids))
    cells = [":2", " :2", "7:1|\t:2", "\u00a0:1", "7:1"]
    arr = np.array([c.encode() for c in cells]) if kind == "S" else np.array(cells)
    out = encode_examples(s, np.zeros(5, np.float32), {"w": arr})
    assert out.bad.tolist() == [0, 1, 2, 3]
    shown = [":2", " :2", "\t:2", "\u00a0:1"]
    assert out.problems == [f"column 'w' has the token {t!r}, expected id:weight with a finite weight" for t in shown]
    assert out.batch.fields["w"].weights.tolist() == [1.0]


def test_id_spaces_decide_which_values_share_ids():
    s = schema_of(cat("a", space="item"), bag("b", space="item"), cat("c"), cat("d", source="a", space="item"))
    b = encode(
        s, np.zeros(2, np.float32), {"a": np.array(["x", "y"]), "b": np.array(["y|x", ""]), "c": np.array(["x", "y"])}
    )
    assert s.id_spaces() == {"item": 0, "c": 1}
    ids = {name: bags.ids.tolist() for name, bags in b.fields.items()}
    assert ids["b"] == [ids["a"][1], ids["a"][0]]  # one space: one value, one id
    assert ids["d"] == ids["a"]  # two fields reading one column
    assert ids["c"][0] != ids["a"][0] and ids["c"] == space_ids(1, cat_values(np.array(["x", "y"]))).tolist()


def test_raw_ids():
    s = schema_of(cat("u", ids="raw"), bag("v", ids="raw", separator=","))
    cells = {
        "u": np.array(["0", "007", "18446744073709551614", ""]),
        "v": np.array(["1,2", "", "3", "18446744073709551614"]),
    }
    b = encode(s, np.zeros(4, np.float32), cells)
    assert b.fields["u"].ids.tolist() == [0, 7, 2**64 - 2, 2**64 - 1]  # empty: the missing id
    assert b.fields["v"].ids.tolist() == [1, 2, 3, 2**64 - 2]
    ids, ok = raw_ids(np.array([b"12", b"18446744073709551615", b"1e3", b"-1", b" 1", b"123456789012345678901", b""]))
    assert ok.tolist() == [True, False, False, False, False, False, True] and ids[0] == 12
    assert raw_ids(np.array(["١٢"]))[1].tolist() == [False]  # other scripts' digits are not decimal ids
    for kind in ("U", "S"):  # leading zeros say nothing: a number below 2**64 - 1 however many there are
        padded = np.array(["0" * 23 + "1", "0" * 5 + "18446744073709551614", "0" * 5 + "18446744073709551615", "0" * 25],
                          dtype=kind)  # fmt: skip
        ids, ok = raw_ids(padded)
        assert ok.tolist() == [True, True, False, True] and ids[[0, 1, 3]].tolist() == [1, 2**64 - 2, 0], kind
    b = encode(s, np.zeros(2, np.float32), {"u": np.array(["1", "2"]), "v": np.array(["", ","])})
    assert b.fields["v"].offsets.tolist() == [0, 0, 0] and len(b.fields["v"].ids) == 0


def test_numeric_transforms():
    s = schema_of(
        num("l", "log", source="x"),
        num("n", "none", source="x"),
        num("z", "standardize", source="x", mean=1.0, std=2.0),
        num("i", "log_buckets", source="k"),
    )
    cells = {"x": np.array(["3", "", "-2.5", "1e3"]), "k": np.array(["5", "", "-1", "2"])}
    b = encode(s, np.zeros(4, np.float32), cells)
    x = np.array([3, 0, -2.5, 1000])
    expected = np.stack([np.log1p(np.maximum(x, 0)), x, np.where([1, 0, 1, 1], (x - 1) / 2, 0)], axis=1)
    np.testing.assert_allclose(b.dense, expected.astype(np.float32), rtol=1e-6)
    assert b.dense.dtype == np.float32 and list(b.fields) == ["i", BIAS_FIELD]
    buckets = int_bucket(np.array([5, MISSING_INT, -1, 2]))
    np.testing.assert_array_equal(b.fields["i"].ids, space_ids(0, buckets))


def test_bucketize_edges():
    col = num("a", "bucketize", boundaries=(1.0, 10.0, 100.0))
    cells = np.array(["-5", "1", "0.999", "9.99", "10", "100", "1e9", ""])
    b = encode(schema_of(col), np.zeros(len(cells), np.float32), {"a": cells})
    buckets = np.array([0, 1, 0, 1, 2, 3, 3, MISSING_CAT], dtype=np.uint64)  # b = how many boundaries are <= x
    np.testing.assert_array_equal(b.fields["a"].ids, space_ids(0, buckets))


def test_standardize_needs_its_stats():
    with pytest.raises(ValueError, match="standardize column 'z' has no mean and std"):
        encode(schema_of(num("z", "standardize")), np.zeros(1, np.float32), {"z": np.array(["1"])})


def test_bad_examples_are_left_out_with_their_first_problem():
    s = schema_of(
        bag("w", kind="weighted"),
        cat("r", ids="raw"),
        num("i", "log_buckets"),
        num("x", "log"),
    )
    cells = {
        "w": np.array(["a:1", "a:x|b:nan", "a:1", "a:1", "a:1", "b", ":2", "a:1"]),
        "r": np.array(["1", "2", "3x", "4", "5", "6", "7", "-8"]),
        "i": np.array(["1", "2", "3", "1.5", "5", "6", "7", "8"]),
        "x": np.array(["1", "2", "3", "4", "inf", "6", "7", "8"]),
    }
    labels = np.arange(8, dtype=np.float32) % 2
    out = encode_examples(s, labels, cells)
    assert out.bad.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert out.problems == [
        "column 'w' has the token 'a:x', expected id:weight with a finite weight",
        "column 'r' is '3x', expected a decimal id below 2**64 - 1",
        "integer column 'i' is '1.5', expected empty, NA (missing) or a base-10 integer in "
        "(-9223372036854775808, 9223372036854775807]",
        "numeric column 'x' is 'inf', expected a finite float32 number (|x| <= 3.4e38) or empty",
        "column 'w' has the token 'b', expected id:weight with a finite weight",
        "column 'w' has the token ':2', expected id:weight with a finite weight",
        "column 'r' is '-8', expected a decimal id below 2**64 - 1",
    ]
    assert len(out.batch) == 1 and out.batch.labels.tolist() == [0.0] and out.batch.fields["r"].ids.tolist() == [1]
    with pytest.raises(ValueError, match="example 1: column 'w' has the token 'a:x'"):
        encode(s, labels, cells)


def test_bad_bag_ids_and_truncated_counts_are_of_the_kept_examples():
    col = bag("v", ids="raw", max_length=1)
    out = encode_examples(schema_of(col), np.zeros(3, np.float32), {"v": np.array(["1|2", "x|3", "4|y"])})
    assert out.bad.tolist() == [1] and out.problems == [
        "column 'v' has the id 'x', expected a decimal id below 2**64 - 1"
    ]
    assert out.batch.fields["v"].ids.tolist() == [1, 4] and out.truncated_bags == 2  # 'y' was cut unread


def test_number_parsers():
    values, missing, ok = float_values(np.array(["1.5", "", " ", "x", "-inf", "2e3"]))
    assert values.tolist() == [1.5, 0, 0, 0, 0, 2000] and missing.tolist() == [0, 1, 1, 0, 0, 0]
    assert ok.tolist() == [1, 1, 1, 0, 0, 1]
    values, ok = int_values(np.array([[b"12", b""], [b"-9223372036854775808", b"9223372036854775807"]]))
    assert values.tolist() == [[12, int(MISSING_INT)], [int(MISSING_INT), 2**63 - 1]]
    assert ok.tolist() == [[True, True], [False, True]]
    values, ok = int_values(np.array(["3", "1.0", "99999999999999999999"]))
    assert values.tolist() == [3, int(MISSING_INT), int(MISSING_INT)] and ok.tolist() == [True, False, False]
    values, missing, ok = float_values(np.array(["nan", "NA", "null", "None", "?", "N/A", "inf"]))  # markers
    assert missing.tolist() == [1, 1, 1, 1, 1, 1, 0] and ok.tolist() == [1, 1, 1, 1, 1, 1, 0]  # inf: not finite
    assert float_values(np.array(["NaN", "2"]))[1].tolist() == [True, False]  # the vectorized path too
    assert float_values(np.array(["-nan", "NA"]))[1].tolist() == [True, True]  # either path: alike


def test_missing_source_and_shape_are_named():
    with pytest.raises(ValueError, match="column 'a' reads 'a', which is not among the cells"):
        encode(schema_of(cat("a")), np.zeros(1, np.float32), {})
    with pytest.raises(ValueError, match=r"cells of 'a' have shape \(2,\), expected \(1,\)"):
        encode(schema_of(bag("a")), np.zeros(1, np.float32), {"a": np.array(["x", "y"])})


def test_a_numeric_feature_past_float32s_range_is_a_bad_example_not_inf():
    schema = Schema(
        format="csv", delimiter=",", label="label",
        columns=(Column("x", "x", "numeric", transform="none"),), tables={}, bias_table="t",
    )  # fmt: skip
    out = encode_examples(schema, np.array([0, 1, 0], np.float32), {"x": np.array(["1.5", "1e39", "-2"])})
    assert out.bad.tolist() == [1] and "expected a finite float32 number (|x| <= 3.4e38)" in out.problems[0]
    np.testing.assert_array_equal(out.batch.dense[:, 0], [1.5, -2.0])


def test_a_numeric_cell_past_float32_is_bad_in_every_pass():
    """1e39 parses as a finite float64 but is inf in the float32 features: the statistics pass and training read
    it alike, as a bad cell (the largest float32 passes)."""
    from worker.cells import float_values

    values, missing, ok = float_values(np.array(["1e39", "-1e39", "3.4e38", "", "inf", "2"]))
    assert ok.tolist() == [False, False, True, True, False, True]
    assert values.tolist()[:3] == [0.0, 0.0, 3.4e38] and missing.tolist()[3]


@pytest.mark.parametrize("kind", ["U", "S"])
def test_weighted_bags_all_empty_in_a_call_are_empty_bags(kind):
    """A chunk whose every weighted cell is empty (or separators alone) holds empty bags: it failed with numpy's
    "zero-size array to reduction operation maximum", which stopped a run on a file whose weighted column was
    empty in a chunk."""
    s = schema_of(bag("w", kind="weighted", pooling="mean"), bag("r", kind="weighted", ids="raw", source="w"))
    b = encode(s, np.zeros(3, np.float32), {"w": np.array(["", "|", "||"], dtype=kind)})
    for name in ("w", "r"):
        bags = b.fields[name]
        assert bags.ids.tolist() == [] and bags.offsets.tolist() == [0, 0, 0, 0] and bags.weights.tolist() == []
        assert bags.weights.dtype == np.float32

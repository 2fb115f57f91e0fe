"""worker/batch.py: table_ids and its hash-table dedup against np.unique, bags built from valid parts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from worker.batch import Bags, Batch, rebatch, table_ids, unique_inverse


@pytest.mark.parametrize("draws,high", [(0, 10), (1, 10), (40_000, 50), (40_000, 1 << 62), (5_000, 3_000)])
def test_unique_inverse_equals_np_unique(draws, high):
    ids = np.random.default_rng(draws).integers(0, high, draws, dtype=np.uint64)
    ids[: draws // 3] *= np.uint64(0x9E3779B97F4A7C15)  # ids over the whole uint64 range too
    uniq, inverse = unique_inverse(ids)
    want_uniq, want_inverse = np.unique(ids, return_inverse=True)
    np.testing.assert_array_equal(uniq, want_uniq)
    np.testing.assert_array_equal(inverse, want_inverse.ravel())
    assert inverse.dtype == np.int64


def _batch(rng: np.random.Generator, n: int) -> Batch:
    lengths = rng.integers(0, 4, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    bag = Bags(rng.integers(0, 30, offsets[-1]).astype(np.uint64), offsets)
    weighted = Bags(rng.integers(0, 30, n).astype(np.uint64), np.arange(n + 1), np.full(n, 0.5, np.float32))
    fields = {"a": Bags.one_per_example(rng.integers(0, 30, n)), "bag": bag, "w": weighted}
    return Batch(rng.integers(0, 2, n).astype(np.float32), fields)


def test_table_ids_counts_shows_and_clicks_per_unique_id():
    rng = np.random.default_rng(3)
    batch = _batch(rng, 200)
    got = table_ids(batch, {"a": "t", "bag": "t", "w": "u"})["t"]
    ids = np.concatenate([batch.fields["a"].ids, batch.fields["bag"].ids])
    labels = np.concatenate([batch.labels, np.repeat(batch.labels, np.diff(batch.fields["bag"].offsets))])
    np.testing.assert_array_equal(got.uniq, np.unique(ids))
    for name in ("a", "bag"):
        np.testing.assert_array_equal(got.uniq[got.index[name]], batch.fields[name].ids)
    for k, i in enumerate(got.uniq):
        assert got.shows[k] == np.sum(ids == i) and got.clicks[k] == np.sum(labels[ids == i])


def test_one_per_example_tells_categorical_fields_from_bags():
    rng = np.random.default_rng(4)
    batch = _batch(rng, 50)
    assert batch.fields["a"].is_one_per_example()
    assert not batch.fields["w"].is_one_per_example()  # weighted
    assert not Bags(np.arange(2, dtype=np.uint64), [0, 0, 2]).is_one_per_example()  # 2 ids for 2 examples


def test_rebatch_slices_and_joins_parts_into_exact_batches():
    rng = np.random.default_rng(5)
    parts = [_batch(rng, n) for n in (7, 30, 1, 12)]
    whole = Batch.concat(parts)
    got = list(rebatch(parts, 16))
    assert [len(b) for b in got] == [16, 16, 16, 2]
    joined = Batch.concat(got)
    for name, bags in whole.fields.items():
        np.testing.assert_array_equal(joined.fields[name].ids, bags.ids)
        np.testing.assert_array_equal(joined.fields[name].offsets, bags.offsets)
    np.testing.assert_array_equal(joined.labels, whole.labels)
    with pytest.raises(ValueError, match="non-decreasing"):
        Bags(np.arange(2, dtype=np.uint64), [0, 2, 1, 2])


def test_the_one_per_bag_hint_is_checked_and_only_taken_where_true():
    from worker.models.numpy_backend import check_inputs
    from worker.models.spec import FieldInput, ModelInputs, ModelSpec, uniform_fields

    spec = ModelSpec("lr", uniform_fields(3, 1), 0, ())
    rows = {"t": np.zeros((5, spec.row_dim("t")), np.float32)}
    n = 3
    single = FieldInput(np.array([0, 4, 2]), np.arange(n + 1), None, True)
    bag_hinted = FieldInput(np.array([0, 1, 2]), np.array([0, 0, 2, 3]), None, True)  # a wrong hint
    fields = {"f0": single, "f1": bag_hinted, "_bias": FieldInput(np.zeros(n, np.int64), np.arange(n + 1))}
    checked = check_inputs(spec, ModelInputs(rows, fields, np.zeros((n, 0), np.float32)), spec.initial_params())
    assert checked["f0"].one_per_bag and not checked["f1"].one_per_bag and checked["_bias"].one_per_bag
    np.testing.assert_array_equal(checked["f1"].offsets, [0, 0, 2, 3])
    out_of_range = {**fields, "f0": FieldInput(np.array([0, 5, 2]), np.arange(n + 1), None, True)}
    with pytest.raises(ValueError, match="index runs from 0 to 5, expected 0 to 4"):
        check_inputs(spec, ModelInputs(rows, out_of_range, np.zeros((n, 0), np.float32)), spec.initial_params())


def test_bags_cut_from_categorical_fields_stay_categorical_and_others_are_checked():
    cat = Bags.one_per_example(np.arange(6))
    assert cat.slice(1, 4).is_one_per_example() and cat.take(np.array([5, 0])).is_one_per_example()
    mixed = Bags(np.arange(4, dtype=np.uint64), [0, 2, 3, 4])
    assert not mixed.is_one_per_example()
    assert mixed.slice(1, 3).is_one_per_example()  # examples 1 and 2 hold one id each
    assert not Bags.concat([cat, mixed]).is_one_per_example()


def test_batches_of_several_files_name_each_examples_file_across_rebatch_and_concat(tmp_path):
    """A directory of a.svm (3 lines) and b.svm read in batches of 4: the batch joining a's last examples to b's
    first names each example's file, and slice, take and concat keep the names (concat of batches of other reads
    gives no file names: no producer mixes reads)."""
    from worker.formats import read_batches
    from worker.schema_builtin import builtin_schema

    (tmp_path / "a.svm").write_text("1 1:1\n0 2:1\n1 3:1\n")
    (tmp_path / "b.svm").write_text("0 4:1\n1 5:1\n")
    a, b = str(tmp_path / "a.svm"), str(tmp_path / "b.svm")
    batches = list(
        read_batches(tmp_path, builtin_schema("libsvm", default_table="t", default_dim=1, libsvm_fields=1), 4)
    )
    assert [[(b_.file_of(i), int(b_.line_nos[i])) for i in range(len(b_))] for b_ in batches] == [
        [(a, 1), (a, 2), (a, 3), (b, 1)],
        [(b, 2)],
    ]
    first = batches[0]
    assert [first.take(np.array([3, 0])).file_of(i) for i in range(2)] == [b, a]
    assert first.slice(3, 4).file_of(0) == b
    assert [Batch.concat([first.slice(3, 4), first.slice(0, 1)]).file_of(i) for i in range(2)] == [b, a]
    other = dataclasses.replace(first.slice(0, 1), file_nos=np.zeros(1, np.int32), files=("c",))  # another read's
    joined = Batch.concat([first.slice(0, 1), other, first.slice(3, 4)])
    assert joined.file_nos is None and joined.files == () and joined.file_of(0) is None
    unnamed = dataclasses.replace(first.slice(0, 1), file_nos=None, files=())  # a part without files
    assert Batch.concat([first, unnamed]).file_of(0) is None

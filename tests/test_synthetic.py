"""Tests for worker/synthetic.py: reproducibility, range slicing, the planted model against a scalar oracle."""

import math
import tracemalloc

import numpy as np
import pytest

from ps.hashing import mix64
from worker.criteo import read_criteo
from worker.features import BIAS_ID, MISSING_CAT, MISSING_INT, NUM_FIELDS, example_ids
from worker.metrics import auc, sigmoid
from worker.synthetic import (
    BLOCK_ROWS,
    DEFAULT_CAT_VOCAB,
    SyntheticConfig,
    SyntheticData,
    write_synthetic_criteo,
    zipf_ranks,
)

M64 = 2**64 - 1


def hashed_normal_py(id_: int, seed: int, stream: int, component: int) -> float:
    """Scalar oracle of the documented hashed normal (module docstring of worker/synthetic.py)."""
    key = int(mix64(np.array([(seed * 0x9E3779B97F4A7C15 + (stream << 32) + component // 2) & M64]))[0])
    h = int(mix64(np.array([id_ ^ key], dtype=np.uint64))[0])
    u, v = (h >> 32) / 2**32, (h & 0xFFFFFFFF) / 2**32
    trig = math.cos if component % 2 == 0 else math.sin
    return math.sqrt(-2 * math.log(1 - u)) * trig(2 * math.pi * v)


def concat(batches):
    return (
        np.concatenate([b.labels for b in batches]),
        np.concatenate([b.ids for b in batches]),
        np.concatenate([b.probs for b in batches]),
    )


def test_same_config_same_rows_and_other_seed_or_range_differs():
    cfg = SyntheticConfig(rows=5000, seed=3)
    a = concat(list(SyntheticData(cfg).batches(1000)))
    b = concat(list(SyntheticData(cfg).batches(1000)))
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    other_seed = SyntheticData(SyntheticConfig(rows=5000, seed=4)).raw(0, 5000)
    assert not np.array_equal(other_seed.ids, a[1])
    later = SyntheticData(cfg).raw(5000, 10000)
    assert not np.array_equal(later.ids, a[1])
    assert np.mean(later.ids[:, :NUM_FIELDS] == a[1][:, :NUM_FIELDS]) < 0.5  # rows are not shifted copies


@pytest.mark.parametrize("batch_size", [1, 999, BLOCK_ROWS, 3 * BLOCK_ROWS + 5])
def test_any_batching_and_range_gives_the_same_rows(batch_size):
    data = SyntheticData(SyntheticConfig(rows=2 * BLOCK_ROWS + 1000))
    whole = data.raw(0, 3 * BLOCK_ROWS)
    start, stop = 100, 2 * BLOCK_ROWS + 1000
    if batch_size == 1:
        start, stop = BLOCK_ROWS - 3, BLOCK_ROWS + 3  # across a block boundary
    batches = list(SyntheticData(data.config).batches(batch_size, start, stop))
    assert sum(len(b) for b in batches) == stop - start
    assert all(len(b) == batch_size for b in batches[:-1])
    labels, ids, probs = concat(batches)
    assert np.array_equal(ids, whole.ids[start:stop])
    assert np.array_equal(labels, whole.labels[start:stop])
    assert np.array_equal(probs, whole.probs[start:stop])
    assert list(data.batches(10, 5, 5)) == []
    with pytest.raises(ValueError):
        data.raw(5, 3)


def test_rows_are_consistent_and_columns_well_formed():
    rows = SyntheticData(SyntheticConfig(rows=20_000)).raw(0, 20_000)
    assert rows.ids.dtype == np.uint64 and rows.ids.shape == (20_000, NUM_FIELDS + 1)
    assert np.array_equal(rows.ids, example_ids(rows.int_values, rows.cat_values))
    assert np.all(rows.ids[:, -1] == BIAS_ID)
    assert set(np.unique(rows.labels).tolist()) == {0.0, 1.0}
    assert 0.07 < np.mean(rows.int_values == MISSING_INT) < 0.13
    cat_missing = np.mean(rows.cat_values == MISSING_CAT, axis=0)
    assert np.all(cat_missing[::4] == 0) and 0.035 < cat_missing[3::4].mean() < 0.065
    present = rows.int_values[rows.int_values != MISSING_INT]
    assert present.min() == -3 and present.max() > 1000  # Criteo-like: I2 reaches -3, heavy tails


def test_interactions_zero_gives_exactly_the_sum_of_hashed_weights():
    cfg = SyntheticConfig(rows=100, seed=7, weight_scale=0.3)
    data = SyntheticData(cfg)
    rows = data.raw(0, 20)
    for i in range(20):
        weights = [cfg.weight_scale * hashed_normal_py(int(x), 7, 0, 0) for x in rows.ids[i, :NUM_FIELDS]]
        logit = data.offset + sum(weights)
        assert rows.probs[i] == pytest.approx(1 / (1 + math.exp(-logit)), rel=1e-6)
    # The offset centers the mean logit of block 0 on cfg.bias.
    block0 = data.raw(0, BLOCK_ROWS)
    assert data.logits(block0.ids).mean() == pytest.approx(cfg.bias, abs=1e-9)


def test_interaction_term_is_the_pairwise_sum_of_hashed_latents():
    cfg = SyntheticConfig(rows=100, seed=1, interactions=0.8, latent_dim=3)
    data = SyntheticData(cfg)
    linear = SyntheticData(SyntheticConfig(rows=100, seed=1))
    ids = data.raw(0, 5).ids
    for row in ids:
        fields = [int(x) for x in row[:NUM_FIELDS]]
        u = [[hashed_normal_py(x, 1, 1, c) * 3**-0.25 for c in range(3)] for x in fields]
        pairs = sum(np.dot(u[f], u[g]) for f in range(NUM_FIELDS) for g in range(f))
        expected = 0.8 * pairs / math.sqrt(NUM_FIELDS * (NUM_FIELDS - 1) / 2)
        got = data.logits(row[None])[0] - data.offset - (linear.logits(row[None])[0] - linear.offset)
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # Over independent ids the term's std is `interactions`; over real rows less, as frequent values repeat.
    fresh = np.random.default_rng(0).integers(0, 2**64, size=(20_000, NUM_FIELDS), dtype=np.uint64)
    term = data.logits(fresh) - linear.logits(fresh) - (data.offset - linear.offset)
    assert term.std() == pytest.approx(0.8, rel=0.05) and abs(term.mean()) < 0.03
    rows = data.raw(0, 20_000).ids
    assert (data.logits(rows) - linear.logits(rows)).std() > 0.3  # visible on real rows too


def test_labels_follow_probs_and_oracle_auc_is_high():
    rows = SyntheticData(SyntheticConfig(rows=100_000)).raw(0, 100_000)
    n, mean_p = len(rows.labels), rows.probs.mean()
    sd = math.sqrt(np.sum(rows.probs * (1 - rows.probs))) / n
    assert abs(rows.labels.mean() - mean_p) < 5 * sd
    assert 0.2 < mean_p < 0.3
    assert auc(rows.labels, rows.probs) > 0.72
    # Calibration: in each probability decile the click rate matches the mean probability.
    edges = np.quantile(rows.probs, np.linspace(0, 1, 11))
    bins = np.clip(np.searchsorted(edges, rows.probs, side="right") - 1, 0, 9)
    for b in range(10):
        sel = bins == b
        assert abs(rows.labels[sel].mean() - rows.probs[sel].mean()) < 0.02


@pytest.mark.parametrize("vocab, exponent", [(1, 1.1), (10, 1.1), (10, 1.0), (10, 0.5), (1000, 1.5)])
def test_zipf_ranks_follow_the_bounded_power_law(vocab, exponent):
    u = (np.arange(200_000) + 0.5) / 200_000  # a uniform grid: frequencies are nearly exact
    ranks = zipf_ranks(u[:, None], np.array([vocab]), exponent)[:, 0]
    assert ranks.min() >= 0 and ranks.max() <= vocab - 1
    x = np.arange(1, vocab + 2, dtype=np.float64)
    if exponent == 1.0:
        cdf = np.log(x) / np.log(vocab + 1)
    else:
        cdf = (x ** (1 - exponent) - 1) / ((vocab + 1) ** (1 - exponent) - 1)
    expected = np.diff(cdf)
    got = np.bincount(ranks, minlength=vocab) / len(ranks)
    assert np.allclose(got, expected, atol=2e-5)


def test_a_billion_values_per_field_needs_no_tables():
    cfg = SyntheticConfig(rows=BLOCK_ROWS, cat_vocab=(10**9,) * 26, vocab_scale=1000.0, zipf_exponent=1.05)
    tracemalloc.start()
    rows = SyntheticData(cfg).raw(0, BLOCK_ROWS)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200 * 2**20
    assert len(np.unique(rows.cat_values)) > 0.5 * rows.cat_values.size  # mostly distinct values
    ranks = zipf_ranks(np.array([[0.0, 0.5, 1 - 2**-53]]), np.array([10**12]), 1.05)
    assert ranks.min() >= 0 and ranks.max() < 10**12 and ranks[0, 2] > 10**9


def test_written_file_reads_back_to_the_same_ids(tmp_path):
    cfg = SyntheticConfig(rows=3000, seed=5)
    path = tmp_path / "synthetic.txt"
    write_synthetic_criteo(path, cfg, 1000, 3000)
    labels, ids, _ = concat(list(SyntheticData(cfg).batches(512, 1000, 3000)))
    read = list(read_criteo(path, 700))
    assert np.array_equal(np.concatenate([b.ids for b in read]), ids)
    assert np.array_equal(np.concatenate([b.labels for b in read]), labels)


def test_config_validation_and_defaults():
    cfg = SyntheticConfig(rows=10)
    assert len(cfg.cat_vocab) == 26 and cfg.cat_vocab == DEFAULT_CAT_VOCAB
    assert min(cfg.cat_vocab) <= 100 and max(cfg.cat_vocab) >= 10**5
    assert SyntheticConfig(rows=1, vocab_scale=1e-9).vocab_sizes().min() == 1
    for bad in (dict(cat_vocab=(10,) * 25), dict(cat_vocab=(0,) * 26), dict(seed=-1), dict(int_missing=2.0)):
        with pytest.raises(ValueError):
            SyntheticConfig(rows=10, **bad)
    assert sigmoid(np.array([0.0]))[0] == 0.5

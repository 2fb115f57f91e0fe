"""Tests for worker/synthetic.py: reproducibility, range slicing, the planted model (history included) against
scalar oracles, the written files, the schema text, the small-data regime."""

import csv
import dataclasses
import math
import tomllib
import tracemalloc

import numpy as np
import pytest

from ps.hashing import mix64
from worker.batch import Bags
from worker.features import (
    BIAS_ID,
    MISSING_CAT,
    MISSING_INT,
    NUM_FIELDS,
    NUM_INT_FIELDS,
    cat_values,
    dense_features,
    example_ids,
    int_bucket,
    space_ids,
)
from worker.metrics import auc, sigmoid
from worker.models.spec import BIAS_FIELD
from worker.synthetic import (
    BLOCK_ROWS,
    DEFAULT_CAT_VOCAB,
    FIELD_NAMES,
    HISTORY_FIELD,
    SMALL_DATA_ROWS,
    SyntheticConfig,
    SyntheticData,
    small_data_config,
    zipf_ranks,
)
from worker.synthetic_files import schema_text, write_synthetic

M64 = 2**64 - 1


def hashed_normal_py(id_: int, seed: int, stream: int, component: int) -> float:
    """Scalar oracle of the documented hashed normal (module docstring of worker/synthetic.py)."""
    key = int(mix64(np.array([(seed * 0x9E3779B97F4A7C15 + (stream << 32) + component // 2) & M64]))[0])
    h = int(mix64(np.array([id_ ^ key], dtype=np.uint64))[0])
    u, v = (h >> 32) / 2**32, (h & 0xFFFFFFFF) / 2**32
    trig = math.cos if component % 2 == 0 else math.sin
    return math.sqrt(-2 * math.log(1 - u)) * trig(2 * math.pi * v)


def key_py(seed: int, stream: int, index: int) -> int:
    return int(mix64(np.array([(seed * 0x9E3779B97F4A7C15 + (stream << 32) + index) & M64], dtype=np.uint64))[0])


def batch_ids(batch) -> np.ndarray:
    """The (n, 40) ids matrix of a Batch's one-id fields I1..C26 and the bias, checking they hold one id each."""
    names = [*FIELD_NAMES, BIAS_FIELD]
    for name in names:
        assert np.array_equal(batch.fields[name].offsets, np.arange(len(batch) + 1))
    return np.stack([batch.fields[name].ids for name in names], axis=1)


def concat(batches):
    return (
        np.concatenate([b.labels for b in batches]),
        np.concatenate([batch_ids(b) for b in batches]),
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


def parse_ints(cells: list[str]) -> list[int]:
    return [int(MISSING_INT) if cell == "" else int(cell) for cell in cells]


def test_written_criteo_file_reads_back_to_the_same_ids(tmp_path):
    cfg = SyntheticConfig(rows=3000, seed=5)
    path = tmp_path / "synthetic.txt"
    write_synthetic(path, cfg, 1000, 3000)
    labels, ids, _ = concat(list(SyntheticData(cfg).batches(512, 1000, 3000)))
    rows = [line.split("\t") for line in path.read_text().splitlines()]  # the Criteo grammar, read by hand
    assert len(rows) == 2000 and all(len(row) == 40 for row in rows)
    ints = np.array([parse_ints(row[1:14]) for row in rows], dtype=np.int64)
    assert np.array_equal(example_ids(ints, cat_values(np.array([row[14:] for row in rows]))), ids)
    assert np.array_equal(np.array([float(row[0]) for row in rows]), labels)


def test_config_validation_and_defaults():
    cfg = SyntheticConfig(rows=10)
    assert len(cfg.cat_vocab) == 26 and cfg.cat_vocab == DEFAULT_CAT_VOCAB
    assert min(cfg.cat_vocab) <= 100 and max(cfg.cat_vocab) >= 10**5
    assert SyntheticConfig(rows=1, vocab_scale=1e-9).vocab_sizes().min() == 1
    assert cfg.history == 0 and cfg.history_max_length >= 1 and cfg.history_vocab >= 1
    for bad in (
        dict(cat_vocab=(10,) * 25),
        dict(cat_vocab=(0,) * 26),
        dict(seed=-1),
        dict(int_missing=2.0),
        dict(history=-1.0),
        dict(history=math.nan),
        dict(history_vocab=0),
        dict(history_max_length=0),
    ):
        with pytest.raises(ValueError):
            SyntheticConfig(rows=10, **bad)
    assert sigmoid(np.array([0.0]))[0] == 0.5


# Fingerprints of rows [0, 3 * BLOCK_ROWS) as generated before the history existed: (config, sum of mix64(ids)
# mod 2**64, clicks, sum of the clicked rows' indices, sum of probs, offset). Data without history keeps them.
TODAYS_DATA = [
    (SyntheticConfig(rows=10_000, seed=3), 0x3DD62A94C8BEC5B4, 3095, 18956058, 3102.4313439735433, -2.4231576978576594),
    (
        SyntheticConfig(rows=10_000, seed=1, interactions=0.8, latent_dim=3, vocab_scale=5.0, zipf_exponent=1.1),
        0xB8FDEF66D4AF2E97,
        3222,
        19792826,
        3253.0403053695222,
        -1.5297282767602716,
    ),
]


@pytest.mark.parametrize("cfg, id_sum, clicks, clicked_rows, prob_sum, offset", TODAYS_DATA, ids=["linear", "pairs"])
def test_data_without_history_is_unchanged(cfg, id_sum, clicks, clicked_rows, prob_sum, offset):
    data = SyntheticData(cfg)
    batches = list(data.batches(5000, 0, 3 * BLOCK_ROWS))
    labels, ids, probs = concat(batches)
    assert int(mix64(ids.ravel()).sum(dtype=np.uint64)) == id_sum
    assert int(labels.sum()) == clicks and int(np.flatnonzero(labels).sum()) == clicked_rows
    assert probs.sum() == pytest.approx(prob_sum, rel=1e-12) and data.offset == pytest.approx(offset, rel=1e-12)
    raw = data.raw(0, 3 * BLOCK_ROWS)
    assert np.array_equal(ids, example_ids(raw.int_values, raw.cat_values)) and raw.history_values is None
    assert np.array_equal(probs, sigmoid(data.logits(ids)))
    assert list(batches[0].fields) == [*FIELD_NAMES, BIAS_FIELD]
    assert np.all(ids[:, NUM_FIELDS] == BIAS_ID)
    dense = np.concatenate([b.dense for b in batches])
    assert dense.dtype == np.float32 and np.array_equal(dense, dense_features(raw.int_values))


HISTORY = SyntheticConfig(rows=3 * BLOCK_ROWS, seed=11, history=1.0, history_vocab=50, history_max_length=7)


def test_history_bags_are_drawn_after_the_other_values():
    data = SyntheticData(HISTORY)
    rows = data.raw(0, 3 * BLOCK_ROWS)
    without = SyntheticData(dataclasses.replace(HISTORY, history=0.0)).raw(0, 3 * BLOCK_ROWS)
    assert np.array_equal(rows.ids, without.ids) and np.array_equal(rows.int_values, without.int_values)
    assert not np.array_equal(rows.probs, without.probs)
    values = rows.history_values
    lengths = values.lengths()
    assert lengths.min() == 0 and lengths.max() == 7
    assert 0.08 < np.mean(lengths == 0) < 0.17  # 1 / 8 of the bags are empty
    assert any(len(set(values.ids[a:b].tolist())) < b - a for a, b in zip(values.offsets[:-1], values.offsets[1:]))
    key = key_py(11, 2, 26)  # the value of rank r: mix64(r ^ key(seed, 2, 26)), r < history_vocab
    vocabulary = set(mix64(np.arange(50, dtype=np.uint64) ^ np.uint64(key)).tolist())
    assert set(values.ids.tolist()) <= vocabulary and len(set(values.ids.tolist())) > 25
    # Block 1 redrawn in the documented order: today's draws, then the lengths, then the history's uniforms.
    rng = np.random.default_rng([11, 1])
    n = BLOCK_ROWS
    rng.random((n, 26)), rng.random((n, 26)), rng.standard_normal((n, 13)), rng.random((n, 13))
    u_label = rng.random(n)
    lengths = rng.integers(0, 8, n)
    ranks = zipf_ranks(rng.random(lengths.sum()), np.array(50), HISTORY.zipf_exponent)
    block = data.raw(BLOCK_ROWS, 2 * BLOCK_ROWS)
    assert np.array_equal(block.history_values.lengths(), lengths)
    assert np.array_equal(block.history_values.ids, mix64(ranks.astype(np.uint64) ^ np.uint64(key)))
    assert np.array_equal(block.labels, (u_label < block.probs).astype(np.float32))
    batches = list(data.batches(1000, 0, 3 * BLOCK_ROWS))
    assert list(batches[0].fields) == [*FIELD_NAMES, HISTORY_FIELD, BIAS_FIELD]
    history = Bags.concat([b.fields[HISTORY_FIELD] for b in batches])
    assert np.array_equal(history.offsets, values.offsets)
    assert np.array_equal(history.ids, space_ids(39, values.ids))
    assert np.array_equal(concat(batches)[1], rows.ids)
    assert not np.isin(history.ids, rows.ids).any()  # its own id space: no other field's ids


def test_history_term_is_the_mean_of_hashed_weights_over_the_bag():
    data = SyntheticData(HISTORY)
    without = SyntheticData(dataclasses.replace(HISTORY, history=0.0))
    rows = data.raw(BLOCK_ROWS - 20, BLOCK_ROWS + 20)
    values = rows.history_values
    for i in range(40):
        bag = [int(x) for x in space_ids(39, values.ids[values.offsets[i] : values.offsets[i + 1]])]
        normals = [hashed_normal_py(x, 11, 3, 0) for x in bag]
        term = HISTORY.history * data.history_scale * sum(normals) / len(bag) if bag else 0.0
        expected = without.logits(rows.ids[i : i + 1])[0] - without.offset + data.offset + term
        assert rows.probs[i] == pytest.approx(1 / (1 + math.exp(-expected)), rel=1e-6)
    with pytest.raises(ValueError, match="history"):
        data.logits(rows.ids)


def test_history_term_std_is_half_the_strength_and_the_mean_logit_stays_the_bias():
    for strength in (1.0, 2.0):
        cfg = SyntheticConfig(rows=5 * BLOCK_ROWS, seed=4, history=strength)  # default vocab and length
        data = SyntheticData(cfg)
        rows = data.raw(0, 5 * BLOCK_ROWS)
        history = Bags(space_ids(39, rows.history_values.ids), rows.history_values.offsets)
        no_history = Bags(np.zeros(0, np.uint64), np.zeros(len(rows.ids) + 1, np.int64))
        term = data.logits(rows.ids, history) - data.logits(rows.ids, no_history)
        assert term[:BLOCK_ROWS].std() == pytest.approx(0.5 * strength, rel=1e-9)  # block 0 sets the scale
        assert term[BLOCK_ROWS:].std() == pytest.approx(0.5 * strength, rel=0.1)
        assert data.logits(rows.ids[:BLOCK_ROWS], history.slice(0, BLOCK_ROWS)).mean() == pytest.approx(cfg.bias)


def read_csv_oracle(path):
    """The CSV of write_synthetic read by hand: labels, the (n, 40) ids, the history bags of ids, dense."""
    with open(path, newline="") as f:
        header, *rows = list(csv.reader(f))
    assert header == ["label", *FIELD_NAMES, "history"]
    assert all(len(row) == 41 for row in rows)
    ints = np.array([parse_ints(row[1:14]) for row in rows], dtype=np.int64)
    columns = [space_ids(j, int_bucket(ints[:, j])) for j in range(NUM_INT_FIELDS)]
    columns += [space_ids(13 + c, cat_values(np.array([row[14 + c] for row in rows]))) for c in range(26)]
    ids = np.stack([*columns, np.full(len(rows), BIAS_ID)], axis=1)
    bags = [row[40].split("|") if row[40] else [] for row in rows]
    offsets = np.cumsum([0] + [len(bag) for bag in bags])
    tokens = np.array([token for bag in bags for token in bag], dtype=str)
    history = Bags(space_ids(39, cat_values(tokens)), offsets)
    return np.array([float(row[0]) for row in rows]), ids, history, dense_features(ints), rows


def test_written_csv_reads_back_to_the_batches(tmp_path):
    path = tmp_path / "synthetic.csv"
    write_synthetic(path, HISTORY, 1000, 5000)
    labels, ids, history, dense, cells = read_csv_oracle(path)
    assert path.read_text().startswith("label,I1,I2,")
    batches = list(SyntheticData(HISTORY).batches(1500, 1000, 5000))
    assert np.array_equal(labels, concat(batches)[0]) and np.array_equal(ids, concat(batches)[1])
    got = Bags.concat([b.fields[HISTORY_FIELD] for b in batches])
    assert np.array_equal(history.ids, got.ids) and np.array_equal(history.offsets, got.offsets)
    assert np.array_equal(dense, np.concatenate([b.dense for b in batches]))
    history_cells = [row[40] for row in cells]
    assert "" in history_cells and any("|" in cell for cell in history_cells)
    tokens = [token for cell in history_cells if cell for token in cell.split("|")]
    cat_cells = [cell for row in cells for cell in row[14:40]]
    assert "" in cat_cells  # missing categoricals
    hex_digits = set("0123456789abcdef")
    assert all(len(t) == 16 and set(t) <= hex_digits for t in tokens + [c for c in cat_cells if c])


def test_schema_text_reads_the_csv_columns_in_id_space_order():
    text = schema_text(HISTORY)
    schema = tomllib.loads(text)
    assert schema["format"] == "csv" and schema["label"] == "label" and schema["delimiter"] == ","
    columns = schema["columns"]
    sparse = [c for c in columns if c["kind"] != "numeric" or c["transform"] == "log_buckets"]
    assert [c["name"] for c in sparse] == [*FIELD_NAMES, "history"]  # id spaces 0..39, in order
    assert all(c.get("source", c["name"]) == c["name"] for c in sparse)
    assert [c["kind"] for c in sparse[13:39]] == ["categorical"] * 26
    history = sparse[39]
    assert history["kind"] == "multi_hot" and history["separator"] == "|" and history["pooling"] == "mean"
    assert history["max_length"] >= HISTORY.history_max_length
    numeric = [c for c in columns if c not in sparse]
    assert [(c["name"], c["source"], c["transform"]) for c in numeric] == [
        (f"{name}_log", name, "log") for name in FIELD_NAMES[:13]
    ]
    # Without history: the same columns but the history's, read from a Criteo file.
    criteo = tomllib.loads(schema_text(dataclasses.replace(HISTORY, history=0.0)))
    assert criteo.pop("format") == "criteo" and schema.pop("format") == "csv" and schema.pop("delimiter") == ","
    schema["columns"].remove(history)
    assert criteo == schema
    assert set(schema) == {"label", "columns"}  # no tables: every column looks up the default table


def test_the_history_csv_and_its_schema_start_a_run_without_a_warning(tmp_path, caplog):
    """The written CSV's I2 reaches -3 and its schema reads I2_log as log(1 + x), those values as 0, as the planted
    data's dense features do; the log_buckets field I2 keeps them apart, so no run on the pair is told they are lost."""
    from worker.schema_builtin import resolve_schema

    data, schema = tmp_path / "h.csv", tmp_path / "h.csv.schema.toml"
    write_synthetic(data, HISTORY, 0, 2000)
    schema.write_text(schema_text(HISTORY))
    assert min(int(row["I2"]) for row in csv.DictReader(data.open()) if row["I2"]) < 0
    with caplog.at_level("WARNING", logger="worker.schema_hints"):
        resolve_schema(str(data), schema_path=str(schema), fmt="auto", label_column=None, drop_columns=(),
                       numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4)  # fmt: skip
    assert [r.getMessage() for r in caplog.records if r.name == "worker.schema_hints"] == []


def test_small_data_config_spreads_few_rows_over_many_ids():
    cfg = small_data_config(0)
    assert cfg.rows == SMALL_DATA_ROWS == 10_000 and cfg.interactions == 1.0 and small_data_config(1).seed == 1
    data = SyntheticData(cfg)
    train, held_out = data.raw(0, cfg.rows), data.raw(cfg.rows, cfg.rows + 20_000)
    distinct, counts = np.unique(train.ids[:, :NUM_FIELDS], return_counts=True)
    assert len(distinct) > 120_000  # measured 134,528
    assert np.mean(counts == 1) > 0.8  # measured 0.851
    assert np.isin(held_out.ids[:, NUM_FIELDS - 26 : NUM_FIELDS], distinct).mean() < 0.8  # unseen values abound
    assert 0.2 < held_out.labels.mean() < 0.35
    assert auc(held_out.labels, held_out.probs) > 0.8  # measured 0.8395


def test_a_path_ending_in_gz_is_written_gzipped(tmp_path):
    import gzip

    cfg = SyntheticConfig(rows=300)
    write_synthetic(tmp_path / "a.tsv", cfg)
    write_synthetic(tmp_path / "a.tsv.gz", cfg)
    with gzip.open(tmp_path / "a.tsv.gz", "rt") as f:
        assert f.read() == (tmp_path / "a.tsv").read_text()

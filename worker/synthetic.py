"""Synthetic Criteo-schema data drawn from a planted model, so every row's true click probability is known.

Rows are a pure function of (config, row index): row i lies in block i // BLOCK_ROWS, and each block is drawn
from its own numpy Generator seeded with (seed, block), so any range [start, stop) is reproducible and train
and eval sets can be disjoint ranges of one config. Per row (n = rows of a block, fields as in features.py):

    categorical field c (vocabulary V_c = max(1, round(cat_vocab[c] * vocab_scale))):
        rank  = floor(x) - 1 clipped to [0, V_c), x drawn from the power law p(x) ~ x**-zipf_exponent on
                [1, V_c + 1) by its inverse CDF (O(1) per draw, no table of V_c entries)
        value = mix64(rank ^ key(seed, 2, c)); MISSING_CAT with probability cat_missing * (c % 4) / 3
    integer field j: floor(exp(_INT_LOG_MEAN[j] + _INT_LOG_STD[j] * N(0, 1))) + _INT_OFFSET[j];
        MISSING_INT with probability int_missing
    history (only when config.history != 0; drawn after every other draw of the block, the labels' included):
        L     = a uniform integer in [0, history_max_length]: the bag's length (0: an empty bag)
        value = mix64(rank ^ key(seed, 2, 26)) for each of L ranks drawn as a categorical field's, with
                V = history_vocab; values repeat, within a bag and across rows
        hist  = features.space_ids(HISTORY_SPACE, value)              # id space 39: after I1..I13, C1..C26
    ids   = features.example_ids(ints, cats)                      # (n, 40); column 39 is BIAS_ID
    logit = offset + sum_f w(id_f) + interactions * sum_{f<g} <u(id_f), u(id_g)> / sqrt(39 * 38 / 2)
                   + history * mean over the bag of w_h(hist)         # 0 for an empty bag
    offset = bias - (mean over the rows of block 0 of the logit without offset), so the mean logit ~ bias
    label = 1 if uniform < sigmoid(logit) else 0;  probs = sigmoid(logit)

The planted model is a function of the 39 field ids and the history's ids only (`SyntheticData.logits`), so a
model with one weight per id (and `pooling = "mean"` for the history) can represent its linear part exactly.
Hashed normals, for an id and a stream s:

    key(seed, s, p) = mix64((seed * 0x9E3779B97F4A7C15 + s * 2**32 + p) mod 2**64)
    h_p   = mix64(id ^ key(seed, s, p)); u = (h_p >> 32) / 2**32, v = (h_p & 0xFFFFFFFF) / 2**32
    pair p: r = sqrt(-2 ln(1 - u)), t = 2 pi v -> normals r cos t, r sin t (components 2p and 2p + 1)
            (cos and sin are taken in float32, for speed: a float64 oracle agrees to ~1e-7)
    w(id)   = weight_scale * component 0 of stream 0
    u(id)   = components 0..latent_dim-1 of stream 1, times latent_dim ** -0.25
    w_h(id) = history_scale * component 0 of stream 3, history_scale = HISTORY_STD / (the std over the rows
              of block 0 of the mean over each bag of that component), so that over block 0 the history
              term's std is history * HISTORY_STD (= 0.5 for history = 1)

Over independent ids each <u_f, u_g> has unit variance, so the interaction term's std is `interactions`;
across real rows the spread of each part differs from its prior std, since frequent values repeat.

Batches (`SyntheticData.batches`, worker/batch.py): fields FIELD_NAMES ("I1".."I13", "C1".."C26": one id each,
columns 0..38 of ids), then HISTORY_FIELD (the bag hist) when history is on, then BIAS_FIELD (BIAS_ID);
dense = features.dense_features(ints) (13 columns); probs as above.

Files: worker/synthetic_files.py writes these rows (write_synthetic) and the schema that reads them back
(schema_text).

Small data (`small_data_config`): 10,000 training rows spread over more than 10**5 distinct ids, most of them
seen once, with planted interactions: a model that trains on it long enough overfits (eval from row 10,000 on).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ps.hashing import mix64
from worker.batch import Bags, Batch
from worker.features import (
    MISSING_CAT,
    MISSING_INT,
    NUM_CAT_FIELDS,
    NUM_FIELDS,
    NUM_INT_FIELDS,
    dense_features,
    example_ids,
    space_ids,
)
from worker.metrics import sigmoid
from worker.models.spec import BIAS_FIELD

BLOCK_ROWS = 4096  # rows per independently seeded block; never change it: it defines the data

# Criteo-like mix: a few tiny fields (3-100 values), many of 1e3-5e4, a few of 1e5-3e5.
DEFAULT_CAT_VOCAB = (
    1_000, 500, 100_000, 50_000, 300, 24, 10_000, 600, 3, 20_000, 5_000, 200_000, 3_000,
    27, 10_000, 100_000, 10, 5_000, 2_000, 4, 300_000, 18, 15, 30_000, 100, 20_000,
)  # fmt: skip
INT_NAMES = tuple(f"I{j + 1}" for j in range(NUM_INT_FIELDS))
CAT_NAMES = tuple(f"C{c + 1}" for c in range(NUM_CAT_FIELDS))
FIELD_NAMES = INT_NAMES + CAT_NAMES  # field f reads column f of the ids matrix (id space f)
HISTORY_FIELD = "history"
HISTORY_SPACE = NUM_FIELDS  # the history's id space: the 40th in order of first appearance
HISTORY_STD = 0.5  # the std over block 0 of the history term, per unit of config.history
SMALL_DATA_ROWS = 10_000
# Integer field j is floor(exp(N(_INT_LOG_MEAN[j], _INT_LOG_STD[j]))) + _INT_OFFSET[j]: counts, heavy-tailed.
_INT_LOG_MEAN = (0.5, 2.0, 1.5, 1.5, 6.0, 3.0, 1.5, 2.5, 3.5, 0.3, 1.0, 0.3, 2.0)
_INT_LOG_STD = (1.2, 2.0, 1.5, 1.0, 2.0, 1.5, 1.5, 1.0, 1.2, 0.6, 1.0, 0.8, 1.3)
_INT_OFFSET = (0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)  # field 1 reaches -3, like Criteo's I2
_INT_MAX = 2**40  # draws are clipped here (never reached in practice)
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = 2**64 - 1
_STREAM_WEIGHT, _STREAM_LATENT, _STREAM_VALUE, _STREAM_HISTORY = 0, 1, 2, 3
_NUM_PAIRS = NUM_FIELDS * (NUM_FIELDS - 1) // 2


@dataclass(frozen=True)
class SyntheticConfig:
    """What to generate. rows: the nominal (training) row count; ranges may go past it (e.g. an eval set)."""

    rows: int
    seed: int = 0
    interactions: float = 0.0  # std of the planted pairwise interaction term of the logit; 0 = linear
    vocab_scale: float = 1.0  # multiplies every categorical vocabulary; any size works (no tables)
    cat_vocab: tuple[int, ...] = DEFAULT_CAT_VOCAB  # NUM_CAT_FIELDS vocabulary sizes before vocab_scale
    zipf_exponent: float = 1.5  # value frequencies ~ rank**-zipf_exponent; higher = easier to learn
    weight_scale: float = 0.22  # std of each (field, value) weight
    bias: float = -1.4  # the mean logit (see offset); sets the mean CTR
    latent_dim: int = 4  # size of the planted latent vectors (interactions only)
    int_missing: float = 0.1  # probability that an integer feature is missing
    cat_missing: float = 0.05  # categorical field c is missing with probability cat_missing * (c % 4) / 3
    history: float = 0.0  # strength of the planted history term (its std is history * HISTORY_STD); 0 = none
    history_vocab: int = 100_000  # values of the history's id space (Zipf-ranked, as a categorical field's)
    history_max_length: int = 20  # a history bag holds 0..history_max_length values

    def __post_init__(self) -> None:
        checks = [
            (self.rows >= 0, f"rows is {self.rows}, expected >= 0"),
            (0 <= self.seed < 2**63, f"seed is {self.seed}, expected in [0, 2**63)"),
            (len(self.cat_vocab) == NUM_CAT_FIELDS, f"cat_vocab has {len(self.cat_vocab)} sizes, expected 26"),
            (min(self.cat_vocab, default=0) >= 1, "cat_vocab sizes must be >= 1"),
            (self.vocab_scale > 0, f"vocab_scale is {self.vocab_scale}, expected > 0"),
            (max(self.cat_vocab, default=0) * self.vocab_scale <= 2**53, "vocabularies must stay <= 2**53 values"),
            (self.zipf_exponent > 0, f"zipf_exponent is {self.zipf_exponent}, expected > 0"),
            (self.latent_dim >= 1, f"latent_dim is {self.latent_dim}, expected >= 1"),
            (0 <= self.int_missing <= 1, f"int_missing is {self.int_missing}, expected in [0, 1]"),
            (0 <= self.cat_missing <= 1, f"cat_missing is {self.cat_missing}, expected in [0, 1]"),
            (math.isfinite(self.history) and self.history >= 0, f"history is {self.history}, expected >= 0"),
            (1 <= self.history_vocab <= 2**53, f"history_vocab is {self.history_vocab}, expected in [1, 2**53]"),
            (self.history_max_length >= 1, f"history_max_length is {self.history_max_length}, expected >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def vocab_sizes(self) -> np.ndarray:
        """The NUM_CAT_FIELDS effective vocabulary sizes, int64."""
        scaled = np.rint(np.asarray(self.cat_vocab, dtype=np.float64) * self.vocab_scale)
        return np.maximum(1, scaled).astype(np.int64)


def small_data_config(seed: int) -> SyntheticConfig:
    """The small-data regime: SMALL_DATA_ROWS training rows whose categorical values are spread thin (vocabularies
    x 30, Zipf exponent 0.8), so they hold more than 10**5 distinct ids, most seen once, and planted
    interactions of std 1. A model overfits it when trained too long; rows from SMALL_DATA_ROWS on are unseen
    rows of the same distribution, for evaluation. tests/test_synthetic.py measures these figures."""
    return SyntheticConfig(rows=SMALL_DATA_ROWS, seed=seed, interactions=1.0, vocab_scale=30.0, zipf_exponent=0.8)


@dataclass
class RawRows:
    """Rows before hashing: labels float32 (n,), int_values int64 (n, 13) (MISSING_INT where absent),
    cat_values uint64 (n, 26) (MISSING_CAT where absent), ids uint64 (n, 40), probs float64 (n,),
    history_values: each row's history as a Bags of raw values (not ids), or None without history."""

    labels: np.ndarray
    int_values: np.ndarray
    cat_values: np.ndarray
    ids: np.ndarray
    probs: np.ndarray
    history_values: Bags | None = None

    def slice(self, lo: int, hi: int) -> RawRows:
        history = None if self.history_values is None else self.history_values.slice(lo, hi)
        return RawRows(*(a[lo:hi] for a in self._arrays()), history)

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.labels, self.int_values, self.cat_values, self.ids, self.probs

    @staticmethod
    def concat(parts: list[RawRows]) -> RawRows:
        history = None
        if parts[0].history_values is not None:
            joined = Bags.concat([p.history_values for p in parts if p.history_values is not None])
            history = Bags(joined.ids.copy(), joined.offsets.copy())  # fresh, like the arrays
        return RawRows(*(np.concatenate(arrays) for arrays in zip(*(p._arrays() for p in parts))), history)


def _key(seed: int, stream: int, index: int) -> np.uint64:
    raw = (seed * _GOLDEN + (stream << 32) + index) & _MASK64
    return mix64(np.array([raw], dtype=np.uint64))[0]


def hashed_normals(ids: np.ndarray, seed: int, stream: int, count: int) -> np.ndarray:
    """count standard normals per id, a pure function of (id, seed, stream): float64 (*ids.shape, count)."""
    ids = np.asarray(ids, dtype=np.uint64)
    out = np.empty(ids.shape + (count,), dtype=np.float64)
    for p in range((count + 1) // 2):
        h = mix64(ids ^ _key(seed, stream, p))
        # Both halves fit in int64, whose conversion to float64 is faster than uint64's.
        high, low = (h >> np.uint64(32)).view(np.int64), (h & np.uint64(0xFFFFFFFF)).view(np.int64)
        radius = np.log1p(high * -(2.0**-32))  # ln(1 - u)
        radius *= -2.0
        np.sqrt(radius, out=radius)
        # float32 trig is many times faster than float64 and plenty for a planted weight.
        angle = (low * (2.0 * np.pi * 2.0**-32)).astype(np.float32)  # 2 pi v
        out[..., 2 * p] = np.cos(angle)
        out[..., 2 * p] *= radius
        if 2 * p + 1 < count:
            out[..., 2 * p + 1] = np.sin(angle)
            out[..., 2 * p + 1] *= radius
    return out


def zipf_ranks(u: np.ndarray, vocab: np.ndarray, exponent: float) -> np.ndarray:
    """Ranks in [0, vocab) from uniforms u in [0, 1) (vocab broadcasts against u), int64: floor(x) - 1 for
    x = F^-1(u), F the CDF of the continuous power law p(x) ~ x**-exponent on [1, vocab + 1)."""
    top = vocab.astype(np.float64) + 1.0
    a = 1.0 - exponent
    if abs(a) < 1e-9:
        x = np.exp(u * np.log(top))
    else:
        x = (1.0 + u * np.expm1(a * np.log(top))) ** (1.0 / a)
    return np.clip(np.floor(x) - 1.0, 0, vocab - 1).astype(np.int64)


def history_ids(history_values: Bags) -> Bags:
    """The ids of history bags of raw values: features.space_ids(HISTORY_SPACE, value)."""
    return Bags(space_ids(HISTORY_SPACE, history_values.ids), history_values.offsets)


def bag_means(values: np.ndarray, bags: Bags) -> np.ndarray:
    """float64 (n,): the mean over each bag of `values` (one per id of bags, float), 0 for an empty bag."""
    sums = np.bincount(bags.example_of_each_id(), weights=values, minlength=len(bags))
    lengths = bags.lengths()
    return np.divide(sums, lengths, out=np.zeros(len(bags)), where=lengths > 0)


class SyntheticData:
    """Generator of the rows of one SyntheticConfig (see the module docstring for the model)."""

    def __init__(self, config: SyntheticConfig):
        self.config = config
        self._vocab = config.vocab_sizes()
        self._value_keys = np.array([_key(config.seed, _STREAM_VALUE, c) for c in range(NUM_CAT_FIELDS)])
        self._history_key = _key(config.seed, _STREAM_VALUE, NUM_CAT_FIELDS)
        self._cat_missing = config.cat_missing * (np.arange(NUM_CAT_FIELDS) % 4) / 3
        self._cached: tuple[int, RawRows] | None = None
        ints, cats, _, history_values = self._draw(0)
        ids = example_ids(ints, cats)
        self.history_scale = 0.0  # w_h(id) = history_scale * component 0 of stream 3
        logit = self._field_logits(ids)
        if history_values is not None:
            history = history_ids(history_values)
            spread = float(bag_means(self._history_normals(history.ids), history).std())
            self.history_scale = HISTORY_STD / spread if spread > 0 else 0.0
            logit += self._history_logits(history)
        # Centering on block 0 (a pure function of the config) keeps the mean logit near `bias` for any seed;
        # otherwise the weights of each field's few most frequent values would move the mean CTR a lot.
        self.offset = config.bias - float(logit.mean())

    def weights(self, ids: np.ndarray) -> np.ndarray:
        """Planted weight of each id (any shape), float64."""
        return self.config.weight_scale * hashed_normals(ids, self.config.seed, _STREAM_WEIGHT, 1)[..., 0]

    def history_weights(self, ids: np.ndarray) -> np.ndarray:
        """Planted weight w_h of each history id (any shape), float64."""
        return self.history_scale * self._history_normals(ids)

    def logits(self, ids: np.ndarray, history: Bags | None = None) -> np.ndarray:
        """Planted logit of each row of an ids matrix (n, NUM_FIELDS [+ 1]) (the bias column is ignored) and
        the rows' history ids (n bags; required when config.history != 0)."""
        logit = self.offset + self._field_logits(ids)
        if self.config.history != 0:
            if history is None or len(history) != len(logit):
                raise ValueError(f"config.history is {self.config.history}: logits needs {len(logit)} history bags")
            logit += self._history_logits(history)
        return logit

    def _history_normals(self, ids: np.ndarray) -> np.ndarray:
        return hashed_normals(ids, self.config.seed, _STREAM_HISTORY, 1)[..., 0]

    def _history_logits(self, history: Bags) -> np.ndarray:
        return self.config.history * bag_means(self.history_weights(history.ids), history)

    def _field_logits(self, ids: np.ndarray) -> np.ndarray:
        fields = np.asarray(ids, dtype=np.uint64)[:, :NUM_FIELDS]
        logit = self.weights(fields).sum(axis=1)
        if self.config.interactions != 0:
            k = self.config.latent_dim
            latent = hashed_normals(fields, self.config.seed, _STREAM_LATENT, k) * k**-0.25
            total = latent.sum(axis=1)  # (n, k)
            pairs = 0.5 * (np.einsum("nk,nk->n", total, total) - np.einsum("nfk,nfk->n", latent, latent))
            logit += self.config.interactions * pairs / math.sqrt(_NUM_PAIRS)
        return logit

    def raw(self, start: int, stop: int) -> RawRows:
        """Rows [start, stop), raw values included; fresh arrays."""
        if not 0 <= start <= stop:
            raise ValueError(f"row range [{start}, {stop}) is invalid, expected 0 <= start <= stop")
        parts = []
        for block in range(start // BLOCK_ROWS, -(-stop // BLOCK_ROWS)):
            lo = max(start - block * BLOCK_ROWS, 0)
            hi = min(stop - block * BLOCK_ROWS, BLOCK_ROWS)
            parts.append(self._block(block).slice(lo, hi))
        if not parts:
            return self._block(0).slice(0, 0)  # empty, with the right shapes and dtypes
        return RawRows.concat(parts)

    def batches(self, batch_size: int, start: int = 0, stop: int | None = None) -> Iterator[Batch]:
        """Batches of rows [start, stop) (stop defaults to config.rows), batch_size rows each but the last."""
        stop = self.config.rows if stop is None else stop
        if batch_size < 1:
            raise ValueError(f"batch_size is {batch_size}, expected >= 1")
        for lo in range(start, stop, batch_size):
            yield to_batch(self.raw(lo, min(lo + batch_size, stop)))

    def _block(self, block: int) -> RawRows:
        if self._cached is None or self._cached[0] != block:
            self._cached = (block, self._generate(block))
        return self._cached[1]

    def _generate(self, block: int) -> RawRows:
        ints, cats, u_label, history_values = self._draw(block)
        ids = example_ids(ints, cats)
        probs = sigmoid(self.logits(ids, None if history_values is None else history_ids(history_values)))
        labels = (u_label < probs).astype(np.float32)
        return RawRows(labels, ints, cats, ids, probs, history_values)

    def _draw(self, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, Bags | None]:
        """The raw int and categorical values of a block, the uniforms that decide its labels, its history."""
        cfg, n = self.config, BLOCK_ROWS
        rng = np.random.default_rng([cfg.seed, block])
        u_rank = rng.random((n, NUM_CAT_FIELDS))
        u_cat_missing = rng.random((n, NUM_CAT_FIELDS))
        z_int = rng.standard_normal((n, NUM_INT_FIELDS))
        u_int_missing = rng.random((n, NUM_INT_FIELDS))
        u_label = rng.random(n)

        ranks = zipf_ranks(u_rank, self._vocab, cfg.zipf_exponent)
        cats = mix64(ranks.astype(np.uint64) ^ self._value_keys)
        cats[u_cat_missing < self._cat_missing] = MISSING_CAT

        log_ints = np.minimum(np.asarray(_INT_LOG_MEAN) + np.asarray(_INT_LOG_STD) * z_int, math.log(_INT_MAX))
        ints = np.floor(np.exp(log_ints)).astype(np.int64) + np.asarray(_INT_OFFSET, dtype=np.int64)
        ints[u_int_missing < cfg.int_missing] = MISSING_INT

        history = None
        if cfg.history != 0:
            lengths = rng.integers(0, cfg.history_max_length + 1, n)
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            u_history = rng.random(int(offsets[-1]))
            history_ranks = zipf_ranks(u_history, np.array(cfg.history_vocab, dtype=np.int64), cfg.zipf_exponent)
            history = Bags(mix64(history_ranks.astype(np.uint64) ^ self._history_key), offsets)
        return ints, cats, u_label, history


def to_batch(rows: RawRows) -> Batch:
    """The Batch of some rows (fields as in the module docstring)."""
    fields = {name: Bags.one_per_example(rows.ids[:, f]) for f, name in enumerate(FIELD_NAMES)}
    if rows.history_values is not None:
        fields[HISTORY_FIELD] = history_ids(rows.history_values)
    fields[BIAS_FIELD] = Bags.one_per_example(rows.ids[:, NUM_FIELDS])
    return Batch(labels=rows.labels, fields=fields, dense=dense_features(rows.int_values), probs=rows.probs)

"""worker.metrics: auc against counting every positive-negative pair, and ScoreStream, exact while it keeps every
example and within its reported tie share of the exact AUC once it counts them in bins."""

from __future__ import annotations

import numpy as np
import pytest

from worker.metrics import SCORE_BINS, ScoreStream, auc, logloss


def pairs_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The definition: the share of (positive, negative) pairs the positive wins, ties counting 1/2."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def test_auc_counts_pairs_with_ties_as_half():
    rng = np.random.default_rng(0)
    labels = (rng.random(400) < 0.3).astype(np.float32)
    scores = np.round(rng.random(400) + labels * 0.3, 1)  # rounded: many ties
    assert auc(labels, scores) == pytest.approx(pairs_auc(labels, scores), abs=1e-12)


def test_a_stream_under_its_bound_gives_the_exact_figures_of_all_its_examples():
    rng = np.random.default_rng(1)
    stream, labels, probs = ScoreStream(exact_examples=10_000), [], []
    for _ in range(10):
        y = (rng.random(1000) < 0.2).astype(np.float32)
        p = rng.random(1000).astype(np.float32)
        stream.add(y, p)
        labels.append(y), probs.append(p)
    y, p = np.concatenate(labels), np.concatenate(probs)
    assert stream.exact and stream.examples == 10_000 and stream.positives == int(y.sum())
    assert stream.auc() == auc(y, p) and stream.logloss() == logloss(y, p) and stream.tie_share() == 0.0


@pytest.mark.parametrize("scale", [1.0, 1e-3])  # probabilities near 0.5, and a CTR of about 1e-3
def test_past_its_bound_a_stream_counts_bins_and_stays_within_its_tie_share_of_the_exact_auc(scale):
    rng = np.random.default_rng(2)
    stream, labels, probs = ScoreStream(exact_examples=5_000), [], []
    for _ in range(40):  # 200,000 examples: all but the first 5,000 past the bound
        logit = rng.normal(size=5000)
        p = (scale / (1 + np.exp(-logit))).astype(np.float32)
        y = (rng.random(5000) < p / scale * 0.3).astype(np.float32)
        stream.add(y, p)
        labels.append(y), probs.append(p)
    y, p = np.concatenate(labels), np.concatenate(probs)
    exact = auc(y, p)
    assert not stream.exact and stream.examples == 200_000 and stream.positives == int(y.sum())
    assert 0 < stream.tie_share() < 1e-3
    assert abs(stream.auc() - exact) <= stream.tie_share() / 2 + 1e-12
    assert stream.logloss() == pytest.approx(logloss(y, p), rel=1e-9)


def test_the_bins_cover_0_to_1_and_negative_zero():
    stream = ScoreStream(exact_examples=0)
    stream.add(np.array([0, 1, 0, 1], np.float32), np.array([-0.0, 1.0, 0.0, 0.5], np.float32))
    negatives, positives = stream._bins
    assert negatives[0] == 2 and positives[SCORE_BINS - 1] == 1 and positives.sum() == 2
    assert stream.auc() == 1.0
    stream.add(np.zeros(0, np.float32), np.zeros(0, np.float32))  # an empty batch changes nothing
    assert stream.examples == 4 and np.isfinite(stream.logloss())
    one_class = ScoreStream(exact_examples=0)
    one_class.add(np.zeros(3, np.float32), np.array([0.1, 0.2, 0.3], np.float32))
    assert np.isnan(one_class.auc())


def test_an_eval_past_the_exact_bound_says_its_auc_is_binned_and_within_what_of_the_exact(monkeypatch):
    """The same training twice on local shards, its 20,000 eval rows scored exactly, then with the bound lowered
    to 2,000: the second's AUC is within its tie share of the first's, and its eval line says it is binned."""
    from worker import metrics
    from worker.results import format_results
    from worker.train import train
    from worker.train_config import TrainConfig

    def run() -> dict:
        return train(TrainConfig(local_shards=1, model="lr", synthetic_rows=20_000, synthetic_eval_rows=20_000,
                                 recipe="large", progress=False))  # fmt: skip

    exact = run()
    monkeypatch.setattr(metrics, "EXACT_AUC_EXAMPLES", 2_000)
    binned = run()
    out = format_results(binned)
    assert "eval_auc_tie_share" not in exact and binned["eval_auc_exact_examples"] == 2_000, binned
    assert abs(binned["eval_auc"] - exact["eval_auc"]) <= binned["eval_auc_tie_share"] / 2 + 1e-12
    assert binned["eval_logloss"] == pytest.approx(exact["eval_logloss"], rel=1e-9)
    assert binned["oracle_auc"] == pytest.approx(exact["oracle_auc"], abs=1e-3)
    assert (f"(20,000 examples; AUC over probability bins, within {binned['eval_auc_tie_share'] / 2:.1e} of the exact "
            "one, past 2,000 examples)") in out, out  # fmt: skip

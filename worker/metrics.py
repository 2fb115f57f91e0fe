"""Evaluation metrics for click models: AUC, log loss, a stable sigmoid, and a running mean for progress bars."""

from __future__ import annotations

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) elementwise without overflow; float32 in -> float32 out, otherwise float64."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        x = x.astype(np.float64)
    e = np.exp(-np.abs(x))  # in (0, 1]: never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: P(score of a random positive > score of a random negative), ties counting 1/2.

    labels (n,) in {0, 1} (positive where label > 0.5); scores (n,) real, no NaN. Rank-based, O(n log n):
    tied scores share their average rank. Returns nan when the labels hold only one class.
    """
    labels = np.asarray(labels).reshape(-1)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if labels.shape != scores.shape:
        raise ValueError(f"labels has {labels.shape[0]} entries, scores {scores.shape[0]}")
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN")
    positive = labels > 0.5
    num_pos = int(positive.sum())
    num_neg = len(labels) - num_pos
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    # Tie groups [starts[k], ends[k]) in sorted order; twice the average 1-based rank is starts + ends + 1.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    twice_rank = np.repeat(starts + ends + 1, ends - starts)  # int64: exact for any n that fits in memory
    twice_rank_sum = int(twice_rank[positive[order]].sum())
    return (twice_rank_sum - num_pos * (num_pos + 1)) / (2 * num_pos * num_neg)


def logloss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy -[y ln p + (1 - y) ln(1 - p)], with p clipped to [eps, 1 - eps]."""
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    probs = np.clip(np.asarray(probs, dtype=np.float64).reshape(-1), eps, 1 - eps)
    if labels.shape != probs.shape:
        raise ValueError(f"labels has {labels.shape[0]} entries, probs {probs.shape[0]}")
    if len(labels) == 0:
        return float("nan")
    return float(-np.mean(labels * np.log(probs) + (1 - labels) * np.log1p(-probs)))


class RunningMean:
    """Exponentially weighted mean of a stream of (value, weight): each update multiplies the weight of
    everything before by `decay`. Bias-free from the first update (no warm-up toward 0)."""

    def __init__(self, decay: float = 0.98):
        if not 0 <= decay < 1:
            raise ValueError(f"decay is {decay}, expected in [0, 1)")
        self.decay = decay
        self._sum = 0.0
        self._weight = 0.0

    def update(self, value: float, weight: float = 1.0) -> float:
        """Add a value with its weight (e.g. a batch's mean log loss, weight 1); return the new mean."""
        self._sum = self.decay * self._sum + weight * float(value)
        self._weight = self.decay * self._weight + weight
        return self.value

    @property
    def value(self) -> float:
        """The current mean; nan before the first update."""
        return self._sum / self._weight if self._weight > 0 else float("nan")

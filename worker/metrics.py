"""Evaluation metrics for click models: AUC, log loss, a stable sigmoid, a running mean for progress bars, and
ScoreStream: AUC and log loss of a stream of scored examples in bounded memory."""

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


EXACT_AUC_EXAMPLES = 2_000_000  # a ScoreStream keeps this many (label, probability) pairs; past it, a histogram
SCORE_BIN_SHIFT = 9  # a probability's bin: its float32 bits >> this (14 bits of mantissa: 2^-14 relative width)
SCORE_BINS = (np.float32(1.0).view(np.uint32) >> SCORE_BIN_SHIFT) + 1  # 2,080,769 bins over [0, 1]


class ScoreStream:
    """AUC and log loss of examples added batch by batch, in bounded memory. Up to EXACT_AUC_EXAMPLES examples
    they are kept and the figures are auc() and logloss() of them all, exactly. Past that, the kept ones and all
    later ones are counted in a histogram of positives and negatives over probability bins (a float32's bits
    shifted right by SCORE_BIN_SHIFT: bins as narrow, relative to the probability, at 1e-6 as at 0.5), in 33 MB,
    and AUC counts the pairs within one bin as ties (1/2): it may differ from the exact AUC by at most half the share
    of positive-negative pairs that share a bin, which `tie_share` reports. The log loss is then a running sum."""

    def __init__(self, exact_examples: int | None = None):
        self.exact_examples = EXACT_AUC_EXAMPLES if exact_examples is None else exact_examples
        self.examples = 0
        self.positives = 0
        self._labels: list[np.ndarray] = []
        self._probs: list[np.ndarray] = []
        self._bins: np.ndarray | None = None  # (2, SCORE_BINS) int64: negatives, positives per bin
        self._loss_sum = 0.0

    @property
    def exact(self) -> bool:
        """Whether every example is still kept (the figures are exact)."""
        return self._bins is None

    def add(self, labels: np.ndarray, probs: np.ndarray) -> None:
        """One batch: labels (n,) in {0, 1} (positive where > 0.5), probabilities (n,) in [0, 1], no NaN."""
        labels, probs = np.asarray(labels).reshape(-1), np.asarray(probs).reshape(-1)
        if labels.shape != probs.shape:
            raise ValueError(f"labels has {labels.shape[0]} entries, probs {probs.shape[0]}")
        if len(labels) == 0:
            return
        self.examples += len(labels)
        self.positives += int(np.count_nonzero(labels > 0.5))
        if self._bins is None:
            self._labels.append(labels)
            self._probs.append(probs)
            if self.examples <= self.exact_examples:
                return
            labels, probs = self._kept()
            self._labels, self._probs = [], []
            self._bins = np.zeros((2, SCORE_BINS), dtype=np.int64)
        if np.isnan(probs).any():
            raise ValueError("scores contain NaN")
        self._loss_sum += len(labels) * logloss(labels, probs)
        clipped = np.clip(np.asarray(probs, dtype=np.float32), 0, 1) + np.float32(0)  # -0.0 -> 0.0
        bins = clipped.view(np.uint32) >> SCORE_BIN_SHIFT
        np.add.at(self._bins, ((labels > 0.5).astype(np.int64), bins.astype(np.int64)), 1)

    def _kept(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The kept labels and probabilities, each concatenated into one array once (None: no example)."""
        if not self._labels:
            return None
        if len(self._labels) > 1:
            self._labels, self._probs = [np.concatenate(self._labels)], [np.concatenate(self._probs)]
        return self._labels[0], self._probs[0]

    def auc(self) -> float:
        """AUC of every example added (nan with one class only): exact while `exact`, else from the histogram."""
        if self._bins is None:
            kept = self._kept()
            return auc(*kept) if kept else float("nan")
        negatives, positives = self._bins
        if not positives.sum() or not negatives.sum():
            return float("nan")
        below = np.cumsum(negatives) - negatives  # negatives in lower bins
        wins = float(np.dot(positives.astype(np.float64), below + negatives / 2))
        return wins / (float(positives.sum()) * float(negatives.sum()))

    def tie_share(self) -> float:
        """Share of positive-negative pairs whose two examples share a bin (0 while `exact`)."""
        if self._bins is None:
            return 0.0
        negatives, positives = self._bins
        pairs = float(positives.sum()) * float(negatives.sum())
        return float(np.dot(positives.astype(np.float64), negatives)) / pairs if pairs else 0.0

    def logloss(self) -> float:
        """Mean log loss of every example added (logloss(): exact while `exact`)."""
        if self._bins is None:
            kept = self._kept()
            return logloss(*kept) if kept else float("nan")
        return self._loss_sum / self.examples

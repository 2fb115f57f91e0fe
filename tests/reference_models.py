"""LR and FM in numpy. Loss: sum over the batch of the logloss; gradients are per (example, field) row.

    LR:  logit = sum_f w_f                                      row = [w]
    FM:  logit = sum_f w_f + 1/2 (|sum_f v_f|^2 - sum_f |v_f|^2)   row = [w | v (k floats)]
    dL/dlogit = p - y;  dL/dw_f = p - y;  dL/dv_f = (p - y) (sum_g v_g - v_f)
The bias is an ordinary id that every example carries (worker.features.BIAS_ID), so it trains on the servers.
"""

from __future__ import annotations

import numpy as np

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from worker.metrics import sigmoid


class Model:
    name = ""
    table = ""

    def __init__(self, embedding_dim: int, optimizer: OptimizerConfig, init_scale: float = 0.01):
        self.embedding_dim = embedding_dim
        self.optimizer = optimizer
        self.init_scale = init_scale

    @property
    def dim(self) -> int:
        raise NotImplementedError

    def table_configs(self) -> list[TableConfig]:
        init = InitializerConfig("uniform", self.init_scale, seed=0)
        return [TableConfig(self.table, self.dim, init, self.optimizer)]

    def logits(self, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def predict(self, rows: np.ndarray) -> np.ndarray:
        return sigmoid(self.logits(rows))

    def forward_backward(self, rows: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(probabilities (n,), grads shaped like rows) of the summed logloss."""
        raise NotImplementedError


class LogisticRegression(Model):
    name = "lr"
    table = "lr"

    @property
    def dim(self) -> int:
        return 1

    def table_configs(self) -> list[TableConfig]:
        return [TableConfig(self.table, 1, InitializerConfig("zeros", 0.0), self.optimizer)]

    def logits(self, rows: np.ndarray) -> np.ndarray:
        return rows[:, :, 0].sum(axis=1)

    def forward_backward(self, rows, labels):
        p = sigmoid(self.logits(rows))
        g = (p - labels).astype(np.float32)
        return p, np.broadcast_to(g[:, None, None], rows.shape).copy()


class FactorizationMachine(Model):
    name = "fm"
    table = "fm"

    @property
    def dim(self) -> int:
        return 1 + self.embedding_dim

    def _parts(self, rows):
        w, v = rows[:, :, 0], rows[:, :, 1:]
        s = v.sum(axis=1)  # (n, k)
        return w, v, s

    def logits(self, rows: np.ndarray) -> np.ndarray:
        w, v, s = self._parts(rows)
        return w.sum(axis=1) + 0.5 * ((s * s).sum(axis=1) - (v * v).sum(axis=(1, 2)))

    def forward_backward(self, rows, labels):
        w, v, s = self._parts(rows)
        logit = w.sum(axis=1) + 0.5 * ((s * s).sum(axis=1) - (v * v).sum(axis=(1, 2)))
        p = sigmoid(logit)
        g = (p - labels).astype(np.float32)
        grads = np.empty_like(rows)
        grads[:, :, 0] = g[:, None]
        grads[:, :, 1:] = g[:, None, None] * (s[:, None, :] - v)
        return p, grads


MODELS = {cls.name: cls for cls in (LogisticRegression, FactorizationMachine)}

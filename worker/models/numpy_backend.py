"""The models of worker/models/spec.py in numpy, forward and a hand-written backward pass (CPU, float32).

    d loss / d logit = p - y                                        (summed logloss)
    FM:   d/dw_f = p - y;   d/dv_f = (p - y) (sum_g v_g - v_f)
    MLP:  z_i = h_i W_i + b_i, h_{i+1} = relu(z_i);  dW_i = h_i^T dz_i,  db_i = sum dz_i,
          dh_i = dz_i W_i^T,  dz_{i-1} = dh_i * (z_{i-1} > 0);  the input's gradient splits back into the v of
          every field (and the dense features, which take none)
"""

from __future__ import annotations

import numpy as np

from worker.metrics import sigmoid
from worker.models.spec import ModelSpec


class NumpyModel:
    def __init__(self, spec: ModelSpec):
        self.spec = spec

    def _embeddings(self, rows: np.ndarray) -> np.ndarray:
        off, k = self.spec.embedding_offset, self.spec.embedding_dim
        return rows[:, :, off : off + k]

    def _mlp_input(self, rows: np.ndarray, dense_x: np.ndarray) -> np.ndarray:
        n = rows.shape[0]
        v = self._embeddings(rows).reshape(n, -1)
        return np.concatenate([v, dense_x.astype(v.dtype, copy=False)], axis=1)

    def _forward(self, rows, dense_x, params):
        """(logit (n,), MLP activations [h_0, ..., h_L] or None), in the dtype of rows (float32 in training;
        float64 in the finite-difference tests)."""
        spec = self.spec
        rows = np.asarray(rows)
        logit = np.zeros(rows.shape[0], dtype=rows.dtype)
        if spec.name in ("lr", "fm", "deepfm"):
            logit += rows[:, :, 0].sum(axis=1)
        if spec.name in ("fm", "deepfm"):
            v = self._embeddings(rows)
            s = v.sum(axis=1)
            logit += 0.5 * ((s * s).sum(axis=1) - (v * v).sum(axis=(1, 2)))
        hs = None
        if spec.has_mlp:
            hs = [self._mlp_input(rows, dense_x)]
            layers = len(spec.hidden) + 1
            for i in range(layers):
                z = hs[-1] @ params[f"mlp.{i}.weight"] + params[f"mlp.{i}.bias"]
                hs.append(np.maximum(z, 0.0) if i < layers - 1 else z)
            logit += hs[-1][:, 0]
        return logit, hs

    def predict(self, rows, dense_x, params) -> np.ndarray:
        return sigmoid(self._forward(rows, dense_x, params)[0])

    def forward_backward(self, rows, dense_x, params, labels):
        """(probs (n,), d loss / d rows (n, F, sparse_dim), {name: d loss / d param}), float32 for float32 rows."""
        spec = self.spec
        rows = np.asarray(rows)
        logit, hs = self._forward(rows, dense_x, params)
        p = sigmoid(logit)
        g = (p - labels).astype(rows.dtype)
        row_grads = np.zeros_like(rows)
        if spec.name in ("lr", "fm", "deepfm"):
            row_grads[:, :, 0] = g[:, None]
        off, k = spec.embedding_offset, spec.embedding_dim
        if spec.name in ("fm", "deepfm"):
            v = self._embeddings(rows)
            row_grads[:, :, off : off + k] = g[:, None, None] * (v.sum(axis=1)[:, None, :] - v)
        param_grads = {}
        if spec.has_mlp:
            dz = g[:, None]
            for i in range(len(spec.hidden), -1, -1):
                w = params[f"mlp.{i}.weight"]
                param_grads[f"mlp.{i}.weight"] = hs[i].T @ dz
                param_grads[f"mlp.{i}.bias"] = dz.sum(axis=0, keepdims=True)
                dh = dz @ w.T
                dz = dh * (hs[i] > 0) if i > 0 else dh  # hs[i] = relu(z_{i-1}) > 0 exactly where z_{i-1} > 0
            n, fields = rows.shape[:2]
            row_grads[:, :, off : off + k] += dz[:, : fields * k].reshape(n, fields, k)
        return p, row_grads, param_grads

"""The models of worker/models/spec.py in numpy, forward and a hand-written backward pass (CPU).

    d loss / d logit = p - y                                        (summed logloss)
    FM:   d/dw_f = p - y;   d/dv_f = (p - y) (sum_g v_g - v_f)
    MLP:  z_i = h_i W_i + b_i, h_{i+1} = relu(z_i);  dW_i = h_i^T dz_i,  db_i = sum dz_i,
          dh_i = dz_i W_i^T,  dz_{i-1} = dh_i * (z_{i-1} > 0);  the input's gradient splits back into the v of
          every field (and the dense features, which take none)
    DeepFM adds the FM and MLP logits, so d/dv_f is the sum of both parts.

Everything runs in the dtype of rows: float32 in training (every matmul in float32), float64 in the
finite-difference tests.
"""

from __future__ import annotations

import numpy as np

from worker.metrics import sigmoid
from worker.models.spec import ModelSpec


def check_batch(spec: ModelSpec, rows: np.ndarray, dense_x: np.ndarray, labels: np.ndarray | None = None) -> None:
    """Raises ValueError unless rows is (n, num_fields, sparse_dim), dense_x (n, num_dense) and labels (n,)."""
    if rows.ndim != 3 or rows.shape[1:] != (spec.num_fields, spec.sparse_dim):
        raise ValueError(
            f"model {spec.name}: rows have shape {rows.shape}, expected (n, {spec.num_fields}, {spec.sparse_dim})"
        )
    n = rows.shape[0]
    if dense_x.shape != (n, spec.num_dense):
        raise ValueError(f"model {spec.name}: dense_x has shape {dense_x.shape}, expected ({n}, {spec.num_dense})")
    if labels is not None and labels.shape != (n,):
        raise ValueError(f"model {spec.name}: labels have shape {labels.shape}, expected ({n},)")


class NumpyModel:
    """forward_backward / predict of one ModelSpec on numpy arrays.

    rows (n, F, sparse_dim), dense_x (n, num_dense) (0 columns allowed), params {name: (r, c)} as in
    spec.dense_params() ({} for lr and fm), labels (n,) in {0, 1}. Stateless: the parameters live on the servers.
    """

    def __init__(self, spec: ModelSpec):
        self.spec = spec

    def predict(self, rows: np.ndarray, dense_x: np.ndarray, params: dict[str, np.ndarray]) -> np.ndarray:
        """Probabilities (n,), in the dtype of rows."""
        rows, dense_x = np.asarray(rows), np.asarray(dense_x)
        check_batch(self.spec, rows, dense_x)
        return sigmoid(self._forward(rows, dense_x, params)[0])

    def forward_backward(
        self, rows: np.ndarray, dense_x: np.ndarray, params: dict[str, np.ndarray], labels: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(probs (n,), d loss / d rows (n, F, sparse_dim), {name: d loss / d param, shaped like the param}) of
        the summed logloss; the gradients in the dtype of rows (float32 in training)."""
        spec = self.spec
        rows, dense_x, labels = np.asarray(rows), np.asarray(dense_x), np.asarray(labels)
        check_batch(spec, rows, dense_x, labels)
        logit, hs = self._forward(rows, dense_x, params)
        p = sigmoid(logit)
        g = (p - labels).astype(rows.dtype)  # d loss / d logit
        row_grads = np.zeros_like(rows)
        if spec.name != "dnn":
            row_grads[:, :, 0] = g[:, None]
        if spec.name in ("fm", "deepfm"):
            v = self._embeddings(rows)
            row_grads[:, :, self._v_columns] = g[:, None, None] * (v.sum(axis=1)[:, None, :] - v)
        param_grads = {}
        if spec.has_mlp:
            dz = g[:, None]  # d loss / d output of the last layer, (n, 1)
            for i in range(len(spec.hidden), -1, -1):
                param_grads[f"mlp.{i}.weight"] = hs[i].T @ dz
                param_grads[f"mlp.{i}.bias"] = dz.sum(axis=0, keepdims=True)
                dh = dz @ self._param(params, f"mlp.{i}.weight", rows.dtype).T
                dz = dh * (hs[i] > 0) if i > 0 else dh  # hs[i] = relu(z_{i-1}) > 0 exactly where z_{i-1} > 0
            n, fields = rows.shape[:2]
            row_grads[:, :, self._v_columns] += dz[:, : fields * spec.embedding_dim].reshape(n, fields, -1)
        return p, row_grads, param_grads

    @property
    def _v_columns(self) -> slice:
        return slice(self.spec.embedding_offset, self.spec.embedding_offset + self.spec.embedding_dim)

    def _embeddings(self, rows: np.ndarray) -> np.ndarray:
        return rows[:, :, self._v_columns]

    @staticmethod
    def _param(params, name: str, dtype) -> np.ndarray:
        return np.asarray(params[name]).astype(dtype, copy=False)

    def _forward(self, rows: np.ndarray, dense_x: np.ndarray, params):
        """(logit (n,), MLP activations [h_0 = input, h_1, ..., h_L = output (n, 1)] or None)."""
        spec = self.spec
        logit = np.zeros(rows.shape[0], dtype=rows.dtype)
        if spec.name != "dnn":
            logit += rows[:, :, 0].sum(axis=1)
        if spec.name in ("fm", "deepfm"):
            v = self._embeddings(rows)
            s = v.sum(axis=1)
            logit += 0.5 * ((s * s).sum(axis=1) - (v * v).sum(axis=(1, 2)))
        if not spec.has_mlp:
            return logit, None
        n = rows.shape[0]
        hs = [np.concatenate([self._embeddings(rows).reshape(n, -1), dense_x.astype(rows.dtype, copy=False)], axis=1)]
        layers = len(spec.hidden) + 1
        for i in range(layers):
            z = hs[-1] @ self._param(params, f"mlp.{i}.weight", rows.dtype)
            z += self._param(params, f"mlp.{i}.bias", rows.dtype)
            hs.append(np.maximum(z, 0, out=z) if i < layers - 1 else z)
        logit += hs[-1][:, 0]
        return logit, hs

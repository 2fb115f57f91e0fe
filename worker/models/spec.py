"""The parameterization of every model, shared by its backends (numpy with a hand-written backward pass, PyTorch
with autograd): parameter names, shapes, initialization and the forward computation they must agree on.

Inputs of one batch of n examples:
    rows     float32 (n, F, sparse_dim)   the pulled sparse rows, one per field (F = num_fields, the last field
                                          is the bias id every example carries)
    dense_x  float32 (n, num_dense)       numeric features (log1p of the Criteo integer features; 0 if missing)
    params   {name: float32 (r, c)}        dense parameters, held on the servers (see dense_params)
    labels   float32 (n,) in {0, 1}

Models (`k` = embedding_dim; a row of an LR or FM table is [w] or [w | v], of a DNN table [v]):
    lr:      logit = sum_f w_f
    fm:      logit = sum_f w_f + 1/2 (|sum_f v_f|^2 - sum_f |v_f|^2)
    deepfm:  logit = fm logit + mlp([v_0, ..., v_{F-1}, dense_x])        (rows are [w | v])
    dnn:     logit = mlp([v_0, ..., v_{F-1}, dense_x])                    (rows are [v])
    mlp(x):  h_0 = x;  h_{i+1} = relu(h_i @ W_i + b_i) for each hidden layer;  out = h_L @ W_L + b_L  (1 unit)
             W_i is "mlp.{i}.weight" (in, out), b_i is "mlp.{i}.bias" (1, out)
Loss: the sum over the batch of the logloss of sigmoid(logit) (not the mean: gradients of a batch add up the
way the servers' per-id optimizers expect). Backends return probabilities, d loss / d rows (n, F, sparse_dim) and
d loss / d each dense parameter, and must agree to float32 rounding (tests/test_models.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODEL_NAMES = ("lr", "fm", "deepfm", "dnn")
DEFAULT_HIDDEN = (400, 400, 400)  # PaddleRec's Criteo DNN and DeepFM


@dataclass(frozen=True)
class DenseParam:
    """One dense parameter tensor: a weight (in, out) or a bias (1, out)."""

    name: str
    shape: tuple[int, int]
    init: str  # "glorot": uniform in +-sqrt(6 / (in + out)); "zeros"

    @property
    def glorot_scale(self) -> float:
        fan_in, fan_out = self.shape
        return float(np.sqrt(6.0 / (fan_in + fan_out)))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_fields: int  # sparse fields per example, the bias column included
    num_dense: int  # numeric features per example
    embedding_dim: int = 8
    hidden: tuple[int, ...] = DEFAULT_HIDDEN

    def __post_init__(self) -> None:
        if self.name not in MODEL_NAMES:
            raise ValueError(f"model {self.name!r} is unknown; expected one of {list(MODEL_NAMES)}")
        if self.embedding_dim < 1 or any(h < 1 for h in self.hidden):
            raise ValueError("embedding_dim and every hidden width must be >= 1")

    @property
    def has_mlp(self) -> bool:
        return self.name in ("deepfm", "dnn")

    @property
    def sparse_dim(self) -> int:
        """Floats per sparse row."""
        return {"lr": 1, "fm": 1 + self.embedding_dim, "deepfm": 1 + self.embedding_dim, "dnn": self.embedding_dim}[
            self.name
        ]

    @property
    def embedding_offset(self) -> int:
        """Column of v inside a sparse row (FM-style rows start with w)."""
        return 0 if self.name == "dnn" else 1

    @property
    def mlp_input(self) -> int:
        return self.num_fields * self.embedding_dim + self.num_dense

    def dense_params(self) -> list[DenseParam]:
        """The MLP's weights and biases, in layer order (none for lr and fm)."""
        if not self.has_mlp:
            return []
        widths = [self.mlp_input, *self.hidden, 1]
        out = []
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            out.append(DenseParam(f"mlp.{i}.weight", (a, b), "glorot"))
            out.append(DenseParam(f"mlp.{i}.bias", (1, b), "zeros"))
        return out

    def initial_params(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Initial dense parameters drawn locally (for tests and the in-process baseline; a PS run takes its
        initial values from the servers' initializers instead)."""
        rng = np.random.default_rng(seed)
        out = {}
        for p in self.dense_params():
            if p.init == "zeros":
                out[p.name] = np.zeros(p.shape, dtype=np.float32)
            else:
                out[p.name] = rng.uniform(-p.glorot_scale, p.glorot_scale, p.shape).astype(np.float32)
        return out

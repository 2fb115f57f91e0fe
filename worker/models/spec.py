"""The parameterization of every model, shared by its backends (numpy with a hand-written backward pass, PyTorch
with autograd): parameter names, shapes, initialization and the forward computation they must agree on.

Inputs of one batch of n examples (ModelInputs):
    rows     {table: float32 (u_t, row_dim(t))}   the pulled rows of the table's unique ids in the batch
    fields   {field: FieldInput}                    per sparse field, in spec.fields order:
                 index   int64 (nnz,)   the row (in rows[field's table]) of each id of the field's bags
                 offsets int64 (n + 1,) example i's bag is index[offsets[i]:offsets[i + 1]] (may be empty)
                 weights float32 (nnz,) or None (every id weighs 1)
    dense_x  float32 (n, num_dense)                  numeric features
    params   {name: float32 (r, c)}                  dense parameters, held on the servers (see dense_params)
    labels   float32 (n,) in {0, 1}

Rows: a table's row is [w | v] for lr, fm and deepfm ([w] alone for lr) and [v] for dnn; v has the table's
width k_t (its `dim`). Pooling a field's bag of example i into one row-shaped vector p_f (w and v alike):
    sum:    p = sum_j w_j r_j
    mean:   p = sum_j w_j r_j / sum_j |w_j|   (the weighted mean for weights >= 0; never larger than the
                                               largest |r_j|, whatever the weights' signs)
    sqrtn:  p = sum_j w_j r_j / sqrt(sum_j w_j^2)
    (w_j the id's weight, 1 when unweighted; an empty bag, or a zero denominator, pools to 0)
Models (p_f = [pw_f | pv_f] the pooled row of field f; the bias field is an ordinary field whose bag is the
one BIAS id of every example; b = "logit.bias" (1, 1), a dense parameter of every model):
    lr:      logit = b + sum_f pw_f
    fm:      logit = b + sum_f pw_f + 1/2 (|sum_f e_f|^2 - sum_f |e_f|^2)
    deepfm:  logit = fm logit + mlp([pv_0, ..., pv_{F-1}, dense_x])
    dnn:     logit = b + mlp([pv_0, ..., pv_{F-1}, dense_x])
    b is the logit's constant, trained without L2 by the dense optimizer: a run that has its training labels
          before training starts it at their log-odds (worker/dense.py start_logit_bias), so the sparse rows,
          whose optimizer shrinks them towards 0 (a strong l2 on small data), learn how an example differs from
          the base rate, not the base rate itself (benchmarks/small_data.py's imbalanced regime)
    e_f = pv_f when k_t = K, the largest width among the fields' tables; otherwise e_f = pv_f @ P_t with
          P_t = "proj.<table>" (k_t, K), a dense parameter shared by the table's fields (the rule where widths
          differ: FM's pairwise products need one width, so narrower tables are projected up to it; the MLP
          takes every width as it is, concatenated)
    mlp(x):  h_0 = x;  h_{i+1} = dropout(relu(h_i @ W_i + b_i)) for each hidden layer;  out = h_L @ W_L + b_L
             W_i is "mlp.{i}.weight" (in, out), b_i is "mlp.{i}.bias" (1, out); dropout (rate spec.dropout, in
             training only) zeroes each unit with that probability and scales the rest by 1 / (1 - rate)
Loss: the sum over the batch of the logloss of sigmoid(logit) (not the mean: gradients of a batch add up the
way the servers' per-id optimizers expect). Backends return probabilities, d loss / d rows per table (shaped like
rows[table]: the gradient of each unique row, its occurrences summed) and d loss / d each dense parameter, and
must agree to float32 rounding (tests/test_models.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODEL_NAMES = ("lr", "fm", "deepfm", "dnn")
MLP_MODELS = ("deepfm", "dnn")  # the models with an MLP (hidden layers, dropout, dense L2)
POOLINGS = ("sum", "mean", "sqrtn")
DEFAULT_HIDDEN = (400, 400, 400)  # PaddleRec's Criteo DNN and DeepFM
BIAS_FIELD = "_bias"  # the field every example carries, its one id the bias; it looks up the first table
LOGIT_BIAS = "logit.bias"  # the dense parameter b of every model's logit (a ".bias": no dense L2)


def row_floats(model: str, k: int) -> int:
    """Floats per row of a table k wide under model (one of MODEL_NAMES): [w | v] (fm, deepfm), [w] (lr), [v] (dnn)."""
    return {"lr": 1, "fm": 1 + k, "deepfm": 1 + k, "dnn": k}[model]


@dataclass(frozen=True)
class DenseParam:
    """One dense parameter tensor: a weight (in, out) or a bias (1, out), of model `model` (its server table is
    named after both: worker.dense.table_name)."""

    name: str
    shape: tuple[int, int]
    init: str  # "glorot": uniform in +-sqrt(6 / (in + out)); "zeros"
    model: str

    @property
    def glorot_scale(self) -> float:
        fan_in, fan_out = self.shape
        return float(np.sqrt(6.0 / (fan_in + fan_out)))


@dataclass(frozen=True)
class FieldSpec:
    """One sparse field: the table its ids look up, that table's width k (floats of v), how a bag pools."""

    name: str
    table: str
    dim: int
    pooling: str = "sum"

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"field {self.name}: pooling {self.pooling!r}, expected one of {list(POOLINGS)}")
        if self.dim < 1:
            raise ValueError(f"field {self.name}: dim {self.dim}, expected >= 1")


@dataclass(frozen=True)
class FieldInput:
    """One field's bags as indices into its table's unique rows (see the module docstring). one_per_bag: every
    bag holds exactly one id, unweighted (a categorical field; pooling is a gather): a hint the backends' input
    check verifies in one comparison, and sets on the fields it returns."""

    index: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray | None = None
    one_per_bag: bool = False


@dataclass
class ModelInputs:
    """One batch as the backends take it (see the module docstring)."""

    rows: dict[str, np.ndarray]
    fields: dict[str, FieldInput]
    dense_x: np.ndarray

    @property
    def n(self) -> int:
        return self.dense_x.shape[0]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    fields: tuple[FieldSpec, ...]  # the bias field included (BIAS_FIELD, last)
    num_dense: int  # numeric features per example
    hidden: tuple[int, ...] = DEFAULT_HIDDEN
    dropout: float = 0.0  # of the MLP's hidden units, in training

    def __post_init__(self) -> None:
        if self.name not in MODEL_NAMES:
            raise ValueError(f"model {self.name!r} is unknown; expected one of {list(MODEL_NAMES)}")
        if not self.fields:
            raise ValueError("a model needs at least one sparse field")
        if any(h < 1 for h in self.hidden):
            raise ValueError("every hidden width must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout {self.dropout}, expected in [0, 1)")
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"field names repeat: {names}")
        for f in self.fields:
            if self.table_dims()[f.table] != f.dim:
                raise ValueError(
                    f"table {f.table} has two widths among the fields: {self.table_dims()[f.table]}, {f.dim}"
                )

    def table_dims(self) -> dict[str, int]:
        """{table: its width k}, tables in the order their first field comes."""
        out: dict[str, int] = {}
        for f in self.fields:
            out.setdefault(f.table, f.dim)
        return out

    @property
    def has_mlp(self) -> bool:
        return self.name in MLP_MODELS

    @property
    def has_fm(self) -> bool:
        return self.name in ("fm", "deepfm")

    def row_dim(self, table: str) -> int:
        """Floats per row of a table: [w | v], [w] or [v]."""
        return row_floats(self.name, self.table_dims()[table])

    @property
    def embedding_offset(self) -> int:
        """Column of v inside a row (FM-style rows start with w)."""
        return 0 if self.name == "dnn" else 1

    @property
    def fm_width(self) -> int:
        """K: the width FM's pairwise products are taken at, the widest table."""
        return max(self.table_dims().values())

    @property
    def mlp_input(self) -> int:
        return sum(f.dim for f in self.fields) + self.num_dense

    @property
    def mlp_output(self) -> str | None:
        """The dense parameter of the MLP's output layer's weight ("mlp.{L}.weight", (hidden[-1], 1)); None
        without an MLP."""
        return f"mlp.{len(self.hidden)}.weight" if self.has_mlp else None

    def mlp_weights(self) -> list[str]:
        """The MLP's weights ("mlp.{i}.weight", in layer order; none without an MLP): the dense parameters
        --dense-l2 regularizes (not the biases, nor FM's projections)."""
        return [f"mlp.{i}.weight" for i in range(len(self.hidden) + 1)] if self.has_mlp else []

    def dense_params(self) -> list[DenseParam]:
        """FM's projections ("proj.<table>", for tables narrower than fm_width), then the MLP's weights and
        biases in layer order, then the logit bias (LOGIT_BIAS); for lr, and fm over tables of one width, the
        logit bias alone."""
        out = []
        if self.has_fm:
            for table, k in self.table_dims().items():
                if k != self.fm_width:
                    out.append(DenseParam(f"proj.{table}", (k, self.fm_width), "glorot", self.name))
        if self.has_mlp:
            widths = [self.mlp_input, *self.hidden, 1]
            for i, (a, b) in enumerate(zip(widths, widths[1:])):
                out.append(DenseParam(f"mlp.{i}.weight", (a, b), "glorot", self.name))
                out.append(DenseParam(f"mlp.{i}.bias", (1, b), "zeros", self.name))
        out.append(DenseParam(LOGIT_BIAS, (1, 1), "zeros", self.name))
        return out

    def initial_params(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Initial dense parameters drawn locally (for tests; a PS run takes its initial values from the servers'
        initializers instead)."""
        rng = np.random.default_rng(seed)
        out = {}
        for p in self.dense_params():
            if p.init == "zeros":
                out[p.name] = np.zeros(p.shape, dtype=np.float32)
            else:
                out[p.name] = rng.uniform(-p.glorot_scale, p.glorot_scale, p.shape).astype(np.float32)
        return out


def uniform_fields(num_fields: int, dim: int, table: str = "t", pooling: str = "sum") -> tuple[FieldSpec, ...]:
    """num_fields fields f0.. on one table of width dim, the last of them the bias field (for tests that
    need a plain model)."""
    names = [f"f{i}" for i in range(num_fields - 1)] + [BIAS_FIELD]
    return tuple(FieldSpec(name, table, dim, pooling) for name in names)

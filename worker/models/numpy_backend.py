"""The models of worker/models/spec.py in numpy, forward and a hand-written backward pass (CPU).

    d loss / d logit = g = p - y                                    (summed logloss)
    every model: d/db = sum g (b the logit bias)
    LR, FM:  d/dpw_f = g
    FM:      d/de_f = g (S - e_f), S = sum_g e_g;  a projected field (e_f = pv_f P_t) passes on
             d/dpv_f = d/de_f P_t^T and adds pv_f^T d/de_f into d/dP_t
    MLP:     z_i = h_i W_i + b_i, h_{i+1} = m_i * relu(z_i) (m_i the dropout mask, 1 without dropout);
             dW_i = h_i^T dz_i, db_i = sum dz_i, dh_i = dz_i W_i^T, dz_{i-1} = dh_i * m_{i-1} * (z_{i-1} > 0);
             dh_0 splits back into the pv of every field (the dense features take none)
    DeepFM adds the FM and MLP logits, so d/dpv_f is the sum of both parts. Each field's d/dp_f then flows
    through its pooling into the rows of its table (worker/models/pooling.py), the fields of one table adding up.

Everything runs in the dtype of the rows, at least float32: float32 in training (every matmul in float32; float16
rows as well, as the torch backend takes them), float64 in the finite-difference tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.metrics import sigmoid
from worker.models.pooling import checked_bags, checked_index, one_id_per_bag, pool, pool_backward
from worker.models.spec import LOGIT_BIAS, FieldInput, ModelInputs, ModelSpec

ROW_FLOAT_BYTES = (2, 4, 8)  # float16, float32, float64 rows, of either byte order; float16 computed in float32


def check_inputs(
    spec: ModelSpec, inputs: ModelInputs, params: dict[str, np.ndarray], labels: np.ndarray | None = None
) -> dict[str, FieldInput]:
    """The fields of a batch with int64 index and offsets, in spec.fields order; ValueError unless rows hold
    exactly the spec's tables at their row widths (floats of ROW_FLOAT_BYTES), fields exactly the spec's fields as valid
    bags over their table's rows, one bag per example, dense_x is (n, num_dense), params exactly spec.dense_params()
    at their shapes and labels (n,)."""
    dense_x = np.asarray(inputs.dense_x)
    if dense_x.ndim != 2 or dense_x.shape[1] != spec.num_dense:
        raise ValueError(f"model {spec.name}: dense_x has shape {dense_x.shape}, expected (n, {spec.num_dense})")
    n = dense_x.shape[0]
    _check_names("rows", inputs.rows, spec.table_dims(), spec.name)
    for table in spec.table_dims():
        rows = np.asarray(inputs.rows[table])
        if (
            rows.ndim != 2
            or rows.shape[1] != spec.row_dim(table)
            or rows.dtype.kind != "f"
            or rows.dtype.itemsize not in ROW_FLOAT_BYTES
        ):
            raise ValueError(
                f"model {spec.name}: rows of table {table} have shape {rows.shape} and dtype {rows.dtype}, "
                f"expected float16, float32 or float64 (u, {spec.row_dim(table)})"
            )
    _check_names("fields", inputs.fields, [f.name for f in spec.fields], spec.name)
    fields = {}
    one_each = np.arange(n + 1, dtype=np.int64)  # the offsets of one id per example
    for f in spec.fields:
        given = inputs.fields[f.name]
        what = f"model {spec.name}: field {f.name}"
        num_rows = len(inputs.rows[f.table])
        if given.one_per_bag and given.weights is None and np.array_equal(given.offsets, one_each):
            index = checked_index(given.index, num_rows, n, what)
            fields[f.name] = FieldInput(index, one_each, None, True)
        else:
            index, offsets, weights = checked_bags(given.index, given.offsets, given.weights, num_rows, n, what)
            fields[f.name] = FieldInput(index, offsets, weights, one_id_per_bag(offsets, weights))
    shapes = {p.name: p.shape for p in spec.dense_params()}
    _check_names("params", params, shapes, spec.name)
    for name, shape in shapes.items():
        if np.shape(params[name]) != shape:
            raise ValueError(f"model {spec.name}: param {name} has shape {np.shape(params[name])}, expected {shape}")
    if labels is not None and np.shape(labels) != (n,):
        raise ValueError(f"model {spec.name}: labels have shape {np.shape(labels)}, expected ({n},)")
    return fields


def _check_names(what: str, given: dict, expected, model: str) -> None:
    missing, unknown = [k for k in expected if k not in given], [k for k in given if k not in expected]
    if missing or unknown:
        raise ValueError(f"model {model}: {what} lack {missing} and hold unknown {unknown}, expected {list(expected)}")


def probabilities(logit: np.ndarray) -> np.ndarray:
    """sigmoid(logit), NaN where the logit is Inf or NaN. The rows and parameters a model gets are finite, so an Inf
    logit is float32 overflowing in the model (a diverged model, or huge numbers in the data), not a certain 0 or
    1; its NaN is what the step's check_finite and scoring's checked_probabilities report."""
    p = sigmoid(logit)
    overflowed = ~np.isfinite(logit)
    if overflowed.any():
        p[overflowed] = np.nan
    return p


@dataclass
class _Forward:
    """What the backward pass needs of the forward one."""

    logit: np.ndarray  # (n,)
    pooled: dict[str, np.ndarray]  # {field: p_f (n, row_dim)}
    fm_e: dict[str, np.ndarray] | None  # {field: e_f (n, K)}
    fm_sum: np.ndarray | None  # S (n, K)
    hs: list[np.ndarray] | None  # MLP activations [h_0 = input, ..., h_L], then the output (n, 1)
    masks: list[np.ndarray | None] | None  # dropout mask of each hidden layer (None: no dropout)


class NumpyModel:
    """predict / forward_backward of one ModelSpec on numpy arrays.

    inputs: ModelInputs (spec.py); params {name: (r, c)} exactly spec.dense_params() ({} for lr, and for fm over
    one width); labels (n,) in {0, 1}. The parameters live on the servers; the model holds only the generator of
    its dropout masks (seeded by `seed`), drawn in forward_backward (training) and never in predict.
    """

    def __init__(self, spec: ModelSpec, seed: int = 0):
        self.spec = spec
        self.rng = np.random.default_rng(seed)

    def predict(self, inputs: ModelInputs, params: dict[str, np.ndarray]) -> np.ndarray:
        """Probabilities (n,), in the dtype of the rows (float32 for float16 rows)."""
        fields = check_inputs(self.spec, inputs, params)
        return probabilities(self._forward(inputs, fields, params, training=False).logit)

    def forward_backward(
        self, inputs: ModelInputs, params: dict[str, np.ndarray], labels: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(probs (n,), {table: d loss / d rows[table]}, {name: d loss / d param, shaped like the param}) of the
        summed logloss; the gradients in the dtype of the rows (float32 in training, and for float16 rows)."""
        spec = self.spec
        fields = check_inputs(spec, inputs, params, labels)
        fwd = self._forward(inputs, fields, params, training=True)
        p = probabilities(fwd.logit)
        dtype = fwd.logit.dtype
        g = (p - np.asarray(labels, dtype=dtype)).astype(dtype)  # d loss / d logit
        grad_pooled = {name: np.zeros_like(pooled) for name, pooled in fwd.pooled.items()}
        if spec.name != "dnn":
            for grad in grad_pooled.values():
                grad[:, 0] = g
        param_grads = {LOGIT_BIAS: g.sum(dtype=dtype).reshape(1, 1)}
        if spec.has_fm:
            self._fm_backward(fwd, g, params, grad_pooled, param_grads)
        if spec.has_mlp:
            self._mlp_backward(fwd, g, params, grad_pooled, param_grads)
        row_grads = {table: np.zeros(np.shape(inputs.rows[table]), dtype=dtype) for table in spec.table_dims()}
        for f in spec.fields:
            field = fields[f.name]
            out = row_grads[f.table]
            pool_backward(grad_pooled[f.name], field.index, field.offsets, field.weights, f.pooling, len(out), out)
        return p, row_grads, param_grads

    def _v(self, pooled: np.ndarray, k: int) -> np.ndarray:
        off = self.spec.embedding_offset
        return pooled[:, off : off + k]

    def _forward(
        self, inputs: ModelInputs, fields: dict[str, FieldInput], params: dict[str, np.ndarray], training: bool
    ) -> _Forward:
        spec = self.spec
        dtype = np.result_type(np.float32, *inputs.rows.values())  # the compiled pooling takes no float16
        rows = {table: np.asarray(r, dtype=dtype) for table, r in inputs.rows.items()}
        pooled = {}
        for f in spec.fields:
            field = fields[f.name]
            pooled[f.name] = pool(rows[f.table], field.index, field.offsets, field.weights, f.pooling)
        n = len(inputs.dense_x)
        fwd = _Forward(np.full(n, _param(params, LOGIT_BIAS, dtype)[0, 0], dtype=dtype), pooled, None, None, None, None)
        if spec.name != "dnn":
            for p in pooled.values():
                fwd.logit += p[:, 0]
        if spec.has_fm:
            fwd.fm_e = {}
            for f in spec.fields:
                v = self._v(pooled[f.name], f.dim)
                fwd.fm_e[f.name] = v if f.dim == spec.fm_width else v @ _param(params, f"proj.{f.table}", dtype)
            fwd.fm_sum = sum(fwd.fm_e.values())
            squares = sum(np.einsum("ij,ij->i", e, e) for e in fwd.fm_e.values())
            fwd.logit += 0.5 * (np.einsum("ij,ij->i", fwd.fm_sum, fwd.fm_sum) - squares)
        if spec.has_mlp:
            x = np.empty((n, spec.mlp_input), dtype=dtype)
            col = 0
            for f in spec.fields:
                x[:, col : col + f.dim] = self._v(pooled[f.name], f.dim)
                col += f.dim
            x[:, col:] = inputs.dense_x
            fwd.hs, fwd.masks = self._mlp_forward(x, params, training and spec.dropout > 0)
            fwd.logit += fwd.hs[-1][:, 0]
        return fwd

    def _mlp_forward(
        self, x: np.ndarray, params: dict[str, np.ndarray], dropout: bool
    ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        hs, masks = [x], []
        layers = len(self.spec.hidden) + 1
        for i in range(layers):
            z = hs[-1] @ _param(params, f"mlp.{i}.weight", x.dtype)
            z += _param(params, f"mlp.{i}.bias", x.dtype)
            if i < layers - 1:
                np.maximum(z, 0, out=z)
                mask = self._dropout_mask(z.shape, x.dtype) if dropout else None
                if mask is not None:
                    z *= mask
                masks.append(mask)
            hs.append(z)
        return hs, masks

    def skip_masks(self, n: int) -> None:
        """Draws, and drops, the dropout masks forward_backward draws in training for a batch of n examples: a
        resumed run (--skip-examples) calls it for each batch it skips, so that its steps draw the masks a run
        never stopped draws in the same steps."""
        if self.spec.has_mlp and self.spec.dropout > 0:
            for width in self.spec.hidden:
                self._dropout_mask((n, width), np.dtype(np.float32))

    def _dropout_mask(self, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
        """0 with probability spec.dropout, 1 / (1 - dropout) otherwise."""
        rate = self.spec.dropout
        keep = self.rng.random(shape, dtype=np.float32) >= rate
        return keep.astype(dtype) * dtype.type(1.0 / (1.0 - rate))

    def _fm_backward(self, fwd: _Forward, g: np.ndarray, params: dict, grad_pooled: dict, param_grads: dict) -> None:
        spec = self.spec
        for f in spec.fields:
            grad_e = g[:, None] * (fwd.fm_sum - fwd.fm_e[f.name])
            grad_v = self._v(grad_pooled[f.name], f.dim)
            if f.dim == spec.fm_width:
                grad_v += grad_e
                continue
            name = f"proj.{f.table}"
            grad_v += grad_e @ _param(params, name, g.dtype).T
            grad_proj = self._v(fwd.pooled[f.name], f.dim).T @ grad_e
            if name in param_grads:
                param_grads[name] += grad_proj
            else:
                param_grads[name] = grad_proj

    def _mlp_backward(self, fwd: _Forward, g: np.ndarray, params: dict, grad_pooled: dict, param_grads: dict) -> None:
        spec = self.spec
        hs, masks = fwd.hs, fwd.masks
        dz = g[:, None]  # d loss / d output of the last layer, (n, 1)
        for i in range(len(spec.hidden), -1, -1):
            param_grads[f"mlp.{i}.weight"] = hs[i].T @ dz
            param_grads[f"mlp.{i}.bias"] = dz.sum(axis=0, keepdims=True)
            dh = dz @ _param(params, f"mlp.{i}.weight", g.dtype).T
            if i > 0:  # hs[i] = m * relu(z_{i-1}) > 0 exactly where z_{i-1} > 0 and the unit is kept
                if masks[i - 1] is not None:
                    dh *= masks[i - 1]
                dh *= hs[i] > 0
            dz = dh
        col = 0
        for f in spec.fields:
            grad_v = self._v(grad_pooled[f.name], f.dim)
            grad_v += dz[:, col : col + f.dim]
            col += f.dim


def _param(params: dict[str, np.ndarray], name: str, dtype: np.dtype) -> np.ndarray:
    return np.asarray(params[name]).astype(dtype, copy=False)

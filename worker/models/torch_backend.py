"""The models of worker/models/spec.py in PyTorch: the same forward, gradients by autograd, on the CPU or a
CUDA device, float32 throughout. Takes and returns numpy arrays like worker.models.numpy_backend.NumpyModel, so
the training loop does not care which backend runs. Imports torch: callers import this module lazily."""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F

from worker.models.numpy_backend import check_inputs
from worker.models.pooling import scaled_weights
from worker.models.spec import LOGIT_BIAS, FieldInput, ModelInputs, ModelSpec


def worker_device(device: str, exclusive: bool = False) -> str:
    """The device of this worker: "cpu" and "cuda:i" as they are; "cuda" the GPU of its LOCAL_RANK (ps-worker
    launch and torchrun set it): cuda:<LOCAL_RANK> when exclusive (--dense allreduce; 0 when LOCAL_RANK is unset;
    ValueError when torch sees GPUs but not that one), else cuda:<LOCAL_RANK mod the GPUs torch sees> (workers of a
    machine spread over its GPUs, sharing them when they are more), or "cuda" itself (the current GPU) without
    LOCAL_RANK. Any device as it is where torch sees no GPU (TorchModel says so, with what to do)."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or index:
        return device
    count = torch.cuda.device_count()
    local = os.environ.get("LOCAL_RANK", "")
    if count == 0 or (not local and not exclusive):
        return device
    local = local or "0"
    if not local.isdigit():
        raise ValueError(f"--device cuda: LOCAL_RANK {local!r} is not a GPU index")
    if not exclusive:
        return f"cuda:{int(local) % count}"
    if int(local) >= count:
        raise ValueError(
            f"--dense allreduce on cuda: this worker's GPU would be cuda:{local} (LOCAL_RANK {local}), but torch "
            f"sees {count} GPU{'s' * (count != 1)}; nccl wants a GPU of its own for each worker: start at most one "
            "cuda worker per GPU on each machine, or use --dense ps, whose workers may share a GPU"
        )
    return f"cuda:{int(local)}"


def pool_torch(rows: torch.Tensor, field: FieldInput, mode: str) -> torch.Tensor:
    """(n, d) pooled bags of rows (u, d) on rows' device, as worker/models/pooling.py pools them: one id per bag
    and no weights is a gather; otherwise a weighted sum (embedding_bag), each weight times its bag's scale
    (scaled_weights) for mean and sqrtn. field holds valid int64 bags, one_per_bag set
    (worker.models.numpy_backend.check_inputs)."""
    device = rows.device
    index = _tensor(field.index, device, np.int64)
    if field.one_per_bag:
        return rows.index_select(0, index)
    weights = field.weights if mode == "sum" else scaled_weights(field.offsets, field.weights, mode)
    weights = None if weights is None else _tensor(weights, device)
    offsets = _tensor(field.offsets, device, np.int64)
    return F.embedding_bag(index, rows, offsets, mode="sum", per_sample_weights=weights, include_last_offset=True)


def _tensor(a: np.ndarray, device: torch.device, dtype: type = np.float32) -> torch.Tensor:
    """a as a tensor on device (sharing a writable array's memory on the CPU when it has the dtype already)."""
    a = np.ascontiguousarray(a, dtype=dtype)
    if not a.flags.writeable:  # torch warns on read-only arrays (np.frombuffer, np.broadcast_to)
        a = a.copy()
    return torch.as_tensor(a, device=device)


class TorchModel:
    """predict / forward_backward of one ModelSpec with torch autograd on `device` ("cpu", "cuda", "cuda:1").

    Same inputs and outputs as NumpyModel, float32 numpy on the CPU; dropout masks come from a torch generator
    on the device seeded by `seed` (any int, as NumpyModel's: taken modulo 2**64), drawn in forward_backward only.
    Raises ValueError for a CUDA device when torch sees none.
    """

    def __init__(self, spec: ModelSpec, device: str = "cpu", seed: int = 0):
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(
                f"--device {device}: no CUDA device is available to torch {torch.__version__} "
                "(run with --device cpu, or on a machine with an NVIDIA GPU and a CUDA build of torch)"
            )
        self.spec = spec
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed % 2**64)  # torch's seeds end at 2**64; make_backend's reach 2**73

    def predict(self, inputs: ModelInputs, params: dict[str, np.ndarray]) -> np.ndarray:
        """Probabilities (n,) float32."""
        fields = check_inputs(self.spec, inputs, params)
        with torch.no_grad():
            rows = {table: self._tensor(r) for table, r in inputs.rows.items()}
            params_t = {name: self._tensor(value) for name, value in params.items()}
            logit = self._logit(rows, fields, self._tensor(inputs.dense_x), params_t, training=False)
            return _probabilities(logit).cpu().numpy()

    def forward_backward(
        self, inputs: ModelInputs, params: dict[str, np.ndarray], labels: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(probs (n,), {table: d loss / d rows[table]}, {name: d loss / d param}) of the summed logloss, float32
        numpy on the CPU."""
        fields = check_inputs(self.spec, inputs, params, labels)
        rows = {table: self._tensor(r, requires_grad=True) for table, r in inputs.rows.items()}
        params_t = {name: self._tensor(value, requires_grad=True) for name, value in params.items()}
        logit = self._logit(rows, fields, self._tensor(inputs.dense_x), params_t, training=True)
        loss = F.binary_cross_entropy_with_logits(logit, self._tensor(labels), reduction="sum")
        loss.backward()
        probs = _probabilities(logit.detach()).cpu().numpy()
        row_grads = {table: _grad_of(t) for table, t in rows.items()}
        return probs, row_grads, {name: _grad_of(t) for name, t in params_t.items()}

    def _tensor(self, a: np.ndarray, requires_grad: bool = False) -> torch.Tensor:
        """A float32 leaf tensor on the model's device."""
        return _tensor(a, self.device).requires_grad_(requires_grad)

    def _logit(
        self,
        rows: dict[str, torch.Tensor],
        fields: dict[str, FieldInput],
        dense_x: torch.Tensor,
        params: dict[str, torch.Tensor],
        training: bool,
    ) -> torch.Tensor:
        spec = self.spec
        n = dense_x.shape[0]
        logit = params[LOGIT_BIAS][0, 0].expand(n)
        stacked = self._stacked(rows, fields)
        if stacked is not None:  # one table, one id per bag: one gather for every field, (n, fields, width)
            off, dim = spec.embedding_offset, spec.fields[0].dim
            vs = stacked[:, :, off : off + dim]
            if spec.name != "dnn":
                logit = logit + stacked[:, :, 0].sum(dim=1)
            if spec.has_fm:
                s = vs.sum(dim=1)
                logit = logit + 0.5 * ((s * s).sum(dim=1) - (vs * vs).sum(dim=(1, 2)))
            if spec.has_mlp:
                logit = logit + self._mlp(torch.cat([vs.flatten(1), dense_x], dim=1), params, training)
            return logit
        pooled = {f.name: pool_torch(rows[f.table], fields[f.name], f.pooling) for f in spec.fields}
        off = spec.embedding_offset
        v = {f.name: pooled[f.name][:, off : off + f.dim] for f in spec.fields}
        if spec.name != "dnn":
            logit = logit + sum(p[:, 0] for p in pooled.values())
        if spec.has_fm:
            e = [v[f.name] if f.dim == spec.fm_width else v[f.name] @ params[f"proj.{f.table}"] for f in spec.fields]
            s = sum(e)
            logit = logit + 0.5 * ((s * s).sum(dim=1) - sum((x * x).sum(dim=1) for x in e))
        if spec.has_mlp:
            logit = logit + self._mlp(torch.cat([v[f.name] for f in spec.fields] + [dense_x], dim=1), params, training)
        return logit

    def _stacked(self, rows: dict[str, torch.Tensor], fields: dict[str, FieldInput]) -> torch.Tensor | None:
        """The rows of every field gathered at once, (n, fields, width), when every field is of one table and
        holds one id per bag without weights (pooling is then a gather, whatever its mode); else None."""
        spec = self.spec
        if len(rows) != 1 or not all(fields[f.name].one_per_bag for f in spec.fields):
            return None
        table = next(iter(rows.values()))
        index = np.stack([fields[f.name].index for f in spec.fields], axis=1)
        gathered = table.index_select(0, _tensor(index.reshape(-1), self.device, np.int64))
        return gathered.view(index.shape[0], len(spec.fields), table.shape[1])

    def _mlp(self, h: torch.Tensor, params: dict[str, torch.Tensor], training: bool) -> torch.Tensor:
        """The MLP's output (n,) of its input h."""
        layers = len(self.spec.hidden) + 1
        for i in range(layers):
            h = h @ params[f"mlp.{i}.weight"] + params[f"mlp.{i}.bias"]
            if i < layers - 1:
                h = torch.relu(h)
                if training and self.spec.dropout > 0:
                    h = h * self._dropout_mask(h.shape)
        return h[:, 0]

    def skip_masks(self, n: int) -> None:
        """Draws, and drops, the dropout masks forward_backward draws in training for a batch of n examples (as
        NumpyModel.skip_masks: a resumed run's steps then draw the masks of a run never stopped)."""
        if self.spec.has_mlp and self.spec.dropout > 0:
            for width in self.spec.hidden:
                self._dropout_mask((n, width))

    def _dropout_mask(self, shape: tuple[int, ...]) -> torch.Tensor:
        """0 with probability spec.dropout, 1 / (1 - dropout) otherwise."""
        rate = self.spec.dropout
        draws = torch.rand(shape, generator=self.generator, device=self.device)
        return (draws >= rate).to(torch.float32) * (1.0 / (1.0 - rate))


def _probabilities(logit: torch.Tensor) -> torch.Tensor:
    """sigmoid(logit), NaN where the logit is Inf or NaN (float32 overflowing in the model: numpy_backend's
    probabilities)."""
    return torch.sigmoid(logit).masked_fill(~torch.isfinite(logit), float("nan"))


def _grad_of(t: torch.Tensor) -> np.ndarray:
    """t's gradient as float32 numpy (zeros where autograd reached none of it)."""
    if t.grad is None:
        return np.zeros(tuple(t.shape), dtype=np.float32)
    return t.grad.cpu().numpy()

"""The models of worker/models/spec.py in PyTorch: the same forward, gradients by autograd, on the CPU or a
CUDA device. Takes and returns numpy arrays (float32), like worker.models.numpy_backend.NumpyModel, so the
training loop does not care which backend runs."""

from __future__ import annotations

import numpy as np
import torch

from worker.models.spec import ModelSpec


class TorchModel:
    def __init__(self, spec: ModelSpec, device: str = "cpu"):
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(
                f"--device {device}: no CUDA device is available to torch {torch.__version__} "
                "(run with --device cpu, or on a machine with an NVIDIA GPU and a CUDA build of torch)"
            )
        self.spec = spec
        self.device = torch.device(device)

    def _tensor(self, a: np.ndarray, grad: bool = False) -> torch.Tensor:
        t = torch.as_tensor(np.ascontiguousarray(a, dtype=np.float32), device=self.device)
        return t.requires_grad_(grad)

    def _logit(self, rows: torch.Tensor, dense_x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        spec = self.spec
        logit = torch.zeros(rows.shape[0], dtype=torch.float32, device=self.device)
        if spec.name in ("lr", "fm", "deepfm"):
            logit = logit + rows[:, :, 0].sum(dim=1)
        off, k = spec.embedding_offset, spec.embedding_dim
        v = rows[:, :, off : off + k]
        if spec.name in ("fm", "deepfm"):
            s = v.sum(dim=1)
            logit = logit + 0.5 * ((s * s).sum(dim=1) - (v * v).sum(dim=(1, 2)))
        if spec.has_mlp:
            h = torch.cat([v.reshape(rows.shape[0], -1), dense_x], dim=1)
            layers = len(spec.hidden) + 1
            for i in range(layers):
                h = h @ params[f"mlp.{i}.weight"] + params[f"mlp.{i}.bias"]
                if i < layers - 1:
                    h = torch.relu(h)
            logit = logit + h[:, 0]
        return logit

    def predict(self, rows, dense_x, params) -> np.ndarray:
        with torch.no_grad():
            p = {k: self._tensor(v) for k, v in params.items()}
            logit = self._logit(self._tensor(rows), self._tensor(dense_x), p)
            return torch.sigmoid(logit).cpu().numpy()

    def forward_backward(self, rows, dense_x, params, labels):
        """(probs (n,), d loss / d rows (n, F, sparse_dim), {name: d loss / d param}), float32 numpy."""
        rows_t = self._tensor(rows, grad=True)
        params_t = {k: self._tensor(v, grad=True) for k, v in params.items()}
        logit = self._logit(rows_t, self._tensor(dense_x), params_t)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, self._tensor(labels), reduction="sum")
        loss.backward()
        probs = torch.sigmoid(logit.detach()).cpu().numpy()
        return probs, rows_t.grad.cpu().numpy(), {k: t.grad.cpu().numpy() for k, t in params_t.items()}

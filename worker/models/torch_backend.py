"""The models of worker/models/spec.py in PyTorch: the same forward, gradients by autograd, on the CPU or a
CUDA device, float32 throughout. Takes and returns numpy arrays like worker.models.numpy_backend.NumpyModel, so
the training loop does not care which backend runs. Imports torch: callers import this module lazily."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from worker.models.numpy_backend import check_batch
from worker.models.spec import ModelSpec


class TorchModel:
    """forward_backward / predict of one ModelSpec with torch autograd on `device` ("cpu", "cuda", "cuda:1").

    Same inputs and outputs as NumpyModel: rows (n, F, sparse_dim), dense_x (n, num_dense), params {name: (r, c)},
    labels (n,); returns float32 numpy on the CPU. Raises ValueError for a CUDA device when torch sees none.
    """

    def __init__(self, spec: ModelSpec, device: str = "cpu"):
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(
                f"--device {device}: no CUDA device is available to torch {torch.__version__} "
                "(run with --device cpu, or on a machine with an NVIDIA GPU and a CUDA build of torch)"
            )
        self.spec = spec
        self.device = torch.device(device)

    def predict(self, rows: np.ndarray, dense_x: np.ndarray, params: dict[str, np.ndarray]) -> np.ndarray:
        """Probabilities (n,) float32."""
        check_batch(self.spec, np.asarray(rows), np.asarray(dense_x))
        with torch.no_grad():
            params_t = {name: self._tensor(value) for name, value in params.items()}
            logit = self._logit(self._tensor(rows), self._tensor(dense_x), params_t)
            return torch.sigmoid(logit).cpu().numpy()

    def forward_backward(
        self, rows: np.ndarray, dense_x: np.ndarray, params: dict[str, np.ndarray], labels: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(probs (n,), d loss / d rows (n, F, sparse_dim), {name: d loss / d param}) of the summed logloss,
        float32 numpy on the CPU."""
        check_batch(self.spec, np.asarray(rows), np.asarray(dense_x), np.asarray(labels))
        rows_t = self._tensor(rows, requires_grad=True)
        params_t = {name: self._tensor(value, requires_grad=True) for name, value in params.items()}
        logit = self._logit(rows_t, self._tensor(dense_x), params_t)
        loss = F.binary_cross_entropy_with_logits(logit, self._tensor(labels), reduction="sum")
        loss.backward()
        probs = torch.sigmoid(logit.detach()).cpu().numpy()
        param_grads = {name: t.grad.cpu().numpy() for name, t in params_t.items()}
        return probs, rows_t.grad.cpu().numpy(), param_grads

    def _tensor(self, a, requires_grad: bool = False) -> torch.Tensor:
        """A float32 leaf tensor on self.device (sharing a writable float32 array's memory on the CPU)."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        if not a.flags.writeable:  # torch warns on read-only arrays (np.frombuffer, np.broadcast_to)
            a = a.copy()
        return torch.as_tensor(a, device=self.device).requires_grad_(requires_grad)

    def _logit(self, rows: torch.Tensor, dense_x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        spec = self.spec
        n = rows.shape[0]
        logit = torch.zeros(n, dtype=torch.float32, device=self.device)
        if spec.name != "dnn":
            logit = logit + rows[:, :, 0].sum(dim=1)
        v = rows[:, :, spec.embedding_offset : spec.embedding_offset + spec.embedding_dim]
        if spec.name in ("fm", "deepfm"):
            s = v.sum(dim=1)
            logit = logit + 0.5 * ((s * s).sum(dim=1) - (v * v).sum(dim=(1, 2)))
        if spec.has_mlp:
            h = torch.cat([v.reshape(n, -1), dense_x], dim=1)
            layers = len(spec.hidden) + 1
            for i in range(layers):
                h = h @ params[f"mlp.{i}.weight"] + params[f"mlp.{i}.bias"]
                if i < layers - 1:
                    h = torch.relu(h)
            logit = logit + h[:, 0]
        return logit

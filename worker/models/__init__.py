"""CTR models that run on the worker: forward and backward over pulled embedding rows.

A model names the sparse tables it needs (`table_configs`) and turns the rows pulled for a batch into
predictions and per-row gradients. Rows and grads are (batch, fields, dim) arrays, one table per model here.
"""

from worker.models.numpy_models import MODELS, FactorizationMachine, LogisticRegression, Model

__all__ = ["MODELS", "FactorizationMachine", "LogisticRegression", "Model"]

"""Dense parameters (MLP weights and biases) held on the parameter servers, pulled and pushed by workers.

Each dense parameter of shape (r, c) is a table of its own, "dense.<name>", with dim c and the ids 0..r-1 as its
rows: the servers store, journal, checkpoint and optimize it exactly like a sparse table (its rows spread over
the shards by id, so one big matrix loads every server a little). The table's initializer gives every worker
the same initial values (uniform in +-glorot_scale, or zeros, seeded by the parameter's name); its optimizer
(Adam by default) runs on the servers, so a numpy worker and a torch worker share one model.

A worker pulls every dense parameter at the start, adds up its gradients, and every `sync_every` steps pushes
the sum and takes the new values the push returns: between syncs it computes with the values of the last sync.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from worker.models.spec import DenseParam

TABLE_PREFIX = "dense."
DEFAULT_OPTIMIZER = OptimizerConfig("adam", 0.001)


def table_name(param: DenseParam) -> str:
    return TABLE_PREFIX + param.name


def table_config(param: DenseParam, optimizer: OptimizerConfig = DEFAULT_OPTIMIZER) -> TableConfig:
    """The server table that holds one dense parameter."""
    seed = zlib.crc32(param.name.encode())  # tables of equal shape must not start equal
    if param.init == "zeros":
        init = InitializerConfig("zeros", 0.0)
    else:
        init = InitializerConfig("uniform", param.glorot_scale, seed=seed)
    return TableConfig(table_name(param), param.shape[1], init, optimizer)


class DenseSync:
    """The dense parameters of one worker: values from the servers, gradients accumulated between syncs.

    `tables` is anything with the Client's pull_many and push_many (a Client, or tests.inprocess's tables)."""

    def __init__(self, tables: Any, params: list[DenseParam], sync_every: int = 1):
        if sync_every < 1:
            raise ValueError(f"--dense-sync-every is {sync_every}, expected >= 1")
        self.tables = tables
        self.params = params
        self.sync_every = sync_every
        self.ids = {p.name: np.arange(p.shape[0], dtype=np.uint64) for p in params}
        self.values: dict[str, np.ndarray] = {}
        self.pending: dict[str, np.ndarray] = {p.name: np.zeros(p.shape, dtype=np.float32) for p in params}
        self.steps_pending = 0
        self.syncs = 0

    def pull(self) -> dict[str, np.ndarray]:
        """Fetches every dense parameter from the servers (one round trip); returns {name: (r, c) float32}."""
        self.take(self.tables.pull_many([(table_name(p), self.ids[p.name]) for p in self.params]))
        return self.values

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """Adds one step's gradients; every sync_every steps pushes their sum and takes the new values."""
        if self.add(grads):
            self.flush()

    def flush(self) -> None:
        """Pushes the gradients added since the last sync (if any) and takes the new values the push returns."""
        items = self.push_items()
        if items:
            self.take(self.tables.push_many(items, return_rows=True))

    # ---- the same in phases, so a training step can send them with its sparse push ------------------
    def add(self, grads: dict[str, np.ndarray]) -> bool:
        """Adds one step's gradients; True when a sync is due: send push_items (return_rows), then take."""
        if not self.params:
            return False
        for name, g in grads.items():
            self.pending[name] += g
        self.steps_pending += 1
        return self.steps_pending >= self.sync_every

    def push_items(self) -> list[tuple]:
        """The pushes of the gradients added since the last sync ([] if none), for push_many; resets them."""
        if not self.params or self.steps_pending == 0:
            return []
        items = [(table_name(p), self.ids[p.name], self.pending[p.name].copy(), None) for p in self.params]
        for g in self.pending.values():
            g[:] = 0.0
        self.steps_pending = 0
        self.syncs += 1
        return items

    def take(self, rows: list[np.ndarray]) -> None:
        """Stores rows of every dense parameter, in params order (a pull's, or those push_many returned)."""
        self.values = {p.name: r.reshape(p.shape) for p, r in zip(self.params, rows, strict=True)}

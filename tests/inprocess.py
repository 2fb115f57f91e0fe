"""InProcessTables: the Client's table calls served by a Shard in this very process, with no RPC.

The reference of benchmarks/train_throughput.py: the same training loop against the server's own table code
(RAM tier, optimizer, journal) called directly, so the gap to a run against server processes is what the RPCs,
their serialization and the processes cost. Same dedup semantics as worker.client.Client.
"""

from __future__ import annotations

import tempfile

import numpy as np

from ps.config import TableConfig
from ps.engine.shard import Shard
from ps.server_config import ServerConfig
from ps.stamp import WorkerStamp
from worker.client import push_arrays


class InProcessTables:
    def __init__(self, cache_bytes: int = 4 << 30, data_dir: str | None = None):
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="sparseps-inprocess-")
        self.shard = Shard(ServerConfig(data_dir=data_dir or self._tmp.name, cache_bytes=cache_bytes))

    def create_table(self, cfg: TableConfig) -> None:
        self.shard.create_table(cfg)

    def dim(self, table: str) -> int:
        return self.shard.table(table).dim

    def pull(self, table: str, ids: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.uint64).ravel()
        uniq, inverse = np.unique(ids, return_inverse=True)
        return self.shard.pull(table, uniq)[inverse.ravel()]

    def _item(self, table: str, ids: np.ndarray, grads: np.ndarray, clicks=None, shows=None) -> tuple:
        """((table, unique ids, summed grads, shows, clicks), where each given id's row is in them or None) of a
        push, deduplicated as the Client does."""
        dim = self.dim(table)
        uniq, item_grads, item_shows, item_clicks, where = push_arrays(table, ids, grads, clicks, shows, dim)
        arrays = (item_grads, item_shows, item_clicks)  # counts None: the defaults, as the Client leaves them out
        return (table, uniq, *(None if a is None else np.ascontiguousarray(a) for a in arrays)), where

    def push(self, table: str, ids: np.ndarray, grads: np.ndarray, clicks=None, shows=None) -> None:
        self.push_many([(table, ids, grads, clicks, shows)])

    def pull_many(self, items: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        return [self.pull(table, ids) for table, ids in items]

    def push_many(
        self,
        items: list[tuple],
        advance_clock: int = 0,
        return_rows: bool = False,
        add_delta: bool = False,
        stamp: WorkerStamp | None = None,
    ) -> list | None:
        """As Client.push_many: one batch, validated whole before any push is applied; return_rows: the rows of
        the pushed unique ids read once, as the server does for PushBatch, put in the given ids' order as the
        Client puts them; stamp: the batch is a job's worker's (Shard.push_stamped), as the Client sends it."""
        made = [self._item(*item) for item in items]
        pushes = [(*push, add_delta) for push, _ in made]
        if stamp is None:
            self.shard.push_batch(pushes, advance_clock)
        else:
            self.shard.push_stamped(pushes, advance_clock, 0, 0, stamp)
        if not return_rows:
            return None
        rows = [self.shard.pull(push[0], push[1]) for push, _ in made]
        return [r if where is None else r[where] for r, (_, where) in zip(rows, made, strict=True)]

    def advance_clock(self, steps: int = 1) -> int:
        return self.shard.advance_clock(steps)

    def close(self) -> None:
        self.shard.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> InProcessTables:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Shard: everything one parameter-server process holds (its Store and Tables), minus gRPC.

Each method validates its whole request before touching state and raises ps.errors exceptions, which the
service maps to gRPC status codes. Ownership: a shard accepts only ids whose slot it owns (ps.sharding).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ps.config import ServerConfig, TableConfig
from ps.errors import InvalidArgumentError, TableExistsError, TableNotFoundError, WrongShardError
from ps.sharding import NUM_SLOTS, SlotMap
from ps.store import Store
from ps.table import Table


class Shard:
    def __init__(self, config: ServerConfig):
        config.validate()
        self.config = config
        self.shard_id = config.shard_id
        self.num_shards = config.num_shards
        self.slot_map = SlotMap.contiguous(config.num_shards)
        self.store = Store(config.data_dir, sync=config.sync)
        self.store.check_identity(config.shard_id, config.num_shards)
        self.tables: dict[str, Table] = {cfg.name: Table(cfg, self.store) for cfg in self.store.load_tables()}
        self._lock = threading.Lock()
        self.started = time.monotonic()

    def create_table(self, cfg: TableConfig) -> Table:
        """Creates the table, or returns the existing one if its config is the same (TableExistsError if not)."""
        cfg.validate()
        with self._lock:
            table = self.tables.get(cfg.name)
            if table is not None:
                diff = table.cfg.differences(cfg)
                if diff:
                    raise TableExistsError(
                        f"table {cfg.name!r} exists on shard {self.shard_id} with a different spec "
                        f"(existing != requested): {'; '.join(diff)}"
                    )
                return table
            self.store.create_table(cfg)
            table = self.tables[cfg.name] = Table(cfg, self.store)
            return table

    def table(self, name: str) -> Table:
        table = self.tables.get(name)
        if table is None:
            known = ", ".join(sorted(self.tables)) or "none"
            raise TableNotFoundError(f"table {name!r} does not exist on shard {self.shard_id} (tables: {known})")
        return table

    def check_owned(self, ids: np.ndarray) -> None:
        """WrongShardError naming the first id this shard does not own."""
        owners = self.slot_map.shard_of(ids)
        wrong = np.flatnonzero(owners != self.shard_id)
        if len(wrong):
            i = int(wrong[0])
            raise WrongShardError(
                f"{len(wrong)} of {len(ids)} ids belong to other shards, e.g. id {int(ids[i])} (position {i}) "
                f"belongs to shard {int(owners[i])} of {self.num_shards}, this is shard {self.shard_id}; "
                "check the order and number of servers the client was given"
            )

    def pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        table = self.table(name)
        self.check_owned(ids)
        return table.pull(ids)

    def push(self, name: str, ids: np.ndarray, grads: np.ndarray) -> None:
        table = self.table(name)
        if grads.shape != (len(ids), table.dim):
            raise InvalidArgumentError(
                f"grads for table {name!r} have shape {grads.shape}, expected ({len(ids)}, {table.dim})"
            )
        if not np.isfinite(grads).all():
            bad = int(np.flatnonzero(~np.isfinite(grads).all(axis=1))[0])
            raise InvalidArgumentError(
                f"grads for table {name!r} hold non-finite values, first at row {bad} (id {int(ids[bad])}): "
                f"{grads[bad].tolist()[:8]}; nothing was applied"
            )
        self.check_owned(ids)
        table.push(ids, grads)

    def stats(self) -> dict:
        return {
            "shard_id": self.shard_id,
            "num_shards": self.num_shards,
            "num_slots": NUM_SLOTS,
            "data_dir": self.config.data_dir,
            "uptime_s": time.monotonic() - self.started,
            "tables": [t.stats() for t in self.tables.values()],
        }

    def close(self) -> None:
        """Flushes RocksDB's memtables and closes it. Pushes were durable already (RocksDB's WAL)."""
        with self._lock:
            for t in self.tables.values():
                t.lock.acquire()
            self.store.flush()
            self.store.close()

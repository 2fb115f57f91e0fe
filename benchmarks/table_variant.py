"""One training run of a model whose sparse table takes extra settings, on fresh servers: the shared harness of
the benchmarks that compare settings of one table (compact_rows.py: optimizers, half_at_rest.py: values at rest).

A run writes the table's TOML keys to a table config file (`ps-worker train --table-config`), as a user would,
starts fresh server processes (worker.cluster.LocalCluster), creates the model's tables, trains cfg's epochs,
evaluates, then stops the servers (they flush their rows to RocksDB as they stop) and measures the RocksDB files
they leave. The caller turns what it returns into its figures.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Callable, Sequence

import harness  # noqa: F401  (before numpy: see its docstring)

from protos import ps_pb2
from ps.config import TableConfig
from worker.client import Client
from worker.cluster import LocalCluster
from worker.dense import DenseSync
from worker.job import loop_settings, make_backend, prepare
from worker.loop import run_epochs
from worker.model_tables import table_configs
from worker.scoring import evaluate
from worker.train_config import TrainConfig

TABLE = "fm"  # the FM's embedding table


def sst_bytes(root: str) -> int:
    """Bytes of the RocksDB table files under root."""
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(root, "**", "*.sst"), recursive=True))


@dataclasses.dataclass(frozen=True)
class VariantRun:
    """What one run leaves: the table as created, the prepared config's batch size, the training's examples/s
    (evaluation excluded), the table's Stats on every shard after training (before the evaluation's reads) and
    after the evaluation, evaluate()'s figures, and the bytes of RocksDB files once the servers stopped."""

    table: TableConfig
    batch_size: int
    examples_per_s: float
    trained_stats: list[ps_pb2.TableStats]  # TABLE's, one per shard
    evaluated_stats: list[ps_pb2.TableStats]
    scores: dict
    sst_bytes: int


def train_variant(cfg: TrainConfig, name: str, table_keys: str, shards: int, tmp: str,
                  server_args: Sequence[str] = (), check: Callable[[TableConfig], bool] = lambda t: True
                  ) -> VariantRun:  # fmt: skip
    """Trains and evaluates cfg on `shards` fresh servers started with server_args, with table_keys (TOML lines)
    under TABLE's section of a table config file tmp/<name>.toml. check(the created TABLE) must hold before
    training starts (the keys took effect); AssertionError otherwise."""
    table_config = os.path.join(tmp, f"{name}.toml")
    with open(table_config, "w") as f:
        f.write(f"[{TABLE}]\n{table_keys}")
    cfg = dataclasses.replace(cfg, table_config=table_config)
    with LocalCluster(shards, extra_args=list(server_args)) as cluster:
        with Client(cluster.addresses) as client:
            client.wait_ready()
            cfg = dataclasses.replace(cfg, servers=tuple(cluster.addresses))
            cfg, data, spec, _ = prepare(cfg, needs_servers=False)
            backend = make_backend(spec, cfg)
            configs = table_configs(cfg, spec, data.schema.table_overrides())
            for t in configs:
                client.create_table(t)
            table = next(t for t in configs if t.name == TABLE)
            assert check(table), f"table {TABLE} as created does not hold what {table_config} sets: {table}"
            dense = DenseSync(client, spec.dense_params(), cfg.dense_sync_every)
            dense.pull()
            loop = run_epochs(client, spec, backend, dense, data.train, loop_settings(cfg, data))
            trained_stats = table_stats(client)
            scores = evaluate(client, spec, backend, dense.pull(), data.eval())
            evaluated_stats = table_stats(client)
        cluster.stop()  # the servers flush their rows to RocksDB as they stop
        disk = sst_bytes(cluster.root)
    return VariantRun(table, cfg.batch_size, loop.examples / loop.seconds, trained_stats, evaluated_stats, scores, disk)


def table_stats(client: Client) -> list[ps_pb2.TableStats]:
    """TABLE's Stats on every shard."""
    return [t for s in client.stats() for t in s.tables if t.name == TABLE]

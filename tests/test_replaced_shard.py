"""A shard replaced under a running client, on the same port: restarted restored from a checkpoint, or on a new,
empty data dir. The client's pushes carry the state id wait_ready read (ps.engine.shard check_state_id): the
replaced shard refuses them, applying nothing, with ModelStateReplacedError saying how it was replaced, and the
error says what the push's other batches applied; a new client (wait_ready again) trains on."""

from __future__ import annotations

import numpy as np
import pytest

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.errors import MODEL_STATE_REPLACED, ModelStateReplacedError, PsError
from ps.server import Server
from ps.server_config import ServerConfig
from ps.sharding import SlotMap
from tests.conftest import random_ids
from worker.checkpoint import save
from worker.client import Client


@pytest.mark.parametrize("replaced", ["restored", "new data dir"])
def test_a_push_to_a_replaced_shard_is_refused_and_applies_nothing_there(tmp_path, replaced):
    def config(i: int, data_dir: str, **kw) -> ServerConfig:
        return ServerConfig(data_dir=str(tmp_path / data_dir), shard_id=i, num_shards=2, port=ports[i],
                            checkpoint_root=str(tmp_path), **kw)  # fmt: skip

    ports = [0, 0]  # any free port; a replaced shard takes its predecessor's
    servers = [Server(config(i, f"d{i}")) for i in range(2)]
    ports = [s.start() for s in servers]
    ids = random_ids(200, seed=11)
    on_1 = ids[SlotMap.contiguous(2).shard_of(ids) == 1]
    ones = np.ones((len(ids), 2), np.float32)
    try:
        with Client([f"127.0.0.1:{p}" for p in ports], timeout_s=10, server_timeout_s=30) as client:
            client.wait_ready()
            client.create_table(TableConfig("t", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
            client.push("t", ids, ones)
            save(client, str(tmp_path / "ckpt"))
            client.push("t", ids, ones)  # not in the checkpoint
            servers[1].stop(grace_s=1)
            if replaced == "restored":
                servers[1] = Server(config(1, "d1-restored", restore_dir=str(tmp_path / "ckpt")))
                how, rows_1 = r"restored from checkpoint \S*ckpt", -1
            else:
                servers[1] = Server(config(1, "d1-new"))
                how, rows_1 = "started on a new, empty data dir", None
            servers[1].start()
            said = (rf"shard 1 {MODEL_STATE_REPLACED} .*since the client connected, the shard was "
                    rf"{how}, .*the push was not applied.*This push was 2 PushBatch calls; shard 0: 1 of 1 applied; "
                    r"shard 1: 0 of 1 applied, batch 1 failed \(ModelStateReplacedError\)$")  # fmt: skip
            with pytest.raises(ModelStateReplacedError, match=said):
                client.push("t", ids, ones)
            np.testing.assert_array_equal(client.pull("t", ids[SlotMap.contiguous(2).shard_of(ids) == 0]), -3)
        with Client([f"127.0.0.1:{p}" for p in ports], timeout_s=10, server_timeout_s=30) as again:
            again.wait_ready()
            if rows_1 is None:  # the new dir holds no table
                again.create_table(TableConfig("t", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
                rows_1 = 0
            np.testing.assert_array_equal(again.pull("t", on_1), rows_1)  # the refused push changed nothing
            again.push("t", on_1, np.ones((len(on_1), 2), np.float32))
            np.testing.assert_array_equal(again.pull("t", on_1), rows_1 - 1)
    finally:
        for s in servers:
            s.stop(grace_s=1)


@pytest.mark.parametrize("replaced_by", ["a new data dir", "another cluster's shard", "a shard of 3"])
def test_a_pull_a_replaced_shard_refuses_says_the_shard_was_replaced_not_only_its_refusal(tmp_path, replaced_by):
    """A training step pulls before it pushes: a shard replaced on a new data dir holds no table, so the step's
    pull is refused (NOT_FOUND, or ids it does not own) before any push carries the state id. The refusal is
    raised as ModelStateReplacedError, the shard's words kept, so that a run stops without a --skip-examples hint
    (worker.train), as for a refused push; a refusal of a shard that was not replaced keeps its own class."""
    ports = [0, 0]

    def config(i: int, data_dir: str, **kw) -> ServerConfig:
        return ServerConfig(**{"data_dir": str(tmp_path / data_dir), "shard_id": i, "num_shards": 2, "port": ports[i],
                               **kw})  # fmt: skip

    servers = [Server(config(i, f"d{i}")) for i in range(2)]
    ports = [s.start() for s in servers]
    ids = random_ids(200, seed=12)
    try:
        with Client([f"127.0.0.1:{p}" for p in ports], timeout_s=10, server_timeout_s=30) as client:
            client.wait_ready()
            client.create_table(TableConfig("t", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
            client.push("t", ids, np.ones((len(ids), 2), np.float32))
            with pytest.raises(PsError, match="table 'u' does not exist on shard") as same:
                client.pull("u", ids)  # a refusal of shards not replaced: as it was
            assert not isinstance(same.value, ModelStateReplacedError)
            servers[1].stop(grace_s=1)
            kw = {"cluster": "other"} if replaced_by == "another cluster's shard" else {}
            kw |= {"num_shards": 3} if replaced_by == "a shard of 3" else {}
            servers[1] = Server(config(1, "d1-new", **kw))
            servers[1].start()
            said = (rf"shard 1 at \S+: PullBatch failed with \w+: .*; shard 1 {MODEL_STATE_REPLACED} \(state id 0x"
                    r"[0-9a-f]+, the client's 0x[0-9a-f]+\): since the client connected, the shard was started on a "
                    r"new, empty data dir")  # fmt: skip
            with pytest.raises(ModelStateReplacedError, match=said) as caught:
                client.pull("t", ids)
            assert caught.value.refused_by == 1
            if replaced_by != "a new data dir":
                assert ("cluster 'other'" if kw.get("cluster") else "shard 1 of 3") in str(caught.value)
    finally:
        for s in servers:
            s.stop(grace_s=1)

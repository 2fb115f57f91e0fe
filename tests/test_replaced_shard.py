"""A shard replaced under a running client, on the same port: restarted restored from a checkpoint, or on a new,
empty data dir. The client's pushes and pulls carry the state id wait_ready read (ps.engine.shard check_state_id):
the replaced shard refuses them, applying and reading nothing, with ModelStateReplacedError saying how it was
replaced, and a push's error says what its other batches applied; `ps-worker eval` stops on it rather than score
rows of two model states; a new client (wait_ready again) trains on."""

from __future__ import annotations

import dataclasses
import re
import threading

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps import wire
from ps.checkpoint import MANIFEST
from ps.codec import STATE_ID_PHASES
from ps.config import EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.errors import (
    MODEL_STATE_REPLACED,
    NOTHING_READ_OR_APPLIED,
    SHARDS_STAY_SHRUNK,
    ModelStateReplacedError,
    PsError,
)
from ps.replacedstate import CHECKPOINT_REFUSED
from ps.server import Server
from ps.server_config import ServerConfig
from ps.sharding import SlotMap
from tests.conftest import random_ids
from tests.worker_runs import run
from worker import checkpoint, served
from worker.checkpoint import save
from worker.client import Client
from worker.shard_calls import carries_state_id
from worker.tables import lost_tables

TABLE = TableConfig("t", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))


def trained_and_saved(
    client: Client, ids: np.ndarray, into: str, table: TableConfig = TABLE, again: bool = True
) -> None:
    """The opening of a test of a replaced shard: wait_ready, table (named "t", dim 2) created, ids pushed once (1.0
    each), a checkpoint saved into into; where again, ids pushed once more, a push the checkpoint lacks."""
    client.wait_ready()
    client.create_table(table)
    client.push("t", ids, np.ones((len(ids), 2), np.float32))
    save(client, into)
    if again:
        client.push("t", ids, np.ones((len(ids), 2), np.float32))


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
            trained_and_saved(client, ids, str(tmp_path / "ckpt"))  # the second push is not in the checkpoint
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
                again.create_table(TABLE)
                rows_1 = 0
            np.testing.assert_array_equal(again.pull("t", on_1), rows_1)  # the refused push changed nothing
            again.push("t", on_1, np.ones((len(on_1), 2), np.float32))
            np.testing.assert_array_equal(again.pull("t", on_1), rows_1 - 1)
    finally:
        for s in servers:
            s.stop(grace_s=1)


@pytest.mark.parametrize("replaced_by", ["a new data dir", "another cluster's shard", "a shard of 3"])
def test_a_call_without_a_state_id_a_replaced_shard_refuses_says_the_shard_was_replaced(tmp_path, replaced_by):
    """A call that carries no state id (DescribeTable: a client's first pull of a table asks its dim) finds no
    table on a shard replaced on a new data dir, and is refused (NOT_FOUND). The refusal is raised as
    ModelStateReplacedError, the shard's words kept, so that a run stops without a --skip-examples hint
    (worker.train), as for a refused push or pull; a refusal of a shard that was not replaced keeps its own class."""
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
            client.create_table(TABLE)
            client.push("t", ids, np.ones((len(ids), 2), np.float32))
            with pytest.raises(PsError, match="table 'u' does not exist on shard") as same:
                client.describe_table("u")  # a refusal of shards not replaced: as it was
            assert not isinstance(same.value, ModelStateReplacedError)
            servers[1].stop(grace_s=1)
            kw = {"cluster": "other"} if replaced_by == "another cluster's shard" else {}
            kw |= {"num_shards": 3} if replaced_by == "a shard of 3" else {}
            servers[1] = Server(config(1, "d1-new", **kw))
            servers[1].start()
            said = (rf"shard 1 at \S+: DescribeTable failed with NOT_FOUND: .*; shard 1 {MODEL_STATE_REPLACED} "
                    r"\(state id 0x[0-9a-f]+, the client's 0x[0-9a-f]+\): since the client connected, the shard was "
                    r"started on a new, empty data dir")  # fmt: skip
            with pytest.raises(ModelStateReplacedError, match=said) as caught:
                client.describe_table("t", shards=[1])
            assert caught.value.refused_by == 1
            # a DescribeTable changes nothing: an eval or a predict makes it too, and nothing of theirs was pushed
            assert ("so its rows are not those of the model state the client read before. A training run, an eval or "
                    "a predict stops: start it again on what the shards hold now") in str(caught.value)  # fmt: skip
            assert "pushed" not in str(caught.value)
            if replaced_by != "a new data dir":
                assert ("cluster 'other'" if kw.get("cluster") else "shard 1 of 3") in str(caught.value)
    finally:
        for s in servers:
            s.stop(grace_s=1)


def test_a_push_or_pull_carrying_the_state_id_refused_otherwise_asks_no_stats_a_describe_asks_once(servers):
    """A PushBatch or PullBatch carrying its shard's state id is checked for it before anything else (ps.engine.shard
    check_state_id): refused some other way (INVALID_ARGUMENT, NOT_FOUND), it found the id matching, so the client
    asks no Stats to tell whether the shard was replaced; a refused call that carries no state id (DescribeTable)
    asks once."""
    addresses, (server,) = servers(1)
    with Client(addresses, timeout_s=10, server_timeout_s=5) as client:
        client.wait_ready()
        client.create_table(TABLE)
        asked, stats = [], server.shard.stats
        server.shard.stats = lambda *a, **kw: (asked.append(1), stats(*a, **kw))[1]
        seen, ids = client.state_ids[0], wire.encode_ids(np.arange(3, dtype=np.uint64))
        short = ps_pb2.PushRequest(table="t", ids=ids, grads=b"\0" * 8, dim=2)  # 8 bytes of grads, expected 3*2*4
        refused = [("PushBatch", ps_pb2.PushBatchRequest(pushes=[short], state_id=seen), "INVALID_ARGUMENT"),
                   ("PullBatch", ps_pb2.PullBatchRequest(pulls=[ps_pb2.PullRequest(table="u", ids=ids)], state_id=seen),
                    "NOT_FOUND")]  # fmt: skip
        for method, request, code in refused:
            with pytest.raises(PsError, match=f"{method} failed with {code}") as caught:
                client._call_many(method, [0], [request])
            assert not isinstance(caught.value, ModelStateReplacedError)
        assert asked == []
        with pytest.raises(PsError, match="DescribeTable failed with NOT_FOUND"):
            client.describe_table("u")
        assert asked == [1]


def test_a_request_carries_a_state_id_its_shard_checks_where_it_has_the_field_set_and_is_no_release():
    """carries_state_id reads the request: every request message with a state_id field, holding an id, carries one
    (the proto's, found from its descriptors), but a Checkpoint of a phase whose id the shard does not check (a
    release, an unknown phase: refused INVALID_ARGUMENT); a request without the field, or with 0 in it, carries
    none. The shard's words for a replaced state cover exactly the phases it checks."""
    with_field = [m for name, m in ps_pb2.DESCRIPTOR.message_types_by_name.items()
                  if name.endswith("Request") and "state_id" in m.fields_by_name]  # fmt: skip
    assert {m.name for m in with_field} >= {"PushBatchRequest", "PullBatchRequest", "CreateTableRequest",
                                            "CheckpointRequest", "ShrinkRequest"}  # fmt: skip
    for m in with_field:
        request = getattr(ps_pb2, m.name)
        phase = {"phase": "hold"} if m.name == "CheckpointRequest" else {}
        assert carries_state_id(request(state_id=7, **phase)) and not carries_state_id(request(**phase)), m.name
    assert set(CHECKPOINT_REFUSED) == STATE_ID_PHASES
    for phase in STATE_ID_PHASES:
        assert carries_state_id(ps_pb2.CheckpointRequest(phase=phase, state_id=7))
    for phase in ("release", "", "bogus"):
        assert not carries_state_id(ps_pb2.CheckpointRequest(phase=phase, token="t", state_id=7)), phase
    assert not carries_state_id(ps_pb2.DescribeTableRequest(table="t"))
    assert not carries_state_id(None)


class TwoShards:
    """Two servers in this process, on ports of their own; replace(i, ...) restarts shard i on its port, on a data
    dir of that name (restored from a checkpoint where restore_dir is given)."""

    def __init__(self, tmp_path):
        self.tmp_path, self.ports = tmp_path, [0, 0]  # any free port; a replaced shard takes its predecessor's
        self.servers = [Server(self.config(i, f"d{i}")) for i in range(2)]
        self.ports = [s.start() for s in self.servers]
        self.addresses = [f"127.0.0.1:{p}" for p in self.ports]

    def config(self, i: int, data_dir: str, **kw) -> ServerConfig:
        return ServerConfig(data_dir=str(self.tmp_path / data_dir), shard_id=i, num_shards=2, port=self.ports[i],
                            checkpoint_root=str(self.tmp_path), **kw)  # fmt: skip

    def replace(self, i: int, data_dir: str, **kw) -> None:
        self.servers[i].stop(grace_s=1)
        self.servers[i] = Server(self.config(i, data_dir, **kw))
        self.servers[i].start()

    def stop(self) -> None:
        for s in self.servers:
            s.stop(grace_s=1)


def raw_pull(address: str, ids: np.ndarray, state_id: int) -> np.ndarray:
    """The rows of ids in table "t" (dim 2) by one PullBatch carrying state_id, sent as it is."""
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        pull = ps_pb2.PullRequest(table="t", ids=wire.encode_ids(ids))
        reply = stub.PullBatch(ps_pb2.PullBatchRequest(pulls=[pull], state_id=state_id), timeout=10)
    return wire.decode_rows(reply.replies[0].rows, len(ids), 2)


def test_a_pull_carrying_a_state_id_the_restored_shard_does_not_hold_is_refused_and_reads_nothing(tmp_path):
    """A pull that carries the state id its client read, to a shard restored from a checkpoint since, is refused
    (FAILED_PRECONDITION, ModelStateReplacedError) before it reads a row: its client does not score, nor train on,
    rows of a model state other than the one it read. A pull with no state id (0), or the shard's, is served."""
    shards = TwoShards(tmp_path)
    ids = random_ids(200, seed=13)
    on = [ids[SlotMap.contiguous(2).shard_of(ids) == i] for i in range(2)]
    try:
        with Client(shards.addresses, timeout_s=10, server_timeout_s=30) as client:
            trained_and_saved(client, ids, str(tmp_path / "ckpt"))  # the second push is not in the checkpoint
            seen = client.state_ids[1]
            np.testing.assert_array_equal(raw_pull(shards.addresses[1], on[1], seen), -2)  # the id it holds: served
            shards.replace(1, "d1-restored", restore_dir=str(tmp_path / "ckpt"))
            now = client.stats()[1].state_id
            assert now not in (0, seen)
            said = (rf"shard 1 at \S+: PullBatch failed with FAILED_PRECONDITION: shard 1 {MODEL_STATE_REPLACED} "
                    rf"\(state id {now:#x}, the client's {seen:#x}\): since the client connected, the shard was "
                    rf"restored from checkpoint \S*ckpt, so its rows are not those of the model state the client read "
                    rf"before; {NOTHING_READ_OR_APPLIED}")  # fmt: skip
            with pytest.raises(ModelStateReplacedError, match=said) as caught:
                client.pull("t", ids)
            assert caught.value.refused_by == 1
            np.testing.assert_array_equal(client.pull("t", on[0]), -2)  # shard 0, not replaced, serves it
        with pytest.raises(grpc.RpcError) as refused:
            raw_pull(shards.addresses[1], on[1], seen)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert MODEL_STATE_REPLACED in refused.value.details()
        np.testing.assert_array_equal(raw_pull(shards.addresses[1], on[1], 0), -1)  # no state id: the checkpoint's
        np.testing.assert_array_equal(raw_pull(shards.addresses[1], on[1], now), -1)  # the shard's own
    finally:
        shards.stop()


def test_eval_against_a_shard_restored_mid_run_stops_saying_so_and_prints_no_scores(tmp_path, capsys, monkeypatch):
    """`ps-worker eval` whose shard 1 is restored from a checkpoint after the eval read the shards' Stats and the
    dense parameters, before it scores: its first pull of the eval rows is refused, and it stops (exit 2) with the
    shard's words rather than print scores of rows of two model states."""
    shards = TwoShards(tmp_path)
    flags = ["--servers", ",".join(shards.addresses), "--model", "lr", "--synthetic-rows", "2000",
             "--synthetic-eval-rows", "500", "--batch-size", "256", "--no-progress"]  # fmt: skip
    try:
        assert run(["train", *flags], capsys)[0] == 0
        with Client(shards.addresses, timeout_s=10) as client:
            client.wait_ready()
            save(client, str(tmp_path / "ckpt"))
        scored = served.evaluate

        def evaluate_after_a_restore(*args, **kwargs):
            shards.replace(1, "d1-restored", restore_dir=str(tmp_path / "ckpt"))
            return scored(*args, **kwargs)

        monkeypatch.setattr(served, "evaluate", evaluate_after_a_restore)
        code, err = run(["eval", *flags], capsys)
        assert code == 2, err
        assert re.search(rf"ps-worker: error: .*shard 1 {MODEL_STATE_REPLACED} .*restored from checkpoint \S*ckpt", err)
        assert "auc" not in capsys.readouterr().out.lower()
    finally:
        shards.stop()


def test_a_create_table_to_a_shard_replaced_on_a_new_data_dir_is_refused_and_the_loss_stays_visible(tmp_path):
    """A CreateTable carries the state id its client read (a run's tables are made after its wait_ready): a shard
    started on a new data dir since refuses it, creating nothing (the check_only round of several shards included),
    so the trained table stays missing there and lost_tables still finds the loss. A table made there would hide it:
    the next run would find the table on every shard and train shard 1's part from scratch, saying nothing."""
    shards = TwoShards(tmp_path)
    ids = random_ids(200, seed=14)
    try:
        with Client(shards.addresses, timeout_s=10, server_timeout_s=30) as client:
            client.wait_ready()
            client.create_table(TABLE)
            client.push("t", ids, np.ones((len(ids), 2), np.float32))
            shards.replace(1, "d1-new")
            said = (rf"shard 1 at \S+: CreateTable failed with FAILED_PRECONDITION: shard 1 {MODEL_STATE_REPLACED} "
                    r"\(state id \w+, the client's \w+\): since the client connected, the shard was started on a new, "
                    r"empty data dir, so the tables it held before may be lost there; the table was not created "
                    r"there\. A training run stops there: start it again on what the shards hold now; its start "
                    r"refuses shards that lost a trained table or were restored from different checkpoints, and names "
                    r"them, as ps-worker stats does$")  # fmt: skip
            with pytest.raises(ModelStateReplacedError, match=said) as caught:
                client.create_table(TABLE)
            assert "pushed" not in str(caught.value) and "--skip-examples" not in str(caught.value)  # a push's words
            stats = client.stats()
        assert [t.name for t in stats[1].tables] == []
        assert "table t" in lost_tables(stats) and "shard 1" in lost_tables(stats)
        with Client(shards.addresses, timeout_s=10, server_timeout_s=30) as again:  # read the shards' ids now: made
            again.wait_ready()
            again.create_table(TABLE)
            assert [t.name for t in again.stats()[1].tables] == ["t"]
    finally:
        shards.stop()


def test_a_checkpoint_save_whose_shard_is_replaced_after_its_checks_holds_and_saves_nothing(tmp_path, monkeypatch):
    """A save reads the shards' Stats for its checks (lost tables, mixed restores), then holds and saves each shard:
    a shard restored from an older checkpoint in between refuses its hold (it carries the state id the save read),
    so no manifest is written, rather than one of a checkpoint whose shard 1 is the older cut and shard 0 the newer.
    A save phase carrying a state id the shard does not hold is refused too, saving nothing."""
    shards = TwoShards(tmp_path)
    ids = random_ids(200, seed=15)
    checks = checkpoint._check_before_holding

    def checked_then_replaced(*args, **kwargs):
        state_ids = checks(*args, **kwargs)
        shards.replace(1, "d1-restored", restore_dir=str(tmp_path / "a"))
        return state_ids

    try:
        with Client(shards.addresses, timeout_s=10, server_timeout_s=30) as client:
            trained_and_saved(client, ids, str(tmp_path / "a"))  # the second push is not in checkpoint a
            monkeypatch.setattr(checkpoint, "_check_before_holding", checked_then_replaced)
            said = (rf"shard 1 at \S+: Checkpoint failed with FAILED_PRECONDITION: shard 1 {MODEL_STATE_REPLACED} "
                    r".*restored from checkpoint \S*a, .*; the shard was not held\. A checkpoint save stops there, "
                    r"writing no manifest")  # fmt: skip
            with pytest.raises(ModelStateReplacedError, match=said):
                save(client, str(tmp_path / "b"))
            monkeypatch.undo()
            assert not (tmp_path / "b" / MANIFEST).exists()
            hold = ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=30, state_id=client.state_ids[0])
            token = client.checkpoint({0: hold})[0].token  # shard 0, not replaced: held
            wrong = ps_pb2.CheckpointRequest(phase="save", dir=str(tmp_path / "c"), token=token,
                                             state_id=client.state_ids[0] ^ 1)  # fmt: skip
            with pytest.raises(ModelStateReplacedError, match="; the shard saved nothing"):
                client.checkpoint({0: wrong})
            client.checkpoint({0: ps_pb2.CheckpointRequest(phase="release", token=token)})
            assert not (tmp_path / "c").exists()
    finally:
        shards.stop()


def test_a_save_by_a_client_that_outlived_a_restore_is_refused_before_any_hold_until_it_reads_the_shards(tmp_path):
    """A client whose shards were all restored from one checkpoint since its wait_ready: its save is refused before
    any hold, saying the shards were replaced since the client read them and what saves them (a new client, or
    wait_ready again), not that the shards hold two models. After wait_ready it saves them. One shard restored
    alone from that same checkpoint passes the checks on the Stats (both name it), and is refused the same way."""
    shards = TwoShards(tmp_path)
    ids = random_ids(200, seed=17)
    try:
        with Client(shards.addresses, timeout_s=10, server_timeout_s=30) as client:
            trained_and_saved(client, ids, str(tmp_path / "a"), again=False)
            seen = client.state_ids
            for i in range(2):
                shards.replace(i, f"d{i}-restored", restore_dir=str(tmp_path / "a"))
            now = [s.state_id for s in client.stats()]
            said = (rf"^shard 0 {MODEL_STATE_REPLACED} \(state id {now[0]:#x}, the client's {seen[0]:#x}\): since the "
                    rf"client connected, the shard was restored from checkpoint \S*a, so its rows are not those of the "
                    r"model state the client read before; no shard was held and nothing was saved\. The save stops "
                    r"there \(shards replaced since this client first read them: 0, 1\)\. To save what the shards "
                    r"hold now, save with a new client \(each ps-worker checkpoint save is one\), or call this "
                    r"client's wait_ready again$")  # fmt: skip
            with pytest.raises(ModelStateReplacedError, match=said):
                save(client, str(tmp_path / "b"))
            assert not (tmp_path / "b").exists()
            client.wait_ready()  # reads the restored shards' ids: the save holds (no hold was left) and saves
            assert save(client, str(tmp_path / "b"))["num_shards"] == 2
            shards.replace(1, "d1-again", restore_dir=str(tmp_path / "a"))
            with pytest.raises(ModelStateReplacedError, match=r"^shard 1 .*first read them: 1\)\."):
                save(client, str(tmp_path / "c"))
            assert not (tmp_path / "c").exists()
    finally:
        shards.stop()


def test_a_shrink_sent_again_while_its_shard_comes_back_restored_shrinks_nothing_there(tmp_path):
    """A Shrink whose shard is down is sent again until the shard answers (no connection: it was not run). Where the
    shard comes back restored from a checkpoint, the Shrink carries the state id its client read, and the restored
    shard refuses it (ModelStateReplacedError, naming the shard that shrank): the checkpoint's rows stay as they were
    saved, where the Shrink meant for the model the client read would have dropped them (a score under the
    table's threshold)."""
    shards = TwoShards(tmp_path)
    ids = random_ids(200, seed=16)
    table = dataclasses.replace(TABLE, eviction=EvictionConfig(score_threshold=0.5))  # 2 shows, no click: 0.2, dropped
    outcome: list = []
    try:
        with Client(shards.addresses, timeout_s=10, server_timeout_s=30) as client:
            trained_and_saved(client, ids, str(tmp_path / "a"), table)  # the second push is not in checkpoint a
            saved_rows = client.stats()[1].tables[0].num_rows
            assert saved_rows > 0
            shards.servers[1].stop(grace_s=1)

            def shrink() -> None:
                try:
                    outcome.append(client.shrink())
                except PsError as e:
                    outcome.append(e)

            shrinking = threading.Thread(target=shrink)
            shrinking.start()  # shard 1's Shrink finds no server: sent again until the restored one answers
            shards.servers[1] = Server(shards.config(1, "d1-restored", restore_dir=str(tmp_path / "a")))
            shards.servers[1].start()
            shrinking.join(60)
            assert not shrinking.is_alive()
            (error,) = outcome
            said = (rf"Shrink failed on shard 1: shard 1 at \S+: Shrink failed with FAILED_PRECONDITION: shard 1 "
                    rf"{MODEL_STATE_REPLACED} .*restored from checkpoint \S*a, .*; nothing was shrunk\. The Shrink "
                    rf"stops there.*Of the Shrink, shard\(s\) 0 shrank .*{re.escape(SHARDS_STAY_SHRUNK)}")  # fmt: skip
            assert isinstance(error, ModelStateReplacedError) and re.search(said, str(error)), error
            after = client.stats()
        assert after[1].tables[0].num_rows == saved_rows  # the checkpoint's rows, none dropped
        assert after[0].tables[0].num_rows == 0  # shard 0, not replaced, shrank
    finally:
        shards.stop()

"""Malformed requests get the right status and a precise message, and change nothing on the server."""

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import ps_pb2, ps_pb2_grpc
from ps import codec, wire
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.errors import ShardClosingError, echo
from ps.server import grpc_options
from ps.server_config import ServerConfig
from ps.sharding import SlotMap
from tests.conftest import random_ids

ADAGRAD = TableConfig("emb", 4, optimizer=OptimizerConfig("adagrad", 0.1))


@pytest.fixture
def shard1(servers):
    """Shard 1 of 2 with table 'emb' (dim 4, Adagrad), a raw stub, and 50 ids it owns holding pushed rows."""
    addresses, (_, server) = servers(2)
    channel = grpc.insecure_channel(addresses[1], options=grpc_options(256 << 20))
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(ADAGRAD)))
    ids = random_ids(400)
    owner = SlotMap.contiguous(2).shard_of(ids)
    mine, theirs = ids[owner == 1][:50], ids[owner == 0][:5]
    stub.Push(
        ps_pb2.PushRequest(table="emb", ids=wire.encode_ids(mine), grads=wire.encode_rows(np.ones((50, 4))), dim=4)
    )
    yield stub, mine, theirs, server.shard
    channel.close()


def pull(stub, ids, table="emb"):
    reply = stub.Pull(ps_pb2.PullRequest(table=table, ids=wire.encode_ids(ids)))
    return wire.decode_rows(reply.rows, len(ids), reply.dim)


def assert_status(call, code, *fragments):
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    for f in fragments:
        assert f in info.value.details()


def snapshot(shard, ids, table="emb"):
    """Full rows (embedding, optimizer state, statistics), rows held in RAM and the table's counters."""
    t = shard.table(table)
    stats = {k: v for k, v in t.stats().items() if k not in ("pulls", "ids_pulled", "cache_misses")}
    return t.peek(ids), t.arena.used, stats, shard.journal.next_seq


def test_bad_requests_get_precise_statuses_and_change_nothing(shard1):
    stub, mine, theirs, shard = shard1
    before = snapshot(shard, mine)
    good_ids = wire.encode_ids(mine[:6])

    def push(**kw):
        req = dict(table="emb", ids=good_ids, grads=wire.encode_rows(np.ones((6, 4))), dim=4)
        req.update(kw)
        return lambda: stub.Push(ps_pb2.PushRequest(**req))

    INVALID, NOT_FOUND, PRECOND = (
        grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION
    )  # fmt: skip
    assert_status(push(grads=b"\0" * 95), INVALID, "grads has 95 bytes, expected 4*6*4 = 96")
    assert_status(push(ids=good_ids[:-3]), INVALID, "ids has 45 bytes, expected a multiple of 8")
    assert_status(push(dim=8), INVALID, "push says dim 8, but table 'emb' has dim 4")
    nan = np.ones((6, 4), dtype=np.float32)
    nan[3, 1] = np.nan
    assert_status(push(grads=wire.encode_rows(nan)), INVALID, "non-finite", "row 3")
    dup = np.concatenate([mine[:5], mine[:1]])
    assert_status(push(ids=wire.encode_ids(dup)), INVALID, "repeats id")
    assert_status(push(table="nope"), NOT_FOUND, "table 'nope' does not exist on shard 1", "tables: emb")
    mixed = np.concatenate([mine[:3], theirs[:3]])
    assert_status(push(ids=wire.encode_ids(mixed)), PRECOND, "3 of 6 ids belong to other shards", "this is shard 1")
    assert_status(lambda: pull(stub, theirs), PRECOND, "belongs to shard 0 of 2")
    assert_status(lambda: pull(stub, mine, table="nope"), NOT_FOUND, "does not exist")
    assert_status(lambda: stub.Pull(ps_pb2.PullRequest(table="emb", ids=b"123")), INVALID, "ids has 3 bytes")
    ids = random_ids(400)
    unseen = ids[SlotMap.contiguous(2).shard_of(ids) == 1][50:52]  # owned by shard 1, never seen by it
    assert_status(push(ids=wire.encode_ids(np.concatenate([unseen[:2], unseen[:1]])), grads=wire.encode_rows(np.ones((3, 4)))),
                  INVALID, "repeats id")  # fmt: skip
    huge = np.full((6, 4), 3e38, dtype=np.float32)  # finite, but two SGD steps of it overflow float32
    shard.create_table(TableConfig("sgd", 4, optimizer=OptimizerConfig("sgd", 1.0)))
    ok = stub.Push(ps_pb2.PushRequest(table="sgd", ids=good_ids, grads=wire.encode_rows(huge), dim=4))
    assert ok.num_applied == 6
    sgd_rows = shard.table("sgd").peek(mine[:6])
    one_huge = np.ones((6, 4), dtype=np.float32)
    one_huge[4] = 3e38  # only the 5th row overflows: the rows before and after it must not change either
    assert_status(push(table="sgd", grads=wire.encode_rows(one_huge)), INVALID, f"would make the row of id {mine[4]} ",
                  "non-finite")  # fmt: skip
    np.testing.assert_array_equal(shard.table("sgd").peek(mine[:6]), sgd_rows)
    after = snapshot(shard, mine)
    np.testing.assert_array_equal(after[0], before[0])
    assert after[1:3] == before[1:3] and after[3] == before[3] + 1  # + the one accepted push to "sgd"
    info = stub.DescribeTable(ps_pb2.DescribeTableRequest(table="emb"))
    assert info.num_rows == 50 and info.row_floats == 4 + 4 + 4  # embedding, adagrad state, statistics


def test_create_table_is_idempotent_and_rejects_a_different_spec(shard1):
    stub = shard1[0]
    spec = codec.table_config_to_proto(ADAGRAD)
    assert stub.CreateTable(ps_pb2.CreateTableRequest(spec=spec)).num_rows == 50
    spec.optimizer.params["epsilon"] = 1e-7  # the default, spelled out: the same table
    assert stub.CreateTable(ps_pb2.CreateTableRequest(spec=spec)).num_rows == 50
    spec.dim = 8
    assert_status(
        lambda: stub.CreateTable(ps_pb2.CreateTableRequest(spec=spec)),
        grpc.StatusCode.ALREADY_EXISTS, "different spec", "dim: 4 != 8",
    )  # fmt: skip
    for bad, fragment in [
        (ps_pb2.TableSpec(name="x", dim=0), "dim must be in 1..4096, got 0"),
        (ps_pb2.TableSpec(name="bad name", dim=2), "table name 'bad name' is invalid"),
        (ps_pb2.TableSpec(name="x", dim=2, optimizer=ps_pb2.OptimizerSpec(name="rmsprop")), "'rmsprop' is unknown"),
        (ps_pb2.TableSpec(name="x", dim=2, initializer=ps_pb2.InitializerSpec(name="ones")), "'ones' is unknown"),
        (ps_pb2.TableSpec(name="emb\n", dim=2), "is invalid"),
        (ps_pb2.TableSpec(name="x", dim=2, optimizer=ps_pb2.OptimizerSpec(learning_rate=0)), "learning_rate must be"),
        (ps_pb2.TableSpec(name="x", dim=2, initializer=ps_pb2.InitializerSpec(scale=1e39)), "scale must be"),
        (ps_pb2.TableSpec(name="x", dim=2, optimizer=ps_pb2.OptimizerSpec(params={"epsilon": 0})), "epsilon must be"),
    ]:
        assert_status(
            lambda bad=bad: stub.CreateTable(ps_pb2.CreateTableRequest(spec=bad)),
            grpc.StatusCode.INVALID_ARGUMENT,
            fragment,
        )
    assert [t.name for t in stub.Stats(ps_pb2.StatsRequest()).tables] == ["emb"]


def test_every_call_naming_a_table_refuses_a_name_no_table_may_have_as_invalid_not_as_missing(shard1):
    stub, mine, _, shard = shard1
    before = snapshot(shard, mine)
    ids, grads = wire.encode_ids(mine[:2]), wire.encode_rows(np.ones((2, 4)))
    calls = {
        "CreateTable": lambda t: stub.CreateTable(ps_pb2.CreateTableRequest(spec=ps_pb2.TableSpec(name=t, dim=4))),
        "DescribeTable": lambda t: stub.DescribeTable(ps_pb2.DescribeTableRequest(table=t)),
        "Pull": lambda t: stub.Pull(ps_pb2.PullRequest(table=t, ids=ids)),
        "PullBatch": lambda t: stub.PullBatch(ps_pb2.PullBatchRequest(pulls=[ps_pb2.PullRequest(table=t, ids=ids)])),
        "Push": lambda t: stub.Push(ps_pb2.PushRequest(table=t, ids=ids, grads=grads, dim=4)),
        "PushBatch": lambda t: stub.PushBatch(
            ps_pb2.PushBatchRequest(pushes=[ps_pb2.PushRequest(table=t, ids=ids, grads=grads, dim=4)])
        ),
        "Shrink": lambda t: stub.Shrink(ps_pb2.ShrinkRequest(table=t)),
    }
    for method, call in calls.items():
        for name in ("a/b", "emb\n", "x" * 129):
            with pytest.raises(grpc.RpcError) as info:
                call(name)
            said = f"table name {echo(name)} is invalid; expected 1-128 characters of [A-Za-z0-9_.-]"
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, said), method
        if method != "CreateTable":  # a valid name the shard lacks is missing
            assert_status(lambda call=call: call("nope"), grpc.StatusCode.NOT_FOUND, "table 'nope' does not exist")
    after = snapshot(shard, mine)
    np.testing.assert_array_equal(after[0], before[0])
    assert after[1:] == before[1:] and [t.name for t in stub.Stats(ps_pb2.StatsRequest()).tables] == ["emb"]


def test_unset_spec_fields_take_defaults_and_set_ones_are_kept():
    spec = ps_pb2.TableSpec(name="x", dim=2, initializer=ps_pb2.InitializerSpec(scale=5))
    assert codec.table_config_from_proto(spec).initializer == InitializerConfig("uniform", 5.0)
    spec = ps_pb2.TableSpec(name="x", dim=2, initializer=ps_pb2.InitializerSpec(name="normal"))
    assert codec.table_config_from_proto(spec).initializer == InitializerConfig("normal", 0.01)


def test_a_server_failure_reaches_the_client_as_internal_with_its_message(shard1, monkeypatch):
    stub, mine, _, shard = shard1

    def broken(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(shard.table("emb"), "pull", broken)
    assert_status(lambda: pull(stub, mine), grpc.StatusCode.INTERNAL, "Pull failed on the server", "disk on fire")


def test_requests_after_close_are_refused_not_hung(tmp_path):
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    shard.create_table(ADAGRAD)
    shard.close()
    with pytest.raises(ShardClosingError, match="shutting down"):
        shard.pull("emb", np.arange(3, dtype=np.uint64))


def test_a_100k_id_pull_of_dim_64_fits_in_one_message(servers):
    addresses, _ = servers(1)
    channel = grpc.insecure_channel(addresses[0], options=grpc_options(256 << 20))
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=ps_pb2.TableSpec(name="big", dim=64)))
    ids = random_ids(100_000, seed=3)
    rows = pull(stub, ids, table="big")  # 25.6 MB reply, over gRPC's 4 MiB default
    assert rows.shape == (100_000, 64) and np.isfinite(rows).all() and rows.std() > 0
    channel.close()


def test_health_service_reports_serving(servers):
    addresses, _ = servers(1)
    with grpc.insecure_channel(addresses[0]) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "sparseps.ParameterServer"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_push_batch_checks_every_push_before_applying_any(shard1):
    stub, mine, theirs, shard = shard1
    before = snapshot(shard, mine)
    clock = shard.clock

    def push(ids, grads, table="emb", dim=4):
        return ps_pb2.PushRequest(table=table, ids=wire.encode_ids(ids), grads=wire.encode_rows(grads), dim=dim)

    good = push(mine[:5], np.ones((5, 4)))
    nan = np.ones((5, 4))
    nan[3, 2] = np.nan
    for bad, code, fragment in [
        (push(mine[5:10], nan), grpc.StatusCode.INVALID_ARGUMENT, "non-finite"),
        (push(mine[5:10], np.ones((5, 4)), table="nope"), grpc.StatusCode.NOT_FOUND, "nope"),
        (push(mine[5:10], np.ones((5, 4)), dim=3), grpc.StatusCode.INVALID_ARGUMENT, "dim 3"),
        (push(theirs, np.ones((5, 4))), grpc.StatusCode.FAILED_PRECONDITION, "other shards"),
    ]:
        request = ps_pb2.PushBatchRequest(pushes=[good, bad], advance_clock=3)
        assert_status(lambda request=request: stub.PushBatch(request), code, fragment)
        after = snapshot(shard, mine)
        np.testing.assert_array_equal(after[0], before[0])  # the good push before the bad one: not applied
        assert after[1:] == before[1:] and shard.clock == clock

    reply = stub.PushBatch(ps_pb2.PushBatchRequest(pushes=[good, push(mine[:5], np.ones((5, 4)))], advance_clock=3))
    assert (reply.num_applied, reply.step) == (10, clock + 3)
    assert not np.array_equal(pull(stub, mine[:5]), before[0][:5, :4])  # both applied (checked exactly in test_client)


def test_a_push_with_more_clicks_than_shows_is_refused_naming_the_id_and_changes_nothing(shard1):
    """Per id, clicks <= shows (shows default to 1, clicks to 0): a push past that is INVALID_ARGUMENT naming the
    first such id and its counts, and a batch holding it applies none of its pushes, of any table."""
    stub, mine, _, shard = shard1
    shard.create_table(TableConfig("other", 4, optimizer=OptimizerConfig("sgd", 1.0)))
    snapshot(shard, mine, "other")  # peek reads the new table's rows into RAM (initial rows, clean)
    before, other_before, clock = snapshot(shard, mine), snapshot(shard, mine, "other"), shard.clock

    def push(table, ids, shows=None, clicks=None):
        counts = {k: wire.encode_rows(np.asarray(v, np.float32)) for k, v in (("shows", shows), ("clicks", clicks))
                  if v is not None}  # fmt: skip
        grads = wire.encode_rows(np.ones((len(ids), 4)))
        return ps_pb2.PushRequest(table=table, ids=wire.encode_ids(ids), grads=grads, dim=4, **counts)

    good = push("other", mine[:3], shows=[2, 1, 5], clicks=[2, 0, 5])  # clicks == shows is allowed
    INVALID = grpc.StatusCode.INVALID_ARGUMENT
    for bad, fragment in [
        (push("emb", mine[:3], shows=[2, 1, 5], clicks=[1, 3, 6]), f"id {mine[1]} (position 1) has 3 clicks and 1 shows"),
        (push("emb", mine[:3], clicks=[0, 0, 2]), f"id {mine[2]} (position 2) has 2 clicks and 1 shows"),  # default shows
        (push("emb", mine[:3], shows=[0, 1, 1], clicks=[0.5, 0, 0]), f"id {mine[0]} (position 0) has 0.5 clicks and 0 shows"),
    ]:  # fmt: skip
        assert_status(lambda bad=bad: stub.Push(bad), INVALID, "clicks for table 'emb' exceed shows", fragment)
        request = ps_pb2.PushBatchRequest(pushes=[good, bad], advance_clock=1)
        assert_status(lambda request=request: stub.PushBatch(request), INVALID, fragment, "nothing was applied")
        after = snapshot(shard, mine)
        np.testing.assert_array_equal(after[0], before[0])
        assert after[1:] == before[1:] and shard.clock == clock
        other_after = snapshot(shard, mine, "other")
        np.testing.assert_array_equal(other_after[0], other_before[0])
        assert other_after[1:] == other_before[1:]
    assert (
        stub.PushBatch(ps_pb2.PushBatchRequest(pushes=[good, push("emb", mine[:3], shows=[1, 1, 1])])).num_applied == 6
    )
    shows_clicks = shard.table("other").peek(mine[:3])[:, -4:-2]  # the statistics: show, click, last_step, admitted
    np.testing.assert_array_equal(shows_clicks, [[2, 2], [1, 0], [5, 5]])


def test_pull_batch_answers_each_pull_in_order_and_fails_as_a_whole(shard1):
    stub, mine, theirs, shard = shard1
    requests = [ps_pb2.PullRequest(table="emb", ids=wire.encode_ids(mine[i : i + 7])) for i in (0, 20, 40)]
    reply = stub.PullBatch(ps_pb2.PullBatchRequest(pulls=requests))
    assert len(reply.replies) == 3
    for i, r in zip((0, 20, 40), reply.replies):
        np.testing.assert_array_equal(wire.decode_rows(r.rows, 7, r.dim), pull(stub, mine[i : i + 7]))
    bad = ps_pb2.PullRequest(table="emb", ids=wire.encode_ids(theirs))
    assert_status(
        lambda: stub.PullBatch(ps_pb2.PullBatchRequest(pulls=requests + [bad])), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert len(stub.PullBatch(ps_pb2.PullBatchRequest()).replies) == 0

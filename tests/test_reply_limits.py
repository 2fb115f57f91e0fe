"""Replies are bounded before they are built: a Pull, PullBatch or PushBatch(return_rows) whose reply would exceed
the server's message limit is RESOURCE_EXHAUSTED, naming the size and the limit, without the server allocating
the reply, and changes nothing. Batches are bounded in count too: more than MAX_BATCH_ITEMS pulls or pushes is
INVALID_ARGUMENT. Through gRPC, against a server process and in-process servers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps import codec, wire
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.server import Server, grpc_options
from ps.server_config import ServerConfig
from ps.service import MAX_BATCH_ITEMS, ParameterServerServicer, handler
from tests.conftest import random_ids
from worker.client import Client
from worker.cluster import LocalCluster

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
DEFAULT_LIMIT = ServerConfig(data_dir="").max_message_bytes  # ps.config.MAX_MESSAGE_BYTES, 512 MiB


def vm_hwm_kib(pid: int) -> int:
    """Peak resident set size of a process (VmHWM, KiB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def stats_state(stub) -> ps_pb2.StatsResponse:
    """The shard's Stats without the fields that move by themselves: uptime, and the disk's free bytes and the data
    dir's bytes (other processes write to the disk; RocksDB writes its log files)."""
    reply = stub.Stats(ps_pb2.StatsRequest(), timeout=30)
    for moving in ("uptime_s", "disk_free_bytes", "data_dir_bytes"):
        reply.ClearField(moving)
    return reply


def test_a_pull_of_a_655_mb_reply_is_refused_before_the_server_builds_it(tmp_path):
    """40,000 ids (a 320 KB request) of a dim-4096 table ask for a 655 MB reply, over the 512 MiB limit; four at
    once must not raise the server's peak RSS, and a pushed row and the shard's stats are unchanged."""
    cluster = LocalCluster(1, root=str(tmp_path), extra_args=["--cache-bytes", "64M", "--flush-interval-s", "3600"])
    (address,) = cluster.start()
    pid = cluster.procs[0].pid
    try:
        with grpc.insecure_channel(address, options=grpc_options(2 * DEFAULT_LIMIT)) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            spec = codec.table_config_to_proto(TableConfig("wide", 4096, optimizer=OptimizerConfig("sgd", 1.0)))
            stub.CreateTable(ps_pb2.CreateTableRequest(spec=spec), timeout=60)
            pushed = np.arange(1, 9, dtype=np.uint64)
            grads = np.full((8, 4096), 0.5, dtype=np.float32)
            stub.Push(ps_pb2.PushRequest(table="wide", ids=wire.encode_ids(pushed), grads=wire.encode_rows(grads),
                                         dim=4096), timeout=60)  # fmt: skip
            request = ps_pb2.PullRequest(table="wide", ids=wire.encode_ids(random_ids(40_000)))
            assert request.ByteSize() < 330_000
            rows_before = stub.Pull(ps_pb2.PullRequest(table="wide", ids=wire.encode_ids(pushed)), timeout=60).rows
            state_before = stats_state(stub)
            hwm_before = vm_hwm_kib(pid)
            with ThreadPoolExecutor(4) as pool:
                calls = [pool.submit(lambda: stub.Pull.future(request, timeout=120).exception()) for _ in range(4)]
                errors = [c.result() for c in calls]
            hwm_after = vm_hwm_kib(pid)
            assert hwm_after - hwm_before < 128 << 10, (hwm_before, hwm_after)  # KiB: one reply would be 640,000
            assert DEFAULT_LIMIT == 536_870_912
            for e in errors:
                assert e is not None and e.code() == EXHAUSTED, e
                assert (
                    "655,360,000 bytes of rows" in e.details() and "message limit of 536,870,912 bytes" in e.details()
                )
            assert stats_state(stub) == state_before
            after = stub.Pull(ps_pb2.PullRequest(table="wide", ids=wire.encode_ids(pushed)), timeout=60).rows
            assert after == rows_before
    finally:
        cluster.stop()


LIMIT = 1 << 20  # a small message limit, so the tests stay small
DIM = 64  # 256-byte rows: 4,096 of them fill LIMIT


def stub_with_table(port: int) -> tuple[grpc.Channel, ps_pb2_grpc.ParameterServerStub]:
    """A channel and a raw stub to the server on port, which has table 'emb' (dim DIM, SGD lr 1) once this returns."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=grpc_options(64 << 20))
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    spec = codec.table_config_to_proto(TableConfig("emb", DIM, optimizer=OptimizerConfig("sgd", 1.0)))
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=spec), timeout=30)
    return channel, stub


@pytest.fixture
def small_limit(tmp_path):
    """An in-process shard with a 1 MiB message limit and table 'emb' (dim 64, SGD lr 1); a raw stub to it."""
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard"), port=0, max_message_bytes=LIMIT))
    server.start()
    channel, stub = stub_with_table(server.port)
    yield stub, server
    channel.close()
    server.stop(grace_s=1)


def pull_request(ids, table: str = "emb") -> ps_pb2.PullRequest:
    return ps_pb2.PullRequest(table=table, ids=wire.encode_ids(ids))


def push_request(ids, return_rows: bool) -> ps_pb2.PushRequest:
    grads = wire.encode_rows(np.ones((len(ids), DIM), dtype=np.float32))
    return ps_pb2.PushRequest(table="emb", ids=wire.encode_ids(ids), grads=grads, dim=DIM, return_rows=return_rows)


def refused(call, *fragments: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == EXHAUSTED, info.value.details()
    for f in fragments:
        assert f in info.value.details()


def test_the_limit_the_server_sends_with_is_the_one_the_servicer_checks(small_limit):
    """A reply just under the limit is delivered (gRPC's send limit is no tighter), one just over is refused by
    the servicer with its own message (gRPC's is no looser)."""
    stub, _ = small_limit
    fits = (LIMIT - 1024) // (4 * DIM)
    reply = stub.Pull(pull_request(np.arange(fits, dtype=np.uint64)), timeout=30)
    assert len(reply.rows) == fits * 4 * DIM
    over = LIMIT // (4 * DIM) + 1
    refused(lambda: stub.Pull(pull_request(np.arange(over, dtype=np.uint64)), timeout=30),
            "Pull reply would be", f"{over:,} ids x dim {DIM} x 4 bytes", f"message limit of {LIMIT:,} bytes")  # fmt: skip


def test_a_pull_batch_is_bounded_by_the_sum_of_its_pulls(small_limit):
    stub, _ = small_limit
    half = np.arange(2100, dtype=np.uint64)  # 537,600 bytes of rows: one fits, two do not
    assert len(stub.PullBatch(ps_pb2.PullBatchRequest(pulls=[pull_request(half)]), timeout=30).replies) == 1
    refused(lambda: stub.PullBatch(ps_pb2.PullBatchRequest(pulls=[pull_request(half)] * 2), timeout=30),
            "PullBatch reply would be", "2 arrays of rows, 4,200 ids in all", f"{LIMIT:,} bytes")  # fmt: skip


@pytest.fixture
def wide_requests(tmp_path):
    """A shard whose servicer bounds replies by LIMIT while gRPC takes requests up to 64 MiB: a PushBatch's grads
    are as large as the rows it returns, so only a server that takes larger requests than it sends can be asked
    for an over-limit PushBatch reply. Table 'emb' as in small_limit; a raw stub."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "shard")))
    server = grpc.server(ThreadPoolExecutor(2), options=[("grpc.max_send_message_length", LIMIT),
                                                         ("grpc.max_receive_message_length", 64 << 20)])  # fmt: skip
    server.add_generic_rpc_handlers((handler(ParameterServerServicer(shard, max_reply_bytes=LIMIT)),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel, stub = stub_with_table(port)
    yield stub, shard
    channel.close()
    server.stop(1).wait()
    shard.close()


def test_a_push_batch_whose_returned_rows_would_not_fit_is_refused_and_applies_nothing(wide_requests):
    stub, shard = wide_requests
    ids = np.arange(1, 4101, dtype=np.uint64)  # 1,049,600 bytes of rows
    rows_before = [stub.Pull(pull_request(part), timeout=30).rows for part in np.array_split(ids, 2)]
    stats_before = stats_state(stub)
    batch = ps_pb2.PushBatchRequest(pushes=[push_request(ids, True)], advance_clock=1, client_id=7, seq=1)
    refused(lambda: stub.PushBatch(batch, timeout=30), "PushBatch reply would be", "4,100 ids x dim 64",
            f"message limit of {LIMIT:,} bytes")  # fmt: skip
    assert stats_state(stub) == stats_before and shard.clock == 0
    assert [stub.Pull(pull_request(part), timeout=30).rows for part in np.array_split(ids, 2)] == rows_before
    # the same push without its rows in the reply is applied, and its request number was not used up
    batch.pushes[0].return_rows = False
    reply = stub.PushBatch(batch, timeout=30)
    assert reply.num_applied == len(ids) and reply.step == 1


def test_the_client_chunks_wide_pulls_under_a_limit_equal_to_its_request_size(small_limit):
    """worker.client splits by reply size: with max_request_bytes at the server's limit, a pull whose rows are
    2.5x the limit arrives whole, in several requests."""
    _, server = small_limit
    ids = np.arange(10_000, dtype=np.uint64)
    with Client([f"127.0.0.1:{server.port}"], server_timeout_s=0, max_request_bytes=LIMIT) as client:
        rows = client.pull("emb", ids)
        assert rows.shape == (10_000, DIM)
        client.push("emb", ids[:10], np.ones((10, DIM), np.float32))
        assert np.array_equal(client.pull("emb", ids[:10]), rows[:10] - 1)


def test_a_batch_of_more_than_max_batch_items_pulls_or_pushes_is_refused_and_applies_nothing(small_limit):
    stub, server = small_limit
    assert MAX_BATCH_ITEMS == 4096
    one = pull_request(np.arange(0, dtype=np.uint64))  # no ids: 4,096 rows of dim 64 would fill the reply limit
    assert len(stub.PullBatch(ps_pb2.PullBatchRequest(pulls=[one] * 4096), timeout=30).replies) == 4096
    with pytest.raises(grpc.RpcError) as e:
        stub.PullBatch(ps_pb2.PullBatchRequest(pulls=[one] * 4097), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "PullBatch carries 4,097 pulls, over the 4,096 one request may carry" in e.value.details()
    empty = push_request(np.arange(0, dtype=np.uint64), False)
    before = stats_state(stub)
    with pytest.raises(grpc.RpcError) as e:
        stub.PushBatch(ps_pb2.PushBatchRequest(pushes=[empty] * 4097, advance_clock=1, client_id=3, seq=1), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "PushBatch carries 4,097 pushes, over the 4,096 one request may carry" in e.value.details()
    assert stats_state(stub) == before and server.shard.clock == 0 and 3 not in server.shard.journal.applied
    batch = ps_pb2.PushBatchRequest(pushes=[empty] * 4096, advance_clock=1, client_id=3, seq=1)
    assert stub.PushBatch(batch, timeout=30).step == 1


def _replaced_once_checked(server, stub, method: str, new: TableConfig, ids: np.ndarray):
    """Table 's' (dim 2, adagrad, never trained), replaced by `new` right after the servicer checked the first pull
    of ids (method: Pull or PullBatch) against it: the first pull is refused (UNAVAILABLE, the replace named: the
    client sends it again). Returns the call, to send it again."""
    pulls = server.shard.pulls
    server.shard.create_table(TableConfig("s", 2))
    check = "check_pull" if method == "Pull" else "check_pull_batch"
    real_check = getattr(pulls, check)

    def check_then_replace(*args, **kwargs):
        cost = real_check(*args, **kwargs)
        setattr(pulls, check, real_check)  # the first pull's check only
        server.shard.create_table(new, replace_untrained=True)
        return cost

    setattr(pulls, check, check_then_replace)
    if method == "Pull":
        call = lambda: stub.Pull(pull_request(ids, "s"), timeout=30)
    else:
        call = lambda: stub.PullBatch(ps_pb2.PullBatchRequest(pulls=[pull_request(ids, "s")]), timeout=30)
    with pytest.raises(grpc.RpcError) as first:
        call()
    assert first.value.code() == grpc.StatusCode.UNAVAILABLE, first.value.details()
    assert first.value.details() == ("table 's' was replaced just now by a table of its name and another spec; send "
                                     "the request again")  # fmt: skip
    return call


@pytest.mark.parametrize("method", ["Pull", "PullBatch"])
def test_a_pull_checked_against_a_table_replaced_before_its_rows_are_read_is_refused_as_replaced(small_limit, method):
    """A replace by a table of dim 64 right after the servicer checked the pull of 20,000 ids against 's' (a
    160,000-byte reply): the pull is refused as replaced, not answered with a 5,120,000-byte reply, 5x the message
    limit, that gRPC would refuse to send; sent again, the servicer refuses it with its own message, naming the
    size and the limit."""
    stub, server = small_limit
    call = _replaced_once_checked(server, stub, method, TableConfig("s", 64), np.arange(20_000, dtype=np.uint64))
    refused(call, f"{method} reply would be", "20,000 ids x dim 64", f"message limit of {LIMIT:,} bytes")


@pytest.mark.parametrize("method", ["Pull", "PullBatch"])
def test_a_pull_checked_against_a_table_replaced_by_one_of_its_dim_is_refused_as_replaced(small_limit, method):
    """A replace by a table of the same dim and another spec (adam, zeros: rows of another width, whose copies the
    request room was not priced for) right after the check: the pull reads no row of either table and is refused
    as replaced; sent again, it is answered with the new table's rows."""
    stub, server = small_limit
    new = TableConfig("s", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("adam"))
    call = _replaced_once_checked(server, stub, method, new, np.arange(100, dtype=np.uint64))
    reply = call()
    rows = reply.rows if method == "Pull" else reply.replies[0].rows
    assert rows == bytes(4 * 2 * 100)  # zeros, 100 ids x dim 2


def _replace_s_after_rows_checked(shard: Shard) -> None:
    """Creates 's' (dim 2, adagrad, never trained) and replaces it by a table of its dim and another spec (adam,
    zeros) right after the servicer checks the rows the next PushBatch asks back (check_pull_batch), before its
    pushes are checked."""
    pulls = shard.pulls
    shard.create_table(TableConfig("s", 2))
    real_check = pulls.check_pull_batch
    new = TableConfig("s", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("adam"))

    def check_then_replace(*args, **kwargs):
        cost = real_check(*args, **kwargs)
        pulls.check_pull_batch = real_check  # the first request's check only
        shard.create_table(new, replace_untrained=True)
        return cost

    pulls.check_pull_batch = check_then_replace


def s_push(ids: np.ndarray) -> ps_pb2.PushRequest:
    """A push of ones to 's' (dim 2) that asks its rows back."""
    grads = wire.encode_rows(np.ones((len(ids), 2), np.float32))
    return ps_pb2.PushRequest(table="s", ids=wire.encode_ids(ids), grads=grads, dim=2, return_rows=True)


def test_a_push_batch_whose_table_is_replaced_after_its_checks_is_refused_whole_or_applied_whole(small_limit):
    """A replace of 's' (dim 2, adagrad, never trained) by a table of its dim and another spec (adam, zeros) right
    after the servicer checked the rows a PushBatch asks back: the push goes to the table it was checked against,
    which refuses it as replaced (UNAVAILABLE) with nothing applied to either table nor its seq used up; sent
    again, it is applied to the new table, whose rows come back."""
    stub, server = small_limit
    shard = server.shard
    _replace_s_after_rows_checked(shard)
    ids = np.arange(1, 4, dtype=np.uint64)
    batch = ps_pb2.PushBatchRequest(pushes=[s_push(ids)], advance_clock=1, client_id=5, seq=1)
    with pytest.raises(grpc.RpcError) as first:
        stub.PushBatch(batch, timeout=30)
    assert first.value.code() == grpc.StatusCode.UNAVAILABLE, first.value.details()
    assert "table 's' was replaced just now" in first.value.details()
    table = shard.table("s")
    assert table.cfg.optimizer.name == "adam" and not table.trained and shard.clock == 0
    assert 5 not in shard.journal.applied
    reply = stub.PushBatch(batch, timeout=30)
    assert reply.num_applied == 3 and reply.step == 1 and shard.table("s").trained
    pulled = stub.Pull(pull_request(ids, "s"), timeout=30).rows
    assert reply.rows[0].rows == pulled and pulled != bytes(4 * 2 * 3)  # adam moved the zeros


def test_a_push_batch_of_two_whose_second_table_is_replaced_before_its_pushes_are_checked_applies_nothing(
    small_limit,
):
    """[a push to 'emb', a push to 's'], 's' replaced before the pushes are checked: the batch is refused
    (UNAVAILABLE) with nothing applied, not even the push to 'emb', whose table is the same; sent again without a
    client id (0: no deduplication), each push is applied once."""
    stub, server = small_limit
    shard = server.shard
    _replace_s_after_rows_checked(shard)
    ids = np.arange(1, 4, dtype=np.uint64)
    before = stub.Pull(pull_request(ids), timeout=30).rows
    batch = ps_pb2.PushBatchRequest(pushes=[push_request(ids, False), s_push(ids)], advance_clock=1, client_id=0)
    with pytest.raises(grpc.RpcError) as first:
        stub.PushBatch(batch, timeout=30)
    assert first.value.code() == grpc.StatusCode.UNAVAILABLE, first.value.details()
    assert first.value.details() == ("table 's' was replaced just now by a table of its name and another spec; send "
                                     "the request again")  # fmt: skip
    assert stub.Pull(pull_request(ids), timeout=30).rows == before and shard.clock == 0
    assert not shard.table("s").trained
    reply = stub.PushBatch(batch, timeout=30)
    assert reply.num_applied == 6 and reply.step == 1
    once = np.frombuffer(before, np.float32).reshape(3, DIM) - 1  # SGD lr 1, grads of ones
    assert np.array_equal(
        np.frombuffer(stub.Pull(pull_request(ids), timeout=30).rows, np.float32).reshape(3, DIM), once
    )

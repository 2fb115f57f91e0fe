"""The `requests` part of --memory-bytes, enforced (ps.engine.room): requests take room for their copies in the
order they ask and wait while it is taken; a client's request larger than the whole room is refused, a sync step's
sum that large runs alone; Shard's pulls and pushes take it; clients size their messages by the room the shards
report (ps.config.message_bytes_for)."""

from __future__ import annotations

import random
import re
import threading
import time
import tracemalloc

import numpy as np
import pytest

from ps.config import (
    CLIENT_MESSAGE_BYTES,
    MIN_CLIENT_MESSAGE_BYTES,
    ROOM_SHARE,
    OptimizerConfig,
    TableConfig,
    message_bytes_for,
)
from ps.engine.room import RequestRoom, pull_batch_cost, pull_cost, push_cost
from ps.engine.shard import Shard
from ps.rows.layout import layout_of
from ps.server import Server
from ps.server_config import ServerConfig
from ps.storage.memory import MiB, plan_memory
from tests.callers import StandInCaller
from tests.waiting import wait_until
from worker.__main__ import main as worker_main
from worker.client import Client


def _taker(room: RequestRoom, nbytes: int, log: list, name: str, go_on: threading.Event | None = None):
    """A thread that takes nbytes, logs name, and holds the room until go_on is set (at once if None)."""

    def run():
        with room.take(nbytes):
            log.append(name)
            if go_on is not None:
                go_on.wait(10)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _waiting(room: RequestRoom, n: int) -> None:
    wait_until(lambda: room.waiting == n, 10, f"{n} takes waiting (now {room.waiting})")


def _holding(log: list, names: list[str]) -> None:
    wait_until(lambda: log == names, 10, lambda: f"{names} holding room (now {log})")


def test_without_a_bound_every_take_returns_at_once():
    room = RequestRoom(0)
    with room.take(1 << 40), room.take(1 << 40):  # nested: nothing is counted
        assert room.in_use == 0


def test_takes_wait_their_turn_and_for_room():
    room, log = RequestRoom(100), []
    with room.take(60):
        b = _taker(room, 50, log, "b")  # does not fit beside 60
        _waiting(room, 1)
        c = _taker(room, 10, log, "c")  # would fit, but b asked first
        _waiting(room, 2)
        assert log == [] and room.in_use == 60
    b.join(5), c.join(5)
    assert log == ["b", "c"] and room.in_use == 0 and room.waiting == 0
    assert room.waits == 2


def test_a_take_larger_than_the_room_runs_alone():
    room, log, go_on = RequestRoom(100), [], threading.Event()
    with room.take(30):
        big = _taker(room, 500, log, "big", go_on)
        _waiting(room, 1)  # waits for the 30 to be given back
    _holding(log, ["big"])
    assert room.in_use == 500
    small = _taker(room, 1, log, "small")
    _waiting(room, 1)  # nothing runs beside it
    assert log == ["big"]
    go_on.set()
    big.join(5), small.join(5)
    assert log == ["big", "small"] and room.in_use == 0


def test_many_takers_never_hold_more_than_the_room_together():
    room, lock = RequestRoom(1000), threading.Lock()
    held, worst, alone_over = [], [0], [True]

    def run(seed):
        rng = random.Random(seed)
        for _ in range(50):
            n = rng.choice([1, 100, 400, 999, 1500])
            with room.take(n):
                with lock:
                    held.append(n)
                    total = sum(held)
                    worst[0] = max(worst[0], total if len(held) > 1 else 0)
                    alone_over[0] &= total <= 1000 or len(held) == 1
                time.sleep(0.0005)
                with lock:
                    held.remove(n)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(8)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert alone_over[0] and 0 < worst[0] <= 1000 and room.in_use == 0


@pytest.fixture
def bounded_shard(tmp_path):
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), memory_bytes=256 * MiB))
    shard.create_table(TableConfig(name="t", dim=4))
    yield shard
    shard.close()


def test_a_bounded_shard_takes_room_for_each_pull_and_push(bounded_shard):
    """With the room taken, a pull and a push wait; given back, both run, and the room is whole again."""
    shard, ids = bounded_shard, np.arange(1000, dtype=np.uint64)
    assert shard.room.capacity == plan_memory(256 * MiB, None).request_bytes > 0
    done = []

    def pull():
        shard.pull("t", ids)
        done.append("pull")

    def push():
        shard.push_batch([("t", ids, np.ones((1000, 4), np.float32), None, None)])
        done.append("push")

    pull(), push()  # the first of each compiles its kernels
    done.clear()
    with shard.room.take(shard.room.capacity):
        threads = [threading.Thread(target=f, daemon=True) for f in (pull, push)]
        [t.start() for t in threads]
        _waiting(shard.room, 2)
        assert done == [] and shard.stats()["request_room_used_bytes"] == shard.room.capacity
    [t.join(30) for t in threads]
    assert sorted(done) == ["pull", "push"] and shard.room.in_use == 0 and shard.stats()["request_room_waits"] == 2
    np.testing.assert_allclose(shard.pull("t", ids[:3]).shape, (3, 4))


def test_costs_count_every_row_read_and_its_copies():
    width, dim = 4 + 4 + 2, 4  # adagrad dim 4: embedding, accumulator, show and click
    assert pull_cost(1000, width, dim) == 1000 * 4 * (width + dim)
    assert push_cost(1000, width) == 1000 * (8 * width + 8)
    assert pull_cost(0, width, dim) == push_cost(0, width) == 0


def test_message_size_fits_the_smallest_room():
    assert message_bytes_for(CLIENT_MESSAGE_BYTES, [0, 0]) == CLIENT_MESSAGE_BYTES  # no bound: as given
    assert message_bytes_for(CLIENT_MESSAGE_BYTES, [64 * MiB, 32 * MiB, 0]) == 32 * MiB // ROOM_SHARE
    assert message_bytes_for(1000, [32 * MiB]) == 1000  # never above what the caller asked
    assert message_bytes_for(CLIENT_MESSAGE_BYTES, [1]) == MIN_CLIENT_MESSAGE_BYTES


def test_a_client_sizes_its_messages_by_a_bounded_shards_room(tmp_path, capsys):
    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, memory_bytes=256 * MiB))
    server.start()
    try:
        with Client([f"127.0.0.1:{server.port}"]) as client:
            assert client.max_request_bytes == CLIENT_MESSAGE_BYTES
            client.wait_ready()
            room = plan_memory(256 * MiB, None).request_bytes
            assert client.max_request_bytes == room // ROOM_SHARE < CLIENT_MESSAGE_BYTES
            client.create_table(TableConfig(name="t", dim=16))
            ids = np.arange(200_000, dtype=np.uint64)  # 14 MB of ids and rows: several messages
            client.push("t", ids, np.full((len(ids), 16), 0.5, np.float32))
            assert client.pull("t", ids).shape == (len(ids), 16)
        assert worker_main(["stats", "--servers", f"127.0.0.1:{server.port}"]) == 0
        out = capsys.readouterr().out
        assert re.search(r"^    0 memory of 256\.0 MiB: .*, room for requests 0 B of 32\.0 MiB \([\d,]+ requests waited for it\), "
                         r"sync steps hold 0 B of 32\.0 MiB \(counted with the copies their sums make\); outside it, "
                         r"replies being sent 0 B of 32\.0 MiB \(0 waited for room\)$",
                         out, re.MULTILINE), out  # fmt: skip
    finally:
        server.stop()


def test_a_take_interrupted_while_it_waits_passes_its_turn_on():
    """A waiter that stops waiting (an exception in its wait) gives its turn to the next ticket: later takes do not
    wait forever behind it."""
    room, log, go_on = RequestRoom(100), [], threading.Event()
    interrupted = threading.Event()
    real_wait = room._cond.wait

    def wait(*args):
        if threading.current_thread().name == "interrupted":
            interrupted.set()
            raise KeyboardInterrupt
        return real_wait(*args)

    room._cond.wait = wait
    holder = _taker(room, 100, log, "holder", go_on)
    _holding(log, ["holder"])
    raised = []

    def interrupted_take():
        try:
            with room.take(10):
                log.append("interrupted")
        except KeyboardInterrupt:
            raised.append(True)

    t = threading.Thread(target=interrupted_take, name="interrupted", daemon=True)
    t.start()
    wait_until(interrupted.is_set, 10, "the interrupted wait")
    t.join(5)
    assert raised == [True]
    later = _taker(room, 10, log, "later")
    _waiting(room, 1)
    go_on.set()
    holder.join(5), later.join(5)
    assert log == ["holder", "later"] and room.waiting == 0 and room.in_use == 0


def test_the_push_rpc_takes_room_too(bounded_shard):
    shard, ids, done = bounded_shard, np.arange(100, dtype=np.uint64), []
    shard.push("t", ids, np.ones((100, 4), np.float32))  # compiles its kernels
    with shard.room.take(shard.room.capacity):
        t = threading.Thread(target=lambda: done.append(shard.push("t", ids, np.ones((100, 4), np.float32))))
        t.start()
        _waiting(shard.room, 1)
        assert done == []
    t.join(30)
    assert done == [None] and shard.room.in_use == 0


def test_a_wait_whose_caller_left_ends_and_passes_its_turn_on():
    """A request waiting for room whose caller is gone (cancelled, past its deadline) stops waiting with
    CallerGoneError; the takes after it go on."""
    from ps.errors import CallerGoneError

    room, log, go_on, gone, raised = RequestRoom(100), [], threading.Event(), threading.Event(), []
    holder = _taker(room, 100, log, "holder", go_on)
    _holding(log, ["holder"])

    def abandoned_take():
        try:
            with room.take(10, caller_gone=gone.is_set):
                log.append("abandoned")
        except CallerGoneError as e:
            raised.append(str(e))

    t = threading.Thread(target=abandoned_take, daemon=True)
    t.start()
    _waiting(room, 1)
    later = _taker(room, 10, log, "later")
    _waiting(room, 2)
    gone.set()
    t.join(5)
    assert raised and "its caller left" in raised[0] and room.waiting == 1
    go_on.set()
    holder.join(5), later.join(5)
    assert log == ["holder", "later"] and room.waiting == 0 and room.in_use == 0


def _recorded_waits(room: RequestRoom) -> tuple[list, threading.Event]:
    """The timeouts of every wait on room's condition, and an event set as the first begins."""
    timeouts, waiting, wait = [], threading.Event(), room._cond.wait

    def recorded(timeout=None):
        timeouts.append(timeout)
        waiting.set()
        return wait(timeout)

    room._cond.wait = recorded
    return timeouts, waiting


def test_a_wait_whose_watched_caller_leaves_is_woken_by_it_not_by_a_poll():
    """A caller that can be watched (ps.service_calls.CallerGone) wakes the wait for room as it leaves: the wait sleeps
    untimed, ends with CallerGoneError at the wake, and the take after it goes on."""
    from ps.errors import CallerGoneError

    room, log, go_on, caller, raised = RequestRoom(100), [], threading.Event(), StandInCaller(), []
    holder = _taker(room, 100, log, "holder", go_on)
    _holding(log, ["holder"])
    timeouts, waiting = _recorded_waits(room)

    def abandoned_take():
        try:
            with room.take(10, caller_gone=caller):
                log.append("abandoned")
        except CallerGoneError as e:
            raised.append(str(e))

    t = threading.Thread(target=abandoned_take, daemon=True)
    t.start()
    assert waiting.wait(60)
    caller.leave()
    t.join(60)
    assert raised and "its caller left" in raised[0]
    assert set(timeouts) == {None} and len(caller.wakes) == 1  # woken by the watch, not a poll
    later = _taker(room, 10, log, "later")
    go_on.set()
    holder.join(60), later.join(60)
    assert log == ["holder", "later"] and room.waiting == 0 and room.in_use == 0


def test_a_wait_whose_caller_left_before_it_began_does_not_sleep():
    """watch_caller says the caller left already (no wake would come): the take is refused before any sleep."""
    from ps.errors import CallerGoneError

    room = RequestRoom(100)
    timeouts, _ = _recorded_waits(room)
    with room.take(100), pytest.raises(CallerGoneError, match="its caller left"):
        room.acquire(10, caller_gone=StandInCaller(gone=True))
    assert timeouts == [] and room.waiting == 0
    with room.take(100):  # its turn passed on
        pass


@pytest.fixture
def bounded_stub(tmp_path):
    """(Shard, stub) of a server under --memory-bytes 256M with tables "t" (dim 16, adagrad; its rows 0..99
    pushed) and "s" (dim 16, sgd)."""
    import grpc

    from protos import ps_pb2_grpc

    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, memory_bytes=256 * MiB))
    port = server.start()
    try:
        server.shard.create_table(TableConfig(name="t", dim=16))
        server.shard.create_table(TableConfig(name="s", dim=16, optimizer=OptimizerConfig("sgd", 0.1)))
        server.shard.push("t", np.arange(100, dtype=np.uint64), np.ones((100, 16), np.float32))
        big = [("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", 1 << 30)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=big) as channel:
            yield server.shard, ps_pb2_grpc.ParameterServerStub(channel)
    finally:
        server.stop()


def _refused_too_large(call, request) -> tuple[str, int]:
    """(details, the most ids it says fit) of a call refused as larger than the request room."""
    import grpc

    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=60)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    details = e.value.details()
    m = re.search(r"more than this server's whole room for requests \(([\d,]+) bytes, .* send at most about ([\d,]+) of "
                  r"these ids per request .*nothing was read or applied", details)  # fmt: skip
    assert m, details
    return details, int(m.group(2).replace(",", ""))


def test_a_request_larger_than_the_whole_room_is_refused_before_anything_and_the_size_it_names_fits(bounded_stub):
    """A caller that does not size its messages by the room (a foreign or hostile client) cannot make a shard copy
    more than its room at once: each data RPC larger than the room is RESOURCE_EXHAUSTED, nothing pulled or
    changed, and a request of the most ids the refusal names is served (the oracle: the costs of ps.engine.room)."""
    from protos import ps_pb2

    shard, stub = bounded_stub
    t = shard.table("t")
    room, before = shard.room.capacity, shard.pull("t", np.arange(100, dtype=np.uint64))
    pulls_before = t.counters["pulls"]

    n = room // pull_cost(1, t.width, t.dim) + 1
    ids = np.arange(n, dtype=np.uint64)
    said, most = _refused_too_large(stub.Pull, ps_pb2.PullRequest(table="t", ids=ids.tobytes()))
    assert "a Pull of" in said and pull_cost(most, t.width, t.dim) <= room < pull_cost(most + 1, t.width, t.dim)
    reply = stub.Pull(ps_pb2.PullRequest(table="t", ids=ids[:most].tobytes()), timeout=60)
    assert len(reply.rows) == most * 16 * 4

    n = room // pull_batch_cost(1, t.width, t.dim) + 1
    batch = ps_pb2.PullBatchRequest(pulls=[ps_pb2.PullRequest(table="t", ids=np.arange(n, dtype=np.uint64).tobytes())])
    said, most = _refused_too_large(stub.PullBatch, batch)
    assert "a PullBatch of 1 pulls" in said and pull_batch_cost(most, t.width, t.dim) <= room

    n = room // push_cost(1, t.width) + 1
    grads = np.full((n, 16), 1e3, np.float32)
    push = ps_pb2.PushRequest(table="t", ids=np.arange(n, dtype=np.uint64).tobytes(), grads=grads.tobytes(), dim=16)
    said, most = _refused_too_large(stub.Push, push)
    assert "a Push of" in said and push_cost(most, t.width) <= room < push_cost(most + 1, t.width)
    said, _ = _refused_too_large(stub.PushBatch, ps_pb2.PushBatchRequest(pushes=[push], client_id=7, seq=1))
    assert "a PushBatch of 1 pushes" in said

    s = shard.table("s")  # sgd: its rows to return cost more than its push; both are checked before the push
    n = room // pull_batch_cost(1, s.width, s.dim) + 1
    assert push_cost(n, s.width) <= room
    sgd = ps_pb2.PushRequest(table="s", ids=np.arange(n, dtype=np.uint64).tobytes(),
                             grads=np.ones((n, 16), np.float32).tobytes(), dim=16, return_rows=True)  # fmt: skip
    said, _ = _refused_too_large(stub.PushBatch, ps_pb2.PushBatchRequest(pushes=[sgd], client_id=8, seq=1))
    assert "a PushBatch's rows to return of 1 pulls" in said and s.num_rows == 0
    sgd.return_rows = False
    stub.PushBatch(ps_pb2.PushBatchRequest(pushes=[sgd], client_id=8, seq=1), timeout=60)
    assert s.num_rows == n

    np.testing.assert_array_equal(shard.pull("t", np.arange(100, dtype=np.uint64)), before)  # nothing applied
    assert t.num_rows == 100 and t.counters["pulls"] == pulls_before + 2  # the Pull that fit, and this check
    assert shard.room.in_use == 0 and not shard.room.waiting


def test_a_pull_batch_takes_room_once_for_its_pulls_and_reply(bounded_shard):
    """A PullBatch waits while the room is taken, then runs, its rows encoded inside its take."""
    shard, ids, done = bounded_shard, np.arange(1000, dtype=np.uint64), []
    seen = []

    def encode(rows):
        seen.append(shard.room.in_use)
        return [r.copy() for r in rows]

    table = shard.table("t")
    shard.pulls.pull_batch([(table, ids)], shard.pulls.check_pull_batch([(table, ids)]), encode)  # compiles
    seen.clear()
    with shard.room.take(shard.room.capacity):
        pulls = [(table, ids), (table, ids[:10])]
        t = threading.Thread(
            target=lambda: done.append(shard.pulls.pull_batch(pulls, shard.pulls.check_pull_batch(pulls), encode))
        )
        t.start()
        _waiting(shard.room, 1)
        assert done == []
    t.join(30)
    w = shard.table("t").width
    assert seen == [pull_batch_cost(1000, w, 4) + pull_batch_cost(10, w, 4)] and shard.room.in_use == 0
    assert [r.shape for r in done[0]] == [(1000, 4), (10, 4)]


def test_a_sync_steps_sum_larger_than_the_room_runs_alone_where_a_push_is_refused(bounded_shard):
    """No client sized a sync step's sum (the union of its workers' ids): it is applied alone, not refused; the
    same pushes as a PushBatch of a client are refused."""
    from ps.errors import RequestTooLargeError
    from ps.stamp import WorkerStamp

    shard = bounded_shard
    n = shard.room.capacity // push_cost(1, shard.table("t").width) + 1
    ids, grads = np.arange(n, dtype=np.uint64), np.ones((n, 4), np.float32)
    with pytest.raises(RequestTooLargeError, match="a PushBatch of 1 pushes"):
        shard.push_batch([("t", ids, grads, None, None)], client=5, client_seq=1)
    assert shard.table("t").num_rows == 0
    stamp = WorkerStamp(job=1, worker=0, num_workers=1, step=0, sync=True)
    shard.push_stamped([("t", ids, grads, None, None)], 0, 9, 0, stamp)
    assert shard.table("t").num_rows == n and shard.room.in_use == 0


def test_a_sync_step_larger_than_the_room_trains_through_a_client_and_a_zero_take_waits_for_nothing(tmp_path):
    """A sync step's push is one PushBatch per shard, whatever its size (its rows returned too): served alone, not
    refused, where the same pushes without a stamp are split by the client to fit. A take of 0 bytes (a PushBatch
    returning no rows) does not queue behind a full room."""
    from ps.stamp import WorkerStamp

    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, memory_bytes=256 * MiB))
    port = server.start()
    try:
        with Client([f"127.0.0.1:{port}"]) as client:
            client.wait_ready()
            client.create_table(TableConfig(name="t", dim=64, optimizer=OptimizerConfig("adam", 0.01)))
            table = server.shard.table("t")
            n = server.shard.room.capacity // pull_batch_cost(1, table.width, table.dim) + 1000
            ids, grads = np.arange(n, dtype=np.uint64), np.ones((n, 64), np.float32)
            stamp = WorkerStamp(job=1, worker=0, num_workers=1, step=0, sync=True)
            [rows], _ = client.push_many([("t", ids, grads)], advance_clock=1, return_rows=True, stamp=stamp)
            assert rows.shape == (n, 64) and table.num_rows == n and server.shard.clock == 1
            [again] = client.push_many([("t", ids, grads)], advance_clock=1, return_rows=True)
            assert again.shape == (n, 64) and server.shard.clock == 2
        room, done = server.shard.room, []
        with room.take(room.capacity):
            queued = _taker(room, 1, [], "queued")  # waits for the room, ahead of what comes next
            _waiting(room, 1)
            t = threading.Thread(target=lambda: done.append(server.shard.pulls.pull_batch([], 0, list)), daemon=True)
            t.start()
            t.join(10)
            assert done == [[]]
        queued.join(10)
    finally:
        server.stop()


def test_a_sync_push_may_run_alone_up_to_the_whole_bound_and_no_further(bounded_shard):
    """Any caller can stamp its push sync: what a sync push copies, running alone, stops at --memory-bytes (its
    contribution and its rows to return), refused before anything is copied."""
    from ps.errors import RequestTooLargeError
    from ps.stamp import WorkerStamp

    shard, width = bounded_shard, bounded_shard.table("t").width
    assert shard.room.alone_limit == 256 * MiB
    n = 256 * MiB // push_cost(1, width) + 1
    ids, grads = np.arange(n, dtype=np.uint64), np.ones((n, 4), np.float32)
    stamp = WorkerStamp(job=1, worker=0, num_workers=1, step=0, sync=True)
    with pytest.raises(RequestTooLargeError, match="more than a sync step's push may copy on this server"):
        shard.push_stamped([("t", ids, grads, None, None)], 0, 9, 0, stamp)
    assert shard.table("t").num_rows == 0 and shard.room.in_use == 0
    m = 256 * MiB // pull_batch_cost(1, width, 4) + 1
    with pytest.raises(RequestTooLargeError, match="more than a sync step's push may copy"):
        shard.pulls.check_pull_batch([(shard.table("t"), np.arange(m, dtype=np.uint64))], larger_runs_alone=True)
    fits = [(shard.table("t"), np.arange(m - 1, dtype=np.uint64))]
    assert shard.pulls.check_pull_batch(fits, larger_runs_alone=True) <= 256 * MiB


def test_a_shard_restarted_with_a_smaller_room_refuses_the_clients_messages_and_the_error_says_why(tmp_path):
    """A client sizes its messages by the room the shards report to wait_ready: a shard restarted since with a
    smaller --memory-bytes refuses a push sized for the old room, applying nothing, and the error names both."""
    from ps.errors import RequestTooLargeError

    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, memory_bytes=1024 * MiB))
    port = server.start()
    with Client([f"127.0.0.1:{port}"], server_timeout_s=60) as client:
        client.wait_ready()
        assert client.max_request_bytes == 128 * MiB // ROOM_SHARE
        client.create_table(TableConfig(name="t", dim=8, optimizer=OptimizerConfig("adam", 0.01)))
        server.stop()
        server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=port, memory_bytes=128 * MiB))
        server.start()
        try:
            n = client.max_request_bytes // (4 * 8 + 16)  # one message's ids
            ids, grads = np.arange(n, dtype=np.uint64), np.ones((n, 8), np.float32)
            said = (rf"whole room for requests \({16 * MiB:,} bytes.*nothing was read or applied\. This client sized "
                    rf"its messages \({8 * MiB:,} bytes\) by the room for requests its shards reported when it "
                    rf"connected \(the smallest {128 * MiB:,} bytes\): where shard 0's room above is smaller, the "
                    "shard restarted with a smaller --memory-bytes since")  # fmt: skip
            with pytest.raises(RequestTooLargeError, match=said):
                client.push("t", ids, grads)
            assert server.shard.table("t").num_rows == 0
        finally:
            server.stop()


def test_the_refusal_states_the_rooms_rule_as_the_memory_plan_sizes_it():
    """The `requests` part the refusal describes (1/k of --memory-bytes, lo to hi MiB) is the one plan_memory gives,
    and the largest room it names is the plan's largest."""
    from ps.errors import RequestTooLargeError

    with pytest.raises(RequestTooLargeError) as small:
        RequestRoom(16 * MiB).refuse_larger(17 * MiB, 17, "a pull")
    share, lo, hi = map(int, re.search(r"the room is 1/(\d+) of it, (\d+) to (\d+) MiB", str(small.value)).groups())
    for memory_bytes in (1 << 30, 256 * MiB, 8 << 30, 4 << 40, (lo * MiB * share) + 1):
        assert plan_memory(memory_bytes, None).request_bytes == min(max(memory_bytes // share, lo * MiB), hi * MiB)
    largest = plan_memory(1 << 40, None).request_bytes
    with pytest.raises(RequestTooLargeError, match=rf"the room is at its largest \({largest // MiB} MiB\)"):
        RequestRoom(largest).refuse_larger(largest + 1, 1, "a pull")


def test_a_miss_copies_no_more_than_the_room_its_request_takes(tmp_path):
    """pull_cost and push_cost are the room a request takes for its copies of rows: a pull or a push of ids missing
    from RAM, never pushed or read from RocksDB, allocates no more. A miss reads its rows into one array that becomes
    the rows installed (initial rows made in it), so a row read is held once. Rows of adam at dim 64 (197 floats),
    beside which the ids' own arrays are small (64 bytes an id allowed for them); the arena is full first, so the
    misses evict rather than grow it."""
    n, dim = 20_000, 64
    layout = layout_of(dim, "adam")
    shard = Shard(ServerConfig(data_dir=str(tmp_path), cache_bytes=3 * n * layout.ram_bytes, flush_interval_s=3600))
    table = shard.create_table(TableConfig("t", dim, optimizer=OptimizerConfig("adam", 0.01)))
    ids, out = np.arange(n, dtype=np.uint64), np.empty((n, dim), np.float32)
    grads, shows, clicks = np.ones((n, dim), np.float32), np.ones(n, np.float32), np.zeros(n, np.float32)

    def fill(k: int) -> None:  # other ids fill the arena: the next request's ids all miss
        table.pull(np.arange(3 * n, dtype=np.uint64) + np.uint64(k * 10**9), np.empty((3 * n, dim), np.float32))
        shard.store.drain()  # the rows it evicted are written: the write-behind thread allocates nothing meanwhile

    def peak(request) -> int:
        misses = table.counters["cache_misses"]
        tracemalloc.start()
        try:
            request()
            got = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert table.counters["cache_misses"] - misses == n  # every id missed
        return got

    table.push(ids + np.uint64(2 * n), grads, shows, clicks, 0)  # in RocksDB for the last push
    fill(1)
    new_pull = peak(lambda: table.pull(ids, out))
    fill(2)
    new_push = peak(lambda: table.push(ids + np.uint64(n), grads, shows, clicks, 0))
    shard.flush()
    fill(3)
    stored_pull = peak(lambda: table.pull(ids + np.uint64(n), out))
    fill(4)
    stored_push = peak(lambda: table.push(ids + np.uint64(2 * n), grads, shows, clicks, 0))
    ids_own = n * 64  # beside the rows: the request's arrays of ids, their keys and positions, a few words each
    pulled, pushed = pull_cost(n, layout.width, dim) + ids_own, push_cost(n, layout.width) + ids_own
    assert max(new_pull, stored_pull) <= pulled, (
        f"pulls of {n:,} missed ids allocated {new_pull:,} (never pushed) and {stored_pull:,} bytes (read from "
        f"RocksDB), taking room for {pulled - ids_own:,} (and {ids_own:,} allowed for their ids)"
    )
    assert max(new_push, stored_push) <= pushed, (
        f"pushes of {n:,} missed ids allocated {new_push:,} (never pushed) and {stored_push:,} bytes (read from "
        f"RocksDB), taking room for {pushed - ids_own:,} (and {ids_own:,} allowed for their ids)"
    )
    shard.close()

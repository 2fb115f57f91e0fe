"""The reply room (ps/replies.py): the replies of rows a server built and gRPC has not sent are bounded by
--reply-bytes. A reply takes its room before its request runs and gives it back when its call ends; one that does
not fit waits, one larger than all of it is refused. Through gRPC, with a caller of raw HTTP/2 that opens no flow
control window, so that its reply stays unsent until it does."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps import codec, wire
from ps.config import MIN_REPLY_READ_TIMEOUT_S, TableConfig
from ps.errors import CallerGoneError
from ps.replies import (
    REPLY_COPIES,
    REPLY_FRAME_BYTES,
    ReplyRoom,
    check_reply_bytes,
    least_reply_bytes,
    reply_room_bytes,
)
from ps.server import Server
from ps.server_config import ServerConfig
from ps.stamp import WorkerStamp
from ps.storage.memory import MiB, plan_memory, request_room_bytes
from ps.unreadreplies import ExpiryLog, UnreadReplies, Watchable, peer_host
from tests.conftest import random_ids
from tests.test_metrics import scrape
from tests.waiting import wait_until
from worker.__main__ import main as worker_main

DIM = 16
IDS = 1200  # a Pull's reply: 76,800 bytes of rows and its frame, held twice (REPLY_COPIES) while unsent; more
# than the 65,535 bytes a connection's window starts with (SlowReader.read opens it)
REPLY_BYTES = 200_000  # one such reply fits, two do not
READ_WINDOW_BYTES = 1 << 20  # what a SlowReader's read() lets the server send, more than any reply here
JOB = 7


class _Ends:
    """A stand-in for a call's context.add_callback: the callbacks kept, run by end()."""

    def __init__(self, ended: bool = False):
        self.callbacks, self.ended = [], ended

    def __call__(self, callback) -> bool:
        if self.ended:
            return False
        self.callbacks.append(callback)
        return True

    def end(self) -> None:
        self.ended = True
        for callback in self.callbacks:
            callback()


def test_a_reply_holds_its_room_until_its_call_ends_and_the_next_waits_for_it():
    room, first, got = ReplyRoom(200), _Ends(), []
    room.hold(60, first, lambda: False)
    assert room.in_use == REPLY_COPIES * 60 == 120  # gRPC's copy and the reply's bytes, both held until it is sent
    second = threading.Thread(target=lambda: (room.hold(50, _Ends(), lambda: False), got.append("second")))
    second.start()
    wait_until(lambda: room.waiting == 1, 10, "the second reply waiting for room")
    assert got == [] and room.in_use == 120
    first.end()
    second.join(10)
    assert got == ["second"] and room.in_use == 100


def test_a_call_that_ended_before_its_reply_took_room_gives_it_back_at_once():
    room = ReplyRoom(100)
    room.hold(80, _Ends(ended=True), lambda: False)
    assert room.in_use == 0


def test_a_wait_for_reply_room_ends_when_its_caller_leaves():
    room = ReplyRoom(200)
    room.hold(80, _Ends(), lambda: False)
    with pytest.raises(CallerGoneError, match=r"reply room \(--reply-bytes\)"):
        room.hold(50, _Ends(), lambda: True)
    assert room.waiting == 0 and room.in_use == 160


def test_a_reply_larger_than_the_room_is_refused_but_a_sync_steps_runs_alone():
    room = ReplyRoom(200)
    held = r"Pull reply would be 101 bytes, held 2 times .* \(202 bytes\), over .* \(200 bytes, --reply-bytes\)"
    with pytest.raises(Exception, match=held):
        room.refuse_larger("Pull", 101)
    room.refuse_larger("PushBatch", 101, runs_alone=True)
    room.refuse_larger("Pull", 100)
    ReplyRoom(0).refuse_larger("Pull", 1 << 40)  # no bound


# ---- a caller of raw HTTP/2 that reads its reply only when told --------------------------------------------------
def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """An HPACK header field, literal and not indexed, its name and value under 127 bytes."""
    return bytes([0, len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


class SlowReader:
    """One unary call over a socket of its own whose stream's flow control window is 0: the server can send its
    reply's headers but no byte of the message until read() opens the window. The reply's headers (sent once
    the handler returned its reply) set `built`, its trailers (the call's end) `answered`; `received` counts the
    bytes of the reply's message that came (its 5-byte gRPC prefix included)."""

    def __init__(self, port: int, method: str, request: bytes):
        self.built, self.answered = threading.Event(), threading.Event()
        self.received = 0
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        headers = b"".join(_literal(k, v) for k, v in (
            (":method", "POST"), (":scheme", "http"), (":path", f"/sparseps.ParameterServer/{method}"),
            (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"), ("te", "trailers")))  # fmt: skip
        message = b"\0" + struct.pack(">I", len(request)) + request
        self._sock.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + _frame(0x4, 0, 0, struct.pack(">HI", 0x4, 0))  # SETTINGS: INITIAL_WINDOW_SIZE 0
            + _frame(0x1, 0x4, 1, headers)  # HEADERS, END_HEADERS
            + _frame(0x0, 0x1, 1, message)  # DATA, END_STREAM
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                head = self._exactly(9)
                size, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
                payload = self._exactly(size)
                if kind == 0x4 and not flags & 0x1:  # SETTINGS: acknowledged
                    self._sock.sendall(_frame(0x4, 0x1, 0))
                elif kind == 0x6 and not flags & 0x1:  # PING: answered
                    self._sock.sendall(_frame(0x6, 0x1, 0, payload))
                elif kind == 0x1:  # HEADERS: the reply's, then with END_STREAM its trailers
                    (self.answered if flags & 0x1 else self.built).set()
                elif kind == 0x0:  # DATA: the reply's message
                    self.received += size
        except OSError:
            return

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise OSError("closed")
            out += chunk
        return out

    def read(self) -> None:
        """Opens the stream's window and the connection's (65,535 bytes until then): the reply is sent."""
        update = struct.pack(">I", READ_WINDOW_BYTES)
        self._sock.sendall(_frame(0x8, 0, 0, update) + _frame(0x8, 0, 1, update))  # WINDOW_UPDATEs

    def close(self) -> None:
        """Closes the connection (shut down first: a close alone sends nothing while the reader is in recv)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed by the server already
            pass
        self._sock.close()
        self._reader.join(10)


@contextlib.contextmanager
def serving(tmp_path, **config) -> Iterator[Server]:
    """A server of table "emb" (dim DIM) whose reply room is REPLY_BYTES; config: more of its ServerConfig."""
    server = Server(ServerConfig(data_dir=str(tmp_path / "data"), port=0, **{"reply_bytes": REPLY_BYTES, **config}))
    server.start()
    try:
        server.shard.create_table(TableConfig(name="emb", dim=DIM))
        yield server
    finally:
        server.stop(grace_s=1)


@pytest.fixture
def server(tmp_path):
    with serving(tmp_path, metrics_port=0) as server:
        yield server


def _pull(ids: np.ndarray) -> ps_pb2.PullRequest:
    return ps_pb2.PullRequest(table="emb", ids=wire.encode_ids(np.sort(ids)))


def _push_batch(ids: np.ndarray, **request) -> ps_pb2.PushBatchRequest:
    """A PushBatch of zero grads to ids that asks their rows back; request: more of its fields."""
    ids = np.sort(ids)
    grads = np.zeros((len(ids), DIM), np.float32).tobytes()
    push = ps_pb2.PushRequest(table="emb", ids=wire.encode_ids(ids), grads=grads, dim=DIM, return_rows=True)
    return ps_pb2.PushBatchRequest(pushes=[push], **request)


def test_a_reply_waits_while_a_slow_readers_unsent_reply_holds_the_room(server):
    """A caller that does not read its reply keeps it on the server: the next Pull's reply, which would not fit
    beside it, is built only once the first is read; then both callers have their rows."""
    slow = SlowReader(server.port, "Pull", _pull(random_ids(IDS, seed=1)).SerializeToString())
    order = []
    try:
        assert slow.built.wait(30), "the slow reader's reply was not built"
        replies = server._servicer.replies
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = ps_pb2_grpc.ParameterServerStub(channel).Pull.future(_pull(random_ids(IDS, seed=2)), timeout=30)
            call.add_done_callback(lambda _: order.append("second answered"))
            wait_until(lambda: call.done() or replies.waiting, 30, "the second Pull waiting for reply room")
            held = REPLY_COPIES * (4 * IDS * DIM + 2 * REPLY_FRAME_BYTES)
            assert _room_figures(server, channel) == [(REPLY_BYTES, held, 1, 0, 0)] * 2  # Stats, /metrics
            order.append("first read")
            slow.read()
            assert slow.answered.wait(30), "the slow reader's reply never came"
            assert len(call.result().rows) == 4 * IDS * DIM
            assert order == ["first read", "second answered"]
            wait_until(lambda: replies.in_use == 0, 10, "the reply room given back")
            assert _room_figures(server, channel) == [(REPLY_BYTES, 0, 0, 1, 0)] * 2
    finally:
        slow.close()


def _room_figures(server: Server, channel: grpc.Channel) -> list[tuple[int, int, int, int, int]]:
    """The reply room's (bytes, used bytes, replies waiting, replies that waited, calls ended with their reply
    unread), as Stats and /metrics say."""
    s = ps_pb2_grpc.ParameterServerStub(channel).Stats(ps_pb2.StatsRequest(), timeout=30)
    m = scrape(server.metrics_port)
    names = ("sparseps_reply_room_bytes", "sparseps_reply_room_used_bytes", "sparseps_reply_room_waiting",
             "sparseps_reply_room_waits_total", "sparseps_reply_room_expired_total")  # fmt: skip
    return [
        (s.reply_room_bytes, s.reply_room_used_bytes, s.reply_room_waiting, s.reply_room_waits, s.reply_room_expired),
        tuple(int(m[(name, ())]) for name in names),
    ]


def test_a_slow_reader_that_leaves_gives_its_room_back(server):
    slow = SlowReader(server.port, "Pull", _pull(random_ids(IDS, seed=1)).SerializeToString())
    assert slow.built.wait(30), "the slow reader's reply was not built"
    replies = server._servicer.replies
    assert replies.in_use > 0
    slow.close()
    wait_until(lambda: replies.in_use == 0, 30, "the reply room given back")


def test_a_reply_larger_than_the_whole_reply_room_is_refused(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel, pytest.raises(grpc.RpcError) as info:
        ps_pb2_grpc.ParameterServerStub(channel).Pull(_pull(random_ids(2 * IDS)), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "(200,000 bytes, --reply-bytes)" in info.value.details()


def test_the_default_room_is_1_gib_or_under_memory_bytes_the_request_room_which_holds_a_largest_reply():
    assert reply_room_bytes(None, None) == 1 << 30
    assert reply_room_bytes(0, 1 << 30) == 0 and reply_room_bytes(5 << 20, None) == 5 << 20  # as given
    for memory_bytes in (92 * MiB, 1 << 30, 3 << 30, 64 << 30):
        room = reply_room_bytes(None, memory_bytes)
        assert room == request_room_bytes(memory_bytes) == plan_memory(memory_bytes, None).request_bytes
        assert least_reply_bytes(room) <= room  # ps-worker's largest reply to this server fits
        check_reply_bytes(room, room)
    assert reply_room_bytes(None, 1 << 30) == 128 * MiB


def test_a_server_under_memory_bytes_keeps_its_request_rooms_bytes_for_replies(tmp_path):
    server = Server(ServerConfig(data_dir=str(tmp_path / "data"), port=0, memory_bytes=1 << 30))
    server.start()
    try:
        assert server._servicer.replies.capacity == server.shard.memory.request_bytes == 128 * MiB
    finally:
        server.stop(grace_s=1)


def test_a_pull_its_checks_refuse_does_not_wait_for_reply_room(tmp_path):
    with serving(tmp_path, num_shards=2) as server:
        mine = random_ids(4 * IDS, seed=1)
        mine = mine[server.shard.slot_map.shard_of(mine) == 0][:IDS]
        theirs = random_ids(4 * IDS, seed=2)
        theirs = theirs[server.shard.slot_map.shard_of(theirs) == 1][:IDS]
        slow = SlowReader(server.port, "Pull", _pull(mine).SerializeToString())
        try:
            assert slow.built.wait(30), "the slow reader's reply was not built"
            with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel, pytest.raises(grpc.RpcError) as info:
                ps_pb2_grpc.ParameterServerStub(channel).Pull(_pull(theirs), timeout=10)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value.details()
            assert "belong to other shards" in info.value.details()
        finally:
            slow.close()


def test_a_push_a_checkpoints_hold_refuses_does_not_wait_for_reply_room(server):
    slow = SlowReader(server.port, "Pull", _pull(random_ids(IDS, seed=1)).SerializeToString())
    _, token = server.shard.hold(60)
    try:
        assert slow.built.wait(30), "the slow reader's reply was not built"
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel, pytest.raises(grpc.RpcError) as info:
            ps_pb2_grpc.ParameterServerStub(channel).PushBatch(_push_batch(random_ids(IDS, seed=2)), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
        assert "checkpoint" in info.value.details()
    finally:
        server.shard.release(token)
        slow.close()


@pytest.mark.parametrize("method", ["PullBatch", "PushBatch"])
def test_a_batchs_reply_holds_its_room_until_it_is_read(server, method):
    """A PullBatch's rows, and a PushBatch's rows to return, hold their room while unsent, and give it back once
    read. The PushBatch is small: the reader sends its request as one frame, at most 16 KiB."""
    n = IDS if method == "PullBatch" else 200
    ids = random_ids(n, seed=4)
    request = ps_pb2.PullBatchRequest(pulls=[_pull(ids)]) if method == "PullBatch" else _push_batch(ids)
    slow = SlowReader(server.port, method, request.SerializeToString())
    try:
        assert slow.built.wait(30), f"the {method} reply was not built"
        replies = server._servicer.replies
        assert replies.in_use == REPLY_COPIES * (4 * n * DIM + 2 * REPLY_FRAME_BYTES)
        slow.read()
        assert slow.answered.wait(30), f"the {method} reply never came"
        wait_until(lambda: replies.in_use == 0, 10, "the reply room given back")
    finally:
        slow.close()


def test_a_sync_steps_rows_larger_than_the_room_wait_for_it_to_empty_and_run_alone(server):
    """A sync step's PushBatch is one per shard whatever its size: its rows to return, whose copies are larger than
    the whole room, are not refused; they wait until the replies before them are read, then run alone."""
    ids = random_ids(2 * IDS, seed=3)
    assert REPLY_COPIES * (4 * len(ids) * DIM + 2 * REPLY_FRAME_BYTES) > REPLY_BYTES
    stamp = codec.stamp_to_proto(WorkerStamp(JOB, 0, 1, 0, sync=True, barrier_timeout_s=30.0))
    slow = SlowReader(server.port, "Pull", _pull(random_ids(IDS, seed=1)).SerializeToString())
    try:
        assert slow.built.wait(30), "the slow reader's reply was not built"
        replies = server._servicer.replies
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = ps_pb2_grpc.ParameterServerStub(channel).PushBatch.future(
                _push_batch(ids, advance_clock=1, stamp=stamp), timeout=30
            )
            wait_until(lambda: call.done() or replies.waiting, 30, "the sync push waiting for reply room")
            assert not call.done()
            slow.read()
            assert slow.answered.wait(30), "the slow reader's reply never came"
            assert len(call.result().rows[0].rows) == 4 * len(ids) * DIM
        wait_until(lambda: replies.in_use == 0, 10, "the reply room given back")
    finally:
        slow.close()


# ---- replies unread past --reply-read-timeout-s -------------------------------------------------------------------
READ_TIMEOUT_S = MIN_REPLY_READ_TIMEOUT_S  # the least the server takes; a test's StillClock moves past it, and the
# watcher, which sleeps this long in real time while that clock stands still, sees it move within that sleep


class StillClock:
    """A monotonic clock that moves only when told: a reply's time is up when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def timed_serving(tmp_path, **config) -> Iterator[tuple[Server, StillClock]]:
    """A server whose replies unread READ_TIMEOUT_S after they were built end their call, by a StillClock."""
    with serving(tmp_path, metrics_port=0, reply_read_timeout_s=READ_TIMEOUT_S, **config) as server:
        clock = server._servicer.replies.unread.clock = StillClock()
        yield server, clock


@pytest.fixture
def timed_server(tmp_path):
    with timed_serving(tmp_path) as server_and_clock:
        yield server_and_clock


def _pull_reply_bytes(n: int) -> int:
    """The bytes of the DATA of a Pull's reply of n rows: its gRPC prefix, its rows' tag and length, its rows."""
    return len(codec.pull_response_to_fill(n, DIM)[0]) + 5


def test_a_reply_unread_past_the_read_timeout_ends_its_call_and_the_waiting_reply_goes(timed_server, capsys):
    """The slow reader never reads: once its time is up its call ends with no byte of its reply sent, its room is
    given back, and the Pull that waited for that room gets its rows; counted once, in Stats, /metrics and
    ps-worker stats."""
    server, clock = timed_server
    replies = server._servicer.replies
    slow = SlowReader(server.port, "Pull", _pull(random_ids(IDS, seed=1)).SerializeToString())
    try:
        assert slow.built.wait(30), "the slow reader's reply was not built"
        wait_until(lambda: replies.unread.watching == 1, 10, "the slow reader's reply watched")
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = ps_pb2_grpc.ParameterServerStub(channel).Pull.future(_pull(random_ids(IDS, seed=2)), timeout=30)
            wait_until(lambda: call.done() or replies.waiting, 30, "the second Pull waiting for reply room")
            assert not call.done() and not slow.answered.is_set()
            clock.now += READ_TIMEOUT_S
            assert slow.answered.wait(30), "the unread reply's call was not ended"
            assert len(call.result().rows) == 4 * IDS * DIM
            assert slow.received == 0  # ended, not sent
            wait_until(lambda: replies.in_use == 0, 10, "the reply room given back")
            assert _room_figures(server, channel) == [(REPLY_BYTES, 0, 0, 1, 1)] * 2
        assert worker_main(["stats", "--servers", f"127.0.0.1:{server.port}"]) == 0
        assert "(1 waited for room, 1 cancelled at --reply-read-timeout-s)" in capsys.readouterr().out
    finally:
        slow.close()


def test_without_a_reply_room_an_unread_reply_still_ends_its_call_and_stats_say_so(tmp_path, capsys, caplog):
    """--reply-bytes 0: no room to give back, but the unread reply holds the server's memory all the same."""
    with timed_serving(tmp_path, reply_bytes=0) as (server, clock), caplog.at_level(logging.WARNING, "ps.replies"):
        replies = server._servicer.replies
        slow = SlowReader(server.port, "Pull", _pull(random_ids(IDS, seed=1)).SerializeToString())
        try:
            assert slow.built.wait(30), "the slow reader's reply was not built"
            wait_until(lambda: replies.unread.watching == 1, 10, "the slow reader's reply watched")
            clock.now += READ_TIMEOUT_S
            assert slow.answered.wait(30), "the unread reply's call was not ended"
            assert slow.received == 0
            wait_until(lambda: replies.unread.cancelled == 1, 10, "the cancel counted")
        finally:
            slow.close()
        assert worker_main(["stats", "--servers", f"127.0.0.1:{server.port}"]) == 0
    assert "; outside it, replies being sent unbounded (--reply-bytes 0), 1 cancelled at --reply-read-timeout-s" in (
        capsys.readouterr().out
    )
    said = [r.getMessage() for r in caplog.records if r.name == "ps.replies"]
    assert len(said) == 1 and "its call ended at the limit (CANCELLED, unless its read completed" in said[0], said
    assert said[0].endswith("), its reply freed (one line per caller's host every 60 s)"), said


def test_a_reply_read_within_the_read_timeout_is_untouched(timed_server):
    server, clock = timed_server
    replies = server._servicer.replies
    slow = SlowReader(server.port, "Pull", _pull(random_ids(IDS, seed=1)).SerializeToString())
    try:
        assert slow.built.wait(30), "the slow reader's reply was not built"
        wait_until(lambda: replies.unread.watching == 1, 10, "the slow reader's reply watched")
        slow.read()
        assert slow.answered.wait(30), "the slow reader's reply never came"
        assert slow.received == _pull_reply_bytes(IDS)
        wait_until(lambda: replies.in_use == 0, 10, "the reply room given back")
        assert replies.unread.watching == 0  # its end took it out: its time coming changes nothing
        clock.now += 10 * READ_TIMEOUT_S
        assert replies.unread.cancelled == 0
    finally:
        slow.close()


def test_without_a_read_timeout_an_unread_reply_is_not_watched(tmp_path):
    with serving(tmp_path, reply_read_timeout_s=0) as server:
        replies = server._servicer.replies
        slow = SlowReader(server.port, "Pull", _pull(random_ids(IDS, seed=1)).SerializeToString())
        try:
            assert slow.built.wait(30), "the slow reader's reply was not built"
            assert replies.unread.watching == 0 and replies.in_use > 0
            assert replies.unread._thread is None  # no watcher started (other tests' servers may run theirs)
            slow.read()
            assert slow.answered.wait(30), "the slow reader's reply never came"
            assert slow.received == _pull_reply_bytes(IDS)
        finally:
            slow.close()


def test_a_call_that_ended_before_its_reply_was_handed_over_is_not_watched():
    unread = UnreadReplies(60.0, logging.getLogger("test"))
    reply, ended = Watchable(), []
    unread.forget(reply)  # the caller left while the handler built its reply
    unread.watch(reply, "Pull", 1, lambda: ended.append(1), lambda: "ipv4:127.0.0.1:1")
    assert unread.watching == 0 and ended == []
    unread.close()


def test_a_call_ended_at_the_limit_is_counted_before_its_end_is_seen():
    """Whoever sees the call end (its caller, the reply room's callback) finds it in `cancelled` already."""
    unread = UnreadReplies(0.01, logging.getLogger("test"))
    seen, ended = [], threading.Event()

    def end_call() -> None:
        seen.append(unread.cancelled)
        ended.set()

    unread.watch(Watchable(), "Pull", 1, end_call, lambda: "ipv4:127.0.0.1:1")
    assert ended.wait(30), "the unread reply's call was never ended"
    unread.close()
    assert seen == [1] and unread.cancelled == 1


def test_replies_ended_unread_are_logged_once_per_host_an_interval_and_the_rest_counted(caplog):
    clock = StillClock()
    lines = ExpiryLog(logging.getLogger("test.expiry"), every_s=60.0, max_hosts=2, clock=clock)
    with caplog.at_level(logging.WARNING, "test.expiry"):
        for port in range(3):  # one host, three connections: one line
            lines.ended(f"ipv4:10.0.0.1:{5000 + port}", "first host")
        lines.ended("ipv6:[::1]:5000", "second host")
        lines.ended("ipv4:10.0.0.3:5000", "third host")  # past max_hosts: counted
        clock.now += 60.0
        lines.ended("ipv4:10.0.0.1:6000", "next interval")
        lines.ended("ipv4:10.0.0.1:6001", "counted")
        lines.close()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4, said
    assert said[0].startswith("first host (one line per caller's host every 60 s)")
    assert said[1].startswith("second host") and "; 2 more cancelled at the limit since the last such line" in said[1]
    assert said[2].startswith("next interval") and "; 1 more cancelled at the limit since the last such line" in said[2]
    assert said[3] == "1 more calls cancelled at the limit since the last such line, not logged"


def test_a_peers_host_is_its_address_without_the_port():
    assert peer_host("ipv4:10.0.0.7:51234") == "ipv4:10.0.0.7"
    assert peer_host("ipv6:[::1]:51234") == "ipv6:[::1]"
    assert peer_host("unix:/tmp/sock") == "unix:/tmp/sock"

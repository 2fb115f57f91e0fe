"""Requests that do not decode get INVALID_ARGUMENT from every method, never INTERNAL (issue 16, item 2).

Black box: raw bytes through gRPC to an in-process shard, checked by status code and by the shard's state as its
own replies show it (Stats less its uptime, request counters, what the flusher moves and the disk's figures; a Pull of the rows pushed
before). Two kinds of bytes:
- bytes that are no protobuf message at all (a key cut short, a length past the end, an unknown wire type, a
  group never closed), sent to each of the ten methods;
- a well-formed request whose string field (a table name; for Checkpoint its phase, dir or token) is not UTF-8,
  which proto3 forbids, sent to each method that has a string field.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.message import DecodeError

from protos import ps_pb2

TIMEOUT_S = 30
SERVICE = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]
METHODS = [m.name for m in SERVICE.methods]
IDS = b"".join(i.to_bytes(8, "little") for i in (3, 5, 9))  # a 1-shard server owns every id
GRADS = b"\x00\x00\x80\x3f" * 6  # float32 1.0, 3 ids x dim 2

NOT_PROTOBUF = {
    "a key cut short": b"\xff\xff\xff",
    "a varint cut short": b"\x08\xff",
    "a length past the end": b"\x0a\x05ab",
    "wire type 6": b"\x0e\x00",
    "wire type 7": b"\x0f\x00",
    "a group never closed": b"\x0b",
    "an end of group with no start": b"\x0c",
}

MOVING = ("pulls", "pushes", "ids_pulled", "ids_pushed", "cache_misses", "rows_on_disk", "dirty_rows", "disk_bytes")
# request counters, and what the background flusher changes: not state a rejected request could change

PLACE = "@@@@"  # a valid name the request is built with; its bytes are then replaced by NON_UTF8 ones
NON_UTF8 = {
    "0xff": b"\xff\xfeab",
    "a lone continuation byte": b"ab\x80c",
    "an encoded surrogate": b"a\xed\xa0\x80",
    "a sequence cut short": b"abc\xc3",
}


def _table_requests() -> dict[str, list[tuple[str, bytes]]]:
    """For each method with a string field: (what, serialized request whose string holds PLACE)."""
    push = ps_pb2.PushRequest(table=PLACE, ids=IDS, grads=GRADS, dim=2)
    pull = ps_pb2.PullRequest(table=PLACE, ids=IDS)
    spec = ps_pb2.TableSpec(name=PLACE, dim=2)
    out = {
        "CreateTable": [("spec.name", ps_pb2.CreateTableRequest(spec=spec))],
        "DescribeTable": [("table", ps_pb2.DescribeTableRequest(table=PLACE))],
        "Pull": [("table", pull)],
        "Push": [("table", push)],
        "PullBatch": [("pulls[0].table", ps_pb2.PullBatchRequest(pulls=[pull]))],
        "PushBatch": [("pushes[0].table", ps_pb2.PushBatchRequest(pushes=[push], advance_clock=1, client_id=7, seq=1))],
        "Shrink": [("table", ps_pb2.ShrinkRequest(table=PLACE))],
        "Checkpoint": [
            ("phase", ps_pb2.CheckpointRequest(phase=PLACE)),
            ("dir", ps_pb2.CheckpointRequest(phase="save", dir=PLACE, token="t")),
            ("token", ps_pb2.CheckpointRequest(phase="release", token=PLACE)),
        ],
    }
    return {m: [(what, r.SerializeToString()) for what, r in reqs] for m, reqs in out.items()}


TABLE_REQUESTS = _table_requests()


@pytest.fixture
def shard(servers):
    """(channel, raw call of a method by name, state()) of a 1-shard server holding table "t" with rows pushed."""
    addresses, _ = servers(1)
    channel = grpc.insecure_channel(addresses[0])
    raw = {m: channel.unary_unary(f"/{SERVICE.full_name}/{m}") for m in METHODS}
    spec = ps_pb2.TableSpec(
        name="t",
        dim=2,
        initializer=ps_pb2.InitializerSpec(name="zeros"),
        optimizer=ps_pb2.OptimizerSpec(name="sgd", learning_rate=1.0),
    )
    raw["CreateTable"](ps_pb2.CreateTableRequest(spec=spec).SerializeToString(), timeout=TIMEOUT_S)
    raw["Push"](ps_pb2.PushRequest(table="t", ids=IDS, grads=GRADS, dim=2).SerializeToString(), timeout=TIMEOUT_S)

    def state() -> tuple[bytes, bytes]:
        stats = ps_pb2.StatsResponse.FromString(raw["Stats"](b"", timeout=TIMEOUT_S))
        for moving in ("uptime_s", "journal_bytes", "disk_free_bytes", "data_dir_bytes"):
            stats.ClearField(moving)
        for t in stats.tables:
            for name in MOVING:
                t.ClearField(name)
        pulled = raw["Pull"](ps_pb2.PullRequest(table="t", ids=IDS).SerializeToString(), timeout=TIMEOUT_S)
        return stats.SerializeToString(), pulled

    yield raw, state
    channel.close()


def refusal(call, data: bytes) -> tuple[grpc.StatusCode | None, str]:
    """(status code, details) of a call of raw bytes; (None, "") if it succeeded."""
    try:
        call(data, timeout=TIMEOUT_S)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return None, ""


def test_the_bytes_are_refused_by_protobuf_itself():
    """The premise: the generated classes refuse every one of these requests (so no server may accept them)."""
    for method in SERVICE.methods:
        cls = getattr(ps_pb2, method.input_type.name)
        for data in NOT_PROTOBUF.values():
            with pytest.raises(DecodeError):
                cls.FromString(data)
    for method, requests in TABLE_REQUESTS.items():
        cls = getattr(ps_pb2, SERVICE.methods_by_name[method].input_type.name)
        for _, data in requests:
            for bad in NON_UTF8.values():
                with pytest.raises(DecodeError):
                    cls.FromString(data.replace(PLACE.encode(), bad))


@pytest.mark.parametrize("method", METHODS)
def test_bytes_that_are_no_request_get_invalid_argument_and_change_nothing(shard, method):
    raw, state = shard
    before = state()
    wrong = []
    for what, data in NOT_PROTOBUF.items():
        code, details = refusal(raw[method], data)
        if code != grpc.StatusCode.INVALID_ARGUMENT or not details:
            wrong.append(f"{what} {data!r}: {code and code.name} {details[:200]!r}")
    assert wrong == [], f"{method} answered bytes that are no request with: {wrong}"
    assert state() == before


@pytest.mark.parametrize("method", sorted(TABLE_REQUESTS))
def test_a_string_that_is_not_utf8_gets_invalid_argument_and_changes_nothing(shard, method):
    raw, state = shard
    before = state()
    wrong = []
    for field, data in TABLE_REQUESTS[method]:
        assert refusal(raw[method], data)[0] != grpc.StatusCode.INTERNAL  # the request is fine with a valid name
        for what, bad in NON_UTF8.items():
            code, details = refusal(raw[method], data.replace(PLACE.encode(), bad))
            if code != grpc.StatusCode.INVALID_ARGUMENT or not details:
                wrong.append(f"{field} = {what} {bad!r}: {code and code.name} {details[:200]!r}")
    assert wrong == [], f"{method} answered a {TABLE_REQUESTS[method][0][0]} that is not UTF-8 with: {wrong}"
    assert state() == before

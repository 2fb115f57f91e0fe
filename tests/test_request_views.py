"""ps.request_views reads what the generated classes read, without copying; bad bytes get a reason."""

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos import ps_pb2
from ps.request_views import PullBatchView, PushBatchView, SinglePullView, SinglePushView

names = st.text(max_size=8)
blobs = st.binary(max_size=64)
uint32 = st.integers(0, 2**32 - 1)
uint64 = st.integers(0, 2**64 - 1)


@st.composite
def push_requests(draw):
    return ps_pb2.PushRequest(
        table=draw(names), ids=draw(blobs), grads=draw(blobs), dim=draw(uint32), shows=draw(blobs),
        clicks=draw(blobs), return_rows=draw(st.booleans()),
    )  # fmt: skip


def same_push(view, msg) -> None:
    assert (view.table, view.dim, view.return_rows) == (msg.table, msg.dim, msg.return_rows)
    for f in ("ids", "grads", "shows", "clicks"):
        assert isinstance(getattr(view, f), memoryview)  # a view of the request's bytes, not a copy
        assert bytes(getattr(view, f)) == getattr(msg, f)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(push_requests(), max_size=4), uint64, uint64, uint64, st.binary(max_size=20))
def test_push_batch_view_reads_what_the_generated_class_reads(pushes, advance, client, seq, unknown_payload):
    msg = ps_pb2.PushBatchRequest(pushes=pushes, advance_clock=advance, client_id=client, seq=seq)
    # an unknown field (number 15, length-delimited) and an unknown varint field (16) are skipped by both
    data = msg.SerializeToString() + b"\x7a" + bytes([len(unknown_payload)]) + unknown_payload + b"\x80\x01\x05"
    want = ps_pb2.PushBatchRequest.FromString(data)
    view = PushBatchView(data)
    assert view.error is None and view.ByteSize() == len(data)
    assert (view.advance_clock, view.client_id, view.seq) == (want.advance_clock, want.client_id, want.seq)
    assert len(view.pushes) == len(want.pushes)
    for v, m in zip(view.pushes, want.pushes):
        same_push(v, m)
    one = pushes[0] if pushes else ps_pb2.PushRequest()
    single = SinglePushView(one.SerializeToString())
    assert single.error is None
    same_push(single, one)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(names, blobs), max_size=4))
def test_pull_views_read_what_the_generated_class_reads(pulls):
    msg = ps_pb2.PullBatchRequest(pulls=[ps_pb2.PullRequest(table=t, ids=i) for t, i in pulls])
    view = PullBatchView(msg.SerializeToString())
    assert view.error is None
    assert [(p.table, bytes(p.ids)) for p in view.pulls] == [(p.table, p.ids) for p in msg.pulls]
    for p in msg.pulls:
        single = SinglePullView(p.SerializeToString())
        assert (single.error, single.table, bytes(single.ids)) == (None, p.table, p.ids)


def test_the_last_value_of_a_repeated_scalar_field_wins():
    a = ps_pb2.PushRequest(table="a", dim=3, ids=b"x" * 8).SerializeToString()
    b = ps_pb2.PushRequest(table="b", dim=5).SerializeToString()
    want, view = ps_pb2.PushRequest.FromString(a + b), SinglePushView(a + b)
    same_push(view, want)


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\x0a\x05ab", "field 1 says 5 bytes, 2 are left"),
        (b"\x08", "truncated varint"),
        (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),
        (b"\x0b", "group 1 is not closed"),
        (b"\x0c", "wire type 4"),  # an end-group with no group
        (b"\x4b\x54", "group 9 ends with field 10"),
        (b"\x92\x80\x80\x80\x80\x00\x01\x41", "longer than 32 bits"),  # a key padded to 6 bytes
        (b"\x90\x80\x80\x80\x80\x01\x01\x41", "longer than 32 bits"),  # a key past 2**32 - 1
        (b"\x00\x01", "field number 0"),
        (b"\x0a\x02\x0a\x05", "field 1 says 5 bytes"),  # inside the first push
        (b"\x0a\x03\x0a\x01\xff", "table is not UTF-8"),
        (b"\x09\x00\x00", "cut short"),
    ],
)
def test_bytes_that_are_not_protobuf_get_a_reason(data, reason):
    view = PushBatchView(data)
    assert view.error is not None and reason in view.error and "not valid protobuf" in view.error
    with pytest.raises(Exception):  # noqa: B017 (protobuf's DecodeError) the generated class refuses them too
        ps_pb2.PushBatchRequest.FromString(data)


def test_a_garbage_request_gets_invalid_argument_from_the_server(servers):
    addresses, _ = servers(1)
    channel = grpc.insecure_channel(addresses[0])
    for method in ("Push", "PushBatch", "Pull", "PullBatch"):
        raw = channel.unary_unary(f"/sparseps.ParameterServer/{method}")
        with pytest.raises(grpc.RpcError) as e:
            raw(b"\x0a\x05ab", timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert "not valid protobuf" in e.value.details()
    good = ps_pb2.PullRequest(table="nope", ids=np.arange(2, dtype="<u8").tobytes()).SerializeToString()
    with pytest.raises(grpc.RpcError) as e:
        channel.unary_unary("/sparseps.ParameterServer/Pull")(good, timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND  # a well-formed request reaches the shard as before


def test_unknown_groups_are_skipped_like_other_unknown_fields():
    data = b"\x12\x01A" + b"\x4b" + b"\x08\x01" + b"\x53\x54" + b"\x4c" + b"\x20\x07"  # group 9 holds group 10
    want, view = ps_pb2.PushRequest.FromString(data), SinglePushView(data)
    assert view.error is None
    same_push(view, want)


def test_a_request_of_very_many_fields_is_read_by_the_generated_class(monkeypatch):
    from ps import request_views

    monkeypatch.setattr(request_views, "MAX_FIELDS", 10)
    msg = ps_pb2.PushBatchRequest(pushes=[ps_pb2.PushRequest(table=str(i), dim=i) for i in range(12)], seq=4)
    view = PushBatchView(msg.SerializeToString())
    assert view.error is None and view.seq == 4
    assert [(p.table, p.dim) for p in view.pushes] == [(str(i), i) for i in range(12)]
    bad = PushBatchView(b"\x10\x01" * 11 + b"\x0a\x05ab")  # past the limit and not protobuf
    assert bad.error and "not valid protobuf" in bad.error

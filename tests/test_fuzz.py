"""Fuzzing the servicer: thousands of malformed and random requests against shard 1 of 2. None crashes it, none
gets UNKNOWN (or INTERNAL: every bad input has its own status; bytes that are no request at all get
INVALID_ARGUMENT from every method), and every rejected request leaves the shard's state as it was, byte for
byte: rows with optimizer state and statistics, RAM used, counters, journal, clock. Requests that happen to be
valid are applied, and the state they leave is the new reference. One documented exception: a PushBatch whose
later push overflows float32 when applied keeps the pushes before it (the error says so; ps/engine/shard.py
push_batch)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos import ps_pb2, ps_pb2_grpc
from ps import wire
from ps.config import OptimizerConfig, TableConfig
from ps.server import grpc_options
from ps.sharding import SlotMap
from tests.conftest import random_ids

REJECTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
}
IDS = random_ids(300, seed=11)
MINE = IDS[SlotMap.contiguous(2).shard_of(IDS) == 1][:40]
THEIRS = IDS[SlotMap.contiguous(2).shard_of(IDS) == 0][:5]
SPECIAL = [0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-45]


@st.composite
def id_bytes(draw) -> bytes:
    kind = draw(st.sampled_from(["mine", "theirs", "mixed", "dup", "empty", "garbage"]))
    n = draw(st.integers(1, 8))
    if kind == "mine":
        return wire.encode_ids(MINE[:n])
    if kind == "theirs":
        return wire.encode_ids(THEIRS[: min(n, 5)])
    if kind == "mixed":
        return wire.encode_ids(np.concatenate([MINE[:n], THEIRS[:1]]))
    if kind == "dup":
        return wire.encode_ids(np.concatenate([MINE[:n], MINE[:1]]))
    if kind == "empty":
        return b""
    return draw(st.binary(max_size=70))


@st.composite
def float_bytes(draw, n_ids: int) -> bytes:
    shape = draw(st.sampled_from(["right", "short", "long", "garbage"]))
    dim = draw(st.sampled_from([4, 4, 4, 3, 8]))
    values = np.array(draw(st.lists(st.sampled_from(SPECIAL), min_size=n_ids * dim, max_size=n_ids * dim)), np.float32)
    raw = values.tobytes()
    if shape == "short":
        return raw[: max(0, len(raw) - draw(st.integers(1, 7)))]
    if shape == "long":
        return raw + b"\0" * draw(st.integers(1, 9))
    if shape == "garbage":
        return draw(st.binary(max_size=200))
    return raw


@st.composite
def requests(draw):
    method = draw(st.sampled_from(["Push", "Pull", "PushBatch", "PullBatch", "CreateTable", "DescribeTable"]))
    table = draw(st.sampled_from(["emb", "emb", "sgd", "nope", "", "é" * 3]))
    ids = draw(id_bytes())
    n = len(ids) // 8
    if method == "Pull":
        return method, ps_pb2.PullRequest(table=table, ids=ids)
    if method == "PullBatch":
        return method, ps_pb2.PullBatchRequest(
            pulls=[
                ps_pb2.PullRequest(table=table, ids=ids),
                ps_pb2.PullRequest(table="emb", ids=wire.encode_ids(MINE[:3])),
            ]
        )
    if method == "DescribeTable":
        return method, ps_pb2.DescribeTableRequest(table=table)
    if method == "CreateTable":
        spec = ps_pb2.TableSpec(name=table, dim=draw(st.integers(0, 5)))
        spec.optimizer.name = draw(st.sampled_from(["", "sgd", "adagrad", "adam", "ftrl", "bogus"]))
        if draw(st.booleans()):
            spec.optimizer.learning_rate = draw(st.sampled_from([0.1, 0.0, -1.0, float("nan"), float("inf")]))
        spec.initializer.name = draw(st.sampled_from(["", "zeros", "uniform", "normal", "what"]))
        if draw(st.booleans()):
            spec.initializer.scale = draw(st.sampled_from([0.01, -1.0, float("nan")]))
        spec.weight_bound = draw(st.sampled_from([0.0, 10.0, -1.0, float("nan")]))
        if draw(st.booleans()):
            spec.admission.probability = draw(st.sampled_from([0.5, 1.5, -0.1, float("nan")]))
        return method, ps_pb2.CreateTableRequest(spec=spec)
    push = ps_pb2.PushRequest(
        table=table, ids=ids, grads=draw(float_bytes(n)), dim=draw(st.sampled_from([4, 4, 3, 0, 2**32 - 1])),
        shows=draw(st.sampled_from([b"", np.full(n, 1.0, np.float32).tobytes(), np.full(n, -1.0, np.float32).tobytes(), b"\x00\x00\xc0\x7f" * n, b"xyz"])),
        clicks=draw(st.sampled_from([b"", np.zeros(n, np.float32).tobytes(), b"\x00\x00\x80\x7f" * n])),
    )  # fmt: skip
    if method == "Push":
        return method, push
    good = ps_pb2.PushRequest(
        table="emb", ids=wire.encode_ids(MINE[:2]), grads=wire.encode_rows(np.ones((2, 4))), dim=4
    )
    order = draw(st.sampled_from([[good, push], [push, good], [push]]))
    return method, ps_pb2.PushBatchRequest(pushes=order, advance_clock=draw(st.integers(0, 2)),
                                           client_id=draw(st.sampled_from([0, 5])), seq=draw(st.integers(0, 3)))  # fmt: skip


def state(shard) -> tuple:
    """Everything a request could change, as bytes and numbers."""
    out = [shard.clock, shard.journal.next_seq, sorted(shard.tables), sorted(shard.journal.applied.items())]
    for name, t in sorted(shard.tables.items()):
        rows = t.peek(MINE).tobytes()  # first: reading rows may cache them in RAM (not a change of state)
        moving = ("pulls", "ids_pulled", "cache_misses", "rows_on_disk", "disk_bytes", "dirty_rows")  # pulls and
        stats = {k: v for k, v in t.stats().items() if k not in moving}  # the background flusher change these
        out += [name, rows, t.arena.used, sorted(stats.items())]
    return tuple(out)


def test_random_and_malformed_requests_never_crash_or_change_state_when_rejected(servers):
    addresses, (_, server) = servers(2)
    shard = server.shard
    channel = grpc.insecure_channel(addresses[1], options=grpc_options(64 << 20))
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    shard.create_table(TableConfig("emb", 4, optimizer=OptimizerConfig("adagrad", 0.1)))
    shard.create_table(TableConfig("sgd", 4, optimizer=OptimizerConfig("sgd", 1.0)))
    seen = {"rejected": 0, "applied": 0, "partly applied": 0}

    @settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
    @given(requests())
    def check(call):
        method, request = call
        before = state(shard)
        try:
            getattr(stub, method)(request, timeout=30)
            seen["applied"] += 1
        except grpc.RpcError as e:
            assert e.code() in REJECTED, f"{method} got {e.code().name}: {e.details()}\n{request}"
            assert e.details(), "a rejection says why"
            if "before it were applied" in e.details():  # documented: a float32 overflow found while applying a
                seen["partly applied"] += 1  # later push of a batch leaves the earlier ones applied, and says so
                return
            assert state(shard) == before, f"rejected {method} changed the shard: {e.details()}\n{request}"
            seen["rejected"] += 1

    try:
        check()
        for method in ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].methods:  # bytes that are no request
            raw = channel.unary_unary(f"/sparseps.ParameterServer/{method.name}")
            for junk in (b"\xff" * 10, b"\x0a\xff\xff\xff\xff\x0f", bytes(range(256))):
                before = state(shard)
                with pytest.raises(grpc.RpcError) as e:
                    raw(junk, timeout=30)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method.name, e.value.details())
                assert "is not valid protobuf" in e.value.details()
                assert state(shard) == before
        assert stub.Stats(ps_pb2.StatsRequest(), timeout=30).shard_id == 1  # still serving
    finally:
        channel.close()
    assert seen["rejected"] > 1000 and seen["applied"] > 20, seen

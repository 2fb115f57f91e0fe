import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protos import ps_pb2
from ps import wire
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.errors import InvalidArgumentError


@given(st.lists(st.integers(0, 2**64 - 1), max_size=200))
def test_ids_round_trip(ids):
    a = np.array(ids, dtype=np.uint64)
    assert wire.decode_ids(wire.encode_ids(a)).tolist() == ids


def test_edge_ids_are_little_endian_on_the_wire():
    b = wire.encode_ids(np.array([0, 256, 2**64 - 1], dtype=np.uint64))
    assert b == bytes(8) + b"\x00\x01" + bytes(6) + b"\xff" * 8


@given(st.integers(0, 30), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_rows_round_trip(n, dim, seed):
    rows = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    assert np.array_equal(wire.decode_rows(wire.encode_rows(rows), n, dim), rows)


@pytest.mark.parametrize("n,dim", [(0, 1), (1, 1), (5, 8), (2047, 16), (3, 200), (70000, 16)])
def test_hand_built_pull_response_parses_as_the_generated_message(n, dim):
    rows = np.random.default_rng(n + dim).standard_normal((n, dim)).astype(np.float32)
    msg = ps_pb2.PullResponse.FromString(wire.encode_pull_response(rows))
    assert msg.dim == dim and msg.rows == rows.tobytes()
    if n:  # byte for byte what protobuf itself writes (it omits an empty field, which parses the same)
        assert wire.encode_pull_response(rows) == ps_pb2.PullResponse(rows=rows.tobytes(), dim=dim).SerializeToString()


@pytest.mark.parametrize("n,dim", [(0, 1), (1, 1), (5, 8), (2047, 16), (70000, 16)])
def test_a_pull_response_filled_in_place_is_the_one_built_from_rows(n, dim):
    rows = np.random.default_rng(n + dim).standard_normal((n, dim)).astype(np.float32)
    reply, view = wire.pull_response_to_fill(n, dim)
    assert isinstance(reply, bytes) and view.shape == (n, dim) and view.dtype == np.float32
    view[...] = rows
    assert reply == wire.encode_pull_response(rows)
    msg = ps_pb2.PullResponse.FromString(reply)
    assert msg.dim == dim and msg.rows == rows.tobytes()


def test_decoders_say_what_was_expected_and_what_arrived():
    with pytest.raises(InvalidArgumentError, match="ids has 13 bytes, expected a multiple of 8"):
        wire.decode_ids(b"x" * 13)
    with pytest.raises(InvalidArgumentError, match=r"grads has 96 bytes, expected 4\*6\*5 = 120"):
        wire.decode_rows(b"x" * 96, 6, 5, field="grads")


def test_table_config_round_trips_through_proto():
    cfg = TableConfig(
        "emb.v2", 17, InitializerConfig("normal", 0.5, 2**64 - 1), OptimizerConfig("adagrad", 0.01, {"epsilon": 1e-6})
    )
    assert wire.table_config_from_proto(wire.table_config_to_proto(cfg)) == cfg


def test_unset_proto_fields_take_defaults():
    from protos import ps_pb2

    cfg = wire.table_config_from_proto(ps_pb2.TableSpec(name="t", dim=3))
    assert cfg == TableConfig("t", 3)


@pytest.mark.parametrize("shapes", [[], [(0, 4)], [(3, 2)], [(5, 8), (0, 1), (300, 16)]])
def test_hand_built_batch_responses_parse_as_the_generated_messages(shapes):
    rng = np.random.default_rng(len(shapes))
    rows = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    pulls = ps_pb2.PullBatchResponse.FromString(wire.encode_pull_batch_response(rows))
    assert [(r.rows, r.dim) for r in pulls.replies] == [(x.tobytes(), x.shape[1]) for x in rows]
    for num_applied, step in [(0, 0), (7, 1), (2**40, 2**63)]:
        push = ps_pb2.PushBatchResponse.FromString(wire.encode_push_batch_response(num_applied, step, rows))
        assert (push.num_applied, push.step) == (num_applied, step)
        assert [(r.rows, r.dim) for r in push.rows] == [(x.tobytes(), x.shape[1]) for x in rows]

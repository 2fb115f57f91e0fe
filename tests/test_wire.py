"""ps.wire: arrays to and from the bytes they travel in, and back, with lengths checked."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ps import wire
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


def test_decoders_say_what_was_expected_and_what_arrived():
    with pytest.raises(InvalidArgumentError, match="ids has 13 bytes, expected a multiple of 8"):
        wire.decode_ids(b"x" * 13)
    with pytest.raises(InvalidArgumentError, match=r"grads has 96 bytes, expected 4\*6\*5 = 120"):
        wire.decode_rows(b"x" * 96, 6, 5, field="grads")

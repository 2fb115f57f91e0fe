"""Bytes <-> ndarray for the wire, and TableConfig <-> its protobuf message.

ids travel as little-endian uint64 (`<u8`), rows and grads as little-endian float32 (`<f4`), C order.
Decoders check lengths and say what was expected and what arrived; they return read-only views (no copy).
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np

from protos import ps_pb2
from ps.config import AdmissionConfig, EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.errors import InvalidArgumentError

IDS_DTYPE = np.dtype("<u8")
ROWS_DTYPE = np.dtype("<f4")


def encode_ids(ids: np.ndarray) -> bytes:
    return np.ascontiguousarray(ids, dtype=IDS_DTYPE).tobytes()


def encode_rows(rows: np.ndarray) -> bytes:
    return np.ascontiguousarray(rows, dtype=ROWS_DTYPE).tobytes()


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _pull_response_parts(rows: np.ndarray) -> list:
    """The pieces of a serialized PullResponse {rows, dim} of (n, dim) float32 rows; the payload is a view."""
    rows = np.ascontiguousarray(rows, dtype=ROWS_DTYPE)
    head, tail = _pull_response_frame(*rows.shape)
    return [head, rows.reshape(-1).view(np.uint8), tail]


def _pull_response_frame(n: int, dim: int) -> tuple[bytes, bytes]:
    """The bytes of a serialized PullResponse before and after its n rows of dim floats."""
    head = b"\x0a" + _varint(4 * n * dim)  # field 1 (rows), wire type 2 (length-delimited)
    tail = b"\x10" + _varint(dim)  # field 2 (dim), wire type 0 (varint)
    return head, tail


def _nested(field_tag: bytes, parts: list) -> list:
    """parts of a message, as a length-delimited field of an outer message."""
    return [field_tag, _varint(sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)), *parts]


def encode_pull_response(rows: np.ndarray) -> bytes:
    """The serialized PullResponse {rows, dim} of (n, dim) float32 rows, built with one copy of the payload
    (through protobuf it is copied three times: tobytes, the message, SerializeToString). Field numbers are
    those of protos/ps.proto; tests/test_wire.py parses the results with the generated classes."""
    return b"".join(_pull_response_parts(rows))


_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize  # (NULL, n): a bytes object of n bytes, not yet written
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)


class _WritableBytes:
    """A writable array interface over a new bytes object's buffer, holding the object (see pull_response_to_fill)."""

    def __init__(self, owner: bytes, size: int):
        self.owner = owner
        address = np.frombuffer(owner, dtype=np.uint8).ctypes.data
        self.__array_interface__ = {"data": (address, False), "shape": (size,), "typestr": "|u1", "version": 3}


def pull_response_to_fill(n: int, dim: int) -> tuple[bytes, np.ndarray]:
    """(a serialized PullResponse {rows, dim} whose n rows are not written yet, a writable (n, dim) float32 view
    of those rows). Fill the view, then send the bytes: the rows go straight into the reply, with no copy.
    Writing into a bytes object is safe here only because it is new and no one else holds it until the caller
    returns it (CPython computes a bytes object's hash on first use, after that)."""
    head, tail = _pull_response_frame(n, dim)
    total = len(head) + 4 * n * dim + len(tail)
    reply = _new_bytes(None, total)
    raw = np.asarray(_WritableBytes(reply, total))  # the view holds reply: it outlives no write through it
    raw[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    raw[total - len(tail) :] = np.frombuffer(tail, dtype=np.uint8)
    return reply, raw[len(head) : total - len(tail)].view(ROWS_DTYPE).reshape(n, dim)


def encode_pull_batch_response(rows: list[np.ndarray]) -> bytes:
    """The serialized PullBatchResponse {replies} (field 1, repeated PullResponse) of several row arrays, with
    one copy of each."""
    return b"".join(p for r in rows for p in _nested(b"\x0a", _pull_response_parts(r)))


def encode_push_batch_response(num_applied: int, step: int, rows: list[np.ndarray]) -> bytes:
    """The serialized PushBatchResponse {num_applied = 1, step = 2, rows = 3 (repeated PullResponse)}, with one
    copy of each row array."""
    parts = [b"\x08", _varint(num_applied), b"\x10", _varint(step)]
    for r in rows:
        parts += _nested(b"\x1a", _pull_response_parts(r))
    return b"".join(parts)


def strictly_increasing(ids: np.ndarray) -> bool:
    """True if every id is larger than the one before (so none repeats); checked without sorting."""
    return len(ids) < 2 or bool((ids[1:] > ids[:-1]).all())


def repeats_ids(ids: np.ndarray) -> bool:
    """True if an id occurs twice (strictly increasing ids, the common case, are checked without sorting)."""
    return not strictly_increasing(ids) and len(np.unique(ids)) != len(ids)


def decode_ids(data: bytes, field: str = "ids") -> np.ndarray:
    """uint64 ids from bytes; InvalidArgumentError if the length is not a multiple of 8."""
    if len(data) % IDS_DTYPE.itemsize:
        raise InvalidArgumentError(
            f"{field} has {len(data)} bytes, expected a multiple of 8 (little-endian uint64 ids)"
        )
    return np.frombuffer(data, dtype=IDS_DTYPE)


def decode_rows(data: bytes, n: int, dim: int, field: str = "rows") -> np.ndarray:
    """(n, dim) float32 from bytes; InvalidArgumentError if the length is not 4 * n * dim."""
    expected = ROWS_DTYPE.itemsize * n * dim
    if len(data) != expected:
        raise InvalidArgumentError(
            f"{field} has {len(data)} bytes, expected 4*{n}*{dim} = {expected} (float32, {n} ids x dim {dim})"
        )
    return np.frombuffer(data, dtype=ROWS_DTYPE).reshape(n, dim)


def table_config_to_proto(cfg: TableConfig) -> ps_pb2.TableSpec:
    return ps_pb2.TableSpec(
        name=cfg.name,
        dim=cfg.dim,
        initializer=ps_pb2.InitializerSpec(
            name=cfg.initializer.name, scale=cfg.initializer.scale, seed=cfg.initializer.seed
        ),
        optimizer=ps_pb2.OptimizerSpec(
            name=cfg.optimizer.name, learning_rate=cfg.optimizer.learning_rate, params=dict(cfg.optimizer.params)
        ),
        weight_bound=cfg.weight_bound,
        admission=ps_pb2.AdmissionSpec(min_count=cfg.admission.min_count, probability=cfg.admission.probability),
        eviction=ps_pb2.EvictionSpec(**dataclasses.asdict(cfg.eviction)),
    )


def table_config_from_proto(spec: ps_pb2.TableSpec) -> TableConfig:
    """The TableConfig a spec describes; each unset field takes TableConfig's default."""
    init, opt = InitializerConfig(), OptimizerConfig()
    if spec.HasField("initializer"):
        i = spec.initializer
        init = InitializerConfig(
            name=i.name or init.name, scale=i.scale if i.HasField("scale") else init.scale, seed=i.seed
        )
    if spec.HasField("optimizer"):
        o = spec.optimizer
        opt = OptimizerConfig(
            name=o.name or opt.name,
            learning_rate=o.learning_rate if o.HasField("learning_rate") else opt.learning_rate,
            params=dict(sorted(o.params.items())),
        )
    return TableConfig(
        name=spec.name,
        dim=spec.dim,
        initializer=init,
        optimizer=opt,
        weight_bound=spec.weight_bound,
        admission=AdmissionConfig(**_set_fields(spec.admission)),
        eviction=EvictionConfig(**_set_fields(spec.eviction)),
    )


def _set_fields(msg) -> dict:
    """The fields of a message that are set (proto3 optional or non-default), as a dict."""
    return {f.name: v for f, v in msg.ListFields()}

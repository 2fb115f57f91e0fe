"""The protocol of protos/ps.proto in one module: every hand-written read and write of protobuf bytes, all of it
driven by GRAMMAR, the table of every message's fields (tests/test_codec.py checks it against the generated
descriptors, both ways, so a field added to ps.proto and not here fails a test).

Reading. Push, PushBatch, Pull and PullBatch requests are read as Views: their bytes fields are memoryviews of the
request's bytes, where the generated classes copy each of them twice. A View reads the wire format as any protobuf
parser does: fields in any order, the last value of a non-repeated scalar field wins, a message field that comes
twice is merged, unknown fields (groups included) and known fields of an unexpected wire type are skipped, every
length is checked against what is left, keys are at most 32 bits, strings must be UTF-8. A request of more than
MAX_FIELDS fields, nested ones included (no real one has them), is read by the generated class instead, so a
stream of tiny fields cannot hold a shard in this Python loop. The other requests are read by the generated
classes, through read_generated. Either way a request's bytes that do not decode give an Undecodable whose `error`
says why, never an exception: the servicer answers INVALID_ARGUMENT.

Writing. PullResponse, PullBatchResponse and PushBatchResponse are written by hand, each row array copied once
(pull_response_to_fill: the rows are gathered straight into the reply); the other replies are built with the
generated classes. table_config_to_proto and table_config_from_proto convert between TableConfig and TableSpec.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import re
import struct
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from google.protobuf.message import Message

from protos import ps_pb2
from ps.config import AdmissionConfig, EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.stamp import WorkerStamp
from ps.wire import ROWS_DTYPE

GRAMMAR = """
A message is a sequence of fields; a field is a key, varint(number << 3 | wire type), then its value:
  VARINT (0) a base-128 varint, least significant group first      I64 (1) 8 bytes, little-endian
  LEN (2)    a varint length, then that many bytes                 I32 (5) 4 bytes, little-endian
A field may be absent (it then holds its type's zero) and fields may come in any order. A repeated field is one
field per element; a map is a repeated entry message. Arrays travel in bytes fields, little-endian, C order.
Each message below: number, name, wire type, type, what the field holds (ps.proto says more).

message PullRequest
  1  table            LEN     string                   the table's name, UTF-8
  2  ids              LEN     bytes                    <u8 (n,)

message PullResponse
  1  rows             LEN     bytes                    <f4 (n, dim), in the order of the request's ids
  2  dim              VARINT  uint32                   the table's dim

message PushRequest
  1  table            LEN     string                   the table's name, UTF-8
  2  ids              LEN     bytes                    <u8 (n,), no duplicates
  3  grads            LEN     bytes                    <f4 (n, dim), finite
  4  dim              VARINT  uint32                   the sender's idea of the table's dim
  5  shows            LEN     bytes                    <f4 (n,), finite, >= 0; empty: 1 each
  6  clicks           LEN     bytes                    <f4 (n,), finite, >= 0, <= shows; empty: 0 each
  7  return_rows      VARINT  bool                     PushBatch: reply with the rows of ids after the batch
  8  add_delta        VARINT  bool                     grads are deltas added to the embeddings, no optimizer step

message PushResponse
  1  num_applied      VARINT  uint64                   ids applied

message WorkerStamp
  1  job              VARINT  uint64                   the training job's id, nonzero
  2  worker           VARINT  uint32                   this worker, in [0, num_workers)
  3  num_workers      VARINT  uint32                   the job's workers
  4  step             VARINT  uint64                   pull: the step about to be computed; push: the step pushed
  5  staleness        VARINT  uint32                   pull: waits until every worker pushed steps < step - this
  6  sync             VARINT  bool                     push: the step's pushes of every worker applied as one sum
  7  barrier_timeout_s I64    double                   how long a wait may last; 0: the shard's default (ps.config DEFAULT_BARRIER_S)
  8  done             VARINT  bool                     push with no pushes: the worker has finished
  9  acked            VARINT  uint64                   the worker's steps whose push has had its reply
  10 setup            LEN     string                   key=value pairs every worker of the job runs alike
  11 stopped          LEN     string                   push with no pushes: why the worker stopped before its end
  12 unclocked        VARINT  bool                     async or geo: push, create; names the job, moves no clock
  13 token            VARINT  uint64                   unclocked: the worker process's random id; 0: not known
  14 apart            VARINT  bool                     push, sync or ssp: ends no step of the worker here; no clock moves
  15 stopped_by       LEN     string                   with stopped: the class of the shard's refusal it stopped on; empty: none
  16 job_name         LEN     string                   the job's name (--job-id), printable ASCII, hashing to job; empty: none

message PullBatchRequest
  1  pulls            LEN     repeated PullRequest     one per pull
  2  stamp            LEN     WorkerStamp              absent: no wait (async, geo, eval, predict)
  3  state_id         VARINT  uint64                   nonzero: the shard's state_id as the client saw it

message PullBatchResponse
  1  replies          LEN     repeated PullResponse    one per pull, in request order
  2  min_clock        VARINT  uint64                   stamped: the job's slowest clock when the pulls were served

message PushBatchRequest
  1  pushes           LEN     repeated PushRequest     one per push, applied in order
  2  advance_clock    VARINT  uint64                   steps to advance the clock after the pushes
  3  client_id        VARINT  uint64                   nonzero: applied at most once per (client_id, seq)
  4  seq              VARINT  uint64                   the client's request number on this shard
  5  stamp            LEN     WorkerStamp              absent: applied in no job's name
  6  shared           VARINT  bool                     client_id is one key for every caller (no identity)
  7  state_id         VARINT  uint64                   nonzero: the shard's state_id as the client saw it

message PushBatchResponse
  1  num_applied      VARINT  uint64                   ids applied, over all pushes
  2  step             VARINT  uint64                   the clock after the batch
  3  rows             LEN     repeated PullResponse    one per push with return_rows, in request order
  4  min_clock        VARINT  uint64                   stamped: the job's slowest clock after the batch

message OptimizerSpec
  1  name             LEN     string                   "sgd" | "adagrad" | "adagrad_rowwise" | "adam" | "ftrl"; empty: "adagrad"
  2  learning_rate    I64     double                   optional; unset: the optimizer's (DEFAULT_LEARNING_RATES)
  3  params           LEN     repeated OptimizerSpec.ParamsEntry  map<string, double>

message OptimizerSpec.ParamsEntry
  1  key              LEN     string                   a parameter's name, e.g. "epsilon"
  2  value            I64     double                   its value

message InitializerSpec
  1  name             LEN     string                   "zeros" | "uniform" | "normal"; empty: "uniform"
  2  scale            I64     double                   optional; unset: 0.01
  3  seed             VARINT  uint64                   initial rows are a function of (seed, id, column)

message AdmissionSpec
  1  min_count        VARINT  uint32                   optional; unset: 1
  2  probability      I64     double                   optional; unset: 1

message EvictionSpec
  1  ttl_steps        VARINT  uint64                   0: off
  2  score_threshold  I64     double                   0: off
  3  decay            I64     double                   optional; unset: 1
  4  nonclk_coeff     I64     double                   optional; unset: 0.1
  5  click_coeff      I64     double                   optional; unset: 1

message TableSpec
  1  name             LEN     string                   the table's name
  2  dim              VARINT  uint32                   floats per embedding
  3  initializer      LEN     InitializerSpec          absent: the defaults
  4  optimizer        LEN     OptimizerSpec            absent: the defaults
  5  weight_bound     I64     double                   > 0: embeddings clipped to [-weight_bound, weight_bound]
  6  admission        LEN     AdmissionSpec            absent: the defaults
  7  eviction         LEN     EvictionSpec             absent: the defaults
  8  l2               I64     double                   > 0: lazy L2, embeddings decay by (1 - lr * l2) per step
  9  features         LEN     string                   what the ids mean ("" none; at most 64 of [A-Za-z0-9_.:-])
  10 values_at_rest   LEN     string                   "float32" | "float16" (embeddings in RocksDB); "": either, new: "float32"

message CreateTableRequest
  1  spec             LEN     TableSpec                the table to create
  2  replace_untrained VARINT bool                     a table of the name, of another spec, never trained: replaced
  3  check_only       VARINT  bool                     every check a create makes, nothing changed (TableInfo as if)
  4  stamp            LEN     WorkerStamp              absent: no job's; a job's worker's: holds the shard for the job
  5  state_id         VARINT  uint64                   nonzero: the shard's state_id as the client saw it

message DescribeTableRequest
  1  table            LEN     string                   the table's name

message TableInfo
  1  spec             LEN     TableSpec                the table's spec, defaults filled in
  2  num_rows         VARINT  uint64                   rows held by this shard
  3  row_floats       VARINT  uint32                   float32 values per stored row

message CheckpointRequest
  1  phase            LEN     string                   "hold" | "save" | "release"
  2  dir              LEN     string                   save: a new directory inside the server's checkpoint root
  3  hold_timeout_s   I64     double                   hold: release after this long, <= 3600; 0: 120
  4  token            LEN     string                   save, release: the token the hold returned
  5  state_id         VARINT  uint64                   hold, save: nonzero: the shard's state_id as the client saw it

message CheckpointResponse
  1  clock            VARINT  uint64                   the shard's clock
  2  shard_json       LEN     string                   save: what the manifest records of this shard
  3  token            LEN     string                   hold: the token for save and release

message StatsRequest

message TableStats
  1  name             LEN     string                   the table's name
  2  dim              VARINT  uint32                   floats per embedding
  3  num_rows         VARINT  uint64                   rows held
  4  pulls            VARINT  uint64                   pull calls
  5  pushes           VARINT  uint64                   push calls
  6  ids_pulled       VARINT  uint64                   ids over all pulls
  7  ids_pushed       VARINT  uint64                   ids over all pushes
  8  rows_in_ram      VARINT  uint64                   rows in the RAM tier
  9  rows_on_disk     VARINT  uint64                   rows in RocksDB
  10 dirty_rows       VARINT  uint64                   RAM rows newer than RocksDB
  11 evictions        VARINT  uint64                   rows dropped from RAM to make room
  12 ram_bytes        VARINT  uint64                   RAM tier bytes charged to the table
  13 cache_misses     VARINT  uint64                   ids looked up in RocksDB
  14 pending_ids      VARINT  uint64                   ids pushed but not admitted yet
  15 disk_bytes       VARINT  uint64                   the table's rows in RocksDB (keys + values)
  16 admitted         VARINT  uint64                   ids admitted since the server started
  17 dropped          VARINT  uint64                   ids dropped by Shrink since the server started
  18 trained          VARINT  bool                     ids were pushed to it here (a Shrink may have dropped all)

message AdvanceClockRequest
  1  steps            VARINT  uint64                   steps to advance the clock by

message ClockResponse
  1  step             VARINT  uint64                   the clock after advancing it

message ShrinkRequest
  1  table            LEN     string                   the table to shrink; empty: all
  2  state_id         VARINT  uint64                   nonzero: the shard's state_id as the client saw it

message ShrinkResponse
  1  dropped          VARINT  uint64                   ids dropped (admitted and pending)
  2  num_rows         VARINT  uint64                   admitted ids left
  3  pending_ids      VARINT  uint64                   pending ids left
  4  tables_without_rule LEN  repeated string          the tables shrunk that have no eviction rule
  5  lists_tables_without_rule VARINT bool             tables_without_rule is filled (false: a server without it)

message StatsResponse
  1  shard_id         VARINT  uint32                   this shard
  2  num_shards       VARINT  uint32                   shards in the cluster
  3  num_slots        VARINT  uint32                   slots of the slot map
  4  tables           LEN     repeated TableStats      one per table
  5  data_dir         LEN     string                   the shard's data directory
  6  uptime_s         I64     double                   seconds since the server started
  7  ram_budget_bytes VARINT  uint64                   --cache-bytes
  8  ram_used_bytes   VARINT  uint64                   RAM tier bytes in use
  9  journal_bytes    VARINT  uint64                   pushes not yet flushed to RocksDB
  10 clock            VARINT  uint64                   the shard's clock (steps)
  11 job              VARINT  uint64                   the job whose worker clocks the shard follows; 0: none
  12 num_workers      VARINT  uint32                   its workers
  13 min_clock        VARINT  uint64                   its slowest worker's clock
  14 max_gap          VARINT  uint64                   the largest step - min_clock a stamped pull was served at
  15 memory_budget_bytes VARINT uint64                 --memory-bytes; 0: no overall bound
  16 block_cache_budget_bytes VARINT uint64            RocksDB's block cache capacity
  17 block_cache_used_bytes VARINT uint64              in use (index and filter blocks too, under --memory-bytes)
  18 memtable_bytes   VARINT  uint64                   RocksDB's memtables
  19 table_reader_bytes VARINT uint64                  RocksDB's table readers (index, filters without --memory-bytes)
  20 write_behind_bytes VARINT uint64                  evicted rows waiting for their RocksDB write
  21 journal_map_bytes VARINT uint64                   the journal segment mapped for appends (its size; 0: none)
  22 cluster          LEN     string                   --cluster: the cluster's name; empty: unnamed
  23 data_dir_bytes   VARINT  uint64                   every file under data_dir: RocksDB, its logs, the journal
  24 disk_free_bytes  VARINT  uint64                   free to the server's user on data_dir's file system
  25 disk_total_bytes VARINT  uint64                   that file system's size
  26 request_room_bytes VARINT uint64                  room for requests' copies of rows, taken by each; 0: none
  27 flushing         VARINT  uint32                   1 while a flush writes dirty rows to RocksDB
  28 request_room_waits VARINT uint64                  pulls and pushes that waited for room since the start
  29 restored_from    LEN     string                   the checkpoint the data dir was restored from; empty: none
  30 restored_sha256  LEN     string                   that checkpoint's manifest sha256
  31 request_room_used_bytes VARINT uint64             request room held now by the pulls and pushes running
  32 state_id         VARINT  uint64                   model state id, random in [1, 2^63): new per data dir or restore
  33 flush_failures   VARINT  uint32                   background flushes failed in a row (0: the last succeeded)
  34 sync_steps_bytes VARINT  uint64                   room for sync steps' contributions and sums; 0: none
  35 sync_steps_held_bytes VARINT uint64               bytes of the sync steps' contributions held now
  36 reply_room_bytes VARINT  uint64                   room for replies built and not yet sent (twice each); 0: none
  37 reply_room_used_bytes VARINT uint64               reply room held now by the replies built and not yet sent
  38 reply_room_waiting VARINT uint32                  replies waiting for reply room now
  39 reply_room_waits VARINT  uint64                   replies that waited for reply room since the start
  40 reply_room_expired VARINT uint64                  calls cancelled at the limit (some read just then) since start
  41 job_unclocked    VARINT  bool                     the job's stamps move no worker clock (async, geo)
  42 job_name         LEN     string                   the job's name (its --job-id; job its hash); empty: none known
"""

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_GROUP_START, _GROUP_END = 3, 4  # proto2 groups: skipped as unknown fields
WIRE_TYPES = {"VARINT": VARINT, "I64": I64, "LEN": LEN, "I32": I32}


class Field(NamedTuple):
    number: int
    name: str
    wire_type: int
    type: str  # a scalar type of .proto ("string", "uint64", ...) or the name of a message of the grammar
    repeated: bool


_FIELD_LINE = re.compile(r"\s+(\d+)\s+(\w+)\s+(VARINT|I64|LEN|I32)\s+(repeated\s+)?([\w.]+)(\s|$)")


def parse_grammar(text: str) -> dict[str, dict[int, Field]]:
    """{message name: {field number: Field}} of a grammar written as GRAMMAR is: a message is a line
    `message Name` and its field lines up to the next blank line; lines before the first message are prose."""
    schema: dict[str, dict[int, Field]] = {}
    message = None
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("message "):
            message = line.split()[1]
            schema[message] = {}
        elif not line.strip():
            message = None
        elif message is not None:
            m = _FIELD_LINE.match(line)
            if m is None or int(m[1]) in schema[message]:
                raise ValueError(f"grammar line {i} is not a new field of {message}: {line!r}")
            schema[message][int(m[1])] = Field(int(m[1]), m[2], WIRE_TYPES[m[3]], m[5], bool(m[4]))
    return schema


SCHEMA = parse_grammar(GRAMMAR)

STATE_ID_PHASES = frozenset({"hold", "save"})
"""The CheckpointRequest phases whose state_id its shard checks before anything else of the call (ps.service
Checkpoint, with CHECKPOINT_REFUSED's words for each), as the grammar's state_id line says; a release ends a hold or
nothing, whatever the id. A client reads it to tell whether a refusal found the id the shard's (worker.shard_calls
carries_state_id)."""


class MalformedError(ValueError):
    """Bytes that are not an encoding of the message being read."""


class _TooManyFields(Exception):
    """More fields than a real request has: the generated class reads it instead (in C, bounded)."""


MAX_FIELDS = 4096  # fields of one request, nested ones included; a PushBatch of 9 pushes has ~70


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data):
            raise MalformedError(f"truncated varint at byte {pos}")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise MalformedError(f"varint longer than 10 bytes at byte {pos}")


def _key(data: memoryview, pos: int) -> tuple[int, int, int]:
    """(field number, wire type, position after the key); keys are at most 5 bytes and 32 bits, as upb requires."""
    start = pos
    key, pos = _varint(data, pos)
    if pos - start > 5 or key > 0xFFFFFFFF:
        raise MalformedError(f"field key at byte {start} is longer than 32 bits")
    if key >> 3 == 0:
        raise MalformedError(f"field number 0 at byte {start}")
    return key >> 3, key & 7, pos


def _value(data: memoryview, pos: int, number: int, wire_type: int, budget: list[int], depth: int = 0) -> tuple:
    """(value, position after it) of a field whose key was read: an int for a varint, a memoryview of the bytes
    for the other wire types, None for a group (skipped, as unknown fields are; its fields count in budget)."""
    end = len(data)
    if wire_type == VARINT:
        return _varint(data, pos)
    if wire_type == LEN:
        size, pos = _varint(data, pos)
        if size > end - pos:
            raise MalformedError(f"field {number} says {size} bytes, {end - pos} are left")
        return data[pos : pos + size], pos + size
    if wire_type in (I64, I32):
        size = 8 if wire_type == I64 else 4
        if size > end - pos:
            raise MalformedError(f"field {number} is cut short")
        return data[pos : pos + size], pos + size
    if wire_type == _GROUP_START and depth < 64:  # its fields, up to the matching end-group key
        while pos < end:
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooManyFields()
            inner, inner_type, pos = _key(data, pos)
            if inner_type == _GROUP_END:
                if inner != number:
                    raise MalformedError(f"group {number} ends with field {inner}")
                return None, pos
            _, pos = _value(data, pos, inner, inner_type, budget, depth + 1)
        raise MalformedError(f"group {number} is not closed")
    raise MalformedError(f"field {number} has wire type {wire_type} here")


def _text(value: memoryview, name: str) -> str:
    try:
        return str(value, "utf-8")
    except UnicodeDecodeError:
        raise MalformedError(f"{name} is not UTF-8") from None


_CONVERT = {  # scalar type: (value as read, field name) -> attribute value; None: the value as read
    "string": _text,
    "bytes": None,
    "bool": lambda v, _: v != 0,
    "uint32": lambda v, _: v & 0xFFFFFFFF,
    "uint64": None,
    "double": lambda v, _: struct.unpack("<d", v)[0],
}
_ZERO = {"string": "", "bytes": memoryview(b""), "bool": False, "uint32": 0, "uint64": 0, "double": 0.0}
_BY_KEY = {  # message: {field key: (name, convert, message of the field or None, repeated)}
    m: {f.number << 3 | f.wire_type: (f.name, _CONVERT.get(f.type), f.type if f.type in SCHEMA else None, f.repeated)
        for f in fields.values()}
    for m, fields in SCHEMA.items()
}  # fmt: skip
_DEFAULTS = {m: {f.name: _ZERO.get(f.type) for f in fs.values() if not f.repeated} for m, fs in SCHEMA.items()}
_REPEATED = {m: [f.name for f in fields.values() if f.repeated] for m, fields in SCHEMA.items()}


class View:
    """A message of GRAMMAR read from its bytes: each field an attribute of its name; bytes fields are memoryviews
    of the bytes read, repeated fields lists, message fields Views (None when absent; one that comes twice is
    merged, as protobuf merges it: the later one's fields read into the earlier's). budget[0] counts down the
    fields the whole request may still have (_TooManyFields past it)."""

    def __init__(self, message: str, data: memoryview, budget: list[int]):
        self._size = 0
        self.__dict__.update(_DEFAULTS[message])
        for name in _REPEATED[message]:
            setattr(self, name, [])
        self._read(message, data, budget)

    def _read(self, message: str, data: memoryview, budget: list[int]) -> None:
        """Reads the fields of data into this view: the last value of a scalar field wins, repeated fields are
        appended to, message fields merged."""
        self._size += len(data)
        end = len(data)
        known, pos = _BY_KEY[message], 0
        while pos < end:
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooManyFields()
            key = data[pos]
            if 8 <= key < 0x80:  # a one-byte key (fields 1-15)
                pos += 1
            else:
                number, wire_type, pos = _key(data, pos)
                key = number << 3 | wire_type
            value, pos = _value(data, pos, key >> 3, key & 7, budget)
            entry = known.get(key)
            if entry is None:
                continue  # an unknown field, or a known one of another wire type: skipped, as protobuf does
            name, convert, inner, repeated = entry
            if inner is not None:
                earlier = None if repeated else getattr(self, name)
                try:
                    if earlier is None:
                        value = View(inner, value, budget)
                    else:  # a message field that came before: merged, as protobuf does
                        earlier._read(inner, value, budget)
                        value = earlier
                except MalformedError as e:
                    where = f"{name}[{len(getattr(self, name))}]" if repeated else name
                    raise MalformedError(f"in {where}: {e}") from None
            elif convert is not None:
                value = convert(value, name)
            if repeated:
                getattr(self, name).append(value)
            else:
                setattr(self, name, value)

    def ByteSize(self) -> int:
        """The size of the bytes read (as a generated message's ByteSize, for the servicer's metrics)."""
        return self._size


class Undecodable:
    """A request whose bytes do not decode; `error` says why (the servicer answers INVALID_ARGUMENT)."""

    def __init__(self, message: str, reason: str, size: int):
        self.error = f"the {message} is not valid protobuf: {reason}"
        self._size = size

    def ByteSize(self) -> int:
        return self._size


def read_view(message: str, data: bytes) -> View | Message | Undecodable:
    """A View of `data` as a `message`; past MAX_FIELDS fields the generated class's message instead (the same
    attributes, bytes fields as bytes); an Undecodable for bytes that do not decode. Never raises."""
    try:
        return View(message, memoryview(data), [MAX_FIELDS])
    except MalformedError as e:
        return Undecodable(message, str(e), len(data))
    except _TooManyFields:
        return read_generated(message, data)


def read_generated(message: str, data: bytes) -> Message | Undecodable:
    """`data` read by the generated class of `message`; an Undecodable for bytes that do not decode, saying why
    as a View reads them (protobuf's own reason where a View cannot tell). Never raises."""
    try:
        return getattr(ps_pb2, message).FromString(data)
    except Exception as e:  # protobuf's DecodeError, or anything else its parser raises
        try:
            View(message, memoryview(data), [MAX_FIELDS])
            reason = str(e)
        except MalformedError as precise:
            reason = str(precise)
        except _TooManyFields:
            reason = str(e)
        return Undecodable(message, reason, len(data))


ZERO_COPY = frozenset({"Push", "PushBatch", "Pull", "PullBatch"})  # methods whose requests are read as Views
_SERVICE = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]


def request_reader(method: str) -> Callable[[bytes], object]:
    """The request deserializer of a ParameterServer method: a View reader for ZERO_COPY methods, the generated
    class for the others. It never raises: bytes that do not decode give an Undecodable."""
    message = _SERVICE.methods_by_name[method].input_type.name
    return functools.partial(read_view if method in ZERO_COPY else read_generated, message)


def _encode_varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _tag(message: str, name: str) -> bytes:
    """The key of field `name` of `message`, as GRAMMAR declares it."""
    (field,) = (f for f in SCHEMA[message].values() if f.name == name)
    return _encode_varint(field.number << 3 | field.wire_type)


_ROWS, _DIM = _tag("PullResponse", "rows"), _tag("PullResponse", "dim")
_REPLIES, _PULLED_MIN_CLOCK = _tag("PullBatchResponse", "replies"), _tag("PullBatchResponse", "min_clock")
_NUM_APPLIED, _STEP, _PUSHED_ROWS, _PUSHED_MIN_CLOCK = (
    _tag("PushBatchResponse", n) for n in ("num_applied", "step", "rows", "min_clock")
)


def _pull_response_frame(n: int, dim: int) -> tuple[bytes, bytes]:
    """The bytes of a PullResponse {rows, dim} before and after its n rows of dim floats."""
    return _ROWS + _encode_varint(4 * n * dim), _DIM + _encode_varint(dim)


def _pull_response_parts(rows: np.ndarray) -> list:
    """The pieces of a PullResponse {rows, dim} of (n, dim) float32 rows; the payload is a view."""
    rows = np.ascontiguousarray(rows, dtype=ROWS_DTYPE)
    head, tail = _pull_response_frame(*rows.shape)
    return [head, rows.reshape(-1).view(np.uint8), tail]


def _nested(tag: bytes, parts: list) -> list:
    """The parts of a message, as a length-delimited field of an outer message."""
    return [tag, _encode_varint(sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)), *parts]


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
    """(a PullResponse {rows, dim} whose n rows are not written yet, a writable (n, dim) float32 view of those
    rows). Fill the view, then send the bytes: the rows go straight into the reply, with no copy. Writing into a
    bytes object is safe here only because it is new and no one else holds it until the caller returns it
    (CPython computes a bytes object's hash on first use, after that)."""
    head, tail = _pull_response_frame(n, dim)
    total = len(head) + 4 * n * dim + len(tail)
    reply = _new_bytes(None, total)
    raw = np.asarray(_WritableBytes(reply, total))  # the view holds reply: it outlives no write through it
    raw[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    raw[total - len(tail) :] = np.frombuffer(tail, dtype=np.uint8)
    return reply, raw[len(head) : total - len(tail)].view(ROWS_DTYPE).reshape(n, dim)


def encode_pull_batch_response(rows: list[np.ndarray], min_clock: int = 0) -> bytes:
    """The PullBatchResponse {replies, min_clock} of several row arrays, with one copy of each (min_clock 0 is
    left out, as protobuf leaves out a zero)."""
    parts = [p for r in rows for p in _nested(_REPLIES, _pull_response_parts(r))]
    if min_clock:
        parts += [_PULLED_MIN_CLOCK, _encode_varint(min_clock)]
    return b"".join(parts)


def encode_push_batch_response(num_applied: int, step: int, rows: list[np.ndarray], min_clock: int = 0) -> bytes:
    """The PushBatchResponse {num_applied, step, rows, min_clock} with one copy of each row array (min_clock 0 is
    left out)."""
    parts = [_NUM_APPLIED, _encode_varint(num_applied), _STEP, _encode_varint(step)]
    for r in rows:
        parts += _nested(_PUSHED_ROWS, _pull_response_parts(r))
    if min_clock:
        parts += [_PUSHED_MIN_CLOCK, _encode_varint(min_clock)]
    return b"".join(parts)


def stamp_to_proto(stamp: WorkerStamp) -> ps_pb2.WorkerStamp:
    """The WorkerStamp message of a stamp, every field set (read back by WorkerStamp.from_message)."""
    return ps_pb2.WorkerStamp(**dataclasses.asdict(stamp))


def table_config_to_proto(cfg: TableConfig) -> ps_pb2.TableSpec:
    """The TableSpec of a TableConfig, every field set."""
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
        l2=cfg.l2,
        features=cfg.features,
        values_at_rest=cfg.values_at_rest,
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
            learning_rate=o.learning_rate if o.HasField("learning_rate") else None,
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
        l2=spec.l2,
        features=spec.features,
        values_at_rest=spec.values_at_rest,  # "": unspecified (TableConfig.values_at_rest)
    )


def _set_fields(msg: Message) -> dict:
    """The fields of a message that are set (proto3 optional or non-default), as a dict."""
    return {f.name: v for f, v in msg.ListFields()}

"""ps.codec: its grammar is the schema of protos/ps.proto (checked against the generated descriptors, both ways),
its views read what the generated classes read, without copying, bytes that do not decode get a reason (and
INVALID_ARGUMENT from every method of a real server), and its hand-built replies parse as the generated ones."""

import random

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos import ps_pb2
from ps import codec
from ps.codec import Undecodable, View, read_generated, read_view
from ps.config import InitializerConfig, OptimizerConfig, TableConfig

TYPE_NAMES = {getattr(FieldDescriptor, n): n[5:].lower() for n in dir(FieldDescriptor) if n.startswith("TYPE_")}
WIRE_TYPE = {
    "double": codec.I64,
    "fixed64": codec.I64,
    "sfixed64": codec.I64,
    "float": codec.I32,
    "fixed32": codec.I32,
    "sfixed32": codec.I32,
    "string": codec.LEN,
    "bytes": codec.LEN,
    "message": codec.LEN,
    "group": 3,
}  # fmt: skip  (the other scalar types are varints)


def declared(file) -> dict[str, dict[int, tuple]]:
    """{message: {number: (name, wire type, type, repeated)}} of every message of a file descriptor, nested ones
    (map entries) included; names without the package, message types by their name."""
    out = {}

    def field(f) -> tuple:
        type_ = TYPE_NAMES[f.type]
        wire = WIRE_TYPE.get(type_, codec.VARINT)
        if f.is_repeated and f.is_packed:
            wire = codec.LEN
        if f.message_type is not None:
            type_ = f.message_type.full_name.removeprefix(file.package + ".")
        return f.name, wire, type_, f.is_repeated

    def walk(message) -> None:
        out[message.full_name.removeprefix(file.package + ".")] = {f.number: field(f) for f in message.fields}
        for nested in message.nested_types:
            walk(nested)

    for message in file.message_types_by_name.values():
        walk(message)
    return out


def differences(file, schema: dict[str, dict[int, codec.Field]]) -> list[str]:
    """What a file descriptor and a codec schema disagree on, both ways."""
    want = declared(file)
    have = {m: {n: (f.name, f.wire_type, f.type, f.repeated) for n, f in fs.items()} for m, fs in schema.items()}
    out = []
    for m in sorted(want.keys() | have.keys()):
        if m not in have:
            out.append(f"{m} is not in the codec's grammar")
        elif m not in want:
            out.append(f"the codec's grammar has {m}, which ps.proto does not")
        else:
            for n in sorted(want[m].keys() | have[m].keys()):
                if n not in have[m]:
                    out.append(f"{m} field {n} {want[m][n]} is not in the codec's grammar")
                elif n not in want[m]:
                    out.append(f"the codec's grammar has {m} field {n} {have[m][n]}, which ps.proto does not")
                elif want[m][n] != have[m][n]:
                    out.append(f"{m} field {n}: ps.proto says {want[m][n]}, the codec's grammar {have[m][n]}")
    return out


def edited_file(edit):
    """The file descriptor of ps.proto changed by edit(FileDescriptorProto), in a pool of its own."""
    proto = descriptor_pb2.FileDescriptorProto()
    ps_pb2.DESCRIPTOR.CopyToProto(proto)
    edit(proto)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(proto.SerializeToString())
    return pool.FindFileByName(proto.name)


def message_proto(file_proto, name: str):
    return next(m for m in file_proto.message_type if m.name == name)


def test_the_grammar_declares_every_field_of_ps_proto_and_no_other():
    assert differences(ps_pb2.DESCRIPTOR, codec.SCHEMA) == []
    assert "OptimizerSpec.ParamsEntry" in codec.SCHEMA  # the map's entries are checked too


def test_the_check_bites_on_a_field_added_to_ps_proto():
    def add_field(proto):
        f = message_proto(proto, "PushRequest").field.add(name="sync", number=9)
        f.type, f.label = FieldDescriptorProto.TYPE_BOOL, FieldDescriptorProto.LABEL_OPTIONAL

    FieldDescriptorProto = descriptor_pb2.FieldDescriptorProto
    assert differences(edited_file(add_field), codec.SCHEMA) == [
        "PushRequest field 9 ('sync', 0, 'bool', False) is not in the codec's grammar"
    ]

    def retype(proto):
        next(
            f for f in message_proto(proto, "PullResponse").field if f.name == "dim"
        ).type = FieldDescriptorProto.TYPE_DOUBLE

    assert differences(edited_file(retype), codec.SCHEMA) == [
        "PullResponse field 2: ps.proto says ('dim', 1, 'double', False), the codec's grammar ('dim', 0, 'uint32', False)"
    ]
    assert differences(edited_file(lambda proto: proto.message_type.add(name="Ping")), codec.SCHEMA) == [
        "Ping is not in the codec's grammar"
    ]


def test_the_check_bites_on_a_field_only_the_codec_knows():
    line = "  2  ids              LEN     bytes                    <u8 (n,)\n"
    extra = "  3  shard            VARINT  uint32                   a field ps.proto does not have\n"
    assert codec.GRAMMAR.count(line) == 1
    schema = codec.parse_grammar(codec.GRAMMAR.replace(line, line + extra, 1))
    assert differences(ps_pb2.DESCRIPTOR, schema) == [
        "the codec's grammar has PullRequest field 3 ('shard', 0, 'uint32', False), which ps.proto does not"
    ]


def test_a_grammar_line_that_is_not_a_field_is_refused():
    with pytest.raises(ValueError, match="grammar line 3 is not a new field of M"):
        codec.parse_grammar("message M\n  1  a  LEN  string\n  1  b  LEN  string\n")
    with pytest.raises(ValueError, match="grammar line 2"):
        codec.parse_grammar("message M\n  one  a  LEN  string\n")


def filled(cls, rng: random.Random, depth: int = 0) -> Message:
    """A message of class cls with a random subset of its fields set to random values (every field type)."""
    msg = cls()
    for f in cls.DESCRIPTOR.fields:
        if rng.random() < 0.3:
            continue
        count = rng.randint(0, 3) if f.is_repeated else 1
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            getattr(msg, f.name).update({scalar("string", rng): scalar("double", rng) for _ in range(count)})
        elif f.message_type is not None:
            inner = [filled(getattr(ps_pb2, f.message_type.name), rng, depth + 1) for _ in range(count)]
            if f.is_repeated:
                getattr(msg, f.name).extend(inner)
            else:
                getattr(msg, f.name).CopyFrom(inner[0])
        elif f.is_repeated:
            getattr(msg, f.name).extend(scalar(TYPE_NAMES[f.type], rng) for _ in range(count))
        else:
            setattr(msg, f.name, scalar(TYPE_NAMES[f.type], rng))
    return msg


def scalar(type_: str, rng: random.Random):
    if type_ == "string":
        return "".join(rng.choice("ab.é中\n") for _ in range(rng.randint(0, 6)))
    if type_ == "bytes":
        return rng.randbytes(rng.randint(0, 40))
    if type_ == "bool":
        return rng.random() < 0.5
    if type_ == "double":
        return rng.choice([0.0, -0.0, 1e-300, 3.5, -2.0, float("inf"), rng.uniform(-1e9, 1e9)])
    bits = {"uint32": 32, "uint64": 64}[type_]
    return rng.choice([0, 1, 2**bits - 1, rng.getrandbits(bits)])


def same(view: View, msg: Message) -> None:
    """The view holds what the generated message holds, field by field; bytes fields are views, not copies."""
    for f in msg.DESCRIPTOR.fields:
        got, want = getattr(view, f.name), getattr(msg, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            assert {e.key: e.value for e in got} == dict(want), f.name
        elif f.message_type is not None and f.is_repeated:
            assert len(got) == len(want), f.name
            for v, m in zip(got, want):
                same(v, m)
        elif f.message_type is not None:
            assert (got is None) == (not msg.HasField(f.name)), f.name
            if got is not None:
                same(got, want)
        elif f.type == FieldDescriptor.TYPE_BYTES:
            assert isinstance(got, memoryview) and bytes(got) == want, f.name
        elif f.is_repeated:  # a list of scalars, each of the generated class's type
            assert got == list(want) and [type(g) for g in got] == [type(w) for w in want], f.name
        else:
            assert got == want and type(got) is type(want), f.name


@pytest.mark.parametrize("message", sorted(m for m in ps_pb2.DESCRIPTOR.message_types_by_name))
def test_a_view_reads_what_the_generated_class_reads_for_every_message(message):
    cls, rng = getattr(ps_pb2, message), random.Random(message)
    for _ in range(40):
        msg = filled(cls, rng)
        data = msg.SerializeToString()
        view = read_view(message, data)
        assert isinstance(view, View) and view.ByteSize() == len(data)
        same(view, msg)


names = st.text(max_size=8)
blobs = st.binary(max_size=64)
uint64 = st.integers(0, 2**64 - 1)


@st.composite
def push_requests(draw):
    return ps_pb2.PushRequest(
        table=draw(names), ids=draw(blobs), grads=draw(blobs), dim=draw(st.integers(0, 2**32 - 1)),
        shows=draw(blobs), clicks=draw(blobs), return_rows=draw(st.booleans()), add_delta=draw(st.booleans()),
    )  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(push_requests(), max_size=4), uint64, uint64, uint64, st.binary(max_size=20))
def test_push_batch_views_read_what_the_generated_class_reads(pushes, advance, client, seq, unknown_payload):
    msg = ps_pb2.PushBatchRequest(pushes=pushes, advance_clock=advance, client_id=client, seq=seq)
    # an unknown field (number 15, length-delimited) and an unknown varint field (16) are skipped by both
    data = msg.SerializeToString() + b"\x7a" + bytes([len(unknown_payload)]) + unknown_payload + b"\x80\x01\x05"
    want, view = ps_pb2.PushBatchRequest.FromString(data), read_view("PushBatchRequest", data)
    assert isinstance(view, View) and view.ByteSize() == len(data)
    same(view, want)


def test_the_last_value_of_a_repeated_scalar_field_wins():
    a = ps_pb2.PushRequest(table="a", dim=3, ids=b"x" * 8).SerializeToString()
    b = ps_pb2.PushRequest(table="b", dim=5).SerializeToString()
    same(read_view("PushRequest", a + b), ps_pb2.PushRequest.FromString(a + b))


@pytest.mark.parametrize("message", ["PullBatchRequest", "PushBatchRequest"])
def test_a_message_field_that_comes_twice_is_merged_as_protobuf_merges_it(message):
    """A stamp split over two fields reads as one (its fields from both, the later's winning), as the generated
    class reads it: a request past MAX_FIELDS, read by that class, means the same."""
    cls = getattr(ps_pb2, message)
    a = cls(stamp=ps_pb2.WorkerStamp(job=7, worker=1, num_workers=2, step=3, setup="a=1")).SerializeToString()
    b = cls(stamp=ps_pb2.WorkerStamp(step=5, sync=True)).SerializeToString()
    want, view = cls.FromString(a + b), read_view(message, a + b)
    assert (want.stamp.job, want.stamp.step, want.stamp.sync, want.stamp.setup) == (7, 5, True, "a=1")
    assert isinstance(view, View) and view.ByteSize() == len(a + b)
    same(view, want)


def test_unknown_groups_and_known_fields_of_another_wire_type_are_skipped():
    data = b"\x12\x01A" + b"\x4b" + b"\x08\x01" + b"\x53\x54" + b"\x4c" + b"\x20\x07"  # group 9 holds group 10
    data += b"\x08\x05"  # field 1 (table, a string) as a varint
    same(read_view("PushRequest", data), ps_pb2.PushRequest.FromString(data))


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
        (b"\x0a\x02\x0a\x05", "in pushes[0]: field 1 says 5 bytes"),
        (b"\x0a\x00\x0a\x03\x0a\x01\xff", "in pushes[1]: table is not UTF-8"),
        (b"\x09\x00\x00", "cut short"),
    ],
)
def test_bytes_that_are_not_protobuf_get_a_reason(data, reason):
    view = read_view("PushBatchRequest", data)
    assert isinstance(view, Undecodable) and view.ByteSize() == len(data)
    assert view.error.startswith("the PushBatchRequest is not valid protobuf: ") and reason in view.error
    with pytest.raises(Exception):  # noqa: B017 (protobuf's DecodeError) the generated class refuses them too
        ps_pb2.PushBatchRequest.FromString(data)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(ps_pb2.DESCRIPTOR.message_types_by_name)), st.lists(st.binary(max_size=6), max_size=6))
def test_views_refuse_the_bytes_the_generated_classes_refuse(message, pieces):
    data = b"".join(pieces)  # keys, lengths and payloads of random fields, mostly
    try:
        getattr(ps_pb2, message).FromString(data)
        refused = False
    except Exception:  # protobuf's DecodeError
        refused = True
    view = read_view(message, data)
    if isinstance(view, Undecodable) and not refused:  # upb lets field number 0 pass where more fields follow
        assert "field number 0" in view.error, data  # (b"\x01" + 8 bytes + b"\x13\x14"); the views never do
    else:
        assert isinstance(view, Undecodable) == refused, data
    assert isinstance(read_generated(message, data), Undecodable) == refused


def test_the_generated_classes_refusals_get_a_precise_reason():
    assert read_generated("StatsRequest", b"\xff\xff\xff").error == (
        "the StatsRequest is not valid protobuf: truncated varint at byte 3"
    )
    assert read_generated("DescribeTableRequest", b"\x0a\x01\xff").error.endswith(": table is not UTF-8")
    spec = b"\x0a\x05\x22\x03\x0a\x01\xff"  # CreateTableRequest.spec.optimizer.name
    assert read_generated("CreateTableRequest", spec).error.endswith(": in spec: in optimizer: name is not UTF-8")
    assert isinstance(read_generated("StatsRequest", b""), ps_pb2.StatsRequest)


def test_a_request_of_very_many_fields_is_read_by_the_generated_class(monkeypatch):
    monkeypatch.setattr(codec, "MAX_FIELDS", 10)
    msg = ps_pb2.PushBatchRequest(pushes=[ps_pb2.PushRequest(table="t", ids=b"i" * 8, dim=2)] * 3, seq=4)
    assert isinstance(read_view("PushBatchRequest", ps_pb2.PushBatchRequest(seq=4).SerializeToString()), View)
    got = read_view("PushBatchRequest", msg.SerializeToString())  # 4 fields, 13 with those of the pushes
    assert isinstance(got, ps_pb2.PushBatchRequest) and got == msg
    group = b"\x4b" + b"\x08\x01" * 10 + b"\x4c"  # an unknown group (field 9) of 10 fields: they count too
    assert isinstance(read_view("PushBatchRequest", group), ps_pb2.PushBatchRequest)
    bad = read_view("PushBatchRequest", b"\x10\x01" * 11 + b"\x0a\x05ab")  # past the limit and not protobuf
    assert isinstance(bad, Undecodable) and "not valid protobuf" in bad.error


def non_utf8(message) -> tuple[bytes, str] | None:
    """(a message of this descriptor whose first string field, depth first, holds the byte 0xff, the reason a
    refusal should give), or None if it has no string field."""
    for f in message.fields:
        if f.type == FieldDescriptor.TYPE_STRING:
            return bytes([f.number << 3 | 2, 1, 0xFF]), f"{f.name} is not UTF-8"
        if f.message_type is not None and (inner := non_utf8(f.message_type)) is not None:
            where = f"{f.name}[0]" if f.is_repeated else f.name
            return bytes([f.number << 3 | 2, len(inner[0])]) + inner[0], f"in {where}: {inner[1]}"
    return None


def test_every_method_answers_bytes_that_do_not_decode_with_invalid_argument(servers):
    addresses, _ = servers(1)
    service = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]
    tried = []
    with grpc.insecure_channel(addresses[0]) as channel:
        for method in service.methods:
            call = channel.unary_unary(f"/{service.full_name}/{method.name}")  # no serializers: bytes as they are
            bad_utf8 = non_utf8(method.input_type)
            for data, reason in [(b"\xff\xff\xff", "truncated varint at byte 3")] + ([bad_utf8] if bad_utf8 else []):
                with pytest.raises(grpc.RpcError) as e:
                    call(data, timeout=10)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method.name, e.value.details())
                assert e.value.details() == f"the {method.input_type.name} is not valid protobuf: {reason}"
                tried.append((method.name, reason))
        good = ps_pb2.PullRequest(table="nope", ids=np.arange(2, dtype="<u8").tobytes()).SerializeToString()
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary(f"/{service.full_name}/Pull")(good, timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND  # a well-formed request reaches the shard
    assert len({m for m, _ in tried}) == len(service.methods) == 10
    assert ("DescribeTable", "table is not UTF-8") in tried and (
        "PushBatch",
        "in pushes[0]: table is not UTF-8",
    ) in tried
    assert sum("UTF-8" in reason for _, reason in tried) == 8  # all but Stats and AdvanceClock have a string


def encode_pull_response(rows: np.ndarray) -> bytes:
    """The PullResponse {rows, dim} of (n, dim) float32 rows from the pieces the batch replies nest
    (codec._pull_response_parts), to hold against the generated class and against pull_response_to_fill."""
    return b"".join(codec._pull_response_parts(rows))


@pytest.mark.parametrize("n,dim", [(0, 1), (1, 1), (5, 8), (2047, 16), (3, 200), (70000, 16)])
def test_hand_built_pull_response_parses_as_the_generated_message(n, dim):
    rows = np.random.default_rng(n + dim).standard_normal((n, dim)).astype(np.float32)
    msg = ps_pb2.PullResponse.FromString(encode_pull_response(rows))
    assert msg.dim == dim and msg.rows == rows.tobytes()
    if n:  # byte for byte what protobuf itself writes (it omits an empty field, which parses the same)
        assert encode_pull_response(rows) == ps_pb2.PullResponse(rows=rows.tobytes(), dim=dim).SerializeToString()


@pytest.mark.parametrize("n,dim", [(0, 1), (1, 1), (5, 8), (2047, 16), (70000, 16)])
def test_a_pull_response_filled_in_place_is_the_one_built_from_rows(n, dim):
    rows = np.random.default_rng(n + dim).standard_normal((n, dim)).astype(np.float32)
    reply, view = codec.pull_response_to_fill(n, dim)
    assert isinstance(reply, bytes) and view.shape == (n, dim) and view.dtype == np.float32
    view[...] = rows
    assert reply == encode_pull_response(rows)


@pytest.mark.parametrize("shapes", [[], [(0, 4)], [(3, 2)], [(5, 8), (0, 1), (300, 16)]])
def test_hand_built_batch_responses_parse_as_the_generated_messages(shapes):
    rng = np.random.default_rng(len(shapes))
    rows = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    for min_clock in (0, 1, 2**64 - 1):
        pulls = ps_pb2.PullBatchResponse.FromString(codec.encode_pull_batch_response(rows, min_clock))
        assert [(r.rows, r.dim) for r in pulls.replies] == [(x.tobytes(), x.shape[1]) for x in rows]
        assert pulls.min_clock == min_clock
    for num_applied, step, min_clock in [(0, 0, 0), (7, 1, 3), (2**40, 2**63, 2**64 - 1)]:
        reply = codec.encode_push_batch_response(num_applied, step, rows, min_clock)
        push = ps_pb2.PushBatchResponse.FromString(reply)
        assert (push.num_applied, push.step, push.min_clock) == (num_applied, step, min_clock)
        assert [(r.rows, r.dim) for r in push.rows] == [(x.tobytes(), x.shape[1]) for x in rows]


def test_table_config_round_trips_through_proto():
    cfg = TableConfig(
        "emb.v2", 17, InitializerConfig("normal", 0.5, 2**64 - 1), OptimizerConfig("adagrad", 0.01, {"epsilon": 1e-6})
    )
    assert codec.table_config_from_proto(codec.table_config_to_proto(cfg)) == cfg


def test_unset_proto_fields_take_defaults():
    unset = codec.table_config_from_proto(ps_pb2.TableSpec(name="t", dim=3))
    assert unset == TableConfig("t", 3, values_at_rest="")  # values_at_rest unspecified: either one matches
    assert unset.as_new() == TableConfig("t", 3)  # and a table made of it has the default


def test_the_stamp_classes_of_both_ends_have_the_protos_fields_in_its_order():
    """ps.codec.stamp_to_proto and WorkerStamp.from_message (ps.service.stamp_of) copy the fields by name: a field added to the
    proto must be added to the class (and the other way round)."""
    import dataclasses

    from ps.service import stamp_of
    from ps.stamp import WorkerStamp

    proto = [f.name for f in ps_pb2.WorkerStamp.DESCRIPTOR.fields]
    assert [f.name for f in dataclasses.fields(WorkerStamp)] == proto
    stamp = WorkerStamp(job=7, worker=1, num_workers=2, step=9, staleness=3, sync=True, barrier_timeout_s=5.0,
                        done=False, acked=8, setup="s", stopped="")  # fmt: skip
    assert stamp_of(ps_pb2.PullBatchRequest(stamp=codec.stamp_to_proto(stamp))) == stamp

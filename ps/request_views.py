"""Zero-copy readers of the bulk requests (Push, PushBatch, Pull, PullBatch): their bytes fields as views into
the request's bytes, where the generated classes copy each of them twice.

A 7.2 MB PushRequest (100,000 ids of dim 16) cost 1.0-1.5 ms to parse with the generated class and as much again
to read its ids and grads (upb hands out a new bytes object per field access); with these, neither copy is made.
They read the protobuf wire format of protos/ps.proto (field numbers and types below) as any protobuf parser
does: fields in any order, the last value of a repeated scalar field wins, unknown fields (groups included) and
known fields of an unexpected wire type are skipped, every length is checked against what is left, keys are at
most 32 bits. A request of more than MAX_FIELDS fields (no real one has them) is read by the generated class
instead, so a stream of tiny fields cannot hold a shard in this Python loop. What the servicer reads of a
request is the same as with the generated class (tests/test_requests.py compares them on random messages).
A request that is not valid protobuf gives a view whose `error` says why; the servicer turns it into
INVALID_ARGUMENT (the generated classes' DecodeError became gRPC's generic INTERNAL).
"""

from __future__ import annotations

from protos import ps_pb2

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


class MalformedRequest(ValueError):
    pass


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data):
            raise MalformedRequest(f"truncated varint at byte {pos}")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise MalformedRequest(f"varint longer than 10 bytes at byte {pos}")


class TooManyFields(Exception):
    """More fields than a real request has: the caller parses with the generated class instead (in C, bounded)."""


MAX_FIELDS = 4096  # a PushBatch of 9 pushes has ~70; 16 MB of tiny fields took 7-36 s to read here, 0.1-0.6 s in C


def _key(data: memoryview, pos: int) -> tuple[int, int, int]:
    """(field number, wire type, position after the key); keys are at most 5 bytes and 32 bits, as upb requires."""
    start = pos
    key, pos = _varint(data, pos)
    if pos - start > 5 or key > 0xFFFFFFFF:
        raise MalformedRequest(f"field key at byte {start} is longer than 32 bits")
    if key >> 3 == 0:
        raise MalformedRequest(f"field number 0 at byte {start}")
    return key >> 3, key & 7, pos


def _skip(data: memoryview, pos: int, number: int, wire_type: int, depth: int = 0) -> tuple[object, int]:
    """(value, position after it) of a field whose key was read: an int for a varint, a memoryview for a
    length-delimited field, None for fixed-size fields and groups (skipped, as unknown fields are)."""
    end = len(data)
    if wire_type == VARINT:
        return _varint(data, pos)
    if wire_type == LEN:
        size, pos = _varint(data, pos)
        if size > end - pos:
            raise MalformedRequest(f"field {number} says {size} bytes, {end - pos} are left")
        return data[pos : pos + size], pos + size
    if wire_type in (FIXED64, FIXED32):
        size = 8 if wire_type == FIXED64 else 4
        if size > end - pos:
            raise MalformedRequest(f"field {number} is cut short")
        return None, pos + size
    if wire_type == 3 and depth < 64:  # a group (proto2): its fields up to the matching end-group key
        while pos < end:
            inner, inner_type, pos = _key(data, pos)
            if inner_type == 4:
                if inner != number:
                    raise MalformedRequest(f"group {number} ends with field {inner}")
                return None, pos
            _, pos = _skip(data, pos, inner, inner_type, depth + 1)
        raise MalformedRequest(f"group {number} is not closed")
    raise MalformedRequest(f"field {number} has wire type {wire_type} here")


def _fields(data: memoryview):
    """(field number, wire type, value) of each field: an int for varints, a memoryview for LEN fields."""
    pos, end, count = 0, len(data), 0
    while pos < end:
        count += 1
        if count > MAX_FIELDS:
            raise TooManyFields()
        number, wire_type, pos = _key(data, pos)
        value, pos = _skip(data, pos, number, wire_type)
        yield number, wire_type, value


def _text(view: memoryview, what: str) -> str:
    try:
        return str(view, "utf-8")
    except UnicodeDecodeError:
        raise MalformedRequest(f"{what} is not UTF-8") from None


class PushView:
    """A PushRequest: table (1, string), ids (2), grads (3), dim (4, uint32), shows (5), clicks (6), return_rows
    (7, bool); bytes fields as memoryviews."""

    def __init__(self, data: memoryview):
        self.table, self.dim, self.return_rows = "", 0, False
        self.ids = self.grads = self.shows = self.clicks = memoryview(b"")
        for number, wire_type, value in _fields(data):
            if wire_type == LEN:
                if number == 1:
                    self.table = _text(value, "table")
                elif number == 2:
                    self.ids = value
                elif number == 3:
                    self.grads = value
                elif number == 5:
                    self.shows = value
                elif number == 6:
                    self.clicks = value
            elif wire_type == VARINT:
                if number == 4:
                    self.dim = value & 0xFFFFFFFF
                elif number == 7:
                    self.return_rows = value != 0


class PullView:
    """A PullRequest: table (1, string), ids (2)."""

    def __init__(self, data: memoryview):
        self.table, self.ids = "", memoryview(b"")
        for number, wire_type, value in _fields(data):
            if wire_type == LEN and number == 1:
                self.table = _text(value, "table")
            elif wire_type == LEN and number == 2:
                self.ids = value


class _Request:
    """Shared by the request views: the parse error (or None) and the size, for the servicer's metrics."""

    def ByteSize(self) -> int:
        return self._size

    def _read(self, data: bytes, what: str, parse, message_cls, fields: tuple[str, ...]) -> None:
        """parse(memoryview) fills self; past MAX_FIELDS the generated class reads the request instead (the
        same fields, as bytes rather than views); bytes that are not protobuf set self.error."""
        self.error, self._size = None, len(data)
        try:
            parse(memoryview(data))
        except MalformedRequest as e:
            self.error = f"the {what} is not valid protobuf: {e}"
        except TooManyFields:
            try:
                msg = message_cls.FromString(data)
            except Exception as e:  # protobuf's DecodeError
                self.error = f"the {what} is not valid protobuf: {e}"
                return
            for f in fields:  # repeated fields stay protobuf's lazy containers (8M tiny pushes: no 8M objects)
                setattr(self, f, getattr(msg, f))


class PushBatchView(_Request):
    """A PushBatchRequest: pushes (1, repeated PushRequest), advance_clock (2), client_id (3), seq (4)."""

    def __init__(self, data: bytes):
        self.pushes, self.advance_clock, self.client_id, self.seq = [], 0, 0, 0
        fields = ("pushes", "advance_clock", "client_id", "seq")
        self._read(data, "PushBatchRequest", self._parse, ps_pb2.PushBatchRequest, fields)

    def _parse(self, data: memoryview) -> None:
        for number, wire_type, value in _fields(data):
            if wire_type == LEN and number == 1:
                self.pushes.append(PushView(value))
            elif wire_type == VARINT and number in (2, 3, 4):
                setattr(self, ("advance_clock", "client_id", "seq")[number - 2], value)


class SinglePushView(_Request, PushView):
    def __init__(self, data: bytes):
        fields = ("table", "ids", "grads", "dim", "shows", "clicks", "return_rows")
        self._read(data, "PushRequest", lambda view: PushView.__init__(self, view), ps_pb2.PushRequest, fields)


class SinglePullView(_Request, PullView):
    def __init__(self, data: bytes):
        fields = ("table", "ids")
        self._read(data, "PullRequest", lambda view: PullView.__init__(self, view), ps_pb2.PullRequest, fields)


class PullBatchView(_Request):
    """A PullBatchRequest: pulls (1, repeated PullRequest)."""

    def __init__(self, data: bytes):
        self.pulls = []
        self._read(data, "PullBatchRequest", self._parse, ps_pb2.PullBatchRequest, ("pulls",))

    def _parse(self, data: memoryview) -> None:
        for number, wire_type, value in _fields(data):
            if wire_type == LEN and number == 1:
                self.pulls.append(PullView(value))


READERS = {"Push": SinglePushView, "PushBatch": PushBatchView, "Pull": SinglePullView, "PullBatch": PullBatchView}

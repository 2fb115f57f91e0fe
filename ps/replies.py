"""ReplyRoom: the bytes of the replies of rows that a server has built and gRPC has not sent yet, bounded.

A reply of rows (a Pull's, a PullBatch's, a PushBatch's returned rows) is built inside its request's take of request
room (ps.engine.room) and handed to gRPC, which holds it until the caller has read it all: the thread and the call
slot are free again meanwhile. While it is unsent the server holds it twice (REPLY_COPIES): gRPC copies the
serialized bytes into a buffer of its own and keeps the Python bytes object until the send completes. A caller that
asks for many large replies and reads them slowly, or not at all, would make the server hold all of them at once. So
each such reply takes REPLY_COPIES times its size of the reply room (reply_room_bytes:
ServerConfig.reply_bytes, ps-server --reply-bytes; 0: no bound) once its request passed its checks, right before its
rows are read (a PushBatch's: after its push), and gives it back when its call ends (context.add_callback: gRPC has
sent the reply and its status, or the call was cancelled, or passed its deadline). A reply that does not fit waits
its turn, in the order asked, as requests do for request room; a wait ends with CallerGoneError once its caller
left. One reply whose copies are larger than the whole room is refused before anything is read or applied, with the
request's other checks (ReplyTooLargeError, RESOURCE_EXHAUSTED), but for a sync step's rows to return (one push per
shard and step, whatever its size), which waits until the room is empty and runs alone.

Lock order: a reply takes reply room before its request room (and after a training job's waits: a stamped
request never holds reply room while it waits for the job's other workers), and nothing holding reply room waits
for it again, so a wait for reply room ends when the calls before it end. A call ends when its caller has read
its reply, leaves or passes its deadline, and at the latest when its reply has stayed unread for read_timeout_s
after its handler handed it to gRPC (ServerConfig.reply_read_timeout_s, ps-server --reply-read-timeout-s, 600 s by
default; 0: no limit): ps.unreadreplies then cancels the call (HeldReply.handed, one watcher thread for the room),
which gives its room back through the same callback, so a caller that never reads and sets no deadline holds its
replies' room that long, not until its connection closes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ps.bytesize import exact_bytes, human_bytes
from ps.config import CLIENT_MESSAGE_BYTES, DEFAULT_REPLY_BYTES, ROOM_SHARE, message_bytes_for
from ps.engine.room import RequestRoom
from ps.errors import NOTHING_READ_OR_APPLIED, ReplyTooLargeError
from ps.storage.memory import request_room_bytes
from ps.unreadreplies import UnreadReplies, Watchable

log = logging.getLogger(__name__)

REPLY_FRAME_BYTES = 40  # at most, per array of rows in a reply: its keys, lengths and dim (ps.codec), and the
# reply's own header fields (PushBatchResponse's num_applied and step)

REPLY_COPIES = 2  # an unsent reply's bytes the server holds, per byte of it: measured, a 200 MiB reply its caller
# did not read raised the server's RSS by 401 MiB (gRPC's copy in its own buffer, and the Python bytes it keeps)


def reply_room_bytes(reply_bytes: int | None, memory_bytes: int | None) -> int:
    """The reply room of a server given --reply-bytes reply_bytes (0: no bound) and --memory-bytes memory_bytes.
    reply_bytes None, the default: as much as the request room under --memory-bytes (its `requests` part, 16 to
    128 MiB: a bounded server holds no GiBs of replies; that is 8 times what one reply to ps-worker's largest
    request takes, least_reply_bytes), else DEFAULT_REPLY_BYTES."""
    if reply_bytes is not None:
        return reply_bytes
    return request_room_bytes(memory_bytes) or DEFAULT_REPLY_BYTES


def least_reply_bytes(request_room_bytes: int) -> int:
    """The least reply room that holds the reply to one of ps-worker's largest requests to a shard that keeps
    request_room_bytes for requests (0: none): its message size's worth of rows (ps.config.message_bytes_for), in
    one array, REPLY_COPIES times."""
    rows_bytes = message_bytes_for(CLIENT_MESSAGE_BYTES, [request_room_bytes])
    return REPLY_COPIES * (rows_bytes + 2 * REPLY_FRAME_BYTES)


def check_reply_bytes(reply_bytes: int, request_room_bytes: int) -> None:
    """ValueError, naming the least that would do, when a reply room of reply_bytes (0: no bound) is too small for
    one reply to ps-worker's largest requests (least_reply_bytes): every such reply would be refused."""
    least = least_reply_bytes(request_room_bytes)
    if reply_bytes and reply_bytes < least:
        source = (f"1/{ROOM_SHARE} of the server's request room, the `requests` part of --memory-bytes"
                  if request_room_bytes else "its largest message")  # fmt: skip
        raise ValueError(
            f"--reply-bytes {exact_bytes(reply_bytes)} is too small for one reply: ps-worker asks this server for up "
            f"to {human_bytes(least // REPLY_COPIES - 2 * REPLY_FRAME_BYTES)} of rows a request ({source}), and a "
            f"reply is held {REPLY_COPIES} times while it is sent; give --reply-bytes {exact_bytes(least)} or more "
            "(0: no bound)"
        )


class HeldReply(Watchable):
    """A call's reply holding its room: given back when the call ends (end, the call's callback), its call ended
    when its caller has not read it within the room's read timeout of its handler handing it to gRPC (handed)."""

    def __init__(self, room: ReplyRoom, nbytes: int):
        self._room, self.nbytes = room, nbytes

    def handed(self, method: str, end_call: Callable[[], None], peer: Callable[[], str]) -> None:
        """The handler returns the reply to gRPC now; end_call: its context.cancel, peer: its context.peer. Returns at
        once without a read timeout (every reply of rows passes here)."""
        if self._room.unread.read_timeout_s:
            self._room.unread.watch(self, method, self.nbytes, end_call, peer)

    def end(self) -> None:
        """The call ended: its room given back, and its reply watched no more."""
        self._room.unread.forget(self)
        self._room.release(self.nbytes)


class ReplyRoom:
    """reply_bytes of room for the replies being built or sent, REPLY_COPIES bytes a byte of reply (0: no bound,
    every hold returns at once), each reply's call ended when its caller has not read it within read_timeout_s of
    being handed to gRPC (0: no limit; ps.unreadreplies). Sizes given to its methods are replies' sizes; in_use
    and capacity count room."""

    def __init__(self, reply_bytes: int, read_timeout_s: float = 0.0):
        self._room = RequestRoom(reply_bytes, what="reply room (--reply-bytes)")
        self.unread = UnreadReplies(read_timeout_s, log)

    @property
    def capacity(self) -> int:
        return self._room.capacity

    @property
    def in_use(self) -> int:
        return self._room.in_use

    @property
    def waiting(self) -> int:
        """Replies asked for and not holding room yet."""
        return self._room.waiting

    @property
    def waits(self) -> int:
        """Replies that had to wait for room, since the room was made."""
        return self._room.waits

    def stats(self) -> dict[str, int]:
        """The room's figures, as StatsResponse and the metrics name them."""
        return {"reply_room_bytes": self.capacity, "reply_room_used_bytes": self.in_use,
                "reply_room_waiting": self.waiting, "reply_room_waits": self.waits,
                "reply_room_expired": self.unread.cancelled}  # fmt: skip

    def refuse_larger(self, method: str, nbytes: int, runs_alone: bool = False) -> None:
        """ReplyTooLargeError when method's reply of nbytes would not fit in the whole room (REPLY_COPIES of it),
        unless it runs alone (a sync step's rows to return); nothing without a bound."""
        if runs_alone or not self.capacity or REPLY_COPIES * nbytes <= self.capacity:
            return
        raise ReplyTooLargeError(
            f"{method} reply would be {nbytes:,} bytes, held {REPLY_COPIES} times while it is sent "
            f"({REPLY_COPIES * nbytes:,} bytes), over this server's room for replies being sent "
            f"({self.capacity:,} bytes, --reply-bytes); send fewer ids per request; {NOTHING_READ_OR_APPLIED}"
        )

    def hold(self, nbytes: int, at_end: Callable[[Callable[[], None]], bool],
             caller_gone: Callable[[], bool]) -> HeldReply:  # fmt: skip
        """Takes room for a call's reply of nbytes (REPLY_COPIES x nbytes), given back when the call ends: waits for
        its turn and for room (CallerGoneError once caller_gone() is true). at_end: the call's context.add_callback
        (False: the call has ended already). The handler calls the HeldReply's handed() as it returns the reply."""
        self._room.acquire(REPLY_COPIES * nbytes, caller_gone)
        held = HeldReply(self, nbytes)
        if not at_end(held.end):  # ended already
            held.end()
        return held

    def release(self, nbytes: int) -> None:
        """Gives back the room of a reply of nbytes (HeldReply.end)."""
        self._room.release(REPLY_COPIES * nbytes)

    def close(self) -> None:
        """The server stops: the watch of unread replies ends (gRPC ends the calls left)."""
        self.unread.close()

"""UnreadReplies: the calls whose reply of rows their caller has not read within a time limit, ended.

A reply of rows holds its reply room (ps.replies) from before it is built until its call ends, and gRPC ends a
call once its caller has read the whole reply, or the caller cancels, leaves or passes its deadline. A caller that
asks for large replies, never reads them and sets no deadline would hold that room for as long as its connection
lives, and every other caller's replies would wait for it. So each reply, once its handler has returned it to gRPC
(watch), is given read_timeout_s (ServerConfig.reply_read_timeout_s, ps-server --reply-read-timeout-s; 0: no limit)
to be read: a reply whose call has not ended by then has its call ended (ServicerContext.cancel(): the caller gets
CANCELLED, and the call's end gives its reply room back through the callback ReplyRoom.hold registered), is counted
(`cancelled`, the calls cancelled at the limit: Stats' reply_room_expired, sparseps_reply_room_expired_total) and
logged (ExpiryLog: one line per peer host an interval, a bounded number of hosts an interval). It does so whether
the room is bounded or not (ps-server --reply-bytes 0): an unread reply holds the server's memory either way.

The count is not exact: a call whose caller reads the last of its reply at that very moment may be counted (and
logged) though its caller got its reply whole. gRPC says a call ended through the callback forget() answers, which
it runs some time after the reply's last byte went out, and neither cancel() (it returns nothing) nor is_active()
(false once the handler returned its reply) tells a call cancelled from one done already.

One thread watches every reply of a server, started by the first reply watched, stopped by close(). As the limit
is one for all, replies expire in the order they were handed over: they wait in an insertion-ordered map, a
reply's end takes it out (forget), and the thread sleeps until the oldest one's time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

EXPIRY_LOG_S = 60.0  # the interval of ExpiryLog: one line per peer host in it
EXPIRY_LOG_HOSTS = 10  # at most, per interval; the calls of other hosts are counted into the next line


class ExpiryLog:
    """The log lines of calls cancelled at the limit, their reply unread: the first of each peer host (a peer
    without its port) in an interval of every_s seconds (clock: monotonic seconds), for at most max_hosts hosts; the
    others are counted, and the count is told in the next line logged, or by close(). A caller that opens many
    connections, or never reads at all, makes a line an interval. Not thread-safe: its UnreadReplies' thread is its
    one caller."""

    def __init__(self, log: logging.Logger, every_s: float = EXPIRY_LOG_S, max_hosts: int = EXPIRY_LOG_HOSTS,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.log, self.every_s, self.max_hosts, self.clock = log, every_s, max_hosts, clock
        self._started = -float("inf")  # the interval's start
        self._hosts: set[str] = set()  # logged in this interval
        self._untold = 0  # calls cancelled and not logged, since the last line

    def ended(self, peer: str, text: str) -> None:
        """A call of peer was cancelled at the limit; text says which and how."""
        now, host = self.clock(), peer_host(peer)
        if now - self._started >= self.every_s:
            self._started, self._hosts = now, set()
        if host in self._hosts or len(self._hosts) >= self.max_hosts:
            self._untold += 1
            return
        self._hosts.add(host)
        untold, self._untold = self._untold, 0
        more = f"; {untold:,} more cancelled at the limit since the last such line, not logged" if untold else ""
        self.log.warning("%s (one line per caller's host every %g s%s)", text, self.every_s, more)

    def close(self) -> None:
        """Logs the count of the calls cancelled at the limit and not logged yet: the server stops."""
        if self._untold:
            self.log.warning("%s more calls cancelled at the limit since the last such line, not logged",
                             f"{self._untold:,}")  # fmt: skip
            self._untold = 0


def peer_host(peer: str) -> str:
    """gRPC's peer ("ipv4:10.0.0.7:51234", "ipv6:[::1]:51234", "unix:/path") without its port."""
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in address:
        return f"{kind}:{address.rsplit(':', 1)[0]}"
    return peer


class Watchable:
    """A reply UnreadReplies can watch: its `ended` is set by forget(), under the watcher's lock."""

    ended: bool = False


@dataclass
class _Watched:
    """A reply handed to gRPC: when its time is up, its method and size (for the log), how to end its call, its
    peer."""

    due: float
    method: str
    nbytes: int
    end_call: Callable[[], None]
    peer: Callable[[], str]

    @property
    def what(self) -> str:
        """The reply in the log's words ("Pull reply of 76,880 bytes"): made only for a call ended."""
        return f"{self.method} reply of {self.nbytes:,} bytes"


class UnreadReplies:
    """Ends the calls of the replies watched that have not ended read_timeout_s after watch() (0: none ever,
    watch does nothing). clock: monotonic seconds. Thread-safe."""

    def __init__(self, read_timeout_s: float, log: logging.Logger, clock: Callable[[], float] = time.monotonic):
        self.read_timeout_s, self.log, self.clock = read_timeout_s, log, clock
        self.lines = ExpiryLog(log)
        self.cancelled = 0  # calls cancelled at the limit since the start; a call that completed at that very
        # moment may be counted (the module's docstring says why)
        self._cond = threading.Condition()
        self._watched: OrderedDict[Watchable, _Watched] = OrderedDict()  # by reply, in the order handed over
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def watching(self) -> int:
        """Replies handed to gRPC whose call has not ended, watched."""
        return len(self._watched)

    def watch(self, reply: Watchable, method: str, nbytes: int, end_call: Callable[[], None],
              peer: Callable[[], str]) -> None:  # fmt: skip
        """reply was handed to gRPC: end_call() ends its call if forget(reply) has not come within read_timeout_s.
        method, nbytes: the reply's method and size, for the log; peer(): its caller's address, asked when its time
        is up. Nothing when forget(reply) came already (its call ended while its handler ran), without a limit, or
        once closed."""
        if not self.read_timeout_s:
            return
        with self._cond:
            if reply.ended or self._closed:
                return
            if not self._watched:
                self._cond.notify()  # the thread sleeps without a deadline
            self._watched[reply] = _Watched(self.clock() + self.read_timeout_s, method, nbytes, end_call, peer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ps-unread-replies", daemon=True)
                self._thread.start()

    def forget(self, reply: Watchable) -> None:
        """reply's call ended (read, cancelled, past its deadline, failed): it is watched no more, nor from now on."""
        if not self.read_timeout_s:
            return
        with self._cond:
            reply.ended = True  # a watch() still to come (the call ended while its handler ran) does nothing
            self._watched.pop(reply, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                due = self._wait_due()
            if due is None:
                return
            for watched in due:
                try:
                    self._end(watched)
                except Exception:  # the thread goes on watching the others
                    self.log.exception("ending the call of an unread %s failed", watched.what)

    def _wait_due(self) -> list[_Watched] | None:
        """With the lock held: waits until a reply's time is up, and takes out those whose time is; None: closed."""
        while not self._closed:
            if not self._watched:
                self._cond.wait()
                continue
            now = self.clock()
            due = []
            while self._watched:
                reply, watched = next(iter(self._watched.items()))
                if watched.due > now:
                    break
                del self._watched[reply]
                due.append(watched)
            if due:
                return due
            self._cond.wait(watched.due - now)
        return None

    def _end(self, watched: _Watched) -> None:
        """Ends watched's call, outside the lock: gRPC runs the call's end callbacks, which forget() it."""
        peer = watched.peer()
        self.cancelled += 1  # before the end: whoever sees the call end (its caller, the room) finds it counted
        watched.end_call()
        self.lines.ended(
            peer, f"{watched.what} to {peer} still unread {self.read_timeout_s:g} s after it was handed to gRPC "
            f"(--reply-read-timeout-s), as far as the server saw: its call ended at the limit (CANCELLED, unless its "
            f"read completed at that very moment), its reply freed",
        )  # fmt: skip

    def close(self) -> None:
        """Stops the thread (the server stops: gRPC ends the calls left) and logs the lines' count not told."""
        with self._cond:
            self._closed = True
            self._watched.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        self.lines.close()

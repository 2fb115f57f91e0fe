"""RequestRoom: the `requests` part of the memory plan (ps.storage.memory), enforced.

A request copies rows while it runs: a pull reads its missed rows from RocksDB and gathers its reply; a push reads
its missed rows and keeps an undo copy of the rows it changes. Each Pull, PullBatch, Push and PushBatch takes room
for its copies (pull_cost, pull_batch_cost, push_cost) before it makes them and gives it back when done. Requests
take room in the order they ask for it; one that does not fit waits until enough is given back. A client's request
larger than the whole room is refused before anything is read or applied (refuse_larger: RequestTooLargeError).
A sync step's push is one per shard whatever its size: its contribution and its rows to return run alone when
larger than the room, up to `alone_limit` bytes of copies each (the whole --memory-bytes; refused past it), and
so does the step's sum (not refused: its workers' contributions together, which the `sync_steps` part bounds).

A miss reads its rows into one array that becomes the rows it admits (ps.engine.rowloader), so each row read is
copied once. What is not counted: the arrays of the request's ids, their keys and positions (a few words an id);
the request's own bytes, already received when it asks (worker.client sizes its messages to a
share of the room the shards report, but for a sync step's push; another client's are bounded by the message limit
only); a reply, made inside its take and sent after it (the servicer's reply room bounds those, ps.replies); a
sync step's contributions, held across its wait for the job's other workers (the wait is never made holding room):
they take the plan's `sync_steps` part instead (ps.engine.syncsteps).

Lock order: a push holds the checkpoint hold's gate and its client's lock before it asks for room; nothing that
holds room waits for anything but its own work, so a wait for room always ends. A waiter that stops waiting (an
exception) passes its turn on. Requests wait for room inside the store's foreground serving (the background
writers' wait for a moment without requests is bounded, ps.storage.foreground).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from ps.errors import NOTHING_READ_OR_APPLIED, CallerGoneError, RequestTooLargeError
from ps.storage.memory import MAX_REQUEST_BYTES, MIN_REQUEST_BYTES, REQUEST_SHARE

ID_BYTES = 8
CALLER_CHECK_S = 0.25  # how often a wait looks whether its caller left, where the caller cannot be watched


def watch_caller(caller_gone: Callable[[], bool] | None, wake: Callable[[], None]) -> bool | None:
    """Before a wait's first sleep, with its lock held (a wake then waits for the sleep): has wake() called when the
    caller leaves, where caller_gone has watch(wake) (ps.service_calls.CallerGone). True: wake() will come; False: the
    caller left already (no wake will come); None: caller_gone cannot be watched (None, or without watch): the wait
    looks at it itself."""
    watch = getattr(caller_gone, "watch", None)
    return None if watch is None else bool(watch(wake))


def pull_cost(n: int, width: int, dim: int) -> int:
    """Bytes a pull of n ids copies at most: every row read (width float32) and its reply (dim float32)."""
    return n * 4 * (width + dim)


def pull_batch_cost(n: int, width: int, dim: int) -> int:
    """Bytes a pull of n ids in a PullBatch (or a PushBatch's returned rows) copies at most: a pull's, and the
    reply its rows are then encoded into."""
    return pull_cost(n, width, dim) + n * 4 * dim


def push_cost(n: int, width: int) -> int:
    """Bytes a push of n ids copies at most: every row read, its undo copy, and the ids' positions."""
    return n * (2 * 4 * width + ID_BYTES)


class RequestRoom:
    """A byte count that requests take from and give back, in the order they ask. capacity 0: unbounded (no
    --memory-bytes), every take returns at once."""

    def __init__(self, capacity: int, alone_limit: int = 0, what: str = "request room (--memory-bytes)"):
        """alone_limit: the most a sync step's push may copy, running alone (0: no more than the room). what: the
        room, as a wait that its caller left names it."""
        if capacity < 0:
            raise ValueError(f"request room must be >= 0 bytes, got {capacity}")
        self.capacity = capacity
        self.what = what
        self.alone_limit = max(alone_limit, capacity)
        self._cond = threading.Condition()
        self._in_use = 0
        self._next_ticket = 0  # the ticket the next asker gets
        self._serving = 0  # the ticket whose turn it is
        self._abandoned: set[int] = set()  # tickets whose askers stopped waiting (an exception): skipped
        self.waits = 0  # takes that had to wait (Stats)

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def waiting(self) -> int:
        """Takes asked for and not yet holding room."""
        return self._next_ticket - self._serving

    def refuse_larger(self, nbytes: int, ids: int, what: str, runs_alone: bool = False) -> None:
        """RequestTooLargeError when a request of `ids` ids that copies nbytes would not fit in the whole room
        (what: the request, for the message); runs_alone (a sync step's push): when it would copy more than
        alone_limit. Nothing otherwise, nor without a bound."""
        if runs_alone:
            if self.capacity and nbytes > self.alone_limit:
                raise RequestTooLargeError(
                    f"{what} would copy {nbytes:,} bytes of rows, more than a sync step's push may copy on this "
                    f"server ({self.alone_limit:,} bytes, its --memory-bytes): a sync step sends each shard one "
                    "push of all its ids, so train with smaller batches, or on more shards, or give the server a "
                    f"larger --memory-bytes; {NOTHING_READ_OR_APPLIED}"
                )
            return
        if self.capacity and nbytes > self.capacity:
            most = self.capacity * ids // nbytes
            larger = (f"give the server a larger --memory-bytes (the room is 1/{REQUEST_SHARE} of it, "
                      f"{MIN_REQUEST_BYTES >> 20} to {MAX_REQUEST_BYTES >> 20} MiB)" if self.capacity < MAX_REQUEST_BYTES
                      else f"the room is at its largest ({MAX_REQUEST_BYTES >> 20} MiB)")  # fmt: skip
            raise RequestTooLargeError(
                f"{what} would copy {nbytes:,} bytes of rows, more than this server's whole room for requests "
                f"({self.capacity:,} bytes, the `requests` part of --memory-bytes): send at most about {most:,} of "
                f"these ids per request (worker.client sizes its messages by the room); {larger}; "
                f"{NOTHING_READ_OR_APPLIED}"
            )

    @contextlib.contextmanager
    def take(self, nbytes: int, caller_gone: Callable[[], bool] | None = None) -> Iterator[None]:
        """Holds nbytes of room for the with-block (acquire, then release at its end)."""
        self.acquire(nbytes, caller_gone)
        try:
            yield
        finally:
            self.release(nbytes)

    def acquire(self, nbytes: int, caller_gone: Callable[[], bool] | None = None) -> None:
        """Takes nbytes of room, for release(nbytes) to give back (from any thread): waits for its turn, then
        until nbytes fit (or the room is empty: a take larger than the room, a sync step's sum, runs alone).
        caller_gone: looked at each time the wait wakes; where it has watch(wake) (ps.service_calls.CallerGone), the
        caller's leaving wakes the wait (watch_caller), else the wait wakes every CALLER_CHECK_S to look. Once
        true, the wait ends with CallerGoneError (its caller cancelled, or past its deadline: nobody would read the
        reply), and the turn passes on. Nothing to take without a bound, or for 0 bytes."""
        if not self.capacity or not nbytes:  # nothing to hold: no turn to wait for
            return
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            waited, poll_s = False, None  # poll_s: how long a wait sleeps before it looks at caller_gone again
            try:
                while ticket != self._serving or (self._in_use and self._in_use + nbytes > self.capacity):
                    if not waited and caller_gone is not None:
                        watching = watch_caller(caller_gone, self._wake)
                        if watching is False:  # left already: no wake would come
                            raise self._caller_left()
                        poll_s = CALLER_CHECK_S if watching is None else None
                    waited = True
                    self._cond.wait(poll_s)
                    if caller_gone is not None and caller_gone():
                        raise self._caller_left()
            except BaseException:  # interrupted while waiting: its turn passes to the next ticket
                self._abandoned.add(ticket)
                self._next_turn()
                raise
            self.waits += waited
            self._serving += 1
            self._next_turn()
            self._in_use += nbytes

    def _caller_left(self) -> CallerGoneError:
        return CallerGoneError(
            f"a request stopped waiting for {self.what}: its caller left (its deadline passed, or it was cancelled)"
        )

    def _wake(self) -> None:
        """Wakes the waits for room to look again (a caller of one of them left: watch_caller)."""
        with self._cond:
            self._cond.notify_all()

    def release(self, nbytes: int) -> None:
        """Gives back what acquire(nbytes) took."""
        if not self.capacity or not nbytes:
            return
        with self._cond:
            self._in_use -= nbytes
            self._cond.notify_all()

    def _next_turn(self) -> None:
        """Moves the turn past abandoned tickets and wakes the waiters (the next ticket may fit too). Under _cond."""
        while self._serving in self._abandoned:
            self._abandoned.remove(self._serving)
            self._serving += 1
        self._cond.notify_all()

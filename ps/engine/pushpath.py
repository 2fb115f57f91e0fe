"""PushPath: a shard's clock and its PushBatch path, applied exactly once per client request.

A PushBatch (push_batch) is validated whole, its clock advance reserved, its pushes applied in order (each through
the shard's apply_push, journaled with (client, client_seq, its index)), then the clock advanced. Exactly once: the
journal's `applied` table (ps.storage.applied) holds each client's newest request and how many of its pushes are
applied; the advance notes (`advanced`: client -> its newest request whose clock advance is applied, stored with
the clock by ShardMeta.set_clock) say which requests are applied whole. One request of a client runs at a time (its
client lock). Every change of the clock, the reservations, the notes and the client locks' table happens under
the shard's lock (`lock`, the one Shard holds for its tables too), held only around those changes.

A retry is the same request: each client's newest request is kept with a digest of its content (_digest), and
the request's seq sent again with other content is refused (RequestSeqReusedError), not applied in part as the
missing rest of the first one. The digest is kept where the request's seq is: in the `applied` entry, in each
journal record of the request and in its clock advance note, so it survives a restart, clean or kill -9. A request
of only pushes without ids and a clock advance of 0 has neither record nor note: until the next flush stores its
`applied` entry, a kill -9 forgets its seq, and the shard takes that seq again as a new request (it changed nothing,
so nothing is applied twice).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ps.config import MAX_CLOCK, MAX_SEQ_JUMP
from ps.engine.push import CheckedPush, TablePush
from ps.engine.room import RequestRoom, push_cost
from ps.errors import (
    CLIENT_TABLE_FULL,
    NOTHING_APPLIED,
    PARTLY_APPLIED,
    ClientTableFullError,
    InvalidArgumentError,
    PsError,
    RequestSeqReusedError,
    ShardNeedsRestartError,
)
from ps.partlyapplied import partly_applied
from ps.storage.checksum import checksum64
from ps.storage.journal import Journal
from ps.storage.journalformat import Origin
from ps.storage.store import Store
from ps.wire import repeats_ids

if TYPE_CHECKING:
    from ps.engine.table import Table


class PushPath:
    def __init__(
        self,
        shard_id: int,
        lock: threading.Lock,
        store: Store,
        journal: Journal,
        room: RequestRoom,
        check_push: Callable[[TablePush, Table | None], CheckedPush],
        apply_push: Callable[[CheckedPush, Origin], None],
        clock: int,
        notes: dict[int, tuple[int, int]],
    ):
        """lock: the shard's lock; store: where the clock and the advance notes are kept (set_clock,
        forget_advanced); journal: its `applied` table and note_applied; room: the request room each batch takes for
        its copies; check_push(push, table) / apply_push: the shard's check (Shard.check_push: table, the caller's Table of
        the push, or None) and apply of one push. clock and notes: the stored
        clock and advance notes ({client: (client_seq, digest)}, ShardMeta.advanced), read before the journal's
        replay, whose flush may drop entries (forget_advances) that aged past the retention while the shard was
        down."""
        self.shard_id = shard_id
        self.clock = clock
        self._lock = lock
        self._store = store
        self._journal = journal
        self._room = room
        self._check_push = check_push
        self._apply_push = apply_push
        self._advances_reserved = 0  # steps of the batches between their check and their advance (lock)
        # client -> [its lock, the requests holding or waiting for it]: one request of a client at a time
        # (push_batch); an entry lives while a request of its client is in flight (_client_lock)
        self._client_locks: dict[int, list] = {}
        # client -> its newest request whose clock advance is applied; such a request is applied whole (the
        # clock moves after its pushes), even one that no journal record notes (its pushes carry no ids). Its
        # entries go with the clients' `applied` entries (forget_advances)
        self.advanced: dict[int, int] = {client: seq for client, (seq, _) in notes.items()}
        # client -> the digest its advance note keeps, until note_advanced puts it in the journal's `applied` table
        self._note_digests: dict[int, int] = {client: digest for client, (_, digest) in notes.items()}

    def replayed_to(self, step: int) -> None:
        """The clock after the journal's replay at start: at least the newest replayed record's step."""
        with self._lock:
            self.clock = max(self.clock, step)

    def note_advanced(self) -> None:
        """Notes in the journal's `applied` table the requests whose clock advance is applied (at start, after the
        replay), with the digests their notes keep (those of the notes the constructor took, dropped here): a
        client's entry there is at least its advance note's request."""
        digests, self._note_digests = self._note_digests, {}
        for client, client_seq in self.advanced.items():
            self._journal.note_applied((client, client_seq, -1, digests.get(client, 0)))

    def push_batch(
        self,
        pushes: list[TablePush],
        advance_clock: int,
        client: int,
        client_seq: int,
        caller_gone: Callable[[], bool] | None = None,
        step_sum: bool = False,
        shared: bool = False,
        tables: Sequence[Table] | None = None,
    ) -> tuple[int, int]:
        """Several pushes of one request, then the clock advanced; returns (clock, pushes applied now: the last
        ones; ps.engine.push.ids_applied counts their ids). All are validated (duplicate ids included) before any
        is applied; then each is applied in order, by its own rule, journaled with (client, client_seq, its index).

        Exactly once: a request with a client id is applied at most once however often it is retried. The
        journal's `applied` table (durable, rebuilt at start) holds each client's newest request and how many of
        its pushes are applied; a retry of it applies only the rest (a crash may have come between two), and an
        older one applies nothing, nor advances the clock; either is still refused where it is malformed (a push
        that repeats ids, a clock advance past MAX_CLOCK), as a new one is. A client sends one request at a time to a
        shard, in client_seq order (1, 2, 3, ...: seq 0 is refused); a retry that arrives while its first attempt still
        runs waits for it. A client_seq more than MAX_SEQ_JUMP past its client's newest is refused. The clock advance of
        a request is stored together with the note that this request made it (ShardMeta.set_clock), so a retry
        advances the clock if and only if no attempt before did, across restarts too, and a request whose advance is
        applied is applied whole (its pushes came before it): a retry of it applies nothing and says so, even after
        a restart that found no journal record of its pushes without ids. A request whose pushes carry no ids (or a
        clock advance alone) is its client's newest as well.

        A retry must be the same request: its client's newest request sent again with other content (other pushes,
        tables, ids or values, or another clock advance) is refused with RequestSeqReusedError, changing nothing,
        where the shard applied that request (in part or whole), before a restart too (the digest is kept with the
        request's seq: ps.storage.applied; but for a request of only pushes without ids and no clock advance, which
        a kill -9 before the next flush forgets: the module's docstring); one known only from a journal record, a
        store or an advance note of the versions before the digest is taken as a retry. An older request is answered
        as applied before, whatever its content. Not for shared (a key any caller sends: Client.push_once, the first
        request applied, another caller's answered as applied before, whatever its content) nor for a sync step's
        sum (step_sum).

        A failure while applying (a float32 overflow, an I/O error) leaves the pushes before it applied and
        says so; validation failures change nothing.

        The caller holds its checkpoint hold's gate (ps.engine.hold). caller_gone: a wait for request room ends
        with CallerGoneError once it is true (ps.engine.room). step_sum: a sync step's sum, which runs alone where it
        is larger than the request room, not refused. tables: the Table of each push, which the caller looked up (ps.service
        reads the rows it sends back from them): each push goes to its Table; one replaced or closed before the pushes
        are checked refuses the request whole (ShardClosingError: Shard.check_push), while one replaced between that
        check and its push's apply refuses that push (Table.push), leaving the pushes before it applied, which the
        refusal says; None: each push's table looked up by name."""
        if tables is not None and len(tables) != len(pushes):
            raise ValueError(f"{len(tables)} tables given for {len(pushes)} pushes")
        if not client:
            return self._apply_checked(self._check_batch(pushes, tables=tables), advance_clock, (0, 0, 0), 0,
                                       caller_gone, step_sum)  # fmt: skip
        if client_seq < 1:  # seq 0 would read as applied before: its clock advance dropped, silently
            raise InvalidArgumentError(
                "a PushBatch with a client id numbers its requests to a shard from 1 (seq 1, 2, 3, ...); it came with "
                f"seq 0; {NOTHING_APPLIED}"
            )
        with self._client_lock(client):
            newest = self._journal.applied.get(client)
            done_seq, done_parts = newest or (0, 0)
            if newest is None and self._journal.applied.full():
                raise self._table_full()
            # a client this shard holds no request of (a new client, or a shard restored from a checkpoint) starts
            # at any seq; a known one may jump at most MAX_SEQ_JUMP ahead
            if newest is not None and client_seq > done_seq + MAX_SEQ_JUMP:
                raise InvalidArgumentError(
                    f"request seq {client_seq:,} is more than {MAX_SEQ_JUMP:,} ahead of this client's newest request "
                    f"on shard {self.shard_id} ({done_seq:,}); a client numbers its requests to a shard 1, 2, 3, ...; "
                    f"{NOTHING_APPLIED}"
                )
            # a request whose clock advance is applied is applied whole (the clock moves after its pushes), even
            # where the table notes fewer parts: after a restart, pushes without ids have no journal record
            whole = self.advanced.get(client, 0) >= client_seq
            done = client_seq == done_seq and done_parts >= len(pushes) and not advance_clock
            answered = whole or done or client_seq < done_seq
            checked = self._check_batch(pushes, answered, tables)  # still a bad request if it is one
            if answered:
                _check_answered_advance(advance_clock)
            kept = not (shared or step_sum) and (client_seq == done_seq or not answered)  # compared or recorded
            digest = _digest(checked, advance_clock) if kept else 0  # 0: none (never a digest's value)
            if digest and client_seq == done_seq:
                if not answered:  # a bad request is refused as one, then a reused seq
                    self.check_advance(advance_clock)
                self._check_same(client, client_seq, digest)
            if answered:
                return self.clock, 0
            skip = done_parts if client_seq == done_seq else 0
            # each journal record of the request, its advance note and its `applied` entry keep the digest (0:
            # none), so that its retries, after a restart too, must carry this content
            request = (client, client_seq, digest)
            out = self._apply_checked(checked, advance_clock, request, skip, caller_gone, step_sum)
            # pushes without ids leave no journal record to note them (in memory; stored at the next flush)
            self._journal.note_applied((client, client_seq, len(pushes) - 1, digest))
            return out

    def _check_same(self, client: int, client_seq: int, digest: int) -> None:
        """RequestSeqReusedError unless the request client_seq of client, its newest, has this digest of content or
        an unknown one (0: ps.storage.applied). The message names no id: client is the deduplication key
        (ps.service.client_key, a hash of the id sent under mutual TLS)."""
        kept = self._journal.applied.entry(client)
        if kept is not None and kept.client_seq == client_seq and kept.digest and kept.digest != digest:
            raise RequestSeqReusedError(
                f"request seq {client_seq:,} of this client id on shard {self.shard_id} was applied before "
                "with other content (its pushes, their tables, ids or values, or its clock advance differ): a "
                "request sent again must be the same request, and each new request takes the next seq; another "
                f"caller uses this client id, or the client numbered two requests alike; {NOTHING_APPLIED}"
            )

    @contextlib.contextmanager
    def _client_lock(self, client: int):
        """Holds the client's lock: one request of a client at a time (a retry that overtakes its first attempt
        waits for it). The lock is kept only while a request of the client holds or waits for it."""
        with self._lock:
            held = self._client_locks.setdefault(client, [threading.Lock(), 0])
            held[1] += 1
        try:
            with held[0]:
                yield
        finally:
            with self._lock:
                held[1] -= 1
                if not held[1]:
                    del self._client_locks[client]

    def _table_full(self) -> ClientTableFullError:
        """The refusal of a new client when the exactly-once table is full (ps.storage.applied); the servicer logs
        it as a warning (ps.refusals: once a minute at most)."""
        applied = self._journal.applied
        held = len(applied)
        text = (f"shard {self.shard_id} keeps the newest requests of {held:,} client{'s' * (held != 1)}, the most it "
                f"keeps ({applied.max_clients:,}, ps.config MAX_CLIENTS), and {CLIENT_TABLE_FULL} until some are "
                f"{applied.retention_s / 86400:.3g} days unused: a process that makes a new Client (a new random "
                "client id) per request, or a caller making ids up, fills it. Reuse one Client per process; the "
                f"clients it holds go on; {NOTHING_APPLIED}")  # fmt: skip
        return ClientTableFullError(text)

    def _check_batch(
        self, pushes: list[TablePush], every_push: bool = False, tables: Sequence[Table] | None = None
    ) -> list[CheckedPush]:
        """The pushes of a batch, each checked (check_push, with its Table of tables, if given) and for repeated
        ids: in a batch of several (a single push's are found by Table.push before it changes anything), or,
        every_push, in any (a request answered without applying it: no Table.push sees its ids)."""
        looked_up = [None] * len(pushes) if tables is None else tables
        checked = [self._check_push(p, t) for p, t in zip(pushes, looked_up)]
        if len(checked) > 1 or every_push:
            for i, c in enumerate(checked):
                if repeats_ids(c.ids):
                    raise InvalidArgumentError(f"push {i} of the batch (table {pushes[i].name!r}) repeats ids; "
                                               f"{NOTHING_APPLIED}")  # fmt: skip
        return checked

    def _apply_checked(
        self,
        checked: list[CheckedPush],
        advance_clock: int,
        request: tuple[int, int, int],
        skip: int,
        caller_gone: Callable[[], bool] | None = None,
        step_sum: bool = False,
    ) -> tuple[int, int]:
        """Checks (unless step_sum) that the copies of the pushes checked (_check_batch) fit in the request room,
        reserves the clock advance (so that no AdvanceClock in between can make it out of range), applies the pushes
        from `skip` on, then advances the clock. request: (client, client_seq, the digest of its content; 0s:
        none)."""
        room = sum(push_cost(len(c.ids), c.table.width) for c in checked[skip:])
        if not step_sum:
            ids = sum(len(c.ids) for c in checked[skip:])
            self._room.refuse_larger(room, ids, f"a PushBatch of {len(checked) - skip} pushes")
        if advance_clock:
            with self._lock:
                self._check_advance(advance_clock)
                self._advances_reserved += advance_clock
        try:
            with self._room.take(room, caller_gone):
                self._apply_pushes(checked, request, skip)
        finally:  # applied or not, the reservation ends; the clock moves only after every push was applied
            if advance_clock:
                with self._lock:
                    self._advances_reserved -= advance_clock
        if not advance_clock:
            return self.clock, len(checked) - skip
        with self._lock:
            try:
                return self._set_clock(self.clock + advance_clock, request if request[0] else None), len(checked) - skip
            except PsError as e:
                if skip == len(checked):  # no push of this attempt applied: the refusal's own words stand
                    raise
                failed = "storing the clock advance of the batch failed"
                raise _partly_applied(e, failed, range(skip, len(checked)), "of the batch", request, None) from e

    def _apply_pushes(self, checked: list[CheckedPush], request: tuple[int, int, int], skip: int):
        """Applies checked[skip:] in order; a refusal after the first says which pushes before it stay applied."""
        client, client_seq, digest = request
        for i in range(skip, len(checked)):
            try:
                self._apply_push(checked[i], (client, client_seq, i, digest))
            except PsError as e:
                if i == skip or isinstance(e, ShardNeedsRestartError):  # journaled: not refused; its message
                    raise  # says what a restart does
                refused = f"push {i} of {len(checked)} in the batch (table {checked[i].table.name!r}) was refused"
                raise _partly_applied(e, refused, range(skip, i), "before it", request, i) from e

    # ---- the clock ----------------------------------------------------------------------------------------
    def advance_clock(self, steps: int) -> int:
        """Moves the clock forward by steps; returns it. InvalidArgumentError, changing nothing, if it would pass
        MAX_CLOCK (counting the advances of PushBatches whose pushes are being applied)."""
        with self._lock:
            self._check_advance(steps)
            return self._set_clock(self.clock + steps)

    def _set_clock(self, clock: int, advanced_by: tuple[int, int, int] | None = None) -> int:
        """Stores the clock (and, given advanced_by = (client, client_seq, digest), that this request advanced it),
        then sets it (so a failed write leaves it as it was); lock held."""
        self._store.meta.set_clock(clock, advanced_by)
        self.clock = clock
        if advanced_by is not None:
            self.advanced[advanced_by[0]] = advanced_by[1]
        return clock

    def check_advance(self, steps: int) -> None:
        """_check_advance under the lock: a sync contribution's advance checked before it is held."""
        with self._lock:
            self._check_advance(steps)

    def _check_advance(self, steps: int) -> None:
        """InvalidArgumentError unless the clock, with the advances reserved by batches in flight, can move by
        steps and stay <= MAX_CLOCK; lock held."""
        if not 0 <= steps <= MAX_CLOCK - self.clock - self._advances_reserved:
            reserved = f" ({self._advances_reserved:,} more steps reserved by batches in flight)"
            at = f"the clock is at {self.clock:,}{reserved if self._advances_reserved else ''} and "
            raise _advance_out_of_range(steps, at=at)

    def forget_advances(self, dropped: dict[int, int]) -> None:
        """Deletes the advance notes (`advanced`, and the store's) of clients dropped from the exactly-once table,
        {client: the client_seq its entry held}, unless a newer request of the client advanced the clock since. A
        note that stays (this write failed) brings its client's entry back at the next start, to be dropped again."""
        with self._lock:  # as set_clock, which writes these notes
            gone = [c for c, seq in dropped.items() if c in self.advanced and self.advanced[c] <= seq]
            if gone:
                self._store.meta.forget_advanced(gone)
                for c in gone:
                    del self.advanced[c]


def _digest(checked: list[CheckedPush], advance_clock: int) -> int:
    """A 64-bit digest of a request's content: its clock advance, and each push's table, update rule, ids, grads,
    shows and clicks (as checked: counts filled in), by checksum64 (memory speed, on every core past 2 MiB). Two
    requests of other content share it with probability ~2**-64; a client that makes them share it on purpose
    gets what its retry would. Never 0, which stands for no digest (ps.storage.applied)."""
    head = [advance_clock, len(checked)]
    parts: list = []
    for c in checked:
        name = c.table.name.encode()
        head += [len(name), c.rule, *c.grads.shape]
        parts += [name, *(np.ascontiguousarray(a) for a in (c.ids, c.grads, c.shows, c.clicks))]
    return checksum64([np.array(head, dtype=np.uint64), *parts]) or 1


def _check_answered_advance(steps: int) -> None:
    """InvalidArgumentError for the clock advance of a request answered as applied before (a retry, or an older
    request) that no clock can take: past MAX_CLOCK. It is not checked against the clock, which moved since the
    request's first attempt (by that advance too, where it was applied)."""
    if steps > MAX_CLOCK:
        raise _advance_out_of_range(
            steps, why=" (the request's seq was applied before, but this advance could never be)"
        )


def _advance_out_of_range(steps: int, at: str = "", why: str = "") -> InvalidArgumentError:
    """The error for a clock advance of steps that the clock cannot take: "a clock advance of N steps is out of
    range: <at>a shard's clock stays <= MAX_CLOCK<why>; NOTHING_APPLIED"."""
    return InvalidArgumentError(
        f"a clock advance of {steps:,} steps is out of range: {at}a shard's clock stays <= {MAX_CLOCK:,}{why}; "
        f"{NOTHING_APPLIED}"
    )


def _partly_applied(e: PsError, failed: str, applied: range, where: str, request: tuple[int, int, int],
                    rest: int | None) -> PsError:  # fmt: skip
    """e, a failure after the pushes `applied` of a batch were applied, reworded by ps.partlyapplied with
    `failed` and "The pushes <applied> <where> were applied and stay applied, and the clock was not advanced
    (PARTLY_APPLIED); <what a retry does>". rest: the first push that a retry with the request's client id applies
    (None: none of them, only the clock advance)."""
    if len(applied) == 1:
        named = f"The push {applied[0]} {where} was applied and stays"
    else:
        named = f"The pushes {applied[0]} to {applied[-1]} {where} were applied and stay"
    if not request[0]:
        retry = "a retry without a client_id applies them all again"
    elif rest is None:
        retry = "a retry of this request (same client_id and seq) applies none of them again, only the clock advance"
    else:
        retry = f"a retry of this request (same client_id and seq) applies pushes {rest} on"
    return partly_applied(e, failed, f"{named} {PARTLY_APPLIED}; {retry}")

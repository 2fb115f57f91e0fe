"""MemoryBudget: the bytes the RAM tiers (arenas) of one server may hold, and how its tables share them.

Every arena row in use, free-listed ones included, is paid for: `row_charge` bytes from the budget. So the sum of
the tables' ram_bytes is `used_bytes` and never exceeds `limit_bytes` (--cache-bytes); there is no allowance
outside it. Sharing:
- a table takes free bytes while there are any (first come, first served);
- once the budget is spent, a table holding less than its fair share (limit_bytes / number of tables) takes
  rows back from the tables holding more than theirs, largest first, leaving each at its share (less than one
  of its rows under it, at most): reclaim() asks the giving arena, under that table's lock, to give up its
  coldest rows, persisting the dirty ones (Arena.give_up). A table whose give_up fails (its dirty rows cannot be
  written) is logged and skipped, and so is one busy in reclaim() itself for RECLAIM_WAIT_S (Lock order); where
  the asker is then left with too few rows, its request fails with that write's error (ps.engine.table), not as a
  RAM tier too small;
- a table at or above its share reuses its own cold rows (S3-FIFO, ps/storage/arena.py).
So a table can hold its share, also one created after the others filled the budget; join() refuses a table
(RamTierTooSmallError, before anything is written) when the shares would fall under the floor of min_share_bytes:
MIN_SHARE_ROWS rows of the widest table, or MIN_SHARE_BYTES where that is less (wide rows). A table whose
creation fails after join(), or that is replaced (its arena's lock held), leaves again (leave()).

Lock order: a table waits for another table's lock only in reclaim(), holding its own lock and no other, and
while it holds another table's lock (give_up) it waits for no table's lock; nothing else holds a table's lock while it
waits for another's. So a cycle of waits can only be of tables that are each in reclaim() (the other tables' row
counts are read without their locks, and the share changes as tables join, so two tables can each see the other
above a share). reclaim() therefore waits for a table's lock as long as it takes (a request on that table, a
Shrink's chunk, a flush's), in slices of RECLAIM_WAIT_S, except while that table is itself in reclaim(): then
for RECLAIM_WAIT_S at most, after which it is skipped, and the waiting request goes on with the rows it has: its
own cold rows, or, when they are too few, ps.errors.TableBusyError (UNAVAILABLE, naming the tables skipped: the
rows exist, and the request is sent again: ps.engine.table), not RamTierTooSmallError, which is for a RAM tier
that cannot hold what is asked. No cycle lasts longer than that.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

from ps.errors import RamTierTooSmallError

log = logging.getLogger("ps.storage.budget")

MIN_SHARE_ROWS = 256  # a table's fair share must hold this many rows of the widest table (a request is served in
MIN_SHARE_BYTES = 1 << 20  # chunks of half a share), or this many bytes where that is less (rows of over 4 KiB)
RECLAIM_WAIT_S = 0.5  # longest wait for the lock of a table to take rows from while that table is in reclaim()


def min_share_bytes(row_charge: int) -> int:
    """The smallest fair share join() allows when the widest table's rows cost row_charge bytes each."""
    return max(row_charge, min(MIN_SHARE_ROWS * row_charge, MIN_SHARE_BYTES))


class Member(Protocol):
    """What the budget needs of an arena."""

    name: str  # its table's, for messages
    row_charge: int  # bytes one row costs
    paid: int  # rows paid for: those in use, and those a growth in progress was granted and has not put in use yet
    lock: threading.Lock  # its table's lock

    def give_up(self, k: int) -> int: ...  # its lock held; reclaim() pays back what `paid` fell by


Failed = tuple[Member, Exception]  # a table whose give_up failed in reclaim(), and its error


class MemoryBudget:
    """Bytes the RAM tiers of one server may use, shared by its tables (see the module docstring)."""

    def __init__(self, limit_bytes: int, source: str = "", raise_to: Callable[[int], str] | None = None):
        """source: how limit_bytes was set, for messages (default "--cache-bytes N"); raise_to(n): what to change
        for a RAM tier of n bytes (default "raise --cache-bytes to at least n"); ps.storage.memory.MemoryPlan
        gives both."""
        self.limit_bytes = int(limit_bytes)
        self.source = source or f"--cache-bytes {self.limit_bytes}"
        self.raise_to = raise_to or (lambda n: f"raise --cache-bytes to at least {n}")
        self.used_bytes = 0
        self._lock = threading.Lock()
        self._members: list[Member] = []  # tables are never dropped; one whose creation failed leaves
        self._reclaiming: set[int] = set()  # id() of the members in reclaim() now, each holding its own lock

    def join(self, member: Member) -> None:
        """Adds a table's arena; RamTierTooSmallError (nothing changed) if the shares would get too small."""
        with self._lock:
            self._check_join(member.row_charge, self._members)
            self._members.append(member)

    def check_join(self, row_charge: int, replacing: Member | None = None) -> None:
        """The RamTierTooSmallError join() would raise for a table whose rows cost row_charge bytes, after
        `replacing` (a member) left; nothing changes either way."""
        with self._lock:
            self._check_join(row_charge, [m for m in self._members if m is not replacing])

    def _check_join(self, row_charge: int, members: list[Member]) -> None:
        n = len(members) + 1
        widest = max([m.row_charge for m in members] + [row_charge])
        self.check_room(n, widest, f"cannot take table number {n}")

    def check_room(self, n: int, widest: int, what: str) -> None:
        """RamTierTooSmallError ("the RAM tier (...) {what}: ...") if n tables whose widest rows cost `widest`
        bytes would get shares under the floor."""
        share, floor = self.limit_bytes // n, min_share_bytes(widest)
        if share < floor:
            raise RamTierTooSmallError(
                f"the RAM tier ({self.source}) {what}: shared by {n} tables it gives each "
                f"{share} bytes, under the {floor} bytes a table's share must hold ({floor // widest} rows of the "
                f"widest table, {widest} bytes a row); {self.raise_to(n * floor)}"
            )

    def leave(self, member: Member) -> None:
        """Removes a table's arena that joined (a table whose creation failed after join(), or one replaced; the
        caller holds the arena's lock, so no reclaim() is taking rows from it); the bytes of its rows go back to the
        budget."""
        with self._lock:
            self._members = [m for m in self._members if m is not member]
            self.used_bytes -= member.paid * member.row_charge

    def share_bytes(self) -> int:
        """A table's fair share: what it can always hold."""
        return self.limit_bytes // max(1, len(self._members))

    def free_bytes(self) -> int:
        return max(0, self.limit_bytes - self.used_bytes)

    def take(self, want_bytes: int, unit: int) -> int:
        """Grants the largest multiple of `unit` bytes <= want_bytes that fits; returns the bytes granted."""
        with self._lock:
            granted = min(want_bytes, self.free_bytes() // unit * unit)
            self.used_bytes += granted
            return granted

    def give(self, nbytes: int) -> None:
        """Returns bytes that take() or reclaim() granted and the caller did not keep."""
        with self._lock:
            self.used_bytes -= nbytes

    def reclaim(self, asker: Member, rows: int, holding: int) -> tuple[int, list[Member], list[Failed]]:
        """Up to `rows` rows (of asker's row_charge) taken from tables above their share and granted to asker,
        which holds its own table's lock and `holding` rows (its rows in use and any granted to it and not yet in
        use). Never grants asker more than its share has room for, the share read again, and the tables ranked
        again, before each table it takes from. Returns the rows granted, the tables above their share skipped
        because they were in reclaim() themselves (see the module), and those whose give_up failed, each with its
        error."""
        with self.reclaiming(asker):
            return self._reclaim(asker, rows, holding)

    @contextlib.contextmanager
    def reclaiming(self, member: Member) -> Iterator[None]:
        """Marks member as in reclaim() (holding its own lock) while the block runs: a table waiting for its lock
        then skips it after RECLAIM_WAIT_S."""
        with self._lock:
            self._reclaiming.add(id(member))
        try:
            yield
        finally:
            with self._lock:
                self._reclaiming.discard(id(member))

    def _reclaim(self, asker: Member, rows: int, holding: int) -> tuple[int, list[Member], list[Failed]]:
        rc, granted, busy, failed, asked, freed = asker.row_charge, 0, [], [], [asker], 0
        while True:
            share = self.share_bytes()
            room = min(rows, share // rc - holding) - granted
            # the bytes the last table gave back, and any freed since asker's take() or by then (a table that left,
            # a growth that failed), go to asker first; then the table furthest above its share now, each once
            got = self._hand(freed, room, rc)
            granted, room = granted + got, room - got
            other = self._furthest_above(share, asked) if room > 0 else None
            if other is None:
                return granted, busy, failed
            asked.append(other)
            if not self._lock_of(other):
                busy.append(other)
                freed = 0
                continue
            paid = other.paid  # other's table is idle now (no growth in progress): its rows can move
            try:
                with self._lock:
                    gone = other not in self._members  # it left since it was chosen (a table replaced): its
                surplus = -(-(paid * other.row_charge - share) // other.row_charge)  # bytes are free already
                wanted = -(-room * rc // other.row_charge)  # to under a row above share
                if surplus > 0 and not gone:
                    other.give_up(min(surplus, wanted))
            except Exception as e:  # e.g. its dirty rows cannot be written: asker fails only if left too few rows
                given = paid - other.paid  # rows that left it before it failed (its arrays could not shrink)
                if given:
                    log.exception("table %r gave %d rows back to table %r, then could not shrink its arrays (they "
                                  "keep their size until it next resizes)", other.name, given, asker.name)  # fmt: skip
                else:
                    log.exception("table %r could not give rows back to table %r; skipped", other.name, asker.name)
                    failed.append((other, e))
            finally:
                freed = (paid - other.paid) * other.row_charge  # no longer paid for, also where give_up failed late
                other.lock.release()

    def _furthest_above(self, share: int, asked: list[Member]) -> Member | None:
        """The table holding the most bytes above `share` of those not in `asked` (their paid read without their
        locks), or None."""
        with self._lock:
            held = [(m.paid * m.row_charge, m) for m in self._members if all(m is not a for a in asked)]
        most, other = max(held, key=lambda h: h[0], default=(0, None))
        return other if most > share else None

    def _hand(self, freed_bytes: int, room: int, rc: int) -> int:
        """Pays freed_bytes back and grants up to room rows of rc bytes from the free bytes, in one hold of the lock:
        no other table takes the freed bytes first. Returns the rows granted."""
        with self._lock:
            self.used_bytes -= freed_bytes
            got = max(0, min(room, self.free_bytes() // rc))
            self.used_bytes += got * rc
        return got

    def _lock_of(self, other: Member) -> bool:
        """Takes other's lock for reclaim(), waiting in slices of RECLAIM_WAIT_S for as long as other is not in
        reclaim() itself (then it may be waiting for the asker's lock: see the module). Whether it got the lock."""
        while not other.lock.acquire(timeout=RECLAIM_WAIT_S):
            with self._lock:
                if id(other) in self._reclaiming:
                    return False
        return True

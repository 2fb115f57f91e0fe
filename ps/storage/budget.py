"""MemoryBudget: the bytes the RAM tiers (arenas) of one server may hold, and how its tables share them.

Every arena row in use, free-listed ones included, is paid for: `row_charge` bytes from the budget. So the sum of
the tables' ram_bytes is `used_bytes` and never exceeds `limit_bytes` (--cache-bytes); there is no allowance
outside it. Sharing:
- a table takes free bytes while there are any (first come, first served), but for those owed to a table in
  reclaim() (below);
- once the budget is spent, a table holding less than its fair share (limit_bytes / number of tables) takes
  rows back from the tables holding more than theirs, largest first, leaving each at its share (less than one
  of its rows under it, at most): reclaim() asks the giving arena, under that table's lock, to give up its
  coldest rows, persisting the dirty ones (Arena.give_up). A table whose give_up fails (its dirty rows cannot be
  written) is logged and skipped, and so is one busy in reclaim() itself for RECLAIM_WAIT_S (Lock order); where
  the asker is then left with too few rows, its request fails with that write's error (ps.engine.table), not as a
  RAM tier too small;
- while a table is in reclaim(), the rows it still has room for under its share are owed to it: take() grants
  another table free bytes beyond that table's own share only out of the bytes no reclaim() is owed. So a table
  reclaim() has visited already (each is visited once), left at its share, cannot take back beyond its share
  the bytes that go free while the asker waits for the next table (a table that left, a growth that failed);
  those go to the asker;
- a table at or above its share reuses its own cold rows (S3-FIFO, ps/storage/eviction.py).
So a table can hold its share, also one created after the others filled the budget; join() refuses a table
(RamTierTooSmallError, before anything is written) when the shares would fall under the floor of min_share_bytes:
MIN_SHARE_ROWS rows of the widest table, or MIN_SHARE_BYTES where that is less (wide rows). A table whose
creation fails after join(), or that is replaced (its arena's lock held), leaves again (leave()).

Paid bytes: the budget records what it charges each table (its rows in use, and those granted to a growth in
progress and not yet in use), changed under the budget's own lock together with used_bytes, so the figures always
add up to used_bytes and reclaim() ranks the tables by figures read at one moment, without their tables' locks.

Lock order: a table's lock, then the budget's. The budget's lock is the innermost: taken with or without a table's
lock held, and nothing waits for any other lock while holding it. A table waits for another table's lock only in
reclaim(), holding its own lock and no other, and while it holds another table's lock (give_up) it waits for no
table's lock; nothing else holds a table's lock while it waits for another's. So a cycle of waits can only be of
tables that are each in reclaim() (the share changes as tables join, so two tables can each see the other above a
share). reclaim() therefore waits for a table's lock as long as it takes (a request on that table, a
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

from ps.bytesize import exact_bytes, human_bytes
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
    used: int  # rows in use, read under its lock: while its table is idle, the budget charges it for exactly these
    lock: threading.Lock  # its table's lock

    def give_up(self, k: int) -> int: ...  # its lock held; lowers `used` by the rows given; reclaim() pays them back


Failed = tuple[Member, Exception]  # a table whose give_up failed in reclaim(), and its error


class MemoryBudget:
    """Bytes the RAM tiers of one server may use, shared by its tables (see the module docstring)."""

    def __init__(self, limit_bytes: int, source: str = "", raise_to: Callable[[int], tuple[str, str]] | None = None):
        """source: how limit_bytes was set, for messages (default "--cache-bytes N", N in exact_bytes' form);
        raise_to(n): what to change for a RAM tier of n bytes, in words, and the flags those words raise, a
        refusal's `budget` field (ps.errors.RAM_TIER_BUDGETS; default "raise --cache-bytes to at least n", "cache");
        ps.storage.memory.MemoryPlan gives source (ram_tier_source) and raise_to (raise_ram_tier_to)."""
        self.limit_bytes = int(limit_bytes)
        self.source = source or f"--cache-bytes {exact_bytes(self.limit_bytes)}"
        self.raise_to = raise_to or (lambda n: (f"raise --cache-bytes to at least {exact_bytes(n)}", "cache"))
        self.used_bytes = 0
        self._lock = threading.Lock()
        self._members: list[Member] = []  # tables are never dropped; one whose creation failed leaves
        self._paid: dict[int, int] = {}  # id() of each member -> the bytes charged to it; they add up to used_bytes
        self._owed: dict[int, int] = {}  # id() of each member in reclaim() -> bytes it still has room for
        self._reclaiming: set[int] = set()  # id() of the members in reclaim() now, each holding its own lock

    def join(self, member: Member) -> None:
        """Adds a table's arena; RamTierTooSmallError (nothing changed) if the shares would get too small."""
        with self._lock:
            self._check_join(member.row_charge, self._members)
            self._members.append(member)
            self._paid[id(member)] = 0

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
        """RamTierTooSmallError ("the RAM tier (...) {what}: ...", its fields n, the floor and the budget) if n tables whose
        widest rows cost `widest` bytes would get shares under the floor."""
        share, floor = self.limit_bytes // n, min_share_bytes(widest)
        if share < floor:
            change, flags = self.raise_to(n * floor)
            raise RamTierTooSmallError(
                f"the RAM tier ({self.source}) {what}: shared by {n} tables it gives each "
                f"{human_bytes(share)}, under the {exact_bytes(floor)} a table's share must hold ({floor // widest} "
                f"rows of the widest table, {widest:,} bytes a row); {change}",
                tables=n,
                floor_bytes=floor,
                budget=flags,
            )

    def leave(self, member: Member) -> None:
        """Removes a table's arena that joined (a table whose creation failed after join(), or one replaced; the
        caller holds the arena's lock, so no reclaim() is taking rows from it); the bytes charged to it go back to
        the budget, and it is granted none from now on."""
        with self._lock:
            self._members = [m for m in self._members if m is not member]
            self.used_bytes -= self._paid.pop(id(member), 0)

    def paid_bytes(self, member: Member) -> int:
        """The bytes charged to member: its rows in use, and those granted to its growth in progress and not yet in
        use (0 once it left)."""
        with self._lock:
            return self._paid.get(id(member), 0)

    def share_bytes(self) -> int:
        """A table's fair share: what it can always hold."""
        return self.limit_bytes // max(1, len(self._members))

    def free_bytes(self) -> int:
        return max(0, self.limit_bytes - self.used_bytes)

    def take(self, member: Member, want_bytes: int, unit: int) -> int:
        """Grants member the largest multiple of `unit` bytes <= want_bytes that fits: any free bytes up to its
        share, beyond it only those no table in reclaim() is owed (see the module). Returns the bytes granted (0 to
        a member that left)."""
        with self._lock:
            if id(member) not in self._paid:
                return 0
            free = self.free_bytes()
            spare = free - sum(self._owed.values())
            to_share = min(free, self.share_bytes() - self._paid[id(member)])
            granted = max(0, min(want_bytes, max(spare, to_share) // unit * unit))
            self._charge(member, granted)
            return granted

    def settle(self, member: Member, rows: int) -> None:
        """Charges member for `rows` rows of its row_charge from now on: bytes that take() or reclaim() granted it
        beyond them, and it did not put in use (a growth that failed), go back to the budget."""
        with self._lock:
            self._charge(member, rows * member.row_charge - self._paid.get(id(member), 0))

    def _charge(self, member: Member, nbytes: int) -> None:
        """Adds nbytes (< 0: pays them back) to what member and the budget hold, if member has not left (its bytes
        went back then); the budget's lock held."""
        if id(member) in self._paid:
            self._paid[id(member)] += nbytes
            self.used_bytes += nbytes

    def reclaim(self, asker: Member, rows: int, holding: int) -> tuple[int, list[Member], list[Failed]]:
        """Up to `rows` rows (of asker's row_charge) taken from tables above their share and granted to asker,
        which holds its own table's lock and `holding` rows (its rows in use and any granted to it and not yet in
        use). Never grants asker more than its share has room for, the share read again, and the tables ranked
        again, before each table it takes from; while it runs, asker is owed that room (see the module). Returns
        the rows granted, the tables above their share skipped because they were in reclaim() themselves (see the
        module), and those whose give_up failed, each with its error."""
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
                self._owed.pop(id(member), None)

    def _reclaim(self, asker: Member, rows: int, holding: int) -> tuple[int, list[Member], list[Failed]]:
        rc, busy, failed, asked = asker.row_charge, [], [], [asker]
        granted = self._hand(asker, rows, holding, 0)  # bytes freed since asker's take(): a table left, a growth failed
        while True:
            share = self.share_bytes()
            room = min(rows, share // rc - holding) - granted
            other = self._furthest_above(share, asked) if room > 0 else None  # each table once
            if other is None:
                return granted, busy, failed
            asked.append(other)
            if not self._lock_of(other):
                busy.append(other)
                granted += self._hand(asker, rows, holding, granted)  # bytes freed while it waited
                continue
            used = other.used  # other's table is idle now: it is charged for these rows, and its rows can move
            try:
                with self._lock:
                    held = self._paid.get(id(other))  # None: it left since it was chosen (a table replaced)
                if held is not None and held > share:
                    surplus = -(-(held - share) // other.row_charge)  # to under a row above share
                    other.give_up(min(surplus, -(-room * rc // other.row_charge)))
            except Exception as e:  # e.g. its dirty rows cannot be written: asker fails only if left too few rows
                if used != other.used:  # rows left it before it failed (its arrays could not shrink)
                    log.exception("table %r gave %d rows back to table %r, then could not shrink its arrays (they "
                                  "keep their size until it next resizes)", other.name, used - other.used,
                                  asker.name)  # fmt: skip
                else:
                    log.exception("table %r could not give rows back to table %r; skipped", other.name, asker.name)
                    failed.append((other, e))
            finally:  # what other no longer holds (also where give_up failed late) goes to asker before its lock goes
                try:
                    granted += self._hand(asker, rows, holding, granted, other, (used - other.used) * other.row_charge)
                finally:
                    other.lock.release()

    def _furthest_above(self, share: int, asked: list[Member]) -> Member | None:
        """The table charged the most bytes above `share` of those not in `asked`, or None."""
        with self._lock:
            held = [(self._paid[id(m)], m) for m in self._members if all(m is not a for a in asked)]
        most, other = max(held, key=lambda h: h[0], default=(0, None))
        return other if most > share else None

    def _hand(
        self, asker: Member, rows: int, holding: int, granted: int, giver: Member | None = None, freed_bytes: int = 0
    ) -> int:
        """Pays back the freed_bytes giver no longer holds, then grants asker, out of the free bytes, up to the rows
        its share has room for as it is now (of `rows`, holding `holding` and granted `granted` so far in this
        reclaim()), in one hold of the lock: no other table takes the freed bytes first. What room is left is owed
        to asker. Returns the rows granted."""
        rc = asker.row_charge
        with self._lock:
            if freed_bytes:
                self._charge(giver, -freed_bytes)
            if id(asker) not in self._paid:  # it left (take() grants such a table nothing either)
                return 0
            room = min(rows, self.share_bytes() // rc - holding) - granted
            got = max(0, min(room, self.free_bytes() // rc))
            self._charge(asker, got * rc)
            self._owed[id(asker)] = max(0, room - got) * rc
        return got

    def _lock_of(self, other: Member) -> bool:
        """Takes other's lock for reclaim(), waiting in slices of RECLAIM_WAIT_S for as long as other is not in
        reclaim() itself (then it may be waiting for the asker's lock: see the module). Whether it got the lock."""
        while not other.lock.acquire(timeout=RECLAIM_WAIT_S):
            with self._lock:
                if id(other) in self._reclaiming:
                    return False
        return True

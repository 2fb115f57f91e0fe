"""MemoryBudget: the bytes the RAM tiers (arenas) of one server may hold, and how its tables share them.

Every arena row in use, free-listed ones included, is paid for: `row_charge` bytes from the budget. So the sum of
the tables' ram_bytes is `used_bytes` and never exceeds `limit_bytes` (--cache-bytes); there is no allowance
outside it. Sharing:
- a table takes free bytes while there are any (first come, first served);
- once the budget is spent, a table holding less than its fair share (limit_bytes / number of tables) takes
  rows back from the tables holding more than theirs, largest first, leaving each at its share (less than one
  of its rows under it, at most): reclaim() asks the giving arena, under that table's lock, to give up its
  coldest rows, persisting the dirty ones (Arena.give_up);
- a table at or above its share reuses its own cold rows (CLOCK).
So every table can always hold its share, also one created after the others filled the budget; join() refuses
a table (RamTierTooSmallError, before anything is written) when the shares would fall under MIN_SHARE_ROWS rows
of the widest table.

Lock order: a table waits for another table's lock only while it holds fewer rows than its share has room for,
and only for a table above its share. A table that gave rows back keeps all the rows its share has room for, so
it never waits for another, and the waits cannot form a cycle. Each wait has a deadline besides
(RECLAIM_WAIT_S), after which that table is skipped.
"""

from __future__ import annotations

import threading
from typing import Protocol

from ps.errors import PsError

MIN_SHARE_ROWS = 1  # a table's fair share must hold at least this many of the widest table's rows
RECLAIM_WAIT_S = 10.0  # longest wait for the lock of a table to take rows from (it may be serving a request)


class RamTierTooSmallError(PsError, ValueError):
    """--cache-bytes cannot give every table the rows it needs; raise it (or keep fewer tables on a shard)."""

    status = "RESOURCE_EXHAUSTED"


class Member(Protocol):
    """What the budget needs of an arena."""

    row_charge: int  # bytes one row costs
    used: int  # rows paid for
    lock: threading.Lock  # its table's lock

    def give_up(self, k: int) -> int: ...


class MemoryBudget:
    """Bytes the RAM tiers of one server may use, shared by its tables (see the module docstring)."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = int(limit_bytes)
        self.used_bytes = 0
        self._lock = threading.Lock()
        self._members: list[Member] = []  # tables are never dropped: members stay

    def join(self, member: Member) -> None:
        """Adds a table's arena; RamTierTooSmallError (nothing changed) if the shares would get too small."""
        with self._lock:
            n = len(self._members) + 1
            widest = max([m.row_charge for m in self._members] + [member.row_charge])
            share = self.limit_bytes // n
            if share < MIN_SHARE_ROWS * widest:
                raise RamTierTooSmallError(
                    f"the RAM tier (--cache-bytes {self.limit_bytes}) cannot take table number {n}: shared by {n} "
                    f"tables it gives each {share} bytes, under {MIN_SHARE_ROWS} row(s) of the widest table "
                    f"({widest} bytes a row); raise --cache-bytes to at least {n * MIN_SHARE_ROWS * widest}"
                )
            self._members.append(member)

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

    def reclaim(self, asker: Member, rows: int) -> int:
        """Up to `rows` rows (of asker's row_charge) taken from tables above their share and granted to asker,
        which holds its own table's lock and is under its share by at least that much (Arena.grow checks).
        Returns the rows granted."""
        share = self.share_bytes()
        granted = 0
        for other in sorted(self._members, key=lambda m: m.used * m.row_charge, reverse=True):
            if granted >= rows or other.used * other.row_charge <= share:
                break
            if other is asker or not other.lock.acquire(timeout=RECLAIM_WAIT_S):
                continue
            try:  # other's table is idle now: its rows can move
                surplus = -(-(other.used * other.row_charge - share) // other.row_charge)  # to under a row above share
                wanted = -(-(rows - granted) * asker.row_charge // other.row_charge)
                freed = other.give_up(min(surplus, wanted)) if surplus > 0 else 0
            finally:
                other.lock.release()
            with self._lock:  # hand the freed bytes to asker before any other table can take them
                self.used_bytes -= freed * other.row_charge
                got = min(rows - granted, self.free_bytes() // asker.row_charge)
                self.used_bytes += got * asker.row_charge
            granted += got
        return granted

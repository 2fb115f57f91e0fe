"""Arena: the RAM tier of one table, rows drawn from the server's MemoryBudget: its arrays, their growth and shrink,
and the rows put in and taken out. Its lookups are its base ArenaLookups' (ps.storage.arenalookups), and the choice
of the rows that leave when it needs rows is ArenaEviction's (ps.storage.eviction), the base of that.

An arena is arrays indexed by arena row plus an IdIndex id -> row. Per row: data float32[width], id, lsn (journal
seq of the last push applied), a pin stamp (of the request that last looked the row up or admitted it; 0 once a
push has applied it, see "Waiting for their push" in ps.storage.eviction), a use count `ref` and flags: dirty
(newer than RocksDB), stored (RocksDB has the row). lsn, pin, the count and the flags live at the end of the row's
line in `data` (ps.rows.layout); the attributes are strided views of them.

Memory: every row in use [0, used) is paid for from the MemoryBudget shared by all tables of a server
(ps.storage.budget: the budget bounds the sum, there are no unpaid rows), and the arrays have room for `capacity`
rows, grown by doubling as rows are paid for, so what a table maps (virtual memory) follows what it holds: at
most twice its rows after a growth, four times once a Shrink dropped rows (return_free shrinks the arrays under
that, and gives the pages past the rows in use back to the OS), and never more than the budget. Growing moves the
pages to a larger mapping where the OS can (ps.accel.hugepages.resize), so the arrays are replaced: callers re-read
`data` and the views after any call that admits rows (grow). When the budget is spent a table reuses its own cold
rows (victims, ps.storage.eviction); a table under its fair share takes rows back from tables above theirs
(give_up). All per-row work is in compiled loops; the Table serializes calls with `lock`, which reclaim takes too.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

import numba
import numpy as np

from ps.accel import hugepages
from ps.rows.layout import INDEX_BYTES_PER_ROW, RAM_OVERHEAD_BYTES, line_floats, meta_col
from ps.rows.rowcopy import scatter
from ps.storage.arenalookups import ArenaLookups
from ps.storage.budget import MemoryBudget
from ps.storage.eviction import RECENT_REQUESTS, not_in_ghost
from ps.storage.idqueue import IdQueue
from ps.storage.index import IdIndex

log = logging.getLogger("ps.storage.arena")

MIN_CAPACITY = 16  # rows the arrays get at their first growth
_NO_RESCAN = 1 << 62


@numba.njit(nogil=True, cache=True)
def _collect_dirty(dirty, start, stop, k, out):
    """Up to k rows r in [start, stop) with dirty[r]; returns (count, where the scan stopped)."""
    count = 0
    r = start
    while r < stop and count < k:
        if dirty[r]:
            out[count] = r
            count += 1
        r += 1
    return count, r


def _detached(e: Exception) -> Exception:
    """e without its traceback and the errors it was raised from or during (their frames may hold what failed: an
    open RocksDB), to keep beyond the except block."""
    e.__traceback__ = e.__cause__ = e.__context__ = None
    return e


class Arena(ArenaLookups):
    """The RAM tier of one table, rows of `width` float32 drawn from `budget`. Not thread-safe: the Table
    serializes calls with `lock`. persist(rows) writes dirty rows to RocksDB and marks them clean (the table's);
    without it give_up gives up clean rows only."""

    def __init__(
        self, width: int, budget: MemoryBudget, persist: Callable[[np.ndarray], None] | None = None, name: str = ""
    ):
        self.name = name  # the table's, for messages
        self.width = width
        self.budget = budget
        self.persist = persist
        self.row_charge = 4 * line_floats(width) + RAM_OVERHEAD_BYTES  # the same figure `ps-server size` uses
        self.max_rows = budget.limit_bytes // self.row_charge  # what one table may ever hold: the whole budget
        self.lock = threading.Lock()  # the table's: its requests, and other tables taking rows back (give_up)
        self.capacity = 0
        self.data = hugepages.zeros((0, line_floats(width)), np.float32)  # rows [0, used) are set
        self.ids = hugepages.zeros(0, np.uint64)
        self._bind()
        self.index = IdIndex(MIN_CAPACITY)
        self.used = 0  # rows [0, used) are in use (installed, or free-listed) and paid for
        self.hand = 0
        self._probation = IdQueue()  # ids on probation, front first (ps.storage.eviction)
        self._ghost = np.zeros(1, dtype=np.uint16)  # fingerprints of ids taken from probation (ps.storage.eviction)
        self._plain_clock = False  # plain CLOCK instead (ps.storage.eviction): tests and benchmarks measure against it
        self.free = np.zeros(0, dtype=np.int64)  # released rows (Shrink), reused first
        self._stamp = 0
        self._recent: collections.deque = collections.deque(maxlen=RECENT_REQUESTS)  # (stamp, ids looked up)
        self._pushed_at = 0  # the latest stamp when a push was last applied
        self._seen: np.ndarray | None = None  # first_repeat's bitmap, one bit per row, kept clear
        self._rescan_from = _NO_RESCAN  # lowest row a dirty row was moved to since collect_dirty last ran
        self.evictions = 0
        self.busy: list[str] = []  # the tables the last grow() could not take rows back from (budget.reclaim)
        self.failed: list[tuple[str, Exception]] = []  # those whose give_up failed then, with their errors
        budget.join(self)  # last: RamTierTooSmallError leaves nothing behind

    def _bind(self) -> None:
        """The views of the bookkeeping at the end of each line of `data`."""
        m = 4 * meta_col(self.width)  # byte offset of the bookkeeping in a line
        self.lsn = self.data.view(np.uint64)[:, m // 8]
        self.pin = self.data.view(np.int64)[:, m // 8 + 1]
        line_bytes = self.data.view(np.uint8)
        self.ref, self.dirty, self.stored = (line_bytes[:, m + 16 + k] for k in range(3))

    def _resize(self, capacity: int) -> None:
        """Gives the arrays room for `capacity` rows (>= used), keeping rows [0, used). Empty views stand in
        while the arrays move (Table.stats reads them without the lock), so nothing else keeps the old mapping.
        Where a move gets no memory, the error propagates and every row stays: the arrays keep room for at least
        `used` rows, `capacity` says how many."""
        self.lsn, self.pin = np.zeros(0, np.uint64), np.zeros(0, np.int64)
        self.ref, self.dirty, self.stored = (np.zeros(0, np.uint8) for _ in range(3))
        self._seen = None
        try:
            hugepages.resize(self, "data", capacity)  # its only reference: moved in place
            hugepages.resize(self, "ids", capacity)
        finally:
            room = min(len(self.data), len(self.ids))
            if room != self.capacity:
                self.capacity = room
                self._ghost = np.zeros(1 << max(0, room.bit_length() - 1), dtype=np.uint16)  # what it held is lost
            self._bind()

    @property
    def paid(self) -> int:
        """Rows paid for from the budget: those in use, and those the growth in progress (grow, this table's lock
        held) was granted and has not put in use yet; the budget's own record (MemoryBudget.paid_bytes)."""
        return self.budget.paid_bytes(self) // self.row_charge

    def max_pinnable(self) -> int:
        """How many rows one request may pin at once: half of what this table is sure to hold while it serves the
        request (its rows, or its fair share if that is more: it can take that much back from other tables). Not
        the free budget: other tables may take that in the meantime."""
        could_hold = max(self.used, self.budget.share_bytes() // self.row_charge)
        return max(1, min(self.max_rows, could_hold) // 2)

    def grow(self, n: int, stamp: int) -> np.ndarray:
        """Up to n unused rows, pinned with stamp: released ones first, then new ones paid from the budget (taken
        back from other tables while this one is under its fair share; `busy` names those it skipped, busy taking
        rows back themselves, and `failed` those that could not give rows back, with their errors, kept without
        their tracebacks, whose frames may hold what failed). May move the arrays (see the module)."""
        self.busy, self.failed = [], []
        reused = self.free[:n]
        if len(reused) == n:
            self.free = self.free[n:]
            self.pin[reused] = stamp
            return reused
        rc = self.row_charge
        want = min(n - len(reused), self.max_rows - self.used)
        try:  # the rows granted are paid for: on any failure before they are in use, the bytes go back
            take = self.budget.take(self, want * rc, rc) // rc
            if take < want and self.budget.share_bytes() // rc > self.used + take:  # reclaim checks again
                got, busy, failed = self.budget.reclaim(self, want - take, self.used + take)
                take, self.busy = take + got, [m.name for m in busy]
                self.failed = [(m.name, _detached(e)) for m, e in failed]
            if self.used + take > self.capacity:
                self._resize(min(self.max_rows, max(self.used + take, 2 * self.capacity, MIN_CAPACITY)))
        except BaseException:
            self.budget.settle(self, self.used)
            raise
        self.free = self.free[len(reused) :]
        self.pin[reused] = stamp
        rows = np.arange(self.used, self.used + take, dtype=np.int64)
        self.pin[rows] = stamp  # so victims() cannot hand them out again before they are installed
        self.lsn[rows] = 0
        self.ref[rows] = 0
        self.dirty[rows] = 0
        self.stored[rows] = 0
        self.used += take
        return np.concatenate([reused, rows]) if len(reused) else rows

    def give_up(self, k: int) -> int:
        """Gives up to k rows back (for MemoryBudget.reclaim, which holds this table's lock and pays the bytes back
        to the budget); returns how many: the rows leave (_compact), then the arrays (the id index too) shrink to
        the rows left, so their memory goes back to the OS. Where the arrays get no memory to shrink into, the error
        propagates once the rows left (reclaim logs it): the arrays keep their size, and every row is as it was
        left."""
        k = self._compact(k)
        if k:
            self._fit(self.used)
        return k

    def _compact(self, k: int) -> int:
        """Up to k rows leave; returns how many. Free rows go first, then rows in use as victims() chooses them;
        the dirty ones are persisted first. The rows in use above used - k move down into the freed places. What
        can fail (persisting, the copies, the index's growth) runs before any row moves: a failure moves none, and
        propagates. The arrays keep their size."""
        top_free = np.sort(self.free)[::-1][:k]  # free rows nearest the end need no move
        evicted = self.victims(k - len(top_free), self.new_stamp()) if k > len(top_free) else self.free[:0]
        if self.persist is None:
            evicted = evicted[self.dirty[evicted] == 0]
        k = len(top_free) + len(evicted)
        if k == 0:
            return 0
        dirty = evicted[self.dirty[evicted] == 1]
        if len(dirty):
            self.persist(dirty)  # if this fails, no row has gone or moved
        gone = np.concatenate([top_free, evicted])
        left = self.used - k
        holes = np.sort(gone[gone < left])
        stays = np.ones(k, dtype=bool)
        stays[gone[gone >= left] - left] = False
        movers = left + np.flatnonzero(stays)  # as many as holes
        lines, moved_ids, free = self.data[movers], self.ids[movers], np.setdiff1d(self.free, gone)
        evicted_ids = self.ids[evicted]
        evicted_ids = evicted_ids[self.index.lookup(evicted_ids) == evicted]  # as _unindex: entries at those rows
        self.index.insert(moved_ids, holes)  # may grow, or fail and change nothing: the last step that allocates
        self.data[holes] = lines  # whole lines: row, lsn, pin and flags
        self.ids[holes] = moved_ids
        self.index.delete(evicted_ids)
        self.evictions += len(evicted)
        moved_dirty = holes[self.dirty[holes] == 1]
        if len(moved_dirty):
            self._rescan_from = min(self._rescan_from, int(moved_dirty[0]))
        self.free = free  # all below `left`
        self.used = left
        self.hand = self.hand if self.hand < left else 0
        self._probation.extend(np.zeros(0, dtype=np.uint64), max(MIN_CAPACITY, left))  # its array shrinks too
        return k

    def _fit(self, capacity: int) -> None:
        """Gives the arrays room for `capacity` rows (>= used), and shrinks the id index to the charge of the rows
        in use, so their memory goes back to the OS; then the arrays give back the pages past the rows in use
        (hugepages.release), which hold the lines of rows gone or moved down, resized or not. MemoryError or OSError
        where they get no memory to move into (_resize: the rows stay)."""
        if capacity != self.capacity:
            self._resize(capacity)
        hugepages.release(self.data, self.used)
        hugepages.release(self.ids, self.used)
        self.index.shrink(INDEX_BYTES_PER_ROW * self.used)  # within the charge of the rows left

    def _kept_capacity(self) -> int:
        """The capacity return_free leaves: the arrays keep theirs while the rows in use fill a quarter of it or
        more; under that they shrink to twice those rows (MIN_CAPACITY at least, 0 for none), the room a doubling
        growth leaves. So a Shrink that drops a few rows does not shrink them only for the next push to double them
        again (each resize wipes the eviction ghost), and they map at most four times the rows in use."""
        if self.used >= self.capacity // 4:
            return self.capacity
        return min(self.capacity, max(2 * self.used, MIN_CAPACITY)) if self.used else 0

    def return_free(self) -> int:
        """Gives the free rows (released by a Shrink, or by a refused request) back to the budget, so that any table
        can take their bytes; returns how many went. The rows in use above them move down into their places
        (_compact: no row in use goes; an error there propagates, no row moved), the budget is settled to the rows
        left in use, and the arrays shrink where the rows in use fall under a quarter of them (_kept_capacity;
        else the pages past those rows go back to the OS); where the arrays get no memory to shrink into, that is
        logged, not raised: the caller's work stands, and they keep their size until they next resize. The table's
        lock held."""
        before = self.used
        try:
            if len(self.free):
                self._compact(len(self.free))
                try:
                    self._fit(self._kept_capacity())
                except (MemoryError, OSError):
                    log.exception("table %r gave %d free rows back to the budget; shrinking its arrays to the rows "
                                  "left failed (they keep their size until they next resize)", self.name,
                                  before - self.used)  # fmt: skip
        finally:
            self.budget.settle(self, self.used)
        return before - self.used

    def install(
        self, rows: np.ndarray, ids: np.ndarray, block: np.ndarray, lsn: np.ndarray, stored: np.ndarray, stamp: int
    ) -> None:
        """Puts rows of ids (data, lsn, stored flags) into arena rows (free or evicted ones), unused, on probation
        unless the ghost remembers the id (ps.storage.eviction)."""
        scatter(self.data, rows, block)
        self.ids[rows] = ids
        self.lsn[rows] = lsn
        self.stored[rows] = stored
        self.dirty[rows] = 0
        self.pin[rows] = stamp
        self.index.insert(ids, rows)
        if self._plain_clock:
            self.ref[rows] = 1
            return
        self.ref[rows] = 0
        ids = np.asarray(ids, dtype=np.uint64)
        keep = max(MIN_CAPACITY, self.used)  # newest entries kept
        self._probation.extend(ids[not_in_ghost(ids, self._ghost)], keep)

    def release(self, rows: np.ndarray) -> None:
        """Drops rows from the table entirely (Shrink); their arena rows become free for reuse."""
        self._unindex(rows)
        self.dirty[rows] = 0
        self.stored[rows] = 0
        self.ref[rows] = 0
        self.give_back(rows)

    def forget(self, rows: np.ndarray) -> None:
        """Drops evicted rows from the index (their data must already be safe in RocksDB or never needed)."""
        self._unindex(rows)
        self.evictions += len(rows)

    def _unindex(self, rows: np.ndarray) -> None:
        """Removes the index entries of rows. Only ids whose entry points at that very row are removed, so a
        stale id left in a row can never delete the live entry of the same id elsewhere."""
        ids = self.ids[rows]
        self.index.delete(ids[self.index.lookup(ids) == rows])

    def give_back(self, rows: np.ndarray) -> None:
        """Puts rows on the free list (reused first by grow()); a free row is never a victim."""
        self.pin[rows] = -1
        self.free = np.concatenate([rows, self.free])

    def collect_dirty(self, start: int, k: int) -> tuple[np.ndarray, int]:
        """Up to k dirty rows at or after row start, in order, and the row where the scan stopped. A scan that
        goes on from where the last call stopped sees every row dirty at its start: if give_up moved a dirty row
        below start since the last call, the scan resumes from that row."""
        start = min(start, self._rescan_from)
        self._rescan_from = _NO_RESCAN
        out = np.empty(k, dtype=np.int64)
        count, stop = _collect_dirty(self.dirty, start, self.used, k, out)
        return out[:count], stop

    def ram_bytes(self) -> int:
        """Bytes this arena holds: its rows in use, as its budget accounts them."""
        return self.used * self.row_charge

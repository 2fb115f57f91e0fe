"""Arena: the RAM tier of one table, rows drawn from the server's MemoryBudget, with frequency-aware eviction.

An arena is arrays indexed by arena row plus an IdIndex id -> row. Per row: data float32[width], id, lsn (journal
seq of the last push applied), a pin stamp (of the request that last looked the row up or admitted it; 0 once a
push has applied it, see "Waiting for their push" below), a use count `ref` and flags: dirty (newer than
RocksDB), stored (RocksDB has the row). lsn, pin, the count and the flags live at the end of the row's line in
`data` (ps.rows.layout); the attributes are strided views of them.

Memory: every row in use [0, used) is paid for from the MemoryBudget shared by all tables of a server
(ps.storage.budget: the budget bounds the sum, there are no unpaid rows), and the arrays have room for `capacity`
rows, grown by doubling as rows are paid for, so what a table maps (virtual memory) follows what it holds: at
most twice its rows, and never more than the budget. Growing moves the pages to a larger mapping where the OS
can (ps.accel.hugepages.resize), so the arrays are replaced: callers re-read `data` and the views after any
call that admits rows (grow). When the budget is spent a table reuses its own cold rows (victims); a table under
its fair share takes rows back from tables above theirs (give_up).

Eviction keeps the ids that come back, as CTR ids are Zipf-distributed: most of a request's misses are ids seen
once in a long while, which should leave first, while ids used again should stay. The scheme is S3-FIFO (Yang et
al., SOSP 2023) on arena rows:
- Use count: every lookup, pull gather and push of a row adds one, up to USE_CAP (ps.rows.update.touch; a count
  at the cap is not written, so a hot row's line stays clean).
- Probation: install gives a row count 0 and puts its id at the back of a FIFO queue; victims() takes rows from the
  front of the queue first. A queued row that has reached PROMOTE_USES uses leaves the queue without being taken
  (in training the admitting request's push is one use, the next request's pull one more), as does an id no
  longer in RAM; a row pinned by the request in progress keeps its entry. The queue holds at most as many ids as
  there are rows in use (an id taken by the hand leaves an entry behind until the queue reaches it), oldest
  entries dropped first: their rows stay, as any other row.
- Ghost: the ids taken from the queue are remembered in a direct-mapped table of 16-bit fingerprints, a slot per
  row the arrays have room for (rounded down to a power of two). An id admitted again while remembered skips the
  queue: an id that comes back after its turn in the queue, but before the ghost forgets it, stays from then on.
- CLOCK over the counts: when the queue has no row to give, a hand sweeps the rows, takes a row whose count is 0
  and lowers any other count by one, so USE_CAP + 1 sweeps reach every row that is not pinned.
- Waiting for their push: in training a worker pulls the next batch's rows before it pushes the current one's
  (its prefetch), so a row admitted by a pull is needed again by a push one or more requests later; taken in
  between (the queue's front is the previous request's rows), it is read from RocksDB again for the push. While
  pushes are being applied (one since the oldest of the lookups below), a row pinned by one of the latest
  lookups (as many as looked up at most RECENT_SHARE of the rows in use, with repeats) that no push has applied
  since (`pushed` sets its pin to 0) is taken, from the queue or by the hand, only when no other row can be.
  Pull-only traffic (evaluation, serving) keeps the policy above as it is. A push of rows that another pull
  also asked for ends their wait too. benchmarks/eviction.py measures it on a stream pulled ahead.
Rows pinned by the request in progress and free rows are never taken. The queue holds at most one id per row in
use, in an array with a quarter to spare (ps.storage.idqueue), and the ghost 2 bytes per row the arrays have room
for: 12 bytes of each row's charge (ps.rows.layout.EVICTION_BYTES_PER_ROW).
`_plain_clock` (private, for tests and benchmarks/eviction.py, which measure against it) makes this plain CLOCK:
no queue and no ghost, a row admitted as used, and the hand clears a count instead of lowering it.
All per-row work is in compiled loops; the Table serializes calls with `lock`, which reclaim takes too.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

import numba
import numpy as np

from ps.accel import hugepages
from ps.accel.prefetch import AHEAD, prefetch_row
from ps.hashing import mix64_scalar
from ps.rows.layout import INDEX_BYTES_PER_ROW, RAM_OVERHEAD_BYTES, line_floats, meta_col
from ps.rows.parallel import parts, run_each, run_parts
from ps.rows.rowcopy import scatter
from ps.rows.update import USE_CAP, touch
from ps.storage.budget import MemoryBudget
from ps.storage.idqueue import IdQueue
from ps.storage.index import IdIndex, find, lookup_into, prefetch_slot

__all__ = ["Arena", "MemoryBudget"]

MIN_CAPACITY = 16  # rows the arrays get at their first growth
PROMOTE_USES = 2  # uses since admission that take a row off probation
RECENT_SHARE = 0.5  # of the rows in use: the latest requests' lookups whose rows wait for their push (see the module)
RECENT_REQUESTS = 64  # latest lookups remembered for that
_NO_RESCAN = 1 << 62


@numba.njit(nogil=True, cache=True)
def _group_by_home(ids, shift, k):
    """Positions of ids grouped by home slot modulo k: (positions, starts) with group g at
    positions[starts[g]:starts[g + 1]], in order of position within each group."""
    n = ids.shape[0]
    group = np.empty(n, np.int64)
    starts = np.zeros(k + 1, np.int64)
    for i in range(n):
        g = np.int64(mix64_scalar(ids[i]) >> shift) % k
        group[i] = g
        starts[g + 1] += 1
    for g in range(k):
        starts[g + 1] += starts[g]
    fill = starts[:k].copy()
    positions = np.empty(n, np.int64)
    for i in range(n):
        positions[fill[group[i]]] = i
        fill[group[i]] += 1
    return positions, starts


@numba.njit(nogil=True, cache=True)
def _lookup_touch(slots, shift, ids, positions, out, uses, pin, stamp):
    """For i in positions (in order): out[i] = row of ids[i] or -1; touches and pins hits. Returns
    the first position whose id repeats an earlier hit of this call (pin already == stamp), or -1."""
    dup = -1
    n = positions.shape[0]
    for p in range(n):
        if p + AHEAD < n:
            prefetch_slot(slots, shift, ids[positions[p + AHEAD]])
        i = positions[p]
        r = find(slots, shift, ids[i])
        out[i] = r
        if r >= 0:
            touch(uses, r)
            if pin[r] == stamp and dup < 0:
                dup = i
            pin[r] = stamp
    return dup


@numba.njit(nogil=True, cache=True)
def _lookup_gather(slots, shift, ids, data, cols, out, uses, rows):
    """The all-hits fast path of a pull: rows[i] = row of ids[i] (-1 if absent), out[i, :cols] = data[rows[i],
    :cols] and a touch for every id found; returns how many ids were not found (their out rows are left as they
    were).
    Two simple loops (look up all, then copy all) rather than one fused loop: more cache misses overlap. Parts
    run on several threads may touch one row at once: a use may go uncounted, the count never passes the cap."""
    n = ids.shape[0]
    lookup_into(slots, shift, ids, rows)
    misses = 0
    for i in range(n):
        if i + AHEAD < n and rows[i + AHEAD] >= 0:
            prefetch_row(data, rows[i + AHEAD])
        r = rows[i]
        if r < 0:
            misses += 1
            continue
        touch(uses, r)
        for j in range(cols):
            out[i, j] = data[r, j]
    return misses


@numba.njit(nogil=True, cache=True)
def _first_repeat(rows, seen):
    """First position whose row appeared earlier in rows, or -1; seen (one bit per arena row, all clear) is
    left clear. The bitmap is small enough to stay in cache (2M rows: 256 KB)."""
    n = rows.shape[0]
    first = -1
    marked = n
    for i in range(n):
        r = rows[i]
        word, bit = r >> 6, np.uint64(1) << np.uint64(r & 63)
        if seen[word] & bit:
            first, marked = i, i
            break
        seen[word] |= bit
    for k in range(marked):  # every set bit is in a word of rows[:marked]
        seen[rows[k] >> 6] = 0
    return first


@numba.njit(inline="always")
def _ghost_slot(ghost, k):
    """(slot, fingerprint) of id k in the ghost table (a power-of-two length): the slot from the high half of
    mix64(k), the fingerprint from bits 16-31 (the low bits choose the id's shard, ps.sharding); fingerprint 0
    marks an empty slot."""
    h = mix64_scalar(k)
    slot = np.int64(h >> np.uint64(32)) & (ghost.shape[0] - 1)
    fp = np.uint16((h >> np.uint64(16)) & np.uint64(0xFFFF))
    return slot, fp if fp != 0 else np.uint16(1)


@numba.njit(nogil=True, cache=True)
def _probation_victims(queue, slots, shift, uses, pin, stamp, floor, k, out, ghost):
    """Up to k rows of ids in the probation queue, front first, into out (see the module), each id taken put in
    the ghost; returns (count, first entry left). Rows pinned with a stamp >= floor are not taken (floor = stamp:
    only this request's). Entries taken or dropped are consumed; those of rows not taken for their pin are kept
    and moved up to just before the first entry left, in order, so the queue afterwards is
    queue[first entry left:]."""
    n = queue.shape[0]
    kept = np.empty(n, np.uint64)
    nk = 0
    count = 0
    p = 0
    while p < n and count < k:
        if p + AHEAD < n:
            prefetch_slot(slots, shift, queue[p + AHEAD])
        i = queue[p]
        p += 1
        r = find(slots, shift, i)
        if r < 0 or uses[r] >= PROMOTE_USES:
            continue  # no longer in RAM, or used again: off probation
        if pin[r] >= floor:
            kept[nk] = i
            nk += 1
            continue
        out[count] = r
        pin[r] = stamp  # not chosen twice
        count += 1
        slot, fp = _ghost_slot(ghost, i)
        ghost[slot] = fp
    queue[p - nk : p] = kept[:nk]
    return count, p - nk


@numba.njit(nogil=True, cache=True)
def _not_in_ghost(ids, ghost):
    """Which ids the ghost does not remember (they go on probation); the ids it remembers are forgotten there."""
    out = np.ones(ids.shape[0], np.bool_)
    for i in range(ids.shape[0]):
        slot, fp = _ghost_slot(ghost, ids[i])
        if ghost[slot] == fp:
            ghost[slot] = 0
            out[i] = False
    return out


@numba.njit(nogil=True, cache=True)
def _clock_victims(uses, pin, stamp, floor, used, hand, k, out, plain):
    """Up to k rows in [0, used) not pinned with a stamp >= floor, by CLOCK over use counts; returns (count, new
    hand). The hand takes a row whose count is 0 and lowers any other count by one (plain: clears it). USE_CAP + 1
    sweeps at most; it stops early once a whole sweep has passed no row it could take or lower."""
    count = 0
    steps = 0
    idle = 0  # steps since the hand last passed a row that is neither pinned nor free
    while count < k and steps < (USE_CAP + 1) * used and idle < used:
        r = hand
        hand += 1
        if hand >= used:
            hand = 0
        steps += 1
        if pin[r] >= floor or pin[r] < 0:  # pinned by a recent request, or released (free)
            idle += 1
            continue
        idle = 0
        if uses[r]:
            uses[r] = 0 if plain else uses[r] - 1
            continue
        out[count] = r
        pin[r] = stamp  # not chosen twice
        count += 1
    return count, hand


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


class Arena:
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
        self._probation = IdQueue()  # ids on probation, front first (see the module)
        self._ghost = np.zeros(1, dtype=np.uint16)  # fingerprints of ids taken from probation (see the module)
        self._plain_clock = False  # plain CLOCK instead (see the module): tests and benchmarks measure against it
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

    def new_stamp(self) -> int:
        """A pin stamp for a new request: its rows are pinned with it and so never evicted by that request."""
        self._stamp += 1
        return self._stamp

    def lookup(self, ids: np.ndarray, stamp: int) -> tuple[np.ndarray, int]:
        """(row of each id or -1, index of the first repeated hit or -1); hits are touched and pinned."""
        out = np.empty(len(ids), dtype=np.int64)
        slots, shift = self.index.slots, self.index.shift
        k = len(parts(len(ids)))  # split by home slot, not by position: repeats of an id stay in one part
        if k == 1:
            positions, starts = np.arange(len(ids), dtype=np.int64), np.array([0, len(ids)])
        else:
            positions, starts = _group_by_home(ids, shift, k)
        dups = run_each(
            lambda g: _lookup_touch(
                slots, shift, ids, positions[starts[g] : starts[g + 1]], out, self.ref, self.pin, stamp
            ),
            k,
        )  # fmt: skip
        dups = [d for d in dups if d >= 0]
        self._count_lookup(stamp, len(ids))
        return out, min(dups) if dups else -1

    def pin_held(self, rows: np.ndarray, ids: np.ndarray, stamp: int) -> None:
        """Pins with stamp, as a lookup does, each row of rows (-1: none) that still holds its id of ids: a pull's
        hits, copied by gather_hits before the table lock was let go, wait for their push with the rows the pull
        admits. A row given back, freed or reused for another id since is left alone. No use is counted (the
        gather counted one); the ids count in the request's lookups (see the module)."""
        hits = rows >= 0
        at = np.flatnonzero(hits & (rows < self.used))
        r = rows[at]
        held = (self.ids[r] == ids[at]) & (self.pin[r] >= 0)
        self.pin[r[held]] = stamp
        self._count_lookup(stamp, int(np.count_nonzero(hits)))  # every hit, held or not, as a lookup counts it

    def _count_lookup(self, stamp: int, n: int) -> None:
        """Counts n ids looked up by the request of stamp (one entry per request in the recent window)."""
        if self._recent and self._recent[-1][0] == stamp:
            self._recent[-1] = (stamp, self._recent[-1][1] + n)
        else:
            self._recent.append((stamp, n))

    def pushed(self, rows: np.ndarray) -> None:
        """A push has applied rows: they wait for no push any more (see the module); the Table calls this once a
        push is applied (or replayed)."""
        self.pin[rows] = 0
        self._pushed_at = self._stamp

    def _recent_floor(self, stamp: int) -> int:
        """The oldest stamp of the latest lookups before `stamp` whose ids (counted with repeats) add up to at most
        RECENT_SHARE of the rows in use, if a push was applied since it; else (or if the last lookup alone is more)
        stamp itself. Rows pinned from there on wait for their push."""
        room, floor = int(self.used * RECENT_SHARE), stamp
        for s, n in reversed(self._recent):
            if s >= stamp:
                continue
            room -= n
            if room < 0:
                break
            floor = s
        return floor if self._pushed_at >= floor else stamp

    def find_rows(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """(row of each id or -1, how many ids are absent), reading only the index: no row is touched, marked or
        pinned. With first_repeat, the push path's check for rows that are all in RAM (cheaper than lookup, which
        writes to each row's line)."""
        out = np.empty(len(ids), dtype=np.int64)
        slots, shift = self.index.slots, self.index.shift
        return out, sum(run_parts(lambda lo, hi: lookup_into(slots, shift, ids[lo:hi], out[lo:hi]), len(ids)))

    def first_repeat(self, rows: np.ndarray) -> int:
        """First position of rows (all >= 0) whose row appeared earlier in it, or -1."""
        if self._seen is None:  # allocated on the first push after each change of capacity
            self._seen = np.zeros((self.capacity + 63) // 64, dtype=np.uint64)
        return int(_first_repeat(rows, self._seen))

    def gather_hits(self, ids: np.ndarray, cols: int, out: np.ndarray, rows: np.ndarray | None = None) -> int:
        """Copies the first cols floats of every id present into out and touches its row; returns how many ids
        are absent. rows (int64, len(ids)), if given, gets the row of each id (-1 where absent)."""
        slots, shift = self.index.slots, self.index.shift
        rows = np.empty(len(ids), dtype=np.int64) if rows is None else rows
        return sum(run_parts(
            lambda lo, hi: _lookup_gather(slots, shift, ids[lo:hi], self.data, cols, out[lo:hi], self.ref,
                                          rows[lo:hi]),
            len(ids),
        ))  # fmt: skip

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
        to the budget); returns how many. Free rows go first, then rows in use as victims() chooses them; the dirty
        ones are persisted first. The rows in use above used - k move down into the freed places,
        and the arrays (the id index too) shrink to the rows left, so their memory goes back to the OS."""
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
        self._unindex(evicted)
        self.evictions += len(evicted)
        if len(movers):
            self.data[holes] = self.data[movers]  # whole lines: row, lsn, pin and flags
            self.ids[holes] = self.ids[movers]
            self.index.insert(self.ids[holes], holes)
            moved_dirty = holes[self.dirty[holes] == 1]
            if len(moved_dirty):
                self._rescan_from = min(self._rescan_from, int(moved_dirty[0]))
        self.free = np.setdiff1d(self.free, gone)  # all below `left`
        self.used = left
        self._probation.extend(np.zeros(0, dtype=np.uint64), max(MIN_CAPACITY, left))  # its array shrinks too
        self.hand = self.hand if self.hand < left else 0
        self._resize(left)
        self.index.shrink(INDEX_BYTES_PER_ROW * left)  # within the charge of the rows left: its memory goes back
        return k

    def victims(self, n: int, stamp: int) -> np.ndarray:
        """Up to n cold, unpinned rows in use, dirty or not (rows on probation first, then by CLOCK over use
        counts; rows waiting for their push only if no other will do: see the module); they are pinned with stamp
        so they are not reused twice. Fewer than n only when fewer rows in use are neither pinned with stamp nor
        free."""
        out = np.empty(n, dtype=np.int64)
        count = 0
        recent = self._recent_floor(stamp)
        floors = (recent, stamp) if recent < stamp else (stamp,)  # rows waiting for their push go last
        for floor in floors:
            if len(self._probation) and count < n:
                slots, shift = self.index.slots, self.index.shift
                more, first_left = _probation_victims(
                    self._probation.ids, slots, shift, self.ref, self.pin, stamp, floor, n - count, out[count:],
                    self._ghost,
                )  # fmt: skip
                self._probation.take(first_left)
                count += more
            if count < n:
                more, self.hand = _clock_victims(
                    self.ref, self.pin, stamp, floor, self.used, self.hand, n - count, out[count:], self._plain_clock
                )
                count += more
        return out[:count]

    def install(
        self, rows: np.ndarray, ids: np.ndarray, block: np.ndarray, lsn: np.ndarray, stored: np.ndarray, stamp: int
    ) -> None:
        """Puts rows of ids (data, lsn, stored flags) into arena rows (free or evicted ones), unused, on probation
        unless the ghost remembers the id (see the module)."""
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
        self._probation.extend(ids[_not_in_ghost(ids, self._ghost)], keep)

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

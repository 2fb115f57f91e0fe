"""ArenaEviction, the base of ArenaLookups and so of Arena: which rows of a table's RAM tier leave when it needs
rows, and the pins that keep rows in. The attributes declared on the class are set by Arena.__init__
(ps.storage.arena).

Eviction keeps the ids that come back, as CTR ids are Zipf-distributed: most of a request's misses are ids seen
once in a long while, which should leave first, while ids used again should stay. The scheme is S3-FIFO (Yang et
al., SOSP 2023) on arena rows:
- Use count: every lookup, pull gather and push of a row adds one, up to USE_CAP (ps.rows.update.touch; a count
  at the cap is not written, so a hot row's line stays clean).
- Probation: Arena.install gives a row count 0 and puts its id at the back of a FIFO queue; victims() takes rows
  from the front of the queue first. A queued row that has reached PROMOTE_USES uses leaves the queue without being
  taken (in training the admitting request's push is one use, the next request's pull one more), as does an id no
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
All per-row work is in compiled loops.
"""

from __future__ import annotations

import collections

import numba
import numpy as np

from ps.accel.prefetch import AHEAD
from ps.hashing import mix64_scalar
from ps.rows.update import USE_CAP
from ps.storage.idqueue import IdQueue
from ps.storage.index import IdIndex, find, prefetch_slot

PROMOTE_USES = 2  # uses since admission that take a row off probation
RECENT_SHARE = 0.5  # of the rows in use: the latest requests' lookups whose rows wait for their push (see the module)
RECENT_REQUESTS = 64  # latest lookups remembered for that


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
def not_in_ghost(ids: np.ndarray, ghost: np.ndarray) -> np.ndarray:
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


class ArenaEviction:
    """The choice of an arena's victims (see the module), and the stamps and lookups it goes by."""

    used: int  # rows [0, used) are in use
    index: IdIndex  # id -> row
    ref: np.ndarray  # uint8 (capacity,): each row's use count (a view into its line)
    pin: np.ndarray  # int64 (capacity,): each row's pin stamp; 0: pushed since, -1: free (a view into its line)
    hand: int  # the CLOCK hand: the next row it passes
    _probation: IdQueue  # ids on probation, front first
    _ghost: np.ndarray  # uint16: fingerprints of ids taken from probation
    _plain_clock: bool  # plain CLOCK instead: tests and benchmarks measure against it
    _stamp: int  # the latest pin stamp handed out
    _recent: collections.deque  # (stamp, ids looked up) of the latest requests
    _pushed_at: int  # the latest stamp when a push was last applied

    def new_stamp(self) -> int:
        """A pin stamp for a new request: its rows are pinned with it and so never evicted by that request."""
        self._stamp += 1
        return self._stamp

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

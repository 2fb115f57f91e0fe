"""Table: one sparse table of one shard: a bounded RAM Arena in front of the Store, with journaled pushes.

- pull: look the ids up in the arena; misses are read from RocksDB with one multi_get (or initialized from a
  hash of the id when RocksDB has no row) and admitted to RAM, evicting cold rows (dirty ones are written back
  first, in one WriteBatch); then one compiled gather.
- push: resolve rows the same way (a cache fill, no visible change), reject duplicate ids, compute the updated
  rows into a buffer (optimizer step, then statistics and admission, weight clipping; a float32 overflow is
  rejected), append the push to the journal (durable from here on), then scatter the buffer; the rows become
  dirty and carry the push's seq as their lsn. The Shard's flusher writes dirty rows to RocksDB.
- admission: an id's statistics (show, click, last step) count from its first push; it gets a trained row once
  its show count reaches admission.min_count (and then with admission.probability per push). Until then its
  pushes only count, its pulls return the initial value, and RocksDB keeps only its statistics.
- shrink: decay show and click, drop ids past their TTL or under the score threshold, in RAM and RocksDB.
- replay (start-up): journal records after the last flush are applied again to the rows whose lsn is older.
A request bigger than half of what the table may hold is processed in chunks, so it never evicts its own rows.
Thread-safety: one lock per table serializes pull, push, flush, shrink.
"""

from __future__ import annotations

import threading
import time

import numba
import numpy as np

from ps.config import TableConfig
from ps.errors import InvalidArgumentError, ShardClosingError, StorageError
from ps.hashing import mix64_scalar
from ps.rows.finite import first_non_finite_bits
from ps.rows.initializers import init_rows
from ps.rows.layout import ADMITTED, CLICK, LAST_STEP, SHOW, RowLayout
from ps.rows.optim import apply_kernel, get_optimizer
from ps.rows.parallel import run_parts
from ps.rows.rowcopy import gather, gather_for_update
from ps.storage.arena import Arena, MemoryBudget
from ps.storage.journal import Journal, Record
from ps.storage.store import Store

FLUSH_CHUNK_ROWS = 8192  # rows flushed (and shrunk) per hold of the table lock: about 20 ms of RocksDB writes
FLUSH_PAUSE_S = 0.0005  # between two such holds, so a waiting pull or push gets the lock (Python's is not fair)
UPDATE_BLOCK = 256  # rows updated per block: gather, optimizer step and accounting while the block is in cache
BLOCK_FLOATS = 8192  # ... and at most this many floats (32 KB, about L1): wide rows (dense tables) take fewer


@numba.njit(inline="always")
def _block_rows(width):
    return max(1, min(UPDATE_BLOCK, BLOCK_FLOATS // width))


@numba.njit(nogil=True, cache=True)
def _account(data, rows, buf, bits, ids, shows, clicks, step, stats_col, dim, min_count, probability, bound):
    """After the optimizer step in buf: add show/click, stamp the step, decide admission. A row that is not
    admitted gets its old embedding and state back (its pushes only count). Clips admitted embeddings to
    [-bound, bound] if bound > 0. Returns (ids admitted by this push, first row of buf that is not finite or
    -1); bits is buf (C-contiguous) viewed as uint32 (an Inf or NaN has every exponent bit set)."""
    admitted_now = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        show = data[r, stats_col + SHOW] + shows[i]
        admitted = data[r, stats_col + ADMITTED] > 0
        if not admitted and show >= min_count:
            if probability >= 1.0:
                admitted = True
            else:  # a pure function of (id, show): replaying the journal decides the same way
                h = mix64_scalar(ids[i] ^ mix64_scalar(np.uint64(show * 16.0)))
                admitted = np.float64(h >> np.uint64(11)) * (1.0 / 9007199254740992.0) < probability
            if admitted:
                admitted_now += 1
        if admitted:
            if bound > 0:
                for j in range(dim):
                    buf[i, j] = min(max(buf[i, j], -bound), bound)
        else:
            for j in range(stats_col):
                buf[i, j] = data[r, j]
        buf[i, stats_col + SHOW] = show
        buf[i, stats_col + CLICK] = data[r, stats_col + CLICK] + clicks[i]
        buf[i, stats_col + LAST_STEP] = step
        buf[i, stats_col + ADMITTED] = 1.0 if admitted else 0.0
    bad = first_non_finite_bits(bits.reshape(-1))  # one flat loop over the block: per row, the loop's set-up
    return admitted_now, bad if bad < 0 else bad // buf.shape[1]  # cost more than the check (1.5 ms per 100,000)


@numba.njit(nogil=True, cache=True)
def _update(code, params, data, rows, grads, ids, shows, clicks, step, stats_col, dim, min_count, probability,
            bound, buf, bits, lo, hi):  # fmt: skip
    """buf[lo:hi] = rows[lo:hi] of data after one push: optimizer step, then _account, a block of UPDATE_BLOCK
    rows at a time so each block is read from the arena once and then worked on in cache (three passes over a
    100,000-row buffer cost 3x the memory traffic). Returns (ids admitted, first non-finite row or -1)."""
    width = buf.shape[1]
    admitted = 0
    bad = -1
    step_rows = _block_rows(width)
    for b in range(lo, hi, step_rows):
        e = min(hi, b + step_rows)
        gather(data, rows[b:e], width, buf[b:e])
        apply_kernel(code, buf[b:e], grads[b:e], params)
        a, x = _account(
            data, rows[b:e], buf[b:e], bits[b:e], ids[b:e], shows[b:e], clicks[b:e], step, stats_col, dim,
            min_count, probability, bound,
        )  # fmt: skip
        admitted += a
        if bad < 0 and x >= 0:
            bad = b + x
    return admitted, bad


@numba.njit(nogil=True, cache=True)
def _update_in_place(code, params, data, rows, grads, ids, shows, clicks, step, stats_col, dim, min_count,
                     probability, bound, lsn, dirty, stored, ref, seq, undo, undo_lsn, undo_dirty, lo, hi):  # fmt: skip
    """Applies a push to rows[lo:hi] of the arena itself, a block at a time (read the rows, update them in
    cache, write them back: one pass over random memory where computing into a buffer and committing it takes
    two). What it overwrites goes to undo, undo_lsn and undo_dirty, for _restore. The rows become dirty at lsn
    seq and referenced (CLOCK). Returns (ids admitted, change in admitted ids, change in pending ids, first non-finite row or -1)."""
    width = undo.shape[1]
    admitted_col = stats_col + ADMITTED
    block = np.empty((_block_rows(width), width), np.float32)
    bits = block.view(np.uint32)
    admitted = 0
    d_admitted = 0
    d_pending = 0
    bad = -1
    step_rows = _block_rows(width)
    for b in range(lo, hi, step_rows):
        e = min(hi, b + step_rows)
        m = e - b
        gather_for_update(data, rows[:hi], b, e, width, undo[b:e])
        for i in range(m):
            for j in range(width):
                block[i, j] = undo[b + i, j]
        apply_kernel(code, block[:m], grads[b:e], params)
        a, x = _account(
            data, rows[b:e], block[:m], bits[:m], ids[b:e], shows[b:e], clicks[b:e], step, stats_col, dim,
            min_count, probability, bound,
        )  # fmt: skip
        admitted += a
        if bad < 0 and x >= 0:
            bad = b + x
        for i in range(m):
            r = rows[b + i]
            undo_lsn[b + i] = lsn[r]
            undo_dirty[b + i] = dirty[r]
            if stored[r] > 0 or dirty[r] > 0:  # the id existed: it leaves its old count
                if undo[b + i, admitted_col] > 0:
                    d_admitted -= 1
                else:
                    d_pending -= 1
            if block[i, admitted_col] > 0:
                d_admitted += 1
            else:
                d_pending += 1
            for j in range(width):
                data[r, j] = block[i, j]
            lsn[r] = seq
            dirty[r] = 1
            ref[r] = 1
    return admitted, d_admitted, d_pending, bad


@numba.njit(nogil=True, cache=True)
def _restore(data, rows, undo, lsn, dirty, undo_lsn, undo_dirty, lo, hi):
    """Undoes _update_in_place on rows[lo:hi]."""
    width = undo.shape[1]
    for i in range(lo, hi):
        r = rows[i]
        for j in range(width):
            data[r, j] = undo[i, j]
        lsn[r] = undo_lsn[i]
        dirty[r] = undo_dirty[i]


@numba.njit(nogil=True, cache=True)
def _set_lsn(lsn, rows, seq, lo, hi):
    for i in range(lo, hi):
        lsn[rows[i]] = seq


class Table:
    def __init__(self, cfg: TableConfig, store: Store, journal: Journal, budget: MemoryBudget):
        self.cfg = cfg
        self.name = cfg.name
        self.dim = cfg.dim
        self.optimizer = get_optimizer(cfg.optimizer)
        self.layout = RowLayout(cfg.dim, self.optimizer.state_floats(cfg.dim))
        self.width = self.layout.width
        self.stats_col = self.layout.stats_col
        self.store = store
        self.journal = journal
        self.arena = Arena(self.width, budget)
        self.stored_counts = store.counts(cfg.name)  # what RocksDB holds: {"admitted": n, "pending": n}
        self.num_rows = self.stored_counts["admitted"]  # admitted ids (trained rows), in RocksDB or RAM
        self.num_pending = self.stored_counts["pending"]  # ids pushed but not admitted yet
        self.lock = threading.Lock()
        self.closed = False
        self.counters = {
            "pulls": 0, "pushes": 0, "ids_pulled": 0, "ids_pushed": 0, "cache_misses": 0, "admitted": 0, "dropped": 0,
        }  # fmt: skip

    # ---- public API -----------------------------------------------------------------------------------
    def pull(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(n, dim) embeddings of ids (duplicates allowed), in order; into out (n, dim) float32 if given."""
        if out is None:
            out = np.empty((len(ids), self.dim), dtype=np.float32)
        with self.lock:
            self._check_open()
            for lo, hi in self._chunks(len(ids)):
                if self.arena.gather_hits(ids[lo:hi], self.dim, out[lo:hi]):  # some missed: admit them
                    rows = self._resolve(ids[lo:hi], self.arena.new_stamp())
                    gather(self.arena.data, rows, self.dim, out[lo:hi])
            self.counters["pulls"] += 1
            self.counters["ids_pulled"] += len(ids)
        return out

    def push(self, ids: np.ndarray, grads: np.ndarray, shows: np.ndarray, clicks: np.ndarray, step: int,
             origin: tuple[int, int, int] = (0, 0, 0)) -> int:  # fmt: skip
        """Applies one push of unique ids: (n, dim) finite grads, and per id its shows and clicks, at clock
        step; origin (client, client_seq, part) goes into its journal record. Durable on return; returns the
        journal seq. Nothing changes if it is rejected (duplicate ids, a
        result that would not be finite) or the journal cannot be written."""
        ids = np.ascontiguousarray(ids, dtype="<u8")
        grads = np.ascontiguousarray(grads, dtype="<f4")
        shows = np.ascontiguousarray(shows, dtype="<f4")
        clicks = np.ascontiguousarray(clicks, dtype="<f4")
        if len(ids) == 0:
            return 0
        with self.lock:
            self._check_open()
            chunks = list(self._chunks(len(ids)))
            if len(chunks) == 1:  # the common case: all rows fit in RAM at once
                rows = self._rows_for_push(ids)
                seq = self._push_in_place(rows, ids, grads, shows, clicks, step, origin)
                self.counters["pushes"] += 1
                self.counters["ids_pushed"] += len(ids)
                return seq
            if len(chunks) > 1:  # chunks are resolved one by one: find duplicates across all of them first
                _, first, counts = np.unique(ids, return_index=True, return_counts=True)
                if (counts > 1).any():
                    self._raise_duplicate(ids, int(np.setdiff1d(np.arange(len(ids)), first)[0]))
            updates = []  # (lo, hi, rows, new rows, admitted): computed first, committed once journaled
            for lo, hi in chunks:
                rows = self._resolve(ids[lo:hi], self.arena.new_stamp(), reject_duplicates=True)
                buf, admitted, bad = self._updated(rows, ids[lo:hi], grads[lo:hi], shows[lo:hi], clicks[lo:hi], step)
                if bad >= 0:
                    raise InvalidArgumentError(
                        f"push to table {self.name!r} would make the row of id {int(ids[lo + bad])} non-finite "
                        f"(float32 overflow: gradient {grads[lo + bad].tolist()[:8]}); nothing was applied"
                    )
                updates.append((lo, hi, rows, buf, admitted))
            seq = self.journal.append(self.name, ids, grads, shows, clicks, step, origin)
            for lo, hi, rows, buf, admitted in updates:
                if len(updates) > 1:  # an earlier chunk's rows may have been evicted (unchanged) since
                    rows = self._resolve(ids[lo:hi], self.arena.new_stamp())
                self._commit(rows, buf, seq)
                self.counters["admitted"] += admitted
            self.counters["pushes"] += 1
            self.counters["ids_pushed"] += len(ids)
            return seq

    def _push_in_place(self, rows, ids, grads, shows, clicks, step, origin) -> int:
        """Updates the resolved rows in the arena, then journals the push; a rejected update or a failed journal
        write restores every row it touched. Nobody sees the rows in between (the table lock is held), and the
        push is acknowledged only after the journal write, so a crash in between loses nothing acknowledged."""
        a, n, adm, opt = self.arena, len(rows), self.cfg.admission, self.optimizer
        expected = np.uint64(self.journal.next_seq)  # the seq append() gives unless another table appends first
        undo = np.empty((n, self.width), dtype=np.float32)
        undo_lsn, undo_dirty = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint8)
        shows, clicks = np.ascontiguousarray(shows), np.ascontiguousarray(clicks)
        results = run_parts(
            lambda lo, hi: _update_in_place(
                opt.CODE, opt.kernel_params, a.data, rows, grads, ids, shows, clicks, np.float32(step),
                self.stats_col, self.dim, np.float32(adm.min_count), adm.probability,
                np.float32(self.cfg.weight_bound), a.lsn, a.dirty, a.stored, a.ref, expected, undo, undo_lsn, undo_dirty,
                lo, hi,
            ),
            n,
        )  # fmt: skip

        def restore() -> None:
            run_parts(lambda lo, hi: _restore(a.data, rows, undo, a.lsn, a.dirty, undo_lsn, undo_dirty, lo, hi), n)

        bad = min((r[3] for r in results if r[3] >= 0), default=-1)
        if bad >= 0:
            restore()
            raise InvalidArgumentError(
                f"push to table {self.name!r} would make the row of id {int(ids[bad])} non-finite "
                f"(float32 overflow: gradient {grads[bad].tolist()[:8]}); nothing was applied"
            )
        try:
            seq = self.journal.append(self.name, ids, grads, shows, clicks, step, origin)
        except BaseException:
            restore()
            raise
        if seq != expected:
            run_parts(lambda lo, hi: _set_lsn(a.lsn, rows, np.uint64(seq), lo, hi), n)
        self.num_rows += sum(r[1] for r in results)
        self.num_pending += sum(r[2] for r in results)
        self.counters["admitted"] += sum(r[0] for r in results)
        return seq

    def replay(self, record: Record) -> int:
        """Applies a journal record to the rows it has not reached yet (lsn < seq). Returns rows updated."""
        updated = 0
        with self.lock:
            for lo, hi in self._chunks(len(record.ids)):
                ids = record.ids[lo:hi]
                rows = self._resolve(ids, self.arena.new_stamp())
                todo = np.flatnonzero(self.arena.lsn[rows] < np.uint64(record.seq))
                buf, admitted, _ = self._updated(
                    rows[todo], ids[todo], np.ascontiguousarray(record.grads[lo:hi][todo]),
                    record.shows[lo:hi][todo], record.clicks[lo:hi][todo], record.step,
                )  # fmt: skip
                self._commit(rows[todo], buf, record.seq)
                self.counters["admitted"] += admitted
                updated += len(todo)
        return updated

    def flush(self) -> int:
        """Writes every row that is dirty when the scan reaches it to RocksDB; returns rows written."""
        start, written = 0, 0
        while True:
            with self.lock:
                if self.closed:
                    return written
                rows, start = self.arena.collect_dirty(start, FLUSH_CHUNK_ROWS)
                if len(rows):
                    self._persist(rows)
                    written += len(rows)
                if start >= self.arena.used:
                    return written
            time.sleep(FLUSH_PAUSE_S)  # with 65,536-row holds and no pause, pushes waited 180 ms (median) for 2.3 s

    def shrink(self, clock: int, chunk_rows: int = FLUSH_CHUNK_ROWS) -> int:
        """Decays show and click (eviction.decay) and drops ids last pushed more than eviction.ttl_steps before
        `clock` or scoring under eviction.score_threshold, in RocksDB and in RAM. Scans RocksDB in chunks of
        chunk_rows (bounded memory), so call flush() first. Returns the number of ids dropped."""
        ev, sc = self.cfg.eviction, self.stats_col
        after, dropped = None, 0
        while True:
            with self.lock:
                self._check_open()
                got = self.store.scan(self.name, self.width, after, chunk_rows)
                if got is None:
                    return dropped
                ids, rows, lsn, complete, after = got
                in_ram = self.arena.index.lookup(ids)
                ram = in_ram >= 0
                if ram.any():  # RAM is as new as RocksDB or newer
                    rows[ram] = self.arena.data[in_ram[ram], : self.width]
                    lsn[ram] = self.arena.lsn[in_ram[ram]]
                    complete[ram] = rows[ram, sc + ADMITTED] > 0
                rows[:, sc + SHOW] *= ev.decay
                rows[:, sc + CLICK] *= ev.decay
                show, click = rows[:, sc + SHOW], rows[:, sc + CLICK]
                drop = np.zeros(len(ids), dtype=bool)
                if ev.ttl_steps > 0:
                    drop |= rows[:, sc + LAST_STEP] < clock - ev.ttl_steps
                if ev.score_threshold > 0:
                    drop |= (show - click) * ev.nonclk_coeff + click * ev.click_coeff < ev.score_threshold
                self._apply_shrink(ids, rows, lsn, complete, in_ram, drop)
                dropped += int(drop.sum())

    def peek(self, ids: np.ndarray) -> np.ndarray:
        """(n, width) full rows (embedding, optimizer state, statistics), for tests and tools."""
        out = np.empty((len(ids), self.width), dtype=np.float32)
        with self.lock:
            for lo, hi in self._chunks(len(ids)):
                rows = self._resolve(ids[lo:hi], self.arena.new_stamp())
                gather(self.arena.data, rows, self.width, out[lo:hi])
        return out

    def stats(self) -> dict:
        a = self.arena
        return {
            "name": self.name,
            "dim": self.dim,
            "num_rows": self.num_rows,
            "pending_ids": self.num_pending,
            "rows_in_ram": a.used - len(a.free),
            "rows_on_disk": self.stored_counts["admitted"],
            "disk_bytes": self.store.disk_bytes(self.name),
            "dirty_rows": int(np.count_nonzero(a.dirty[: a.used])),
            "evictions": a.evictions,
            "ram_bytes": a.ram_bytes(),
            **self.counters,
        }

    # ---- internals (lock held) ----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ShardClosingError(f"table {self.name!r}: the server is shutting down")

    def _chunks(self, n: int):
        step = self.arena.max_pinnable()
        for lo in range(0, max(n, 1), step):
            yield lo, min(n, lo + step)

    def _raise_duplicate(self, ids: np.ndarray, dup: int):
        first = int(np.flatnonzero(ids == ids[dup])[0])
        raise InvalidArgumentError(
            f"push to table {self.name!r} repeats id {int(ids[dup])} (positions {first} and {dup}); "
            "ids must be unique: sum the gradients of duplicate ids before pushing"
        )

    def _rows_for_push(self, ids: np.ndarray) -> np.ndarray:
        """Arena rows of a push's ids (one chunk), all in RAM; a repeated id raises InvalidArgumentError before
        anything changes. When every id is in RAM already (hot rows) only the index is read: no row's line is
        touched until the update, which marks it referenced; nothing is admitted, so nothing needs pinning."""
        rows, misses = self.arena.find_rows(ids)
        if misses:
            return self._resolve(ids, self.arena.new_stamp(), reject_duplicates=True)
        dup = self.arena.first_repeat(rows)
        if dup >= 0:
            self._raise_duplicate(ids, dup)
        return rows

    def _resolve(self, ids: np.ndarray, stamp: int, reject_duplicates: bool = False) -> np.ndarray:
        """Arena row of each id; admits missing ids to RAM. With reject_duplicates, a repeated id raises
        InvalidArgumentError before anything is admitted."""
        rows, dup = self.arena.lookup(ids, stamp)
        miss = np.flatnonzero(rows < 0)
        missing = first = inverse = None
        if len(miss):
            missing, first, inverse = np.unique(ids[miss], return_index=True, return_inverse=True)
            if len(missing) < len(miss):
                repeated = int(miss[np.setdiff1d(np.arange(len(miss)), first)[0]])
                dup = repeated if dup < 0 else min(dup, repeated)
        if reject_duplicates and dup >= 0:
            self._raise_duplicate(ids, dup)
        if missing is not None:
            rows[miss] = self._admit(missing, stamp)[inverse.ravel()]
            self.counters["cache_misses"] += len(missing)
        return rows

    def _initial(self, ids: np.ndarray) -> np.ndarray:
        """Rows of ids never pushed: initial embedding, initial optimizer state, zero statistics."""
        block = np.zeros((len(ids), self.width), dtype=np.float32)
        init_rows(self.cfg.initializer, ids, block, self.dim)
        self.optimizer.init_state(block[:, : self.stats_col], self.dim)
        return block

    def _admit(self, ids: np.ndarray, stamp: int) -> np.ndarray:
        found, stored_rows, stored_lsn, complete = self.store.get_rows(self.name, ids, self.width)
        block = self._initial(ids)
        lsn = np.zeros(len(ids), dtype=np.uint64)
        where = np.flatnonzero(found)
        full, partial = where[complete], where[~complete]
        block[full] = stored_rows[complete]
        block[partial, self.stats_col :] = stored_rows[~complete, self.stats_col :]
        lsn[where] = stored_lsn
        stored = np.zeros(len(ids), dtype=np.uint8)
        stored[partial], stored[full] = 1, 2
        rows = self._make_room(len(ids), stamp)
        self.arena.install(rows, ids, block, lsn, stored, stamp)
        return rows

    def _make_room(self, n: int, stamp: int) -> np.ndarray:
        rows = self.arena.grow(n, stamp)
        if len(rows) < n:
            victims = self.arena.victims(n - len(rows), stamp)
            if len(victims) < n - len(rows):  # e.g. another table took the budget since this request was chunked
                self.arena.give_back(rows)  # the victims stay as they are: live rows, still indexed
                raise StorageError(f"table {self.name!r}: no evictable rows for {n} ids (RAM tier too small)")
            dirty = victims[self.arena.dirty[victims] == 1]
            if len(dirty):
                self._persist(dirty)
            self.arena.forget(victims)
            rows = np.concatenate([rows, victims])
        return rows

    def _updated(self, rows, ids, grads, shows, clicks, step) -> tuple[np.ndarray, int, int]:
        """(the rows after this push in a new buffer, ids admitted by it, first row that is not finite or -1);
        the arena is untouched."""
        buf = np.empty((len(rows), self.width), dtype=np.float32)
        bits, adm, opt = buf.view(np.uint32), self.cfg.admission, self.optimizer
        shows, clicks = np.ascontiguousarray(shows), np.ascontiguousarray(clicks)

        def part(lo: int, hi: int) -> tuple[int, int]:
            return _update(
                opt.CODE, opt.kernel_params, self.arena.data, rows, grads, ids, shows, clicks, np.float32(step),
                self.stats_col, self.dim, np.float32(adm.min_count), adm.probability,
                np.float32(self.cfg.weight_bound), buf, bits, lo, hi,
            )  # fmt: skip

        results = run_parts(part, len(rows))
        admitted = sum(a for a, _ in results)
        bad = min((b for _, b in results if b >= 0), default=-1)
        return buf, admitted, bad

    def _commit(self, rows: np.ndarray, buf: np.ndarray, seq: int) -> None:
        d_admitted, d_pending = self.arena.commit(rows, buf, seq, self.stats_col + ADMITTED)
        self.num_rows += d_admitted
        self.num_pending += d_pending

    def _counts_after(self, before: np.ndarray, after: np.ndarray) -> dict:
        """Stored counts once rows whose stored flags are `before` are stored as `after` (0/1/2)."""
        c = dict(self.stored_counts)
        c["admitted"] += int(np.count_nonzero(after == 2)) - int(np.count_nonzero(before == 2))
        c["pending"] += int(np.count_nonzero(after == 1)) - int(np.count_nonzero(before == 1))
        return c

    def _persist(self, rows: np.ndarray) -> None:
        """Writes rows (data + lsn) to RocksDB with the new counts, then marks them clean and stored."""
        a = self.arena
        buf = np.empty((len(rows), self.width), dtype=np.float32)
        gather(a.data, rows, self.width, buf)
        complete = buf[:, self.stats_col + ADMITTED] > 0
        after = np.where(complete, 2, 1).astype(np.uint8)
        counts = self._counts_after(a.stored[rows], after)
        self.store.put_rows(self.name, a.ids[rows], buf, a.lsn[rows], complete, counts)
        self.stored_counts = counts
        a.stored[rows] = after
        a.dirty[rows] = 0

    def _apply_shrink(self, ids, rows, lsn, complete, in_ram, drop) -> None:
        """Writes a shrink chunk: decayed rows kept, dropped rows deleted, in RocksDB and RAM."""
        a, keep = self.arena, ~drop
        ram_rows = in_ram[in_ram >= 0]
        before = np.full(len(ids), 0, dtype=np.uint8)
        before[in_ram >= 0] = a.stored[ram_rows]
        before[in_ram < 0] = np.where(complete[in_ram < 0], 2, 1)
        after = np.where(drop, 0, np.where(complete, 2, 1)).astype(np.uint8)
        counts = self._counts_after(before, after)
        self.num_rows -= int(np.count_nonzero(drop & complete))
        self.num_pending -= int(np.count_nonzero(drop & ~complete))
        self.store.put_rows(self.name, ids[keep], rows[keep], lsn[keep], complete[keep], counts, delete=ids[drop])
        self.stored_counts = counts
        kept_ram, dropped_ram = in_ram[keep & (in_ram >= 0)], in_ram[drop & (in_ram >= 0)]
        a.data[kept_ram, : self.width] = rows[keep & (in_ram >= 0)]
        a.stored[kept_ram] = after[keep & (in_ram >= 0)]
        a.dirty[kept_ram] = 0
        if len(dropped_ram):
            a.release(dropped_ram)
        self.counters["dropped"] += int(drop.sum())

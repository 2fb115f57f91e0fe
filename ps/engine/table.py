"""Table: one sparse table of one shard: a bounded RAM Arena in front of the Store, with journaled pushes.

- pull: look the ids up in the arena; misses are admitted to RAM by the table's RowLoader (ps.engine.rowloader:
  read from RocksDB, or initial rows, evicting cold rows), then one compiled gather.
- push: resolve rows the same way (a cache fill, no visible change), reject duplicate ids, update the rows in
  place (ps.rows.update: the push's rule, then statistics and admission, weight clipping) keeping an undo copy,
  then append the push to the journal (durable from here on); a float32 overflow or a failed journal write puts
  the undo copy back. The rows become dirty and carry the push's seq as their lsn. The Shard's flusher writes
  dirty rows to RocksDB (flush, through the table's RowWriter: ps.engine.rowwriter).
- admission: an id's statistics (show, click, last step) count from its first push; it gets a trained row once
  its show count reaches admission.min_count (and then with admission.probability per push). Until then its
  pushes only count, its pulls return the initial value, and RocksDB keeps only its statistics.
- shrink: decay show and click, drop ids past their TTL or under the score threshold (ps.engine.shrinkrule), in
  RAM and RocksDB.
- rules: a push applies its grads by one of ps.rows.update's rules: OPTIMIZE (the table's optimizer step) or
  ADD_DELTA (grads added to the embeddings as they are, the optimizer state untouched but for FTRL's z, set to
  give the new embedding); statistics, admission and clipping apply either way. ADD_DELTA applies no lazy L2, yet
  stamps the rows' last step: the decay a row owed since its previous push is dropped. The journal record keeps
  the rule.
- replay (start-up): journal records after the last flush are applied again, each by its rule, to the rows whose
  lsn is older.
A request bigger than half of what the table may hold is processed in chunks, so it never evicts its own rows; a
push in chunks computes every chunk into a buffer first and puts them into the arena once it is journaled.
Thread-safety: one lock per table serializes pull, push, flush, shrink; a pull of one chunk releases it while it
reads its misses from RocksDB (ps.engine.readahead), and rows written to RocksDB meanwhile are read again under it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from ps.config import TableConfig
from ps.engine.readahead import ReadAheads
from ps.engine.rowloader import RowLoader, raise_duplicate
from ps.engine.rowwriter import RowWriter
from ps.engine.shrinkprogress import ShrinkProgress
from ps.engine.shrinkrule import shrink_chunk
from ps.errors import NOTHING_APPLIED, DataLossError, InvalidArgumentError, ShardClosingError, ShardNeedsRestartError
from ps.rows import update, updateio
from ps.rows.layout import ADMITTED, RowLayout, half_floats_of
from ps.rows.optim import get_optimizer
from ps.rows.rowcopy import gather
from ps.rows.updateio import Push, RowState
from ps.storage.arena import Arena
from ps.storage.budget import MemoryBudget
from ps.storage.foreground import Foreground
from ps.storage.journal import Journal
from ps.storage.journalformat import NO_ORIGIN, Origin, Record
from ps.storage.store import Store

log = logging.getLogger("ps.engine.table")

FLUSH_CHUNK_ROWS = 8192  # rows flushed (and shrunk) per hold of the table lock: short enough not to stall pushes
FLUSH_PAUSE_S = 0.0005  # between two such holds, so a waiting pull or push gets the lock (Python's is not fair)


def rows_text(n: int) -> str:
    """A count of a table's rows (or of several tables') as the shard's log lines say it: "1 row", "1,500 rows"."""
    return f"{n:,} row{'s' * (n != 1)}"


def layout_for(cfg: TableConfig) -> RowLayout:
    """The row layout of a table of cfg: its width, and ram_bytes, the RAM tier's charge for one row. ValueError for
    a values_at_rest other than "float32" and "float16" (an unspecified "" included: TableConfig.as_new)."""
    half_floats = half_floats_of(cfg.dim, cfg.values_at_rest)
    return RowLayout(cfg.dim, get_optimizer(cfg.optimizer).state_floats(cfg.dim), half_floats)


def _check_out(out: np.ndarray, n: int, dim: int, name: str) -> None:
    """InvalidArgumentError, before anything is written, unless out is what a pull of n ids of a table of dim writes
    into: a C-contiguous (n, dim) float32 array (the gather writes rows into its memory and checks nothing)."""
    if out.shape != (n, dim) or out.dtype != np.float32 or not out.flags.c_contiguous:
        order = "C order" if out.flags.c_contiguous else "not C order"
        raise InvalidArgumentError(
            f"a pull of {n:,} ids of table {name!r} (dim {dim}) writes into an out array of shape ({n}, {dim}), "
            f"float32, C order; it got shape {out.shape}, {out.dtype}, {order}; nothing was written into it"
        )


class Table:
    def __init__(self, cfg: TableConfig, store: Store, journal: Journal, budget: MemoryBudget):
        self.cfg = cfg
        self.name = cfg.name
        self.dim = cfg.dim
        self.optimizer = get_optimizer(cfg.optimizer)
        self.layout = layout_for(cfg)
        self.width = self.layout.width
        self.stats_col = self.layout.stats_col
        self.store = store
        self.journal = journal
        self.hyper = {  # rule -> hyper-parameter vector at step 0
            rule: update.hyper_params(self.optimizer, cfg.admission, cfg.weight_bound, l2=cfg.l2, rule=rule)
            for rule in update.RULES.values()
        }
        stored_counts = store.counts(cfg.name)  # what RocksDB holds: {"admitted": n, "pending": n, "trained": b}
        self.reads_ahead = ReadAheads()  # the reads of missing rows in progress without the lock (pull)
        # joins the budget after the counts' read, which can fail (a table whose counts do not read never joins it);
        # the dirty rows the arena gives back are written by the writer, made next
        self.arena = Arena(self.width, budget, lambda rows: self.writer.persist(rows), cfg.name)
        self.writer = RowWriter(self.arena, store, self.stats_col, self.reads_ahead, stored_counts)
        self.num_rows = stored_counts["admitted"]  # admitted ids (trained rows), in RocksDB or RAM
        self.num_pending = stored_counts["pending"]  # ids pushed but not admitted yet
        self.lock = self.arena.lock  # also taken by other tables that take rows back (ps.storage.budget)
        self.closed = False
        self.broken = ""  # why the table refuses every request: a journaled push only partly applied in RAM
        self.replaced = False  # closed because a table of its name and another spec took its place (untrained)
        self.replaced_dims: frozenset[int] = frozenset()  # of the tables of its name this one and those before it
        # replaced since the server started (CreateTable replace_untrained): a push of such a dim says so (ps.service)
        self.counters = {
            "pulls": 0, "pushes": 0, "ids_pulled": 0, "ids_pushed": 0, "cache_misses": 0, "admitted": 0, "dropped": 0,
        }  # fmt: skip
        self.loader = RowLoader(cfg, self.optimizer, self.arena, self.writer, self.counters)  # the miss path

    def count_on(self, old: Table) -> None:
        """Takes over the counts of `old`, the table this one replaces under its name (an untrained table of
        another spec): the counts, which Stats and the metrics' counters report per table name, count from the
        server's start and never go down."""
        self.counters.update(old.counters)  # in place: the loader counts into this dict too
        self.arena.evictions = old.arena.evictions

    @property
    def row_state(self) -> RowState:
        """What the update kernel reads and writes: the arena's arrays, which move when it grows."""
        a = self.arena
        return RowState(a.data, a.lsn, a.dirty, a.stored, a.ref)

    # ---- public API -----------------------------------------------------------------------------------
    def pull(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(n, dim) embeddings of ids (duplicates allowed), in order; into out (n, dim) float32 if given.
        A request of one chunk copies its hits first, then reads its misses from RocksDB without the table lock
        (ps.engine.readahead), so a pull that comes while a push is applied (a worker's prefetch) loads its misses
        meanwhile; back under the lock it admits only the ids that missed, and pins its hits (Arena.pin_held) as a
        lookup would. ids of another integer type are taken as uint64, as a push takes them (the compiled index
        compares uint64 keys)."""
        ids = np.ascontiguousarray(ids, dtype="<u8")
        if out is None:
            out = np.empty((len(ids), self.dim), dtype=np.float32)
        else:
            _check_out(out, len(ids), self.dim, self.name)
        with self.lock:
            self.check_open()
            chunks, ahead = list(self._chunks(len(ids))), None
            if len(chunks) == 1:
                found = np.empty(len(ids), dtype=np.int64)
                if self.arena.gather_hits(ids, self.dim, out, found):  # some missed: read them without the lock
                    ahead = self.reads_ahead.start(ids, found)
            else:
                for lo, hi in chunks:
                    if self.arena.gather_hits(ids[lo:hi], self.dim, out[lo:hi]):  # some missed: admit them
                        rows = self.loader.resolve(ids[lo:hi], self.arena.new_stamp())
                        gather(self.arena.data, rows, self.dim, out[lo:hi])
            if ahead is None:
                self._count_pull(len(ids))
                return out
        try:
            ahead.read(self.store, self.name, self.width)
        except BaseException:
            with self.lock:
                self.reads_ahead.end(ahead)
                self.check_open()  # a read cut short by the shard closing is its error, not the store's
            raise
        with self.lock:
            try:  # the watch ends with the resolve, in one hold: no write goes unseen
                self.check_open()
                # chunked again: other tables may have taken rows back while the lock was out (ps.storage.budget)
                chunks = list(self._chunks(len(ids)))
                if len(chunks) == 1:  # the hits are in `out` already: only the ids that missed are resolved
                    stamp, missed = self.arena.new_stamp(), np.flatnonzero(found < 0)
                    self.arena.pin_held(found, ids, stamp)
                    rows = self.loader.resolve(ids[missed], stamp, ahead=ahead)
                    part = np.empty((len(missed), self.dim), dtype=np.float32)
                    gather(self.arena.data, rows, self.dim, part)
                    out[missed] = part
                else:
                    for lo, hi in chunks:
                        rows = self.loader.resolve(ids[lo:hi], self.arena.new_stamp(), ahead=ahead)
                        gather(self.arena.data, rows, self.dim, out[lo:hi])
            finally:
                self.reads_ahead.end(ahead)
            self._count_pull(len(ids))
        return out

    def _count_pull(self, n: int) -> None:
        self.counters["pulls"] += 1
        self.counters["ids_pulled"] += n

    def push(self, ids: np.ndarray, grads: np.ndarray, shows: np.ndarray, clicks: np.ndarray, step: int,
             origin: Origin = NO_ORIGIN, rule: int = update.OPTIMIZE) -> int:  # fmt: skip
        """Applies one push of unique ids: (n, dim) finite grads, and per id its shows and clicks, at clock
        step, by `rule` (update.OPTIMIZE or update.ADD_DELTA); origin (client, client_seq, part, digest) and the rule go
        into its journal record. Durable on return; returns the journal seq. Nothing changes if it is rejected
        (duplicate ids, a result that would not be finite) or the journal cannot be written. A push of more ids
        than one pass takes (_chunks) is journaled, then applied chunk by chunk: if that fails part way (a RocksDB
        read or write), ShardNeedsRestartError, and the table refuses every request after (`broken`) until a
        restart replays the journal."""
        hyper = self._hyper_of(rule)
        ids = np.ascontiguousarray(ids, dtype="<u8")
        grads = np.ascontiguousarray(grads, dtype="<f4")
        shows = np.ascontiguousarray(shows, dtype="<f4")
        clicks = np.ascontiguousarray(clicks, dtype="<f4")
        if len(ids) == 0:
            return 0
        with self.lock:
            self.check_open()
            chunks = list(self._chunks(len(ids)))
            if len(chunks) == 1:  # the common case: all rows fit in RAM at once
                rows = self._rows_for_push(ids)
                seq = self._push_in_place(rows, Push(ids, rows, grads, shows, clicks), step, origin, rule)
                self.arena.pushed(rows)
                self.counters["pushes"] += 1
                self.counters["ids_pushed"] += len(ids)
                return seq
            # chunks are resolved one by one: find duplicates across all of them first
            _, first, counts = np.unique(ids, return_index=True, return_counts=True)
            if (counts > 1).any():
                raise_duplicate(self.name, ids, int(np.setdiff1d(np.arange(len(ids)), first)[0]))
            hp = update.at_step(hyper, step)
            updates = []  # (lo, hi, new rows, admitted): computed first, committed once journaled
            for lo, hi in chunks:
                rows = self.loader.resolve(ids[lo:hi], self.arena.new_stamp(), reject_duplicates=True)
                push = Push(ids[lo:hi], rows, grads[lo:hi], shows[lo:hi], clicks[lo:hi])
                target = updateio.buffered(hi - lo, self.width)
                out = update.update(hp, push, self.row_state, target)
                if out.first_bad >= 0:
                    self._raise_non_finite(push, out.first_bad, rule)
                updates.append((lo, hi, target.rows, out.admitted))
            seq = self.journal.append(self.name, ids, grads, shows, clicks, step, origin, rule)
            done = 0
            try:
                for lo, hi, buf, admitted in updates:  # an earlier chunk's rows may have been evicted (unchanged)
                    rows = self.loader.resolve(ids[lo:hi], self.arena.new_stamp())  # since: read, evicting others
                    self._commit(rows, buf, seq)
                    self.arena.pushed(rows)
                    self.counters["admitted"] += admitted
                    done = hi
            except Exception as e:  # journaled, partly applied: only a replay of the journal can finish it
                self.broken = (
                    f"push {seq:,} to table {self.name!r} is in the journal, but applying it in RAM failed after "
                    f"{done:,} of its {len(ids):,} ids ({type(e).__name__}: {e}). Restart the server: its journal "
                    "replays the push whole; until then it takes no requests"
                )
                raise ShardNeedsRestartError(self.broken) from e
            self.counters["pushes"] += 1
            self.counters["ids_pushed"] += len(ids)
            return seq

    def _push_in_place(self, rows, push: Push, step: int, origin, rule: int) -> int:
        """Updates the resolved rows in the arena by the rule, then journals the push; a rejected update or a
        failed journal write restores every row it touched. Nobody sees the rows in between (the table lock is
        held), and the push is acknowledged only after the journal write, so a crash in between loses nothing
        acknowledged."""
        expected = self.journal.next_seq  # the seq append() gives unless another table appends first
        target = updateio.in_place(len(rows), self.width, expected)
        out = update.update(update.at_step(self.hyper[rule], step), push, self.row_state, target)
        if out.first_bad >= 0:
            update.undo(self.row_state, rows, target)
            self._raise_non_finite(push, out.first_bad, rule)
        try:
            seq = self.journal.append(self.name, push.ids, push.grads, push.shows, push.clicks, step, origin, rule)
        except BaseException:
            update.undo(self.row_state, rows, target)
            raise
        if seq != expected:
            update.restamp(self.row_state, rows, seq)
        self.num_rows += out.d_admitted
        self.num_pending += out.d_pending
        self.counters["admitted"] += out.admitted
        return seq

    def replay(self, record: Record) -> int:
        """Applies a journal record, by its rule, to the rows it has not reached yet (lsn < seq). Returns rows
        updated. DataLossError, changing nothing, for a rule that is not one of ps.rows.update's or grads of
        another dim than the table's (the update kernel checks no bounds). It moves num_rows and num_pending, and
        none of `counters` (counts since the server started: the run that journaled the push counted its ids
        pushed and admitted)."""
        if record.rule not in self.hyper:
            raise DataLossError(
                f"journal record {record.seq} (table {self.name!r}) has push rule {record.rule}, which is none of "
                f"{sorted(update.RULES.values())} ({', '.join(update.RULES)}): restore the dir from a backup or "
                "checkpoint"
            )
        if record.grads.shape[1] != self.dim:
            raise DataLossError(
                f"journal record {record.seq} (table {self.name!r}) holds grads of dim {record.grads.shape[1]}, where "
                f"the table's dim is {self.dim}: the journal does not match RocksDB's tables; restore the dir from a "
                "backup or checkpoint"
            )
        updated = 0
        hp = update.at_step(self.hyper[record.rule], record.step)
        with self.lock:
            for lo, hi in self._chunks(len(record.ids)):
                rows = self.loader.resolve(record.ids[lo:hi], self.arena.new_stamp())
                todo = np.flatnonzero(self.arena.lsn[rows] < np.uint64(record.seq))
                push = Push(
                    record.ids[lo:hi][todo], rows[todo], np.ascontiguousarray(record.grads[lo:hi][todo]),
                    record.shows[lo:hi][todo], record.clicks[lo:hi][todo],
                )  # fmt: skip
                # in place: the record was accepted when it was journaled, so the same step on the same rows is too
                out = update.update(hp, push, self.row_state, updateio.in_place(len(todo), self.width, record.seq))
                self.arena.pushed(rows)
                self.num_rows += out.d_admitted
                self.num_pending += out.d_pending
                updated += len(todo)
        return updated

    def flush(self, yield_to: Foreground | None = None, urgent: Callable[[], bool] = lambda: False) -> int:
        """Writes every row that is dirty when the scan reaches it to RocksDB; returns rows written.
        ShardNeedsRestartError once the table is broken (a flush that went on would let the journal be trimmed of
        the push RAM holds only part of). yield_to: before writing a chunk, wait for a moment without requests
        there (Foreground.wait_for_idle, with urgent: a chunk's write holds Python's lock, and would stall them);
        a chunk with no dirty row waits for nothing."""
        start, written, ready = 0, 0, yield_to is None
        while True:
            with self.lock:
                if self.broken:
                    raise ShardNeedsRestartError(self.broken)
                if self.closed:
                    return written
                rows, end = self.arena.collect_dirty(start, FLUSH_CHUNK_ROWS)
                wait = len(rows) > 0 and not ready  # first a moment without requests, then this chunk collected again
                if wait:  # collected again from its first row: it may lie below start (dirty rows moved down by
                    start = min(start, int(rows[0]))  # give_up, which this call took the arena's note of)
                else:
                    if len(rows):
                        self.writer.persist(rows)
                        written += len(rows)
                    if end >= self.arena.used:
                        return written
                    start = end
            if wait:
                yield_to.wait_for_idle(urgent)
            else:  # without a pause, this thread would take the lock back before a waiting push
                time.sleep(FLUSH_PAUSE_S)
            ready = wait or yield_to is None

    @property
    def shrink_rows(self) -> int:
        """The rows (and pending ids) a Shrink scans, as the table holds them: 0 with no rule on (shrink skips it)."""
        return 0 if self.cfg.eviction.is_off else self.num_rows + self.num_pending

    def shrink(self, clock: int, progress: ShrinkProgress, chunk_rows: int = FLUSH_CHUNK_ROWS) -> None:
        """Decays show and click (eviction.decay) and drops ids last pushed more than eviction.ttl_steps before
        `clock` or scoring under eviction.score_threshold, in RocksDB and in RAM. Scans RocksDB in chunks of
        chunk_rows (bounded memory), so call flush() first. Each chunk written is told to progress
        (ShrinkProgress.wrote: rows rewritten and ids dropped), and each chunk read (ShrinkProgress.scanned, which
        logs the Shrink's progress now and then). A row pushed since the last flush (its lsn past the
        store's flushed seq) is kept, decayed, until a later shrink: a drop is not journaled, so after a crash the
        journal's replay of that push would bring the row back (with the push under any later one). Only what
        changes is written: with decay 1 the kept rows stay as they are, and a table with no rule on is not
        scanned at all. Once the scan ends, or a chunk fails, the RAM rows of the ids dropped go back to the budget
        (Arena.return_free), for any table to take; where that fails too after a chunk failed, it is logged and the
        chunk's error propagates."""
        if self.cfg.eviction.is_off:
            return
        try:
            self._shrink_chunks(clock, progress, chunk_rows)
        except BaseException:
            with self.lock:
                try:
                    self.arena.return_free()  # the rows the chunks written before dropped
                except Exception:
                    log.exception("table %r: giving the RAM rows a failed Shrink dropped back failed", self.name)
            raise
        with self.lock:
            self.arena.return_free()  # the RAM of the rows dropped, for any table to take

    def _shrink_chunks(self, clock: int, progress: ShrinkProgress, chunk_rows: int) -> None:
        """shrink's scan: each chunk read, ruled and written, under the lock. A table replaced since the Shrink
        listed it (CreateTable's replace_untrained) is done: it was never trained, and the Shrink of the other
        tables goes on."""
        after = None
        while True:
            with self.lock:
                if self.replaced:  # only a table never trained is replaced: RocksDB holds nothing of it to shrink
                    return
                self.check_open()
                got = self.store.scan(self.name, self.width, after, chunk_rows)
                if got is None:
                    return
                ids, rows, lsn, complete, after = got
                in_ram = self.arena.index.lookup(ids)
                ram = in_ram >= 0
                if ram.any():  # RAM is as new as RocksDB or newer
                    rows[ram] = self.arena.data[in_ram[ram], : self.width]
                    lsn[ram] = self.arena.lsn[in_ram[ram]]
                    complete[ram] = rows[ram, self.stats_col + ADMITTED] > 0
                flushed = self.store.meta.flushed_seq()
                drop, written = shrink_chunk(self.cfg.eviction, self.stats_col, rows, lsn, clock, flushed)
                if drop.any() or written.any():  # else the chunk is as it was: not even its counts are written
                    self.writer.write_shrink(ids, rows, lsn, complete, in_ram, drop, written)
                    self.num_rows -= int(np.count_nonzero(drop & complete))  # once written: a failed write drops none
                    self.num_pending -= int(np.count_nonzero(drop & ~complete))
                    self.counters["dropped"] += int(drop.sum())
                    progress.wrote(self.name, int(np.count_nonzero(written)), int(drop.sum()))
            progress.scanned(self.name, len(ids))  # once the lock is released: a stalled log stalls no push

    def peek(self, ids: np.ndarray) -> np.ndarray:
        """(n, width) full rows (embedding, optimizer state, statistics), for tests and tools."""
        ids = np.ascontiguousarray(ids, dtype="<u8")
        out = np.empty((len(ids), self.width), dtype=np.float32)
        with self.lock:
            for lo, hi in self._chunks(len(ids)):
                rows = self.loader.resolve(ids[lo:hi], self.arena.new_stamp())
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
            "rows_on_disk": self.writer.stored_counts["admitted"],
            "disk_bytes": self.store.disk_bytes(self.name),
            "dirty_rows": int(np.count_nonzero(a.dirty[: a.used])),
            "evictions": a.evictions,
            "ram_bytes": a.ram_bytes(),
            **self.counters,
            "trained": self.trained,
        }

    def check_open(self) -> None:
        """Refuses a request to this table once it is replaced (ShardClosingError, UNAVAILABLE: sent again, the
        request goes to the table that took its place), closed (ShardClosingError) or broken (ShardNeedsRestartError).
        Called with the lock held by the table's own reads and writes, and without it by Shard.check_push, whose
        answer a replace right after it does not change."""
        if self.replaced:  # UNAVAILABLE: the client sends it again, to the table that took its place
            raise ShardClosingError(f"table {self.name!r} was replaced just now by a table of its name and another "
                                    "spec; send the request again")  # fmt: skip
        if self.closed:
            raise ShardClosingError(f"table {self.name!r}: the server is shutting down")
        if self.broken:
            raise ShardNeedsRestartError(self.broken)

    # ---- internals (lock held) ----------------------------------------------------------------------
    def _hyper_of(self, rule: int) -> np.ndarray:
        """The step-0 hyper-parameter vector of a push rule; InvalidArgumentError for an unknown rule."""
        hp = self.hyper.get(rule)
        if hp is None:
            raise InvalidArgumentError(f"push rule {rule} is unknown; expected one of {update.RULES}")
        return hp

    def _chunks(self, n: int):
        step = self.arena.max_pinnable()
        for lo in range(0, max(n, 1), step):
            yield lo, min(n, lo + step)

    def _raise_non_finite(self, push: Push, bad: int, rule: int):
        """Refuses a push whose update of its row `bad` (the arena row as before the push) is not finite."""
        grad = push.grads[bad]
        cause = "float32 overflow"
        if rule == update.OPTIMIZE:
            cause = self.optimizer.non_finite_cause(self.row_state.data[push.rows[bad]], grad)
        raise InvalidArgumentError(
            f"push to table {self.name!r} would make the row of id {int(push.ids[bad])} non-finite "
            f"(gradient {grad.tolist()[:8]}): {cause}; {NOTHING_APPLIED}"
        )

    def _rows_for_push(self, ids: np.ndarray) -> np.ndarray:
        """Arena rows of a push's ids (one chunk), all in RAM; a repeated id raises InvalidArgumentError before
        anything changes. When every id is in RAM already (hot rows) only the index is read: no row's line is
        touched until the update, which counts a use of it; nothing is admitted, so nothing needs pinning."""
        rows, misses = self.arena.find_rows(ids)
        if misses:
            return self.loader.resolve(ids, self.arena.new_stamp(), reject_duplicates=True)
        dup = self.arena.first_repeat(rows)
        if dup >= 0:
            raise_duplicate(self.name, ids, dup)
        return rows

    def _commit(self, rows: np.ndarray, buf: np.ndarray, seq: int) -> None:
        d_admitted, d_pending = update.commit(self.row_state, rows, buf, seq)
        self.num_rows += d_admitted
        self.num_pending += d_pending

    @property
    def trained(self) -> bool:
        """Whether ids were ever pushed to this table on this shard: it holds a row or a pending id (in RAM or
        RocksDB), or RocksDB's counts say it did before a Shrink dropped them."""
        return bool(self.num_rows or self.num_pending or self.writer.stored_counts["trained"])

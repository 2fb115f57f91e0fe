"""Shard: everything one parameter-server process holds (Store, Journal, Tables, flusher), minus gRPC.

Each method validates its whole request before touching state and raises ps.errors exceptions, which the
service maps to gRPC status codes. Ownership: a shard accepts only ids whose slot it owns (ps.sharding).

A push (ps.engine.push.TablePush) is a table name, ids, grads, shows, clicks and add_delta: grads go through the
table's optimizer, or with add_delta true are added to the embeddings as they are (ps.rows.update's ADD_DELTA rule:
the optimizer state is untouched, FTRL's z aside, set to give the new embedding; shows, clicks, admission and
weight clipping apply as usual). Its journal record keeps the rule.

The clock and a PushBatch's exactly-once bookkeeping (the clients' newest requests, their clock advances, one
request of a client at a time) are ps.engine.pushpath's, one PushPath per shard (Shard.pushes); a Pull's and a
PullBatch's checks and reads are ps.engine.pullpath's, one PullPath per shard (Shard.pulls).

Training jobs (stamped requests: the job a shard follows, its worker clocks, sync steps) are ps.engine.jobs's, one
JobClocks per shard (Shard.jobs; its job and clocks: ps.engine.followedjob); push_stamped is a stamped PushBatch
(ps.engine.stampedpush, one StampedPushes per shard: Shard.stamped), create_table with a stamp a stamped
CreateTable. Checkpoints (hold, save, release) are ps.engine.checkpointing's, one ShardCheckpoints per shard, whose
push gate every push passes through. What the shard reports of itself besides its tables is ps.engine.shardstats's;
the last steps of its close are ps.engine.closing's.

Durability: a push is appended to the journal before it is applied and acknowledged. The flusher thread
(ps.engine.flusher) writes dirty rows to RocksDB every flush_interval_s (or once the journal has grown by
journal_flush_bytes), records the journal position they cover, and deletes the journal segments below it.
Start-up (ps.engine.opening) replays what is left; a clean close flushes everything.

What stops the shard taking writes until a restart (its data dir or journal segment deleted under it, a push
applied in part: broken), and the listeners told then, are ps.engine.writeguard's, one WriteGuard per shard
(Shard.guard).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from ps.config import TableConfig, check_table_name
from ps.engine.checkpointing import ShardCheckpoints
from ps.engine.closing import close_data_dir
from ps.engine.flusher import Flusher
from ps.engine.jobs import JobClocks
from ps.engine.opening import (
    check_data_dir,
    check_store,
    clear_frames,
    close_after_failed_start,
    failed_start_error,
    new_budget,
    open_journal,
    open_store,
    open_tables,
    replay,
)
from ps.engine.pullpath import PullPath
from ps.engine.push import CheckedPush, TablePush, as_pushes
from ps.engine.pushpath import PushPath
from ps.engine.room import RequestRoom, push_cost
from ps.engine.shardstats import describe_start, health_stats, memory_stats, restore_stats
from ps.engine.shrinkprogress import ShrinkProgress, ShrinkRunning
from ps.engine.stampedpush import StampedPushes
from ps.engine.startup import StartProgress
from ps.engine.table import Table
from ps.engine.tablemaker import TableMaker
from ps.engine.writeguard import WriteGuard
from ps.errors import (
    InvalidArgumentError,
    ModelStateReplacedError,
    PsError,
    ShardNeedsRestartError,
    TableNotFoundError,
    WrongShardError,
    echo,
)
from ps.replacedstate import PUSH_REFUSED, StateReplacedWords, how_replaced, model_state_replaced
from ps.rows.pushcheck import MAX_COUNT_PER_ID, check_push_values
from ps.rows.update import ADD_DELTA, OPTIMIZE
from ps.server_config import ServerConfig
from ps.sharding import NUM_SLOTS, SlotMap
from ps.stamp import WorkerStamp
from ps.storage.diskspace import measure
from ps.storage.journalformat import NO_ORIGIN, Origin
from ps.storage.memory import plan_memory
from ps.storage.meta import STATE_ID_BITS

log = logging.getLogger("ps.engine.shard")


class Shard:
    def __init__(self, config: ServerConfig, progress: StartProgress | None = None):
        """Opens (or restores into, with config.restore_dir) the data dir, replays its journal and starts the
        flusher. A dir that cannot be served raises a ps.errors error (DataLossError for lost writes; a StorageError
        naming the dir for any other failure) and leaves nothing open; ValueError if the cache does not fit.
        progress: told each phase as it begins; a stop asked of it raises StartStopped at the next safe point
        (ps.engine.startup), with nothing left open."""
        config.validate()
        self._progress = progress = progress if progress is not None else StartProgress()
        self.config = config
        self.shard_id = config.shard_id
        self.num_shards = config.num_shards
        self.slot_map = SlotMap.contiguous(config.num_shards)
        self.memory = plan_memory(config.memory_bytes, config.cache_bytes)  # ValueError: cache does not fit
        self.room = RequestRoom(self.memory.request_bytes, self.memory.memory_bytes or 0)  # taken per pull and push
        progress.enter("checking")
        manifest = check_data_dir(config, self.memory)
        progress.enter("opening")
        self.store = open_store(config, self.memory)
        try:
            self._start(manifest)
        except BaseException as e:  # the error raised is left bound to no local: its traceback holds this frame, and
            # the cycle would keep it, its frames and what they hold alive until a garbage collection
            close_after_failed_start(config.data_dir, self.store, getattr(self, "journal", None))
            clear_frames(e)
            error = failed_start_error(e, config.data_dir)
            if error is None:
                raise
            try:
                raise error from e
            finally:  # error's traceback holds this frame: bound to a local here, it would make the cycle above
                del error
        self.checkpoints = ShardCheckpoints(config, self.store, lambda: self.flush(), lambda: self.clock)  # hold, save
        self.pulls = PullPath(self.room, self.store.foreground, lambda ids: self.check_owned(ids))
        self.stamped = StampedPushes(self.jobs, self.pushes, self.room, self.checkpoints.gate,
                                     lambda name: self.table(name), lambda push, table: self.check_push(push, table),
                                     lambda *batch: self.push_batch(*batch))  # fmt: skip
        self._journal_mark = self.journal.bytes_written
        self.journal.on_lost = self.guard.on_lost  # the guard's listeners are told once the data dir is found lost
        self.flusher.start()
        self.started = time.monotonic()

    def _start(self, manifest: dict | None) -> None:
        """The start once RocksDB is open: its checks (and the restore), the journal and the tables, the clients'
        requests and the journal replay, the job clocks; the cluster's name recorded last (a start refused before
        leaves it unnamed)."""
        config = self.config
        self.store.meta.check_identity(config.shard_id, config.num_shards)
        unnamed = self.store.meta.check_cluster(config.cluster)  # recorded last: a start refused leaves the dir unnamed
        self.restored_now, stored = check_store(self.store, config, self.memory, manifest, self._progress)
        self.budget = new_budget(self.memory)
        self.journal = open_journal(config, self.memory)
        self.guard = WriteGuard(self.shard_id, self.journal, lambda: self.flusher.wake())  # refuses writes once lost
        self.shrink_running = ShrinkRunning(self.shard_id)  # one Shrink at a time
        self.tables: dict[str, Table] = open_tables(self.store, self.journal, self.budget, stored)
        self._maker = TableMaker(self.shard_id, self.tables, self.store, self.journal, self.budget)
        self._lock = threading.Lock()
        self.flusher = Flusher(lambda background: self.flush(background), config.flush_interval_s, self.journal,
                               lambda: self.guard.broken, config.data_dir)  # fmt: skip
        self._load_requests()
        self.jobs = JobClocks(self.shard_id, lambda client: self.journal.applied.get(client, (0, 0))[0],
                              config.threads, MAX_COUNT_PER_ID,
                              done_store=(self.store.meta.job_done, self.store.meta.set_job_done),
                              sync_step_bytes=self.memory.sync_step_bytes,
                              held_s=lambda now: self.checkpoints.gate.held_s(now))  # fmt: skip
        if unnamed:
            self.store.meta.record_cluster(config.cluster)
        self.state_id = self.store.meta.state_id()  # drawn for a new dir, and again by a restore

    @property
    def saving_checkpoint(self) -> bool:
        """Whether a checkpoint save runs now (no lock taken: safe in a signal handler)."""
        return self.checkpoints.gate.save_running

    def describe_start(self) -> str:
        """What the data dir held at start, for the server's first line: "new, no tables", or the tables with their
        rows and the clock (ps.engine.shardstats.describe_start)."""
        return describe_start(self.store, self.config.restore_dir if self.restored_now else "", self.tables, self.clock)

    def _load_requests(self) -> None:
        """Reads the clock and the clients' applied requests (the push path's, with its advance notes), then replays
        the journal past what RocksDB holds."""
        clock, notes = self.store.meta.clock(), self.store.meta.advanced()  # before the replay's flush
        self.journal.applied.load(self.store.meta.applied())  # client requests applied before the last flush
        self.pushes = PushPath(self.shard_id, self._lock, self.store, self.journal, self.room,
                               lambda push, table: self.check_push(push, table),
                               lambda checked, origin: self.apply_push(checked, origin), clock, notes)  # fmt: skip
        records, step = replay(self.store, self.journal, self.tables, self._progress, self.config.accept_journal_loss)
        self.pushes.replayed_to(step)
        if records or self.journal.losses:  # flushed at once: the next start does not find them again
            self._progress.enter("flushing")
            self.flush()
        self.pushes.note_advanced()

    @property
    def clock(self) -> int:
        """The shard's clock (PushPath's: moved by PushBatches' advances and AdvanceClock)."""
        return self.pushes.clock

    # ---- tables ---------------------------------------------------------------------------------------
    def create_table(
        self, cfg: TableConfig, replace_untrained: bool = False, stamp: WorkerStamp | None = None
    ) -> Table:
        """Creates the table, or returns the existing one if its config is the same (TableExistsError if not); a
        table made (or replaced) must pass ps.newtable.check_new too (InvalidArgumentError).
        replace_untrained: an existing table of another config that was never trained (Table.trained: no id ever
        pushed to it on this shard) is replaced by a new one of cfg (the rows a pull put in its RAM tier, its
        initial rows, go with it); one that was trained is refused (TableExistsError).
        stamp: a training job's worker creates its job's tables (ps.engine.jobs: JobClocks.check with create,
        then created): refused while the shard holds another job (JobConflictError, nothing created); once
        created, the job holds the shard as after its first push. A create that fails leaves the job's tenancy as it
        was. Without a stamp, a replace is refused while the shard holds a job (JobClocks.check_replace: its tables)."""
        self.guard.refuse_if_lost()
        claimed = stamp is not None and self.jobs.check(stamp, pull=False, create=True)
        try:
            table = self._create_table(cfg, replace_untrained, stamp is not None)
        except BaseException:
            if claimed:
                self.jobs.release(stamp)
            raise
        if stamp is not None:
            self.jobs.created(stamp, claimed)
        return table

    def _create_table(self, cfg: TableConfig, replace_untrained: bool, stamped: bool) -> Table:
        cfg = cfg.normalized()
        with self._lock:
            table, made = self._maker.create(cfg, replace_untrained, None if stamped else self.jobs.check_replace)
        if made:
            log.info("%s", made)  # once the lock is released: a stalled log stalls no push waiting for it
        return table

    def check_create(
        self, cfg: TableConfig, replace_untrained: bool = False, stamp: WorkerStamp | None = None
    ) -> tuple[TableConfig, int, int]:
        """What create_table(cfg, replace_untrained, stamp) would answer, changing no table: (config, trained rows,
        row floats) of the table it would return, or the error it would raise (all but a failed RocksDB write's),
        so that a client can check every shard before it creates the table on any. A stamp is checked as the
        create checks it (refused while another job holds the shard), and holds nothing: no claim, no tenancy
        lasting for it, no worker's token taken (JobClocks.check's check_only); but a stamp whose worker count or
        setup differs from its job's stops that job, as the create would (that worker exits without a stop stamp:
        this is how the job's other workers learn why)."""
        self.guard.refuse_if_lost()
        if stamp is not None:
            self.jobs.check(stamp, pull=False, create=True, check_only=True)
        cfg = cfg.normalized()
        with self._lock:
            return self._maker.check_create(
                cfg, replace_untrained, None if stamp is not None else self.jobs.check_replace
            )

    def table(self, name: str) -> Table:
        table = self.tables.get(name)
        if table is None:
            check_table_name(name)  # a name no table may have is refused as invalid, not as missing
            names = sorted(self.tables)
            known = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
            raise TableNotFoundError(
                f"table {echo(name)} does not exist on shard {self.shard_id} (tables: {known or 'none'})"
            )
        return table

    def check_owned(self, ids: np.ndarray) -> None:
        """WrongShardError naming the first id this shard does not own."""
        if self.num_shards == 1:
            return
        owners = self.slot_map.shard_of(ids)
        wrong = np.flatnonzero(owners != self.shard_id)
        if len(wrong):
            i = int(wrong[0])
            raise WrongShardError(
                f"{len(wrong)} of {len(ids)} ids belong to other shards, e.g. id {int(ids[i])} (position {i}) "
                f"belongs to shard {int(owners[i])} of {self.num_shards}, this is shard {self.shard_id}; "
                "check the order and number of servers the client was given"
            )

    # ---- data -----------------------------------------------------------------------------------------
    def pull(
        self,
        name: str,
        ids: np.ndarray,
        out: np.ndarray | Callable[[int, int], np.ndarray] | None = None,
        caller_gone: Callable[[], bool] | None = None,
        cost: int | None = None,
    ) -> np.ndarray:
        """(n, dim) embeddings of ids, written into out if given: PullPath.pull (Shard.pulls) says how. The library's
        entry point (tests, benchmarks); the servicer calls Shard.pulls itself."""
        return self.pulls.pull(self.table(name), ids, out, caller_gone, cost)

    def check_push(self, push: TablePush, table: Table | None = None) -> CheckedPush:
        """Validates a push without changing anything; returns it checked, for apply_push. shows / clicks: per id
        (n,) float32, finite, >= 0 and <= MAX_COUNT_PER_ID, each id's clicks <= its shows; None: 1 show and 0 clicks
        per id. add_delta: grads are deltas added to the embeddings (see the module docstring). table: the Table
        the caller looked push.name up as (ps.service: the one it checked the push's dim against and reads rows
        back from), which the push goes to: one replaced or closed since it was looked up is refused here
        (ShardClosingError, UNAVAILABLE: Table.check_open), and one replaced after this check refuses the push when
        applied (Table.push); None: looked up here."""
        name, ids, grads = push.name, push.ids, push.grads
        if table is None:
            table = self.table(name)
        else:
            table.check_open()
        if grads.shape != (len(ids), table.dim):
            raise InvalidArgumentError(
                f"grads for table {name!r} have shape {grads.shape}, expected ({len(ids)}, {table.dim})"
            )
        check_push_values(name, ids, grads, push.shows, push.clicks)
        shows = np.ones(len(ids), dtype=np.float32) if push.shows is None else push.shows
        clicks = np.zeros(len(ids), dtype=np.float32) if push.clicks is None else push.clicks
        self.check_owned(ids)
        rule = ADD_DELTA if push.add_delta else OPTIMIZE
        return CheckedPush(table=table, ids=ids, grads=grads, shows=shows, clicks=clicks, rule=rule)

    def apply_push(self, checked: CheckedPush, origin: Origin = NO_ORIGIN) -> None:
        """Applies a push that check_push accepted (applied in RAM by its rule, journaled with its origin and
        rule). A push journaled but only partly applied (ShardNeedsRestartError) breaks the shard
        (WriteGuard.mark_broken)."""
        c = checked
        try:
            with self.store.foreground.serving():
                c.table.push(c.ids, c.grads, c.shows, c.clicks, self.clock, origin, c.rule)
        except ShardNeedsRestartError as e:
            self.guard.mark_broken(str(e))
            raise
        if self.journal.bytes_written - self._journal_mark >= self.config.journal_flush_bytes:
            self.flusher.wake()

    def push(
        self,
        name: str,
        ids: np.ndarray,
        grads: np.ndarray,
        shows: np.ndarray | None = None,
        clicks: np.ndarray | None = None,
        add_delta: bool = False,
        caller_gone: Callable[[], bool] | None = None,
        table: Table | None = None,
    ) -> None:
        """shows / clicks: per id (n,) float32, finite, >= 0 and <= MAX_COUNT_PER_ID, clicks <= shows; None: 1 show
        and 0 clicks per id. add_delta: grads are deltas added to the embeddings (see the module docstring).
        caller_gone: as pull's. table: the Table looked up as name, as check_push takes it."""
        push = TablePush(name=name, ids=ids, grads=grads, shows=shows, clicks=clicks, add_delta=add_delta)
        self.guard.refuse_if_lost()
        with self.checkpoints.gate.push_gate():
            checked = self.check_push(push, table)
            cost = push_cost(len(checked.ids), checked.table.width)
            self.room.refuse_larger(cost, len(checked.ids), f"a Push of {len(checked.ids):,} ids to table {name!r}")
            with self.room.take(cost, caller_gone):
                self.apply_push(checked)

    def push_batch(
        self,
        pushes: Sequence[TablePush | tuple],
        advance_clock: int = 0,
        client: int = 0,
        client_seq: int = 0,
        caller_gone: Callable[[], bool] | None = None,
        shared: bool = False,
        tables: Sequence[Table] | None = None,
    ) -> tuple[int, int]:
        """Several pushes of one request (TablePushes, or tuples in its field order: ps.engine.push.as_pushes), then
        the clock advanced, applied exactly once per (client, client_seq) under the checkpoint hold's gate;
        returns (clock, pushes applied now): ps.engine.pushpath's PushPath.push_batch says how (shared: a key any
        caller sends; tables: the Table of each push, as check_push takes it)."""
        self.guard.refuse_if_lost()
        with self.checkpoints.gate.push_gate():
            return self.pushes.push_batch(as_pushes(pushes), advance_clock, client, client_seq, caller_gone,
                                          shared=shared, tables=tables)  # fmt: skip

    # ---- stamped pushes (ps.engine.stampedpush) ---------------------------------------------------------
    def push_stamped(
        self,
        pushes: Sequence[TablePush | tuple],
        advance_clock: int,
        client: int,
        client_seq: int,
        stamp: WorkerStamp,
        caller_gone: Callable[[], bool] | None = None,
        shared: bool = False,
        tables: Sequence[Table] | None = None,
    ) -> tuple:
        """A PushBatch of a job's worker, once the guard's refuse_if_lost has passed: StampedPushes.push says how.
        Returns (clock, ids applied by this request, min_clock). pushes, tables: as push_batch takes them."""
        pushes = as_pushes(pushes)
        self.guard.refuse_if_lost()
        return self.stamped.push(pushes, advance_clock, client, client_seq, stamp, caller_gone, shared, tables)

    # ---- checkpoints (ps.engine.checkpointing) ------------------------------------------------------
    def hold(self, timeout_s: float, caller_gone: Callable[[], bool] | None = None) -> tuple[int, str]:
        """Stops taking pushes (they get CheckpointInProgressError) for up to timeout_s (at most ps.config MAX_HOLD_S),
        counted once the pushes in flight are done; returns (clock, token): save and release need the token. Every push
        acknowledged before this returns is in the checkpoint, none after. One hold at a time: CheckpointHoldError
        while another lasts. InvalidArgumentError unless 0 < timeout_s <= MAX_HOLD_S. caller_gone: a hold whose caller
        left before it was had is dropped (CallerGoneError; ps.engine.hold.PushHold.hold).

        A hold stops pushes (Push, PushBatch, a PushBatch's clock advance included) and Shrinks: a Shrink asked for
        while it lasts or its save runs is refused, and a hold asked for while a Shrink runs, or while a save whose
        hold was released runs on (CheckpointHoldError, nothing applied or held), so a checkpoint holds a Shrink
        wholly or not at all (ps.engine.hold PushHold.shrink_slot). An AdvanceClock
        during the hold still runs and changes what the save records of this shard (a later clock than the one
        returned here)."""
        self.guard.refuse_if_lost()
        return self.checkpoints.hold(timeout_s, caller_gone)

    def release(self, token: str) -> None:
        """Ends the hold that returned token (a stale token releases nothing)."""
        self.checkpoints.gate.release(token)

    def save_checkpoint(self, directory: str, token: str, caller_gone: Callable[[], bool] | None = None) -> dict:
        """Flushes, then writes a RocksDB checkpoint of this shard to <directory>/shard-<id>, under the hold that
        returned token; returns what the manifest records of it (ShardCheckpoints.save; caller_gone: a save whose
        caller left writes nothing more)."""
        self.guard.refuse_if_lost()
        return self.checkpoints.save(directory, token, caller_gone)

    # ---- clock and shrink ---------------------------------------------------------------------------
    def advance_clock(self, steps: int) -> int:
        """PushPath.advance_clock, once the guard's refuse_if_lost has passed."""
        self.guard.refuse_if_lost()
        return self.pushes.advance_clock(steps)

    def shrink(self, name: str = "") -> dict:
        """Runs every table's (or one table's) eviction rules; returns dropped / num_rows / pending_ids, and
        tables_without_rule: the names of the tables shrunk that have no eviction rule (each left as it was).
        DataLossError, naming the key, before any table is changed, where one of them has a number that does not
        read (Store.table_number): a shrink stopped there would leave the tables before it shrunk, and its retry
        would decay their rows again. A failure part way (a chunk's write, the flush after) is raised as
        ShrinkProgress.refusal says: what was shrunk before it stays, and the message says what (a
        ShardNeedsRestartError's after its own words, which say what a restart does: a restart keeps those rows
        decayed). The log says how far a long one got every ps.progress.LOG_EVERY_S seconds, and how long
        it took. One Shrink at a time: ShrinkRunningError, changing nothing, while another runs (ShrinkRunning). No
        Shrink while a checkpoint holds the shard or saves: CheckpointHoldError at once, changing nothing, saying
        since when and for up to how long; and a hold asked for while it runs is refused (ps.engine.hold
        PushHold.shrink_slot)."""
        self.guard.refuse_if_lost()
        tables = [self.table(name)] if name else list(self.tables.values())
        for table in tables:
            self.store.table_number(table.name)
        progress = ShrinkProgress([t.name for t in tables], sum(t.shrink_rows for t in tables))
        with self.shrink_running.begin(progress), self.checkpoints.gate.shrink_slot(progress.running):
            try:
                self.flush()  # shrink scans RocksDB: it must hold every row
                for table in tables:
                    table.shrink(self.clock, progress=progress)
                    progress.done += 1
                self.flush()
            except PsError as e:  # the chunks written before it stay shrunk: the refusal says which
                partly = progress.refusal(e)
                if partly is None:
                    raise
                raise partly from e
        off = [t.name for t in tables if t.cfg.eviction.is_off]
        log.info("%s", progress.summary(self.clock, off))
        return {
            "dropped": sum(progress.dropped.values()),
            "num_rows": sum(t.num_rows for t in tables),
            "pending_ids": sum(t.num_pending for t in tables),
            "tables_without_rule": off,
        }

    # ---- flushing -------------------------------------------------------------------------------------
    def flush(self, background: bool = False) -> int:
        """Writes every dirty row to RocksDB and trims the journal below what is now flushed. Returns rows.
        ShardNeedsRestartError on a broken shard: nothing is written, the journal keeps everything. background
        (the flusher's): each chunk waits for a moment without requests first (Table.flush), unless another
        flush() waits for this one or the shard is closing."""
        with self.flusher.turn(background):
            if self.guard.broken:
                raise ShardNeedsRestartError(self.guard.broken)
            covered, changes = self.journal.mark()  # every record <= covered is applied (appends happen under
            self._journal_mark = self.journal.bytes_written  # the table lock, which each table.flush takes)
            try:
                tables = list(self.tables.values())
                yield_to = self.store.foreground if background else None
                written = sum(t.flush(yield_to, self.flusher.urgent) for t in tables)
                broken = self.guard.broken or next((t.broken for t in tables if t.broken), "")
                if broken:  # a push journaled before the mark broke its table since: the journal must keep it
                    raise ShardNeedsRestartError(broken)
                self.store.meta.set_flushed_seq(covered, changes)
            except BaseException:
                self.journal.applied.put_back(changes)  # written by the next flush
                raise
            self.pushes.forget_advances(changes.dropped)
            self.journal.trim(covered)
            return written

    def stats(self) -> dict:
        self.guard.refuse_if_lost()  # the data dir's figures are gone with it; the refusal says what happened
        return {
            "shard_id": self.shard_id,
            "num_shards": self.num_shards,
            "num_slots": NUM_SLOTS,
            "cluster": self.config.cluster,
            "data_dir": self.config.data_dir,
            "uptime_s": time.monotonic() - self.started,
            "tables": [t.stats() for t in list(self.tables.values())],
            "ram_budget_bytes": self.budget.limit_bytes,
            "ram_used_bytes": self.budget.used_bytes,
            "journal_bytes": self.journal.size_bytes(),
            "flushing": int(self.flusher.flushing),
            **measure(self.config.data_dir)._asdict(),  # measured now: a stat per file of the data dir
            **memory_stats(self.memory, self.store, self.journal, self.room, self.jobs),
            "clock": self.clock,
            **self.jobs.stats(),
            **restore_stats(self.store),
            "state_id": self.state_id,
            "flush_failures": self.flusher.failures,
        }

    def check_state_id(self, seen: int, words: StateReplacedWords = PUSH_REFUSED) -> None:
        """ModelStateReplacedError when a client's request carries a state id (seen, nonzero: the one its client read
        from Stats) other than this shard's: the data dir was restored or created anew since the client read it, so
        the model state the client trains on, scores with, creates a table of, checkpoints or shrinks is not here.
        Called first by each handler of a request with a state id, so nothing is applied, created, shrunk, held or
        read. words: what the refusal says of the call (ps.replacedstate.model_state_replaced): what is gone, what of the
        call stands and who stops; a PushBatch's by default, a PullBatch's READ_REFUSED, the others' their own
        (ps.replacedstate, as ps.service picks them). A seen of 2^STATE_ID_BITS or more is no shard's state id: InvalidArgumentError, since no
        restore or new data dir explains it."""
        if not seen or seen == self.state_id:
            return
        if seen >> STATE_ID_BITS:
            raise InvalidArgumentError(f"state_id {seen:#x} is no shard's: a shard's model state id is in [1, "
                                       f"2^{STATE_ID_BITS}) (StatsResponse state_id); send the one Stats gave, or 0 "
                                       "to send none")  # fmt: skip
        restored = self.store.meta.restored()
        how = how_replaced(restored["checkpoint"] if restored else "")
        raise ModelStateReplacedError(model_state_replaced(self.shard_id, self.state_id, seen, how, words))

    def health_stats(self) -> dict[str, int]:
        """For the metrics: ps.engine.shardstats.health_stats of the journal and the flusher's disk watch."""
        return health_stats(self.journal, self.flusher.disk_watch)

    def close(self) -> None:
        """Stops the flusher, flushes every dirty row, closes the journal and RocksDB. Requests that arrive
        later get ShardClosingError (UNAVAILABLE); none waits forever, nor do stamped waits."""
        self.jobs.close()
        self.flusher.stop()
        self.journal.check_intact()  # a deletion since the thread's last look is known before anything is written
        close_data_dir(self.shard_id, self._lock, self.tables, self.journal, self.store, self.guard.broken, self.flush)

"""Opening a shard's data dir: the refusals before RocksDB opens, the restore from a checkpoint, the journal and
the tables RocksDB holds, the journal replay; the error a failed start reports, and its clean-up.

Shard.__init__ (ps.engine.shard) runs these in order, entering each phase of ps.engine.startup.StartProgress as it
begins; a stop asked of it is taken at the checks here (between journal records, after each batch of a restore).
"""

from __future__ import annotations

import logging
import os
import traceback

from ps.checkpoint import MANIFEST, checkpoint_folder_around, load_manifest, read_manifest, slot_range, unfinished_save
from ps.config import TableConfig
from ps.diskfull import DiskFullError, disk_full_reason
from ps.engine.restore import check_restored, restore_into
from ps.engine.startup import StartProgress
from ps.engine.table import Table, rows_text
from ps.errors import DataLossError, PsError, StorageError
from ps.progress import LoggedCount, pace
from ps.rows.layout import layout_of
from ps.server_config import ServerConfig
from ps.sharding import NUM_SLOTS
from ps.storage.budget import MemoryBudget
from ps.storage.datadir import first_start_cut_short
from ps.storage.journal import Journal
from ps.storage.journalreplay import replay_progress
from ps.storage.memory import MemoryPlan
from ps.storage.sidefiles import IDENTITY_FILE, MARK_FILE
from ps.storage.store import Store
from ps.storage.tablecatalog import LOST_TABLE_ROWS

log = logging.getLogger("ps.engine.shard")  # the shard's: opening its data dir is a part of its start


def start_error(e: Exception, data_dir: str) -> PsError | None:
    """The error to report for a start that e stopped, when e is not damage: a file the server may not read or
    write (PermissionError), or a full disk; None otherwise (StorageErrors and the like say what they are)."""
    if isinstance(e, PermissionError):
        return StorageError(f"cannot start on data dir {data_dir}: permission denied on {e.filename or 'a file'} "
                            f"({e.strerror}): run ps-server as the user that owns the data dir (uid {os.geteuid()} "
                            "runs it now), or give that user access; nothing was changed")  # fmt: skip
    reason = disk_full_reason(e)
    if reason is not None and not isinstance(e, DiskFullError):
        return DiskFullError.of(reason, f"starting on data dir {data_dir}", outcome="", remedy="start the server again")
    if isinstance(e, DiskFullError):
        return e.instead("", disk=data_dir, remedy="start the server again (nothing acknowledged is lost)")
    return None


def refuse_lone_rocksdb(config: ServerConfig) -> None:
    """StorageError, before RocksDB is opened (which writes), for a data dir that holds RocksDB's files and nothing
    else of a shard's: most likely a checkpoint's shard folder copied in (unless config.accept_journal_loss). One
    whose RocksDB holds nothing but the shard record, what a first start killed before it wrote shard.json leaves
    (first_start_cut_short), is started on, with a warning: it holds nothing to lose."""
    path = config.data_dir
    if config.accept_journal_loss or not os.path.exists(os.path.join(path, "CURRENT")):
        return
    if not any(os.path.exists(os.path.join(path, n)) for n in (IDENTITY_FILE, MARK_FILE, "journal")):
        if first_start_cut_short(path):
            log.warning("data dir %s holds RocksDB's files, which hold nothing, and no %s: a first start on it was "
                        "killed before it wrote %s; starting on it as a new one", path, IDENTITY_FILE, IDENTITY_FILE)  # fmt: skip
            return
        raise StorageError(
            f"data dir {path} holds RocksDB's files and nothing else of a shard's (no {IDENTITY_FILE}, journal or "
            "journal mark): a checkpoint's shard-<i> folder? To start from a checkpoint, give --restore CHECKPOINT "
            "with a new data dir. If this is a data dir that lost those files, --accept-journal-loss starts on what "
            "RocksDB holds; nothing was changed"
        )


def restore_manifest(config: ServerConfig) -> dict | None:
    """StorageError if config.data_dir is, or lies inside, a shard's folder of a checkpoint (through symbolic links
    too). For a restore into a new (missing or empty) data dir: the checkpoint's manifest, checked with every file of
    it before the dir is made; else None (a dir with data gets the refusals of check_store)."""
    folder = checkpoint_folder_around(config.data_dir)
    if folder is not None:
        checkpoint = os.path.dirname(folder)
        if folder != os.path.realpath(config.data_dir):
            raise StorageError(
                f"--data-dir {config.data_dir} lies inside {folder}, a shard's folder of the checkpoint {checkpoint}: "
                "a server there would add files to the checkpoint, which a restore or an export then refuses as "
                "damaged. Give a --data-dir outside the checkpoint; nothing was changed"
            )
        raise StorageError(
            f"--data-dir {config.data_dir} is a shard's folder of the checkpoint {checkpoint}, not a data dir: a "
            f"server on it would change the checkpoint. Start on a new --data-dir with --restore {checkpoint}"
        )
    new_dir = not os.path.isdir(config.data_dir) or not set(os.listdir(config.data_dir)) - {"lost+found"}
    if not (config.restore_dir and new_dir):
        return None
    if not os.path.isdir(config.restore_dir):
        raise StorageError(f"--restore {config.restore_dir} does not exist (or is not a directory): give the "
                           "directory ps-worker checkpoint save wrote; the data dir was not touched")  # fmt: skip
    if not os.path.isfile(os.path.join(config.restore_dir, MANIFEST)):
        unfinished = unfinished_save(config.restore_dir)
        if unfinished is not None:
            raise StorageError(f"--restore {config.restore_dir} {unfinished}; the data dir was not touched")
        raise StorageError(f"--restore {config.restore_dir} is not a checkpoint: it has no {MANIFEST} "
                           "(ps-worker checkpoint save writes one); the data dir was not touched")  # fmt: skip
    try:
        return read_manifest(config.restore_dir)
    except StorageError as e:
        raise StorageError(f"{e}; the data dir was not touched") from None


def check_tables_fit(budget: MemoryBudget, tables: list[TableConfig], whose: str) -> None:
    """RamTierTooSmallError when the RAM tier cannot give each of these tables its share; all of them at once, so
    the message names the least --cache-bytes that holds them, not the next table's. No tables: nothing to check."""
    if tables:
        widest = max(layout_of(t.dim, t.optimizer.name).ram_bytes for t in tables)
        budget.check_room(len(tables), widest, f"cannot hold the {len(tables)} {whose}")


def clear_frames(error: BaseException) -> None:
    """Clears the locals of the finished frames in the tracebacks of error and of the errors it chains to. Kept by
    a failed start's caller, a frame holding a RocksDB column family (a scan's, a reader's argument) would keep
    RocksDB, and the data dir's lock, open after the store closed."""
    todo, seen = [error], set()
    while todo:
        e = todo.pop()
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            traceback.clear_frames(e.__traceback__)
            todo += [e.__cause__, e.__context__]


def check_data_dir(config: ServerConfig, memory: MemoryPlan) -> dict | None:
    """The checks before RocksDB is opened (which writes): the data dir is no checkpoint's folder, a restore's
    checkpoint is whole and its tables fit the RAM tier, RocksDB's files are not alone there. Returns the manifest
    of the checkpoint to restore into a new data dir, else None (restore_manifest)."""
    manifest = restore_manifest(config)
    if manifest is not None:
        check_room_for(memory, manifest, config.restore_dir)
    refuse_lone_rocksdb(config)
    return manifest


def open_store(config: ServerConfig, memory: MemoryPlan) -> Store:
    """RocksDB on config.data_dir, sized by the memory plan. A file the server may not read or write, or a full
    disk, raises the error start_error makes of it."""
    try:
        return Store(config.data_dir, block_cache_bytes=memory.block_cache_bytes, sync=config.sync,
                     direct_reads=config.direct_reads, mmap_reads=config.mmap_reads,
                     read_threads=config.read_threads,
                     write_behind_bytes=memory.write_behind_bytes,
                     write_buffer_bytes=memory.write_buffer_bytes,
                     index_in_cache=memory.bounded,
                     shard=(config.shard_id, config.num_shards))  # fmt: skip
    except Exception as e:
        known = start_error(e, config.data_dir)
        if known is None:
            raise
        raise known from e


def check_store(
    store: Store, config: ServerConfig, memory: MemoryPlan, manifest: dict | None, progress: StartProgress
) -> tuple[bool, list[TableConfig]]:
    """Refuses a store of an unfinished restore (one from the checkpoint restore_dir names is started over:
    Store.forget_unfinished_restore deletes its keys, no file); restores into it if configured, refusing a dir that
    holds tables and was not restored from that checkpoint before. The restore checks for a stop after every batch
    of rows it writes: a stop leaves the dir marked as an unfinished restore, which the next start with the same
    --restore starts over. Returns (whether this start restored the dir, the table configs it holds now). The
    store's shard and cluster are checked before (Shard._start). The checkpoint's files and the RAM tier's room
    for its tables are checked before a row is restored: here, where check_data_dir did not (a dir with data)."""
    pending = store.meta.restore_pending()
    if pending and config.restore_dir and os.path.abspath(config.restore_dir) == pending:
        manifest = read_manifest(config.restore_dir)  # checked before anything is deleted
        check_room_for(memory, manifest, config.restore_dir)
        log.warning("data dir %s holds a restore from %s that did not finish (the server stopped during it): "
                    "starting it over", config.data_dir, pending)  # fmt: skip
        store.forget_unfinished_restore()
    check_restored(store)
    stored = store.load_tables()
    if not config.restore_dir or _restored_already(store, config, config.restore_dir):  # tables or none: a
        return False, stored  # checkpoint of no tables restores a clock and a new state id, once
    if stored:
        raise StorageError(f"--restore needs a new or empty data dir; {store.path} has tables already (and was not "
                           "restored from that checkpoint): leave --restore (PS_RESTORE) out to start on what it "
                           "holds, or give a new data dir")  # fmt: skip
    if manifest is None:  # a dir with data and no table (check_data_dir checks a new one): checked before a row is in
        manifest = read_manifest(config.restore_dir)
        check_room_for(memory, manifest, config.restore_dir)
    expected = _rows_to_restore(config, manifest)
    written = LoggedCount(log, lambda rows, took_s: f"restoring: {pace(rows, expected, took_s, 'rows written')}")
    progress.enter("restoring", lambda: written.done / expected)

    def on_written(n: int) -> None:  # after each batch: a stop there leaves the dir marked, to start over
        written.add(n)
        progress.check()

    summary = restore_into(store, config.restore_dir, config.shard_id, config.num_shards, manifest, on_written)
    progress.enter("restored", check=False)  # done: a stop from now on leaves no mark to start over
    # a count: the server's listening line names each table with its rows
    n, rows = len(summary["tables"]), sum(counts["admitted"] for counts in summary["tables"].values())
    shards = summary["from_shards"]
    log.info("restored from checkpoint %s (%d shard%s) in %.1f s: %s; clock %s", config.restore_dir, shards,
             "s" * (shards != 1), written.took_s(), f"{n:,} table{'s' * (n != 1)}, {rows_text(rows)}" if n else
             "no tables", f"{summary['clock']:,}")  # fmt: skip
    return True, store.load_tables()  # what the restore wrote


def new_budget(memory: MemoryPlan) -> MemoryBudget:
    """The RAM tier's budget, its refusals naming the flag that sizes it (MemoryPlan.raise_ram_tier_to)."""
    return MemoryBudget(memory.ram_tier_bytes, memory.ram_tier_source(), memory.raise_ram_tier_to)


def check_room_for(memory: MemoryPlan, manifest: dict, checkpoint: str) -> None:
    """RamTierTooSmallError, before a row is restored, when the RAM tier cannot hold the checkpoint's tables
    (the check a start on the restored dir would make, open_tables)."""
    tables = [TableConfig.from_dict(t) for t in manifest["tables"]]
    check_tables_fit(new_budget(memory), tables, f"tables of checkpoint {checkpoint}")


def _rows_to_restore(config: ServerConfig, manifest: dict) -> int:
    """The rows a restore writes to this shard, about: its slots' share of the rows the manifest counts (slots hold
    about equal rows); at least 1. A restore logs "restoring: 1,200,000 of about 3,000,000 rows written (40%),
    400,000 rows/s, about 5 s left" every ps.progress.LOG_EVERY_S seconds, and its share done is the rows written
    over these."""
    lo, hi = slot_range(config.shard_id, config.num_shards)
    return max(1, round(sum(sum(s["rows"].values()) for s in manifest["shards"]) * (hi - lo) / NUM_SLOTS))


def _restored_already(store: Store, config: ServerConfig, checkpoint: str) -> bool:
    """True (logged) when this dir was restored from that checkpoint before, whether or not it holds tables: a
    restart with --restore still given (PS_RESTORE kept in a container's environment) starts on what the dir holds.
    That checkpoint: the same manifest, or the same path as given (the record's, links unresolved: restore_into),
    whatever it holds now: gone (old checkpoints pruned), or another checkpoint (a link a save moves, a "latest"),
    which a warning names; the dir keeps what it restored."""
    done = store.meta.restored()
    if done is None:
        return False
    same_path = done["checkpoint"] == os.path.abspath(checkpoint)
    try:
        same = load_manifest(checkpoint)["sha256"] == done["sha256"]
    except StorageError:  # gone since: the same path is the same restore
        same = same_path
    else:
        if not same and same_path:
            log.warning("data dir %s was restored from %s, which leads to another checkpoint now (%s: a link moved, "
                        "or a save replaced it); the dir keeps what it restored. To restore that one, start on a new "
                        "data dir", config.data_dir, checkpoint, os.path.realpath(checkpoint))  # fmt: skip
            same = True
    if same:
        log.info("data dir %s was restored from %s before: starting on what it holds (--restore is done; leave it "
                 "out)", config.data_dir, checkpoint)  # fmt: skip
    return same


def open_journal(config: ServerConfig, memory: MemoryPlan) -> Journal:
    """The data dir's journal (its segments under journal/, its mark beside them)."""
    return Journal(os.path.join(config.data_dir, "journal"), sync=config.sync,
                   segment_bytes=memory.journal_segment_bytes,
                   mark_path=os.path.join(config.data_dir, MARK_FILE))  # fmt: skip


def open_tables(store: Store, journal: Journal, budget: MemoryBudget, stored: list[TableConfig]) -> dict[str, Table]:
    """The tables of the configs RocksDB holds (check_store's), by name, over one RAM tier budget
    (RamTierTooSmallError if it cannot hold them); a warning names the numbers of stored rows of no table
    (Store.rows_of_no_table: a lost table's, or, where a table's number does not read or is missing, most likely
    that table's, and the warning names that damage; the start serves the others)."""
    check_tables_fit(budget, stored, "tables its data dir holds")
    tables = {cfg.name: Table(cfg, store, journal, budget) for cfg in stored}
    try:
        orphans = store.rows_of_no_table()
    except DataLossError as e:  # met again by the requests that read there, which fail with DATA_LOSS
        log.warning("data dir %s: stored rows of no table were not looked for: %s", store.path, e)
        return tables
    unread = store.numbers_unread()
    shown = ", ".join(f"{n:,}" for n in orphans[:5]) + (", ..." if len(orphans) > 5 else "")
    if orphans and unread:  # the rows are most likely those tables'
        more = f" (and {len(unread) - 1} more table(s) without a number that reads)" if len(unread) > 1 else ""
        log.warning("data dir %s is damaged: %s%s: requests of %s fail with DATA_LOSS, the other tables serve. The rows "
                    "stored under table number(s) %s, which no readable table number is, are most likely %s. `ps-server "
                    "verify %s` says what to do", store.path, next(iter(unread.values())), more,
                    ", ".join(map(repr, unread)), shown, "that table's" if len(unread) == 1 else "those tables'", store.path)  # fmt: skip
    elif orphans:
        log.warning("data dir %s is damaged: it stores rows under table number(s) %s, which no table's number (meta "
                    "key tid/<name>) is: %s; the other tables serve. `ps-server verify %s` counts them and says what to "
                    "do", store.path, shown, LOST_TABLE_ROWS, store.path)  # fmt: skip
    return tables


def replay(
    store: Store, journal: Journal, tables: dict[str, Table], progress: StartProgress, accept_loss: bool
) -> tuple[int, int]:
    """Applies the journal records RocksDB lacks; returns (records applied, the newest step among them, 0 if none).
    The journal refuses records missing or damaged below its mark unless accept_loss; a loss so accepted
    (journal.losses) must be flushed at once by the caller, as must the records applied, so that RocksDB's flushed
    position passes them and the next start does not find them again."""
    after = store.meta.flushed_seq()
    rows = step = seq = 0  # seq: the record applied last, which the line names
    records = LoggedCount(log, lambda done, took_s: replay_progress(done, seq, journal.replay_bytes, took_s))
    read = lambda: journal.replay_bytes[0] / max(1, journal.replay_bytes[1])
    progress.enter("replaying", read)
    written = store.meta.written_seq()  # rows written back before a flush hold pushes up to it
    for rec in journal.replay(after, accept_loss=accept_loss, rows_seq=written):
        progress.check()  # between records: a stop leaves them all to the next start's replay
        if not records.done:
            log.info("replaying the journal past record %s: the pushes not yet written to RocksDB when the "
                     "last run stopped", f"{after:,}")  # fmt: skip
        table = tables.get(rec.table)
        if table is None:  # a push was journaled only for tables that exist, and tables are never dropped
            raise DataLossError(
                f"journal record {rec.seq} is a push to table {rec.table!r}, which RocksDB does not hold: RocksDB "
                "lost its latest writes (its write-ahead log, *.log, deleted or damaged). Restore the dir from "
                "a backup or checkpoint"
            )
        rows += table.replay(rec)
        seq, step = rec.seq, max(step, rec.step)
        records.add(1)  # its line every ps.progress.LOG_EVERY_S seconds
    if records.done:
        log.info("replayed %s journal records (%s row updates) in %.2f s", f"{records.done:,}", f"{rows:,}",
                 records.took_s())  # fmt: skip
    return records.done, step


def close_after_failed_start(data_dir: str, store: Store, journal: Journal | None) -> None:
    """Closes the journal (if it was opened) and the store; their errors are logged, not raised: the error that
    stopped the start is the news."""
    try:
        if journal is not None:
            journal.close()
    except Exception as close_error:
        log.warning("closing the journal of %s after a failed start: %s", data_dir, close_error)
    try:
        store.close()
    except Exception as close_error:  # (a full disk, say)
        log.warning("closing data dir %s after a failed start: %s", data_dir, close_error)


def failed_start_error(e: BaseException, data_dir: str) -> BaseException | None:
    """What a start that e stopped once RocksDB was open raises, from e: DataLossError naming the dir for lost
    writes, start_error's error for permissions or a full disk, a StorageError naming the dir for any other failure
    that is no ps.errors error; None: e itself (a ps.errors error, or no Exception: an interrupt, a stop)."""
    if isinstance(e, DataLossError):
        return DataLossError(f"cannot start on data dir {data_dir}: {e}")
    known = start_error(e, data_dir) if isinstance(e, Exception) else None
    if known is not None:
        return known
    if isinstance(e, PsError) or not isinstance(e, Exception):
        return None
    return StorageError(
        f"cannot start on data dir {data_dir}: {type(e).__name__}: {e} (corrupt files? restore the "
        "dir from a backup or checkpoint, or start on an empty one)"
    )

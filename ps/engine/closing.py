"""The last steps of a shard's close (ps.engine.shard.Shard.close): the final flush, its tables closed to requests,
the journal and RocksDB closed part by part with the first error kept, and the close of a shard whose data dir is
gone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import NoReturn

from ps.engine.table import Table
from ps.errors import NOTHING_APPLIED, DataDirLostError
from ps.storage.journal import Journal
from ps.storage.store import Store

log = logging.getLogger("ps.engine.shard")  # the shard's: its close is a part of it


def close_tables(tables: Iterable[Table]) -> None:
    """Marks each table closed under its lock: a request that arrives later gets ShardClosingError. Call it holding
    the shard's lock, so that no table is created meanwhile."""
    for t in list(tables):
        with t.lock:
            t.closed = True


def close_part(
    shard_id: int, what: str, close: Callable[[], None], failed: BaseException | None
) -> BaseException | None:
    """Runs one part of a shard's close; returns the error the close raises: failed (a failed flush, or an earlier
    part), else this part's. A failure after an earlier error is logged, not raised in its place (on a full disk
    the flush and RocksDB's close both fail, and the flush's error says what the stop left)."""
    try:
        close()
    except BaseException as e:  # an interrupt too: the parts after it still close
        if failed is None:
            return e
        log.warning("shard %d: %s failed too (after the error the stop reports): %s", shard_id, what, e)
    return failed


def close_lost(lock: threading.Lock, tables: Iterable[Table], journal: Journal, store: Store) -> NoReturn:
    """The close of a shard whose data dir is gone: nothing is flushed (it could not be kept), the tables are
    closed, the journal and RocksDB are closed as far as they can be; raises DataDirLostError saying what was
    lost."""
    with lock:
        close_tables(tables)
        for what, close in (("the journal", journal.close), ("RocksDB", store.close)):
            try:
                close()
            except Exception as e:  # the files are gone: nothing to save, the refusal below says why
                log.info("closing %s of the lost data dir: %s", what, e)
    lost = journal.lost.removesuffix(f"; {NOTHING_APPLIED}")
    raise DataDirLostError(f"stopped without writing its last rows to RocksDB: {lost}")


def close_data_dir(
    shard_id: int,
    lock: threading.Lock,
    tables: Mapping[str, Table],
    journal: Journal,
    store: Store,
    broken: str,
    flush: Callable[[], int],
) -> None:
    """A shard's close once its jobs and flusher stopped and its journal had a last look (Journal.check_intact):
    where the data dir is gone, close_lost; else every dirty row flushed (flush: the shard's; none where the shard is
    broken, `broken` saying why, logged), then, the flush failed or not, the tables closed and the journal and RocksDB
    closed part by part (Store.flush before the close, after a flush that passed). Raises the flush's error, else
    the first part's."""
    if journal.dir_gone:
        close_lost(lock, tables.values(), journal, store)
    flushed, failed = False, None
    try:
        if broken:
            log.warning("shard %d stops without flushing its dirty rows (its journal keeps every acknowledged "
                        "push and the push only partly applied; the next start replays them): %s", shard_id,
                        broken)  # fmt: skip
        else:
            t0 = time.monotonic()
            rows = flush()
            flushed = True
            log.info("final flush: %s dirty rows written to RocksDB in %.1f s", f"{rows:,}", time.monotonic() - t0)
    except BaseException as e:
        failed = e
        raise
    finally:  # a failed flush too: the journal keeps what it did not write, and the data dir is let go
        with lock:
            close_tables(tables.values())

            def journal_then_flush() -> None:
                journal.close()
                if flushed:  # after a failed flush, its error is the one raised
                    store.flush()

            error = close_part(shard_id, "closing the journal", journal_then_flush, failed)
            error = close_part(shard_id, "closing RocksDB", store.close, error)
            if error is not failed:
                raise error

"""The last steps of a shard's close (ps.engine.shard.Shard.close): its tables closed to requests, the journal and
RocksDB closed part by part with the first error kept, and the close of a shard whose data dir is gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
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

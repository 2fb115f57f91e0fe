"""WriteGuard: why a shard takes no writes until a restart (its data dir lost, or a push applied in part), and the
listeners it tells once it stops taking them.

Deleted under it: the journal checks about once a second that its segment and the data dir are still there
(ps.storage.journal.Journal.check_intact). Once it finds either gone, the shard refuses every write (pushes, a
clock advance, CreateTable, Shrink, checkpoints) and Stats with DataDirLostError, tells the listeners (the
server's health turns NOT_SERVING), and: for a deleted segment only, flushes at once (RocksDB is intact, and then
holds every acknowledged push); for a data dir deleted or replaced, flushes no more, and Shard.close() stops
without writing, raising DataDirLostError.

Broken: a push applied in chunks (more ids than one pass takes) is journaled first; if applying a chunk then
fails, RAM holds part of a push the journal holds whole. The shard refuses every write and Stats, the table every
request, with ShardNeedsRestartError, tells the listeners, and flushes nothing (a flush would trim the push from
the journal), Shard.close() included; the next start replays it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ps.errors import DataDirLostError, ShardNeedsRestartError
from ps.storage.journal import Journal

log = logging.getLogger("ps.engine.shard")  # the shard's: its refusals are a part of it


class WriteGuard:
    def __init__(self, shard_id: int, journal: Journal, wake_flusher: Callable[[], None]):
        """journal: the shard's, whose `lost` says what was deleted (its on_lost is to be this guard's on_lost);
        wake_flusher: starts the shard's flush at once (a deleted segment's pushes are flushed to RocksDB)."""
        self.shard_id = shard_id
        self.broken = ""  # or why the shard takes no writes until a restart (mark_broken); the listeners are told too
        self.listeners: list[Callable[[], None]] = []  # told once the data dir is found lost, or the shard broke
        self._journal = journal
        self._wake_flusher = wake_flusher

    def on_lost(self) -> None:
        """The journal found its segment or the data dir deleted (from the mark's thread): a deleted segment's
        pushes are flushed to RocksDB at once; the listeners are told."""
        if not self._journal.dir_gone:
            self._wake_flusher()
        self._tell_listeners("the data dir's loss")

    def _tell_listeners(self, what: str) -> None:
        """Calls each of listeners; one that fails is logged (naming `what` it was told of) and the others are
        called still."""
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:  # a listener's failure must not stop the others, nor the caller's thread
                log.exception("a listener of %s failed", what)

    def lost(self) -> str:
        """Why the shard takes no writes, if the journal found its segment or the data dir deleted, else ""."""
        return f"shard {self.shard_id} takes no writes: {self._journal.lost}" if self._journal.lost else ""

    def lost_unnamed(self) -> str:
        """Why the shard takes no writes, naming no path, for whoever asks without the token (the health service):
        what was deleted, not where, or that it broke (mark_broken; its reason, which may name files, is in the
        log and the refusals); "" while neither."""
        if not self._journal.lost:
            return (f"shard {self.shard_id} takes no writes until a restart: a journaled push was only partly applied "
                    "in RAM (its log, and the refusals its callers get, say why); the restart replays it whole"
                    ) if self.broken else ""  # fmt: skip
        what = "its data dir was deleted or replaced" if self._journal.dir_gone else "its journal segment was deleted"
        return (f"shard {self.shard_id} takes no writes: {what} under the running server (its log, and the refusals "
                "its callers get, say which and since when)")  # fmt: skip

    def refuse_if_lost(self) -> None:
        """DataDirLostError if the journal found its segment or the data dir deleted, ShardNeedsRestartError if
        the shard is broken (two attribute reads)."""
        if self._journal.lost:
            raise DataDirLostError(self.lost())
        if self.broken:
            raise ShardNeedsRestartError(self.broken)

    def mark_broken(self, why: str) -> None:
        """A journaled push is only partly applied in RAM: from now on the shard takes no writes and flushes
        nothing (a flush would record the push as covered and trim it from the journal), and the listeners are
        told (health NOT_SERVING); the next start replays the journal. The first reason stays."""
        if self.broken:
            return
        self.broken = why
        log.error("shard %d: %s", self.shard_id, why)
        self._tell_listeners("the shard's breaking")

"""Filling a new shard from a checkpoint (restore). The checkpoint format is in ps.checkpoint; writing a checkpoint's
model for serving is ps.engine.export.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ps.checkpoint import pinned, slot_range
from ps.config import TableConfig
from ps.errors import CheckpointDamagedError, StorageError
from ps.rows.layout import layout_of
from ps.storage.store import Store


def check_restored(store: Store) -> None:
    """StorageError if a restore into this store started and did not finish (a crash or a stop in the middle)."""
    pending = store.meta.restore_pending()
    if pending:
        raise StorageError(f"data dir {store.path} holds a restore from {pending} that did not finish; start with "
                           f"--restore {pending} to start it over (what it copied is deleted first), or delete the "
                           "data dir: it holds nothing but that unfinished restore (a restore starts only on a dir "
                           "with no tables), so a start on the emptied dir with --restore of another checkpoint is "
                           "safe, as is one with none. A restore that stops on a damaged checkpoint deletes what "
                           "it copied itself, and leaves no such mark")  # fmt: skip


def restore_into(
    store: Store,
    directory: str,
    shard_id: int,
    num_shards: int,
    manifest: dict | None = None,
    on_written: Callable[[int], None] | None = None,
) -> dict:
    """Fills an empty store (one that holds no table: its caller, ps.engine.opening.check_store, refuses a dir
    with tables before) with this shard's part of the checkpoint at directory; returns a summary. manifest:
    the checkpoint's, from read_manifest (None: read here, before anything is written). Every file is read from
    directory with its links resolved once, so a link that moves meanwhile (a "latest") mixes no other checkpoint
    in; a manifest given must be the one there then (ps.checkpoint.pinned: a StorageError before anything is
    written, if not). From its first write, the
    store is marked as holding a restore that did not finish (check_restored) until every row is in.
    on_written: told the admitted rows of each batch written (Store.import_slots); it may raise to stop the
    restore there, which leaves that mark.

    A checkpoint whose RocksDB is damaged (CheckpointDamagedError: a block whose checksum fails, found when the
    copy reads it; the files' sha256s match, as they do when the damage was saved; or a value, a row or a table
    number that is not as the store's grammar and the manifest say: Store.import_slots) stops the restore, which then
    deletes what it copied and its mark (Store.forget_unfinished_restore), leaving the store as it was: the error
    is the checkpoint's, and a start with another checkpoint must not be refused for it. Only when that deletion
    fails too does the mark stay (the error says so, and check_restored what to do)."""
    check_restored(store)
    source, manifest = pinned(directory, manifest)  # every file read from there: one checkpoint, though a link moves
    store.meta.set_restore_pending(os.path.abspath(directory))  # cleared once every row is in: see check_restored
    tables = [TableConfig.from_dict(t) for t in manifest["tables"]]
    for cfg in tables:
        store.create_table(cfg)
    slots = slot_range(shard_id, num_shards)
    rows = {cfg.name: {"admitted": 0, "pending": 0} for cfg in tables}
    layouts = {t.name: layout_of(t.dim, t.optimizer.name, t.values_at_rest) for t in tables}
    for shard in manifest["shards"]:
        lo, hi = slot_range(int(shard["shard_id"]), int(manifest["num_shards"]))  # the slots it owned
        try:
            copied = store.import_slots(os.path.join(source, shard["dir"]), slots, [t.name for t in tables],
                                        layouts, on_written, trained_from=lo < slots[1] and slots[0] < hi)  # fmt: skip
        except CheckpointDamagedError as e:
            raise _undone(store, e) from None
        for name, counts in copied.items():
            for k, v in counts.items():
                rows[name][k] += v
    store.meta.set_clock(int(manifest["clock"]))
    store.flush()
    store.meta.set_restored(os.path.abspath(directory), manifest["sha256"])
    store.meta.set_restore_pending(None)
    store.flush()
    return {"tables": rows, "clock": int(manifest["clock"]), "slots": slots, "from_shards": len(manifest["shards"])}


def _undone(store: Store, damage: CheckpointDamagedError) -> StorageError:
    """The error to raise for a restore that damage in its checkpoint stopped, once what it copied and its mark are
    deleted (a StorageError saying so if that fails: the mark stays)."""
    try:
        store.forget_unfinished_restore()
    except Exception as e:  # a StorageError, a DiskFullError: the dir keeps the mark, and check_restored says why
        return StorageError(f"{damage}. The restore stopped; deleting what it had copied into data dir {store.path} "
                            f"failed too ({e}), so the dir stays marked as holding an unfinished restore: it holds "
                            "nothing else, delete it and start again with --restore of another checkpoint")  # fmt: skip
    return CheckpointDamagedError(f"{damage}. The restore stopped and deleted what it had copied: data dir "
                                  f"{store.path} is as it was before it, and a start with --restore of another "
                                  "checkpoint (an earlier save) goes ahead", damage.checkpoint, damage.where)  # fmt: skip

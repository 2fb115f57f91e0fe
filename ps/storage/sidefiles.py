"""Side files: what a data dir keeps outside RocksDB and the journal, so that losing one file cannot lose it.

Two small JSON files beside RocksDB's files, each replaced whole (written to a temporary file, fsynced, renamed
over the old one), so a reader finds the old content or the new, never a mix:
    shard.json          {"shard_id": i, "num_shards": n, "num_slots": s}  the shard's identity; RocksDB's meta
                        column family holds the same record (ps.storage.shardmeta.ShardMeta.check_identity)
    journal-mark.json   {"written_seq": k}  every journal record <= k was written whole to the journal, so its
                        push may have been acknowledged: none of them may be missing at start-up
                        (ps.storage.journal.Journal.replay); written at the first start on a data dir (0), then
                        kept up to date by MarkWriter
    <file>.<8 chars>.tmp   the next content of shard.json or journal-mark.json while it is written (tempfile.mkstemp
                        names it), renamed over <file> once whole; one that a kill left is removed at the next start
                        (remove_temporary_files, by the server that holds the dir's RocksDB LOCK)
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable

from ps.accel.threadnames import name_os_thread
from ps.errors import StorageError
from ps.storage import leftovers
from ps.storage.atomicfile import write_json_whole

log = logging.getLogger(__name__)

IDENTITY_FILE = "shard.json"
IDENTITY_FIELDS = ("shard_id", "num_shards", "num_slots")  # of the shard record, in shard.json and in RocksDB
MARK_FILE = "journal-mark.json"
TEMPORARY = re.compile(r"(?:shard|journal-mark)\.json\.[a-z0-9_]{8}\.tmp")  # write_json's, of either file


def remove_temporary_files(data_dir: str) -> list[str]:
    """Removes the temporary files of write_json that a server killed mid-write left in data_dir, logging each;
    returns their paths. Only the server holding the dir's RocksDB LOCK may call it: no other writes there."""
    return leftovers.remove(
        leftovers.matching(data_dir, TEMPORARY, files=True), "a server killed while it replaced that file"
    )


def write_json(path: str, obj: dict, sync_dir: bool = False) -> None:
    """Replaces the file at path with obj as JSON, whole (ps.storage.atomicfile): its temporary file is named as
    TEMPORARY finds it. sync_dir: fsync the directory too, so the rename itself survives a power loss."""
    write_json_whole(path, obj, sync_dir=sync_dir)


def read_json(path: str, keys: tuple[str, ...]) -> dict | None:
    """The JSON object in the file at path (None if there is no file); StorageError if it is not a JSON object
    holding these keys with integer values >= 0 (every value these files record is a count or a number), or a
    directory, or unreadable (PermissionError as it is)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise StorageError(
            f"{path} is a directory, where the shard keeps a file of that name: made there by "
            "mistake, or damage to the data dir; move it away (docs/reliability.md says what a start "
            "does without that file)"
        ) from None
    except PermissionError:  # the callers' own message says as whom to run
        raise
    except OSError as e:  # an I/O error, ...
        raise StorageError(f"{path} cannot be read: {e.strerror or e}") from None
    try:
        obj = counts_object(json.loads(raw), keys)
    except ValueError as e:
        raise StorageError(f"{path} is damaged: {e}; it holds {raw[:80]!r}") from None
    return obj


def counts_object(obj: object, keys: tuple[str, ...]) -> dict:
    """obj, a decoded JSON value, if it is an object holding these keys with integer values >= 0 (every value
    these files record is a count or a number); ValueError otherwise."""
    if not isinstance(obj, dict) or any(type(obj.get(k)) is not int or obj[k] < 0 for k in keys):
        raise ValueError(f"expected a JSON object with integers >= 0 {', '.join(keys)}")
    return obj


def shard_name(identity: dict) -> str:
    """'shard 0 of 2 (num_slots 16384)' for a shard record."""
    return f"shard {identity['shard_id']} of {identity['num_shards']} (num_slots {identity['num_slots']})"


def read_mark(path: str) -> int:
    """The written_seq of the journal mark at path (0 if there is no mark file)."""
    obj = read_json(path, ("written_seq",))
    return obj["written_seq"] if obj is not None else 0


class MarkWriter:
    """Keeps the journal mark at path at most interval_s behind source() (the last journal record written): a
    daemon thread rewrites it whenever source() has grown. write() brings it up to date at once (a segment
    rotation); close() does so and stops the thread. Nothing happens on the append path. written: what the file
    holds now (it is never rewritten with less); -1: there is no file yet, and the next write makes it, at
    source() (0 before the first record), its directory fsynced too, so that the file's being there survives (a
    data dir keeps a mark from its server's first start on: ps.storage.journalreplay.JournalReader.read). check:
    called by the thread each time it wakes, before its write, and after a write that failed
    (ps.storage.journal.Journal.check_intact); once it returns False (the data dir is gone) the mark is no longer
    written, as every write would fail, and no failure is warned of."""

    def __init__(self, path: str, source: Callable[[], int], written: int, interval_s: float = 1.0,
                 sync_dir: bool = False, check: Callable[[], bool] | None = None):  # fmt: skip
        self.path = path
        self._source = source
        self._check = check
        self._gone = False  # check() said the mark's directory is gone: no more writes
        self._interval_s = interval_s
        self._sync_dir = sync_dir
        self._lock = threading.Lock()  # one write at a time; `written` only grows
        self.written = written  # the seq the file holds, as far as this writer knows
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="journal-mark", daemon=True)
        self._thread.start()

    def write(self) -> None:
        """Writes source() to the mark file if it is above what the file holds. An OSError is logged, not raised:
        the mark is a check, not the data, and the next write tries again."""
        with self._lock:
            seq = self._source()
            if seq > self.written and not self._gone:
                try:
                    write_json(self.path, {"written_seq": seq}, self._sync_dir or self.written < 0)
                except OSError as e:
                    if self._check is not None and not self._check():  # the data dir is gone: check said so
                        self._gone = True
                        return
                    log.warning("cannot write the journal mark %s: %s", self.path, e)
                    return
                self.written = seq

    def _run(self) -> None:
        name_os_thread()
        while not self._stop.wait(self._interval_s):
            if self._check is not None and not self._check():
                self._gone = True
            self.write()

    def close(self, write: bool = True) -> None:
        """Stops the thread, then brings the mark up to date (unless write is False: its directory is gone)."""
        self._stop.set()
        self._thread.join()
        if write:
            self.write()

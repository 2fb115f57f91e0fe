"""A shard's data dir as RocksDB opens it read-write: the refusals before the open (not a directory, the journal
folder, RocksDB's files lost, another program's files, its LOCK held, another shard's, its shard record lost), the
open itself, RocksDB's errors there said as ours (rocksdb_error), and the open dir as its Store and ShardMeta both
use it (OpenDataDir).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from typing import Any

from ps.diskfull import DiskFullError, disk_full_reason
from ps.errors import NOTHING_APPLIED, DataDirLostError, DataLossError, PsError, StorageError
from ps.sharding import NUM_SLOTS
from ps.storage.atomicfile import make_dirs
from ps.storage.meta import META_CF, meta_value, shard_record
from ps.storage.options import iter_items
from ps.storage.readonly import is_damage, open_failure, opened_read_only
from ps.storage.rocks import AccessType, Options, Rdict, WriteOptions
from ps.storage.sidefiles import IDENTITY_FIELDS, IDENTITY_FILE, MARK_FILE, read_json, shard_name

RESTORE_DIR = "restore the dir from a backup or checkpoint"  # what to do about damage, where no remedy is given


def checked_entries(path: str) -> list[str]:
    """The entries of data dir `path` (made if missing; its journal/ and lost+found left out), once it is known to
    be a new, empty or sparseps data dir that no process holds: a StorageError saying why not otherwise (a
    DataLossError where the dir holds a shard's side files or journal but no RocksDB), with nothing changed."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise StorageError(f"data dir {path} is a file, not a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.basename(os.path.abspath(path)) == "journal" and any(
        os.path.exists(os.path.join(parent, name)) for name in ("CURRENT", IDENTITY_FILE, MARK_FILE)
    ):
        raise StorageError(f"data dir {path} is the journal folder of the shard whose data dir is {parent}: give "
                           f"--data-dir {parent} (nothing was changed)")  # fmt: skip
    try:
        make_dirs(path, "data dir")
    except ValueError as e:
        raise StorageError(str(e)) from None
    entries = sorted(set(os.listdir(path)) - {"journal", "lost+found"})  # lost+found: a volume's root (ext4)
    ours = [e for e in entries if e in (IDENTITY_FILE, MARK_FILE)]
    journal = os.path.join(path, "journal")
    if os.path.isdir(journal) and os.listdir(journal):
        ours.append("a journal")
    if ours and "CURRENT" not in entries:
        raise DataLossError(
            f"data dir {path} holds {' and '.join(ours)} but no RocksDB (its CURRENT file is missing): "
            "RocksDB's files were deleted or lost. Refusing to start on it; restore the dir from a backup or "
            "checkpoint"
        )
    if entries and "CURRENT" not in entries:
        raise StorageError(
            f"data dir {path} is not empty and holds no sparseps data (it has {', '.join(entries[:5])}"
            f"{', ...' if len(entries) > 5 else ''}); give a new or empty directory, or this shard's own"
        )
    holder = lock_holder(os.path.join(path, "LOCK")) if "LOCK" in entries else None
    if holder is not None:  # refused before RocksDB's open, which would rotate the running server's LOG first
        who = f"process {holder}" if holder > 0 else "a process"
        by = ("this process itself (a store it opened on the dir is still open: it holds RocksDB's LOCK file)"
              if holder == os.getpid() else f"another process ({who} holds RocksDB's LOCK file)")  # fmt: skip
        raise StorageError(f"data dir {path} is in use by {by}: is a server already running on it? Nothing was "
                           "changed")  # fmt: skip
    return entries


def first_start_cut_short(path: str) -> bool:
    """Whether the RocksDB at data dir path holds no key but, at most, the meta column family's shard record: all a
    server's first start writes before shard.json beside it, so a first start killed there (kill -9, a power loss)
    left it, and it holds nothing to keep. Read through a read-only view (opened_read_only), writing nothing into
    path; False where it does not open or read (the read-write open then says why)."""
    try:  # rocksdict raises plain Exception
        with opened_read_only(path) as (db, names, _):
            for name in names:
                keys = [key for key, _ in zip(iter_items(db.get_column_family(name)), range(2))]
                if keys and (name != META_CF or [key for key, _ in keys] != [b"shard"]):
                    return False
    except Exception:
        return False
    return True


def open_rocksdb(path: str, opts: Options, entries: list[str], shard: tuple[int, int] | None) -> Rdict:
    """The RocksDB of data dir `path` (entries: checked_entries'), opened read-write with every column family it has
    and "meta". shard: (shard_id, num_shards) it is opened as, checked against shard.json first (the refusals of
    _check_shard_record_survived). A dir this user may not write is a PermissionError; damage a DataLossError; a
    held LOCK or another failure a StorageError."""
    if "CURRENT" in entries and IDENTITY_FILE in entries:
        _check_shard_record_survived(path, opts, shard)
    try:  # rocksdict raises plain Exception
        existing = Rdict.list_cf(path, opts) if "CURRENT" in entries else []
        # Pass each column family's options explicitly: otherwise a reopen takes them from the OPTIONS file.
        cfs = dict.fromkeys(set(existing) | {META_CF}, opts)
        return Rdict(path, opts, column_families=cfs)
    except Exception as e:
        if "While lock file" in str(e):
            raise StorageError(
                f"data dir {path} is in use by another process (RocksDB's LOCK file is held): is a server already "
                f"running on it? ({e})"
            ) from e
        if str(e).startswith("Corruption"):
            raise rocksdb_error(path, "opening it", e, open_failure(path, e)) from e
        if "No such file" in str(e) and "MANIFEST" in str(e):  # the one CURRENT names is not there
            raise rocksdb_error(path, "opening it", e, f"{e} (its CURRENT file names a MANIFEST that is not there: "
                                                       "CURRENT damaged, or the MANIFEST deleted)") from e  # fmt: skip
        if "Permission denied" in str(e):  # the dir, or a file of it, this user may not write: no damage
            raise PermissionError(errno.EACCES, f"RocksDB: {e}", path) from e
        raise StorageError(f"cannot open RocksDB at {path}: {e}") from e


def identity(shard: tuple[int, int]) -> dict:
    """The shard record of shard (shard_id, num_shards), as shard.json and RocksDB's "shard" key hold it."""
    return {"shard_id": shard[0], "num_shards": shard[1], "num_slots": NUM_SLOTS}


def belongs_elsewhere(path: str, have: dict, want: dict) -> StorageError:
    """The refusal of data dir `path`, whose shard record is `have`, to a server started as shard record `want`."""
    start = f"--shard-id {have['shard_id']} --num-shards {have['num_shards']}"
    if have.get("num_slots") != NUM_SLOTS:  # a dir of another build's slot count: no flag serves it
        start = "a build of the same num_slots"
    return StorageError(
        f"data dir {path} belongs to {shard_name(have)}, but this server was started as shard {want['shard_id']} "
        f"of {want['num_shards']}: start it with {start}, or give this shard its own data dir (to serve these rows "
        "on another number of shards, save a checkpoint and --restore it into new data dirs); nothing was changed"
    )


def lost_shard_record(in_file: dict) -> DataLossError:
    """The refusal of a dir whose shard.json holds in_file and whose RocksDB holds no shard record."""
    return DataLossError(
        f"{IDENTITY_FILE} says it is {shard_name(in_file)}, but RocksDB holds no shard record: RocksDB lost its "
        "latest writes (its write-ahead log, *.log, or its MANIFEST deleted, cut short or damaged) or its files were "
        "replaced, and its tables and rows may be gone with them. Refusing to start; restore the dir from a backup "
        "or checkpoint"
    )


def copies_disagree(in_file: dict, in_db: dict) -> DataLossError:
    """The refusal of a shard record whose two copies differ, naming the fields that differ."""

    def shown(record: dict, key: str) -> str:
        return repr(record[key]) if key in record else "absent"

    differ = "; ".join(
        f"{key}: {shown(in_file, key)} in {IDENTITY_FILE}, {shown(in_db, key)} in RocksDB"
        for key in sorted(set(in_file) | set(in_db))
        if shown(in_file, key) != shown(in_db, key)
    )
    return DataLossError(
        f"{IDENTITY_FILE} says {shard_name(in_file)} and RocksDB says {shard_name(in_db)} ({differ}); one copy "
        f"is damaged. Refusing to start; {RESTORE_DIR}"
    )


def _check_shard_record_survived(path: str, opts: Options, shard: tuple[int, int] | None) -> None:
    """The refusals of ShardMeta.check_identity that a read-only open can find: the dir belongs to another shard
    than `shard` (by shard.json), or RocksDB lost its shard record. A read-write open of a RocksDB whose MANIFEST
    lost its latest edits deletes every SST file the MANIFEST no longer lists, so the refusal must come before
    it. Copies that disagree with each other are said to before either is compared with `shard`. A RocksDB that
    does not open read-only is left to the read-write open to report."""
    in_file = read_json(os.path.join(path, IDENTITY_FILE), IDENTITY_FIELDS)
    if in_file is None:
        return
    elsewhere = shard is not None and in_file != identity(shard)
    raw: bytes | None = b"unreadable: left to the read-write open"
    try:  # rocksdict raises plain Exception
        if META_CF not in Rdict.list_cf(path, opts):
            raw = None
            db = None
        else:  # the meta column family alone: its write-ahead log records are replayed into memory, not every row's
            db = Rdict(path, opts, column_families={META_CF: opts}, access_type=AccessType.read_only())
    except Exception:
        db = None
    if db is not None:
        try:
            raw = db.get_column_family(META_CF).get(b"shard")
        except Exception:
            pass
        finally:
            db.close()
    if raw is None:  # shard.json alone still says whose dir it is
        raise belongs_elsewhere(path, in_file, identity(shard)) if elsewhere else lost_shard_record(in_file)
    try:
        in_db = shard_record(raw)
    except ValueError:
        in_db = None  # unreadable: the read-write open reports it
    if in_db is not None and in_db != in_file:  # before the flags: the copies disagree with each other
        raise copies_disagree(in_file, in_db)
    if elsewhere:
        raise belongs_elsewhere(path, in_file, identity(shard))


def rocksdb_error(path: str, doing: str, e: Exception, text: str | None = None,
                  outcome: str = NOTHING_APPLIED, target: str | None = None) -> StorageError | DiskFullError:  # fmt: skip
    """rocksdict's error (a plain Exception) as a StorageError saying what failed; a full disk ("IO error: No space
    left on device: <file>") as a DiskFullError ending with outcome (what of the request stands); damage that
    RocksDB detected ("Corruption: ...", a file gone) as a DataLossError, unless the error names target (a
    directory outside path that was being written, a checkpoint's); a file gone because the data dir itself is gone
    as a DataDirLostError. text: what to say of e (default: str(e))."""
    text = str(e) if text is None else text
    elsewhere = target is not None and target in text
    reason = disk_full_reason(e)
    if reason is not None:
        what = f"RocksDB in the data dir {path} failed while {doing} ({text})"
        return DiskFullError.of(reason, what, outcome, os.path.dirname(target) if elsewhere else path)
    damage = is_damage(text)
    if "No such file" in text and not elsewhere and not os.path.isdir(path):  # not damage: the dir is gone
        return DataDirLostError(
            f"RocksDB in {path} failed while {doing}: the data dir was deleted under the running server ({text}); "
            "nothing written there can be kept: restart the server on an intact data dir"
        )
    if not damage or elsewhere:
        return StorageError(f"RocksDB in {path} failed while {doing}: {text}")
    return DataLossError(
        f"RocksDB found damage in {path} while {doing}: {text}. `ps-server verify {path}` lists what is damaged; "
        f"{RESTORE_DIR}"
    )


class OpenDataDir:
    """The open RocksDB of data dir `path`, as the Store of its rows and the ShardMeta of its own records share it:
    db; meta_cf, its "meta" column family (meta_handle() names it in a WriteBatch); write_opts, synced where the
    store syncs (--sync), and synced, always synced (the writes a restart must find whatever --sync says);
    rocksdb(doing, outcome, target), a block whose RocksDB errors are said as ours; damaged(what, remedy), the error
    for a value that does not read; meta_get, a meta value read by its grammar. close() closes RocksDB; nothing may
    use it after."""

    def __init__(self, db: Rdict, path: str, sync: bool):
        self.db: Rdict | None = db
        self.path = path
        self.meta_cf: Rdict | None = db.get_column_family(META_CF)
        self.write_opts = WriteOptions()
        self.write_opts.sync = sync
        self.synced = WriteOptions()
        self.synced.sync = True

    @contextlib.contextmanager
    def rocksdb(self, doing: str, outcome: str = NOTHING_APPLIED, target: str | None = None) -> Iterator[None]:
        """RocksDB's errors inside the block raised as the StorageError, DiskFullError or DataLossError of
        rocksdb_error (which says what outcome and target are); our own errors pass as they are."""
        try:
            yield
        except PsError:
            raise
        except Exception as e:
            raise rocksdb_error(self.path, doing, e, outcome=outcome, target=target) from e

    def damaged(self, what: str, remedy: str = RESTORE_DIR) -> DataLossError:
        """The error for a stored value of this dir that does not read as its grammar says (meta_value), or that is
        missing; remedy: what to do about it."""
        return DataLossError(f"RocksDB in data dir {self.path} is damaged: {what}. `ps-server verify {self.path}` "
                             f"lists what is damaged; {remedy}")  # fmt: skip

    def meta_get(self, key: bytes, doing: str, default: Any = None, remedy: str = RESTORE_DIR) -> Any:
        """The value of key `key` in this dir's meta column family, read as its grammar says (meta_value; damaged's
        DataLossError, with remedy, where it does not read), or default where it is absent; doing: what a RocksDB
        error says was being done."""
        with self.rocksdb(doing, "nothing was read"):
            raw = self.meta_cf.get(key)
        return default if raw is None else meta_value(key, raw, lambda what: self.damaged(what, remedy))

    def meta_handle(self) -> Any:
        """The meta column family's handle, for a WriteBatch."""
        return self.db.get_column_family_handle(META_CF)

    def close(self, outcome: str) -> None:
        """Lets go of the meta column family (one held open keeps RocksDB's LOCK past the close), then closes
        RocksDB: its failure raised as rocksdb says, with outcome, the dir closed all the same."""
        self.meta_cf = None
        db, self.db = self.db, None
        with self.rocksdb("closing RocksDB", outcome):
            db.close()


PROC_LOCKS = "/proc/locks"
RECORD_LOCKS = ("POSIX", "OFDLCK")  # /proc/locks' kinds of lock that conflict with RocksDB's fcntl lock


def lock_holder(path: str, proc_locks: str = PROC_LOCKS) -> int | None:
    """The process holding a lock on the file at path (RocksDB's LOCK file), as the kernel's list of file locks
    shows it: its pid, 0 or less where the kernel shows none (a process of another container); None if no process
    holds one, or where that cannot be told (no such list: not Linux; the file gone). Only the locks that would refuse
    RocksDB's (an fcntl record lock: POSIX, or an open file description's, OFDLCK) count: an flock (a script's `flock
    LOCK ...`), a lease or an NFS delegation does not stop RocksDB. Reads the list only: opening the file and closing
    it would drop this process's own locks on it (POSIX record locks)."""
    try:
        st = os.stat(path)
        with open(proc_locks) as f:
            text = f.read()
    except OSError:
        return None
    file_id = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in text.splitlines():
        fields = line.split()  # "1: POSIX  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF"; a waiter's has "->"
        if len(fields) >= 6 and "->" not in fields and fields[1] in RECORD_LOCKS and fields[5] == file_id:
            with contextlib.suppress(ValueError):
                return int(fields[4])
    return None

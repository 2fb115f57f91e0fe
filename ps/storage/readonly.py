"""RocksDB opened read-only, with nothing written into what it reads (a checkpoint's shard folder, a data dir to
verify), and RocksDB's errors read as damage: whether a text tells of damage (is_damage), where (damage_at), an
open's failure with the write-ahead logs it replays named (open_failure), and the CheckpointDamagedError that names
a checkpoint's (reading_checkpoint, checkpoint_damaged, OddRows).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator

from ps.errors import CheckpointDamagedError, PsError, StorageError
from ps.rows.layout import RowLayout
from ps.storage.rocks import AccessType, Options, Rdict

log = logging.getLogger(__name__)

_NOT_IN_VIEW = re.compile(r"LOCK|LOG(\.old\..*)?|rocksdict-config\.json")  # files a read-only open may write


@contextlib.contextmanager
def opened_read_only(source: str, opts: Options | None = None) -> Iterator[tuple[Rdict, list[str], str]]:
    """(db, its column families' names, view) of the RocksDB at source (a checkpoint, or a data dir to verify)
    opened read-only, with nothing written into source: rocksdict rewrites rocksdict-config.json at every open,
    read-only ones too, which fails on a read-only disk and would change a checkpoint's checksummed files. So
    RocksDB opens `view`, a temporary directory of symlinks to source's files (RocksDB reads through them; what the
    open writes stays in the view), removed on exit. An exception leaving the block names source, not the view.
    Without a writable temporary directory, source itself is opened (a warning says so)."""
    opts = opts or Options(raw_mode=True)
    view = None
    try:
        view = tempfile.mkdtemp(prefix="sparseps-read-only-")
        if os.path.isdir(source):
            for name in os.listdir(source):
                full = os.path.join(os.path.abspath(source), name)
                if not _NOT_IN_VIEW.fullmatch(name) and os.path.isfile(full):
                    os.symlink(full, os.path.join(view, name))
    except OSError as e:
        log.warning("no temporary directory for a read-only view of %s (%s): opening it in place, which rewrites its "
                    "rocksdict-config.json", source, e)  # fmt: skip
        if view is not None:
            shutil.rmtree(view, ignore_errors=True)
        view = None
    except BaseException:  # a SIGTERM (ps.terminate) while the view is made: it goes too
        if view is not None:
            shutil.rmtree(view, ignore_errors=True)
        raise
    with contextlib.ExitStack() as cleanup:
        if view is not None:
            cleanup.callback(shutil.rmtree, view, True)
        else:
            view = source
        try:
            names = Rdict.list_cf(view, opts)
            db = Rdict(view, opts, column_families=dict.fromkeys(names, opts), access_type=AccessType.read_only())
        except Exception as e:  # rocksdict raises plain Exception
            raise Exception(str(e).replace(view, source)) from None
        try:
            yield db, names, view
        except StorageError:
            raise
        except Exception as e:
            if view not in str(e):
                raise
            raise Exception(str(e).replace(view, source)) from None
        finally:
            db.close()


def is_damage(text: str) -> bool:
    """Whether RocksDB's error text tells of damage it met: a block that fails its checks ("Corruption: ..."), or a
    file it needs gone."""
    return text.startswith("Corruption") or "No such file" in text


_DAMAGED_FILE = re.compile(r"(/\S*?(?:\.sst|\.log|\.blob|MANIFEST-\d+|CURRENT|OPTIONS-\d+))(?::|,|\s|$)")
_DAMAGED_OFFSET = re.compile(r"\boffset (\d+)")


def damage_at(text: str, base: str | None = None) -> str:
    """Where RocksDB's error text puts the damage: "FILE at offset N" for a block of a file (a data block whose
    checksum fails), "FILE" where it names a file and no offset, "" where it names none. base: FILE is given
    relative to it when it lies inside."""
    found = _DAMAGED_FILE.search(text)
    if found is None:
        return ""
    name = found.group(1)
    if base is not None and os.path.commonpath([os.path.abspath(base), name]) == os.path.abspath(base):
        name = os.path.relpath(name, base)
    offset = _DAMAGED_OFFSET.search(text, found.end(1))
    return f"{name} at offset {offset.group(1)}" if offset else name


def checkpoint_damaged(source: str) -> Callable[[str], CheckpointDamagedError]:
    """The error, given what is damaged, for a value in the checkpoint shard folder at source that does not read as
    its grammar says (a meta value: ps.storage.meta; a row's size): a CheckpointDamagedError naming the checkpoint
    and the shard's folder."""
    checkpoint, shard = os.path.split(os.path.abspath(source))
    return lambda what: _checkpoint_damage(checkpoint, shard, f"{shard}: {what}")


def _checkpoint_damage(checkpoint: str, where: str, what: str, more: str = "") -> CheckpointDamagedError:
    """The CheckpointDamagedError saying `what` is damaged in the checkpoint at checkpoint (where: the file, or the
    shard's folder), then `more` (sentences, each ending ". "), then which command lists everything damaged in it."""
    return CheckpointDamagedError(f"checkpoint {checkpoint} is damaged: {what}. {more}`ps-server verify {checkpoint}` "
                                  "lists everything damaged in it", checkpoint, where, what)  # fmt: skip


@contextlib.contextmanager
def reading_checkpoint(source: str) -> Iterator[tuple[Rdict, list[str], str]]:
    """opened_read_only of a checkpoint's shard folder, for a restore, an export or a save reading back what it
    wrote: RocksDB's errors about source (one it raises at the open, or one naming a file of source later; not
    those naming another dir, such as a restore's writes into its data dir) as a CheckpointDamagedError naming the
    checkpoint, the file and the offset for damage ("Corruption: ...", a file gone), or saying the checkpoint is
    gone where its shard's folder is no longer there (deleted or moved while read: no damage, which `ps-server
    verify` would not find), as a StorageError for anything else."""
    source = os.path.abspath(source)
    checkpoint, shard = os.path.split(source)
    opened = False

    def failed(text: str, doing: str) -> StorageError:
        if not is_damage(text):
            return StorageError(f"RocksDB cannot read checkpoint {checkpoint} ({shard}) while {doing}: {text}")
        if not os.path.isdir(source):  # no damage: the checkpoint, or its shard's folder, was deleted or moved
            gone = shard if os.path.isdir(checkpoint) else "the whole checkpoint"
            what = f"{gone} is no longer there (RocksDB, while {doing} {shard}: {text})"
            return CheckpointDamagedError(f"checkpoint {checkpoint} is gone: {what}: it was deleted or moved while "
                                          "being read. Keep a checkpoint in place while it is read", checkpoint,
                                          shard, what)  # fmt: skip
        where = damage_at(text, checkpoint) or f"{shard} (RocksDB names no file)"
        return _checkpoint_damage(checkpoint, where, f"{where} (RocksDB, while {doing}: {text})",
                                  "Nothing in it can be read past that point. A checkpoint's SST files are hard "
                                  "links to the shard's own when saved on its file system: `ps-server verify` that "
                                  "shard's data dir too. ")  # fmt: skip

    try:
        with opened_read_only(source) as opened_db:
            opened = True
            yield opened_db
    except PsError:
        raise
    except Exception as e:  # rocksdict raises plain Exception
        if not opened:
            raise failed(str(e), "opening it") from None
        if source not in str(e):
            raise
        raise failed(str(e), "reading it") from None


class OddRows:
    """The stored values of a checkpoint's table that are of neither size the config read with gives (layout: its
    RowLayout, whose sizes_at_rest are those sizes; None: unknown, no value is odd), as a restore or an export
    meets them: how many, and the first."""

    def __init__(self, layout: RowLayout | None) -> None:
        self.layout = layout
        self.sizes = layout.sizes_at_rest if layout is not None else None
        self.count, self.first, self.first_size = 0, b"", 0

    def saw(self, key: bytes, value: bytes) -> bool:
        """Whether key's value is of neither size (counted if so)."""
        if self.sizes is None or len(value) in self.sizes:
            return False
        if not self.count:
            self.first, self.first_size = key, len(value)
        self.count += 1
        return True

    def check(self, damaged: Callable[[str], CheckpointDamagedError], table: str, among: str = "") -> None:
        """damaged(what), naming the table, how many (among: of which slots, "" for all) and the first one's id,
        key and size, if any was seen."""
        if self.count:
            sizes = self.sizes
            raise damaged(
                f"table {table!r} holds {self.count:,} stored rows{among} of neither a trained row's size by the config read "
                f"with (its manifest's: {sizes.trained} bytes) nor a pending id's ({sizes.pending}), the first of id "
                f"{int.from_bytes(self.first[6:], 'big')} (key {self.first.hex()}, {self.first_size:,} bytes): its "
                f"rows are damaged, or its manifest does not match them{self.layout.written_with(self.first_size)}"
            )


def open_failure(path: str, e: Exception) -> str:
    """rocksdict's error at open, with the write-ahead logs named where RocksDB reports damage without a file
    (its "Corruption: checksum mismatch" of a damaged log record): an open reads the MANIFEST, named when it
    is the one, and replays those logs."""
    text = str(e)
    if not text.startswith("Corruption") or re.search(r"MANIFEST|CURRENT|OPTIONS|IDENTITY|\.sst|\.log|/", text):
        return text
    logs = sorted(f for f in os.listdir(path) if f.endswith(".log"))
    sizes = ", ".join(f"{f} ({os.path.getsize(os.path.join(path, f)):,} bytes)" for f in logs)
    return f"{text} (in no file RocksDB names; the write-ahead logs it replays at open: {sizes or 'none'})"

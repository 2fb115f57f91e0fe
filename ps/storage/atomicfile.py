"""write_text_whole, write_json_whole, replaced_whole: a file replaced whole, never seen half written; sync_file: a
file's data, sync_directory: a directory's entries (a rename into it), made durable; make_dirs: a directory and its
parents made, or why not (standard library only: the worker uses it too, ps.storage.sidefiles for
the files beside RocksDB, ps.checkpoint for a checkpoint's manifest, an export for its files)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import IO, Any

NAME_MAX_BYTES = 255  # the longest file name of Linux's file systems (ext4, xfs, btrfs, tmpfs), in bytes
RANDOM_CHARS = 8  # what tempfile.mkstemp puts between a temporary file's prefix and suffix


def name_within(name: str, room: int) -> str:
    """name, or, where it is longer than room bytes (as the file system has them), its start, "~" and 16 hex digits
    of its hash, room bytes at most (a UTF-8 name is cut between characters): the part of a temporary file's name
    that stands for the file it becomes, cut so that the whole keeps within NAME_MAX_BYTES (worker.temp_dirs'
    partial files, replaced_whole's)."""
    raw = os.fsencode(name)
    if len(raw) <= room:
        return name
    digest = hashlib.blake2b(raw, digest_size=8).hexdigest()
    head = raw[: room - 1 - len(digest)]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return os.fsdecode(head) + "~" + digest  # a name that is no UTF-8 keeps its bytes as they are
    return head.decode("utf-8", "ignore") + "~" + digest  # a character cut in two is left out whole


def temp_prefix_within(prefix: str, suffix: str = ".tmp") -> str:
    """replaced_whole's prefix for its temporary file, as name_within cuts it to leave room for mkstemp's random
    part and suffix (the prefix a search for the leftovers of a killed write looks for)."""
    return name_within(prefix, NAME_MAX_BYTES - RANDOM_CHARS - len(os.fsencode(suffix)))


def write_json_whole(path: str, obj: dict, sync_dir: bool = False, temp_prefix: str | None = None) -> None:
    """Replaces the file at path with obj as JSON and a newline, whole (write_text_whole)."""
    write_text_whole(path, json.dumps(obj) + "\n", sync_dir, temp_prefix)


def write_text_whole(path: str, text: str, sync_dir: bool = False, temp_prefix: str | None = None,
                     shared: bool = False) -> None:  # fmt: skip
    """Replaces the file at path with text (UTF-8), through replaced_whole: the temporary file fsynced before it is
    renamed over path. A failure (text that is not UTF-8 included) leaves path as it was. sync_dir: fsync the
    directory too, so the rename itself survives a power loss. shared: as replaced_whole's."""
    data = text.encode("utf-8")  # before any file is made
    with replaced_whole(path, temp_prefix, shared=shared) as tmp, open(tmp, "wb") as f:
        f.write(data)
        sync_file(f)
    if sync_dir:
        sync_directory(os.path.dirname(path) or ".")


@contextlib.contextmanager
def replaced_whole(path: str, temp_prefix: str | None = None, suffix: str = ".tmp",
                   shared: bool = False) -> Iterator[str]:  # fmt: skip
    """Yields the path of a new, empty temporary file in path's directory (named temp_prefix + random + suffix;
    None: the file's name and a dot; a prefix too long for the whole to fit in a file name is cut, as
    temp_prefix_within says) for the block to write; renames it over path once the block ends, and removes
    it if the block raises (a stop included), leaving path as it was. The file is its owner's alone (0600), unless
    shared: then its mode is what open() would give a new file (0666 less the umask), for a file other users read.
    The block fsyncs what it wrote where that must survive a power loss."""
    directory = os.path.dirname(path) or "."
    prefix = temp_prefix_within(temp_prefix if temp_prefix is not None else os.path.basename(path) + ".", suffix)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    try:
        if shared:
            os.fchmod(fd, 0o666 & ~_umask())
        os.close(fd)
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def make_dirs(path: str, what: str) -> None:
    """os.makedirs(path, exist_ok=True); where path cannot be made, a ValueError naming what (the flag or the role:
    "--out", "data dir"), path, the reason and the part of path at fault."""
    try:
        os.makedirs(path, exist_ok=True)
    except (NotADirectoryError, FileNotFoundError, FileExistsError) as e:  # a file on the way, say
        raise ValueError(f"{what} {path} cannot be created: {e.strerror} ({e.filename}); give a path whose parents "
                         "are directories") from None  # fmt: skip
    except OSError as e:  # a read-only file system, no permission, ...
        raise ValueError(f"{what} {path} cannot be created: {e.strerror} ({e.filename}); give a path on a writable "
                         "file system where this user may create it") from None  # fmt: skip


def sync_file(f: IO[Any]) -> None:
    """Writes f's buffer out and fsyncs it: its data is on disk before it is renamed into place."""
    f.flush()
    os.fsync(f.fileno())


def sync_directory(directory: str) -> None:
    """fsyncs directory, so that the files created, renamed or removed in it stay so after a power loss (OSError
    if it cannot be opened or synced)."""
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _umask() -> int:
    """The process's umask (Linux reads it from /proc without changing it; elsewhere it is set and put back)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask

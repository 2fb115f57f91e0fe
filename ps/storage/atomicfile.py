"""write_text_whole, write_json_whole: a file replaced whole, never seen half written; sync_file: a file's data,
sync_directory: a directory's entries (a rename into it), made durable (standard library only: the worker uses it too, ps.storage.sidefiles for
the files beside RocksDB, ps.checkpoint for a checkpoint's manifest, an export for its files)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import IO, Any


def write_json_whole(path: str, obj: dict, sync_dir: bool = False, temp_prefix: str | None = None) -> None:
    """Replaces the file at path with obj as JSON and a newline, whole (write_text_whole)."""
    write_text_whole(path, json.dumps(obj) + "\n", sync_dir, temp_prefix)


def write_text_whole(path: str, text: str, sync_dir: bool = False, temp_prefix: str | None = None,
                     shared: bool = False) -> None:  # fmt: skip
    """Replaces the file at path with text (UTF-8): a temporary file in the same directory (named temp_prefix +
    random + ".tmp"; None: the file's name and a dot), fsynced, then renamed over it. A failure (text that is not
    UTF-8 included) removes the temporary file and leaves path as it was. sync_dir: fsync the directory too, so the
    rename itself survives a power loss. The file is its owner's alone (0600), unless shared: then its mode is
    what open() would give a new file (0666 less the umask), for a file other users read."""
    data = text.encode("utf-8")  # before any file is made
    directory = os.path.dirname(path) or "."
    prefix = temp_prefix if temp_prefix is not None else os.path.basename(path) + "."
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    try:
        if shared:
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            sync_file(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if sync_dir:
        sync_directory(directory)


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

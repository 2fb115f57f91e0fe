"""Leftovers: what a writer killed mid-write (SIGKILL, a power loss) left of its temporary files, removed by the
next writer once it can prove that no writer uses them, with one log line naming each and its size.

Each temp-then-rename writer names its temporary files with a pattern of its own, beside the final file; each
pattern is described where it is produced (ps.storage.sidefiles, ps.engine.restore.export, worker/export.py,
worker/temp_dirs). What proves that none is in use:
- in a data dir: this server holds RocksDB's LOCK on it (one server a dir), so Store removes them once it opened it;
- in an export's OUT: a flock on the directory OUT itself. Every writer into OUT (`ps-server export`, `ps-worker
  export`) holds a shared one while it writes there (`claimed`), so an exclusive one, had for a moment before it
  writes, proves that no other is there. Where none can be had (another export writes into OUT now, or the file
  system has no flock on directories, as NFS), the leftovers are reported and left.
- a worker's own files (an export's fresh checkpoint, predict's .partial file) name its process and host: those
  of this host whose process is gone (worker/temp_dirs).
Stdlib only: worker/ uses it too (its own export's leftovers).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator

if os.name == "posix":
    import fcntl

log = logging.getLogger(__name__)
# The temporary files of an export in its OUT (described where they are written: ps.engine.restore.export, and
# worker/export.py's export.json.tmp), which every writer into OUT removes under its claim.
EXPORT_TEMPORARY = re.compile(r".+\.(?:ids|rows)\.npy\.tmp|export\.json\.tmp")


def holds_an_export(out: str, also: re.Pattern[str] | None = None) -> bool:
    """Whether out is an export's folder, whose leftovers an export may remove: it holds export.json (an earlier
    export), or nothing but names of an export's temporary files (EXPORT_TEMPORARY, or `also`: a caller's own
    temporary names). A folder of anything else is the user's, and names in it that merely look like
    temporary files are not touched."""
    try:
        names = os.listdir(out)
    except OSError:
        return False
    if "export.json" in names:
        return True
    return all(EXPORT_TEMPORARY.fullmatch(n) or (also is not None and also.fullmatch(n)) for n in names)


def matching(directory: str, pattern: re.Pattern[str]) -> list[str]:
    """The paths of the entries directly in directory whose names fullmatch pattern and that are files or folders
    (not links: a link is nobody's temporary file), in name order; [] if directory cannot be listed."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if pattern.fullmatch(name) and (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            out.append(path)
    return out


def size_bytes(path: str) -> int:
    """Bytes in the file at path, or in the files under the folder at path (links not followed)."""
    if not os.path.isdir(path) or os.path.islink(path):
        with contextlib.suppress(OSError):
            return os.lstat(path).st_size
        return 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def remove(paths: list[str], whose: str) -> list[str]:
    """Removes each path (a file, or a folder and all under it), logging a WARNING that names it, its size and
    whose it was ("an export killed mid-write", say); returns those removed. One that cannot be removed is
    logged and left."""
    removed = []
    for path in paths:
        size = size_bytes(path)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        except FileNotFoundError:  # another run removed it first
            continue
        except OSError as e:
            log.warning("could not remove %s (%s bytes), left by %s: %s", path, f"{size:,}", whose, e)
            continue
        log.warning("removed %s (%s bytes), left by %s", path, f"{size:,}", whose)
        removed.append(path)
    return removed


def report(paths: list[str], why: str) -> None:
    """Logs a WARNING for each path, naming it and its size, saying why it is left as it is."""
    for path in paths:
        log.warning("left %s (%s bytes) as it is: %s", path, f"{size_bytes(path):,}", why)


@contextlib.contextmanager
def claimed(directory: str, leftovers: Callable[[], list[str]], whose: str) -> Iterator[None]:
    """Holds a shared flock on the folder directory while the block runs (other writers into it see one is
    there). First, under an exclusive flock had at once (no other writer holds one), removes leftovers() (paths in
    directory that only a dead writer can have left; whose: see remove); if none can be had, reports them and
    leaves them. Without flock (not POSIX), or where directory cannot be opened, leftovers() is reported only."""
    fd = None
    if os.name == "posix":
        with contextlib.suppress(OSError):
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        alone = False
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                alone = True
            except OSError:  # BlockingIOError: another writer is there; others: no flock on this file system
                pass
        if alone:
            remove(leftovers(), whose)
        else:
            report(leftovers(), f"another writer may be using it (a lock on {directory} is held, or none can be had)")
        if fd is not None:
            with contextlib.suppress(OSError):  # from exclusive to shared; waits only for another's removal
                fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        if fd is not None:
            os.close(fd)

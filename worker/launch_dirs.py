"""The temporary directory of a `ps-worker launch` (its workers' --metrics-out files), and the removal of those that
earlier launches left behind.

    <tmp>/sparseps-launch-<pid>-<host>-<random>    <pid>: the launch's process; <host>: this machine's name

A launch removes its directory on the way out, also on Ctrl-C and SIGTERM; a launch killed by SIGKILL cannot. The
next launch on the host removes every such directory whose <pid> no longer runs (os.kill(pid, 0)), if it is a
directory (not a link) owned by this user, and logs each removal. Directories of other hosts (a /tmp shared by
containers, whose pids are not comparable) and of running processes are left alone; a pid taken again by another
process keeps its directory until that process ends, which errs on the safe side.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import stat
import tempfile

log = logging.getLogger("worker.launch")
PREFIX = "sparseps-launch-"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "localhost"


def make_launch_dir() -> str:
    """A new directory under the temporary directory, named after this process and host (see the module
    docstring)."""
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{_host()}-")


def remove_stale_launch_dirs(root: str | None = None) -> list[str]:
    """Removes the directories under root (default: the temporary directory) that launches on this host left
    behind and whose process is gone; returns their paths. One that cannot be removed is logged and left."""
    root = root or tempfile.gettempdir()
    pattern = re.compile(re.escape(PREFIX) + r"(\d{1,10})-" + re.escape(_host()) + r"-[A-Za-z0-9_]+")
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    removed = []
    for name in names:
        m = pattern.fullmatch(name)
        path = os.path.join(root, name)
        if m is None or _running(int(m.group(1))) or not _own_directory(path):
            continue
        try:
            shutil.rmtree(path)
        except FileNotFoundError:  # another launch removed it first
            continue
        except OSError as e:
            log.warning("could not remove %s, left by an earlier launch (pid %s): %s", path, m.group(1), e)
            continue
        log.warning("removed %s, left by an earlier launch (pid %s) that is gone", path, m.group(1))
        removed.append(path)
    return removed


def _running(pid: int) -> bool:
    """Whether a process pid exists (this one included; any pid that cannot be asked about counts as running)."""
    if pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _own_directory(path: str) -> bool:
    """Whether path is a directory, not a link to one, owned by this user."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()

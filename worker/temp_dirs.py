"""The temporary directories of a run, and the removal of those that earlier runs left behind.

    <tmp>/sparseps-<kind>-<pid>-<host>-<random>    <kind>: "launch" (a `ps-worker launch`'s workers' --metrics-out
                                                   files) or "local" (the shards of --local-shards: data dirs and
                                                   logs); <pid>: the run's process; <host>: this machine's name
    <dir>/LOCK                                     empty; the run holds an exclusive flock on it (and so do its
                                                   local shards, which inherit the descriptor) while it uses <dir>
    <dir>/KEPT                                     a note: the directory was left on purpose (a shard failed to
                                                   start and the error names its log here)
    <OUT>/checkpoint.new-<pid>-<host>-<8 hex>      the checkpoint a `ps-worker export` (process <pid>) has its
                                                   servers save into OUT and exports; moved into
                                                   the export's folder (--keep-checkpoint) or removed at its end
                                                   (export_checkpoint_dir)
    <dir of F>/.<name of F>.<pid>-<host>-<8 hex>.partial   the rows `ps-worker predict` (process <pid>) writes
                                                   for its --out F, renamed to F once whole (partial_file); a
                                                   name of F past PARTIAL_NAME_BYTES bytes stands there as its
                                                   start, "~" and 16 hex digits of its hash, so that the whole
                                                   fits in a file name (255 bytes)

A run removes its directory on the way out, also on Ctrl-C and SIGTERM; a run killed by SIGKILL cannot (its
local shards stop with it, their stdin pipe closed, but may still be flushing). The next launch, or train with
--local-shards, on the host removes every such directory whose <pid> no longer runs (os.kill(pid, 0)) and whose
LOCK nobody holds, if it is a directory (not a link) owned by this user without a KEPT note, and logs each
removal. Directories of other hosts, of running processes, in use (a shard of a killed run still stopping; a run
in a container sharing /tmp, whose pids are not comparable), and kept ones are left alone; a pid taken again by
another process keeps its directory until that process ends, which errs on the safe side.

A `ps-worker export` killed by SIGKILL leaves its OUT/checkpoint.new-...: the next export into OUT removes those
of this host whose <pid> no longer runs (dead_export_checkpoints), under its claim on OUT (refused while another
export holds one: a running export holds its claim for its whole run, and the `ps-server export` a killed worker
started, which runs on, holds it too: ps.storage.leftovers); it reports the others (of a running export, of
another host, or named without a <pid>) and leaves them. Likewise, the next predict into F
removes the .partial files of F of this host whose <pid> no longer runs (dead_partial_files).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable

from ps.storage.atomicfile import NAME_MAX_BYTES, name_within
from ps.storage.leftovers import EXPORT_CHECKPOINT, matching

if os.name == "posix":
    import fcntl

log = logging.getLogger("worker.temp_dirs")
KINDS = ("launch", "local")
KEPT = "KEPT"  # the note in a directory left on purpose
LOCK = "LOCK"  # flocked while the directory is in use


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "localhost"


def make_temp_dir(kind: str) -> tuple[str, int]:
    """A new directory of kind (KINDS) under the temporary directory, named after this process and host, and a
    descriptor holding the flock on its LOCK (see the module docstring): close it once the directory is removed
    or left for good. Child processes given the descriptor (pass_fds) hold the lock too."""
    if kind not in KINDS:
        raise ValueError(f"temporary directory kind {kind!r}, expected one of {list(KINDS)}")
    path = tempfile.mkdtemp(prefix=f"sparseps-{kind}-{os.getpid()}-{_host()}-")
    fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    if os.name == "posix":
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return path, fd


def keep(path: str, why: str) -> None:
    """Leaves a KEPT note in path saying why: remove_stale_temp_dirs leaves the directory alone."""
    try:
        with open(os.path.join(path, KEPT), "w") as f:
            f.write(why + "\n")
    except OSError as e:
        log.warning("could not write %s in %s: %s", KEPT, path, e)


def remove_stale_temp_dirs(root: str | None = None) -> list[str]:
    """Removes the directories under root (default: the temporary directory) that runs on this host left behind
    and whose process is gone, but kept ones; returns their paths. One that cannot be removed is logged and
    left."""
    root = root or tempfile.gettempdir()
    kinds = "|".join(KINDS)
    pattern = re.compile(rf"sparseps-(?:{kinds})-(\d{{1,10}})-" + re.escape(_host()) + r"-[A-Za-z0-9_]+")
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
        if os.path.lexists(os.path.join(path, KEPT)) or _in_use(path):
            continue
        try:
            shutil.rmtree(path)
        except FileNotFoundError:  # another run removed it first
            continue
        except OSError as e:
            log.warning("could not remove %s, left by an earlier run (pid %s): %s", path, m.group(1), e)
            continue
        log.warning("removed %s, left by an earlier run (pid %s) that is gone", path, m.group(1))
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


def _in_use(path: str) -> bool:
    """Whether a process holds the flock on path's LOCK (a directory without one, or where flock is unknown, is
    not in use)."""
    if os.name != "posix":
        return False
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def _own_directory(path: str) -> bool:
    """Whether path is a directory, not a link to one, owned by this user."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def export_checkpoint_dir(out: str) -> str:
    """The path of the fresh checkpoint of this process's export into out (module docstring)."""
    return os.path.join(out, _own_name(EXPORT_CHECKPOINT))


def dead_export_checkpoints(out: str) -> tuple[list[str], list[str]]:
    """(dead, others): the paths of the fresh checkpoints in out of exports on this host whose process is gone,
    and of the other folders named checkpoint.new-* there (a running export's, another host's, or one named
    otherwise, with no process to ask about), whose writer may be alive."""
    return _of_gone_runs(out, EXPORT_CHECKPOINT, "", os.path.isdir)


# what a partial file's name adds to out's: ".", then ".<pid: up to 10 digits>-<host: up to 64>-<8 hex>.partial"
PARTIAL_NAME_BYTES = NAME_MAX_BYTES - len(f"..{'9' * 10}-{'h' * 64}-{'0' * 8}.partial")


def partial_file(out: str) -> str:
    """The path of the file this process writes the rows of its output file out into (module docstring)."""
    folder, name = os.path.split(os.path.abspath(out))
    return os.path.join(folder, _own_name(f".{_partial_stem(name)}.", ".partial"))


def dead_partial_files(out: str) -> tuple[list[str], list[str]]:
    """(dead, others): the partial files of out of runs on this host whose process is gone and that no process
    holds a flock on (hold_while_written: a run of another pid namespace with this host name, as a container on
    the host's network, holds its own), and the other .<name>.*.partial files beside out (a running one's,
    another host's, or one named otherwise, with no process to ask about), whose writer may be alive."""
    folder, name = os.path.split(os.path.abspath(out))
    return _of_gone_runs(folder, f".{_partial_stem(name)}.", ".partial",
                         lambda path: os.path.isfile(path) and not _locked(path))  # fmt: skip


def _partial_stem(name: str) -> str:
    """name as its partial files' names hold it: itself, or one past PARTIAL_NAME_BYTES bytes cut (name_within)."""
    return name_within(name, PARTIAL_NAME_BYTES)


def _own_name(prefix: str, suffix: str = "") -> str:
    """prefix<pid>-<host>-<8 hex>suffix: a name of this process's, which _of_gone_runs can tell is of a gone one."""
    return f"{prefix}{os.getpid()}-{_host()}-{secrets.token_hex(4)}{suffix}"


def _of_gone_runs(
    folder: str, prefix: str, suffix: str, removable: Callable[[str], bool]
) -> tuple[list[str], list[str]]:
    """(dead, others) of the entries of folder named prefix*suffix: dead, those named by _own_name of a process of
    this host that no longer runs and that removable(path) accepts (of the right kind, not in use); others, the
    rest (a running process's, another host's, named otherwise), whose writer may be alive."""
    own = re.compile(re.escape(prefix) + r"(\d{1,10})-" + re.escape(_host()) + r"-[0-9a-f]{8}" + re.escape(suffix))
    dead, others = [], []
    for path in matching(folder, re.compile(re.escape(prefix) + ".+" + re.escape(suffix))):
        m = own.fullmatch(os.path.basename(path))
        (dead if m is not None and not _running(int(m.group(1))) and removable(path) else others).append(path)
    return dead, others


def hold_while_written(fd: int) -> None:
    """Takes an exclusive flock on the open file fd, held until it is closed: dead_partial_files leaves a file so
    held (where flock works; elsewhere nothing is taken and the pid alone decides)."""
    if os.name == "posix":
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass


def _locked(path: str) -> bool:
    """Whether some open file holds a flock on path (False where none can be asked about)."""
    if os.name != "posix":
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True  # cannot look: left alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no flock here
        return False
    finally:
        os.close(fd)
    return False

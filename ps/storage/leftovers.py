"""Leftovers: what a writer killed mid-write (SIGKILL, a power loss) left of its temporary files, removed by the
next writer once it can prove that no writer uses them, with one log line naming each and its size.

Each temp-then-rename writer names its temporary files with a pattern of its own, beside the final file; each
pattern is described where it is produced (ps.storage.sidefiles, ps.engine.export.export, worker/export.py,
worker/temp_dirs). What proves that none is in use:
- in a data dir: this server holds RocksDB's LOCK on it (one server a dir), so Store removes them once it opened it;
- in an export's OUT: a flock on the directory OUT itself. Every writer into OUT (`ps-server export`, `ps-worker
  export`) holds an exclusive one while it writes there (`claimed`; `ps-worker export` passes its own on to the
  `ps-server export` it runs), so no other is there; one that finds it held is refused (ClaimedError). Where no
  flock can be had (a file system that refuses it), the leftovers are reported and left, and the writer says it
  holds no claim; where the file system keeps flocks on each machine (NFS's on a directory), writers on two
  machines do not see each other's, which nothing here can detect (see claimed).
- a worker's own files (an export's fresh checkpoint, predict's .partial file) name its process and host: those
  of this host whose process is gone (worker/temp_dirs).
Stdlib only (and ps.storage.atomicfile): worker/ uses it too (its own export's leftovers).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import stat
from collections.abc import Callable, Iterator
from typing import IO, Any

from ps.storage.atomicfile import sync_directory, sync_file

if os.name == "posix":
    import fcntl

log = logging.getLogger(__name__)
# An export's OUT (ps.engine.export.export): export.json names ("dir") the folder export-<8 hex> of the export's
# .npy files; export.json.tmp is the export.json an export writes before it renames it into place (worker/export.py's
# too). The temporary file, and every export-<8 hex> folder that export.json does not name (an export killed before
# its export.json was in place, or before it removed the folder of the export it replaced), are what killed exports
# left, which every writer into OUT removes under its claim (export_leftovers); where export.json names no folder
# there (damaged), no folder is removed, nor one that holds a checkpoint other than ps-worker export's fresh one
# (MOVED_CHECKPOINT).
EXPORT_TEMPORARY = re.compile(r"export\.json\.tmp")
EXPORT_FILES = re.compile(r"export-[0-9a-f]{8}")
# the names either of them takes: no content of OUT to an export without --overwrite (a killed export's, which it
# removes, or the export's in place, which export.json stands for)
EXPORT_OWN = re.compile(f"{EXPORT_TEMPORARY.pattern}|{EXPORT_FILES.pattern}")
# ps-worker export's fresh checkpoint in its OUT, checkpoint.new-<pid>-<host>-<8 hex> (worker/temp_dirs)
EXPORT_CHECKPOINT = "checkpoint.new-"
EXPORT_CHECKPOINT_NAME = re.compile(re.escape(EXPORT_CHECKPOINT) + r".+")
# A folder of export files holds this note, {"from": where the checkpoint comes from}, fsynced, before an export moves
# a checkpoint into it (<folder>/checkpoint): its absolute path, or, for one moved out of a folder kept so (a killed
# export's, below), what that folder's note says (null where it has none: unknown; checkpoint_origin). A folder that no
# export.json names and that holds a checkpoint is removed as a leftover (export_leftovers) only where its note names
# ps-worker export's fresh checkpoint in OUT (is_export_checkpoint); else it may hold the user's only copy (`ps-server
# export --move-checkpoint`; without a note: an export of a version that wrote none, or a damaged note): it is never
# removed, but reported with where to move the checkpoint back. Once export.json names the folder, the note is renamed
# EXPORTED_CHECKPOINT: the checkpoint is the export's, and goes with its folder (a folder an export replaced, left by a
# kill, goes too).
MOVED_CHECKPOINT = "moved-checkpoint.json"
EXPORTED_CHECKPOINT = "exported-checkpoint.json"


def open_temporary(path: str, mode: str = "wb", **options: Any) -> IO[Any]:
    """A new regular file at path, opened for writing, never through a link: an earlier regular file there (what
    a killed writer left) is replaced; a link, a folder or anything else there is no writer's temporary file, and
    is refused with an OSError naming it, left as it is (writing through a link would change a file elsewhere).
    options: open()'s (encoding, errors, newline) for a text mode."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            kind = "a link" if stat.S_ISLNK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else "no file"
            raise OSError(f"{path} is {kind}, where this writer keeps its temporary file: it is left as it is; "
                          "remove it (it is not one this program wrote) and run again")  # fmt: skip
        os.remove(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o644), mode, **options)


def holds_an_export(out: str, also: re.Pattern[str] | None = None) -> bool:
    """Whether out is an export's folder, whose leftovers an export may remove: it holds export.json (an earlier
    export), or nothing but an export's temporary files (regular files named as EXPORT_TEMPORARY says), folders of
    export files (EXPORT_FILES) and folders named as `also` says (a caller's own temporary folders). A folder of
    anything else is the user's, and names in it that merely look like temporary files are not touched."""
    try:
        names = os.listdir(out)
    except OSError:
        return False
    if "export.json" in names:
        return True
    ours = set(matching(out, EXPORT_TEMPORARY, files=True)) | set(matching(out, EXPORT_FILES, dirs=True))
    ours |= set(matching(out, also, dirs=True) if also else ())
    return all(os.path.join(out, n) in ours for n in names)


def read_export_json(out: str) -> dict:
    """out's export.json, read as JSON; {} where there is none or it does not read as a JSON object."""
    try:
        with open(os.path.join(out, "export.json")) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def export_in_place(out: str) -> str | None:
    """The folder of the export in place in out, as its export.json names it (export_files_dir), or None."""
    return export_files_dir(read_export_json(out))


def export_files_dir(info: dict) -> str | None:
    """The name of the folder of export files (EXPORT_FILES) that an export.json (read_export_json's) names ("dir"),
    or None where it names no such folder (an export.json without "dir" keeps its .npy files in out itself; one
    whose "dir" is no such name is damaged)."""
    name = info.get("dir")
    return name if isinstance(name, str) and EXPORT_FILES.fullmatch(name) else None


def export_leftovers(out: str, also: re.Pattern[str] | None = None) -> list[str]:
    """What exports killed mid-write left in out, if out is an export's folder (holds_an_export, `also` as there):
    its temporary files (EXPORT_TEMPORARY), and the folders of export files (EXPORT_FILES) that are no export's in
    place: every one where out holds no export.json, every one but the folder named where it names one that is
    there. An export.json that names none there (damaged, or of an export without "dir") proves none of them a
    killed export's: they are reported and left (the export that replaces it names its own, and the one after
    removes them, superseded). A folder that holds a checkpoint other than ps-worker export's fresh one, moved there
    by a killed export (moved_checkpoint_origin), is never one of them: it is reported, saying where to move the
    checkpoint back. Only
    a writer that holds out alone (claimed) may remove them: another's may be writing them now."""
    if not holds_an_export(out, also):
        return []
    temporary, dirs = matching(out, EXPORT_TEMPORARY, files=True), matching(out, EXPORT_FILES, dirs=True)
    if os.path.lexists(os.path.join(out, "export.json")):
        live = export_in_place(out)
        if live is None or os.path.join(out, live) not in dirs:
            report(dirs, f"{os.path.join(out, 'export.json')} names no folder of export files there (it is damaged, "
                         "or an export's without \"dir\"), so none is known to be a killed export's; once an export "
                         "names its own, the next removes them")  # fmt: skip
            return temporary
        dirs = [p for p in dirs if os.path.basename(p) != live]
    users = []
    for path in dirs:
        origin = moved_checkpoint_origin(path)
        if origin is not None and not is_export_checkpoint(origin, out):
            checkpoint = os.path.join(path, "checkpoint")
            back = f"move it back (mv {checkpoint} {origin})" if origin else "move it where you keep checkpoints"
            report([path], f"it holds {checkpoint}, your checkpoint, which an export killed mid-write (ps-server "
                           f"export --move-checkpoint) moved there from {origin or 'a place its folder does not name'}"
                           f": it is never removed; {back}, then remove {path}")  # fmt: skip
            users.append(path)
    return temporary + [p for p in dirs if p not in users]


def note_moved_checkpoint(folder: str, checkpoint: str) -> None:
    """Writes, fsynced, folder's MOVED_CHECKPOINT note that the checkpoint at the path checkpoint is moved into it
    (folder/checkpoint, folder directly in the OUT exported into), naming where it comes from (checkpoint_origin)."""
    with open(os.path.join(folder, MOVED_CHECKPOINT), "x") as f:
        json.dump({"from": checkpoint_origin(checkpoint, os.path.dirname(os.path.abspath(folder)))}, f)
        sync_file(f)
    sync_directory(folder)  # on disk before the checkpoint's rename into folder


def moved_checkpoint_origin(folder: str) -> str | None:
    """Where the checkpoint in folder (one of export files), folder/checkpoint, was moved from, as its
    MOVED_CHECKPOINT note says ("" where the note is missing or does not read); None where folder holds no
    checkpoint, or one an export in place held (EXPORTED_CHECKPOINT)."""
    if not os.path.lexists(os.path.join(folder, "checkpoint")) or os.path.lexists(
        os.path.join(folder, EXPORTED_CHECKPOINT)
    ):
        return None
    try:
        with open(os.path.join(folder, MOVED_CHECKPOINT)) as f:
            origin = json.load(f)["from"]
    except (OSError, ValueError, TypeError, KeyError):
        return ""
    return origin if isinstance(origin, str) else ""


def checkpoint_origin(checkpoint: str, out: str | None = None) -> str | None:
    """Where the checkpoint at the path checkpoint comes from: its absolute path, unless it is the checkpoint of a
    folder of export files kept as a killed export left it (<folder>/checkpoint, where moved_checkpoint_origin is not
    None and no export.json beside the folder names it), which is a place to move it back from, not its origin: then
    what that folder's note names (None where it has none that reads: unknown). A folder is one of export files
    only where its parent is an export's folder (holds_an_export, ps-worker export's fresh checkpoints counted as
    its: EXPORT_CHECKPOINT_NAME, as worker/export.py counts them) or out (the OUT an export writes into): a user's
    folder named alike (/ckpts/export-20241231) is not."""
    path = os.path.abspath(checkpoint)
    folder = os.path.dirname(path)
    if os.path.basename(path) != "checkpoint" or not EXPORT_FILES.fullmatch(os.path.basename(folder)):
        return path
    parent = os.path.dirname(folder)
    if not holds_an_export(parent, EXPORT_CHECKPOINT_NAME) and (
        out is None or os.path.realpath(parent) != os.path.realpath(out)
    ):
        return path
    origin = moved_checkpoint_origin(folder)
    if origin is None or export_in_place(os.path.dirname(folder)) == os.path.basename(folder):
        return path
    return origin or None


def check_no_named_checkpoint_left(out: str, checkpoint: str | None = None) -> None:
    """ValueError where out holds a `checkpoint` folder that out's export.json names as its checkpoint, and an
    export of the checkpoint at the path checkpoint (None: one of none there) would leave it behind, named by
    nothing: an export of an earlier version kept its checkpoint there (`ps-worker export --keep-checkpoint`), or
    the export in place was made from it. Which of the two it is cannot be told, and an export never removes what
    may be the user's only copy of a checkpoint; only an export of that checkpoint itself goes ahead, which the
    message names as the way to make it the export's own (moved into its folder)."""
    kept = os.path.join(out, "checkpoint")
    named = read_export_json(out).get("checkpoint")
    if not os.path.lexists(kept) or not isinstance(named, str) or not named:
        return
    if os.path.realpath(named) != os.path.realpath(kept):
        return
    if checkpoint is not None and os.path.realpath(checkpoint) == os.path.realpath(kept):
        return
    make_it_the_exports = f"ps-server export {shlex.quote(kept)} --out {shlex.quote(out)} --move-checkpoint --overwrite"
    raise ValueError(f"{kept} is the checkpoint {os.path.join(out, 'export.json')} names: one an export of an "
                     "earlier version kept there (ps-worker export --keep-checkpoint), or the one the export in place "
                     "was made from. This export would leave it behind, named by nothing, and it removes no "
                     "checkpoint that may be your only copy: move it where you keep checkpoints (or remove it, if it "
                     "is a kept copy you do not need), then export again; or make it the export's own: "
                     f"`{make_it_the_exports}` exports it, moved into the new export's folder, which a later export "
                     f"into {out} removes with it. Nothing was written")  # fmt: skip


def is_export_checkpoint(checkpoint: str, out: str) -> bool:
    """Whether checkpoint is a ps-worker export's fresh checkpoint in out (EXPORT_CHECKPOINT_NAME, directly in it),
    which no one but that export holds."""
    path = os.path.abspath(checkpoint)
    parent = os.path.realpath(os.path.dirname(path))
    return parent == os.path.realpath(out) and EXPORT_CHECKPOINT_NAME.fullmatch(os.path.basename(path)) is not None


def matching(directory: str, pattern: re.Pattern[str], files: bool = False, dirs: bool = False) -> list[str]:
    """The paths of the entries directly in directory whose names fullmatch pattern and that are regular files
    (files) or folders (dirs), either without them (never links: a link is nobody's temporary file), in name
    order; [] if directory cannot be listed."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    kinds = [k for k, wanted in ((stat.S_ISREG, files), (stat.S_ISDIR, dirs)) if wanted or not (files or dirs)]
    out = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if pattern.fullmatch(name) and any(kind(mode) for kind in kinds):
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


def remove_folder(path: str) -> None:
    """shutil.rmtree(path), its `checkpoint` (an export's folder's) first: a kill meanwhile leaves the folder's
    note (MOVED_CHECKPOINT, EXPORTED_CHECKPOINT), which says whose the checkpoint is, while any of it is left."""
    checkpoint = os.path.join(path, "checkpoint")
    if os.path.isdir(checkpoint) and not os.path.islink(checkpoint):
        shutil.rmtree(checkpoint)
    shutil.rmtree(path)


def remove(paths: list[str], whose: str) -> list[str]:
    """Removes each path (a file, or a folder and all under it), logging a WARNING that names it, its size and
    whose it was ("an export killed mid-write", say); returns those removed. One that cannot be removed is
    logged and left."""
    removed = []
    for path in paths:
        size = size_bytes(path)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                remove_folder(path)
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


class ClaimedError(OSError):
    """Another writer holds its claim on the folder (claimed): it writes there now."""


@contextlib.contextmanager
def claimed(
    directory: str,
    leftovers: Callable[[], list[str]],
    whose: str,
    fd: int | None = None,
    check: Callable[[], None] | None = None,
    unclaimed: bool = False,
) -> Iterator[int | None]:
    """Holds an exclusive flock on the folder directory while the block runs, had at once: no other writer is
    there, so first it runs check() (what directory must hold for the writer to go ahead, seen under the claim: an
    error it raises refuses, nothing changed), then removes leftovers() (paths in directory that only a dead writer
    can have left; whose: see remove). ClaimedError, nothing changed, where another writer holds it. Without flock
    (not POSIX, a file system that refuses it on directories), or where directory cannot be opened, check() runs,
    leftovers() is reported only, and a WARNING says that the writer goes ahead holding no claim. A flock excludes
    only those who take one where it is kept: on a network file system that keeps it on each machine (NFS's flock
    on a directory, or a mount with local_lock=flock or all; Lustre's localflock), a writer on another machine is
    not kept out, and nothing here can tell. Yields the
    descriptor the flock is held by (None where none is): a child process given it (pass_fds) holds the claim
    too, and claims the folder through it (fd: such a descriptor, of directory, which this leaves open; a
    ValueError where it is none). unclaimed: the writer that runs this one found that no lock on directory can be
    had, and said so and reported leftovers() itself (ps-worker export's `ps-server export`): the flock is tried all
    the same (a claim, or ClaimedError, as above, where one is had after all: a user's --unclaimed on a file system
    that keeps flocks), and only where none is had is nothing said again."""
    if unclaimed and fd is not None:
        raise ValueError(f"descriptor {fd} is given as the claim on {directory}, which is also said to have none")
    own, why = fd is None, "no flock on this system"  # why: where none is had
    if not own:
        _check_descriptor_of(fd, directory)
    elif os.name == "posix":
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            why = f"the folder does not open: {e.strerror or e}"
    try:
        alone = False
        if fd is not None and os.name == "posix":
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # had already where fd is one holding it
                alone = True
            except BlockingIOError:
                raise ClaimedError(f"another export into {directory} runs now (it holds a lock on the folder): wait "
                                   "for it to end, or give another directory; nothing was written") from None  # fmt: skip
            except OSError as e:  # a file system that refuses flock (Lustre without -o flock: ENOSYS)
                why = f"its file system refuses flock: {e.strerror or e}"
        if check is not None:
            check()
        if alone:
            remove(leftovers(), whose)
        elif not unclaimed:
            log.warning("no lock on %s can be had (%s): this writer goes ahead holding no claim on it, so another "
                        "writing there at the same time is not refused, and what killed writers left is only "
                        "reported; run one writer into it at a time", directory, why)  # fmt: skip
            report(leftovers(), f"no lock on {directory} can be had, so another writer may be using it")
        yield fd if alone else None
    finally:
        if own and fd is not None:
            os.close(fd)


def _check_descriptor_of(fd: int, directory: str) -> None:
    """ValueError unless fd is an open descriptor of the folder directory."""
    try:
        held, there = os.fstat(fd), os.stat(directory)
    except OSError as e:
        raise ValueError(f"descriptor {fd}, given as one of {directory}: {e.strerror or e}") from None
    if (held.st_dev, held.st_ino) != (there.st_dev, there.st_ino):
        raise ValueError(f"descriptor {fd}, given as one of {directory}, is of another file")

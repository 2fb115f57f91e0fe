"""What a process killed by SIGKILL (or a power loss) leaves of its temporary files is removed by the next run that
can prove it dead, with a log line naming it and its size; what another process may be writing now is left and
reported. The leftovers are made here as their writers name them (a kill at the right moment leaves exactly that).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ps.config import TableConfig
from ps.engine import export as engine_export
from ps.engine import exportout
from ps.server import Server
from ps.server_config import ServerConfig
from ps.storage import leftovers
from ps.storage.store import Store
from tests.conftest import exported, one_table_checkpoint
from worker.__main__ import main
from worker.client import Client
from worker.export import export_claim
from worker.temp_dirs import _host

LOGGER = "ps.storage.leftovers"


def dead_pid() -> int:
    """The pid of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def write(path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def removed_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.getMessage().startswith("removed ")]


def held(path, how: int = fcntl.LOCK_SH) -> int:
    """A descriptor holding a flock on the folder path, as another writer into it holds one."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, how)
    return fd


# --- a data dir: shard.json and journal-mark.json are replaced through a temporary file -----------------------------


def test_a_servers_start_removes_the_temporary_side_files_a_killed_server_left_and_nothing_else(tmp_path, caplog):
    data = tmp_path / "data"
    store = Store(str(data), shard=(0, 1))
    store.meta.check_identity(0, 1)
    store.close()
    write(data / "shard.json.ab_c1234.tmp", 40)  # tempfile.mkstemp's names, as write_json makes them
    write(data / "journal-mark.json.zz9y8x7w.tmp", 25)
    write(tmp_path / "elsewhere", 3)
    os.symlink(tmp_path / "elsewhere", data / "shard.json.linkzzzz.tmp")  # a link is nobody's temporary file
    write(data / "shard.json.tmp", 5)  # not write_json's pattern
    caplog.set_level("INFO", LOGGER)
    store = Store(str(data), shard=(0, 1))
    store.meta.check_identity(0, 1)
    store.close()
    names = set(os.listdir(data))
    assert "shard.json.ab_c1234.tmp" not in names and "journal-mark.json.zz9y8x7w.tmp" not in names
    assert {"shard.json.linkzzzz.tmp", "shard.json.tmp", "shard.json"} <= names
    lines = removed_lines(caplog)
    assert len(lines) == 2, lines
    assert any(str(data / "shard.json.ab_c1234.tmp") in line and "(40 bytes)" in line for line in lines), lines
    assert any(str(data / "journal-mark.json.zz9y8x7w.tmp") in line and "(25 bytes)" in line for line in lines)


# --- ps-server export: <file>.tmp in OUT, renamed once all are written ----------------------------------------------


@pytest.fixture
def ckpt(tmp_path) -> str:
    """A checkpoint of one shard holding 10 rows of table "a" (dim 2)."""
    return one_table_checkpoint(tmp_path, 10)


def test_an_export_removes_what_a_killed_export_left_in_out(ckpt, tmp_path, caplog):
    """Its export.json.tmp and the folders of export files the earlier export.json does not name go, with a line
    each; the earlier export's own folder goes as the new export replaces it; the user's names stay."""
    out = tmp_path / "out"
    write(out / "export-0123abcd" / "gone.rows.npy", 1000)  # a killed export's, never put in place
    write(out / "export-4567cdef" / "a.ids.npy", 7)  # the earlier export's, which export.json names
    write(out / "export.json.tmp", 9)
    write(out / "notes.tmp", 4)
    write(out / "export-mine" / "x", 4)  # not an export's folder name
    write(out / "export-89abcdef", 4)  # a file, not a folder
    (out / "export.json").write_text(json.dumps({"dir": "export-4567cdef", "tables": {"a": {}}}))
    caplog.set_level("INFO", LOGGER)
    summary = engine_export.export(ckpt, str(out))
    assert sorted(os.listdir(out)) == sorted([summary["dir"], "export-89abcdef", "export-mine", "export.json",
                                              "notes.tmp"])  # fmt: skip
    lines = removed_lines(caplog)
    assert len(lines) == 2 and any(str(out / "export-0123abcd") in x and "(1,000 bytes)" in x for x in lines), lines
    assert len(exported(out, "a")[0]) == 10


def test_the_files_an_export_replaces_are_read_from_one_read_of_export_json(tmp_path, monkeypatch):
    """The folder export.json names, else the .npy files of its tables in out itself, else none; export.json is read
    once for them."""
    reads = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: reads.append(path) or real_open(path, *a, **k))
    out = tmp_path / "out"
    out.mkdir()
    for info, files in (
        ({"dir": "export-4567cdef", "tables": {"a": {}}}, ["export-4567cdef"]),
        ({"tables": {"a": {}, "../b": {}, "..": {}}}, ["a.ids.npy", "a.rows.npy"]),
        ({"dir": "export-mine", "tables": {"a": {}}}, []),  # damaged: no guess from its tables
        ([1, 2], []),
        ("{not json", []),
        (None, []),
    ):
        if info is None:
            (out / "export.json").unlink()
        else:
            (out / "export.json").write_text(info if isinstance(info, str) else json.dumps(info))
        reads.clear()
        assert exportout.earlier_files(str(out)) == [str(out / f) for f in files]
        assert reads == [str(out / "export.json")], reads


@pytest.mark.parametrize("info", [{"tables": {"b": {}}}, {"dir": "..", "tables": {"b": {}}}, {"dir": "/tmp"},
                                  {"dir": "export-0123abcd/x"}, {"dir": "export-00000000"}, [1], "{not json"])  # fmt: skip
def test_an_export_over_an_export_json_naming_no_folder_there_removes_no_folder(ckpt, tmp_path, info, caplog):
    """Which folder of export files is in place cannot be told: each is reported and left, by the worker's claim
    and by the export that goes ahead; the .npy files of its tables in out go only where it has no "dir" (an export
    without one keeps them there). Once the new export names its own, the next one removes them, superseded."""
    out = tmp_path / "out"
    folders = [out / "export-0123abcd", out / "export-4567cdef"]
    for folder in folders:
        write(folder / "a.rows.npy", 5)
    write(out / "b.ids.npy", 3)
    (out / "export.json").write_text(info if isinstance(info, str) else json.dumps(info))
    caplog.set_level("INFO", LOGGER)
    with export_claim(str(out)):
        pass
    summary = engine_export.export(ckpt, str(out))
    assert all((f / "a.rows.npy").read_bytes() == b"xxxxx" for f in folders) and removed_lines(caplog) == []
    assert (out / "b.ids.npy").exists() == (not isinstance(info, dict) or "dir" in info), os.listdir(out)
    left = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"left {folders[0]} ")]
    assert len(left) == 2 and "names no folder of export files there" in left[0], left
    assert json.loads((out / "export.json").read_text())["dir"] == summary["dir"]
    engine_export.export(ckpt, str(out))
    assert not any(f.exists() for f in folders) and len(removed_lines(caplog)) == 2


@pytest.mark.parametrize("move", [True, False])
def test_an_export_of_the_checkpoint_a_killed_export_moved_into_its_folder_keeps_that_folder(ckpt, tmp_path, move):
    """ps-server export --move-checkpoint killed before its export.json was in place leaves the checkpoint in an
    unnamed folder: exporting it from there removes no folder that holds it."""
    out = tmp_path / "out"
    engine_export.export(ckpt, str(out))
    moved = out / "export-0123abcd" / "checkpoint"
    os.makedirs(moved.parent)
    os.rename(ckpt, moved)
    summary = engine_export.export(str(moved), str(out), move_checkpoint=move)
    assert len(exported(out, "a")[0]) == 10
    kept = out / summary["dir"] / "checkpoint" if move else moved
    assert summary["checkpoint"] == str(kept) and sorted(os.listdir(kept)) == ["manifest.json", "shard-0"]


KILLED_PUBLISHING = """
import os, signal, sys
real = os.replace
def replace(source, target, *args, **kwargs):
    if os.path.basename(str(target)) == "export.json":
        os.kill(os.getpid(), signal.SIGKILL)
    return real(source, target, *args, **kwargs)
os.replace = replace
from ps.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_users_checkpoint_a_killed_export_moved_into_its_folder_is_kept_by_every_later_export_and_named(
    tmp_path, caplog
):
    """ps-server export --move-checkpoint killed after the move, before its export.json was in place: the folder
    holds the user's only copy, which no later export into OUT removes (ps-server's or ps-worker's); the log says
    where it came from. The same kill of ps-worker export's own fresh checkpoint leaves a folder that goes."""
    out = tmp_path / "out"
    users = one_table_checkpoint(tmp_path, 10)
    fresh = out / f"checkpoint.new-{dead_pid()}-{_host()}-0123abcd"  # as ps-worker export names its own
    os.makedirs(out)
    os.rename(one_table_checkpoint(tmp_path / "worker", 7), fresh)
    folders = []
    for checkpoint in (users, str(fresh)):
        before = set(os.listdir(out))
        killed = subprocess.run([sys.executable, "-c", KILLED_PUBLISHING, "export", checkpoint, "--out", str(out),
                                 "--move-checkpoint", "--overwrite", "--no-progress"], capture_output=True, text=True)  # fmt: skip
        assert killed.returncode == -9 and not os.path.exists(checkpoint), killed.stderr
        (folder,) = [out / n for n in set(os.listdir(out)) - before if n.startswith("export-")]
        assert (folder / "checkpoint" / "manifest.json").exists()
        folders.append(folder)
    mine, workers = folders
    assert json.loads((mine / leftovers.MOVED_CHECKPOINT).read_text()) == {"from": users}
    assert json.loads((workers / leftovers.MOVED_CHECKPOINT).read_text()) == {"from": str(fresh)}
    caplog.set_level("INFO", LOGGER)
    with export_claim(str(out)):  # ps-worker export's claim
        pass
    summary = engine_export.export(one_table_checkpoint(tmp_path / "other", 4), str(out))
    assert len(exported(out, "a")[0]) == 4 and not workers.exists()
    assert any(str(workers) in x for x in removed_lines(caplog)), removed_lines(caplog)
    assert sorted(os.listdir(out)) == sorted([mine.name, summary["dir"], "export.json"])
    assert sorted(os.listdir(mine / "checkpoint")) == ["manifest.json", "shard-0"]
    left = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"left {mine} ")]
    assert len(left) == 2 and all(f"moved there from {users}: it is never removed" in x for x in left), left
    os.rename(mine / "checkpoint", users)  # as the log says: moved back, it exports as it was
    engine_export.export(users, str(out), overwrite=True)
    assert len(exported(out, "a")[0]) == 10 and not mine.exists()


def test_a_checkpoint_an_export_of_an_earlier_version_left_in_a_folder_without_a_note_is_kept(tmp_path, caplog):
    """An export before moved-checkpoint.json (a30a7a2's ps-server export --move-checkpoint, killed after the move
    and before its export.json was in place) left the user's checkpoint in an unnamed folder with no note: no later
    export into OUT removes it (its origin unknown, the log says so), while a folder of .npy files alone goes."""
    out = tmp_path / "out"
    engine_export.export(one_table_checkpoint(tmp_path, 10), str(out))
    kept = out / "export-0123abcd"
    os.makedirs(kept)
    os.rename(one_table_checkpoint(tmp_path / "users", 7), kept / "checkpoint")
    write(kept / "a.rows.npy", 100)
    gone = out / "export-4567cdef"
    write(gone / "a.rows.npy", 100)
    caplog.set_level("INFO", LOGGER)
    summary = engine_export.export(one_table_checkpoint(tmp_path / "other", 4), str(out), overwrite=True)
    assert len(exported(out, "a")[0]) == 4 and not gone.exists()
    assert sorted(os.listdir(out)) == sorted([kept.name, summary["dir"], "export.json"])
    assert sorted(os.listdir(kept / "checkpoint")) == ["manifest.json", "shard-0"]
    left = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"left {kept} ")]
    assert len(left) == 1 and "a place its folder does not name: it is never removed" in left[0], left


@pytest.mark.parametrize("note", [True, False])
def test_a_checkpoint_moved_on_out_of_a_kept_folder_is_noted_as_from_where_that_folder_says(tmp_path, note):
    """Exported from a folder kept for the checkpoint a killed export moved into it (--move-checkpoint again), the
    checkpoint's new folder names the kept folder's origin (unknown where it has no note), not the kept folder:
    that folder goes as a leftover once the checkpoint has left it. A checkpoint of the export in place, or of
    anywhere else, is noted as from its own path."""
    out, users = tmp_path / "out", one_table_checkpoint(tmp_path / "users", 7)
    engine_export.export(one_table_checkpoint(tmp_path, 10), str(out))
    kept = out / "export-0123abcd"
    os.makedirs(kept)
    os.rename(users, kept / "checkpoint")
    if note:
        (kept / leftovers.MOVED_CHECKPOINT).write_text(json.dumps({"from": users}))
    summary = engine_export.export(str(kept / "checkpoint"), str(out), move_checkpoint=True, overwrite=True)
    noted = out / summary["dir"] / leftovers.EXPORTED_CHECKPOINT  # the note, once export.json names the folder
    assert json.loads(noted.read_text()) == {"from": users if note else None}
    assert leftovers.checkpoint_origin(summary["checkpoint"]) == summary["checkpoint"]  # the export in place's
    elsewhere = one_table_checkpoint(tmp_path / "elsewhere", 4)
    assert leftovers.checkpoint_origin(elsewhere) == elsewhere
    engine_export.export(elsewhere, str(out), overwrite=True)
    assert not kept.exists()  # a leftover now that the checkpoint has left it


def test_a_users_folder_named_like_one_of_export_files_is_no_kept_folder_and_its_checkpoint_is_noted_as_from_it(
    tmp_path,
):
    """A dated folder of the user's (ckpts/export-20241231/checkpoint, beside other files: no export's folder) that
    only looks like one of export files: its checkpoint, moved into an export's folder, is noted as from its own
    path, where to move it back. A kept folder directly in the OUT exported into is one of export files even where
    OUT holds files of the user's too (not an export's folder)."""
    ckpts = tmp_path / "ckpts"
    dated = ckpts / "export-20241231" / "checkpoint"
    os.makedirs(dated.parent)
    os.rename(one_table_checkpoint(tmp_path / "users", 7), dated)
    write(ckpts / "notes.txt", 3)
    assert leftovers.checkpoint_origin(str(dated)) == str(dated)
    out = tmp_path / "out"
    summary = engine_export.export(str(dated), str(out), move_checkpoint=True)
    noted = out / summary["dir"] / leftovers.EXPORTED_CHECKPOINT
    assert json.loads(noted.read_text()) == {"from": str(dated)} and len(exported(out, "a")[0]) == 7
    kept = out / "export-0123abcd"
    os.makedirs(kept)
    os.rename(out / summary["dir"] / "checkpoint", kept / "checkpoint")
    (kept / leftovers.MOVED_CHECKPOINT).write_text(json.dumps({"from": str(dated)}))
    write(out / "notes.txt", 3)
    os.remove(out / "export.json")  # OUT: a kept folder and the user's files, no export's folder
    assert leftovers.checkpoint_origin(str(kept / "checkpoint")) == str(kept / "checkpoint")
    summary = engine_export.export(str(kept / "checkpoint"), str(out), move_checkpoint=True, overwrite=True)
    noted = out / summary["dir"] / leftovers.EXPORTED_CHECKPOINT
    assert json.loads(noted.read_text()) == {"from": str(dated)}  # the kept folder's, not that folder


def test_a_kept_folder_beside_a_worker_exports_fresh_checkpoint_is_one_of_export_files(tmp_path):
    """OUT holding a kept folder of export files (its checkpoint noted as moved from the user's) and a ps-worker
    export's fresh checkpoint left by a kill, and no export.json, is an export's folder, as ps-worker export sees it:
    the kept checkpoint's origin is what its folder's note names, not the kept folder."""
    out, users = tmp_path / "out", str(tmp_path / "users" / "checkpoint")
    kept = out / "export-0123abcd"
    os.makedirs(kept / "checkpoint")
    (kept / leftovers.MOVED_CHECKPOINT).write_text(json.dumps({"from": users}))
    os.makedirs(out / f"{leftovers.EXPORT_CHECKPOINT}123-{_host()}-89abcdef")
    assert leftovers.checkpoint_origin(str(kept / "checkpoint")) == users


def an_earlier_layouts_export(tmp_path, with_dir: bool) -> Path:
    """tmp_path/out as an export of an earlier version with --keep-checkpoint left it: export.json naming
    OUT/checkpoint, and the .npy files of table "a" in a folder it names (with_dir) or in OUT itself."""
    out = tmp_path / "out"
    os.makedirs(out)
    os.rename(one_table_checkpoint(tmp_path / "kept", 7), out / "checkpoint")
    files = out / "export-4567cdef" if with_dir else out
    write(files / "a.ids.npy", 8)
    write(files / "a.rows.npy", 16)
    info = {"checkpoint": str(out / "checkpoint"), "tables": {"a": {}}} | ({"dir": files.name} if with_dir else {})
    (out / "export.json").write_text(json.dumps(info))
    return out


def listing(out) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*"))


@pytest.mark.parametrize("with_dir", [False, True])
def test_an_export_over_one_that_names_out_checkpoint_is_refused_as_it_would_leave_it_behind(
    tmp_path, with_dir, capsys
):
    """OUT/checkpoint, named by export.json (an earlier version's kept checkpoint, or the user's one that the export
    in place was made from: the two cannot be told apart), is never left behind named by nothing, nor removed: an
    --overwrite export of another checkpoint is refused, ps-server's and ps-worker's (before any server is asked),
    nothing changed. An export of that checkpoint itself goes ahead (moved into the new export's folder): the refusal
    names the command for it."""
    out = an_earlier_layouts_export(tmp_path, with_dir)
    before = listing(out)
    other = one_table_checkpoint(tmp_path / "other", 4)
    with pytest.raises(ValueError, match=f"{out / 'checkpoint'} is the checkpoint {out / 'export.json'} names") as e:
        engine_export.export(other, str(out), overwrite=True)
    way_out = re.search(r"`ps-server (export [^`]+)`", str(e.value))  # the third way out, besides a move or removal
    nowhere = ["--servers", "127.0.0.1:1", "--server-timeout", "0", "--timeout-s", "1"]
    assert main(["export", str(out), "--overwrite", *nowhere]) == 2
    err = capsys.readouterr().err
    assert f"ps-worker: error: {out / 'checkpoint'} is the checkpoint" in err and "127.0.0.1:1" not in err, err
    assert listing(out) == before and os.path.isdir(other)
    from ps.__main__ import main as server_main

    assert way_out and server_main([*shlex.split(way_out[1]), "--no-progress"]) == 0, str(e.value)
    summary = json.loads((out / "export.json").read_text())
    assert sorted(os.listdir(out)) == [summary["dir"], "export.json"]
    assert summary["checkpoint"] == str(out / summary["dir"] / "checkpoint") and len(exported(out, "a")[0]) == 7


def test_an_export_over_one_that_names_another_checkpoint_leaves_a_users_out_checkpoint_as_it_is(tmp_path):
    out = an_earlier_layouts_export(tmp_path, with_dir=False)
    (out / "export.json").write_text(json.dumps({"checkpoint": str(tmp_path / "checkpoint"), "tables": {"a": {}}}))
    summary = engine_export.export(one_table_checkpoint(tmp_path / "other", 4), str(out), overwrite=True)
    assert sorted(os.listdir(out)) == ["checkpoint", summary["dir"], "export.json"]
    assert sorted(os.listdir(out / "checkpoint")) == ["manifest.json", "shard-0"]


@pytest.mark.parametrize("how", [fcntl.LOCK_SH, fcntl.LOCK_EX])
def test_an_export_into_an_out_another_export_writes_into_now_is_refused_and_changes_nothing(ckpt, tmp_path, how):
    out = tmp_path / "out"
    write(out / "export-0123abcd" / "gone.rows.npy", 1000)
    fd = held(out, how)  # another export's claim on OUT
    try:
        with pytest.raises(leftovers.ClaimedError, match=f"another export into {out} runs now"):
            engine_export.export(ckpt, str(out))
        done = subprocess.run([sys.executable, "-m", "ps", "export", ckpt, "--out", str(out), "--no-progress"],
                              capture_output=True, text=True)  # fmt: skip
    finally:
        os.close(fd)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"ps-server export: error: another export into {out} runs now" in done.stderr, done.stderr
    assert os.listdir(out) == ["export-0123abcd"] and (out / "export-0123abcd" / "gone.rows.npy").stat().st_size == 1000
    assert sorted(os.listdir(ckpt)) == ["manifest.json", "shard-0"]


def test_an_export_into_an_out_whose_file_system_refuses_flock_says_it_goes_ahead_holding_no_claim(
    ckpt, tmp_path, monkeypatch, caplog
):
    """As on Lustre mounted without -o flock (ENOSYS): the export is written, and a warning says that no claim on
    OUT is held, so that another export there meanwhile is not refused; a killed export's files are reported."""
    import errno

    def refused(fd, how):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    out = tmp_path / "out"
    write(out / "export-0123abcd" / "a.rows.npy", 9)  # a killed export's
    monkeypatch.setattr(leftovers.fcntl, "flock", refused)
    caplog.set_level("INFO", LOGGER)
    summary = engine_export.export(ckpt, str(out))
    assert sorted(os.listdir(out)) == sorted([summary["dir"], "export-0123abcd", "export.json"])
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"no lock on {out} can be had (its file system refuses flock: {os.strerror(errno.ENOSYS)}): this " \
           "writer goes ahead holding no claim on it" in warned[0], warned  # fmt: skip
    assert len(warned) == 2 and warned[1].startswith(f"left {out / 'export-0123abcd'} "), warned


def test_an_unclaimed_export_still_takes_the_flock_where_it_is_had(ckpt, tmp_path, caplog):
    """--unclaimed (the caller found no lock to be had) on a file system that keeps flocks: the export is refused
    while another export holds one, and else claims OUT, so it removes a killed export's folder, saying nothing
    of going ahead without a claim."""
    out = tmp_path / "out"
    write(out / "export-0123abcd" / "gone.rows.npy", 1000)  # a killed export's
    fd = held(out, fcntl.LOCK_EX)  # another export's claim on OUT
    try:
        with pytest.raises(leftovers.ClaimedError, match=f"another export into {out} runs now"):
            engine_export.export(ckpt, str(out), unclaimed=True)
    finally:
        os.close(fd)
    assert os.listdir(out) == ["export-0123abcd"]
    caplog.set_level("INFO", LOGGER)
    summary = engine_export.export(ckpt, str(out), unclaimed=True)
    assert sorted(os.listdir(out)) == sorted([summary["dir"], "export.json"])
    assert len(removed_lines(caplog)) == 1 and not [r for r in caplog.records if "no lock on" in r.getMessage()]


FLOCK_REFUSED = """
import errno, fcntl, os, sys
def refused(fd, how):
    raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
fcntl.flock = refused
from ps.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_worker_export_into_an_out_whose_file_system_refuses_flock_says_so_once(tmp_path, monkeypatch, caplog, capfd):
    """ps-worker export finds no lock on OUT to be had, says so and reports a killed export's folder; its
    ps-server export, refused flock too, says neither again."""
    import errno
    import types

    import worker.export

    def refused(fd, how):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    out, real_run = tmp_path / "out", worker.export._run_server_export
    write(out / "export-0123abcd" / "a.rows.npy", 9)  # a killed export's
    monkeypatch.setattr(
        leftovers, "fcntl", types.SimpleNamespace(flock=refused, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB)
    )

    def child(command, claim):  # ps-server export, on the same file system
        assert command[1:3] == ["-m", "ps"], command
        return real_run([command[0], "-c", FLOCK_REFUSED, *command[3:]], claim)

    monkeypatch.setattr(worker.export, "_run_server_export", child)
    caplog.set_level("INFO", LOGGER)
    assert _export_five_rows(tmp_path, out) == 0
    err = capfd.readouterr().err
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == LOGGER]
    assert len(warned) == 2 and warned[0].startswith(f"no lock on {out} can be had"), warned
    assert warned[1].startswith(f"left {out / 'export-0123abcd'} "), warned
    assert "no lock on" not in err and "export-0123abcd" not in err, err  # the child said neither again
    summary = json.loads((out / "export.json").read_text())
    assert sorted(os.listdir(out)) == sorted([summary["dir"], "export-0123abcd", "export.json"])


def an_export_ends_meanwhile(out, real):
    """make_dirs as real, after which an export into out is put in place (one that ended before this one claimed
    out), leaving what killed exports left there."""

    def make_dirs(path, what):
        real(path, what)
        write(out / "export-4567cdef" / "a.ids.npy", 7)
        (out / "export.json").write_text(json.dumps({"dir": "export-4567cdef", "tables": {"a": {}}}))

    return make_dirs


def test_an_export_without_overwrite_checks_out_under_its_claim_and_its_refusal_removes_nothing(
    ckpt, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    write(out / "export-0123abcd" / "gone.rows.npy", 1000)  # a killed export's: out holds no export yet
    write(out / "export.json.tmp", 9)
    monkeypatch.setattr(engine_export, "make_dirs", an_export_ends_meanwhile(out, engine_export.make_dirs))
    with pytest.raises(ValueError, match=re.escape(f"--out {out} holds an earlier export (export.json): give")):
        engine_export.export(ckpt, str(out), overwrite=False)
    assert sorted(os.listdir(out)) == ["export-0123abcd", "export-4567cdef", "export.json", "export.json.tmp"]
    assert (out / "export-0123abcd" / "gone.rows.npy").stat().st_size == 1000 and free(out)
    assert sorted(os.listdir(ckpt)) == ["manifest.json", "shard-0"]


def test_while_an_export_writes_into_out_another_cannot_claim_it_alone(ckpt, tmp_path, monkeypatch):
    out = tmp_path / "out"
    seen = []
    real = engine_export._export_into

    def probe(*args, **kwargs):
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(True)
        finally:
            os.close(fd)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_export, "_export_into", probe)
    engine_export.export(ckpt, str(out))
    assert seen == [True]


# --- ps-worker export: OUT/checkpoint.new-<pid>-<host>-<8 hex> ------------------------------------------------------


def test_a_worker_export_removes_the_checkpoints_of_dead_exports_only(tmp_path, caplog):
    out = tmp_path / "out"
    dead = out / f"checkpoint.new-{dead_pid()}-{_host()}-0123abcd"
    running = out / f"checkpoint.new-{os.getpid()}-{_host()}-4567cdef"  # this process runs
    other_host = out / f"checkpoint.new-{dead_pid()}-not-{_host()}-89abcdef"
    earlier = out / "checkpoint.new-fedcba98"  # a version before <pid> was in the name
    for path in (dead, running, other_host, earlier):
        write(path / "shard-0" / "000009.sst", 300)
    write(out / "export.json.tmp", 11)
    caplog.set_level("INFO", LOGGER)
    with export_claim(str(out)):
        pass
    assert not dead.exists() and not (out / "export.json.tmp").exists()
    assert running.exists() and other_host.exists() and earlier.exists()
    lines = removed_lines(caplog)
    assert len(lines) == 2 and any(str(dead) in x and "(300 bytes)" in x for x in lines), lines
    left = [r.getMessage() for r in caplog.records if r.getMessage().startswith("left ")]
    assert len(left) == 3 and all("(300 bytes)" in x for x in left), left


def test_a_worker_export_into_an_out_another_export_writes_into_now_is_refused_before_any_server(tmp_path, capsys):
    """Such as the ps-server export a killed worker started, still reading its checkpoint, which stays."""
    out = tmp_path / "out"
    dead = out / f"checkpoint.new-{dead_pid()}-{_host()}-0123abcd"
    write(dead / "manifest.json", 10)
    write(out / "export.json", 2)
    fd = held(out)
    try:
        nowhere = ["--servers", "127.0.0.1:1", "--server-timeout", "0", "--timeout-s", "1"]
        assert main(["export", str(out), "--overwrite", *nowhere]) == 2
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert f"ps-worker: error: another export into {out} runs now" in err and "127.0.0.1:1" not in err, err
    assert sorted(os.listdir(out)) == [dead.name, "export.json"] and (dead / "manifest.json").exists()


def test_a_worker_export_without_overwrite_checks_out_under_its_claim_and_its_refusal_removes_nothing(
    tmp_path, capsys, monkeypatch
):
    import worker.export

    out = tmp_path / "out"
    dead = out / f"checkpoint.new-{dead_pid()}-{_host()}-0123abcd"  # a killed export's: out holds no export yet
    write(dead / "manifest.json", 10)
    write(out / "export.json.tmp", 9)
    monkeypatch.setattr(worker.export, "make_dirs", an_export_ends_meanwhile(out, worker.export.make_dirs))
    nowhere = ["--servers", "127.0.0.1:1", "--server-timeout", "0", "--timeout-s", "1"]
    assert main(["export", str(out), *nowhere]) == 2
    err = capsys.readouterr().err
    assert f"ps-worker: error: OUT {out} is not empty (it holds export.json); nothing was written: give a new or " \
           "empty directory, or --overwrite to write over the export there" in err, err  # fmt: skip
    assert sorted(os.listdir(out)) == sorted([dead.name, "export-4567cdef", "export.json", "export.json.tmp"])
    assert (dead / "manifest.json").exists() and free(out)


def test_a_worker_export_holds_out_until_its_ps_server_export_ends_which_claims_it_through_the_same_lock(
    tmp_path, capsys, monkeypatch
):
    """No other export takes OUT between the worker's checkpoint and its ps-server export, nor while that runs."""
    import worker.export

    out, seen, real_run = tmp_path / "out", [], worker.export._run_server_export

    def child(command, claim):
        seen.append(free(out))  # the worker has its checkpoint now, and starts ps-server export
        done = real_run(command, claim)
        seen.append(free(out))  # it ended, having removed the checkpoint
        return done

    monkeypatch.setattr(worker.export, "_run_server_export", child)
    code = _export_five_rows(tmp_path, out)
    assert code == 0, capsys.readouterr().err
    assert seen == [False, False] and free(out)
    summary = json.loads((out / "export.json").read_text())
    assert sorted(os.listdir(out)) == sorted([summary["dir"], "export.json"]) and len(exported(out, "emb")[0]) == 5


def free(path) -> bool:
    """Whether another process could claim the folder path now (an exclusive flock on it had at once)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_ps_server_export_claims_out_through_a_descriptor_of_out_only(ckpt, tmp_path, capsys):
    out, other = tmp_path / "out", tmp_path / "other"
    os.makedirs(out)
    os.makedirs(other)
    fd = held(out, fcntl.LOCK_EX)  # as ps-worker export holds it and passes it on
    wrong = os.open(other, os.O_RDONLY | os.O_DIRECTORY)
    try:
        args = [ckpt, "--out", str(out), "--no-progress", "--claim-fd"]
        bad = subprocess.run([sys.executable, "-m", "ps", "export", *args, str(wrong)], pass_fds=(wrong,),
                             capture_output=True, text=True)  # fmt: skip
        closed = subprocess.run([sys.executable, "-m", "ps", "export", *args, "999"], capture_output=True, text=True)
        assert os.listdir(out) == []  # nothing written
        done = subprocess.run([sys.executable, "-m", "ps", "export", *args, str(fd)], pass_fds=(fd,),
                              capture_output=True, text=True)  # fmt: skip
        assert not free(out)  # still held by this process's descriptor
    finally:
        os.close(fd)
        os.close(wrong)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert f"ps-server export: error: descriptor {wrong}, given as one of {out}, is of another file" in bad.stderr
    assert closed.returncode == 2 and f"descriptor 999, given as one of {out}: Bad file descriptor" in closed.stderr
    assert done.returncode == 0, done.stderr
    assert len(exported(out, "a")[0]) == 10 and sorted(os.listdir(other)) == []


def test_the_next_export_into_out_removes_what_a_killed_one_left_and_exports(tmp_path, capsys, caplog):
    out = tmp_path / "export"
    leftover = out / f"checkpoint.new-{dead_pid()}-{_host()}-0123abcd"
    write(leftover / "shard-0" / "000009.sst", 300)
    write(out / "export-0123abcd" / "emb.rows.npy", 50)
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard-0"), port=0, checkpoint_root=str(tmp_path)))
    server.start()
    try:
        address = f"127.0.0.1:{server.port}"
        assert main(["export", str(tmp_path / "empty"), "--servers", address, "--no-progress"]) == 2
        assert "the servers hold no table: nothing to export" in capsys.readouterr().err
        with Client([address]) as client:
            client.create_table(TableConfig("emb", 2))
            client.push("emb", np.arange(5, dtype=np.uint64), np.ones((5, 2), np.float32))
        nothing = tmp_path / "nothing"
        assert main(["export", str(nothing), "--servers", address, "--tables", "emb,fm*", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "--tables 'fm*' matches no table the servers hold (emb); nothing was saved" in err, err
        assert not nothing.exists() and sorted(os.listdir(tmp_path)) == ["export", "shard-0"]  # no checkpoint taken
        caplog.set_level("INFO", LOGGER)
        code = main(["export", str(out), "--servers", address, "--keep-checkpoint", "--no-progress"])
    finally:
        server.stop(grace_s=1)
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "export.json").read_text())
    assert sorted(os.listdir(out)) == sorted([summary["dir"], "export.json"])
    assert summary["checkpoint"] == str(out / summary["dir"] / "checkpoint") and len(exported(out, "emb")[0]) == 5
    assert all(any(str(p) in x for x in removed_lines(caplog)) for p in (leftover, out / "export-0123abcd"))


KILLED_REMOVING_THE_CHECKPOINT = """
import os, shutil, signal, sys
real = shutil.rmtree
def rmtree(path, *args, **kwargs):
    if os.path.basename(str(path)).startswith("checkpoint.new-"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(path, *args, **kwargs)
shutil.rmtree = rmtree
from ps.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_kill_between_an_export_in_place_and_its_checkpoint_removed_leaves_export_json_naming_none(
    tmp_path, capsys, monkeypatch
):
    """ps-server export is killed as it goes to remove the fresh checkpoint: what OUT holds then (as a kill of the
    worker too would leave it) is the new export whole, its export.json naming no checkpoint; the worker says so,
    and removes the fresh checkpoint."""
    import worker.export

    out, seen, real_run = tmp_path / "out", [], worker.export._run_server_export

    def killed_child(command, claim):
        assert command[1:4] == ["-m", "ps", "export"], command
        done = real_run([command[0], "-c", KILLED_REMOVING_THE_CHECKPOINT, *command[3:]], claim)
        seen.append((json.loads((out / "export.json").read_text()), sorted(os.listdir(out))))
        return done

    monkeypatch.setattr(worker.export, "_run_server_export", killed_child)
    code = _export_five_rows(tmp_path, out)
    err = capsys.readouterr().err
    assert code == 137 and f"the new export is in place ({out / 'export.json'} names export-" in err, err
    ((summary, names),) = seen
    assert summary["checkpoint"] is None and len(exported(out, "emb")[0]) == 5
    assert names[0].startswith("checkpoint.new-") and names[1:] == sorted([summary["dir"], "export.json"]), names
    assert sorted(os.listdir(out)) == sorted([summary["dir"], "export.json"])


def test_a_removed_checkpoint_is_named_by_no_export_json_and_one_left_by_a_kill_goes_with_the_next_export(
    tmp_path, caplog, monkeypatch
):
    out = tmp_path / "out"
    fresh = out / f"checkpoint.new-{dead_pid()}-{_host()}-0123abcd"  # as ps-worker export names its own
    one_table_checkpoint(tmp_path, 10)
    os.makedirs(out)
    os.rename(tmp_path / "ckpt", fresh)
    real = engine_export.shutil.rmtree

    def killed(path, *args, **kwargs):
        if str(path) == str(fresh):
            raise KeyboardInterrupt  # as a kill there: nothing after it runs
        return real(path, *args, **kwargs)

    monkeypatch.setattr(engine_export.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        engine_export.export(str(fresh), str(out), remove_checkpoint=True)
    summary = json.loads((out / "export.json").read_text())
    assert summary["checkpoint"] is None and len(exported(out, "a")[0]) == 10 and fresh.exists()
    monkeypatch.setattr(engine_export.shutil, "rmtree", real)
    caplog.set_level("INFO", LOGGER)
    with export_claim(str(out)):
        pass
    assert not fresh.exists() and any(str(fresh) in x for x in removed_lines(caplog))
    assert sorted(os.listdir(out)) == sorted([summary["dir"], "export.json"])
    one_table_checkpoint(tmp_path, 10)
    engine_export.export(str(tmp_path / "ckpt"), str(out), remove_checkpoint=True)
    assert not (tmp_path / "ckpt").exists() and json.loads((out / "export.json").read_text())["checkpoint"] is None
    with pytest.raises(ValueError, match="either moved into the export's folder or removed, not both"):
        engine_export.export(str(fresh), str(out), move_checkpoint=True, remove_checkpoint=True)


# --- ps-worker checkpoint save: an unfinished checkpoint is named, never removed -----------------------------------


def test_checkpoint_save_names_an_unfinished_checkpoint_and_leaves_it(tmp_path, capsys):
    target = tmp_path / "ckpt"
    write(target / "shard-0" / "000009.sst", 300)
    write(target / "shard-1.tmp" / "000010.sst", 200)  # RocksDB's, of a server killed while it saved
    write(target / "manifest.json.k2_x9q1f.tmp", 10)  # write_manifest's, of a worker killed while it wrote it
    nowhere = ["--servers", "127.0.0.1:1", "--server-timeout", "0", "--timeout-s", "1"]
    code = main(["checkpoint", "save", str(target), *nowhere])
    err = capsys.readouterr().err
    assert code == 2 and ("holds an unfinished checkpoint (manifest.json.k2_x9q1f.tmp, shard-0, shard-1.tmp: 510 "
                          "bytes, no manifest.json)") in err  # fmt: skip
    assert (target / "shard-0" / "000009.sst").exists() and (target / "shard-1.tmp" / "000010.sst").exists()


# --- ps-worker predict: .<name>.<pid>-<host>-<8 hex>.partial beside --out ------------------------------------------


def test_a_predict_removes_the_partial_files_of_dead_predicts_into_its_out_only(tmp_path, caplog):
    from worker import predict
    from worker.scoring import ScoringProgress

    out = tmp_path / "scores.csv"
    dead = tmp_path / f".scores.csv.{dead_pid()}-{_host()}-0123abcd.partial"
    running = tmp_path / f".scores.csv.{os.getpid()}-{_host()}-4567cdef.partial"
    earlier = tmp_path / ".scores.csv.89abcdef.partial"  # a version before <pid> was in the name
    another_out = tmp_path / f".other.csv.{dead_pid()}-{_host()}-0123abcd.partial"
    for path in (dead, running, earlier, another_out):
        write(path, 70)
    caplog.set_level("INFO", LOGGER)
    assert predict._write(str(out), [], predict._Columns(False, False, ()), ScoringProgress(0, False), False) == 0
    assert not dead.exists() and running.exists() and earlier.exists() and another_out.exists()
    assert not out.exists() and sorted(os.listdir(tmp_path)) == sorted(p.name for p in (running, earlier, another_out))
    lines = removed_lines(caplog)
    assert len(lines) == 1 and str(dead) in lines[0] and "(70 bytes)" in lines[0], lines


def test_a_predict_never_writes_through_a_link_where_its_partial_file_goes(tmp_path, monkeypatch):
    from worker import predict
    from worker.scoring import ScoringProgress

    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("keep me")
    partial = tmp_path / ".scores.csv.1-host-0123abcd.partial"
    partial.symlink_to(elsewhere)
    monkeypatch.setattr(predict, "partial_file", lambda out: str(partial))
    with pytest.raises(OSError, match="is a link, where this writer keeps its temporary file"):
        predict._write(
            str(tmp_path / "scores.csv"), [], predict._Columns(False, False, ()), ScoringProgress(0, False), False
        )
    assert elsewhere.read_text() == "keep me" and partial.is_symlink()


def test_a_predict_into_a_name_as_long_as_a_file_system_takes_writes_it_and_removes_its_dead_partial_files(
    tmp_path, files, caplog
):
    """An --out name of 253 bytes (a character where the partial file's name must cut it, left out whole): the partial file's
    name, which adds the pid, the host and a random part, keeps within 255 bytes, and the next predict into it
    finds a dead run's."""
    from worker import predict
    from worker.formats import read_batches
    from worker.schema_builtin import builtin_schema
    from worker.scoring import ScoringProgress
    from worker.temp_dirs import partial_file

    out = tmp_path / ("a" + "é" * 124 + ".csv")  # 1 + 248 + 4 bytes
    assert len(os.fsencode(out.name)) == 253
    killed = partial_file(str(out)).replace(f".{os.getpid()}-", f".{dead_pid()}-")
    other = partial_file(str(tmp_path / ("a" + "é" * 124 + ".tsv"))).replace(f".{os.getpid()}-", f".{dead_pid()}-")
    assert len(os.fsencode(os.path.basename(killed))) <= 255 and killed != other
    assert killed.encode("utf-8") and other.encode("utf-8")  # no stray byte of a character cut in two
    write(Path(killed), 30)
    write(Path(other), 30)
    (batch,) = read_batches(files[1], builtin_schema("criteo", default_table="fm", default_dim=8), 1000)
    scored = [(files[1], batch, np.full(len(batch), 0.25, np.float32), [""] * len(batch))]
    caplog.set_level("INFO", LOGGER)
    assert predict._write(
        str(out), scored, predict._Columns(False, False, ()), ScoringProgress(0, False), False
    ) == len(batch)
    assert out.read_text().splitlines()[:2] == ["line,probability", "1,0.25"]
    assert sorted(os.listdir(tmp_path)) == sorted([out.name, os.path.basename(other), "test.tsv", "train.tsv"])
    lines = removed_lines(caplog)
    assert len(lines) == 1 and killed in lines[0], lines


def test_a_partial_file_held_by_a_live_writer_of_another_pid_namespace_is_left(tmp_path):
    """A predict in a container on the host's network has this host's name and pids this host cannot see: its
    flock on the file it writes says it is alive."""
    from worker.temp_dirs import dead_partial_files, hold_while_written

    out = tmp_path / "scores.csv"
    held = tmp_path / f".scores.csv.{dead_pid()}-{_host()}-0123abcd.partial"
    free = tmp_path / f".scores.csv.{dead_pid()}-{_host()}-4567cdef.partial"
    write(held, 10)
    write(free, 10)
    with open(held, "a") as f:
        hold_while_written(f.fileno())
        assert dead_partial_files(str(out)) == ([str(free)], [str(held)])
    dead, others = dead_partial_files(str(out))
    assert sorted(dead) == sorted([str(free), str(held)]) and others == []


def test_a_folder_of_the_users_is_refused_and_its_temp_looking_files_are_kept(tmp_path, capsys):
    """Names that look like an export's temporary files, in a folder that is no export's, are the user's."""
    mine = tmp_path / "mine"
    for name in ("export-0123abcd/a.ids.npy", "export.json.tmp", "notes.txt"):
        write(mine / name, 5)
    code = main(["export", str(mine), "--servers", "127.0.0.1:1", "--server-timeout", "0", "--timeout-s", "1"])
    assert code == 2 and "OUT " + str(mine) + " is not empty (it holds notes.txt)" in capsys.readouterr().err
    assert sorted(os.listdir(mine)) == ["export-0123abcd", "export.json.tmp", "notes.txt"]
    with export_claim(str(mine)):  # --overwrite into it: still not an export's folder, nothing removed
        pass
    assert sorted(os.listdir(mine)) == ["export-0123abcd", "export.json.tmp", "notes.txt"]
    restore_out = tmp_path / "other"
    write(restore_out / "export-0123abcd" / "a.rows.npy", 5)
    write(restore_out / "keep.txt", 5)
    from ps.storage import leftovers

    assert not leftovers.holds_an_export(str(restore_out))  # ps-server export leaves them too


def _two_started_shards(tmp_path) -> tuple[list[Server], list[str]]:
    """Two in-process servers, shards 0 and 1 of 2 with data dirs and checkpoint root in tmp_path, started: (the
    servers, their addresses)."""
    servers = [Server(ServerConfig(data_dir=str(tmp_path / f"shard-{i}"), port=0, shard_id=i, num_shards=2,
                                   checkpoint_root=str(tmp_path))) for i in range(2)]  # fmt: skip
    for server in servers:
        server.start()
    return servers, [f"127.0.0.1:{server.port}" for server in servers]


def test_an_export_of_servers_whose_shard_0_alone_lacks_the_table_is_not_told_there_is_none(tmp_path, capsys):
    """Shard 0 restarted on an empty data dir: the tables of shard 1 are the servers' tables, and the export's
    error is the missing table on shard 0, not 'no table', before any shard saved (nothing is left in OUT)."""
    from ps.sharding import SlotMap

    servers, addresses = _two_started_shards(tmp_path)
    try:
        with Client(addresses[1:]) as client:
            client.create_table(TableConfig("emb", 2))
            ids = np.arange(100, dtype=np.uint64)
            on_1 = ids[SlotMap.contiguous(2).shard_of(ids) == 1]
            client.push("emb", on_1, np.ones((len(on_1), 2), np.float32))  # rows: not refused as untrained
        code = main(["export", str(tmp_path / "out"), "--servers", ",".join(addresses), "--no-progress"])
    finally:
        for server in servers:
            server.stop(grace_s=1)
    err = capsys.readouterr().err
    assert (
        code == 2 and "hold no table" not in err and "table emb (" in err and "is on no data dir of shard 0" in err
    ), err
    assert not (tmp_path / "out").exists()


def test_an_export_whose_save_fails_on_one_shard_does_not_say_to_delete_the_checkpoint_it_removed(tmp_path, capsys):
    """Shard 0 saves its part into OUT's fresh checkpoint, shard 1's save fails: the export removes that checkpoint
    (and OUT) itself, so its error is the shard's, with no word of parts left there to delete."""
    from ps.errors import CheckpointDirError

    servers, addresses = _two_started_shards(tmp_path)

    def refused(path: str, caller_gone=None) -> None:
        raise CheckpointDirError("cannot write the checkpoint here (the test's)")

    out = tmp_path / "out"
    try:
        with Client(addresses) as client:
            client.create_table(TableConfig("emb", 2))
            client.push("emb", np.arange(100, dtype=np.uint64), np.ones((100, 2), np.float32))
        servers[1].shard.checkpoints.write = refused
        code = main(["export", str(out), "--servers", ",".join(addresses), "--no-progress"])
    finally:
        for server in servers:
            server.stop(grace_s=1)
    err = capsys.readouterr().err
    assert code == 2 and "shard 1 at" in err and "cannot write the checkpoint here (the test's)" in err, err
    assert "delete" not in err and "shard-0, the part of each shard" not in err, err
    assert not out.exists()


def _export_from_one_server(tmp_path, capsys, out, checkpoint_root: str | None) -> str:
    """ps-worker export OUT from one server holding a table "emb" (started with checkpoint_root): its stderr;
    the export must fail with exit code 2 and leave no OUT."""
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard-0"), port=0, checkpoint_root=checkpoint_root))
    server.start()
    try:
        with Client([f"127.0.0.1:{server.port}"]) as client:
            client.create_table(TableConfig("emb", 2))
            client.push("emb", np.arange(5, dtype=np.uint64), np.ones((5, 2), np.float32))
        code = main(["export", str(out), "--servers", f"127.0.0.1:{server.port}", "--no-progress"])
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert code == 2 and not out.exists(), err  # the OUT it made is removed again
    return err


def test_an_export_from_servers_without_a_checkpoint_root_says_what_export_needs(tmp_path, capsys):
    err = _export_from_one_server(tmp_path, capsys, tmp_path / "out", None)
    assert "export has the servers save the model as a checkpoint into a folder of OUT first" in err, err
    assert "restart the servers with --checkpoint-root DIR" in err and "this server takes no checkpoints" in err, err
    assert "and give an OUT inside DIR; nothing was saved. The server said: " in err, err  # its only shard refused


def test_an_export_one_shard_of_which_has_no_checkpoint_root_says_which_saved_their_part(tmp_path, capsys):
    """Shard 0 saves its part of the temporary checkpoint, shard 1 refuses for having no --checkpoint-root: the
    error does not say nothing was saved (shard 0's part, where its root is another machine's, stays there), but
    which shard refused and which saved."""
    root, out = tmp_path / "root", tmp_path / "root" / "out"
    servers = [Server(ServerConfig(data_dir=str(tmp_path / f"shard-{i}"), port=0, shard_id=i, num_shards=2,
                                   checkpoint_root=str(root) if i == 0 else None)) for i in range(2)]  # fmt: skip
    try:
        addresses = ",".join(f"127.0.0.1:{s.start()}" for s in servers)
        with Client(addresses.split(",")) as client:
            client.create_table(TableConfig("emb", 2))
            client.push("emb", np.arange(50, dtype=np.uint64), np.ones((50, 2), np.float32))
        code = main(["export", str(out), "--servers", addresses, "--no-progress"])
    finally:
        for server in servers:
            server.stop()
    err = capsys.readouterr().err
    assert code == 2 and not out.exists(), err  # the OUT it made is removed again, shard 0's part with it
    assert "nothing was saved" not in err and "this server takes no checkpoints" in err, err
    assert re.search(r"give an OUT inside DIR; of the save into \S+checkpoint\.new-\S+, shard\(s\) 1 refused it for "
                     r"that; shard\(s\) 0 saved their part: \S+ is removed on this machine, and a part a shard saved "
                     r"on another machine \(its --checkpoint-root there\) stays there: delete \S+ there\. The "
                     r"server said: ", err), err  # fmt: skip


@pytest.mark.parametrize(
    "outcomes, known",
    [
        (None, "which shards saved their part is not known"),
        (["NoCheckpointRootError", "ServerUnavailableError"],
         "shard(s) 0 refused it for that; shard(s) 1 (ServerUnavailableError) failed otherwise, and may have saved"),
    ],
)  # fmt: skip
def test_an_export_refused_for_no_checkpoint_root_says_what_it_knows_of_the_other_shards(outcomes, known):
    """Where shard_outcomes is not known, or a shard ended otherwise (it may have saved), the error says so, and
    not that nothing was saved."""
    from ps import errors
    from worker.export import _what_was_saved

    e = errors.NoCheckpointRootError("shard 0 at h:1: this server takes no checkpoints")
    if outcomes is not None:
        e.shard_outcomes = [getattr(errors, name) for name in outcomes]
    said = _what_was_saved(e, "/r/out/checkpoint.new-1")
    assert said.startswith(f"of the save into /r/out/checkpoint.new-1, {known}"), said


def test_an_export_outside_the_servers_checkpoint_root_is_said_so_of_out(tmp_path, capsys):
    out = tmp_path / "elsewhere" / "v1"  # its parent made by the export too: both removed again
    err = _export_from_one_server(tmp_path, capsys, out, str(tmp_path / "root"))
    assert f"OUT {out} is outside the servers' checkpoint root" in err, err
    assert not (tmp_path / "elsewhere").exists()
    assert f"not inside this server's checkpoint root {os.path.realpath(tmp_path / 'root')}" in err


# --- what is not an export's own is never written through, replaced or removed -------------------------------------


def test_a_link_at_a_temporary_name_is_refused_and_never_written_through(ckpt, tmp_path):
    out, decoy = tmp_path / "out", tmp_path / "decoy.bin"
    decoy.write_bytes(b"precious")
    out.mkdir()
    os.symlink(decoy, out / "export.json.tmp")
    with pytest.raises(OSError, match=r"export\.json\.tmp is a link, where this writer keeps its temporary file"):
        engine_export.export(ckpt, str(out))
    assert decoy.read_bytes() == b"precious" and os.path.islink(out / "export.json.tmp")
    assert sorted(os.listdir(out)) == ["export.json.tmp"]  # nothing else left


def test_a_folder_named_like_a_temporary_file_is_the_users(ckpt, tmp_path, caplog):
    from ps.storage import leftovers

    out = tmp_path / "out"
    write(out / "export.json.tmp" / "data", 10)
    assert not leftovers.holds_an_export(str(out))  # a folder of such names is no export's
    write(out / "export.json", 2)  # an earlier export's folder: its leftovers would go, but no folder is one
    caplog.set_level("INFO", LOGGER)
    with pytest.raises(OSError, match=r"export\.json\.tmp is a folder, where this writer keeps its temporary"):
        engine_export.export(ckpt, str(out))
    assert (out / "export.json.tmp" / "data").exists() and removed_lines(caplog) == []
    assert sorted(os.listdir(out)) == ["export.json", "export.json.tmp"]  # its own folder removed again


def test_export_with_an_empty_tables_is_refused(tmp_path, capsys):
    nowhere = ["--servers", "127.0.0.1:1", "--server-timeout", "0", "--timeout-s", "1"]
    assert main(["export", str(tmp_path / "new"), "--tables", ",", *nowhere]) == 2
    assert "--tables ',' names no table" in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_ps_server_export_refuses_a_folder_of_other_files_without_overwrite(ckpt, tmp_path, capsys):
    from ps.__main__ import main as server_main

    out = tmp_path / "out"
    write(out / "notes.txt", 3)
    assert server_main(["export", ckpt, "--out", str(out), "--no-progress"]) == 2
    assert "holds files of no export (notes.txt): give a new or empty directory, or --overwrite" in (
        capsys.readouterr().err
    )
    assert os.listdir(out) == ["notes.txt"]
    assert server_main(["export", ckpt, "--out", str(out), "--no-progress", "--tables", ""]) == 2
    assert server_main(["export", ckpt, "--out", str(out / "notes.txt"), "--no-progress"]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_ps_server_export_checks_its_out_against_the_checkpoint_once(ckpt, tmp_path, monkeypatch):
    from ps.__main__ import main as server_main

    calls = []
    real = engine_export.check_out_of_checkpoint
    monkeypatch.setattr(engine_export, "check_out_of_checkpoint", lambda *a: calls.append(a) or real(*a))
    out = str(tmp_path / "out")
    assert server_main(["export", ckpt, "--out", out, "--no-progress"]) == 0
    assert calls == [(ckpt, out)]


@pytest.mark.parametrize("inside", ["", "shard-0"])
def test_ps_server_export_into_its_checkpoint_is_refused_for_that_not_for_want_of_overwrite(ckpt, inside, capsys):
    """The checkpoint is not empty, but --overwrite would not help: the refusal says what does."""
    from ps.__main__ import main as server_main

    files = lambda: sorted(p.relative_to(ckpt) for p in Path(ckpt).rglob("*"))
    before = files()
    out = os.path.join(ckpt, inside)
    assert server_main(["export", ckpt, "--out", out, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} lies inside the checkpoint {ckpt}" in err and "--overwrite" not in err, err
    assert files() == before


def test_an_export_of_one_models_tables_is_not_refused_for_another_models_lost_table(tmp_path, capsys):
    """Table "other" is trained on shard 1 and lost on shard 0 (a new, empty data dir there): an export of the
    whole model is refused, one of --tables emb goes ahead, as its checkpoint is read for emb alone and deleted;
    with --keep-checkpoint (a checkpoint that would hold the loss) it is refused too."""
    from ps.sharding import SlotMap

    servers, addresses = _two_started_shards(tmp_path)
    try:
        ids = np.arange(1000, dtype=np.uint64)
        on_1 = ids[SlotMap.contiguous(2).shard_of(ids) == 1]
        with Client(addresses) as client:
            client.create_table(TableConfig("emb", 2))
            client.push("emb", ids, np.ones((len(ids), 2), np.float32))
        with Client(addresses[1:]) as shard_1:
            shard_1.create_table(TableConfig("other", 2))
        with Client(addresses) as client:  # only shard 1 holds "other": its ids alone go there
            client._dims.note("other", 2)
            client.push("other", on_1, np.ones((len(on_1), 2), np.float32))
        base = ["export", "--servers", ",".join(addresses), "--no-progress"]
        assert main([*base, str(tmp_path / "all")]) == 2
        assert "table other (" in capsys.readouterr().err
        assert main([*base, str(tmp_path / "kept"), "--tables", "emb", "--keep-checkpoint"]) == 2
        assert "table other (" in capsys.readouterr().err
        code = main([*base, str(tmp_path / "emb"), "--tables", "emb"])
        assert code == 0, capsys.readouterr().err
    finally:
        for server in servers:
            server.stop(grace_s=1)
    summary = json.loads((tmp_path / "emb" / "export.json").read_text())
    names = os.listdir(tmp_path / "emb" / summary["dir"])
    assert sorted(names) == ["emb.ids.npy", "emb.rows.npy"] and list(summary["tables"]) == ["emb"], names
    assert "checkpoint" not in names and not any(n.startswith("checkpoint.new") for n in names), names


@pytest.mark.parametrize("tables", [5, "ab", None, True])
def test_an_export_over_an_export_json_whose_tables_is_damaged_goes_ahead_and_removes_no_file(ckpt, tmp_path, tables):
    """An export.json without "dir" names its .npy files by its tables; one whose tables is no object or list names
    none: the new export takes its place, and no file is removed on a guess (a string's letters are no tables)."""
    out = tmp_path / "out"
    for name in ("a.ids.npy", "a.rows.npy", "b.ids.npy"):
        write(out / name, 3)
    (out / "export.json").write_text(json.dumps({"tables": tables}))
    summary = engine_export.export(ckpt, str(out))
    assert sorted(os.listdir(out)) == ["a.ids.npy", "a.rows.npy", "b.ids.npy", summary["dir"], "export.json"]
    assert len(exported(out, "a")[0]) == 10


def _export_five_rows(tmp_path, out) -> int:
    """`ps-worker export out` of a one-shard server (data and checkpoint root under tmp_path) holding 5 rows of a
    table "emb"; its exit code."""
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard-0"), port=0, checkpoint_root=str(tmp_path)))
    server.start()
    try:
        address = f"127.0.0.1:{server.port}"
        with Client([address]) as client:
            client.create_table(TableConfig("emb", 2))
            client.push("emb", np.arange(5, dtype=np.uint64), np.ones((5, 2), np.float32))
        return main(["export", str(out), "--servers", address, "--no-progress"])
    finally:
        server.stop(grace_s=1)

"""What restore, export and `ps-server verify` read of a checkpoint, and what they say of one they cannot: a link that
moves read as the one checkpoint it led to (and an export's checkpoint named, moved or removed, and a restart's
--restore taken as done, by it), a shard's folder gone named whole, a manifest's shard entry of the wrong types or
without its sha256 refused naming it, a restore into a dir with data checked against the RAM tier before a row is
copied, and a data dir named shard-<i> told from a checkpoint's folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ps.checkpoint import write_manifest
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.export import export
from ps.engine.shard import Shard
from ps.errors import RamTierTooSmallError, StorageError
from ps.server_config import ServerConfig
from ps.storage import verify
from ps.storage.store import Store
from tests.checkpointlinks import move_link, two_saves_behind_a_link
from tests.conftest import exported, one_shard_checkpoint, one_table_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root, where ps is


@pytest.mark.parametrize("what", ["checkpoint", "shard folder"])
def test_verify_through_a_link_a_save_moves_reports_on_the_one_checkpoint_it_led_to(tmp_path, monkeypatch, what):
    """`ps-server verify latest` (or latest/shard-1), the link moved to a newer save once the manifest was read:
    every shard's files are read from the checkpoint that manifest is of, and nothing is damaged."""
    latest, _ = two_saves_behind_a_link(tmp_path)
    load_manifest = verify.load_manifest

    def load_then_move(directory: str) -> dict:
        manifest = load_manifest(directory)
        move_link(latest, "two")  # a save finished meanwhile
        return manifest

    monkeypatch.setattr(verify, "load_manifest", load_then_move)
    path = latest if what == "checkpoint" else os.path.join(latest, "shard-1")
    lines, damaged = verify.verify_data_dir(path)
    assert not damaged, lines
    assert lines[-1] == f"verify checkpoint {path} (read at {tmp_path / 'one'}): nothing damaged", lines
    assert os.readlink(latest) == "two"  # the link did move while verify read
    shards = ["shard-0:", "shard-1:"] if what == "checkpoint" else ["shard-1:"]
    assert [line.split()[1] for line in lines if "files match the manifest's sha256" in line] == shards, lines


@pytest.mark.parametrize("gone", ["deleted", "a file in its place"])
def test_a_shard_folder_gone_is_named_whole_by_restore_export_and_verify(tmp_path, gone):
    """A checkpoint whose shard-0/ is gone: restore and export name the folder, as verify does."""
    ckpt = one_table_checkpoint(tmp_path, 10)
    shutil.rmtree(os.path.join(ckpt, "shard-0"))
    if gone == "a file in its place":
        with open(os.path.join(ckpt, "shard-0"), "w") as f:
            f.write("not a folder")
    what = "is missing" if gone == "deleted" else "is not a directory"
    said = (
        rf"checkpoint {ckpt}: shard-0 {what} \(the manifest lists it as shard 0's folder\); the checkpoint is damaged"
    )
    with pytest.raises(StorageError, match=rf"^{said}; the data dir was not touched$"):
        Shard(ServerConfig(data_dir=str(tmp_path / "new"), restore_dir=ckpt))
    assert not os.path.exists(tmp_path / "new")
    with pytest.raises(StorageError, match=rf"^{said}$"):
        export(ckpt, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")
    lines, damaged = verify.verify_checkpoint(ckpt)
    assert damaged and "DAMAGED shard-0: missing (the manifest lists it)" in lines, lines


def test_a_restore_into_a_dir_with_data_and_no_table_is_refused_for_the_ram_tier_before_a_row_is_copied(tmp_path):
    """A data dir a server ran on and made no table in, --restore of a checkpoint whose tables the RAM tier cannot
    hold: refused before a row is copied, as for a new dir."""
    wide = TableConfig("wide", 512, InitializerConfig("zeros"), OptimizerConfig("adagrad", 0.1))
    source = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        source.create_table(wide)
        source.push("wide", np.arange(1, 101, dtype=np.uint64), np.ones((100, 512), np.float32))
        one_shard_checkpoint(source, str(tmp_path / "ckpt"), [wide])
        saved = source.pull("wide", np.arange(1, 101, dtype=np.uint64))
    finally:
        source.close()
    used = str(tmp_path / "used")
    Shard(ServerConfig(data_dir=used)).close()  # data, no table
    with pytest.raises(RamTierTooSmallError, match=r"cannot hold the 1 tables of checkpoint .*ckpt: "):
        Shard(ServerConfig(data_dir=used, restore_dir=str(tmp_path / "ckpt"), cache_bytes=40_000))
    store = Store(used)
    try:
        assert store.load_tables() == [] and store.meta.restored() is None and not store.meta.restore_pending()
    finally:
        store.close()
    restored = Shard(ServerConfig(data_dir=used, restore_dir=str(tmp_path / "ckpt")))
    try:  # the default RAM tier holds it: restored whole
        np.testing.assert_array_equal(restored.pull("wide", np.arange(1, 101, dtype=np.uint64)), saved)
    finally:
        restored.close()


BAD_ENTRIES = [  # (the edit of shard entry 0, what the error says of it)
    (("clock", "7"), "clock '7', expected an integer >= 0"),
    (("clock", -1), "clock -1, expected an integer >= 0"),
    (("clock", None), "clock None, expected an integer >= 0"),  # (None: the key removed)
    (("rows", None), "rows None, expected an object {table name: rows}"),
    (("rows", [10]), "rows [10], expected an object {table name: rows}"),
    (("rows", {"a": "x"}), "rows 'x' of table 'a', expected an integer >= 0"),
    (("rows", {"a": -1}), "rows -1 of table 'a', expected an integer >= 0"),
    (("rows", {"a": True}), "rows True of table 'a', expected an integer >= 0"),
]


@pytest.mark.parametrize(("edit", "said"), BAD_ENTRIES)
def test_a_shard_entry_whose_clock_or_rows_do_not_read_is_refused_naming_it(tmp_path, edit, said):
    """A manifest edited, its sha256 made again, so that shard entry 0's clock or rows are no counts: restore,
    export and verify refuse it naming the manifest and the entry, changing nothing."""
    ckpt = one_table_checkpoint(tmp_path, 10)
    path = os.path.join(ckpt, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    key, value = edit
    manifest["shards"][0][key] = value
    if value is None:
        del manifest["shards"][0][key]
    write_manifest(ckpt, manifest)
    error = rf"checkpoint manifest {path} has shard entry 0 \(shard_id 0\) with {re.escape(said)}; the checkpoint is "
    with pytest.raises(StorageError, match=rf"^{error}damaged \(or was edited\)$"):
        export(ckpt, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")
    with pytest.raises(StorageError, match=rf"^{error}.*the data dir was not touched$"):
        Shard(ServerConfig(data_dir=str(tmp_path / "new"), restore_dir=ckpt))
    assert not os.path.exists(tmp_path / "new")
    lines, damaged = verify.verify_checkpoint(ckpt)
    assert damaged and lines[0].startswith("DAMAGED manifest: checkpoint manifest") and said in lines[0], lines
    if edit == ("rows", [10]):  # the command: a message, no traceback
        argv = [sys.executable, "-m", "ps", "export", ckpt, "--out", str(tmp_path / "out")]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert said in done.stderr, done.stderr


def test_a_data_dir_named_shard_0_whose_restore_was_stopped_gets_the_unfinished_restore_advice(tmp_path):
    """/data/shard-0 (the layout docs/reliability.md's examples use), its --restore stopped mid-copy: shard.json, no
    journal yet. `ps-server verify` reads it as a data dir holding an unfinished restore, and says to start that
    restore over."""
    from ps.engine.startup import StartProgress, StartStopped
    from ps.storage.sidefiles import IDENTITY_FILE, MARK_FILE

    ckpt = one_table_checkpoint(tmp_path, 300)
    held = set(os.listdir(os.path.join(ckpt, "shard-0")))
    assert not held & {"journal", IDENTITY_FILE, MARK_FILE}, held  # what tells a data dir from a checkpoint's folder

    class StopAfterABatch(StartProgress):
        def check(self) -> None:
            if self.phase == "restoring":  # the first check in the phase: after the restore's first batch
                self.stop.set()
            super().check()

    data_dir = tmp_path / "data" / "shard-0"
    with pytest.raises(StartStopped, match="restoring from its checkpoint"):
        Shard(ServerConfig(data_dir=str(data_dir), restore_dir=ckpt), StopAfterABatch())
    assert "journal" not in os.listdir(data_dir) and IDENTITY_FILE in os.listdir(data_dir)
    lines, damaged = verify.verify_data_dir(str(data_dir))
    assert damaged and lines[-2] == (f"DAMAGED restore: a restore from {ckpt} did not finish (a crash or a stop during "
                                     f"it): start with --restore {ckpt} to start it over, or delete the dir"), lines  # fmt: skip
    from ps.checkpoint import DATA_DIR_PARTS

    assert set(DATA_DIR_PARTS) == {"journal", IDENTITY_FILE, MARK_FILE}  # the names the data dir's files have


@pytest.mark.parametrize("kept", ["named", "moved", "removed"])
def test_an_export_through_a_link_names_moves_or_removes_the_checkpoint_it_read_not_the_link(tmp_path, caplog, kept):
    """ps-server export latest (a link to one): export.json names one, the checkpoint read, not the link (which a
    save moves on); --move-checkpoint moves one into the export, --remove-checkpoint removes one; the link stays as it
    is, and a warning names it."""
    latest, ids = two_saves_behind_a_link(tmp_path)
    out = tmp_path / "out"
    with caplog.at_level("WARNING", "ps.engine.export"):
        summary = export(latest, str(out), move_checkpoint=kept == "moved", remove_checkpoint=kept == "removed")
    with open(out / "export.json") as f:
        assert json.load(f)["checkpoint"] == summary["checkpoint"]
    assert os.readlink(latest) == "one" and os.path.isdir(tmp_path / "two")  # the link and the other save stay
    link_said = f"the link {latest} led to the checkpoint exported, {tmp_path / 'one'}, which was "
    if kept == "named":
        assert summary["checkpoint"] == str(tmp_path / "one") and os.path.isdir(tmp_path / "one")
        assert link_said not in caplog.text, caplog.text
    elif kept == "moved":
        moved = out / summary["dir"] / "checkpoint"
        assert summary["checkpoint"] == str(moved) and not os.path.islink(moved), summary
        assert os.path.isfile(moved / "manifest.json") and not os.path.lexists(tmp_path / "one")
        assert f"{link_said}moved into the export; the link is left as it is" in caplog.text, caplog.text
    else:
        assert summary["checkpoint"] is None and not os.path.lexists(tmp_path / "one")
        assert f"{link_said}removed; the link is left as it is" in caplog.text, caplog.text
        assert "could not be removed" not in caplog.text, caplog.text
    got, rows = exported(out, "a")
    np.testing.assert_array_equal(got, ids)
    np.testing.assert_array_equal(rows, -np.ones((len(ids), 2), np.float32))  # one's rows


def test_a_restart_with_restore_latest_after_the_link_moved_starts_on_what_the_dir_holds(tmp_path, caplog):
    """--restore latest (PS_RESTORE kept set), the dir restored from one and trained, the link moved to two by a
    later save: the restart starts on what the dir holds (its trained rows), with a warning that latest leads to
    another checkpoint now."""
    latest, ids = two_saves_behind_a_link(tmp_path)
    cfg = ServerConfig(data_dir=str(tmp_path / "d"), restore_dir=latest)
    restored = Shard(cfg)
    try:
        restored.push("a", ids, np.ones((len(ids), 2), np.float32))  # trained since: -1 - 1
    finally:
        restored.close()
    move_link(latest, "two")
    with caplog.at_level("INFO", "ps.engine.shard"):
        again = Shard(cfg)
    try:
        np.testing.assert_array_equal(again.pull("a", ids), -2 * np.ones((len(ids), 2), np.float32))
        np.testing.assert_array_equal(again.pull("b", ids), -np.ones((len(ids), 2), np.float32))  # one's, not two's
        assert again.describe_start().startswith("existing, tables"), again.describe_start()
    finally:
        again.close()
    assert (f"data dir {tmp_path / 'd'} was restored from {latest}, which leads to another checkpoint now "
            f"({tmp_path / 'two'}: a link moved, or a save replaced it); the dir keeps what it restored") in caplog.text  # fmt: skip
    assert "starting on what it holds" in caplog.text


def test_ps_server_export_with_tables_reads_the_checkpoints_files_once_from_the_one_it_exports(tmp_path, monkeypatch):
    """`ps-server export latest --tables a`, the link moved to two once the first shard's files were hashed: every
    file is hashed once, of one, and one is exported (its manifest is what the "left out" warning reads)."""
    from ps import checkpoint
    from ps.__main__ import main as server_main

    latest, ids = two_saves_behind_a_link(tmp_path)
    hashed, file_checksums = [], checkpoint.file_checksums

    def hash_then_move(path: str) -> dict[str, str]:
        hashed.append(os.path.relpath(path, tmp_path))
        move_link(latest, "two")  # a save finished meanwhile
        return file_checksums(path)

    monkeypatch.setattr(checkpoint, "file_checksums", hash_then_move)
    assert server_main(["export", latest, "--out", str(tmp_path / "out"), "--tables", "a", "--no-progress"]) == 0
    assert hashed == ["one/shard-0", "one/shard-1"]
    got, rows = exported(tmp_path / "out", "a")
    np.testing.assert_array_equal(got, ids)
    np.testing.assert_array_equal(rows, -np.ones((len(ids), 2), np.float32))  # one's rows


def test_a_manifest_without_its_sha256_is_refused_by_restore_export_and_verify_as_the_docs_say(tmp_path):
    """A manifest with no sha256 of itself (edited, or from a save before manifests carried one) is refused, not
    read with its other checks only, and docs/reliability.md quotes the refusal."""
    ckpt = one_table_checkpoint(tmp_path, 10)
    path = os.path.join(ckpt, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    del manifest["sha256"]
    with open(path, "w") as f:
        json.dump(manifest, f)
    said = "has no checksum of itself (sha256)"
    with pytest.raises(StorageError, match=re.escape(said)):
        Shard(ServerConfig(data_dir=str(tmp_path / "new"), restore_dir=ckpt))
    assert not os.path.exists(tmp_path / "new")
    with pytest.raises(StorageError, match=re.escape(said)):
        export(ckpt, str(tmp_path / "out"))
    lines, damaged = verify.verify_checkpoint(ckpt)
    assert damaged and said in lines[0], lines
    with open(os.path.join(ROOT, "docs", "reliability.md")) as f:
        doc = " ".join(f.read().split())
    assert f"is refused: `{said}`" in doc and "gets these checks only" not in doc

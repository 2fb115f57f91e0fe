"""What restore, export and `ps-server verify` read of a checkpoint, and what they say of one they cannot: a link that
moves read as the one checkpoint it led to, a shard's folder gone named whole."""

from __future__ import annotations

import os
import shutil

import pytest

from ps.engine.restore import export
from ps.engine.shard import Shard
from ps.errors import StorageError
from ps.server_config import ServerConfig
from ps.storage import verify
from tests.conftest import one_table_checkpoint
from tests.test_restore_tables import move_link, two_saves_behind_a_link


@pytest.mark.parametrize("what", ["checkpoint", "shard folder"])
def test_verify_through_a_link_a_save_moves_reports_on_the_one_checkpoint_it_led_to(tmp_path, monkeypatch, what):
    """`ps-server verify latest` (or latest/shard-1), the link moved to a newer save once the manifest was read:
    every shard's files are read from the checkpoint that manifest is of, and nothing is damaged. Before: the
    shards' folders were read through the moved link, the other checkpoint's files against this manifest (DAMAGED:
    files that do not match their sha256)."""
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
    """A checkpoint whose shard-0/ is gone: restore and export name the folder, as verify does. Before: they named
    its first file ("shard-0/000010.log is missing")."""
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

"""A restore copies every table its manifest lists, or refuses: a checkpoint whose RocksDB holds no table number for
a table of the manifest (a damaged checkpoint, or a manifest of another checkpoint) is a start-up error naming the
table, not a table restored empty."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from ps.bytesize import exact_bytes
from ps.checkpoint import write_manifest
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.errors import CheckpointDamagedError, RamTierTooSmallError, StorageError
from ps.rows.initializers import init_rows
from ps.server_config import ServerConfig
from ps.storage import atomicfile
from ps.storage.datadir import OpenDataDir
from ps.storage.store import Store
from ps.storage.verify import verify_checkpoint
from tests.checkpointlinks import move_link, two_saves_behind_a_link
from tests.conftest import exported, one_shard_checkpoint, one_table_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root, where ps is


def table(name: str) -> TableConfig:
    return TableConfig(name, 2, InitializerConfig("zeros"), OptimizerConfig("sgd", 1.0))


def test_a_table_of_the_manifest_the_checkpoint_lacks_is_refused_by_name(tmp_path):
    ids = np.arange(1, 6, dtype=np.uint64)
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(table("kept"))
        shard.push("kept", ids, np.ones((5, 2), np.float32))
        one_shard_checkpoint(shard, str(tmp_path / "good"), [table("kept")])
        one_shard_checkpoint(shard, str(tmp_path / "bad"), [table("kept"), table("lost")])  # "lost" is in no RocksDB
    finally:
        shard.close()
    restored = Shard(ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "good")))
    try:
        np.testing.assert_array_equal(restored.pull("kept", ids), -np.ones((5, 2), np.float32))
    finally:
        restored.close()
    with pytest.raises(CheckpointDamagedError, match=rf"checkpoint {tmp_path / 'bad'} is damaged: shard-0: its meta "
                       r"holds no table number for table\(s\) 'lost' of its manifest .*The restore stopped and deleted "
                       "what it had copied"):  # fmt: skip
        Shard(ServerConfig(data_dir=str(tmp_path / "b"), restore_dir=str(tmp_path / "bad")))
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "b")))  # no table, no mark of an unfinished restore
    try:
        assert shard.tables == {}
    finally:
        shard.close()
    lines, damaged = verify_checkpoint(str(tmp_path / "bad"))  # what the refusal says to run names it
    assert damaged and "DAMAGED shard-0: its meta holds no table number for table(s) 'lost' of the manifest (meta key " \
                       "tid/<table>): a restore of the checkpoint is refused" in lines, lines  # fmt: skip


def test_a_restart_with_the_same_restore_still_given_starts_on_what_the_dir_holds(tmp_path, caplog, monkeypatch):
    """PS_RESTORE kept in a container's environment: the restart neither copies the checkpoint again (rows
    trained since stay) nor refuses, reading the table configs and the cluster name once; another checkpoint is
    refused, saying how to start."""
    ids = np.arange(1, 6, dtype=np.uint64)
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(table("kept"))
        shard.push("kept", ids, np.ones((5, 2), np.float32))
        one_shard_checkpoint(shard, str(tmp_path / "one"), [table("kept")])
        shard.push("kept", ids, np.ones((5, 2), np.float32))
        one_shard_checkpoint(shard, str(tmp_path / "two"), [table("kept")])
    finally:
        shard.close()
    restored = Shard(ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "one")))
    assert restored.describe_start().startswith(f"restored from {tmp_path / 'one'}, tables kept 5 rows")
    restored.push("kept", ids, np.ones((5, 2), np.float32))  # trained after the restore
    restored.close()
    reads, load_tables, meta_get = [], Store.load_tables, OpenDataDir.meta_get
    monkeypatch.setattr(Store, "load_tables", lambda s: reads.append("tables") or load_tables(s))
    monkeypatch.setattr(
        OpenDataDir, "meta_get", lambda s, key, *a, **kw: reads.append(key) or meta_get(s, key, *a, **kw)
    )
    with caplog.at_level("INFO", "ps.engine.shard"):
        again = Shard(ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "one")))
    monkeypatch.undo()
    assert (reads.count("tables"), reads.count(b"cluster")) == (1, 1)
    try:
        np.testing.assert_array_equal(again.pull("kept", ids), -2 * np.ones((5, 2), np.float32))
        assert again.describe_start().startswith("existing, tables kept 5 rows")
        assert "was restored from" in caplog.text and "starting on what it holds" in caplog.text
    finally:
        again.close()
    with pytest.raises(StorageError, match=r"has tables already \(and was not restored from that checkpoint\): leave "
                                           r"--restore \(PS_RESTORE\) out"):  # fmt: skip
        Shard(ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "two")))
    shutil.rmtree(tmp_path / "one")  # pruned since: its path still names the restore
    Shard(ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "one"))).close()


def test_a_restart_with_the_same_restore_of_a_checkpoint_of_no_tables_does_not_restore_again(tmp_path):
    """A checkpoint of a shard with no tables (clock 5) restores once: a restart with --restore still given keeps the
    clock moved since and the model state's id (a restore again would set the clock back and draw a new id, and
    every client would get ModelStateReplacedError)."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.advance_clock(5)
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), [])
    finally:
        shard.close()
    config = ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=str(tmp_path / "ckpt"))
    restored = Shard(config)
    try:
        assert restored.tables == {} and restored.clock == 5
        assert restored.describe_start().startswith(f"restored from {tmp_path / 'ckpt'}")
        restored.advance_clock(3)
        state_id = restored.state_id
    finally:
        restored.close()
    again = Shard(config)
    try:
        assert (again.clock, again.state_id) == (8, state_id)
        assert again.describe_start().startswith("existing")
    finally:
        again.close()


# The export's peak (bytes held above what was held before it) of each table of the checkpoint at argv[1]/ckpt, each
# exported on its own (argv[2]: their names, as JSON) three times, the smallest kept (another allocation only raises
# a peak). Fixed costs are made small (a chunk of rows being read, a piece of rows being written), so that at every
# size the peak is where the most is held a row: the sorted ids being written, beside the ids, embeddings and sort
# order; tqdm's monitor thread, which a bar (even one that is off) starts, is kept from starting.
_EXPORT_PEAKS = """
import functools, json, sys, tracemalloc
from tqdm import tqdm
tqdm.monitor_interval = 0
from ps.engine import export as engine_export
from ps.storage.checkpointread import read_table
engine_export.read_table = functools.partial(read_table, chunk=1024)
engine_export.WRITE_ROWS = 4096
root, names = sys.argv[1], json.loads(sys.argv[2])
peaks = dict.fromkeys(names, float("inf"))
tracemalloc.start()
for _ in range(3):
    for name in names:
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        engine_export.export(f"{root}/ckpt", f"{root}/{name}", tables=[name])
        peaks[name] = min(peaks[name], tracemalloc.get_traced_memory()[1] - held)
print(json.dumps(peaks))
"""


def test_export_holds_what_it_writes_of_a_table_and_16_bytes_a_row_not_the_whole_rows(tmp_path):
    """ps-server export reads a table's rows (embedding, optimizer state, statistics: 28 floats for adam at dim 8)
    and writes the embeddings sorted by id. What it holds a row peaks as it writes the sorted ids: the ids (8 bytes), the
    embeddings (32), their int64 sort order (8) and the sorted ids being written (8), 56 in all; not the whole rows
    (112 bytes a row where the embeddings are 32) nor a sorted copy of the embeddings (32 more). What a row costs is
    the slope of the export's peak over two table sizes, where its fixed costs cancel out (an export's first-time
    allocations are spent by one of a tiny table first): at most 2 bytes a row over the design's 56, so a copy of
    one float32 column (4 bytes a row) fails it."""
    sizes = {"tiny": 100, "half": 50_000, "whole": 100_000}  # a table of each
    ids = np.random.default_rng(0).permutation(np.arange(1, sizes["whole"] + 1, dtype=np.uint64) * np.uint64(7919))
    grads = np.random.default_rng(1).standard_normal((sizes["whole"], 8)).astype(np.float32)
    specs = [TableConfig(name, 8, optimizer=OptimizerConfig("adam", 0.01)) for name in sizes]
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        for spec in specs:
            shard.create_table(spec)
            shard.push(spec.name, ids[: sizes[spec.name]], grads[: sizes[spec.name]])
        want = shard.pull("whole", np.sort(ids))
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), specs)
    finally:
        shard.close()
    # measured in a process of its own: tracemalloc counts what every thread allocates, and a test process holds
    # the threads of the tests before it
    child = subprocess.run(
        [sys.executable, "-c", _EXPORT_PEAKS, str(tmp_path), json.dumps(list(sizes))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )  # ROOT: the ps that this test imports
    assert child.returncode == 0, child.stderr
    peaks = json.loads(child.stdout)
    per_row = (peaks["whole"] - peaks["half"]) / (sizes["whole"] - sizes["half"])
    assert per_row <= 8 + 8 * 4 + 8 + 8 + 2, f"{per_row:.2f} bytes a row; peaks {peaks}"
    got_ids, got_rows = exported(tmp_path / "whole", "whole")
    np.testing.assert_array_equal(got_ids, np.sort(ids))
    np.testing.assert_array_equal(got_rows, want)


def test_export_json_names_each_tables_features_and_optimizer(tmp_path):
    """What a serving system needs to read the rows: the schema fingerprint the tables carry and the optimizer."""
    import json

    from ps.engine.export import export

    made = TableConfig("emb", 4, optimizer=OptimizerConfig("adagrad", 0.05), features="schema:0123456789abcdef",
                       initializer=InitializerConfig("normal", 0.5, 7))  # fmt: skip
    specs = [made, table("plain")]
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        for spec in specs:
            shard.create_table(spec)
            shard.push(spec.name, np.arange(1, 4, dtype=np.uint64), np.ones((3, spec.dim), np.float32))
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), specs)
        unseen = np.array([10, 2**63], dtype=np.uint64)
        served = shard.pull("emb", unseen)  # ids with no row: their initial embedding
    finally:
        shard.close()
    summary = export(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "export.json").read_text()) == summary
    zeros = {"name": "zeros", "scale": 0.01, "seed": 0}
    assert summary["tables"] == {
        "emb": {"dim": 4, "rows": 3, "features": "schema:0123456789abcdef", "optimizer": "adagrad",
                "initializer": {"name": "normal", "scale": 0.5, "seed": 7}},
        "plain": {"dim": 2, "rows": 3, "features": "", "optimizer": "sgd", "initializer": zeros},
    }  # fmt: skip
    rebuilt = np.zeros((2, 4), np.float32)  # what a serving system computes from export.json for an unseen id
    init_rows(InitializerConfig(**summary["tables"]["emb"]["initializer"]), unseen, rebuilt, 4)
    np.testing.assert_array_equal(rebuilt, served)
    assert (served != 0).all()


@pytest.mark.parametrize("no_progress", [False, True])
def test_ps_server_export_shows_rows_read_per_table_of_the_manifests_count(no_progress, tmp_path, capsys, monkeypatch):
    """A plain progress line (stderr no terminal) per table, rows read of the manifest's count; none with
    --no-progress; the files written are the same either way."""
    from ps.__main__ import main
    from ps.engine.export import ExportProgress

    monkeypatch.setattr(ExportProgress, "PLAIN_EVERY_S", 0.0)
    specs = [TableConfig("a", 2), TableConfig("b", 3)]
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        for spec, n in zip(specs, (700, 40), strict=True):
            shard.create_table(spec)
            shard.push(spec.name, np.arange(1, n + 1, dtype=np.uint64), np.ones((n, spec.dim), np.float32))
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), specs)
    finally:
        shard.close()
    flag = ["--no-progress"] if no_progress else []
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), *flag]) == 0
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.startswith("export: ")]
    if no_progress:
        assert lines == [], err
    else:
        assert [x.split(" (100%), ")[0] for x in lines] == [
            "export: table a: 700 of 700 rows read", "export: table a: 700 of 700 rows written",
            "export: table b: 40 of 40 rows read", "export: table b: 40 of 40 rows written"], err  # fmt: skip
    folder = tmp_path / "out" / json.loads((tmp_path / "out" / "export.json").read_text())["dir"]
    assert f"exported the model at clock 0 to {folder} (rows; named by {tmp_path / 'out' / 'export.json'}): " in out
    np.testing.assert_array_equal(exported(tmp_path / "out", "a")[0], np.arange(1, 701, dtype=np.uint64))


def test_ps_server_export_prints_the_clock_and_since_with_thousands_separators(tmp_path, capsys):
    """The checkpoint's clock and --since read as the other lines print them (3,920, not 3920)."""
    from ps.__main__ import main

    spec = TableConfig("a", 2)
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(spec)
        shard.push("a", np.arange(1, 3, dtype=np.uint64), np.ones((2, 2), np.float32))
        shard.advance_clock(3920)
        clock = shard.clock
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), [spec])
    finally:
        shard.close()
    assert clock >= 3920
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), "--since", "1500"]) == 0
    out = capsys.readouterr().out
    assert f"exported the model at clock {clock:,} to " in out and "(rows pushed at step >= 1,500; named by " in out


def test_export_refuses_a_shard_holding_more_rows_than_its_manifest_says_and_writes_nothing(tmp_path):
    """The arrays are sized by the manifest's counts: a shard with more rows stops the read before any lands past
    them, and is named as damaged."""
    from ps.engine.export import export

    spec = TableConfig("emb", 2)
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(spec)
        shard.push("emb", np.arange(1, 6, dtype=np.uint64), np.ones((5, 2), np.float32))
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), [spec], edit=lambda info: info["rows"].update(emb=3))
    finally:
        shard.close()
    with pytest.raises(CheckpointDamagedError) as refused:
        export(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert str(refused.value) == (
        f"checkpoint {tmp_path / 'ckpt'} is damaged: shard-0: it holds more than 3 admitted rows of table 'emb' where "
        "its manifest says 3: its rows, its table number (meta key tid/emb) and its manifest's count do not match. "
        f"`ps-server verify {tmp_path / 'ckpt'}` lists everything damaged in it"
    )
    assert not (tmp_path / "out").exists()  # the out it made is removed again


def test_a_restore_stopped_midway_is_started_over_by_the_next_start_with_the_same_restore(tmp_path, caplog):
    """A stop (SIGTERM) during a restore ends it after a batch of rows; the dir is marked unfinished: a start
    without --restore, or with another checkpoint, is refused and deletes nothing; one with the same checkpoint
    empties the dir and restores it whole (the rows of a restore that never stopped)."""
    from ps.engine.startup import StartProgress, StartStopped

    specs = [TableConfig("a", 2), TableConfig("b", 3)]
    ids = np.arange(1, 301, dtype=np.uint64)
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        for spec in specs:
            shard.create_table(spec)
            shard.push(spec.name, ids, np.ones((len(ids), spec.dim), np.float32))
        want = {spec.name: shard.pull(spec.name, ids) for spec in specs}
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), specs)
        shard.push("a", ids, np.ones((len(ids), 2), np.float32))
        one_shard_checkpoint(shard, str(tmp_path / "other"), specs)
    finally:
        shard.close()

    class StopAfterABatch(StartProgress):
        def check(self) -> None:
            if self.phase == "restoring":  # the first check in the phase: after the restore's first batch
                self.stop.set()
            super().check()

    cfg = ServerConfig(data_dir=str(tmp_path / "d"), restore_dir=str(tmp_path / "ckpt"))
    with pytest.raises(StartStopped, match="restoring from its checkpoint"):
        Shard(cfg, StopAfterABatch())
    for restore in (None, str(tmp_path / "other")):
        with pytest.raises(StorageError, match=rf"holds a restore from {tmp_path / 'ckpt'} that did not finish; "
                                               rf"start with --restore {tmp_path / 'ckpt'} to start it over"):  # fmt: skip
            Shard(ServerConfig(data_dir=str(tmp_path / "d"), restore_dir=restore))
        assert (tmp_path / "d" / "CURRENT").exists()  # still the dir's RocksDB, still marked (the next refusal)
    with caplog.at_level("WARNING", "ps.engine.shard"):
        again = Shard(cfg)
    try:
        assert "that did not finish (the server stopped during it): starting it over" in caplog.text
        assert again.describe_start().startswith(f"restored from {tmp_path / 'ckpt'}, tables a 300 rows, b 300 rows")
        for spec in specs:
            np.testing.assert_array_equal(again.pull(spec.name, ids), want[spec.name])
    finally:
        again.close()


def test_starting_a_restore_over_deletes_keys_not_files_so_a_checkpoint_inside_the_data_dir_stays(tmp_path):
    """A data dir a server once started on (no tables), a checkpoint copied into it, a restore from there stopped
    midway: the start-over deletes the restore's keys in RocksDB, and every file but RocksDB's own is as it was."""
    import shutil

    from ps.engine.startup import StartProgress, StartStopped

    spec = TableConfig("a", 2)
    ids = np.arange(1, 301, dtype=np.uint64)
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(spec)
        shard.push("a", ids, np.ones((len(ids), 2), np.float32))
        want = shard.pull("a", ids)
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), [spec])
    finally:
        shard.close()
    Shard(ServerConfig(data_dir=str(tmp_path / "data"))).close()
    shutil.copytree(tmp_path / "ckpt", tmp_path / "data" / "ckpt")
    before = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "data" / "ckpt").rglob("*"))

    class StopAfterABatch(StartProgress):
        def check(self) -> None:
            if self.phase == "restoring":
                self.stop.set()
            super().check()

    cfg = ServerConfig(data_dir=str(tmp_path / "data"), restore_dir=str(tmp_path / "data" / "ckpt"))
    with pytest.raises(StartStopped):
        Shard(cfg, StopAfterABatch())
    again = Shard(cfg)
    try:
        np.testing.assert_array_equal(again.pull("a", ids), want)
        assert again.describe_start().startswith("restored from")
    finally:
        again.close()
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "data" / "ckpt").rglob("*")) == before


def test_an_export_stopped_while_it_writes_rows_leaves_no_partial_file(tmp_path, monkeypatch):
    """Ctrl-C (or a MemoryError) while the sorted rows are written removes the file being written, as an OSError
    does."""
    from ps.engine import export as engine_export

    one_table_checkpoint(tmp_path, 100)
    update = engine_export.ExportProgress.update

    def interrupted(self, n: int) -> None:
        if self.phase == "written":
            raise KeyboardInterrupt
        update(self, n)

    monkeypatch.setattr(engine_export.ExportProgress, "update", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine_export.export(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # nor the out it made


def test_export_writes_the_tables_named_or_matched_only(tmp_path, capsys):
    from ps.__main__ import main as server_main
    from ps.engine.export import export

    specs = [table("fm"), table("dense.fm.w"), table("lr")]
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        for spec in specs:
            shard.create_table(spec)
            shard.push(spec.name, np.arange(1, 4, dtype=np.uint64), np.ones((3, 2), np.float32))
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), specs)
    finally:
        shard.close()
    summary = export(str(tmp_path / "ckpt"), str(tmp_path / "out"), tables=["fm", "dense.fm.*"])
    assert sorted(summary["tables"]) == ["dense.fm.w", "fm"]
    assert sorted(os.listdir(tmp_path / "out")) == sorted([summary["dir"], "export.json"])
    assert sorted(os.listdir(tmp_path / "out" / summary["dir"])) == ["dense.fm.w.ids.npy", "dense.fm.w.rows.npy",
                                                                    "fm.ids.npy", "fm.rows.npy"]  # fmt: skip
    code = server_main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "none"), "--tables", "fm,deepfm"])
    assert code == 2 and "--tables 'deepfm' matches no table of the checkpoint; it holds fm, dense.fm.w, lr" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "none").exists()  # refused before anything was made


def test_export_of_part_of_a_models_tables_warns_naming_those_left_out(tmp_path, capsys):
    """Tables that share a `features` (one schema's fingerprint) are one model: --tables that takes some of them
    and leaves others out says which, after exporting; a whole model, or tables of no named features, say nothing."""
    from ps.__main__ import main as server_main

    named = lambda name, features: dataclasses.replace(table(name), features=features)
    specs = [named("fm", "schema:x"), named("dense.fm.w", "schema:x"), named("lr", "schema:y"), table("plain"),
             named("dense.fm.b", "schema:x")]  # fmt: skip
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        for spec in specs:
            shard.create_table(spec)
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), specs)
    finally:
        shard.close()

    def warnings(tables: str) -> list[str]:
        out = tmp_path / f"out-{tables}"
        assert server_main(["export", str(tmp_path / "ckpt"), "--out", str(out), "--tables", tables]) == 0
        assert (out / "export.json").exists()
        return [line for line in capsys.readouterr().err.splitlines() if "warning" in line]

    assert warnings("fm") == ["ps-server export: warning: --tables leaves out dense.fm.w, dense.fm.b of the model of "
                              "fm (features 'schema:x'): this export holds only part of that model"]  # fmt: skip
    assert warnings("dense.fm.*,lr") == ["ps-server export: warning: --tables leaves out fm of the model of "
                                         "dense.fm.w, dense.fm.b (features 'schema:x'): this export holds only part "
                                         "of that model"]  # fmt: skip
    assert warnings("fm,dense.fm.*") == warnings("lr") == warnings("plain") == warnings("lr,plain,fm,dense.*") == []


def test_a_restore_the_ram_tier_cannot_hold_is_refused_before_a_row_is_copied(tmp_path):
    """The check a start on the restored dir would make (the RAM tier holds every table's share), made from the
    manifest: a long restore is not run only to be refused at its end, and the data dir is not created."""
    wide = TableConfig("wide", 512, InitializerConfig("zeros"), OptimizerConfig("adagrad", 0.1))
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(table("kept"))
        shard.create_table(wide)
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), [table("kept"), wide])
    finally:
        shard.close()
    target = tmp_path / "new"
    with pytest.raises(RamTierTooSmallError, match=r"cannot hold the 2 tables of checkpoint .*ckpt: .*raise "
                                                   r"--cache-bytes to at least (.+)$") as info:  # fmt: skip
        Shard(ServerConfig(data_dir=str(target), restore_dir=str(tmp_path / "ckpt"), cache_bytes=40_000))
    assert not target.exists()
    least = info.value.tables * info.value.floor_bytes  # the figure the message names, as a field
    assert str(info.value).endswith(f"at least {exact_bytes(least)}") and least > 0, str(info.value)
    restored = Shard(ServerConfig(data_dir=str(target), restore_dir=str(tmp_path / "ckpt"), cache_bytes=least))
    assert sorted(restored.tables) == ["kept", "wide"]  # that much holds them, restored and started on
    restored.close()


def test_an_export_over_an_earlier_one_leaves_no_file_of_a_table_it_does_not_list(tmp_path):
    """--overwrite: the files in out are those of the new export.json; the earlier export's folder goes whole, its
    other tables too (a loader that globs *.npy, or a delta applied over out, would read them as this export's),
    and so do the .npy files in out itself of an earlier export.json that names no folder."""
    from ps.engine.export import export

    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        for name in ("a", "b"):
            shard.create_table(table(name))
            shard.push(name, np.arange(1, 4, dtype=np.uint64), np.ones((3, 2), np.float32))
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), [table("a"), table("b")])
    finally:
        shard.close()
    out = tmp_path / "out"
    first = export(str(tmp_path / "ckpt"), str(out))["dir"]
    (out / "notes.txt").write_text("mine")
    assert sorted(p.name for p in out.iterdir()) == sorted([first, "export.json", "notes.txt"])
    assert sorted(p.name for p in (out / first).iterdir()) == ["a.ids.npy", "a.rows.npy", "b.ids.npy", "b.rows.npy"]
    summary = export(str(tmp_path / "ckpt"), str(out), tables=["a"])
    assert list(summary["tables"]) == ["a"] and summary["dir"] != first
    assert sorted(p.name for p in out.iterdir()) == sorted([summary["dir"], "export.json", "notes.txt"])
    assert sorted(p.name for p in (out / summary["dir"]).iterdir()) == ["a.ids.npy", "a.rows.npy"]
    flat = tmp_path / "flat"  # an export.json without "dir": its tables' files in out itself
    flat.mkdir()
    (flat / "export.json").write_text(json.dumps({"tables": {"a": {}, "b": {}}}))
    for name in ("a.ids.npy", "a.rows.npy", "b.ids.npy", "b.rows.npy", "c.ids.npy"):
        (flat / name).write_bytes(b"x")
    summary = export(str(tmp_path / "ckpt"), str(flat), tables=["a"])
    assert sorted(p.name for p in flat.iterdir()) == sorted([summary["dir"], "c.ids.npy", "export.json"])


def test_an_exports_clock_for_the_next_delta_is_the_smallest_shard_clock(tmp_path):
    """A checkpoint whose shards were held at clocks 1 and 2 (a step straddling the cut): rows that step pushed
    after the cut on the lagging shard are stamped 1, so the next delta must take --since 1, not the manifest's 2."""
    from ps.engine.export import export

    shard = Shard(ServerConfig(data_dir=str(tmp_path / "source")))
    try:
        shard.create_table(table("a"))
        shard.push("a", np.arange(1, 4, dtype=np.uint64), np.ones((3, 2), np.float32))

        def lagging(info: dict) -> None:  # as if another shard of the cut was at clock + 1
            info["clock"] = 1

        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), [table("a")], edit=lagging)
    finally:
        shard.close()
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    manifest["clock"] = 2
    write_manifest(str(tmp_path / "ckpt"), manifest)
    summary = export(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert (summary["clock"], summary["checkpoint_clock"]) == (1, 2)
    assert json.loads((tmp_path / "out" / "export.json").read_text())["clock"] == 1


def recorded_syncs(monkeypatch) -> list[tuple[str, ...]]:
    """The fsyncs (of the file or directory each descriptor names) and renames (source, target) from here on, in
    order, as real paths."""
    events: list[tuple[str, ...]] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        events.append(("fsync", os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))))
        fsync(fd)

    def recording_replace(source, target) -> None:
        replace(source, target)
        events.append(("replace", os.path.realpath(source), os.path.realpath(target)))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    return events


def assert_synced_into_place(events: list[tuple[str, ...]], final) -> None:
    """final was renamed into place once, from a temporary file fsynced before, and its directory fsynced after."""
    final = os.path.realpath(final)
    renames = [e for e in events if e[0] == "replace" and e[2] == final]
    assert len(renames) == 1, (final, events)
    at = events.index(renames[0])
    assert ("fsync", renames[0][1]) in events[:at], f"{renames[0][1]} was not fsynced before its rename: {events}"
    assert ("fsync", os.path.dirname(final)) in events[at + 1 :], f"no fsync of {final}'s directory after: {events}"


def test_a_manifest_is_fsynced_and_so_is_its_directory_after_the_rename(tmp_path, monkeypatch):
    (tmp_path / "ckpt").mkdir()
    events = recorded_syncs(monkeypatch)
    write_manifest(str(tmp_path / "ckpt"), {"format": 1})
    assert_synced_into_place(events, tmp_path / "ckpt" / "manifest.json")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["manifest.json"]  # no temporary file left
    mode = (tmp_path / "ckpt" / "manifest.json").stat().st_mode & 0o777
    assert mode == 0o666 & ~atomicfile._umask(), oct(mode)  # the servers' user reads it to restore


def test_an_exports_files_are_fsynced_and_so_is_out_after_the_rename(tmp_path, monkeypatch):
    from ps.engine.export import export

    one_table_checkpoint(tmp_path, 10)
    events = recorded_syncs(monkeypatch)
    files = tmp_path / "out" / export(str(tmp_path / "ckpt"), str(tmp_path / "out"))["dir"]
    assert_synced_into_place(events, tmp_path / "out" / "export.json")
    at = next(k for k, e in enumerate(events) if e[0] == "replace")  # export.json's: the export in place
    for path in (files / "a.ids.npy", files / "a.rows.npy", files):  # its folder and files, fsynced before
        assert ("fsync", os.path.realpath(path)) in events[:at], (path, events)


@pytest.mark.parametrize("cut", ["half", "empty"])
def test_a_manifest_cut_short_is_called_damaged_by_restore_and_export(tmp_path, cut):
    from ps.engine.export import export

    one_table_checkpoint(tmp_path, 10)
    path = tmp_path / "ckpt" / "manifest.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2] if cut == "half" else "")
    damaged = rf"checkpoint manifest {path} is not whole JSON \(.*\); the checkpoint is damaged \(or its save was cut"
    with pytest.raises(StorageError, match=damaged):
        Shard(ServerConfig(data_dir=str(tmp_path / "d"), restore_dir=str(tmp_path / "ckpt")))
    with pytest.raises(StorageError, match=damaged):
        export(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert not (tmp_path / "d").exists() and not (tmp_path / "out").exists()


def test_a_stop_asked_as_a_restore_ends_leaves_a_restored_dir_that_starts_without_the_restore(tmp_path, monkeypatch):
    """A stop asked for after the restore's last batch (or during one of a share with no rows) is taken at the
    next check, in the phase after the restore: the dir holds the whole restore and no mark, so the line printed
    says it is as the next start can use, and a start without --restore serves it."""
    import ps.engine.opening as opening
    from ps.engine.startup import StartProgress, StartStopped
    from ps.server_run import _stopped_start_line

    checkpoint = one_table_checkpoint(tmp_path, 5)
    progress, restore = StartProgress(), opening.restore_into

    def restore_then_stop(*args, **kwargs):
        summary = restore(*args, **kwargs)
        progress.stop.set()  # a SIGTERM just after the last batch's check
        return summary

    monkeypatch.setattr(opening, "restore_into", restore_then_stop)
    config = ServerConfig(data_dir=str(tmp_path / "a"), restore_dir=checkpoint)
    with pytest.raises(StartStopped) as stopped:
        Shard(config, progress)
    assert progress.phase == "restored"
    line = _stopped_start_line("ps-server", stopped.value, progress.phase, config.restore_dir)
    assert line.endswith("its data dir is as the next start can use"), line
    monkeypatch.undo()
    again = Shard(dataclasses.replace(config, restore_dir=None))
    try:
        assert again.describe_start() == "existing, tables a 5 rows, clock 0"
    finally:
        again.close()


def test_a_restore_keeps_trained_a_table_a_shrink_emptied_on_the_shards_that_take_its_slots(tmp_path):
    """A checkpoint of 2 shards: table t trained on shard 1 only, then emptied by a Shrink (no row, no pending id,
    trained: RocksDB's counts say so); table never, never pushed to. Restored on 2 shards, t is trained on the shard
    that takes shard 1's slots only; on 1 shard, which takes every slot, it is trained; never is trained nowhere."""
    from ps.checkpoint import FORMAT
    from ps.config import EvictionConfig
    from ps.sharding import NUM_SLOTS, SlotMap

    specs = [TableConfig("t", 2, eviction=EvictionConfig(ttl_steps=1)), table("never")]
    source, infos, clocks = [], [], []
    for i in range(2):
        shard = Shard(ServerConfig(data_dir=str(tmp_path / f"source-{i}"), shard_id=i, num_shards=2))
        source.append(shard)
        for spec in specs:
            shard.create_table(spec)
    try:
        ids = np.arange(1, 200, dtype=np.uint64)
        ids = ids[SlotMap.contiguous(2).shard_of(ids) == 1][:5]
        source[1].push("t", ids, np.ones((5, 2), np.float32))
        source[1].flush()
        source[1].advance_clock(3)
        assert source[1].shrink("t")["dropped"] == 5
        assert [s.table("t").trained for s in source] == [False, True] and source[1].table("t").num_rows == 0
        for shard in source:
            clock, token = shard.hold(60)
            try:
                infos.append(shard.save_checkpoint(str(tmp_path / "ckpt"), token))
            finally:
                shard.release(token)
            clocks.append(clock)
    finally:
        for shard in source:
            shard.close()
    write_manifest(str(tmp_path / "ckpt"), {"format": FORMAT, "num_shards": 2, "num_slots": NUM_SLOTS,
                                            "clock": max(clocks), "created": "now",
                                            "tables": [t.to_dict() for t in specs], "shards": infos})  # fmt: skip
    for num_shards, trained in ((2, [False, True]), (1, [True])):
        restored = [
            Shard(
                ServerConfig(
                    data_dir=str(tmp_path / f"to-{num_shards}-{i}"),
                    shard_id=i,
                    num_shards=num_shards,
                    restore_dir=str(tmp_path / "ckpt"),
                )
            )  # fmt: skip
            for i in range(num_shards)
        ]
        try:
            assert [s.table("t").trained for s in restored] == trained, num_shards
            assert not any(s.table("never").trained for s in restored)
            assert all(s.table("t").num_rows == 0 for s in restored)
        finally:
            for shard in restored:
                shard.close()


FORK_SERVER = """
import json, os, re, runpy, sys, threading
import ps.__main__, ps.engine.export, ps.engine.restore  # imported once, here: each run is a process forked from this one
from ps.storage import leftovers
del sys.modules["ps.__main__"]  # run as a script by each run, as `python -m ps` runs it
assert threading.active_count() == 1, "a fork copies no thread but its caller"
out = os.path.realpath(sys.argv[1])
REMOVALS = ("remove", "unlink", "rmdir")  # of a run of one of these in one folder, the first two are kill points
def resolved(path, dir_fd):  # the name an operation acts on, not a link's target; shutil.rmtree's by dir_fd
    start = "." if dir_fd is None else os.readlink(f"/proc/self/fd/{dir_fd}")
    path = os.fsdecode(path)
    return os.path.join(os.path.realpath(os.path.join(start, os.path.dirname(path))), os.path.basename(path))
def paths_of(name, args, kwargs):
    if name == "fsync":
        return [os.readlink(f"/proc/self/fd/{args[0]}")]
    if name in ("rename", "replace"):  # its source and its destination: a rename into out is on out too
        return [resolved(args[0], kwargs.get("src_dir_fd")), resolved(args[1], kwargs.get("dst_dir_fd"))]
    return [resolved(args[0], kwargs.get("dir_fd"))]
def in_out(path):
    return path == out or path.startswith(out + os.sep)
def step(when, name, paths):  # as each run names it: export-<8 hex>, a name drawn anew each run, as export-*
    return " ".join([when, name, *(re.sub(r"export-[0-9a-f]{8}", "export-*", os.path.relpath(p, out)) for p in paths)])
def run_killed_at(phase, kill_at, argv, report):
    steps, last, repeats, removing = [], None, 0, False
    def point(at):  # a kill point of the steps swept: those of leftovers.remove, or the export's own (the rest)
        if removing == (phase == "leftovers"):
            steps.append(at)
            if len(steps) == kill_at:  # as a SIGKILL or a power loss: nothing after it runs
                os.write(report, json.dumps(steps).encode())
                os._exit(137)
    def killed_at(name, real):
        def call(*args, **kwargs):
            nonlocal last, repeats
            paths = paths_of(name, args, kwargs)
            ours = [p for p in paths if in_out(p)]
            key = (name, os.path.dirname(ours[0]) if ours else None)
            repeats, last = repeats + 1 if key == last else 1, key  # any other operation ends a run
            if ours and (name not in REMOVALS or repeats <= 2):
                point(step("before", name, paths))
            done = real(*args, **kwargs)
            if ours and name == "mkdir":
                point(step("after", name, paths))  # the new folder, empty
            return done
        setattr(os, name, call)
    def removing_leftovers(real):
        def call(*args, **kwargs):
            nonlocal removing
            removing = True
            try:
                return real(*args, **kwargs)
            finally:
                removing = False
        return call
    for name in ("mkdir", "fsync", "replace", "rename", "remove", "unlink", "rmdir"):  # after the imports: what
        killed_at(name, getattr(os, name))  # chose by the real functions (shutil.rmtree's dir_fd way) keeps its choice
    leftovers.remove = removing_leftovers(leftovers.remove)  # what leftovers.claimed removes
    sys.argv = ["ps", *argv]
    try:
        runpy.run_module("ps", run_name="__main__")
    finally:
        os.write(report, json.dumps(steps).encode())
    sys.exit(0)  # as `python -m ps` ends: out of the loop below, its SystemExit too
for line in sys.stdin:
    phase, kill_at, argv = json.loads(line)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.dup2(2, 1)  # its output to stderr: stdout answers each run's exit status and steps
        run_killed_at(phase, kill_at, argv, write_end)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as report:
        steps = json.loads(report.read() or b"null")
    print(json.dumps([os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), steps]), flush=True)
"""


@contextlib.contextmanager
def fork_server(out) -> Iterator[Callable[[str, int, list[str]], tuple[int, list[str]]]]:
    """Yields run(phase, kill_at, argv): `ps-server <argv>` run in a process forked from one that imported ps once
    (FORK_SERVER), so a run costs what the export does, not an interpreter's start; killed (os._exit) at the
    kill_at-th kill point (1, 2, ...) of the phase's steps ("export": its own, "leftovers": its removal of what
    killed exports left in out); returns its exit status (137: killed) and the steps of the phase up to there
    (kill_each_step says which they are). On an error (a run that hangs past 60 s among them) the server and the run
    it forked are killed at once, so what is raised is that error and no process is left."""
    import select
    import signal
    import subprocess
    import sys
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryFile("w+") as errors:
        # in a session of its own: its process group is it and the runs it forks, killed together on an error
        server = subprocess.Popen([sys.executable, "-c", FORK_SERVER, str(out)], cwd=root, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True)  # fmt: skip

        def output() -> str:
            errors.seek(0)
            return errors.read()[-3000:]

        def run(phase: str, kill_at: int, argv: list[str]) -> tuple[int, list[str]]:
            server.stdin.write(json.dumps([phase, kill_at, argv]) + "\n")
            server.stdin.flush()
            assert select.select([server.stdout], [], [], 60)[0], f"run {phase} {kill_at} still runs after 60 s"
            answer = server.stdout.readline()
            assert answer, f"the fork server ended: {output()}"
            status, steps = json.loads(answer)
            assert status in (0, 137), output()
            return status, steps

        try:
            yield run
            server.stdin.close()  # its loop ends
            server.wait(timeout=60)
        finally:
            if server.returncode is None:  # not reaped (a run failed, or the server did not end): its group id
                os.killpg(server.pid, signal.SIGKILL)  # is still its own, and the run it waits on, hung, is in it
                server.wait()
            with contextlib.suppress(BrokenPipeError):  # a request the killed server never read
                server.stdin.close()
            server.stdout.close()


def kill_each_step(argv, out, read, earlier, whole_new) -> None:
    """Runs `ps-server <argv()>` (fork_server) killed at its 1st, 2nd, ... kill point until a run ends; then, after
    a run killed before its rename of export.json.tmp (which leaves its whole folder and export.json.tmp), one
    killed at the 1st, 2nd, ... kill point of its removal of those, until a run ends. After each run, read() is the
    earlier export or the whole new one (from the first run that left the new one, that is the earlier one). The
    steps the runs were killed at are those of the run that ended, each in turn.

    A kill point is a file operation (mkdir, fsync, replace, rename, remove, unlink, rmdir) on out or a name in it
    (a rename's source or destination), before it runs, and just after each mkdir there (the new folder, empty):
    what a kill leaves is what out holds, so one before an operation elsewhere (the checkpoint's read-only copy in
    the temp dir) leaves out as the next point does. Of a run of one removal (remove, unlink or rmdir) in one
    folder, which any other of those operations ends, on out or elsewhere (the files of a folder removed one by
    one), the first two are points: nothing of the run done, and part of it; the next point of its phase, where
    there is one, is where all of it is done. A run's points are counted in two phases, each from 1: those within
    its removal of what killed exports left (leftovers.remove, under its claim on out), and its own steps, the
    rest."""

    def check(earlier, run: str):  # what read() finds: earlier, or the whole new export from its first one on
        now = read()
        assert now in (earlier, whole_new), (run, now)
        return now

    with fork_server(out) as run:
        killed, kill_at, status = [], 0, 137
        while status == 137:
            kill_at += 1
            status, steps = run("export", kill_at, argv())
            killed += steps[-1:] if status == 137 else []
            earlier = check(earlier, f"export {kill_at}")
        assert killed == steps, "the steps killed at are not those of the export that ran whole"
        before_rename = steps.index("before replace export.json.tmp export.json") + 1
        killed, kill_at, status = [], 0, 137
        while status == 137:
            kill_at += 1
            assert run("export", before_rename, argv()) == (137, steps[:before_rename])
            check(whole_new, f"export {before_rename}")
            status, removal = run("leftovers", kill_at, argv())
            killed += removal[-1:] if status == 137 else []
            check(whole_new, f"leftovers {kill_at}")
        assert killed == removal and len(removal) > 1, (killed, removal)


def test_an_export_killed_at_any_point_leaves_the_earlier_one_whole_or_the_new_one(tmp_path):
    """`ps-server export --overwrite` killed at each kill point in turn (kill -9, a power loss; kill_each_step: its
    own steps, then its removal of what a killed one left): a reader of out, by export.json and the folder it
    names, finds the earlier export or the new one, each whole, never a mix; the next export removes what the killed
    ones left, and only that."""

    from ps.engine.export import export

    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old, new = one_table_checkpoint(tmp_path / "old", 10), one_table_checkpoint(tmp_path / "new", 30)
    out = tmp_path / "out"

    def read(folder=out) -> dict:  # {table: [ids, rows]}; an export.json without "dir": files in out itself
        summary = json.loads((folder / "export.json").read_text())
        files = folder / summary.get("dir", "")
        return {t: [np.load(files / f"{t}.{kind}.npy").tolist() for kind in ("ids", "rows")] for t in summary["tables"]}

    export(old, str(out))
    (out / "notes.txt").write_text("mine")
    earlier = read()
    export(new, str(tmp_path / "reference"))
    whole_new = read(tmp_path / "reference")
    assert earlier != whole_new
    kill_each_step(
        lambda: ["export", new, "--out", str(out), "--overwrite", "--no-progress"], out, read, earlier, whole_new
    )
    export(old, str(out))  # removes what the killed exports left
    assert sorted(os.listdir(out)) == sorted([json.loads((out / "export.json").read_text())["dir"], "export.json",
                                              "notes.txt"])  # fmt: skip


def test_an_export_that_moves_its_checkpoint_killed_at_any_point_leaves_one_whole_export_and_its_checkpoint(tmp_path):
    """`ps-server export --overwrite --move-checkpoint` (ps-worker export --keep-checkpoint) killed at each kill point
    in turn (kill_each_step): a reader of out finds the earlier export or the new one, each whole with the checkpoint
    it was made from, named by its export.json; the checkpoint is never both in place and missing."""
    import shutil

    from ps.checkpoint import read_manifest
    from ps.engine.export import export

    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old, new = one_table_checkpoint(tmp_path / "old", 10), one_table_checkpoint(tmp_path / "new", 30)
    out = tmp_path / "out"
    out.mkdir()

    def fresh() -> str:  # a copy of the new checkpoint in out, as ps-worker export's save leaves it
        path = out / "checkpoint.new-test"
        if not path.exists():
            shutil.copytree(new, path)
        return str(path)

    def read() -> tuple:  # (tables' ids, the kept checkpoint's sha256), by export.json
        summary = json.loads((out / "export.json").read_text())
        assert summary["checkpoint"] == str(out / summary["dir"] / "checkpoint"), summary
        ids = {t: np.load(out / summary["dir"] / f"{t}.ids.npy").tolist() for t in summary["tables"]}
        return ids, read_manifest(summary["checkpoint"])["sha256"]

    shutil.copytree(old, out / "checkpoint.new-test")
    export(str(out / "checkpoint.new-test"), str(out), move_checkpoint=True)
    earlier = read()
    assert earlier == ({"a": list(range(1, 11))}, read_manifest(old)["sha256"])
    whole_new = ({"a": list(range(1, 31))}, read_manifest(new)["sha256"])
    kill_each_step(
        lambda: ["export", fresh(), "--out", str(out), "--overwrite", "--move-checkpoint", "--no-progress"],
        out,
        read,
        earlier,
        whole_new,
    )
    kept = json.loads((out / "export.json").read_text())["checkpoint"]
    with pytest.raises(ValueError, match="lies inside the export in .* that this export replaces"):
        export(kept, str(out))  # its folder would go, and the checkpoint it names with it
    assert read() == whole_new
    export(kept, str(out), move_checkpoint=True)  # the kept checkpoint goes on with the new export
    assert read() == whole_new
    export(old, str(out))  # removes what the killed exports left, their moved checkpoints too
    assert sorted(os.listdir(out)) == sorted([json.loads((out / "export.json").read_text())["dir"], "export.json"])


@pytest.mark.parametrize("deleted", ["checkpoint", "shard folder"])
def test_a_checkpoint_deleted_while_it_is_restored_is_said_gone_not_damaged(tmp_path, deleted):
    """The checkpoint deleted after the restore read its manifest. Before: "checkpoint ... is damaged: shard-0/CURRENT
    (... No such file or directory) ... `ps-server verify CHECKPOINT` lists everything damaged in it", of a
    checkpoint that verify then finds not there."""
    from ps.checkpoint import read_manifest
    from ps.engine.restore import restore_into

    ckpt = one_table_checkpoint(tmp_path, 100)
    manifest = read_manifest(ckpt)
    shutil.rmtree(ckpt if deleted == "checkpoint" else os.path.join(ckpt, "shard-0"))
    gone = "the whole checkpoint" if deleted == "checkpoint" else "shard-0"
    store = Store(str(tmp_path / "new"))
    try:
        with pytest.raises(CheckpointDamagedError) as raised:
            restore_into(store, ckpt, 0, 1, manifest)
        said = str(raised.value)
        assert said.startswith(f"checkpoint {ckpt} is gone: {gone} is no longer there (RocksDB, while opening it "
                               "shard-0: "), said  # fmt: skip
        assert "it was deleted or moved while being read" in said and "damaged" not in said, said
        assert "The restore stopped and deleted what it had copied" in said, said
        assert store.load_tables() == [] and not store.meta.restore_pending()  # the data dir as it was
    finally:
        store.close()


def test_a_restore_reads_the_one_checkpoint_a_link_named_as_it_began_though_the_link_moves(tmp_path, monkeypatch):
    """--restore latest, a link that a save moves to a newer checkpoint while the restore copies: every row is the
    checkpoint's the restore began from (its manifest, its files checked)."""
    latest, ids = two_saves_behind_a_link(tmp_path)
    import_slots = Store.import_slots

    def import_then_move(self, *args, **kwargs):
        copied = import_slots(self, *args, **kwargs)
        move_link(latest, "two")  # a save finished meanwhile: once moved, it stays on two
        return copied

    monkeypatch.setattr(Store, "import_slots", import_then_move)
    restored = Shard(ServerConfig(data_dir=str(tmp_path / "to"), restore_dir=latest))
    try:
        for name in ("a", "b"):
            np.testing.assert_array_equal(restored.pull(name, ids), -np.ones((len(ids), 2), np.float32), name)
    finally:
        restored.close()


def test_an_export_reads_the_one_checkpoint_a_link_named_as_it_began_though_the_link_moves(tmp_path, monkeypatch):
    """ps-server export latest, the link moved to a newer checkpoint once the first shard's rows of table a were
    read: every row exported is the first checkpoint's."""
    from ps.engine import export as engine_export

    latest, ids = two_saves_behind_a_link(tmp_path)
    read_table = engine_export.read_table

    def read_then_move(*args, **kwargs):
        yield from read_table(*args, **kwargs)
        move_link(latest, "two")

    monkeypatch.setattr(engine_export, "read_table", read_then_move)
    engine_export.export(latest, str(tmp_path / "out"))
    for name in ("a", "b"):
        got, rows = exported(tmp_path / "out", name)
        np.testing.assert_array_equal(got, ids)
        np.testing.assert_array_equal(rows, -np.ones((len(ids), 2), np.float32), name)


def test_a_link_moved_between_the_restores_check_and_its_copy_is_refused_changing_nothing(tmp_path, monkeypatch):
    """The manifest and files are checked before RocksDB opens; the link moved before the copy began: the start is
    refused, nothing restored, and a start again restores the checkpoint the link names then, whole."""
    from ps.engine import opening

    latest, ids = two_saves_behind_a_link(tmp_path)
    check_room_for = opening.check_room_for

    def check_then_move(*args, **kwargs):
        check_room_for(*args, **kwargs)
        move_link(latest, "two")

    monkeypatch.setattr(opening, "check_room_for", check_then_move)
    with pytest.raises(StorageError, match=rf"--restore {latest} names another checkpoint than the one checked as the "
                                           rf"start began \(it names {tmp_path / 'two'} now: a link moved\?\)"):  # fmt: skip
        Shard(ServerConfig(data_dir=str(tmp_path / "to"), restore_dir=latest))
    monkeypatch.undo()
    store = Store(str(tmp_path / "to"))
    try:
        assert store.load_tables() == [] and not store.meta.restore_pending()
    finally:
        store.close()
    restored = Shard(ServerConfig(data_dir=str(tmp_path / "to"), restore_dir=latest))
    try:
        np.testing.assert_array_equal(restored.pull("a", ids), -2 * np.ones((len(ids), 2), np.float32))
    finally:
        restored.close()


def test_a_checkpoint_whose_save_has_not_finished_is_named_so_by_restore_export_and_verify(tmp_path):
    """A save still running (or killed mid-way) has written shard-0/ and no manifest.json yet: a restore, an export
    and `ps-server verify`, of it or of its shard's folder, say it is an unfinished save, not "not a checkpoint", and
    verify does not read the shard's folder as a data dir (before: DAMAGED, its journal mark missing, and advice to
    start with --accept-journal-loss, which would start a server on the checkpoint's files)."""
    ckpt = one_table_checkpoint(tmp_path, 10)
    os.remove(os.path.join(ckpt, "manifest.json"))
    unfinished = r"holds an unfinished checkpoint \(shard-0; no manifest.json, which a save writes last"
    with pytest.raises(StorageError, match=rf"--restore {ckpt} {unfinished}.*the data dir was not touched"):
        Shard(ServerConfig(data_dir=str(tmp_path / "new"), restore_dir=ckpt))
    assert not os.path.exists(tmp_path / "new")
    Shard(ServerConfig(data_dir=str(tmp_path / "used"))).close()
    with pytest.raises(StorageError, match=rf"checkpoint {ckpt} {unfinished}"):  # a dir with data: read later
        Shard(ServerConfig(data_dir=str(tmp_path / "used"), restore_dir=ckpt))
    for argv in (["export", ckpt, "--out", str(tmp_path / "out")], ["verify", ckpt],
                 ["verify", os.path.join(ckpt, "shard-0")]):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "ps", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "unfinished checkpoint (shard-0; no manifest.json" in done.stderr, (argv, done)
        assert "DAMAGED" not in done.stdout and "accept-journal-loss" not in done.stdout, (argv, done.stdout)
    assert not os.path.exists(tmp_path / "out")


def test_a_restore_logs_its_progress_with_a_rate_and_the_time_left(tmp_path, caplog, monkeypatch):
    """A restore writes its rows in batches of 65,536: with a line after each (LOG_EVERY_S 0), the log says
    the rows written of about the checkpoint's (this shard's slots' share), the share, a rate and the time left
    while rows are left; then the restore's own final line."""
    from ps import progress

    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    rows = 150_000
    ckpt = one_table_checkpoint(tmp_path, rows)
    with caplog.at_level("INFO", "ps.engine.shard"):
        Shard(ServerConfig(data_dir=str(tmp_path / "d"), restore_dir=ckpt)).close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("restoring: ")]
    written = [65_536, 131_072, rows]
    assert len(lines) == len(written), lines
    for line, done in zip(lines, written, strict=True):
        left = r", about [\d,]+ s left" if done < rows else ""
        want = rf"restoring: {done:,} of about {rows:,} rows written \({100 * done / rows:.0f}%\), [\d,]+ rows/s{left}"
        assert re.fullmatch(want, line), line
    (restored,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("restored from ")]
    # a count, not the tables listed again: the server's listening line lists them
    assert re.fullmatch(rf"restored from checkpoint {re.escape(ckpt)} \(1 shard\) in [\d.]+ s: 1 table, "
                        rf"{rows:,} rows; clock 0", restored), restored  # fmt: skip

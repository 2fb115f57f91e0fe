"""A data dir that is not a shard's (a file, someone else's files) or is damaged gives a clear error at start-up,
and `ps-server` exits with it instead of a traceback."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest

from ps.config import TableConfig
from ps.engine.shard import Shard
from ps.errors import StorageError
from ps.server_config import ServerConfig
from ps.storage.sidefiles import MARK_FILE
from ps.storage.verify import verify_data_dir
from tests import asnobody
from tests.conftest import crash, one_table_checkpoint
from tests.server_process import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root, where ps is


@pytest.fixture
def good_dir(tmp_path):
    path = str(tmp_path / "good")
    shard = Shard(ServerConfig(data_dir=path))
    shard.create_table(TableConfig("t", 4))
    shard.push("t", np.arange(50, dtype=np.uint64), np.ones((50, 4), np.float32))
    shard.close()  # flushed: rows in SST files
    return path


def damaged_copy(good_dir, tmp_path, damage) -> str:
    path = str(tmp_path / "copy")
    shutil.copytree(good_dir, path)
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if damage == "CURRENT" and name == "CURRENT":
            with open(full, "w") as f:
                f.write("garbage\n")
        if damage == "sst" and name.endswith(".sst"):
            with open(full, "r+b") as f:
                f.seek(40)
                f.write(b"\xff" * 64)
    return path


@pytest.mark.parametrize("damage, message", [
    ("CURRENT", "RocksDB found damage in .* while opening it: Corruption: CURRENT file corrupted. `ps-server verify"),
    ("sst", "cannot start on data dir .*checksum mismatch.*restore the dir"),
])  # fmt: skip
def test_a_damaged_rocksdb_is_a_clear_error(good_dir, tmp_path, damage, message):
    with pytest.raises(StorageError, match=message):
        Shard(ServerConfig(data_dir=damaged_copy(good_dir, tmp_path, damage)))


def test_a_file_or_a_foreign_directory_is_refused(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(StorageError, match="is a file, not a directory"):
        Shard(ServerConfig(data_dir=str(a_file)))
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(StorageError, match=r"is not empty and holds no sparseps data \(it has cat.jpg\)"):
        Shard(ServerConfig(data_dir=str(foreign)))
    assert os.listdir(foreign) == ["cat.jpg"]  # nothing written into it
    with pytest.raises(StorageError, match=r"data dir .*a_file/shard cannot be created: Not a directory"):
        Shard(ServerConfig(data_dir=str(a_file / "shard")))
    read_only = OSError(errno.EROFS, "Read-only file system", str(tmp_path / "ro"))
    with (
        mock.patch("ps.storage.atomicfile.os.makedirs", side_effect=read_only),
        pytest.raises(StorageError, match=r"data dir .*/ro/shard cannot be created: Read-only file system .*writable"),
    ):
        Shard(ServerConfig(data_dir=str(tmp_path / "ro" / "shard")))
    volume = tmp_path / "volume"  # the root of a new ext4 volume (a Kubernetes data dir) holds lost+found
    (volume / "lost+found").mkdir(parents=True)
    with pytest.raises(StorageError, match="is not a checkpoint: .*; the data dir was not touched"):
        Shard(ServerConfig(data_dir=str(volume), restore_dir=str(tmp_path / "photos")))  # checked first there too
    assert os.listdir(volume) == ["lost+found"]
    with pytest.raises(StorageError, match="--restore .*/nowhere does not exist .*; the data dir was not touched"):
        Shard(ServerConfig(data_dir=str(volume), restore_dir=str(tmp_path / "nowhere")))
    assert os.listdir(volume) == ["lost+found"]
    Shard(ServerConfig(data_dir=str(volume))).close()


def test_a_shard_with_a_damaged_journal_refuses_to_start(good_dir, tmp_path):
    shard = Shard(ServerConfig(data_dir=good_dir))
    for k in range(3):  # journaled, not flushed
        shard.push("t", np.arange(5, dtype=np.uint64) + np.uint64(100 * k), np.ones((5, 4), np.float32))
    crash(shard)  # kill -9: leave the journal as it is
    journal = os.path.join(good_dir, "journal")
    (segment,) = [os.path.join(journal, f) for f in os.listdir(journal)]
    with open(segment, "r+b") as f:
        f.seek(40)
        f.write(b"\x00\x01")
    with pytest.raises(StorageError, match="journal segment .* is corrupt at byte 0 .* Refusing to start"):
        Shard(ServerConfig(data_dir=good_dir))


def test_ps_server_exits_with_the_message(good_dir, tmp_path):
    path = damaged_copy(good_dir, tmp_path, "CURRENT")
    r = subprocess.run([sys.executable, "-m", "ps", "--data-dir", path, "--port", "0"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert re.search(r"RocksDB found damage in .* while opening it: Corruption", r.stderr), r.stderr


def test_a_manifest_cut_short_is_refused_without_deleting_the_files_it_lost(good_dir, tmp_path):
    """A RocksDB whose MANIFEST lost its edits opens read-write as a database without them, and deletes the SST
    files they listed: the refusal must come first and leave every file as it was."""
    path = str(tmp_path / "cut")
    shutil.copytree(good_dir, path)
    (manifest,) = [os.path.join(path, f) for f in os.listdir(path) if f.startswith("MANIFEST-")]
    os.truncate(manifest, 200)
    before = {f: os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".sst")}
    assert before
    with pytest.raises(StorageError, match=r"RocksDB holds no shard record.*MANIFEST.*Refusing to start"):
        Shard(ServerConfig(data_dir=path))
    assert {f: os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".sst")} == before


def test_a_shard_started_under_another_cluster_name_is_refused(good_dir):
    shard = Shard(ServerConfig(data_dir=good_dir, cluster="prod"))  # an unnamed dir takes the first name
    before = shard.pull("t", np.arange(50, dtype=np.uint64)).copy()
    shard.close()
    for other in ("staging", ""):
        with pytest.raises(StorageError, match="belongs to cluster 'prod'.*start it with --cluster prod"):
            Shard(ServerConfig(data_dir=good_dir, cluster=other))
    shard = Shard(ServerConfig(data_dir=good_dir, cluster="prod"))
    assert np.array_equal(shard.pull("t", np.arange(50, dtype=np.uint64)), before)  # the refusals changed nothing
    shard.close()


def test_a_start_refused_after_the_cluster_check_leaves_the_dir_unnamed(good_dir):
    """An audit's case: --cluster X with a RAM tier too small for the dir's table. The start is refused, and the
    dir must not keep the name: the next start, without --cluster or with another, goes ahead."""
    from ps.errors import RamTierTooSmallError

    shard = Shard(ServerConfig(data_dir=good_dir))
    shard.create_table(TableConfig("wide", 512))
    shard.close()
    with pytest.raises(RamTierTooSmallError, match="cannot hold the 2 tables"):
        Shard(ServerConfig(data_dir=good_dir, cluster="X", cache_bytes=40_000))
    Shard(ServerConfig(data_dir=good_dir, cluster="")).close()  # unnamed still
    Shard(ServerConfig(data_dir=good_dir, cluster="Y")).close()  # the first start that got through names it
    with pytest.raises(StorageError, match="belongs to cluster 'Y'"):
        Shard(ServerConfig(data_dir=good_dir, cluster="X"))


def test_a_failed_start_reports_its_error_even_when_closing_the_store_fails(good_dir, monkeypatch, caplog):
    """A full disk: the start fails, and closing RocksDB then fails as well (rocksdict's plain Exception)."""
    from ps.storage.store import Store

    Shard(ServerConfig(data_dir=good_dir, cluster="prod")).close()

    def close_fails(self):
        raise Exception("IO error: No space left on device: While appending to file: 000012.log")

    monkeypatch.setattr(Store, "close", close_fails)
    with pytest.raises(StorageError, match="belongs to cluster 'prod'"):
        Shard(ServerConfig(data_dir=good_dir, cluster="other"))
    assert "after a failed start: IO error: No space left on device" in caplog.text


def test_a_data_dir_a_running_server_holds_is_refused_as_in_use_and_left_as_it_is(good_dir):
    running = ServerProcess(good_dir)
    try:
        assert running.started(), running.output()
        files = {name: os.stat(os.path.join(good_dir, name)).st_mtime_ns for name in os.listdir(good_dir)}
        with pytest.raises(StorageError, match=rf"is in use by another process \(process {running.proc.pid} holds "
                           r"RocksDB's LOCK file\): is a server already running on it"):  # fmt: skip
            Shard(ServerConfig(data_dir=good_dir))
        # the running server's files as they were: its RocksDB LOG not rotated (LOG.old.*), nothing rewritten
        assert {name: os.stat(os.path.join(good_dir, name)).st_mtime_ns for name in os.listdir(good_dir)} == files
    finally:
        running.stop()


def test_a_data_dir_this_process_has_open_already_is_refused_naming_this_process(good_dir):
    from ps.storage.store import Store

    store = Store(good_dir)
    try:
        with pytest.raises(StorageError, match=r"is in use by this process itself \(a store it opened on the dir is "
                                               r"still open: it holds RocksDB's LOCK file\)"):  # fmt: skip
            Store(good_dir)
    finally:
        store.close()
    Store(good_dir).close()  # closed, the dir opens again


def test_a_lock_holder_is_read_from_the_kernels_list_of_file_locks(tmp_path):
    from ps.storage.datadir import lock_holder

    path = tmp_path / "LOCK"
    path.write_bytes(b"")
    st = os.stat(path)
    file_id = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    locks = tmp_path / "locks"
    locks.write_text(f"1: POSIX  ADVISORY  WRITE 4242 {file_id}1 0 EOF\n"  # another file (a longer inode number)
                     f"2: -> POSIX  ADVISORY  WRITE 99 {file_id} 0 EOF\n"  # a waiter, not the holder
                     f"3: POSIX  ADVISORY  WRITE 777 {file_id} 0 EOF\n")  # fmt: skip
    assert lock_holder(str(path), str(locks)) == 777
    locks.write_text(f"1: POSIX  ADVISORY  WRITE 4242 {file_id}1 0 EOF\n")
    assert lock_holder(str(path), str(locks)) is None
    # an flock, a lease and a delegation do not stop RocksDB's fcntl lock; an open file description's lock does
    locks.write_text(f"1: FLOCK  ADVISORY  WRITE 11 {file_id} 0 EOF\n2: LEASE  ACTIVE    READ 12 {file_id} 0 EOF\n"
                     f"3: DELEG  ACTIVE    READ 13 {file_id} 0 EOF\n")  # fmt: skip
    assert lock_holder(str(path), str(locks)) is None
    locks.write_text(f"1: OFDLCK ADVISORY  WRITE -1 {file_id} 0 EOF\n")
    assert lock_holder(str(path), str(locks)) == -1
    assert lock_holder(str(path), str(tmp_path / "no-such-list")) is None


def test_a_data_dir_whose_lock_file_another_process_flocks_opens(good_dir):
    """An flock on LOCK (a script's `flock LOCK ...`) does not stop RocksDB's fcntl lock: the store opens."""
    from ps.storage.store import Store

    code = (
        "import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); "
        "time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, os.path.join(good_dir, "LOCK")], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        Store(good_dir).close()
    finally:
        holder.kill()
        holder.wait()


def test_a_journal_mark_deleted_after_a_flush_is_refused_unless_the_loss_is_accepted(good_dir):
    os.remove(os.path.join(good_dir, MARK_FILE))  # RocksDB holds pushes up to a journal record: the mark was there
    with pytest.raises(StorageError, match=r"journal mark .* is missing, though RocksDB holds the pushes up to "
                                           r"journal record \d+ .*it was deleted.*Refusing to start"):  # fmt: skip
        Shard(ServerConfig(data_dir=good_dir))
    lines, damaged = verify_data_dir(good_dir)
    assert damaged and any("DAMAGED journal: the journal mark" in line for line in lines), lines
    Shard(ServerConfig(data_dir=good_dir, accept_journal_loss=True)).close()


@pytest.mark.parametrize("written", ["-5", "2.5", '"7"'])
def test_a_journal_mark_of_no_count_is_damage(good_dir, written):
    with open(os.path.join(good_dir, MARK_FILE), "w") as f:
        f.write('{"written_seq": ' + written + "}")
    with pytest.raises(StorageError, match=r"journal-mark.json is damaged: expected a JSON object with integers >= 0"):
        Shard(ServerConfig(data_dir=good_dir))


def test_verify_finds_journal_records_of_a_table_rocksdb_lost(tmp_path):
    """RocksDB's write-ahead log cut short after the table was created and pushed to: the journal holds pushes to
    a table RocksDB does not hold; start-up refuses, and verify must say so as well."""
    live, path = str(tmp_path / "live"), str(tmp_path / "d")
    shard = Shard(ServerConfig(data_dir=live))
    shard.store.flush()  # the shard record in an SST file; what follows only in the write-ahead log
    shard.create_table(TableConfig("t", 4))
    shard.push("t", np.arange(50, dtype=np.uint64), np.ones((50, 4), np.float32))
    shutil.copytree(live, path)  # the files as kill -9 would leave them
    shard.close()
    (wal,) = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".log") and os.path.getsize(
        os.path.join(path, f))]  # fmt: skip
    os.truncate(wal, 0)
    with pytest.raises(StorageError, match="journal record 1 is a push to table 't', which RocksDB does not hold"):
        Shard(ServerConfig(data_dir=path))
    lines, damaged = verify_data_dir(path)
    assert damaged and any("DAMAGED journal: record 1 is a push to table 't', which RocksDB" in x for x in lines), lines


def test_verify_counts_journal_records_with_thousands_separators_and_one_in_the_singular(tmp_path):
    """1,200 pushes flushed, one after: the journal line reads "1 record after record 1,200", as a human reads it."""
    live, path = str(tmp_path / "live"), str(tmp_path / "d")
    shard = Shard(ServerConfig(data_dir=live, flush_interval_s=3600))
    shard.create_table(TableConfig("t", 2))
    for i in range(1200):  # one journal record each
        shard.push("t", np.array([i], np.uint64), np.ones((1, 2), np.float32))
    shard.flush()
    shard.push("t", np.array([1], np.uint64), np.ones((1, 2), np.float32))
    shutil.copytree(live, path)  # the files as kill -9 would leave them: the last record not flushed
    shard.close()
    lines, damaged = verify_data_dir(path)
    assert not damaged and ("ok      journal: 1 record after record 1,200 (RocksDB's flushed position), none "
                            "missing up to the journal mark") in lines, lines  # fmt: skip


def test_verify_by_a_user_who_cannot_read_the_dir_is_an_error_not_damage(good_dir, tmp_path):
    reason = asnobody.why_not()
    if reason:
        pytest.skip(reason)
    os.chmod(tmp_path, 0o755)
    os.chmod(good_dir, 0o700)  # root's; nobody cannot read it
    r = asnobody.run([sys.executable, "-m", "ps", "verify", good_dir])
    assert r.returncode == 2 and "permission denied; run verify as the user the server runs as" in r.stderr, r
    assert "DAMAGED" not in r.stdout


def test_the_first_line_says_whether_the_data_dir_was_new_and_what_it_holds(tmp_path, caplog):
    """A server started on a mistyped --data-dir says "new, no tables" where its operator expected a model."""
    path = str(tmp_path / "d")
    shard = Shard(ServerConfig(data_dir=path))
    assert shard.describe_start() == "new, no tables"
    with caplog.at_level("INFO", "ps.engine.shard"):
        shard.create_table(TableConfig("t", 4))
    assert "created table t: dim 4, adagrad" in caplog.text
    shard.create_table(TableConfig("u", 1))
    shard.push("t", np.arange(1500, dtype=np.uint64), np.ones((1500, 4), np.float32))
    shard.push("u", np.arange(1, dtype=np.uint64), np.ones((1, 1), np.float32))  # a model's bias: one row
    shard.advance_clock(3)
    shard.close()
    shard = Shard(ServerConfig(data_dir=path))
    try:
        assert shard.describe_start() == "existing, tables t 1,500 rows, u 1 row, clock 3"
    finally:
        shard.close()


def test_a_start_stopped_by_permissions_or_a_full_disk_says_so_not_damage(good_dir, monkeypatch):
    """Neither is damage: the message names the file and the user, or the full disk, and what to do."""
    import ps.engine.opening as opening
    import ps.engine.shard as shard_module
    from ps.diskfull import DiskFullError

    journal_dir = os.path.join(good_dir, "journal")

    def unreadable(*args, **kw):
        raise PermissionError(13, "Permission denied", journal_dir)

    monkeypatch.setattr(opening, "Journal", unreadable)
    with pytest.raises(StorageError, match=rf"permission denied on {re.escape(journal_dir)} \(Permission denied\): "
                                           r"run ps-server as the user that owns the data dir") as refused:  # fmt: skip
        Shard(ServerConfig(data_dir=good_dir))
    assert "corrupt" not in str(refused.value)
    monkeypatch.undo()

    def full(self):
        raise Exception("IO error: No space left on device: While appending to file: 000012.log")

    monkeypatch.setattr(shard_module.Shard, "_load_requests", full)
    with pytest.raises(DiskFullError, match=r"the server's disk is full \(No space left on device\): starting on data "
                                            r"dir .*; free space on that disk .* and start the server again"):  # fmt: skip
        Shard(ServerConfig(data_dir=good_dir))
    monkeypatch.undo()
    Shard(ServerConfig(data_dir=good_dir)).close()  # nothing was changed


def test_a_checkpoint_folder_or_a_lone_journal_given_as_a_data_dir_is_named_and_left_as_it_was(good_dir, tmp_path):
    """A checkpoint's shard folder copied in as a data dir points to --restore; a dir whose RocksDB files are gone
    but whose journal is there is data loss; neither start writes anything into the dir."""
    from tests.test_worker_outputs import tree

    shard = Shard(ServerConfig(data_dir=good_dir, checkpoint_root=str(tmp_path)))
    try:
        _, token = shard.hold(60)
        shard.save_checkpoint(str(tmp_path / "ckpt"), token)
        shard.release(token)
    finally:
        shard.close()
    copied = tmp_path / "copied"
    shutil.copytree(tmp_path / "ckpt" / "shard-0", copied)
    before = tree(copied)
    with pytest.raises(
        StorageError, match="a checkpoint's shard-<i> folder\\? To start from a checkpoint, give --restore"
    ):
        Shard(ServerConfig(data_dir=str(copied)))
    assert tree(copied) == before
    shard = Shard(ServerConfig(data_dir=good_dir))
    shard.push("t", np.arange(5, dtype=np.uint64), np.ones((5, 4), np.float32))  # journaled, not flushed
    crash(shard)
    lone = tmp_path / "lone"  # what is left when RocksDB's files are deleted
    shutil.copytree(os.path.join(good_dir, "journal"), lone / "journal")
    before = tree(lone)
    with pytest.raises(StorageError, match="holds a journal but no RocksDB"):
        Shard(ServerConfig(data_dir=str(lone)))
    assert tree(lone) == before


def test_verify_names_a_restore_that_did_not_finish_as_the_start_does(good_dir, tmp_path):
    """A server refuses to start on a dir marked as holding an unfinished restore (ps.engine.restore): verify says so
    too, not "nothing damaged"."""
    from ps.storage.store import Store

    lines, damaged = verify_data_dir(good_dir)
    assert not damaged and not any("DAMAGED restore" in line for line in lines), lines
    store = Store(good_dir)
    store.meta.set_restore_pending(str(tmp_path / "ckpt"))
    store.close()
    with pytest.raises(StorageError, match="holds a restore from .*ckpt that did not finish"):
        Shard(ServerConfig(data_dir=good_dir))
    lines, damaged = verify_data_dir(good_dir)
    assert damaged and any(f"DAMAGED restore: a restore from {tmp_path / 'ckpt'} did not finish" in line
                           for line in lines), lines  # fmt: skip
    lines, damaged = verify_data_dir(good_dir, restoring=str(tmp_path / "ckpt"))  # --restore of it: begun over
    assert not damaged and any("this start (--restore) begins it over" in line for line in lines), lines
    assert verify_data_dir(good_dir, restoring=str(tmp_path / "other"))[1]  # another checkpoint: still refused


def test_a_restore_started_over_passes_verify_on_start(tmp_path):
    """--restore X --verify-on-start on a dir marked as holding X's unfinished restore: the start begins it over, as
    without --verify-on-start (its verify does not count the mark as damage)."""
    from ps.server import Server
    from ps.storage.store import Store

    ckpt = one_table_checkpoint(tmp_path, 20)
    data = str(tmp_path / "restored")
    Shard(ServerConfig(data_dir=data, restore_dir=ckpt)).close()
    store = Store(data)
    store.meta.set_restore_pending(ckpt)  # what a stop in the middle of the restore leaves
    store.close()
    server = Server(ServerConfig(data_dir=data, restore_dir=ckpt, verify_on_start=True, port=0))  # builds the shard
    try:
        assert server.shard.tables["a"].num_rows == 20
    finally:
        server.stop(grace_s=1)


ODD_KEY = b"\x00\x00\x00\x00short"  # 9 bytes: no (table, slot, id)


def test_verify_names_a_row_key_of_another_size_and_counts_the_rows_around_it(good_dir):
    from ps.storage.store import Store

    store = Store(good_dir)
    try:
        store._rows().put(ODD_KEY, b"\x00" * 24)
        store.flush()
    finally:
        store.close()
    lines, damaged = verify_data_dir(good_dir)
    assert damaged and "DAMAGED column family rows: 1 keys of another size than 14 bytes (table, slot, id), the " \
                       f"first {ODD_KEY.hex()}" in lines, lines  # fmt: skip
    assert "ok      column family rows: 51 keys read, every block's checksum verified" in lines, lines


# A first start with --restore (argv[1]: data dir, argv[2]: checkpoint) killed by SIGKILL at a point of its first
# steps (argv[3]): once RocksDB made its files, before the shard record is written into it ("record"), or once it
# is, before shard.json is written beside it ("shard.json").
_KILLED_FIRST_START = """
import os, signal, sys
from ps.engine.shard import Shard
from ps.server_config import ServerConfig
from ps.storage import shardmeta
die = lambda *a, **kw: os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[3] == "record":
    shardmeta.ShardMeta.check_identity = die
else:
    shardmeta.write_json = die
Shard(ServerConfig(data_dir=sys.argv[1], restore_dir=sys.argv[2]))
"""


@pytest.mark.parametrize("killed_at", ["record", "shard.json"])
def test_a_first_start_killed_before_it_wrote_shard_json_leaves_a_dir_the_next_start_takes(tmp_path, killed_at):
    """kill -9 of a first start (with --restore, as a container starts) between RocksDB making its files and
    shard.json: the dir holds RocksDB's files, which hold nothing (or the shard record alone). The next start, with
    the same --restore, restores."""
    ckpt = one_table_checkpoint(tmp_path, 10)
    data = str(tmp_path / "new")
    done = subprocess.run([sys.executable, "-c", _KILLED_FIRST_START, data, ckpt, killed_at], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == -9, done.stderr
    assert "CURRENT" in os.listdir(data) and "shard.json" not in os.listdir(data)
    ids = np.arange(1, 11, dtype=np.uint64)
    clean = Shard(ServerConfig(data_dir=str(tmp_path / "clean"), restore_dir=ckpt))
    try:
        want = clean.pull("a", ids)
    finally:
        clean.close()
    shard = Shard(ServerConfig(data_dir=data, restore_dir=ckpt))
    try:
        assert shard.describe_start().startswith(f"restored from {ckpt}, tables a 10 rows"), shard.describe_start()
        np.testing.assert_array_equal(shard.pull("a", ids), want)
    finally:
        shard.close()
    assert "shard.json" in os.listdir(data)

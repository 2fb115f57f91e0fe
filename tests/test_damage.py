"""Damaged data dirs, black box: a ps-server process pushes, is killed -9 (or stopped), its files are damaged,
and then the next start (a ps.server.Server, or ps-server) must refuse with a message naming the damage,
`ps-server verify` must find it, and --accept-journal-loss must start with a warning naming what was lost.

Damage: RocksDB's write-ahead log deleted, with bytes flipped or cut in half, after a flush; a data block of an
SST file; the journal's newest segment cut in the middle of a record or at a record boundary, or the journal
deleted whole."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.errors import PsError, StorageError
from ps.server import Server
from ps.server_config import ServerConfig
from ps.storage.rowformat import encode_keys
from ps.storage.store import Store
from ps.storage.tablecatalog import LOST_TABLE_ROWS
from ps.storage.verify import verify_checkpoint, verify_data_dir
from tests.server_process import ServerProcess
from tests.waiting import wait_until
from worker.client import Client

DIM = 4
PUSHES = 30
COMMON = np.arange(1000, dtype=np.uint64)  # in every push: its rows end at -(pushes applied)
JOURNAL_HEADER = struct.Struct("<IQIQ")  # magic, seq, payload_len, checksum (ps/storage/journalformat.py's grammar)
JOURNAL_MAGIC = 0x364A5350  # "PSJ6"


@contextlib.contextmanager
def opened(data_dir) -> Iterator[Store]:
    """The data dir's Store, open while the block runs (a server stopped: one process holds its RocksDB)."""
    store = Store(str(data_dir))
    try:
        yield store
    finally:
        store.close()


def own(k: int) -> np.ndarray:
    return np.arange(50, dtype=np.uint64) + np.uint64(100_000 + 100 * k)  # only in push k


class InProcess:
    """A ps.server.Server on data_dir, for a with-block: its address."""

    def __init__(self, data_dir, **config):
        self.server = Server(ServerConfig(data_dir=str(data_dir), **config))

    def __enter__(self) -> str:
        return f"127.0.0.1:{self.server.start()}"

    def __exit__(self, *exc) -> None:
        self.server.stop(grace_s=1)


def refusal(data_dir, shard: tuple[int, int] = (0, 1)) -> str:
    """The message of the StorageError that a Server on data_dir refuses to start with."""
    try:
        server = Server(ServerConfig(data_dir=str(data_dir), shard_id=shard[0], num_shards=shard[1]))
    except StorageError as e:
        return str(e)
    server.start()
    server.stop()
    raise AssertionError(f"a server started on the damaged {data_dir}")


def push_all(address: str, table: str) -> None:
    with Client([address], timeout_s=30) as client:
        client.create_table(TableConfig(table, DIM, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0)))
        for k in range(PUSHES):
            ids = np.concatenate([COMMON, own(k)])
            client.push(table, ids, np.ones((len(ids), DIM), dtype=np.float32))


def pushes_applied(address: str, table: str) -> int:
    """How many of push_all's pushes the shard holds, checking that they are the first ones, each whole."""
    with Client([address], timeout_s=30) as client:
        applied = int(-client.pull(table, COMMON)[0, 0])
        for k in range(PUSHES):
            want = -1.0 if k < applied else 0.0
            np.testing.assert_array_equal(client.pull(table, own(k)), np.full((50, DIM), want, np.float32))
    return applied


def verify(data_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ps", "verify", str(data_dir)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def journal_bytes(journal: pathlib.Path) -> int:
    """Bytes in the journal's segments, read while the server may delete them (a flush trims)."""
    total = 0
    for name in os.listdir(journal):
        with contextlib.suppress(FileNotFoundError):
            total += os.path.getsize(journal / name)
    return total


# ---- RocksDB's write-ahead log -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flushed_then_killed(tmp_path_factory):
    """A data dir whose pushes are flushed to RocksDB (its write-ahead log holds them; the journal is trimmed),
    then the server killed -9."""
    data_dir = tmp_path_factory.mktemp("wal") / "shard"
    server = ServerProcess(data_dir, "--flush-interval-s", "0.2")
    address = server.started()
    assert address, server.output()
    push_all(address, "t")
    journal = data_dir / "journal"
    wait_until(lambda: not journal_bytes(journal), 60, "a flush")
    server.stop(signal.SIGKILL)
    wal = [f for f in os.listdir(data_dir) if f.endswith(".log")]
    assert wal and max(os.path.getsize(data_dir / f) for f in wal) > 0, "RocksDB's write-ahead log holds nothing"
    return data_dir


@pytest.mark.parametrize("damage, message", [
    ("deleted", "shard.json says it is shard 0 of 1 .*but RocksDB holds no shard record"),
    ("bytes flipped", r"RocksDB found damage in .* while opening it: Corruption: .*write-ahead logs it replays at "
                      r"open: \d+\.log \([\d,]+ bytes\)"),
    ("cut in half", r"journal records \d+\.\.30 .* are missing \(\d+ pushes, which may have been acknowledged\)"),
])  # fmt: skip
def test_a_damaged_write_ahead_log_is_refused_and_the_identity_survives(flushed_then_killed, tmp_path, damage,
                                                                        message):  # fmt: skip
    data_dir = tmp_path / "shard"
    shutil.copytree(flushed_then_killed, data_dir)
    (wal,) = [data_dir / f for f in os.listdir(data_dir) if f.endswith(".log") and os.path.getsize(data_dir / f)]
    size = os.path.getsize(wal)
    if damage == "deleted":
        os.remove(wal)
    elif damage == "bytes flipped":
        with open(wal, "r+b") as f:
            f.seek(size // 3)
            f.write(bytes(b ^ 0xFF for b in f.read(4)))
    else:
        os.truncate(wal, size // 2)
    assert re.search(message, refusal(data_dir))
    if damage == "bytes flipped":
        report = verify(data_dir)
        assert report.returncode == 1 and re.search(
            r"DAMAGED RocksDB does not open: Corruption: .*\d+\.log", report.stdout
        ), report.stdout + report.stderr
    if damage == "deleted":  # the identity survives the loss of RocksDB's copy
        other = ServerProcess(data_dir, shard=(1, 2)).refused()  # and ps-server says so, with no traceback
        assert "belongs to shard 0 of 1" in other and "started as shard 1 of 2" in other
        report = verify(data_dir)
        assert report.returncode == 1 and "DAMAGED shard identity" in report.stdout, report.stdout + report.stderr
        for name in os.listdir(data_dir):  # all of RocksDB's files gone: shard.json still says whose dir it is
            if name not in ("shard.json", "journal-mark.json", "journal"):
                os.remove(data_dir / name)
        assert re.search(r"holds .*shard.json.* but no RocksDB \(its CURRENT file is missing\)", refusal(data_dir))


# ---- an SST block ---------------------------------------------------------------------------------------------
def test_a_corrupt_sst_block_is_found_by_verify_and_a_pull_meeting_it_is_data_loss(tmp_path, caplog):
    data_dir = tmp_path / "shard"
    server = ServerProcess(data_dir)
    address = server.started()
    assert address, server.output()
    ids = np.arange(20_000, dtype=np.uint64)
    with Client([address], timeout_s=30) as client:
        client.create_table(TableConfig("emb", DIM))
        client.push("emb", ids, np.ones((len(ids), DIM), dtype=np.float32))
    server.stop()  # a clean stop: every row in SST files
    sst = max((data_dir / f for f in os.listdir(data_dir) if f.endswith(".sst")), key=os.path.getsize)
    with open(sst, "r+b") as f:
        f.seek(os.path.getsize(sst) // 4)  # a data block: the index and filter blocks are at the end
        f.write(b"\xff" * 16)
    report = verify(data_dir)
    assert report.returncode == 1, report.stdout + report.stderr
    assert re.search(r"DAMAGED column family \S+: Corruption: block checksum mismatch.* in .*\.sst",
                     report.stdout), report.stdout  # fmt: skip
    refused = ServerProcess(data_dir, "--verify-on-start")
    assert refused.started() is None and refused.proc.wait(timeout=60) == 2, refused.output()
    assert "damaged (--verify-on-start" in refused.output() and "block checksum mismatch" in refused.output()
    with InProcess(data_dir) as address, Client([address], timeout_s=30) as client, pytest.raises(PsError) as failed:
        client.pull("emb", ids)  # the server started: the damage is in a data block, read when a pull needs it
    assert "failed with DATA_LOSS" in str(failed.value) and os.path.basename(sst) in str(failed.value)
    assert "INTERNAL" not in str(failed.value)
    assert not [r for r in caplog.records if r.exc_info], "the server logged a stack trace for data damage"
    logged = [r for r in caplog.records if r.name == "ps.service" and "block checksum mismatch" in r.getMessage()]
    assert logged and all(r.levelname == "ERROR" for r in logged), "the damage was not logged as an error"


# ---- the journal ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def journaled_then_killed(tmp_path_factory):
    """A data dir whose PUSHES pushes are only in the journal (no flush), covered by the journal's mark (the
    server keeps it a second behind), then the server killed -9."""
    data_dir = tmp_path_factory.mktemp("journal") / "shard"
    server = ServerProcess(data_dir, "--flush-interval-s", "3600")
    address = server.started()
    assert address, server.output()
    push_all(address, "t")
    mark = data_dir / "journal-mark.json"

    def marked() -> bool:
        return mark.exists() and f'"written_seq": {PUSHES}' in mark.read_text()

    wait_until(marked, 30, f"the journal mark to cover all {PUSHES} pushes")  # the refusals below need it
    server.stop(signal.SIGKILL)
    return data_dir


def record_ends(segment) -> list[int]:
    """The byte offset where each record of a journal segment ends, by its headers."""
    data, ends, pos = segment.read_bytes(), [], 0
    while pos + JOURNAL_HEADER.size <= len(data):
        magic, _seq, payload_len, _check = JOURNAL_HEADER.unpack_from(data, pos)
        if magic != JOURNAL_MAGIC:
            break
        pos += JOURNAL_HEADER.size + payload_len
        ends.append(pos)
    return ends


@pytest.mark.parametrize("damage", ["cut in a record", "cut at a record boundary", "deleted"])
def test_a_journal_missing_acknowledged_records_is_refused_unless_the_loss_is_accepted(journaled_then_killed, tmp_path,
                                                                                        caplog, damage):  # fmt: skip
    data_dir = tmp_path / "shard"
    shutil.copytree(journaled_then_killed, data_dir)
    journal = data_dir / "journal"
    kept = 14
    if damage == "deleted":
        shutil.rmtree(journal)
        kept = 0
    else:
        (segment,) = journal.iterdir()
        ends = record_ends(segment)
        assert len(ends) == PUSHES
        os.truncate(segment, ends[kept - 1] + (100 if damage == "cut in a record" else 0))
    lost = f"journal records {kept + 1}..{PUSHES} in {journal} are missing ({PUSHES - kept} pushes"
    out = refusal(data_dir)
    assert lost in out and "--accept-journal-loss" in out and "without --sync" in out, out
    if damage == "cut in a record":
        report = verify(data_dir)
        assert report.returncode == 1 and "DAMAGED journal: " + lost in report.stdout, report.stdout + report.stderr

    if damage == "cut at a record boundary":  # ps-server's flag
        server = ServerProcess(data_dir, "--accept-journal-loss")
        address = server.started()
        assert address, server.output()
        try:
            assert "WARNING" in server.output() and lost in server.output() and "Starting anyway" in server.output()
            assert pushes_applied(address, "t") == kept
        finally:
            server.stop()
    else:
        caplog.clear()
        with InProcess(data_dir, accept_journal_loss=True) as address:
            warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert [w for w in warnings if lost in w and "Starting anyway" in w], warnings
            assert pushes_applied(address, "t") == kept
    caplog.clear()
    with InProcess(data_dir) as address:  # the loss, once accepted, is not met again
        assert pushes_applied(address, "t") == kept
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "journal" in r.getMessage()]


def test_a_journal_cut_short_with_its_mark_deleted_before_any_flush_is_refused(journaled_then_killed, tmp_path):
    """Both the mark and the journal's last records gone, and RocksDB holds no push: the records left show pushes
    were written, the mark that said how many is gone, so start-up and verify call it a loss, not a torn end."""
    data_dir = tmp_path / "shard"
    shutil.copytree(journaled_then_killed, data_dir)
    os.remove(data_dir / "journal-mark.json")
    (segment,) = (data_dir / "journal").iterdir()
    os.truncate(segment, record_ends(segment)[13])
    lost = f"journal mark {data_dir / 'journal-mark.json'} is missing, though the journal (1 segment in "
    out = refusal(data_dir)
    assert lost in out and "holds records up to 14" in out and "--accept-journal-loss" in out, out
    report = verify(data_dir)
    assert report.returncode == 1 and "DAMAGED journal: the journal mark" in report.stdout, report.stdout


# ---- a checkpoint whose SST holds a damaged block ---------------------------------------------------------
def damage_largest_sst(folder) -> str:
    """Flips 16 bytes a quarter into folder's largest SST file (a data block); returns its name."""
    sst = max((folder / f for f in os.listdir(folder) if f.endswith(".sst")), key=os.path.getsize)
    with open(sst, "r+b") as f:
        f.seek(os.path.getsize(sst) // 4)
        f.write(bytes(b ^ 0xFF for b in f.read(16)))
    return sst.name


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(root, the rows pulled at the saves): root/good, a checkpoint of a shard; root/bad, one saved by the same
    shard after a data block of its largest SST was damaged (a copy of its data dir: good's files are hard links to
    the original's). bad's manifest covers the damaged bytes: its sha256s match."""
    from ps.engine.shard import Shard
    from tests.conftest import one_shard_checkpoint as checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    spec = TableConfig("emb", DIM)
    ids = np.arange(20_000, dtype=np.uint64)
    shard = Shard(ServerConfig(data_dir=str(root / "source")))
    try:
        shard.create_table(spec)
        shard.push("emb", ids, np.ones((len(ids), DIM), np.float32))
        want = shard.pull("emb", ids)
        checkpoint(shard, str(root / "good"), [spec])
    finally:
        shard.close()
    shutil.copytree(root / "source", root / "damaged")
    damage_largest_sst(root / "damaged")
    shard = Shard(ServerConfig(data_dir=str(root / "damaged")))  # it starts: the damage is found when read
    try:
        checkpoint(shard, str(root / "bad"), [spec])
    finally:
        shard.close()
    return root, ids, want


def test_verify_reads_every_block_of_a_checkpoint_and_names_the_damaged_file_and_offset(checkpoints):
    root, _, _ = checkpoints
    bad = root / "bad"
    for what in (bad, bad / "shard-0"):  # the checkpoint, or one shard's folder of it
        report = verify(what)
        assert report.returncode == 1, report.stdout + report.stderr
        assert re.search(r"^ok +shard-0: \d+ files match the manifest's sha256$", report.stdout, re.M), report.stdout
        assert re.search(r"^DAMAGED shard-0: column family rows: shard-0/\d+\.sst at offset \d+: Corruption: block "
                         r"checksum mismatch", report.stdout, re.M), report.stdout  # fmt: skip
        assert report.stdout.rstrip().endswith(f"verify checkpoint {what}: 1 damaged"), report.stdout
    report = verify(root / "good")
    assert report.returncode == 0 and "DAMAGED" not in report.stdout, report.stdout + report.stderr
    assert report.stdout.rstrip().endswith("nothing damaged"), report.stdout
    assert "admitted rows as the manifest counts (emb 20,000)" in report.stdout, report.stdout
    empty = root / "empty"
    empty.mkdir()
    refused = verify(empty)
    assert refused.returncode == 2 and "nor a checkpoint: it holds no manifest.json" in refused.stderr, refused.stderr


def test_a_restore_from_a_damaged_checkpoint_names_it_and_leaves_the_data_dir_open_to_another(checkpoints, tmp_path):
    from ps.engine.shard import Shard
    from ps.errors import CheckpointDamagedError

    root, ids, want = checkpoints
    data_dir = tmp_path / "new"
    out = ServerProcess(data_dir, "--restore", str(root / "bad")).refused()  # no traceback, exit 2
    assert re.search(rf"ps-server: error: checkpoint {root / 'bad'} is damaged: shard-0/\d+\.sst at offset \d+ "
                     r"\(RocksDB, while reading it: Corruption: block checksum mismatch", out), out  # fmt: skip
    assert f"The restore stopped and deleted what it had copied: data dir {data_dir} is as it was" in out, out
    assert "cannot start on data dir" not in out, out  # the checkpoint's damage, not the data dir's
    with pytest.raises(CheckpointDamagedError, match="is damaged: shard-0/"):  # again: no mark refuses it
        Shard(ServerConfig(data_dir=str(data_dir), restore_dir=str(root / "bad")))
    shard = Shard(ServerConfig(data_dir=str(data_dir), restore_dir=str(root / "good")))
    try:
        assert shard.describe_start().startswith(f"restored from {root / 'good'}, tables emb 20,000 rows")
        np.testing.assert_array_equal(shard.pull("emb", ids), want)
    finally:
        shard.close()


def test_a_restore_that_cannot_delete_what_it_copied_from_a_damaged_checkpoint_says_to_delete_the_dir(
    checkpoints, tmp_path, monkeypatch
):
    from ps.engine.shard import Shard
    from ps.storage.store import Store

    root, _, _ = checkpoints
    data_dir = tmp_path / "new"

    def fails(self) -> None:
        raise StorageError("RocksDB in it failed while deleting an unfinished restore's rows: IO error")

    with monkeypatch.context() as m:
        m.setattr(Store, "forget_unfinished_restore", fails)
        with pytest.raises(StorageError, match=r"is damaged: .*deleting what it had copied into data dir .* failed too "
                                               r"\(.*IO error\), so the dir stays marked .*delete it and start again "
                                               r"with --restore of another checkpoint"):  # fmt: skip
            Shard(ServerConfig(data_dir=str(data_dir), restore_dir=str(root / "bad")))
    with pytest.raises(StorageError, match=r"holds a restore from .*bad that did not finish; .*or delete the data dir: "
                                           r"it holds nothing but that unfinished restore"):  # fmt: skip
        Shard(ServerConfig(data_dir=str(data_dir), restore_dir=str(root / "good")))
    shutil.rmtree(data_dir)  # what the refusal says to do
    Shard(ServerConfig(data_dir=str(data_dir), restore_dir=str(root / "good"))).close()


@pytest.mark.parametrize("out_exists", [False, True])
def test_export_of_a_damaged_checkpoint_is_a_message_and_writes_nothing(checkpoints, tmp_path, out_exists):
    root, _, _ = checkpoints
    out = tmp_path / "out"
    if out_exists:
        out.mkdir()
    done = subprocess.run([sys.executable, "-m", "ps", "export", str(root / "bad"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert re.match(rf"ps-server export: error: checkpoint {root / 'bad'} is damaged: shard-0/\d+\.sst at offset \d+ ",
                    done.stderr), done.stderr  # fmt: skip
    assert (list(out.iterdir()) == []) if out_exists else not out.exists()


def test_ps_worker_export_of_a_shard_with_a_damaged_sst_is_a_message(checkpoints, tmp_path):
    """The worker's export saves a checkpoint (hard links to the shard's SSTs, the damaged one too) and exports it:
    ps-server export's message, exit 2, and no checkpoint or OUT left behind."""
    root, _, _ = checkpoints
    data_dir = tmp_path / "shard"
    shutil.copytree(root / "damaged", data_dir)
    server = ServerProcess(data_dir, "--checkpoint-root", str(tmp_path))
    address = server.started()
    assert address, server.output()
    try:
        out = tmp_path / "export"
        done = subprocess.run([sys.executable, "-m", "worker", "export", "--servers", address, str(out),
                               "--no-progress"], capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        server.stop_cleanly()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert re.search(r"ps-server export: error: checkpoint \S+ is damaged: shard-0/\d+\.sst at offset \d+ ",
                     done.stderr), done.stderr  # fmt: skip
    assert not out.exists()


# ---- side files, CURRENT, the meta column family: what a damaged or mistaken dir is called -------------------------
@pytest.fixture(scope="module")
def stopped_cleanly(tmp_path_factory):
    """A data dir after push_all and a clean stop (its rows flushed, its journal trimmed)."""
    data_dir = tmp_path_factory.mktemp("clean") / "shard"
    with InProcess(data_dir) as address:
        push_all(address, "t")
    return data_dir


def copied(stopped_cleanly, tmp_path) -> pathlib.Path:
    data_dir = tmp_path / "shard"
    shutil.copytree(stopped_cleanly, data_dir)
    return data_dir


@pytest.mark.parametrize("name", ["shard.json", "journal-mark.json"])
def test_a_side_file_that_is_a_directory_is_named_by_start_and_verify(stopped_cleanly, tmp_path, name):
    data_dir = copied(stopped_cleanly, tmp_path)
    os.remove(data_dir / name)
    os.mkdir(data_dir / name)
    assert re.search(rf"{name} is a directory, where the shard keeps a file of that name", refusal(data_dir))
    done = verify(data_dir)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.search(rf"DAMAGED .*{name} is a directory", done.stdout), done.stdout


def test_a_current_file_naming_a_missing_manifest_is_damage(stopped_cleanly, tmp_path):
    data_dir = copied(stopped_cleanly, tmp_path)
    (data_dir / "CURRENT").write_text("MANIFEST-000099\n")
    assert re.search(r"RocksDB found damage in .* CURRENT file names a MANIFEST that is not there", refusal(data_dir))


def test_verify_checks_no_identity_or_journal_against_a_meta_column_family_it_cannot_read(stopped_cleanly, tmp_path):
    """One damaged block of the meta column family is one finding: not also a lost shard record and missing
    journal records, which its unread keys would otherwise look like."""
    data_dir = copied(stopped_cleanly, tmp_path)
    # the meta column family's keys include flushed_seq (blocks are not compressed); no other file holds it
    meta_files = [
        f for f in os.listdir(data_dir) if f.endswith(".sst") and b"flushed_seq" in (data_dir / f).read_bytes()
    ]
    assert len(meta_files) == 1, meta_files
    _flip_byte(data_dir / meta_files[0], 300)
    done = verify(data_dir)
    damaged = [line for line in done.stdout.splitlines() if line.startswith("DAMAGED")]
    assert done.returncode == 1 and len(damaged) == 1 and "column family meta" in damaged[0], done.stdout
    assert "shard identity, journal and row sizes: not checked against RocksDB, whose meta column family" in done.stdout


def _flip_byte(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_data_dir_that_is_a_shards_journal_folder_is_refused(stopped_cleanly, tmp_path):
    data_dir = copied(stopped_cleanly, tmp_path)
    before = sorted(os.listdir(data_dir / "journal"))
    message = refusal(data_dir / "journal")
    assert f"is the journal folder of the shard whose data dir is {data_dir}: give --data-dir {data_dir}" in message
    assert sorted(os.listdir(data_dir / "journal")) == before


def test_a_journal_that_is_a_file_is_damage_to_start_and_verify(stopped_cleanly, tmp_path):
    data_dir = copied(stopped_cleanly, tmp_path)
    shutil.rmtree(data_dir / "journal")
    (data_dir / "journal").write_text("x\n")
    assert "is a file, not the directory of journal segments" in refusal(data_dir)
    done = verify(data_dir)
    assert done.returncode == 1 and re.search(r"DAMAGED journal: the journal .* is a file", done.stdout), done.stdout


def test_verify_names_an_unreadable_segment_and_on_a_live_dir_calls_a_journal_finding_a_note(tmp_path):
    """A journal segment that cannot be read (here a directory named like one) is reported, not a traceback: damaged
    on a stopped dir; on a dir a server runs on (its flushes move the journal under verify) a note that says so."""
    data_dir = tmp_path / "d"
    server = ServerProcess(data_dir)
    with Client([server.started()]) as client:
        client.wait_ready()
        client.create_table(TableConfig(name="t", dim=2))
        client.push("t", np.arange(10, dtype=np.uint64), np.ones((10, 2), np.float32))  # the journal is there
    (data_dir / "journal" / f"{0:020d}.log").mkdir()  # before the segment the server writes
    report = verify(data_dir)
    assert "Traceback" not in report.stderr, report.stderr
    assert "a server runs on this data dir (RocksDB's LOCK is held)" in report.stdout, report.stdout
    assert "a journal segment cannot be read" in report.stdout and "a journal segment must be a file" in report.stdout
    server.stop()
    report = verify(data_dir)
    assert report.returncode == 1 and "Traceback" not in report.stderr, (report.stdout, report.stderr)
    assert re.search(r"DAMAGED\s+journal: a journal segment cannot be read: .*a journal segment must be a file",
                     report.stdout), report.stdout  # fmt: skip


NUMBER_UNREAD = (
    "a request that reads its rows fails with DATA_LOSS, as do a start replaying a push to it, a checkpoint "
    "save, a Shrink of every table and the creation of a new table (the number it held is not known); the other "
    "tables serve"
)


def test_a_row_of_a_size_no_table_layout_makes_or_a_table_without_its_number_is_data_loss(tmp_path, caplog):
    data_dir = tmp_path / "shard"
    ids = np.arange(100, dtype=np.uint64)
    with InProcess(data_dir) as address, Client([address], timeout_s=30) as client:
        client.create_table(TableConfig("emb", DIM))
        client.push("emb", ids, np.ones((len(ids), DIM), dtype=np.float32))
    with opened(data_dir) as store:  # the stop flushed every row: one of them is overwritten with 5 bytes
        store._rows().put(encode_keys(store.table_number("emb"), ids[5:6])[0], b"\x00" * 5)
    with InProcess(data_dir) as address, Client([address], timeout_s=30) as client, pytest.raises(PsError) as failed:
        client.pull("emb", ids)
    assert "failed with DATA_LOSS" in str(failed.value) and "INTERNAL" not in str(failed.value)
    assert "table emb holds a row of 5 bytes" in str(failed.value)
    lines, damaged = verify_data_dir(str(data_dir))  # as ps-server verify reports it
    bad = [line for line in lines if line.startswith("DAMAGED")]
    assert damaged and len(bad) == 1, lines
    assert re.fullmatch(r"DAMAGED table 'emb': 1 stored rows of a size its layout does not make \(1 of 5 bytes; a "
                        r"trained row is \d+ bytes, a pending id 24\), the first of id 5 \(key 00000000\w{4}"
                        r"0000000000000005\): a pull of them is refused with DATA_LOSS", bad[0]), bad  # fmt: skip
    with opened(data_dir) as store:  # the table's number (its rows' key prefix) goes
        store._dir.meta_cf.delete(b"tid/emb")
    with InProcess(data_dir) as address, Client([address], timeout_s=30) as client, pytest.raises(PsError) as failed:
        client.pull("emb", ids)
    assert "failed with DATA_LOSS" in str(failed.value) and "'emb' has no number" in str(failed.value)
    assert not [r for r in caplog.records if r.exc_info], "the server logged a stack trace for data damage"
    lines, damaged = verify_data_dir(str(data_dir))
    (said,) = [line for line in lines if line.startswith("DAMAGED")]
    assert said.startswith("DAMAGED table 'emb': its config is stored without its number (meta key tid/emb): none of "
                           f"its rows can be found; {NUMBER_UNREAD}. Its rows, if it has any, are among the 100 stored "
                           "rows of table number(s) 0"), lines  # fmt: skip


def test_verify_checks_the_sizes_of_a_checkpoints_rows_against_their_tables(checkpoints, tmp_path):
    root, ids, _ = checkpoints
    lines, damaged = verify_checkpoint(str(root / "good"))
    assert not damaged and "ok      shard-0: row sizes: 20,000 stored rows of 1 table(s), each of its table's " \
                           "trained row or pending id size" in lines, lines  # fmt: skip
    copy = tmp_path / "copy"
    shutil.copytree(root / "good", copy)
    store = Store(str(copy / "shard-0"))  # a row of another size: what a restore refuses
    try:
        store._rows().put(encode_keys(store.table_number("emb"), ids[7:8])[0], b"\x00" * 40)
        store.flush()
    finally:
        store.close()
    lines, damaged = verify_checkpoint(str(copy))
    assert damaged and any(re.fullmatch(r"DAMAGED shard-0: table 'emb': 1 stored rows of a size its layout does not "
                                        r"make \(1 of 40 bytes; .*\), the first of id 7 .*: a restore or an export "
                                        r"of the checkpoint is refused",
                                        line) for line in lines), lines  # fmt: skip


# ---- damage met by a Store call outside the rows' reads and writes ---------------------------------------------
class Damaged:
    """Stands for a Store's Rdict or a column family of it that meets damage, or a full disk: reads and writes
    (get, put, delete, write, flush, iter) raise RocksDB's error as rocksdict raises it (a plain Exception)."""

    def __init__(self, wrapped, path: str, full: bool = False):
        self._wrapped = wrapped
        self._text = (f"IO error: No space left on device: While appending to file: {path}/000009.log: No space left "
                      "on device" if full else f"Corruption: block checksum mismatch: stored = 1, computed = 2, type "
                      f"= 4  in {path}/000009.sst offset 0 size 100")  # fmt: skip

    def _fail(self, *args, **kwargs):
        raise Exception(self._text)

    get = put = delete = write = flush = iter = _fail

    def __getattr__(self, name):
        return getattr(self._wrapped, name)


@contextlib.contextmanager
def damaged(store: Store, full: bool = False):
    """The store's RocksDB, its meta and rows column families Damaged inside the block, as the Store and its
    ShardMeta hold them (the meta's in the OpenDataDir they share)."""
    real = store._dir.db, store._dir.meta_cf, dict(store._cfs)
    store._dir.db, store._dir.meta_cf = Damaged(real[0], store.path, full), Damaged(real[1], store.path, full)
    store._cfs = {name: Damaged(cf, store.path, full) for name, cf in real[2].items()}
    try:
        yield
    finally:
        store._dir.db, store._dir.meta_cf, store._cfs = real


STORE_CALLS = {
    "clock": lambda s: s.meta.clock(),
    "set_clock": lambda s: s.meta.set_clock(5, (1, 2, 0)),
    "counts": lambda s: s.counts("emb"),
    "disk_bytes": lambda s: s.disk_bytes("emb"),
    "restored": lambda s: s.meta.restored(),
    "set_restored": lambda s: s.meta.set_restored("/checkpoints/c1", "ab" * 32),
    "state_id": lambda s: s.meta.state_id(),
    "restore_pending": lambda s: s.meta.restore_pending(),
    "set_restore_pending": lambda s: s.meta.set_restore_pending("/checkpoints/c1"),
    "clear_restore_pending": lambda s: s.meta.set_restore_pending(None),
    "flushed_seq": lambda s: s.meta.flushed_seq(),
    "iter_rows": lambda s: list(s.iter_rows("emb")),
    "flush": lambda s: s.flush(),
}


@pytest.mark.parametrize("full", [False, True], ids=["damage", "full disk"])
@pytest.mark.parametrize("call", STORE_CALLS)
def test_every_store_call_says_damage_is_data_loss_and_a_full_disk_is_one(tmp_path, call, full):
    from ps.diskfull import DiskFullError
    from ps.errors import DataLossError

    store = Store(str(tmp_path / "d"))
    try:
        store.create_table(TableConfig("emb", DIM))
        with damaged(store, full), pytest.raises(PsError) as failed:
            STORE_CALLS[call](store)
        assert type(failed.value) is (DiskFullError if full else DataLossError), repr(failed.value)
        said = f"RocksDB {'in the data dir ' if full else 'found damage in '}{store.path} "
        assert said in str(failed.value), str(failed.value)
    finally:
        store.close()


def test_damage_met_by_advance_clock_or_stats_is_data_loss_not_internal(tmp_path, caplog):
    import grpc

    from protos import ps_pb2, ps_pb2_grpc

    served = InProcess(tmp_path / "shard")
    with served as address, Client([address], timeout_s=30) as client, grpc.insecure_channel(address) as channel:
        client.create_table(TableConfig("emb", DIM))
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        with damaged(served.server.shard.store):
            with pytest.raises(grpc.RpcError) as failed:
                stub.AdvanceClock(ps_pb2.AdvanceClockRequest(steps=1), timeout=30)
            assert failed.value.code() == grpc.StatusCode.DATA_LOSS, failed.value.details()
            assert "while storing the clock at step 1: Corruption" in failed.value.details()
            with pytest.raises(PsError) as stats_failed:
                client.stats()
            assert "failed with DATA_LOSS" in str(stats_failed.value), str(stats_failed.value)
        assert stub.AdvanceClock(ps_pb2.AdvanceClockRequest(steps=1), timeout=30).step == 1  # nothing was applied
    assert not [r for r in caplog.records if r.exc_info], "the server logged a stack trace for data damage"


# ---- damage met reading a checkpoint back, exporting one, or a meta value that does not read -------------------
def _meta_sst(data_dir) -> pathlib.Path:
    """The one SST file of data_dir that holds the meta column family's keys (blocks are not compressed)."""
    (found,) = [
        data_dir / f for f in os.listdir(data_dir) if f.endswith(".sst") and b"tid/" in (data_dir / f).read_bytes()
    ]
    return found


def test_a_save_meeting_damage_reading_its_checkpoint_back_is_data_loss_naming_the_data_dir(tmp_path, caplog):
    """A save reads the checkpoint RocksDB wrote back (its rows per table, from its meta column family): a block
    damaged there is the data dir's (the checkpoint's SSTs are hard links to the shard's), so DATA_LOSS names the
    data dir and the file, not the checkpoint, which the save leaves no shard-<i> of; not INTERNAL."""
    from protos import ps_pb2
    from ps.errors import DataLossError

    data_dir = tmp_path / "shard"
    served = InProcess(data_dir, checkpoint_root=str(tmp_path))
    with served as address, Client([address], timeout_s=30) as client:
        client.create_table(TableConfig("emb", DIM))
        client.push("emb", np.arange(100, dtype=np.uint64), np.ones((100, DIM), np.float32))
        served.server.shard.flush()
        served.server.shard.store.flush()  # the meta keys in an SST file, which the running server read no block of
        sst = _meta_sst(data_dir)
        _flip_byte(sst, 100)
        (held,) = client.checkpoint({0: ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60)})
        with pytest.raises(DataLossError) as failed:  # the server's class, which it names
            client.checkpoint({0: ps_pb2.CheckpointRequest(phase="save", dir=str(tmp_path / "c1"), token=held.token)})
        client.checkpoint({0: ps_pb2.CheckpointRequest(phase="release", token=held.token)})
    said = str(failed.value)
    assert "failed with DATA_LOSS" in said and "INTERNAL" not in said, said
    assert re.search(rf"RocksDB in data dir {data_dir} is damaged: its checkpoint just written to "
                     rf"{tmp_path / 'c1' / 'shard-0'}, a copy of its files, does not read back: shard-0/{sst.name}"
                     r"( at offset \d+)? \(RocksDB, while reading it: Corruption", said), said  # fmt: skip
    assert f"`ps-server verify {data_dir}` lists what is damaged" in said and "verify " + str(tmp_path / "c1") \
        not in said, said  # fmt: skip
    assert not (tmp_path / "c1" / "shard-0").exists()
    assert not [r for r in caplog.records if r.exc_info], "the server logged a stack trace for data damage"


def odd_rows_checkpoint(tmp_path) -> tuple[pathlib.Path, list[TableConfig], np.ndarray, list[np.ndarray]]:
    """(tmp_path/ckpt, its tables, ids, each table's rows of them): a checkpoint of a shard holding ids of tables "a" and "emb", where two rows of
    emb (ids 7 and 900) are overwritten with values of neither a trained row's nor a pending id's size (40 and 3
    bytes) before the save: its sha256s match. tmp_path/good: the same shard saved before the damage."""
    from ps.engine.shard import Shard
    from tests.conftest import one_shard_checkpoint

    specs, ids = [TableConfig("a", DIM), TableConfig("emb", DIM)], np.arange(1000, dtype=np.uint64)
    data_dir = tmp_path / "shard"
    shard = Shard(ServerConfig(data_dir=str(data_dir)))
    try:
        for spec in specs:
            shard.create_table(spec)
            shard.push(spec.name, ids, np.ones((len(ids), DIM), np.float32))
        want = [shard.pull(spec.name, ids) for spec in specs]
        one_shard_checkpoint(shard, str(tmp_path / "good"), specs)
    finally:
        shard.close()
    with opened(data_dir) as store:
        for i, size in ((7, 40), (900, 3)):
            store._rows().put(encode_keys(store.table_number("emb"), ids[i : i + 1])[0], b"\x00" * size)
    shard = Shard(ServerConfig(data_dir=str(data_dir)))
    try:
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), specs)
    finally:
        shard.close()
    return tmp_path / "ckpt", specs, ids, want


def odd_rows_said(ckpt: pathlib.Path, ids: np.ndarray, number: int) -> str:
    """What odd_rows_checkpoint's damage is called: its table, how many rows, the first one in key order (slot, id)."""
    key, i, size = min((bytes(k), i, size) for k, i, size in zip(encode_keys(number, ids[[7, 900]]), (7, 900), (40, 3)))
    return (f"checkpoint {ckpt} is damaged: shard-0: table 'emb' holds 2 stored rows of neither a trained row's size by "
            f"the config read with (its manifest's: 56 bytes) nor a pending id's (24), the first of id {i} (key "
            f"{key.hex()}, {size} bytes): its rows are damaged, or its manifest does not match them. `ps-server "
            f"verify {ckpt}` lists everything damaged in it")  # fmt: skip


def test_export_of_a_checkpoint_holding_rows_of_no_layouts_size_names_them(tmp_path):
    """Rows of neither a trained row's nor a pending id's size, saved into a checkpoint (its sha256s match): an
    export refuses it, naming the table, how many and the first one, instead of dropping them."""
    from ps.engine.export import export
    from ps.errors import CheckpointDamagedError

    ckpt, _, ids, _ = odd_rows_checkpoint(tmp_path)
    with pytest.raises(CheckpointDamagedError) as failed:
        export(str(ckpt), str(tmp_path / "out"), progress=False)
    assert str(failed.value) == odd_rows_said(ckpt, ids, 1)
    assert not (tmp_path / "out").exists()


def test_a_restore_meeting_rows_of_no_layouts_size_undoes_its_copy_and_calls_the_checkpoint_damaged(tmp_path):
    """The same rows met by a restore: the checkpoint is damaged (not a plain StorageError), the restore deletes
    what it copied (table a's rows, copied before emb's) and its mark, so a start without --restore, or with
    another checkpoint, goes ahead."""
    from ps.engine.shard import Shard
    from ps.errors import CheckpointDamagedError
    from ps.rows.layout import layout_of
    from ps.sharding import slot_of

    ckpt, specs, ids, want = odd_rows_checkpoint(tmp_path)
    data_dir = tmp_path / "new"
    out = ServerProcess(data_dir, "--restore", str(ckpt)).refused()  # exit 2, no traceback
    (said,) = [line for line in out.splitlines() if "error" in line]
    assert said == (f"ps-server: error: {odd_rows_said(ckpt, ids, 1)}. The restore stopped and deleted what it had "
                    f"copied: data dir {data_dir} is as it was before it, and a start with --restore of another "
                    "checkpoint (an earlier save) goes ahead"), out  # fmt: skip
    with pytest.raises(CheckpointDamagedError, match=r"shard-0: table 'emb' holds 2 stored rows of neither"):
        Shard(ServerConfig(data_dir=str(data_dir), restore_dir=str(ckpt)))  # again: no mark refuses it
    with opened(data_dir) as store:
        assert store.load_tables() == [] and store.meta.restore_pending() is None
        assert list(store._rows().keys()) == []  # table a's rows went too
    Shard(ServerConfig(data_dir=str(data_dir))).close()  # a start without --restore
    store = Store(str(tmp_path / "part"))  # a shard restoring some slots: how many of them
    try:
        for spec in specs:
            store.create_table(spec)
        layouts = {spec.name: layout_of(spec.dim, spec.optimizer.name) for spec in specs}
        slot = int(slot_of(ids[7:8])[0])
        assert slot != int(slot_of(ids[900:901])[0])
        with pytest.raises(CheckpointDamagedError, match=rf"'emb' holds 1 stored rows in slots {slot}\.\.{slot} of "
                                                         r"neither .* the first of id 7 "):  # fmt: skip
            store.import_slots(str(ckpt / "shard-0"), (slot, slot + 1), [spec.name for spec in specs], layouts)
    finally:
        store.close()
    shard = Shard(ServerConfig(data_dir=str(data_dir), restore_dir=str(tmp_path / "good")))
    try:
        for spec, rows in zip(specs, want):
            np.testing.assert_array_equal(shard.pull(spec.name, ids), rows)
    finally:
        shard.close()


DAMAGED_META = {  # key -> a value that does not read as ps.storage.meta's grammar says
    b"table/t": b"{not json",
    b"count/t": b'{"admitted": "many", "pending": 0}',
    b"state_id": b"12x",
    b"clock": b"-1",
    b"flushed_seq": b"",
    b"lsn_high": b"1e3",
    b"shard": b"[0, 1]",
    b"applied/" + (7).to_bytes(8, "big"): b"\x00" * 5,
}


@pytest.mark.parametrize("key", DAMAGED_META, ids=lambda k: k.decode("ascii", "replace").split("/")[0])
def test_a_meta_value_that_does_not_read_refuses_the_start_as_damage_naming_it(stopped_cleanly, tmp_path, key):
    from ps.errors import DataLossError

    data_dir = copied(stopped_cleanly, tmp_path)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(key, DAMAGED_META[key])
    with pytest.raises(DataLossError) as refused:
        Server(ServerConfig(data_dir=str(data_dir)))
    name = key.decode() if key.isascii() and key.decode().isprintable() else ascii(key)
    assert f"RocksDB in data dir {data_dir} is damaged: meta key {name} holds {ascii(DAMAGED_META[key])}, which " \
           "does not read as its value" in str(refused.value), str(refused.value)  # fmt: skip
    if key == b"table/t":  # ps-server says so, with no traceback
        out = ServerProcess(data_dir).refused()
        assert f"ps-server: error: cannot start on data dir {data_dir}: RocksDB in data dir {data_dir} is damaged: " \
               "meta key table/t holds" in out and "Traceback" not in out, out  # fmt: skip


def test_a_table_number_or_restore_record_that_does_not_read_is_data_loss_to_a_request(stopped_cleanly, tmp_path,
                                                                                       caplog):  # fmt: skip
    """Values a start does not read: a table's number (read by the first request of a row), the restore the dir
    began from (read by Stats)."""
    data_dir = copied(stopped_cleanly, tmp_path)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(b"tid/t", b"zero")
        store._dir.meta_cf.put(b"restored", b'{"checkpoint": 5}')
    with InProcess(data_dir) as address, Client([address], timeout_s=30) as client:
        with pytest.raises(PsError) as failed:
            client.pull("t", COMMON)
        assert "failed with DATA_LOSS" in str(failed.value), str(failed.value)
        assert "meta key tid/t holds b'zero'" in str(failed.value), str(failed.value)
        with pytest.raises(PsError) as failed:
            client.stats()
        assert "failed with DATA_LOSS" in str(failed.value), str(failed.value)
        assert "meta key restored holds" in str(failed.value), str(failed.value)
    assert not [r for r in caplog.records if r.exc_info], "the server logged a stack trace for data damage"


def crashed_with_a_replay_to_a_damaged_table(data_dir) -> None:
    """A shard on data_dir crashed with a push to table t only in its journal (the next start replays it), then
    t's number (meta key tid/t) damaged: the replay's scan of the tables' numbers meets it."""
    from ps.engine.shard import Shard
    from tests.conftest import crash

    shard = Shard(ServerConfig(data_dir=str(data_dir)))
    shard.create_table(TableConfig("t", DIM))
    shard.push("t", COMMON, np.ones((len(COMMON), DIM), np.float32))
    crash(shard)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(b"tid/t", b"zero")


def test_a_start_refused_on_damage_met_in_a_scan_keeps_no_rocksdb_handle_in_its_error(tmp_path):
    """A start that replays the journal reads the tables' numbers (a scan of meta); one that does not read refuses
    the start with DATA_LOSS. The refusal, kept by its caller, holds nothing of RocksDB: the dir opens again at
    once, where a frame of its traceback holding the meta column family kept RocksDB and the dir's LOCK open."""
    from ps.engine.shard import Shard
    from ps.errors import DataLossError

    data_dir = tmp_path / "shard"
    crashed_with_a_replay_to_a_damaged_table(data_dir)
    with pytest.raises(DataLossError) as refused:
        Shard(ServerConfig(data_dir=str(data_dir)))
    assert "meta key tid/t holds b'zero'" in str(refused.value), str(refused.value)
    Store(str(data_dir)).close()  # not "in use by this process itself"


def test_a_refused_start_error_dropped_by_its_caller_is_freed_at_once(tmp_path):
    """The error a refused start raises in place of its cause (here DATA_LOSS naming the dir) is not left bound in
    the start's frame, which its traceback holds: no cycle, so a caller that drops it frees it, with the frames and
    the closed store it holds, at once rather than at a garbage collection."""
    import gc
    import weakref

    from ps.engine.shard import Shard
    from ps.errors import DataLossError

    data_dir = tmp_path / "shard"
    crashed_with_a_replay_to_a_damaged_table(data_dir)
    refused: list[weakref.ref] = []

    def start() -> None:
        try:
            Shard(ServerConfig(data_dir=str(data_dir)))
        except DataLossError as e:
            assert str(e).startswith(f"cannot start on data dir {data_dir}: "), str(e)
            refused.append(weakref.ref(e))

    was_enabled = gc.isenabled()
    gc.disable()  # only reference counts free what the start left
    try:
        start()
        assert len(refused) == 1 and refused[0]() is None, "the refused start's error outlived its last reference"
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("key, value, why", [
    (b"tid/t", 2**32, "not below 2^32"),
    (b"clock", 2**40 + 1, "1,099,511,627,777 is past the largest clock a shard takes, 1,099,511,627,776 (an "
                          "out-of-range clock advance put it there)"),
    (b"flushed_seq", 5 * 2**64, "not below 2^64"),
    (b"state_id", 0, "0 is no model state's id, which is in [1, 2^63)"),
    (b"state_id", 2**63, "not below 2^63"),
])  # fmt: skip
def test_a_decimal_meta_value_past_its_bound_is_damage_to_a_request_and_to_verify(stopped_cleanly, tmp_path, key,
                                                                                  value, why):  # fmt: skip
    """A table's number is a key's u32 field, the clock at most MAX_CLOCK, the state id in [1, 2^63) (0 would
    turn its checks off), the other decimals u64s: one past that does not read, as damage (a table's number fails a pull with DATA_LOSS, not INTERNAL; the others refuse a
    start), and verify says so."""
    from ps.errors import DataLossError

    data_dir = copied(stopped_cleanly, tmp_path)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(key, str(value).encode())
    what = f"meta key {key.decode()} holds b'{value}', which does not read as its value (ValueError: {why})"
    if key.startswith(b"tid/"):
        with (
            InProcess(data_dir) as address,
            Client([address], timeout_s=30) as client,
            pytest.raises(PsError) as failed,
        ):
            client.pull("t", COMMON)
        assert "failed with DATA_LOSS" in str(failed.value) and what in str(failed.value), str(failed.value)
    else:
        with pytest.raises(DataLossError) as failed:
            Server(ServerConfig(data_dir=str(data_dir)))
        assert what in str(failed.value), str(failed.value)
    said = f"table 't': {what}: none of its rows can be found" if key.startswith(b"tid/") else \
        f"{what}: a server refuses to start on it"  # fmt: skip
    lines, damaged = verify_data_dir(str(data_dir))
    assert damaged and [line for line in lines if line.startswith("DAMAGED")][0].startswith(f"DAMAGED {said}"), lines


def test_rows_of_a_table_number_no_config_has_are_damage_to_verify_and_a_start_warns_and_serves(stopped_cleanly,
                                                                                                 tmp_path, caplog):  # fmt: skip
    """Three rows under a number no table has: verify calls them DAMAGED (how many, which number, the first key, what
    to do), a start warns naming the number and serves the table there; a checkpoint of the dir holds them too,
    which verify of it notes (no restore reads them), and a restore of it into a new dir leaves them behind, as
    verify's remedy says. The intact dir gives no such line."""
    from ps.engine.shard import Shard
    from tests.conftest import one_shard_checkpoint

    data_dir = copied(stopped_cleanly, tmp_path)
    with opened(data_dir) as store:
        number = store.table_number("t")
        for key in encode_keys(number + 5, np.arange(3, dtype=np.uint64)):
            store._rows().put(key, b"\x00" * 24)
    lines, damaged = verify_data_dir(str(data_dir))
    first = encode_keys(number + 5, np.zeros(1, np.uint64))[0].hex()
    said = (f"rows of no table: 3 stored rows of table number(s) {number + 5} (3 rows), which no readable table "
            f"config has (meta keys table/<name>, tid/<name>); the first key {first}")  # fmt: skip
    assert damaged and f"DAMAGED {said}: the rows of a table whose meta keys table/<name> and tid/<name> were lost. " \
        "No request reads them and " \
        "no new table takes their numbers; restore the dir from a backup or checkpoint to get the table back, or, " \
        "to drop them, save a checkpoint and restore it into a new data dir (a restore copies only the tables it " \
        "names)" in lines, lines  # fmt: skip
    spec = TableConfig("t", DIM, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))
    shard = Shard(ServerConfig(data_dir=str(data_dir)))
    try:
        assert rows_of(shard.pull("t", COMMON), -PUSHES)
        one_shard_checkpoint(shard, str(tmp_path / "ckpt"), [spec])
    finally:
        shard.close()
    warned = [r.getMessage() for r in caplog.records if "rows under table number(s)" in r.getMessage()]
    assert warned == [f"data dir {data_dir} is damaged: it stores rows under table number(s) {number + 5}, which "
                      "no table's number (meta key tid/<name>) is: the rows of a table whose meta keys table/<name> "
                      "and tid/<name> were lost. No request reads them and no new table takes their numbers; the "
                      f"other tables serve. `ps-server verify {data_dir}` counts them and says what to do"], warned  # fmt: skip
    lines, damaged = verify_checkpoint(str(tmp_path / "ckpt"))
    assert not damaged and f"note    shard-0: {said}: no restore or export reads them" in lines, lines
    Shard(ServerConfig(data_dir=str(tmp_path / "new"), restore_dir=str(tmp_path / "ckpt"))).close()
    for intact in (tmp_path / "new", stopped_cleanly):
        lines, damaged = verify_data_dir(str(intact))
        assert not damaged and not [line for line in lines if "rows of no table" in line], lines


def test_verify_says_a_stray_count_of_no_table_fails_only_the_creation_of_that_table(stopped_cleanly, tmp_path):
    """A count/ value that does not read, of a name no table has: the server starts and serves, a CreateTable of
    that name fails with DATA_LOSS (the create reads its counts), and verify says so, not that a start is refused."""
    from ps.errors import DataLossError

    data_dir = copied(stopped_cleanly, tmp_path)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(b"count/stray", b"{bad")
    server = Server(ServerConfig(data_dir=str(data_dir)))  # starts
    try:
        with pytest.raises(DataLossError, match="meta key count/stray holds"):
            server.shard.create_table(TableConfig(name="stray", dim=4))
    finally:
        server.shard.close()
    lines, damaged = verify_data_dir(str(data_dir))
    said = [line for line in lines if line.startswith("DAMAGED")]
    assert damaged and len(said) == 1 and said[0].startswith("DAMAGED meta key count/stray holds b'{bad'"), lines
    assert said[0].endswith(": no table 'stray' is stored, so a start and every request leave it unread but a "
                            "CreateTable of that name, which fails with DATA_LOSS"), lines  # fmt: skip


VERIFIED_META = {  # DAMAGED_META's values and more, as verify names them
    **DAMAGED_META,
    b"cluster": b"\xff",
    b"restore_pending": b"\xfe/ckpt",
    b"restored": b'{"checkpoint": 5}',
    b"advanced/" + (7).to_bytes(8, "big"): b"7x",
    b"applied": b"[1, 2]",
}


@pytest.mark.parametrize("key", VERIFIED_META, ids=lambda k: k.decode("ascii", "replace").split("/")[0])
def test_verify_names_a_meta_value_that_does_not_read_as_the_server_reads_it(stopped_cleanly, tmp_path, key):
    """verify reads each meta value as start-up (or a request) does, and names the one that does not read, once:
    not as damage of the whole column family, nor as a lost shard record or journal records it did not read."""
    from ps.errors import DataLossError

    data_dir = copied(stopped_cleanly, tmp_path)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(key, VERIFIED_META[key])
    name = key.decode() if key.isascii() and key.decode().isprintable() else ascii(key)
    if key == b"restored":  # read by Stats, and by a start given --restore
        follows = "Stats, and a start given --restore, fail with DATA_LOSS"
        with pytest.raises(DataLossError) as failed:
            Store(str(data_dir)).meta.restored()
    else:
        follows = "a server refuses to start on it"
        with pytest.raises(DataLossError) as failed:
            Server(ServerConfig(data_dir=str(data_dir)))
    what = re.search(r"is damaged: (meta key .*?\)). `ps-server verify", str(failed.value)).group(1)
    assert what.startswith(f"meta key {name} holds {ascii(VERIFIED_META[key])}, which does not read as its value (")
    lines, damaged = verify_data_dir(str(data_dir))
    assert damaged and [line for line in lines if line.startswith("DAMAGED")] == [f"DAMAGED {what}: {follows}"], lines
    if key in (b"flushed_seq", b"lsn_high"):
        assert "note    journal: not checked: RocksDB's flushed position or highest lsn does not read (above), and " \
               "they say which records must be there" in lines, lines  # fmt: skip
    if key == b"clock":  # ps-server verify prints it, exit 1
        done = verify(data_dir)
        assert done.returncode == 1 and f"DAMAGED {what}: {follows}\n" in done.stdout, done.stdout + done.stderr


CLIENT_KEYS_OF_ANOTHER_LENGTH = {  # a client's key whose id is not 8 bytes, with a value that reads
    b"applied/" + (7).to_bytes(7, "big"): struct.pack("<QIQ", 3, 1, 100),
    b"applied/" + (7).to_bytes(9, "big"): struct.pack("<QIQ", 3, 1, 100),
    b"advanced/" + (7).to_bytes(4, "big"): b"3",
}


@pytest.mark.parametrize("key", CLIENT_KEYS_OF_ANOTHER_LENGTH, ids=lambda k: f"{k.split(b'/')[0].decode()}-{len(k)}")
def test_a_client_key_whose_id_is_not_8_bytes_is_damage_to_a_start_and_to_verify(stopped_cleanly, tmp_path, key):
    """An "applied/" or "advanced/" key whose client id is not 8 bytes long (read as a u64 it would name another
    client's entry) refuses the start with DATA_LOSS naming the key, and verify names it."""
    from ps.errors import DataLossError

    data_dir = copied(stopped_cleanly, tmp_path)
    value = CLIENT_KEYS_OF_ANOTHER_LENGTH[key]
    with opened(data_dir) as store:
        store._dir.meta_cf.put(key, value)
    with pytest.raises(DataLossError) as refused:
        Server(ServerConfig(data_dir=str(data_dir)))
    what = (f"meta key {ascii(key)} holds {ascii(value)}, but its client id is {len(key.split(b'/', 1)[1])} bytes, "
            "not 8 (the key is damaged)")  # fmt: skip
    assert f"RocksDB in data dir {data_dir} is damaged: {what}" in str(refused.value), str(refused.value)
    lines, damaged = verify_data_dir(str(data_dir))
    said = [line for line in lines if line.startswith("DAMAGED")]
    assert damaged and said == [f"DAMAGED {what}: a server refuses to start on it"], lines


@pytest.mark.parametrize("record", [b'{"7": [3]}', b'{"7": []}', b'{"7": "12"}', b'{"7": [3, 4, 5]}',
                                    b'{"7": [1.5, 2]}', b'{"7": [3, 4294967296]}', b'{"x7": [3, 4]}'])  # fmt: skip
def test_a_legacy_applied_entry_short_of_its_fields_is_damage_to_a_start_and_to_verify(stopped_cleanly, tmp_path,
                                                                                       record):  # fmt: skip
    """The legacy "applied" value's entry [client_seq, parts] with one missing, one too many, of another type or
    too large, or of a client that is not a decimal, does not read: a start is refused with DATA_LOSS naming the
    key, not a bug's traceback nor an entry read as another (a string "12" as [1, 2]), and verify names it, not
    as damage of the whole meta column family."""
    from ps.errors import DataLossError

    data_dir = copied(stopped_cleanly, tmp_path)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(b"applied", record)
    with pytest.raises(DataLossError) as refused:
        Server(ServerConfig(data_dir=str(data_dir)))
    what = f"meta key applied holds {ascii(record)}, which does not read as its value (ValueError: "
    assert what in str(refused.value), str(refused.value)
    lines, damaged = verify_data_dir(str(data_dir))
    said = [line for line in lines if line.startswith("DAMAGED")]
    assert damaged and len(said) == 1 and said[0].startswith(f"DAMAGED {what}"), lines
    assert said[0].endswith(": a server refuses to start on it"), lines


@pytest.mark.parametrize("record", [b'{"job": 1, "done": "x"}', b'{"job": 1, "num_workers": 2, "done": [2]}'])
def test_verify_notes_a_job_done_record_that_does_not_read_which_a_start_passes(stopped_cleanly, tmp_path, record):
    """The job_done record is read as the grammar says, as every meta value is: verify names one that does not
    read, as a note (a shard that follows the job logs it and waits for its finished workers), and a start
    passes it."""
    from ps.storage.shardmeta import JOB_DONE_REMEDY

    data_dir = copied(stopped_cleanly, tmp_path)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(b"job_done", record)
    with InProcess(data_dir):
        pass
    lines, damaged = verify_data_dir(str(data_dir))
    said = [line for line in lines if "meta key job_done" in line]
    assert not damaged and len(said) == 1, lines
    assert said[0].startswith(f"note    meta key job_done holds {ascii(record)}, which does not read as its value (")
    assert said[0].endswith(f": {JOB_DONE_REMEDY}"), lines


@pytest.mark.parametrize("shard_json", ["kept", "missing"])
@pytest.mark.parametrize(
    "record", [b"{}", b'{"shard_id": 0}', b'{"shard_id": 0, "num_shards": "1", "num_slots": 16384}']
)
def test_a_shard_record_without_its_fields_is_damage_to_a_start_and_to_verify(stopped_cleanly, tmp_path, record,
                                                                               shard_json):  # fmt: skip
    """A JSON object in RocksDB's "shard" key lacking an integer shard_id, num_shards or num_slots is named as
    damage by a start and by verify, and a start writes no shard.json from it."""
    from ps.errors import DataLossError

    data_dir = copied(stopped_cleanly, tmp_path)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(b"shard", record)
    if shard_json == "missing":
        os.remove(data_dir / "shard.json")
    with pytest.raises(DataLossError) as refused:
        Server(ServerConfig(data_dir=str(data_dir)))
    what = f"meta key shard holds {ascii(record)}, which does not read as its value (ValueError: expected a JSON " \
           "object with integers >= 0 shard_id, num_shards, num_slots)"  # fmt: skip
    assert f"RocksDB in data dir {data_dir} is damaged: {what}" in str(refused.value), str(refused.value)
    assert (data_dir / "shard.json").exists() == (shard_json == "kept")
    lines, damaged = verify_data_dir(str(data_dir))
    assert damaged and [line for line in lines if line.startswith("DAMAGED")] == [
        f"DAMAGED {what}: a server refuses to start on it"
    ], lines


def test_verify_names_a_checkpoints_meta_value_that_does_not_read_by_what_reads_it(checkpoints, tmp_path):
    """In a checkpoint, a row count that does not read refuses a restore: damaged; a clock that does not read is
    read by no restore or export: a note."""
    root, _, _ = checkpoints
    copy = tmp_path / "copy"
    shutil.copytree(root / "good", copy)
    store = Store(str(copy / "shard-0"))
    try:
        store._dir.meta_cf.put(b"count/emb", b"{}")
        store._dir.meta_cf.put(b"clock", b"x")
        store.flush()
    finally:
        store.close()
    lines, damaged = verify_checkpoint(str(copy))
    assert damaged, lines
    said = [line for line in lines if "meta key" in line]
    assert said == [
        "note    shard-0: meta key clock holds b'x', which does not read as its value (ValueError: not a decimal "
        "integer): no restore or export reads it",
        "DAMAGED shard-0: meta key count/emb holds b'{}', which does not read as its value (ValueError: not "
        '{"admitted": n, "pending": n} with counts >= 0): a restore of the checkpoint is refused',
    ], lines
    assert not [line for line in lines if "column family meta" in line and line.startswith("DAMAGED")], lines


@pytest.mark.parametrize("number", ["deleted", "unreadable"])
def test_verify_says_once_the_rows_of_the_one_table_without_its_number(stopped_cleanly, tmp_path, number):
    """A table whose number is gone or does not read: its rows are among those of numbers no table has, said in its
    DAMAGED line, not again as rows no server reads. With two such tables they cannot be told apart: the rows are
    a line of their own, which says they are most likely those tables' (not a table's whose meta keys were lost)."""
    data_dir = copied(stopped_cleanly, tmp_path)
    with opened(data_dir) as store:
        ids = np.array([i for i, _ in store.iter_rows("t")], dtype=np.uint64)
        rows, first = len(ids), bytes(min(encode_keys(store.table_number("t"), ids))).hex()
        if number == "deleted":
            store._dir.meta_cf.delete(b"tid/t")
        else:
            store._dir.meta_cf.put(b"tid/t", b"zero")
    lines, damaged = verify_data_dir(str(data_dir))
    why = {
        "deleted": "its config is stored without its number (meta key tid/t)",
        "unreadable": "meta key tid/t holds b'zero', which does not read as its value (ValueError: not a decimal "
                      "integer)",
    }[number]  # fmt: skip
    assert damaged and [line for line in lines if line.startswith(("DAMAGED", "note    rows"))] == [
        f"DAMAGED table 't': {why}: none of its rows can be found; {NUMBER_UNREAD}. Its rows, if it has any, are "
        f"among the {rows:,} stored rows of table number(s) 0 ({rows:,} rows), which no other table has; the first key {first}"
    ], lines
    with opened(data_dir) as store:  # a second table without its number: which rows are whose is not known
        store._dir.meta_cf.put(b"table/u", json.dumps(TableConfig("u", DIM).to_dict()).encode())
    lines, damaged = verify_data_dir(str(data_dir))
    said = [line for line in lines if line.startswith("DAMAGED rows of no table")]
    assert len(said) == 1 and said[0].endswith(
        ": most likely the rows of the tables above whose numbers are missing "
        "or do not read ('t', 'u'), which of them whose is not known"
    ), lines
    assert not [line for line in lines if "Its rows, if it has any" in line or LOST_TABLE_ROWS in line], lines


# ---- one table's number damaged among several: that table fails, the others serve ----------------------------------
SGD = dict(initializer=InitializerConfig("zeros", 0.0), optimizer=OptimizerConfig("sgd", 1.0))


def shard_of(data_dir, **config):
    from ps.engine.shard import Shard

    return Shard(ServerConfig(data_dir=str(data_dir), **config))


def push_ones(shard_or_client, table: str) -> None:
    shard_or_client.push(table, COMMON, np.ones((len(COMMON), DIM), np.float32))


@pytest.fixture(scope="module")
def three_tables(tmp_path_factory):
    """A data dir holding tables a, b and c (numbers 0, 1, 2), each of COMMON's rows pushed once (-1 each), stopped
    cleanly."""
    data_dir = tmp_path_factory.mktemp("three") / "shard"
    shard = shard_of(data_dir)
    for table in "abc":
        shard.create_table(TableConfig(table, DIM, **SGD))
        push_ones(shard, table)
    shard.close()
    return data_dir


def rows_of(got: np.ndarray, value: float) -> bool:
    return np.array_equal(got, np.full((len(COMMON), DIM), value, np.float32))


def test_a_damaged_table_number_fails_that_tables_requests_and_a_save_while_the_others_serve(three_tables, tmp_path):
    """tid/b does not read: a pull or push of b fails with DATA_LOSS naming the key, and so do a new table (it could
    get b's number) and a checkpoint save (it would copy the damage), each changing nothing; a and c serve, a push
    to them is applied and kept."""
    from worker.checkpoint import save

    data_dir = copied(three_tables, tmp_path)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(b"tid/b", b"zero")
    said = "meta key tid/b holds b'zero', which does not read as its value"
    root = tmp_path / "root"
    with InProcess(data_dir, checkpoint_root=str(root)) as address, Client([address], timeout_s=30) as client:
        assert rows_of(client.pull("a", COMMON), -1) and rows_of(client.pull("c", COMMON), -1)
        push_ones(client, "a")
        assert rows_of(client.pull("a", COMMON), -2)
        for call in (lambda: client.pull("b", COMMON), lambda: push_ones(client, "b"),
                     lambda: client.create_table(TableConfig("d", DIM, **SGD))):  # fmt: skip
            with pytest.raises(PsError) as failed:
                call()
            assert "failed with DATA_LOSS" in str(failed.value) and said in str(failed.value), str(failed.value)
        assert "no new table is given a number while a table's is not known" in str(failed.value), str(failed.value)
        with pytest.raises(PsError) as failed:
            save(client, str(root / "ckpt"))
        assert said in str(failed.value) and "a checkpoint would copy it: nothing was saved" in str(failed.value)
        assert not (root / "ckpt").exists() or not list((root / "ckpt").iterdir())
        assert sorted(t.name for t in client.stats()[0].tables) == ["a", "b", "c"]
    with opened(data_dir) as store:
        assert store._dir.meta_cf.get(b"table/d") is None and store._dir.meta_cf.get(b"tid/b") == b"zero"
    shard = shard_of(data_dir)
    try:
        assert rows_of(shard.pull("a", COMMON), -2) and rows_of(shard.pull("c", COMMON), -1)
    finally:
        shard.close()


@pytest.mark.parametrize("replayed", ["a", "b"])
def test_a_start_replays_pushes_to_other_tables_and_refuses_one_to_the_table_whose_number_does_not_read(
    three_tables, tmp_path, replayed
):
    """A push only in the journal: to a, the start replays it and a serves; to b, whose number does not read, the
    start is refused, naming the key, and applies it nowhere: once the number is put back, the next start applies it
    to b, once."""
    from ps.errors import DataLossError
    from tests.conftest import crash

    data_dir = copied(three_tables, tmp_path)
    shard = shard_of(data_dir)
    push_ones(shard, replayed)
    crash(shard)
    with opened(data_dir) as store:
        number = store._dir.meta_cf.get(b"tid/b")
        store._dir.meta_cf.put(b"tid/b", b"zero")
    if replayed == "b":
        with pytest.raises(DataLossError) as refused:
            shard_of(data_dir)
        assert "meta key tid/b holds b'zero'" in str(refused.value), str(refused.value)
        with opened(data_dir) as store:
            store._dir.meta_cf.put(b"tid/b", number)
    shard = shard_of(data_dir)
    try:
        for table in "abc":
            if table == "b" and replayed == "a":
                with pytest.raises(DataLossError, match="meta key tid/b holds b'zero'"):
                    shard.pull(table, COMMON)
            else:
                assert rows_of(shard.pull(table, COMMON), -2 if table == replayed else -1), table
    finally:
        shard.close()


def with_table_number(three_tables, tmp_path, table: str, number: str, unreadable: bytes) -> str:
    """A copy of three_tables' data dir whose table's number (its meta key tid/<table>) is "deleted", or
    "unreadable" (holds the bytes unreadable)."""
    data_dir = copied(three_tables, tmp_path)
    with opened(data_dir) as store:
        if number == "deleted":
            store._dir.meta_cf.delete(f"tid/{table}".encode())
        else:
            store._dir.meta_cf.put(f"tid/{table}".encode(), unreadable)
    return data_dir


@pytest.mark.parametrize("number", ["deleted", "unreadable"])
def test_no_new_table_takes_a_number_while_a_tables_number_is_not_known(three_tables, tmp_path, number):
    """c's number (2, the highest) deleted or unreadable: a new table is refused (by create and by its check), where
    the next number would be c's, its pulls c's rows; c is not made again under another number either. The tables
    whose numbers read are made again as they are."""
    from ps.errors import DataLossError

    data_dir = with_table_number(three_tables, tmp_path, "c", number, b"2x")
    shard = shard_of(data_dir)
    try:
        said = "table 'c' has no number (meta key tid/c)" if number == "deleted" else "meta key tid/c holds b'2x'"
        for create in (shard.check_create, shard.create_table):
            with pytest.raises(DataLossError) as refused:
                create(TableConfig("d", DIM, **SGD))
            assert said in str(refused.value) and "no new table is given a number" in str(refused.value)
        with pytest.raises(DataLossError, match="the table is not created again under another number"):
            shard.store.create_table(TableConfig("c", DIM, **SGD))
        assert "d" not in shard.tables
        assert shard.create_table(TableConfig("a", DIM, **SGD)) is shard.tables["a"]
        assert rows_of(shard.pull("a", COMMON), -1)
    finally:
        shard.close()
    with opened(data_dir) as store:
        assert store._dir.meta_cf.get(b"table/d") is None and store._dir.meta_cf.get(b"tid/d") is None


@pytest.mark.parametrize("number", ["deleted", "unreadable"])
def test_a_start_names_a_tables_number_that_does_not_read_not_lost_meta_keys_for_its_rows(three_tables, tmp_path,
                                                                                          number, caplog):  # fmt: skip
    """b's number (1) deleted or unreadable, its config kept: b's rows are under a number no readable table number
    is, and the start's warning names the damage there is (b's number), not meta keys table/<name> and tid/<name>
    lost; a and c serve."""
    data_dir = with_table_number(three_tables, tmp_path, "b", number, b"1x")
    shard = shard_of(data_dir)
    try:
        assert rows_of(shard.pull("a", COMMON), -1) and rows_of(shard.pull("c", COMMON), -1)
    finally:
        shard.close()
    said = "table 'b' has no number (meta key tid/b)" if number == "deleted" else "meta key tid/b holds b'1x'"
    warned = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"data dir {data_dir} is damaged: {said}"), warned
    assert "requests of 'b' fail with DATA_LOSS, the other tables serve. The rows stored under table number(s) 1, " \
        "which no readable table number is, are most likely that table's" in warned[0], warned  # fmt: skip
    assert "were lost" not in warned[0], warned


@pytest.mark.parametrize("highest", [2**32 - 2, 2**32 - 1])
def test_a_new_table_takes_the_last_table_number_and_none_past_it(three_tables, tmp_path, highest):
    """c's number set to `highest`: below 2^32 - 1, a new table d gets the next, 2^32 - 1 (a row key's u32 field
    holds it: d's rows go and come back); at 2^32 - 1, d is refused by create and by its check with
    RESOURCE_EXHAUSTED naming c's key, writing nothing, where the next number would not fit the key."""
    from ps.errors import TableNumbersExhaustedError
    from ps.storage.meta import MAX_TABLE_NUMBER

    assert MAX_TABLE_NUMBER == 2**32 - 1
    data_dir = copied(three_tables, tmp_path)
    with opened(data_dir) as store:
        store._dir.meta_cf.put(b"tid/c", str(highest).encode())
    d = TableConfig("d", DIM, **SGD)
    shard = shard_of(data_dir)
    try:
        if highest < MAX_TABLE_NUMBER:
            shard.create_table(d)
            push_ones(shard, "d")
            assert shard.store.table_number("d") == 2**32 - 1 and rows_of(shard.pull("d", COMMON), -1)
            return
        for create in (shard.check_create, shard.create_table):
            with pytest.raises(TableNumbersExhaustedError) as refused:
                create(d)
            assert "no table number is left for new table 'd': a new table takes the number after the highest, and " \
                   "table 'c' holds 4,294,967,295 (meta key tid/c)" in str(refused.value), str(refused.value)  # fmt: skip
        assert refused.value.status == "RESOURCE_EXHAUSTED" and "d" not in shard.tables
        assert shard.create_table(TableConfig("a", DIM, **SGD)) is shard.tables["a"]
    finally:
        shard.close()
    with opened(data_dir) as store:
        assert store._dir.meta_cf.get(b"table/d") is None and store._dir.meta_cf.get(b"tid/d") is None


@pytest.mark.parametrize("lost", ["c", "abc"])
def test_a_new_table_takes_no_number_that_rows_of_a_lost_table_are_under(three_tables, tmp_path, lost):
    """The meta keys table/<name> and tid/<name> of c (number 2, the highest), or of every table, deleted: their
    rows stay in RocksDB under numbers no table has. A new table d, and c made again, each take a number past
    them (3, 4) and start empty, never with the lost table's rows; the tables left serve theirs."""
    data_dir = copied(three_tables, tmp_path)
    with opened(data_dir) as store:
        for table in lost:
            store._dir.meta_cf.delete(b"table/" + table.encode())
            store._dir.meta_cf.delete(b"tid/" + table.encode())
    shard = shard_of(data_dir)
    try:
        assert shard.store.rows_of_no_table() == ([2] if lost == "c" else [0, 1, 2])
        for table in "dc":
            shard.create_table(TableConfig(table, DIM, **SGD))
            assert rows_of(shard.pull(table, COMMON), 0), table
        assert [shard.store.table_number(t) for t in "dc"] == [3, 4]
        assert shard.store.rows_of_no_table() == ([2] if lost == "c" else [0, 1, 2])
        for table in sorted(set("ab") - set(lost)):
            assert rows_of(shard.pull(table, COMMON), -1), table
    finally:
        shard.close()


def test_rows_of_no_table_under_the_last_table_number_leave_none_for_a_new_table(three_tables, tmp_path):
    """A stored row under 2^32 - 1, a number no table has: a new table is refused with RESOURCE_EXHAUSTED naming
    those rows, not given a number past the key's field; the tables there serve."""
    from ps.errors import TableNumbersExhaustedError

    data_dir = copied(three_tables, tmp_path)
    with opened(data_dir) as store:
        store._rows().put(encode_keys(2**32 - 1, np.zeros(1, np.uint64))[0], b"\x00" * 24)
    shard = shard_of(data_dir)
    try:
        with pytest.raises(TableNumbersExhaustedError) as refused:
            shard.create_table(TableConfig("d", DIM, **SGD))
        assert "a new table takes the number after the highest, and stored rows of no table (the rows of a table " \
               "whose meta keys table/<name> and tid/<name> were lost. No request reads them and no new table takes " \
               f"their numbers; `ps-server verify {data_dir}` counts them) are under " \
               "4,294,967,295, the largest" in str(refused.value), str(refused.value)  # fmt: skip
        assert "d" not in shard.tables and rows_of(shard.pull("c", COMMON), -1)
    finally:
        shard.close()


def test_a_table_number_key_whose_name_is_not_utf8_is_damage_that_fails_only_its_table(three_tables, tmp_path):
    """tid/b's key damaged into one whose name is not UTF-8 (b's number under it): b has no number, so its pulls
    fail with DATA_LOSS, as does a new table, naming the key; a and c serve; verify names the key and b."""
    from ps.errors import DataLossError

    data_dir = copied(three_tables, tmp_path)
    with opened(data_dir) as store:
        number = store._dir.meta_cf.get(b"tid/b")
        store._dir.meta_cf.delete(b"tid/b")
        store._dir.meta_cf.put(b"tid/\xe2b", number)
    shard = shard_of(data_dir)
    try:
        assert rows_of(shard.pull("a", COMMON), -1) and rows_of(shard.pull("c", COMMON), -1)
        with pytest.raises(DataLossError, match="table 'b' has no number"):
            shard.pull("b", COMMON)
        said = "meta key b'tid/\\xe2b' holds b'1', but its table name is not UTF-8 (the key is damaged)"
        for create in (shard.check_create, shard.create_table):
            with pytest.raises(DataLossError) as refused:
                create(TableConfig("d", DIM, **SGD))
            assert said in str(refused.value) and "no new table is given a number" in str(refused.value)
    finally:
        shard.close()
    lines, damaged = verify_data_dir(str(data_dir))
    found = [line for line in lines if line.startswith("DAMAGED")]
    assert damaged and any(said in line for line in found), lines
    assert any(line.startswith("DAMAGED table 'b'") for line in found), lines


def test_a_shrink_of_every_table_is_refused_before_any_is_shrunk_while_a_tables_number_does_not_read(tmp_path):
    """Tables a, b and c decay show and click by half at each Shrink; tid/b does not read. A Shrink of every table
    is refused with DATA_LOSS naming the key, changing no table (one that went on until b would have decayed a's
    rows, and its retry decays them again); a Shrink of a alone decays a's rows once."""
    from ps.config import EvictionConfig
    from ps.errors import DataLossError
    from ps.rows.layout import SHOW

    data_dir = tmp_path / "shard"
    shard = shard_of(data_dir)
    for table in "abc":
        shard.create_table(TableConfig(table, DIM, eviction=EvictionConfig(decay=0.5), **SGD))
        push_ones(shard, table)  # one show per id
    shard.close()
    with opened(data_dir) as store:
        store._dir.meta_cf.put(b"tid/b", b"zero")
    shard = shard_of(data_dir)
    try:
        shows = lambda table: shard.tables[table].peek(COMMON)[:, shard.tables[table].stats_col + SHOW]
        with pytest.raises(DataLossError, match="meta key tid/b holds b'zero'"):
            shard.shrink()
        assert (shows("a") == 1).all() and (shows("c") == 1).all()
        assert shard.shrink("a")["dropped"] == 0
        assert (shows("a") == 0.5).all() and (shows("c") == 1).all()
    finally:
        shard.close()

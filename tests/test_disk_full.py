"""A full disk (ENOSPC, or a spent quota: EDQUOT) is RESOURCE_EXHAUSTED, with a message that says the server's
disk is full, names the path (the journal, the data dir, the checkpoint dir) and says what of the request stands;
the request changes nothing, and once space is freed the same request succeeds and survives a restart.

The full disk is simulated: the journal's pwritev writes part of a record and then fails as a full disk does
(the rest fails with ENOSPC), RocksDB's writes and checkpoints raise rocksdict's plain Exception with RocksDB's
text ("IO error: No space left on device: ..."). Black box where it can be: through gRPC, the rows as Pull
returns them; the journal's next record number and file are looked at directly. A check on a real full disk
(a small tmpfs in a private mount namespace) gave the same codes and messages.
"""

from __future__ import annotations

import errno
import os

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps.accel.prefault import Prefaulter
from ps.diskfull import SHRINK_REMEDY, DiskFullError, disk_full_reason
from ps.errornames import error_fields
from ps.errors import StorageError
from ps.server import Server
from ps.server_config import ServerConfig
from ps.storage import journal as journal_module
from ps.storage import journalformat
from ps.storage import store as store_module
from ps.storage.journal import Journal
from tests.conftest import crash, stop_servers

TIMEOUT_S = 30
DIM = 4
REASONS = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded"}


# ---- helpers ----------------------------------------------------------------------------------------------
class FullDisk:
    """os.pwritev as on a disk that fills up: the first call writes `first` bytes of what it is given and
    returns that count (a short write), every later one raises OSError(error). `calls` counts the calls."""

    def __init__(self, error: int = errno.ENOSPC, first: int = 100, passes: int = 0):
        self.error, self.first, self.passes, self.calls = error, first, passes, 0
        self.real = os.pwritev

    def __call__(self, fd, buffers, offset):
        self.calls += 1
        if self.passes:  # records written whole before the disk fills
            self.passes -= 1
            return self.real(fd, buffers, offset)
        if self.first is not None:
            data = b"".join(bytes(b) for b in buffers)[: self.first]
            self.first = None
            return os.pwrite(fd, data, offset)
        raise OSError(self.error, os.strerror(self.error))


@pytest.fixture
def full_journal(monkeypatch):
    """Installs a FullDisk as the journal's pwritev (made by the returned function); the mapped copy into
    prepared space is turned off, so that every record is written with pwritev. monkeypatch.undo() frees the
    space."""
    monkeypatch.setattr(Prefaulter, "mapped_end", property(lambda self: 0))

    def install(**kwargs) -> FullDisk:
        disk = FullDisk(**kwargs)
        monkeypatch.setattr(journal_module.os, "pwritev", disk)
        return disk

    return install


class FullRocksDB:
    """Stands for a Store's Rdict on a full disk: writes (write, put, create_column_family) raise RocksDB's
    error as rocksdict raises it (a plain Exception); everything else is the real Rdict's."""

    def __init__(self, db, path: str):
        self._db, self._path = db, path

    def _full(self, *args, **kwargs):
        raise Exception(
            f"IO error: No space left on device: While appending to file: {self._path}/000004.log: "
            "No space left on device"
        )

    write = put = create_column_family = _full

    def __getattr__(self, name):
        return getattr(self._db, name)


def start(data_dir, root=None) -> tuple[Server, ps_pb2_grpc.ParameterServerStub, grpc.Channel]:
    config = ServerConfig(data_dir=str(data_dir), port=0, flush_interval_s=3600.0,
                          checkpoint_root=str(root) if root else None)  # fmt: skip
    server = Server(config)
    port = server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return server, ps_pb2_grpc.ParameterServerStub(channel), channel


@pytest.fixture
def serve(tmp_path):
    """Factory: start(data dir name) -> (server, stub); everything started is stopped at the end."""
    running = []

    def go(name: str = "d", root=None):
        server, stub, channel = start(tmp_path / name, root)
        running.append((server, channel))
        return server, stub

    yield go
    stop_servers(running)


def create(stub, name: str = "t") -> None:
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=ps_pb2.TableSpec(name=name, dim=DIM)), timeout=TIMEOUT_S)


def push_request(ids, value: float, table: str = "t") -> ps_pb2.PushRequest:
    grads = np.full((len(ids), DIM), value, dtype="<f4")
    return ps_pb2.PushRequest(table=table, ids=np.asarray(ids, "<u8").tobytes(), grads=grads.tobytes(), dim=DIM)


def pull(stub, ids, table: str = "t") -> np.ndarray:
    reply = stub.Pull(ps_pb2.PullRequest(table=table, ids=np.asarray(ids, "<u8").tobytes()), timeout=TIMEOUT_S)
    return np.frombuffer(reply.rows, dtype="<f4").reshape(len(ids), DIM).copy()


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def journal_file_ends_at_last_record(journal: Journal) -> bool:
    return journal._fd < 0 or os.path.getsize(journal._path) == journal._segment_size


IDS = np.arange(1, 41, dtype=np.uint64)
NEW_IDS = np.arange(1000, 1010, dtype=np.uint64)  # ids the shard has never seen


# ---- pushes -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EDQUOT])
def test_a_push_on_a_full_disk_is_resource_exhausted_and_changes_nothing(serve, full_journal, monkeypatch, error):
    server, stub = serve()
    create(stub)
    stub.Push(push_request(IDS, 0.5), timeout=TIMEOUT_S)
    ids = np.concatenate([IDS, NEW_IDS])
    before = pull(stub, ids)
    journal = server.shard.journal
    seq, clock = journal.next_seq, server.shard.clock
    request = ps_pb2.PushBatchRequest(pushes=[push_request(ids, 1.0)], advance_clock=1, client_id=7, seq=1)

    disk = full_journal(error=error)
    e = refused(lambda: stub.PushBatch(request, timeout=TIMEOUT_S))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
    head = journalformat.HEADER.size + 2 + len("t") + journalformat.PAYLOAD_HEAD.size + journalformat.DIGEST.size
    size = head + len(ids) * (8 + 4 * DIM + 4 + 4)  # ids, grads, shows, clicks
    assert e.details() == (
        f"the server's disk is full ({REASONS[error]}): the journal in {journal.dir} cannot take a push of "
        f"{size:,} bytes; free space on that disk (or raise the quota) and retry; nothing was applied"
    )
    assert disk.calls == 2  # the short write, then the rest: the real error
    assert journal.next_seq == seq and server.shard.clock == clock
    assert journal_file_ends_at_last_record(journal), "the part of the record that was written stays in the file"
    assert np.array_equal(pull(stub, ids), before)

    monkeypatch.undo()  # space freed: the same request (a retry) is applied, once
    reply = stub.PushBatch(request, timeout=TIMEOUT_S)
    assert (reply.num_applied, reply.step) == (len(ids), clock + 1)
    assert journal.next_seq == seq + 1
    after = pull(stub, ids)
    assert not np.array_equal(after, before)
    server.stop(grace_s=1)

    restarted, stub2 = serve()
    assert np.array_equal(pull(stub2, ids), after)
    assert restarted.shard.clock == clock + 1


def test_a_failed_append_leaves_no_record_for_a_later_append_or_a_crash_to_replay(tmp_path, full_journal, monkeypatch):
    """After a short write, the journal's end and next seq are where they were: a later append takes the seq
    and the offset, and replay after a crash reads the good records only (none of the torn one)."""
    server, stub, channel = start(tmp_path / "d")
    try:
        create(stub)
        stub.Push(push_request(IDS, 0.5), timeout=TIMEOUT_S)
        full_journal(first=60)  # the header and part of the payload reach the file
        e = refused(lambda: stub.Push(push_request(IDS, 9.0), timeout=TIMEOUT_S))
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        monkeypatch.undo()
        stub.Push(push_request(NEW_IDS, 0.25), timeout=TIMEOUT_S)
        expected = pull(stub, np.concatenate([IDS, NEW_IDS]))
        assert server.shard.journal.next_seq == 3  # records 1 and 2: the failed push took no seq
    finally:
        channel.close()
        server._grpc.stop(None).wait()
    crash(server.shard)  # kill -9: the journal is what is left

    server, stub, channel = start(tmp_path / "d")
    try:
        assert np.array_equal(pull(stub, np.concatenate([IDS, NEW_IDS])), expected)
        assert server.shard.journal.losses == []
    finally:
        channel.close()
        server.stop(grace_s=1)


def test_a_batch_whose_second_push_finds_the_disk_full_says_the_first_stays(serve, full_journal, monkeypatch):
    server, stub = serve()
    create(stub)
    before = pull(stub, np.concatenate([IDS, NEW_IDS]))
    request = ps_pb2.PushBatchRequest(pushes=[push_request(IDS, 1.0), push_request(NEW_IDS, 1.0)], client_id=9,
                                      seq=1, advance_clock=1)  # fmt: skip
    full_journal(passes=1)
    e = refused(lambda: stub.PushBatch(request, timeout=TIMEOUT_S))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.details().startswith(
        "the server's disk is full (No space left on device): "
        f"the journal in {server.shard.journal.dir} cannot take a push of "
    )
    assert e.details().endswith(
        "free space on that disk (or raise the quota) and retry; push 1 of 2 in the batch (table 't') was refused. The "
        "push 0 before it was applied and stays applied, and the clock was not advanced; a retry of this request "
        "(same client_id and seq) applies pushes 1 on"
    )
    after_first = pull(stub, np.concatenate([IDS, NEW_IDS]))
    assert not np.array_equal(after_first[: len(IDS)], before[: len(IDS)])
    assert np.array_equal(after_first[len(IDS) :], before[len(IDS) :])
    monkeypatch.undo()
    reply = stub.PushBatch(request, timeout=TIMEOUT_S)
    assert (reply.num_applied, reply.step) == (len(NEW_IDS), 1)  # the second push only, then the clock
    after = pull(stub, np.concatenate([IDS, NEW_IDS]))
    assert np.array_equal(after[: len(IDS)], after_first[: len(IDS)])  # the first push is applied once


def test_a_batch_whose_clock_advance_finds_the_disk_full_says_its_pushes_stay(serve, monkeypatch):
    """The pushes are journaled and applied, then RocksDB's write of the clock fails: the refusal says they stay
    applied (PARTLY_APPLIED), so that a client without a client_id knows a retry applies them again."""
    from worker.retry import may_have_run

    server, stub = serve()
    create(stub)
    before = pull(stub, np.concatenate([IDS, NEW_IDS]))
    store = server.shard.store
    monkeypatch.setattr(store._dir, "db", FullRocksDB(store._dir.db, store.path))  # the rows' and the clock's writes
    request = ps_pb2.PushBatchRequest(pushes=[push_request(IDS, 1.0), push_request(NEW_IDS, 1.0)], advance_clock=1)
    e = refused(lambda: stub.PushBatch(request, timeout=TIMEOUT_S))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.details().startswith(
        "the server's disk is full (No space left on device): "
        f"RocksDB in the data dir {store.path} failed while storing the clock at step 1 "
    )
    assert e.details().endswith(
        "and retry; storing the clock advance of the batch failed. The pushes 0 to 1 of the batch were applied and "
        "stay applied, and the clock was not advanced; a retry without a client_id applies them all again"
    )
    assert may_have_run(e)
    assert (pull(stub, np.concatenate([IDS, NEW_IDS])) != before).all() and server.shard.clock == 0


def test_the_client_does_not_retry_a_full_disk(serve, full_journal):
    from ps.config import TableConfig
    from worker.client import Client

    server, _ = serve()
    with Client([f"127.0.0.1:{server.port}"], timeout_s=TIMEOUT_S, server_timeout_s=60) as client:
        client.create_table(TableConfig("t", DIM))
        disk = full_journal()
        with pytest.raises(Exception, match=r"RESOURCE_EXHAUSTED: the server's disk is full") as e:
            client.push("t", IDS, np.ones((len(IDS), DIM), dtype=np.float32))
        assert disk.calls == 2, "the push was sent more than once"
    assert type(e.value).__name__ == "DiskFullError"  # not ReplyTooLargeError, the other RESOURCE_EXHAUSTED


# ---- the journal on its own ----------------------------------------------------------------------------------
def _append(journal: Journal, n: int = 8, value: float = 1.0) -> int:
    ids = np.arange(1, n + 1, dtype="<u8")
    ones = np.ones(n, dtype="<f4")
    return journal.append("t", ids, np.full((n, DIM), value, dtype="<f4"), ones, ones, 0)


def _replayed(directory: str) -> list[tuple[int, float]]:
    journal = Journal(directory)
    out = [(r.seq, float(r.grads[0, 0])) for r in journal.replay(0)]
    journal.close()
    return out


@pytest.mark.parametrize("sync", [False, True])
def test_journal_append_on_a_full_disk(tmp_path, full_journal, monkeypatch, sync):
    journal = Journal(str(tmp_path / "j"), sync=sync)
    list(journal.replay(0))
    assert _append(journal, value=1.0) == 1
    end, written = journal._segment_size, journal.bytes_written
    full_journal()
    with pytest.raises(DiskFullError, match=r"^the server's disk is full \(No space left on device\): the journal in"):
        _append(journal, value=2.0)
    assert (journal.next_seq, journal._segment_size, journal.bytes_written) == (2, end, written)
    assert os.path.getsize(journal._path) == end
    monkeypatch.undo()
    assert _append(journal, value=3.0) == 2
    journal.close()
    assert _replayed(str(tmp_path / "j")) == [(1, 1.0), (2, 3.0)]


def test_journal_fsync_on_a_full_disk_takes_the_record_back(tmp_path, monkeypatch):
    """A file system that reports the full disk at fsync (NFS, thin provisioning): the record is cut off."""
    journal = Journal(str(tmp_path / "j"), sync=True)
    list(journal.replay(0))
    _append(journal, value=1.0)

    real, failures = os.fsync, [1]

    def fsync(fd):
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real(fd)

    monkeypatch.setattr(journal_module.os, "fsync", fsync)
    with pytest.raises(DiskFullError, match=r"\(Disk quota exceeded\): the journal in .*; nothing was applied$"):
        _append(journal, value=2.0)
    assert journal.next_seq == 2 and os.path.getsize(journal._path) == journal._segment_size
    _append(journal, value=3.0)

    failures[0] = 2  # the cut's fsync fails too: the failed record may come back, so the journal stops
    with pytest.raises(StorageError, match=r"could not be cut off \(\[Errno 122\] Disk quota exceeded\); restart"):
        _append(journal, value=4.0)
    with pytest.raises(StorageError, match="could not be cut off"):
        _append(journal, value=5.0)
    monkeypatch.undo()
    journal.close()
    assert _replayed(str(tmp_path / "j")) == [(1, 1.0), (2, 3.0)]


def test_a_short_write_whose_rest_is_written_is_no_error(tmp_path, monkeypatch):
    """A short write for another reason than a full disk (a signal): the rest is written, the append succeeds."""
    journal = Journal(str(tmp_path / "j"))
    list(journal.replay(0))
    real, calls = os.pwritev, []

    def short_once(fd, buffers, offset):
        calls.append(offset)
        if len(calls) == 1:
            return os.pwrite(fd, b"".join(bytes(b) for b in buffers)[:37], offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(Prefaulter, "mapped_end", property(lambda self: 0))
    monkeypatch.setattr(journal_module.os, "pwritev", short_once)
    assert _append(journal, value=1.0) == 1
    assert calls == [0, 37]
    monkeypatch.undo()
    journal.close()
    assert _replayed(str(tmp_path / "j")) == [(1, 1.0)]


# ---- RocksDB: CreateTable and checkpoints --------------------------------------------------------------------
def test_create_table_on_a_full_disk(serve, monkeypatch):
    server, stub = serve()
    create(stub, "t")
    store = server.shard.store
    monkeypatch.setattr(store._dir, "db", FullRocksDB(store._dir.db, store.path))
    e = refused(lambda: create(stub, "u"))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.details() == (
        f"the server's disk is full (No space left on device): RocksDB in the data dir {store.path} failed while "
        f"creating table 'u' (IO error: No space left on device: While appending to file: {store.path}/000004.log: "
        f"No space left on device); free space on the disk of {store.path} (or raise the quota) and retry; the "
        "table was not created"
    )
    e = refused(lambda: stub.DescribeTable(ps_pb2.DescribeTableRequest(table="u"), timeout=TIMEOUT_S))
    assert e.code() == grpc.StatusCode.NOT_FOUND
    monkeypatch.undo()
    create(stub, "u")
    stub.Push(push_request(IDS, 1.0, "u"), timeout=TIMEOUT_S)
    rows = pull(stub, IDS, "u")
    server.stop(grace_s=1)
    _, stub = serve()
    assert np.array_equal(pull(stub, IDS, "u"), rows)


def serving_checkpoints(serve, tmp_path):
    """(root, server, stub): a server whose checkpoint root is tmp_path/root (resolved, as the server resolves it),
    with the test's table created."""
    root = tmp_path / "root"
    root.mkdir()
    root = type(root)(os.path.realpath(root))
    server, stub = serve(root=root)
    create(stub)
    return root, server, stub


def test_a_checkpoint_into_a_full_checkpoint_root(serve, tmp_path, monkeypatch):
    root, server, stub = serving_checkpoints(serve, tmp_path)
    stub.Push(push_request(IDS, 1.0), timeout=TIMEOUT_S)
    rows = pull(stub, IDS)
    seq = server.shard.journal.next_seq

    class FullCheckpoint:
        def __init__(self, db):
            pass

        def create_checkpoint(self, path):
            raise Exception(
                f"IO error: No space left on device: While appending to file: {path}.tmp/000111.sst: "
                "No space left on device"
            )

    monkeypatch.setattr(store_module, "Checkpoint", FullCheckpoint)
    token = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60), timeout=TIMEOUT_S).token
    save = ps_pb2.CheckpointRequest(phase="save", dir="new/c1", token=token)
    e = refused(lambda: stub.Checkpoint(save, timeout=TIMEOUT_S))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    target, data = root / "new" / "c1", server.shard.store.path
    assert e.details() == (
        f"the server's disk is full (No space left on device): RocksDB in the data dir {data} failed while writing "
        f"checkpoint {target}/shard-0 (IO error: No space left on device: While appending to file: "
        f"{target}/shard-0.tmp/000111.sst: No space left on device); free space on the disk of {root} (or raise "
        f"the quota) and retry; the checkpoint was not saved, nothing of it is left in {target}; the shard's rows "
        "are as they were"
    )
    assert list(root.iterdir()) == [], "the failed save left directories in the checkpoint root"
    assert np.array_equal(pull(stub, IDS), rows) and server.shard.journal.next_seq == seq

    monkeypatch.undo()
    stub.Checkpoint(save, timeout=TIMEOUT_S)  # space freed: the same save, under the same hold
    stub.Checkpoint(ps_pb2.CheckpointRequest(phase="release", token=token), timeout=TIMEOUT_S)
    assert (target / "shard-0" / "CURRENT").exists()


def test_a_checkpoint_whose_flush_finds_the_data_disk_full(serve, tmp_path, monkeypatch):
    root, server, stub = serving_checkpoints(serve, tmp_path)
    stub.Push(push_request(IDS, 1.0), timeout=TIMEOUT_S)
    rows = pull(stub, IDS)
    store = server.shard.store
    monkeypatch.setattr(store._dir, "db", FullRocksDB(store._dir.db, store.path))
    token = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60), timeout=TIMEOUT_S).token
    e = refused(lambda: stub.Checkpoint(ps_pb2.CheckpointRequest(phase="save", dir="c1", token=token),
                                        timeout=TIMEOUT_S))  # fmt: skip
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.details().startswith(
        f"the server's disk is full (No space left on device): RocksDB in the data dir {store.path} failed while "
        "writing rows of table 't' (IO error: No space left on device: "
    )
    assert e.details().endswith(
        f"free space on the disk of {store.path} (or raise the quota) and retry; the checkpoint was not saved, "
        f"nothing of it is left in {root / 'c1'}; the shard's rows are as they were"
    )
    assert list(root.iterdir()) == []
    assert np.array_equal(pull(stub, IDS), rows)
    monkeypatch.undo()
    stub.Checkpoint(ps_pb2.CheckpointRequest(phase="save", dir="c1", token=token), timeout=TIMEOUT_S)
    stub.Checkpoint(ps_pb2.CheckpointRequest(phase="release", token=token), timeout=TIMEOUT_S)


def test_a_checkpoint_dir_that_cannot_be_made_on_a_full_disk(serve, tmp_path, monkeypatch):
    root, server, stub = serving_checkpoints(serve, tmp_path)
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if str(path).startswith(str(root)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    token = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60), timeout=TIMEOUT_S).token
    e = refused(lambda: stub.Checkpoint(ps_pb2.CheckpointRequest(phase="save", dir="a/b", token=token),
                                        timeout=TIMEOUT_S))  # fmt: skip
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.details() == (
        f"the server's disk is full (No space left on device): cannot create checkpoint dir {root / 'a' / 'b'}; "
        "free space on that disk (or raise the quota) and retry; nothing was saved"
    )
    monkeypatch.undo()
    stub.Checkpoint(ps_pb2.CheckpointRequest(phase="release", token=token), timeout=TIMEOUT_S)


# ---- the service's one mapping -------------------------------------------------------------------------------
def test_any_other_error_of_a_full_disk_is_resource_exhausted(serve, monkeypatch):
    server, stub = serve()

    def stats():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/somewhere/file")

    monkeypatch.setattr(server.shard, "stats", stats)
    e = refused(lambda: stub.Stats(ps_pb2.StatsRequest(), timeout=TIMEOUT_S))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.details() == (
        "the server's disk is full (No space left on device): Stats failed on the server: OSError: [Errno 28] No "
        "space left on device: '/somewhere/file'; free space on that disk (or raise the quota) and retry"
    )
    assert ("sparseps-error", "DiskFullError") in e.trailing_metadata()  # the client raises DiskFullError
    assert error_fields(e.trailing_metadata()) == {  # with its fields (worker.retry)
        "reason": "No space left on device",
        "what": "Stats failed on the server: OSError: [Errno 28] No space left on device: '/somewhere/file'",
        "disk": "",
        "outcome": "",
        "remedy": "retry",
    }

    def other():
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(server.shard, "stats", other)
    assert refused(lambda: stub.Stats(ps_pb2.StatsRequest(), timeout=TIMEOUT_S)).code() == grpc.StatusCode.INTERNAL


def test_disk_full_reason():
    assert disk_full_reason(OSError(errno.ENOSPC, "x")) == "No space left on device"
    assert disk_full_reason(OSError(errno.EDQUOT, "x")) == "Disk quota exceeded"
    assert disk_full_reason(OSError(errno.EIO, "x")) is None
    assert disk_full_reason(PermissionError(errno.EACCES, "No space left on device")) is None  # errno decides
    assert disk_full_reason(Exception("IO error: No space left on device: /d/000012.log")) == "No space left on device"
    assert disk_full_reason(Exception("IO error: Disk quota exceeded: /d/x.sst")) == "Disk quota exceeded"
    assert disk_full_reason(Exception("Corruption: block checksum mismatch")) is None
    assert DiskFullError.of("No space left on device", "x").status == "RESOURCE_EXHAUSTED"


def test_a_request_stopped_part_way_by_a_stopped_background_writer_keeps_its_remedy_and_outcome():
    """The write-behind's full disk stops its writer until a restart: reworded by partly_applied (a push batch or
    a Shrink stopped part way), the error still says to restart the server, not to retry, and that the writer
    stopped, then what of the request stays."""
    from ps.partlyapplied import partly_applied
    from ps.storage.writebehind import PendingBatch, WriteBehind

    def write(batch):
        raise DiskFullError.of("No space left on device", "RocksDB in /d failed while writing 1 row")

    one = np.zeros(1, dtype=np.uint64)
    wb = WriteBehind(write, max_pending_bytes=1 << 20)
    wb.submit(PendingBatch("t", one, np.zeros((1, 2), np.float32), one, np.ones(1, bool), {}))
    with pytest.raises(DiskFullError) as stopped:
        wb.drain()
    wb.close()
    e = partly_applied(stopped.value, "shrink stopped", "Of the Shrink, table 't' was shrunk whole: those stay",
                       remedy=SHRINK_REMEDY)  # fmt: skip
    assert isinstance(e, DiskFullError) and str(e).endswith(
        "(or raise the quota) and restart the server (its journal replays every acknowledged push); the background "
        "writer of evicted rows stopped there; shrink stopped. Of the Shrink, table 't' was shrunk whole: those stay"
    ), str(e)
    plain = partly_applied(DiskFullError.of("No space left on device", "x"), "shrink stopped", "some stays")
    assert str(plain).endswith("(or raise the quota) and retry; shrink stopped. some stays"), str(plain)
    refused = DiskFullError.of("Disk quota exceeded", "x")
    refused.refused_by = 2  # what a client notes of a shard's refusal
    shrink = partly_applied(refused, "shrink stopped", "some stays", remedy=SHRINK_REMEDY)
    assert str(shrink).endswith(f"(or raise the quota) and {SHRINK_REMEDY}; shrink stopped. some stays"), str(shrink)
    assert (shrink.remedy, shrink.reason, shrink.refused_by) == (SHRINK_REMEDY, "Disk quota exceeded", 2)
    assert (refused.remedy, str(refused).endswith("and retry; nothing was applied")) == ("retry", True)  # a copy


def test_a_server_whose_disk_is_full_at_its_stop_says_so_in_a_line(capsys):
    from ps.server_run import stop_server

    class FullAtStop:
        def stop(self):
            raise DiskFullError.of("No space left on device", "RocksDB in /data failed while writing rows",
                                   outcome="", remedy="restart the server")  # fmt: skip

    assert stop_server(FullAtStop(), 3) == 1
    err = capsys.readouterr().err
    assert err.startswith("ps-server shard 3: stopped without writing its last rows to RocksDB: the server's disk is")
    assert err.rstrip().endswith("Every acknowledged push is in its journal, replayed at the next start once the disk "
                                 "has room")  # fmt: skip


def test_a_background_flush_that_keeps_failing_is_told_once_and_its_recovery_too(tmp_path, caplog):
    """A full disk fails every flush until space is freed: one ERROR line with the cause (no traceback: the
    message says it), not one per interval, then a line when a flush succeeds again."""
    from ps.engine.shard import Shard
    from tests.waiting import wait_until

    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), flush_interval_s=0.02))
    real, calls = shard.flush, []

    def flush(background=False):
        calls.append(1)
        if len(calls) <= 5:
            raise DiskFullError.of("No space left on device", "a flush of 10 rows", outcome="")
        return real(background)

    shard.flush = flush
    try:
        with caplog.at_level("INFO", "ps.engine.shard"):
            wait_until(lambda: "background flush succeeded" in caplog.text, 30, "the flush's recovery")
    finally:
        shard.close()
    told = [r for r in caplog.records if "background flush" in r.getMessage()]
    assert [r.levelname for r in told] == ["ERROR", "WARNING"] and not told[0].exc_info, told
    assert told[0].getMessage().startswith("background flush failed: the server's disk is full")
    assert told[1].getMessage().startswith("background flush succeeded after 5 failed attempts over ")


class _CloseFindsTheDiskFull:
    """A RocksDB whose close (its last WAL write) finds the disk full, after closing for real."""

    def __init__(self, db):
        self.db = db

    def close(self):
        self.db.close()
        raise Exception("IO error: No space left on device: While appending to file: /data/000004.log")

    def __getattr__(self, name):
        return getattr(self.db, name)


def test_a_stop_whose_flush_and_close_both_find_the_disk_full_reports_the_flush(tmp_path, caplog):
    """The stop's error is its flush's DiskFullError (what ps-server prints as a line), not RocksDB's close error
    raised in its place; the close's is logged, and the data dir opens again."""
    from ps.engine.shard import Shard

    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))

    def flush(background=False):
        raise DiskFullError.of("No space left on device", "the final flush of 10 rows", outcome="")

    shard.flush = flush
    shard.store._dir.db = _CloseFindsTheDiskFull(shard.store._dir.db)
    with caplog.at_level("WARNING", "ps.engine.shard"), pytest.raises(DiskFullError, match="the final flush of 10"):
        shard.close()
    assert "closing RocksDB failed too" in caplog.text and "No space left on device" in caplog.text
    Shard(ServerConfig(data_dir=str(tmp_path / "d"))).close()


def test_a_store_whose_close_finds_the_disk_full_says_so(tmp_path):
    from ps.storage.store import Store

    store = Store(str(tmp_path / "rows"))
    store._dir.db = _CloseFindsTheDiskFull(store._dir.db)
    with pytest.raises(DiskFullError, match=r"closing RocksDB.*the rows it did not write are in the journal"):
        store.close()
    store.close()  # closed all the same: a second close does nothing


@pytest.mark.parametrize("restoring", [False, True])
def test_a_close_that_finds_the_disk_full_says_what_recovers_the_unwritten_part(tmp_path, restoring):
    """RocksDB's close failing on a full disk: the rows it did not write are in the journal, unless a restore was
    in progress (its restore_pending mark set): then the same --restore starts it over, and the journal holds none
    of the checkpoint's rows."""
    store = store_module.Store(str(tmp_path / "d"))
    if restoring:
        store.meta.set_restore_pending("/checkpoints/c1")
    store._dir.db = _CloseFindsTheDiskFull(store._dir.db)
    with pytest.raises(DiskFullError) as caught:
        store.close()
    said = str(caught.value)
    if restoring:
        assert "the restore from /checkpoints/c1 did not finish: a start with the same --restore starts it over" in (
            said
        ), said
        assert "journal" not in said, said
    else:
        assert "the rows it did not write are in the journal, replayed at the next start" in said, said

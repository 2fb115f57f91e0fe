"""A journal segment, or the whole data dir, deleted (or the dir replaced) under a running server: the server
finds it within about a second (the journal mark's thread: ps.storage.journal.Journal.check_intact), logs one
ERROR line saying what happened, refuses every later write with FAILED_PRECONDITION (nothing applied), answers
Stats with that refusal, and reports NOT_SERVING. A deleted segment's pushes are flushed to RocksDB, so a SIGTERM
then a start keeps every acknowledged push; a deleted data dir makes SIGTERM exit 1 with a message, no traceback.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import threading

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps.errors import DataDirLostError
from ps.health import check_health
from ps.server import Server
from ps.server_config import ServerConfig
from ps.storage.journal import Journal
from tests.conftest import stop_servers
from tests.server_process import ServerProcess
from tests.test_metrics import scrape
from tests.waiting import wait_until

TIMEOUT_S = 30
COMPILE_S = 120  # a call that may compile kernels first (a cold numba cache, a loaded host)
DIM = 4
FOUND_S = 10  # the check runs about once a second; generous on a loaded machine


def remove_under_a_running_server(path) -> None:
    """rm -rf path while its server writes and renames files in it (a journal mark's temporary file renamed
    between the listing and its unlink): tried again until the folder is gone."""
    for _ in range(100):
        if not os.path.lexists(path):
            return
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:  # a file renamed or removed meanwhile
            continue
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:  # a file created meanwhile
                raise
    raise AssertionError(f"{path} could not be removed under its server")


def push_request(ids, value: float) -> ps_pb2.PushRequest:
    grads = np.full((len(ids), DIM), value, dtype="<f4")
    return ps_pb2.PushRequest(table="t", ids=np.asarray(ids, "<u8").tobytes(), grads=grads.tobytes(), dim=DIM)


def pull(stub, ids) -> np.ndarray:
    reply = stub.Pull(ps_pb2.PullRequest(table="t", ids=np.asarray(ids, "<u8").tobytes()), timeout=TIMEOUT_S)
    return np.frombuffer(reply.rows, dtype="<f4").reshape(len(ids), DIM).copy()


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


@pytest.fixture
def serve(tmp_path):
    """start(data dir) -> (server, stub, address) of an in-process server; all stopped at the end."""
    running = []

    def start(data_dir):
        server = Server(ServerConfig(data_dir=str(data_dir), port=0, flush_interval_s=3600.0, metrics_port=0))
        port = server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        running.append((server, channel))
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        stub.CreateTable(ps_pb2.CreateTableRequest(spec=ps_pb2.TableSpec(name="t", dim=DIM)), timeout=TIMEOUT_S)
        return server, stub, f"127.0.0.1:{port}"

    yield start
    stop_servers(running)


def not_serving(address: str) -> bool:
    """Whether health says NOT_SERVING, saying why (not starting: `ps-server health --starting-ok` fails too)."""
    health = check_health(address)
    return not health.serving and not health.starting and "was deleted" in health.text


def test_a_deleted_segment_stops_every_write_and_a_sigterm_keeps_every_acknowledged_push(serve, tmp_path, caplog):
    data_dir = tmp_path / "d"
    server, stub, address = serve(data_dir)
    ids = np.arange(1, 65, dtype=np.uint64)
    acked = 0  # pushes acknowledged, by the thread below, until the refusals come
    outcomes: list[str] = []
    stop = threading.Event()

    def pusher() -> None:  # pushes while the segment is deleted: the last acknowledged ones must be kept too
        nonlocal acked
        while not stop.is_set():
            try:
                stub.Push(push_request(ids, 0.01), timeout=TIMEOUT_S)
                acked += 1
                outcomes.append("OK")
            except grpc.RpcError as e:
                outcomes.append(e.code().name)

    before = pull(stub, ids)
    thread = threading.Thread(target=pusher)
    with caplog.at_level(logging.INFO):
        thread.start()
        wait_until(lambda: acked >= 20, TIMEOUT_S, "pushes before the deletion")
        for name in os.listdir(data_dir / "journal"):
            os.remove(data_dir / "journal" / name)
        wait_until(lambda: not_serving(address), FOUND_S, "health to say NOT_SERVING")
        said = check_health(address).text  # to a caller without the token: what was deleted, not where
        assert said.startswith("NOT_SERVING: shard 0 takes no writes: its journal segment was deleted"), said
        assert str(tmp_path) not in said and "journal" + os.sep not in said, said
        wait_until(lambda: outcomes and outcomes[-1] != "OK", FOUND_S, "the refusals")
        seq = server.shard.journal.next_seq
        wait_until(lambda: len(outcomes) > outcomes.index("FAILED_PRECONDITION") + 20, TIMEOUT_S, "more refusals")
        stop.set()
        thread.join(TIMEOUT_S)
    first = outcomes.index("FAILED_PRECONDITION")
    assert set(outcomes[first:]) == {"FAILED_PRECONDITION"}, outcomes[first:]  # none acknowledged after
    assert server.shard.journal.next_seq == seq  # nothing journaled after the refusals began
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("ps.")]
    errors = [m for m in errors if "rejected" not in m]  # the servicer's lines for each refused call
    assert len(errors) == 1 and "was deleted under the running server" in errors[0], errors
    assert not [r for r in caplog.records if "cannot write the journal mark" in r.getMessage()]

    e = refused(lambda: stub.Push(push_request(ids, 1.0), timeout=TIMEOUT_S))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "journal segment" in e.details() and "was deleted under the running server" in e.details()
    assert "could not be kept" in e.details() and e.details().endswith("nothing was applied"), e.details()
    for call in (
        lambda: stub.AdvanceClock(ps_pb2.AdvanceClockRequest(steps=1), timeout=TIMEOUT_S),
        lambda: stub.CreateTable(ps_pb2.CreateTableRequest(spec=ps_pb2.TableSpec(name="u", dim=DIM)), timeout=9),
        lambda: stub.Stats(ps_pb2.StatsRequest(), timeout=TIMEOUT_S),
    ):
        e = refused(call)
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "was deleted under" in e.details(), e.details()
    rows = pull(stub, ids)  # pulls go on, and the refused pushes changed nothing
    assert not np.array_equal(rows, before)
    wait_until(lambda: server.shard.flusher.failures == 0 and server.shard.journal._fd < 0, TIMEOUT_S,
               "the flush started when the deletion was found")  # fmt: skip

    server.stop(grace_s=1)  # a clean stop: every acknowledged push is in RocksDB
    _, stub2, _ = serve(data_dir)
    np.testing.assert_array_equal(pull(stub2, ids), rows)


def test_a_data_dir_replaced_under_a_running_server_is_found(serve, tmp_path):
    data_dir = tmp_path / "d"
    server, stub, address = serve(data_dir)
    stub.Push(push_request([1, 2, 3], 0.5), timeout=TIMEOUT_S)
    os.rename(data_dir, tmp_path / "moved")
    os.mkdir(data_dir)  # same path, another directory: the journal's segment is still linked, in "moved"
    wait_until(lambda: not_serving(address), FOUND_S, "health to say NOT_SERVING")
    said = check_health(address).text
    assert said.startswith("NOT_SERVING: shard 0 takes no writes: its data dir was deleted or replaced"), said
    assert str(tmp_path) not in said, said
    e = refused(lambda: stub.Push(push_request([1, 2, 3], 0.5), timeout=TIMEOUT_S))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"its data dir {data_dir} was deleted or replaced under the running server" in e.details(), e.details()
    assert "pushes since" in e.details() and "Restart the server on an intact data dir" in e.details()
    m = scrape(server.metrics_port)  # the gauge says why the shard's figures are gone; the process's stay
    assert m[("sparseps_data_dir_lost", ())] == 1 and m[("sparseps_shard_broken", ())] == 0
    assert m[("process_resident_memory_bytes", ())] > 0
    assert not [k for k in m if k[0].startswith("sparseps_table") or k[0] == "sparseps_clock"], sorted(m)
    with pytest.raises(DataDirLostError, match="stopped without writing its last rows"):
        server.stop(grace_s=1)


def test_a_data_dir_deleted_under_a_server_process(tmp_path):
    """rm -rf DATA of a server process: refusals, Stats says why (not INTERNAL), health NOT_SERVING, no warning
    a second, and SIGTERM exits 1 with a message and no traceback."""
    data_dir = tmp_path / "d"
    server = ServerProcess(data_dir, "--flush-interval-s", "0.5")
    address = server.started()
    try:
        channel = grpc.insecure_channel(address)
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        stub.CreateTable(ps_pb2.CreateTableRequest(spec=ps_pb2.TableSpec(name="t", dim=DIM)), timeout=TIMEOUT_S)
        for _ in range(5):  # the first may compile the push kernels (a cold numba cache): COMPILE_S
            stub.Push(push_request(np.arange(1, 100), 0.1), timeout=COMPILE_S)
        remove_under_a_running_server(data_dir)
        wait_until(lambda: not_serving(address), FOUND_S, "health to say NOT_SERVING")
        e = refused(lambda: stub.Push(push_request([1, 2], 0.1), timeout=TIMEOUT_S))
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
        assert "was deleted or replaced under the running server" in e.details(), e.details()
        e = refused(lambda: stub.Stats(ps_pb2.StatsRequest(), timeout=TIMEOUT_S))
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "was deleted or replaced" in e.details(), e
        wait_until(lambda: "takes no more writes" in server.output(), FOUND_S, "the ERROR line")
        threading.Event().wait(2.5)  # a few of the mark thread's and the flusher's turns
        channel.close()
    finally:
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(60)
    out = server.output()
    assert code == 1, out
    assert "Traceback" not in out and "found damage" not in out, out
    assert "cannot write the journal mark" not in out, out  # a failed write checks first: the dir is gone
    assert out.count("the data dir") >= 1 and "stopped without writing its last rows to RocksDB" in out, out
    assert len([line for line in out.splitlines() if " ERROR " in line and "rejected" not in line]) <= 2, out


def test_journal_check_intact(tmp_path):
    """The journal alone: a deleted segment is found by check_intact, appends are refused from then on (no record
    taken), and the mark is still written (the data dir is there); a check of an intact journal changes nothing."""
    data_dir = tmp_path / "d"
    os.mkdir(data_dir)
    journal = Journal(str(data_dir / "journal"), mark_path=str(data_dir / "journal-mark.json"))
    list(journal.replay(0))
    told = []
    journal.on_lost = lambda: told.append(journal.lost)
    ids, grads = np.arange(3, dtype="<u8"), np.ones((3, 2), "<f4")
    shows, clicks = np.ones(3, "<f4"), np.zeros(3, "<f4")
    assert journal.append("t", ids, grads, shows, clicks, 0) == 1
    assert journal.check_intact() and not journal.lost and not told and not journal.seems_lost()
    os.remove(journal._path)
    assert journal.seems_lost() and not journal.lost and not told  # seen, nothing changed (a signal handler's look)
    assert journal.check_intact()  # the data dir is still there: the mark can be written
    assert "journal segment" in journal.lost and not journal.dir_gone and len(told) == 1
    with pytest.raises(DataDirLostError, match="was deleted under the running server"):
        journal.append("t", ids, grads, shows, clicks, 0)
    assert journal.next_seq == 2
    journal.check_intact()
    assert len(told) == 1  # told once
    journal.close()


def test_a_kill_after_a_deleted_segment_is_found_and_flushed_loses_no_acknowledged_push(tmp_path):
    """The audit's case: `rm -f DATA/journal/*` under a server process, then kill -9. Before, the pushes went into
    the unlinked file and the restart refused (journal records missing); now the server stops acknowledging, writes
    what it acknowledged to RocksDB, says so, and a restart after a kill has every acknowledged push."""
    data_dir = tmp_path / "d"
    server = ServerProcess(data_dir)  # flushes every 30 s: only the one the detection starts comes into play
    address = server.started()
    ids = np.arange(1, 200, dtype=np.uint64)
    try:
        with grpc.insecure_channel(address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            stub.CreateTable(ps_pb2.CreateTableRequest(spec=ps_pb2.TableSpec(name="t", dim=DIM)), timeout=TIMEOUT_S)
            stub.Push(push_request(ids, 0.01), timeout=COMPILE_S)  # the first segment: made by the first push
            for name in os.listdir(data_dir / "journal"):
                os.remove(data_dir / "journal" / name)
            while True:  # pushes until refused: the ones acknowledged went into the deleted segment, as the first
                try:
                    stub.Push(push_request(ids, 0.01), timeout=TIMEOUT_S)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
                    break
            rows = pull(stub, ids)
            wait_until(lambda: "is in RocksDB now" in server.output(), FOUND_S, "the flush of the deleted segment")
            assert not_serving(address)
    finally:
        server.stop(signal.SIGKILL)
    restarted = ServerProcess(data_dir)
    address = restarted.started()
    assert address is not None, restarted.output()
    try:
        with grpc.insecure_channel(address) as channel:
            np.testing.assert_array_equal(pull(ps_pb2_grpc.ParameterServerStub(channel), ids), rows)
    finally:
        restarted.stop_cleanly()

"""What a hostile or careless caller can no longer do to a shard, through gRPC and the CLI (issue 16, items 1 and
4-7): carry the clock out of range (also by racing a batch's advance), hold pushes with a NaN timeout, write
checkpoints outside the operator's root, stop another client's pushes with a forged sequence number, push counts
that overflow the admission hash, or overflow gRPC's trailer with a long name; nor can a server's trailers make a
client read a refusal's fields as other than text. Each rejected request gets a precise status, never INTERNAL, and
changes nothing; a clock the disk did not take is not kept either."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps.config import MAX_CLOCK
from ps.server import Server
from ps.server_config import ServerConfig
from tests.rpc_errors import RefusedCall

SUM_SPEC = ps_pb2.TableSpec(  # zeros and SGD with lr 1: a row is minus the sum of its grads
    name="sum",
    dim=2,
    initializer=ps_pb2.InitializerSpec(name="zeros", scale=0.0),
    optimizer=ps_pb2.OptimizerSpec(name="sgd", learning_rate=1.0),
)
IDS = np.arange(1, 9, dtype=np.uint64)
TIMEOUT_S = 30


@pytest.fixture
def serve(tmp_path):
    """Factory: an in-process shard on 127.0.0.1 (port 0) with the given ServerConfig fields; stopped at teardown.
    Returns (Server, stub)."""
    started = []

    def start(data_dir=None, **fields) -> tuple[Server, ps_pb2_grpc.ParameterServerStub]:
        server = Server(ServerConfig(data_dir=str(data_dir or tmp_path / "d"), port=0, **fields))
        started.append(server)
        port = server.start()
        if fields.get("tls_cert"):
            return server, None
        return server, ps_pb2_grpc.ParameterServerStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

    yield start
    for s in started:
        try:
            s.stop(grace_s=1)
        except Exception:  # stopped by the test already
            pass


def refused(call, request) -> tuple[grpc.StatusCode, str]:
    """(status code, details) of a call that must fail."""
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=TIMEOUT_S)
    return e.value.code(), e.value.details() or ""


def push_request(grads: float, ids=IDS) -> ps_pb2.PushRequest:
    grads = np.full((len(ids), 2), grads, dtype="<f4")
    return ps_pb2.PushRequest(table="sum", ids=ids.astype("<u8").tobytes(), grads=grads.tobytes(), dim=2)


def rows(stub, ids=IDS) -> np.ndarray:
    reply = stub.Pull(ps_pb2.PullRequest(table="sum", ids=ids.astype("<u8").tobytes()), timeout=TIMEOUT_S)
    return np.frombuffer(reply.rows, dtype="<f4").reshape(len(ids), 2)


def clock(stub) -> int:
    return stub.Stats(ps_pb2.StatsRequest(), timeout=TIMEOUT_S).clock


def test_a_clock_advance_out_of_range_is_refused_and_the_shard_works_on_across_a_restart(tmp_path, serve):
    server, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    assert stub.AdvanceClock(ps_pb2.AdvanceClockRequest(steps=3), timeout=TIMEOUT_S).step == 3
    for steps in (2**64 - 1, 2**63, 2**63, 2**41):
        code, details = refused(stub.AdvanceClock, ps_pb2.AdvanceClockRequest(steps=steps))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "out of range" in details, (steps, code, details)
    batch = ps_pb2.PushBatchRequest(pushes=[push_request(1.0)], advance_clock=2**64 - 2, client_id=5, seq=1)
    code, details = refused(stub.PushBatch, batch)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "nothing was applied" in details
    assert (rows(stub) == 0).all() and clock(stub) == 3  # the push of the refused batch was not applied
    stub.Push(push_request(1.0), timeout=TIMEOUT_S)
    assert clock(stub) == 3 and (rows(stub) == -1).all()
    server.stop(grace_s=1)

    _, stub = serve(data_dir=tmp_path / "d")  # the clock is saved: the restarted shard must work as well
    assert clock(stub) == 3 and (rows(stub) == -1).all()
    reply = stub.PushBatch(ps_pb2.PushBatchRequest(pushes=[push_request(1.0)], advance_clock=2), timeout=TIMEOUT_S)
    assert reply.step == 5 and (rows(stub) == -2).all()


def test_a_saved_clock_out_of_range_is_refused_at_start_with_a_clear_error(tmp_path, serve):
    server, stub = serve()
    stub.AdvanceClock(ps_pb2.AdvanceClockRequest(steps=7), timeout=TIMEOUT_S)
    server.shard.store.meta.set_clock(2**64 + 5)  # as a server that took any advance left its data dir
    server.stop(grace_s=1)
    # no --stop-with-stdin with stdin closed: that would stop the start before its refusal (a server that did
    # start would run into the timeout, failing the test)
    r = subprocess.run([sys.executable, "-m", "ps", "--data-dir", str(tmp_path / "d")], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert (
        "meta key clock holds b'18446744073709551621', which does not read as its value (ValueError: "
        "18,446,744,073,709,551,621 is past the largest clock a shard takes, 1,099,511,627,776" in r.stderr
    ), r.stderr
    assert "Traceback" not in r.stderr


def test_a_batchs_clock_advance_is_reserved_before_its_pushes_are_applied(serve, monkeypatch):
    """An AdvanceClock arrives while a PushBatch's push is being applied, and the two together would carry the
    clock past MAX_CLOCK: the AdvanceClock is refused, and the batch applies with its advance."""
    server, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    shard, raced = server.shard, []
    apply_push = shard.apply_push

    def apply_then_advance(*args, **kwargs):
        apply_push(*args, **kwargs)
        with pytest.raises(grpc.RpcError) as e:
            stub.AdvanceClock(ps_pb2.AdvanceClockRequest(steps=1), timeout=TIMEOUT_S)
        raced.append((e.value.code(), e.value.details()))

    monkeypatch.setattr(shard, "apply_push", apply_then_advance)
    batch = ps_pb2.PushBatchRequest(pushes=[push_request(1.0)], advance_clock=MAX_CLOCK, client_id=5, seq=1)
    reply = stub.PushBatch(batch, timeout=TIMEOUT_S)
    assert (reply.num_applied, reply.step) == (len(IDS), MAX_CLOCK)
    ((code, details),) = raced
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "reserved by batches in flight" in details, details
    assert clock(stub) == MAX_CLOCK and (rows(stub) == -1).all()


def test_a_clock_that_cannot_be_stored_is_not_kept(serve, monkeypatch):
    server, stub = serve()
    store = server.shard.store

    def disk_gone(step: int, advanced_by=None) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(store.meta, "set_clock", disk_gone)
    code, _ = refused(stub.AdvanceClock, ps_pb2.AdvanceClockRequest(steps=5))
    assert code == grpc.StatusCode.INTERNAL and clock(stub) == 0
    monkeypatch.undo()
    assert stub.AdvanceClock(ps_pb2.AdvanceClockRequest(steps=1), timeout=TIMEOUT_S).step == 1
    assert store.meta.clock() == 1


def test_shows_and_clicks_past_2_24_per_id_are_refused(serve):
    """Counts that large would overflow the admission hash's uint64(show * 16); 2**24 itself is taken."""
    _, stub = serve()
    spec = ps_pb2.TableSpec()
    spec.CopyFrom(SUM_SPEC)
    spec.admission.min_count, spec.admission.probability = 2, 0.5  # admission by hash of (id, show)
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=spec), timeout=TIMEOUT_S)
    before = stub.Stats(ps_pb2.StatsRequest(), timeout=TIMEOUT_S).tables[0]
    for field in ("shows", "clicks"):
        for count in (2.0**25, 1e30, 3e38):
            request = push_request(1.0)
            setattr(request, field, np.full(len(IDS), count, dtype="<f4").tobytes())
            code, details = refused(stub.Push, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (field, count, code, details)
            assert f"{field} for table 'sum' may be at most 16,777,216 per id" in details, details
    after = stub.Stats(ps_pb2.StatsRequest(), timeout=TIMEOUT_S).tables[0]
    assert (after.num_rows, after.pending_ids) == (before.num_rows, before.pending_ids) == (0, 0)
    request = push_request(1.0)
    request.shows = np.full(len(IDS), 2.0**24, dtype="<f4").tobytes()
    assert stub.Push(request, timeout=TIMEOUT_S).num_applied == len(IDS)


def test_a_hold_with_a_bad_timeout_is_refused_and_holds_nothing(serve):
    _, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    for timeout_s in (math.nan, math.inf, -math.inf, -1.0, 3600.5, 1e308):
        code, details = refused(stub.Checkpoint, ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=timeout_s))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "hold_timeout_s must be finite" in details, timeout_s
        stub.Push(push_request(1.0), timeout=TIMEOUT_S)  # not held
    assert (rows(stub) == -6).all()
    token = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold"), timeout=TIMEOUT_S).token  # 0: the default
    code, _ = refused(stub.Push, push_request(1.0))
    assert code == grpc.StatusCode.UNAVAILABLE  # a valid hold holds
    stub.Checkpoint(ps_pb2.CheckpointRequest(phase="release", token=token), timeout=TIMEOUT_S)
    stub.Push(push_request(1.0), timeout=TIMEOUT_S)
    assert (rows(stub) == -7).all()


def test_checkpoint_save_is_refused_on_a_server_without_a_checkpoint_root(tmp_path, serve):
    _, stub = serve()
    token = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60), timeout=TIMEOUT_S).token
    try:
        for target in (tmp_path / "ckpt", tmp_path / "a" / "b"):
            code, details = refused(stub.Checkpoint, ps_pb2.CheckpointRequest(phase="save", dir=str(target),
                                                                              token=token))  # fmt: skip
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "--checkpoint-root DIR" in details, details
            assert not target.exists()
    finally:
        stub.Checkpoint(ps_pb2.CheckpointRequest(phase="release", token=token), timeout=TIMEOUT_S)


def has_checkpoint_root() -> bool:
    return "checkpoint_root" in {f.name for f in dataclasses.fields(ServerConfig)}


def test_checkpoints_are_written_only_inside_the_root(tmp_path, serve):
    assert has_checkpoint_root(), "the operator cannot confine checkpoints: ServerConfig has no checkpoint_root"
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "a-file").write_text("not a directory")
    _, stub = serve(checkpoint_root=str(root))
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    stub.Push(push_request(1.0), timeout=TIMEOUT_S)
    token = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60), timeout=TIMEOUT_S).token

    def save(directory: str, timeout: float = TIMEOUT_S):
        return stub.Checkpoint(ps_pb2.CheckpointRequest(phase="save", dir=directory, token=token), timeout=timeout)

    try:
        for bad in ("../outside/c", "x/../../outside/c", str(outside / "c"), "link/c", str(root / "link" / "c"), ".",
                    str(root), "", "/", "c\0d"):  # fmt: skip
            code, details = refused(save, bad)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (bad, code, details)
            assert "checkpoint root" in details, (bad, details)
        code, details = refused(save, "a-file/c")  # a directory that cannot be created
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "cannot create checkpoint dir" in details, details
        assert os.listdir(outside) == [] and sorted(os.listdir(root)) == ["a-file", "link"]

        assert save("runs/1").clock == 0  # relative to the root
        assert save(str(root / "runs" / "2")).clock == 0  # or absolute inside it
        assert sorted(os.listdir(root / "runs")) == ["1", "2"]
        assert "shard-0" in os.listdir(root / "runs" / "1") and "shard-0" in os.listdir(root / "runs" / "2")
        code, details = refused(save, "runs/1")
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "exists already" in details
        kept = sorted(os.listdir(root / "runs" / "1" / "shard-0"))
        for nested in ("runs/1/shard-0", "runs/1/shard-0/x/y"):  # inside a checkpoint's RocksDB directory
            code, details = refused(save, nested)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "is inside" in details, (nested, details)
        assert sorted(os.listdir(root / "runs" / "1" / "shard-0")) == kept

        # saves to one directory at once (a retry after a client's deadline): one is saved, the others refused
        def attempt(_) -> str:
            try:
                save("runs/3")
                return "saved"
            except grpc.RpcError as e:
                return f"{e.code().name}: {e.details()}"

        with ThreadPoolExecutor(4) as pool:
            outcomes = sorted(pool.map(attempt, range(4)))
        assert outcomes[-1] == "saved" and all(
            o.startswith("INVALID_ARGUMENT: checkpoint dir") and "exists already" in o for o in outcomes[:-1]
        ), outcomes
    finally:
        stub.Checkpoint(ps_pb2.CheckpointRequest(phase="release", token=token), timeout=TIMEOUT_S)
    assert os.listdir(outside) == []


def test_a_checkpoint_dir_with_control_characters_is_refused_and_forges_no_log_line(tmp_path, serve, caplog):
    """A save to a dir whose name holds a line break, a terminal escape or another character that does not print is
    refused (INVALID_ARGUMENT), making no directory: the name would reach the server's log as it is (a line break
    starts a forged log line), and every listing and tool that prints the checkpoint's path."""
    root = tmp_path / "root"
    root.mkdir()
    _, stub = serve(checkpoint_root=str(root))
    token = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60), timeout=TIMEOUT_S).token
    forged = "2026-01-01 00:00:00,000 ERROR ps.engine.shard: forged"
    try:
        with caplog.at_level("INFO"):
            for bad in (f"c\n{forged}", "c\r1", "c\x1b[2J", "c\t1", "c\x7f", "c\u2028x", "c\x85", "ok/c\nx"):
                request = ps_pb2.CheckpointRequest(phase="save", dir=bad, token=token)
                code, details = refused(stub.Checkpoint, request)
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "is not a usable path" in details, (bad, details)
                assert ascii(bad) in details and "\n" not in details, details
        assert os.listdir(root) == []
        logged = [r.getMessage() for r in caplog.records]
        assert any("is not a usable path" in m for m in logged) and not [m for m in logged if "\n" in m], logged
        save = ps_pb2.CheckpointRequest(phase="save", dir="runs/\u00e9t\u00e9 1", token=token)  # prints: saved
        assert stub.Checkpoint(save, timeout=TIMEOUT_S).clock == 0
        assert os.listdir(root / "runs") == ["\u00e9t\u00e9 1"]
    finally:
        stub.Checkpoint(ps_pb2.CheckpointRequest(phase="release", token=token), timeout=TIMEOUT_S)


def batch(client_id: int, seq: int, grads: float) -> ps_pb2.PushBatchRequest:
    return ps_pb2.PushBatchRequest(pushes=[push_request(grads)], client_id=client_id, seq=seq)


def test_a_forged_sequence_number_cannot_stop_another_clients_pushes(serve):
    _, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    victim = 0x5EED_1234_ABCD_0001
    assert stub.PushBatch(batch(victim, 1, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)
    for seq in (2**64 - 1, 2 + 2**20):  # far ahead of the victim's newest request
        code, details = refused(stub.PushBatch, batch(victim, seq, 100.0))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "ahead of this client's newest request" in details
    assert (rows(stub) == -1).all()
    assert stub.PushBatch(batch(victim, 2, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)  # applied, and says so
    assert (rows(stub) == -2).all()
    assert stub.PushBatch(batch(victim, 2, 1.0), timeout=TIMEOUT_S).num_applied == 0  # a retry: applied before
    assert stub.PushBatch(batch(victim, 1, 1.0), timeout=TIMEOUT_S).num_applied == 0  # an old one, late
    assert (rows(stub) == -2).all()
    assert stub.PushBatch(batch(victim, 2 + 2**20, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)  # at the bound
    assert (rows(stub) == -3).all()
    assert stub.PushBatch(batch(0x77, 2**40, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)  # new to the shard
    assert (rows(stub) == -4).all()


def test_a_request_answered_as_applied_before_is_still_refused_when_it_repeats_ids(serve):
    """An old or retried request (its seq applied) applies nothing, but a malformed one is refused as a new one
    is, whatever its seq: a push that repeats an id, alone in its batch or not."""
    _, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    client = 0xD0D0
    for seq in (1, 2):
        assert stub.PushBatch(batch(client, seq, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)
    repeated = push_request(1.0, ids=np.array([3, 4, 3], dtype=np.uint64))
    for seq in (1, 2, 3):  # older, the newest (a retry), and new
        for pushes in ([repeated], [push_request(1.0), repeated]):
            request = ps_pb2.PushBatchRequest(pushes=pushes, client_id=client, seq=seq)
            code, details = refused(stub.PushBatch, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "repeats id" in details, (seq, len(pushes), details)
    assert (rows(stub) == -2).all() and clock(stub) == 0
    assert stub.PushBatch(batch(client, 1, 1.0), timeout=TIMEOUT_S).num_applied == 0  # well formed: applied before
    assert (rows(stub) == -2).all()


def test_a_request_answered_as_applied_before_is_still_refused_when_its_clock_advance_is_out_of_range(serve):
    """An old or retried request (its seq applied) whose clock advance no clock could take (past MAX_CLOCK) is
    refused as a new one is; a retry of a request whose advance brought the clock to MAX_CLOCK is not: its advance
    is checked against MAX_CLOCK alone, not against the clock it moved."""
    _, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    client = 0xADC0
    first = ps_pb2.PushBatchRequest(pushes=[push_request(1.0)], advance_clock=1, client_id=client, seq=1)
    assert stub.PushBatch(first, timeout=TIMEOUT_S).num_applied == len(IDS)
    assert stub.PushBatch(batch(client, 2, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)
    for seq, advance in ((1, 2**64 - 1), (1, MAX_CLOCK + 1), (2, 2**64 - 1)):  # older (advance applied); a retry
        request = ps_pb2.PushBatchRequest(pushes=[push_request(1.0)], advance_clock=advance, client_id=client, seq=seq)
        code, details = refused(stub.PushBatch, request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "out of range" in details, (seq, advance, code, details)
    assert (rows(stub) == -2).all() and clock(stub) == 1
    to_the_top = ps_pb2.PushBatchRequest(advance_clock=MAX_CLOCK - 1, client_id=client, seq=3)
    assert stub.PushBatch(to_the_top, timeout=TIMEOUT_S).step == MAX_CLOCK
    assert stub.PushBatch(to_the_top, timeout=TIMEOUT_S).step == MAX_CLOCK  # its retry: applied before, not refused
    assert (rows(stub) == -2).all()


def test_a_client_id_with_its_top_bit_set_is_a_client_of_its_own(serve):
    """The top bit of a key is the server's (the jobs' sync sums), but a client_id with it set is not masked into
    the key of the id without it, whose requests would then drop its pushes as retries: each is applied, once."""
    _, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    assert stub.PushBatch(batch(1, 5, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)
    for k, client_id in enumerate(((1 << 63) | 1, 1 << 63, 2**64 - 1), start=2):
        assert stub.PushBatch(batch(client_id, 1, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)
        assert stub.PushBatch(batch(client_id, 1, 1.0), timeout=TIMEOUT_S).num_applied == 0  # a retry
        assert (rows(stub) == -k).all()


def test_an_advance_alone_counts_as_a_clients_request(serve):
    """A client whose requests to a shard carry only clock advances for a long time (the shard holds none of its
    ids) is not refused when it pushes again: its advances count as its requests, and a retried one applies once."""
    _, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    client = 0xC0FFEE
    assert stub.PushBatch(batch(client, 1, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)
    for seq in (2, 2 + 2**20, 2 + 2 * 2**20):
        advance = ps_pb2.PushBatchRequest(advance_clock=1, client_id=client, seq=seq)
        assert stub.PushBatch(advance, timeout=TIMEOUT_S).num_applied == 0
    assert stub.PushBatch(advance, timeout=TIMEOUT_S).step == 3  # sent again: not applied again
    assert stub.PushBatch(batch(client, 3 + 2 * 2**20, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)
    assert (rows(stub) == -2).all() and clock(stub) == 3


def test_a_client_id_with_seq_0_is_refused_not_half_applied(serve):
    """Requests of a client are numbered from 1: seq 0 would read as applied before, its clock advance dropped
    while its pushes went in. Refused, changing nothing; the same request numbered 1 applies whole."""
    _, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    for request in (ps_pb2.PushBatchRequest(advance_clock=5, client_id=11, seq=0), batch(12, 0, 1.0)):
        request.advance_clock = 5
        code, details = refused(stub.PushBatch, request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "numbers its requests to a shard from 1" in details
    assert (rows(stub) == 0).all() and clock(stub) == 0
    request = batch(12, 1, 1.0)
    request.advance_clock = 5
    assert stub.PushBatch(request, timeout=TIMEOUT_S).num_applied == len(IDS)
    assert (rows(stub) == -1).all() and clock(stub) == 5


def test_a_seq_sent_again_with_other_content_is_refused_and_changes_nothing(serve):
    """A client's newest request sent again with other content (more pushes, other values, a clock advance the
    first attempt lacked) is not a retry: refused with FAILED_PRECONDITION naming the client id and seq, nothing of
    it applied. The same request sent again is still a retry (applied before), and a shared key's request (one
    applied, whoever sends it) still answers another caller's content as applied before."""
    _, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    client, more = 0xC1D5, np.arange(100, 104, dtype=np.uint64)
    assert stub.PushBatch(batch(client, 1, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)
    longer = ps_pb2.PushBatchRequest(pushes=[push_request(1.0), push_request(1.0, ids=more)], client_id=client, seq=1)
    advanced = ps_pb2.PushBatchRequest(pushes=[push_request(1.0)], advance_clock=3, client_id=client, seq=1)
    for request in (longer, advanced, batch(client, 1, 5.0)):
        code, details = refused(stub.PushBatch, request)
        assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
        assert "seq 1 of this client id" in details and "nothing was applied" in details
    assert (rows(stub) == -1).all() and (rows(stub, more) == 0).all() and clock(stub) == 0
    assert stub.PushBatch(batch(client, 1, 1.0), timeout=TIMEOUT_S).num_applied == 0  # a retry: applied before
    advanced.seq = 2  # the next request: applied
    assert stub.PushBatch(advanced, timeout=TIMEOUT_S).step == 3
    for value in (1.0, 2.0):  # a shared key: the second caller's content is answered as applied before
        shared = ps_pb2.PushBatchRequest(pushes=[push_request(value, ids=more)], client_id=0x5A, seq=1, shared=True)
        assert stub.PushBatch(shared, timeout=TIMEOUT_S).num_applied == (len(more) if value == 1.0 else 0)
    assert (rows(stub) == -2).all() and (rows(stub, more) == -1).all() and clock(stub) == 3


EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def make_pki(d) -> None:
    """A CA, a server certificate for 127.0.0.1 and two client certificates (CN alice, CN mallory) it signed."""
    assert shutil.which("openssl"), "this test needs the openssl command (Debian: apt install openssl)"

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ca")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "alice", "mallory"):
        openssl("req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
                f"{name}.pem", "-days", "2", "-extfile", "server.ext" if name == "server" else "client.ext")  # fmt: skip


def alice_and_mallory(tmp_path, serve) -> tuple:
    """Stubs of a mutual-TLS server (make_pki's certificates), as the clients alice and mallory."""
    pki = tmp_path / "pki"
    pki.mkdir()
    make_pki(pki)
    server, _ = serve(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"), tls_ca=str(pki / "ca.pem"))

    def stub_as(name: str) -> ps_pb2_grpc.ParameterServerStub:
        credentials = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes(), (pki / f"{name}.key").read_bytes(),
                                                   (pki / f"{name}.pem").read_bytes())  # fmt: skip
        return ps_pb2_grpc.ParameterServerStub(grpc.secure_channel(f"127.0.0.1:{server.port}", credentials))

    return stub_as("alice"), stub_as("mallory")


def test_under_mutual_tls_a_client_id_belongs_to_its_certificate(tmp_path, serve):
    alice, mallory = alice_and_mallory(tmp_path, serve)
    alice.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    shared_id = 0xA11CE
    assert alice.PushBatch(batch(shared_id, 1, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)
    # mallory sends alice's next request number under alice's client id: it counts only as mallory's own request
    assert mallory.PushBatch(batch(shared_id, 2, 10.0), timeout=TIMEOUT_S).num_applied == len(IDS)
    assert alice.PushBatch(batch(shared_id, 2, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)
    assert (rows(alice) == -12).all()  # alice's second push was applied
    assert alice.PushBatch(batch(shared_id, 2, 1.0), timeout=TIMEOUT_S).num_applied == 0  # her retry is not
    assert (rows(alice) == -12).all()


def test_under_mutual_tls_a_shared_key_is_one_for_every_certificate(tmp_path, serve):
    """A request marked shared (Client.push_once's) is deduplicated under its client_id alone: applied once, whoever
    sends it; the same id unmarked is still each certificate's own."""
    alice, mallory = alice_and_mallory(tmp_path, serve)
    alice.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    once = batch(0x5EED, 1, 1.0)
    once.shared = True
    assert alice.PushBatch(once, timeout=TIMEOUT_S).num_applied == len(IDS)
    assert mallory.PushBatch(once, timeout=TIMEOUT_S).num_applied == 0  # the same key: applied before
    assert (rows(alice) == -1).all()
    assert mallory.PushBatch(batch(0x5EED, 1, 1.0), timeout=TIMEOUT_S).num_applied == len(IDS)  # unmarked: hers
    assert (rows(alice) == -2).all()


LONG = "x" * 20_000


def test_errors_that_echo_a_long_name_stay_short(serve):
    _, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    for i in range(12):  # a NOT_FOUND lists some of the tables, not all
        spec = ps_pb2.TableSpec(name=f"t{i:03d}", dim=1)
        stub.CreateTable(ps_pb2.CreateTableRequest(spec=spec), timeout=TIMEOUT_S)
    wide = "\u00e9" * 9_000  # 6 bytes each once percent-encoded in the trailer
    long_push = ps_pb2.PushRequest(table=LONG, ids=IDS.astype("<u8").tobytes(), grads=b"\0" * 64, dim=2)
    specs = [
        ps_pb2.TableSpec(name=LONG, dim=2),
        ps_pb2.TableSpec(name=wide, dim=2),
        ps_pb2.TableSpec(name="ok", dim=2, optimizer=ps_pb2.OptimizerSpec(name=LONG)),
        ps_pb2.TableSpec(name="ok", dim=2, initializer=ps_pb2.InitializerSpec(name=LONG)),
        ps_pb2.TableSpec(name="ok", dim=2, optimizer=ps_pb2.OptimizerSpec(params={LONG: 1.0, wide: 2.0})),
    ]
    # a name no table may have is refused as such by every call that names a table, not as a missing table
    calls = [(stub.CreateTable, ps_pb2.CreateTableRequest(spec=spec), "INVALID_ARGUMENT") for spec in specs] + [
        (stub.DescribeTable, ps_pb2.DescribeTableRequest(table=LONG), "INVALID_ARGUMENT"),
        (stub.DescribeTable, ps_pb2.DescribeTableRequest(table=wide), "INVALID_ARGUMENT"),
        (stub.Pull, ps_pb2.PullRequest(table=LONG, ids=IDS.astype("<u8").tobytes()), "INVALID_ARGUMENT"),
        (stub.PullBatch, ps_pb2.PullBatchRequest(pulls=[ps_pb2.PullRequest(table=wide)]), "INVALID_ARGUMENT"),
        (stub.Push, long_push, "INVALID_ARGUMENT"),
        (stub.PushBatch, ps_pb2.PushBatchRequest(pushes=[long_push]), "INVALID_ARGUMENT"),
        (stub.Shrink, ps_pb2.ShrinkRequest(table=LONG), "INVALID_ARGUMENT"),
        (stub.Checkpoint, ps_pb2.CheckpointRequest(phase=LONG), "INVALID_ARGUMENT"),
    ]
    for call, request, want in calls:
        code, details = refused(call, request)
        assert code.name == want, (call, code, details[:300])
        assert len(details.encode()) <= 1024, (call, len(details))
        assert "characters)" in details or "parameters" in details, details
    _, details = refused(stub.DescribeTable, ps_pb2.DescribeTableRequest(table="missing"))
    assert "'missing' does not exist" in details and "and 3 more" in details, details


def test_a_checkpoint_is_never_written_into_a_shards_own_data_dir(serve, tmp_path):
    """--checkpoint-root inside --data-dir is refused at start; a save into the data dir under a root that holds
    it is refused (a checkpoint's hard links among the shard's live files)."""
    root = tmp_path / "root"
    with pytest.raises(ValueError, match="--checkpoint-root .* lies inside --data-dir"):
        ServerConfig(data_dir=str(root / "d"), checkpoint_root=str(root / "d")).validate()
    with pytest.raises(ValueError, match="--checkpoint-root .* lies inside --data-dir"):
        ServerConfig(data_dir=str(root / "d"), checkpoint_root=str(root / "d" / "journal")).validate()
    _, stub = serve(data_dir=root / "d", checkpoint_root=str(root))
    token = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60), timeout=TIMEOUT_S).token
    for inside in ("d/ck", "d/journal/ck", "d"):
        code, details = refused(stub.Checkpoint, ps_pb2.CheckpointRequest(phase="save", dir=inside, token=token))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "lies inside shard 0's data dir" in details, details
    assert stub.Checkpoint(ps_pb2.CheckpointRequest(phase="save", dir="ck", token=token), timeout=TIMEOUT_S).clock == 0


def test_a_checkpoint_dir_that_holds_a_shards_data_dir_is_refused(serve, tmp_path):
    """A save into a directory above the data dir (deleting that checkpoint would delete the live data) is refused,
    changing nothing; a directory beside the data dir is taken."""
    root = tmp_path / "root"
    _, stub = serve(data_dir=root / "run1" / "data0", checkpoint_root=str(root))
    token = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60), timeout=TIMEOUT_S).token
    for above in ("run1", str(root / "run1")):
        code, details = refused(stub.Checkpoint, ps_pb2.CheckpointRequest(phase="save", dir=above, token=token))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert f"holds shard 0's data dir {root / 'run1' / 'data0'}" in details, details
    assert sorted(os.listdir(root)) == ["run1"] and sorted(os.listdir(root / "run1")) == ["data0"]
    reply = stub.Checkpoint(ps_pb2.CheckpointRequest(phase="save", dir="run1/ck", token=token), timeout=TIMEOUT_S)
    assert reply.clock == 0 and os.listdir(root / "run1" / "ck") == ["shard-0"]


def test_a_refusals_fields_at_their_bound_and_past_it_do_not_overflow_the_trailer(serve, monkeypatch):
    """A DiskFullError whose fields take MAX_FIELDS_BYTES once percent-encoded (a path of "é", 6 bytes each), and
    whose message, clipped, is as wide: its client gets RESOURCE_EXHAUSTED, the class named and the fields whole,
    every time (not gRPC's refusal of a trailer over its limit); one byte more of them, and they are left out."""
    from ps.diskfull import DiskFullError
    from ps.errornames import MAX_FIELDS_BYTES, error_fields, error_metadata

    server, stub = serve()
    base = sum(len(s) for s in ("Disk quota exceeded", "the journal in /", "/", "nothing was applied", "retry"))
    wide = (MAX_FIELDS_BYTES - base) // 12  # of "é" in each of the two paths
    what, disk = "the journal in /" + "\u00e9" * wide, "/" + "\u00e9" * wide + "x" * ((MAX_FIELDS_BYTES - base) % 12)
    at_bound = DiskFullError.of("Disk quota exceeded", what, disk=disk)
    past_bound = DiskFullError.of("Disk quota exceeded", what, disk=disk + "x")
    assert sum(len(v) for k, v in error_metadata(at_bound) if k != "sparseps-error") == MAX_FIELDS_BYTES
    assert len(error_metadata(past_bound)) == 1
    whole = {"reason": "Disk quota exceeded", "what": what, "disk": disk, "outcome": "nothing was applied",
             "remedy": "retry"}  # fmt: skip
    for error, fields in ((at_bound, whole), (past_bound, {})):

        def stats(error=error):
            raise error

        monkeypatch.setattr(server.shard, "stats", stats)
        for _ in range(10):
            with pytest.raises(grpc.RpcError) as e:
                stub.Stats(ps_pb2.StatsRequest(), timeout=TIMEOUT_S)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
            assert ("sparseps-error", "DiskFullError") in e.value.trailing_metadata()
            assert error_fields(e.value.trailing_metadata()) == fields
            assert "\u00e9" * 100 in e.value.details()


def test_a_state_id_no_shard_draws_is_refused_as_invalid_and_changes_nothing(serve):
    """A state id at or past 2^63 (2^64-1 included) is no shard's: shards draw theirs in [1, 2^63) (StatsResponse
    state_id). Every request that carries one is refused INVALID_ARGUMENT, saying so, not FAILED_PRECONDITION telling
    its client that the shard was restored or started anew; no table is made, no push applied, no shard held or
    shrunk."""
    _, stub = serve()
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=SUM_SPEC), timeout=TIMEOUT_S)
    other = ps_pb2.TableSpec(name="other", dim=2, initializer=SUM_SPEC.initializer, optimizer=SUM_SPEC.optimizer)
    push = push_request(1.0)
    pull = ps_pb2.PullRequest(table="sum", ids=push.ids)
    for bad in (2**63, 2**64 - 1):
        for call, request in (
            (stub.CreateTable, ps_pb2.CreateTableRequest(spec=other, state_id=bad)),
            (stub.PushBatch, ps_pb2.PushBatchRequest(pushes=[push], state_id=bad, advance_clock=1)),
            (stub.PullBatch, ps_pb2.PullBatchRequest(pulls=[pull], state_id=bad)),
            (stub.Checkpoint, ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60, state_id=bad)),
            (stub.Shrink, ps_pb2.ShrinkRequest(table="sum", state_id=bad)),
        ):
            code, details = refused(call, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (type(request).__name__, code, details)
            assert details.startswith(f"state_id {bad:#x} is no shard's"), details
    assert [t.name for t in stub.Stats(ps_pb2.StatsRequest(), timeout=TIMEOUT_S).tables] == ["sum"]
    assert clock(stub) == 0 and not rows(stub).any()
    stub.Push(push, timeout=TIMEOUT_S)  # not held
    assert (rows(stub) == -1.0).all()


def _disk_full(trailers: tuple) -> RefusedCall:
    """A DiskFullError's refusal as a client sees it, with the trailing metadata given."""
    return RefusedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "the server's disk is full (...)", trailers)


def test_a_refusals_hostile_trailers_decode_to_text_and_nothing_else():
    """The fields of a refusal's trailing metadata as a careless or hostile server may send them: a "%" that starts
    no escape stays as it is, an escape of bytes that are not UTF-8 reads as U+FFFD, a bytes value (a -bin key's)
    and a key outside ERROR_NAME_KEY-<field> are not read, and a field no class has sets nothing. The client's
    DiskFullError has the fields as decoded; one that lacks a field, sent as bytes, has its message alone."""
    from ps.diskfull import DiskFullError
    from worker.retry import Outages

    fields = (("sparseps-error-reason", "%C3%28"), ("sparseps-error-what", "a%zz%"), ("sparseps-error-disk", "/d%2"),
              ("sparseps-error-outcome", "%E2%82"), ("sparseps-error-remedy", "retry%20now"))  # fmt: skip
    noise = (("sparseps-error-bogus", "x"), ("x-sparseps-error-what", "y"), ("sparseps-error-what-bin", b"\xff"))
    outages = Outages(["h:1"])
    e = outages.error("Stats", 0, _disk_full((("sparseps-error", "DiskFullError"), *fields, *noise)), 5, None, 5)
    assert isinstance(e, DiskFullError), e
    head = "shard 0 at h:1: Stats failed with RESOURCE_EXHAUSTED: "
    assert str(e) == head + "the server's disk is full (...)"
    said = (e.reason, e.what, e.disk, e.outcome, e.remedy, e.refused_by)
    assert said == ("\ufffd(", head + "a%zz%", "/d%2", "\ufffd", "retry now", 0), said
    assert not hasattr(e, "bogus")

    as_bytes = tuple((k, v.encode()) if k.endswith("-disk") else (k, v) for k, v in fields)
    e = outages.error("Stats", 0, _disk_full((("sparseps-error", "DiskFullError"), *as_bytes)), 5, None, 5)
    assert isinstance(e, DiskFullError) and str(e) == head + "the server's disk is full (...)"
    assert (e.reason, e.what, e.disk, e.outcome, e.remedy) == ("", "", "", "", "")

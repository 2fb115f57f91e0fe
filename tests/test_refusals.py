"""RefusalLog: each kind of refused request logged once per interval, with the count of the others; and the
servicer's refusals logged through it (a client repeating a bad request does not fill the log)."""

from __future__ import annotations

import errno
import logging
import re
import time

import grpc
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps.diskfull import DiskFullError
from ps.errors import InvalidArgumentError, TableNotFoundError
from ps.refusals import RefusalLog

LOGGER = "tests.refusals"


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_kind_is_logged_once_per_interval_and_close_tells_the_count_of_the_others(caplog):
    caplog.set_level(logging.INFO, LOGGER)
    now = [100.0]
    refusals = RefusalLog(logging.getLogger(LOGGER), every_s=60.0, clock=lambda: now[0])
    bad = InvalidArgumentError("ids has 3 bytes")
    for _ in range(5):  # 1 logged, 4 counted
        refusals.refused(logging.INFO, "Pull", bad, "rejected: ids has 3 bytes", "INVALID_ARGUMENT")
    refusals.refused(logging.INFO, "Push", bad, "rejected: ids has 3 bytes", "INVALID_ARGUMENT")  # another method
    refusals.refused(logging.INFO, "Pull", TableNotFoundError("no table"), "rejected: no table", "NOT_FOUND")
    assert len(lines(caplog)) == 3, lines(caplog)
    assert lines(caplog)[0] == "Pull rejected: ids has 3 bytes (more of this kind within 60 s are counted in one line)"
    now[0] += 59.9
    refusals.refused(logging.INFO, "Pull", bad, "rejected: ids has 5 bytes", "INVALID_ARGUMENT")  # counted: the 5th
    assert len(lines(caplog)) == 3
    refusals.close()  # the server stops before the interval's end: the count is told now
    assert lines(caplog)[3:] == [
        "Pull rejected: ids has 5 bytes (the last of 5 Pull refusals of this kind, InvalidArgumentError "
        "INVALID_ARGUMENT, since the kind's previous line)"
    ], lines(caplog)
    refusals.refused(logging.INFO, "Pull", bad, "rejected: ids has 3 bytes", "INVALID_ARGUMENT")  # closed: logged
    assert lines(caplog)[-1] == "Pull rejected: ids has 3 bytes" and len(lines(caplog)) == 5


def test_a_bursts_count_is_logged_at_its_intervals_end_with_no_refusal_after_it(caplog):
    """A burst of one kind and then none: its count is not left for a next refusal that may never come."""
    caplog.set_level(logging.INFO, LOGGER)
    refusals = RefusalLog(logging.getLogger(LOGGER), every_s=2.0)
    for _ in range(4):
        refusals.refused(logging.ERROR, "PushBatch", DiskFullError("the server's disk is full"), "rejected: full",
                         "RESOURCE_EXHAUSTED")  # fmt: skip
    assert len(lines(caplog)) == 1
    deadline = time.monotonic() + 60
    while len(lines(caplog)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lines(caplog)[1:] == [
        "PushBatch rejected: full (the last of 3 PushBatch refusals of this kind, DiskFullError RESOURCE_EXHAUSTED, "
        "since the kind's previous line)"
    ], lines(caplog)
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.ERROR] * 2
    refusals.close()
    assert len(lines(caplog)) == 2  # told once


def test_a_refusal_keeps_its_level_and_an_unexpected_failure_its_traceback(caplog):
    caplog.set_level(logging.DEBUG, LOGGER)
    refusals = RefusalLog(logging.getLogger(LOGGER))
    refusals.refused(logging.DEBUG, "PushBatch", InvalidArgumentError("held"), "rejected: held", "UNAVAILABLE")
    try:
        raise KeyError("bug")
    except KeyError as e:
        refusals.refused(logging.ERROR, "Pull", e, "failed", "INTERNAL", exc_info=True)
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in records] == [logging.DEBUG, logging.ERROR]
    assert records[0].exc_info is None and records[1].exc_info[0] is KeyError
    refusals.close()


def test_a_client_repeating_a_bad_request_gives_one_line_not_one_per_request(servers, caplog):
    caplog.set_level(logging.INFO, "ps.service")
    (address,), (server,) = servers(1)
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        for _ in range(200):
            with pytest.raises(grpc.RpcError) as refused:
                stub.Pull(ps_pb2.PullRequest(table="emb", ids=b"123"))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # every one refused, as before
        with pytest.raises(grpc.RpcError):
            stub.Pull(ps_pb2.PullRequest(table="nope", ids=b""))  # another kind: a line of its own
    logged = [r.getMessage() for r in caplog.records if r.name == "ps.service"]
    assert len([m for m in logged if re.match(r"Pull rejected: ids has 3 bytes", m)]) == 1, logged[:5]
    assert len([m for m in logged if "table 'nope' does not exist" in m]) == 1, logged[:5]
    assert len(logged) == 2, logged[:5]
    server.stop(grace_s=1)  # before the minute's end: the stop tells the count
    logged = [r.getMessage() for r in caplog.records if r.name == "ps.service"]
    assert len(logged) == 3 and "(the last of 199 Pull refusals of this kind, InvalidArgumentError" in logged[-1]


def test_a_full_disk_and_another_failure_of_one_error_class_are_two_kinds(servers, caplog, monkeypatch):
    """An OSError of a full disk (RESOURCE_EXHAUSTED) and then one of an I/O error (INTERNAL) in one method: the
    second is logged with its traceback, not counted as one more of the full disk's."""
    caplog.set_level(logging.INFO, "ps.service")
    (address,), (server,) = servers(1)
    errors = [OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EIO, "Input/output error")]

    def table(name):
        raise errors.pop(0)

    monkeypatch.setattr(server.shard, "table", table)
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        codes = []
        for _ in range(2):
            with pytest.raises(grpc.RpcError) as refused:
                stub.Pull(ps_pb2.PullRequest(table="emb", ids=b""))
            codes.append(refused.value.code())
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL]
    records = [r for r in caplog.records if r.name == "ps.service"]
    assert [r.getMessage().split(" (")[0] for r in records] == [
        "Pull failed: OSError: [Errno 28] No space left on device",
        "Pull failed: OSError: [Errno 5] Input/output error",
    ]
    assert all(r.levelno == logging.ERROR and r.exc_info[1].errno in (errno.ENOSPC, errno.EIO) for r in records)

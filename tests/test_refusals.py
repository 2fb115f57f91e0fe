"""RefusalLog: each kind of refused request logged once per interval, with the count of the others; and the
servicer's refusals logged through it (a client repeating a bad request does not fill the log)."""

from __future__ import annotations

import logging
import re

import grpc
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps.errors import InvalidArgumentError, TableNotFoundError
from ps.refusals import RefusalLog

LOGGER = "tests.refusals"


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_kind_is_logged_once_per_interval_with_the_count_of_the_others(caplog):
    caplog.set_level(logging.INFO, LOGGER)
    now = [100.0]
    refusals = RefusalLog(logging.getLogger(LOGGER), every_s=60.0, clock=lambda: now[0])
    bad = InvalidArgumentError("ids has 3 bytes")
    for _ in range(5):  # 1 logged, 4 counted
        refusals.refused(logging.INFO, "Pull", bad, "rejected: ids has 3 bytes")
    refusals.refused(logging.INFO, "Push", bad, "rejected: ids has 3 bytes")  # another method: its own kind
    refusals.refused(logging.INFO, "Pull", TableNotFoundError("no table"), "rejected: no table")  # another class
    assert len(lines(caplog)) == 3, lines(caplog)
    now[0] += 59.9
    refusals.refused(logging.INFO, "Pull", bad, "rejected: ids has 3 bytes")  # still within the interval: 5th counted
    assert len(lines(caplog)) == 3
    now[0] += 0.1
    refusals.refused(logging.INFO, "Pull", bad, "rejected: ids has 3 bytes")
    assert lines(caplog)[-1].startswith("Pull rejected: ids has 3 bytes (5 more Pull refusals of this kind since")
    now[0] += 60
    refusals.refused(logging.INFO, "Pull", bad, "rejected: ids has 3 bytes")  # none counted since the last line
    assert "more Pull refusals" not in lines(caplog)[-1] and "counted in its next line" in lines(caplog)[-1]
    assert len(lines(caplog)) == 5


def test_a_refusal_keeps_its_level_and_an_unexpected_failure_its_traceback(caplog):
    caplog.set_level(logging.DEBUG, LOGGER)
    refusals = RefusalLog(logging.getLogger(LOGGER))
    refusals.refused(logging.DEBUG, "PushBatch", InvalidArgumentError("held"), "rejected: held")
    try:
        raise KeyError("bug")
    except KeyError as e:
        refusals.refused(logging.ERROR, "Pull", e, "failed", exc_info=True)
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in records] == [logging.DEBUG, logging.ERROR]
    assert records[0].exc_info is None and records[1].exc_info[0] is KeyError


def test_a_client_repeating_a_bad_request_gives_one_line_not_one_per_request(servers, caplog):
    caplog.set_level(logging.INFO, "ps.service")
    (address,), _ = servers(1)
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

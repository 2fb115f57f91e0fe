"""A shard process that dies between running a call and replying (os._exit as the shard's method returns, as a
kill -9 there would), then starts again on its port: the client sends a push or a clock advance (a PushBatch too)
again, which the restarted shard applies once (its request number), and does not send a Shrink again (the lost
connection says nothing of whether it ran: it did), raising instead."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from ps.config import OptimizerConfig, TableConfig
from ps.errors import ServerUnavailableError
from tests.server_process import ServerProcess
from worker.client import Client

DIES_AFTER = """import os, sys
from ps.__main__ import main
from ps.engine.shard import Shard
name = os.environ["DIE_AFTER"]
real = getattr(Shard, name)
def dying(self, *args, **kw):
    real(self, *args, **kw)
    os._exit(9)
setattr(Shard, name, dying)
sys.exit(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("dies_after, call", [("push_batch", "push"), ("push_batch", "advance_clock"),
                                              ("shrink", "shrink")])  # fmt: skip
def test_a_shard_that_dies_before_its_reply_applies_a_call_once(tmp_path, monkeypatch, dies_after, call):
    port = free_port()
    flags = ("--port", str(port))
    monkeypatch.setenv("DIE_AFTER", dies_after)
    dying = ServerProcess(tmp_path / "d", *flags, launcher=("-c", DIES_AFTER))  # makes the table, then dies after
    assert dying.started() == f"127.0.0.1:{port}"  # its first call of dies_after
    ids = np.arange(10, dtype=np.uint64)
    with Client([f"127.0.0.1:{port}"], timeout_s=30, server_timeout_s=120) as client:
        client.wait_ready()
        client.create_table(TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 1.0)))
        before = client.pull("emb", ids)
        assert dying.proc.poll() is None  # neither the table's creation nor the pull ran dies_after
        again: list[ServerProcess] = []

        def restart() -> None:
            dying.proc.wait(120)
            again.append(ServerProcess(tmp_path / "d", *flags))
            again[0].started()

        restarting = threading.Thread(target=restart)
        restarting.start()
        try:
            if call == "push":
                client.push("emb", ids, np.ones((len(ids), 4), np.float32))  # sent again to the restarted shard
            elif call == "advance_clock":
                assert client.advance_clock(1) == 1
            else:
                with pytest.raises(ServerUnavailableError, match=r"lost the connection during Shrink \(.*; did it "
                                   "die\\?\\): it may still be running there, or be done; it was not sent again"):  # fmt: skip
                    client.shrink()
            restarting.join(120)
            assert dying.proc.returncode == 9, dying.output()
            np.testing.assert_array_equal(client.pull("emb", ids), before - (call == "push"))  # once
            assert client.stats()[0].clock == (call == "advance_clock")  # once
        finally:
            restarting.join(120)
            for server in again:
                server.stop_cleanly()

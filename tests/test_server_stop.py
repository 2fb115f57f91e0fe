"""A server's stop: gRPC cancels the calls still running at the grace's end but not their handlers, which may still
use the store (a checkpoint being written); the store is closed once they returned, or CALLS_DRAIN_S after. A stop
asked for before start() serves the shard ends the start: nothing is served."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from ps import server as server_module
from ps.server import Server
from ps.server_config import ServerConfig
from ps.service_calls import RunningCalls
from tests.waiting import join_thread, wait_until
from worker.client import Client


def test_running_calls_counts_and_waits_a_bounded_time():
    calls = RunningCalls()
    assert calls.wait_done(0) == 0
    calls.enter()
    calls.enter()
    started = time.monotonic()
    assert calls.wait_done(0.3) == 2 and 0.25 < time.monotonic() - started < 5
    calls.leave()
    threading.Timer(0.2, calls.leave).start()
    assert calls.wait_done(10) == 0


def stats_call_failing_quietly(client: Client) -> None:
    with contextlib.suppress(Exception):  # cancelled by the stop
        client.stats()


@pytest.mark.parametrize("drain_s", [30.0, 0.2])
def test_the_store_is_closed_after_the_handlers_of_cancelled_calls_returned(tmp_path, monkeypatch, drain_s):
    monkeypatch.setattr(server_module, "CALLS_DRAIN_S", drain_s)
    server = Server(ServerConfig(data_dir=str(tmp_path / "d")))
    address = f"127.0.0.1:{server.start()}"
    shard, events, inside = server.shard, [], threading.Event()
    stats, close = shard.stats, shard.store.close

    def slow_stats() -> dict:
        inside.set()
        time.sleep(1.5)  # past the stop's grace: gRPC cancels the call, its handler runs on
        events.append("stats done")
        return stats()

    def recorded_close() -> None:
        events.append("store closed")
        close()

    monkeypatch.setattr(shard, "stats", slow_stats)
    monkeypatch.setattr(shard.store, "close", recorded_close)
    with Client([address], timeout_s=30, server_timeout_s=0) as client:
        caller = threading.Thread(target=stats_call_failing_quietly, args=(client,), daemon=True)
        caller.start()
        wait_until(inside.is_set, 30, "the Stats call to run")
        server.stop(grace_s=0.1)
        join_thread(caller, 30, "the cancelled Stats call")
    wait_until(lambda: "stats done" in events, 30, "the handler to return")
    if drain_s > 1.5:
        assert events == ["stats done", "store closed"]
    else:  # the drain gave up first: the store was closed under the handler, which then failed
        assert events == ["store closed", "stats done"]


@pytest.mark.parametrize("warming", [False, True])
def test_a_stop_asked_for_before_start_serves_nothing_and_closes_the_shard(tmp_path, warming):
    """As a signal's handler does (StartProgress.stop_asked) while the shard is "about to serve": start() raises
    StartStopped, its gate never opened, health never SERVING, the shard closed, the port closed."""
    from ps.engine.startup import StartStopped
    from ps.health import SERVICE_NAME, SERVING, check_health

    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, memory_bytes=(256 << 20) if warming else None))
    address = f"127.0.0.1:{server.port}"
    assert check_health(address, 10).starting  # listening, "about to serve"
    seen: list = []
    set_status, close = server.health.set, server.shard.close
    server.health.set = lambda name, status: (seen.append(status), set_status(name, status))
    server.shard.close = lambda: (seen.append("closed"), close())
    server.progress.stop.set()
    assert server.progress.stop_asked()
    with pytest.raises(StartStopped, match="about to serve"):
        server.start(warming=warming)
    assert server._gate._open is None and server._servicer is None and SERVING not in seen
    assert server.health._server_status[SERVICE_NAME] != SERVING and seen.count("closed") == 1
    health = check_health(address, 10)
    assert not health.serving and "connection refused" in health.text, health

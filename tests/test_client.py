"""Client routing, dedup, reassembly and error reporting against in-process shards."""

import contextlib
import dataclasses
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import grpc
import numpy as np
import pytest

from protos import ps_pb2
from ps.config import OptimizerConfig, TableConfig
from ps.errornames import ERROR_NAME_KEY
from ps.errors import (
    CallerGoneError,
    ClientIdInUseError,
    InvalidArgumentError,
    PsError,
    ServerUnavailableError,
    StorageError,
    TableBusyError,
    TableNotFoundError,
)
from ps.rows.initializers import init_rows
from ps.sharding import SlotMap
from tests.conftest import call_slots_taken, random_ids
from tests.rpc_errors import RefusedCall
from worker import shard_calls
from worker.client import Client, PushItem, push_arrays, sum_duplicates
from worker.retry import retryable, sent_once


def initial(cfg: TableConfig, ids):
    out = np.empty((len(ids), cfg.dim), dtype=np.float32)
    init_rows(cfg.initializer, ids, out, cfg.dim)
    return out


def test_sum_duplicates_against_a_loop():
    ids = np.array([5, 3, 5, 2**64 - 1, 3, 5], dtype=np.uint64)
    grads = np.arange(12, dtype=np.float32).reshape(6, 2)
    uniq, summed = sum_duplicates(ids, grads)
    want = {}
    for i, g in zip(ids.tolist(), grads):
        want[i] = want.get(i, 0) + g
    assert uniq.tolist() == sorted(want)
    np.testing.assert_array_equal(summed, np.array([want[i] for i in uniq.tolist()]))


@pytest.mark.parametrize("ids", [[7, 3, 7, 9, 3], [1, 2, 3, 10], [4], [], [2, 2], [3, 2]])
@pytest.mark.parametrize("with_clicks", [False, True])
def test_push_arrays_against_a_loop(ids, with_clicks):
    """Sorted unique ids take the no-copy path, others are summed; both must give what a loop gives."""
    ids = np.array(ids, dtype=np.uint64)
    rng = np.random.default_rng(len(ids))
    grads = rng.standard_normal((len(ids), 3)).astype(np.float32)
    clicks = rng.integers(0, 2, len(ids)).astype(np.float32) if with_clicks else None
    uniq, g, shows, got_clicks, order = push_arrays("t", ids, grads, clicks, None, 3)
    want = {}
    for k, i in enumerate(ids.tolist()):
        s = want.setdefault(i, [np.zeros(3, np.float32), 0.0, 0.0])
        s[0] = s[0] + grads[k]
        s[1] += 1.0
        s[2] += 0.0 if clicks is None else float(clicks[k])
    assert uniq.tolist() == sorted(want)
    np.testing.assert_allclose(g, np.array([want[i][0] for i in uniq.tolist()]).reshape(-1, 3), rtol=1e-6)
    # the default counts (one show, no click per id) come back as None: the Client leaves them out of its requests
    want_shows = [want[i][1] for i in uniq.tolist()]
    assert (shows is None) == all(s == 1.0 for s in want_shows)
    assert want_shows == ([1.0] * len(uniq) if shows is None else shows.tolist())
    want_clicks = [want[i][2] for i in uniq.tolist()]
    assert (got_clicks is None) == all(c == 0.0 for c in want_clicks)
    assert want_clicks == ([0.0] * len(uniq) if got_clicks is None else got_clicks.tolist())
    where = np.arange(len(ids)) if order is None else order  # the row of each given id
    assert uniq[where].tolist() == ids.tolist()


def test_push_arrays_refuses_clicks_or_shows_of_another_length():
    ids, grads = np.array([1, 2, 3], np.uint64), np.zeros((3, 2), np.float32)
    for kwargs in ({"clicks": np.ones(2), "shows": None}, {"clicks": np.ones(4), "shows": None},
                   {"clicks": None, "shows": np.ones(5)}):  # fmt: skip
        with pytest.raises(ValueError, match="for 3 ids"):
            push_arrays("t", ids, grads, kwargs["clicks"], kwargs["shows"], 2)
    _, _, shows, clicks, _ = push_arrays("t", ids, grads, 1.0, None, 2)  # one value: every id
    assert clicks.tolist() == [1.0, 1.0, 1.0] and shows is None  # one show each: the default, left out
    _, _, shows, clicks, _ = push_arrays("t", ids, grads, 0.0, 2.0, 2)
    assert shows.tolist() == [2.0, 2.0, 2.0] and clicks is None  # no click: the default, left out


BAD_PUSHES = {  # what spoils one id's part of a push, and what the refusal says
    "nan grad": (
        {"grad": np.nan},
        r"grads for table 'emb' hold non-finite values, first at row \d+ \(id {id}\): "
        r"\[1.0, 1.0, nan",
    ),
    "inf grad": ({"grad": np.inf}, r"hold non-finite values, first at row \d+ \(id {id}\): \[1.0, 1.0, inf"),
    "a sum past float32": ({"grad": 3e38, "twice": True}, r"id {id}'s occurrences, each finite, sum past float32"),
    "clicks over shows": ({"clicks": 2.0}, r"exceed shows: id {id} \(position \d+\) has 2 clicks and 1 shows"),
    "nan clicks": ({"clicks": np.nan}, r"clicks for table 'emb' must be finite and >= 0; position \d+ holds nan"),
}


@pytest.mark.parametrize("bad", sorted(BAD_PUSHES))
def test_a_push_with_a_bad_value_for_one_id_changes_no_shard(servers, sgd1_table, bad):
    """A bad value in the part of a push that one shard owns is refused by the client before it sends anything:
    the shards that own the other ids apply nothing either (each shard would refuse only its own part)."""
    spoil, message = BAD_PUSHES[bad]
    addresses, _ = servers(3)
    with Client(addresses) as client:
        client.create_table(sgd1_table)
        ids = random_ids(60, seed=8)
        assert len(set(client.slot_map.shard_of(ids).tolist())) == 3
        before = client.pull("emb", ids)
        grads, clicks = np.ones((60, 4), np.float32), np.zeros(60, np.float32)
        bad_at = 41
        grads[bad_at, 2] = spoil.get("grad", 1.0)
        clicks[bad_at] = spoil.get("clicks", 0.0)
        if spoil.get("twice"):  # the id twice, each grad finite: their sum is not
            ids, grads, clicks = np.append(ids, ids[bad_at]), np.vstack([grads, grads[bad_at]]), np.append(clicks, 0)
        with pytest.raises(InvalidArgumentError, match=message.format(id=int(ids[bad_at]))):
            client.push("emb", ids, grads, clicks)
        np.testing.assert_array_equal(client.pull("emb", ids[:60]), before)
        assert sum(t.pushes for s in client.stats() for t in s.tables) == 0


@pytest.mark.parametrize("max_request_bytes", [64 << 20, 200])  # 200 bytes: many chunks per shard
def test_pull_and_push_with_duplicates_across_three_shards(servers, sgd1_table, max_request_bytes):
    addresses, _ = servers(3)
    with Client(addresses, max_request_bytes=max_request_bytes) as client:
        client.wait_ready()
        client.create_table(sgd1_table)
        base = random_ids(300)
        ids = np.concatenate([base, base[:100], base[:10]])[np.random.default_rng(1).permutation(410)]
        rows = client.pull("emb", ids)
        np.testing.assert_array_equal(rows, initial(sgd1_table, ids))
        grads = np.random.default_rng(2).integers(-3, 4, (410, 4)).astype(np.float32)
        client.push("emb", ids, grads)
        summed = {}
        for i, g in zip(ids.tolist(), grads):  # integer grads: their sum is exact in float32
            summed[i] = summed.get(i, 0) + g
        expected = {int(i): r - summed[int(i)] for i, r in zip(ids, initial(sgd1_table, ids))}
        got = client.pull("emb", ids.reshape(41, 10))  # any shape, flattened
        np.testing.assert_array_equal(got, np.array([expected[i] for i in ids.tolist()]))
        increasing = np.unique(ids)  # unique and sorted: sent as given, rows in that order
        np.testing.assert_array_equal(
            client.pull("emb", increasing), np.array([expected[i] for i in increasing.tolist()])
        )
        assert sum(t.num_rows for s in client.stats() for t in s.tables) == 300


@pytest.mark.parametrize("max_request_bytes", [64 << 20, 300])  # 300 bytes: several batches per shard
def test_push_many_and_pull_many_equal_one_call_per_table(servers, sgd1_table, max_request_bytes):
    """Two tables of different dims in one exchange (grouped into PushBatch / PullBatch per shard), then the
    clock advanced on every shard, even one that got no push."""
    addresses, _ = servers(3)
    other = dataclasses.replace(sgd1_table, name="wide", dim=7)
    with Client(addresses, max_request_bytes=max_request_bytes) as client:
        client.wait_ready()
        client.create_table(sgd1_table)
        client.create_table(other)
        a, b = random_ids(50, seed=3), random_ids(2, seed=4)
        ga = np.random.default_rng(5).integers(-3, 4, (50, 4)).astype(np.float32)
        gb = np.ones((2, 7), np.float32)
        clocks = [s.clock for s in client.stats()]
        client.push_many([("emb", a, ga, None), ("wide", b, gb, np.ones(2))], advance_clock=2)
        assert [s.clock for s in client.stats()] == [c + 2 for c in clocks]
        got_a, got_b, got_a2 = client.pull_many([("emb", a), ("wide", b), ("emb", a[:3])])
        np.testing.assert_array_equal(got_a, initial(sgd1_table, a) - ga)
        np.testing.assert_array_equal(got_b, initial(other, b) - 1)
        np.testing.assert_array_equal(got_a2, got_a[:3])
        assert client.pull_many([]) == [] and client.pull_many([("emb", a[:0])])[0].shape == (0, 4)
        wide = [t for s in client.stats() for t in s.tables if t.name == "wide"]
        assert sum(t.num_rows for t in wide) == 2


def test_errors_name_the_shard_and_the_problem(servers, sgd1_table):
    addresses, _ = servers(2)
    with Client(addresses) as client:
        client.create_table(sgd1_table)
        with pytest.raises(
            TableNotFoundError, match=r"shard 0 at 127\.0\.0\.1:\d+: DescribeTable failed with NOT_FOUND"
        ):
            client.pull("nope", np.arange(3, dtype=np.uint64))
    wrong_lists = {
        "the servers are not in shard order": addresses[::-1],
        "shard 0 is listed more than once": [addresses[0], addresses[0]],
        "the cluster has 2 shards, the list 1; shard 1 is missing": addresses[:1],
        "shard 1 is listed more than once": [*addresses, addresses[1]],
        "shard 0 is listed more than once \\(127\\.0\\.0\\.1:\\d+ and localhost:\\d+ give the same model state id: one "
        "server listed under two addresses\\?\\)": [addresses[0], addresses[0].replace("127.0.0.1", "localhost")],
    }
    for what, servers_listed in wrong_lists.items():
        with Client(servers_listed) as client, pytest.raises(PsError, match=f"does not match the cluster: {what}"):
            client.wait_ready()
    from worker.channels import server_list_error

    assert "the cluster has 3 shards, the list 1; shards 1, 2 are missing" in server_list_error(["a:1"], [(0, 3)], [7])
    assert "shard 0 is listed more than once (the same address twice)" in server_list_error(["a:1", "a:1"],
                                                                                            [(0, 2), (0, 2)], [7, 7])  # fmt: skip
    assert ("shard 0 is listed more than once (a:1 and b:2 both say they are shard 0: was one started without its "
            "--shard-id, which defaults to 0?)") in server_list_error(["a:1", "b:2"], [(0, 2), (0, 2)], [7, 8])  # fmt: skip
    assert ("shard 0 is listed more than once (b:2 and c:3 give the same model state id: one server listed under two "
            "addresses?)") in server_list_error(["a:1", "b:2", "c:3"], [(0, 2)] * 3, [7, 8, 8])  # fmt: skip
    assert "--shard-id" in server_list_error(["a:1", "b:2"], [(0, 2), (0, 2)], [0, 0])  # 0: no state id to compare


def test_a_second_client_under_the_same_client_id_is_refused_loudly(servers, sgd1_table):
    """The shards hold requests 1-3 of the first client's id; the second client's first request under that id is
    request 1, which they take for an old one and do not apply: its push raises, it is not silently lost."""
    addresses, _ = servers(2)
    ids = random_ids(20, seed=7)
    with Client(addresses) as first, Client(addresses) as second:
        first.create_table(sgd1_table)
        second.client_id = first.client_id
        for _ in range(3):
            first.push("emb", ids, np.ones((20, 4), np.float32))
        said = r"applied 0 of the \d+ ids of PushBatch request 1 of client id 0x[0-9a-f]+ on its first attempt: "
        with pytest.raises(ClientIdInUseError, match=said + ".* another caller uses the same client id") as e:
            second.push("emb", ids, np.ones((20, 4), np.float32))
        assert e.value.status == "FAILED_PRECONDITION"
        np.testing.assert_array_equal(first.pull("emb", ids), initial(sgd1_table, ids) - 1 - 1 - 1)  # 3 pushes


def test_a_server_timeout_under_a_second_is_said_as_given():
    """The error of a call whose shard stayed down names the --server-timeout given (0.5 s, not "0 s")."""
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    said = r"it has been failing for \d+ s \(server timeout 0.5 s\)"
    with (
        Client([dead], timeout_s=0.2, server_timeout_s=0.5) as client,
        pytest.raises(ServerUnavailableError, match=said),
    ):
        client.stats()


def test_a_dead_server_gives_a_clear_error_not_a_hang(caplog):
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    started = time.monotonic()
    with Client([dead], timeout_s=1.0, server_timeout_s=2.0) as client:
        refused = f"shard 0 at {dead} did not accept a connection within 1 s; nothing listens there: is ps-server"
        with pytest.raises(ServerUnavailableError, match=refused):
            client.wait_ready(timeout_s=1.0)
        with (
            caplog.at_level("WARNING"),
            mock.patch("worker.channels.READY_PATIENCE_S", 0.5),
            pytest.raises(ServerUnavailableError, match=refused.replace("1 s", "1.5 s")),
        ):
            client.wait_ready(timeout_s=1.5)  # past READY_PATIENCE_S it says what it waits for, at once
        assert f"shard 0 at {dead} does not answer yet; nothing listens there: is ps-server running" in caplog.text
        caplog.clear()
        with (
            caplog.at_level("WARNING"),
            mock.patch("worker.channels.READY_PATIENCE_S", 0.5),
            mock.patch("worker.channels.READY_REMIND_S", 0.5),
            pytest.raises(ServerUnavailableError),
        ):
            client.wait_ready(timeout_s=2.0)  # a long wait says, every READY_REMIND_S, that it still waits
        reminders = [r for r in caplog.records if r.getMessage().startswith(f"still waiting for shard 0 at {dead} (")]
        assert len(reminders) >= 2, caplog.text
        with pytest.raises(
            ServerUnavailableError,
            match=rf"shard 0 at {dead}: Stats failed \(connection refused: nothing listens there\); it has been "
            r"failing for [2-5] s \(server timeout 2 s\)",
        ):
            client.stats()  # retried for the server timeout, then a clear error (not the deadline of one attempt)
    assert 5.0 <= time.monotonic() - started < 20


def _fake_clock() -> tuple[list[float], mock.Mock]:
    """A stand-in for the time module whose clock moves only by its sleeps: ([now], the stand-in)."""
    now = [1000.0]
    return now, mock.Mock(monotonic=lambda: now[0], time=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))


@contextlib.contextmanager
def _client_on(clock: mock.Mock, attempt, **kwargs) -> Iterator[Client]:
    """A Client of one shard at 127.0.0.1:1 (kwargs: its timeouts) whose attempts are `attempt`, and whose waits
    and retries run on `clock` (_fake_clock's)."""
    with (
        Client(["127.0.0.1:1"], **kwargs) as client,
        mock.patch("worker.shard_calls.time", clock),
        mock.patch("worker.retry.time", clock),
    ):
        client._attempt = attempt
        yield client


def test_a_shard_that_stays_down_is_waited_for_the_server_timeout_in_all_not_per_call():
    """--server-timeout bounds the wait for a shard from the first failure the client saw of it: a call made after
    another gave up on the shard, still failing, tries once and fails at once, saying how long the shard has been
    failing; a failure after no call failed on it for the server timeout starts a new wait. A stand-in fails every
    call; a fake clock moves by the retries' sleeps."""
    now, clock = _fake_clock()

    attempts = []

    def attempt(call, timeout_s, interruptible):
        attempts.append(now[0])
        return RefusedCall(grpc.StatusCode.UNAVAILABLE, "Connection refused")  # nothing listens there

    def waited(call) -> tuple[float, int, str]:
        """(fake seconds the call took, its attempts, its error)"""
        started, tried = now[0], len(attempts)
        with pytest.raises(ServerUnavailableError) as raised:
            call()
        return now[0] - started, len(attempts) - tried, str(raised.value)

    with _client_on(clock, attempt, timeout_s=1, server_timeout_s=10) as client:
        first, tried, said = waited(client.stats)
        assert 10 <= first < 12 and tried > 5 and f"it has been failing for {first:.0f} s (server timeout 10 s)" in said
        took, tried, said = waited(client.stats)  # the shard still fails: what is left of its wait is nothing
        assert (took, tried) == (0, 1) and f"it has been failing for {first:.0f} s (server timeout 10 s)" in said
        now[0] += 5
        took, tried, said = waited(client.stats)
        assert (took, tried) == (0, 1) and f"it has been failing for {first + 5:.0f} s (server timeout 10 s)" in said
        now[0] += 10.5  # no call failed on it for longer than the server timeout: a new outage
        took, tried, said = waited(client.stats)
        assert 10 <= took < 12 and tried > 5 and f"it has been failing for {took:.0f} s (server timeout 10 s)" in said


def test_a_server_timeout_shorter_than_the_backoff_between_attempts_still_ends_the_wait():
    """A call's attempts back off from 0.05 to 2 s: with a server timeout under that (0.2 s), the gap between two of
    its own attempts is no quiet time that ends the outage, so the call gives up once the shard has failed for the
    server timeout (it does not wait for ever). A stand-in fails every call under a fake clock."""
    now, clock = _fake_clock()

    attempts = []

    def attempt(call, timeout_s, interruptible):
        attempts.append(now[0])
        if len(attempts) > 20:  # the call would go on for ever: end it here
            raise AssertionError(f"{len(attempts) - 1} attempts in {now[0] - 1000:.2f} s, and still waiting")
        return RefusedCall(grpc.StatusCode.UNAVAILABLE, "Connection refused")  # nothing listens there

    failing = r"it has been failing for 0 s \(server timeout 0.2 s\)"
    with (
        _client_on(clock, attempt, timeout_s=1, server_timeout_s=0.2) as client,
        pytest.raises(ServerUnavailableError, match=failing),
    ):
        client.stats()
    assert 0.2 <= now[0] - 1000 < 0.5 and len(attempts) == 4, attempts


def test_a_shard_that_answers_no_attempt_within_a_deadline_longer_than_the_server_timeout_is_given_up_on():
    """A shard that takes connections but answers nothing (stopped, hung), with a call's deadline longer than the
    server timeout (`ps-worker stats` and export: --timeout-s 600, --server-timeout 30): each attempt fails at
    its deadline, so the failures are a deadline apart, but the attempt in flight was failing all along: the
    outage goes on, and the call gives up at its second failure, as with any other outage (not waiting forever,
    a deadline at a time). A stand-in fails each attempt at its deadline under a fake clock."""
    now, clock = _fake_clock()

    attempts = []

    def attempt(call, timeout_s, interruptible):
        attempts.append(now[0])
        if len(attempts) > 10:  # the call would go on for ever: end it here
            raise AssertionError(f"{len(attempts) - 1} attempts in {now[0] - 1000:.0f} s, and still waiting")
        now[0] += timeout_s
        return RefusedCall(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    with _client_on(clock, attempt, timeout_s=600, server_timeout_s=30) as client:
        with pytest.raises(ServerUnavailableError, match=r"it has been failing for 600 s \(server timeout 30 s\)"):
            client.stats()
        assert len(attempts) == 2 and 1200 <= now[0] - 1000 < 1201


def test_a_shrink_or_hold_past_its_deadline_is_not_sent_again_and_a_clock_advance_is_applied_once(servers, sgd1_table):
    """A Shrink (Checkpoint) that outlives its deadline may still apply on the shard: sending it again would decay
    the scores (meet its own hold) twice, so the client raises instead, having sent it once. A clock advance is a
    PushBatch under the client's request numbers: sent again, and applied once."""
    addresses, (server,) = servers(1)
    calls = {"shrink": 0, "hold": 0, "push_batch": 0}
    for name in calls:
        real = getattr(server.shard, name)

        def slow(*args, real=real, name=name, **kw):
            calls[name] += 1
            if calls[name] == 1:
                time.sleep(0.6)
            return real(*args, **kw)

        setattr(server.shard, name, slow)
    with Client(addresses, timeout_s=0.2, server_timeout_s=10) as client:
        hold = [ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=5)]
        for method, call in (("Shrink", client.shrink), ("Checkpoint", lambda: client.checkpoint({0: hold[0]}))):
            started = time.monotonic()
            with pytest.raises(ServerUnavailableError, match=rf"did not answer {method} within 0.2 s: it may still be "
                                                             "running there, or be done; it was not sent again"):  # fmt: skip
                call()
            assert time.monotonic() - started < 2  # not the 10 s server timeout
        assert client.advance_clock() == 1  # its first attempt timed out, a later one answered
    assert sent_once("Checkpoint", hold[0]) and not sent_once("Checkpoint", ps_pb2.CheckpointRequest(phase="release"))
    time.sleep(0.8)  # the calls in the server end
    assert calls["shrink"] == 1 and calls["hold"] == 1 and calls["push_batch"] >= 2
    assert server.shard.clock == 1  # advanced once


def test_a_shrink_past_its_deadline_says_to_send_no_other_before_the_next_is_due(servers, sgd1_table):
    """A Shrink past its deadline runs on: the error says to send none before the next one is due (one sent at once,
    with a larger --timeout-s, would decay the rows a second time), where the shard's log says it ended and how long
    it took, and that a --timeout-s past that fits the next one."""
    addresses, (server,) = servers(1)
    real, ended = server.shard.shrink, threading.Event()

    def slow(*args, **kw):
        time.sleep(0.6)
        try:
            return real(*args, **kw)
        finally:
            ended.set()

    server.shard.shrink = slow
    with Client(addresses, timeout_s=0.2, server_timeout_s=10) as client, pytest.raises(ServerUnavailableError) as e:
        client.shrink()
    assert ended.wait(30)  # the Shrink in the server ends
    assert str(e.value).endswith(
        "did not answer Shrink within 0.2 s: it may still be running there, or be done; it was not sent again, since "
        "a repeat would apply it once more (send no Shrink before the next one is due: one sent again would decay the "
        "rows this one shrank a second time; the shard's log says how far it got, and 'shrink at step ...' with the "
        "seconds it took once it ended: a --timeout-s past those gives the next Shrink of these tables the time it "
        "needs)"
    )


def test_a_call_its_shard_cancelled_is_sent_again_unless_it_could_apply_twice(servers, sgd1_table):
    """A stopping server cancels the calls it has not finished (CANCELLED): a push is sent again (applied once:
    it carries its request number), a Shrink is not (it may have run), and says so."""
    addresses, (server,) = servers(1)
    calls = {"push_batch": 0, "shrink": 0}
    for name in calls:
        real = getattr(server.shard, name)

        def cancelled_once(*args, real=real, name=name, **kw):
            calls[name] += 1
            if calls[name] == 1:  # the push is applied, then its call cancelled: the retry must not apply it again
                if name == "push_batch":
                    real(*args, **kw)
                raise CallerGoneError("cancelled, as a stopping server cancels the calls it has not finished")
            return real(*args, **kw)

        setattr(server.shard, name, cancelled_once)
    ids = random_ids(10)
    with Client(addresses, timeout_s=10, server_timeout_s=30) as client:
        client.create_table(sgd1_table)
        client.push("emb", ids, np.ones((len(ids), 4), np.float32))
        np.testing.assert_array_equal(client.pull("emb", ids), initial(sgd1_table, ids) - 1)  # applied once
        with pytest.raises(ServerUnavailableError, match=r"cancelled Shrink \(is it stopping\?\): it may still be "
                                                         "running there, or be done; it was not sent again"):  # fmt: skip
            client.shrink()
    assert calls == {"push_batch": 2, "shrink": 1}


@pytest.mark.parametrize("refusal", [StorageError, TableBusyError])
def test_a_shrink_its_shard_says_stopped_part_way_raises_the_shards_refusal_not_a_lost_connection(servers, refusal):
    """A Shrink whose shard answers that it stopped part way (INTERNAL, or UNAVAILABLE: a status the client retries;
    its words PARTLY_APPLIED) is not sent again, and raises the class the shard named with the shard's own words:
    the shard answered, so it did not die, and its answer says what of the Shrink stands."""
    from ps.engine.shrinkprogress import ShrinkProgress

    addresses, (server,) = servers(1)
    progress = ShrinkProgress(["a", "b"])
    progress.wrote("a", 30, 2)
    said = str(progress.refusal(refusal("table 'a' failed: disk gone; nothing was applied")))
    calls = []

    def stops_part_way(*args, **kwargs) -> dict:
        calls.append(args)
        raise refusal(said)

    server.shard.shrink = stops_part_way
    with Client(addresses, timeout_s=10, server_timeout_s=30) as client, pytest.raises(PsError) as refused:
        client.shrink()
    assert type(refused.value) is refusal and len(calls) == 1
    assert str(refused.value) == f"shard 0 at {addresses[0]}: Shrink failed with {refusal.status}: {said}"


def test_a_shrink_stopped_part_way_by_a_shard_now_gone_keeps_the_shards_words(servers):
    """A Shrink whose shard answers UNAVAILABLE that it stopped part way (PARTLY_APPLIED), the shard's process gone
    since (a local shard that exited): the shard's refusal, its class and its words of what stays, and that the
    shard is gone, not the gone shard alone."""
    from ps.engine.shrinkprogress import ShrinkProgress

    addresses, (server,) = servers(1)
    progress = ShrinkProgress(["a", "b"])
    progress.wrote("a", 30, 2)
    said = str(progress.refusal(TableBusyError("table 'a' failed: disk gone; nothing was applied")))
    gone = "local shard 0 (pid 7) exited with code 1, and a local shard is not restarted"

    def stops_part_way(*args, **kwargs) -> dict:
        raise TableBusyError(said)

    server.shard.shrink = stops_part_way
    client = Client(addresses, timeout_s=10, server_timeout_s=30, shard_gone=lambda shard: gone)
    with client, pytest.raises(PsError) as refused:
        client.shrink()
    assert type(refused.value) is TableBusyError
    assert str(refused.value) == f"shard 0 at {addresses[0]}: Shrink failed with UNAVAILABLE: {said}; since then {gone}"


def test_a_call_is_sent_again_while_another_of_its_batch_still_waits(servers):
    """A stamped call can wait on one shard (at a barrier) for what the retry of another, on a restarted shard,
    brings: each call of a batch is sent again on its own, not once the whole batch has answered."""
    addresses, _ = servers(2)
    retried = threading.Event()

    attempts = []

    def attempt(call, timeout_s, interruptible):
        attempts.append(call[1])
        if call[1] == 0:  # waits, as at a barrier, until shard 1's call is sent again
            assert retried.wait(10), "shard 1's call was not sent again while shard 0's waited"
            return "reply 0"
        if attempts.count(1) == 1:
            return RefusedCall(grpc.StatusCode.UNAVAILABLE, "restarting")
        retried.set()
        return "reply 1"

    with Client(addresses, timeout_s=5, server_timeout_s=30) as client:
        client._attempt = attempt
        done: set[int] = set()
        assert client._call_mixed([("PullBatch", 0, None), ("PullBatch", 1, None)], done) == ["reply 0", "reply 1"]
    assert done == {1} and attempts.count(1) == 2


def test_a_channel_whose_close_hangs_does_not_hold_the_client(servers, caplog):
    addresses, _ = servers(1)
    client = Client(addresses, timeout_s=5)
    released = threading.Event()
    real_close = client._channels[0].close
    client._channels[0].close = lambda: released.wait(30)  # as seen once after a SIGTERM inside a call
    started = time.monotonic()
    client.close(timeout_s=0.5)
    assert time.monotonic() - started < 5 and "did not close within 0.5 s; going on without them" in caplog.text
    released.set()
    real_close()


def test_call_threads_run_calls_at_once_on_reused_daemon_threads():
    import threading as _threading

    from worker.fanout import CallThreads

    calls = CallThreads()
    gate = _threading.Barrier(3, timeout=10)  # three calls must be in flight together to pass it
    futures = [calls.submit(gate.wait) for _ in range(3)]
    assert sorted(f.result(timeout=10) for f in futures) == [0, 1, 2]
    threads = {t for t in _threading.enumerate() if t.name == "ps-call"}
    assert len(threads) >= 3 and all(t.daemon for t in threads)
    failed = calls.submit(int, "not a number")
    with pytest.raises(ValueError, match="invalid literal"):
        failed.result(timeout=10)
    for _ in range(20):  # one at a time: the idle threads take them, no new ones start
        calls.submit(len, "abc").result(timeout=10)
    assert {t for t in _threading.enumerate() if t.name == "ps-call"} <= threads


def test_call_threads_end_when_closed():
    import threading as _threading

    from worker.fanout import CallThreads

    calls = CallThreads()
    gate = _threading.Barrier(2, timeout=10)
    futures = [calls.submit(gate.wait) for _ in range(2)]
    assert sorted(f.result(timeout=10) for f in futures) == [0, 1]
    mine = [t for t in _threading.enumerate() if t.name == "ps-call" and t.is_alive()]
    calls.close()
    with pytest.raises(RuntimeError, match="closed"):
        calls.submit(len, "x")
    deadline = time.monotonic() + 10
    while sum(t.is_alive() for t in mine) > len(mine) - 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(t.is_alive() for t in mine) <= len(mine) - 2  # this instance's two threads ended


def test_a_server_list_that_mixes_two_clusters_shards_is_refused(tmp_path):
    """Two 2-shard clusters named a and b: shard 0 of a with shard 1 of b passes every shard-id check but not the
    names; one cluster's list is fine, and so is an unnamed cluster."""
    from ps.server import Server
    from ps.server_config import ServerConfig

    started = {}
    for name in ("a", "b", ""):
        for i in range(2):
            config = ServerConfig(data_dir=str(tmp_path / f"{name or 'none'}-{i}"), shard_id=i, num_shards=2, port=0,
                                  cluster=name)  # fmt: skip
            started[name, i] = Server(config)
            started[name, i].start()
    try:
        address = {k: f"127.0.0.1:{s.port}" for k, s in started.items()}
        for name in ("a", "b", ""):
            with Client([address[name, 0], address[name, 1]]) as client:
                client.wait_ready()
        for mixed, said in (
            ((("a", 0), ("b", 1)), "says 'a', .* says 'b'"),
            ((("", 0), ("a", 1)), "says '\\(unnamed\\)'"),
        ):
            with (
                Client([address[k] for k in mixed]) as client,
                pytest.raises(PsError, match="mixes clusters: .*" + said),
            ):
                client.wait_ready()
        with pytest.raises(ValueError, match="--cluster 'a b': expected at most 64 letters"):
            ServerConfig(data_dir=str(tmp_path / "x"), cluster="a b").validate()
    finally:
        for s in started.values():
            s.stop(grace_s=1)


def _push_while_held(servers, table: TableConfig, caplog, hold_s: float, released_on: str) -> list[tuple[str, str]]:
    """Creates table on one shard and pushes 4 ids to it while a checkpoint's hold of hold_s seconds is on it, the
    hold released once the client logs a message holding released_on; returns the (level, message) of each record
    worker.client logged meanwhile (INFO and up)."""
    addresses, (server,) = servers(1)
    _, token = server.shard.hold(hold_s)

    class ReleaseOnceSaid(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if released_on in record.getMessage():  # a second release of token releases nothing
                server.shard.release(token)

    release = ReleaseOnceSaid()
    logging.getLogger("worker.client").addHandler(release)
    try:
        with (
            Client(addresses, timeout_s=5.0, server_timeout_s=30.0) as client,
            caplog.at_level("INFO", "worker.client"),
        ):
            client.create_table(table)
            client.push(table.name, np.arange(4, dtype=np.uint64), np.ones((4, table.dim), np.float32))
    finally:
        logging.getLogger("worker.client").removeHandler(release)
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "worker.client"]


def test_a_push_held_by_a_checkpoint_waits_and_says_so_at_info_not_as_an_outage(servers, sgd1_table, caplog):
    """A checkpoint holds pushes for seconds, routinely: the client waits it out, logging at INFO only. The hold
    ends once the client has said it waits (not after a fixed time, which a slow start could outlast)."""
    said = _push_while_held(servers, sgd1_table, caplog, hold_s=60, released_on="is taking a checkpoint")
    assert [level for level, _ in said] == ["INFO", "INFO"], said
    assert "shard 0 is taking a checkpoint" in said[0][1] and "is back after" in said[1][1]


def test_a_checkpoints_pause_that_lasts_is_warned_about_once_and_its_end_too(servers, sgd1_table, caplog, monkeypatch):
    """A pause past LONG_PAUSE_S (a large shard's save, or the holds of a saver that died, which last until their
    --hold-timeout-s) is no routine one: the client says so once at WARNING, what holds the shard and how long it
    waits, and its end at WARNING too; a worker is not left silent for minutes. (LONG_PAUSE_S 0.5 s here; the hold
    ends once the client has warned, else it expires after 5 s.)"""
    from worker import retry

    monkeypatch.setattr(retry, "LONG_PAUSE_S", 0.5)
    said = _push_while_held(servers, sgd1_table, caplog, hold_s=5, released_on="has refused pushes for")
    assert [level for level, _ in said] == ["INFO", "WARNING", "WARNING"], said
    assert "shard 0 is taking a checkpoint" in said[0][1], said
    assert "shard 0 at " in said[1][1] and "has refused pushes for " in said[1][1], said
    assert "s: a checkpoint holds them (" in said[1][1] and "--hold-timeout-s); waiting for it for up to" in said[1][1]
    assert "is back after" in said[2][1], said


def test_a_shard_that_fails_during_a_checkpoints_pause_is_warned_about(caplog):
    """The pause is told at INFO; a failure of another kind while it lasts is an outage: a WARNING."""

    def unavailable(details: str) -> RefusedCall:
        return RefusedCall(grpc.StatusCode.UNAVAILABLE, details)

    with Client(["127.0.0.1:1"], server_timeout_s=30) as client, caplog.at_level("INFO", "worker.client"):
        assert client._outages.keep_waiting(
            0, unavailable("shard 0 is taking a checkpoint; retry shortly"), client.server_timeout_s, time.monotonic()
        )
        assert client._outages.keep_waiting(
            0, unavailable("Connection refused"), client.server_timeout_s, time.monotonic()
        )
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "worker.client"]
    assert [level for level, _ in said] == ["INFO", "WARNING"], said
    assert "is unavailable (connection refused: nothing listens there) after a checkpoint's pause" in said[1][1]


@pytest.mark.parametrize(("server_timeout_s", "lasted_s"), [(5.0, 11.0), (15.0, 20.0)])
@pytest.mark.parametrize("then", ["shard 0 is taking a checkpoint; retry shortly", "Connection refused"])
def test_a_pause_past_the_clients_wait_is_not_warned_about_as_waited_for(caplog, server_timeout_s, lasted_s, then):
    """A checkpoint's pause that has lasted past server_timeout_s (shorter than LONG_PAUSE_S, or spent by an earlier
    call of the same outage), then a call's failure of either kind: the call waits no more, and no warning offers
    to wait a negative time; with time left, the same failure is warned about, saying what is left."""
    from worker.retry import LONG_PAUSE_S, Outages

    def unavailable(details: str) -> RefusedCall:
        return RefusedCall(grpc.StatusCode.UNAVAILABLE, details)

    paused = unavailable("shard 0 is taking a checkpoint; retry shortly")
    for timeout_s, waits in ((server_timeout_s, False), (lasted_s + 60, True)):
        outages = Outages(["127.0.0.1:1"])
        with caplog.at_level("INFO", "worker.client"):
            assert outages.keep_waiting(0, paused, timeout_s, time.monotonic())
            outages.down[0] -= lasted_s  # the pause began lasted_s ago (>= LONG_PAUSE_S)
            caplog.clear()
            assert outages.keep_waiting(0, unavailable(then), timeout_s, time.monotonic()) is waits
        said = [r.getMessage() for r in caplog.records if r.name == "worker.client" and r.levelname == "WARNING"]
        assert lasted_s >= LONG_PAUSE_S and len(said) == waits, said
        assert all(f"waiting for it for up to {timeout_s - lasted_s:.0f} s more" in m for m in said), said


def test_a_host_name_that_does_not_resolve_is_said_so():
    from worker.channels import why_not_ready

    said = why_not_ready("no-such-host.invalid:5000", (None, None, None))  # .invalid never resolves (RFC 2606)
    assert said.startswith("; its host name 'no-such-host.invalid' does not resolve ("), said


def test_a_refusal_is_raised_as_the_class_the_server_named_where_it_has_the_status():
    from ps.diskfull import DiskFullError
    from ps.errornames import error_class
    from ps.errors import CheckpointHoldError, DataDirLostError, PsError, TableNotFoundError, WrongShardError

    assert error_class("FAILED_PRECONDITION", "DataDirLostError") is DataDirLostError
    assert error_class("FAILED_PRECONDITION", "CheckpointHoldError") is CheckpointHoldError
    assert error_class("RESOURCE_EXHAUSTED", "DiskFullError") is DiskFullError
    assert error_class("FAILED_PRECONDITION", None) is WrongShardError  # no name: the status's class
    assert error_class("NOT_FOUND", "DataDirLostError") is TableNotFoundError  # a name of another status: ignored
    assert error_class("FAILED_PRECONDITION", "SystemExit") is WrongShardError  # no PsError: ignored
    assert error_class("UNIMPLEMENTED", None) is PsError


def test_a_refusals_fields_cross_percent_encoded_and_only_within_their_bound():
    """A DiskFullError's fields cross as printable ASCII ("%", a newline and UTF-8 percent-encoded) and come back
    whole; fields over MAX_FIELDS_BYTES together are left out, the class still named, and the client's copy then
    has its message alone, its remedy included (not RETRY: not known)."""
    from ps.diskfull import RETRY, DiskFullError
    from ps.errornames import MAX_FIELDS_BYTES, error_fields, error_metadata
    from ps.errors import TableNotFoundError

    odd = "/d/donn\u00e9es 100%\nx"
    e = DiskFullError.of("Disk quota exceeded", f"the journal in {odd}", disk=odd)
    metadata = error_metadata(e)
    assert all(v.isascii() and v.isprintable() for _, v in metadata), metadata
    assert ("sparseps-error-disk", "/d/donn%C3%A9es 100%25%0Ax") in metadata
    fields = error_fields(metadata)
    assert fields == {"reason": "Disk quota exceeded", "what": f"the journal in {odd}", "disk": odd,
                      "outcome": "nothing was applied", "remedy": RETRY}  # fmt: skip
    copy = DiskFullError.received("shard 0 at h:1: Push failed with RESOURCE_EXHAUSTED: " + str(e), "head: ", fields)
    assert (copy.reason, copy.what, copy.disk, copy.remedy) == (e.reason, "head: " + e.what, odd, RETRY)

    wide = DiskFullError.of("No space left on device", "the journal in /d", disk="/" + "\u00e9" * 600)  # 6 x 600
    assert MAX_FIELDS_BYTES < 6 * 600
    assert error_metadata(wide) == (("sparseps-error", "DiskFullError"),)
    alone = DiskFullError.received("head: " + str(wide), "head: ", error_fields(error_metadata(wide)))
    assert (alone.reason, alone.what, alone.disk, alone.outcome, alone.remedy) == ("", "", "", "", "")
    assert error_metadata(TableNotFoundError("no table")) == (("sparseps-error", "TableNotFoundError"),)


def error_classes() -> list[type]:
    """Every PsError class that ps/errors.py and ps/diskfull.py define, PsError included."""
    import inspect

    from ps import diskfull, errors

    return [c for m in (errors, diskfull) for _, c in inspect.getmembers(m, inspect.isclass)
            if issubclass(c, errors.PsError) and c.__module__ == m.__name__]  # fmt: skip


def test_every_server_side_error_class_can_be_named_to_the_client():
    """Each PsError of ps/errors.py and ps/diskfull.py is in SERVER_ERRORS (the client raises it by name) unless it
    is one the client raises itself: a class missing there reaches the client as its status's class
    (FAILED_PRECONDITION: WrongShardError, whose message is about slot maps)."""
    from ps import errornames

    client_side = {"ClientIdInUseError", "JobIdReusedError", "ServerUnavailableError", "RequestOutcomeUnknownError"}
    classes = {c.__name__ for c in error_classes()}
    named = {c.__name__ for c in errornames.SERVER_ERRORS}
    assert classes - {"PsError"} - client_side == named, (classes - named, named - classes)


def test_every_error_class_with_wire_fields_reads_them_back():
    """PsError.received makes the error of its message alone: each class that sends fields (wire_fields) has its
    own received, which sets them, so no field a shard sends is dropped by the client."""
    from ps import errors

    # classes whose fields take values of a form: sample values of it
    samples = {"RamTierTooSmallError": {"tables": "7", "floor_bytes": "7", "budget": "cache+memory"}}
    senders = [c for c in error_classes() if c.wire_fields]
    assert senders, "no class sends fields"
    for cls in senders:
        assert cls.received.__func__ is not errors.PsError.received.__func__, cls.__name__
        fields = {name: samples.get(cls.__name__, {}).get(name, f"{name} value") for name in cls.wire_fields}
        error = cls.received("head: message", "head: ", fields)
        assert all(str(getattr(error, name)).endswith(fields[name]) for name in cls.wire_fields), cls.__name__
    plain = errors.TableNotFoundError.received("head: no table", "head: ", {"what": "x"})
    assert (type(plain), str(plain), hasattr(plain, "what")) == (errors.TableNotFoundError, "head: no table", False)


def test_the_router_keeps_the_routes_of_few_ids_only_and_routes_the_same_either_way():
    """A dense table's few ids come back every step: their routes are kept; a sparse table's many ids, of another
    count each step, are routed anew and not kept (they filled the cache with copies never asked for again)."""
    from ps.sharding import SlotMap
    from worker import routing

    router = routing.Router(SlotMap.contiguous(3), 3)
    rng = np.random.default_rng(0)
    few = np.unique(rng.integers(0, 2**63, 100).astype(np.uint64))
    many = np.unique(rng.integers(0, 2**63, routing.MAX_ROUTED_IDS + 10).astype(np.uint64))
    first = router.route(few, 8, 1 << 20)
    assert router.route(few, 8, 1 << 20) is first and len(router._routes) == 1  # kept, and reused
    routed = router.route(many, 8, 1 << 20)
    assert len(router._routes) == 1  # not kept
    for ids, routes in ((few, first), (many, routed)):  # every id once, on its slot's owner
        positions = np.concatenate([p for _, p in routes])
        assert sorted(positions.tolist()) == list(range(len(ids)))
        for shard, p in routes:
            assert (router.slot_map.shard_of(ids[p]) == shard).all()


def test_a_shard_past_a_calls_deadline_is_said_to_be_slow_not_down(caplog):
    """A deadline says the shard did not answer in time, which a busy shard does too (requests waiting for their
    memory room): the log says "not answering in time" and why, where a refused connection says "unavailable"."""

    with Client(["127.0.0.1:1", "127.0.0.1:2"], server_timeout_s=30) as client, caplog.at_level("INFO"):
        late = RefusedCall(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        assert client._outages.keep_waiting(0, late, client.server_timeout_s, time.monotonic())
        refused = RefusedCall(grpc.StatusCode.UNAVAILABLE, "Connection refused")
        assert client._outages.keep_waiting(1, refused, client.server_timeout_s, time.monotonic())
    said = [r.getMessage() for r in caplog.records if r.name == "worker.client"]
    assert "shard 0 at 127.0.0.1:1 is not answering in time (DEADLINE_EXCEEDED: Deadline Exceeded; down, or busy: " \
           "its requests may be waiting for their memory room)" in said[0], said  # fmt: skip
    assert "shard 1 at 127.0.0.1:2 is unavailable (connection refused" in said[1], said


def test_a_push_of_several_batches_that_fails_says_what_each_shard_applied(servers, sgd1_table):
    """Each shard gets its batches one per wave, a wave once the one before had every reply: when shard 1 refuses
    its 2nd batch, shard 0 has applied its first two, shard 1 its first, and the third wave is not sent; the error
    says so per shard, and the rows agree. A shard that does not answer in time may apply its batch later: said,
    for a push of one batch too, after that the shard answers a Stats: the deadline may be too short."""
    addresses, shards = servers(2)
    slot_map = SlotMap.contiguous(2)
    ids = random_ids(400, seed=3)
    owner = slot_map.shard_of(ids)
    mine = [np.sort(ids[owner == s])[:39] for s in (0, 1)]  # 3 requests of 13 ids each (Router.route: id and
    # grads, the default counts left out), a batch each
    calls = [0]
    real = shards[1].shard.push_batch

    def second_refused(*args, **kw):
        calls[0] += 1
        if calls[0] == 2:
            raise InvalidArgumentError("refused by the test; nothing was applied")
        return real(*args, **kw)

    shards[1].shard.push_batch = second_refused
    pushed = np.concatenate(mine)
    with Client(addresses, max_request_bytes=13 * (4 * 4 + 8), server_timeout_s=0) as client:
        client.create_table(sgd1_table)
        with pytest.raises(InvalidArgumentError, match=r"refused by the test; nothing was applied\. This push was 6 "
                           r"PushBatch calls; shard 0: 2 of 3 applied; shard 1: 1 of 3 applied, batch 2 failed "
                           r"\(InvalidArgumentError\), 1 not sent$"):  # fmt: skip
            client.push("emb", pushed, np.ones((len(pushed), 4), np.float32))
        applied = np.concatenate([mine[0][:26], mine[1][:13]])
        rest = np.concatenate([mine[0][26:], mine[1][13:]])
        np.testing.assert_array_equal(client.pull("emb", applied), initial(sgd1_table, applied) - 1)
        np.testing.assert_array_equal(client.pull("emb", rest), initial(sgd1_table, rest))

        def slow(*args, **kw):
            time.sleep(0.6)
            return real(*args, **kw)

        shards[1].shard.push_batch = slow
        client.timeout_s = 0.3
        rest = np.concatenate([mine[0][26:], mine[1][13:26]])  # a batch to each shard
        with pytest.raises(ServerUnavailableError, match=r"shard 1 at \S+ did not answer PushBatch within 0.3 s; yet it "
                           r"answered a Stats in \S+ s: it is up, .* time it needs\. This push was 2 PushBatch calls; shard 0: 1 of 1 applied; shard 1: 0 of 1 applied, batch 1 "
                           r"failed \(ServerUnavailableError: it may be applied, now or later, or not\)$"):  # fmt: skip
            client.push("emb", rest, np.ones((len(rest), 4), np.float32))
        time.sleep(0.6)  # shard 1 applies it later
        np.testing.assert_array_equal(client.pull("emb", rest), initial(sgd1_table, rest) - 1)
        with pytest.raises(ServerUnavailableError, match=r"shard 1 at \S+ did not answer PushBatch within 0.3 s; yet it "
                           r"answered a Stats .* time it needs; the push may be applied, now or later, or not$"):  # fmt: skip
            client.push("emb", mine[1][:13], np.ones((13, 4), np.float32))  # one batch


def test_a_push_a_checkpoint_holds_past_the_server_timeout_says_it_was_not_applied_and_how_to_wait(servers, sgd1_table):
    """Every attempt refused by a hold (a save longer than the worker's --server-timeout): the push was not applied,
    and the error says so (not "may be applied"), names the hold and the flag that waits it out; the rows agree.
    Once released, the same push applies once."""
    addresses, shards = servers(2)
    owner = SlotMap.contiguous(2).shard_of(ids := random_ids(200, seed=5))
    one = np.sort(ids[owner == 1])[:10]
    both = np.concatenate([np.sort(ids[owner == 0])[:10], one])
    hint = (r"it was last refused by a checkpoint's hold of its pushes, which lasts while the save runs \(if the "
            r"saver died, until its --hold-timeout-s\): a larger server timeout \(--server-timeout\) waits out a "
            r"longer hold")  # fmt: skip
    with Client(addresses, server_timeout_s=1) as client:
        client.create_table(sgd1_table)
        _, token = shards[1].shard.hold(60)
        with pytest.raises(ServerUnavailableError, match=rf"shard 1 at \S+: PushBatch failed \(UNAVAILABLE: shard 1 is "
                           rf"taking a checkpoint; retry shortly\); it has been failing for \d+ s \(server timeout 1 "
                           rf"s\); {hint}; the push was not applied \(no attempt of it ran\)$") as refused:  # fmt: skip
            client.push("emb", one, np.ones((len(one), 4), np.float32))
        assert not refused.value.ran
        with pytest.raises(ServerUnavailableError, match=rf"{hint}\. This push was 2 PushBatch calls; shard 0: 1 of 1 "
                           r"applied; shard 1: 0 of 1 applied, batch 1 failed \(ServerUnavailableError\)$"):  # fmt: skip
            client.push("emb", both, np.ones((len(both), 4), np.float32))
        shards[1].shard.release(token)
        np.testing.assert_array_equal(client.pull("emb", both[:10]), initial(sgd1_table, both[:10]) - 1)
        np.testing.assert_array_equal(client.pull("emb", one), initial(sgd1_table, one))  # neither push applied
        client.push("emb", one, np.ones((len(one), 4), np.float32))
        np.testing.assert_array_equal(client.pull("emb", one), initial(sgd1_table, one) - 1)


def test_a_batch_push_refused_past_the_server_timeout_after_part_of_it_was_applied_says_it_may_be_applied(
    servers, sgd1_table
):
    """One PushBatch of two tables' pushes: the first is applied, the second refused UNAVAILABLE on every attempt (its
    table busy) until the server timeout. The first attempt ran in part (later ones, sent again under the same request
    number, apply the second push only), so the error says the push may be applied, not that no attempt of it ran; the first push is applied once, the second not at all."""
    (address,), (server,) = servers(1)
    other = dataclasses.replace(sgd1_table, name="other")
    ids = np.arange(1, 11, dtype=np.uint64)
    with Client([address], server_timeout_s=1) as client:
        client.create_table(sgd1_table)
        client.create_table(other)

        def busy(*args, **kwargs) -> int:
            raise TableBusyError("table 'other' is busy; nothing was applied")

        ended = (r"PushBatch failed \(UNAVAILABLE: table 'other' is busy; nothing was applied\); it has been failing "
                 r"for \d+ s \(server timeout 1 s\); the push may be applied, now or later, or not$")  # fmt: skip
        with (
            mock.patch.object(server.shard.table("other"), "push", busy),
            pytest.raises(ServerUnavailableError, match=ended) as refused,
        ):
            client.push_many([("emb", ids, np.ones((10, 4), np.float32)), ("other", ids, np.ones((10, 4), np.float32))])
        assert refused.value.ran
        np.testing.assert_array_equal(client.pull("emb", ids), initial(sgd1_table, ids) - 1)
        np.testing.assert_array_equal(client.pull("other", ids), initial(other, ids))


def test_a_push_keeps_its_messages_within_max_request_bytes(servers):
    """A push carries 4 * dim + 16 bytes an id (id, grads, show, click), less 4 for each count it leaves out at
    its default: a dim-1 push with clicks chunked as a pull is (by its reply, 4 * dim + 8 bytes an id) would send
    messages of 20/12 the size asked for; one without clicks chunked as one with them, messages of 16/20 of it."""
    addresses, _ = servers(2)
    sizes: dict[str, list[int]] = {"PushBatch": []}
    with Client(addresses, max_request_bytes=4000) as client:
        client.create_table(TableConfig("lr", 1, optimizer=OptimizerConfig("sgd", 1.0)))
        real = client._attempt

        def measured(call, *args):
            method, _, request = call
            if method == "PushBatch":
                sizes[method].append(sum(len(p.ids) + len(p.grads) + len(p.shows) + len(p.clicks)
                                         for p in request.pushes))  # fmt: skip
            return real(call, *args)

        client._attempt = measured
        ids = random_ids(1000, seed=5)
        before = client.pull("lr", ids)
        for clicks in (np.ones(len(ids), np.float32), None):  # per id 20 bytes sent, then 16 (clicks left out)
            sizes["PushBatch"].clear()
            client.push("lr", ids, np.ones((len(ids), 1), np.float32), clicks=clicks)
            assert max(sizes["PushBatch"]) <= 4000 < max(sizes["PushBatch"]) + 20  # full messages, none larger
        np.testing.assert_array_equal(client.pull("lr", ids), before - 1 - 1)  # two sgd steps, in float32


def test_a_push_leaves_out_the_default_counts_and_the_shards_count_what_a_loop_counts(servers, sgd1_table):
    """One show and no click per id are the counts a PushRequest may leave out: the client sends shows only where
    an id's are not 1 (it occurs more than once, or the caller gives others), clicks only where one is not 0, each
    on its own; the shards' show and click statistics are what a loop over the pushes counts."""
    addresses, shards = servers(2)
    sent: list[tuple[bool, bool]] = []  # (shows sent, clicks sent) per PushRequest
    ids = random_ids(200, seed=7)
    odd = (np.arange(len(ids)) % 2).astype(np.float32)
    cases = [  # (ids, clicks, shows, (shows sent, clicks sent))
        (ids, None, None, (False, False)),
        (np.concatenate([ids, ids[:50]]), None, None, (True, False)),  # duplicates: their shows summed
        (ids, np.zeros(len(ids)), None, (False, False)),  # no click given is no click
        (ids, odd, None, (False, True)),
        (np.concatenate([ids, ids[:50]]), np.concatenate([odd, odd[:50]]), None, (True, True)),
        (ids, None, np.full(len(ids), 2.0), (True, False)),
        (ids, odd, np.ones(len(ids)), (False, True)),  # one show each given is the default
        (ids, np.zeros(len(ids)), np.zeros(len(ids)), (True, False)),
    ]
    want = {int(i): [0.0, 0.0] for i in ids}  # id: [shows, clicks]
    with Client(addresses) as client:
        client.create_table(sgd1_table)
        real = client._attempt

        def measured(call, *args):
            method, _, request = call
            if method == "PushBatch":
                sent.extend((len(p.shows) > 0, len(p.clicks) > 0) for p in request.pushes)
            return real(call, *args)

        client._attempt = measured
        for pushed, clicks, shows, flags in cases:
            sent.clear()
            client.push_many([PushItem("emb", pushed, np.zeros((len(pushed), 4), np.float32), clicks, shows)])
            assert set(sent) == {flags}, (flags, sent)
            for k, i in enumerate(pushed.tolist()):
                want[i][0] += 1.0 if shows is None else float(shows[k])
                want[i][1] += 0.0 if clicks is None else float(clicks[k])
    owner = SlotMap.contiguous(2).shard_of(ids)
    for s in (0, 1):
        mine = ids[owner == s]
        counts = shards[s].shard.table("emb").peek(mine)[:, -4:-2]  # the statistics: show, click, last_step, admitted
        np.testing.assert_array_equal(counts, [want[i] for i in mine.tolist()])


def test_an_overloaded_shard_refuses_calls_past_its_queue_at_once_and_clients_send_them_again(
    servers, sgd1_table, caplog
):
    """A shard runs --threads calls and lets --max-queued-calls wait for a thread; it refuses a call past them at
    once (RESOURCE_EXHAUSTED, unread), where gRPC would queue calls without bound. A client sends such a call again
    after a pause, as for a shard that is down: a brief overload costs a job time, not its run."""
    addresses, (server,) = servers(1, threads=1, max_queued_calls=1)
    ids = random_ids(8)
    with Client(addresses, timeout_s=10, server_timeout_s=30) as client, caplog.at_level("INFO", "worker.client"):
        client.create_table(sgd1_table)
        with ThreadPoolExecutor(1) as pool, call_slots_taken(server):
            with Client(addresses, server_timeout_s=0) as once, pytest.raises(PsError, match="RESOURCE_EXHAUSTED: "
                                                                              "Concurrent RPC limit exceeded"):  # fmt: skip
                once.stats()  # refused at once, not queued
            pushed = pool.submit(client.push, "emb", ids, np.ones((8, 4), np.float32))
            deadline = time.monotonic() + 10
            while not any("is overloaded" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
                time.sleep(0.01)
        pushed.result(timeout=30)  # sent again once the shard had room
        np.testing.assert_array_equal(client.pull("emb", ids), initial(sgd1_table, ids) - 1)  # applied once
    said = [r.getMessage() for r in caplog.records if r.name == "worker.client"]
    assert "is overloaded (RESOURCE_EXHAUSTED: Concurrent RPC limit exceeded!: every thread of the shard busy and " \
           "its queue of calls full (ps-server --threads, --max-queued-calls); the call was not run)" in said[0], said  # fmt: skip
    assert "is back after" in said[1], said


def test_only_an_overloaded_servers_resource_exhausted_is_sent_again():
    """A shard's own RESOURCE_EXHAUSTED (a request larger than its room, a full disk) names its error and stays
    one; so does gRPC's for a message over its limit."""

    def exhausted(details: str, name: str | None = None) -> RefusedCall:
        return RefusedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, details, ((ERROR_NAME_KEY, name),) if name else ())

    assert retryable(exhausted("Concurrent RPC limit exceeded!"))
    assert not retryable(exhausted("Received message larger than max (600 vs. 500)"))
    assert not retryable(
        exhausted("request needs 1 GiB of room; Concurrent RPC limit exceeded", "RequestTooLargeError")
    )


def test_after_a_signal_stops_a_calls_wait_later_calls_block_instead_of_waiting_on_a_future():
    """A signal's exception (Ctrl-C, a SIGTERM's Terminated) raised while the caller's thread waits on a gRPC
    future can land inside gRPC's bookkeeping of the channel's calls, leaving no thread to poll for completions: a
    later future never completes, deadline included (a worker stopping by SIGTERM hung in stop_job so). After
    such an interrupt the Client makes its calls blocking: here the stop stamp goes by the blocking call, and the
    future is never asked for again."""
    from types import SimpleNamespace

    from ps.stamp import WorkerStamp

    class Method:
        def __init__(self):
            self.blocking, self.futures = 0, 0

        def __call__(self, request, timeout=None):
            self.blocking += 1
            return ps_pb2.PushBatchResponse()

        def future(self, request, timeout=None):
            self.futures += 1
            return SimpleNamespace(result=self.interrupted, cancel=lambda: None)

        def interrupted(self):
            if self.futures > 1:  # a later future: one that would never complete
                raise AssertionError("a call after the interrupt waited on a future")
            raise KeyboardInterrupt

    client = Client(["127.0.0.1:1"], server_timeout_s=0)
    try:
        push = Method()
        client._stubs = [SimpleNamespace(PushBatch=push)]
        with pytest.raises(KeyboardInterrupt):
            client._send([("PushBatch", 0, ps_pb2.PushBatchRequest())], 1.0)
        assert (push.futures, push.blocking) == (1, 0)
        assert client.stop_job(WorkerStamp(job=7, worker=0, num_workers=1, step=0), "interrupted") == []
        assert (push.futures, push.blocking) == (1, 1)
    finally:
        client.close()


def test_a_server_list_out_of_range_is_refused_before_any_channel_opens(monkeypatch):
    """No servers, or more than the slots they own: a ValueError saying which, with no channel left open."""
    from ps.sharding import NUM_SLOTS

    opened = []
    monkeypatch.setattr("worker.shard_calls.open_channels", lambda *args: opened.append(args) or [])
    with pytest.raises(ValueError, match="at least one server address"):
        Client([])
    with pytest.raises(ValueError, match=f"num_shards must be in 1..{NUM_SLOTS}"):
        Client(["127.0.0.1:1"] * (NUM_SLOTS + 1))
    assert opened == []


@pytest.mark.parametrize("stats_slow", [False, True])
def test_a_call_past_its_deadline_on_a_shard_that_answers_stats_says_the_deadline_may_be_too_short(
    servers, stats_slow, monkeypatch
):
    """A big pull on a slow shard: each attempt outlives --timeout-s, and the call ends at the server timeout. Where
    the shard answers a Stats meanwhile, it is up: the error says so and names --timeout-s, not only that the shard
    "has been failing"; where Stats is late too (the shard hung), the error says no more than before."""
    monkeypatch.setattr(
        shard_calls, "PROBE_TIMEOUT_S", 0.3, raising=False
    )  # the Stats asked at the end: late past 0.3 s
    addresses, (server,) = servers(1)
    with Client(addresses, timeout_s=0.2, server_timeout_s=0.5) as client:
        client.wait_ready()
        client.create_table(TableConfig("t", 2))
        for owner, name in ((server.shard.pulls, "pull_batch"), (server.shard, "stats"))[: 1 + stats_slow]:
            real = getattr(owner, name)
            setattr(owner, name, lambda *a, real=real, **kw: (time.sleep(0.4), real(*a, **kw))[1])
        with pytest.raises(ServerUnavailableError, match=r"did not answer PullBatch within 0.2 s; it has been "
                                                         r"failing for \d+ s \(server timeout 0.5 s\)") as caught:  # fmt: skip
            client.pull("t", np.arange(10, dtype=np.uint64))
    said = (r"; yet it answered a Stats in \d\.\d\d s: it is up, and PullBatch may take longer than its deadline "
            r"\(--timeout-s 0.2: .*a larger --timeout-s gives it the time it needs")  # fmt: skip
    if stats_slow:
        assert "answered a Stats" not in str(caught.value)
    else:
        assert re.search(said, str(caught.value)), caught.value

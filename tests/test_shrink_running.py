"""One Shrink at a time on a shard (ps.engine.shrinkprogress ShrinkRunning): a second Shrink sent while the first
scans (a client's whose deadline passed, an operator's) is refused, changing nothing, where it would decay the
rows a second time."""

import re
import threading

import numpy as np
import pytest

from ps.config import EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shrinkprogress import ShrinkProgress, ShrinkRunning
from ps.engine.table import Table
from ps.errors import NOTHING_APPLIED, InvalidArgumentError, ShrinkRunningError
from ps.rows.layout import SHOW
from worker.client import Client

CFG = TableConfig("t", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0),
                  eviction=EvictionConfig(decay=0.5))  # fmt: skip


def test_a_shrink_sent_while_another_runs_is_refused_and_the_rows_are_decayed_once(servers, monkeypatch):
    """The first Shrink's scan stops after its first chunk (written: id 1's 4 shows decayed to 2) until the second
    Shrink, sent from another client, has its answer: FAILED_PRECONDITION saying a Shrink runs, since when, how far
    it got, and to send none before the next is due. The first then ends; id 1 holds 2 shows, not 1."""
    (address,), (server,) = servers(1)
    server.shard.create_table(CFG)
    server.shard.push("t", np.array([1], np.uint64), np.ones((1, 2), np.float32), shows=np.array([4], np.float32),
                      clicks=np.zeros(1, np.float32))  # fmt: skip
    scanning, go_on = threading.Event(), threading.Event()
    scanned = ShrinkProgress.scanned

    def slow_scan(self, table: str, n: int) -> None:
        scanned(self, table, n)
        if not scanning.is_set():  # the first Shrink's first chunk only
            scanning.set()
            go_on.wait(30)

    monkeypatch.setattr(ShrinkProgress, "scanned", slow_scan)
    first: list = []
    with Client([address], timeout_s=30, server_timeout_s=5) as one, Client([address], timeout_s=30) as other:
        thread = threading.Thread(target=lambda: first.append(one.shrink("t")))
        thread.start()
        try:
            assert scanning.wait(30)
            with pytest.raises(ShrinkRunningError) as refused:
                other.shrink("t")
        finally:
            go_on.set()
            thread.join(30)
    assert [r.dropped for r in first[0]] == [0]
    table = server.shard.table("t")
    assert table.peek(np.array([1], np.uint64))[0, table.stats_col + SHOW] == 2.0  # decayed once: 4 * 0.5
    said = str(refused.value)
    assert re.fullmatch(
        rf"shard 0 at {address}: Shrink failed with FAILED_PRECONDITION: shard 0: a Shrink is running \(of table 't', "
        r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, \d+ s ago: 1 of 1 rows scanned so far\); one Shrink at a time: "
        "send no Shrink before the next one is due: one sent now would decay the rows that one shrinks a second time, "
        f"and the next shrinks what it leaves; {NOTHING_APPLIED}",
        said,
    ), said
    with Client([address], timeout_s=30) as client:  # the slot is free once the first ended: 2 shows decayed to 1
        assert [r.dropped for r in client.shrink("t")] == [0]
    assert table.peek(np.array([1], np.uint64))[0, table.stats_col + SHOW] == 1.0


def test_a_shrink_that_failed_frees_the_slot_and_a_refused_one_holds_none():
    """The slot is free again once a Shrink's block raised; a Shrink refused while another runs does not free the
    running one's slot on its way out."""
    running = ShrinkRunning(3)
    with pytest.raises(InvalidArgumentError), running.begin(ShrinkProgress(["a"])):
        raise InvalidArgumentError("a chunk failed")
    assert running.running is None
    first = ShrinkProgress(["a", "b"], rows=10)
    with running.begin(first):
        busy = r"^shard 3: a Shrink is running \(of tables 'a', 'b', .* 0 of 10 "
        with pytest.raises(ShrinkRunningError, match=busy), running.begin(ShrinkProgress(["a"])):
            pass
        assert running.running is first
    assert running.running is None


def test_a_shrink_of_every_table_goes_on_past_an_untrained_table_replaced_while_it_runs(servers, monkeypatch):
    """A Shrink of every table lists them as it begins; table 's', never trained, is replaced by one of another spec
    (CreateTable's replace_untrained, from another client) once table 't' is shrunk. The Shrink ends OK, 't' decayed
    once: 's' held nothing to shrink, and a Shrink that failed there would leave 't' shrunk and tell its caller to
    send no Shrink again."""
    (address,), (server,) = servers(1)
    server.shard.create_table(CFG)
    server.shard.create_table(TableConfig("s", 2, eviction=EvictionConfig(decay=0.5)))
    server.shard.push("t", np.array([1], np.uint64), np.ones((1, 2), np.float32), shows=np.array([4], np.float32),
                      clicks=np.zeros(1, np.float32))  # fmt: skip
    real_shrink = Table.shrink

    def shrink_then_replace(self, clock, progress, **kwargs):
        real_shrink(self, clock, progress, **kwargs)
        if self.name == "t":
            with Client([address], timeout_s=30) as other:
                other.create_table(TableConfig("s", 3, eviction=EvictionConfig(decay=0.5)), replace_untrained=True)

    monkeypatch.setattr(Table, "shrink", shrink_then_replace)
    with Client([address], timeout_s=30) as client:
        assert [(r.dropped, r.num_rows) for r in client.shrink("")] == [(0, 1)]
    assert server.shard.table("s").dim == 3
    table = server.shard.table("t")
    assert table.peek(np.array([1], np.uint64))[0, table.stats_col + SHOW] == 2.0  # decayed once: 4 * 0.5

"""The exactly-once table is bounded (ps.storage.applied): a client's entry is dropped at a flush once it is
REQUEST_RETENTION_S unused, a new client past MAX_CLIENTS is refused, a flush writes only the entries that changed,
a data dir that stored the table the old way (one JSON value) opens and converts; and the Client sends no attempt
of a push once its first attempt is RETRY_WINDOW_S old. Wall time is a fake clock here (ps.storage.applied
.wall_time), the client's window seconds."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

from ps.config import REQUEST_RETENTION_S
from ps.errors import ClientTableFullError, RequestOutcomeUnknownError, ServerUnavailableError, ShardClosingError
from ps.storage import applied as applied_module
from ps.storage.applied import AppliedTable
from ps.storage.meta import APPLIED_PREFIX, APPLIED_VALUE, LEGACY_APPLIED, OLDER_APPLIED_VALUE
from ps.storage.store import Store
from tests.conftest import crash
from tests.test_exactly_once import SUM, A, B, open_shard, push, rows
from worker import retry as retry_module
from worker.client import Client

R = REQUEST_RETENTION_S


class WallClock:
    def __init__(self) -> None:
        self.now = 1.7e9

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def wall(monkeypatch) -> WallClock:
    clock = WallClock()
    monkeypatch.setattr(applied_module, "wall_time", clock)
    return clock


def stored(path) -> tuple[dict, dict, bytes | None]:
    """(applied(), advanced(), the legacy single value) of the data dir's RocksDB (no shard open on it)."""
    store = Store(str(path))
    try:
        return store.meta.applied(), store.meta.advanced(), store._dir.meta_cf.get(LEGACY_APPLIED)
    finally:
        store.close()


def test_a_client_unused_past_the_retention_is_dropped_at_a_flush_and_its_next_request_is_new(tmp_path, wall):
    shard = open_shard(tmp_path)
    assert shard.push_batch([push(A, 1.0)], 1, client=7, client_seq=1) == (1, 1)  # with a clock advance
    wall.now += R - 1
    shard.push_batch([push(B, 1.0)], 0, client=9, client_seq=1)
    shard.flush()
    assert 7 in shard.journal.applied  # R - 1 old: kept
    wall.now += 2
    shard.flush()
    assert 7 not in shard.journal.applied and shard.journal.applied[9] == (1, 1)
    shard.close()
    entries, advanced, _ = stored(tmp_path)
    assert set(entries) == {9} and 7 not in advanced  # its clock advance note went with it

    shard = open_shard(tmp_path)  # nothing brings it back at start-up
    try:
        assert 7 not in shard.journal.applied
        assert shard.push_batch([push(A, 1.0)], 1, client=7, client_seq=2) == (2, 1)  # its next request: applied
        assert (rows(shard, A) == -2).all() and shard.journal.applied[7] == (2, 1)
    finally:
        shard.close()


def test_the_log_line_of_a_drop_counts_one_client_in_the_singular(tmp_path, wall, caplog):
    """The line says "the newest requests of 1 client ...; 1 client kept", not "1 clients"."""
    shard = open_shard(tmp_path)
    try:
        shard.push_batch([push(A, 1.0)], 0, client=7, client_seq=1)
        wall.now += R - 1
        shard.push_batch([push(B, 1.0)], 0, client=9, client_seq=1)
        wall.now += 2
        with caplog.at_level(logging.INFO, logger="ps.storage.applied"):
            shard.flush()
    finally:
        shard.close()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dropped the newest")]
    assert line == ("dropped the newest requests of 1 client from the exactly-once table: unused for more than 7 "
                    "days (clients stop sending a request again before that); 1 client kept"), line  # fmt: skip


def test_a_start_whose_replay_ends_in_a_flush_that_drops_an_aged_entry_starts(tmp_path, wall):
    """kill -9 left journal records, and a client's stored entry aged past the retention while the shard was down:
    the flush that ends the replay drops it (and its clock advance note), and the start goes on."""
    shard = open_shard(tmp_path)
    shard.push_batch([push(A, 1.0)], 1, client=7, client_seq=1)  # with a clock advance: an advanced/ note
    shard.flush()  # client 7's entry is in RocksDB
    wall.now += R + 1
    shard.push_batch([push(B, 1.0)], 0, client=9, client_seq=1)  # a journal record no flush wrote
    crash(shard)
    shard = open_shard(tmp_path)
    try:
        assert 7 not in shard.journal.applied and 7 not in shard.pushes.advanced and shard.journal.applied[9] == (1, 1)
        assert (rows(shard, A) == -1).all() and (rows(shard, B) == -1).all() and shard.clock == 1
    finally:
        shard.close()
    entries, advanced, _ = stored(tmp_path)
    assert set(entries) == {9} and not advanced


@pytest.mark.parametrize("stop", ["flush, then kill -9", "kill -9 before a flush"])
def test_a_retry_within_the_retention_is_applied_once_across_a_restart(tmp_path, wall, stop):
    shard = open_shard(tmp_path)
    shard.push_batch([push(A, 1.0)], 1, client=7, client_seq=1)
    shard.push_batch([push(A, 1.0), push(B, 2.0)], 1, client=7, client_seq=2)
    if stop.startswith("flush"):
        wall.now += R - 60
        shard.flush()  # kept; the journal is trimmed: the entry comes from RocksDB
        assert shard.journal.size_bytes() == 0
    crash(shard)
    if stop.startswith("kill"):
        wall.now += 3 * 86400  # the replay takes place 3 days after the request
    shard = open_shard(tmp_path)
    try:
        if stop.startswith("kill"):
            wall.now += R - 60  # R - 60 after the replay, more than R after the request: a rebuilt entry is kept
        shard.flush()
        assert shard.push_batch([push(A, 1.0), push(B, 2.0)], 1, client=7, client_seq=2) == (2, 0)  # a retry
        assert (rows(shard, A) == -2).all() and (rows(shard, B) == -2).all() and shard.clock == 2
        wall.now += 61  # a retry changes nothing, its time included: R + 1 after the entry's time, dropped
        shard.flush()
        assert 7 not in shard.journal.applied
    finally:
        shard.close()


def test_past_max_clients_a_new_client_is_refused_and_the_known_ones_go_on(tmp_path, wall):
    shard = open_shard(tmp_path)
    try:
        shard.journal.applied.max_clients = 2
        shard.push_batch([push(A, 1.0)], 0, client=1, client_seq=1)
        shard.push_batch([push(A, 1.0)], 0, client=2, client_seq=1)
        with pytest.raises(ClientTableFullError, match="keeps the newest requests of 2 clients.*nothing was applied"):
            shard.push_batch([push(A, 1.0)], 1, client=3, client_seq=1)
        assert (rows(shard, A) == -2).all() and shard.clock == 0 and 3 not in shard.journal.applied
        shard.push_batch([push(A, 1.0)], 0, client=1, client_seq=2)  # a client it holds goes on
        assert shard.push_batch([push(A, 1.0)], 0, client=2, client_seq=1) == (0, 0)  # and a retry is still a retry
        wall.now += R + 1
        shard.flush()  # both dropped: room again
        assert shard.push_batch([push(A, 1.0)], 0, client=3, client_seq=1) == (0, 1)
        assert (rows(shard, A) == -4).all()
    finally:
        shard.close()


def test_a_new_client_refused_by_a_full_table_gets_client_table_full_error(servers):
    addresses, started = servers(1)
    started[0].shard.journal.applied.max_clients = 1
    with Client(addresses) as first, Client(addresses) as second:
        first.create_table(SUM)
        first.push("sum", A, np.ones((len(A), 2), np.float32))
        with pytest.raises(ClientTableFullError, match="takes no new client"):
            second.push("sum", A, np.ones((len(A), 2), np.float32))
        np.testing.assert_array_equal(first.pull("sum", A), np.full((len(A), 2), -1.0))


def test_new_clients_refused_by_a_full_table_give_one_warning(servers, caplog):
    """A caller making a new client per request meets the full table again and again: one WARNING line (the
    servicer's, ps.refusals: its count later), not that and a shard's line of the same text as well."""
    caplog.set_level(logging.INFO)
    addresses, started = servers(1)
    started[0].shard.journal.applied.max_clients = 1
    with Client(addresses) as first:
        first.create_table(SUM)
        first.push("sum", A, np.ones((len(A), 2), np.float32))
    for _ in range(3):
        with Client(addresses) as other, pytest.raises(ClientTableFullError):
            other.push("sum", A, np.ones((len(A), 2), np.float32))
    told = [r for r in caplog.records if "keeps the newest requests of 1 client, the most" in r.getMessage()]
    assert [(r.name, r.levelno) for r in told] == [("ps.service", logging.WARNING)], told


def test_a_flush_writes_only_the_entries_changed_since_the_last_one(tmp_path, wall, monkeypatch):
    shard = open_shard(tmp_path)
    written = []
    set_flushed_seq = shard.store.meta.set_flushed_seq

    def record(seq, changes=None):
        written.append(changes)
        set_flushed_seq(seq, changes)

    monkeypatch.setattr(shard.store.meta, "set_flushed_seq", record)
    for client in range(1, 201):
        shard.push_batch([push(A[:1], 1.0)], 0, client=client, client_seq=1)
    shard.flush()
    assert len(written[-1].written) == 200
    changed = list(range(50, 60))
    for client in changed:
        shard.push_batch([push(A[:1], 1.0)], 0, client=client, client_seq=2)
    shard.push_batch([push(A[:1], 1.0)], 0, client=7, client_seq=1)  # a retry changes nothing
    shard.flush()
    assert sorted(written[-1].written) == changed and not written[-1].dropped
    shard.flush()
    assert not written[-1].written
    assert not shard.pushes._client_locks  # a client's lock lives only while a request of it is in flight
    shard.close()
    entries, _, legacy = stored(tmp_path)
    assert len(entries) == 200 and legacy is None
    assert all(entries[c][:2] == ((2, 1) if c in changed else (1, 1)) for c in range(1, 201))


def write_the_old_way(path, table: dict[int, tuple[int, int]]) -> None:
    """Rewrites the data dir's exactly-once table as versions before "applied/" stored it: one JSON value."""
    store = Store(str(path))
    try:
        for client in list(store.meta.applied()):
            store._dir.meta_cf.delete(APPLIED_PREFIX + client.to_bytes(8, "big"))
        store._dir.meta_cf.put(LEGACY_APPLIED, json.dumps({str(c): list(v) for c, v in table.items()}).encode())
    finally:
        store.close()


def test_a_data_dir_with_the_old_single_applied_value_opens_keeps_its_entries_and_converts(tmp_path, wall):
    shard = open_shard(tmp_path)
    shard.push_batch([push(A, 1.0), push(B, 1.0)], 0, client=7, client_seq=3)
    shard.push_batch([push(B, 1.0)], 0, client=2**63 + 5, client_seq=4)  # a sync key: the top bit set
    shard.close()
    write_the_old_way(tmp_path, {7: (3, 2), 2**63 + 5: (4, 1)})
    assert json.loads(stored(tmp_path)[2]) == {"7": [3, 2], str(2**63 + 5): [4, 1]}

    shard = open_shard(tmp_path)
    try:
        assert shard.journal.applied == {7: (3, 2), 2**63 + 5: (4, 1)}
        assert shard.push_batch([push(A, 1.0), push(B, 1.0)], 0, client=7, client_seq=3) == (0, 0)  # a retry
        assert (rows(shard, A) == -1).all() and (rows(shard, B) == -2).all()
        shard.flush()  # converts
    finally:
        shard.close()
    entries, _, legacy = stored(tmp_path)
    now = math.ceil(wall.now)  # the old value kept no digests: unknown (0), and a retry records none
    assert legacy is None and entries == {7: (3, 2, now, 0), 2**63 + 5: (4, 1, now, 0)}
    shard = open_shard(tmp_path)
    try:
        assert shard.journal.applied == {7: (3, 2), 2**63 + 5: (4, 1)}
    finally:
        shard.close()


def test_the_table_and_the_store_match_a_dict_model_under_random_notes_flushes_and_reopens(tmp_path, wall):
    """Random notes (with a digest of the request, or none: 0), time steps, flushes (a fifth of them failing: put
    back), and reopens from what RocksDB holds, against a dict model: client -> (seq, parts, time of its last
    change, digest), dropped once older than the retention at a flush. A note that does not move an entry gives
    it the digest it lacks, for that request; a note of no digest keeps the request's."""
    rng = np.random.default_rng(11)
    store = Store(str(tmp_path))
    table, model, held = AppliedTable(retention_s=100.0), {}, {}  # held: what RocksDB should hold
    try:
        for op in range(4000):
            r = rng.random()
            if r < 0.6:
                client, seq, part = int(rng.integers(1, 50)), int(rng.integers(1, 8)), int(rng.integers(-1, 3))
                digest = [0, seq, 2**64 - seq][int(rng.integers(0, 3))]
                table.note(client, seq, part, digest)
                old = model.get(client)
                same = old is not None and old[0] == seq
                if old is None or old[:2] < (seq, part + 1):
                    model[client] = (seq, part + 1, wall.now, digest or (old[3] if same else 0))
                elif same and digest and not old[3]:
                    model[client] = (*old[:3], digest)
            elif r < 0.8:
                wall.now += float(rng.integers(0, 30))
            elif r < 0.97:
                changes = table.take_changes()
                model = {c: e for c, e in model.items() if wall.now - e[2] <= 100.0}
                if rng.random() < 0.2:
                    table.put_back(changes)  # the write failed
                    continue
                store.meta.set_flushed_seq(op, changes)
                held = dict(model)
                assert store.meta.applied() == held
            else:  # a restart that lost what no flush wrote (a journal's replay would bring it back)
                table = AppliedTable(retention_s=100.0)
                table.load(store.meta.applied())
                model = dict(held)
            assert dict(table) == {c: e[:2] for c, e in model.items()}
            assert all(table.entry(c)[2:] == e[2:] for c, e in model.items())
    finally:
        store.close()


WINDOW_S = 3.0  # the client's retry window here: room for a few attempts on a loaded machine


def test_the_client_gives_up_on_a_push_past_the_retry_window_saying_its_outcome_is_unknown(servers, monkeypatch):
    addresses, started = servers(1)
    shard = started[0].shard
    attempts = []
    push_batch = shard.push_batch

    def apply_then_lose_every_reply(*args, **kwargs):
        result = push_batch(*args, **kwargs)
        attempts.append(result)
        raise ShardClosingError("the server went away before replying")  # UNAVAILABLE: sent again

    with Client(addresses, timeout_s=5, server_timeout_s=1e6) as client:
        client.create_table(SUM)
        client.push("sum", B, np.ones((len(B), 2), np.float32))  # the push's and the flush's kernels compiled
        shard.flush()  # (numba: seconds with a new checkout's cold cache, the table's lock held by a flush) before
        # the window is made short: else the first attempt alone may outlast it
        monkeypatch.setattr(retry_module, "RETRY_WINDOW_S", WINDOW_S)
        monkeypatch.setattr(shard, "push_batch", apply_then_lose_every_reply)
        with pytest.raises(RequestOutcomeUnknownError, match="it may or may not have been applied") as e:
            client.push("sum", A, np.ones((len(A), 2), np.float32))
        assert isinstance(e.value, ServerUnavailableError) and f"within {WINDOW_S / 86400:.3g} days" in str(e.value)
        assert len(attempts) >= 2 and [n for _, n in attempts[1:]] == [0] * (len(attempts) - 1)  # retries: applied once
        monkeypatch.undo()
        np.testing.assert_array_equal(client.pull("sum", A), np.full((len(A), 2), -1.0))


def test_a_client_in_both_the_old_value_and_a_key_keeps_the_newer_request(tmp_path):
    """An older version may write the single value after this one wrote a client's key (a downgrade, then an
    upgrade again): per client the newer (client_seq, parts) of the two holds, whichever place has it."""
    store = Store(str(tmp_path))
    try:
        store._dir.meta_cf.put(APPLIED_PREFIX + (7).to_bytes(8, "big"), OLDER_APPLIED_VALUE.pack(3, 1, 100))
        store._dir.meta_cf.put(APPLIED_PREFIX + (8).to_bytes(8, "big"), APPLIED_VALUE.pack(9, 2, 100, 55))
        store._dir.meta_cf.put(LEGACY_APPLIED, json.dumps({"7": [9, 2], "8": [3, 1], "5": [1, 1]}).encode())
        assert store.meta.applied() == {7: (9, 2, None, 0), 8: (9, 2, 100.0, 55), 5: (1, 1, None, 0)}
    finally:
        store.close()

"""Pushes that add deltas to rows without the optimizer (PushRequest.add_delta, ps.rows.update's ADD_DELTA rule).

Oracles: an add-delta push leaves rows = rows before + delta (float32), the optimizer state bit for bit as it was
(FTRL's z aside: set so that FTRL's own formula gives the new embedding, which a push of zero gradients then keeps),
and shows, clicks, last step, admission and clipping as any push sets them; an optimizer push in the same batch
gives what it gives alone (a second shard applies it as the reference). Journal records keep each push's rule, so
a crash and replay rebuild the rows bit for bit. Non-finite deltas, or deltas whose sum overflows float32, are
refused with INVALID_ARGUMENT and change nothing."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from protos import ps_pb2, ps_pb2_grpc
from ps import codec, wire
from ps.config import AdmissionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.errors import DataLossError, InvalidArgumentError
from ps.rows import update
from ps.rows.layout import ADMITTED, CLICK, LAST_STEP, SHOW, layout_of
from ps.server import grpc_options
from ps.server_config import ServerConfig
from ps.storage import budget as budget_module
from ps.storage.journal import Journal
from ps.storage.journalformat import Record
from tests.conftest import crash, random_ids
from worker.client import Client

ADAGRAD = TableConfig("emb", 4, optimizer=OptimizerConfig("adagrad", 0.1))
ADAM_L2 = TableConfig("adam", 3, optimizer=OptimizerConfig("adam", 0.01), l2=0.5)
ADAGRAD_L2 = TableConfig("l2", 5, optimizer=OptimizerConfig("adagrad", 0.2), l2=0.3)
MIXED = TableConfig("mixed", 4, optimizer=OptimizerConfig("adagrad", 0.1), weight_bound=2.0, l2=0.1,
                    admission=AdmissionConfig(min_count=2))  # fmt: skip
TINY_RAM_TIER = 8 * layout_of(4, "adagrad").ram_bytes  # 8 rows of MIXED: pushes of 5+ ids are chunked
F32 = np.float32


def open_shard(path, cache_bytes: int = 2 << 30) -> Shard:
    """A shard whose flusher never fires on its own: what a crash loses is in the journal only."""
    return Shard(ServerConfig(data_dir=str(path), cache_bytes=cache_bytes, flush_interval_s=3600))


def bits(rows: np.ndarray) -> np.ndarray:
    return rows.view(np.uint32)


def counts(rng: np.random.Generator, n: int, high: int) -> np.ndarray:
    """n counts in [0, high): shows, or clicks (taken at most the shows)."""
    return rng.integers(0, high, n).astype(F32)


@pytest.fixture
def tiny_shares(monkeypatch):
    """A RAM tier of 8 rows holds a table: a share may be one row here (MIN_SHARE_ROWS rows otherwise)."""
    monkeypatch.setattr(budget_module, "MIN_SHARE_ROWS", 1)


@pytest.mark.parametrize("cfg", [ADAGRAD, ADAM_L2, ADAGRAD_L2], ids=lambda c: c.name)
def test_an_add_delta_push_adds_exactly_the_deltas_leaves_the_state_and_counts(tmp_path, cfg):
    shard = open_shard(tmp_path)
    try:
        table = shard.create_table(cfg)
        ids, rng = random_ids(60, seed=3), np.random.default_rng(3)
        shard.push(cfg.name, ids, rng.standard_normal((60, cfg.dim)).astype(F32))  # optimizer state not initial
        shard.advance_clock(4)  # an optimizer push would decay the l2 tables' rows now; a delta is added as it is
        before = table.peek(ids)
        delta = rng.standard_normal((60, cfg.dim)).astype(F32)
        shows = counts(rng, 60, 4)
        clicks = np.minimum(counts(rng, 60, 2), shows)  # at most the shows
        shard.push(cfg.name, ids, delta, shows, clicks, add_delta=True)
        after, dim, sc = table.peek(ids), cfg.dim, table.stats_col
        assert np.abs(delta).min() > 0 and (before[:, dim:sc] != table.loader.initial(ids)[:, dim:sc]).any()
        np.testing.assert_array_equal(bits(after[:, :dim]), bits(before[:, :dim] + delta))
        np.testing.assert_array_equal(bits(after[:, dim:sc]), bits(before[:, dim:sc]))  # optimizer state
        np.testing.assert_array_equal(after[:, sc + SHOW], before[:, sc + SHOW] + shows)
        np.testing.assert_array_equal(after[:, sc + CLICK], before[:, sc + CLICK] + clicks)
        assert (after[:, sc + LAST_STEP] == 4).all() and (after[:, sc + ADMITTED] == 1).all()
        np.testing.assert_array_equal(shard.pull(cfg.name, ids), after[:, :dim])
    finally:
        shard.close()


@pytest.mark.parametrize("l1", [0.0, 0.5])
def test_an_add_delta_push_to_ftrl_rows_lasts_through_later_optimizer_pushes(tmp_path, l1):
    """FTRL computes its embedding from (z, n) at each step: an added delta whose z were left as they were would
    be undone by the next push (early stopping's restore of the best model was, under the small-data recipe's
    FTRL). A push of zero gradients changes neither z nor n, so after it the embedding is FTRL's w of (z, n): the
    one the delta set, n bit for bit as before, rows set to 0 staying 0."""
    cfg = TableConfig("ftrl", 4, optimizer=OptimizerConfig("ftrl", 0.05, {"l1": l1, "l2": 3.0}))
    shard = open_shard(tmp_path)
    try:
        table = shard.create_table(cfg)
        ids, rng = random_ids(50, seed=6), np.random.default_rng(6)
        for _ in range(3):
            shard.push("ftrl", ids, rng.standard_normal((50, 4)).astype(F32))
        before = table.peek(ids)
        target = rng.standard_normal((50, 4)).astype(F32) * 0.1
        target[:10] = 0.0  # a row put back to zero (an id's initial FTRL row)
        shard.push("ftrl", ids, target - before[:, :4], add_delta=True)
        set_rows = table.peek(ids)
        np.testing.assert_allclose(set_rows[:, :4], target, atol=1e-7)
        np.testing.assert_array_equal(bits(set_rows[:, 8:12]), bits(before[:, 8:12]))  # n as it was
        shard.push("ftrl", ids, np.zeros((50, 4), F32))
        np.testing.assert_allclose(shard.pull("ftrl", ids), target, rtol=1e-5, atol=1e-7)
        assert (shard.pull("ftrl", ids)[:10] == 0).all()
    finally:
        shard.close()


def test_admission_and_the_weight_bound_apply_to_deltas(tmp_path):
    """min_count 2: the first push only counts (the row keeps its initial value); the second admits the id and
    adds its delta, clipped to the weight bound."""
    cfg = TableConfig("adm", 3, InitializerConfig("zeros", 0.0), OptimizerConfig("adagrad", 0.1), weight_bound=0.5,
                      admission=AdmissionConfig(min_count=2))  # fmt: skip
    shard = open_shard(tmp_path)
    try:
        table = shard.create_table(cfg)
        ids, delta = random_ids(10, seed=4), np.full((10, 3), 0.25, F32)
        initial = table.peek(ids)
        shard.push("adm", ids, delta, add_delta=True)
        first = table.peek(ids)
        np.testing.assert_array_equal(first[:, : table.stats_col], initial[:, : table.stats_col])
        assert (first[:, table.stats_col + SHOW] == 1).all() and (first[:, table.stats_col + ADMITTED] == 0).all()
        assert table.num_rows == 0 and table.num_pending == 10
        shard.push("adm", ids, delta, add_delta=True)
        assert (shard.pull("adm", ids) == 0.25).all() and table.num_rows == 10  # one delta: the first only counted
        shard.push("adm", ids, 4 * delta, add_delta=True)
        assert (shard.pull("adm", ids) == 0.5).all()  # 1.25 clipped
        assert (table.peek(ids)[:, 3 : table.stats_col] == initial[:, 3 : table.stats_col]).all()
    finally:
        shard.close()


def test_a_push_in_chunks_adds_the_deltas_as_one_in_place(tmp_path, tiny_shares):
    shard = open_shard(tmp_path, cache_bytes=TINY_RAM_TIER)
    try:
        table = shard.create_table(ADAGRAD)
        ids, rng = random_ids(30, seed=5), np.random.default_rng(5)
        assert len(list(table._chunks(len(ids)))) > 1  # the chunked path (computed into buffers, then committed)
        shard.push("emb", ids, rng.standard_normal((30, 4)).astype(F32))
        before = table.peek(ids)
        delta = rng.standard_normal((30, 4)).astype(F32)
        shard.push("emb", ids, delta, add_delta=True)
        after = table.peek(ids)
        np.testing.assert_array_equal(bits(after[:, :4]), bits(before[:, :4] + delta))
        np.testing.assert_array_equal(bits(after[:, 4 : table.stats_col]), bits(before[:, 4 : table.stats_col]))
        np.testing.assert_array_equal(after[:, table.stats_col + SHOW], before[:, table.stats_col + SHOW] + 1)
    finally:
        shard.close()


def mixed_batches(seed: int) -> tuple[np.ndarray, list[list[tuple]]]:
    """(the ids pushed, 8 batches of two pushes each to MIXED), optimizer and add-delta pushes mixed; the first
    and last batches add deltas (to rows never pushed; to the rows a tiny RAM tier holds at the end)."""
    pool, rng = random_ids(24, seed=seed), np.random.default_rng(seed)
    batches = []
    for step in range(8):
        pushes = []
        for _ in range(2):
            ids = rng.choice(pool, size=int(rng.integers(1, 12)), replace=False)
            add_delta = step in (0, 7) or bool(rng.integers(0, 2))
            grads = rng.standard_normal((len(ids), 4)).astype(F32) * (3 if add_delta else 1)
            shows = counts(rng, len(ids), 3)
            pushes.append(("mixed", ids, grads, shows, np.minimum(counts(rng, len(ids), 2), shows), add_delta))
        batches.append(pushes)
    return pool, batches


def apply_batches(shard: Shard, batches: list[list[tuple]]) -> None:
    shard.create_table(MIXED)
    for step, pushes in enumerate(batches):
        shard.push_batch(pushes, advance_clock=1, client=5, client_seq=step + 1)


@pytest.mark.parametrize("ram", ["ample", "tiny"])
def test_replay_after_a_crash_applies_each_record_by_its_rule_bit_for_bit(tmp_path, ram, tiny_shares):
    """Batches mixing optimizer and add-delta pushes (admission, clipping and lazy L2 all in play), clock
    advances between them; then kill -9. With a tiny RAM tier, pushes are chunked and rows are evicted (written
    to RocksDB) along the way. Replay must rebuild every row, optimizer state and statistics bit for bit, as a
    shard that never crashed holds them (the reference; reading the crashed shard's rows before the crash would
    evict, and so write, rows of the tiny RAM tier)."""
    pool, batches = mixed_batches(seed=6)
    cache = TINY_RAM_TIER if ram == "tiny" else 2 << 30
    shard = open_shard(tmp_path / "crashed", cache_bytes=cache)
    apply_batches(shard, batches)
    dirty_in_ram = int(shard.table("mixed").arena.dirty.sum())
    assert shard.store.meta.flushed_seq() == 0 and dirty_in_ram > 0
    crash(shard)
    rules = [r.rule for r in Journal(str(tmp_path / "crashed" / "journal")).replay(0)]
    assert rules == [update.ADD_DELTA if p[-1] else update.OPTIMIZE for pushes in batches for p in pushes]
    assert set(rules) == {update.ADD_DELTA, update.OPTIMIZE}
    reference = open_shard(tmp_path / "reference")
    try:
        apply_batches(reference, batches)
        expected = reference.table("mixed").peek(pool)
    finally:
        reference.close()
    shard = open_shard(tmp_path / "crashed", cache_bytes=cache)
    try:
        np.testing.assert_array_equal(bits(shard.table("mixed").peek(pool)), bits(expected))
        assert shard.clock == len(batches) and shard.journal.applied[5] == (len(batches), 2)
    finally:
        shard.close()


def test_a_journal_record_of_an_unknown_rule_is_refused_at_replay(tmp_path):
    shard = open_shard(tmp_path)
    try:
        table = shard.create_table(ADAGRAD)
        ids = random_ids(3, seed=7)
        record = Record(1, "emb", ids, np.ones((3, 4), F32), np.ones(3, F32), np.zeros(3, F32), 0, rule=7)
        with pytest.raises(DataLossError, match="push rule 7"):
            table.replay(record)
        with pytest.raises(InvalidArgumentError, match="push rule 7 is unknown"):
            table.push(ids, np.ones((3, 4), F32), np.ones(3, F32), np.zeros(3, F32), 0, rule=7)
        assert table.num_rows == 0 and shard.journal.next_seq == 1
    finally:
        shard.close()


# ---- through the servicer and the client ----------------------------------------------------------------------
@pytest.fixture
def served(servers):
    """(stub, shard) of a one-shard server holding table 'emb' (ADAGRAD)."""
    addresses, (server,) = servers(1)
    channel = grpc.insecure_channel(addresses[0], options=grpc_options(64 << 20))
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    stub.CreateTable(ps_pb2.CreateTableRequest(spec=codec.table_config_to_proto(ADAGRAD)))
    yield stub, server.shard
    channel.close()


def push_request(ids, grads, add_delta=False, return_rows=False, table="emb") -> ps_pb2.PushRequest:
    return ps_pb2.PushRequest(table=table, ids=wire.encode_ids(ids), grads=wire.encode_rows(grads), dim=4,
                              add_delta=add_delta, return_rows=return_rows)  # fmt: skip


def test_a_push_batch_applies_each_push_by_its_rule_and_returns_the_rows(served, tmp_path):
    stub, shard = served
    ids, rng = random_ids(40, seed=8), np.random.default_rng(8)
    grads, delta = (rng.standard_normal((40, 4)).astype(F32) for _ in range(2))
    batch = ps_pb2.PushBatchRequest(pushes=[push_request(ids, grads), push_request(ids, delta, True, True)])
    reply = stub.PushBatch(batch)
    reference = open_shard(tmp_path / "reference")  # the optimizer push alone
    try:
        reference.create_table(ADAGRAD)
        reference.push("emb", ids, grads)
        want = reference.table("emb").peek(ids)
    finally:
        reference.close()
    sc = shard.table("emb").stats_col
    want[:, :4] += delta
    want[:, sc + SHOW] += 1
    got = shard.table("emb").peek(ids)
    np.testing.assert_array_equal(bits(got), bits(want))
    assert reply.num_applied == 80 and len(reply.rows) == 1
    np.testing.assert_array_equal(bits(wire.decode_rows(reply.rows[0].rows, 40, 4)), bits(want[:, :4]))
    stub.Push(push_request(ids, -delta, add_delta=True))  # Push takes it too
    np.testing.assert_array_equal(shard.pull("emb", ids), want[:, :4] - delta)


@pytest.mark.parametrize("bad", ["non-finite", "overflow"])
def test_deltas_that_are_or_would_make_rows_non_finite_are_refused_and_change_nothing(served, bad):
    stub, shard = served
    ids = random_ids(20, seed=9)
    stub.Push(push_request(ids, np.full((20, 4), 3e38, F32), add_delta=True))
    table, other = shard.table("emb"), random_ids(5, seed=10)
    before, seq = table.peek(np.concatenate([ids, other])), shard.journal.next_seq
    delta = np.ones((20, 4), F32)
    delta[7, 2] = np.nan if bad == "non-finite" else 3e38  # 3e38 + 3e38 overflows float32
    batch = ps_pb2.PushBatchRequest(pushes=[push_request(ids, delta, True),
                                            push_request(other, np.ones((5, 4), F32), True)])  # fmt: skip
    for call in (lambda: stub.Push(push_request(ids, delta, add_delta=True)), lambda: stub.PushBatch(batch)):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        why = "hold non-finite values" if bad == "non-finite" else f"would make the row of id {ids[7]} non-finite"
        assert why in e.value.details() and "nothing was applied" in e.value.details(), e.value.details()
    np.testing.assert_array_equal(bits(table.peek(np.concatenate([ids, other]))), bits(before))
    assert shard.journal.next_seq == seq


def test_the_client_sends_add_delta_pushes_per_item_and_returns_their_rows(servers, sgd1_table):
    """SGD with lr 1 and small integer grads: every sum is exact, so the oracle is plain float32 arithmetic."""
    addresses, _ = servers(2)
    with Client(addresses) as client:
        client.create_table(sgd1_table)
        ids, rng = random_ids(50, seed=11), np.random.default_rng(11)
        before = client.pull("emb", ids)
        grads = rng.integers(-3, 4, (50, 4)).astype(F32)
        repeated = np.concatenate([ids, ids[:10]])  # duplicate ids' deltas are summed
        deltas = rng.integers(-3, 4, (60, 4)).astype(F32)
        summed = deltas[:50].copy()
        summed[:10] += deltas[50:]
        got = client.push_many([("emb", ids, grads, None), ("emb", repeated, deltas, None)], add_delta=[False, True],
                               return_rows=True)  # fmt: skip
        want = (before - grads) + summed
        np.testing.assert_array_equal(got[1], np.concatenate([want, want[:10]]))
        np.testing.assert_array_equal(got[0], want)  # the rows after the batch
        client.push("emb", ids, -summed, add_delta=True)
        np.testing.assert_array_equal(client.pull("emb", ids), want - summed)
        client.push_many([("emb", ids, grads, None)])  # no flag: the optimizer, as before
        np.testing.assert_array_equal(client.pull("emb", ids), want - summed - grads)
        with pytest.raises(ValueError, match="2 add_delta flags for 1 items"):
            client.push_many([("emb", ids, grads, None)], add_delta=[True, False])

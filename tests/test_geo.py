"""GeoTables against in-process servers and simple oracles: plain optimizer pushes (SGD is linear, so deltas
added every k steps give the same rows), a numpy Adagrad run locally with its deltas added every 4 steps, two
workers that see each other's deltas at their pushes, the shows and clicks the servers count, the memory bound."""

from __future__ import annotations

import numpy as np
import pytest

from ps.config import EvictionConfig, OptimizerConfig, TableConfig
from ps.rows.layout import CLICK, LAST_STEP, SHOW
from ps.rows.pushcheck import MAX_COUNT_PER_ID
from tests.inprocess import InProcessTables
from worker.geo import GeoTables
from worker.idslots import SLOT_BYTES

F32 = np.float32
SGD = TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 0.5), weight_bound=0.02)
ADAGRAD = TableConfig("ada", 3, optimizer=OptimizerConfig("adagrad", 0.1, {"initial_accumulator": 0.2}))


@pytest.fixture
def server():
    tables = InProcessTables(cache_bytes=64 << 20)
    yield tables
    tables.close()


def make_steps(seed: int, n: int, dim: int, pool: int = 60, per_step: int = 20, hot: int = 0) -> list[tuple]:
    """(ids unique sorted, grads, shows, clicks) per step, ids from a pool (and id `hot` every step if given)."""
    rng = np.random.default_rng(seed)
    universe = rng.integers(1, 2**63, pool, dtype=np.uint64)
    out = []
    for _ in range(n):
        ids = np.unique(np.concatenate([rng.choice(universe, per_step), np.array([hot] if hot else [], np.uint64)]))
        shows = rng.integers(1, 4, len(ids)).astype(F32)
        clicks = np.minimum(rng.integers(0, 2, len(ids)), shows).astype(F32)
        out.append((ids, rng.standard_normal((len(ids), dim)).astype(F32) * 0.01, shows, clicks))
    return out


def all_ids(steps: list[tuple]) -> np.ndarray:
    return np.unique(np.concatenate([s[0] for s in steps]))


def train(geo: GeoTables, table: str, steps: list[tuple]) -> list[bool]:
    pushed = []
    for ids, grads, shows, clicks in steps:
        geo.rows({table: ids})
        geo.apply(table, ids, grads, shows, clicks)
        pushed.append(geo.end_step())
    return pushed


def test_sgd_every_step_gives_the_rows_of_plain_pushes(server):
    plain = InProcessTables(cache_bytes=64 << 20)
    try:
        server.create_table(SGD)
        plain.create_table(SGD)
        geo = GeoTables(server, {"emb": SGD}, every=1)
        for ids, grads, shows, clicks in make_steps(0, 25, 4):
            rows = geo.rows({"emb": ids})["emb"]
            np.testing.assert_allclose(rows, plain.pull("emb", ids), rtol=1e-6, atol=1e-9)
            geo.apply("emb", ids, grads, shows, clicks)
            assert geo.end_step()
            plain.push_many([("emb", ids, grads, clicks, shows)])
        ids = all_ids(make_steps(0, 25, 4))
        expected = plain.pull("emb", ids)
        assert np.abs(expected).max() == pytest.approx(0.02)  # the weight bound was reached: clipped locally too
        np.testing.assert_allclose(server.pull("emb", ids), expected, rtol=1e-6, atol=1e-9)
        assert geo.pushes == 25 and geo.ids_pushed == sum(len(s[0]) for s in make_steps(0, 25, 4))
    finally:
        plain.close()


def adagrad_oracle(initial: dict[int, np.ndarray], steps: list[tuple], every: int, cfg: TableConfig) -> dict:
    """Server rows after GEO with a local numpy Adagrad, deltas added every `every` steps and once at the end."""
    lr, p = F32(cfg.optimizer.learning_rate), cfg.optimizer.all_params()
    eps, acc0 = F32(p["epsilon"]), F32(p["initial_accumulator"])
    server = {i: r.copy() for i, r in initial.items()}
    local: dict[int, list[np.ndarray]] = {}  # id -> [w, accumulator, base]
    changed: set[int] = set()

    def push() -> None:
        for i in changed:
            w, _, base = local[i]
            server[i] = server[i] + (w - base)
            local[i][0], local[i][2] = server[i].copy(), server[i].copy()
        changed.clear()

    for k, (ids, grads, _, _) in enumerate(steps):
        for i, g in zip(ids.tolist(), grads):
            if i not in local:
                local[i] = [server[i].copy(), np.full(cfg.dim, acc0, F32), server[i].copy()]
            w, a, _ = local[i]
            a += g * g
            w -= lr * g / (np.sqrt(a) + eps)
            changed.add(i)
        if (k + 1) % every == 0:
            push()
    push()
    return server


def test_adagrad_every_4_steps_matches_a_local_numpy_adagrad_whose_deltas_are_added(server):
    server.create_table(ADAGRAD)
    steps = make_steps(1, 22, 3)
    ids = all_ids(steps)
    initial = dict(zip(ids.tolist(), server.pull("ada", ids)))
    geo = GeoTables(server, {"ada": ADAGRAD}, every=4)
    pushed = train(geo, "ada", steps)
    assert pushed == [(k + 1) % 4 == 0 for k in range(22)]
    assert geo.flush() and not geo.flush()  # steps 21 and 22 were pending; then nothing is
    oracle = adagrad_oracle(initial, steps, 4, ADAGRAD)
    np.testing.assert_allclose(server.pull("ada", ids), np.stack([oracle[i] for i in ids.tolist()]), rtol=1e-5,
                               atol=1e-8)  # fmt: skip
    table = server.shard.table("ada")
    state = table.peek(ids)[:, 3 : table.stats_col]
    assert (state == F32(0.2)).all()  # the servers ran no optimizer: their accumulators are the initial ones
    seen, new_rows_at = set(), 0
    for step_ids, *_ in steps:
        new_rows_at += not set(step_ids.tolist()) <= seen
        seen |= set(step_ids.tolist())
    assert geo.pulls == new_rows_at and geo.ids_pulled == len(ids)  # each row pulled once, then the local copy


def test_the_servers_count_the_shows_and_clicks_of_the_pushed_deltas(server):
    server.create_table(ADAGRAD)
    steps = make_steps(2, 10, 3)
    geo = GeoTables(server, {"ada": ADAGRAD}, every=3)
    train(geo, "ada", steps)
    geo.flush()
    ids = all_ids(steps)
    shows, clicks = dict.fromkeys(ids.tolist(), 0.0), dict.fromkeys(ids.tolist(), 0.0)
    for step_ids, _, s, c in steps:
        for i, si, ci in zip(step_ids.tolist(), s, c):
            shows[i] += si
            clicks[i] += ci
    table = server.shard.table("ada")
    stats = table.peek(ids)[:, table.stats_col :]
    np.testing.assert_array_equal(stats[:, SHOW], [shows[i] for i in ids.tolist()])
    np.testing.assert_array_equal(stats[:, CLICK], [clicks[i] for i in ids.tolist()])
    assert stats[:, CLICK].sum() > 0


def test_two_workers_see_each_others_deltas_at_their_own_pushes(server):
    cfg = TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 0.5))
    server.create_table(cfg)
    a, b = GeoTables(server, {"emb": cfg}, every=2), GeoTables(server, {"emb": cfg}, every=2)
    ids = np.array([3, 5, 8], np.uint64)
    initial = server.pull("emb", ids)
    rng = np.random.default_rng(3)
    total = np.zeros((3, 4), F32)
    for step in range(6):
        for worker in (b, a):  # b pushes first; a's push returns rows with b's deltas in them
            worker.rows({"emb": ids})
            grads = rng.standard_normal((3, 4)).astype(F32)
            worker.apply("emb", ids, grads, 1, 0)
            total -= F32(0.5) * grads
            if worker.end_step() and worker is a:
                np.testing.assert_array_equal(a.rows({"emb": ids})["emb"], server.pull("emb", ids))
                np.testing.assert_allclose(server.pull("emb", ids), initial + total, rtol=1e-5, atol=1e-6)
                assert not np.allclose(b.rows({"emb": ids})["emb"], server.pull("emb", ids))  # b: not before its push
        if step == 0:  # no push yet: a's local rows have its step, the servers' rows none
            assert not np.allclose(a.rows({"emb": ids})["emb"], initial)
            np.testing.assert_array_equal(server.pull("emb", ids), initial)
    assert a.pushes == b.pushes == 3


def test_the_workers_of_a_job_push_their_share_so_the_servers_hold_the_mean_of_their_models(server):
    """N workers that step from the same rows leave on the servers the mean of their local rows, not the sum of
    their steps (which moves a row all of them train N times as far as one worker's step would)."""
    cfg = TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 0.5))
    server.create_table(cfg)
    workers = [GeoTables(server, {"emb": cfg}, every=1, num_workers=3) for _ in range(3)]
    ids = np.array([3, 5, 8], np.uint64)
    initial = server.pull("emb", ids)
    rng = np.random.default_rng(4)
    local = []
    for worker in workers:
        worker.rows({"emb": ids})
        worker.apply("emb", ids, rng.standard_normal((3, 4)).astype(F32), 1, 0)
        local.append(worker.rows({"emb": ids})["emb"].copy())
    for worker in workers:
        assert worker.end_step()
    np.testing.assert_allclose(server.pull("emb", ids), np.mean(local, axis=0), rtol=1e-5, atol=1e-6)
    assert not np.allclose(server.pull("emb", ids), initial + sum(x - initial for x in local), atol=1e-3)
    with pytest.raises(ValueError, match="num_workers >= 1"):
        GeoTables(server, {"emb": cfg}, every=1, num_workers=0)


def test_memory_stays_within_capacity_after_each_push_and_training_stays_exact(server):
    """SGD keeps no state, so rows dropped and pulled again continue exactly: the servers hold the rows of plain
    pushes, clipped to the weight bound, however small the memory."""
    plain = InProcessTables(cache_bytes=64 << 20)
    try:
        server.create_table(SGD)
        plain.create_table(SGD)
        steps = make_steps(4, 40, 4, pool=200, per_step=15, hot=77)
        capacity = 30 * (4 * 4 + 4 * 4 + 9 + SLOT_BYTES)  # 30 rows; a push carries up to 3 x 16 ids
        geo = GeoTables(server, {"emb": SGD}, every=3, capacity_bytes=capacity)
        for ids, grads, shows, clicks in steps:
            geo.rows({"emb": ids})
            geo.apply("emb", ids, grads, shows, clicks)
            plain.push_many([("emb", ids, grads, clicks, shows)])
            if geo.end_step():
                assert geo.bytes_used <= capacity and geo.held("emb", np.array([77], np.uint64)).all()
            else:
                assert geo.local_rows >= 30 or geo.bytes_used <= capacity  # between pushes pending rows stay
        geo.flush()
        assert geo.bytes_used <= capacity and geo.ids_pulled > len(all_ids(steps)) + 50  # dropped rows came back
        ids = all_ids(steps)
        np.testing.assert_allclose(server.pull("emb", ids), plain.pull("emb", ids), rtol=1e-6, atol=1e-9)
    finally:
        plain.close()


def test_a_delta_pushed_after_a_shrink_dropped_its_row_lands_on_the_initial_row(server):
    """A Shrink's drop is final, as a push of any mode finds it: a geo worker's later delta of a dropped id (taken
    from the row it held before the drop) is added to the id's initial row, whose statistics count from that push,
    and the push returns that row to the worker; a dropped row the worker holds but does not change keeps, locally,
    its value from before the drop. Oracle: numpy SGD on the rows, the delta added to the initial rows."""
    cfg = TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 0.5), eviction=EvictionConfig(ttl_steps=2))
    server.create_table(cfg)
    ids = np.array([5, 9], np.uint64)  # 5 trained in both rounds, 9 in the first only
    initial = server.pull("emb", ids)
    geo = GeoTables(server, {"emb": cfg}, every=2)
    rng = np.random.default_rng(7)
    first = [rng.standard_normal((2, 4)).astype(F32) for _ in range(2)]
    train(geo, "emb", [(ids, g, np.ones(2, F32), np.zeros(2, F32)) for g in first])
    trained = initial - F32(0.5) * first[0] - F32(0.5) * first[1]
    np.testing.assert_allclose(server.pull("emb", ids), trained, rtol=1e-6)
    server.advance_clock(10)
    assert server.shard.shrink()["dropped"] == 2  # both last pushed at clock 0, more than 2 steps before 12
    np.testing.assert_array_equal(server.pull("emb", ids), initial)
    second = [rng.standard_normal((1, 4)).astype(F32) for _ in range(2)]
    geo.rows({"emb": ids})
    assert train(geo, "emb", [(ids[:1], g, np.full(1, 3, F32), np.zeros(1, F32)) for g in second]) == [False, True]
    local = trained[0] - F32(0.5) * second[0][0] - F32(0.5) * second[1][0]
    on_server = initial[0] + (local - trained[0])  # the round's delta, on the initial row
    np.testing.assert_allclose(server.pull("emb", ids), [on_server, initial[1]], rtol=1e-5, atol=1e-7)
    assert not np.allclose(on_server, local, atol=1e-3)  # not the worker's row: the trained row is gone
    held = geo.rows({"emb": ids})["emb"]
    np.testing.assert_array_equal(held[0], server.pull("emb", ids[:1])[0])  # the row the push returned
    np.testing.assert_allclose(held[1], trained[1], rtol=1e-6)  # held, unchanged: from before the drop
    table = server.shard.table("emb")
    assert table.peek(ids[:1])[0, table.stats_col + SHOW] == 6  # the shows of its pushes since the drop


def test_a_rounds_counts_past_a_pushs_limit_per_id_are_clipped_to_it_as_a_sync_sum_clips_them(server):
    """A hot id's shows summed over a geo round can pass what one push may carry per id (MAX_COUNT_PER_ID, 2^24:
    an id in every example of batches of 16,384 over --geo-every 2,048 does it), which the servers refuse, and the
    run with them: the round's counts are clipped to that limit, as a sync step's sum of its workers' counts is, and
    the round's delta lands."""
    server.create_table(SGD)
    geo = GeoTables(server, {"emb": SGD}, every=3)
    ids = np.array([7, 8], np.uint64)
    initial = server.pull("emb", ids)
    for _ in range(3):
        geo.rows({"emb": ids})
        geo.apply("emb", ids, np.full((2, 4), 0.001, F32), np.array([2**23, 2], F32), np.array([2**22, 1], F32))
        assert geo.end_step() == (geo.steps == 3)
    table = server.shard.table("emb")
    stats = table.peek(ids)[:, table.stats_col :]
    np.testing.assert_array_equal(stats[:, SHOW], [MAX_COUNT_PER_ID, 6])  # 3 x 2^23 clipped; 6 as summed
    np.testing.assert_array_equal(stats[:, CLICK], [3 * 2**22, 3])  # under the limit: as summed
    np.testing.assert_allclose(server.pull("emb", ids), initial - F32(0.5 * 0.003), rtol=1e-5)  # the deltas landed


def test_apply_needs_the_rows_held_and_every_must_be_positive(server):
    server.create_table(ADAGRAD)
    geo = GeoTables(server, {"ada": ADAGRAD}, every=1)
    with pytest.raises(KeyError, match="not held"):
        geo.apply("ada", np.array([1], np.uint64), np.zeros((1, 3), F32), 1, 0)
    with pytest.raises(ValueError, match="every"):
        GeoTables(server, {"ada": ADAGRAD}, every=0)
    assert not geo.end_step()  # nothing pending: no push


def test_a_geo_worker_stopped_before_its_end_pushes_its_pending_deltas_unless_they_cannot_land():
    """So that the examples a stopped run says it trained (its --skip-examples) are on the servers; not where the
    servers failed, hold another model state or refuse the job."""
    from ps.diskfull import DiskFullError
    from ps.errors import (
        BarrierTimeoutError,
        ClientIdInUseError,
        InvalidArgumentError,
        JobConflictError,
        ModelStateReplacedError,
        PsError,
        RequestTooLargeError,
        ServerUnavailableError,
        WorkerDoneError,
    )
    from worker.steprows import GeoRows
    from worker.stopping import abandon

    class Geo:
        flushes = 0

        def flush(self):
            self.flushes += 1

    geo = Geo()
    abandon(GeoRows(None, geo), KeyboardInterrupt())
    abandon(GeoRows(None, geo), ValueError("a bad line"))
    abandon(GeoRows(None, geo), InvalidArgumentError("grads of table 'mlp' hold a NaN"))  # its own request's fault
    abandon(GeoRows(None, geo), RequestTooLargeError("a PullBatch of 40 MB is over the shard's room"))  # the same
    abandon(GeoRows(None, geo), BarrierTimeoutError("worker 1 did not come"))  # the servers are up
    assert geo.flushes == 5
    abandon(GeoRows(None, geo), ServerUnavailableError("shard 0 did not answer"))
    abandon(GeoRows(None, geo), DiskFullError("shard 0's disk is full"))
    abandon(GeoRows(None, geo), PsError("a server's error of no class the client knows"))
    # refused the same way by some shards and applied by others (worker.retry.pushes_cannot_land):
    abandon(GeoRows(None, geo), JobConflictError("shard 0 trains job 9"))  # another run holds the job
    abandon(GeoRows(None, geo), WorkerDoneError("worker 0 said it is done"))
    abandon(GeoRows(None, geo), ClientIdInUseError("another caller's client id"))
    abandon(GeoRows(None, geo), ModelStateReplacedError("shard 0 holds another model state"))  # the run is void
    failed = GeoRows(None, geo)
    failed._failed = True  # a push of deltas failed: some shards may have applied it
    abandon(failed, KeyboardInterrupt())
    assert geo.flushes == 5


def test_a_geo_worker_stopped_by_a_refusal_that_stops_its_job_pushes_no_deltas(caplog):
    """A shard's refusal that stopped the job (its words: 'job J stops') is no fault of the worker's own request:
    the shards that have not stopped the job yet would apply the deltas, so none are pushed (a warning says how
    many steps' they are). The same words in an error of the worker's own, or another job's, or a shard's refusal
    that stops no job, leave the deltas pushed."""
    from ps.errors import InvalidArgumentError
    from ps.stamp import WorkerStamp
    from worker.steprows import GeoRows
    from worker.stopping import abandon

    class Geo:
        flushes = 0

        def flush(self):
            self.flushes += 1

    class Tables:
        def stop_job(self, stamp, reason, by=""):
            return []

    def refused(message: str, shard: int | None = 0) -> InvalidArgumentError:
        error = InvalidArgumentError(f"shard 0 at h:1: PushBatch failed with INVALID_ARGUMENT: {message}")
        if shard is not None:
            error.refused_by = shard  # (worker.retry: a shard's refusal)
        return error

    stamp = WorkerStamp(7, 0, 2, 0, setup="mode=geo", unclocked=True)
    stops = "shard 0: job 7 stops: worker 1 runs another setup than the job started with here"
    geo = Geo()
    for e in (refused(stops, None), refused(stops.replace("job 7", "job 8")), refused("grads hold a NaN")):
        rows = GeoRows(Tables(), geo, stamp)
        rows.unpushed_steps = 3
        abandon(rows, e)
    assert geo.flushes == 3
    rows = GeoRows(Tables(), geo, stamp)
    rows.unpushed_steps = 3
    with caplog.at_level("WARNING", logger="worker.steprows"):
        abandon(rows, refused(stops))
    assert geo.flushes == 3 and rows.holding()
    assert "last 3 steps" in caplog.text and "a shard's refusal stopped the job" in caplog.text


def _three_geo_steps(server, every: int = 4):
    """GeoRows over the server, every `every` steps per push, after three steps of SGD on ids 1 and 2; and the
    local rows of those ids."""
    from worker.batch import TableIds
    from worker.steprows import GeoRows

    cfg = TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 0.5))
    server.create_table(cfg)
    rows = GeoRows(server, GeoTables(server, {"emb": cfg}, every=every))
    ids = np.array([1, 2], np.uint64)
    tids = {"emb": TableIds(ids, {}, np.ones(2, F32), np.zeros(2, F32))}
    for step in range(1, 4):
        rows.rows(step, tids, None)
        rows.push(step, tids, {"emb": np.ones((2, 4), F32)}, [])
    return rows, ids, rows.geo.rows({"emb": ids})["emb"].copy()


def test_a_geo_worker_whose_own_request_was_refused_pushes_its_deltas_as_it_stops(server):
    """An InvalidArgumentError (its own check of a push before it sent, or a shard's refusal of what a request
    held) is no failure of the servers: the deltas of the steps since the last push reach them."""
    from ps.errors import InvalidArgumentError
    from worker.stopping import abandon

    rows, ids, local = _three_geo_steps(server)
    before = server.pull("emb", ids)
    assert rows.holding()
    abandon(rows, InvalidArgumentError("grads of table 'mlp' hold a NaN"))
    assert not rows.holding()
    np.testing.assert_allclose(server.pull("emb", ids), local, rtol=1e-6)
    assert not np.allclose(before, local)


def test_a_geo_worker_that_does_not_push_its_deltas_as_it_stops_says_how_many_steps_they_cover(server, caplog):
    """Where the servers failed, or the push as it stops fails, the warning names the steps whose deltas the
    servers lack; the worker still counts them as not pushed (holding)."""
    from ps.errors import InvalidArgumentError, ServerUnavailableError
    from worker.stopping import abandon

    rows, ids, _ = _three_geo_steps(server)
    before = server.pull("emb", ids)
    with caplog.at_level("WARNING", logger="worker.steprows"):
        abandon(rows, ServerUnavailableError("shard 0 did not answer"))
    assert "the local deltas of this worker's last 3 steps (since its last push) are not on the servers" in caplog.text
    assert "the servers failed" in caplog.text
    assert rows.holding()
    np.testing.assert_array_equal(server.pull("emb", ids), before)

    caplog.clear()
    other = InProcessTables(cache_bytes=64 << 20)
    try:
        rows, ids, _ = _three_geo_steps(other)

        def refused(items, **kw):
            raise InvalidArgumentError("shard 0: job 7 stops: worker 1 runs another setup")

        other.push_many = refused
        with caplog.at_level("WARNING", logger="worker.steprows"):
            abandon(rows, InvalidArgumentError("grads of table 'mlp' hold a NaN"))
        assert "last 3 steps" in caplog.text
        assert "their push as the worker stopped failed (InvalidArgumentError: shard 0: job 7 stops" in caplog.text
        assert rows.holding()
    finally:
        other.close()


def test_a_settle_whose_push_was_interrupted_is_not_pushed_again_by_the_abandon_after_it(server):
    """The push may have reached the shards before the interrupt: sending its deltas again would add them twice."""
    from worker.steprows import GeoRows
    from worker.stopping import abandon

    cfg = TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 0.5))
    server.create_table(cfg)
    real, calls = server.push_many, []

    def push_many(items, **kw):  # applied, then a Ctrl-C before its reply is read
        out = real(items, **kw)
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return out

    server.push_many = push_many
    geo = GeoTables(server, {"emb": cfg}, every=4)
    rows = GeoRows(server, geo)
    ids = np.array([1, 2], np.uint64)
    geo.rows({"emb": ids})
    geo.apply("emb", ids, np.ones((2, 4), F32), 1, 0)
    geo.end_step()  # step 1 of 4: its delta pending
    local = geo.rows({"emb": ids})["emb"].copy()
    with pytest.raises(KeyboardInterrupt) as stopped:
        rows.settle()  # a validation's push
    abandon(rows, stopped.value)
    assert len(calls) == 1
    np.testing.assert_allclose(server.pull("emb", ids), local, rtol=1e-6)


def test_geo_rows_say_while_they_hold_steps_not_pushed(server):
    """holding() is what a worker's PROGRESS reports count its pushed examples by (worker/loop.py): true after a
    step whose deltas stay local, false once a push (every 3rd step, or a settle) sent them."""
    from worker.batch import TableIds
    from worker.steprows import GeoRows

    cfg = TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 0.5))
    server.create_table(cfg)
    geo = GeoTables(server, {"emb": cfg}, every=3)
    rows = GeoRows(server, geo)
    ids = np.array([1, 2], np.uint64)
    tids = {"emb": TableIds(ids, {}, np.ones(2, F32), np.zeros(2, F32))}
    held = []
    for step in range(1, 8):
        rows.rows(step, tids, None)
        rows.push(step, tids, {"emb": np.ones((2, 4), F32)}, [])
        held.append(rows.holding())
    assert held == [True, True, False, True, True, False, True]
    rows.settle()
    assert not rows.holding()


def test_a_geo_runs_pushes_advance_the_shard_clock_by_each_of_its_steps(server):
    """A run of 10 steps pushing every 4, with a validation's settle after step 2, ends with the shard's clock at 10
    (not short of the last, partial round's 2 steps, nor counting the settled ones twice): shrink-by-age reads a
    row's age as the clock less its last_step, the clock its last push came at (before that push's advance)."""
    from worker.batch import TableIds
    from worker.steprows import GeoRows

    cfg = TableConfig("emb", 4, optimizer=OptimizerConfig("sgd", 0.5))
    server.create_table(cfg)
    rows = GeoRows(server, GeoTables(server, {"emb": cfg}, every=4))
    clocks = []
    for step in range(1, 11):
        ids = np.array([step, 100], np.uint64)
        tids = {"emb": TableIds(ids, {}, np.ones(2, F32), np.zeros(2, F32))}
        rows.rows(step, tids, None)
        rows.push(step, tids, {"emb": np.ones((2, 4), F32)}, [])
        if step == 2:
            rows.settle()
        clocks.append(server.shard.clock)
    rows.finish()
    assert clocks == [0, 2, 2, 4, 4, 4, 4, 8, 8, 8]
    assert server.shard.clock == 10
    table = server.shard.table("emb")
    last_step = table.peek(np.array([9, 10, 100], np.uint64))[:, table.stats_col + LAST_STEP]
    np.testing.assert_array_equal(last_step, [8, 8, 8])


def test_a_geo_steps_dense_pushes_carry_its_job_and_a_shard_training_another_refuses_them(server):
    """The dense pushes that go with a geo step carry the job's unclocked stamp, as its deltas do: on a shard that
    trains another job the first of them is refused, applying nothing, before any delta is due."""
    from ps.errors import JobConflictError
    from ps.stamp import WorkerStamp
    from worker.client import PushItem
    from worker.steprows import GeoRows

    server.create_table(SGD)
    server.create_table(TableConfig("mlp", 4, optimizer=OptimizerConfig("sgd", 0.5)))
    ids = np.array([1, 2], np.uint64)
    first = WorkerStamp(1, 0, 1, 0, setup="mode=async", unclocked=True)
    server.push_many([("emb", ids, np.ones((2, 4), F32))], stamp=first)  # job 1 trains on the shard
    second = WorkerStamp(2, 0, 1, 0, setup="mode=geo", unclocked=True)
    rows = GeoRows(server, GeoTables(server, {"emb": SGD}, every=4, stamp=second), second)
    before = server.pull("mlp", ids)
    with pytest.raises(JobConflictError, match="holds job 1"):
        rows.push(0, {}, {}, [PushItem("mlp", ids, np.ones((2, 4), F32))])  # step 1 of 4: no delta due
    np.testing.assert_array_equal(server.pull("mlp", ids), before)
    assert server.shard.stats()["job"] == 1


def test_a_geo_rounds_clock_advance_reaches_a_shard_holding_none_of_its_deltas(servers, tmp_path):
    """A round whose deltas all go to shard 0 advances both shards' clocks by `every` (shard 1 gets a PushBatch
    of no pushes, with the job's stamp and the advance), and the rows it keeps are the servers' after it; where
    another job holds shard 1, that PushBatch is refused (FAILED_PRECONDITION), shard 1's clock unmoved, while
    shard 0 takes the round's deltas and advance."""
    from ps.errors import JobConflictError
    from ps.stamp import WorkerStamp
    from worker.client import Client

    stamp = WorkerStamp(2, 0, 1, 0, setup="mode=geo", unclocked=True)
    for held in (False, True):
        addresses, started = servers(2, root=tmp_path / str(held))
        with Client(addresses, timeout_s=30) as client:
            client.create_table(SGD)
            ids = np.arange(1, 200, dtype=np.uint64)
            owner = client.slot_map.shard_of(ids)
            if held:  # job 1 holds shard 1
                other = WorkerStamp(1, 0, 1, 0, setup="mode=async", unclocked=True)
                client.push_many([("emb", ids[owner == 1][:1], np.ones((1, 4), F32))], stamp=other)
            clocks = [s.shard.clock for s in started]
            mine = ids[owner == 0][:3]  # every delta on shard 0
            before = client.pull("emb", mine)
            geo = GeoTables(client, {"emb": SGD}, every=2, stamp=stamp)
            geo.rows({"emb": mine})
            geo.apply("emb", mine, np.ones((3, 4), F32), 1.0, 0.0)
            assert not geo.end_step()
            geo.apply("emb", mine, np.ones((3, 4), F32), 1.0, 0.0)
            if held:
                with pytest.raises(JobConflictError, match="holds job 1") as refused:
                    geo.end_step()
                assert refused.value.status == "FAILED_PRECONDITION"
            else:
                assert geo.end_step()
                np.testing.assert_array_equal(geo.rows({"emb": mine})["emb"], client.pull("emb", mine))
            assert not np.array_equal(client.pull("emb", mine), before)  # shard 0 took the deltas
        assert [s.shard.clock for s in started] == [clocks[0] + 2, clocks[1] + (0 if held else 2)]


def test_a_geo_rounds_deltas_and_clock_advance_go_in_one_push_a_shard_training_another_refuses_whole(servers):
    """A geo round's deltas and clock advance go to each shard in one PushBatch carrying the job's stamp: a shard
    that trains another job refuses the round whole (FAILED_PRECONDITION), its rows and clock unmoved; the other
    shard takes its deltas with its clock advance."""
    from ps.errors import JobConflictError
    from ps.stamp import WorkerStamp
    from worker.batch import TableIds
    from worker.client import Client
    from worker.steprows import GeoRows

    addresses, started = servers(2)
    with Client(addresses, timeout_s=30) as client:
        client.create_table(SGD)
        ids = np.arange(1, 200, dtype=np.uint64)
        owner = client.slot_map.shard_of(ids)
        first = WorkerStamp(1, 0, 1, 0, setup="mode=async", unclocked=True)
        client.push_many([("emb", ids[owner == 1][:2], np.ones((2, 4), F32))], stamp=first)  # job 1 holds shard 1
        assert [s.shard.stats()["job"] for s in started] == [0, 1]
        clocks = [s.shard.clock for s in started]
        second = WorkerStamp(2, 0, 1, 0, setup="mode=geo", unclocked=True)
        rows = GeoRows(client, GeoTables(client, {"emb": SGD}, every=1, stamp=second), second)
        mine = np.sort(np.concatenate([ids[owner == 0][:2], ids[owner == 1][2:4]]))  # job 2's deltas: both shards
        tids = {"emb": TableIds(mine, {}, np.ones(4, F32), np.zeros(4, F32))}
        rows.rows(1, tids, None)
        before = client.pull("emb", mine)
        calls, sent = client._outcomes, []

        def noted(batch, *args, **kw):  # each PushBatch: (shard, advance_clock, pushes)
            sent.extend((shard, r.advance_clock, len(r.pushes)) for method, shard, r in batch if method == "PushBatch")
            return calls(batch, *args, **kw)

        client._outcomes = noted
        with pytest.raises(JobConflictError, match="holds job 1") as refused:
            rows.push(1, tids, {"emb": np.ones((4, 4), F32)}, [])  # the round's deltas and clock advance
        client._outcomes = calls
        assert refused.value.status == "FAILED_PRECONDITION"
        assert sorted(sent) == [(0, 1, 1), (1, 1, 1)]  # one PushBatch a shard: its deltas and the advance
        after = client.pull("emb", mine)
    held = owner[mine - 1] == 1
    np.testing.assert_array_equal(after[held], before[held])  # nothing applied on the held shard
    assert not np.array_equal(after[~held], before[~held])  # the other shard's deltas are applied
    assert [s.shard.clock for s in started] == [clocks[0] + 1, clocks[1]]
    assert [s.shard.stats()["job"] for s in started] == [2, 1]


def test_tables_training_in_turn_leave_no_arrays_of_their_rows_behind_and_train_exactly(server):
    """Two SGD tables under one small memory, each trained on new ids in its turn: after each push the rows of the
    other table leave, and its arrays shrink with them (without that each table kept arrays for every row it ever
    held at once, 2.1 x the memory at a push); the rows moved by the shrink train on as plain pushes do."""
    other = TableConfig("other", 6, optimizer=OptimizerConfig("sgd", 0.5))
    configs = {"emb": SGD, "other": other}
    plain = InProcessTables(cache_bytes=64 << 20)
    try:
        for cfg in configs.values():
            server.create_table(cfg)
            plain.create_table(cfg)
        capacity = 400 * (4 * 6 + 4 * 6 + 9 + SLOT_BYTES)  # 400 rows of `other`, 100 ids a step
        geo = GeoTables(server, configs, every=2, capacity_bytes=capacity)
        rng, first = np.random.default_rng(6), np.arange(10, dtype=np.uint64)
        for turn in range(6):
            t = ("emb", "other")[turn % 2]
            for k in range(8):  # ids new to the turn, and a few of its first step again
                new = np.arange(100, dtype=np.uint64) + np.uint64(10**6 * turn + 100 * k)
                ids = np.unique(np.concatenate([new, first + np.uint64(10**6 * turn)]))
                geo.rows({t: ids})
                grads = rng.standard_normal((len(ids), configs[t].dim)).astype(F32) * 0.01
                geo.apply(t, ids, grads, 1, 0)
                plain.push_many([(t, ids, grads, None, np.ones(len(ids), F32))])
                if geo.end_step():
                    assert geo.bytes_used <= capacity and geo.allocated_bytes <= 2 * capacity, geo.allocated_bytes
        geo.flush()
        for turn in range(6):
            t = ("emb", "other")[turn % 2]
            ids = np.arange(800, dtype=np.uint64) + np.uint64(10**6 * turn)
            np.testing.assert_allclose(server.pull(t, ids), plain.pull(t, ids), rtol=1e-6, atol=1e-9)
            np.testing.assert_array_equal(geo.rows({t: ids[:10]})[t], server.pull(t, ids[:10]))  # held: as pushed
    finally:
        plain.close()

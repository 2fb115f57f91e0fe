"""The `sync_steps` part of --memory-bytes (ps.engine.syncsteps, ps.engine.syncsum): a sync step's contributions,
held until every worker of the step has pushed, and the copies their sum makes, counted against it; a contribution
past it stops the job for every worker, applying nothing; Stats reports the bytes held."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from protos import ps_pb2
from ps import codec
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.engine.push import TablePush
from ps.engine.room import RequestRoom, push_cost
from ps.engine.shard import MAX_COUNT_PER_ID, Shard
from ps.engine.stampedpush import StampedPushes
from ps.engine.syncsum import SUM_COPIES, held_bytes, step_cost, sum_contributions
from ps.errors import CallerGoneError, RequestTooLargeError, ShardClosingError, SyncStepTooLargeError
from ps.server import Server
from ps.server_config import ServerConfig
from ps.storage.memory import MiB, plan_memory
from tests.test_modes import Concurrently
from tests.waiting import wait_until
from worker.client import WorkerStamp

JOB = 0x51A7
SGD = TableConfig("emb", 4, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))  # row = -(sum of grads)
ID_BYTES = 8 + 4 * 4 + 4 + 4  # a dim-4 contribution's bytes per id: id, grads, show, click
PY_OBJECTS = 64 << 10  # the sum's Python objects (lists, its pushes), besides its arrays


def _contribution(rng, tables: int, n: int, dim: int, high: int) -> list[TablePush]:
    """Pushes to `tables` tables of up to n unique ids below high each, shuffled, with small whole grads and
    counts (their sums are exact in float32, whatever the order of the additions)."""
    out = []
    for t in range(tables):
        ids = np.unique(rng.integers(0, high, n)).astype(np.uint64)
        rng.shuffle(ids)
        k = len(ids)
        out.append(TablePush(f"t{t}", ids, rng.integers(-8, 8, (k, dim)).astype(np.float32),
                             rng.integers(0, 4, k).astype(np.float32), rng.integers(0, 2, k).astype(np.float32)))  # fmt: skip
    return out


def _oracle(contributions: list[list[TablePush]], max_count: float) -> dict:
    """{(table, id): (grads, show, click)} summed id by id in a loop, counts clipped."""
    sums: dict = {}
    for pushes in contributions:
        for p in pushes:
            for i, x in enumerate(p.ids.tolist()):
                g, s, c = sums.get((p.name, x), (0, 0.0, 0.0))
                sums[(p.name, x)] = (g + p.grads[i].astype(np.float64), s + float(p.shows[i]), c + float(p.clicks[i]))
    return {k: (g, min(s, max_count), min(c, max_count)) for k, (g, s, c) in sums.items()}


@pytest.mark.parametrize(
    "workers, tables, n, dim, high",
    [(4, 1, 40_000, 1, 1 << 40), (8, 1, 5_000, 64, 1 << 40), (3, 2, 50_000, 1, 60_000), (2, 5, 20_000, 16, 1 << 40),
     (2, 3, 30_000, 16, 40_000), (1, 1, 60_000, 1, 1 << 40)],
)  # fmt: skip
def test_a_sum_copies_what_it_sums_at_most_sum_copies_times_and_sums_every_id(workers, tables, n, dim, high):
    """The oracles: tracemalloc's peak of what sum_contributions allocates (its result included) against
    SUM_COPIES x the contributions' bytes, the bound the `sync_steps` part is charged by (step_cost); and a loop
    summing id by id. Disjoint ids of dim 1 are the worst case, where the arrays reach the bound: every id
    survives, and an id's sort order and position cost the most next to its values."""
    rng = np.random.default_rng(workers * 1000 + dim)
    contributions = [_contribution(rng, tables, n, dim, high) for _ in range(workers)]
    held = sum(held_bytes(c) for c in contributions)
    tracemalloc.start()
    try:
        out = sum_contributions(contributions, 5.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= SUM_COPIES * held + PY_OBJECTS, f"the sum allocated {peak / held:.3f}x what it sums"
    assert step_cost(held) == (1 + SUM_COPIES) * held
    want = _oracle(contributions, 5.0)
    assert [p.name for p in out] == sorted({p.name for c in contributions for p in c})
    assert sum(len(p.ids) for p in out) == len(want)
    for p in out:
        assert (np.diff(p.ids.astype(np.float64)) > 0).all()  # sorted, unique
        for i, x in enumerate(p.ids.tolist()):
            g, s, c = want[(p.name, x)]
            assert (p.grads[i] == g).all() and p.shows[i] == s and p.clicks[i] == c


def _stamp(worker: int, step: int, job: int = JOB, num_workers: int = 2) -> WorkerStamp:
    return WorkerStamp(job, worker, num_workers, step, sync=True, barrier_timeout_s=30.0)


def _push(ids: np.ndarray, value: float = 1.0) -> TablePush:
    return TablePush("emb", ids, np.full((len(ids), 4), value, np.float32), None, None)


@pytest.fixture
def bounded(tmp_path):
    """A shard under --memory-bytes 256M (its `sync_steps` part 32 MiB) with table "emb" (SGD, dim 4)."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), memory_bytes=256 * MiB))
    shard.create_table(SGD)
    yield shard
    shard.close()


def test_a_sync_step_past_the_part_stops_the_job_for_every_worker_and_applies_nothing(bounded):
    """Two workers whose contributions each fit the part, and not together: worker 1's is refused
    (RESOURCE_EXHAUSTED, saying what to do), worker 0, waiting at the step, gets the same error instead of waiting
    out its barrier, nothing is applied or journaled, the bytes go back, and the job takes nothing more; another
    job then trains."""
    shard = bounded
    part = plan_memory(256 * MiB, None).sync_step_bytes
    n = part // (3 * ID_BYTES) * 3 // 4  # one contribution takes 3/4 of the part, two 3/2
    assert step_cost(n * ID_BYTES) <= part < step_cost(2 * n * ID_BYTES)
    ids = np.arange(2 * n, dtype=np.uint64)
    journaled = shard.journal.next_seq
    first = Concurrently(lambda: shard.push_stamped([_push(ids[:n])], 1, 0, 0, _stamp(0, 0)))
    wait_until(lambda: shard.stats()["sync_steps_held_bytes"] == n * ID_BYTES, 30, "worker 0's contribution held")
    assert shard.stats()["sync_steps_bytes"] == part
    with pytest.raises(SyncStepTooLargeError) as refused:
        shard.push_stamped([_push(ids[n:])], 1, 0, 0, _stamp(1, 0))
    said = str(refused.value)
    assert refused.value.status == "RESOURCE_EXHAUSTED"
    assert f"job {JOB} stops: worker 1's contribution to sync step 0 holds {n * ID_BYTES:,} bytes, the step's " \
           f"other contributions here {n * ID_BYTES:,}, other steps' 0" in said  # fmt: skip
    assert f"take {step_cost(2 * n * ID_BYTES):,}, over this server's `sync_steps` part of --memory-bytes " \
           f"({part:,} bytes); train" in said and "give the server a larger --memory-bytes" in said  # fmt: skip
    assert "nothing of the step was applied" in said
    with pytest.raises(SyncStepTooLargeError, match="worker 1's contribution to sync step 0"):
        first.join(60)  # its wait ended with the refusal, not at its barrier timeout
    assert shard.table("emb").num_rows == 0 and shard.clock == 0 and shard.journal.next_seq == journaled
    assert shard.stats()["sync_steps_held_bytes"] == 0 and shard.jobs.sync_held_bytes == 0
    with pytest.raises(SyncStepTooLargeError):  # the job stopped: its worker's retry is refused at once
        shard.push_stamped([_push(ids[:10])], 1, 0, 0, _stamp(0, 0))
    assert shard.table("emb").num_rows == 0
    Concurrently(*(lambda w=w: shard.push_stamped([_push(ids[w * 10 : w * 10 + 20])], 1, 0, 0, _stamp(w, 0, JOB + 1))
                   for w in range(2))).join(60)  # fmt: skip
    np.testing.assert_array_equal(shard.pull("emb", ids[:30])[:, 0], [-1.0] * 10 + [-2.0] * 10 + [-1.0] * 10)
    assert shard.clock == 1 and shard.jobs.sync_held_bytes == 0


def test_a_retried_contribution_is_held_once_and_an_applied_step_gives_its_bytes_back(bounded):
    """A contribution whose caller left stays in its step; the worker's retry replaces it and is counted in its
    place, not beside it; the step's sum applied, the part is empty again."""
    shard = bounded
    a, b = np.arange(1000, dtype=np.uint64), np.arange(500, 2500, dtype=np.uint64)
    with pytest.raises(CallerGoneError):
        shard.push_stamped([_push(a)], 1, 0, 0, _stamp(0, 0), lambda: True)
    assert shard.stats()["sync_steps_held_bytes"] == 1000 * ID_BYTES
    retry = Concurrently(lambda: shard.push_stamped([_push(a)], 1, 0, 0, _stamp(0, 0)))
    wait_until(lambda: shard.jobs.sync.steps[0].waiters == 1, 30, "the retry waiting at its step")
    assert shard.stats()["sync_steps_held_bytes"] == 1000 * ID_BYTES
    shard.push_stamped([_push(b)], 1, 0, 0, _stamp(1, 0))
    retry.join(60)
    rows = shard.pull("emb", np.arange(2500, dtype=np.uint64))[:, 0]
    np.testing.assert_array_equal(rows, np.repeat([-1.0, -2.0, -1.0], [500, 500, 1500]))
    assert shard.stats()["sync_steps_held_bytes"] == 0 and shard.clock == 1


def test_without_a_bound_contributions_are_counted_and_never_refused(tmp_path):
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    try:
        shard.create_table(SGD)
        part = plan_memory(256 * MiB, None).sync_step_bytes
        n = part // ID_BYTES  # three times what the bounded shard above takes at once
        ids = np.arange(2 * n, dtype=np.uint64)
        first = Concurrently(lambda: shard.push_stamped([_push(ids[:n])], 1, 0, 0, _stamp(0, 0)))
        wait_until(lambda: shard.stats()["sync_steps_held_bytes"] == n * ID_BYTES, 30, "worker 0's contribution")
        assert shard.stats()["sync_steps_bytes"] == 0
        shard.push_stamped([_push(ids[n:])], 1, 0, 0, _stamp(1, 0))
        first.join(60)
        assert shard.table("emb").num_rows == 2 * n and shard.stats()["sync_steps_held_bytes"] == 0
    finally:
        shard.close()


def test_the_refusal_reaches_a_client_as_resource_exhausted_and_stats_reports_the_part(tmp_path):
    """Over gRPC: a one-worker job's contribution past the part is RESOURCE_EXHAUSTED naming the part, nothing
    applied; StatsResponse carries the part and the bytes held."""
    import grpc

    from protos import ps_pb2_grpc

    server = Server(ServerConfig(data_dir=str(tmp_path / "d"), port=0, memory_bytes=256 * MiB))
    port = server.start()
    try:
        server.shard.create_table(SGD)
        part = server.shard.memory.sync_step_bytes
        n = part // (3 * ID_BYTES) + 1
        ids = np.arange(n, dtype=np.uint64)
        request = ps_pb2.PushBatchRequest(
            pushes=[ps_pb2.PushRequest(table="emb", ids=ids.tobytes(), grads=np.ones((n, 4), np.float32).tobytes(),
                                       dim=4)],
            advance_clock=1, client_id=3, stamp=codec.stamp_to_proto(_stamp(0, 0, num_workers=1)),
        )  # fmt: skip
        big = [("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", 1 << 30)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=big) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            with pytest.raises(grpc.RpcError) as e:
                stub.PushBatch(request, timeout=60)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "over this server's `sync_steps` part of --memory-bytes" in e.value.details()
            stats = stub.Stats(ps_pb2.StatsRequest(), timeout=60)
        assert (stats.sync_steps_bytes, stats.sync_steps_held_bytes) == (part, 0)
        assert server.shard.table("emb").num_rows == 0 and server.shard.clock == 0
    finally:
        server.stop()


def test_max_count_clips_the_sum_and_leaves_the_contributions():
    """Counts past a push's limit per id are clipped in the result (in place), the contributions left as they were."""
    shows = np.full(3, MAX_COUNT_PER_ID, np.float32)
    c = [TablePush("t", np.arange(3, dtype=np.uint64), np.ones((3, 2), np.float32), shows.copy(), shows.copy())]
    [out] = sum_contributions([c, c], MAX_COUNT_PER_ID)
    assert (out.shows == MAX_COUNT_PER_ID).all() and (out.clicks == MAX_COUNT_PER_ID).all()
    assert (c[0].shows == MAX_COUNT_PER_ID).all() and (out.grads == 2).all()


def test_a_sync_push_is_priced_by_the_tables_it_is_checked_against(tmp_path):
    """StampedPushes with a room that holds a sync push of 1,000 ids to 's' as made (SGD) and not as replaced
    (adam, wider rows): given the Table it was looked up as, replaced since, the push is priced by that Table and
    refused as replaced (UNAVAILABLE: sent again, it goes to the new table); looked up by name, it is priced by the
    new table and refused as too large. Neither applies anything."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    try:
        old = shard.create_table(TableConfig("s", 2, optimizer=OptimizerConfig("sgd", 1.0)))
        new = shard.create_table(TableConfig("s", 2, optimizer=OptimizerConfig("adam")), replace_untrained=True)
        assert new.width > old.width
        fits = push_cost(1000, old.width)
        stamped = StampedPushes(shard.jobs, shard.pushes, RequestRoom(fits, fits), shard.checkpoints.gate,
                                shard.table, shard.check_push, shard.push_batch)  # fmt: skip
        push = TablePush("s", np.arange(1000, dtype=np.uint64), np.ones((1000, 2), np.float32), None, None)
        stamp = _stamp(0, 0, num_workers=1)
        with pytest.raises(ShardClosingError, match="table 's' was replaced just now"):
            stamped.push([push], 1, 0, 0, stamp, tables=[old])
        with pytest.raises(RequestTooLargeError, match=f"would copy {push_cost(1000, new.width):,} bytes"):
            stamped.push([push], 1, 0, 0, stamp)
        assert not shard.table("s").trained and shard.clock == 0
    finally:
        shard.close()


def test_a_sync_push_to_a_wider_table_replaced_since_is_refused_as_replaced_not_as_too_large(tmp_path):
    """The room holds a sync push of 1,000 ids to 's' as replaced (SGD) and not as it was looked up (adam, wider
    rows): given the Table it was looked up as, the push is refused as replaced (UNAVAILABLE: sent again, it goes to
    the new table and fits), not as too large for a table it no longer goes to. Nothing is applied."""
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d")))
    try:
        old = shard.create_table(TableConfig("s", 2, optimizer=OptimizerConfig("adam")))
        new = shard.create_table(TableConfig("s", 2, optimizer=OptimizerConfig("sgd", 1.0)), replace_untrained=True)
        assert old.width > new.width
        fits = push_cost(1000, new.width)
        stamped = StampedPushes(shard.jobs, shard.pushes, RequestRoom(fits, fits), shard.checkpoints.gate,
                                shard.table, shard.check_push, shard.push_batch)  # fmt: skip
        push = TablePush("s", np.arange(1000, dtype=np.uint64), np.ones((1000, 2), np.float32), None, None)
        with pytest.raises(ShardClosingError, match="table 's' was replaced just now"):
            stamped.push([push], 1, 0, 0, _stamp(0, 0, num_workers=1), tables=[old])
        assert not shard.table("s").trained and shard.clock == 0
    finally:
        shard.close()

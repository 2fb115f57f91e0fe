"""Checkpoints saved every 0.2 s while a job of 2 workers trains, in every mode: the job finishes as it would
without them, every push applied once (the rows' show counts equal those of a run without checkpoints; sync: the
whole model, bit for bit), and every checkpoint restores. A sync checkpoint holds, per shard, the state after some
whole step: the holds refuse sync steps' sums, whose contributors all send their parts again."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from ps.engine.shard import Shard
from ps.errors import CheckpointInProgressError
from ps.rows.layout import SHOW
from ps.server_config import ServerConfig
from tests.test_train_modes import _run_job
from tests.waiting import wait_until
from worker.checkpoint import save
from worker.client import Client
from worker.synthetic import SyntheticConfig
from worker.synthetic_files import write_synthetic
from worker.train_config import TrainConfig

State = dict[str, tuple[np.ndarray, np.ndarray]]  # table -> (ids, full rows), by id


def _state(shards: list[Shard]) -> State:
    """Every row the shards hold: table -> (ids, full rows: embedding, optimizer state, statistics), by id."""
    parts: dict[str, list] = {}
    for shard in shards:
        shard.flush()
        for name, table in shard.tables.items():
            ids = np.array(sorted(i for i, _ in shard.store.iter_rows(name)), np.uint64)
            parts.setdefault(name, []).append((ids, table.peek(ids)))
    out = {}
    for name, held in parts.items():
        ids = np.concatenate([i for i, _ in held])
        order = np.argsort(ids)
        out[name] = (ids[order], np.concatenate([r for _, r in held])[order])
    return out


def _peek(shard: Shard, ids_of: State) -> State:
    """The shard's full rows of the ids of ids_of (initial rows for ids it never had)."""
    return {name: (ids, shard.tables[name].peek(ids)) for name, (ids, _) in ids_of.items()}


def _shows(state: State, name: str, width: int) -> np.ndarray:
    return state[name][1][:, width + SHOW]


class Saver:
    """Saves a checkpoint into root/ckpt-<n> every period_s on a thread of its own, from the moment every shard
    holds the tables `tables`, until the block ends; each save's hold made at least hold_s long."""

    def __init__(self, addresses, started, root, tables: set[str], period_s: float = 0.2, hold_s: float = 0.05):
        self.addresses, self.started, self.root, self.tables = addresses, started, root, tables
        self.period_s, self.hold_s = period_s, hold_s
        self.saved: list[str] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-saver")
        for s in started:  # a longer hold: more pushes and sums meet it
            slowly(s.shard, "save_checkpoint", hold_s)

    def _run(self):
        try:
            wait_until(lambda: all(set(s.shard.tables) >= self.tables for s in self.started) or self._stop.is_set(),
                       60, "the job's tables on every shard")  # fmt: skip
            with Client(self.addresses, timeout_s=30) as client:
                while not self._stop.wait(self.period_s):
                    path = str(self.root / f"ckpt-{len(self.saved)}")
                    save(client, path)
                    self.saved.append(path)
        except BaseException as e:  # handed to the test
            self.error = e

    def __enter__(self) -> Saver:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()


def slowly(shard: Shard, method: str, seconds: float) -> None:
    """Makes every call of shard.<method> take `seconds` more, after it did its work."""
    real = getattr(shard, method)

    def slow(*args, **kw):
        out = real(*args, **kw)
        time.sleep(seconds)
        return out

    setattr(shard, method, slow)


def _count_refusals(owner: object, method: str, counts: dict) -> None:
    """Counts the calls of owner.<method> (a Shard's, its StampedPushes') that a checkpoint's hold refused, in
    counts[method]."""
    real = getattr(owner, method)

    def counted(*args, **kw):
        try:
            return real(*args, **kw)
        except CheckpointInProgressError:
            counts[method] = counts.get(method, 0) + 1
            raise

    setattr(owner, method, counted)


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "train.txt"
    write_synthetic(path, SyntheticConfig(rows=1600, seed=3))
    return str(path)


@pytest.mark.parametrize("mode", ["sync", "async", "ssp", "geo"])
def test_checkpoints_saved_while_two_workers_train(servers, tmp_path, data_file, mode):
    base = TrainConfig(data=data_file, model="deepfm", hidden=(16, 8), recipe="large", epochs=1, progress=False,
                       validation_fraction=0.0, synthetic_eval_rows=0, prefetch=1, batch_size=32, mode=mode,
                       num_workers=2, job_id=7, staleness=2 if mode == "ssp" else None,
                       geo_every=4 if mode == "geo" else None)  # fmt: skip
    cfgs = [dataclasses.replace(base, worker_id=i) for i in range(2)]
    plain, plain_started = servers(2, root=tmp_path / "plain")
    assert [r["result"].steps for r in _run_job(plain, cfgs)] == [25, 25]
    want = _state([s.shard for s in plain_started])
    want_per_shard = [_state([s.shard]) for s in plain_started]

    got, got_started = servers(2, root=tmp_path / "got", checkpoint_root=str(tmp_path))
    refused: dict[str, int] = {}
    steps: list[list[State]] = [[] for _ in got_started]  # sync: each shard's state before and after each sum
    for i, s in enumerate(got_started):
        if mode == "sync":
            real = s.shard.stamped._apply_sum

            def recorded(*args, _real=real, _i=i, _shard=s.shard, **kw):
                steps[_i].append(_peek(_shard, want_per_shard[_i]))
                _real(*args, **kw)
                steps[_i].append(_peek(_shard, want_per_shard[_i]))

            s.shard.stamped._apply_sum = recorded
            slowly(s.shard, "apply_push", 0.003)  # a sum's tables one by one: a save between two would be half a step
            _count_refusals(s.shard.stamped, "_apply_sum", refused)
        else:
            _count_refusals(s.shard, "push_batch", refused)
    with Saver(got, got_started, tmp_path, set(want)) as saver:
        runs = _run_job(got, cfgs)
    assert saver.error is None, saver.error
    assert [r["result"].steps for r in runs] == [25, 25]
    assert len(saver.saved) >= 3 and sum(refused.values()) > 0, (saver.saved, refused)  # the holds met the job
    have = _state([s.shard for s in got_started])

    assert set(have) == set(want)
    width = {name: t.stats_col for name, t in got_started[0].shard.tables.items()}
    for name, (ids, rows) in want.items():
        np.testing.assert_array_equal(have[name][0], ids, err_msg=name)
        np.testing.assert_array_equal(_shows(have, name, width[name]), _shows(want, name, width[name]), err_msg=name)
        if mode == "sync":  # the same sums in the same order
            np.testing.assert_array_equal(have[name][1], rows, err_msg=name)

    before = {name: np.zeros(len(ids), np.float32) for name, (ids, _) in want.items()}
    for i, path in enumerate(saver.saved):
        restored = Shard(ServerConfig(data_dir=str(tmp_path / f"restored-{i}"), restore_dir=path))
        try:
            assert set(restored.tables) == set(want), path
            held = _peek(restored, want)
            for name in want:  # later checkpoints hold more, and none more than the end
                shows = _shows(held, name, width[name])
                assert (before[name] <= shows).all() and (shows <= _shows(want, name, width[name])).all(), name
                before[name] = shows
            if mode == "sync":  # each shard's part is its state between two sums: whole steps
                for shard, states in enumerate(steps):
                    part = _peek(restored, want_per_shard[shard])
                    assert any(all(np.array_equal(part[n][1], rows) for n, (_, rows) in state.items())
                               for state in states), f"{path}: shard {shard}'s part is no step's state"  # fmt: skip
        finally:
            restored.close()


@pytest.mark.parametrize("mode", ["sync", "ssp"])
def test_a_hold_longer_than_the_barrier_timeout_pauses_the_job_and_does_not_stop_it(servers, tmp_path, data_file, mode):
    """A checkpoint's hold that outlasts --barrier-timeout (a large shard's save, or a saver that died and left its
    holds to expire) refuses the workers' pushes meanwhile, so a pull waiting for another worker's step cannot be
    served: its deadline leaves the hold's time out, and the job pauses and finishes, as with no hold."""
    base = TrainConfig(data=data_file, model="fm", recipe="large", epochs=1, progress=False, validation_fraction=0.0,
                       synthetic_eval_rows=0, prefetch=1, batch_size=32, mode=mode, num_workers=2, job_id=7,
                       staleness=0 if mode == "ssp" else None, barrier_timeout_s=1.0)  # fmt: skip
    addresses, started = servers(2, checkpoint_root=str(tmp_path))
    holds: list[float] = []

    def hold_mid_job():  # as a saver that died once it held every shard: the holds expire, none is released
        wait_until(lambda: all(s.shard.clock >= 4 for s in started), 60, "the job's first steps on every shard")
        for s in started:
            s.shard.hold(3.0)
        holds.append(time.monotonic())

    holder = threading.Thread(target=hold_mid_job)
    holder.start()
    runs = _run_job(addresses, [dataclasses.replace(base, worker_id=i) for i in range(2)])
    holder.join(60)
    assert holds, "the holds were not taken"
    assert [r["result"].steps for r in runs] == [25, 25]

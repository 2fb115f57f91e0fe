"""The allreduce dense path: two gloo workers with different gradients hold the same weights, bit for bit, after
every step, equal to one process applying the optimizer to the mean gradient from the PS path's initial values;
the servers hold the trained values after flush; the local optimizer is the servers' rule."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the allreduce dense path runs among torch workers only")
dist = pytest.importorskip("torch.distributed", reason="torch without torch.distributed")
mp = pytest.importorskip("torch.multiprocessing", reason="torch without torch.multiprocessing")

from ps.config import OptimizerConfig  # noqa: E402
from ps.rows.optim import get_optimizer  # noqa: E402
from tests.inprocess import InProcessTables  # noqa: E402
from worker.allreduce import AllReduceDense  # noqa: E402
from worker.allreduce_group import ENV_VARS, init_process_group_from_env, rank_device  # noqa: E402
from worker.batch import Bags, Batch, table_ids  # noqa: E402
from worker.client import PushItem  # noqa: E402
from worker.dense import DenseSync, table_config  # noqa: E402
from worker.diverged import DIVERGED_ADVICE  # noqa: E402
from worker.local_optimizer import LocalOptimizer, NonFiniteStepError  # noqa: E402
from worker.models.spec import ModelSpec, uniform_fields  # noqa: E402
from worker.scoring import field_tables  # noqa: E402
from worker.step import Prepared, Step  # noqa: E402

SPEC = ModelSpec("dnn", uniform_fields(3, 4), num_dense=2, hidden=(8, 8))
PARAMS = SPEC.dense_params()
OPTIMIZERS = {
    "sgd": OptimizerConfig("sgd", 0.05),
    "adagrad": OptimizerConfig("adagrad", 0.1),
    "adam": OptimizerConfig("adam", 0.01),
}
STEPS = 20
WORLD = 2
ROOT = pathlib.Path(__file__).resolve().parent.parent
SHORT = 5  # rank 1 runs out of batches SHORT steps before rank 0: finish() keeps it in rank 0's last steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dense_tables() -> InProcessTables:
    tables = InProcessTables(cache_bytes=16 << 20)
    for p in PARAMS:
        tables.create_table(table_config(p))
    return tables


def flat(values: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([values[p.name].ravel() for p in PARAMS])


def grads_of(rank: int, step: int) -> dict[str, np.ndarray]:
    """Rank `rank`'s gradients at `step`: different on every rank and step."""
    rng = np.random.default_rng([rank, step])
    return {p.name: rng.normal(0, 1 + rank, p.shape).astype(np.float32) for p in PARAMS}


def run_worker(rank: int, port: int, out_dir: str) -> None:
    """One worker (a spawned process): for each optimizer, pull, STEPS steps, flush; saves what it held (rank 0
    also what the servers hold after flush)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    assert init_process_group_from_env("cpu") == (rank, WORLD)
    for name, optimizer in OPTIMIZERS.items():
        tables = dense_tables() if rank == 0 else None  # fresh servers: every optimizer starts at the initial values
        dense = AllReduceDense(tables, PARAMS, optimizer)
        held = [flat(dense.pull())]
        for s in range(STEPS - SHORT * rank):
            dense.step(grads_of(rank, s))
            held.append(flat(dense.values))
        dense.finish()  # rank 1 takes part in rank 0's last SHORT steps, then both write to the servers
        held.append(flat(dense.values))
        assert dense.syncs == STEPS
        np.save(pathlib.Path(out_dir, f"{name}.{rank}.npy"), np.stack(held))
        if tables is not None:
            np.save(pathlib.Path(out_dir, f"{name}.servers.npy"), flat(DenseSync(tables, PARAMS).pull()))
            tables.close()
        dense.close()
        assert dist.is_initialized()  # close() leaves a group it did not create
    dist.destroy_process_group()


def oracle(name: str, start: np.ndarray, world: int = WORLD) -> np.ndarray:
    """(STEPS + 1, size): the weights of one process applying the optimizer (float64, ps.rows.optim's rules) to
    the mean of the gradients of the ranks 0 .. world - 1 that have a batch at that step (rank r has
    STEPS - SHORT * r)."""
    cfg, w = OPTIMIZERS[name], start.astype(np.float64)
    p, lr = cfg.all_params(), cfg.learning_rate
    m, v, a = np.zeros_like(w), np.zeros_like(w), np.full_like(w, p.get("initial_accumulator", 0.0))
    out = [w.copy()]
    for s in range(STEPS):
        g = np.mean([flat(grads_of(r, s)).astype(np.float64) for r in range(world) if s < STEPS - SHORT * r], axis=0)
        if name == "sgd":
            w = w - lr * g
        elif name == "adagrad":
            a = a + g * g
            w = w - lr * g / (np.sqrt(a) + p["epsilon"])
        else:
            t = s + 1
            m = p["beta1"] * m + (1 - p["beta1"]) * g
            v = p["beta2"] * v + (1 - p["beta2"]) * g * g
            w = w - lr * (m / (1 - p["beta1"] ** t)) / (np.sqrt(v / (1 - p["beta2"] ** t)) + p["epsilon"])
        out.append(w.copy())
    return np.stack(out)


class RecordingSource:
    """A row source's push_apart and finish (the writes of the MLP, and the worker's leave), recorded in order in
    events, the pushes applied to tables."""

    def __init__(self, tables: InProcessTables):
        self.tables, self.events = tables, []

    def push_apart(self, items, add_delta=False):
        self.events.append("write" if add_delta else "push")
        return self.tables.push_many(items, return_rows=True, add_delta=add_delta)

    def finish(self):
        self.events.append("leave")


def run_leaving_worker(rank: int, port: int, out_dir: str) -> None:
    """One worker (a spawned process) with servers of its own: pull, rank 0 SHORT steps fewer than rank 1, finish;
    saves its events, its values and what its servers hold."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    with dense_tables() as tables:
        source = RecordingSource(tables)
        dense = AllReduceDense(tables, PARAMS, OPTIMIZERS["sgd"], source=source)
        dense._next_write = math.inf  # no periodic write
        dense.pull()
        for s in range(STEPS - SHORT * (1 - rank)):
            dense.step(grads_of(rank, s))
        dense.finish(source.finish)
        pathlib.Path(out_dir, f"events.{rank}").write_text(" ".join(source.events))
        np.save(pathlib.Path(out_dir, f"held.{rank}.npy"), flat(dense.values))
        np.save(pathlib.Path(out_dir, f"servers.{rank}.npy"), flat(DenseSync(tables, PARAMS).pull()))
        dense.close()


@pytest.mark.xdist_group("allreduce_scenarios")  # one spawn of the scenarios fixture (dev.py: loadgroup)
def test_the_worker_that_leaves_last_writes_the_mlp_before_it_leaves(scenarios):
    """finish(leave): rank 0, out of batches SHORT steps before rank 1, says it is done at once (an ssp shard would
    hold rank 1's pulls for it) and writes nothing; rank 1, of the group's last step, writes the MLP through its
    row source (the job's stamp) while its job still holds the shards, then says it is done."""
    out = scenarios / "leaving"
    assert [(out / f"events.{r}").read_text() for r in range(WORLD)] == ["leave", "write leave"]
    held = [np.load(out / f"held.{r}.npy") for r in range(WORLD)]
    np.testing.assert_array_equal(held[0], held[1])
    np.testing.assert_allclose(np.load(out / "servers.1.npy"), held[1], rtol=1e-6, atol=1e-7)
    with dense_tables() as tables:
        np.testing.assert_array_equal(np.load(out / "servers.0.npy"), flat(DenseSync(tables, PARAMS).pull()))


def run_handing_over_worker(rank: int, port: int, out_dir: str) -> None:
    """As run_leaving_worker (rank 0 out of batches SHORT steps before rank 1), with a write due at every step of
    the writer; after its last step, and after finish, each rank records whether save_on_stop (a stop then)
    wrote."""
    import worker.allreduce

    worker.allreduce.WRITE_EVERY_S = 0.0
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    with dense_tables() as tables:
        source = RecordingSource(tables)
        dense = AllReduceDense(tables, PARAMS, OPTIMIZERS["sgd"], source=source)
        dense.pull()
        for s in range(STEPS - SHORT * (1 - rank)):
            dense.step(grads_of(rank, s))
        source.events.append(f"stop-writes={dense.save_on_stop()}")
        dense.finish(source.finish)
        source.events.append(f"stop-writes={dense.save_on_stop()}")  # done: nothing more
        pathlib.Path(out_dir, f"events.{rank}").write_text(" ".join(source.events))
        np.save(pathlib.Path(out_dir, f"held.{rank}.npy"), flat(dense.values))
        np.save(pathlib.Path(out_dir, f"servers.{rank}.npy"), flat(DenseSync(tables, PARAMS).pull()))
        dense.close()


@pytest.mark.xdist_group("allreduce_scenarios")  # one spawn of the scenarios fixture (dev.py: loadgroup)
def test_the_writer_is_the_lowest_rank_with_a_batch_while_training_and_as_it_stops(scenarios):
    """Rank 0 writes the MLP at its steps (due at every step here) until it runs out of batches and leaves; then
    rank 1, the lowest rank with a batch, writes it at each of its steps alone, and would write it were it
    stopped after its last step (save_on_stop): a checkpoint taken while rank 1 trains on, or a run that stops
    then, does not find the MLP rank 0 wrote last. A worker that left writes nothing more."""
    out = scenarios / "handing_over"
    events = [(out / f"events.{r}").read_text().split() for r in range(WORLD)]
    ran = STEPS - SHORT  # rank 0's steps
    # a stop after a rank's last step: each was the writer of it (rank 0 of its own, rank 1 of the group's last)
    assert events[0] == ["write"] * ran + ["write", "stop-writes=True", "leave", "stop-writes=False"]
    assert events[1] == ["write"] * SHORT + ["write", "stop-writes=True", "write", "leave", "stop-writes=False"]
    held = [np.load(out / f"held.{r}.npy") for r in range(WORLD)]
    np.testing.assert_array_equal(held[0], held[1])
    np.testing.assert_allclose(np.load(out / "servers.1.npy"), held[1], rtol=1e-6, atol=1e-7)


DIVERGES = 2  # rank 1's step DIVERGES (from 0) diverges: its predictions hold a NaN


class DivergingModel:
    """A backend whose predictions are 0.5 and whose MLP gradients are grads_of(rank, s) at its s-th step, but for
    rank 1's step DIVERGES: NaN predictions."""

    def __init__(self, rank: int):
        self.rank, self.steps = rank, 0

    def forward_backward(self, inputs, params, labels):
        s, self.steps = self.steps, self.steps + 1
        nan = self.rank == 1 and s == DIVERGES
        rows = {t: np.zeros_like(r) for t, r in inputs.rows.items()}
        return np.full(len(labels), np.nan if nan else 0.5, np.float32), rows, grads_of(self.rank, s)


class CountingSource:
    """A row source of zero rows that counts the rows' pushes."""

    def __init__(self):
        self.pushes = 0

    def rows(self, step, tids, prepared):
        return {t: np.zeros((len(ti.uniq), SPEC.row_dim(t)), np.float32) for t, ti in tids.items()}

    def push(self, step, tids, row_grads, extra):
        self.pushes += 1
        return []


def diverging_steps(dense: AllReduceDense, rank: int, steps: int) -> dict:
    """steps real Steps (worker/step.py) of rank over dense, then finish(); what it raised, and at which step."""
    n = 4
    batch = Batch(np.array([0, 1, 0, 1], np.float32),
                  {f.name: Bags.one_per_example(np.arange(n) + 10 * i) for i, f in enumerate(SPEC.fields)},
                  np.ones((n, 2), np.float32))  # fmt: skip
    tids, source = table_ids(batch, field_tables(SPEC)), CountingSource()
    step, s = Step(SPEC, DivergingModel(rank), dense, source, dense_l2=0.0), 0
    try:
        for s in range(steps):
            step(Prepared(s, batch, tids, None))
        s = "finish"
        dense.finish()
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e), "at": s, "syncs": dense.syncs, "pushes": source.pushes}
    finally:
        step.pusher.shutdown()
    return {"type": None, "at": s, "syncs": dense.syncs}


def run_diverging_worker(rank: int, port: int, out_dir: str) -> None:
    """One worker (a spawned process) taking real Steps until rank 1's step DIVERGES diverges, twice in one group:
    both ranks with batches then ("stepping"); rank 0 out of batches before it, in finish() ("finishing"). Saves
    what each raised, and its values before the step that diverged and after it."""
    import json

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    with dense_tables() as tables:
        dense = AllReduceDense(tables, PARAMS, OPTIMIZERS["adam"])  # the group's owner: close() destroys it
        outcomes = {}
        for case, steps in (("stepping", STEPS), ("finishing", DIVERGES if rank == 0 else STEPS)):
            held = AllReduceDense(tables, PARAMS, OPTIMIZERS["adam"]) if case == "finishing" else dense
            held._next_write = math.inf  # no periodic write
            held.pull()
            outcomes[case] = diverging_steps(held, rank, steps)
            np.save(pathlib.Path(out_dir, f"{case}.{rank}.npy"), np.stack([flat(held.values), held.weights]))
        pathlib.Path(out_dir, f"outcomes.{rank}.json").write_text(json.dumps(outcomes))
        dense.close()


@pytest.mark.xdist_group("allreduce_scenarios")  # one spawn of the scenarios fixture (dev.py: loadgroup)
def test_a_step_that_diverges_on_one_rank_raises_diverged_error_on_every_rank_at_that_step(scenarios):
    """worker/step.py over --dense allreduce: rank 1's step diverges (NaN predictions) while rank 0's does not.
    Rank 1 still takes part in the step's all_reduce, so every rank raises DivergedError at that step (rank 0's
    names rank 1; rank 1's says what diverged), rather than rank 0 failing with a peer gone or hanging; no rank
    applied the MLP's step, rank 0's row push of it landed (rank 1 pushed nothing), and the group goes on working.
    The same where rank 0 waits in finish() for rank 1's steps."""
    import json

    out = scenarios / "diverging"
    outcomes = [json.loads((out / f"outcomes.{r}.json").read_text()) for r in range(WORLD)]
    for case in ("stepping", "finishing"):
        rank0, rank1 = outcomes[0][case], outcomes[1][case]
        assert rank0["type"] == rank1["type"] == "DivergedError", (case, rank0, rank1)
        assert rank1["at"] == DIVERGES and rank0["at"] == (DIVERGES if case == "stepping" else "finish")
        assert rank0["syncs"] == rank1["syncs"] == DIVERGES  # the steps before it, not that one
        assert rank0["message"].startswith(
            f"training diverged in step {DIVERGES + 1} of the allreduce group (2 workers): the predictions or "
            "gradients of rank 1 hold an Inf or NaN (its output says which)"
        ), rank0
        assert rank1["message"].startswith(
            f"training diverged in step {DIVERGES + 1}: the model's predictions hold nan"
        )
        assert rank1["pushes"] == DIVERGES  # the step that diverged pushed no rows
        # rank 0's row push of that step, in flight beside the all_reduce, landed (in finish() it had no step to push)
        assert rank0["pushes"] == (DIVERGES + 1 if case == "stepping" else DIVERGES), (case, rank0)
        assert rank0["message"].endswith(
            "No worker applied the MLP's step; the row pushes of that step by the workers whose step did not "
            "diverge were applied. " + DIVERGED_ADVICE
        ), rank0
        values = [np.load(out / f"{case}.{r}.npy") for r in range(WORLD)]
        np.testing.assert_array_equal(values[0], values[1])
        np.testing.assert_array_equal(values[0][0], values[0][1])  # the values and the weights: the step before
    with dense_tables() as tables:
        start = flat(DenseSync(tables, PARAMS).pull())
    assert DIVERGES < STEPS - SHORT  # the oracle's steps before it: both ranks with a batch
    np.testing.assert_allclose(
        np.load(out / "stepping.0.npy")[0], oracle("adam", start)[DIVERGES], rtol=1e-6, atol=1e-6
    )


SCENARIOS = {"mean": run_worker, "leaving": run_leaving_worker, "diverging": run_diverging_worker,
             "handing_over": run_handing_over_worker}  # fmt: skip


def run_every_scenario(rank: int, ports: tuple[int, ...], out_dir: str) -> None:
    """One worker (a spawned process) running the SCENARIOS in turn, each in a group of its own (at its port of
    ports) with its outputs in out_dir/<scenario>: three tests share one spawn of the workers, which import torch.
    handing_over runs last: it sets WRITE_EVERY_S for the rest of the process."""
    for (scenario, target), port in zip(SCENARIOS.items(), ports, strict=True):
        target(rank, port, str(pathlib.Path(out_dir, scenario)))


def free_ports(count: int) -> tuple[int, ...]:
    """count distinct ports that were free a moment ago (held at once while they are picked)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return tuple(s.getsockname()[1] for s in sockets)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> pathlib.Path:
    """The outputs of run_every_scenario, its workers spawned once for the module: <returned dir>/<scenario>/."""
    out = tmp_path_factory.mktemp("allreduce")
    for scenario in SCENARIOS:
        (out / scenario).mkdir()
    spawn_workers(str(out), free_ports(len(SCENARIOS)), timeout_s=120.0)
    return out


def spawn_workers(out_dir: str, ports: tuple[int, ...], timeout_s: float) -> None:
    """WORLD processes running run_every_scenario(rank, ports, out_dir); fails when one fails or they run past
    timeout_s."""
    context = mp.spawn(run_every_scenario, args=(ports, out_dir), nprocs=WORLD, join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=0.5):  # raises when a worker failed
            assert time.monotonic() < deadline, f"the workers still run after {timeout_s:g} s"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()


@pytest.mark.xdist_group("allreduce_scenarios")  # one spawn of the scenarios fixture (dev.py: loadgroup)
def test_two_workers_hold_equal_weights_after_every_step_equal_to_the_mean_gradient_oracle(scenarios):
    out = scenarios / "mean"
    with dense_tables() as tables:
        start = flat(DenseSync(tables, PARAMS).pull())  # the PS path's initial values
    for name in OPTIMIZERS:
        rank0, rank1 = (np.load(out / f"{name}.{r}.npy") for r in range(WORLD))
        assert rank0.shape == (STEPS + 2, start.size) and rank1.shape == (STEPS - SHORT + 2, start.size)
        np.testing.assert_array_equal(rank0[-1], rank0[-2])  # finish() after rank 0's last step: no more steps
        rank0 = rank0[:-1]
        for s in range(STEPS - SHORT + 1):
            np.testing.assert_array_equal(rank0[s], rank1[s], err_msg=f"{name}, after step {s}")
        np.testing.assert_array_equal(rank0[-1], rank1[-1], err_msg=f"{name}, at the end")
        np.testing.assert_array_equal(rank0[0], start)
        np.testing.assert_allclose(rank0, oracle(name, start), rtol=1e-6, atol=1e-6, err_msg=name)
        assert np.abs(rank0[-1] - start).max() > 0.05  # the steps moved the weights
        servers = np.load(out / f"{name}.servers.npy")
        np.testing.assert_allclose(servers, rank0[-1], rtol=1e-6, atol=1e-7, err_msg=f"{name}: the servers' values")


class UnreachableTables:
    def pull_many(self, items):
        raise ConnectionError("no server answers")


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                             reason="needs a CUDA device")])],
)  # fmt: skip
def test_one_worker_creates_and_destroys_its_group(monkeypatch, device):
    """On cuda the group is nccl's, on cuda:0 (no LOCAL_RANK), its collectives on tensors of that GPU."""
    group_env(monkeypatch, free_port(), 0, 1)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert not dist.is_initialized()
    with dense_tables() as tables:
        dense = AllReduceDense(tables, PARAMS, OPTIMIZERS["adam"], device=device)
        try:
            assert dist.is_initialized() and (dense.rank, dense.world_size) == (0, 1) and not dense.inline
            assert dist.get_backend() == ("nccl" if device == "cuda" else "gloo")
            assert str(dense.device) == ("cuda:0" if device == "cuda" else "cpu")
            start = flat(dense.pull())
            for s in range(3):
                dense.step(grads_of(0, s))
            dense.flush()
            np.testing.assert_allclose(flat(dense.values), oracle("adam", start, world=1)[3], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(flat(DenseSync(tables, PARAMS).pull()), flat(dense.values), atol=1e-7)
            dense.tables = UnreachableTables()
            with pytest.raises(ConnectionError, match="no server"):
                dense.flush()
        finally:
            dense.close()
        dense.close()
        assert not dist.is_initialized()
        with pytest.raises(RuntimeError, match="after close"):
            dense.step(grads_of(0, 0))


def test_a_stopped_rank_0_writes_the_mlp_of_its_last_step_alone(monkeypatch):
    """save_on_stop (a worker stopped by a signal or an error): rank 0 writes its values with no collective, so the
    servers hold the MLP a resumed run trains on; nothing before a step, nor from another rank."""
    group_env(monkeypatch, free_port(), 0, 1)
    with dense_tables() as tables:
        dense = AllReduceDense(tables, PARAMS, OPTIMIZERS["adam"])
        dense._next_write = math.inf  # no periodic write (test_rank_0_writes_the_mlp_while_the_job_trains)
        try:
            start = flat(dense.pull())
            assert not dense.save_on_stop()  # no step: the servers hold these values already
            for s in range(3):
                dense.step(grads_of(0, s))
            dense.rank = 1
            assert not dense.save_on_stop()
            np.testing.assert_allclose(flat(DenseSync(tables, PARAMS).pull()), start, atol=1e-7)
            dense.rank = 0
            dense._collective = lambda *args: pytest.fail("a collective as a worker stops: the others may be gone")
            assert dense.save_on_stop()
            np.testing.assert_allclose(flat(DenseSync(tables, PARAMS).pull()), flat(dense.values), atol=1e-7)
            assert not np.allclose(flat(dense.values), start)
        finally:
            dense.close()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_mean_gradient_with_a_nan_or_inf_is_refused_and_changes_nothing(monkeypatch, bad):
    """As a server refuses a push of a non-finite gradient: the step raises, naming the parameter and element, and
    the weights and Adam's state stay those of the step before (the steps after are the oracle's without it)."""
    group_env(monkeypatch, free_port(), 0, 1)
    with dense_tables() as tables:
        dense = AllReduceDense(tables, PARAMS, OPTIMIZERS["adam"])
        dense._next_write = math.inf  # no periodic write
        try:
            start = flat(dense.pull())
            dense.step(grads_of(0, 0))
            after_first = flat(dense.values)
            spoiled = grads_of(0, 1)
            name = PARAMS[2].name  # mlp.1.weight: (8, 8)
            spoiled[name][0, 5] = bad
            with pytest.raises(ValueError, match=rf"^step 2 of the allreduce group: the mean gradient over the workers "
                               rf"at dense parameter '{name}' \[0, 5\] is {bad} \(weight .*\); the MLP's step was not "
                               r"applied \(its values are those of the step before\); the row pushes of that step "
                               r"were sent beside it \(applied, unless a warning says their push "
                               r"failed\)$"):  # fmt: skip
                dense.step(spoiled)
            np.testing.assert_array_equal(flat(dense.values), after_first)
            np.testing.assert_array_equal(dense.weights, after_first)
            for s in range(1, 3):
                dense.step(grads_of(0, s))
            np.testing.assert_allclose(flat(dense.values), oracle("adam", start, world=1)[3], rtol=1e-6, atol=1e-6)
        finally:
            dense.close()


@pytest.mark.parametrize("name", ["adagrad", "adam"])
def test_a_step_that_would_overflow_the_weights_or_state_is_refused_and_changes_nothing(monkeypatch, name):
    """A finite mean gradient whose step overflows float32 (1e21: its square, in Adagrad's accumulator or Adam's v,
    is Inf) is refused as a server refuses such a push: the step raises, naming the parameter and element, and the
    weights and the optimizer's state stay those of the step before (the steps after are the oracle's without it)."""
    group_env(monkeypatch, free_port(), 0, 1)
    with dense_tables() as tables:
        dense = AllReduceDense(tables, PARAMS, OPTIMIZERS[name])
        dense._next_write = math.inf  # no periodic write
        try:
            start = flat(dense.pull())
            dense.step(grads_of(0, 0))
            after_first = flat(dense.values)
            huge = grads_of(0, 1)
            param = PARAMS[2].name  # mlp.1.weight: (8, 8)
            huge[param][0, 5] = 1e21
            with pytest.raises(ValueError, match=rf"^step 2 of the allreduce group: the {name} step would make "
                               rf"dense parameter '{param}' \[0, 5\] or its optimizer state non-finite \(weight "
                               r".*, mean gradient over the workers 1\.0+\d*e\+21\): float32 overflow; the MLP's "
                               r"step was not applied \(its values are those of the step before\); the row pushes "
                               r"of that step were sent beside it \(applied, unless a warning says their push "
                               r"failed\)$"):  # fmt: skip
                dense.step(huge)
            np.testing.assert_array_equal(flat(dense.values), after_first)
            np.testing.assert_array_equal(dense.weights, after_first)
            for s in range(1, 3):
                dense.step(grads_of(0, s))
            np.testing.assert_allclose(flat(dense.values), oracle(name, start, world=1)[3], rtol=1e-6, atol=1e-6)
        finally:
            dense.close()


def test_rank_0_writes_the_mlp_while_the_job_trains_after_its_first_step_then_every_interval(monkeypatch):
    """A checkpoint, export, eval or predict taken during a run reads the MLP rank 0 wrote last: after the first
    step, then at most WRITE_EVERY_S seconds old; no other rank writes."""
    import worker.allreduce

    group_env(monkeypatch, free_port(), 0, 1)
    monkeypatch.setattr(worker.allreduce, "WRITE_EVERY_S", 3600.0)
    with dense_tables() as tables:
        dense = AllReduceDense(tables, PARAMS, OPTIMIZERS["adam"])
        try:
            start = flat(dense.pull())
            dense.step(grads_of(0, 0))
            after_first = flat(dense.values)
            assert not np.allclose(after_first, start)
            np.testing.assert_allclose(flat(DenseSync(tables, PARAMS).pull()), after_first, atol=1e-7)
            dense.step(grads_of(0, 1))  # within the interval: the servers keep the first step's
            np.testing.assert_allclose(flat(DenseSync(tables, PARAMS).pull()), after_first, atol=1e-7)
            dense._next_write = 0.0  # the interval has passed
            dense.step(grads_of(0, 2))
            np.testing.assert_allclose(flat(DenseSync(tables, PARAMS).pull()), flat(dense.values), atol=1e-7)
        finally:  # (another rank writes only once rank 0 has no batch: test_the_writer_is_the_lowest_rank_...)
            dense.close()


def test_a_one_worker_run_forms_its_group_with_no_rendezvous_variables_left_behind(monkeypatch):
    """ps-worker train --dense allreduce alone needs no launcher: the variables it sets for its group of one go
    once the group is formed (a later run in the process, or a child it starts, does not inherit them)."""
    import types

    from worker.job import dense_path

    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    cfg = types.SimpleNamespace(dense="allreduce", dense_optimizer="adam", dense_learning_rate=0.001, num_workers=1,
                                device="cpu", barrier_timeout_s=30.0)  # fmt: skip
    spec = ModelSpec("dnn", uniform_fields(3, 4), num_dense=2, hidden=(8, 8))
    with dense_tables() as tables:
        dense = dense_path(cfg, tables, spec)
        try:
            assert isinstance(dense, AllReduceDense) and (dense.rank, dense.world_size) == (0, 1)
            assert [v for v in ENV_VARS if v in os.environ] == []
            dense.pull()
        finally:
            dense.close()


def test_missing_environment_variables_are_named(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="missing: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE"):
        init_process_group_from_env("cpu")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="missing: MASTER_PORT, WORLD_SIZE$"):
        AllReduceDense(None, PARAMS)
    assert not dist.is_initialized()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_local_optimizer_is_the_servers_rule(name):
    """LocalOptimizer against ps.rows.optim's kernel on rows [w | state], 20 steps of random gradients."""
    rng = np.random.default_rng(1)
    rows, dim = 3, 5
    server = get_optimizer(OPTIMIZERS[name])
    buf = np.zeros((rows, dim + server.state_floats(dim)), np.float32)
    buf[:, :dim] = rng.uniform(-1, 1, (rows, dim))
    server.init_state(buf, dim)
    local = LocalOptimizer(OPTIMIZERS[name], rows * dim)
    weights = buf[:, :dim].ravel().copy()
    for _ in range(20):
        g = rng.normal(0, 1, (rows, dim)).astype(np.float32)
        server.apply(buf, g)
        local.apply(weights, g.ravel())
    # the servers' kernels are compiled with fastmath (reassociated float32): adam drifts ~1e-6 in 20 steps
    np.testing.assert_allclose(weights, buf[:, :dim].ravel(), rtol=0, atol=3e-6)


@pytest.mark.parametrize(
    ("name", "weight", "grad"), [("sgd", 3.3e38, -3e38), ("adagrad", 1.0, 1e20), ("adam", 1.0, 1e21)]
)
def test_a_local_step_is_refused_whole_where_the_servers_kernel_makes_a_row_non_finite(name, weight, grad):
    """Where ps.rows.optim's kernel makes a row (weight or state) Inf or NaN, which a server's push refuses whole,
    the local step raises ValueError (NonFiniteStepError) naming the element and changes nothing: the next step gives what it
    gives to an optimizer that never saw the refused one."""
    server = get_optimizer(OPTIMIZERS[name])
    dim = 3
    buf = np.zeros((1, dim + server.state_floats(dim)), np.float32)
    buf[0, :dim] = [0.5, weight, -0.5]
    server.init_state(buf, dim)
    bad = np.array([[0.25, grad, 0.25]], np.float32)
    server.apply(buf, bad)
    assert not np.isfinite(buf).all()  # the oracle: the server's check refuses such a push
    local, fresh = LocalOptimizer(OPTIMIZERS[name], dim), LocalOptimizer(OPTIMIZERS[name], dim)
    before = np.array([0.5, weight, -0.5], np.float32)
    weights = before.copy()
    with pytest.raises(NonFiniteStepError, match=r"element 1 or its optimizer state non-finite .*: float32 overflow; "
                       "nothing was applied") as refused:  # fmt: skip
        local.apply(weights, bad.ravel())
    assert (refused.value.index, refused.value.overflow) == (1, bool(np.isfinite(grad)))
    np.testing.assert_array_equal(weights, before)
    good = np.array([0.125, -0.25, 0.5], np.float32)
    expected = weights.copy()
    fresh.apply(expected, good)
    local.apply(weights, good)
    np.testing.assert_array_equal(weights, expected)
    assert local.steps == fresh.steps == 1


def float32_steps(name: str, weights: np.ndarray, grads: list[np.ndarray]) -> list[np.ndarray]:
    """The weights after each step of float32 numpy applying the rule in the kernels' order, each operation one
    IEEE-rounded float32 one (the oracle of LocalOptimizer's bits)."""
    cfg, f32 = OPTIMIZERS[name], np.float32
    p, lr, one = {k: f32(v) for k, v in cfg.all_params().items()}, f32(cfg.learning_rate), f32(1.0)
    w, m, v, a = weights.copy(), np.zeros_like(weights), np.zeros_like(weights), np.zeros_like(weights)
    a[:] = p.get("initial_accumulator", f32(0.0))
    out = []
    for t, g in enumerate(grads, start=1):
        if name == "sgd":
            w = w - lr * g
        elif name == "adagrad":
            a = a + g * g
            w = w - lr * g / (np.sqrt(a) + p["epsilon"])
        else:
            c1, c2 = f32(1.0 - float(p["beta1"]) ** t), f32(1.0 - float(p["beta2"]) ** t)
            m = p["beta1"] * m + (one - p["beta1"]) * g
            v = p["beta2"] * v + (one - p["beta2"]) * g * g
            w = w - lr * (m / c1) / (np.sqrt(v / c2) + p["epsilon"])
        assert w.dtype == m.dtype == v.dtype == a.dtype == np.float32
        out.append(w)
    return out


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_local_optimizer_gives_the_bits_of_float32_numpy_in_the_same_order(name):
    """200 steps of LocalOptimizer (one compiled pass into buffers, state swapped in) equal, bit for bit after every
    step, float32 numpy computing each rule in the same order: nothing fused or reordered, whatever the buffers."""
    rng = np.random.default_rng(7)
    size = 1001  # not a multiple of a vector's width: the loop's tail too
    weights = rng.uniform(-1, 1, size).astype(np.float32)
    grads = [(rng.normal(0, 1, size) * 10.0 ** rng.uniform(-4, 2, size)).astype(np.float32) for _ in range(200)]
    local, held = LocalOptimizer(OPTIMIZERS[name], size), weights.copy()
    for s, (g, want) in enumerate(zip(grads, float32_steps(name, weights, grads), strict=True)):
        local.apply(held, g)
        np.testing.assert_array_equal(held, want, err_msg=f"{name}, step {s + 1}")
    assert np.abs(held - weights).max() > 0.01 and local.steps == 200


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("bad", [np.nan, -np.inf])
def test_a_local_step_with_a_gradient_not_finite_says_so_and_changes_nothing(name, bad):
    """A gradient of NaN or Inf is refused whole, named as the gradient (not as a float32 overflow of the step), and
    the weights, state and step count stay those of the step before: the next steps are a fresh optimizer's."""
    rng = np.random.default_rng(3)
    size = 37
    grads = [rng.normal(0, 1, size).astype(np.float32) for _ in range(3)]
    local, fresh = LocalOptimizer(OPTIMIZERS[name], size), LocalOptimizer(OPTIMIZERS[name], size)
    weights = rng.uniform(-1, 1, size).astype(np.float32)
    expected = weights.copy()
    local.apply(weights, grads[0])
    fresh.apply(expected, grads[0])
    before = weights.copy()
    spoiled = grads[1].copy()
    spoiled[20] = bad
    with pytest.raises(NonFiniteStepError, match=rf"^the gradient at element 20 is {bad} \(weight .*\); nothing was "
                       "applied$") as refused:  # fmt: skip
        local.apply(weights, spoiled)
    assert (refused.value.index, refused.value.overflow, str(refused.value.grad)) == (20, False, str(bad))
    np.testing.assert_array_equal(weights, before)
    for g in grads[1:]:
        local.apply(weights, g)
        fresh.apply(expected, g)
    np.testing.assert_array_equal(weights, expected)
    assert local.steps == fresh.steps == 3


def test_the_allreduce_path_imports_not_the_step_that_calls_it():
    """worker/allreduce.py takes DivergedError from worker/diverged.py, not from its caller worker/step.py (which
    brings scoring, metrics and the row source with it)."""
    code = "import sys, worker.allreduce; print([m for m in ('worker.step', 'worker.scoring') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize(("weights", "grads"), [(6, 6), (4, 6), (6, 4), (3, 3)])
def test_a_local_step_of_another_size_than_the_optimizers_is_refused_and_changes_nothing(weights, grads):
    local = LocalOptimizer(OPTIMIZERS["adam"], 4)
    w, g = np.ones(weights, np.float32), np.ones(grads, np.float32)
    state = [local._before.copy(), local.m.copy(), local.v.copy()]
    expected = rf"weights have shape \({weights},\) and grads \({grads},\), expected \(4,\) each"
    with pytest.raises(ValueError, match=expected):
        local.apply(w, g)
    np.testing.assert_array_equal(w, np.ones(weights, np.float32))
    for before, now in zip(state, [local._before, local.m, local.v], strict=True):
        np.testing.assert_array_equal(before, now)
    assert local.steps == 0


def test_ftrl_is_refused():
    with pytest.raises(ValueError, match="not 'ftrl'"):
        LocalOptimizer(OptimizerConfig("ftrl", 0.1), 4)


def test_a_group_that_not_every_worker_joins_is_a_timeout_that_says_what_to_check(monkeypatch):
    """A worker of WORLD_SIZE 2 whose peer never comes (a --dense ps worker, say) fails after the timeout with a
    message, not torch's DistStoreError traceback, and leaves no group behind."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        TimeoutError, match=r"1/2 clients joined\. Every worker of the job must run with --dense allr"
    ) as e:
        init_process_group_from_env("cpu", timeout_s=1)
    assert isinstance(e.value.__cause__, dist.DistStoreError)  # chained, for debugging
    assert not dist.is_initialized()


def group_env(monkeypatch, port: int, rank: int, world_size: int = 2) -> None:
    """torch.distributed's env:// variables for rank of world_size at 127.0.0.1:port."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))


def test_a_rank_whose_rank_0_never_starts_times_out_with_a_message_naming_the_address(monkeypatch):
    """RANK 1 of 2 with nothing at MASTER_ADDR:MASTER_PORT: torch's DistNetworkError (not a DistStoreError) becomes
    a TimeoutError (an OSError: the CLI prints its message) that names the address, the timeout and what to check."""
    port = free_port()
    group_env(monkeypatch, port, rank=1)
    with pytest.raises(TimeoutError) as info:
        init_process_group_from_env("cpu", timeout_s=1)
    assert str(info.value).startswith(
        f"RANK 1 of WORLD_SIZE 2 could not reach the allreduce group's rendezvous at 127.0.0.1:{port} (MASTER_ADDR:"
        "MASTER_PORT, hosted by RANK 0) within the timeout of 1 s (--barrier-timeout): The client socket has timed out"
    )
    assert "RANK 0 must run with --dense allreduce and the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE" in str(
        info.value
    )
    assert isinstance(info.value.__cause__, dist.DistNetworkError)
    assert not dist.is_initialized()


def test_a_master_port_in_use_is_a_connection_error_that_says_what_to_change(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        group_env(monkeypatch, port, rank=0)
        with pytest.raises(ConnectionError) as info:
            init_process_group_from_env("cpu", timeout_s=1)
    message = str(info.value)
    assert message.startswith(f"RANK 0 of WORLD_SIZE 2 could not set up the allreduce group at 127.0.0.1:{port} ")
    assert "EADDRINUSE" in message and "MASTER_PORT a port no other process holds" in message
    assert isinstance(info.value.__cause__, dist.DistError)
    assert not dist.is_initialized()


def peer_case(rank: str, fate: str, timeout_s: str, out: str) -> None:
    """One of two workers (a process of its own: a fresh default group's store keys match the other's): pull and
    one step; then rank 1 meets its fate ("die": SIGKILL; "stop": SIGSTOP), and rank 0 writes to `out` (JSON) the
    error of its second step and whether close() destroyed its group. Both start the group on a line on stdin
    (the group's timeout is the rendezvous's too: they join at once, not as each has imported torch)."""
    import json
    import signal
    import sys

    tables = dense_tables() if rank == "0" else None
    print("ready", flush=True)
    sys.stdin.readline()
    dense = AllReduceDense(tables, PARAMS, OPTIMIZERS["sgd"], timeout_s=float(timeout_s))
    dense.pull()
    dense.step(grads_of(int(rank), 0))
    if rank == "1":
        os.kill(os.getpid(), signal.SIGKILL if fate == "die" else signal.SIGSTOP)
    start, result = time.monotonic(), {}
    try:
        dense.step(grads_of(0, 1))  # the peer is gone or stopped: never a hang
    except Exception as e:
        result = {"type": type(e).__name__, "message": str(e), "cause": type(e.__cause__).__name__}
    result["seconds"] = time.monotonic() - start
    dense.close()
    result["closed"] = not dist.is_initialized()
    pathlib.Path(out).write_text(json.dumps(result))


def peer_fails_in_a_step(tmp_path, fate: str, timeout_s: float) -> tuple[dict, int]:
    """peer_case's result on rank 0, and MASTER_PORT."""
    import json
    import select
    import subprocess
    import sys

    port, out = free_port(), tmp_path / "rank0.json"
    workers = []
    try:
        for rank in range(2):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
            code = "import sys; from tests.test_allreduce import peer_case; peer_case(*sys.argv[1:])"
            args = [sys.executable, "-c", code, str(rank), fate, str(timeout_s), str(out)]
            root = pathlib.Path(__file__).resolve().parents[1]
            kw = dict(cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            workers.append(subprocess.Popen(args, **kw))
        for w in workers:
            assert select.select([w.stdout], [], [], 60)[0] and w.stdout.readline() == "ready\n", "a worker failed"
        for w in workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        assert workers[0].wait(timeout=20 + timeout_s) == 0
        return json.loads(out.read_text()), port
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()  # rank 1, stopped; or any worker of a failed test
            w.wait()
            w.stdin.close()
            w.stdout.close()


def test_a_peer_that_dies_fails_the_step_at_once_with_a_connection_error_naming_the_operation(tmp_path):
    error, port = peer_fails_in_a_step(tmp_path, "die", timeout_s=30)
    assert error["type"] == "ConnectionError", error  # an OSError: the CLI prints it as one line
    assert error["message"].startswith(
        f"rank 0 of the allreduce group (2 workers at 127.0.0.1:{port}): the all_reduce of the dense gradients failed:"
        " a peer worker is gone (its process died or was killed, or the connection to it broke): "
    ), error
    assert error["message"].endswith("the other workers' output says what happened to them; rerun the job")
    assert error["cause"] == "RuntimeError" and error["closed"]  # torch's error chained; the group destroyed
    assert error["seconds"] < 10  # not the timeout: a closed connection is seen at once


def test_a_peer_that_stops_fails_the_step_after_the_timeout_with_a_timeout_error_naming_it(tmp_path):
    error, port = peer_fails_in_a_step(tmp_path, "stop", timeout_s=6)  # the setup's broadcasts must fit in it
    assert error["type"] == "TimeoutError", error
    assert error["message"].startswith(
        f"rank 0 of the allreduce group (2 workers at 127.0.0.1:{port}): the all_reduce of the dense gradients failed,"
        " a peer worker not answering within its timeout of 6 s (--barrier-timeout): Timed out waiting 6000ms for recv"
    ), error
    assert (
        "The peer is stalled (stopped, hung, or busy outside the step for longer than that) or gone" in error["message"]
    )
    assert error["message"].endswith("rerun the job, with a larger --barrier-timeout if a worker is only slow")
    assert error["cause"] == "RuntimeError" and error["closed"]
    assert 5 < error["seconds"] < 20


def test_a_cuda_worker_runs_on_the_gpu_of_its_local_rank(monkeypatch):
    from worker.models.torch_backend import worker_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert (rank_device("cpu"), rank_device("cuda"), rank_device("cuda:1")) == ("cpu", "cuda:0", "cuda:1")
    assert worker_device("cuda") == "cuda"  # --dense ps, no LOCAL_RANK: the current GPU
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_device("cuda") == "cuda:1" and worker_device("cuda") == "cuda:1"
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert worker_device("cuda") == "cuda:0"  # --dense ps: more workers than GPUs share them
    with pytest.raises(ValueError, match=r"cuda:2 \(LOCAL_RANK 2\), but torch sees 2 GPUs; .* one cuda worker per GPU"):
        rank_device("cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # the model says there is no GPU
    assert rank_device("cuda") == worker_device("cuda") == "cuda"


@pytest.mark.parametrize(
    "setting",
    ["weight_bound = 0.05", "l2 = 0.1", 'optimizer = { name = "sgd", learning_rate = 0.5 }',
     "admission = { min_count = 2 }"],
)  # fmt: skip
def test_table_config_settings_of_an_mlp_table_the_workers_do_not_apply_are_refused(servers, tmp_path, setting):
    """The workers of --dense allreduce train the MLP themselves with --dense-optimizer: a --table-config setting of a
    dense table that only the servers apply (its optimizer, weight bound, lazy l2, admission) would leave the
    servers, and so eval, predict and export, with another MLP than the one the job trained and evaluated. Such a
    run is refused before any table is made; an initializer (the values every worker starts from, pulled from the
    servers) is taken, and the servers then hold the MLP the run's final evaluation scored."""
    from worker.client import Client
    from worker.served import evaluate_servers
    from worker.train import train
    from worker.train_config import TrainConfig

    addresses, _ = servers(1)
    table = tmp_path / "tables.toml"
    table.write_text(f'["dense.deepfm.mlp.0.weight"]\n{setting}\n')
    cfg = TrainConfig(servers=tuple(addresses), model="deepfm", backend="torch", dense="allreduce", hidden=(4,),
                      synthetic_rows=400, synthetic_eval_rows=200, recipe="large", batch_size=50, progress=False,
                      server_timeout_s=0, table_config=str(table))  # fmt: skip
    name = setting.split(" =")[0]
    with pytest.raises(ValueError, match=rf"--dense allreduce .* dense.deepfm.mlp.0.weight: {name} .* --dense ps"):
        train(cfg)
    with Client(addresses) as client:
        assert [t.name for t in client.stats()[0].tables] == []  # nothing was made
    table.write_text('["dense.deepfm.mlp.0.weight"]\ninitializer = { name = "uniform", scale = 0.3, seed = 5 }\n')
    trained = train(cfg)
    assert trained["eval_logloss"] == pytest.approx(evaluate_servers(cfg)["eval_logloss"], rel=1e-6)


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_a_run_writes_the_mlp_with_its_jobs_stamp_before_it_says_it_is_done_or_stopped(servers, mode, monkeypatch):
    """--dense allreduce: the MLP's writes to the servers (while training, at the end, and as a failed run stops)
    carry the job's stamp and come before the worker says it is done (or stopped): after that, another job may hold
    the shards, and the MLP would land in its tables."""
    from worker.client import Client
    from worker.steprows import AsyncRows, ClockedRows
    from worker.train import train
    from worker.train_config import TrainConfig

    calls, push_many, finish, stop_job = [], Client.push_many, Client.finish, Client.stop_job

    def pushed(self, items, *args, **kwargs):
        if any(PushItem(*item).table.startswith("dense.") for item in items):
            calls.append(("write" if kwargs.get("add_delta") else "push", kwargs.get("stamp")))
        return push_many(self, items, *args, **kwargs)

    def finished(self, stamp):
        calls.append(("done", stamp))
        return finish(self, stamp)

    def stopped(self, stamp, *args, **kwargs):
        calls.append(("stopped", stamp))
        return stop_job(self, stamp, *args, **kwargs)

    monkeypatch.setattr(Client, "push_many", pushed)
    monkeypatch.setattr(Client, "finish", finished)
    monkeypatch.setattr(Client, "stop_job", stopped)
    addresses, _ = servers(1)
    cfg = TrainConfig(servers=tuple(addresses), model="deepfm", backend="torch", dense="allreduce", hidden=(4,),
                      synthetic_rows=400, synthetic_eval_rows=0, recipe="large", batch_size=50, progress=False,
                      mode=mode, job_id=91)  # fmt: skip
    train(cfg)
    kinds = [kind for kind, _ in calls]
    assert kinds[0] == "write" and kinds[-2:] == ["write", "done"], kinds  # after the first step; at the end
    assert all(stamp is not None and stamp.job == 91 for _, stamp in calls)
    calls.clear()
    source = AsyncRows if mode == "async" else ClockedRows
    push = source.push

    def fails(self, step, *args):
        if step == 3:
            raise ValueError("a failure mid-training")
        return push(self, step, *args)

    monkeypatch.setattr(source, "push", fails)
    with pytest.raises(ValueError, match="a failure mid-training"):
        train(dataclasses.replace(cfg, job_id=92))
    kinds = [kind for kind, _ in calls]
    assert kinds[0] == "write" and kinds[-2:] == ["write", "stopped"], kinds  # save_on_stop's, then the stop
    assert all(stamp is not None and stamp.job == 92 for _, stamp in calls)

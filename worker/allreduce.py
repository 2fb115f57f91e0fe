"""The dense path among torch workers: every worker holds the whole MLP, and gradients are averaged by allreduce.

The servers hold the dense parameters (worker.dense's tables) as a worker last wrote them: pull() has rank 0 read
their initial values and broadcast them, so every worker starts identical and equal to the PS path's start; finish()
has a worker write the trained values back as add-delta pushes, so evaluation and checkpoints read the trained
MLP from the servers. The lowest rank that has a batch at a step (rank 0 until it runs out: the writer) also writes
them, alone, after its first step as the writer and then every WRITE_EVERY_S seconds, so that a checkpoint, export,
eval or predict taken while the job trains reads an MLP at most that old (not the one the job started from). Every write goes through the worker's row source (`source`: push_apart, with its job's
stamp, as the PS path's pushes), while the worker has not said it is done: its job holds the shards then, and a
shard that holds another job refuses the write. In between, a step's gradients (every parameter flattened, in
params order, into one float32 buffer, followed by one float per rank: 1 in its own from a worker with a batch) go
through one all_reduce (SUM) and are divided by the number of workers that had a batch; each worker then applies the optimizer
to that mean itself (LocalOptimizer: the servers' rule per element), so equal inputs leave every worker with equal
weights, bit for bit. A mean with an Inf or NaN (a worker's loss diverged) is refused as a server refuses such a
push: every rank raises ValueError at that step, its values and optimizer state those of the step before.

Workers may run out of batches at different steps (shares of a file differ by a line, a worker stops early):
finish() keeps a worker that is done in the all_reduces, adding zeros and 0 to the count and applying the same
mean as the others, until every worker is done. A worker that waits so for the others says it is done first (its
`leave`: the row source's finish), since an ssp shard would hold the others' pulls for it; the writer of the group's
last step (the lowest rank of those that did not wait) then writes the values (flush(writer)), its job still
holding the shards for it, and says it is done after that; and a worker stopped before its end has the writer of
the last step it took part in write them (save_on_stop). pull, step, finish and flush are collective: every
rank of the group calls pull and finish (or flush) once, in that order, and step between them as often as it has
batches. A failure of rank 0's pull, or of the writer's write, reaches every rank as an error (after its own). A
peer worker that dies makes the collective it is missing from fail at once on the others (a ConnectionError); one
that stalls (stopped, hung), after the group's timeout (a TimeoutError): each says which operation, and what to
check.

The process group: torch.distributed, from the environment torchrun sets (env://: MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE), gloo for a cpu device and nccl for a cuda one, whose device is this rank's GPU ("cuda:<LOCAL_RANK>").
torch is imported inside the functions, so this module imports without it.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import time
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from ps.config import OptimizerConfig
from ps.errors import NOTHING_APPLIED
from ps.rows.finite import first_non_finite
from worker.client import PushItem
from worker.dense import DEFAULT_OPTIMIZER, table_name
from worker.models.spec import DenseParam

ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
WRITE_EVERY_S = 30.0  # the writer's writes of the MLP to the servers while the job trains


def rank_device(device: str) -> str:
    """This rank's device: worker.models.torch_backend.worker_device with a GPU of its own (nccl wants one GPU
    per worker)."""
    from worker.models.torch_backend import worker_device

    return worker_device(device, exclusive=True)


def init_process_group_from_env(device: str, timeout_s: float | None = None) -> tuple[int, int]:
    """Joins the default torch.distributed group the environment describes (env://): gloo for a cpu device,
    nccl for cuda (its GPU made the current one). Returns (rank, world_size); a default group already
    initialized is returned as it is. ValueError naming the missing variables when some of ENV_VARS are unset;
    TimeoutError when not every rank joined within timeout_s (None: torch's default), or this rank could not reach
    the rendezvous at MASTER_ADDR:MASTER_PORT in time; ConnectionError when the group could not be set up otherwise
    (MASTER_PORT in use on rank 0, say). Both are OSErrors: the CLI prints their message, torch's error chained."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    missing = [v for v in ENV_VARS if not os.environ.get(v)]
    if missing:
        raise ValueError(
            f"the allreduce dense path reads {', '.join(ENV_VARS)} from the environment (torchrun sets them); "
            f"missing: {', '.join(missing)}"
        )
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(rank_device(device)))
        backend = "nccl"
    else:
        backend = "gloo"
    try:
        if timeout_s is None:
            dist.init_process_group(backend, init_method="env://")
        else:  # a collective waiting longer for a peer (one that died) fails instead of hanging
            dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))
    except dist.DistStoreError as e:  # the rendezvous: not every rank came
        env = {v: os.environ[v] for v in ENV_VARS}
        raise TimeoutError(
            f"not every worker joined the allreduce group at {env['MASTER_ADDR']}:{env['MASTER_PORT']} (RANK "
            f"{env['RANK']} of WORLD_SIZE {env['WORLD_SIZE']}) in time: {str(e).splitlines()[0]} Every worker of "
            "the job must run with --dense allreduce and the same WORLD_SIZE (a --dense ps worker never joins); "
            "a worker that died or has not started yet leaves the group short too"
        ) from e
    except RuntimeError as e:  # DistNetworkError (the store's socket), another DistError, the backend's own
        raise _init_error(e, timeout_s) from e
    return dist.get_rank(), dist.get_world_size()


def torch_reason(e: BaseException) -> str:
    """The gist of a torch.distributed error for a message: its first line, at most 300 characters; of a line
    from gloo's transport ("[.../pair.cc:553] Connection closed by peer [addr]:port. This is typically caused
    by ..."), the first sentence without the source file."""
    lines = str(e).strip().splitlines()
    line = lines[0].strip() if lines else ""
    text = re.sub(r"^\[[^\]]*\]\s*", "", line)
    if text != line:
        text = text.split(". ", 1)[0]
    text = text.rstrip(".") or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _timed_out(e: BaseException) -> bool:
    return "timed out" in str(e).lower() or "timeout" in str(e).lower()


def _init_error(e: RuntimeError, timeout_s: float | None) -> OSError:
    """The error of a failed init_process_group (other than the rendezvous timing out on the store's host): a
    TimeoutError when this rank could not reach the store in time, else a ConnectionError."""
    env = {v: os.environ[v] for v in ENV_VARS}
    where, rank, world = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", env["RANK"], env["WORLD_SIZE"]
    within = "in time" if timeout_s is None else f"within the timeout of {timeout_s:g} s (--barrier-timeout)"
    if _timed_out(e):
        return TimeoutError(
            f"RANK {rank} of WORLD_SIZE {world} could not reach the allreduce group's rendezvous at {where} "
            f"(MASTER_ADDR:MASTER_PORT, hosted by RANK 0) {within}: {torch_reason(e)}. RANK 0 must run with --dense "
            "allreduce and the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, and this machine must reach that address; "
            "a RANK 0 that died or has not started yet leaves the group short too"
        )
    return ConnectionError(
        f"RANK {rank} of WORLD_SIZE {world} could not set up the allreduce group at {where} (MASTER_ADDR:MASTER_PORT): "
        f"{torch_reason(e)}. RANK 0 hosts the group there: MASTER_ADDR must be an address of RANK 0's machine that "
        "every worker reaches, and MASTER_PORT a port no other process holds (another job's group, say); every "
        "worker must have the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE"
    )


class LocalOptimizer:
    """ps.rows.optim's update (sgd, adagrad, adam) of one flat float32 vector: each element as the servers'
    kernels compute it, every operation a single IEEE-rounded float32 one (none fused or reordered), so equal
    inputs give equal bits on any machine. Adam's bias correction counts this optimizer's steps (each
    step updates every element, as a server counts each id's updates)."""

    SUPPORTED = ("sgd", "adagrad", "adam")

    def __init__(self, cfg: OptimizerConfig, size: int):
        cfg.validate()
        if cfg.name not in self.SUPPORTED:
            raise ValueError(f"the allreduce dense path runs {list(self.SUPPORTED)}, not {cfg.name!r}")
        p = {k: np.float32(v) for k, v in cfg.all_params().items()}
        self.name, self.lr, self.params, self.steps = cfg.name, np.float32(cfg.learning_rate), p, 0
        if cfg.name == "adagrad":
            self.accumulator = np.full(size, p["initial_accumulator"], np.float32)
        if cfg.name == "adam":
            self.m = np.zeros(size, np.float32)
            self.v = np.zeros(size, np.float32)

    def apply(self, weights: np.ndarray, grads: np.ndarray) -> None:
        """One step on weights (float32, in place) with grads of the same shape: one compiled pass."""
        self.steps += 1
        p = self.params
        if self.name == "sgd":
            _sgd_step(weights, grads, self.lr)
        elif self.name == "adagrad":
            _adagrad_step(weights, grads, self.accumulator, self.lr, p["epsilon"])
        else:
            c1 = np.float32(1.0 - float(p["beta1"]) ** self.steps)  # 1 - b^t rounded once, to float32
            c2 = np.float32(1.0 - float(p["beta2"]) ** self.steps)
            _adam_step(weights, grads, self.m, self.v, self.lr, p["beta1"], p["beta2"], p["epsilon"], c1, c2)


# One pass over the vector each, every operation a float32 one in the order written (no fastmath: nothing fused
# or reordered), so equal inputs give equal bits on every worker. error_model="numpy": a division is IEEE's (no
# check for a zero divisor, which none of these can be), so the loops vectorize (Adam 3.1 -> 0.7 ms at 487K).
@numba.njit(nogil=True, error_model="numpy", cache=True)
def _sgd_step(w, g, lr):  # w -= lr g
    for i in range(w.shape[0]):
        w[i] -= lr * g[i]


@numba.njit(nogil=True, error_model="numpy", cache=True)
def _adagrad_step(w, g, a, lr, eps):  # a += g g; w -= lr g / (sqrt(a) + eps)
    for i in range(w.shape[0]):
        a[i] += g[i] * g[i]
        w[i] -= lr * g[i] / (np.sqrt(a[i]) + eps)


@numba.njit(nogil=True, error_model="numpy", cache=True)
def _adam_step(w, g, m, v, lr, b1, b2, eps, c1, c2):  # m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g
    one = np.float32(1.0)  # w -= lr (m / c1) / (sqrt(v / c2) + eps)
    for i in range(w.shape[0]):
        m[i] = b1 * m[i] + (one - b1) * g[i]
        v[i] = b2 * v[i] + (one - b2) * g[i] * g[i]
        w[i] -= lr * (m[i] / c1) / (np.sqrt(v[i] / c2) + eps)


class AllReduceDense:
    """The dense parameters of one torch worker, kept here and averaged over the group (see the module docstring).

    tables: anything with the Client's pull_many and push_many (used by the rank that reads or writes); source: the
    worker's row source (worker/steprows.py), whose push_apart the writes go through with the job's stamp (None:
    tables.push_many, unstamped); optimizer: the update run on every worker; group: a torch.distributed process
    group, or None for the default group (initialized from the environment when it is not yet, and then destroyed
    by close())."""

    inline = False
    collective = True  # flush() and finish() are collective

    def __init__(
        self,
        tables: Any,
        params: list[DenseParam],
        optimizer: OptimizerConfig = DEFAULT_OPTIMIZER,
        device: str = "cpu",
        group: Any = None,
        timeout_s: float | None = None,
        source: Any = None,
    ):
        import torch
        import torch.distributed as dist

        self.tables, self.params, self.group, self.timeout_s = tables, params, group, timeout_s
        self.source = source
        self.sizes = [p.shape[0] * p.shape[1] for p in params]
        self.optimizer = LocalOptimizer(optimizer, sum(self.sizes))
        self.device = torch.device(rank_device(device))
        self._owns_group = group is None and not dist.is_initialized()
        if group is None:
            init_process_group_from_env(device, timeout_s)
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.ids = {p.name: np.arange(p.shape[0], dtype=np.uint64) for p in params}
        self.weights = np.zeros(sum(self.sizes), np.float32)  # every parameter, flattened in params order
        # the gradients, then one flag per rank: 1 from a worker with a batch
        self._buffer = np.empty(len(self.weights) + self.world_size, np.float32)
        self._grads = self._buffer[: len(self.weights)]
        self._writer = 0  # the lowest rank with a batch at the last step that had one: it writes the values
        self.values: dict[str, np.ndarray] = {}
        self.syncs = 0
        self._closed = False
        self._next_write = 0.0  # time.monotonic() of this rank's next write as the writer: after its first step
        self._left = False  # finish() said this worker is done (leave): it writes nothing more

    def pull(self) -> dict[str, np.ndarray]:
        """Rank 0 reads every dense parameter from the servers and broadcasts them; returns {name: (r, c)}. The
        optimizer's state stays as it is."""
        error = None
        if self.rank == 0:
            try:
                rows = self.tables.pull_many([(table_name(p), self.ids[p.name]) for p in self.params])
                if rows:
                    self.weights[:] = np.concatenate([r.ravel() for r in rows])
            except Exception as e:  # every rank learns of it below, rather than waiting in the broadcast
                error = e
        self._agree_ok(error, "pull the dense parameters from the servers")
        self._collective("broadcast", self.weights, "the dense parameters rank 0 read from the servers")
        self.values = self._split(self.weights)
        return self.values

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """Averages grads ({name: (r, c)}) over the workers with a batch in one all_reduce and applies the
        optimizer to the mean; a mean with an Inf or NaN changes nothing and raises ValueError on every rank."""
        if self._closed:
            raise RuntimeError("AllReduceDense.step after close()")
        if not self.params:
            return
        start = 0
        for p, size in zip(self.params, self.sizes, strict=True):
            g = grads[p.name]
            if g.shape != p.shape:
                raise ValueError(f"gradient of {p.name} has shape {g.shape}, expected {p.shape}")
            self._grads[start : start + size] = g.ravel()
            start += size
        self._reduce_and_apply(1.0)

    def finish(self, leave: Callable[[], None] = lambda: None) -> None:
        """This worker has no more batches: it takes part in the others' steps (adding no gradient) until every
        worker is done, then the lowest rank that did not wait for the others writes the values (flush), and
        leave() (this worker is done: the row source's finish). One that waits leaves before it does (an ssp
        shard would hold the others' pulls for it); the rest once the values are written, while their job holds the
        shards: the writer of the group's last step, which had a batch then, did not wait."""
        self._next_write = math.inf  # the write below is the last
        waited = False
        while self.params and self._reduce_and_apply(0.0):
            if not waited:
                leave()
                self._left = waited = True
        self.flush(self._writer)
        if not waited:
            leave()
            self._left = True

    def _reduce_and_apply(self, has_batch: float) -> int:
        """One all_reduce of the buffer (this worker's gradients, or zeros without a batch); applies the mean
        over the workers that had a batch, the lowest of them the writer. Returns how many had one (0: every worker
        is done, nothing applied)."""
        if not has_batch:
            self._grads[:] = 0.0
        flags = self._buffer[len(self._grads) :]
        flags[:] = 0.0
        flags[self.rank] = has_batch
        self._collective("all_reduce", self._buffer, "the dense gradients")
        ranks = np.flatnonzero(flags)
        active = len(ranks)
        if active == 0:
            return 0
        self._writer = int(ranks[0])
        if active > 1:
            np.divide(self._grads, np.float32(active), out=self._grads)
        self._refuse_non_finite(self._grads)
        self.optimizer.apply(self.weights, self._grads)
        self.values = self._split(self.weights)
        self.syncs += 1
        if self.rank == self._writer and time.monotonic() >= self._next_write:
            self._write_values()
        return active

    def _refuse_non_finite(self, grads: np.ndarray) -> None:
        """ValueError naming the first Inf or NaN of the mean gradient (flat, in params order), as a server refuses
        a push of one: raised by every rank at the same step (they hold the same mean), before any change. Not a
        server's error: the writer saves the MLP of the step before as it stops
        (worker.allreduce_stop.save_dense_on_stop)."""
        bad = first_non_finite(grads)
        if bad < 0:
            return
        start = 0
        for p, size in zip(self.params, self.sizes, strict=True):
            if bad < start + size:
                row, col = divmod(bad - start, p.shape[1])
                raise ValueError(
                    f"the mean gradient of dense parameter {p.name!r} over the workers holds {float(grads[bad])} at "
                    f"[{row}, {col}] (step {self.syncs + 1}); {NOTHING_APPLIED}, the values are those of the "
                    "step before"
                )
            start += size

    def flush(self, writer: int = 0) -> None:
        """(Collective: in finish(), or when every rank has taken the same steps.) Rank `writer` writes its values
        to the servers' dense tables (add-delta pushes of values - the servers' values, one show per id: a row is
        admitted, and takes a delta, once it has a show), unless no step changed them; every rank returns once it
        is done."""
        error = None
        if self.rank == writer and self.params and self.syncs:
            try:
                self._write_values()
            except Exception as e:
                error = e
        self._agree_ok(error, "write the dense parameters to the servers", writer)

    def save_on_stop(self) -> bool:
        """For a worker stopped before its end (a signal, an error), before it tells the shards so: the writer of
        the last step it took part in (the lowest rank with a batch then: rank 0 until it ran out) writes its values
        to the servers as flush() does, alone (the other ranks may be gone: no collective), so that the servers
        hold the MLP of its last step, which a resumed run (--skip-examples) trains on. Whether it wrote (the
        writer, after a step, not done: a worker that said it is done writes nothing more); raises what the write
        raises. A writer killed by SIGKILL writes nothing: the servers hold the MLP written last."""
        if not self.writes_on_stop():
            return False
        self._write_values()
        return True

    def writes_on_stop(self) -> bool:
        """Whether save_on_stop would write: this rank is the writer of the last step it took part in, after a
        step, not done."""
        return self.rank == self._writer and bool(self.params) and bool(self.syncs) and not self._left

    def _write_values(self) -> None:
        """The values written to the servers' dense tables: add-delta pushes of values - the servers' values,
        through the row source (the job's stamp) where there is one."""
        items = [(table_name(p), self.ids[p.name]) for p in self.params]
        if math.isfinite(self._next_write):
            self._next_write = time.monotonic() + WRITE_EVERY_S
        current = self.tables.pull_many(items)
        pushes = [
            PushItem(t, ids, self.values[p.name] - now.reshape(p.shape), shows=np.ones(len(ids), np.float32))
            for (t, ids), p, now in zip(items, self.params, current, strict=True)
        ]
        if self.source is not None:
            self.source.push_apart(pushes, add_delta=True)
        else:
            self.tables.push_many(pushes, add_delta=True)

    def close(self) -> None:
        """Destroys the process group if this object created it. Idempotent."""
        import torch.distributed as dist

        if not self._closed and self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._closed = True

    # ---- collectives ------------------------------------------------------------------------------------------
    def _split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """{name: (r, c)} copies of flat's slices (callers may keep them across steps)."""
        out, start = {}, 0
        for p, size in zip(self.params, self.sizes, strict=True):
            out[p.name] = flat[start : start + size].reshape(p.shape).copy()
            start += size
        return out

    def _collective(self, op: str, flat: np.ndarray, what: str, src: int = 0) -> None:
        """broadcast from rank src, or all_reduce SUM, of flat (float32, in place) over the group, on the device. A
        failure of the group (a peer worker died, or stalled past the group's timeout) raises a ConnectionError or a
        TimeoutError that names op and what (see _peer_error)."""
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(flat).to(self.device)  # the array's own memory on the CPU
        try:
            if op == "broadcast":
                global_src = src if self.group is None else dist.get_global_rank(self.group, src)
                dist.broadcast(tensor, src=global_src, group=self.group)
            else:
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        except RuntimeError as e:  # gloo's, or DistBackendError (nccl): the tensor is ours and valid, the group failed
            raise self._peer_error(op, what, e) from e
        if tensor.device.type != "cpu":
            flat[:] = tensor.cpu().numpy()

    def _peer_error(self, op: str, what: str, e: RuntimeError) -> OSError:
        """The error of a failed collective, for the CLI's one line: a TimeoutError when torch's says it timed out
        (a peer stalled, or died without closing its connections), else a ConnectionError (a peer is gone)."""
        at = ""
        if self.group is None and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
            at = f" at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        head = f"rank {self.rank} of the allreduce group ({self.world_size} workers{at}): the {op} of {what} failed"
        then = "The run cannot go on without every worker: the other workers' output says what happened to them; "
        if _timed_out(e):
            timeout = self._timeout_s()
            limit = "its timeout" if timeout is None else f"its timeout of {timeout:g} s"
            return TimeoutError(
                f"{head}, a peer worker not answering within {limit} (--barrier-timeout): {torch_reason(e)}. The peer "
                "is stalled (stopped, hung, or busy outside the step for longer than that) or gone. "
                f"{then}rerun the job, with a larger --barrier-timeout if a worker is only slow"
            )
        return ConnectionError(
            f"{head}: a peer worker is gone (its process died or was killed, or the connection to it broke): "
            f"{torch_reason(e)}. {then}rerun the job"
        )

    def _timeout_s(self) -> float | None:
        """The group's timeout in seconds, as its backend holds it (else the one given, None when neither is
        known)."""
        import torch.distributed as dist

        try:
            group = self.group if self.group is not None else dist.distributed_c10d._get_default_group()
            return group._get_backend(self.device).options._timeout.total_seconds()
        except Exception:  # a private API: torch may change it
            return self.timeout_s

    def _agree_ok(self, error: Exception | None, what: str, src: int = 0) -> None:
        """Rank src's outcome sent to every rank, which returns only once rank src is done: raises error on rank
        src, a RuntimeError on the others."""
        flag = np.array([0.0 if error is None else 1.0], np.float32)
        self._collective("broadcast", flag, f"whether rank {src} could {what}", src)
        if error is not None:
            raise error
        if flag[0] != 0.0:
            raise RuntimeError(f"rank {src} failed to {what} (its log says why)")

"""The dense path among torch workers: every worker holds the whole MLP, and gradients are averaged by allreduce.

The servers hold the dense parameters (worker.dense's tables) as a worker last wrote them: pull() has rank 0 read
their initial values and broadcast them, so every worker starts identical and equal to the PS path's start; finish()
has a worker write the trained values back as add-delta pushes, so evaluation and checkpoints read the trained
MLP from the servers. The lowest rank that has a batch at a step (rank 0 until it runs out: the writer) also writes
them, alone, after its first step as the writer and then every WRITE_EVERY_S seconds, so that a checkpoint, export,
eval or predict taken while the job trains reads an MLP at most that old (not the one the job started from). Every write
goes through the worker's row source (`source`: push_apart, with its job's stamp, as the PS path's pushes), while the
worker has not said it is done: its job holds the shards then, and a shard that holds another job refuses the write. In
between, a step's gradients (every parameter flattened, in params order, into one float32 buffer, followed by two
floats per rank, each 1 only in its own: from a worker with a batch, and from a worker whose step diverged) go through
one all_reduce (SUM) and are divided by the number of workers that had a batch; each worker then applies the optimizer to that mean itself (worker/local_optimizer.py
LocalOptimizer: the servers' rule per element), so equal inputs leave every worker with equal weights, bit for bit. A
mean with an Inf or NaN (a worker's loss diverged), or a step that would make a weight or its optimizer state Inf or NaN
(float32 overflow), is refused as a server refuses such a push: every rank raises ValueError at that step, its values
and optimizer state those of the step before. A worker whose step diverged (worker.step's check_finite: an Inf or NaN
in its predictions or gradients) still takes part in the step's all_reduce (diverged()), with its flag set and no
gradient: every rank then raises DivergedError at that step, naming the ranks that diverged, the MLP unchanged. The
other ranks' row pushes of that step, in flight beside the all_reduce (worker/step.py), are applied, as where the
optimizer refuses a step: the worker whose step diverged pushed nothing of it.

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

The process group: torch.distributed, joined from the environment torchrun sets (worker/allreduce_group.py). torch is
imported inside the functions, so this module imports without it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ps.config import OptimizerConfig
from ps.errors import NOTHING_APPLIED
from worker.allreduce_group import init_process_group_from_env, rank_device, timed_out, torch_reason
from worker.client import PushItem
from worker.dense import DEFAULT_OPTIMIZER, table_name
from worker.diverged import DIVERGED_ADVICE, DivergedError
from worker.local_optimizer import LocalOptimizer, NonFiniteStepError
from worker.models.spec import DenseParam

WRITE_EVERY_S = 30.0  # the writer's writes of the MLP to the servers while the job trains


class AllReduceDense:
    """The dense parameters of one torch worker, kept here and averaged over the group (see the module docstring).

    tables: anything with the Client's pull_many and push_many (used by the rank that reads or writes); source: the
    worker's row source (worker/steprows.py), whose push_apart the writes go through with the job's stamp (None:
    tables.push_many, unstamped); optimizer: the update run on every worker; group: a torch.distributed process
    group, or None for the default group (initialized from the environment when it is not yet, and then destroyed
    by close())."""

    inline = False
    collective = True  # flush() and finish() are collective
    sync_every = 1  # every step's gradients averaged and applied in that step

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
        # the gradients, then two flags per rank: 1 from a worker with a batch; 1 from a worker whose step diverged
        self._buffer = np.empty(len(self.weights) + 2 * self.world_size, np.float32)
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
        optimizer to the mean; a mean with an Inf or NaN, or a step that would make a value or its optimizer state
        one, changes nothing and raises ValueError on every rank."""
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

    def diverged(self, error: Exception) -> None:
        """This worker's step diverged (error: worker.step's check_finite): it takes part in the step's all_reduce,
        adding no gradient and its divergence flag, so that every rank raises DivergedError at this step, none
        having changed the MLP; raises error here (also where the group failed meanwhile: the divergence is the
        error to report, the group's failure chained to it)."""
        if self._closed:
            raise RuntimeError("AllReduceDense.diverged after close()")
        if not self.params:
            raise error
        try:
            self._reduce_and_apply(1.0, error)
        except (ConnectionError, TimeoutError) as failed:
            raise error from failed

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

    def _reduce_and_apply(self, has_batch: float, diverged: Exception | None = None) -> int:
        """One all_reduce of the buffer (this worker's gradients, or zeros without a batch or where its step
        diverged); applies the mean over the workers that had a batch, the lowest of them the writer, unless a
        worker's step diverged: then it raises DivergedError (diverged, this worker's own, where given), the MLP
        unchanged. Returns how many had a batch (0: every worker is done, nothing applied)."""
        if not has_batch or diverged is not None:
            self._grads[:] = 0.0
        flags = self._buffer[len(self._grads) : len(self._grads) + self.world_size]
        diverging = self._buffer[len(self._grads) + self.world_size :]
        flags[:] = diverging[:] = 0.0
        flags[self.rank] = has_batch
        diverging[self.rank] = 1.0 if diverged is not None else 0.0
        self._collective("all_reduce", self._buffer, "the dense gradients")
        if diverging.any():
            raise diverged or self._diverged_error([int(r) for r in np.flatnonzero(diverging)])
        ranks = np.flatnonzero(flags)
        active = len(ranks)
        if active == 0:
            return 0
        self._writer = int(ranks[0])
        if active > 1:
            np.divide(self._grads, np.float32(active), out=self._grads)
        try:
            self.optimizer.apply(self.weights, self._grads)
        except NonFiniteStepError as e:
            raise self._refusal(e) from e
        self.values = self._split(self.weights)
        self.syncs += 1
        if self.rank == self._writer and time.monotonic() >= self._next_write:
            self._write_values()
        return active

    def _refusal(self, e: NonFiniteStepError) -> ValueError:
        """The ValueError of a step the optimizer refused (e: at its first non-finite element), as a server refuses
        a push of an Inf or NaN gradient, or one that would overflow a row: raised by every rank at the same step
        (they hold the same mean), the MLP unchanged (the rows' pushes of the step, in flight beside it, are
        applied). Not a server's error: the writer saves the MLP of the step before as it stops
        (worker.allreduce_stop.save_dense_on_stop)."""
        name, row, col = self._element(e.index)
        refused = e.say(f"dense parameter {name!r} [{row}, {col}]", "mean gradient over the workers")
        return ValueError(
            f"step {self.syncs + 1} of the allreduce group: {refused.removesuffix(f'; {NOTHING_APPLIED}')}; the MLP's "
            "step was not applied (its values are those of the step before); the row pushes of that step were sent "
            "beside it (applied, unless a warning says their push failed)"
        )

    def _diverged_error(self, ranks: list[int]) -> DivergedError:
        """The DivergedError of a rank whose step did not diverge, where those of ranks did: this rank's rows' push
        of the step, in flight beside the all_reduce, is applied (worker/step.py settles it)."""
        which = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        return DivergedError(
            f"training diverged in step {self.syncs + 1} of the allreduce group ({self.world_size} workers): the "
            f"predictions or gradients of {which} hold an Inf or NaN (its output says which): the model's weights, "
            "or the features fed to them, overflow float32. No worker applied the MLP's step; the row pushes "
            "of that step by the workers whose step did not diverge were applied. " + DIVERGED_ADVICE
        )

    def _element(self, index: int) -> tuple[str, int, int]:
        """(parameter name, row, column) of an index into the flat vector of every parameter (params order)."""
        start = 0
        for p, size in zip(self.params, self.sizes, strict=True):
            if index < start + size:
                row, col = divmod(index - start, p.shape[1])
                return p.name, row, col
            start += size
        raise IndexError(f"index {index} is past the {start} dense values")

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
        if timed_out(e):
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

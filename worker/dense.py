"""Dense parameters (MLP weights and biases, the logit bias) held on the parameter servers, pulled and pushed by
workers.

Each dense parameter of shape (r, c) is a table of its own, "dense.<name>", with dim c and the ids 0..r-1 as its
rows: the servers store, journal, checkpoint and optimize it exactly like a sparse table (its rows spread over
the shards by id, so one big matrix loads every server a little). The table's initializer gives every worker
the same initial values (uniform in +-glorot_scale, or zeros, seeded by the parameter's name); its optimizer
(Adam by default) runs on the servers, so a numpy worker and a torch worker share one model.

A dense path (DensePath: DenseSync here, worker.allreduce.AllReduceDense among torch workers) gives the training
loop `values`, the weights the next forward uses, and takes each step's gradients:
    inline True:   the loop sends add() / push_items() with its sparse push and take()s the rows it returns
    inline False:  the loop calls step(grads)
    flush():       every gradient given so far applied, values fresh, the model on the servers complete
    diverged(e):   the worker's step diverged (worker.diverged's DivergedError e): raises e, a collective path
                   (allreduce) once every worker has learnt of it in the step's all_reduce (they raise one too)
    finish(leave): the worker has no more batches: its gradients applied (allreduce: with the others'), and leave()
                   (its row source's finish: the worker is done) once nothing more of the MLP is to be written
    close():       threads stopped, or left to end a push in flight (idempotent); syncs counts the pushes (or
                   allreduces) done
DenseSync pulls every dense parameter at the start and then, by `staleness` k:
    k = 0 (inline): it adds up the gradients, and every `sync_every` steps the loop pushes the sum with its
        sparse push and takes the new values the push returns; between syncs a step computes with the values
        of the last sync (they miss the gradients of at most the sync_every - 1 steps before it). The step before
        a validation and the worker's last step push the steps added since the last sync with their own push
        (add()'s sync, asked by worker/loop.py), so under --mode sync they are summed with the other workers'
        and applied once; flush() then finds nothing to push. A flush() with steps added (best.py's put-back
        comes after a validation; a caller of step() alone) pushes them apart from a step's push, through
        `source` with the job's stamp as the background thread's below.
    k > 0 (background, sync_every 1): step() adds the gradients to a pending sum and returns; a thread
        repeatedly takes the whole pending sum (the steps given while its last push was out, merged into one
        push), pushes it (return_rows; through the worker's row source, `source`, with the job's stamp, as the
        step's pushes are: a shard that holds another job refuses it) and sets values to the rows it returns. The bound
        is in steps: step()
        blocks while more than k steps have gradients not yet applied (given, but not returned by a push), so
        the values step s computes with (steps counted from 0, values read after step s - 1's step() returns)
        include the gradients of every step before s - k, and of steps s - k .. s - 1 those whose push returned.
        An error of the thread is raised by the next step() or flush(); close() ends the thread, dropping what
        is pending (flush() first to keep it), or, when its push in flight outlasts CLOSE_WAIT_S (a shard that
        does not answer), leaves it to that push as a daemon. pull() flushes first.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.terminate import SIGNAL_CHECK_S
from worker.client import PushItem, WorkerStamp
from worker.models.spec import LOGIT_BIAS, DenseParam

TABLE_PREFIX = "dense."
DEFAULT_OPTIMIZER = OptimizerConfig("adam", 0.001)
CLOSE_WAIT_S = 5.0  # close() waits this long at most for the background thread's push in flight
MIN_BASE_RATE = 1e-4  # start_logit_bias clips the positive rate to [this, 1 - this]: log-odds within +-9.2


def table_name(param: DenseParam) -> str:
    """The server table of a dense parameter: dense.<model>.<name> ("dense.deepfm.mlp.0.weight"), so that two
    models with an MLP of the same widths never train each other's."""
    return f"{TABLE_PREFIX}{param.model}.{param.name}"


def start_logit_bias(client: Any, params: list[DenseParam], positives: int, examples: int,
                     trained_rows: int, stamp: WorkerStamp | None = None) -> float | None:  # fmt: skip
    """Starts the logit bias (spec.LOGIT_BIAS, one of params) of a new model at the log-odds of positives /
    examples (the rate clipped to [MIN_BASE_RATE, 1 - MIN_BASE_RATE]): one add-delta push, the optimizer state
    untouched, sent with Client.push_once under a key of the table's own (start_key), so that however many workers
    of a job call it, at once or one after another, the servers apply one of them; stamp: the job's (the worker's
    row source's), which the push carries as the job's other pushes do (None: a run that holds no job). A model is
    new while its sparse tables hold no trained row (trained_rows: what the servers said) and its bias is at its
    initial 0; a model trained further keeps its own (one trained before models had a logit bias gets it at 0: its
    own predictions).
    Returns the value it started at; None where it did not (the model is not new, another worker started it, or
    there are no examples)."""
    (param,) = [p for p in params if p.name == LOGIT_BIAS]
    table, ids = table_name(param), np.zeros(1, dtype=np.uint64)
    if not examples or trained_rows:
        return None
    (current,) = client.pull_many([(table, ids)])
    if current[0, 0] != 0.0:
        return None
    rate = min(max(positives / examples, MIN_BASE_RATE), 1.0 - MIN_BASE_RATE)
    value = np.float32(math.log(rate / (1.0 - rate)))
    applied = client.push_once(table, ids, np.full((1, 1), value, dtype=np.float32), start_key(table), stamp)
    return float(value) if applied else None


def start_key(table: str) -> int:
    """The client id start_logit_bias pushes under: a 63-bit hash of the table's name, the same for every worker."""
    digest = hashlib.blake2b(b"sparseps logit bias start\0" + table.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") & ((1 << 63) - 1)) or 1


def table_config(param: DenseParam, optimizer: OptimizerConfig = DEFAULT_OPTIMIZER, zeros: bool = False) -> TableConfig:
    """The server table that holds one dense parameter; zeros: it starts at zeros whatever param.init says (the
    MLP's output layer under the small-data recipe: worker/recipe.py)."""
    seed = zlib.crc32(param.name.encode())  # tables of equal shape must not start equal
    if param.init == "zeros" or zeros:
        init = InitializerConfig("zeros", 0.0)
    else:
        init = InitializerConfig("uniform", param.glorot_scale, seed=seed)
    return TableConfig(table_name(param), param.shape[1], init, optimizer)


class DensePath(Protocol):
    """What the training loop uses of a dense path (see the module docstring)."""

    params: list[DenseParam]
    values: dict[str, np.ndarray]  # {name: (r, c) float32}, the weights the next forward uses
    inline: bool  # a step's gradients go with its sparse push: add(), push_items(), take() (DenseSync's)
    collective: bool  # flush() is a step every worker takes together (allreduce): not the loop's to call alone
    sync_every: int  # the steps whose gradients one sync applies (DenseSync's --dense-sync-every; allreduce: 1)
    syncs: int  # pushes (PS) or allreduces done

    def pull(self) -> dict[str, np.ndarray]: ...

    def step(self, grads: dict[str, np.ndarray]) -> None: ...

    def diverged(self, error: Exception) -> None: ...  # raises error (see the module docstring)

    def flush(self) -> None: ...

    def finish(
        self, leave: Callable[[], None]
    ) -> None: ...  # no more batches: the last gradients applied, then leave()

    def close(self) -> None: ...


class DenseSync:
    """The dense parameters of one worker: values from the servers, gradients accumulated between syncs
    (staleness 0) or pushed by a background thread (staleness k > 0); see the module docstring.

    `tables` is anything with the Client's pull_many and push_many (a Client, or tests.inprocess's tables); the
    pushes sent apart from a step's (the thread's with staleness > 0; flush()'s of the steps added since the last
    sync with staleness 0) go through source.push_apart (the worker's row source, worker/steprows.py: stamped with
    its job), or tables.push_many without a stamp where source is None, while the loop uses them too."""

    def __init__(
        self, tables: Any, params: list[DenseParam], sync_every: int = 1, staleness: int = 0, source: Any = None
    ):
        if sync_every < 1:
            raise ValueError(f"--dense-sync-every is {sync_every}, expected >= 1")
        if staleness < 0:
            raise ValueError(f"--dense-staleness is {staleness}, expected >= 0")
        if staleness > 0 and sync_every > 1:
            raise ValueError(
                f"--dense-sync-every is {sync_every} with --dense-staleness {staleness}: a background push takes "
                "every step pending, so expected --dense-sync-every 1 (or --dense-staleness 0)"
            )
        self.tables = tables
        self.source = source
        self.params = params
        self.sync_every = sync_every
        self.staleness = staleness
        self.inline = staleness == 0
        self.collective = False
        self.ids = {p.name: np.arange(p.shape[0], dtype=np.uint64) for p in params}
        self.values: dict[str, np.ndarray] = {}
        self.pending: dict[str, np.ndarray] = self._zeros()
        self.steps_pending = 0  # steps added to pending
        self.syncs = 0
        # background (staleness > 0): the thread and what it shares with step() and flush(), under _cond
        self._cond = threading.Condition()
        self._unapplied = 0  # steps given whose gradients values do not include yet (pending or being pushed)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False

    def _zeros(self) -> dict[str, np.ndarray]:
        return {p.name: np.zeros(p.shape, dtype=np.float32) for p in self.params}

    def pull(self) -> dict[str, np.ndarray]:
        """Fetches every dense parameter from the servers (one round trip); returns {name: (r, c) float32}.
        In the background mode it flushes first, so no push is in flight."""
        if not self.inline:
            self.flush()
        self.take(self.tables.pull_many([(table_name(p), self.ids[p.name]) for p in self.params]))
        return self.values

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """Adds one step's gradients. Staleness 0: every sync_every steps pushes their sum and takes the new
        values. Staleness k: hands them to the thread; returns once at most k steps are unapplied."""
        if not self.inline:
            self._step_background(grads)
        elif self.add(grads):
            self.flush()

    def flush(self) -> None:
        """Every gradient given so far pushed and the values it returned taken: staleness 0 pushes those added
        since the last sync (if any); staleness k waits for the thread to push everything given."""
        if not self.inline:
            self._wait_until_applied(0)
            return
        items = self.push_items()
        if items:
            self.take(self._push_apart(items))

    def diverged(self, error: Exception) -> None:
        """Raises error (this worker's step diverged): no other worker waits for this one's step."""
        raise error

    def finish(self, leave: Callable[[], None] = lambda: None) -> None:
        """flush(): this worker's last gradients pushed; then leave() (the row source's finish: this worker is
        done)."""
        self.flush()
        leave()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Ends the background thread (if any); what is pending is not pushed. A push in flight (retrying
        against a shard that does not answer, perhaps) is waited for up to wait_s, then left to the daemon
        thread: a stopping worker does not wait out its retries. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            deadline = time.monotonic() + wait_s
            while self._thread.is_alive() and time.monotonic() < deadline:  # in slices: signals are handled
                self._thread.join(SIGNAL_CHECK_S)
            self._thread = None

    # ---- the same in phases, so a training step can send them with its sparse push (staleness 0) -----------
    def add(self, grads: dict[str, np.ndarray], sync: bool = False) -> bool:
        """Adds one step's gradients; True when a sync is due (sync_every steps added, or sync asked for: a flush
        follows the step): send push_items (return_rows), then take."""
        if not self.params:
            return False
        for name, g in grads.items():
            self.pending[name] += g
        self.steps_pending += 1
        return sync or self.steps_pending >= self.sync_every

    def push_items(self) -> list[PushItem]:
        """The pushes of the gradients added since the last sync ([] if none), for push_many; resets them."""
        if not self.params or self.steps_pending == 0:
            return []
        items = [PushItem(table_name(p), self.ids[p.name], self.pending[p.name].copy()) for p in self.params]
        for g in self.pending.values():
            g[:] = 0.0
        self.steps_pending = 0
        self.syncs += 1
        return items

    def take(self, rows: list[np.ndarray]) -> None:
        """Stores rows of every dense parameter, in params order (a pull's, or those push_many returned)."""
        self.values = {p.name: r.reshape(p.shape) for p, r in zip(self.params, rows, strict=True)}

    # ---- background pushes (staleness > 0) ------------------------------------------------------------------
    def _step_background(self, grads: dict[str, np.ndarray]) -> None:
        if not self.params:
            return
        with self._cond:
            self._raise_if_failed()
            if self._closed:
                raise RuntimeError("DenseSync.step after close()")
            for name, g in grads.items():
                self.pending[name] += g
            self.steps_pending += 1
            self._unapplied += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._push_pending, name="dense-push", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        self._wait_until_applied(self.staleness)

    def _wait_until_applied(self, most_unapplied: int) -> None:
        """Blocks while more than most_unapplied steps are unapplied; raises the thread's error, if any."""
        with self._cond:
            while self._unapplied > most_unapplied and self._error is None:
                if self._thread is None or not self._thread.is_alive():
                    raise RuntimeError(f"{self._unapplied} dense steps unapplied and no thread to push them")
                self._cond.wait(SIGNAL_CHECK_S)  # timed: a signal another thread received is handled here
            self._raise_if_failed()

    def _push_apart(self, items: list[PushItem]) -> list[np.ndarray]:
        """A push of the MLP's sent apart from a step's (the thread's, or flush()'s at staleness 0); returns the
        rows of its items: through source (the job's stamp), or unstamped where there is none."""
        if self.source is not None:
            return self.source.push_apart(items)
        return self.tables.push_many(items, return_rows=True)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _push_pending(self) -> None:
        """The thread: pushes whatever is pending, merged, until close(); an error ends it, kept for step()."""
        try:
            while True:
                with self._cond:
                    while self.steps_pending == 0 and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    grads, steps = self.pending, self.steps_pending
                    self.pending, self.steps_pending = self._zeros(), 0
                rows = self._push_apart([PushItem(table_name(p), self.ids[p.name], grads[p.name]) for p in self.params])
                with self._cond:
                    self.take(rows)
                    self._unapplied -= steps
                    self.syncs += 1
                    self._cond.notify_all()
        except BaseException as e:  # kept, and raised in the thread of step()
            with self._cond:
                self._error = e
                self._cond.notify_all()


def dense_norm(values: dict[str, np.ndarray]) -> float:
    """The L2 norm of all the dense parameters together (float64): a fingerprint of an MLP, to compare the one a
    worker ended with against the one the servers hold (launch's metrics carry both)."""
    return float(np.sqrt(sum(float(np.square(v, dtype=np.float64).sum()) for v in values.values())))

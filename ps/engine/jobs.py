"""JobClocks: the waits of the modes that follow the worker clocks of a shard's training job: a stamped pull's, and
a sync step's contributions, summed and applied once. JobClocks is a FollowedJob (ps.engine.followedjob: the job
followed, its stamps, its workers' clocks and done flags, min_clock) with these waits.

- A stamped pull of step s with staleness k waits, before it reads, until min_clock >= s - k (k = 0: every worker
  has pushed every step before s); when every worker is done it is served at once. max_gap records the largest
  s - min_clock a pull was served at.
- A sync push of step t is a contribution: it waits until every worker not done has contributed to t, then the
  contributions are summed (ps.engine.syncsum.sum_contributions: per table the union of ids, grads, shows and
  clicks summed per id, shows and clicks clipped to a push's limit per id) and applied once, as one PushBatch of
  the job: client sync_key(job), request number t + 1, so the sum is journaled and durable, and the journal's
  exactly-once rule applies it once across restarts too: applying the same sum again applies only the pushes
  (tables) a crash left unapplied, or nothing. Every contributor's reply waits for the whole sum to be applied. A
  contribution sent again before the sum is applied replaces the worker's earlier one (a retry). Under
  --memory-bytes the contributions held, and the copies their sums make, take the plan's `sync_steps` part
  (sync_held_bytes, Stats' sync_steps_held_bytes); a contribution that would take them past it stops the job
  (SyncStepTooLargeError, RESOURCE_EXHAUSTED, to it and to every worker waiting at its step), applying nothing:
  its step could not complete, as every contribution is held until it does. A contribution to
  a step this process applied, or older than the newest step the journal holds, is answered without applying
  anything (num_applied 0).

Job ids. A job id is for one run: a shard remembers the sync steps it applied under it, and answers a second run's
contributions to them with num_applied 0 (worker.request_numbers raises JobIdReusedError for such an answer to a
first attempt).

Threads. Each wait holds one of the server's RPC threads (ServerConfig.threads, --threads), and a job may have a
pull and a push of every worker waiting at once: a server needs 2 x workers + 2 threads. A wait that would leave
no thread free for the request that ends the waits is refused at once (RpcThreadsExhaustedError,
RESOURCE_EXHAUSTED, naming --threads); a refused contribution fails its step for every contributor. Every wait is
on one threading.Condition, notified when a clock moves, a worker is done, a sync step is applied or fails, or the
job changes; each ends by its deadline (the stamp's barrier_timeout_s) with BarrierTimeoutError naming every
worker it waited for and its clock (its worker then stops, and its stop stamp stops the job), but for the time a
sync step's sum is being applied: that waits for no worker (a shard's first sum may take a while: its kernels
compile), so a contribution to it waits until it is applied, and a pull's deadline counts from its end; nor
does a pull's while a checkpoint's hold refuses this shard's pushes (the workers it waits for cannot push: a large
shard's save, or the holds of a saver that died, which last until their --hold-timeout-s): its deadline counts the
time of its wait that no hold took, so that holds back to back (saves more often than the barrier timeout) pause it
and a dead worker still stops the job. A sync step whose deadline passes drops its contributions: nothing of it was
applied or acknowledged. A wait whose caller left (its RPC cancelled, or past its deadline: the service's caller_gone)
ends then, freeing its thread (CallerGoneError); its contribution stays in the step for a retry, until the step's own
deadline if no contributor waits then (a timer drops it, so that steps nobody waits for do not pile up in memory). At
most MAX_OPEN_SYNC_STEPS steps of a job gather at once: a contribution that would open another is refused
(InvalidArgumentError). The steps and their contributions are held by ps.engine.syncsteps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ps.config import MAX_SEQ_JUMP
from ps.engine.followedjob import FollowedJob
from ps.engine.push import TablePush
from ps.engine.room import watch_caller
from ps.engine.syncsteps import SyncStep, again
from ps.engine.syncsum import sync_key
from ps.errors import (
    NOTHING_APPLIED,
    NOTHING_OF_THE_STEP_APPLIED,
    BarrierTimeoutError,
    CallerGoneError,
    InvalidArgumentError,
    RpcThreadsExhaustedError,
    ShardClosingError,
)
from ps.stamp import WorkerStamp


def _check_caller(caller_gone: Callable[[], bool] | None, stamp: WorkerStamp, what: str) -> None:
    """CallerGoneError if the waiting request's caller left."""
    if caller_gone is not None and caller_gone():
        raise _caller_left(stamp, what)


def _caller_left(stamp: WorkerStamp, what: str) -> CallerGoneError:
    return CallerGoneError(f"worker {stamp.worker}'s {what} of step {stamp.step} stopped waiting: its caller left "
                           "(its deadline passed, or it was cancelled)")  # fmt: skip


class JobClocks(FollowedJob):
    def __init__(
        self,
        shard_id: int,
        sync_steps_applied: Callable[[int], int],
        threads: int,
        max_count: float,
        done_store: tuple[Callable[[int, int], list[int]], Callable[[int, int, list[int]], None]] | None = None,
        sync_step_bytes: int = 0,
        held_s: Callable[[float], float] | None = None,
    ):
        """threads: the server's RPC threads (0: no limit on waits); held_s(now): the seconds checkpoint holds refused
        this shard's pushes until now, summed (ps.engine.hold.PushHold.held_s; None: never held); the others as
        FollowedJob takes them."""
        super().__init__(shard_id, sync_steps_applied, max_count, done_store, sync_step_bytes)
        self.threads = threads
        self._waiting = 0  # threads in a wait here
        self._held_s = held_s or (lambda now: 0.0)

    # ---- pulls ------------------------------------------------------------------------------------------
    def wake(self) -> None:
        """Wakes every wait to look again (a caller_gone of one may have turned true)."""
        with self._cond:
            self._cond.notify_all()

    def wait_for_pull(self, stamp: WorkerStamp, caller_gone: Callable[[], bool] | None = None) -> int:
        """Waits until min_clock >= stamp.step - stamp.staleness, or every worker is done; returns min_clock then.
        BarrierTimeoutError past the stamp's barrier timeout (counted from the end of a sync sum being applied, if
        one is, and leaving out the time checkpoint holds refused this shard's pushes), naming the workers it waited
        for; RpcThreadsExhaustedError instead of a wait that would hold the last free RPC thread. caller_gone: whether
        the request's caller left (its RPC ended); where it has watch(wake) (ps.service_calls.CallerGone), the wait has
        wake() called when it turns true: the wait ends then, with CallerGoneError, freeing its thread."""
        need = stamp.step - stamp.staleness
        with self._cond:
            generation = self._enter(stamp)
            started, waiting = time.monotonic(), False
            held_before = self._held_s(started)
            try:
                while True:
                    self._check_alive(generation)
                    _check_caller(caller_gone, stamp, "pull")
                    low = self._min_clock()
                    if low >= need:
                        self.max_gap = max(self.max_gap, stamp.step - low)
                        return low
                    if all(self._done):
                        return low
                    now = time.monotonic()
                    held = self._held_s(now) - held_before  # the workers it waits for could not push then
                    waited = now - started - held
                    applying = self.sync.applying()  # the clocks move when it ends
                    if waited >= stamp.timeout_s and not applying:
                        behind = [w for w in range(self.num_workers) if not self._done[w] and self._clocks[w] < need]
                        behind = [w for w in behind if w != stamp.worker] or behind  # its own step waits for them
                        raise BarrierTimeoutError(
                            f"shard {self.shard_id}: worker {stamp.worker}'s pull of step {stamp.step} (staleness "
                            f"{stamp.staleness}) waited {waited:.3g} s"
                            f"{f' (and {held:.3g} s while checkpoints held its pushes)' if held > 0 else ''} for "
                            f"{self._named(behind)} of job "
                            f"{self.tenancy.named(stamp)}; is it alive? the job stops"
                        )
                    if not waiting:
                        refused = self._threads_refusal(stamp, f"pull of step {stamp.step}")
                        if refused is not None:
                            raise refused
                        if watch_caller(caller_gone, self.wake) is False:  # left already: no wake would come
                            raise _caller_left(stamp, "pull")
                        self._waiting, waiting = self._waiting + 1, True
                    self._cond.wait(None if applying else stamp.timeout_s - waited)
                    if applying:  # the workers waited for the sum too: their time counts from its end
                        started = time.monotonic()
                        held_before = self._held_s(started)
            finally:
                if waiting:
                    self._waiting -= 1

    def _check_alive(self, generation: int, stopping: bool = True) -> None:
        """Raises what ends a wait: the shard closing, the job stopped (if stopping), or replaced. Lock held."""
        if self._closed:
            raise ShardClosingError(f"shard {self.shard_id} is shutting down")
        if stopping and generation == self._generation and self.tenancy.stopped is not None:
            raise again(self.tenancy.stopped)
        if generation != self._generation:
            raise BarrierTimeoutError(f"shard {self.shard_id}: the job was replaced by job {self.tenancy.named()} (a "
                                      "stamp of that job came); the job stops")  # fmt: skip

    def _threads_refusal(self, stamp: WorkerStamp, what: str) -> RpcThreadsExhaustedError | None:
        """The error for a wait that would leave no RPC thread free (None: it may wait). Lock held."""
        if not self.threads or self._waiting + 2 <= self.threads:
            return None
        n = self.num_workers
        return RpcThreadsExhaustedError(
            f"shard {self.shard_id}: worker {stamp.worker}'s {what} of job {self.tenancy.named(stamp)} would wait for the "
            f"other workers while waits hold {self._waiting} of this server's {self.threads} RPC threads (--threads), "
            f"leaving none for the requests that end them; a job of {n:,} workers may have 2 x {n:,} "
            f"waits: start ps-server with --threads >= 2 x workers + 2 ({2 * n + 2:,}); {NOTHING_APPLIED}; the "
            "job stops"
        )

    # ---- sync -------------------------------------------------------------------------------------------
    def push_sync(
        self,
        stamp: WorkerStamp,
        pushes: list[TablePush],
        advance_clock: int,
        apply: Callable[[list[TablePush], int, int, int], object],
        client: int = 0,
        caller_gone: Callable[[], bool] | None = None,
    ) -> tuple[int, int]:
        """Contributes pushes (contribution's: validated copies, with shows and clicks) to the stamp's sync step and
        waits until its sum is applied: apply(sum pushes, advance_clock, client, client_seq) applies it, as a
        PushBatch, with advance_clock the largest of the contributions'. Returns (ids of this contribution
        applied now: 0 for a step applied before, min_clock). BarrierTimeoutError past the deadline (the step's
        contributions dropped: nothing applied); the error of apply, if it fails, for every contributor;
        WorkerDoneError for a worker held as done; RpcThreadsExhaustedError (the step failed) instead of a wait
        that would hold the last free RPC thread; SyncStepTooLargeError (the job stopped) for a contribution past
        the `sync_steps` part (SyncSteps.contribute). client: the PushBatch's client id (0: unknown); a contribution
        of a worker from another client than its earlier one to the same step (two processes given one worker
        id; a retry comes from the same client) fails the step for every contributor (InvalidArgumentError).
        caller_gone: as for wait_for_pull; a contribution whose caller left stays in the step (a retry replaces it,
        and the step is applied once complete)."""
        key, seq = sync_key(stamp.job), stamp.step + 1
        self._check_seq_jump(stamp, key, seq)
        with self._cond:
            self._check_not_done(stamp)
            generation = self._enter(stamp)
            step = self._join_step(stamp, seq, pushes, advance_clock, client)
            if step is None:  # a step applied before
                return 0, self._min_clock()
            low = self._wait_for_step(step, stamp, generation, caller_gone)
            if low is not None:  # another contributor's thread applied it
                return sum(len(p.ids) for p in pushes), low
        return self._apply(step, key, seq, apply, sum(len(p.ids) for p in pushes), generation)

    def _check_seq_jump(self, stamp: WorkerStamp, key: int, seq: int) -> None:
        """InvalidArgumentError for a step too far past the newest applied (seq: the request number of its sum),
        refused as the PushBatch that applies its sum would be."""
        newest = self._sync_steps_applied(key)
        if newest and seq > newest + MAX_SEQ_JUMP:
            raise InvalidArgumentError(
                f"bad worker stamp: sync step {stamp.step:,} is more than {MAX_SEQ_JUMP:,} steps past the newest "
                f"step of job {self.tenancy.named(stamp)} applied on shard {self.shard_id} ({newest - 1:,}); a job's "
                f"workers count their steps 0, 1, 2, ...; {NOTHING_APPLIED}"
            )

    def _join_step(
        self, stamp: WorkerStamp, seq: int, pushes: list[TablePush], advance_clock: int, client: int
    ) -> SyncStep | None:
        """The stamp's step with this contribution in it (opened if it is the first; none added to a step whose sum
        is being applied), or None for a step applied before (every worker's clock moved past it). Lock held."""
        step = self.sync.steps.get(stamp.step)
        if step is None and self.sync.known_applied(stamp.step, self._journaled_step(), self._acked):
            self._reach(seq, range(self.num_workers))  # a step applied before: every worker contributed
            return None
        # this worker had its reply to every earlier step
        self.sync.prove_below(stamp.step, self._journaled_step(), self.num_workers)
        if step is None:
            step = self.sync.open(stamp)
        if not step.applying:
            too_large = self.sync.contribute(step, stamp, pushes, advance_clock, client, self.num_workers)
            if too_large is not None:  # its step could not complete: the job stops
                self.tenancy.stop(too_large)
                raise again(self.tenancy.stopped)
        return step

    def _wait_for_step(
        self, step: SyncStep, stamp: WorkerStamp, generation: int, caller_gone: Callable[[], bool] | None
    ) -> int | None:
        """Waits until the step is applied (returns min_clock then) or complete, when this thread claims its sum
        to apply (step.applying; returns None); raises the step's error, the end of the wait (_check_alive, its
        caller left), or its deadline's BarrierTimeoutError. A step its caller left, none waiting for it, is
        dropped at its deadline. Lock held (released while it waits)."""
        started, waiting = time.monotonic(), False
        step.waiters += 1
        try:
            while True:
                if step.error is not None:
                    raise again(step.error)
                if step.applied:
                    return self._min_clock()
                self._check_alive(generation, stopping=not step.applying)  # a sum being applied ends as applied
                if not step.applying and self._complete(step):
                    step.applying = True
                    return None
                _check_caller(caller_gone, stamp, "sync push")
                waited = time.monotonic() - started
                if waited >= stamp.timeout_s and not step.applying:  # a sum being applied waits for no worker
                    raise self._timed_out(step, stamp, waited)
                if not waiting:
                    self._check_may_wait(step, stamp, caller_gone)
                    self._waiting, waiting = self._waiting + 1, True
                self._cond.wait(None if step.applying else stamp.timeout_s - waited)  # _apply notifies
        finally:
            if waiting:
                self._waiting -= 1
            step.waiters -= 1
            if not step.waiters and not step.applying and step.error is None:  # its caller left
                step.deadline = max(step.deadline, started + stamp.timeout_s)
                self.sync.drop_unless_waited_for(step, stamp)

    def _timed_out(self, step: SyncStep, stamp: WorkerStamp, waited: float) -> BaseException:
        """Fails the step at its deadline (BarrierTimeoutError naming the workers it waited for); the error to
        raise. Lock held."""
        missing = [w for w in range(self.num_workers) if not self._done[w] and w not in step.contributions]
        self.sync.fail(step, BarrierTimeoutError(
            f"shard {self.shard_id}: worker {stamp.worker}'s sync push of step {stamp.step} waited "
            f"{waited:.3g} s for the pushes of {self._named(missing)} of job "
            f"{self.tenancy.named(stamp)}; {NOTHING_OF_THE_STEP_APPLIED}; is it alive? the job stops"
        ))  # fmt: skip
        return again(step.error)

    def _check_may_wait(self, step: SyncStep, stamp: WorkerStamp, caller_gone: Callable[[], bool] | None) -> None:
        """Before a contribution's first wait: the step failed for a wait that would hold the last free RPC
        thread (RpcThreadsExhaustedError), CallerGoneError if its caller left already. Lock held."""
        refused = self._threads_refusal(stamp, f"sync push of step {stamp.step}")
        if refused is not None:
            self.sync.fail(step, refused)
            raise again(refused)
        if watch_caller(caller_gone, self.wake) is False:  # left already: no wake would come
            raise _caller_left(stamp, "sync push")

    def _complete(self, step: SyncStep) -> bool:
        return all(self._done[w] or w in step.contributions for w in range(self.num_workers))

    def _apply(
        self, step: SyncStep, key: int, seq: int, apply: Callable, mine: int, generation: int
    ) -> tuple[int, int]:
        """Applies a complete step's sum (this thread claimed it), outside the lock; then wakes its waiters. The
        job's state moves only if the job is still the one the step is of (generation)."""
        self.sync.apply_sum(step, key, seq, apply)
        with self._cond:
            self.sync.applied(step, seq, generation == self._generation)
            self._cond.notify_all()
            return mine, self._min_clock()

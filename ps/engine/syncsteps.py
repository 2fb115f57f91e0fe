"""SyncSteps: the sync steps of the job a shard follows that gather or are being applied, and how each ends.

A step holds each worker's contribution (validated copies of its pushes, ps.engine.syncsum.contribution) and the
client it came from; the bytes they hold count against the `sync_steps` part of --memory-bytes (held_bytes). A step
gathers, then is applied (its sum, once, outside the lock), or is proven applied whole after a restart, or fails
(its contributions dropped, its waiters told the error); a step whose contributors' callers all left is dropped by
a timer at its deadline. ps.engine.jobs's JobClocks decides when (its waits; the worker clocks and the job's changes
are its base's, ps.engine.followedjob's FollowedJob); both work under FollowedJob's one condition (`cond`, passed
here), which every method expects held but apply_sum, which takes it itself, as does the timer
drop_unless_waited_for starts. The worker clocks stay FollowedJob's: a step applied or proven moves them through
`reach`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from ps.engine.push import TablePush
from ps.engine.stampcheck import job_stops
from ps.engine.syncsum import held_bytes, step_cost, sum_contributions
from ps.errors import (
    NOTHING_APPLIED,
    NOTHING_OF_THE_STEP_APPLIED,
    BarrierTimeoutError,
    InvalidArgumentError,
    PsError,
    StorageError,
    SyncStepTooLargeError,
)
from ps.stamp import WorkerStamp

log = logging.getLogger("ps.engine.jobs")  # the job's: its sync steps are a part of it
MAX_OPEN_SYNC_STEPS = 4  # sync steps of a job gathering at once: its workers run one step at a time (about 2)


class SyncStep:
    """A sync step's contributions: worker -> (pushes, advance_clock); state gathering -> applying -> applied,
    or failed (error set) from gathering or applying."""

    def __init__(self, step: int):
        self.step = step
        self.contributions: dict[int, tuple[list[TablePush], int]] = {}
        self.clients: dict[int, int] = {}  # worker -> the client (PushBatch client_id) its contribution came from
        self.held: dict[int, int] = {}  # worker -> bytes its contribution holds, counted in SyncSteps.held_bytes
        self.applying = self.applied = False
        self.error: BaseException | None = None
        self.waiters = 0  # contributors' threads waiting for it
        self.deadline = 0.0  # time.monotonic() past which, with no waiter, its contributions are dropped
        self.timer: threading.Timer | None = None  # the one that will look at the deadline (SyncSteps)


def again(error: BaseException) -> BaseException:
    """A new exception saying what error says, for another thread to raise."""
    if isinstance(error, PsError):
        return type(error)(str(error))
    return StorageError(f"applying the sum of a sync step failed: {type(error).__name__}: {error}")


class SyncSteps:
    def __init__(
        self,
        shard_id: int,
        cond: threading.Condition,
        max_count: float,
        step_bytes: int,
        reach: Callable[[int, Iterable[int]], None],
        named: Callable[[list[int]], str],
    ):
        """cond: JobClocks' condition, notified when a step ends; max_count: a push's shows (and clicks) per id at
        most, where a sum clips them; step_bytes: the `sync_steps` part of --memory-bytes (0: no bound);
        reach(clock, workers): moves the workers' clocks up to clock (JobClocks'); named(workers): the workers as a
        refusal names them (JobClocks', with their clocks). Both with the lock held."""
        self.shard_id = shard_id
        self.step_bytes = step_bytes
        self.held_bytes = 0  # bytes of the contributions the gathering and applying steps hold
        self.steps: dict[int, SyncStep] = {}
        self.applied_here = 0  # the newest sync step (+ 1) of the job whose whole sum this process applied
        self._cond = cond
        self._max_count = max_count
        self._reach = reach
        self._named = named
        self._closed = False

    def open(self, stamp: WorkerStamp) -> SyncStep:
        """A new step for the stamp's; InvalidArgumentError while MAX_OPEN_SYNC_STEPS of the job gather."""
        if len(self.steps) >= MAX_OPEN_SYNC_STEPS:
            raise InvalidArgumentError(
                f"bad worker stamp: sync step {stamp.step:,} of job {stamp.named} while steps "
                f"{', '.join(f'{s:,}' for s in sorted(self.steps))} are still gathering on shard "
                f"{self.shard_id}: a job's workers run one step at a time; {NOTHING_APPLIED}"
            )  # fmt: skip
        step = self.steps[stamp.step] = SyncStep(stamp.step)
        return step

    def contribute(
        self, step: SyncStep, stamp: WorkerStamp, pushes: list[TablePush], advance_clock: int, client: int,
        num_workers: int,
    ) -> SyncStepTooLargeError | None:  # fmt: skip
        """Holds the stamp's worker's contribution (in place of its earlier one: a retry). A contribution from
        another client than the worker's earlier one to the step fails the step and raises (InvalidArgumentError).
        Returns the error that stops the job, holding nothing, where what the steps would then hold takes more than
        the `sync_steps` part (count_held)."""
        earlier = step.clients.get(stamp.worker, 0)
        if client and earlier and earlier != client:
            self.fail(step, InvalidArgumentError(
                f"bad worker stamp: two workers of job {stamp.named} say they are worker {stamp.worker} "
                f"(their pushes of sync step {stamp.step:,} come from two clients): give each worker its own "
                f"--worker-id in 0..{num_workers - 1}; the step was not applied"
            ))  # fmt: skip
            raise again(step.error)
        too_large = self._count_held(step, stamp, pushes)
        if too_large is not None:
            return too_large
        step.contributions[stamp.worker] = (pushes, advance_clock)
        step.clients[stamp.worker] = client
        return None

    def _count_held(self, step: SyncStep, stamp: WorkerStamp, pushes: list[TablePush]) -> SyncStepTooLargeError | None:
        """Counts the contribution of the stamp's worker (in place of its earlier one to the step) in held_bytes.
        Where what the sync steps then hold would take more than the `sync_steps` part (syncsum.step_cost: a sum
        copies what it sums), counts nothing and returns SyncStepTooLargeError: the job stops (its step could not
        complete: the other contributions stay until it does, and the next step's would be as large)."""
        mine, before = held_bytes(pushes), step.held.get(stamp.worker, 0)
        held = self.held_bytes - before + mine
        if self.step_bytes and step_cost(held) > self.step_bytes:
            others = sum(step.held.values()) - before
            return SyncStepTooLargeError(
                f"{job_stops(self.shard_id, stamp.named)}worker {stamp.worker}'s contribution to sync step "
                f"{stamp.step:,} holds {mine:,} bytes, the step's other contributions here {others:,}, other steps' "
                f"{held - mine - others:,}: {held:,} bytes, which with the copies their sum makes take "
                f"{step_cost(held):,}, over this server's `sync_steps` part of --memory-bytes "
                f"({self.step_bytes:,} bytes); train with smaller batches, fewer "
                "workers or more shards, or give the server a larger --memory-bytes; "
                f"{NOTHING_OF_THE_STEP_APPLIED}; start the job anew under a new --job-id"
            )  # fmt: skip
        step.held[stamp.worker] = mine
        self.held_bytes = held
        return None

    def _release(self, step: SyncStep) -> None:
        """Takes the bytes of step's contributions out of held_bytes (once: it ends)."""
        self.held_bytes -= sum(step.held.values())
        step.held.clear()

    def applying(self) -> bool:
        """Whether a step's sum is being applied (the clocks move when it ends)."""
        return any(s.applying for s in self.steps.values())

    def drop_unless_waited_for(self, step: SyncStep, stamp: WorkerStamp) -> None:
        """Makes sure a timer will drop step's contributions at its deadline if no contributor waits for it then
        (a wait that comes meanwhile ends by its own deadline): one timer per step, which looks at the deadline
        when it fires; close() cancels them."""
        if step.timer is not None or self._closed:
            return

        def expire() -> None:
            with self._cond:
                step.timer = None
                if self._closed or self.steps.get(step.step) is not step or step.waiters or step.applying or step.error:
                    return
                if time.monotonic() < step.deadline:  # a later contribution's caller left too: its deadline
                    self.drop_unless_waited_for(step, stamp)
                    return
                workers = sorted(step.contributions)
                log.warning("job %s: sync step %d dropped the contributions of %s at its barrier timeout: their "
                            "callers left and no worker waits for the step", stamp.named, step.step,
                            self._named(workers))  # fmt: skip
                self.fail(step, BarrierTimeoutError(
                    f"shard {self.shard_id}: sync step {step.step} of job {stamp.named} was dropped at its barrier "
                    f"timeout, with nobody waiting for it (the callers of {self._named(workers)} left); "
                    f"{NOTHING_OF_THE_STEP_APPLIED}"
                ))  # fmt: skip

        step.timer = threading.Timer(max(0.0, step.deadline - time.monotonic()), expire)
        step.timer.daemon = True
        step.timer.name = "ps-sync-expiry"
        step.timer.start()

    def known_applied(self, step: int, journaled: int, acked: int) -> bool:
        """Whether the job's sync step is known to be applied whole: this process applied it, the journal holds
        a later one, or the journal holds it and a stamp's acked passed it. journaled: the newest sync step (+ 1)
        of the job the journal holds; acked: the largest acked of the job's stamps."""
        return self.applied_here > step or journaled > step + 1 or (journaled > step and acked > step)

    def prove_below(self, bound: int, journaled: int, num_workers: int) -> None:
        """Ends, as applied whole, every gathering step before bound that the journal holds (journaled: as for
        known_applied): a worker had its reply to it (its stamp's acked, or its contribution to a later step, says
        so)."""
        for step in [s for s in self.steps.values() if s.step < min(bound, journaled) and not s.applying]:
            self._proven(step, num_workers)

    def apply_sum(self, step: SyncStep, key: int, seq: int, apply: Callable) -> None:
        """Applies a complete step's sum (the calling thread claimed it: step.applying), outside the lock:
        apply(sum pushes, the largest advance_clock of the contributions, key, seq). A failure fails the step
        (under the lock) and is raised."""
        contributions = [step.contributions[w] for w in sorted(step.contributions)]
        try:
            summed = sum_contributions([p for p, _ in contributions], self._max_count)
            apply(summed, max(a for _, a in contributions), key, seq)
        except BaseException as e:
            with self._cond:
                self.fail(step, e)
            raise

    def applied(self, step: SyncStep, seq: int, same_job: bool) -> None:
        """Ends a step whose sum apply_sum applied; the job's state (applied_here, the step's entry, its
        contributors' clocks, moved to seq) moves only if the job is still the one the step is of (same_job)."""
        step.applied = True
        self._release(step)
        if same_job:
            self.applied_here = max(self.applied_here, seq)
            if self.steps.get(step.step) is step:
                del self.steps[step.step]
                self._reach(seq, list(step.contributions))

    def _proven(self, step: SyncStep, num_workers: int) -> None:
        """Ends a gathering step known to be applied whole (after a restart): its waiters are answered."""
        step.applied = True
        self._release(step)
        del self.steps[step.step]
        self.applied_here = max(self.applied_here, step.step + 1)
        self._reach(step.step + 1, range(num_workers))

    def fail(self, step: SyncStep, error: BaseException) -> None:
        """Ends a step with error: its contributions are dropped, its waiters raise the error."""
        step.error = error
        self._release(step)
        if self.steps.get(step.step) is step:
            del self.steps[step.step]
        self._cond.notify_all()

    def fail_gathering(self, error: BaseException) -> None:
        """Fails every gathering step with error (the job stops; a step whose sum is being applied is left to
        finish)."""
        for step in [s for s in self.steps.values() if not s.applying]:
            self.fail(step, error)

    def replace(self, error: BaseException) -> None:
        """Forgets every step (another job starts): each ends with error, a step whose sum is being applied when
        that ends (applied, which releases it)."""
        for step in self.steps.values():
            step.error = error
            if not step.applying:  # a sum being applied ends in applied(), which releases it
                self._release(step)
        self.steps = {}
        self.applied_here = 0

    def close(self) -> None:
        """Cancels every step's timer; none is started after."""
        self._closed = True
        for step in self.steps.values():
            if step.timer is not None:
                step.timer.cancel()

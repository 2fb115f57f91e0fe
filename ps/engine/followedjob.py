"""FollowedJob: the training job a shard follows and its workers: every stamp checked against the job, the workers'
clocks and done flags, and the pushes, creates, done and stop stamps that move them. JobClocks (ps.engine.jobs) is a
FollowedJob with the waits of the modes that follow the clocks: a stamped pull's, a sync step's contribution's.

A worker of a sync or ssp job stamps its PullBatch and PushBatch requests (ps.stamp.WorkerStamp, the proto's); a
worker of an async or geo job stamps its PushBatch requests, unclocked (below); the MLP's pushes carry the job's
stamp too, those that go with a step's push and those sent apart from it (worker/dense.py DenseSync's background
pushes and the steps it pushes at a validation and at the end; worker/allreduce.py's writes of the MLP, before
its worker says it is done); so do early stopping's restore of the best model (worker/best.py, through the row
source's push_apart) and a new model's logit-bias start (worker/dense.py start_logit_bias: Client.push_once, a
PushBatch marked shared, under a key every worker sends, before the worker's first step). That shared push holds
the shard as a push of the job does but is none of the worker's steps: its stamp says apart (or unclocked, an
async or geo worker's), so it moves no clock, and its key names no worker's process. Every worker stamps the
CreateTable requests that make its job's tables (created): they hold the shard for the job as its first push
would. Requests without a stamp (reads: eval, predict, export, stats; `ps-worker train --create-tables-only`'s
CreateTable; AdvanceClock, an operator's: every mode's worker advances the clock in its stamped PushBatch) never
wait, never come here, and hold nothing.

Clocks. The clock of worker w on this shard is the number of its steps applied here: max(step + 1) over its
stamped pushes not apart, and at least the largest `acked` of its stamps (the steps whose push has had its reply,
as the worker counts them); 0 before any. A worker that said it is done counts as infinitely far ahead. min_clock
is the smallest clock (when every worker is done, the largest).

- A stamped push (not sync) is applied at once, as an async one is; then its worker's clock moves to step + 1, but
  for one whose stamp says apart: a message of a step's push before the shard's last (the clock moves with the
  step's last message here, once the shard holds the whole step), or a push sent apart from the steps (the MLP's,
  early stopping's restore); it holds the shard for the job as a push does, and moves no clock.
- A done stamp (a PushBatch without pushes) marks its worker done (again: no change); a sync step that waits only
  for done workers is applied with the contributions it has. A push of a worker held as done is refused
  (WorkerDoneError, FAILED_PRECONDITION): a done worker pushes nothing more.
- A stop stamp (a PushBatch without pushes whose `stopped` says why) comes from a worker that ends before its
  work is done (interrupted, or failed): the job stops at once, as for a worker of another setup
  (ps.engine.tenancy), with BarrierTimeoutError (ABORTED) naming the worker and its reason, instead of its peers
  waiting out their barrier for a worker that is gone; and another job may start. Where the worker stopped on a
  refusal that stopped the job on a shard (a worker of another setup there, say: the worker stopped because the
  job had; the stamp's stopped_by names its class), the job stops with that refusal instead, its class and its
  words, so that every worker learns the first cause whichever shard it hears it from. A stop stamp of a job the
  shard does not follow, or of one stopped already, changes nothing.

Restarts. Clocks live in memory; done flags too, and each is also stored (synced) before its done stamp is answered
(done_store; a store that fails is logged, and the flag kept in memory), so a restarted shard knows which workers of
the job are done (a finished worker sends nothing more, and its peers would otherwise wait for it); of the rest, it
knows what its journal proves and what the stamps' acked say. Every sync step before the newest one the journal
holds is complete: the clocks start there (an ssp job's at 0), and each stamp raises its worker's clock to its
acked, so that the pulls of the workers' next steps are served once every worker has sent one. The newest step the
journal holds may be partly applied (a crash between its records, one per table): its contributions are gathered and
the sum applied again (the rest of it applied). A gathering step t, or a contribution to it, is proven applied whole
(its contributors answered, every clock moved to t + 1) when the journal holds t (its newest sync step of the job is
>= t) and a stamp says acked > t or a worker contributes to a later step: that worker had its reply to t, which
comes only after the whole sum. Stamps are trusted that far and no further: no stamp proves a step the journal does
not hold.

The job. The job followed, its setup, the claims of the pushes and creates that start a job, and which process
trains each worker (a push's client id, an unclocked stamp's token) are the shard's JobTenancy's (ps.engine.tenancy,
which says when a stamp of another job, another setup or another process is refused); FollowedJob holds one and checks
every stamp against it.

Async and geo (unclocked stamps: PushBatch only, not sync): the stamp holds the shard for its job, and its worker
count, setup and unclocked are checked as any stamp's (a worker of another mode, another --geo-every, or another
count stops the job), but it moves no clock and waits for nothing. A done stamp marks its worker done, and so does a
stop stamp: the job does not stop (its other workers wait for nobody), but where another process (token) holds the
worker; a push of a worker marked done marks it running again, and so does the create or push that starts
the job here (the done flags stored may be of a run of the job id that ended: an async job id is given run after run).

Lock: every method takes the one threading.Condition (`_cond`) on which JobClocks's waits wait, or, where its
docstring says "Lock held", runs with it held.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ps.engine.stampcheck import check_stamp, job_stops
from ps.engine.syncsteps import SyncSteps
from ps.engine.syncsum import sync_key
from ps.engine.tenancy import JobTenancy, relayed_stop
from ps.errors import NOTHING_APPLIED, BarrierTimeoutError, PsError, ShardClosingError, WorkerDoneError, echo
from ps.stamp import WorkerStamp

log = logging.getLogger("ps.engine.jobs")  # the job's: following it is a part of it
NAMED_WORKERS = 20  # workers named in a timeout's message, at most


class FollowedJob:
    def __init__(
        self,
        shard_id: int,
        sync_steps_applied: Callable[[int], int],
        max_count: float,
        done_store: tuple[Callable[[int, int], list[int]], Callable[[int, int, list[int]], None]] | None = None,
        sync_step_bytes: int = 0,
    ):
        """sync_steps_applied(key): the request number of the newest request of client `key` the journal has
        applied (0: none), in part or whole; for sync_key(job), the newest sync step (+ 1) it holds. max_count: a
        push's shows (and clicks) per id at most.
        done_store: (done(job, num_workers) -> the workers stored as done, store(job, num_workers, done workers)),
        the durable record of done workers (ps.storage.shardmeta's job_done); None: done flags in memory only.
        sync_step_bytes: the `sync_steps` part of --memory-bytes (ps.storage.memory; 0: no bound), which the sync
        steps' contributions and their sums' copies may take (syncsum.step_cost)."""
        self.shard_id = shard_id
        self._sync_steps_applied = sync_steps_applied
        self._done_store = done_store
        self._acked = 0  # the largest acked of the job's stamps
        self._cond = threading.Condition()
        self.max_gap = 0  # the largest step - min_clock a stamped pull of this job was served at
        self._clocks: list[int] = []
        self._done: list[bool] = []
        self._stamped: list[bool] = []  # worker -> a stamp of it came here (since the job started here)
        self.sync = SyncSteps(shard_id, self._cond, max_count, sync_step_bytes, self._reach, self._named)
        # the job followed, and which job holds the shard
        self.tenancy = JobTenancy(shard_id, self._cond, lambda: self._done, self.sync.fail_gathering)
        self._generation = 0  # moves when the job changes: waits of an older job fail
        self._closed = False

    @property
    def job(self) -> int:
        """The job followed (0: none yet), the tenancy's."""
        return self.tenancy.job

    @property
    def num_workers(self) -> int:
        """The worker count of the job followed, the tenancy's."""
        return self.tenancy.num_workers

    # ---- the job --------------------------------------------------------------------------------------
    def check(
        self, stamp: WorkerStamp, pull: bool, client: int = 0, create: bool = False, check_only: bool = False
    ) -> bool:
        """InvalidArgumentError, changing nothing, for a stamp that this shard refuses (check_stamp), for one of
        a stopped job, and for one whose worker count or setup differs from what its job started with (which
        stops the job: JobTenancy.check_workers); WorkerDoneError for a push of a worker held as done;
        JobConflictError for a stamp of another job while the one followed runs or a push or create that starts
        one is claimed (JobTenancy.check_job), and for an ssp push from another client (the PushBatch's client_id; 0:
        unknown) than the worker's earlier pushes (which stops the job), and for an unclocked stamp of a worker
        another process (token) holds (JobTenancy.check_token: the job goes on). A stamp of the job followed that
        passes counts as hearing from the job (its tenancy of the shard lasts). create: the stamp of a CreateTable (a
        job's worker creating its job's tables, before its first push), checked as a push's is but for done and
        client. check_only: a CreateTable's check_only (Shard.check_create), refused as its create would be, but
        holding nothing: it claims no shard, is not heard from (the tenancy does not last for it) and takes no token
        (returns False). Returns whether the stamp claims the shard: a push (not sync, not done) or a create that
        starts its job here; the claim refuses every other job until pushed(claimed=True) or created(claimed=True)
        starts the job, or release() drops it (the push or create failed). An unclocked push or create of the job
        followed whose token its worker's stamps did not carry here claims the worker the same way (returns True):
        the token is the worker's once the request is applied, not where it fails (JobTenancy.take)."""
        check_stamp(stamp, pull, create)
        with self._cond:
            if stamp.unclocked and stamp.done and not self.tenancy.follows(stamp):
                return False  # the end of a worker of a job not followed: nothing to change (finish)
            self.tenancy.check_job(stamp, create)
            self.tenancy.check_workers(stamp)
            if not pull and not create and not stamp.unclocked:
                self._check_not_done(stamp)
                if not stamp.sync and not stamp.done:
                    self.tenancy.check_client(stamp, client, self._clocks)
            self.tenancy.check_token(stamp, create)
            if check_only:  # it writes nothing: it holds nothing
                return False
            return self.tenancy.take(stamp, pull, create)

    def check_replace(self, table: str) -> None:
        """JobConflictError, changing nothing, while a job holds the shard (JobTenancy.check_replace): a CreateTable
        without a stamp would replace table, never trained, under that job."""
        with self._cond:
            self.tenancy.check_replace(table)

    def release(self, stamp: WorkerStamp) -> None:
        """Drops the claim of check() for stamp: its push or create failed, and the shard is as it was before it."""
        with self._cond:
            self.tenancy.drop_claim(stamp)

    def _check_not_done(self, stamp: WorkerStamp) -> None:
        """WorkerDoneError for a push (not a done stamp) of a worker held as done. Lock held."""
        if not stamp.done and stamp.job == self.job and self._done[stamp.worker]:
            raise WorkerDoneError(
                f"shard {self.shard_id}: worker {stamp.worker} of job {self.tenancy.named(stamp)} said it is done, and "
                "a done worker pushes nothing more: is a second run using the job id? a job id is for one run; give a "
                f"new --job-id; {NOTHING_APPLIED}"
            )

    def _enter(self, stamp: WorkerStamp, applied: bool = False) -> int:
        """Starts the stamp's job if it is another one and takes in its acked; returns the job's generation
        (applied: as JobTenancy.check_workers). Lock held."""
        if self._closed:
            raise ShardClosingError(f"shard {self.shard_id} is shutting down")
        if not self.tenancy.follows(stamp):
            self.tenancy.check_job(stamp)
            self._start(stamp)
        self.tenancy.check_workers(stamp, applied)
        self._stamped[stamp.worker] = True
        self.tenancy.heard(stamp)
        if stamp.acked > self._clocks[stamp.worker]:
            self._reach(stamp.acked, [stamp.worker])
        if stamp.acked > self._acked:
            self._acked = stamp.acked
            self.sync.prove_below(stamp.acked, self._journaled_step(), self.num_workers)
        return self._generation

    def _start(self, stamp: WorkerStamp) -> None:
        """Follows the stamp's job in place of the one followed: clocks seeded from the journal, done flags from the
        done store, the stamp's setup the job's (JobTenancy.start). An unclocked stamp's worker is not done (it
        creates or pushes), and a new run of an unclocked job whose run ended here (JobTenancy.follows) takes no
        done flag from the store: those are of the run that ended, and would end the new one at its start. Lock
        held."""
        job, num_workers = stamp.job, stamp.num_workers
        seed = max(0, self._sync_steps_applied(sync_key(job)) - 1)  # the newest step may be partly applied
        done = self._stored_done(stamp)  # read before anything changes
        if stamp.unclocked:  # its worker runs (its create or push); the record of a run that ended here is that run's
            done = [w for w in done if w != stamp.worker] if stamp.job != self.job else []
        old, new = self.tenancy.named(), stamp.named
        log.info("shard %d follows job %s of %d worker%s (clocks from %s)%s", self.shard_id, new, num_workers,
                 "s" * (num_workers != 1), f"{seed:,}", f", in place of job {old}" if self.job else "")  # fmt: skip
        replaced = BarrierTimeoutError(
            f"shard {self.shard_id}: job {old} was replaced by job {new} (a stamp of that job came); the job stops"
        )
        self.sync.replace(replaced)
        self.tenancy.start(stamp)
        self.max_gap, self._acked = 0, 0
        self._clocks, self._done = [seed] * num_workers, [False] * num_workers
        for w in done:
            self._done[w] = True
        if any(self._done):
            log.info("shard %d: workers %s of job %s are done (as this data dir recorded them)", self.shard_id,
                     [w for w in range(num_workers) if self._done[w]], new)  # fmt: skip
        self._stamped = [False] * num_workers
        self._generation += 1
        self._cond.notify_all()

    def _stored_done(self, stamp: WorkerStamp) -> list[int]:
        """The workers of the stamp's job (of its num_workers) the done store holds as done; [] without a store, or
        where reading it fails (logged: the record only spares waits for finished workers)."""
        if self._done_store is None:
            return []
        try:
            return self._done_store[0](stamp.job, stamp.num_workers)
        except PsError as e:
            log.warning("shard %d: the done workers of job %s could not be read, so none is taken as done: %s",
                        self.shard_id, stamp.named, e)  # fmt: skip
            return []

    def _store_done(self) -> None:
        """Stores the done workers of the job followed (synced), before the done stamp is answered; a failure is
        logged, not raised: the worker is done all the same, and only a restart would wait for it. Lock held."""
        if self._done_store is None:
            return
        try:
            self._done_store[1](self.job, self.num_workers, [w for w in range(self.num_workers) if self._done[w]])
        except PsError as e:
            log.warning("shard %d: storing that workers of job %s are done failed (%s); after a restart the shard "
                        "would wait for them", self.shard_id, self.tenancy.named(), e)  # fmt: skip

    def _journaled_step(self) -> int:
        """The newest sync step (+ 1) of the job followed that the journal holds (0: none). Lock held."""
        return self._sync_steps_applied(sync_key(self.job))

    @property
    def sync_held_bytes(self) -> int:
        """Bytes of the contributions the gathering and applying sync steps hold (SyncSteps.held_bytes)."""
        return self.sync.held_bytes

    def min_clock(self) -> int:
        with self._cond:
            return self._min_clock()

    def _min_clock(self) -> int:
        live = [c for c, done in zip(self._clocks, self._done) if not done]
        return min(live) if live else max(self._clocks, default=0)

    def _reach(self, clock: int, workers) -> None:
        """Moves the clocks of workers up to clock; notifies the waits. Lock held."""
        for w in workers:
            self._clocks[w] = max(self._clocks[w], clock)
        self._cond.notify_all()

    def _named(self, workers: list[int]) -> str:
        """'worker 1 (at step 3)' or 'workers 1 (at step 3), 4 (at step 0; not heard from here: ...)', the first
        NAMED_WORKERS of them (not heard from: no stamp of it came here since the job started here, so it did not
        start, is cut off from this shard, or ran before this shard's restart)."""
        unheard = "; not heard from here: not started, or cut off"
        named = ", ".join(f"{w} (at step {self._clocks[w]}{'' if self._stamped[w] else unheard})"
                          for w in workers[:NAMED_WORKERS])  # fmt: skip
        more = f" and {len(workers) - NAMED_WORKERS} more" if len(workers) > NAMED_WORKERS else ""
        return f"worker{'s' if len(workers) > 1 else ''} {named}{more}"

    def stats(self) -> dict:
        """job, job_name, num_workers, min_clock, max_gap and job_unclocked, as StatsResponse has them."""
        with self._cond:
            return {"job": self.job, "job_name": self.tenancy.name, "num_workers": self.num_workers,
                    "min_clock": self._min_clock(), "max_gap": self.max_gap,
                    "job_unclocked": bool(self.job) and self.tenancy.unclocked}  # fmt: skip

    def close(self) -> None:
        """Ends every wait with ShardClosingError (UNAVAILABLE: clients retry on the restarted shard)."""
        with self._cond:
            self._closed = True
            self.sync.close()
            self._cond.notify_all()

    # ---- pushes, creates, done and stop stamps ---------------------------------------------------------
    def pushed(self, stamp: WorkerStamp, client: int = 0, claimed: bool = False) -> int:
        """Notes that the stamp's worker pushed its step (applied) from client: its clock moves to step + 1, also in
        a job stopped since its check. claimed: what check() returned (the claim ends: the job starts). A stamp that
        says apart ends none of the worker's steps here (a message of a step before the shard's last, or a push sent
        apart from the steps, Client.push_once's shared one among them): the job holds the shard as after a push,
        and no clock moves. Returns min_clock. (Another job that started since the check and runs, or
        the job started since the check with another worker count, by a push of another worker checked at the same
        time: the push stays applied, and nothing moves; the worker's next stamp is refused as its check finds the
        job now.)"""
        with self._cond:
            if not self._entered(stamp, claimed):
                return self._min_clock()
            if stamp.unclocked:  # a worker that pushes runs: one that stopped (or finished) was started again
                self._done[stamp.worker] = False
                return self._min_clock()
            self.tenancy.pushed_from(stamp, client)
            if not stamp.apart:
                self._reach(stamp.step + 1, [stamp.worker])
            return self._min_clock()

    def created(self, stamp: WorkerStamp, claimed: bool = False) -> None:
        """Notes that the stamp's worker created a table (of its job's, before its first push): its job holds the
        shard as after a push (started here if it was not followed), moving no clock. claimed: what check()
        returned (the claim ends). (Another job started since the check, or its job with another worker count:
        as for pushed, nothing moves.)"""
        with self._cond:
            self._entered(stamp, claimed)

    def _entered(self, stamp: WorkerStamp, claimed: bool) -> bool:
        """After a push or create of the stamp, checked (claimed: what check() returned; the claim ends), was
        applied: enters the stamp's job (_enter, applied) unless another job started since the check and runs, or
        the job started since with another worker count; returns whether it entered it. Lock held."""
        if claimed:
            self.tenancy.drop_claim(stamp)
        if stamp.job != self.job and self.tenancy.running():
            return False
        if self.tenancy.follows(stamp) and stamp.num_workers != self.num_workers:
            return False
        self._enter(stamp, applied=True)
        return True

    def finish(self, stamp: WorkerStamp) -> int:
        """Marks the stamp's worker done (idempotent): no wait counts it any more; an unclocked one of a job not
        followed changes nothing. Returns min_clock."""
        with self._cond:
            if stamp.unclocked and not self.tenancy.follows(stamp):
                return self._min_clock()
            self._enter(stamp)
            if not self._done[stamp.worker]:
                log.info(
                    "shard %d: worker %d of job %s is done", self.shard_id, stamp.worker, self.tenancy.named(stamp)
                )
                self._done[stamp.worker] = True
                self._store_done()
                self._cond.notify_all()
            return self._min_clock()

    def abandon(self, stamp: WorkerStamp) -> int:
        """A stop stamp (its `stopped` says why): stops the stamp's job, if it is the one followed and runs, with
        the refusal that stopped it on a shard where the worker stopped on one (ps.engine.tenancy relayed_stop),
        else BarrierTimeoutError naming the worker and why (unclocked: marks the worker as done instead: no other
        worker waits for it; but not where another process, another token, holds the worker); otherwise changes
        nothing. Returns min_clock."""
        with self._cond:
            if self._closed:
                raise ShardClosingError(f"shard {self.shard_id} is shutting down")
            if stamp.unclocked:
                if (stamp.job == self.job and stamp.num_workers == self.num_workers and not self._done[stamp.worker]
                        and self.tenancy.token_conflict(stamp) is None):  # (not another process's worker)  # fmt: skip
                    log.info("shard %d: worker %d of job %s stopped (%s)", self.shard_id, stamp.worker,
                             self.tenancy.named(stamp), echo(stamp.stopped, 200))  # fmt: skip
                    self._done[stamp.worker] = True
                    self._cond.notify_all()
            elif stamp.job == self.job and self.tenancy.stopped is None and not all(self._done):
                log.warning("shard %d: job %s stops: worker %d stopped (%s)", self.shard_id, self.tenancy.named(stamp),
                            stamp.worker, echo(stamp.stopped, 200))  # fmt: skip
                self.tenancy.stop(relayed_stop(stamp) or BarrierTimeoutError(
                    f"{job_stops(self.shard_id, self.tenancy.named(stamp))}worker {stamp.worker} stopped before its end "
                    f"({echo(stamp.stopped, 200)}); start the job anew under a new --job-id"
                ))  # fmt: skip
            return self._min_clock()

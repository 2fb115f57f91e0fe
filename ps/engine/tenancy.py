"""JobTenancy: which training job holds a shard (the job's tenancy of it), and the checks of a worker's stamp against
it: the job's setup, the claims of pushes and creates that start a job, and the processes (clients, tokens) that train
its workers.

Setup. The first stamp of a job on a shard sets the job's worker count and setup (its `setup`: key=value pairs the
worker says every worker of the job must run alike: mode, model, tables). A stamp of the job with another count,
or whose pairs differ, is refused (InvalidArgumentError naming what differs) and stops the job: its waits and
every later stamp of it get that error, so every worker learns why at once instead of waiting out its barrier for
a worker that has failed.

One job at a time, in any mode: a stamp of another job (a pull's, a push's, a CreateTable's) is refused
(JobConflictError, FAILED_PRECONDITION, naming both jobs, changing nothing) while the one followed runs: until
every worker of it is done, it stops (a stop stamp, a refused stamp), or no stamp of it has come for its barrier
timeout (the largest its stamps gave: its waits would have ended by then, so its workers are gone). Then a stamp of
another job starts that one (its clocks seeded from the journal) and the old job's waits fail; a sum of the old job
applied after the switch changes nothing of the new one. A pull or sync push starts its job under the lock that
checks it; a push that is applied first (async, geo, ssp) claims the shard at its check, under that lock, so that
two jobs' first pushes reaching a free shard together do not both apply: the other job is refused until the push is
applied (its job starts) or fails (the claim is dropped, the shard as it was). A stamped CreateTable claims the
shard the same way, whatever the job's mode, and starts its job once the table is made (a create that fails leaves
the shard as it was); so the tenancy starts at a job's first table, and a second job's create (a replace of the first
job's untrained tables, say) is refused before it changes anything. Its check_only is checked the same way (refused
where the create would be) and holds nothing: it claims no shard, does not count as hearing from its job (the
tenancy does not last for it), and takes no worker's token. A CreateTable without a stamp holds nothing and is not
refused for a job, but for a replace (replace_untrained, of a table of another spec): that is refused while a job holds
the shard (check_replace), as it would replace that job's tables under it.

Workers' processes. A push carries its client's id (a random id per worker process). An ssp push of a worker from
another client than its earlier pushes here (a worker restarted mid-job, which would train its share again, or two
processes given one worker id) is refused and stops the job (JobConflictError); sync steps check the same per step
(ps.engine.syncsteps). A restarted shard knows no worker's client: the first push after it sets it. An async or geo
worker's process is told by its stamps' token instead (unclocked stamps), which a restarted shard learns the same
way: a stamp's token names the worker's process (random, made at its
start, kept in its --resume-file: a worker started again with that file after a crash or Ctrl-C is the same process,
and pushes on at once). A push, done stamp or CreateTable of the worker with another token is refused
(JobConflictError, FAILED_PRECONDITION, changing nothing; the job goes on) while the token its stamps carried here
holds it: heard within the job's barrier timeout, and not done or stopped since (a stop stamp of the other token
changes nothing); then the new token takes it, with a push or CreateTable that is applied (its worker is claimed
for it meanwhile, other tokens refused; one refused for what it carries takes nothing) or a done stamp. So two
processes given one --worker-id do not both train its share (and another share never); a token 0 is not known and
checked against nothing. An unclocked job whose every worker is
done, or that was not heard from for its barrier timeout, holds the shard no more; a push of it then starts it anew
(a new run under the same id, its setup that push's), as a push of another job would; so does a job a worker of
another setup stopped, once that holds (its workers hear why until then). The job followed lives in memory: a
restarted shard follows the first job that stamps a request to it, and another job's may come first there while the
job's workers are gone, or still wait for the restart (the shards that did not restart refuse that job's pushes, and
its worker stops; the first job's workers are refused where it got in).

A relayed stop: a stop stamp of a worker that stopped on a shard's refusal that stopped the job there (its stopped_by
names the refusal's class, its reason holds the refusal's words) stops the job here with that refusal
(relayed_stop), so that every worker learns the first cause whichever shard it hears it from.

Contract. ps.engine.followedjob's FollowedJob (the base of ps.engine.jobs's JobClocks) holds one JobTenancy and
calls it under its one condition (`cond`, passed here), which every method expects held. The tenancy owns the job's
identity and setup (job, num_workers, setup, unclocked: from its first stamp here; name, which messages name it by:
the first its stamps carry), why it stopped (stopped), when it was last heard from and how long it is held without a
word (its patience), the claims, and the workers' clients and tokens. FollowedJob owns the worker clocks and done
flags, JobClocks the waits: the tenancy reads the done flags through `done`, and stop() fails the job's gathering
sync steps through `stopping` before it notifies the condition.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ps.engine.stampcheck import job_kind, job_stops, nothing_done, setup_difference, setup_pairs
from ps.engine.syncsteps import again
from ps.errors import InvalidArgumentError, JobConflictError, PsError
from ps.stamp import WorkerStamp, job_named, stopping_refusal


def relayed_stop(stamp: WorkerStamp) -> PsError | None:
    """The refusal that stopped the stop stamp's job on a shard, where the worker stopped on one (ps.stamp
    stopping_refusal), said again here; None otherwise: the worker stopped for a cause of its own, or on a refusal
    that stops no job."""
    refusal = stopping_refusal(stamp)
    if refusal is None:
        return None
    cls, words = refusal
    return cls(f"{words} (worker {stamp.worker} stopped on this refusal, and told every shard)")


class JobTenancy:
    def __init__(
        self,
        shard_id: int,
        cond: threading.Condition,
        done: Callable[[], list[bool]],
        stopping: Callable[[BaseException], None],
    ):
        """cond: JobClocks' condition, notified when the job stops; done(): JobClocks' done flags of the job's
        workers (worker -> it said it is done, or an unclocked one stopped); stopping(error): fails JobClocks'
        gathering sync steps with the error that stops the job. Both with the lock held."""
        self.shard_id = shard_id
        self._cond = cond
        self._done = done
        self._stopping = stopping
        self.job = 0
        self.name = ""  # the job's name (its stamps' job_name; empty: none known), which messages name it by
        self.num_workers = 0
        self.setup = ""  # the job's, from its first stamp here
        self._setup_from = 0  # the worker of that stamp
        self.unclocked = False  # the job's stamps move no clock (async, geo): from its first stamp here
        self.stopped: BaseException | None = None  # why the job stopped (a worker of another setup came)
        self._clients: list[int] = []  # worker -> the client id of its pushes here (0: none yet)
        self._tokens: list[int] = []  # worker -> the token of its unclocked stamps here (0: none known)
        self._token_heard: list[float] = []  # worker -> monotonic time of its latest stamp with that token
        self._heard = 0.0  # monotonic time of the job's latest stamp here
        # (stamp, what it does) of the pushes and table creations checked, not yet done, that start their job
        self._claims: list[tuple[WorkerStamp, str]] = []
        self._patience_s = 0.0  # the largest barrier timeout its stamps gave

    def start(self, stamp: WorkerStamp) -> None:
        """Holds the shard for the stamp's job in place of the one followed: the stamp's setup the job's, not
        stopped, no client or token known, its patience from its stamps to come."""
        self.job, self.name, self.num_workers, self.setup, self._setup_from = (
            stamp.job,
            stamp.job_name,
            stamp.num_workers,
            stamp.setup,
            stamp.worker,
        )
        self.stopped, self.unclocked, self._patience_s = None, stamp.unclocked, 0.0
        self._clients = [0] * stamp.num_workers
        self._tokens, self._token_heard = [0] * stamp.num_workers, [0.0] * stamp.num_workers

    def stop(self, error: BaseException) -> None:
        """Stops the job: its gathering steps and waits fail with error (stopping, then the condition notified), and
        so does every later stamp of it (a step whose sum is being applied is left to finish)."""
        self.stopped = error
        self._stopping(error)
        self._cond.notify_all()

    def follows(self, stamp: WorkerStamp) -> bool:
        """Whether the stamp is of the job followed, running or stopped; an unclocked stamp of an unclocked job
        that ended (every worker done or stopped, or none heard from for its barrier timeout; one stopped by a
        worker of another setup too, once so) is not: it is of a new run of the job, which a push starts anew (an
        async or geo job id may be given to run after run)."""
        silent = time.monotonic() - self._heard > self._patience_s
        ended = stamp.unclocked and self.unclocked and (all(self._done()) or silent)
        return stamp.job == self.job and not ended

    def running(self) -> bool:
        """Whether the job followed still runs: not every worker done, not stopped, a stamp within its barrier
        timeout."""
        if not self.job or self.stopped is not None or all(self._done()):
            return False
        return time.monotonic() - self._heard <= self._patience_s

    def take(self, stamp: WorkerStamp, pull: bool, create: bool) -> bool:
        """After the stamp passed the checks (JobClocks.check): one of the job followed is heard from (its tenancy
        of the shard lasts) and takes its worker for its process (its token) where the worker's stamps carried that
        token already, claiming nothing; where they carried another token or none, its push or create claims the
        worker (returns True): another token's is refused until drop_claim drops it, and the token is the worker's
        once the request is applied (heard), not where it is refused. A push (not sync, not done) or a create of a
        job not followed claims the shard (returns True): every other job is refused until drop_claim drops it."""
        if self.follows(stamp):  # heard from, even if its push is then held back (a checkpoint's save) or refused
            self._heard = time.monotonic()
            if not self._takes_worker(stamp):
                self._take_token(stamp)
                return False
            first_push = "applying the first push of a process"  # the worker's, for its process (token)
        elif not create and (pull or stamp.sync or stamp.done):  # these start their job under the lock (JobClocks)
            return False
        else:
            first_push = "applying the first push"  # the job's, on this shard
        self._claims.append((stamp, "creating a table" if create else first_push))
        return True

    def drop_claim(self, stamp: WorkerStamp) -> None:
        """Drops one claim of take() for stamp: its push or create was applied (its job starts) or failed."""
        self._claims.remove(next(c for c in self._claims if c[0] == stamp))

    def heard(self, stamp: WorkerStamp) -> None:
        """Notes a stamp of the job followed, which passed check_workers, as heard now: the tenancy lasts for the
        largest barrier timeout its stamps gave, an unclocked stamp's token is its worker's, and its job_name is the
        job's where none was known (the job started here by a stamp without one)."""
        self.name = self.name or stamp.job_name
        self._heard = time.monotonic()
        self._patience_s = max(self._patience_s, stamp.timeout_s)
        self._take_token(stamp)

    def named(self, stamp: WorkerStamp | None = None) -> str:
        """The stamp's job (None: the one followed) as messages name it (ps.stamp job_named): by the stamp's
        job_name, else by the followed job's name where it is that job, else by its id."""
        if stamp is None:
            return job_named(self.job, self.name)
        return job_named(stamp.job, stamp.job_name or (self.name if stamp.job == self.job else ""))

    def check_replace(self, table: str) -> None:
        """JobConflictError, changing nothing, while a job holds the shard (it runs, or a push or create claims the
        shard for it): a CreateTable without a stamp (`ps-worker train --create-tables-only`, another client) that
        would replace table, never trained, by one of another spec would replace it under that job."""
        claim = next((c for c, _ in self._claims), None)
        if claim is None and not self.running():
            return
        held = claim if claim is not None else self  # (a stamp, or the job followed: job, setup, unclocked)
        job = self.named(claim)
        raise JobConflictError(
            f"shard {self.shard_id} holds job {job} ({job_kind(held.setup, held.unclocked)}), and this create would replace table {table!r} "
            "(never trained) under it: a create without a job's stamp (`ps-worker train --create-tables-only`, "
            f"another client) replaces no table while a job holds the shard; wait for the end of job {job}, or stop "
            "it; nothing was created"
        )

    def check_job(self, stamp: WorkerStamp, create: bool = False) -> None:
        """JobConflictError for a stamp of another job while the one followed runs, or while a push or create claims
        the shard for another job (take()); create: the stamp is a CreateTable's (its table is not created)."""
        nothing = nothing_done(create)
        running = self.running()  # a claim of its own worker (a new process's first push) is the running job's: below
        claim, doing = next(((c, d) for c, d in self._claims if c.job not in (stamp.job, self.job if running else 0)),
                            (None, ""))  # fmt: skip
        if claim is not None:
            raise JobConflictError(
                f"shard {self.shard_id} is {doing} of job {self.named(claim)} "
                f"({job_kind(claim.setup, claim.unclocked)}, worker {claim.worker}), so worker {stamp.worker} of job "
                f"{stamp.named} ({job_kind(stamp.setup, stamp.unclocked)}) cannot train here: a shard trains one job "
                f"at a time (two jobs would train one model over each other); wait for the end of job {self.named(claim)}, "
                f"or stop it; {nothing}"
            )
        if stamp.job == self.job or not running:
            return
        silent = time.monotonic() - self._heard
        left = max(0.0, self._patience_s - silent)
        live = sum(not d for d in self._done())
        job = self.named()
        resume = (
            f", or resume job {job} (its workers' command with --job-id {self.name or self.job}; a --resume-file "
            "keeps it, and `ps-worker launch` run again with its --resume-file gives it back), which pushes on at once "
            "(a worker killed without a word, only with its --resume-file, which keeps its process token)"
            if self.unclocked
            else ""
        )  # a sync or ssp worker cannot rejoin
        raise JobConflictError(
            f"shard {self.shard_id} holds job {job} ({job_kind(self.setup, self.unclocked)}, {live} of its "
            f"{self.num_workers} workers not done, last heard from {silent:.3g} s ago), so worker {stamp.worker} of "
            f"job {stamp.named} ({job_kind(stamp.setup, stamp.unclocked)}) cannot train here: a shard trains one job "
            f"at a time (two jobs would train one model over each other). If the workers of job {job} are gone (killed "
            f"without a word), the shard holds it for {left:.3g} s more (its barrier timeout, {self._patience_s:g} "
            f"s, after it was last heard from): wait that long{resume}; if they run, wait for the job's end, or stop "
            f"it; {nothing}"
        )

    def check_client(self, stamp: WorkerStamp, client: int, clocks: list[int]) -> None:
        """JobConflictError, stopping the job, for a push of the followed job's worker from another client than
        its earlier pushes here; clocks: JobClocks' worker clocks, which the refusal names."""
        if not client or stamp.job != self.job or self._clients[stamp.worker] in (0, client):
            return
        self.stop(JobConflictError(
            f"{job_stops(self.shard_id, self.named(stamp))}worker {stamp.worker}'s push of step {stamp.step:,} "
            f"comes from another process than its earlier pushes (its clock here is {clocks[stamp.worker]:,}): "
            "a worker restarted mid-job would train its share again, and two processes cannot share a --worker-id; "
            "start the job anew under a new --job-id; the request was not applied"
        ))  # fmt: skip
        raise again(self.stopped)

    def pushed_from(self, stamp: WorkerStamp, client: int) -> None:
        """Notes client (0: unknown) as the one the clocked stamp's worker pushes from, where none was known."""
        if client and not self._clients[stamp.worker]:
            self._clients[stamp.worker] = client

    def check_token(self, stamp: WorkerStamp, create: bool) -> None:
        """JobConflictError for an unclocked stamp of a worker whose stamps here carry another token (another
        process), heard within the job's barrier timeout and not done since, or claimed by a push or create of the
        job that another token sends (take())."""
        silent = self.token_conflict(stamp)
        if silent is None:
            return
        patience = self._patience_s if self.follows(stamp) else stamp.timeout_s  # (a claim's job: not started)
        n, w, left = self.num_workers or stamp.num_workers, stamp.worker, max(0.0, patience - silent)
        raise JobConflictError(
            f"shard {self.shard_id}: worker {w} of job {self.named(stamp)} ({job_kind(stamp.setup, True)}) is trained "
            f"here by another process (last heard from {silent:.3g} s ago; its stamps carry another token than this "
            f"process's, {stamp.token:#x}), which holds worker {w} for {left:.3g} s more (the job's barrier timeout, "
            f"{patience:g} s, after it was last heard from) unless it says it is done or stopped. If this is worker "
            f"{w} started again after that process was killed without a word (SIGKILL, an OOM kill, a lost node): "
            "without the --resume-file its killed run kept, it is another process, refused until then; with that "
            "file it is the same process and pushes on at once. If the other process runs, two processes given one "
            f"--worker-id would train its share twice and another share never: give each process its own "
            f"--worker-id in 0..{n - 1}, or stop the other one; {nothing_done(create)}"
        )

    def token_conflict(self, stamp: WorkerStamp) -> float | None:
        """Seconds since this shard heard the stamp's worker under another token (0 for a claim of the job's first
        push or create by another token), where that process still holds the worker: not done, heard within the
        job's barrier timeout; None where the stamp may take the worker (clocked, no token, the same token, or
        none held)."""
        if not stamp.unclocked or not stamp.token:
            return None
        if any(c.job == stamp.job and c.worker == stamp.worker and c.token not in (0, stamp.token)
               for c, _ in self._claims):  # fmt: skip
            return 0.0
        if not self.follows(stamp) or stamp.num_workers != self.num_workers:
            return None
        token, silent = self._tokens[stamp.worker], time.monotonic() - self._token_heard[stamp.worker]
        if token in (0, stamp.token) or self._done()[stamp.worker] or silent > self._patience_s:
            return None
        return silent

    def _takes_worker(self, stamp: WorkerStamp) -> bool:
        """Whether an unclocked push or create of the job followed (not a done stamp, which is answered at once)
        would take its worker for another token than the one the worker's stamps carried here, or for one where
        none was known."""
        return (stamp.unclocked and bool(stamp.token) and not stamp.done and stamp.num_workers == self.num_workers
                and self._tokens[stamp.worker] != stamp.token)  # fmt: skip

    def _take_token(self, stamp: WorkerStamp) -> None:
        """Notes the token of an unclocked stamp of the job followed, passed by check_token, as its worker's, heard
        now."""
        if stamp.unclocked and stamp.token and self.follows(stamp) and stamp.num_workers == self.num_workers:
            self._tokens[stamp.worker], self._token_heard[stamp.worker] = stamp.token, time.monotonic()

    def check_workers(self, stamp: WorkerStamp, applied: bool = False) -> None:
        """The stamp's job, if it is the one followed, against what it started with; a stamp of a stopped job gets
        why, and one of another worker count or setup stops the job (applied: the stamp's push was applied, after
        JobClocks.check: neither a stopped job nor another setup raises)."""
        if not self.follows(stamp):
            return
        if self.stopped is not None and not applied:
            raise again(self.stopped)
        if stamp.num_workers != self.num_workers:  # (never after a push applied: JobClocks.pushed returns first)
            error = self._mismatch(stamp, f"says the job has {stamp.num_workers:,} workers; it started here with "
                                          f"{self.num_workers:,}", "gives the same count")  # fmt: skip
            self.stop(error)
            raise again(error)
        if not applied and stamp.setup != self.setup and setup_pairs(stamp.setup) != setup_pairs(self.setup):
            self.stop(self._mismatch(stamp, "runs another setup than the job started with here",
                                     "runs the same mode, model and tables",
                                     f": {setup_difference(stamp.setup, self.setup)}"))  # fmt: skip
            raise again(self.stopped)
        if not applied and stamp.unclocked != self.unclocked:
            self.stop(self._mismatch(stamp, f"stamps as {job_kind('', stamp.unclocked)} does, where the job started "
                                     f"here as {job_kind('', self.unclocked)}", "runs the same mode"))  # fmt: skip
            raise again(self.stopped)

    def _mismatch(self, stamp: WorkerStamp, what: str, rule: str, detail: str = "") -> InvalidArgumentError:
        """The error that stops the job for a stamp that does not match what the job started with."""
        first = "its own" if stamp.worker == self._setup_from else f"worker {self._setup_from}'s"
        return InvalidArgumentError(
            f"{job_stops(self.shard_id, self.named(stamp))}worker {stamp.worker} {what} ({first} first stamp)"
            f"{detail}; every worker of a job {rule} (a flag given to some workers only? or a second run under the "
            "job id: a job id is for one run, give a new --job-id); the request was not applied"
        )

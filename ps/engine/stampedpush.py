"""StampedPushes: a shard's PushBatches stamped by a training job's worker (ps.engine.jobs), each routed by its stamp.

A stop stamp stops its job here (JobClocks.abandon); a done stamp marks its worker done (JobClocks.finish); a sync
stamp's pushes are a contribution to its step (ps.engine.syncsum.contribution, JobClocks.push_sync), whose sum is
applied once, as one PushBatch of the job's sync key under the checkpoint hold's gate; any other stamp's pushes are
the shard's PushBatch (Shard.push_batch), after which its worker's clock moves (JobClocks.pushed). The shard checks
that it takes writes (WriteGuard.refuse_if_lost) before it hands a request over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ps.engine.hold import PushHold
from ps.engine.jobs import JobClocks
from ps.engine.push import CheckedPush, TablePush, ids_applied
from ps.engine.pushpath import PushPath
from ps.engine.room import RequestRoom, push_cost
from ps.engine.stampcheck import check_batch_stamp, check_ending_batch, check_stamp
from ps.engine.syncsum import contribution
from ps.engine.table import Table
from ps.stamp import WorkerStamp

PushBatchFn = Callable[
    [list[TablePush], int, int, int, Callable[[], bool] | None, bool, Sequence[Table] | None], tuple[int, int]
]


class StampedPushes:
    def __init__(
        self,
        jobs: JobClocks,
        pushes: PushPath,
        room: RequestRoom,
        gate: PushHold,
        table: Callable[[str], Table],
        check_push: Callable[[TablePush, Table | None], CheckedPush],
        push_batch: PushBatchFn,
    ):
        """The shard's parts: jobs, its JobClocks; pushes, its PushPath (the clock, a sum's PushBatch); room, its
        request room; gate, the checkpoint hold's push gate; table(name), check_push(push, table) and push_batch(pushes,
        advance_clock, client, client_seq, caller_gone, shared, tables): the shard's table lookup, its check of one push
        (Shard.check_push) and its PushBatch."""
        self._jobs = jobs
        self._pushes = pushes
        self._room = room
        self._gate = gate
        self._table = table
        self._check_push = check_push
        self._push_batch = push_batch

    def push(
        self,
        pushes: list[TablePush],
        advance_clock: int,
        client: int,
        client_seq: int,
        stamp: WorkerStamp,
        caller_gone: Callable[[], bool] | None = None,
        shared: bool = False,
        tables: Sequence[Table] | None = None,
    ) -> tuple:
        """A PushBatch of a job's worker (see ps.engine.followedjob and ps.engine.jobs): done or stopped (no
        pushes), sync (a contribution to the step's sum, applied once the step is complete; client tells two workers of
        one worker id apart, client_seq is not used) or not (push_batch, then the worker's clock moves, unless the stamp
        says apart, which advances no clock: advance_clock 0; or, unclocked, the worker runs). Returns (clock, ids
        applied by this request, min_clock). A rejected request (a bad stamp, a push of a worker held as done) changes
        nothing. caller_gone: see JobClocks.push_sync. shared: the PushBatch is marked shared (Client.push_once: applied
        once under a key any worker may send, none of the worker's steps), so client names no worker's process, and its
        stamp says apart or unclocked (no clock moves), not done or stopped. tables: the Table of each push, the caller's
        (Shard.push_batch's tables), or None; a sync push's are those its contribution is checked against."""
        check_batch_stamp(stamp, shared, advance_clock)
        if stamp.stopped or stamp.done:  # refused before the job hears from it (JobClocks.check)
            check_stamp(stamp, pull=False)
            check_ending_batch(stamp, bool(pushes or advance_clock))
        if stamp.stopped:  # a stop stamp: its job stops here, if this shard follows it (JobClocks.abandon)
            return self._pushes.clock, 0, self._jobs.abandon(stamp)
        owner = 0 if shared else client  # a shared push's key names no worker's process
        claimed = self._jobs.check(stamp, pull=False, client=owner)
        if stamp.done:
            return self._pushes.clock, 0, self._jobs.finish(stamp)
        if stamp.sync:
            applied, low = self._jobs.push_sync(stamp, self._contribution(pushes, advance_clock, tables), advance_clock,
                                                self._apply_sum, client, caller_gone)  # fmt: skip
            return self._pushes.clock, applied, low
        try:
            clock, applied = self._push_batch(pushes, advance_clock, client, client_seq, caller_gone, shared, tables)
        except BaseException:
            if claimed:
                self._jobs.release(stamp)
            raise
        return clock, ids_applied(pushes, applied), self._jobs.pushed(stamp, owner, claimed)

    def _contribution(
        self, pushes: list[TablePush], advance_clock: int, tables: Sequence[Table] | None = None
    ) -> list[TablePush]:
        """A sync push's contribution (ps.engine.syncsum.contribution), its clock advance checked too, and its size:
        RequestTooLargeError, before anything is copied, past what a push may copy running alone. Both are of each
        push's Table of tables (None: each looked up by name)."""
        looked_up = [self._table(p.name) for p in pushes] if tables is None else tables
        for table in looked_up:  # replaced since its lookup: UNAVAILABLE (send again), not a size its new one fits
            table.check_open()
        cost = sum(push_cost(len(p.ids), t.width) for p, t in zip(pushes, looked_up, strict=True))
        self._room.refuse_larger(cost, sum(len(p.ids) for p in pushes), f"a sync PushBatch of {len(pushes)} pushes",
                                 runs_alone=True)  # fmt: skip
        out = contribution(pushes, self._check_push, looked_up)
        self._pushes.check_advance(advance_clock)
        return out

    def _apply_sum(self, pushes: list[TablePush], advance_clock: int, client: int, client_seq: int) -> None:
        """Applies a sync step's sum as one PushBatch of (client, client_seq). The sum goes by table name: each of
        its pushes goes to the table of its name when the sum is applied, not to the Tables the contributions were
        checked against (a table replaced in between gets the sum, or refuses the step if it does not fit its
        dim: Shard.check_push)."""
        with self._gate.push_gate():
            self._pushes.push_batch(pushes, advance_clock, client, client_seq, step_sum=True)

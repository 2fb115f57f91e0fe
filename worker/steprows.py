"""Where a training step's rows come from and where its gradients go, one class per mode (--mode).

    mode   rows of step s                                        the step's push
    async  pulled (ahead on the prefetch thread), with the rows  applied as it arrives; returns the rows it
           this worker's last pushes returned laid over them     updated (AsyncRows)
    ssp    pulled with the worker's stamp: a shard serves them   applied as it arrives, stamped: the worker's
           once every worker has pushed steps < s - staleness;   clock moves (ClockedRows)
           rows the row cache holds fresh enough are not pulled
    sync   ssp with staleness 0                                  every worker's push of step s summed on the
                                                                 servers and applied once (ClockedRows, sync)
    geo    the worker's local copies (worker/geo.py), pulled     the table's optimizer on the local copies;
           once when an id is new to it                          their deltas pushed every --geo-every steps
                                                                 (GeoRows)

Every mode's pushes carry the job's stamp (async and geo: unclocked, which moves no clock): a shard trains one job
at a time, and refuses a worker of its job whose setup (worker/row_source.py job_setup) differs (ps.engine.tenancy).
worker/row_source.py builds a config's row source.

Each class has prepare(step, tids) (on the prefetch thread: the rows, or None to fetch them in rows()),
rows(step, tids, prepared) and push(step, tids, row_grads, extra) (extra: the dense pushes that go with the
step's push; returns the rows the push returned for them), push_apart(items, add_delta) (a push of the worker's
sent apart from its step's, the MLP's: worker/dense.py's background pushes and flush()'s of the steps since its
last sync, worker/allreduce.py's writes (add_delta): with the job's stamp, advancing no clock; returns the rows of
its items), settle() (before a validation: the servers hold every
step this worker trained; geo pushes its pending deltas, the others' pushes are applied as answered), finish() (the
worker is done: nobody waits for it),
abandon(reason, pushes_ok, by) (the worker stops before its end, by: worker/stopping.py stopped_by: sync and ssp stop
the job on the shards, so that no other worker waits for it; geo pushes the deltas it holds, unless the servers failed,
hold another model state or refuse the job (worker.retry.pushes_cannot_land), a shard's refusal stopped the job
(ps.stamp stopping_refusal) or a push of them did, and logs how many steps' deltas it did not push; async and geo tell
the shards that the worker stopped, so that the job holds them no more for it) and stats() ({"cache_hit_rate",
"cache_bytes_saved"} where a cache serves rows).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from worker.batch import TableIds
from worker.client import PushItem
from worker.models.spec import ModelSpec
from worker.pipeline import RecentRows, in_any
from worker.stopping import stop_reason, stopped_the_job

if TYPE_CHECKING:
    from worker.client import WorkerStamp

log = logging.getLogger("worker.steprows")


def pull_rows(
    tables: Any, spec: ModelSpec, tids: dict[str, TableIds], covered: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """{table: rows of its unique ids}, pulled in one pull_many; rows where covered[table] is True are left unset
    (for the caller to fill)."""
    wanted, out = [], {}
    for t, ti in tids.items():
        out[t] = np.empty((len(ti.uniq), spec.row_dim(t)), dtype=np.float32)
        mask = None if covered is None else ~covered[t]
        if mask is None or mask.any():
            wanted.append((t, ti.uniq if mask is None else ti.uniq[mask], mask))
    if wanted:
        for (t, _, mask), rows in zip(wanted, tables.pull_many([(t, ids) for t, ids, _ in wanted])):
            if mask is None:
                out[t] = rows
            else:
                out[t][mask] = rows
    return out


def _in_flight(window: deque, tids: dict[str, TableIds]) -> dict[str, np.ndarray]:
    """{table: mask over its unique ids}: True where a batch in window (the last batches prepared, whose pushes
    may not have happened yet) holds the id; then appends this batch's ids to window."""
    covered = {t: in_any(ti.uniq, [w[t] for w in window if t in w]) for t, ti in tids.items()}
    window.append({t: ti.uniq for t, ti in tids.items()})
    return covered


def _sparse_pushes(tids: dict[str, TableIds], row_grads: dict[str, np.ndarray]) -> list[PushItem]:
    return [PushItem(t, ti.uniq, row_grads[t], clicks=ti.clicks, shows=ti.shows) for t, ti in tids.items()]


class _Leaving:
    """Tells the shards, once, that an async or geo job's worker sends no more: done (reason None), or stopped
    (why); a shard that did not take a stop is logged (it holds the job until its barrier timeout). Without a
    stamp there is nobody to tell."""

    def __init__(self, tables: Any, stamp: WorkerStamp | None):
        self.tables, self.stamp, self.told = tables, stamp, stamp is None

    def __call__(self, reason: str | None, by: str = "") -> None:
        if self.told:
            return
        self.told = True
        if reason is None:
            self.tables.finish(self.stamp)
            return
        for line in self.tables.stop_job(self.stamp, reason, by=by):
            log.warning("could not tell %s that this worker stopped; it holds the shard for the job until the "
                        "job's barrier timeout", line)  # fmt: skip


class AsyncRows:
    """One worker's exact view with prefetch (worker/pipeline.py): rows pulled ahead, and the rows its last
    depth + 1 pushes returned laid over them. stamp: the job's unclocked stamp its pushes carry (None: none)."""

    def __init__(self, tables: Any, spec: ModelSpec, depth: int, stamp: WorkerStamp | None = None):
        self.tables, self.spec, self.depth, self.stamp = tables, spec, depth, stamp
        self._leave = _Leaving(tables, stamp)
        self.recent = {t: RecentRows(depth + 1) for t in spec.table_dims()}  # a pull runs up to depth + 1 ahead
        self.window: deque = deque(maxlen=depth + 1)  # the unique ids per table of the batches prepared last

    def start_epoch(self) -> None:
        self.window = deque(maxlen=self.depth + 1)

    def prepare(self, step: int, tids: dict[str, TableIds]) -> dict[str, np.ndarray] | None:
        if not self.depth:
            return None
        covered = _in_flight(self.window, tids)
        return pull_rows(self.tables, self.spec, tids, covered)

    def rows(self, step: int, tids: dict[str, TableIds], prepared: dict | None) -> dict[str, np.ndarray]:
        rows = prepared
        if rows is None:  # no prefetch: pull the rows the last pushes did not return
            rows = pull_rows(
                self.tables, self.spec, tids, {t: self.recent[t].covered(ti.uniq) for t, ti in tids.items()}
            )
        for t, ti in tids.items():
            self.recent[t].overlay(ti.uniq, rows[t])
        return rows

    def push(self, step: int, tids: dict[str, TableIds], row_grads: dict, extra: list) -> list:
        returned = self.tables.push_many(_sparse_pushes(tids, row_grads) + extra, advance_clock=1, return_rows=True,
                                         stamp=self.stamp)  # fmt: skip
        for (t, ti), updated in zip(tids.items(), returned):
            self.recent[t].add(ti.uniq, updated)
        return returned[len(tids) :]

    def push_apart(self, items: list[PushItem], add_delta: bool = False) -> list[np.ndarray]:
        return self.tables.push_many(items, return_rows=True, add_delta=add_delta, stamp=self.stamp)

    def settle(self) -> None:
        pass

    def finish(self) -> None:
        self._leave(None)

    def abandon(self, reason: str, pushes_ok: bool = True, by: str = "") -> None:
        self._leave(reason, by)

    def stats(self) -> dict:
        return {}


class ClockedRows:
    """sync and ssp: every pull and push carries the worker's stamp (worker.client.WorkerStamp); the shards make
    a pull of step s wait until every worker has pushed steps < s - staleness, and with sync sum a step's pushes
    of all workers before applying them once.

    A RowCache (worker/rowcache.py), if given, keeps the rows pulls and pushes returned, stamped with the slowest
    worker's clock the shards reported when they read them, and serves a row at step s while its stamp is
    >= s - staleness: a pull then would be allowed to return that very row. The rows a push returns include this
    worker's own update, so cached rows read this worker's writes.

    Prefetch: the thread pulls, for step s, the ids that none of the batches before it in flight (the last
    prefetch + 1) holds; the step's other ids may be pushed by those batches' steps, so the step reads them itself,
    after those pushes: from the cache when it holds them fresh enough (a push just returned them), else pulled."""

    def __init__(self, tables: Any, spec: ModelSpec, stamp: WorkerStamp, cache: Any = None, depth: int = 1):
        self.tables, self.spec, self.stamp, self.cache, self.depth = tables, spec, stamp, cache, depth
        self._cache_lock = threading.Lock()  # the prefetch thread looks up and stores, the step stores
        self.window: deque = deque(maxlen=depth + 1)
        self._finished = False
        self.acked = 0  # this worker's pushes that have had their reply

    def start_epoch(self) -> None:
        self.window = deque(maxlen=self.depth + 1)

    def _at(self, step: int, **changes: Any) -> WorkerStamp:
        """The stamp of a request of step: it also says how many of this worker's pushes have had their reply
        (acked), so that a restarted shard learns the clocks its waits need."""
        return replace(self.stamp, step=step, acked=min(self.acked, step), **changes)

    def _read(self, step: int, tids: dict[str, TableIds], out: dict, wanted: dict[str, np.ndarray]) -> None:
        """Fills out[t][wanted[t]] (boolean masks over tids[t].uniq): from the cache where it is fresh enough for
        step, the rest pulled with the step's stamp (and cached)."""
        if self.cache is not None:
            with self._cache_lock:
                for t, mask in wanted.items():
                    if mask.any():
                        rows, hit = self.cache.lookup(t, tids[t].uniq[mask], step - self.stamp.staleness)
                        where = np.flatnonzero(mask)
                        out[t][where[hit]] = rows[hit]
                        mask[where[hit]] = False
        pulls = [(t, tids[t].uniq[mask], mask) for t, mask in wanted.items() if mask.any()]
        if not pulls:
            return
        pulled, min_clock = self.tables.pull_many([(t, ids) for t, ids, _ in pulls], stamp=self._at(step))
        for (t, _, mask), rows in zip(pulls, pulled):
            out[t][mask] = rows
        if self.cache is not None:
            with self._cache_lock:
                for (t, ids, _), rows in zip(pulls, pulled):
                    self.cache.store(t, ids, rows, min_clock)

    def prepare(self, step: int, tids: dict[str, TableIds]) -> tuple[dict, dict]:
        covered = _in_flight(self.window, tids)
        out = {t: np.empty((len(ti.uniq), self.spec.row_dim(t)), dtype=np.float32) for t, ti in tids.items()}
        self._read(step, tids, out, {t: ~c for t, c in covered.items()})
        return out, covered

    def rows(self, step: int, tids: dict[str, TableIds], prepared: tuple[dict, dict]) -> dict[str, np.ndarray]:
        out, covered = prepared
        self._read(step, tids, out, covered)
        return out

    def push(self, step: int, tids: dict[str, TableIds], row_grads: dict, extra: list) -> list:
        returned, min_clock = self.tables.push_many(
            _sparse_pushes(tids, row_grads) + extra, advance_clock=1, return_rows=True, stamp=self._at(step)
        )
        self.acked = step + 1
        if self.cache is not None:
            with self._cache_lock:
                for (t, ti), rows in zip(tids.items(), returned):
                    self.cache.store(t, ti.uniq, rows, min_clock)
        return returned[len(tids) :]

    def push_apart(self, items: list[PushItem], add_delta: bool = False) -> list[np.ndarray]:
        """Sent with the worker's stamp marked apart (not sync: no step's contribution; a sync job's MLP goes with
        its steps, the steps since its last sync with the step before a validation and with its last step), at its next
        step: it holds the shards for the job and moves no clock, before the worker's first step's reply too."""
        returned, _ = self.tables.push_many(
            items, return_rows=True, add_delta=add_delta, stamp=self._at(self.acked, sync=False, apart=True)
        )
        return returned

    def settle(self) -> None:
        pass

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.tables.finish(replace(self.stamp, step=0, acked=self.acked, done=True))

    def abandon(self, reason: str, pushes_ok: bool = True, by: str = "") -> None:
        """Stops the job on every shard (Client.stop_job, with by: stopped_by), unless this worker finished; a shard
        that did not take it is logged (its other workers then wait out their barrier)."""
        if self._finished:
            return
        self._finished = True
        for line in self.tables.stop_job(replace(self.stamp, step=self.acked, acked=self.acked), reason, by=by):
            log.warning("could not tell %s that this worker stopped; its other workers there wait for it until "
                        "their barrier timeout", line)  # fmt: skip

    def stats(self) -> dict:
        if self.cache is None:
            return {}
        return {"cache_hit_rate": self.cache.hit_rate, "cache_bytes_saved": int(self.cache.bytes_saved)}


class GeoRows:
    """geo: rows from the worker's local copies (worker/geo.py GeoTables), which it trains with the tables'
    optimizers and whose deltas it pushes every `every` steps (and at a settle and at the end), with the shards'
    clock advance by the steps since its last push. stamp: the job's unclocked stamp (which geo's pushes carry:
    GeoTables.stamp), told the worker's end."""

    def __init__(self, tables: Any, geo: Any, stamp: WorkerStamp | None = None):
        self.tables, self.geo, self.stamp = tables, geo, stamp
        self._leave = _Leaving(tables, stamp)
        self.requested = self.local = 0
        self._failed = False  # a push of deltas failed: some shards may have applied it, so it is not sent again
        self.unpushed_steps = 0  # steps whose deltas are not on the servers yet

    def holding(self) -> bool:
        """Whether some steps' deltas are held here, not pushed yet (a SIGKILL would lose them)."""
        return self.unpushed_steps > 0

    def start_epoch(self) -> None:
        pass

    def prepare(self, step: int, tids: dict[str, TableIds]) -> None:
        return None  # the local copies change in every step: read them in the step

    def rows(self, step: int, tids: dict[str, TableIds], prepared: dict | None) -> dict[str, np.ndarray]:
        pulls_before = self.geo.ids_pulled
        rows = self.geo.rows({t: ti.uniq for t, ti in tids.items()})
        requested = sum(len(ti.uniq) for ti in tids.values())
        self.requested += requested
        self.local += requested - (self.geo.ids_pulled - pulls_before)
        return rows

    def push(self, step: int, tids: dict[str, TableIds], row_grads: dict, extra: list) -> list:
        for t, ti in tids.items():
            self.geo.apply(t, ti.uniq, row_grads[t], ti.shows, ti.clicks)
        self.unpushed_steps += 1  # until a push holds this step's deltas
        try:
            self.geo.end_step()  # a round's deltas and clock advance, in one PushBatch per shard
        except BaseException:
            self._failed = True
            raise
        if self.geo.steps % self.geo.every == 0:
            self.unpushed_steps = 0
        return self.tables.push_many(extra, return_rows=True, stamp=self.stamp) if extra else []

    def push_apart(self, items: list[PushItem], add_delta: bool = False) -> list[np.ndarray]:
        return self.tables.push_many(items, return_rows=True, add_delta=add_delta, stamp=self.stamp)

    def settle(self) -> None:
        """Pushes the deltas of the steps since the last push (a validation then scores the model trained so far,
        not the one of the last push)."""
        self._flush()

    def finish(self) -> None:
        self._flush()
        self._leave(None)

    def _flush(self) -> None:
        """geo's pending deltas pushed, unless a push failed: one that fails (or is interrupted) may have been
        applied by some shards, so it is never sent again (abandon's flush included)."""
        if self._failed:
            return
        try:
            self.geo.flush()
        except BaseException:
            self._failed = True
            raise
        self.unpushed_steps = 0

    def abandon(self, reason: str, pushes_ok: bool = True, by: str = "") -> None:
        """The deltas of the steps since the last push are pushed (so that a stopped run's count of trained
        examples holds them), unless the error that stopped it says they cannot land (pushes_ok False: the servers
        failed, hold another model state or refuse the job), a shard's refusal stopped the
        job (reason and by, its stop stamp's, say so: ps.stamp stopping_refusal; the shards that have not stopped
        it yet would apply them) or a push of deltas failed before; where they are not pushed (so, or their push
        fails now), a warning says how many steps' deltas the servers lack. Then tells the shards it stopped."""
        try:
            why = self._flush_on_stop(pushes_ok, reason, by)
            if why is not None and self.unpushed_steps:
                n = self.unpushed_steps
                log.warning("the local deltas of this worker's last %s (since its last push) are not on the "
                            "servers, or not whole: %s; its count of pushed examples leaves them out, and a resumed "
                            "run trains them again", f"{n:,} steps" if n != 1 else "step", why)  # fmt: skip
        finally:
            self._leave(reason, by)

    def _flush_on_stop(self, pushes_ok: bool, reason: str, by: str) -> str | None:
        """Pushes the pending deltas where it may; why they were not pushed, or None where they were."""
        if self._failed:
            return "a push of them failed, and is not sent again (some shards may have applied it)"
        if not pushes_ok:
            return "the servers failed, hold another model state or refuse this job: this worker sent them nothing more"
        if stopped_the_job(self.stamp, reason, by):
            return "a shard's refusal stopped the job, so this worker sent them nothing more"
        try:
            self._flush()
        except Exception as e:
            return f"their push as the worker stopped failed ({stop_reason(e)})"
        return None

    def stats(self) -> dict:
        rate = self.local / self.requested if self.requested else 0.0
        return {"cache_hit_rate": rate, "local_rows": int(self.geo.local_rows)}

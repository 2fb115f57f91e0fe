"""PushHold: a shard's push gate, the checkpoint hold that closes it, and saving a checkpoint under the hold.

A checkpoint of a running cluster holds every shard (hold: the shard stops taking pushes once the ones in flight
are done), saves each (a flush, then a RocksDB checkpoint into <dir>/shard-<id>: save_into) under its hold's token,
then releases them. A shard owns one PushHold, through its ShardCheckpoints (ps.engine.checkpointing).

A hold and a Shrink exclude each other on a shard, so that a checkpoint holds a Shrink wholly or not at all, never the
chunks or tables it wrote before the save and not those after; each is refused at once while the other lasts, holding
or changing nothing (CheckpointHoldError, FAILED_PRECONDITION, not retried by clients), never made to wait: a Shrink
asked for while a hold lasts or a save runs (shrink_slot; a save whose hold was released meanwhile included: a
checkpoint whose save failed on one shard releases every shard), and a hold asked for while a Shrink runs. A Shrink
runs for minutes, and a hold that waited for it would stop the shard's pushes all that time; a Shrink that waited
for a hold would take a gRPC thread of the shard for as long as the hold lasts (up to MAX_HOLD_S), and its refusal
says since when the checkpoint holds the shard, for up to how long, and to send the Shrink once it has ended.
A hold asked for while a save whose hold was released runs on is refused too: its own save would wait for that one's
end, its pushes paused and an RPC thread taken all that time, not looking whether its caller left.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from ps.checkpoint import inside_a_checkpoint
from ps.config import DEFAULT_HOLD_S, MAX_HOLD_S
from ps.diskfull import DiskFullError, disk_full_reason
from ps.engine.room import CALLER_CHECK_S, watch_caller
from ps.errors import (
    CHECKPOINT_PAUSE,
    NOTHING_APPLIED,
    CallerGoneError,
    CheckpointDirError,
    CheckpointHoldError,
    CheckpointInProgressError,
    InvalidArgumentError,
)
from ps.utctime import utc

log = logging.getLogger("ps.engine.shard")  # the shard's: a hold is a part of its shard
T = TypeVar("T")
SAVE_TRIES = 3  # writes of a save whose directory another shard's failed save removed under it (save_into)


class PushHold:
    """Counts the pushes in flight and refuses new ones while a checkpoint holds them; one hold at a time, and
    one save at a time; no hold while a Shrink runs, and no Shrink while a hold lasts or a save runs."""

    def __init__(self, shard_id: int):
        self.shard_id = shard_id
        self._gate = threading.Condition()  # guards the fields below; a hold waits on it for the pushes in flight
        self._saving = threading.Lock()  # one checkpoint save at a time (a second one to the same dir is refused)
        self._saves = 0  # saves inside saving() (running, or waiting for _saving): no Shrink while one is
        self._save_began = 0.0  # time.time() the first of the saves inside saving() began (for a refusal's message)
        self.held_until = 0.0  # monotonic time the hold expires; 0: not held; inf: a save runs under it, or the hold
        # waits for the pushes in flight
        self.token: str | None = None  # the hold's, which save and release need
        self._hold_s = 0.0  # the hold's timeout, counted again from the end of a save
        self._pushes_in_flight = 0
        self._held_at = 0.0  # monotonic time the hold was taken
        self._held_since = 0.0  # time.time() it was asked for (for a refused Shrink's message)
        self._refused = 0  # pushes the hold refused (told once, at its end, not per push)
        self._waiting = False  # a hold waits for the pushes in flight (held_until inf meanwhile)
        self._ended_held_s = 0.0  # seconds the holds that ended (released, expired or dropped) refused pushes, summed
        self._shrink: Callable[[], str] | None = None  # what the Shrink running here is ("a Shrink is running (...)")

    @contextlib.contextmanager
    def push_gate(self) -> Iterator[None]:
        """Counts a push in flight; refuses it (UNAVAILABLE, the client retries) while a checkpoint holds pushes
        (until it releases, or its hold expires). Refused, not queued: waiting pushes would take the RPC threads
        the checkpoint's own calls need."""
        with self._gate:
            if self.held_until:
                if time.monotonic() < self.held_until:
                    self._refused += 1
                    raise CheckpointInProgressError(f"shard {self.shard_id} {CHECKPOINT_PAUSE}; retry shortly")
                log.warning("checkpoint hold expired %.0f s after it was taken, without a release (the process that "
                            "took it died, or its save outlived --hold-timeout-s): taking pushes again; %s pushes "
                            "were refused meanwhile (clients retry them)", time.monotonic() - self._held_at,
                            f"{self._refused:,}")  # fmt: skip
                self._end_hold(self.held_until)
            self._pushes_in_flight += 1
        try:
            yield
        finally:
            with self._gate:
                self._pushes_in_flight -= 1
                self._gate.notify_all()

    def hold(
        self, timeout_s: float, clock: Callable[[], int], caller_gone: Callable[[], bool] | None = None
    ) -> tuple[int, str]:
        """Stops taking pushes (they get CheckpointInProgressError) for up to timeout_s (at most MAX_HOLD_S) counted
        from when the pushes in flight are done (it waits for them first); returns (clock(), read then, token): save
        and release need the token. Every push acknowledged before this returns is in the checkpoint, none after.
        One hold at a time: CheckpointHoldError while another lasts, while a save whose hold was released runs on,
        and while a Shrink runs (shrink_slot).
        InvalidArgumentError unless 0 < timeout_s <= MAX_HOLD_S. caller_gone: looked at as the wait wakes and once it
        ends (where it has watch(wake), ps.service_calls.CallerGone, the wait is woken as the caller leaves; else it
        looks every CALLER_CHECK_S); once true, the hold is dropped (pushes taken again) and CallerGoneError raised:
        nobody would have its token to save or release."""
        if not (math.isfinite(timeout_s) and 0 < timeout_s <= MAX_HOLD_S):
            raise InvalidArgumentError(
                f"hold_timeout_s must be finite, > 0 and <= {MAX_HOLD_S:g} seconds (0 in a request: "
                f"{DEFAULT_HOLD_S:g}), got {timeout_s}; nothing is held"
            )
        with self._gate:
            now = time.monotonic()
            if self._held(now):
                raise CheckpointHoldError(
                    f"shard {self.shard_id} is held by another checkpoint ({self._other(now)}); one checkpoint at a "
                    "time: take this one once that one has ended; nothing is held"
                )
            if self._shrink is not None:
                raise CheckpointHoldError(
                    f"shard {self.shard_id}: {self._shrink()}; a checkpoint saved meanwhile would hold part of that "
                    "Shrink, so a shard takes no checkpoint hold while one runs: save once it has ended (the shard's "
                    "log says how far it got, and 'shrink at step ...' once it ended); nothing is held"
                )
            if self._saves:  # its hold released: this hold's save would wait for that one, pushes paused meanwhile
                raise CheckpointHoldError(
                    f"shard {self.shard_id}: {self._saving_on()}; one checkpoint at a time: take this one once that "
                    "save has ended; nothing is held"
                )
            if self.held_until:  # an expired hold nobody ended yet
                self._end_hold(self.held_until)
            token = self.token = secrets.token_hex(8)
            self._held_at, self._held_since = time.monotonic(), time.time()
            self.held_until = float("inf")  # pushes refused; the expiry counts once the pushes in flight are done
            self._hold_s, self._refused, self._waiting = timeout_s, 0, True
            try:
                poll_s = None if caller_gone is None else CALLER_CHECK_S
                if self._pushes_in_flight and watch_caller(caller_gone, self._wake):
                    poll_s = None  # woken as the caller leaves (an RPC ended already is gone: looked at below)
                while self._pushes_in_flight and not (caller_gone is not None and caller_gone()):
                    self._gate.wait(poll_s)
                gone = caller_gone is not None and caller_gone()
            except BaseException:  # no expiry is set yet: a hold left behind would never end
                gone = True
                raise
            finally:
                self._waiting = False
                if gone:
                    self._end_hold(time.monotonic())
                    self.token = None
            if gone:
                raise CallerGoneError(f"shard {self.shard_id}: a checkpoint hold was dropped as it was taken: its "
                                      "caller left (its deadline passed, or it was cancelled); nothing is held")  # fmt: skip
            self.held_until = time.monotonic() + timeout_s
            log.info("checkpoint hold taken: pushes paused for at most %g s", timeout_s)
            return clock(), token

    def _held(self, now: float) -> bool:
        """Whether a checkpoint hold lasts at now (monotonic; under _gate)."""
        return bool(self.held_until) and now < self.held_until

    def _hold_or_save(self, now: float) -> bool:
        """Whether a checkpoint hold lasts at now (monotonic) or a save runs (under _gate): what refuses a Shrink."""
        return self._held(now) or self._saves > 0

    def _wake(self) -> None:
        """Wakes a hold waiting for the pushes in flight to look again (its caller_gone may have turned true)."""
        with self._gate:
            self._gate.notify_all()

    def release(self, token: str) -> None:
        """Ends the hold that returned token (a stale token releases nothing)."""
        with self._gate:
            if token == self.token:
                expired = not self.held_until  # which a push found, and said (its end is counted then)
                if not expired:
                    self._end_hold(min(time.monotonic(), self.held_until))  # an expiry no push found: its time
                self.token = None
                if not expired:
                    log.info("checkpoint hold released after %.1f s: taking pushes again (%s refused meanwhile, "
                             "which clients retry)", time.monotonic() - self._held_at, f"{self._refused:,}")  # fmt: skip

    def _end_hold(self, ended_at: float) -> None:
        """Ends the hold taken at _held_at as of ended_at (monotonic; under _gate), counting its time in held_s."""
        self._ended_held_s += max(0.0, ended_at - self._held_at)
        self.held_until = 0.0

    def held_s(self, now: float) -> float:
        """Seconds checkpoint holds refused pushes here from the process's start until now (time.monotonic()), all
        holds summed: a lasting one counts until now, an expired one until its expiry. A wait for other workers'
        pushes (ps.engine.jobs) leaves out the time they were held during it: they could not push then."""
        with self._gate:
            if not self.held_until:
                return self._ended_held_s
            lasted = min(now, self.held_until) - self._held_at  # held_until inf while it waits for pushes or saves
            return self._ended_held_s + max(0.0, lasted)

    def _other(self, now: float) -> str:
        """Where the hold another checkpoint has (under _gate, lasting at now) is: taking itself, saving (the hold
        lasts on after the save until its checkpoint releases it, _hold_s after the save at the latest), or held until
        its checkpoint releases it after its save, or its expiry."""
        if self._waiting:
            return (f"its hold waits for the pushes in flight, then lasts up to {self._hold_s:g} s, and while its save "
                    "runs")  # fmt: skip
        if math.isinf(self.held_until):
            return ("it saves now; its hold lasts on after the save until that checkpoint releases it, "
                    f"{self._hold_s:g} s after the save has ended at the latest")  # fmt: skip
        return ("until that checkpoint releases it after its save, or its hold expires, "
                f"{math.ceil(self.held_until - now)} s from now at the latest")  # fmt: skip

    def _not_held(self) -> str:
        """Why a save's token is not the shard's hold now (under _gate): another checkpoint holds it, no hold was
        taken since the process started, or the hold expired or was released."""
        if self._held(time.monotonic()):  # a hold lasts: the token is not its
            return ("it is held by another checkpoint (the token is not its hold's); one checkpoint at a time: take "
                    "this one once that one has ended")  # fmt: skip
        if not self._held_at:
            return ("it has taken no checkpoint hold since it started (none was taken, or the shard restarted since "
                    "it was); take the hold first")  # fmt: skip
        return "the checkpoint's hold expired or was released before the save (raise --hold-timeout-s?); take it again"

    @property
    def save_running(self) -> bool:
        """Whether a checkpoint save runs now (one lock's state: no wait, safe in a signal handler)."""
        return self._saving.locked()

    @contextlib.contextmanager
    def saving(self, token: str) -> Iterator[None]:
        """Runs a save under the hold that returned token, one save at a time: CheckpointHoldError if that hold
        is not the shard's now (_not_held says why). The hold cannot expire while the save runs; its timeout counts
        again after."""
        with self._gate:
            if token != self.token or not self.held_until or time.monotonic() >= self.held_until:
                raise CheckpointHoldError(f"shard {self.shard_id}: {self._not_held()}; nothing saved")
            self.held_until = float("inf")  # no expiry during the save
            if not self._saves:
                self._save_began = time.time()
            self._saves += 1  # under _gate with the check: a Shrink never sees neither the hold nor the save
        try:
            with self._saving:
                yield
        finally:
            with self._gate:
                self._saves -= 1
                if self.token == token:
                    self.held_until = time.monotonic() + self._hold_s

    @contextlib.contextmanager
    def shrink_slot(self, running: Callable[[], str]) -> Iterator[None]:
        """Runs a Shrink's block with no checkpoint hold or save on the shard, refusing holds while it runs, running()
        saying why ("a Shrink is running (...)"). While a hold lasts (until its release, or its expiry) or a save runs
        (until its end, its hold released or not), refused at once: CheckpointHoldError, the block not run, saying
        since when, for up to how long, and to send the Shrink once the checkpoint has ended (_shrink_refused)."""
        with self._gate:
            now = time.monotonic()
            if self._hold_or_save(now):
                raise CheckpointHoldError(self._shrink_refused(now))
            self._shrink = running
        try:
            yield
        finally:
            with self._gate:
                self._shrink = None

    def _shrink_refused(self, now: float) -> str:
        """The message of a Shrink refused (under _gate) while a hold lasts at now or a save runs: "shard 1: a
        checkpoint holds it since 2026-12-07 19:41:05 UTC, 12 s ago (until that checkpoint releases it after its
        save, or its hold expires, 48 s from now at the latest); a Shrink run meanwhile ... send the Shrink once that
        checkpoint has ended; nothing was applied"."""
        if self._held(now):
            what = f"a checkpoint holds it since {_since(self._held_since)} ({self._other(now)})"
        else:
            what = self._saving_on()
        return (f"shard {self.shard_id}: {what}; a Shrink run meanwhile would be saved in part by that checkpoint, "
                f"so a shard runs no Shrink while a checkpoint holds it or saves: {CheckpointHoldError.shrink_remedy}; "
                f"{NOTHING_APPLIED}")  # fmt: skip

    def _saving_on(self) -> str:
        """What a save whose hold was released, running on (under _gate), is: "a checkpoint's save runs on it since
        2026-12-07 19:41:05 UTC, 3 s ago, its hold released"."""
        return f"a checkpoint's save runs on it since {_since(self._save_began)}, its hold released"


def _since(began: float) -> str:
    """When began (time.time()) was, for a message: "2026-12-07 19:41:05 UTC, 12 s ago"."""
    return f"{utc(began)}, {max(0.0, time.time() - began):,.0f} s ago"


def check_caller(caller_gone: Callable[[], bool] | None, directory: str) -> None:
    """CallerGoneError if the caller of the save into directory left (caller_gone; None: it is not asked)."""
    if caller_gone is not None and caller_gone():
        raise CallerGoneError(f"the caller of the save into {directory} left; nothing saved")


def save_into(directory: str, name: str, checkpoint_root: str, write: Callable[[str], T],
              caller_gone: Callable[[], bool] | None = None) -> T:  # fmt: skip
    """Creates directory (and its missing parents), then write(path) writes the shard's checkpoint to path,
    <directory>/<name> (a write that fails removes what it wrote there); returns what write returns. Refused before
    anything is written: InvalidArgumentError if path exists (a dangling link included) or directory lies inside a
    checkpoint or a RocksDB directory (below checkpoint_root; "": the file system's root); CheckpointDirError (or
    InvalidArgumentError, DiskFullError: see _make_dirs) if directory cannot be created or written. A failed write
    leaves none of the directories this created; a DiskFullError of it names the nearest directory that is there. The
    shards of a checkpoint save into one directory at once, and a shard whose save fails removes the directories it
    created while they are empty: a write that failed, or a look at the directory that found it gone, because it went
    away before this shard wrote anything runs again (SAVE_TRIES in all), so that shard's error, not this one's, says
    why the checkpoint failed. caller_gone: whether the save's caller left (its RPC cancelled or past its deadline),
    asked before each attempt makes the directories (CallerGoneError, nothing made) and before a failed write would
    run again (its error raised instead): the caller removes the directory it gave (an interrupted ps-worker export
    removes its fresh checkpoint, and OUT if it made it), and a write run again would make it again, with the shard's
    whole checkpoint in it, after the caller has gone. It is not asked while write runs: a caller that leaves then is
    write's to see, and what write raises for it (CallerGoneError) leaves none of the directories this created."""
    path = os.path.join(directory, name)
    if os.path.lexists(path):  # a link too, dangling or not; checked before the write: a refused save changes nothing
        raise InvalidArgumentError(f"checkpoint dir {path} exists already; give a new directory")
    inside = inside_a_checkpoint(directory, checkpoint_root)
    if inside is not None:
        raise InvalidArgumentError(f"checkpoint dir {directory} is inside {inside}, a checkpoint or a RocksDB "
                                   "directory; give a directory of its own")  # fmt: skip
    for attempt in range(SAVE_TRIES):
        check_caller(caller_gone, directory)  # nobody reads this save: nothing made for it
        created = _make_dirs(directory)  # removed again if the save fails: a refused save leaves nothing behind
        if not os.access(directory, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
            _remove_dirs(created)
            if not os.path.isdir(directory) and attempt < SAVE_TRIES - 1:  # removed meanwhile (by another shard
                continue  # whose save failed, as below), not unwritable: made again
            raise CheckpointDirError(f"checkpoint dir {directory} is not writable by this server (uid "
                                     f"{os.geteuid()}); nothing saved")  # fmt: skip
        try:
            return write(path)
        except DiskFullError as e:  # the data dir's (the flush) or the checkpoint dir's: say which, and what stands
            _remove_dirs(created)
            disk = e.disk  # the checkpoint's own dir was removed again: name the nearest one that is there
            if disk and os.path.isabs(disk) and os.path.commonpath([disk, directory]) == directory:
                while not os.path.isdir(disk) and os.path.dirname(disk) != disk:
                    disk = os.path.dirname(disk)
            raise e.instead(f"the checkpoint was not saved, nothing of it is left in {directory}; the shard's rows "
                            "are as they were", disk) from e  # fmt: skip
        except Exception:
            # Another shard of this checkpoint whose save failed removed the directory, empty, before this write put
            # anything in it: the write failed for that alone, and runs again in a new one.
            gone = not os.path.isdir(directory)
            _remove_dirs(created)
            if not gone or attempt == SAVE_TRIES - 1 or (caller_gone is not None and caller_gone()):
                raise  # (its caller gone, it was the caller that removed the directory)
            log.warning("checkpoint dir %s was removed while this shard began to write into it (by another shard "
                        "whose save failed, or by hand): writing again", directory)  # fmt: skip
        except BaseException:
            _remove_dirs(created)
            raise


_MKDIR_ATTEMPTS = 3  # a directory another shard makes and removes again between our mkdir and our look at it


def _make_dirs(directory: str) -> list[str]:
    """Creates directory and its missing parents; returns those it created, parents first (not those another
    process made meanwhile: the shards of a checkpoint save into one directory at once; one made and removed again
    meanwhile, by another shard's failed save, is made here). A directory that cannot be created leaves none of
    them behind: InvalidArgumentError for a path no file system takes (a name too long), DiskFullError for a full
    disk, CheckpointDirError for the others (no permission, a file in the way)."""
    missing = []
    d = os.path.abspath(directory)
    while not os.path.isdir(d) and os.path.dirname(d) != d:
        missing.append(d)
        d = os.path.dirname(d)
    created = []
    try:
        for d in reversed(missing):
            for attempt in range(_MKDIR_ATTEMPTS):
                try:
                    os.mkdir(d)
                except FileExistsError:  # another shard of this checkpoint made it meanwhile: not ours to remove
                    if os.path.isdir(d):
                        break
                    if os.path.lexists(d) or attempt == _MKDIR_ATTEMPTS - 1:
                        raise  # a file in the way
                    continue  # made, then removed by that shard's failed save: made again here
                created.append(d)
                break
    except OSError as e:
        _remove_dirs(created)
        reason = disk_full_reason(e)
        if reason is not None:
            raise DiskFullError.of(reason, f"cannot create checkpoint dir {directory}", "nothing was saved") from None
        error = InvalidArgumentError if e.errno in (errno.ENAMETOOLONG, errno.EINVAL) else CheckpointDirError
        raise error(f"cannot create checkpoint dir {directory}: {e.strerror}; nothing saved") from None
    return created


def _remove_dirs(created: list[str]) -> None:
    """Removes the (empty) directories _make_dirs created, children first."""
    for d in reversed(created):
        with contextlib.suppress(OSError):
            os.rmdir(d)

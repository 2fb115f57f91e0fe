"""StartProgress: what a shard's start is doing (its phase, how far along), for whoever asks meanwhile, and the
stop that ends a start at its next safe point.

A start moves through PHASES in order (some are skipped): ps.server runs "verifying" and those from "ready" on, the
Shard's constructor (ps.engine.shard, through ps.engine.opening) the others, calling enter() as each begins. The
calls are served from finish() on: in SERVED_PHASES, "warming" (the warm-up under --memory-bytes, ps.engine.warmup:
health NOT_SERVING still) until warmed(), then "serving". Other threads
read describe() (the health service's reason and the UNAVAILABLE of every call, ps.server and ps.service) and
snapshot() (the metrics port, ps.metrics) at any time; the writer replaces one tuple, so a reader never sees half a
change.

Stopping: a SIGTERM (or a closed stdin, ps.server_run) sets the `stop` flag, in its handler (a ps.signalsafe.StopFlag:
no lock), then tells stop_asked(). check(), and every enter(), raise StartStopped once it is set, so a start stops
only where stopping leaves the data dir as the next start can use: before RocksDB is opened, between journal records
(replayed again next time: a row's lsn says which records it has), before the flush that ends a replay, before the
shard serves its calls (finish(): a stop_asked() up to the instant its phase changes ends the start, one after it
stops a shard that serves). A read-only phase run under read_only() (--verify-on-start) may be stopped anywhere
inside it: the signal handler raises StartStopped itself while `interruptible` is true. A restore (--restore) stops
after the batch of rows it is writing: its data dir stays marked as an unfinished restore, which the next start with
the same --restore starts over, and any other start refuses (ps.engine.opening.check_store).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from ps.signalsafe import StopFlag

PHASES = {  # phase -> what the shard is doing, as describe() says it
    "verifying": "verifying every block of its data dir (--verify-on-start)",
    "checking": "checking its data dir and the checkpoint to restore",
    "opening": "opening RocksDB",
    "restoring": "restoring from its checkpoint (--restore)",
    "restored": "opening the tables its checkpoint restored",
    "replaying": "replaying its journal",
    "flushing": "writing the replayed rows to RocksDB",
    "ready": "about to serve",
    "warming": "loading its compiled kernels (warm-up; calls are served meanwhile)",
    "serving": "serving",
}
SERVED_PHASES = ("warming", "serving")  # the shard serves its calls: no stop ends the start any more


class StartStopped(BaseException):
    """Raised by a start that was asked to stop (the phase it was in is its message). Not an Exception: no
    `except Exception` on its way may take it for a failure of the start."""


class StartProgress:
    def __init__(self, stop: StopFlag | None = None):
        """stop: the flag a SIGTERM sets (None: a new one, which only this object's owner can set)."""
        self.stop = stop if stop is not None else StopFlag()
        self.started = time.monotonic()
        self._state: tuple[str, Callable[[], float | None] | None, bool] = ("checking", None, False)
        self._took_s: float | None = None  # once serving: how long the start took, its warm-up included
        self._stopped_in: tuple[str, Callable[[], float | None] | None, bool] | None = None  # stop_asked()'s state

    def enter(self, phase: str, fraction: Callable[[], float | None] | None = None, check: bool = True) -> None:
        """Begins a phase of PHASES, after check(): callers enter a phase where stopping is safe. fraction: how
        much of the phase is done (0..1, None: unknown), called by readers on their threads. check False: no
        check (the phase before has ended, and a stop asked for meanwhile is taken at the next check, in this
        phase)."""
        if phase not in PHASES:
            raise ValueError(f"unknown start phase {phase!r}; expected one of {', '.join(PHASES)}")
        if check:
            self.check()
        self._state = (phase, fraction, False)

    @contextlib.contextmanager
    def read_only(self, phase: str) -> Iterator[None]:
        """Enters phase for the with block, which writes nothing: a stop may end it anywhere inside (the signal
        handler raises StartStopped while `interruptible`), and nowhere after it."""
        self.enter(phase)
        self._state = (phase, None, True)
        try:
            yield
        finally:
            self._state = (phase, None, False)

    def check(self) -> None:
        """Raises StartStopped if a stop was asked for (and the shard does not serve its calls yet)."""
        if self.stop.is_set() and self.starting:
            raise StartStopped(self.describe())

    def stop_asked(self) -> bool:
        """(a signal handler, after it set `stop`, in the thread that runs the start and calls finish(): it reads
        and writes attributes only) True if the stop ends the start: the shard serves no call yet, and finish() will
        raise StartStopped instead of serving; False if it stops a shard that serves its calls (or `stop` is not
        set)."""
        if not (self.stop.is_set() and self.starting):
            return False
        self._stopped_in = self._current()
        return True

    def finish(self, warming: bool = False) -> None:
        """The shard serves its calls: the start is done, or with warming, its warm-up runs until warmed(). Raises
        StartStopped instead, the start left in its phase, if a stop was asked for before: set (check()) or told
        (stop_asked()) up to the instant the phase changes."""
        self.check()
        before = self._state
        self._state = ("warming" if warming else "serving", None, False)  # from here stop_asked() says False
        if self._stopped_in is not None:  # told between check() and the line above
            self._state = before
            raise StartStopped(self.describe())
        if not warming:
            self.warmed()

    def warmed(self) -> None:
        """The start is done, its warm-up (if any) ended: "serving"."""
        self._took_s = time.monotonic() - self.started
        self._state = ("serving", None, False)

    def _current(self) -> tuple[str, Callable[[], float | None] | None, bool]:
        """The state, as every reader sees it: where a stop_asked() found the start while finish() takes the start
        back (its phase changed, for an instant, to one that serves), never a served phase."""
        state, stopped_in = self._state, self._stopped_in
        return stopped_in if stopped_in is not None and state[0] in SERVED_PHASES else state

    @property
    def phase(self) -> str:
        return self._current()[0]

    @property
    def interruptible(self) -> bool:
        phase, _, interruptible = self._current()
        return interruptible and phase not in SERVED_PHASES

    @property
    def starting(self) -> bool:
        """The shard does not serve its calls yet (every call UNAVAILABLE): a stop ends the start."""
        return self.phase not in SERVED_PHASES

    def snapshot(self) -> tuple[str, float | None, float]:
        """(phase, fraction of it done or None, seconds the start has taken so far, or took)."""
        phase, fraction, _ = self._current()
        took = self._took_s if self._took_s is not None else time.monotonic() - self.started
        return phase, _clamped(fraction), took

    def describe(self) -> str:
        """What the start is doing, as "replaying its journal, 43% (12 s so far)"; "serving" once done."""
        phase, done, took = self.snapshot()
        if phase == "serving":
            return PHASES[phase]
        share = "" if done is None else f", {int(done * 100)}%"
        return f"{PHASES[phase]}{share} ({took:.0f} s so far)"


def _clamped(fraction: Callable[[], float | None] | None) -> float | None:
    """fraction() within 0..1, or None (none given, or it failed: a reader never fails for a progress figure)."""
    if fraction is None:
        return None
    try:
        value = fraction()
    except Exception:
        return None
    return None if value is None else min(1.0, max(0.0, float(value)))

"""What a signal handler may use, taking no lock: StopFlag, the stop it sets; HandlerWork, a thread for the rest."""

from __future__ import annotations

import functools
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable

DRAIN_POLL_S = 0.005  # HandlerWork.drained's look at its marker

log = logging.getLogger("ps.signalsafe")


class StopFlag:
    """A stop asked for, that a signal handler sets itself: set() takes no lock (threading.Event.set takes the
    event's, which the code the handler interrupted may hold), so nothing can wait on it: is_set() is polled.
    `received`: the signals that asked for it, in order (set(sig) appends one in a single step, so a handler
    tells a second signal by the count); set() with none: a stop asked for by code, not by a signal."""

    def __init__(self) -> None:
        self.received: list[signal.Signals] = []
        self._asked = False

    def set(self, sig: signal.Signals | None = None) -> None:
        if sig is None:
            self._asked = True
        else:
            self.received.append(sig)

    def is_set(self) -> bool:
        return self._asked or bool(self.received)


class HandlerWork:
    """What signal handlers hand over, done in order by a daemon thread of its own (`name`), which start() begins
    outside them. A Python signal handler runs in the main thread wherever that thread is, so the code it
    interrupted may hold a lock of that thread, and a handler that takes the same one waits for good or fails: an
    Event's (Event.set: not reentrant), stderr's buffer (a log line or a print: "reentrant call inside
    <_io.BufferedWriter name='<stderr>'>", raised into the interrupted code). run() takes none (a
    queue.SimpleQueue's put is reentrant): a handler calls it, and this thread does what takes locks."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._actions: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Starts the thread, once; never from a signal handler."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()

    def run(self, action: Callable[[], object]) -> None:
        """action() on the thread, after the actions handed over before it. Safe in a signal handler."""
        self._actions.put(action)

    def drained(self, timeout_s: float) -> bool:
        """Whether every action handed over so far has run, waiting timeout_s at most. Takes no lock (it hands
        over a marker and polls what the marker sets, in DRAIN_POLL_S sleeps), so a signal handler may call it: the
        bound matters there, as the thread may be waiting for a lock the interrupted code holds (stderr's)."""
        ran: list[bool] = []
        self.run(functools.partial(ran.append, True))
        deadline = time.monotonic() + timeout_s
        while not ran:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(DRAIN_POLL_S, left))
        return True

    def _serve(self) -> None:
        """(thread) Runs the actions as they come."""
        while True:
            action = self._actions.get()
            try:
                action()
            except Exception:  # the thread goes on: later signals' actions still run
                log.exception("%s: an action a signal handler handed over failed", self.name)

"""SIGTERM as an exception, so that a command (ps-worker's, ps-server's) stopped by `kill`, a container runtime or
a launcher cleans up as on Ctrl-C: local shards stopped, temporary files and directories removed, a message, exit
code 143. A running ps-server has its own handler (ps.server_run.serve), put in place within the block.

    with sigterm_raises():   # main thread only; elsewhere it does nothing
        ...                  # the first SIGTERM raises Terminated here; later ones are ignored while it unwinds
                             # (under exit_code, a command's main, until the process exits)

Terminated is a BaseException, as KeyboardInterrupt is: an `except Exception` on the way does not swallow it.
Later SIGTERMs and Ctrl-Cs are ignored, so a cleanup that hangs could keep the process for good: CLEANUP_LIMIT_S
after the first, it exits with EXIT_CODE (130 after a Ctrl-C) whatever it is doing (local shards stop on their own
once it is gone).

Within the block, SIGTERM and Ctrl-C (SIGINT, unless the process ignores it) that arrive while the main thread
holds numba's compiler lock (compiling a kernel, or loading one from numba's cache) raise once it lets go of it:
numba calls back into Python from LLVM (its lock callbacks), and an exception raised there by a signal handler
crashed the process (exit -11) instead of unwinding it. Inside a signals_after_step block (a training step) they
raise at the block's end, or once the block has run grace_s past the signal (the timer nudges the main thread
with RAISE_PENDING_SIGNAL, whose handler raises them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

# How often a main thread waiting on another thread lets signal handlers run. The kernel may hand SIGTERM to any
# thread (a gRPC one); Python runs the handler only when the main thread next runs bytecode, which an untimed
# wait for a lock, a queue or a future would not let it do until the thing waited for came.
SIGNAL_CHECK_S = 0.2
EXIT_CODE = 128 + signal.SIGTERM  # 143, as a shell reports a process ended by SIGTERM
CLEANUP_LIMIT_S = 120.0  # after a SIGTERM, the process exits (EXIT_CODE) by then even if its cleanup hangs
TERMINATED = "terminated"  # what a command a SIGTERM stops says after its name (exit_code): 'ps-worker: terminated'


class Terminated(BaseException):
    """SIGTERM reached this process."""


class _CompileGuard:
    """Defers the exceptions of signal handlers while the main thread holds numba's compiler lock (the
    "numba:compiler_lock" event, which nests): raise_now(error) raises at once, or keeps the first error for when
    the lock is let go of."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: type[BaseException] | None = None
        self.installed = False
        self.handling = False  # sigterm_raises's handlers are in place
        self.holding = False  # a signals_after_step block runs
        self.grace_s = 0.0
        self._timer: threading.Timer | None = None

    def install(self) -> None:
        """Listens to numba's compiler-lock events (once; numba is imported here, not before)."""
        if self.installed:
            return
        from numba.core import event

        guard = self

        class Listener(event.Listener):
            def on_start(self, ev: Any) -> None:
                if threading.current_thread() is threading.main_thread():
                    guard.depth += 1

            def on_end(self, ev: Any) -> None:
                if threading.current_thread() is not threading.main_thread():
                    return
                guard.depth = max(0, guard.depth - 1)
                if guard.depth == 0 and guard.pending is not None and not guard.holding:
                    error, guard.pending = guard.pending, None
                    raise error

        event.register("numba:compiler_lock", Listener())
        self.installed = True

    def raise_now(self, error: type[BaseException]) -> None:
        if self.depth > 0 or self.holding:
            if self.holding and self._timer is None:  # the step's grace: raised then, wherever the main thread is
                self._timer = threading.Timer(self.grace_s, self._grace_over)
                self._timer.daemon = True
                self._timer.start()
            self.pending = self.pending or error
            return
        raise error

    def _grace_over(self) -> None:
        """(timer thread) The held step outlived its grace: its signal is raised now, in the main thread."""
        self.holding = False
        if self.pending is not None:
            signal.pthread_kill(threading.main_thread().ident, RAISE_PENDING_SIGNAL)

    def take_pending(self) -> type[BaseException] | None:
        """The deferred error, unless numba's compiler lock still defers it (it raises at the lock's end)."""
        if self.depth > 0:
            return None
        error, self.pending = self.pending, None
        return error


_GUARD = _CompileGuard()
RAISE_PENDING_SIGNAL = signal.SIGUSR1  # the grace timer's nudge to the main thread (its handler raises the signal's)


@contextlib.contextmanager
def signals_after_step(grace_s: float) -> Iterator[None]:
    """Within the block (a training step: its push, then its count), Ctrl-C and SIGTERM raise at its end, so that
    a stopped run's count of trained examples holds every push the servers applied; if the block runs on for
    grace_s after the signal (a sync barrier's wait, a shard's outage), they raise then, inside it. Under
    sigterm_raises in the main thread only; elsewhere the block runs as it is. An exception that ends the block
    drops a deferred signal (that error ends the run)."""
    if not _GUARD.handling or threading.current_thread() is not threading.main_thread():
        yield
        return
    _GUARD.holding, _GUARD.grace_s = True, grace_s
    try:
        yield
    except BaseException:
        _GUARD.pending = None if _GUARD.depth == 0 else _GUARD.pending
        raise
    finally:
        _GUARD.holding = False
        if _GUARD._timer is not None:
            _GUARD._timer.cancel()
            _GUARD._timer = None
    error = _GUARD.take_pending()
    if error is not None:
        raise error


def result_of(future: Future) -> Any:
    """future.result(), waited for in SIGNAL_CHECK_S slices: a signal reaches the main thread meanwhile."""
    while True:
        try:
            return future.result(timeout=SIGNAL_CHECK_S)
        except FutureTimeout:
            continue


def stopped_by_signal(e: BaseException) -> tuple[str, int] | None:
    """("interrupted", 130) for a Ctrl-C, (TERMINATED, EXIT_CODE) for a SIGTERM: e is KeyboardInterrupt or
    Terminated, or carries one (signal_behind); None for anything else. A program's main says the word and exits
    with the code."""
    behind = signal_behind(e)
    if behind is None:
        return None
    return ("interrupted", 128 + signal.SIGINT) if isinstance(behind, KeyboardInterrupt) else (TERMINATED, EXIT_CODE)


def exit_code(program: str, run: Callable[[], int]) -> int:
    """run()'s exit code, the whole of a command's main: a Ctrl-C or SIGTERM that ends it (stopped_by_signal) is
    said on stderr ('PROGRAM: interrupted', or 'terminated') and gives 130 (or EXIT_CODE, 143); any other
    exception goes on. Notes the code it stopped added to the signal's exception (add_note: what that code left,
    a checkpoint's save or an export, say) follow the word, on its line. Within run(), a sigterm_raises block that
    a SIGTERM reached leaves SIGTERM ignored as it ends: the process is on its way out, and a second SIGTERM (a
    container runtime repeating it) would otherwise end it by default mid-cleanup or mid-line (exit -15)."""
    global _mains
    _mains += 1
    try:
        return run()
    except (KeyboardInterrupt, Terminated, SystemError) as e:  # SystemError: numba's may carry one (signal_behind)
        stopped = stopped_by_signal(e)
        if stopped is None:
            raise
        notes = getattr(signal_behind(e), "__notes__", [])
        said = f"{program}: {stopped[0]}" + (f": {' '.join(notes)}" if notes else "")
        print(said, file=sys.stderr, flush=True)
        return stopped[1]
    finally:
        _mains -= 1


_mains = 0  # the exit_code calls running (a command's main, whose process exits once they return)


def signal_behind(e: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or Terminated that e was raised from or while handling (its __cause__ or __context__
    chain), else None: numba's compiled code that calls back into Python (unpickling a cached kernel's constants)
    turns a signal's exception there into a SystemError that carries it."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (KeyboardInterrupt, Terminated)):
            return e
        e = e.__cause__ or e.__context__
    return None


@contextlib.contextmanager
def interrupt_exits(program: str) -> Iterator[None]:
    """Within the block (a command's imports: before its main() can catch anything), a Ctrl-C ends the process at
    once, as main() ends it for a later one: 'PROGRAM: interrupted' on stderr and exit 130, no traceback. Nothing
    is there to clean up yet, and an exception raised into an extension's import would not come out as itself
    (numpy's turns it into an ImportError). Main thread only, and only where Ctrl-C raises KeyboardInterrupt (not
    where the process ignores it); the previous handler comes back after.

        with interrupt_exits("ps-worker"):
            from worker.cli_train import ...
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return

    def interrupted(signum: int, frame: Any) -> None:
        with contextlib.suppress(OSError):  # no stderr: the exit code says it
            os.write(2, f"{program}: interrupted\n".encode())
        os._exit(128 + signal.SIGINT)

    signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def sigterm_raises(
    cleanup_limit_s: float | None = CLEANUP_LIMIT_S, ctrl_c_again_raises: bool = False
) -> Iterator[None]:
    """Within the block, SIGTERM raises Terminated in the main thread, and Ctrl-C KeyboardInterrupt, once: a second
    SIGTERM or Ctrl-C while the first unwinds is ignored, so that the cleanup it triggers runs to its end (not cut
    short with a traceback); the previous handlers come back after (SIGTERM's stays ignored where a SIGTERM came
    within exit_code: the process exits). SIGTERM and Ctrl-C that arrive while numba
    compiles raise when it is done (see the module docstring). cleanup_limit_s: the process exits (EXIT_CODE, or
    130 after a Ctrl-C) that long after the first signal whatever it does; None: never (tests that send signals to
    their own process). ctrl_c_again_raises: every Ctrl-C raises, with no time limit (a cleanup that a second Ctrl-C
    cuts short on purpose: launch's grace for its workers), also where the block is inside another one (launch's,
    inside ps-worker's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stop = _SignalStop(cleanup_limit_s, ctrl_c_again_raises)
    stop.install()
    try:
        _GUARD.install()  # after the handlers: importing numba takes a second, in which a SIGTERM counts too
        _GUARD.handling = True
        yield
    finally:
        _GUARD.handling = False
        stop.uninstall()


class _SignalStop:
    """sigterm_raises' handlers of one block and what they share: whether a stop is under way (`stopping`), its
    watchdog, the handlers and the unraisable hook they replace. The handlers are bound once (`on_term`, `on_int`,
    `on_lost`): the block's end tells them by identity."""

    def __init__(self, cleanup_limit_s: float | None, ctrl_c_again_raises: bool):
        self.cleanup_limit_s, self.ctrl_c_again_raises = cleanup_limit_s, ctrl_c_again_raises
        self.stopping = False  # a signal has raised (or will, at a step's end): later ones are ignored while it unwinds
        self.watchdog: threading.Timer | None = None
        self.on_term, self.on_int, self.on_lost = self._raise_terminated, self._raise_interrupt, self._lost

    def install(self) -> None:
        self.previous = signal.signal(signal.SIGTERM, self.on_term)
        current = signal.getsignal(signal.SIGINT)
        # not where SIGINT is ignored; a block whose every Ctrl-C raises takes it from an enclosing block too (launch's
        # within ps-worker's: there the enclosing block would ignore the second Ctrl-C)
        enclosing = isinstance(getattr(current, "__self__", None), _SignalStop)
        interrupting = current is signal.default_int_handler or (self.ctrl_c_again_raises and enclosing)
        self.previous_int = signal.signal(signal.SIGINT, self.on_int) if interrupting else None
        self.previous_nudge = signal.signal(RAISE_PENDING_SIGNAL, _raise_pending)
        self.previous_hook, sys.unraisablehook = sys.unraisablehook, self.on_lost

    def uninstall(self) -> None:
        if sys.unraisablehook is self.on_lost:
            sys.unraisablehook = self.previous_hook
        # a handler put in place within the block (ps.server_run.serve's) stays: a late signal is still its to handle;
        # so does the SIG_IGN a SIGTERM set under exit_code: the command exits, and a second SIGTERM must not cut it
        term = signal.getsignal(signal.SIGTERM)
        if term is self.on_term or (term is signal.SIG_IGN and not _mains):
            signal.signal(signal.SIGTERM, self.previous)
        signal.signal(RAISE_PENDING_SIGNAL, self.previous_nudge)
        if self.previous_int is not None and signal.getsignal(signal.SIGINT) is self.on_int:
            signal.signal(signal.SIGINT, self.previous_int)

    def _stop_with(self, error: type[BaseException], exit_code: int) -> None:
        if self.stopping:  # a second Ctrl-C (or SIGTERM after one) would cut the cleanup short with a traceback
            limit = "" if self.cleanup_limit_s is None else f", {self.cleanup_limit_s:g} s after the first at most"
            with contextlib.suppress(OSError):  # os.write: a print here could meet the main thread's own
                os.write(2, f"stopping already: this signal is ignored while the stop finishes{limit} (SIGKILL "
                            "ends it at once)\n".encode())  # fmt: skip
            return
        self.stopping = True
        if self.cleanup_limit_s is not None:  # later signals are ignored: a cleanup that hangs must not keep the
            self.watchdog = threading.Timer(self.cleanup_limit_s, os._exit, args=(exit_code,))  # process for good
            self.watchdog.daemon = True
            self.watchdog.start()
        _GUARD.raise_now(error)

    def _raise_terminated(self, signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._stop_with(Terminated, EXIT_CODE)

    def _raise_interrupt(self, signum: int, frame: Any) -> None:
        if self.ctrl_c_again_raises:
            _GUARD.raise_now(KeyboardInterrupt)
        else:
            self._stop_with(KeyboardInterrupt, 128 + signal.SIGINT)

    def _lost(self, unraisable: Any) -> None:
        """sys.unraisablehook: a signal's exception raised inside a finalizer (a __del__, a generator's close) is
        printed there and dropped, so no stop is under way: the next signal raises again, and no watchdog ends the
        process meanwhile."""
        self.previous_hook(unraisable)
        if not self.stopping or not isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
            return
        if threading.current_thread() is not threading.main_thread():
            return
        self.stopping = False
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
            signal.signal(signal.SIGTERM, self.on_term)


def _raise_pending(signum: int, frame: Any) -> None:
    """RAISE_PENDING_SIGNAL's handler: raises the signal's exception that a training step held back."""
    error = _GUARD.take_pending()
    if error is not None:
        raise error


def how_it_ended(returncode: int) -> str:
    """A child's end as a message says it, from its Popen.returncode (-N: killed by signal N): "exited with code
    2", "was killed by SIGABRT"."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


def child_setup(own_group: bool = True) -> Callable[[], None]:
    """preexec_fn of a child process that must not outlive this one: on Linux it gets SIGTERM when this process
    dies, however it dies (PR_SET_PDEATHSIG; at once if this process died before it was set); own_group: in a
    process group of its own (a terminal's Ctrl-C then reaches this process alone, which stops it). libc is loaded
    here, before the fork: the child only calls setpgid, prctl and getppid, which are safe after a fork even where
    this process runs other threads (a gRPC client's)."""
    parent = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def setup() -> None:
        if own_group:
            os.setpgid(0, 0)
        if prctl is not None:
            prctl(pr_set_pdeathsig, sigterm, 0, 0, 0)
            if os.getppid() != parent:
                os.kill(os.getpid(), sigterm)

    return setup

"""Fan-out: a batch of calls over shards made at once, the first on the caller's thread and the others on a pool
of daemon threads, each attempt a blocking unary call (a gRPC future would start a polling thread per call
whenever none is in flight: ~0.6 ms of a step each time), or, on the caller's thread, a future whose wait a signal
interrupts. No retries here: worker/retry.py and ShardCalls._call_until_answered (worker/shard_calls.py) decide
those.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

import grpc

from ps.terminate import result_of


def attempt(stub: grpc.UnaryUnaryMultiCallable, request: object, timeout_s: float, interruptible: bool) -> object:
    """One attempt of a call: its reply, or the grpc.RpcError it failed with. interruptible: as a gRPC future,
    whose wait a signal interrupts (the caller's thread: Ctrl-C during a sync or ssp wait stops the worker at
    once, cancelling the call)."""
    if not interruptible:
        try:
            return stub(request, timeout=timeout_s)
        except grpc.RpcError as e:
            return e
    future = stub.future(request, timeout=timeout_s)
    try:
        return future.result()
    except grpc.RpcError as e:
        return e
    except BaseException:  # KeyboardInterrupt, or Terminated from a SIGTERM handler
        future.cancel()
        raise


def at_once(pool: CallThreads, calls: list, run: Callable[[tuple, int, bool], object]) -> list:
    """[run(call, its position, interruptible)] of every call at once: the first on this thread (interruptible:
    a signal stops the wait, see attempt), the others on the pool, waited for in slices (ps.terminate's
    result_of: a signal stops that wait too); in order."""
    if not calls:
        return []
    others = [pool.submit(run, c, i, False) for i, c in enumerate(calls[1:], start=1)]
    return [run(calls[0], 0, True), *(result_of(f) for f in others)]


class CallThreads:
    """Daemon threads that make a Client's calls past the first of a batch, one more started whenever none is
    idle (several threads of a worker call at once: prefetch, push, dense). Daemons: a call in flight, such as a
    pull waiting at a barrier, never holds up the process's exit."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0
        self._closed = False

    def close(self) -> None:
        """Each thread ends once it is done with the calls already given; submit raises RuntimeError after."""
        with self._lock:
            threads, self._closed = self._threads, True
        for _ in range(threads):
            self._work.put(None)

    def submit(self, fn: Callable[..., object], *args: object) -> Future:
        """fn(*args) on one of the threads; its Future."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            if self._idle:
                self._idle -= 1
            else:
                self._threads += 1
                threading.Thread(target=self._run, name="ps-call", daemon=True).start()
        self._work.put((future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args = item
            try:
                result, error = fn(*args), None
            except BaseException as e:  # handed to the caller
                result, error = None, e
            with self._lock:  # idle before the caller hears: its next call finds this thread
                self._idle += 1
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

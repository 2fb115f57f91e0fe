"""A servicer call's course outside its handler: its refusal as a gRPC status (refuse), the wrapper that maps
every exception of a handler to one and records the call (rpc_handler), the count of calls running (RunningCalls), and
whether its caller is gone (CallerGone)."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

import grpc

from ps import codec
from ps.diskfull import DiskFullError, disk_full_reason
from ps.errornames import error_metadata
from ps.errors import (
    CheckpointInProgressError,
    ClientTableFullError,
    FileTooLargeError,
    InvalidArgumentError,
    PsError,
    clip,
)
from ps.terminate import SIGNAL_CHECK_S


def refuse(context: grpc.ServicerContext, e: PsError) -> None:
    """Ends the call with e's status and message, naming e's class in the trailing metadata (ERROR_NAME_KEY: the
    client raises that class) and carrying its fields (ps.errornames.error_metadata). context.abort raises: nothing
    after this runs."""
    context.set_trailing_metadata(error_metadata(e))
    context.abort(grpc.StatusCode[e.status], clip(str(e)))


def rpc_handler(method: Callable) -> Callable:
    """Runs a servicer method; turns a request that did not decode and exceptions into a status code and message
    (one place for all RPCs), records the call in the servicer's metrics (if any), and counts it as running
    (RunningCalls) while it does."""

    @functools.wraps(method)
    def wrapper(self, request, context):
        started, code, reply = time.perf_counter(), "OK", None
        self.calls.enter()
        try:
            if isinstance(request, codec.Undecodable):
                raise InvalidArgumentError(request.error)
            reply = method(self, request, context)
            return reply
        except PsError as e:
            code = e.status
            # a client's mistake is routine; damage on this server's disk (DATA_LOSS), a failed write or a full
            # disk is not
            serious = e.status in ("DATA_LOSS", "INTERNAL") or isinstance(e, DiskFullError | FileTooLargeError)
            level = logging.ERROR if serious else logging.INFO
            if isinstance(e, CheckpointInProgressError):  # a hold's refusals: counted, told at its release
                level = logging.DEBUG
            if isinstance(e, ClientTableFullError):  # a caller making client ids up: the operator's to see
                level = logging.WARNING
            # the text, not e: a handler that keeps records (pytest's caplog) would keep e's traceback, and with it
            # what its frames hold (a failed RocksDB write's: the RocksDB, open)
            self.refusals.refused(level, method.__name__, e, f"rejected: {e}", code)
            refuse(context, e)
        except Exception as e:  # a bug or an I/O failure: say so, never hang or return UNKNOWN
            failed = f"{method.__name__} failed on the server: {type(e).__name__}: {e}"
            reason = disk_full_reason(e)  # a full disk that no storage layer named (those raise DiskFullError)
            full = DiskFullError.of(reason, failed, outcome="") if reason is not None else None
            code = full.status if full is not None else "INTERNAL"
            self.refusals.refused(logging.ERROR, method.__name__, e, f"failed: {type(e).__name__}: {e}", code,
                                  exc_info=True)  # fmt: skip
            if full is not None:
                refuse(context, full)
            else:
                context.abort(grpc.StatusCode.INTERNAL, clip(failed))
        finally:
            try:
                if self.metrics is not None:
                    out = len(reply) if isinstance(reply, bytes) else (reply.ByteSize() if reply is not None else 0)
                    self.metrics.observe(method.__name__, code, time.perf_counter() - started, request.ByteSize(), out)
            finally:
                self.calls.leave()  # last: Server.stop closes the metrics and the shard once none runs

    return wrapper


class CallerGone:
    """Whether a request's caller is gone (its RPC cancelled, or past its deadline), for the work of the request that
    stops without it (CallerGoneError): its waits, a stamped request's for its job's other workers (ps.engine.jobs),
    one for request room or reply room (ps.engine.room, ps.replies), the checkpoint hold's for the pushes in flight
    (ps.engine.hold), which watch(wake) wakes as the RPC ends, so that a wait whose caller left frees its RPC thread
    at once (ps.engine.room.watch_caller); and a checkpoint save, which calls it before each write (ps.engine.hold
    save_into), after the flush and once the checkpoint is written and read back (ps.engine.checkpointing
    ShardCheckpoints.write), and watches nothing: it does not wait, so the RPC's end has no one to wake there."""

    def __init__(self, context: grpc.ServicerContext):
        self._context = context

    def __call__(self) -> bool:
        return not self._context.is_active()

    def watch(self, wake: Callable[[], None]) -> bool:
        """Registers wake for the RPC's end; False if it has ended already (wake will not be called)."""
        return bool(self._context.add_callback(wake))


class RunningCalls:
    """How many servicer methods run now: gRPC's stop cancels the calls but leaves their handler threads running,
    and the shard's store must not be closed under one (a checkpoint being written)."""

    def __init__(self) -> None:
        self._count = 0
        self._cond = threading.Condition()

    def enter(self) -> None:
        with self._cond:
            self._count += 1

    def leave(self) -> None:
        with self._cond:
            self._count -= 1
            if not self._count:
                self._cond.notify_all()

    def wait_done(self, timeout_s: float) -> int:
        """Waits up to timeout_s (in slices of SIGNAL_CHECK_S: the main thread's signals are handled) until none
        runs; returns how many still run."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._count and time.monotonic() < deadline:
                self._cond.wait(min(SIGNAL_CHECK_S, max(0.0, deadline - time.monotonic())))
            return self._count

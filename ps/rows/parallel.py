"""Runs a compiled per-id loop over parts of a batch on several threads at once.

The loops of the hot path (index lookup, gather, optimizer update, scatter, the journal checksum) are bound by
memory latency and bandwidth, not arithmetic, and they release the GIL (numba nogil), so each further core
(up to THREADS) keeps more cache misses in flight and takes a share of the batch. numba's own `parallel=True` is
not used: its default threading layer aborts when two Python threads call parallel functions at once, which a
gRPC server does.

Contract for a kernel run in parts: part i touches only its own slice of the outputs, and rows shared by two
parts are only read (or, like a row's use count, updated where a lost update is harmless).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ps.accel.threadnames import name_os_thread

T = TypeVar("T")


def _default_threads() -> int:
    """PS_KERNEL_THREADS, or the usable cores (at most 4)."""
    env = os.environ.get("PS_KERNEL_THREADS", "").strip()
    if not env:
        return max(1, min(4, len(os.sched_getaffinity(0))))
    if not env.isdigit() or int(env) < 1:
        raise ValueError(f"environment variable PS_KERNEL_THREADS is {env!r}, expected a whole number >= 1 (threads "
                         "a server splits one batch's per-id work over)")  # fmt: skip
    return int(env)


THREADS = _default_threads()  # threads a batch is split over (tests lower MIN_PART to split tiny batches too)
MIN_PART = 8192  # ids; a smaller part is not worth handing to another thread

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def parts(n: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges covering [0, n): one per thread, each at least MIN_PART long (one range if n is small)."""
    k = max(1, min(THREADS, n // max(1, MIN_PART)))
    bounds = [n * i // k for i in range(k + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(k)]


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=max(1, THREADS - 1), thread_name_prefix="ps-kernel", initializer=name_os_thread
            )
        return _pool


def run_each(fn: Callable[[int], T], k: int) -> list[T]:
    """[fn(0), ..., fn(k - 1)], run concurrently (the last on the calling thread). An exception in any of them
    is raised once all have finished: none outlives the call (the caller's lock guards the arrays they touch)."""
    if k == 1:
        return [fn(0)]
    futures = [_executor().submit(fn, i) for i in range(k - 1)]
    try:
        last = fn(k - 1)
    except BaseException:
        for f in futures:
            f.exception()
        raise
    return [f.result() for f in futures] + [last]


def run_parts(fn: Callable[[int, int], T], n: int) -> list[T]:
    """[fn(lo, hi) for each part [lo, hi) of [0, n)], run concurrently (see run_each)."""
    ranges = parts(n)
    return run_each(lambda i: fn(*ranges[i]), len(ranges))

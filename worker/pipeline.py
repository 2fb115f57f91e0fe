"""Bounded prefetch: pull the rows of the next batches on a background thread while the current one computes.

The thread reads batches and pulls their rows (gRPC calls release the GIL), at most `depth` batches ahead of
the consumer. A pulled batch may miss the pushes of the up to `depth` batches before it: the usual staleness of
an asynchronous parameter server, traded for overlapping communication with computation (depth 0: none).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator

_END = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


def prefetched(batches: Iterable, pull: Callable, depth: int = 1) -> Iterator[tuple]:
    """Yields (batch, pull(batch)) for each batch, in order, pulling up to depth batches ahead on a thread.
    An exception in reading or pulling is raised here, at the batch where it happened."""
    if depth < 0:
        raise ValueError(f"--prefetch is {depth}, expected >= 0")
    if depth == 0:
        for batch in batches:
            yield batch, pull(batch)
        return
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not put((batch, pull(batch))):
                    return
            put(_END)
        except BaseException as e:  # handed to the consumer, raised there
            put(_Failed(e))

    thread = threading.Thread(target=produce, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()  # the consumer stopped early (or failed): let the producer end
        thread.join(timeout=60)

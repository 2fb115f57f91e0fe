"""Bounded prefetch: pull the rows of the next batches on a background thread while the current one computes.

The thread reads batches and pulls their rows (gRPC calls release the GIL), at most `depth` batches ahead of
the consumer (depth in the queue, one more in the thread's hands), so a row pulled ahead may miss the pushes
of the up to depth + 1 batches before it, and even one step of such staleness trains FM worse, most of all on
small tables at a high learning rate. So every push returns the rows it updated, and the consumer lays the rows
its last depth + 1 pushes returned over the rows pulled ahead (RecentRows): the rows it computes with are then
exactly those of a run without prefetch (tests/test_pipeline.py), and no pull waits in the step.
Scoring (eval, predict: worker/scoring.py predictions) pushes nothing and needs no overlay; it chains two stages,
reading on one thread and pulling on another, so a pull's wait overlaps the parsing of the batches after it.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from ps.terminate import SIGNAL_CHECK_S

_END = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


def prefetched(batches: Iterable, pull: Callable, depth: int = 1) -> Iterator[tuple]:
    """Yields (batch, pull(batch)) for each batch, in order, pulling up to depth batches ahead on a thread.
    An exception in reading or pulling is raised here, at the batch where it happened. Closed early, it waits a
    second for the thread, whose pull in flight (a sync or ssp pull may wait out its barrier) is then left to end
    on its own (the thread is a daemon, and its result is dropped). The thread closes `batches` (a generator left
    part way: its files, or the thread of a prefetched() it is) as it ends, being the thread that ran it."""
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
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            try:  # timed: a signal another thread received runs its handler here (ps.terminate)
                item = items.get(timeout=SIGNAL_CHECK_S)
            except queue.Empty:
                continue
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:  # the consumer stopped early, or failed (Ctrl-C too): let the producer end
        stop.set()
        thread.join(timeout=1.0)  # a pull of it may wait at a barrier for minutes: the daemon thread is left to it


def in_any(ids: np.ndarray, id_sets: Iterable[np.ndarray]) -> np.ndarray:
    """Boolean mask over ids: True where the id is in one of id_sets (each sorted and unique)."""
    mask = np.zeros(len(ids), dtype=bool)
    for other in id_sets:
        mask |= found_in_sorted(ids, other)[0]
    return mask


def found_in_sorted(ids: np.ndarray, sorted_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask over ids: True where the id is in sorted_ids (sorted, unique), each id's position in sorted_ids
    where it is there): binary search, no sort."""
    where = np.searchsorted(sorted_ids, ids)
    where[where == len(sorted_ids)] = 0
    found = sorted_ids[where] == ids if len(sorted_ids) else np.zeros(len(ids), dtype=bool)
    return found, where


class RecentRows:
    """The rows this worker's last `window` pushes returned (each row as it was right after its push), to lay over
    rows pulled before those pushes: for a single worker the result is exactly what a pull now would give."""

    def __init__(self, window: int):
        self._pushed: deque = deque(maxlen=max(window, 1))

    def add(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Records one push's ids (sorted, unique) and the rows it returned."""
        self._pushed.append((np.asarray(ids, dtype=np.uint64), rows))

    def covered(self, ids: np.ndarray) -> np.ndarray:
        """Boolean mask over ids (unique): True where a recorded push returned the id's row."""
        return in_any(ids, [pushed for pushed, _ in self._pushed])

    def overlay(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """rows[i] = the newest recorded row of ids[i], where there is one (ids unique; rows updated in place)."""
        for pushed, pushed_rows in self._pushed:  # oldest first: newer pushes overwrite
            found, where = found_in_sorted(ids, pushed)
            rows[found] = pushed_rows[where[found]]

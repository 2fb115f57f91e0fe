"""The stream of training batches over epochs, cut to a resumed run's share: Skipping drops the examples a resumed
run has trained (--skip-examples), Limit ends the stream at the worker's --max-examples, marked_last marks its
last batch (the loop pushes the MLP's gradients in that step).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from worker.batch import Batch


class Limit:
    """Passes on the first `left` examples of the batches it is given (the last batch cut to fit), over as many
    epochs' streams as that takes, then nothing; left 0: no limit. `reached`: the limit ended the stream."""

    def __init__(self, left: int):
        self.on, self.left, self.reached = left > 0, left, False

    def __call__(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        if not self.on:
            yield from batches
            return
        if self.reached:
            return
        it = iter(batches)
        try:
            for batch in it:
                if len(batch) >= self.left:
                    yield batch if len(batch) == self.left else batch.slice(0, self.left)
                    self.left, self.reached = 0, True
                    return
                self.left -= len(batch)
                yield batch
        finally:
            close = getattr(it, "close", None)
            if close is not None:  # a file's reader, left part way: closed now, not when collected
                close()


class Skipping:
    """Drops the first `left` examples of the batches it is given, over as many epochs' streams as that takes;
    `seconds` is the time spent reading them. on_dropped(n), where given, is told of each batch dropped whole (of
    n examples): the backend's skip_masks, which draws the dropout masks a run never stopped drew for it, so that
    the resumed run's steps draw the masks that run's did."""

    def __init__(self, left: int, on_dropped: Callable[[int], None] | None = None):
        self.left, self.seconds, self.on_dropped = left, 0.0, on_dropped

    def __call__(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        started = time.perf_counter() if self.left else None
        for batch in batches:
            if self.left >= len(batch):
                self.left -= len(batch)
                if self.on_dropped is not None:
                    self.on_dropped(len(batch))
                continue
            if self.left:
                batch, self.left = batch.slice(self.left, len(batch)), 0
            if started is not None:
                self.seconds += time.perf_counter() - started
                started = None
            yield batch
        if started is not None:
            self.seconds += time.perf_counter() - started


def marked_last(batches: Iterable[Batch], look_ahead: bool = True) -> Iterator[tuple[Batch, bool]]:
    """(batch, last) for each of batches, last True for the final one: it reads one batch ahead (the data only:
    no rows are pulled for it). An error reading the next batch comes after the batch before it, as unmarked, so
    that its step runs first (an interrupt, KeyboardInterrupt or a SIGTERM's, is raised at once); closing it
    closes batches. look_ahead False: every batch unmarked, none read ahead (each batch's read is timed with its
    own step)."""
    it = iter(batches)
    try:
        if not look_ahead:
            for batch in it:
                yield batch, False
            return
        current = next(it, None)
        while current is not None:
            try:
                following = next(it, None)
            except Exception:  # a read error: the batch before it trains first (a Ctrl-C or SIGTERM stops at once)
                yield current, False
                raise
            yield current, following is None
            current = following
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()

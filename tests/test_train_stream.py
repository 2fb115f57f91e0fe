"""worker/train_stream.py's marked_last: the last batch marked, an error reading ahead raised after the batch
before it."""

from __future__ import annotations

import pytest

from worker.train_stream import marked_last


def test_only_the_final_batch_is_marked_last():
    assert list(marked_last(iter("abc"))) == [("a", False), ("b", False), ("c", True)]
    assert list(marked_last(iter("a"))) == [("a", True)]
    assert list(marked_last(iter(""))) == []


def test_an_error_reading_ahead_comes_after_the_batch_before_it_unmarked_and_closing_closes_the_batches():
    closed = []

    def batches():
        try:
            yield "a"
            yield "b"
            raise ValueError("line 3 is malformed")
        finally:
            closed.append(True)

    marked = marked_last(batches())
    assert next(marked) == ("a", False)
    assert next(marked) == ("b", False)  # its step runs before the error
    with pytest.raises(ValueError, match="line 3"):
        next(marked)
    assert closed
    early = marked_last(batches())
    next(early)
    early.close()
    assert len(closed) == 2


def test_an_interrupt_while_reading_ahead_is_raised_at_once_not_after_another_step():
    def batches():
        yield "a"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        next(marked_last(batches()))

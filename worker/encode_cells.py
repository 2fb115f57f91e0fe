"""What encoding (worker/encode.py) reads a column's cells through: the cells checked, the first problem of each bad
example, and a cell as a message shows it."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from worker.schema_columns import Column


class ExampleProblems:
    """The first problem of each bad example."""

    def __init__(self, n: int) -> None:
        self.bad = np.zeros(n, dtype=bool)
        self.first: dict[int, str] = {}

    def add(self, examples: np.ndarray, messages: list[str]) -> None:
        """Records messages[j] as the problem of examples[j] where that example has none yet."""
        for i, message in zip(np.asarray(examples).tolist(), messages):
            if i not in self.first:
                self.first[i] = message
                self.bad[i] = True


def source_cells(cells: Mapping[str, np.ndarray], c: Column, n: int) -> np.ndarray:
    """The n cells of column c's source as a str or bytes array, or ValueError where cells lack the source or its
    cells are not of shape (n,)."""
    if c.source not in cells:
        raise ValueError(f"column {c.name!r} reads {c.source!r}, which is not among the cells {sorted(cells)}")
    arr = np.asarray(cells[c.source])
    if arr.dtype.kind not in "SU":
        arr = arr.astype(np.str_)
    if arr.shape != (n,):
        raise ValueError(f"cells of {c.source!r} have shape {arr.shape}, expected ({n},)")
    return arr


def shown_cell(cell: str | bytes) -> str:
    """A cell for a message: its text (UTF-8, bad bytes replaced), cut at 80 characters."""
    text = cell.decode("utf-8", "replace") if isinstance(cell, bytes) else str(cell)
    return repr(text) if len(text) <= 80 else repr(text[:80]) + f"... ({len(text)} characters)"

"""The numeric sources of one encoding call (worker/encode.py), each parsed once: integers, floats, their buckets,
times, and dense features."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from worker.cells import FLOAT32_MAX, float_values, int_values
from worker.encode_cells import ExampleProblems, shown_cell, source_cells
from worker.features import MISSING_CAT, MISSING_INT, int_bucket
from worker.schema import Schema
from worker.schema_columns import TIME_TRANSFORMS, Column
from worker.timestamps import TEXT_TIME_FORMATS, iso_parts, time_parts

_INT_RANGE = f"({MISSING_INT}, {np.iinfo(np.int64).max}]"


_TIME_EXPECTED = {"yymmddhh": "a time YYMMDDHH (14102100: 2014-10-21, hour 00; a month 01-12, a day of it, an "
                               "hour 00-23)",
                  "unix": "a time in unix seconds (an integer from 0 to 9999999999: not milliseconds)",
                  "iso": "a date and time YYYY-MM-DD HH:MM:SS or YYYY-MM-DDTHH:MM:SS (minutes, seconds and a zone "
                         "optional; a valid date, an hour 00-23)"}  # fmt: skip


def reads_text_time(c: Column) -> bool:
    """Whether a column reads its cells as a time written as text (timestamps.TEXT_TIME_FORMATS), not a number."""
    return c.transform in TIME_TRANSFORMS and c.transform.rpartition("_")[0] in TEXT_TIME_FORMATS


class NumericSources:
    """The parsed numeric sources of one call, each parsed once: as integers where a log_buckets column reads
    the source (taken from `ints` where it holds them, else all of them in one int_values call per dtype kind; a
    float view of them then serves the other transforms), else as floats. A source's problems are reported
    when a column first reads it. The integer sources' buckets and float views are computed for all of them
    at once, when a column first needs one. Float sources in `floats` are taken from it (all ok)."""

    def __init__(self, schema: Schema, cells: Mapping[str, np.ndarray], n: int, problems: ExampleProblems,
                 ints: dict[str, np.ndarray], floats: dict[str, tuple[np.ndarray, np.ndarray]]):  # fmt: skip
        self.cells, self.n, self.problems = cells, n, problems
        self.parsed_ints: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        by_kind: dict[str, dict[str, np.ndarray]] = {}
        for c in schema.columns:
            if c.transform == "log_buckets" and c.source in ints:
                self.parsed_ints[c.source] = (ints[c.source], np.ones(n, dtype=bool))
            elif c.transform == "log_buckets":
                arr = source_cells(cells, c, n)
                by_kind.setdefault(arr.dtype.kind, {})[c.source] = arr
        for group in by_kind.values():
            values, ok = int_values(np.stack(list(group.values()), axis=1))
            self.parsed_ints.update({source: (values[:, j], ok[:, j]) for j, source in enumerate(group)})
        self.ints: dict[str, np.ndarray] = {}
        self.floats = {s: v for s, v in floats.items() if s not in self.parsed_ints}
        self.buckets: dict[str, np.ndarray] = {}
        self.int_floats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.text_times: dict[str, tuple[np.ndarray, ...]] = {}  # iso_parts of a text time's source

    def _int(self, c: Column) -> np.ndarray:
        if c.source not in self.ints:
            values, ok = self.parsed_ints[c.source]
            if not ok.all():
                cells, at = self.cells[c.source], np.flatnonzero(~ok)
                expected = f"expected empty, NA (missing) or a base-10 integer in {_INT_RANGE}"
                self.problems.add(
                    at, [f"integer column {c.source!r} is {shown_cell(cells[i])}, {expected}" for i in at]
                )
            self.ints[c.source] = values
        return self.ints[c.source]

    def _all_ints(self) -> np.ndarray:
        """int64 (k, n): the values of the k integer sources (MISSING_INT where not ok), in parsed_ints order."""
        return np.stack([values for values, _ in self.parsed_ints.values()]).reshape(len(self.parsed_ints), self.n)

    def _float(self, c: Column) -> tuple[np.ndarray, np.ndarray]:
        """(float64 values, missing)."""
        if c.source not in self.floats:
            if c.source in self.parsed_ints:
                self._int(c)  # its problems
                if not self.int_floats:
                    ints = self._all_ints()
                    missing = ints == MISSING_INT
                    floats = np.where(missing, 0, ints).astype(np.float64)
                    self.int_floats = {s: (floats[j], missing[j]) for j, s in enumerate(self.parsed_ints)}
                self.floats[c.source] = self.int_floats[c.source]
            else:
                cells = source_cells(self.cells, c, self.n)
                values, missing, ok = float_values(cells)
                if not ok.all():
                    at = np.flatnonzero(~ok)
                    self.problems.add(
                        at,
                        [
                            f"numeric column {c.source!r} is {shown_cell(cells[i])}, expected a finite float32 number "
                            "(|x| <= 3.4e38) or empty"
                            for i in at.tolist()
                        ],
                    )
                self.floats[c.source] = (values, missing)
        return self.floats[c.source]

    def bucket_values(self, c: Column) -> np.ndarray:
        """uint64 bucket values of a bucketize or log_buckets column, hours or weekdays of a time column."""
        if c.transform in TIME_TRANSFORMS:
            return self._time_values(c)
        if c.transform == "log_buckets":
            self._int(c)  # its problems
            if not self.buckets:
                self.buckets = dict(zip(self.parsed_ints, int_bucket(self._all_ints())))
            return self.buckets[c.source]
        x, missing = self._float(c)
        b = np.searchsorted(np.asarray(c.boundaries), x, side="right").astype(np.uint64)
        b[missing] = MISSING_CAT
        return b

    def _time_values(self, c: Column) -> np.ndarray:
        fmt, _, part = c.transform.rpartition("_")
        if reads_text_time(c):
            if c.source not in self.text_times:
                self.text_times[c.source] = iso_parts(source_cells(self.cells, c, self.n))
            hour, weekday, ok, missing = self.text_times[c.source]
        else:
            x, missing = self._float(c)
            hour, weekday, ok = time_parts(x, fmt)
        bad = ~ok & ~missing
        if bad.any():
            at, cells = np.flatnonzero(bad), self.cells.get(c.source)
            expected = _TIME_EXPECTED[fmt]
            self.problems.add(at, [f"time column {c.source!r} is {shown_cell(cells[i]) if cells is not None else x[i]}, "
                                   f"expected {expected} or empty" for i in at])  # fmt: skip
        out = (hour if part == "hour" else weekday).astype(np.uint64)
        out[missing | bad] = MISSING_CAT
        return out

    def dense_values(self, c: Column) -> np.ndarray:
        """float64 (n,) of a log, none or standardize column."""
        x, missing = self._float(c)
        if c.transform == "log":
            out = np.log1p(np.maximum(x, 0.0))
        elif c.transform == "standardize":
            if c.mean is None or c.std is None:
                raise ValueError(f"standardize column {c.name!r} has no mean and std: Schema.with_stats gives them")
            out = (x - c.mean) / c.std
        else:
            out = x.copy()
        out[missing] = 0.0
        too_big = ~(np.abs(out) <= FLOAT32_MAX)  # past it, inf in float32
        if too_big.any():
            at = np.flatnonzero(too_big)
            cells = self.cells.get(c.source)
            self.problems.add(at, [f"numeric column {c.source!r} is {shown_cell(cells[i]) if cells is not None else x[i]}:"
                                   f" its {c.transform} feature {out[i]:.3g} is past float32's range" for i in at])  # fmt: skip
            out[too_big] = 0.0
        return out

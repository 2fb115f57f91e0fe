"""A column of times read as the hour of the day and the day of the week (the schema's time transforms,
worker/schema.py), and the test schema inference tells such a column by (worker/column_infer.py).

    time_parts(values, fmt) -> (hour, weekday, ok)      # of float64 numbers, as cells.py reads numeric cells
    time_format(name, cells) -> "yymmddhh", "unix" or None

Two formats of a time, each an integer:
    yymmddhh  YYMMDDHH, Avazu's `hour` (14102100: 2014-10-21, hour 00): the year 2000 + YY, a month 01-12, a
              day of that month, an hour 00-23
    unix      seconds since 1970-01-01 00:00 UTC, 0 to 9999999999 (ten digits at most, to 2286-11-20: a time in
              milliseconds, 13 digits, is no time of it); the hour and weekday of UTC
The hour is 0..23, the weekday 0..6, Monday 0.
"""

from __future__ import annotations

import re

import numpy as np

from worker.cells import is_missing_text

TIME_FORMATS = ("yymmddhh", "unix")
_UNIX_MAX = 1e10 - 1  # ten digits: unix seconds to 2286; milliseconds (13 digits since 2001) are past it
_TIME_NAME = re.compile(r"(?:^|[^a-z])(?:hour|time|date|datetime|timestamp|ts)(?:$|[^a-z])")  # a word of a name
_YYMMDDHH = re.compile(r"[0-9]{8}")
_UNIX = re.compile(r"[1-9][0-9]{9}")  # 10 digits: 2001-09-09 to 2286-11-20


def time_parts(values: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hour 0..23, weekday 0..6, ok) of float64 values (int64 arrays; 0 where not ok): ok where a value is a time
    of format fmt (see the module docstring)."""
    x = np.asarray(values, dtype=np.float64)
    ok = (x == np.floor(x)) & (x >= 0)
    if fmt == "unix":
        ok &= x <= _UNIX_MAX
        seconds = np.where(ok, x, 0).astype(np.int64)
        hour, days = seconds // 3600 % 24, seconds // 86400
    elif fmt == "yymmddhh":
        v = np.where(ok & (x < 1e8), x, 0).astype(np.int64)
        ok &= x < 1e8
        days, valid = _days(2000 + v // 1_000_000, v // 10_000 % 100, v // 100 % 100)
        hour = v % 100
        ok &= valid & (hour <= 23)
    else:
        raise ValueError(f"time format {fmt!r} is unknown; expected one of {list(TIME_FORMATS)}")
    weekday = (days + 3) % 7  # 1970-01-01 was a Thursday
    return np.where(ok, hour, 0), np.where(ok, weekday, 0), ok


def _days(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(days since 1970-01-01, ok) of dates given as int64 arrays: ok where the month is 01-12 and the day one of
    that month's."""
    ok = (month >= 1) & (month <= 12) & (day >= 1)
    months = (year - 1970) * 12 + np.clip(month, 1, 12) - 1  # months since 1970-01
    first = months.astype("datetime64[M]").astype("datetime64[D]").astype(np.int64)
    following = (months + 1).astype("datetime64[M]").astype("datetime64[D]").astype(np.int64)
    return first + day - 1, ok & (day <= following - first)


def time_format(name: str, cells: list[str]) -> str | None:
    """The format of a column of times, told by its name and its cells (stripped; missing ones left out: empty, or
    NA, ? and the other cells.MISSING_TEXTS, as encode reads a time's cells): a name with a word hour, time, date,
    datetime, timestamp or ts (any case; `click_time`, `eventTs`), and every other cell eight digits that are a
    valid YYMMDDHH ("yymmddhh") unless every one is a date YYYYMMDD from 1970 on too (a `date` of 2012-03-01 to
    2012-03-23, 20120301..20120323, reads as 2020-12-03 at hours 01..23, and its later days as no time), or ten
    digits, the first not 0 ("unix"); else None."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()  # eventTs -> event_ts
    present = [c.strip() for c in cells if not is_missing_text(c)]
    if not present or not _TIME_NAME.search(words):
        return None
    if all(_YYMMDDHH.fullmatch(c) for c in present):
        v = np.array(present, dtype=np.int64)
        dates = _days(v // 10_000, v // 100 % 100, v % 100)[1] & (v >= 19_700_000)
        return "yymmddhh" if time_parts(v.astype(np.float64), "yymmddhh")[2].all() and not dates.all() else None
    return "unix" if all(_UNIX.fullmatch(c) for c in present) else None

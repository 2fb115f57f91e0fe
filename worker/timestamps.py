"""A column of times read as the hour of the day and the day of the week (the schema's time transforms,
worker/schema.py), and the test schema inference tells such a column by (worker/column_infer.py).

    time_parts(values, fmt) -> (hour, weekday, ok)      # of float64 numbers, as cells.py reads numeric cells
    iso_parts(cells) -> (hour, weekday, ok, missing)   # of text cells (str or bytes), format iso
    time_format(name, cells) -> "yymmddhh", "unix", "iso" or None
    untold_time(name, cells) -> "unix_ms", "yyyymmdd" or None   # times of a form no transform reads

Two formats of a time that are integers (read as numbers, time_parts), and one that is text (iso_parts):
    yymmddhh  YYMMDDHH, Avazu's `hour` (14102100: 2014-10-21, hour 00): the year 2000 + YY, a month 01-12, a
              day of that month, an hour 00-23
    unix      seconds since 1970-01-01 00:00 UTC, 0 to 9999999999 (ten digits at most, to 2286-11-20: a time in
              milliseconds, 13 digits, is no time of it); the hour and weekday of UTC
    iso       a date and time as ISO 8601 and databases write them: YYYY-MM-DD, then T or a space, then HH, then
              optionally :MM, :MM:SS or :MM:SS.fraction, then optionally a zone (Z, +HH, +HHMM or +HH:MM, or
              - for +); surrounding whitespace allowed. A valid date, an hour 00-23, minutes and seconds 00-59
              (60 too: a leap second). The hour and weekday as written: a zone is not applied, so a time keeps the
              clock hour of the place that wrote it
The hour is 0..23, the weekday 0..6, Monday 0. A missing cell (empty, or NA and the other
cells.MISSING_TEXTS) is no time and no problem: encode gives it an id of its own.
"""

from __future__ import annotations

import re

import numpy as np

from worker.cells import MISSING_TEXTS, is_missing_text

TIME_FORMATS = ("yymmddhh", "unix", "iso")
TEXT_TIME_FORMATS = ("iso",)  # read from the cells' text (iso_parts), not as numbers (time_parts)
_UNIX_MAX = 1e10 - 1  # ten digits: unix seconds to 2286; milliseconds (13 digits since 2001) are past it
_TIME_NAME = re.compile(r"(?:^|[^a-z])(?:hour|time|date|datetime|timestamp|ts)(?:$|[^a-z])")  # a word of a name
_YYMMDDHH = re.compile(r"[0-9]{8}")
_UNIX = re.compile(r"[1-9][0-9]{9}")  # 10 digits: 2001-09-09 to 2286-11-20
_UNIX_MS = re.compile(r"[1-9][0-9]{12}")  # 13 digits: milliseconds, 2001-09-09 to 2286-11-20
_ISO_HEAD = 13  # YYYY-MM-DDTHH: what the hour and weekday are read from
_ISO_DIGITS = (0, 1, 2, 3, 5, 6, 8, 9, 11, 12)  # the head's digits, at these offsets
_ISO_TAIL = re.compile(r"(?::[0-5][0-9](?::(?:[0-5][0-9]|60)(?:\.[0-9]+)?)?)?(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)?")
_ISO_SHAPE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}" + _ISO_TAIL.pattern)  # iso_parts' layout, unchecked


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


def iso_parts(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(hour 0..23, weekday 0..6, ok, missing) of text cells (a str or bytes array) of the iso format (see the module
    docstring): int64 arrays, 0 where not ok; missing where a cell is empty or one of MISSING_TEXTS (then not ok)."""
    cells = np.strings.strip(np.asarray(cells))
    if cells.dtype.kind not in "SU":
        raise ValueError(f"iso times are read from text cells, not from an array of {cells.dtype}")
    byte = cells.dtype.kind == "S"
    texts = [t.encode() if byte else t for t in ("", *MISSING_TEXTS)]
    missing = np.isin(np.strings.lower(cells), np.array(texts, dtype=cells.dtype))
    unit = np.dtype(np.uint8 if byte else np.uint32)  # a character's code
    chars = cells.dtype.itemsize // unit.itemsize
    codes = np.zeros((len(cells), max(chars, _ISO_HEAD)), dtype=unit)
    if chars:
        codes[:, :chars] = np.ascontiguousarray(cells).view(unit).reshape(len(cells), chars)
    digits = codes[:, _ISO_DIGITS].astype(np.int64) - ord("0")
    ok = ((digits >= 0) & (digits <= 9)).all(axis=1) & (codes[:, 4] == ord("-")) & (codes[:, 7] == ord("-"))
    ok &= (codes[:, 10] == ord("T")) | (codes[:, 10] == ord(" "))
    number = np.where(ok[:, None], digits, 0) * np.array([1000, 100, 10, 1, 10, 1, 10, 1, 10, 1], dtype=np.int64)
    year, month, day, hour = number[:, :4].sum(1), number[:, 4:6].sum(1), number[:, 6:8].sum(1), number[:, 8:].sum(1)
    days, valid = _days(year, month, day)
    ok &= valid & (hour <= 23)
    if chars > _ISO_HEAD:  # the text after the head: its codes viewed back as the cells' kind of text
        tail = np.dtype((cells.dtype.kind, chars - _ISO_HEAD))
        tails, inverse = np.unique(np.ascontiguousarray(codes[:, _ISO_HEAD:]).view(tail), return_inverse=True)
        fits = [_ISO_TAIL.fullmatch(t.decode("latin-1") if byte else t) is not None for t in tails.tolist()]
        ok &= np.array(fits, dtype=bool)[inverse.reshape(-1)]
    return np.where(ok, hour, 0), np.where(ok, (days + 3) % 7, 0), ok, missing


def _days(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(days since 1970-01-01, ok) of dates given as int64 arrays: ok where the month is 01-12 and the day one of
    that month's."""
    ok = (month >= 1) & (month <= 12) & (day >= 1)
    months = (year - 1970) * 12 + np.clip(month, 1, 12) - 1  # months since 1970-01
    first = months.astype("datetime64[M]").astype("datetime64[D]").astype(np.int64)
    following = (months + 1).astype("datetime64[M]").astype("datetime64[D]").astype(np.int64)
    return first + day - 1, ok & (day <= following - first)


def time_format(name: str, cells: list[str]) -> str | None:
    """The format of a column of times, told by its cells (stripped; missing ones left out: empty, or NA, ? and the
    other cells.MISSING_TEXTS, as encode reads a time's cells) and, for integers, its name: "iso" where every
    other cell is a date and time of that format (the text says it is a time, whatever the name); else, for a
    name with a word hour, time, date, datetime, timestamp or ts (any case; `click_time`, `eventTs`), every such
    cell eight digits that are a valid YYMMDDHH ("yymmddhh") unless every one is a date YYYYMMDD from 1970 on too
    (a `date` of 2012-03-01 to 2012-03-23, 20120301..20120323, reads as 2020-12-03 at hours 01..23, and its later
    days as no time), or ten digits, the first not 0 ("unix"); else None."""
    present = [c.strip() for c in cells if not is_missing_text(c)]
    shaped = all(_ISO_SHAPE.fullmatch(c) for c in present)  # first: the array pads every cell to the longest
    if present and shaped and iso_parts(np.array(present, dtype=np.str_))[2].all():
        return "iso"
    if not present or not _time_name(name):
        return None
    if all(_YYMMDDHH.fullmatch(c) for c in present):
        v = np.array(present, dtype=np.int64)
        return "yymmddhh" if time_parts(v.astype(np.float64), "yymmddhh")[2].all() and not _dates(v).all() else None
    return "unix" if all(_UNIX.fullmatch(c) for c in present) else None


def untold_time(name: str, cells: list[str]) -> str | None:
    """For a column named like a time (as time_format names it) that time_format reads no time of, the form every
    other cell (the missing ones left out) has that no time transform reads: "unix_ms", thirteen digits, the first
    not 0 (unix milliseconds), or "yyyymmdd", eight digits that are each a date YYYYMMDD from 1970 on; else None."""
    present = [c.strip() for c in cells if not is_missing_text(c)]
    if not present or not _time_name(name) or time_format(name, cells) is not None:
        return None
    if all(_UNIX_MS.fullmatch(c) for c in present):
        return "unix_ms"
    if all(_YYMMDDHH.fullmatch(c) for c in present) and _dates(np.array(present, dtype=np.int64)).all():
        return "yyyymmdd"
    return None


def _time_name(name: str) -> bool:
    """Whether a column's name has a word hour, time, date, datetime, timestamp or ts (any case; eventTs)."""
    return bool(_TIME_NAME.search(re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()))  # eventTs -> event_ts


def _dates(v: np.ndarray) -> np.ndarray:
    """Where int64 values of eight digits are each a date YYYYMMDD from 1970 on."""
    return _days(v // 10_000, v // 100 % 100, v % 100)[1] & (v >= 19_700_000)

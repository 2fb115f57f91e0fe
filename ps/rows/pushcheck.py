"""The values of a push checked before anything applies them: grads finite, shows and clicks in range, clicks <= shows.

One check for both sides: a shard runs it on every push it is sent (Shard.check_push), and the client on every
push it is about to send (worker.dedup.push_arrays), so that a push with a bad value is refused before any shard
gets a part of it: a push split over several shards is refused on none or applied on all, as far as its values go.
"""

from __future__ import annotations

import numpy as np

from ps.errors import NOTHING_APPLIED, InvalidArgumentError
from ps.rows.finite import first_non_finite

MAX_COUNT_PER_ID = 2**24  # shows (and clicks) of one id in one push; keeps a row's show count, and the admission
# hash's uint64(show * 16) of it, far from overflow (a table's min_count is at most 2**24 too)


def check_push_values(
    table: str, ids: np.ndarray, grads: np.ndarray, shows: np.ndarray | None, clicks: np.ndarray | None
) -> None:
    """InvalidArgumentError naming the first bad value of a push to `table` of unique ids: grads (n, dim) float32
    not finite; shows or clicks (n,) float32 (None: 1 show, 0 clicks per id) of another shape, not finite, < 0 or
    > MAX_COUNT_PER_ID; an id's clicks over its shows."""
    bad = first_non_finite(grads)
    if bad >= 0:
        bad //= grads.shape[1]
        raise InvalidArgumentError(
            f"grads for table {table!r} hold non-finite values, first at row {bad} (id {int(ids[bad])}): "
            f"{grads[bad].tolist()[:8]}; {NOTHING_APPLIED}"
        )
    for what, a in (("shows", shows), ("clicks", clicks)):
        if a is None:  # the defaults need no check
            continue
        if a.shape != (len(ids),):
            raise InvalidArgumentError(f"{what} for table {table!r} have shape {a.shape}, expected ({len(ids)},)")
        ok = (a >= 0) & (a <= MAX_COUNT_PER_ID)  # NaN fails both; numpy beats a loop that stops early here
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            if np.isfinite(a[bad]) and a[bad] >= 0:
                raise InvalidArgumentError(
                    f"{what} for table {table!r} may be at most {MAX_COUNT_PER_ID:,} per id in one push; "
                    f"position {bad} holds {float(a[bad]):g}; {NOTHING_APPLIED}"
                )
            raise InvalidArgumentError(
                f"{what} for table {table!r} must be finite and >= 0; position {bad} holds {float(a[bad])}"
            )
    if clicks is not None:  # default clicks (0) never exceed shows
        over = clicks > (1.0 if shows is None else shows)
        if over.any():
            bad = int(np.flatnonzero(over)[0])
            show = 1.0 if shows is None else float(shows[bad])
            raise InvalidArgumentError(
                f"clicks for table {table!r} exceed shows: id {int(ids[bad])} (position {bad}) has "
                f"{float(clicks[bad]):g} clicks and {show:g} shows, expected clicks <= shows; {NOTHING_APPLIED}"
            )

"""TablePush and CheckedPush: one push to a table as a request carries it, and as Shard.check_push accepted it.

ps.service decodes each push of a Push or PushBatch request into a TablePush; Shard.check_push validates it into a
CheckedPush, which Shard.apply_push applies; a sync step's contributions and their sum (ps.engine.syncsum) are
TablePushes too. (The update kernel's packed input, ps.rows.updateio.Push, is another thing: arena rows, no table.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from ps.engine.table import Table


class TablePush(NamedTuple):
    """A push of grads for ids to the table named name. shows / clicks: per id; None: 1 show and 0 clicks per id.
    add_delta: grads are deltas added to the embeddings (ps.rows.update's ADD_DELTA rule), not optimizer input."""

    name: str
    ids: np.ndarray  # uint64 (n,)
    grads: np.ndarray  # float32 (n, dim)
    shows: np.ndarray | None = None  # float32 (n,)
    clicks: np.ndarray | None = None  # float32 (n,)
    add_delta: bool = False


class CheckedPush(NamedTuple):
    """A TablePush that Shard.check_push accepted: its table, its counts filled in, its update rule."""

    table: Table
    ids: np.ndarray  # uint64 (n,)
    grads: np.ndarray  # float32 (n, table.dim)
    shows: np.ndarray  # float32 (n,)
    clicks: np.ndarray  # float32 (n,)
    rule: int  # ps.rows.update.OPTIMIZE or ADD_DELTA


def as_pushes(pushes: Sequence[TablePush | tuple]) -> list[TablePush]:
    """pushes as TablePushes; a plain tuple is read in TablePush's field order (name, ids, grads[, shows, clicks,
    add_delta])."""
    return [p if isinstance(p, TablePush) else TablePush(*p) for p in pushes]


def ids_applied(pushes: Sequence[TablePush], applied: int) -> int:
    """The ids of the last `applied` of a request's pushes: those a PushBatch applied now (a retry of a request
    applies only the pushes a crash left unapplied, which are its last ones)."""
    return sum(len(p.ids) for p in pushes[len(pushes) - applied :])

"""A sync step's sum: one worker's contribution (its push checked and copied), the sum of every contribution, what
they cost the `sync_steps` part of --memory-bytes, and the client key under which a job's sums are applied exactly
once (ps.engine.syncsteps gathers the contributions and applies the sum).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ps.engine.push import CheckedPush, TablePush
from ps.errors import NOTHING_APPLIED, NOTHING_OF_THE_STEP_APPLIED, InvalidArgumentError
from ps.rows.update import OPTIMIZE
from ps.wire import repeats_ids

if TYPE_CHECKING:
    from ps.engine.table import Table

SYNC_KEY_BIT = 1 << 63  # set in every sync key, clear in every client's (ps.service.client_key): apart
SUM_COPIES = 2  # sum_contributions' copies of what it sums, at most, its result included (tests/test_sync_memory.py)


def held_bytes(pushes: list[TablePush]) -> int:
    """Bytes a contribution's copy holds: its ids, grads, shows and clicks."""
    return sum(p.ids.nbytes + p.grads.nbytes + p.shows.nbytes + p.clicks.nbytes for p in pushes)


def step_cost(held: int) -> int:
    """What contributions holding `held` bytes take of the `sync_steps` part: themselves and their sum's copies."""
    return (1 + SUM_COPIES) * held


def sync_key(job: int) -> int:
    """The client key under which a job's sync sums are applied exactly once: a 64-bit hash of job with
    SYNC_KEY_BIT set, a key no client's PushBatch is applied under (a client that could apply a request under it
    would make the journal say the job's steps were applied)."""
    digest = hashlib.blake2b(b"sync\0" + job.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") | SYNC_KEY_BIT


def contribution(
    pushes: list[TablePush],
    check_push: Callable[[TablePush, Table | None], CheckedPush],
    tables: Sequence[Table] | None = None,
) -> list[TablePush]:
    """Copies of a sync push's pushes, shows and clicks filled in (add_delta false), each validated by
    check_push(push, its Table of tables, or None: Shard.check_push) and for repeated ids; InvalidArgumentError for
    an add_delta push (deltas are not summed across workers)."""
    out = []
    for i, p in enumerate(pushes):
        c = check_push(p, None if tables is None else tables[i])
        if c.rule != OPTIMIZE:
            raise InvalidArgumentError(f"push {i} of the batch (table {p.name!r}) is add_delta, which a sync push "
                                       f"cannot carry; {NOTHING_APPLIED}")  # fmt: skip
        if repeats_ids(c.ids):
            raise InvalidArgumentError(f"push {i} of the batch (table {p.name!r}) repeats ids; {NOTHING_APPLIED}")
        out.append(TablePush(name=p.name, ids=np.array(c.ids), grads=np.array(c.grads), shows=np.array(c.shows),
                             clicks=np.array(c.clicks)))  # fmt: skip
    return out


def sum_contributions(contributions: list[list[TablePush]], max_count: float) -> list[TablePush]:
    """One push per table, in name order, of contributions (each a list of pushes with shows and clicks, ids
    unique within each): per table the union of the ids, sorted, with grads, shows and clicks summed per id (by
    np.add.reduceat over the id's values in the order of the contributions; numpy chooses how the float32 additions
    associate, so the sum may differ in the last bit from a left-to-right one, but the same contributions in the
    same order give the same sum), and shows and clicks clipped to max_count (a push's limit per id, which
    contributions within it may sum past). Tables without ids are left out. InvalidArgumentError if a sum of
    gradients overflows float32. It allocates at most SUM_COPIES times the contributions' bytes, its result
    included: a table at a time, and one array of it at a time."""
    by_table: dict[str, list[TablePush]] = {}
    for pushes in contributions:
        for p in pushes:
            by_table.setdefault(p.name, []).append(p)
    out = [_sum_table(name, by_table[name], max_count) for name in sorted(by_table)]
    return [p for p in out if p is not None]


def _sum_table(name: str, pushes: list[TablePush], max_count: float) -> TablePush | None:
    """sum_contributions' push of one table, from its pushes in the contributions' order (None: no ids)."""
    ids = np.concatenate([p.ids for p in pushes])
    if not len(ids):
        return None
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    starts = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
    ids = ids[starts]
    grads, shows, clicks = (_summed([getattr(p, f) for p in pushes], order, starts)
                            for f in ("grads", "shows", "clicks"))  # fmt: skip
    if not np.isfinite(grads).all():
        bad = int(np.flatnonzero(~np.isfinite(grads).all(axis=1))[0])
        raise InvalidArgumentError(
            f"the sum of the workers' gradients for id {int(ids[bad])} of table {name!r} overflows float32 (each "
            f"worker's is finite; the sum is {grads[bad].tolist()[:8]}); {NOTHING_OF_THE_STEP_APPLIED}"
        )
    np.minimum(shows, max_count, out=shows)
    np.minimum(clicks, max_count, out=clicks)
    return TablePush(name=name, ids=ids, grads=grads, shows=shows, clicks=clicks)


def _summed(arrays: list[np.ndarray], order: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The per-id sums of arrays (one per contribution) concatenated, taken in order, summed from each of starts:
    one copy at a time besides the result (the concatenation is dropped once sorted)."""
    with np.errstate(over="ignore"):
        return np.add.reduceat(np.concatenate(arrays)[order], starts, axis=0)

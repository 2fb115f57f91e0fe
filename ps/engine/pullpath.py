"""PullPath: a shard's Pull and PullBatch path: a pull's tables and ids checked, its copies priced in the request
room, then its rows read while it holds that room.

The caller looks each table up once (Shard.table: TableNotFoundError) and passes that Table down, so that the reply
it sized and the rows read are of one table. A check (check_pull, check_pull_batch) reads no row: it checks that this
shard owns the ids (WrongShardError) and that the copies fit in the request room (RequestTooLargeError), and
returns their bytes, the cost the pull then takes of the room (ps.engine.room). The servicer checks a request
whole before it waits for anything, so a request refused holds nothing. Rows are read under the store's
foreground mark (ps.storage.foreground: background RocksDB writes wait for a moment without a request).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from ps.engine.room import RequestRoom, pull_batch_cost, pull_cost
from ps.engine.table import Table
from ps.storage.foreground import Foreground

T = TypeVar("T")


class PullPath:
    def __init__(self, room: RequestRoom, foreground: Foreground, check_owned: Callable[[np.ndarray], None]):
        """room: the shard's request room; foreground: its store's; check_owned(ids): the shard's check that it owns
        ids."""
        self._room = room
        self._foreground = foreground
        self._check_owned = check_owned

    def pull(
        self,
        table: Table,
        ids: np.ndarray,
        out: np.ndarray | Callable[[int, int], np.ndarray] | None = None,
        caller_gone: Callable[[], bool] | None = None,
        cost: int | None = None,
    ) -> np.ndarray:
        """(n, dim) embeddings of ids in table, written into out if given: an array, or out(n, table.dim) making
        one once the request holds its room (a reply to fill, counted in it). Checked first as check_pull does,
        unless cost is that check's, made already; caller_gone: a wait for request room ends with CallerGoneError
        once it is true (ps.engine.room). A table replaced or closed since it was looked up refuses the pull
        (ShardClosingError: Table.pull), so rows are of the table, and the dim, that the caller checked."""
        if cost is None:
            cost = self.check_pull(table, ids)
        with self._room.take(cost, caller_gone), self._foreground.serving():
            return table.pull(ids, out(len(ids), table.dim) if callable(out) else out)

    def check_pull(self, table: Table, ids: np.ndarray) -> int:
        """Checks a pull as pull runs it, reading nothing: that this shard owns its ids, and that its copies fit in
        the request room (RequestTooLargeError); returns those copies' bytes."""
        self._check_owned(ids)
        cost = pull_cost(len(ids), table.width, table.dim)
        self._room.refuse_larger(cost, len(ids), f"a Pull of {len(ids):,} ids of table {table.name!r}")
        return cost

    def check_pull_batch(
        self, pulls: list[tuple[Table, np.ndarray]], what: str = "a PullBatch", larger_runs_alone: bool = False
    ) -> int:
        """Checks pulls of (table, ids) as pull_batch runs them, reading nothing: that this shard owns their ids,
        that their copies fit in the request room (RequestTooLargeError; larger_runs_alone: a sync step's rows to
        return, which run alone, within the room's alone_limit); returns those copies' bytes."""
        cost = 0
        for table, ids in pulls:
            self._check_owned(ids)
            cost += pull_batch_cost(len(ids), table.width, table.dim)
        self._room.refuse_larger(cost, sum(len(ids) for _, ids in pulls), f"{what} of {len(pulls)} pulls",
                                 larger_runs_alone)  # fmt: skip
        return cost

    def pull_batch(
        self,
        pulls: list[tuple[Table, np.ndarray]],
        cost: int,
        encode: Callable[[list[np.ndarray]], T],
        caller_gone: Callable[[], bool] | None = None,
    ) -> T:
        """encode(the rows of each pull of (table, ids)), pulls that check_pull_batch passed and priced at cost:
        one take of that much request room for the rows and the reply encode makes of them. caller_gone, and a
        table replaced since: as pull's."""
        with self._room.take(cost, caller_gone), self._foreground.serving():
            return encode([table.pull(ids) for table, ids in pulls])

"""TableDims: the dim of each table as a Client read it, and the check of a pull's rows against it.

A Client reads a table's dim once (its create_table, or its first describe_table: a pull or push of a table it has
not read describes it) and sizes every pull and push of the table by it. Another client's CreateTable
(replace_untrained) may replace an untrained table with one of another dim meanwhile: a shard then answers a pull
with rows of the new dim, and says it (PullResponse dim). Such rows are refused (TableReplacedError), with the dim
this client read and the table's now, rather than read at the wrong size; describe_table reads the dim anew. A push
of the dim read is refused by the shard in the same words (ps.replacedstate.table_replaced), where the shard
replaced the table since it started.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from protos import ps_pb2
from ps import wire
from ps.errors import PsError
from ps.replacedstate import table_replaced


class TableReplacedError(PsError):
    """A shard answered a pull with rows of another dim than the one this client read for the table: another client
    replaced the table (CreateTable replace_untrained) with one of that dim since. Not sent again: a pull sent again
    gets rows of the same dim, which the caller's model is not built for."""

    status = "FAILED_PRECONDITION"


class TableDims:
    """Each table's dim as its client read it. describe(table): reads it from the shards (Client.describe_table,
    which notes what it read here)."""

    def __init__(self, describe: Callable[[str], object]):
        self._describe = describe
        self._dims: dict[str, int] = {}

    def of(self, table: str) -> int:
        """The table's dim as read; read first (describe) where it was not."""
        if table not in self._dims:
            self._describe(table)
        return self._dims[table]

    def note(self, table: str, dim: int) -> None:
        """Keeps dim as the table's, read from the shards (a create or a describe)."""
        self._dims[table] = dim


def read_rows(table: str, dim: int, reply: ps_pb2.PullResponse, n: int, where: str) -> np.ndarray:
    """The (n, dim) float32 rows a pull of n ids of table, sized by dim (the table's as its client read it), got from
    where ("shard 1 at H:P") in reply. TableReplacedError where the reply's dim is not dim (0: a shard that does not
    say it, taken as dim)."""
    if reply.dim and reply.dim != dim:
        said = table_replaced(table, dim, reply.dim, "the rows pulled were not returned")
        raise TableReplacedError(f"{where}: {said}")
    return wire.decode_rows(reply.rows, n, dim)

"""`python -m tests.slow_start GATE AT [ps-server flags]`: ps-server whose start waits, until the file GATE exists,
at AT: `verify` (before --verify-on-start's reading), a number K (before its journal replay applies its K-th
record) or `restore` (inside --restore, once its first batch of rows is written); or, with AT `stop`, whose stop
waits before it closes the shard (its last flush); or, with AT `warm-up`, whose warm-up (--memory-bytes) waits
inside its first push, having made the file GATE.reached. A start, a stop or
a warm-up as long as a test needs, watched from outside (health, calls, signals); nothing else differs."""

from __future__ import annotations

import os
import sys
import time

import ps.server
from ps.__main__ import main
from ps.engine import warmup
from ps.engine.shard import Shard
from ps.engine.table import Table
from ps.storage.store import Store


def wait_for(gate: str) -> None:
    while not os.path.exists(gate):
        time.sleep(0.01)  # a signal's handler runs in between, as it would between two steps of the start


def hold_replay(gate: str, at_record: int) -> None:
    """Makes Table.replay wait, before the at_record-th record (counting from 1), until the file gate exists."""
    replay, seen = Table.replay, [0]

    def held(self: Table, record) -> int:
        seen[0] += 1
        if seen[0] == at_record:
            wait_for(gate)
        return replay(self, record)

    Table.replay = held


def hold_verify(gate: str) -> None:
    """Makes the server's --verify-on-start reading wait, before it reads anything, until the file gate exists."""
    verify = ps.server.verify_data_dir

    def held(path: str, **kwargs) -> tuple[list[str], bool]:
        wait_for(gate)
        return verify(path, **kwargs)

    ps.server.verify_data_dir = held


def hold_restore(gate: str) -> None:
    """Makes a restore (--restore) wait, once its first batch of rows is written (before the stop is checked for),
    until the file gate exists."""
    import_slots, seen = Store.import_slots, [False]

    def held(self: Store, source: str, slots, names, layouts, on_written=None, **kwargs):
        def written(n: int) -> None:
            if not seen[0]:
                seen[0] = True
                wait_for(gate)
            if on_written is not None:
                on_written(n)

        return import_slots(self, source, slots, names, layouts, written, **kwargs)

    Store.import_slots = held


def hold_stop(gate: str) -> None:
    """Makes Shard.close (a stop's last step: the flush, then closing the store) wait until the file gate exists."""
    close = Shard.close

    def held(self: Shard) -> None:
        wait_for(gate)
        close(self)

    Shard.close = held


def hold_warm_up(gate: str) -> None:
    """Makes the warm-up's first push make the file gate + ".reached", then wait until the file gate exists."""
    push = warmup._push

    def held(table, ids) -> None:
        if not os.path.exists(gate + ".reached"):
            open(gate + ".reached", "w").close()
            wait_for(gate)
        push(table, ids)

    warmup._push = held


if __name__ == "__main__":
    gate, at = sys.argv[1], sys.argv[2]
    if at == "verify":
        hold_verify(gate)
    elif at == "stop":
        hold_stop(gate)
    elif at == "warm-up":
        hold_warm_up(gate)
    elif at == "restore":
        hold_restore(gate)
    else:
        hold_replay(gate, int(at))
    sys.exit(main(sys.argv[3:]))

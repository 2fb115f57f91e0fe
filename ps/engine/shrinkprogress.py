"""What a Shrink changed so far, table by table, and the refusal of one that stopped part way.

A Shrink writes its tables one after the other, each in chunks (Table.shrink), each chunk in one atomic write; it
keeps no record of how far it got. A failure part way leaves the chunks written before it shrunk, so its refusal
says which (ps.errors PARTLY_APPLIED's wording: worker.retry.may_have_run then knows the call ran, and the client
does not send it again). A Shrink sent again would decay those rows a second time, so the refusal gives one
instruction, SHRINK_NOT_AGAIN ("send no Shrink before the next one is due"): the next shrinks what this one left
(and a full disk's remedy is SHRINK_REMEDY instead of its RETRY).

A Shrink of a large table runs for minutes (its scan reads every stored row): the server logs a line every
ps.progress.LOG_EVERY_S seconds meanwhile, with the rows scanned of those the tables hold, the rate and the time left
(scanned), and Shard.shrink a final line with the time it took.

A Shrink runs with no checkpoint hold on its shard (ps.engine.hold PushHold.shrink_slot): one asked for while a hold
lasts or a save runs is refused at once, and a hold asked for while it runs is refused, saying what runs
(ShrinkProgress.running).

One Shrink runs at a time on a shard (ShrinkRunning): another sent meanwhile (a client's whose deadline passed, an
operator's) would decay the rows a second time, so it is refused (ShrinkRunningError), changing nothing, with when
the running one began and how far it got.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ps.diskfull import SHRINK_REMEDY
from ps.errors import NOTHING_APPLIED, PARTLY_APPLIED, SHRINK_NOT_AGAIN, PsError, ShrinkRunningError
from ps.partlyapplied import partly_applied
from ps.progress import LoggedCount, pace
from ps.utctime import utc

log = logging.getLogger(__name__)


class ShrinkProgress:
    """The tables of one Shrink, in the order it shrinks them, what each chunk written changed of them, and the rows
    scanned so far of those the tables held as it began."""

    def __init__(self, tables: list[str], rows: int = 0):
        """rows: the rows (and pending ids) the scan reads, those of the tables with a rule on (0: unknown)."""
        self.tables = tables
        self.done = 0  # tables shrunk whole (Shard.shrink counts them)
        self.written = dict.fromkeys(tables, 0)  # kept rows rewritten (decayed), per table
        self.dropped = dict.fromkeys(tables, 0)  # ids dropped, per table
        self.rows = rows
        self.table = tables[0] if tables else ""  # the table being scanned
        self.scan = LoggedCount(log, self._line)  # the rows scanned so far
        self.began_at = time.time()  # wall clock, for a refused Shrink's message

    def summary(self, clock: int, off: list[str]) -> str:
        """The line a Shrink's end logs: the ids dropped, the tables whose rules ran (those of `tables` not in off,
        the tables without an eviction rule, which it leaves as they were), the rows scanned and the time taken."""
        ruled = [t for t in self.tables if t not in off]
        left = f"; {len(off):,} table{'s' * (len(off) != 1)} without an eviction rule left as " + (
            "it was" if len(off) == 1 else "they were"
        )
        return (f"shrink at step {clock:,} dropped {sum(self.dropped.values()):,} ids from "
                f"{', '.join(ruled) or 'no table'} ({self.scan.done:,} rows scanned in {self.scan.took_s():.1f} s)"
                f"{left if off else ''}")  # fmt: skip

    def scanned(self, table: str, n: int) -> None:
        """Notes a chunk of n rows of table's scanned; logs the Shrink's progress every ps.progress.LOG_EVERY_S
        seconds: "shrinking: 1,200,000 of 3,000,000 rows scanned (40%), 80,000 rows/s, about 23 s left (table 't',
        1 of 2)" (a total the scan passed, rows pushed meanwhile, is shown as the count so far, with no time left)."""
        self.table = table
        self.scan.add(n)

    def _line(self, scanned: int, took_s: float) -> str:
        rows = pace(scanned, self.rows, took_s, "rows scanned", about="")
        return f"shrinking: {rows} (table {self.table!r}, {self.tables.index(self.table) + 1} of {len(self.tables)})"

    def wrote(self, table: str, written: int, dropped: int) -> None:
        """Notes a chunk of table's written: `written` kept rows rewritten, `dropped` ids deleted."""
        self.written[table] += written
        self.dropped[table] += dropped

    def changed(self, table: str) -> str:
        """What the chunks written changed of table: "1,024 rows decayed and 7 ids dropped"."""
        return f"{self.written[table]:,} rows decayed and {self.dropped[table]:,} ids dropped"

    def _of(self) -> str:
        return f"of {_listed(self.tables)}" if self.tables else "of no table"

    def running(self) -> str:
        """What this Shrink is, for the refusal of a call it keeps out while it runs (a checkpoint's hold, another
        Shrink): "a Shrink is running (of table 't', since 2026-12-07 19:41:05 UTC, 12 s ago: 8,192 of
        20,580 rows scanned so far)"."""
        total = max(self.rows, self.scan.done)
        what = self._of()
        return (f"a Shrink is running ({what}, since {utc(self.began_at)}, {self.scan.took_s():,.0f} s ago: "
                f"{self.scan.done:,} of {total:,} rows scanned so far)")  # fmt: skip

    def refusal(self, e: PsError) -> PsError | None:
        """e, the failure that stopped the Shrink, reworded to say what of the Shrink stays (ps.partlyapplied:
        its class and attributes kept; a DiskFullError's remedy RETRY becomes SHRINK_REMEDY): None where no chunk was
        written (e's own outcome stands); else with "shrink stopped" and "Of the Shrink, <the tables shrunk whole,
        the one in part (where a chunk of it was written), those not at all>: those changes were applied, and the
        clock was not advanced; <SHRINK_NOT_AGAIN>: one sent again would decay the rows shrunk already a second
        time, and the next shrinks what this one left (<the tables not shrunk whole, if any>)"."""
        if not any(self.written.values()) and not any(self.dropped.values()):
            return None
        done, rest = self.tables[: self.done], self.tables[self.done :]
        current = rest[:1] if rest and (self.written[rest[0]] or self.dropped[rest[0]]) else []
        left = rest  # the tables not shrunk whole
        rest = rest[len(current) :]  # the table it stopped in is not shrunk where no chunk of it was written
        parts = (
            [f"{_named(done)} shrunk whole ({'; '.join(f'{t!r}: {self.changed(t)}' for t in done)})"] if done else []
        )
        parts += [f"table {t!r} was shrunk in part ({self.changed(t)} so far)" for t in current]
        parts += [f"{_named(rest)} not shrunk"] if rest else []
        what_is_left = f", and the next shrinks what this one left ({_listed(left)})" if left else ""
        return partly_applied(
            e,
            "shrink stopped",
            f"Of the Shrink, {'; '.join(parts)}: those changes were {PARTLY_APPLIED}; {SHRINK_NOT_AGAIN}: "
            f"one sent again would decay the rows shrunk already a second time{what_is_left}",
            remedy=SHRINK_REMEDY,
        )


class ShrinkRunning:
    """The Shrink running on a shard, if any: one at a time."""

    def __init__(self, shard_id: int):
        self.shard_id = shard_id
        self._lock = threading.Lock()
        self.running: ShrinkProgress | None = None

    @contextmanager
    def begin(self, progress: ShrinkProgress) -> Iterator[None]:
        """Holds the shard's Shrink slot for progress's Shrink while the block runs; ShrinkRunningError, holding
        nothing, while another holds it: "shard 0: a Shrink is running (of table 't', since 2026-12-07 19:41:05 UTC,
        12 s ago: 8,192 of 20,580 rows scanned so far); one Shrink at a time: send no Shrink before the next one is
        due: one sent now would decay the rows that one shrinks a second time, and the next shrinks what it leaves;
        nothing was applied"."""
        with self._lock:
            running = self.running
            if running is None:
                self.running = progress
        if running is not None:
            raise ShrinkRunningError(self._refusal(running))
        try:
            yield
        finally:
            with self._lock:
                self.running = None

    def _refusal(self, running: ShrinkProgress) -> str:
        """The message of a Shrink refused while `running` runs."""
        return (
            f"shard {self.shard_id}: {running.running()}; one Shrink at a time: {SHRINK_NOT_AGAIN}: "
            "one sent now would decay the rows that one shrinks a second time, and the next shrinks "
            f"what it leaves; {NOTHING_APPLIED}"
        )


def _named(tables: list[str]) -> str:
    """ "table 'a' was" or "tables 'a', 'b' were"."""
    return f"{_listed(tables)} {'was' if len(tables) == 1 else 'were'}"


def _listed(tables: list[str]) -> str:
    """ "table 'a'" or "tables 'a', 'b'"."""
    return f"table {tables[0]!r}" if len(tables) == 1 else f"tables {', '.join(map(repr, tables))}"

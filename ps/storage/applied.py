"""AppliedTable: a shard's exactly-once table (each client's newest request), bounded by age and by count.

An entry maps a client key to (client_seq, parts done) of that client's newest request: ps.engine.shard's
push_batch applies a request the table already holds, or an older one, only for the parts that are missing, and
ps.engine.jobs keeps each job's sync steps under sync_key(job) (ps.engine.syncsum) the same way. Each entry also
keeps `used_s`, the wall time (time.time) its value last moved: its newest request's latest part applied. A value
that does not move (a retry answered from the table, a note of an older request) leaves the time as it was. And
`digest`, the 64-bit digest of that request's content (ps.engine.pushpath: a retry must carry the same), 0 where
it is unknown: a request of no digest (a shared key's, a sync step's sum), or one known only from a journal record,
a stored entry or a clock advance note of the versions before the digest.

Age. An entry unchanged for longer than ps.config.REQUEST_RETENTION_S is dropped at the next flush
(take_changes). A worker's Client sends no attempt of a request once its first attempt is RETRY_WINDOW_S old (the
retention less RETRY_MARGIN_S; worker.retry), and an entry's time is at or after its request's first attempt,
so a retry comes while the entry of its request (or of a later one) is kept: a dropped entry never turns a retry
into a second application. A dropped client that comes back is a new one: its next request is applied. The times
err late, never early: an entry rebuilt from the journal at replay, or read from a data dir of an older version (which
stored no times), takes the time it is rebuilt or read. A wall clock set back keeps entries longer. The risk that stays:
a wall clock set forward by more than RETRY_MARGIN_S, or an attempt that reaches its shard more than
RETRY_MARGIN_S after it was sent, can meet a dropped entry and be applied a second time.

Count. The table holds at most MAX_CLIENTS entries (plus the new clients whose first requests are in flight
together). full() says when it is reached, and the shard then refuses a new client's request
(ps.errors.ClientTableFullError, RESOURCE_EXHAUSTED, nothing applied); the clients it holds go on. It does not
drop the least recently used entry instead: that entry's client may still be retrying an acknowledged request,
which would then be applied a second time, silently, and any admitted caller that makes up client ids could
cause that for every other client. The risk of refusing: such a caller (or a bug that makes a new Client per
request) keeps new clients out, loudly, until the entries it made are REQUEST_RETENTION_S old.

Persistence. The journal rebuilds the table from its records at replay (each record carries its request's digest),
and RocksDB keeps it as of each flush, digests included:
take_changes() returns the entries changed and dropped since the last call (ps.storage.shardmeta.ShardMeta
set_flushed_seq writes just those, one key per client), and put_back() hands them back after a write that
failed. So a flush costs what changed, not the table's size.

Threads: the methods that change the table, and iteration, take the table's lock; a lookup is one dict read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from ps.config import MAX_CLIENTS, REQUEST_RETENTION_S

log = logging.getLogger(__name__)

DROP_LOG_S = 3600.0  # between the log lines of entries dropped for their age (the counts are summed meanwhile)


def _clients(n: int) -> str:
    """A count of clients as the log lines say it: "1 client", "1,500 clients"."""
    return f"{n:,} client{'s' * (n != 1)}"


def wall_time() -> float:
    """Seconds since the epoch: the clock of every entry's used_s (tests replace it)."""
    return time.time()


class Entry(NamedTuple):
    client_seq: int  # the client's newest request
    parts: int  # how many of its pushes are applied
    used_s: float  # when this entry last changed (wall_time)
    digest: int = 0  # the digest of that request's content (ps.engine.pushpath); 0: unknown


class AppliedChanges(NamedTuple):
    """What changed in an AppliedTable since the last take_changes: entries to write, and dropped clients with
    the client_seq their entry held."""

    written: dict[int, Entry]
    dropped: dict[int, int]


class AppliedTable(Mapping):
    """client -> (client_seq, parts done) of its newest request; see the module's docstring. As a Mapping it
    shows the (client_seq, parts) pairs; entry() has the time and the digest too."""

    def __init__(self, retention_s: float = REQUEST_RETENTION_S, max_clients: int = MAX_CLIENTS):
        self.retention_s = retention_s
        self.max_clients = max_clients
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently changed first
        self._changed: set[int] = set()  # clients whose entry changed since take_changes
        self._dropped: dict[int, int] = {}  # clients dropped since take_changes -> the client_seq they held
        self._unlogged = 0  # entries dropped since the last log line
        self._logged_s = float("-inf")  # monotonic time of that line

    # ---- reading ------------------------------------------------------------------------------------
    def __getitem__(self, client: int) -> tuple[int, int]:
        e = self._entries[client]
        return e.client_seq, e.parts

    def __iter__(self) -> Iterator[int]:
        with self._lock:
            return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, client: int) -> Entry | None:
        return self._entries.get(client)

    def full(self) -> bool:
        """Whether the table holds max_clients entries: a new client is to be refused."""
        return len(self._entries) >= self.max_clients

    # ---- changing -----------------------------------------------------------------------------------
    def load(self, entries: Mapping[int, tuple[int, int, float | None, int]]) -> None:
        """Adds entries read from the store, {client: (client_seq, parts, used_s, digest)}; used_s None (a store of
        an older version kept no times): now, and the entry counts as changed, so the next flush writes it; digest
        0: unknown (a store of the versions before the digest)."""
        now = wall_time()
        loaded = [(c, Entry(seq, parts, now if used is None else used, digest))
                  for c, (seq, parts, used, digest) in entries.items()]  # fmt: skip
        with self._lock:
            for client, e in sorted(loaded, key=lambda ce: ce[1].used_s):  # least recently changed first
                self._entries[client] = e
            self._changed.update(c for c, (_, _, used, _) in entries.items() if used is None)

    def note(self, client: int, client_seq: int, part: int, digest: int = 0) -> None:
        """Push `part` of request client_seq of client, of content `digest` (0: unknown), is applied (part -1: none
        of its pushes, its clock advance is): the entry moves there, stamped now, if that is past what it holds;
        else nothing changes, but for a digest of the request the entry holds where it holds none (a retry of a
        request known from before the digest: its time stays). A note of digest 0 keeps the digest the entry holds
        for that request."""
        done = (client_seq, part + 1)
        with self._lock:
            old = self._entries.get(client)
            if old is not None and (old.client_seq, old.parts) >= done:
                if digest and not old.digest and old.client_seq == client_seq:
                    self._entries[client] = old._replace(digest=digest)
                    self._changed.add(client)
                return
            if not digest and old is not None and old.client_seq == client_seq:
                digest = old.digest
            self._entries[client] = Entry(client_seq, part + 1, wall_time(), digest)
            self._entries.move_to_end(client)
            self._changed.add(client)
            self._dropped.pop(client, None)

    def take_changes(self) -> AppliedChanges:
        """Drops the entries older than retention_s, then returns (and forgets) what changed since the last
        call: the entries to write, as they are now, and the clients dropped."""
        now = wall_time()
        with self._lock:
            dropped = self._expire(now)
            changes = AppliedChanges({c: self._entries[c] for c in self._changed}, self._dropped)
            self._changed, self._dropped = set(), {}
        self._log_drops(dropped, len(self._entries))
        return changes

    def put_back(self, changes: AppliedChanges) -> None:
        """Marks take_changes' changes as not written (their write failed): the next take_changes returns them
        again, as the entries are then."""
        with self._lock:
            self._changed.update(c for c in changes.written if c in self._entries)
            for client, seq in changes.dropped.items():
                if client not in self._entries:
                    self._dropped.setdefault(client, seq)

    def _expire(self, now: float) -> int:
        """Drops entries from the least recently changed on while they are older than retention_s (an entry
        stamped before the wall clock was set back stops the scan: kept longer, never dropped early). Lock held."""
        count = 0
        while self._entries:
            client, oldest = next(iter(self._entries.items()))
            if now - oldest.used_s <= self.retention_s:
                break
            del self._entries[client]
            self._changed.discard(client)
            self._dropped[client] = oldest.client_seq
            count += 1
        return count

    def _log_drops(self, dropped: int, kept: int) -> None:
        """Logs the entries dropped for their age at most every DROP_LOG_S, summed since the last line."""
        self._unlogged += dropped
        if self._unlogged and time.monotonic() - self._logged_s >= DROP_LOG_S:
            log.info("dropped the newest requests of %s from the exactly-once table: unused for more than %.3g "
                     "days (clients stop sending a request again before that); %s kept", _clients(self._unlogged),
                     self.retention_s / 86400, _clients(kept))  # fmt: skip
            self._unlogged, self._logged_s = 0, time.monotonic()

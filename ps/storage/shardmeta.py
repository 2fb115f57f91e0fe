"""ShardMeta: a shard's own records in the "meta" column family of its RocksDB, the ones that are no table's: its
identity and cluster name, the restore marks, the model state's id, the done workers of its job, the journal's
positions (flushed_seq, lsn_high and the exactly-once `applied` table) and the clock with its advance notes.
ps.storage.meta has their keys and the grammar of their values; the tables' configs, numbers and counts, which
their rows need, are the Store's (its base ps.storage.tablecatalog.TableCatalog).

Two of its writes go into a WriteBatch the Store writes, so that they land with rows or not at all: "lsn_high" in
the batch of the rows that raised it (lsn_high_raised), and the deletes of what a restore wrote here in the batch
of Store.forget_unfinished_restore (delete_restored).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import threading
from collections.abc import Callable, Iterator

import numpy as np

from ps.errors import StorageError
from ps.storage.applied import AppliedChanges
from ps.storage.datadir import (
    OpenDataDir,
    belongs_elsewhere,
    copies_disagree,
    identity,
    lost_shard_record,
)
from ps.storage.meta import (
    ADVANCED_PREFIX,
    APPLIED_PREFIX,
    APPLIED_VALUE,
    LEGACY_APPLIED,
    STATE_ID_BITS,
    client_key,
    client_of,
    meta_value,
)
from ps.storage.options import iter_prefixed
from ps.storage.rocks import WriteBatch
from ps.storage.sidefiles import IDENTITY_FIELDS, IDENTITY_FILE, read_json, write_json

log = logging.getLogger(__name__)

JOB_DONE_REMEDY = (  # a "job_done" record that does not read: its error's remedy, and verify's note
    "the record only spares a restarted shard its waits for the finished workers of the job it follows, so there is "
    "nothing to restore: a worker that finished before the shard's start is waited for, and the record is written "
    "anew at the job's next done stamp"
)


def _drawn_state_id() -> bytes:
    """A new "state_id" value as stored: a random int in [1, 2^STATE_ID_BITS), in decimal."""
    return str(secrets.randbits(STATE_ID_BITS) or 1).encode()


class ShardMeta:
    """The records of one shard's RocksDB that are no table's, read and written by their grammar."""

    def __init__(self, data_dir: OpenDataDir, drain_rows: Callable[[], None]):
        """data_dir: the open RocksDB of the dir, its Store's, which closes it. Its write_opts serve the writes that
        --sync covers; the ones a restart must find whatever it says (identity, marks, the state id, the done
        workers) are always synced. drain_rows: returns once the rows written in the background are in RocksDB
        (set_flushed_seq waits for it)."""
        self.path = data_dir.path
        self._dir = data_dir
        self._drain_rows = drain_rows
        self._lsn_lock = threading.Lock()  # lsn_high_raised's, of every writer of rows: lsn_high only grows
        self._lsn_high: int | None = None  # "lsn_high", read by the first written_seq()
        self._legacy_applied = False  # whether the legacy single `applied` value is stored (applied() found it)

    # ---- identity and cluster --------------------------------------------------------------------------
    def check_identity(self, shard_id: int, num_shards: int) -> None:
        """Records (shard_id, num_shards) on first use, in RocksDB (synced) and then in shard.json beside it.
        StorageError if the data dir belongs to another shard, if the two copies disagree, or if shard.json is
        there and RocksDB's copy is not (RocksDB lost its latest writes). A missing shard.json is written again
        from RocksDB's copy."""
        want = identity((shard_id, num_shards))
        file_path = os.path.join(self.path, IDENTITY_FILE)
        in_file = read_json(file_path, IDENTITY_FIELDS)
        in_db = self._dir.meta_get(b"shard", "reading the shard record")
        if in_file is not None and in_db is not None and in_file != in_db:
            raise copies_disagree(in_file, in_db)
        have = in_db or in_file
        if have is not None and have != want:
            raise belongs_elsewhere(self.path, have, want)
        if in_db is None and in_file is not None:
            raise lost_shard_record(in_file)
        if in_db is None:
            with self._dir.rocksdb("recording the shard record", "nothing was recorded"):
                self._dir.meta_cf.put(b"shard", json.dumps(want).encode(), self._dir.synced)
        if in_file is None:
            if in_db is not None:
                log.warning("%s was missing; written again from RocksDB's copy of the shard record", file_path)
            write_json(file_path, want, sync_dir=True)

    def check_cluster(self, cluster: str) -> bool:
        """StorageError if the dir recorded another --cluster name than `cluster`, an empty one included; a dir that
        never ran with a name takes any. Returns whether `cluster` is still to be recorded (record_cluster): a name
        given to a dir that has none."""
        have = self._dir.meta_get(b"cluster", "reading the cluster name", "")
        if have and have != cluster:
            given = f"--cluster {cluster!r}" if cluster else "no --cluster"
            raise StorageError(
                f"data dir {self.path} belongs to cluster {have!r}, but this server was started with {given}; start "
                f"it with --cluster {have} (a dir keeps the first name it ran with; to move its rows to another "
                "cluster, restore a checkpoint into a new data dir)"
            )
        return bool(cluster) and not have

    def record_cluster(self, cluster: str) -> None:
        """Records the --cluster name of a dir that has none (check_cluster said so; synced, in RocksDB), which a
        start does once nothing else can refuse it: the dir keeps it from then on."""
        with self._dir.rocksdb("recording the cluster name", "nothing was recorded"):
            self._dir.meta_cf.put(b"cluster", cluster.encode(), self._dir.synced)
        log.info("data dir %s now belongs to cluster %r", self.path, cluster)

    # ---- restore marks and the model state's id --------------------------------------------------------
    def restore_pending(self) -> str | None:
        """The checkpoint a restore into this store started from and did not finish (None: none)."""
        return self._dir.meta_get(b"restore_pending", "reading the mark of an unfinished restore")

    def set_restore_pending(self, directory: str | None) -> None:
        """Marks the dir as holding a restore from directory, not finished; None clears the mark. Synced."""
        with self._dir.rocksdb("clearing the mark of an unfinished restore" if directory is None else
                           f"marking the dir as holding a restore from {directory}", "nothing was recorded"):  # fmt: skip
            if directory is None:
                self._dir.meta_cf.delete(b"restore_pending", self._dir.synced)
            else:
                self._dir.meta_cf.put(b"restore_pending", directory.encode(), self._dir.synced)

    def restored(self) -> dict | None:
        """The checkpoint this dir was restored from ({"checkpoint", "sha256"}), or None."""
        return self._dir.meta_get(b"restored", "reading the restore the dir began from")

    def set_restored(self, checkpoint: str, sha256: str) -> None:
        """Records the restore the dir began from, and a new state id (see state_id), in one synced write."""
        meta = self._dir.meta_handle()
        batch = WriteBatch(raw_mode=True)
        batch.put(b"state_id", _drawn_state_id(), meta)
        batch.put(b"restored", json.dumps({"checkpoint": checkpoint, "sha256": sha256}).encode(), meta)
        with self._dir.rocksdb(f"recording the restore from {checkpoint}", "nothing was recorded"):
            self._dir.db.write(batch, self._dir.synced)

    def delete_restored(self, batch: WriteBatch) -> None:
        """Adds to batch the deletes of what a restore writes here (the clock, the note of a finished restore) and
        of the mark of an unfinished one; the identity, the cluster name and the journal's positions stay."""
        meta = self._dir.meta_handle()
        for key in (b"clock", b"restored", b"restore_pending"):
            batch.delete(key, meta)

    def state_id(self) -> int:
        """The random id of the model state this dir holds ("state_id"): drawn (and stored, synced) the first time
        it is asked for, and again by set_restored; a restart keeps it, so a client that finds another one knows
        the dir was restored or replaced since it looked."""
        stored = self._dir.meta_get(b"state_id", "reading the model state's id")
        return self._new_state_id() if stored is None else stored

    def _new_state_id(self) -> int:
        value = _drawn_state_id()
        with self._dir.rocksdb("recording a new model state id", "nothing was recorded"):
            self._dir.meta_cf.put(b"state_id", value, self._dir.synced)
        return int(value)

    # ---- the job's done workers ------------------------------------------------------------------------
    def set_job_done(self, job: int, num_workers: int, done: list[int]) -> None:
        """Stores, synced, that these workers of the job (of num_workers) are done (the "job_done" record)."""
        record = json.dumps({"job": job, "num_workers": num_workers, "done": sorted(done)}).encode()
        # (the caller's message names the job, as its workers named it: ps.engine.followedjob)
        with self._dir.rocksdb(f"storing that workers {sorted(done)} of the job are done", "the done stamp is refused"):
            self._dir.meta_cf.put(b"job_done", record, self._dir.synced)

    def job_done(self, job: int, num_workers: int) -> list[int]:
        """The workers of the job (of num_workers) the "job_done" record says are done; [] where it names another
        job or worker count, or there is none. DataLossError for a record that does not read as set_job_done
        writes it: ps.engine.followedjob logs it and reads it as none (the record only spares waits)."""
        record = self._dir.meta_get(b"job_done", "reading the done workers of a job", remedy=JOB_DONE_REMEDY)
        if record is None or record["job"] != job or record["num_workers"] != num_workers:
            return []
        return record["done"]

    # ---- the journal's positions -----------------------------------------------------------------------
    def written_seq(self) -> int:
        """The largest lsn of a row RocksDB holds (its "lsn_high"; 0: none recorded): the journal record of that
        push was written, and so was every one before it."""
        if self._lsn_high is None:
            self._lsn_high = self._dir.meta_get(b"lsn_high", "reading the highest lsn written", 0)
        return self._lsn_high

    @contextlib.contextmanager
    def lsn_high_raised(self, batch: WriteBatch, lsn: np.ndarray) -> Iterator[None]:
        """A block in which the caller writes batch, a write of rows of these lsn: "lsn_high" is added to batch where
        their largest passes written_seq, and is written_seq once the block ends without an error. Writers of rows
        take turns here, so that lsn_high only grows."""
        with self._lsn_lock:
            before = self.written_seq()
            high = max(before, int(lsn.max()) if len(lsn) else 0)
            if high > before:
                batch.put(b"lsn_high", str(high).encode(), self._dir.meta_handle())
            yield
            self._lsn_high = high

    def flushed_seq(self) -> int:
        """The journal position every record up to which is in RocksDB (0: none recorded)."""
        return self._dir.meta_get(b"flushed_seq", "reading the flushed journal position", 0)

    def set_flushed_seq(self, seq: int, changes: AppliedChanges | None = None) -> None:
        """Records that every journal record <= seq is in RocksDB and (if given) the changes of the journal's
        `applied` table (AppliedTable.take_changes: entries written, dropped ones deleted) as of seq, in one write
        (durably, if the store syncs), once the rows written in the background are in RocksDB. The first one given
        changes deletes the legacy single value that applied() read: its entries must be among changes.written
        (AppliedTable.load counts them as changed)."""
        self._drain_rows()
        batch = WriteBatch(raw_mode=True)
        meta = self._dir.meta_handle()
        batch.put(b"flushed_seq", str(seq).encode(), meta)
        if changes is not None:
            for client, e in changes.written.items():
                value = APPLIED_VALUE.pack(e.client_seq, e.parts, math.ceil(e.used_s), e.digest)
                batch.put(client_key(APPLIED_PREFIX, client), value, meta)
            for client in changes.dropped:
                batch.delete(client_key(APPLIED_PREFIX, client), meta)
            if self._legacy_applied:
                batch.delete(LEGACY_APPLIED, meta)
        with self._dir.rocksdb("recording the flushed journal position"):
            self._dir.db.write(batch, self._dir.write_opts)
            if self._dir.write_opts.sync:
                self._dir.db.flush_wal(True)
        if changes is not None:
            self._legacy_applied = False

    def applied(self) -> dict[int, tuple[int, int, float | None, int]]:
        """The journal's `applied` table as the set_flushed_seq calls stored it: {client: (client_seq, parts,
        used_s, digest)}; used_s None for an entry of the legacy single value (it kept no times), digest 0 where
        none is stored (the legacy value, an entry of the versions before the digest). A client in both the legacy
        value and an `applied/` key (an older version wrote the value after this one wrote the key) gets the newer
        (client_seq, parts) of the two, with used_s None when that is the legacy one."""
        doing = "reading the exactly-once table of client requests"
        legacy = self._dir.meta_get(LEGACY_APPLIED, doing)
        if legacy is not None:
            self._legacy_applied = True
        out: dict[int, tuple[int, int, float | None, int]] = legacy or {}
        with self._dir.rocksdb(doing):
            for key, raw in iter_prefixed(self._dir.meta_cf, APPLIED_PREFIX):
                seq, parts, used, digest = meta_value(key, raw, self._dir.damaged)
                client = client_of(key, APPLIED_PREFIX)
                if client not in out or out[client][:2] <= (seq, parts):
                    out[client] = (seq, parts, float(used), digest)
        return out

    # ---- the clock -------------------------------------------------------------------------------------
    def clock(self) -> int:
        """The shard's clock (0: none stored)."""
        return self._dir.meta_get(b"clock", "reading the clock", 0)

    def set_clock(self, step: int, advanced_by: tuple[int, int, int] | None = None) -> None:
        """Stores the clock; with advanced_by = (client, client_seq, digest of the request's content, 0: none), in
        the same write, that this request of that client advanced it (advanced())."""
        meta = self._dir.meta_handle()
        batch = WriteBatch(raw_mode=True)
        batch.put(b"clock", str(step).encode(), meta)
        if advanced_by is not None:
            client, client_seq, digest = advanced_by
            batch.put(client_key(ADVANCED_PREFIX, client), f"{client_seq} {digest}".encode(), meta)
        with self._dir.rocksdb(f"storing the clock at step {step:,}"):
            self._dir.db.write(batch, self._dir.write_opts)

    def forget_advanced(self, clients: list[int]) -> None:
        """Deletes the notes of set_clock's advanced_by of these clients (whose `applied` entries were dropped)."""
        if not clients:
            return
        meta = self._dir.meta_handle()
        batch = WriteBatch(raw_mode=True)
        for client in clients:
            batch.delete(client_key(ADVANCED_PREFIX, client), meta)
        with self._dir.rocksdb("deleting the clock advance notes of clients dropped from the exactly-once table"):
            self._dir.db.write(batch, self._dir.write_opts)

    def advanced(self) -> dict[int, tuple[int, int]]:
        """client -> (the client_seq of its newest request whose clock advance is stored, set_clock; the digest of
        that request's content, 0: unknown)."""
        out = {}
        with self._dir.rocksdb("reading the clock advances of client requests"):
            for key, raw in iter_prefixed(self._dir.meta_cf, ADVANCED_PREFIX):
                out[client_of(key, ADVANCED_PREFIX)] = meta_value(key, raw, self._dir.damaged)
        return out

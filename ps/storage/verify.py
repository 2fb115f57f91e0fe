"""verify_data_dir: reads every block of a shard's data dir, changing nothing, and says what is damaged
(`ps-server verify DIR`); verify_checkpoint does the same for a checkpoint (DIR holds a manifest.json), or for one
shard's folder of it (`ps-server verify CHECKPOINT/shard-<i>`).

What it reads: every key of every RocksDB column family, with every block's checksum verified (not cached); every
meta value, read as the server reads it (ps.storage.meta's grammar: each table's config, number and counts, the
clock, the shard record, ...); each table's number, and every stored row's size against its table's layout (a
trained row's or a pending id's); the shard record in RocksDB against shard.json (ps.storage.sidefiles); every
journal record after RocksDB's flushed position, against the journal's mark, as start-up would replay them. A
finding is damaged where the server would refuse to start on it or fail a request with DATA_LOSS (a restore or an
export, in a checkpoint), and a note where it starts with a warning (a torn last journal record), reads it with a
warning as if absent (a job_done record), repairs it (a missing shard.json) or never reads it (a checkpoint's meta
values other than its tables' numbers and counts, and its rows of a table number no table config has). Rows of a
table number no table config has are damage in a data dir: a table's lost meta keys leave them, and so does a table
number that is missing or does not read (then they are most likely that table's).
"""

from __future__ import annotations

import os

from ps.checkpoint import MANIFEST, checkpoint_holding, file_checksums, load_manifest, unfinished_part, unfinished_save
from ps.errors import StorageError
from ps.storage.checkpointread import admitted_counts
from ps.storage.journal import Journal
from ps.storage.meta import COUNT_PREFIX, META_CF, TABLE_ID_PREFIX
from ps.storage.readonly import damage_at
from ps.storage.sidefiles import IDENTITY_FIELDS, IDENTITY_FILE, MARK_FILE, read_json, shard_name
from ps.storage.verifymeta import VerifyReport, meta_values, table_rows
from ps.storage.verifyscan import verify_rocksdb

AS_THE_SERVER = "run verify as the user the server runs as (nothing was checked)"


def verify_data_dir(path: str, restoring: str | None = None) -> tuple[list[str], bool]:
    """(report lines, whether anything is damaged). A checkpoint (a manifest.json and no RocksDB CURRENT file) or a
    shard's folder of one is verified as such (verify_checkpoint). A data dir holding a restore that did not finish
    is damaged (a server refuses to start on it), unless `restoring` (--restore of the start verifying it) names
    that restore's checkpoint: the start begins it over. StorageError if path is neither a shard's data dir nor a
    checkpoint, naming a checkpoint whose save has not finished (ps.checkpoint.unfinished_save), or a shard's
    folder of one, as such: it is no data dir, and no checkpoint yet."""
    if not os.path.isdir(path):
        try:
            os.stat(path)
        except PermissionError:
            raise StorageError(f"cannot read {path}: permission denied; {AS_THE_SERVER}") from None
        except FileNotFoundError:
            raise StorageError(f"{path} does not exist") from None
        raise StorageError(f"{path} is not a directory")
    checkpoint = checkpoint_holding(path)
    if checkpoint is not None:
        return verify_checkpoint(checkpoint, only=os.path.basename(os.path.abspath(path)))
    unfinished = unfinished_save(path) or unfinished_part(path)
    if unfinished is not None:
        raise StorageError(f"{path} {unfinished}")
    names = set(os.listdir(path))
    if MANIFEST in names and "CURRENT" not in names:
        return verify_checkpoint(path)
    if not names & {"CURRENT", IDENTITY_FILE, MARK_FILE}:
        raise StorageError(f"{path} is not a shard's data dir: it holds no RocksDB CURRENT file, {IDENTITY_FILE} or "
                           f"{MARK_FILE}; nor a checkpoint: it holds no {MANIFEST}")  # fmt: skip
    _check_readable(path)
    report = VerifyReport()
    found = report.found

    meta = None
    if "CURRENT" in names:
        read, meta = verify_rocksdb(path)
        for name, (count, damage) in read.items():
            if not name:
                found(False, damage)  # RocksDB does not open
            elif damage:
                found(False, f"column family {name}: {damage} (after {count:,} keys)")
            else:
                found(True, f"column family {name}: {count:,} keys read, every block's checksum verified")
    else:
        found(False, "RocksDB: its CURRENT file is missing (its files were deleted or lost)")
    if meta is None:
        report.note("shard identity and journal: not checked against RocksDB, which cannot be read")
    elif read.get(META_CF, (0, ""))[1]:  # the shard record and flushed position may be past the damage
        report.note(f"shard identity, journal and row sizes: not checked against RocksDB, whose {META_CF} column "
                    "family (the shard record, the flushed position, the tables) could not be read whole")  # fmt: skip
    else:
        meta_values(meta, report, checkpoint=False)
        dims = table_rows(meta, report, checkpoint=False)
        unreadable = meta["unreadable"]
        if b"shard" not in unreadable:  # else named above, not compared
            _identity(path, meta["shard"], report)
        if b"flushed_seq" in unreadable or b"lsn_high" in unreadable:
            report.note("journal: not checked: RocksDB's flushed position or highest lsn does not read (above), and "
                        "they say which records must be there")  # fmt: skip
        else:
            _journal(path, meta["flushed_seq"], meta["lsn_high"], dims, report)
        pending = meta["restore_pending"]
        if pending and restoring is not None and os.path.abspath(restoring) == pending:
            report.note(f"restore: a restore from {pending} did not finish; this start (--restore) begins it over")
        elif pending:  # a server refuses to start on it (ps.engine.restore.check_restored)
            found(False, f"restore: a restore from {pending} did not finish (a crash or a stop during it): start with "
                         f"--restore {pending} to start it over, or delete the dir")  # fmt: skip
    return report.finish(f"verify {path}")


def verify_checkpoint(directory: str, only: str | None = None) -> tuple[list[str], bool]:
    """(report lines, whether anything is damaged) of the checkpoint at directory, changing nothing: its manifest
    against its own sha256; per shard (only: that shard's folder alone, e.g. "shard-0"), every file against the
    manifest's sha256 and no file it does not list (what a restore checks first), then every key of its RocksDB
    read with every block's checksum verified (what a restore and an export read; a block damaged before the save
    has sha256s that match), each table's number and its rows' sizes (table_rows), and its admitted rows per table
    against the manifest's counts (an export refuses a difference). A damaged manifest is reported, and the
    shard-<i> folders there are read as RocksDB still. Every file is read from directory with its links resolved
    once, as a restore and an export read it (ps.checkpoint.pinned): through a link a save moves (a "latest"), the
    report is of the one checkpoint it led to then, named in its last line.
    StorageError if this user cannot read it (nothing was checked)."""
    given, directory = os.path.abspath(directory), os.path.realpath(directory)
    _check_readable(directory)
    report = VerifyReport()
    found = report.found

    try:
        manifest = load_manifest(directory)
    except StorageError as e:
        found(False, f"manifest: {e}")
        shards = [{"dir": name} for name in sorted(os.listdir(directory)) if name.startswith("shard-")]
        tables = None
    else:
        tables = [t["name"] for t in manifest["tables"]]
        found(True, f"manifest: {manifest['num_shards']} shard(s), clock {manifest['clock']:,}, tables "
                    f"{', '.join(tables) or 'none'}; its sha256 matches")  # fmt: skip
        shards = sorted(manifest["shards"], key=lambda shard: shard["shard_id"])
    for shard in shards:
        if only is None or shard["dir"] == only:
            _checkpoint_shard(directory, shard, tables, report)
    title = given if only is None else os.path.join(given, only)
    return report.finish(f"verify checkpoint {title}" + ("" if given == directory else f" (read at {directory})"))


def _checkpoint_shard(directory: str, shard: dict, tables: list[str] | None, report: VerifyReport) -> None:
    """The findings of one shard's folder; tables: the manifest's (None: it does not read)."""
    found, name = report.found, shard["dir"]
    path = os.path.join(directory, name)
    if not os.path.isdir(path):
        found(False, f"{name}: missing (the manifest lists it)")
        return
    if "files" in shard:
        have = file_checksums(path)
        bad = [f"{f} is missing" if f not in have else f"{f} does not match its sha256"
               for f, digest in sorted(shard["files"].items()) if have.get(f) != digest]  # fmt: skip
        bad += [f"{f} is not in the manifest (a restore refuses it)" for f in sorted(set(have) - set(shard["files"]))]
        found(not bad, f"{name}: " + ("; ".join(bad[:5]) + ("; ..." if len(bad) > 5 else "") if bad else
                                      f"{len(have)} files match the manifest's sha256"))  # fmt: skip
    read, meta = verify_rocksdb(path)
    for cf, (count, damage) in read.items():
        if not cf:
            found(False, f"{name}: {damage}")
        elif damage:
            where = damage_at(damage, directory) or "RocksDB names no file"
            found(False, f"{name}: column family {cf}: {where}: {damage} (after {count:,} keys)")
        else:
            found(True, f"{name}: column family {cf}: {count:,} keys read, every block's checksum verified")
    if meta is not None and not read.get(META_CF, (0, ""))[1]:
        meta_values(meta, report, True, f"{name}: ")
        table_rows(meta, report, True, f"{name}: ")
        # (a table whose config is stored: table_rows)
        missing = [t for t in tables or () if t not in meta["tables"] and t not in meta["numbers"]]
        if missing:
            found(False, f"{name}: its meta holds no table number for table(s) {', '.join(map(repr, missing[:10]))} "
                         "of the manifest (meta key tid/<table>): a restore of the checkpoint is refused")  # fmt: skip
    if "rows" not in shard or "" in read:
        return
    if meta is not None and any(key.startswith((TABLE_ID_PREFIX, COUNT_PREFIX)) for key in meta["unreadable"]):
        return  # named above: the counts are read with them (admitted_counts)
    try:
        held = admitted_counts(path)
    except Exception as e:  # rocksdict raises plain Exception; the read above named the damage
        found(False, f"{name}: rows per table cannot be counted: {e}")
        return
    differ = [f"{t} {held.get(t, 0):,} where the manifest says {int(n):,}" for t, n in sorted(shard["rows"].items())
              if held.get(t, 0) != int(n)]  # fmt: skip
    counted = ", ".join(f"{t} {int(n):,}" for t, n in sorted(shard["rows"].items())) or "no tables"
    found(not differ, f"{name}: admitted rows {'; '.join(differ) or f'as the manifest counts ({counted})'}")


def _identity(path: str, in_db: dict | None, report: VerifyReport) -> None:
    found = report.found
    try:
        in_file = read_json(os.path.join(path, IDENTITY_FILE), IDENTITY_FIELDS)
    except StorageError as e:
        found(False, f"shard identity: {e}")
        return
    if in_file is not None and in_db is not None:
        same = in_file == in_db
        found(same, f"shard identity: {shard_name(in_db)}" + ("" if same else f" in RocksDB, {shard_name(in_file)} "
                                                                            f"in {IDENTITY_FILE}"))  # fmt: skip
    elif in_file is not None:
        found(False, f"shard identity: {IDENTITY_FILE} says {shard_name(in_file)}, RocksDB holds no shard record (it "
                     "lost its latest writes: its write-ahead log deleted or damaged?)")  # fmt: skip
    elif in_db is not None:
        report.note(f"shard identity: {shard_name(in_db)} in RocksDB; {IDENTITY_FILE} is missing (the server "
                    "writes it again from RocksDB's copy)")  # fmt: skip
    else:
        report.note("shard identity: none recorded (a shard that never started)")


def _check_readable(path: str) -> None:
    """StorageError (not damage) if this user cannot read the dir or one of its files."""
    for root, dirs, files in os.walk(path):  # a dir it cannot list is checked as an entry of its parent
        for name in [root, *(os.path.join(root, f) for f in dirs + files)]:
            if not os.access(name, os.R_OK | (os.X_OK if os.path.isdir(name) else 0)):
                raise StorageError(f"cannot read {name}: permission denied; {AS_THE_SERVER}")


def served_now(path: str) -> bool:
    """Whether a running RocksDB (a server) holds the data dir's LOCK, as /proc/locks shows (Linux; elsewhere False):
    its flushes cut, trim and mark the journal while verify reads it. Read from /proc, not by taking the lock: closing
    a descriptor of LOCK would give up the locks this very process holds on it (POSIX)."""
    try:
        st = os.stat(os.path.join(path, "LOCK"))
        with open("/proc/locks") as f:
            held = f.read()
    except OSError:
        return False
    me = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
    return any(me in line and f" {os.getpid()} " not in line for line in held.splitlines())


LIVE = ("a server runs on this data dir (RocksDB's LOCK is held): its flushes cut, trim and mark the journal while "
        "verify reads it, so this may be no damage at all; verify the dir with its server stopped")  # fmt: skip


def _journal(path: str, flushed_seq: int, rows_seq: int, dims: dict[str, int | None], report: VerifyReport) -> None:
    """The journal records after flushed_seq as start-up reads and replays them, against the tables (their dims:
    None where unknown) RocksDB holds."""
    found = report.found
    mark_path = os.path.join(path, MARK_FILE)
    journal = Journal(os.path.join(path, "journal"), mark_path=mark_path)
    try:
        count, refusal, warning, pushed = journal.check(flushed_seq, rows_seq)
    except OSError as e:  # a segment that cannot be read: gone (a running server's trim), not a file, a disk error
        count, refusal, warning, pushed = 0, f"a journal segment cannot be read: {e}", "", {}
    if refusal and served_now(path):
        report.note(f"journal: {refusal.removesuffix('.')} ({LIVE})")
        return
    if refusal:
        found(False, f"journal: {refusal}")
    else:
        upto = "up to the journal mark" if os.path.exists(mark_path) else f"(no journal mark: {MARK_FILE} is absent)"
        found(True, f"journal: {count:,} record{'s' * (count != 1)} after record {flushed_seq:,} (RocksDB's flushed "
                    f"position), none missing {upto}")  # fmt: skip
    missing = set()
    for (table, dim), seq in sorted(pushed.items(), key=lambda item: item[1]):  # as start-up's replay refuses them
        if table not in dims and table not in missing:  # (ps.engine.shard)
            missing.add(table)
            found(False, f"journal: record {seq:,} is a push to table {table!r}, which RocksDB does not hold: "
                         "RocksDB lost its latest writes (its write-ahead log, *.log, deleted, cut short or "
                         "damaged)")  # fmt: skip
        elif dims.get(table) not in (None, dim):  # (Table.replay)
            found(False, f"journal: record {seq:,} holds grads of dim {dim} for table {table!r}, whose dim is "
                         f"{dims[table]}: the journal does not match RocksDB's tables")  # fmt: skip
    if warning:
        report.note(f"journal: start-up would log: {warning}")

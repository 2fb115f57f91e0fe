"""The checkpoint format: a manifest over every shard's RocksDB checkpoint at one cut (read by restore and export).

A checkpoint directory (written by `ps-worker checkpoint save`, see worker/checkpoint.py):
    manifest.json   manifest := {"format": 1, "num_shards": n, "num_slots": NUM_SLOTS, "clock": int,
                                 "created": "YYYY-MM-DDTHH:MM:SSZ", "pushes_held_s": float,
                                 "tables": [TableConfig.to_dict()], "shards": [shard],
                                 "positions": [position] (optional), "sha256": hex}
                    shard    := {"shard_id": i, "dir": "shard-<i>", "clock": int, "rows": {table name: rows},
                                 "files": {relative path: sha256 hex}}
    shard-<i>/      a RocksDB checkpoint of shard i (ps/storage/store.py layout), taken after a flush
clock: the largest of the shards' clocks. created: the UTC time the manifest was made, after the release.
pushes_held_s: seconds, to the millisecond, from the hold of shard 0 (held first) sent to the release of every
shard: shard 0 refuses pushes from the hold's coming, while it waits for the pushes in flight.
tables: every table every shard saved, in name order (one made during the save, which only the shards that saved
after its CreateTable hold, is not part of the cut: worker.checkpoint leaves it out, and a restore reads no other).
shards: one entry per shard_id in 0..n-1; rows: the shard's rows per table, as its checkpoint records them
(ps.storage.checkpointread.admitted_counts); files: every file under its dir. sha256: of the manifest without it
(manifest_digest). positions: the training workers' positions read from their --resume-file just before the
shards were held, where the save was given them (--record-positions; worker/resume_checkpoint.py has a position's grammar
and checks each one's fields where it reads them). Reading (load_manifest) checks format, num_slots, sha256 (a
manifest without it is refused: every save writes it), that num_shards, clock, tables and shards hang together
(each shard entry's clock and rows too: integers >= 0), and that positions, where there, are a list of objects;
read_manifest checks every file too, and that a shard's dir holds no file its entry does
not list (RocksDB would read it: a stray write-ahead log replays into the rows). created and pushes_held_s are
informational: no reader checks them (`ps-worker checkpoint save` prints pushes_held_s).

The cut: every shard stops taking pushes (waits for the ones in flight), then each flushes and checkpoints,
then all take pushes again. Every push acknowledged before the hold is in the checkpoint and none after; one
training step's pushes to two shards can fall on either side on each of them.

Restore (`ps-server --restore DIR`, ps.engine.restore, on a new data dir): shard i of n copies, from every
checkpointed shard, the rows of the slots it owns now (a slot is a key range), with their journal positions reset;
the tables, their row counts and the clock come along. Pulls then return exactly what they returned at the cut,
whatever n.

The sha256s are of the files as saved (hard links to the shard's live SSTs): a block damaged before the save has
matching ones. A save does not read the blocks (docs/reliability.md has the measured cost); `ps-server verify
CHECKPOINT` (ps.storage.verify.verify_checkpoint) does, and a restore or an export that meets such a block stops
with a CheckpointDamagedError naming the file and offset (ps.storage.readonly).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import reprlib

from ps.errors import StorageError
from ps.sharding import NUM_SLOTS, SlotMap
from ps.storage.atomicfile import write_text_whole

MANIFEST = "manifest.json"
FORMAT = 1
# what a save writes into its directory before its manifest: the shards' folders, RocksDB's shard-<i>.tmp while it
# writes one, write_manifest's temporary file
SAVE_PARTS = re.compile(r"shard-\d+(?:\.tmp)?|manifest\.json\.(?:\w+\.)?tmp")


def unfinished_save(directory: str) -> str | None:
    """What directory holds, where it holds what a save writes and no manifest (a save into it runs now, or one was
    killed or failed there), said as "holds an unfinished checkpoint (...)"; else None (no such dir, an empty one,
    a checkpoint, or one holding anything else)."""
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return None
    if not entries or MANIFEST in entries or not all(SAVE_PARTS.fullmatch(e) for e in entries):
        return None
    shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
    return (f"holds an unfinished checkpoint ({shown}; no {MANIFEST}, which a save writes last, once every shard saved "
            "its part): a save into it runs now, or one was killed or failed there. Nothing can restore, export or "
            "verify it: give a checkpoint whose save finished")  # fmt: skip


# what a data dir holds and a checkpoint's shard folder never does (a RocksDB checkpoint holds RocksDB's files only):
# its journal, its shard identity (shard.json, written as a start begins, before a restore copies), its journal mark
# (ps.storage.sidefiles' IDENTITY_FILE and MARK_FILE: named here, as this module imports no storage layer)
DATA_DIR_PARTS = ("journal", "shard.json", "journal-mark.json")


def unfinished_part(path: str) -> str | None:
    """unfinished_save's words, naming the checkpoint, where path is a shard's folder (shard-<i>, holding none of
    DATA_DIR_PARTS) of a directory holding an unfinished checkpoint; else None. A data dir named shard-<i> alone in
    its parent (/data/shard-0) whose start stopped before it made its journal (a --restore killed mid-copy) holds
    shard.json: it is a data dir."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    if not re.fullmatch(r"shard-\d+", name) or any(os.path.exists(os.path.join(path, n)) for n in DATA_DIR_PARTS):
        return None
    said = unfinished_save(parent)
    return None if said is None else f"is a shard's folder of {parent}, which {said}"


def file_checksums(path: str) -> dict[str, str]:
    """sha256 of every file under path, by relative name."""
    out = {}
    for root, _, files in os.walk(path):
        for name in sorted(files):
            full = os.path.join(root, name)
            h = hashlib.sha256()
            with open(full, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            out[os.path.relpath(full, path)] = h.hexdigest()
    return out


def checkpoint_holding(path: str) -> str | None:
    """The checkpoint directory whose shard folder path is (its parent's manifest lists it as a shard's dir, and
    it holds no journal, as a data dir does), else None: a server started on one would change the checkpoint's
    files."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    if not name.startswith("shard-") or os.path.exists(os.path.join(path, "journal")):
        return None
    try:
        with open(os.path.join(parent, MANIFEST)) as f:
            manifest = json.load(f)
        listed = {shard.get("dir") for shard in manifest["shards"] if isinstance(shard, dict)}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return parent if name in listed else None


def checkpoint_folder_around(path: str) -> str | None:
    """The shard folder of a checkpoint (checkpoint_holding) that path is or lies inside, symbolic links resolved,
    else None: a data dir there would add files to the checkpoint, which a restore, an export and `ps-server
    verify` then refuse as damaged (read_manifest)."""
    path = os.path.realpath(path)  # a link on the way may lead into the checkpoint
    while True:
        if checkpoint_holding(path) is not None:
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def inside_a_checkpoint(directory: str, below: str) -> str | None:
    """The directory, or the nearest of its parents below `below` ("": the file system's root), that holds a
    checkpoint's manifest or a RocksDB directory (its CURRENT file), else None: a checkpoint saved there would mix
    its files with theirs."""
    root = os.path.abspath(below or os.sep)
    path = os.path.abspath(directory)
    while path != root and os.path.dirname(path) != path:
        if any(os.path.exists(os.path.join(path, name)) for name in (MANIFEST, "CURRENT")):
            return path
        path = os.path.dirname(path)
    return None


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's JSON without its "sha256" key (keys sorted, no spaces)."""
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_manifest(directory: str, manifest: dict) -> dict:
    """Writes manifest (the grammar above, without sha256) as directory/manifest.json, its sha256 added, whole or
    not at all, also after a power loss (ps.storage.atomicfile: a temporary file manifest.json.<random>.tmp,
    fsynced, renamed, the directory fsynced); readable by other users (the servers restore from it). Returns it
    with the sha256. OSError if it cannot be written."""
    manifest = {**manifest, "sha256": manifest_digest(manifest)}
    write_text_whole(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1), sync_dir=True,
                     temp_prefix=MANIFEST + ".", shared=True)  # fmt: skip
    return manifest


def _check_structure(manifest: dict, path: str) -> None:
    """StorageError naming what is wrong for a manifest whose entries do not hang together (see the grammar)."""
    from ps.config import TableConfig

    def bad(what: str) -> StorageError:
        return StorageError(f"checkpoint manifest {path} {what}; the checkpoint is damaged (or was edited)")

    n, clock, tables, shards = (manifest.get(k) for k in ("num_shards", "clock", "tables", "shards"))
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise bad(f"has num_shards {n!r}, expected an integer >= 1")
    if not isinstance(clock, int) or isinstance(clock, bool) or clock < 0:
        raise bad(f"has clock {clock!r}, expected an integer >= 0")
    if not isinstance(tables, list) or not isinstance(shards, list):
        raise bad("lacks its list of tables or of shards")
    names = []
    for t in tables:
        try:
            names.append(TableConfig.from_dict(t).name)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise bad(f"holds a table it cannot read ({type(e).__name__}: {e})") from None
    if len(set(names)) != len(names):
        raise bad(f"lists a table twice: {sorted(x for x in set(names) if names.count(x) > 1)}")
    for i, shard in enumerate(shards):
        shard_id = shard.get("shard_id") if isinstance(shard, dict) else None
        if not isinstance(shard_id, int) or isinstance(shard_id, bool) or not isinstance(shard.get("files"), dict):
            raise bad(f"has a shard entry {i} it cannot read (a shard_id and its files)")
        if shard.get("dir") != f"shard-{shard_id}":
            raise bad(f"has shard entry {i} of shard_id {shard_id} in dir {shard.get('dir')!r}, "
                      "expected shard-<shard_id>")  # fmt: skip
        wrong = _wrong_counts(shard)
        if wrong:
            raise bad(f"has shard entry {i} (shard_id {shard_id}) with {wrong}")
    ids = sorted(shard["shard_id"] for shard in shards)
    if ids != list(range(n)):
        raise bad(f"lists shards {ids[:20]} for num_shards {n}, expected each of 0..{n - 1} once")
    positions = manifest.get("positions", [])  # their fields: worker/resume_checkpoint.py
    if not isinstance(positions, list) or not all(isinstance(p, dict) for p in positions):
        raise bad(f"has positions {reprlib.repr(positions)}, expected a list of objects")


def _wrong_counts(shard: dict) -> str | None:
    """What is wrong with a shard entry's clock and rows (the grammar: an integer >= 0, and {table name: an integer
    >= 0}), said as "<field> <value>, expected ..."; None where nothing is."""

    def count(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    clock, rows = shard.get("clock"), shard.get("rows")
    if not count(clock):
        return f"clock {reprlib.repr(clock)}, expected an integer >= 0"
    if not isinstance(rows, dict):
        return f"rows {reprlib.repr(rows)}, expected an object {{table name: rows}}"
    wrong = [(name, n) for name, n in rows.items() if not count(n)]
    if wrong:
        return f"rows {reprlib.repr(wrong[0][1])} of table {wrong[0][0]!r}, expected an integer >= 0"
    return None


def load_manifest(directory: str) -> dict:
    """The manifest, checked against its own checksum and for entries that hang together (StorageError if not;
    one that is not whole JSON, cut short or empty, is called damaged like any other); the shards' files are not
    read."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        if not os.path.isdir(directory):
            raise StorageError(f"checkpoint {directory} does not exist (or is not a directory)") from None
        unfinished = unfinished_save(directory)
        if unfinished is not None:
            raise StorageError(f"checkpoint {directory} {unfinished}") from None
        raise StorageError(f"{directory} is not a checkpoint: it has no {MANIFEST}") from None
    except ValueError as e:  # not JSON (UnicodeDecodeError included): cut short, or empty
        raise StorageError(f"checkpoint manifest {path} is not whole JSON ({e}); the checkpoint is damaged (or its "
                           "save was cut short)") from None  # fmt: skip
    except OSError as e:
        raise StorageError(f"checkpoint manifest {path} cannot be read: {e}") from None
    if not isinstance(manifest, dict):
        raise StorageError(f"checkpoint manifest {path} is not a JSON object; the checkpoint is damaged")
    if "sha256" not in manifest:
        raise StorageError(f"checkpoint manifest {path} has no checksum of itself (sha256): it was edited, or saved by "
                           "a sparseps before manifests carried one; its files cannot be checked, so it is not read")  # fmt: skip
    if manifest["sha256"] != manifest_digest(manifest):
        raise StorageError(f"checkpoint manifest {path} does not match its checksum (sha256); the checkpoint is "
                           "damaged (or the manifest was edited)")  # fmt: skip
    if manifest.get("format") != FORMAT or manifest.get("num_slots") != NUM_SLOTS:
        raise StorageError(f"checkpoint {directory} has format {manifest.get('format')} and "
                           f"{manifest.get('num_slots')} slots; this server reads format {FORMAT}, {NUM_SLOTS} slots")  # fmt: skip
    _check_structure(manifest, path)
    return manifest


def read_manifest(directory: str) -> dict:
    """load_manifest, with every file of every shard checked against its checksum, and no other file there
    (StorageError if not)."""
    path = os.path.realpath(directory)  # the manifest and the files of one checkpoint, though a link moves
    manifest = load_manifest(path)
    for shard in manifest["shards"]:
        shard_dir = os.path.join(path, shard["dir"])
        if not os.path.isdir(shard_dir):  # the folder named, as verify names it, not its first file
            what = "is not a directory" if os.path.lexists(shard_dir) else "is missing"
            raise StorageError(f"checkpoint {directory}: {shard['dir']} {what} (the manifest lists it as shard "
                               f"{shard['shard_id']}'s folder); the checkpoint is damaged")  # fmt: skip
        try:
            have = file_checksums(shard_dir)
        except OSError as e:
            raise StorageError(f"checkpoint {directory}: cannot read {shard['dir']}: {e}") from None
        if not shard["files"]:
            raise StorageError(f"checkpoint {directory}: its manifest lists no file of {shard['dir']}; the checkpoint "
                               "is damaged")  # fmt: skip
        for name, digest in shard["files"].items():
            if have.get(name) != digest:
                what = "is missing" if name not in have else "does not match its checksum"
                raise StorageError(f"checkpoint {directory}: {shard['dir']}/{name} {what}; the checkpoint is damaged")
        extra = sorted(set(have) - set(shard["files"]))
        if extra:  # RocksDB would read them: a write-ahead log there replays into every restore and export
            raise StorageError(f"checkpoint {directory}: {shard['dir']} holds files its manifest does not list "
                               f"({', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''}): files were added after "
                               "the save; remove them (or restore from another checkpoint)")  # fmt: skip
    return manifest


def pinned(directory: str, manifest: dict | None = None) -> tuple[str, dict]:
    """(the path of the checkpoint at directory with every symbolic link resolved, its manifest): a restore or an
    export reads every file from that path, so that it reads one checkpoint whole where directory is a link that
    moves to another meanwhile (a "latest" each save moves). manifest: the one read_manifest read at directory
    before (as a start checks it), which must be the one there now: StorageError, naming where directory leads
    now, if not; None: read_manifest there."""
    path = os.path.realpath(directory)
    if manifest is None:
        return path, read_manifest(path)
    if os.path.isdir(path) and load_manifest(path)["sha256"] != manifest["sha256"]:  # (gone: the copy says so)
        raise StorageError(f"--restore {directory} names another checkpoint than the one checked as the start began "
                           f"(it names {path} now: a link moved?); nothing was restored: start again, which "
                           "checks the checkpoint it names then")  # fmt: skip
    return path, manifest


def table_patterns(text: str) -> list[str]:
    """The table names or fnmatch patterns of an export's --tables (comma-separated, spaces around each dropped);
    ValueError when it names none."""
    patterns = [t.strip() for t in text.split(",") if t.strip()]
    if not patterns:
        raise ValueError(f"--tables {text!r} names no table: give table names or patterns, or leave it out")
    return patterns


def slot_range(shard_id: int, num_shards: int) -> tuple[int, int]:
    """[lo, hi) of the slots shard_id of num_shards owns (contiguous ranges, as SlotMap.contiguous)."""
    slots = SlotMap.contiguous(num_shards).slots_of_shard(shard_id)
    return int(slots[0]), int(slots[-1]) + 1

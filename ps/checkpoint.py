"""The checkpoint format: a manifest over every shard's RocksDB checkpoint at one cut (read by restore and export).

A checkpoint directory (written by `ps-worker checkpoint save`, see worker/checkpoint.py):
    manifest.json      {"format": 1, "num_shards", "num_slots", "clock", "created",
                        "tables": [TableConfig.to_dict()], "shards": [{"shard_id", "dir", "clock", "rows",
                        "files": {name: sha256}}]}
    shard-<i>/         a RocksDB checkpoint of shard i (ps/storage/store.py layout), taken after a flush

The cut: every shard stops taking pushes (waits for the ones in flight), then each flushes and checkpoints,
then all take pushes again. Every push acknowledged before the hold is in the checkpoint and none after; one
training step's pushes to two shards can fall on either side on each of them.

Restore (`ps-server --restore DIR`, ps.engine.restore, on a new data dir): shard i of n copies, from every checkpointed shard, the
rows of the slots it owns now (a slot is a key range), with their journal positions reset; the tables, their
row counts and the clock come along. Pulls then return exactly what they returned at the cut, whatever n.
"""

from __future__ import annotations

import hashlib
import json
import os

from ps.errors import StorageError
from ps.sharding import NUM_SLOTS, SlotMap

MANIFEST = "manifest.json"
FORMAT = 1


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


def read_manifest(directory: str) -> dict:
    """The manifest, with every file of every shard checked against its checksum (StorageError if not)."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise StorageError(f"{directory} is not a checkpoint: it has no {MANIFEST}") from None
    except (OSError, ValueError) as e:
        raise StorageError(f"checkpoint manifest {path} cannot be read: {e}") from None
    if manifest.get("format") != FORMAT or manifest.get("num_slots") != NUM_SLOTS:
        raise StorageError(f"checkpoint {directory} has format {manifest.get('format')} and "
                           f"{manifest.get('num_slots')} slots; this server reads format {FORMAT}, {NUM_SLOTS} slots")  # fmt: skip
    for shard in manifest["shards"]:
        shard_dir = os.path.join(directory, shard["dir"])
        have = file_checksums(shard_dir) if os.path.isdir(shard_dir) else {}
        for name, digest in shard["files"].items():
            if have.get(name) != digest:
                what = "is missing" if name not in have else "does not match its checksum"
                raise StorageError(f"checkpoint {directory}: {shard['dir']}/{name} {what}; the checkpoint is damaged")
    return manifest


def slot_range(shard_id: int, num_shards: int) -> tuple[int, int]:
    """[lo, hi) of the slots shard_id of num_shards owns (contiguous ranges, as SlotMap.contiguous)."""
    slots = SlotMap.contiguous(num_shards).slots_of_shard(shard_id)
    return int(slots[0]), int(slots[-1]) + 1

"""Checkpoints: every shard's rows at one cut, and restoring them onto any number of shards.

A checkpoint directory (written by `ps-worker checkpoint save`, see worker/checkpoint.py):
    manifest.json      {"format": 1, "num_shards", "num_slots", "clock", "created",
                        "tables": [TableConfig.to_dict()], "shards": [{"shard_id", "dir", "clock", "rows",
                        "files": {name: sha256}}]}
    shard-<i>/         a RocksDB checkpoint of shard i (ps/store.py layout), taken after a flush

The cut: every shard stops taking pushes (waits for the ones in flight), then each flushes and checkpoints,
then all take pushes again. Every push acknowledged before the hold is in the checkpoint and none after; one
training step's pushes to two shards can fall on either side on each of them.

Restore (`ps-server --restore DIR`, on a new data dir): shard i of n copies, from every checkpointed shard, the
rows of the slots it owns now (a slot is a key range), with their journal positions reset; the tables, their
row counts and the clock come along. Pulls then return exactly what they returned at the cut, whatever n.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from ps.config import TableConfig
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


def check_restored(store) -> None:
    """StorageError if a restore into this store started and did not finish (a crash in the middle)."""
    pending = store.restore_pending()
    if pending:
        raise StorageError(f"data dir {store.path} holds a restore from {pending} that did not finish; delete the "
                           "data dir and restore again")  # fmt: skip


def restore_into(store, directory: str, shard_id: int, num_shards: int) -> dict:
    """Fills an empty store with this shard's part of the checkpoint at directory; returns a summary."""
    check_restored(store)
    manifest = read_manifest(directory)
    if store.load_tables():
        raise StorageError(f"--restore needs a new or empty data dir; {store.path} has tables already")
    tables = [TableConfig.from_dict(t) for t in manifest["tables"]]
    store.set_restore_pending(os.path.abspath(directory))  # cleared once every row is in: see check_restored
    for cfg in tables:
        store.create_table(cfg)
    slots = slot_range(shard_id, num_shards)
    rows = {cfg.name: {"admitted": 0, "pending": 0} for cfg in tables}
    for shard in manifest["shards"]:
        copied = store.import_slots(os.path.join(directory, shard["dir"]), slots, [t.name for t in tables])
        for name, counts in copied.items():
            for k, v in counts.items():
                rows[name][k] += v
    store.set_clock(int(manifest["clock"]))
    store.flush()
    store.set_restore_pending(None)
    store.flush()
    return {"tables": rows, "clock": int(manifest["clock"]), "slots": slots, "from_shards": len(manifest["shards"])}


def export(directory: str, out: str, since: int | None = None) -> dict:
    """Writes the model in the checkpoint at directory for serving, to out/: per table `<table>.ids.npy` (uint64)
    and `<table>.rows.npy` (float32 (n, dim): embeddings only, no optimizer state), admitted rows only, and
    `export.json` (tables, dims, row counts, the checkpoint's clock). since: only rows pushed at clock step
    >= since (a delta to apply over an earlier export). Dense parameters are tables too: `dense.<name>` row i
    is row i of the matrix."""
    from ps.layout import LAST_STEP, layout_of
    from ps.store import Store

    manifest = read_manifest(directory)
    os.makedirs(out, exist_ok=True)
    summary = {"clock": manifest["clock"], "since": since, "checkpoint": os.path.abspath(directory), "tables": {}}
    for t in manifest["tables"]:
        cfg = TableConfig.from_dict(t)
        layout = layout_of(cfg.dim, cfg.optimizer.name)
        ids_parts, rows_parts = [], []
        for shard in manifest["shards"]:
            for ids, rows in Store.read_table(os.path.join(directory, shard["dir"]), cfg.name, layout.width):
                if since is not None:
                    keep = rows[:, layout.stats_col + LAST_STEP] >= since
                    ids, rows = ids[keep], rows[keep]
                ids_parts.append(ids)
                rows_parts.append(rows[:, : cfg.dim])
        ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, np.uint64)
        rows = np.concatenate(rows_parts) if rows_parts else np.zeros((0, cfg.dim), np.float32)
        order = np.argsort(ids, kind="stable")
        np.save(os.path.join(out, f"{cfg.name}.ids.npy"), ids[order])
        np.save(os.path.join(out, f"{cfg.name}.rows.npy"), rows[order])
        summary["tables"][cfg.name] = {"dim": cfg.dim, "rows": int(len(ids))}
    with open(os.path.join(out, "export.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary

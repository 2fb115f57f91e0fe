"""`ps-worker checkpoint save`: a checkpoint of every shard at one cut, with a manifest (format: ps/checkpoint.py).

hold on every shard, one after another in shard order (each stops taking pushes once those in flight are done;
pushes sent meanwhile get UNAVAILABLE and clients retry them; a shard another checkpoint holds refuses at once,
FAILED_PRECONDITION) -> save on every shard (flush, RocksDB checkpoint to DIR/shard-<i>) -> release on every shard
held, also if anything failed -> write DIR/manifest.json. The servers write only inside their
--checkpoint-root (ps.service.checkpoint_dir), and this worker writes the manifest: DIR is sent as an absolute path
(a relative one is taken from this worker's working directory), so it must lie inside that root under the same
path here and on the servers (one machine, or a volume shared at the same path).
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from protos import ps_pb2
from ps import codec
from ps.checkpoint import FORMAT, MANIFEST, manifest_digest
from ps.sharding import NUM_SLOTS
from worker.flags import check_new_dir

if TYPE_CHECKING:
    from worker.client import Client

NEW_DIR = "give a new or empty directory (a checkpoint is never written over another, nor beside other files)"


def save(client: Client, directory: str, hold_timeout_s: float = 120.0) -> dict:
    """Checkpoints every shard the client knows into directory (new or empty, and inside the servers'
    --checkpoint-root); returns the manifest. ValueError, before any shard is held, for a directory that holds
    a checkpoint or any other file."""
    directory = os.path.abspath(directory)
    if os.path.exists(os.path.join(directory, MANIFEST)):
        raise ValueError(f"{directory} holds a checkpoint already; give a new directory")
    check_new_dir("checkpoint dir", directory, NEW_DIR)
    n = len(client.servers)
    started = time.monotonic()
    tokens: list[str] = []  # of the shards held so far, in shard order
    try:
        for shard in range(n):  # in shard order: two saves at once never hold a shard each and wait on the other
            hold = ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=hold_timeout_s)
            tokens.append(client._call_many("Checkpoint", [shard], [hold])[0].token)
        held = time.monotonic()
        replies = client._call_all(
            "Checkpoint", [ps_pb2.CheckpointRequest(phase="save", dir=directory, token=t) for t in tokens]
        )
    finally:  # every hold taken is released, whatever failed
        client._call_many("Checkpoint", list(range(len(tokens))),
                          [ps_pb2.CheckpointRequest(phase="release", token=t) for t in tokens])  # fmt: skip
    shards = [json.loads(r.shard_json) for r in replies]
    names = sorted({name for s in shards for name in s["rows"]})
    tables = [codec.table_config_from_proto(client.describe_table(name)[0].spec).to_dict() for name in names]
    manifest = {
        "format": FORMAT,
        "num_shards": n,
        "num_slots": NUM_SLOTS,
        "clock": max(s["clock"] for s in shards),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pushes_held_s": round(time.monotonic() - held, 3),
        "tables": tables,
        "shards": shards,
    }
    manifest["sha256"] = manifest_digest(manifest)
    tmp = os.path.join(directory, MANIFEST + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1)
        os.replace(tmp, os.path.join(directory, MANIFEST))
    except OSError as e:
        raise OSError(
            f"the shards saved their files in {directory}, but writing its {MANIFEST} failed ({e}): "
            "without it the checkpoint cannot be restored; remove the directory and save again"
        ) from e
    manifest["seconds"] = round(time.monotonic() - started, 3)
    return manifest

"""`ps-worker checkpoint save`: a checkpoint of every shard at one cut, with a manifest (format: ps/checkpoint.py).

hold on shard 0, then on the others at once (each stops taking pushes once those in flight are done; pushes sent
meanwhile get UNAVAILABLE and clients retry them; a shard another checkpoint holds, or one a Shrink runs on, refuses
at once, FAILED_PRECONDITION, not sent again: of two saves at once, the one that holds shard 0 goes on) -> save on every shard (flush,
RocksDB checkpoint to DIR/shard-<i>) -> release on every shard held, also if anything failed -> write
DIR/manifest.json. A Ctrl-C or SIGTERM that stops it ends with a line saying what DIR holds and which shards take
pushes again (worker/checkpoint_left.py). The servers write only inside their
--checkpoint-root (ps.service.checkpoint_dir), and this worker writes the manifest: DIR is sent as an absolute path
(a relative one is taken from this worker's working directory), so it must lie inside that root under the same
path here and on the servers (one machine, or a volume shared at the same path).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from protos import ps_pb2
from ps import codec
from ps.checkpoint import FORMAT, MANIFEST, SAVE_PARTS, write_manifest
from ps.config import DEFAULT_HOLD_S
from ps.errors import ModelStateReplacedError, PsError
from ps.replacedstate import READ_REFUSED, how_replaced, model_state_replaced
from ps.sharding import NUM_SLOTS
from ps.storage.leftovers import size_bytes
from ps.terminate import signal_behind, stopped_by_signal
from worker.channels import check_cluster
from worker.checkpoint_left import SaveProgress, note_parts_left
from worker.flags import check_new_dir
from worker.tables import cluster_damage, untrained_on_some_shards

if TYPE_CHECKING:
    from worker.client import Client


def _hold(client: Client, shard: int, hold_timeout_s: float, tokens: dict[int, str], state_id: int) -> None:
    """Holds shard, which must hold model state state_id (its token into tokens)."""
    hold = ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=hold_timeout_s, state_id=state_id)
    tokens[shard] = client.checkpoint({shard: hold})[0].token


NEW_DIR = "give a new or empty directory (a checkpoint is never written over another, nor beside other files)"


def check_save_dir(name: str, directory: str) -> None:
    """ValueError naming `name` unless directory is new or empty. One holding what a save writes and no manifest
    (shard-<i>/, RocksDB's shard-<i>.tmp/, manifest.json.<random>.tmp) is named an unfinished checkpoint, with its
    size: a save killed mid-way left it, or one runs into it now (which nobody can tell from here, so it is left as
    it is); nothing can restore it, and its hard links keep the shards' old SST files on disk."""
    entries = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    if entries and all(SAVE_PARTS.fullmatch(e) for e in entries):
        size = sum(size_bytes(os.path.join(directory, e)) for e in entries)
        shown = ", ".join(entries[:4]) + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")
        raise ValueError(
            f"{name} {directory} holds an unfinished checkpoint ({shown}: {size:,} bytes, no {MANIFEST}): a "
            "`ps-worker checkpoint save` killed mid-way left it, or one is saving into it now. Nothing can restore "
            "it; once no save runs into it, delete it (its hard links keep the shards' old SST files on disk), or "
            "give a new or empty directory"
        )
    check_new_dir(name, directory, NEW_DIR)


def save(
    client: Client,
    directory: str,
    hold_timeout_s: float = DEFAULT_HOLD_S,
    tables: set[str] | None = None,
    temporary: bool = False,
    positions: Callable[[], list[dict]] | None = None,
    released: Callable[[], None] | None = None,
) -> dict:
    """Checkpoints every shard the client knows into directory (new or empty, and inside the servers'
    --checkpoint-root); returns the manifest. PsError, before any shard is held, unless the client's servers are
    every shard of the cluster in shard order (Client.wait_ready's check). ValueError, before any hold, for a
    directory that holds a checkpoint or any other file, for shards that lost a trained table or were restored
    from different checkpoints (worker.tables.cluster_damage), or for a table some shards lack
    (untrained_on_some_shards: its manifest entry is described by every shard); tables: look only at these for
    such a table, for a checkpoint that is read for them alone, an export's. A failure once the shards began to
    save says what they left in directory (note_parts_left), unless temporary: the caller removes directory when
    the save fails (an export's fresh checkpoint, whose leftovers the next export removes), so the error says
    nothing of what is in it. A table made during the save is left out of the manifest, or refused (ValueError)
    where a shard saved rows of it (_made_during_the_save). positions: read just before the hold of shard 0, the
    training positions the manifest records (worker/resume_checkpoint.py; an error it raises fails the save before
    any shard is held). released: called once every shard saved and every hold was
    released (the servers take pushes again), as the save goes on to its manifest."""
    directory = os.path.abspath(directory)
    state_ids = _check_before_holding(client, directory, tables)
    progress = SaveProgress(None if temporary else directory, hold_timeout_s or DEFAULT_HOLD_S, released)
    try:
        return _save_held(client, directory, state_ids, tables, progress, positions)
    except BaseException as e:
        signal_error = signal_behind(e)  # a Ctrl-C or SIGTERM, or an error that carries one (numba's SystemError)
        if signal_error is not None:  # its last line (ps.terminate.exit_code) says what the save left
            signal_error.add_note(progress.stopped_words())
        raise


def _save_held(client: Client, directory: str, state_ids: list[int], tables: set[str] | None, progress: SaveProgress,
               positions: Callable[[], list[dict]] | None) -> dict:  # fmt: skip
    """save's work from the first hold on, progress kept as it goes; returns the manifest."""
    parts_in = progress.directory  # where a failure's error says what the shards left
    started = time.monotonic()
    held_s, replies, recorded = _hold_and_save(client, directory, state_ids, progress, positions)
    n = len(state_ids)
    shards = [json.loads(r.shard_json) for r in replies]
    _check_parts_seen(directory, shards)
    for left_out in _made_during_the_save(shards, tables, parts_in):  # not part of the cut: nowhere in the manifest
        for shard in shards:
            shard["rows"].pop(left_out, None)
    configs = _table_configs(client, n, shards, tables, parts_in)
    manifest = {
        "format": FORMAT,
        "num_shards": n,
        "num_slots": NUM_SLOTS,
        "clock": max(s["clock"] for s in shards),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pushes_held_s": round(held_s, 3),
        "tables": configs,
        "shards": shards,
        **({} if recorded is None else {"positions": recorded}),
    }
    try:
        manifest = write_manifest(directory, manifest)
    except OSError as e:
        raise OSError(
            f"the shards saved their files in {directory}, but writing its {MANIFEST} failed ({e}): "
            "without it the checkpoint cannot be restored; remove the directory and save again"
        ) from e
    manifest["seconds"] = round(time.monotonic() - started, 3)
    return manifest


def _check_before_holding(client: Client, directory: str, tables: set[str] | None) -> list[int]:
    """save's refusals before any shard is held: ValueError for a directory that holds a checkpoint or any other
    file, for shards that lost a trained table or were restored from different checkpoints, or for a table some
    shards lack (of tables, where given); PsError for a server list that is not the cluster's shards in shard order
    (worker.channels.check_cluster: a list missing a shard would save a checkpoint of fewer shards, which restores
    as a whole model without that shard's rows); ModelStateReplacedError for a shard replaced since the client read
    it at wait_ready (_check_not_replaced). Returns the model state id each shard's hold and save carry, the one
    these checks read (the client's, where it read one), so that a shard replaced since refuses them
    (ModelStateReplacedError) rather than mix its state into the checkpoint."""
    if os.path.exists(os.path.join(directory, MANIFEST)):
        raise ValueError(f"{directory} holds a checkpoint already; give a new directory")
    check_save_dir("checkpoint dir", directory)
    shard_stats = client.stats()
    check_cluster(client.servers, shard_stats)  # the manifest's num_shards is the list's: a shard left out is lost
    lost = cluster_damage(shard_stats, tables)
    if lost:  # a checkpoint of it would make the loss (or two cuts) look like a model
        raise ValueError(f"{lost}; nothing was saved")
    partial = untrained_on_some_shards(shard_stats, tables)
    if partial:  # refused now, not by a shard lacking it once every shard has saved
        raise ValueError(f"{partial}; nothing was saved")
    _check_not_replaced(client.state_ids, shard_stats)
    return [stats.state_id for stats in shard_stats]


def _check_not_replaced(seen: tuple[int, ...], shard_stats: list) -> None:
    """ModelStateReplacedError, before any hold, where a shard's state id is not the one the client read at
    wait_ready (seen; 0: not read): the shard was restored or started on a new data dir since, so the model state the
    client worked with is not all there (one shard restored alone from the checkpoint the whole cluster was restored
    from passes the checks on the Stats, not this one). A client that read the shards after a restore of every
    shard (a new one, or wait_ready again) saves them."""
    replaced = [
        i for i, (ours, s) in enumerate(zip(seen, shard_stats, strict=True)) if ours and s.state_id not in (0, ours)
    ]
    if replaced:
        first, stats = replaced[0], shard_stats[replaced[0]]
        words = READ_REFUSED._replace(
            outcome="no shard was held and nothing was saved",
            stops="The save stops there (shards replaced since this client first read them: "
            f"{', '.join(map(str, replaced))}). To save what the shards hold now, save with a new client (each "
            "ps-worker checkpoint save is one), or call this client's wait_ready again",
        )
        raise ModelStateReplacedError(
            model_state_replaced(first, stats.state_id, seen[first], how_replaced(stats.restored_from), words)
        )


def _hold_and_save(client: Client, directory: str, state_ids: list[int], progress: SaveProgress,
                   positions: Callable[[], list[dict]] | None) -> tuple[float, list, list[dict] | None]:  # fmt: skip
    """(seconds from the hold of shard 0 sent, which refuses pushes as it comes, while it waits for the pushes in
    flight, to the release of every shard; every shard's save reply; positions() read just before the hold of shard 0,
    None without it): shard 0 held first, alone (of two saves at
    once, one gets it), then the others at once; every shard saved into directory; every hold taken released,
    whatever failed (a release that fails after a Ctrl-C or SIGTERM is kept in progress, and the signal goes on).
    Shard i's hold and save carry state_ids[i]. progress.directory: where a failure's error says what the shards
    left (see save)."""
    tokens, parts_in, timeout_s = progress.tokens, progress.directory, progress.hold_timeout_s
    n = len(state_ids)
    # before the hold, so that no shard refuses pushes while the files are read (a slow disk, a hung mount): each
    # count is still within the cut (its examples' pushes were acknowledged before its file was written)
    recorded = None if positions is None else positions()
    try:
        held = time.monotonic()  # pushes are refused from the hold's coming, not from its reply
        progress.asked = {0}
        _hold(client, 0, timeout_s, tokens, state_ids[0])  # first alone: of two saves at once, one gets it
        if n > 1:
            progress.asked = set(range(n))
            with ThreadPoolExecutor(min(n - 1, 32)) as pool:
                futures = [pool.submit(_hold, client, s, timeout_s, tokens, state_ids[s]) for s in range(1, n)]
                errors = [f.exception() for f in futures]  # every hold has ended (its token kept) first
            first = next((e for e in errors if e is not None), None)
            if first is not None:
                raise first
        progress.saving = True  # from here on a failure leaves parts in directory
        try:
            replies = client.checkpoint(
                {
                    s: ps_pb2.CheckpointRequest(phase="save", dir=directory, token=tokens[s], state_id=state_ids[s])
                    for s in range(n)
                }
            )
        except PsError as e:
            if parts_in is not None:
                note_parts_left(e, parts_in)
            raise
        progress.saved = True
    except BaseException as e:  # every hold taken is released, whatever failed
        stopping = stopped_by_signal(e) is not None  # its words say what the save left (progress), not the error
        try:
            _release(client, tokens, parts_in if progress.saving and not stopping else None, progress.saved)
            progress.released = True
        except PsError as failed:
            if not stopping:
                raise
            progress.release_failed = str(failed)  # the signal goes on
        raise
    _release(client, tokens, parts_in, progress.saved)
    progress.released = True
    if progress.on_released is not None:
        progress.on_released()
    return time.monotonic() - held, replies, recorded


def _check_parts_seen(directory: str, shards: list[dict]) -> None:
    """PermissionError or ValueError, no manifest written, where this machine cannot read directory or sees no
    shard-<i> folder the servers saved (their DIR is another machine's, another mount)."""
    if not os.access(directory, os.R_OK | os.X_OK):
        raise PermissionError(
            f"the servers saved their parts into {directory}, which this user cannot read (the servers' user made "
            "it): no manifest was written; save as a user that can read the servers' --checkpoint-root, and delete "
            "the shard-<i> folders the servers left there"
        )
    absent = [s["dir"] for s in shards if not os.path.isdir(os.path.join(directory, s["dir"]))]
    if absent:  # the servers saved into a DIR of their own (another machine's, another mount) than this one
        raise ValueError(f"the servers saved their parts, but {directory} here holds no {', '.join(absent)}: the "
                         "servers' DIR is not this machine's (another mount at that path?); no manifest was "
                         "written. The servers' shard-<i> folders stay in their DIR (hard links to their files): "
                         "delete them there. Save from a machine that sees the servers' --checkpoint-root at the "
                         "same path")  # fmt: skip


def _table_configs(
    client: Client, n: int, shards: list[dict], tables: set[str] | None, parts_in: str | None
) -> list[dict]:
    """The config of every table the n shards saved, as the manifest holds it: described by every shard, but a
    table left out of tables, by the shards that hold it (shards: as save leaves them, without the tables made
    during the save). A failure says what the shards left in parts_in (all of their parts), where given."""
    names = sorted({name for s in shards for name in s["rows"]})
    every = list(range(n))  # a table left out of `tables` is described by the shards that hold it: it may be lost
    asked = {name: every if tables is None or name in tables else [i for i in every if name in shards[i]["rows"]]
             for name in names}  # fmt: skip
    try:
        return [codec.table_config_from_proto(client.describe_table(name, asked[name])[0].spec).to_dict()
                for name in names]  # fmt: skip
    except PsError as e:  # a table made on some shards since the Stats above, or a shard gone
        if parts_in is not None:
            note_parts_left(e, parts_in, all_saved=True)
        raise


def _made_during_the_save(shards: list[dict], tables: set[str] | None, parts_in: str | None) -> set[str]:
    """The tables (of tables, where given) that some shards saved and others did not: made during the save (a
    CreateTable is not held), after the save of those that lack it. Every table was on every shard before the hold
    (untrained_on_some_shards), so such a table is not part of the cut: save leaves it out of the manifest (its
    tables, and its shards' rows), as a restore finds no table number for it in the parts that lack it. A part
    holds no row of it where its CreateTable came after that shard's hold; ValueError, saying what the shards
    left in parts_in, where one holds some."""
    saved = [set(s["rows"]) for s in shards]
    partial = {name for name in set().union(*saved) - set.intersection(*saved) if tables is None or name in tables}
    trained = sorted(name for name in partial if any(s["rows"].get(name, 0) for s in shards))
    if trained:
        error = ValueError(f"table(s) {', '.join(map(repr, trained))} were saved by shards "
                           f"{[s['shard_id'] for s in shards if trained[0] in s['rows']]} with rows, and not by "
                           "the others: made during the save; no manifest was written: save again")  # fmt: skip
        if parts_in is not None:
            note_parts_left(error, parts_in, all_saved=True)
        raise error
    return partial


def _release(client: Client, tokens: dict[int, str], saved_into: str | None, all_saved: bool) -> None:
    """Releases every hold of tokens; saved_into: the directory the shards were told to save into, whose parts
    a failed release's error names (note_parts_left; all_saved: every shard's save finished), else None (no save
    was sent, or its directory is temporary: see save)."""
    try:
        client.checkpoint({s: ps_pb2.CheckpointRequest(phase="release", token=t) for s, t in tokens.items()})
    except PsError as e:
        if saved_into is not None:
            note_parts_left(e, saved_into, all_saved)
        raise

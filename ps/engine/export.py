"""Writing a checkpoint's model for serving (export): each table's rows read from the checkpoint (any shard count)
and written as .npy files into OUT, put in place at once by the rename of its export.json. What it checks first is
ps.engine.exportout; the checkpoint format is in ps.checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Sequence

import numpy as np

from ps.checkpoint import pinned
from ps.config import TableConfig
from ps.engine.exportout import check_holds_no_export, check_out_of_checkpoint, chosen_tables, earlier_files, holding
from ps.progress import CountProgress
from ps.rows.layout import LAST_STEP, layout_of
from ps.storage import leftovers
from ps.storage.atomicfile import make_dirs, sync_directory, sync_file
from ps.storage.checkpointread import read_table
from ps.storage.readonly import checkpoint_damaged

log = logging.getLogger(__name__)


class ExportProgress(CountProgress):
    """One table's export progress in one phase, rows read of the manifest's count, then rows written of those kept
    (ps.progress: a bar, or a plain 'export: ...' line)."""

    def __init__(self, name: str, total: int, on: bool, phase: str = "read"):
        super().__init__(total, on, unit="row", desc=f"export {name}" + ("" if phase == "read" else f" ({phase})"))
        self.name, self.phase = name, phase

    def line(self, rate: float) -> str:
        return (f"export: table {self.name}: {self.done:,} of {self.total:,} rows {self.phase} "
                f"({self.done / max(self.total, 1):.0%}), {rate:,.0f} rows/s")  # fmt: skip


WRITE_ROWS = 1 << 16  # rows gathered into sorted order and written at a time
# An export's OUT: export.json, and the folder it names ("dir"), export-<8 hex>, of the export's .npy files. An
# export writes a new folder, fsyncs it, then writes export.json.tmp and renames it over export.json: that rename
# puts the whole new export in place at once. Then it removes the earlier export's folder (or, of an export.json
# without "dir", the .npy files of its tables in OUT itself). With move_checkpoint the folder holds the checkpoint
# exported too (`checkpoint`), moved in before export.json is written. Every writer into OUT holds a claim on it
# (ps.storage.leftovers.claimed: one writer at a time, another refused), and removes what killed exports left
# (leftovers.export_leftovers) first.


def export(directory: str, out: str, since: int | None = None, progress: bool = False,
           tables: Sequence[str] | None = None, move_checkpoint: bool = False, overwrite: bool = True,
           remove_checkpoint: bool = False, claim_fd: int | None = None, unclaimed: bool = False,
           read: tuple[str, dict] | None = None) -> dict:  # fmt: skip
    """Writes the model in the checkpoint at directory for serving, to out/: `export.json`, and the folder it names
    (its "dir": out/export-<8 hex>) holding per table `<table>.ids.npy` (uint64, sorted) and `<table>.rows.npy`
    (float32 (n, dim): embeddings only, no optimizer state, row i of id i), admitted rows only. export.json: {clock,
    checkpoint_clock, since, checkpoint, dir, tables: {name: {dim, rows, features, optimizer, initializer}}}
    (features: TableConfig.features, what the ids mean, "" if its creator named none; optimizer: the name of the one
    that trained it; initializer: {name, scale, seed}, the InitializerConfig that gives an id with no row its
    embedding, as the servers serve it (ps.rows.initializers.init_rows); checkpoint_clock: the checkpoint's, its
    largest shard clock; clock: its smallest shard clock, the --since of the next delta: a step whose pushes
    straddle the checkpoint's cut is stamped with the lower one). since: only rows pushed at clock step >= since (a
    delta to apply over an earlier export). Dense parameters are tables too: `dense.<name>` row i is row i of the
    matrix.

    Memory: one table's embeddings and three id-sized arrays (ids, their sort order, the sorted ids) at a time,
    about what it writes for the table plus 16 bytes a row; the rows are written in sorted order WRITE_ROWS at a
    time. The export appears whole or not at all: its folder is written and fsynced first, and the rename of its
    export.json over an earlier one puts it in place; only then is the earlier export's folder removed, and out
    fsynced. A failure, a kill or a power loss before that rename leaves an earlier export in out as it was.
    progress: show rows read, then rows written, per table (ExportProgress, on stderr); an out it made is removed
    again on a failure. What exports killed mid-write left in out is removed first, if out is an export's
    (leftovers.holds_an_export); leftovers.ClaimedError where another export writes there now, nothing changed
    (one export into out at a time). ValueError for an out inside the
    checkpoint, for an out that holds files without overwrite (check_holds_no_export, under the claim, before
    any leftover is removed: no export put in place meanwhile is replaced), for an out/checkpoint that out's
    export.json names and this export would leave behind (leftovers.check_no_named_checkpoint_left, under the
    claim too), and for a checkpoint inside
    the folder of the export in out that this one replaces (without move_checkpoint: that folder is removed);
    CheckpointDamagedError for a damaged checkpoint (naming the file and
    offset where RocksDB finds a block whose checksum fails), and for a shard whose admitted rows of a table differ
    from its manifest's count.
    tables: the names (or fnmatch patterns: `dense.fm.*`) of the tables to write, all without; ValueError for one
    that matches no table of the checkpoint, naming those it holds. move_checkpoint: the checkpoint is renamed into
    the export's folder (`<dir>/checkpoint`, on out's filesystem), once the .npy files are written, and export.json
    names it there: the export and the checkpoint it was made from appear together, by the one rename, and a later
    export into out removes them together. A failure before that rename moves the checkpoint back; a kill leaves it
    in the unnamed folder. A note naming where it came from is written into the folder before the move
    (leftovers.MOVED_CHECKPOINT): where it is the user's (no ps-worker export's fresh one:
    leftovers.is_export_checkpoint), every later export into out keeps that folder, logging where to move the
    checkpoint back; ps-worker export's is removed by the next export into out (leftovers.export_leftovers), unless
    it exports that checkpoint.
    remove_checkpoint:
    export.json names no checkpoint (null), and the checkpoint is removed once the export is in place (ps-worker
    export's own): a kill before that leaves it where it is, named by nothing (worker.temp_dirs names ps-worker
    export's for the next export to remove); a failure to remove it is logged. claim_fd: a descriptor of out by
    which the caller holds the claim on it and passes it on (ps-worker export's: no other export takes out between
    its checkpoint and this export), ValueError where it is no descriptor of out. unclaimed: the caller found that no
    lock on out can be had, and said so (ps-worker export's, where out's file system refuses flock): the flock is
    still tried, and where it fails this export goes ahead holding none, saying nothing of it again
    (leftovers.claimed).
    Through a symbolic link (a "latest" a save moves), export.json names, and move_checkpoint and remove_checkpoint
    move or remove, the checkpoint the link led to as the export began (pinned), never the link (a warning names it).
    read: what pinned(directory) returned to a caller that read the manifest first (None: pinned here).
    """
    if move_checkpoint and remove_checkpoint:
        raise ValueError("the checkpoint exported is either moved into the export's folder or removed, not both")
    source, manifest = read or pinned(directory)  # every file read from there: one checkpoint, though a link moves
    if tables:
        manifest = {**manifest, "tables": chosen_tables(manifest["tables"], tables)}
    check_out_of_checkpoint(source, out)  # first: overwrite does not help there
    new_out = not os.path.exists(out)
    make_dirs(out, "--out")
    killed, check = _claim_calls(source, out, overwrite)
    with leftovers.claimed(out, killed, "an export killed mid-write", claim_fd, check, unclaimed):
        summary = _export_into(source, (source, manifest), out, new_out, since, progress, move_checkpoint,
                               remove_checkpoint)  # fmt: skip
    if remove_checkpoint:  # the export in place names no checkpoint: a kill before this leaves it, named by nothing
        _remove_exported(source)
    moved_or_removed = (move_checkpoint or remove_checkpoint) and not os.path.lexists(source)
    if moved_or_removed and os.path.islink(directory.rstrip(os.sep) or os.sep):
        log.warning("the link %s led to the checkpoint exported, %s, which was %s; the link is left as it is",
                    directory, source, "moved into the export" if move_checkpoint else "removed")  # fmt: skip
    return summary


def _claim_calls(directory: str, out: str, overwrite: bool) -> tuple[Callable[[], list[str]], Callable[[], None]]:
    """What export's claim on out calls (leftovers.claimed): the leftovers of killed exports to remove, and the
    checks made under the claim."""

    def killed() -> list[str]:  # never a folder that holds the checkpoint read (one a killed export moved there)
        found = leftovers.export_leftovers(out)
        held = holding(found, directory)
        leftovers.report(held, f"it holds the checkpoint exported, {directory}")
        return [p for p in found if p not in held]

    def check() -> None:  # under the claim: no export ends meanwhile
        if not overwrite:
            check_holds_no_export(out)
        leftovers.check_no_named_checkpoint_left(out, directory)

    return killed, check


def _remove_exported(directory: str) -> None:
    """Removes the checkpoint exported (remove_checkpoint); a failure is logged."""
    try:
        shutil.rmtree(directory)
    except OSError as e:
        log.warning("the checkpoint exported, %s, could not be removed (%s): remove it", directory, e)


def _export_into(directory: str, read: tuple[str, dict], out: str, new_out: bool, since: int | None,
                 progress: bool, move_checkpoint: bool, remove_checkpoint: bool) -> dict:  # fmt: skip
    """export's writing, into out (new_out: this export made it), under its claim on out; read: (the path its files
    are read from, its manifest), ps.checkpoint.pinned's."""
    source, manifest = read
    name = f"export-{secrets.token_hex(4)}"  # leftovers.EXPORT_FILES
    summary = _summary(directory, manifest, since, remove_checkpoint, name)
    earlier = earlier_files(out)
    inside = holding(earlier, directory)
    if inside and not move_checkpoint:  # (moved, it leaves that folder before it goes)
        raise ValueError(f"the checkpoint {directory} lies inside the export in {out} that this export replaces, "
                         f"whose folder {inside[0]} is removed once the new one is in place; move or copy the "
                         "checkpoint out of it first (or have it moved into the new export: --move-checkpoint)")  # fmt: skip
    writing = _ExportWrite(directory, out, name, new_out, move_checkpoint)
    writing.write(source, manifest, since, progress, summary)
    writing.put_in_place(earlier)
    return summary


def _summary(directory: str, manifest: dict, since: int | None, remove_checkpoint: bool, name: str) -> dict:
    """export.json's content but its tables (filled as they are written), for an export into the folder `name`."""
    # the clock a delta that follows this export takes as --since: the smallest shard's. A checkpoint's shards are
    # held one after another, so a step's pushes can land before the cut on one shard and after it on another,
    # stamped there with that shard's lower clock; the manifest's clock (the largest) would leave them out of both
    clock = min(s["clock"] for s in manifest["shards"])  # (load_manifest: one shard at least, each with its clock)
    return {"clock": clock, "checkpoint_clock": int(manifest["clock"]), "since": since,
            "checkpoint": None if remove_checkpoint else os.path.abspath(directory), "dir": name,
            "tables": {}}  # fmt: skip


class _ExportWrite:
    """One export's writes into out: its folder (`files`, out/<name>) and export.json.tmp, what of them it made
    (`made`, removed again by undo), the progress shown, then the rename that puts the export in place."""

    def __init__(self, directory: str, out: str, name: str, new_out: bool, move_checkpoint: bool):
        self.directory, self.out, self.new_out, self.move_checkpoint = directory, out, new_out, move_checkpoint
        self.files, self.final = os.path.join(out, name), os.path.join(out, "export.json")
        self.moved = os.path.join(self.files, "checkpoint")
        self.shown: ExportProgress | None = None
        self.made: list[str] = []  # what this export has created in out: its folder, then its export.json.tmp

    def write(self, source: str, manifest: dict, since: int | None, progress: bool, summary: dict) -> None:
        """The folder, every table's .npy files in it (their entries in summary["tables"], read from source: the
        checkpoint's path, links resolved), the checkpoint moved in (move_checkpoint), fsynced, then
        export.json.tmp; on a failure, what it made is undone."""
        try:
            os.mkdir(self.files)
            self.made.append(self.files)
            for t in manifest["tables"]:
                cfg = TableConfig.from_dict(t)
                summary["tables"][cfg.name] = self._table(source, manifest, cfg, since, progress)
            if self.move_checkpoint:
                # a kill leaves the folder naming where it came from
                leftovers.note_moved_checkpoint(self.files, self.directory)
                os.rename(self.directory, self.moved)
                summary["checkpoint"] = os.path.abspath(self.moved)
            sync_directory(self.files)
            sync_directory(self.out)  # the folder's own entry, on disk before export.json names it
            with leftovers.open_temporary(self.final + ".tmp", "w") as f:
                self.made.append(self.final + ".tmp")
                json.dump(summary, f, indent=1)
                sync_file(f)
        except BaseException:
            if self.shown is not None:
                self.shown.close()
            self.undo()
            raise

    def _table(self, source: str, manifest: dict, cfg: TableConfig, since: int | None, progress: bool) -> dict:
        """Writes a table's ids (sorted) and rows (in that order) into the folder; its entry in export.json."""
        total = sum(int(s["rows"].get(cfg.name, 0)) for s in manifest["shards"])
        self.shown = ExportProgress(cfg.name, total, progress)
        ids, rows = _table_rows(source, manifest, cfg, total, since, self.shown.update)
        self.shown.close()
        n, order = len(ids), np.argsort(ids, kind="stable")
        _write_npy(os.path.join(self.files, f"{cfg.name}.ids.npy"), ids[order])
        del ids
        self.shown = ExportProgress(cfg.name, n, progress, phase="written")
        _write_npy(os.path.join(self.files, f"{cfg.name}.rows.npy"), rows, order, self.shown.update)
        self.shown.close()
        del rows, order
        return {"dim": cfg.dim, "rows": int(n), "features": cfg.features, "optimizer": cfg.optimizer.name,
                "initializer": dataclasses.asdict(cfg.initializer)}  # fmt: skip

    def put_in_place(self, earlier: list[str]) -> None:
        """Renames export.json.tmp over export.json (undo on a failure), then removes the earlier export's files."""
        try:
            os.replace(self.final + ".tmp", self.final)  # the new export, whole, in place of the earlier one
        except OSError:
            self.undo()
            raise
        sync_directory(self.out)  # the rename, after a power loss too
        with contextlib.suppress(OSError):  # the checkpoint is the export's now, which a later export replaces whole
            os.replace(os.path.join(self.files, leftovers.MOVED_CHECKPOINT),
                       os.path.join(self.files, leftovers.EXPORTED_CHECKPOINT))  # fmt: skip
        # an earlier folder left (a kill, an error) is one export.json does not name, which the next export removes
        for path in earlier:
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):
                    leftovers.remove_folder(path)
                else:
                    os.remove(path)
        sync_directory(self.out)

    def undo(self) -> None:
        """Removes what this export made in out (and out, if it made it and nothing else came in), the checkpoint
        moved back first."""
        if self.move_checkpoint and os.path.isdir(self.moved):
            try:
                os.rename(self.moved, self.directory)
            except OSError:  # the folder stays, checkpoint and all: the user's is kept by the next export, as its
                self.made.remove(self.files)  # note says (leftovers.MOVED_CHECKPOINT); ps-worker export's is removed
        for path in self.made:
            with contextlib.suppress(OSError):  # what is left goes with the next export's leftovers
                if path == self.files:
                    leftovers.remove_folder(path)
                else:
                    os.remove(path)
        if self.new_out:  # an out this export made, if nothing else came into it
            with contextlib.suppress(OSError):
                os.rmdir(self.out)


def _table_rows(directory: str, manifest: dict, cfg: TableConfig, total: int, since: int | None,
                on_read: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(ids, embeddings) of a table's admitted rows over every shard of the checkpoint, in arrays of the manifest's
    total count filled as read (since: only those pushed at step >= since, a prefix of them; on_read: told the
    number of rows of each batch read); CheckpointDamagedError when a shard holds another number of them than its
    manifest entry says."""
    layout = layout_of(cfg.dim, cfg.optimizer.name, cfg.values_at_rest)
    ids_out, rows_out, kept = np.zeros(total, np.uint64), np.zeros((total, cfg.dim), np.float32), 0
    for shard in manifest["shards"]:
        held, expected = 0, int(shard["rows"].get(cfg.name, 0))
        for ids, rows in read_table(os.path.join(directory, shard["dir"]), cfg.name, layout):
            held += len(ids)
            if held > expected:
                break  # more rows than the manifest says: refused below, before any is placed past the arrays
            if on_read is not None:
                on_read(len(ids))
            if since is not None:
                keep = rows[:, layout.stats_col + LAST_STEP] >= since
                ids, rows = ids[keep], rows[keep]
            ids_out[kept : kept + len(ids)] = ids
            rows_out[kept : kept + len(ids)] = rows[:, : cfg.dim]
            kept += len(ids)
        if held != expected:
            count = f"more than {expected:,}" if held > expected else f"{held:,}"
            raise checkpoint_damaged(os.path.join(directory, shard["dir"]))(
                f"it holds {count} admitted rows of table {cfg.name!r} where its manifest says {expected:,}: its "
                f"rows, its table number (meta key tid/{cfg.name}) and its manifest's count do not match"
            )
    return ids_out[:kept], rows_out[:kept]  # views: fewer than the arrays hold only with since


def _write_npy(
    path: str, array: np.ndarray, order: np.ndarray | None = None, on_written: Callable[[int], None] | None = None
) -> None:
    """array (or array[order], gathered WRITE_ROWS rows at a time) written as .npy to the new file path (in the
    export's own new folder: the caller removes the folder on a failure) and fsynced. on_written: told the number of
    rows of each piece written."""
    n = len(array) if order is None else len(order)
    try:
        with open(path, "xb") as f:
            header = {"descr": np.lib.format.dtype_to_descr(array.dtype), "fortran_order": False,
                      "shape": (n, *array.shape[1:])}  # fmt: skip
            np.lib.format.write_array_header_1_0(f, header)
            for start in range(0, n, WRITE_ROWS):
                piece = array[start : start + WRITE_ROWS] if order is None else array[order[start : start + WRITE_ROWS]]
                f.write(np.ascontiguousarray(piece).data)
                if on_written is not None:
                    on_written(len(piece))
            sync_file(f)
    except OSError as e:
        raise OSError(f"writing {path} failed ({e}); nothing of an earlier export there was changed") from e

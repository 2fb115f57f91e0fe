"""What an export checks and reads in OUT and the checkpoint before it writes (ps.engine.export.export): an out
inside the checkpoint or holding files of no export, the tables chosen and the models they leave in part, the
folders that hold the checkpoint, and the files of the export in out that a new one replaces.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence

from ps.storage import leftovers


def check_out_of_checkpoint(directory: str, out: str) -> None:
    """ValueError if out is the checkpoint directory or lies inside it (symbolic links resolved): an export there
    would change the checkpoint."""
    source, target = os.path.realpath(directory), os.path.realpath(out)
    if os.path.commonpath([source, target]) == source:
        raise ValueError(f"--out {out} lies inside the checkpoint {directory}: writing there would change the "
                         "checkpoint; give a directory outside it")  # fmt: skip


def check_holds_no_export(out: str) -> None:
    """ValueError if out holds an earlier export or other files: what only an export writing over them (overwrite)
    may go into. An export's folders and temporary files count as its export.json does (without one, they are a
    killed export's, removed as an export starts)."""
    held = sorted(os.listdir(out)) if os.path.isdir(out) else []
    held = [n for n in held if not leftovers.EXPORT_OWN.fullmatch(n)]
    if held:
        what = "an earlier export" if "export.json" in held else "files of no export"
        raise ValueError(f"--out {out} holds {what} ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}): give "
                         "a new or empty directory, or --overwrite")  # fmt: skip


def chosen_tables(specs: list[dict], patterns: Sequence[str]) -> list[dict]:
    """The manifest table specs whose names match one of patterns (exact names or fnmatch patterns), in the
    manifest's order; ValueError naming a pattern that matches none, with the names there are."""
    names = [t["name"] for t in specs]
    for pattern in patterns:
        if not fnmatch.filter(names, pattern):
            raise ValueError(f"--tables {pattern!r} matches no table of the checkpoint; it holds "
                             f"{', '.join(names) or 'none'}")  # fmt: skip
    return [t for t in specs if any(fnmatch.fnmatchcase(t["name"], p) for p in patterns)]


def left_out_of_models(specs: list[dict], chosen: list[dict]) -> list[str]:
    """For an export of `chosen` among the checkpoint's table specs: per model (the tables that share a non-empty
    `features`: one schema's fingerprint) of which some tables are chosen and some not, a line naming those left
    out, in the manifest's order. [] when every chosen table's model is whole."""
    names = {t["name"] for t in chosen}
    lines = []
    for features in dict.fromkeys(t.get("features", "") for t in chosen):
        if not features:  # a table whose creator named no features: its model is not known
            continue
        model = [t["name"] for t in specs if t.get("features", "") == features]
        out = [n for n in model if n not in names]
        if out:
            lines.append(f"{', '.join(out)} of the model of {', '.join(n for n in model if n in names)} "
                         f"(features {features!r})")  # fmt: skip
    return lines


def holding(paths: list[str], directory: str) -> list[str]:
    """Those of paths that are directory or a folder it lies in (links resolved)."""
    source = os.path.realpath(directory)
    return [p for p in paths if os.path.commonpath([source, os.path.realpath(p)]) == os.path.realpath(p)]


def earlier_files(out: str) -> list[str]:
    """The paths of the files of the export in out that a new one replaces: the folder its export.json names, or,
    where it has no "dir", the .npy files in out itself of the tables it lists; [] without one, and where its "dir"
    names no folder of export files or its "tables" is neither an object nor a list (damaged: no file is removed
    on a guess)."""
    info = leftovers.read_export_json(out)
    named = leftovers.export_files_dir(info)
    if named is not None:
        return [os.path.join(out, named)]
    if "dir" in info:
        return []
    tables = info.get("tables")
    listed = tables if isinstance(tables, (dict, list)) else ()
    names = [n for n in listed if isinstance(n, str) and "/" not in n and n not in ("", ".", "..")]
    return [os.path.join(out, f"{n}.{kind}.npy") for n in names for kind in ("ids", "rows")]

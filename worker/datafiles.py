"""A data flag's value as the files it names: one file, a directory, a glob, or a comma-separated list of them.

    data_files(spec) -> [path, ...]            # in reading order; ValueError for a pattern or directory that
                                               # matches no file, or a file named twice
    check_data_input(flag, spec, expected)     # ValueError naming the flag unless every file is a readable file
    takes_in(spec, path) -> bool               # whether a directory or glob of spec takes in a file at path

The grammar of spec (--data, --eval-data, --validation-data, and the data `ps-worker schema` reads):
    spec   := a path that is a regular file (taken whole, even if it holds ',' or '*')
            | a path that is a directory (one entry, taken whole, even if it holds ',')
            | entry (',' entry)*
    entry  := a directory  -> its regular files (not its subdirectories) in name order, less SKIPPED ones
            | a glob       -> (an entry holding *, ? or [) the regular files it matches, in name order, less
                              SKIPPED ones
            | a path       -> that file (checked by check_data_input)
SKIPPED: a name starting with '.' (hidden) or '_' (Spark and Hadoop's _SUCCESS, _committed_*), or ending in
one of NOT_DATA (checksums, schemas, notes written next to the data). Named on its own, such a file is read.
A directory or glob whose data-named entry is neither a regular file nor a directory (a broken link, a FIFO) is
refused, naming it: its examples would otherwise be left out unsaid.
Name order compares runs of digits as numbers (name_order): day_2 comes before day_10, as it does in time.

The files are read in this order as one stream (worker/formats.py read_batches): a run over day_0..day_23 reads
the same examples, in the same order, as over their concatenation.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re

NOT_DATA = (".crc", ".md", ".json", ".toml", ".yaml", ".yml", ".py", ".sh", ".schema")
_GLOB_CHARS = frozenset("*?[")


def data_files(spec: str | os.PathLike) -> list[str]:
    """The files of spec, in reading order (see the module docstring)."""
    spec = os.fspath(spec)
    if os.path.isfile(spec):
        return [spec]
    files: list[str] = []
    for entry in data_entries(spec):
        if not entry:
            raise ValueError(f"{spec!r}: an empty entry in a comma-separated list of data files")
        files += _entry_files(entry)
    seen: set[str] = set()
    for f in files:
        real = os.path.realpath(f)
        if real in seen:
            raise ValueError(f"{spec!r}: the file {f} is named twice: its examples would be read twice")
        seen.add(real)
    return files


def describe_files(flag: str, spec: str | os.PathLike | None) -> str | None:
    """A line saying which files a directory, glob or list names (up to 5, then a count) and which files of its
    directories and globs were skipped as not data; None for a single file (or None)."""
    if spec is None or os.path.isfile(spec):
        return None
    files = data_files(spec)
    skipped = []
    for entry in data_entries(os.fspath(spec)):
        names = (os.path.basename(p) for p in _listed(entry) or [] if os.path.isfile(p))
        skipped += sorted(n for n in names if not _is_data(n))
    shown = ", ".join(os.path.basename(f) for f in files[:5]) + (
        f", ... ({len(files) - 5:,} more)" if len(files) > 5 else ""
    )
    line = f"{flag} {os.fspath(spec)}: {len(files):,} file{'s' * (len(files) != 1)} read in this order ({shown})"
    if skipped:
        line += f"; skipped as not data: {', '.join(skipped[:5])}" + (" ..." if len(skipped) > 5 else "")
    return line


def name_order(path: str) -> tuple:
    """The sort key of a data file: its path with each run of digits compared as a number (day_2 < day_10,
    part-9 < part-10), then the path itself (part-01 and part-1 keep one order)."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", path) if t), path


def data_entries(spec: str) -> list[str]:
    """The entries of a spec that is no regular file (the module docstring's grammar): the spec itself where it
    is a directory, a ',' in its name kept; else its comma-separated parts, stripped (an empty one kept, for
    data_files to refuse)."""
    if os.path.isdir(spec):
        return [spec]
    return [entry.strip() for entry in spec.split(",")]


def _entry_files(entry: str) -> list[str]:
    listed = _listed(entry)
    if listed is None:
        return [entry]
    unread = _not_files(listed)
    if unread:
        what = "a broken link" if not os.path.exists(unread[0]) else "not a regular file"
        raise ValueError(f"{unread[0]}, taken in by {entry}, is {what}: its examples cannot be read (remove it, or "
                         "name the files to read)")  # fmt: skip
    files = sorted((p for p in listed if os.path.isfile(p) and _is_data(os.path.basename(p))), key=name_order)
    if not files and os.path.isdir(entry):
        raise ValueError(f"{entry} is a directory holding no data file (hidden files, names starting with '_' "
                         f"and names ending in {', '.join(NOT_DATA)} are skipped)")  # fmt: skip
    if not files:
        raise ValueError(f"the pattern {entry!r} matches no data file")
    return files


def _listed(entry: str) -> list[str] | None:
    """Every path a directory entry holds (its files and subdirectories, not below) or a glob entry matches, data
    or not (_is_data tells), hidden ones included; None for an entry that names one path."""
    if os.path.isdir(entry):
        return [os.path.join(entry, n) for n in os.listdir(entry)]
    if _GLOB_CHARS & set(entry) and not os.path.lexists(entry):
        return glob.glob(entry, include_hidden=True)
    return None


def _not_files(listed: list[str]) -> list[str]:
    """The data-named paths (_is_data) of an entry's (_listed) that are neither regular files nor directories (links
    followed): a broken link, a FIFO, a socket or a device; in name order."""
    odd = (p for p in listed if _is_data(os.path.basename(p)) and not os.path.isfile(p) and not os.path.isdir(p))
    return sorted(odd, key=name_order)


def _is_data(name: str) -> bool:
    return not name.startswith((".", "_")) and not name.endswith(NOT_DATA)


def takes_in(spec: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether a file at path (there or not yet) is among the files of spec by a directory or glob entry: in the
    directory, or matched by the glob (component by component, as glob.glob matches, hidden names included), and
    not SKIPPED. An output file there would be read as data by the next run over spec."""
    spec, path = os.fspath(spec), os.fspath(path)
    if os.path.isfile(spec) or not _is_data(os.path.basename(path)):
        return False
    return any(_entry_takes_in(entry, path) for entry in data_entries(spec) if entry)


def _entry_takes_in(entry: str, path: str) -> bool:
    """Whether a directory or glob entry takes in a file at path (takes_in)."""
    if os.path.isdir(entry):
        return os.path.realpath(os.path.dirname(os.path.abspath(path))) == os.path.realpath(entry)
    if not _GLOB_CHARS & set(entry) or os.path.lexists(entry):
        return False
    pattern = os.path.normpath(os.path.abspath(entry)).split(os.sep)
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    return len(pattern) == len(parts) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pattern))


def shared_files(spec: str, other: str) -> list[str]:
    """The files of spec (data_files) that other names too (the same file, links followed), in spec's order."""
    theirs = {os.path.realpath(f) for f in data_files(other)}
    return [f for f in data_files(spec) if os.path.realpath(f) in theirs]


HELD_OUT_USES = {
    "--validation-data": "its early stopping and the advice drawn from its curve would follow a figure that keeps "
    "improving; leave --validation-data out (a share of --data is then held out) or give a file of other rows",
    "--eval-data": "the eval figures would not say how the model does on new rows; give a file of other rows "
    "(ps-worker eval --servers ... scores any file after training)",
}


def check_held_out(data: str | None, validation_data: str | None, eval_data: str | None) -> None:
    """ValueError, for a training run, when a file of validation_data or eval_data is one of data's (the file, a
    link to it, its directory): a model scored on rows it trained on scores far better than on new ones, so the
    figures (and early stopping, and the advice drawn from the validation curve) would mislead. Inputs that name
    no file are left to check_data_input, which names their flag."""
    for flag, spec in (("--validation-data", validation_data), ("--eval-data", eval_data)):
        try:
            shared = shared_files(data, spec) if spec and data else []  # as --data names them
        except ValueError:
            continue
        if shared:
            more = f" and {len(shared) - 1} more of them" if len(shared) > 1 else ""
            raise ValueError(f"{flag} {spec} is also training data: --data {data} reads {shared[0]}{more}. A model "
                             f"scored on the rows it trained on scores far better than on new rows, so "
                             f"{HELD_OUT_USES[flag]}")  # fmt: skip


def check_data_input(flag: str, spec: str | None, expected: str) -> None:
    """ValueError naming the flag unless spec is None or names files (data_files) that are all readable regular
    files; `expected` says what they should be."""
    if spec is None:
        return
    try:
        files = data_files(spec)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}; expected {expected}") from None
    for path in files:
        if not os.path.exists(path):
            raise ValueError(f"{flag} {path} does not exist; expected {expected}")
        if not os.path.isfile(path):
            raise ValueError(f"{flag} {path} is not a regular file; expected {expected}")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{flag} {path} is not readable by this user")

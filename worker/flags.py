"""Checks of the worker's command-line values that name the flag at fault: server lists, files to read and write,
a CSV delimiter, numbers in range; and the help formatter of its commands.

Each check raises ValueError with the flag, the value that arrived and what was expected, before anything starts:
an unset shell variable in `--servers "$SERVERS"` is an error here, not a run on throwaway local shards. The
argparse types (integer, number) check a value wherever it comes from: ps/settings.py names the environment
variable or config file key of a value they refuse.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ps.flagtypes import address_hint, is_address


def server_list(text: str | None, flag: str = "--servers") -> tuple[str, ...]:
    """The host:port addresses of a comma-separated list (() for None: the flag not given). ValueError for a
    list with no address in it or an entry that is not host:port with a port in 1..65535."""
    if text is None:
        return ()
    addresses = tuple(a.strip() for a in text.split(","))
    if not any(addresses):
        raise ValueError(f"{flag} is empty ({text!r}); expected host:port,... in shard order (an unset variable?)")
    for i, address in enumerate(addresses):
        if not is_address(address):
            raise ValueError(f"{flag} {text!r}: entry {i} ({address!r}) is not host:port with a port in 1..65535"
                             f"{address_hint(address)}")  # fmt: skip
    return addresses


TAB_NAMES = ("\\t", "tab")  # a --delimiter value naming a tab: as typed in a shell without $'\t', or the word


def delimiter(text: str, flag: str = "--delimiter") -> str:
    """A CSV delimiter: one character other than a quote, a NUL or a line end; a backslash and t (as a shell passes
    '\\t') or `tab` (any case) is a tab. ValueError for anything else."""
    if text.lower() in TAB_NAMES:
        return "\t"
    if len(text) != 1 or text in '"\r\n\0':
        raise ValueError(f"{flag} {text!r}: expected one character other than a quote or a newline (a tab: $'\\t', "
                         "'\\t' or tab)")  # fmt: skip
    return text


def check_input_file(flag: str, path: str | None, expected: str) -> None:
    """ValueError naming the flag unless path is None or a readable regular file; `expected` says what it
    should be."""
    if path is None:
        return
    if not os.path.exists(path):
        raise ValueError(f"{flag} {path} does not exist; expected {expected}")
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a directory; expected {expected}")
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path} is not a regular file; expected {expected}")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{flag} {path} is not readable by this user")


def check_output_file(flag: str, path: str | None) -> None:
    """ValueError naming the flag unless path is None or a file name that can be written: checked before the
    run, so that a run does not end without its output."""
    if path is None:
        return
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a directory; expected the name of a file to write")
    if not os.path.isdir(parent):
        raise ValueError(f"{flag} {path}: its directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{flag} {path}: its directory {parent} is not writable by this user")
    name = len(os.fsencode(os.path.basename(path)))
    try:
        longest = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):  # a file system that does not say
        return
    if name > longest:
        raise ValueError(f"{flag} {path}: its name is {name:,} bytes long; the file system of {parent} takes "
                         f"names of up to {longest:,}")  # fmt: skip


def check_new_file(flag: str, path: str | None, overwrite: bool) -> None:
    """ValueError naming the flag when the file `path` exists and overwrite is False: a command that writes a file
    replaces one only when told to (--overwrite); and, overwrite or not, when `path` is there but no regular file
    (a symbolic link, a device such as /dev/null, a FIFO), which a replacement would turn into one. None: the flag
    not given."""
    if path is not None and os.path.lexists(path) and (os.path.islink(path) or not os.path.isfile(path)):
        raise ValueError(f"{flag} {path} is not a regular file (a link, a device or a FIFO): it is never replaced; "
                         "nothing was written: give the name of a regular file, or a new one")  # fmt: skip
    if path is not None and not overwrite and os.path.lexists(path):
        raise ValueError(f"{flag} {path} exists; nothing was written: give another file name, or --overwrite to "
                         "replace it")  # fmt: skip


def check_new_dir(name: str, path: str, how: str, ignore: re.Pattern[str] | None = None) -> None:
    """ValueError naming `name` (a flag, or the metavar of a positional argument) unless path does not exist or
    is an empty directory (but for names that fullmatch `ignore`: what the command itself removes first): a
    command that fills a directory does not mix its files with others. `how` ends the message, saying how to
    proceed."""
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise ValueError(f"{name} {path} exists and is not a directory; {how}")
    entries = sorted(e for e in os.listdir(path) if ignore is None or not ignore.fullmatch(e))
    if entries:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise ValueError(f"{name} {path} is not empty (it holds {shown}); nothing was written: {how}")


def check_not_an_input(flag: str, path: str | None, inputs: Mapping[str, str | None]) -> None:
    """ValueError when the output file `path` of `flag` is the file of one of `inputs` (flag -> path, None for a
    flag not given): writing it would replace that input; or when a directory or glob of an input takes it in
    (datafiles.takes_in): the next run over that input would read it as data."""
    if path is None:
        return
    from worker.datafiles import data_files, takes_in

    for input_flag, input_path in inputs.items():
        try:
            files = data_files(input_path) if input_path is not None else []
        except ValueError:  # nothing matched: refused by the input's own check
            files = []
        if any(same_file(path, f) for f in [input_path] * (input_path is not None) + files):
            raise ValueError(f"{flag} {path} is the file of {input_flag} {input_path}: writing it would replace "
                             "that input; give another file name")  # fmt: skip
        if input_path is not None and takes_in(input_path, path):
            raise ValueError(f"{flag} {path} lies where {input_flag} {input_path} reads its files: the next run over "
                             "that input would read it as data; write it outside that directory, or under a name "
                             "the input skips (one starting with '.' or '_')")  # fmt: skip


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (links followed; paths that do not exist compared by their real path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)

"""`ps-worker export OUT --servers ...`: the model the servers hold, written for serving at one cut.

    1. a claim on OUT for the whole run (export_claim: an exclusive flock, refused where another export holds one;
       under it, OUT checked new or empty (or --overwrite), so that no export put in place meanwhile is written
       over; then what exports killed mid-way left in OUT is removed, in an export's own folder only,
       worker/temp_dirs.py and ps/storage/leftovers.py)
    2. once the servers answer, an error unless the tables exported hold a row (check_rows: a model made by
       `train --create-tables-only`, or the wrong --servers, exports nothing of use)
    3. a checkpoint through the servers into OUT/checkpoint.new-<pid>-<host>-<8 hex> (worker/checkpoint.py save;
       OUT must lie inside the servers' --checkpoint-root)
    4. `ps-server export` of it into OUT (a child process that dies with this one: the server package reads
       RocksDB files, the worker does not import it; it is given the claim's descriptor, --claim-fd, and claims OUT
       through it, or --unclaimed where no lock on OUT can be had, which this one said), --since and --tables passed
       on; its exit code is this one's,
       and one killed by signal N is said so, exit code 128 + N. A Ctrl-C or SIGTERM of this process is passed on
       to it as SIGTERM, and it is waited for (CHILD_STOP_S at most, then killed), so that its stop removes what it
       wrote before this one removes the rest (_run_server_export). It puts the new export in place of an earlier one
       whole, by the rename of its export.json (ps.engine.export.export), and removes the earlier one's files.
       With --keep-checkpoint it moves the fresh checkpoint into the export's folder first (--move-checkpoint), so
       that rename puts the export and its checkpoint, `OUT/<dir>/checkpoint`, in place together; without, the
       export.json it puts in place names no checkpoint, and it removes the fresh one after (--remove-checkpoint):
       a kill between leaves the new export whole and the fresh checkpoint, named by nothing, which the next
       export removes (its <pid> is gone)
Checked before any server is asked: OUT no checkpoint or RocksDB directory, writable, and (under the claim) new
or empty (or --overwrite), holding no OUT/checkpoint that its export.json names (an earlier version's kept checkpoint
or the user's: leftovers.check_no_named_checkpoint_left), which this export would leave behind. A failure leaves OUT as
it was (an OUT this export created is removed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ps.checkpoint import inside_a_checkpoint, table_patterns
from ps.errors import CheckpointOutsideRootError, InvalidArgumentError, NoCheckpointRootError, PsError
from ps.storage import leftovers
from ps.storage.atomicfile import make_dirs
from ps.terminate import CLEANUP_LIMIT_S, child_setup, how_it_ended, signal_behind, stopped_by_signal
from worker.checkpoint import save
from worker.checkpoint_left import every_shard_refused_for_no_root
from worker.flags import check_new_dir
from worker.tables import NEVER_TRAINED
from worker.temp_dirs import dead_export_checkpoints, export_checkpoint_dir

UNDO_S = 30.0  # of CLEANUP_LIMIT_S after a Ctrl-C or SIGTERM: this process's removal of what it wrote
CHILD_STOP_S = CLEANUP_LIMIT_S - UNDO_S  # the rest: the stop of its `ps-server export` (then it is killed)


def _missing_dirs(path: str) -> list[str]:
    """path and those of its parents that do not exist, deepest first (what os.makedirs(path) creates)."""
    missing, path = [], os.path.abspath(path)
    while not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def export_command(args: Any, client: Callable[[Any], Any]) -> int:
    """`ps-worker export`'s parsed args (see the module docstring); client(args): a connected Client for them.
    Returns the exit code."""
    fresh = export_checkpoint_dir(args.out)
    patterns = None if args.tables is None else table_patterns(args.tables)  # ValueError: none, before any server
    _check_out(args.out)
    made = _missing_dirs(args.out)  # OUT and the parents this export creates, deepest first
    make_dirs(args.out, "OUT")
    stage = _Stage(args.out, fresh)
    try:  # the claim on OUT is held to the end: ps-server export claims OUT through it (--claim-fd)
        with export_claim(args.out, lambda: _check_out_claimed(args)) as claim:
            earlier = stage.earlier = leftovers.export_in_place(args.out)
            with client(args) as servers:
                _save_checkpoint(args, servers, patterns, fresh, stage)
            command = _server_export_command(args, fresh, claim)
            returncode = _run_server_export(command, claim)
            stage.child_ended = True
    except BaseException as e:
        fresh_there = os.path.exists(fresh)
        _undo(fresh, made)
        if stopped_by_signal(e) is not None:  # a Ctrl-C or SIGTERM: its line says what the export left
            signal_error = signal_behind(e)
            notes = getattr(signal_error, "__notes__", [])  # the save's (worker/checkpoint.py), where it was stopped
            signal_error.__notes__ = [stage.stopped_words(fresh_there, bool(notes)), *notes]
        raise
    if returncode != 0:  # an earlier export in OUT is as it was
        _undo(fresh, made)
        if returncode > 0:  # ps-server export said why
            return returncode
        now = leftovers.export_in_place(args.out)
        what = (f"the new export is in place ({os.path.join(args.out, 'export.json')} names {now})" if now != earlier
                else f"nothing was exported, and what {args.out} held before is as it was")  # fmt: skip
        print(f"ps-worker: error: `ps-server export` {how_it_ended(returncode)} before it finished: {what} "
              "(the next export into it removes any temporary files the child left there)", file=sys.stderr)  # fmt: skip
        return 128 - returncode  # as a shell gives a child's death by signal N: 128 + N
    return 0


@dataclasses.dataclass
class _Stage:
    """How far an export into out got, for the words that a Ctrl-C or SIGTERM stopping it ends with
    (stopped_words)."""

    out: str
    fresh: str  # its fresh checkpoint
    earlier: str | None = None  # the export in place in out as it began (its folder), under its claim: read before
    # the save, so not known where saved is False (nor needed: no new export is put in place before the save)
    saved: bool = False  # its checkpoint was saved: the servers' hold ended (set by the save, mark_saved)
    child_ended: bool = False  # its `ps-server export` ended by itself

    def mark_saved(self) -> None:
        """The save's `released` (worker.checkpoint.save): every shard saved and every hold was released."""
        self.saved = True

    def stopped_words(self, fresh_there: bool, held_said: bool) -> str:
        """What the export left, said once its traces were removed (_undo; fresh_there: its fresh checkpoint was
        there before): the export in place in out, its fresh checkpoint, and the servers' hold, unless the save's
        own words (held_said: they follow) say it."""
        now = leftovers.export_in_place(self.out)
        json_path = os.path.join(self.out, "export.json")
        if self.saved and now is not None and now != self.earlier:  # only `ps-server export`, after the save, puts one
            said = [f"the new export is in place ({json_path} names {now})" + (
                "" if self.child_ended else "; the next export into it removes any files `ps-server export` left "
                "there")]  # fmt: skip
        elif now is not None:  # under the claim nothing else changes it: the one in place as this export began
            said = [f"nothing was exported: {json_path} names {now}, the export it named before"]
        elif os.path.isdir(self.out):
            said = [f"nothing was exported: {self.out} holds no export, as before"]
        else:
            said = [f"nothing was exported: {self.out}, which this export made, was removed"]
        if fresh_there:
            gone = not os.path.exists(self.fresh)
            said.append(f"Its fresh checkpoint {self.fresh} " + ("was removed" if gone else "is left: delete it"))
        text = ". ".join(said) + "."
        if held_said:
            return text
        if self.saved:
            return f"{text} The servers' hold ended with the save of its checkpoint: they take pushes."
        return f"{text} No shard was held: the servers took pushes throughout."


def _run_server_export(command: list[str], claim: int | None) -> int:
    """Runs `ps-server export` (command; claim: the descriptor it claims OUT through) to its end and returns its
    exit status (-N: killed by signal N). A Ctrl-C or SIGTERM that stops this process meanwhile is passed on to it as
    SIGTERM, and it is waited for: its stop removes the files it wrote into OUT (and moves a checkpoint it moved back)
    before this process removes its fresh checkpoint and the OUT it made; a kill would leave them there. This process
    ends CLEANUP_LIMIT_S (ps.terminate) after the signal whatever it does, so its stop is waited for CHILD_STOP_S of
    that at most, then it is killed (what it wrote into OUT is left, and the next export into OUT removes it), and
    UNDO_S of it are left for this one's removal of its fresh checkpoint and the OUT it made."""
    child = subprocess.Popen(command, preexec_fn=child_setup(own_group=False),  # dies with this process
                             pass_fds=() if claim is None else (claim,))  # fmt: skip
    try:
        return child.wait()
    except BaseException:
        try:
            child.send_signal(signal.SIGTERM)  # (nothing where it has ended)
            child.wait(CHILD_STOP_S)
        except subprocess.TimeoutExpired:
            print(f"ps-worker: `ps-server export` did not stop within {CHILD_STOP_S:g} s of its SIGTERM: killed (the "
                  "next export into OUT removes what it left there)", file=sys.stderr)  # fmt: skip
        finally:
            if child.poll() is None:  # its stop ran past CHILD_STOP_S, or the wait itself failed: none left running
                child.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(UNDO_S / 10)
        raise


def _check_out(out: str) -> None:
    """ValueError, before anything is written, for an OUT that is no directory, is a checkpoint or a RocksDB
    directory, or (or its nearest parent) is not writable by this user."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ValueError(f"OUT {out} exists and is not a directory; give a new or empty directory")
    # OUT itself, before the check of what it holds (--overwrite would not help); the servers check its parents
    if inside_a_checkpoint(out, os.path.dirname(os.path.abspath(out))):
        raise ValueError(f"OUT {out} is a checkpoint or a RocksDB directory: export has the servers save the "
                         "model as a checkpoint into a folder of OUT first, and they save none inside another; give a "
                         "directory of its own; nothing was written")  # fmt: skip
    where = out if os.path.isdir(out) else os.path.dirname(os.path.abspath(out))
    if os.path.isdir(where) and not os.access(where, os.W_OK):
        raise ValueError(f"OUT {out}: {where} is not writable by this user; nothing was written")


def _undo(fresh: str, made: list[str]) -> None:
    """A failed export's traces removed: its fresh checkpoint, and the folders it created (made, deepest first),
    if nothing else came into them."""
    shutil.rmtree(fresh, ignore_errors=True)
    for directory in made:  # the folders this export created, if nothing else came into them
        try:
            os.rmdir(directory)
        except OSError:
            break


def _check_out_claimed(args: Any) -> None:
    """Under the claim on OUT: no export put in place meanwhile is written over (OUT new or empty but for what
    exports killed mid-way left, unless --overwrite), and no checkpoint its export.json names is left behind."""
    if not args.overwrite:
        only_leftovers = re.compile(f"{leftovers.EXPORT_OWN.pattern}|{leftovers.EXPORT_CHECKPOINT_NAME.pattern}")
        earlier = os.path.exists(os.path.join(args.out, "export.json"))
        check_new_dir("OUT", args.out, "give a new or empty directory, or --overwrite to write " + (
            "over the export there" if earlier else "beside those files"), ignore=only_leftovers)  # fmt: skip
    leftovers.check_no_named_checkpoint_left(args.out)  # its export reads its fresh checkpoint, never that one


def _save_checkpoint(args: Any, servers: Any, patterns: list[str] | None, fresh: str, stage: _Stage) -> None:
    """The servers' model saved as a checkpoint into fresh (worker/checkpoint.py save), once they answer and the
    tables to export (_exported_tables) hold a row (check_rows); a server's refusal to save there said in the
    terms of OUT. stage.saved is set as the save releases its holds."""
    shard_stats = servers.wait_ready()  # before the checkpoint (a hold on pushes) is taken
    exported = _exported_tables(shard_stats, patterns)
    check_rows(shard_stats, exported)
    only = None  # the tables a lost one refuses the save: every one, unless the checkpoint is read for
    if patterns is not None and not args.keep_checkpoint:  # --tables alone and then deleted
        only = set(exported)
    try:
        save(servers, fresh, tables=only, temporary=True, released=stage.mark_saved)  # _undo removes it on a failure
    except NoCheckpointRootError as e:  # a server started without --checkpoint-root
        raise NoCheckpointRootError(
            "export has the servers save the model as a checkpoint into a folder of OUT first, and a "
            "server saves only inside its --checkpoint-root: restart the servers with --checkpoint-root "
            f"DIR (their data dirs keep the model) and give an OUT inside DIR; {_what_was_saved(e, fresh)}. The "
            f"server said: {e}"
        ) from None
    except CheckpointOutsideRootError as e:
        raise InvalidArgumentError(
            f"OUT {args.out} is outside the servers' checkpoint root: export has the servers save the "
            f"model into a folder of OUT first, and a server saves only inside its --checkpoint-root; "
            f"give an OUT inside it. The server said: {e}"
        ) from None


def _what_was_saved(e: NoCheckpointRootError, fresh: str) -> str:
    """What the temporary save into fresh that e (a shard's refusal for no --checkpoint-root) stopped left:
    "nothing was saved" where every shard refused so (every_shard_refused_for_no_root); else which shards saved
    their part, or may have, as far as e's shard_outcomes (Client.checkpoint's) tell. export removes fresh on this
    machine (_undo); a part a shard saved on another machine (the servers' --checkpoint-root there) stays there."""
    if every_shard_refused_for_no_root(e):
        return "nothing was saved"
    outcomes = getattr(e, "shard_outcomes", None) or []
    refused = [str(s) for s, o in enumerate(outcomes) if issubclass(o, NoCheckpointRootError)]
    saved = [str(s) for s, o in enumerate(outcomes) if not issubclass(o, PsError)]
    other = [f"{s} ({o.__name__})" for s, o in enumerate(outcomes)
             if issubclass(o, PsError) and not issubclass(o, NoCheckpointRootError)]  # fmt: skip
    said = [f"shard(s) {', '.join(refused)} refused it for that"] if refused else []
    said += [f"shard(s) {', '.join(saved)} saved their part"] if saved else []
    said += [f"shard(s) {', '.join(other)} failed otherwise, and may have saved theirs"] if other else []
    known = "; ".join(said) if said else "which shards saved their part is not known"
    return (f"of the save into {fresh}, {known}: {fresh} is removed on this machine, and a part a shard saved on "
            f"another machine (its --checkpoint-root there) stays there: delete {fresh} there")  # fmt: skip


def _exported_tables(shard_stats: list, patterns: list[str] | None) -> list[str]:
    """The names of the tables the servers hold that --tables' patterns match (every one without patterns),
    sorted; ValueError where they hold none, or a pattern matches none."""
    held = sorted({t.name for shard in shard_stats for t in shard.tables})
    if not held:
        raise ValueError("the servers hold no table: nothing to export (a train with --servers makes "
                         "the model's tables); nothing was saved")  # fmt: skip
    if patterns is not None:
        for pattern in patterns:
            if not fnmatch.filter(held, pattern):
                raise ValueError(f"--tables {pattern!r} matches no table the servers hold ("
                                 f"{', '.join(held) or 'none'}); nothing was saved")  # fmt: skip
    return held if patterns is None else sorted({n for p in patterns for n in fnmatch.filter(held, p)})


def _server_export_command(args: Any, fresh: str, claim: int | None) -> list[str]:
    """The `ps-server export` command of fresh into OUT (OUT checked already: --overwrite), --since and --tables
    passed on; the fresh checkpoint moved into the export (--keep-checkpoint) or removed after; OUT claimed through
    the descriptor claim, or --unclaimed where it is None (no lock, said so)."""
    command = [sys.executable, "-m", "ps", "export", fresh, "--out", args.out, "--overwrite"]  # OUT checked
    command += [] if args.since is None else ["--since", str(args.since)]
    command += [] if args.tables is None else ["--tables", args.tables]
    command += ["--no-progress"] if args.no_progress else []
    command += ["--move-checkpoint"] if args.keep_checkpoint else ["--remove-checkpoint"]
    command += ["--unclaimed"] if claim is None else ["--claim-fd", str(claim)]  # None: no lock, said so
    return command


def check_rows(shard_stats: list, tables: list[str]) -> None:
    """ValueError when the tables to export hold no row on any shard: an export of them would be empty. The
    message says whether they were trained (TableStats.trained: emptied by a Shrink since) or never were."""
    stats = [t for shard in shard_stats for t in shard.tables if t.name in tables]
    if sum(t.num_rows for t in stats):
        return
    why = ("They were trained, and a Shrink has dropped every row since" if any(t.trained for t in stats)
           else f"{NEVER_TRAINED[0].upper()}{NEVER_TRAINED[1:]}")  # fmt: skip
    raise ValueError(f"the servers' tables {', '.join(tables)} hold no trained row: an export would be empty. "
                     f"{why}; nothing was saved")  # fmt: skip


@contextlib.contextmanager
def export_claim(out: str, check: Callable[[], None] | None = None) -> Iterator[int | None]:
    """The claim a `ps-worker export` holds on out (an existing folder) for its whole run (ps.storage.leftovers
    .claimed: ClaimedError where another export holds one), and passes on to the `ps-server export` it runs:
    yields the descriptor it is held by (None where none is). Under it, first, check() runs (an error it raises
    refuses, nothing changed); then what exports killed mid-way left in
    out is removed, logging each with its size (their fresh checkpoints, worker.temp_dirs.dead_export_checkpoints,
    and what their `ps-server export` left, leftovers.export_leftovers), if out is an export's folder
    (leftovers.holds_an_export); the checkpoints whose writer may still run are reported and left."""

    def killed() -> list[str]:
        if not leftovers.holds_an_export(out, leftovers.EXPORT_CHECKPOINT_NAME):
            return []
        return dead_export_checkpoints(out)[0] + leftovers.export_leftovers(out, leftovers.EXPORT_CHECKPOINT_NAME)

    with leftovers.claimed(out, killed, "an export killed mid-way", check=check) as fd:
        leftovers.report(dead_export_checkpoints(out)[1], f"an export into {out} may be running (here or on another "
                         "host, or named without its process): remove it once none is")  # fmt: skip
        yield fd

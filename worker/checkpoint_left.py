"""What a checkpoint save (worker/checkpoint.py) leaves behind, in words: the shard parts in its directory where it
failed (note_parts_left), and, where a Ctrl-C or SIGTERM stopped it, what the directory holds and which shards take
pushes again (SaveProgress.stopped_words).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable

from ps.checkpoint import MANIFEST
from ps.errors import NoCheckpointRootError


def note_parts_left(error: BaseException, directory: str, all_saved: bool = False) -> None:
    """Adds to error's message what the save phase leaves in directory (_parts_left; all_saved: every shard's save
    finished, a failure after the save phase). A refusal for having no --checkpoint-root by every shard (the
    error's shard_outcomes, Client.checkpoint's), no shard part seen in directory, is said as what it is: the
    servers' own words say what to do. Where another shard saved, or may have (its save unanswered, or its outcome
    not known), its part may be in the servers' DIR on another machine: the error says what this machine sees."""
    if every_shard_refused_for_no_root(error) and not _shard_parts(directory):
        error.args = (f"nothing was saved into {directory}: {error}",)
        return
    if all_saved:
        error.args = (f"the save into {directory} failed after every shard saved its part there: {error}. "
                      f"{_parts_left(directory, True)}",)  # fmt: skip
        return
    error.args = (f"the save into {directory} failed: {error}. {_parts_left(directory)}",)


def every_shard_refused_for_no_root(error: BaseException) -> bool:
    """error is a NoCheckpointRootError, and so was every shard's outcome (shard_outcomes; not known: False)."""
    outcomes = getattr(error, "shard_outcomes", None)
    return isinstance(error, NoCheckpointRootError) and bool(outcomes) and \
        all(issubclass(o, NoCheckpointRootError) for o in outcomes)  # fmt: skip


def _shard_parts(directory: str) -> list[str]:
    """The shard-<i> folders (and RocksDB's shard-<i>.tmp) this machine sees in directory, sorted."""
    try:
        return sorted(name for name in os.listdir(directory) if name.startswith("shard-"))
    except OSError:  # not there, or not readable
        return []


def _parts_left(directory: str, all_saved: bool = False) -> str:
    """What the save phase leaves in directory, said in a sentence or two: the shard-<i> folders of the shards whose
    save finished, where this machine sees any, apart from the shard-<i>.tmp folders of saves that did not finish
    (cut off, or going on: a save whose deadline passed, or whose call was given up, is not called off). all_saved:
    every shard's save finished. Without a manifest they are not a checkpoint, and the directory takes no save
    until they are gone."""
    if all_saved:
        return (f"No {MANIFEST} was written, so the shard-<i> folders there are not a checkpoint: delete {directory} "
                "before saving into it again")  # fmt: skip
    if not os.path.isdir(directory):  # the shards that failed removed what they made, and none finished
        return (f"This machine sees nothing at {directory}; a shard whose save did not answer may still make it and "
                "write its part there, and where the servers' DIR is another machine's, the shards that finished "
                "left their shard-<i> folders there: delete any before saving into it again")  # fmt: skip
    left = _shard_parts(directory)
    finished = [name for name in left if not name.endswith(".tmp")]
    unfinished = [name for name in left if name.endswith(".tmp")]  # RocksDB's, while it makes shard-<i>
    said = [f"{', '.join(finished)}, the part of each shard whose save finished"] if finished else []
    if unfinished:
        said.append(f"{', '.join(unfinished)}, the unfinished part of each shard whose save was cut off (its server "
                    "died) or still runs")  # fmt: skip
    holds = f"holds {'; and '.join(said)}" if said else "holds no shard part yet"
    return (
        f"{directory} {holds}; a shard whose save did not answer may still write its part there; with no "
        f"{MANIFEST} it is not a checkpoint: delete it once the shards are done, before saving into it again"
    )


@dataclasses.dataclass
class SaveProgress:
    """How far a save got, for the words that a Ctrl-C or SIGTERM stopping it ends with (stopped_words).
    directory: where the shards save, None for a temporary one (whose caller says what is left of it)."""

    directory: str | None
    hold_timeout_s: float
    on_released: Callable[[], None] | None = None  # save's `released`
    asked: set[int] = dataclasses.field(default_factory=set)  # the shards sent a hold
    tokens: dict[int, str] = dataclasses.field(default_factory=dict)  # shard -> its hold's token, of those held
    saving: bool = False  # the save phase was sent
    saved: bool = False  # every shard's save answered
    released: bool = False  # the release of every hold taken answered
    release_failed: str = ""  # the error of the release sent as the signal stopped the save; "": none failed

    def stopped_words(self) -> str:
        """What the save left, from what it knew as it stopped: what the directory holds (not for a temporary one),
        and whether the servers take pushes again."""
        said = []
        # the manifest is there once write_manifest renamed it into place, also where a stop cut off its fsync after
        if self.directory is not None and os.path.exists(os.path.join(self.directory, MANIFEST)):
            said.append(f"the checkpoint {self.directory} is whole: its {MANIFEST} was written.")
        elif self.directory is not None and not self.saving:
            said.append(f"no shard was asked to save: nothing was written into {self.directory}.")
        elif self.directory is not None and self.saved:
            said.append(f"every shard saved its part into {self.directory}. {_parts_left(self.directory, True)}.")
        elif self.directory is not None:
            said.append(f"the save was stopped while the shards saved. {_parts_left(self.directory)}.")
        return " ".join([*said, self._pushes_words()])

    def _pushes_words(self) -> str:
        """Whether the servers take pushes again: the shards held released, or which refuse pushes until when."""
        if not self.asked:
            return "No shard was held: the servers took pushes throughout."
        until = f"until its hold times out, {self.hold_timeout_s:g} s after it was taken"
        unanswered = sorted(self.asked - set(self.tokens))
        said = []
        if self.release_failed and self.tokens:
            said.append(f"The release of the hold of {_shards(self.tokens)} failed ({self.release_failed}): each "
                        f"refuses pushes {until}.")  # fmt: skip
        elif self.tokens and self.released:
            said.append(f"The hold of {_shards(self.tokens)} was released: pushes are taken there again.")
        elif self.tokens:  # the signal came during the release, or before it was sent
            said.append(f"The release of the hold of {_shards(self.tokens)} was cut off before it answered: each "
                        f"shard it did not reach refuses pushes {until}.")  # fmt: skip
        if unanswered:
            said.append(f"No answer came to the hold sent to {_shards(unanswered)}: where it took, each refuses "
                        f"pushes {until}.")  # fmt: skip
        return " ".join(said)


def _shards(ids: Iterable[int]) -> str:
    """'shard 3', or 'shards 0, 1, 2': shard ids in order."""
    ids = sorted(ids)
    return f"shard{'s' * (len(ids) != 1)} {', '.join(map(str, ids))}"

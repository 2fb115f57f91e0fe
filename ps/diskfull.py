"""A write that found no room on disk: how such a failure is recognised, and the DiskFullError it becomes.

A full disk is classified here, once (`disk_full_reason`): the journal, the store and the checkpoint save turn
such a failure into a DiskFullError naming the path, and the service maps any other error that carries one to
RESOURCE_EXHAUSTED as well. Its message starts DISK_FULL_PREFIX and says what to do once space is freed (RETRY, or
SHRINK_REMEDY for a Shrink that ran in part) after REMEDY_AFTER; ps.partlyapplied rewords it when part of its request
stays.
"""

import copy
import errno

from ps.errors import NOTHING_APPLIED, PsError

# errno of a write that found no room: the disk is full, or the user's disk quota is spent
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DISK_FULL_PREFIX = "the server's disk is full"  # how a DiskFullError's message starts
# their texts, as RocksDB's errors carry them ("IO error: No space left on device: <file>"; a plain Exception)
DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded")
RETRY = "retry"  # a DiskFullError's remedy where the request is sent again, once space is freed, as it was
SHRINK_REMEDY = "wait for the next Shrink"  # a full disk's, once space is freed, for a Shrink that ran in part
REMEDY_AFTER = "(or raise the quota) and "  # what a DiskFullError's message says before its remedy (DiskFullError.of)


def disk_full_reason(e: BaseException) -> str | None:
    """Why e says a write found the disk full, or None: "No space left on device" (ENOSPC) or "Disk quota
    exceeded" (EDQUOT), for an OSError of either errno, a DiskFullError, or an error that is no OSError whose
    text holds either (rocksdict raises RocksDB's "IO error: ..." as a plain Exception)."""
    if isinstance(e, DiskFullError):
        return e.reason or DISK_FULL_TEXTS[0]
    if isinstance(e, OSError) and e.errno is not None:
        return DISK_FULL_TEXTS[DISK_FULL_ERRNOS.index(e.errno)] if e.errno in DISK_FULL_ERRNOS else None
    text = str(e)
    return next((t for t in DISK_FULL_TEXTS if t in text), None)


class DiskFullError(PsError):
    """A write this server needed found its disk full (ENOSPC) or its disk quota spent (EDQUOT):
    RESOURCE_EXHAUSTED, gRPC's code for "the entire file system is out of space". The message says so, names the
    path (the data dir, its journal, or the checkpoint dir) and says what of the request was applied: nothing,
    unless it says otherwise (partly_applied: a PushBatch's pushes applied before a later push, or its clock
    advance, failed; a Shrink's chunks written before it stopped). Not retried by the client: it fails the same
    way until space is freed on the server."""

    status = "RESOURCE_EXHAUSTED"
    wire_fields = ("reason", "what", "disk", "outcome", "remedy")

    def __init__(self, message: str, reason: str = "", what: str = "", disk: str = "", outcome: str = "",
                 remedy: str = RETRY):  # fmt: skip
        super().__init__(message)
        self.reason = reason  # DISK_FULL_TEXTS' entry, where known
        self.what = what  # what failed, and where
        self.disk = disk  # a path on the disk that is full, where `what` names more than one
        self.outcome = outcome  # what of the request stands, as the message ends ("": not said)
        self.remedy = remedy  # what to do once space is freed

    @classmethod
    def of(
        cls, reason: str, what: str, outcome: str = NOTHING_APPLIED, disk: str = "", remedy: str = RETRY
    ) -> "DiskFullError":
        """The error for `what` (what failed, naming the path) failing for `reason` (disk_full_reason's);
        outcome: what of the request stands, the message's end ("": none; partly_applied adds what stays when
        part of the request was applied); disk: a path on the full disk, named when `what` names more than one;
        remedy: what to do once space is freed."""
        where = f"the disk of {disk}" if disk else "that disk"
        return cls(
            f"{DISK_FULL_PREFIX} ({reason}): {what}; free space on {where} {REMEDY_AFTER}{remedy}"
            + (f"; {outcome}" if outcome else ""),
            reason,
            what,
            disk,
            outcome,
            remedy,
        )

    @classmethod
    def received(cls, message: str, head: str, fields: dict[str, str]) -> "DiskFullError":
        """A client's copy of a shard's DiskFullError (see PsError.received): its fields as the shard sent them, head
        starting `what` (the message names the shard and the call there). A refusal that came without them all (a
        shard that sends none, or one whose fields were over ps.errornames MAX_FIELDS_BYTES) has its message
        alone: every field "", its remedy included (not known; partly_applied rewords its message, the remedy at its
        end included)."""
        if any(name not in fields for name in cls.wire_fields):
            return cls(message, remedy="")
        f = fields
        return cls(message, f["reason"], head + f["what"], f["disk"], f["outcome"], f["remedy"])

    def instead(self, outcome: str, disk: str | None = None, remedy: str | None = None) -> "DiskFullError":
        """The same error with another outcome (and disk, and remedy, if given: else its own): a copy, its class and
        other attributes (a client's refused_by) kept."""
        disk = self.disk if disk is None else disk
        remedy = self.remedy if remedy is None else remedy
        fresh = DiskFullError.of(self.reason or DISK_FULL_TEXTS[0], self.what or str(self), outcome, disk, remedy)
        reworded = copy.copy(self)
        vars(reworded).update(vars(fresh))
        reworded.args = fresh.args
        return reworded

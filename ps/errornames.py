"""How a refusal's PsError crosses gRPC: the trailing metadata that names its class (ERROR_NAME_KEY) and carries its
fields (error_metadata, error_fields), and the class a client raises for a refused call's status and that name
(error_class).

gRPC takes only printable ASCII (and space) in a metadata value and fails the whole call (INTERNAL, "Invalid
metadata") on anything else, so a field is percent-encoded: its UTF-8 bytes outside that range, and "%", as %XX
(a path "/données" crosses as "/donn%C3%A9es"); the client decodes it back whole. Trailing metadata over gRPC's limit
(8 KiB by default) loses the refusal too, so the fields of a refusal go only where, encoded, they take at most
MAX_FIELDS_BYTES together; a refusal whose fields take more is sent with its name and message alone, as by a
shard that sends no fields, and its client's copy has its message alone (PsError.received).
"""

from __future__ import annotations

from collections.abc import Iterable
from string import printable, whitespace
from urllib.parse import quote, unquote

from ps.diskfull import DiskFullError
from ps.errors import (
    BarrierTimeoutError,
    CallerGoneError,
    CheckpointDamagedError,
    CheckpointDirError,
    CheckpointHoldError,
    CheckpointInProgressError,
    CheckpointOutsideRootError,
    ClientTableFullError,
    DataDirLostError,
    DataLossError,
    FileTooLargeError,
    InvalidArgumentError,
    JobConflictError,
    ModelStateReplacedError,
    NoCheckpointRootError,
    PsError,
    RamTierTooSmallError,
    ReplyTooLargeError,
    RequestSeqReusedError,
    RequestTooLargeError,
    RpcThreadsExhaustedError,
    ServerUnavailableError,
    ShardClosingError,
    ShardNeedsRestartError,
    ShardStartingError,
    ShrinkRunningError,
    StorageError,
    SyncStepTooLargeError,
    TableBusyError,
    TableExistsError,
    TableNotFoundError,
    TableNumbersExhaustedError,
    WorkerDoneError,
    WrongShardError,
)

ERROR_NAME_KEY = "sparseps-error"
"""The trailing metadata of a refused call that names the PsError class the server raised (ps.service), so a
client raises that class (error_class), not only its status's; its fields follow as ERROR_NAME_KEY-<field>."""

MAX_FIELDS_BYTES = 3 * 1024
"""Of a refusal's fields together, percent-encoded: with its message (ps.errors MAX_DETAILS_BYTES, at most 3x that
once percent-encoded) and the names, its trailing metadata stays under gRPC's 8 KiB limit."""

_ASCII = "".join(c for c in printable if c not in whitespace and c != "%") + " "  # what a field keeps as it is


def error_metadata(e: PsError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata of a shard's refusal e: its class's name (ERROR_NAME_KEY), then each of its
    wire_fields, percent-encoded, keyed ERROR_NAME_KEY-<field>, where they take at most MAX_FIELDS_BYTES together;
    else the name alone."""
    named = ((ERROR_NAME_KEY, type(e).__name__),)
    fields = tuple((f"{ERROR_NAME_KEY}-{name}", quote(str(getattr(e, name)), safe=_ASCII)) for name in e.wire_fields)
    return named if sum(len(value) for _, value in fields) > MAX_FIELDS_BYTES else named + fields


def error_fields(metadata: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """The fields a refusal's trailing metadata carries (error_metadata), decoded: field -> value ({} for none)."""
    prefix = f"{ERROR_NAME_KEY}-"
    return {
        key.removeprefix(prefix): unquote(value, errors="replace")
        for key, value in metadata
        if key.startswith(prefix) and isinstance(value, str)
    }


def error_class(status: str, name: str | None) -> type[PsError]:
    """The PsError class a client raises for a call refused with gRPC status `status` whose server named the
    class `name` (ERROR_NAME_KEY): that one of SERVER_ERRORS where it has that status, else the status's
    (STATUS_TO_ERROR), else PsError."""
    for cls in SERVER_ERRORS:
        if cls.__name__ == name and cls.status == status:
            return cls
    return STATUS_TO_ERROR.get(status, PsError)


STATUS_TO_ERROR = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        TableNotFoundError,
        TableExistsError,
        WrongShardError,
        ReplyTooLargeError,
        ServerUnavailableError,
        BarrierTimeoutError,
        DataLossError,
    )
}


SERVER_ERRORS = (
    InvalidArgumentError, TableNotFoundError, TableExistsError, WrongShardError, ReplyTooLargeError,
    RequestTooLargeError, SyncStepTooLargeError, RamTierTooSmallError, RequestSeqReusedError, TableBusyError, WorkerDoneError,
    JobConflictError, ClientTableFullError, TableNumbersExhaustedError, RpcThreadsExhaustedError, CheckpointDirError,
    NoCheckpointRootError, ShardClosingError, CheckpointInProgressError, ShardStartingError, DataDirLostError,
    CheckpointHoldError, CallerGoneError, BarrierTimeoutError, FileTooLargeError, DiskFullError, StorageError,
    DataLossError, CheckpointDamagedError, CheckpointOutsideRootError, ShardNeedsRestartError, ModelStateReplacedError,
    ShrinkRunningError,
)  # fmt: skip
"""The classes a server's refusal may name for its client to raise (error_class): those a shard raises, not the
client-side ones (ClientIdInUseError, JobIdReusedError, ServerUnavailableError, RequestOutcomeUnknownError)."""

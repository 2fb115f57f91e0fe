"""How a refusal's PsError crosses gRPC: the trailing metadata that names its class (ERROR_NAME_KEY), and the
class a client raises for a refused call's status and that name (error_class)."""

from __future__ import annotations

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
    DiskFullError,
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
client raises that class (error_class), not only its status's."""


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

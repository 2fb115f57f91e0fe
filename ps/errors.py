"""The exceptions a shard raises for bad requests and failures; each names the gRPC status it maps to.

The service maps them to status codes in one place (`ps.service`); clients get the same classes back from
`worker.client`. Messages say what was expected and what arrived.
"""


class PsError(Exception):
    """Base class. `status` is the name of a `grpc.StatusCode` member."""

    status = "INTERNAL"


class InvalidArgumentError(PsError, ValueError):
    """Malformed request: byte lengths that do not match the dims, non-finite values, a bad spec."""

    status = "INVALID_ARGUMENT"


class TableNotFoundError(PsError, KeyError):
    """The named table does not exist on this shard."""

    status = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TableExistsError(PsError):
    """CreateTable named an existing table with a different spec."""

    status = "ALREADY_EXISTS"


class WrongShardError(PsError):
    """The request holds ids that another shard owns (the client's slot map or server list is wrong)."""

    status = "FAILED_PRECONDITION"


class ReplyTooLargeError(PsError):
    """The reply a request asks for would exceed the server's message limit (ps.config.MAX_MESSAGE_BYTES or
    ServerConfig.max_message_bytes); it is refused before anything is built. Send fewer ids per request."""

    status = "RESOURCE_EXHAUSTED"


class ServerUnavailableError(PsError, ConnectionError):
    """A shard did not answer within its deadline (client side)."""

    status = "UNAVAILABLE"


class ShardClosingError(PsError):
    """The server is shutting down and takes no more requests (retry on its replacement)."""

    status = "UNAVAILABLE"


class CheckpointInProgressError(PsError):
    """The shard holds pushes while a checkpoint is taken (seconds); clients retry."""

    status = "UNAVAILABLE"


class StorageError(PsError):
    """The on-disk store failed or holds data that cannot be read back."""

    status = "INTERNAL"


class DataLossError(StorageError):
    """The data dir's files are damaged: RocksDB found a block whose checksum fails, or cannot read a file it
    needs. `ps-server verify DIR` lists what is damaged."""

    status = "DATA_LOSS"


STATUS_TO_ERROR = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        TableNotFoundError,
        TableExistsError,
        WrongShardError,
        ReplyTooLargeError,
        ServerUnavailableError,
        DataLossError,
    )
}

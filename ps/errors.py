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


STATUS_TO_ERROR = {
    cls.status: cls
    for cls in (InvalidArgumentError, TableNotFoundError, TableExistsError, WrongShardError, ServerUnavailableError)
}

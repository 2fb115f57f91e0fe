"""The exceptions a shard raises for bad requests and failures; each names the gRPC status it maps to.

The service maps them to status codes in one place (`ps.service_calls`); clients get the same classes back from
`worker.client`, by the class name the refusal carries (`ps.errornames`). Messages say what was expected and what
arrived; a value that came from a client is echoed through `echo`, so that no message grows with the request, and
the service sends at most MAX_DETAILS_BYTES of a message (`clip`): gRPC carries it in a trailer, and refuses
trailers over its metadata limit (8 KiB by default). An error's own fields (wire_fields: a DiskFullError's reason,
path, remedy) cross beside its message, whole, in that trailer (ps.errornames), and the client's copy takes them
from there (PsError.received); its message is the shard's text as it came.

A full disk's error, and how a failure is recognised as one, are in ps.diskfull; a refusal of a request part of
which stays is reworded by ps.partlyapplied.
"""

MAX_ECHO_CHARS = 100  # of a client's value echoed in a message
MAX_DETAILS_BYTES = 1024  # of a status message, UTF-8; percent-encoded in the trailer, it takes at most 3x this


def echo(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """ascii() of a value a client sent, for an error message: cut to `limit` characters, with its length, when
    longer (`'xxxx'... (20,000 characters)`). ascii, not repr: every character of it is one byte on the wire."""
    text = ascii(value)
    if len(text) <= limit:
        return text
    size = f"{len(value):,} characters" if isinstance(value, str) else f"{len(text):,} characters as written"
    return f"{text[:limit]}... ({size})"


def clip(message: str, max_bytes: int = MAX_DETAILS_BYTES) -> str:
    """message cut to at most max_bytes of UTF-8 (a note of how much was cut included), for a status's details."""
    data = message.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return message
    note = f" ... ({len(data) - max_bytes + 40:,} more bytes cut)"
    return data[: max_bytes - 40].decode("utf-8", "ignore") + note


class PsError(Exception):
    """Base class. `status` is the name of a `grpc.StatusCode` member; wire_fields: the attributes a shard's refusal
    sends its client beside the message (ps.errornames.error_metadata), str each."""

    status = "INTERNAL"
    wire_fields: tuple[str, ...] = ()

    @classmethod
    def received(cls, message: str, head: str, fields: dict[str, str]) -> "PsError":
        """A client's copy of a shard's refusal of this class: message, the client's words (head: where and which
        call, "shard 1 at H:P: Shrink failed with NOT_FOUND: ") before the shard's; fields: the wire_fields its
        shard sent (ps.errornames.error_fields). A class with wire_fields overrides this to set them
        (ps.diskfull DiskFullError.received); this one, for a class without any, makes the error of the message
        alone."""
        return cls(message)


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


class RequestTooLargeError(PsError):
    """The copies a request would make of its rows exceed the server's whole room for requests (the `requests`
    part of --memory-bytes, ps.engine.room); it is refused before anything is read or applied. Send fewer ids per
    request (worker.client sizes its messages by the room the shards report), or give the server a larger
    --memory-bytes."""

    status = "RESOURCE_EXHAUSTED"


class SyncStepTooLargeError(PsError):
    """A contribution to a sync step would take the sync steps' contributions (and the copies their sums make) past
    the `sync_steps` part of --memory-bytes (ps.engine.syncsteps): the job stops for each of its workers (the step
    could not complete), nothing of the step applied. Train with smaller batches, fewer workers or more shards, or
    give the server a larger --memory-bytes."""

    status = "RESOURCE_EXHAUSTED"


RAM_TIER_BUDGETS = ("cache", "memory", "cache+memory")  # RamTierTooSmallError.budget: the flags it asks raised


class RamTierTooSmallError(PsError, ValueError):
    """The RAM tier (--cache-bytes, or what --memory-bytes leaves) cannot hold what is asked: a new table's share
    of it (CreateTable), or a checkpoint's tables (restore). Raise --cache-bytes (or --memory-bytes), keep
    fewer tables on a shard, or send fewer ids per request. Its fields (wire_fields, 0 or "" where not known):
    `tables`, the number of tables the tier was asked to share (a refused CreateTable's table number),
    `floor_bytes`, the least share each of them must hold, and `budget`, the flags the refusal asks raised (one of
    RAM_TIER_BUDGETS: "cache", --cache-bytes; "memory", --memory-bytes, whose rest is the tier; "cache+memory",
    --cache-bytes and --memory-bytes to hold it); so a worker sizes what its whole model needs, and says which flag
    to raise, without reading the message."""

    status = "RESOURCE_EXHAUSTED"
    wire_fields = ("tables", "floor_bytes", "budget")

    def __init__(self, message: str, tables: int = 0, floor_bytes: int = 0, budget: str = ""):
        super().__init__(message)
        self.tables = tables
        self.floor_bytes = floor_bytes
        self.budget = budget

    @classmethod
    def received(cls, message: str, head: str, fields: dict[str, str]) -> "RamTierTooSmallError":
        """A client's copy of a shard's refusal (see PsError.received): its counts where the shard sent both as at
        most 20 ASCII digits, each at most 2^64 - 1 (what a shard's counts can be: longer digit strings would make
        int() or the bytes shown of them fail), else 0 and 0; its budget where the shard sent one of
        RAM_TIER_BUDGETS, else ""."""
        counts, budget = [fields.get("tables", ""), fields.get("floor_bytes", "")], fields.get("budget", "")
        tables, floor_bytes = (int(counts[0]), int(counts[1])) if all(_a_count(c) for c in counts) else (0, 0)
        return cls(message, tables, floor_bytes, budget if budget in RAM_TIER_BUDGETS else "")


def _a_count(text: str) -> bool:
    """Whether text is a count a shard sends: 1 to 20 ASCII digits, at most 2^64 - 1."""
    return 0 < len(text) <= 20 and text.isascii() and text.isdigit() and int(text) < 1 << 64


class TableNumbersExhaustedError(PsError):
    """CreateTable of a new table on a shard whose highest table number is the largest a row key's table field
    takes (2^32 - 1): a new table takes the number after the highest, and none is left. Nothing is created; a
    checkpoint restored into a new data dir numbers its tables from 0."""

    status = "RESOURCE_EXHAUSTED"


class TableBusyError(PsError):
    """A request on a table under its share of the RAM tier needed rows that only tables above their shares hold,
    and those tables were busy taking rows back themselves (ps.storage.budget: a possible cycle of waits, each
    broken after RECLAIM_WAIT_S; its message names them), or other tables took the rows the request was cut for
    while it ran (a table joined and halved the shares). The rows exist: nothing was applied, and clients send the
    request again, as for a shard that is unavailable."""

    status = "UNAVAILABLE"


class ClientIdInUseError(PsError):
    """Client side: a shard answered a PushBatch, on its first attempt, that it had applied the request (or part of
    it) before: another caller sends requests under this client's id. The pushes it did not apply are lost to
    this client; give each client its own id."""

    status = "FAILED_PRECONDITION"


class RequestSeqReusedError(ClientIdInUseError):
    """A PushBatch numbered as its client's newest request on a shard (same client id and seq) whose content differs
    from that request's (ps.engine.pushpath): not a retry, so nothing of it is applied. Another caller uses the
    client id, or the client numbered two requests alike. The shard's own refusal, named to the client, which
    raises it as the ClientIdInUseError it is."""

    status = "FAILED_PRECONDITION"


class WorkerDoneError(PsError):
    """A push of a training job's worker that the shard holds as done (its done stamp came): a done worker pushes
    nothing more, so the job id is being used by a second run (ps.engine.followedjob)."""

    status = "FAILED_PRECONDITION"


class JobIdReusedError(PsError):
    """Client side: a shard answered the first attempt of a sync push that it had applied that step of the job
    before: the job id was used by an earlier run, and this contribution was dropped. A job id is for one run."""

    status = "FAILED_PRECONDITION"


class JobConflictError(PsError):
    """A stamped request that conflicts with the job a shard follows (ps.engine.tenancy): a stamp of another job while
    that one is running, or an ssp push of a worker from another process than its earlier pushes (a restarted
    worker, or two processes given one worker id). Nothing was applied."""

    status = "FAILED_PRECONDITION"


class ClientTableFullError(PsError):
    """A request of a new client that a shard refused because its exactly-once table holds ps.config MAX_CLIENTS
    clients (ps.storage.applied: it drops none that may still be retried). Nothing was applied; the clients it
    holds go on. A process should keep one Client, not make one per request. Its message holds CLIENT_TABLE_FULL."""

    status = "RESOURCE_EXHAUSTED"


CLIENT_TABLE_FULL = "takes no new client"


class RpcThreadsExhaustedError(PsError):
    """A stamped request would wait for a job's other workers while too few of the server's RPC threads are free
    for the requests that end the waits (ps.engine.jobs); refused, changing nothing. Raise ps-server --threads."""

    status = "RESOURCE_EXHAUSTED"


class CheckpointDirError(PsError):
    """A checkpoint cannot be written where asked: this server has no checkpoint root (ps-server
    --checkpoint-root), or the directory cannot be created."""

    status = "FAILED_PRECONDITION"


class NoCheckpointRootError(CheckpointDirError):
    """A checkpoint save on a server started without --checkpoint-root: it takes none."""


class CheckpointOutsideRootError(InvalidArgumentError):
    """A checkpoint save into a directory that resolves outside the server's --checkpoint-root."""


class ServerUnavailableError(PsError, ConnectionError):
    """A shard did not answer within its deadline (client side). ran: whether the call may have run on its shard
    (False: every attempt was refused before it ran, or found no connection)."""

    status = "UNAVAILABLE"
    ran = True


class RequestOutcomeUnknownError(ServerUnavailableError):
    """Client side: a PushBatch was not answered before its first attempt was ps.config RETRY_WINDOW_S old, so it
    is not sent again (its shard forgets a request REQUEST_RETENTION_S after it was applied, and a later retry
    could be applied a second time). It may or may not have been applied."""


class ShardClosingError(PsError):
    """The server is shutting down and takes no more requests (retry on its replacement)."""

    status = "UNAVAILABLE"


class CheckpointInProgressError(PsError):
    """The shard holds pushes while a checkpoint is taken (seconds); clients retry. Its message holds
    CHECKPOINT_PAUSE (the client tells a routine pause from an outage by it)."""

    status = "UNAVAILABLE"


CHECKPOINT_PAUSE = "is taking a checkpoint"


class ShardStartingError(PsError):
    """The shard listens but its start (opening its data dir, a restore, a journal replay) is not done; clients
    retry as for an outage. Its message holds SHARD_STARTING, then what the start is doing (ps.engine.startup)."""

    status = "UNAVAILABLE"


SHARD_STARTING = "is starting"

PARTLY_APPLIED = "applied, and the clock was not advanced"
"""The words of a refusal of a request part of which was applied and stays: a batch push's pushes before the refused
one, or before its clock advance failed (ps.engine.pushpath), or a Shrink's chunks written before it stopped
(ps.engine.shrinkprogress): that attempt ran, in part, however its status reads (worker.retry.may_have_run)."""

SHARDS_STAY_SHRUNK = "those shards stay shrunk, rows decayed once (where a decay is set) and the ids they dropped gone"
"""The words of a Shrink's outcome where some shards shrank and another refused (worker.shrinkreplies): what the
shards that shrank changed stays, and they take no Shrink before the next one is due. A Shrink has no clock:
PARTLY_APPLIED's words are a shard's own (a Shrink it stopped part way, which the client reads)."""

OVERLOADED = "Concurrent RPC limit exceeded"
"""gRPC's text of a call a server refused, RESOURCE_EXHAUSTED, before running it: its threads were busy and as many
calls as ps-server --max-queued-calls waited for them (ps.server). It names no PsError: clients send it again, as
for a shard that is down (worker.retry), and health probes ask again (ps.health)."""


class DataDirLostError(PsError):
    """The shard's data dir was deleted or replaced, or its open journal segment deleted, under the running server
    (ps.storage.journal.Journal.check_intact): what it acknowledges could no longer be kept, so it takes no more
    writes. Not retried: the server has to be restarted (on an intact data dir); the message says since when
    pushes could not be kept, and that nothing of the refused request was applied."""

    status = "FAILED_PRECONDITION"


NOTHING_APPLIED = "nothing was applied"  # a refusal's outcome where none of the request was applied
NOTHING_READ_OR_APPLIED = "nothing was read or applied"  # a request refused before it read a row or changed one
NOTHING_OF_THE_STEP_APPLIED = "nothing of the step was applied"  # a sync step failed: no worker's push of it applied
# what the errors of a Shrink that ran in part, may have run, or runs say to do: one sent again decays rows twice
SHRINK_NOT_AGAIN = "send no Shrink before the next one is due"

MODEL_STATE_REPLACED = "holds another model state than the one this client started with"  # its message's words


class ModelStateReplacedError(PsError):
    """A request that carried the shard's state id as its client read it (StatsResponse state_id, at wait_ready): a
    PushBatch, a PullBatch, a CreateTable, a Shrink, or a checkpoint's hold or save, found another one: the shard's
    data dir was restored from a checkpoint or started anew since, so the model state the client trains on, scores
    with, creates a table in, shrinks or checkpoints is gone from it. Nothing of the request is applied, created,
    shrunk, held, saved or read (the message says which: ps.replacedstate.model_state_replaced); not retried (a
    restarted client works with what the shard holds now). The client raises it too: for a refusal of a call that
    carries no state id by a shard whose Stats give another one (worker.shard_calls), and for a checkpoint save whose
    shards were replaced since its client read them, before any hold (worker.checkpoint)."""

    status = "FAILED_PRECONDITION"


class ShardNeedsRestartError(PsError):
    """A push was journaled, then failed part way through being applied in RAM (a push too large for one pass,
    whose later part needed a RocksDB read or write that failed): the journal holds all of it, RAM some of it. The
    shard takes no more writes (nor Stats), the push's table no requests at all, and nothing is flushed (so the
    journal keeps the push); a restart replays it whole. Not retried: the server has to be restarted; the
    message says which push and why."""

    status = "FAILED_PRECONDITION"


class CheckpointHoldError(PsError):
    """A checkpoint's hold cannot be had (another checkpoint holds the shard or saves there, or a Shrink runs there)
    or was lost (it expired, or was released, before the save); or a Shrink cannot run, since a checkpoint holds its
    shard or saves there (ps.engine.hold PushHold.shrink_slot: nothing applied). Not retried: waiting does not end
    another checkpoint, nor revive an expired hold; a Shrink runs for minutes, and a checkpoint's save of a large shard
    too (a client that retried would count the shard as down and give up after its server timeout, blaming an
    outage); the message says when to send it again (a Shrink's refusal ends ": <shrink_remedy>"; partly_applied
    drops it where the outcome of the request says it)."""

    status = "FAILED_PRECONDITION"
    shrink_remedy = "send the Shrink once that checkpoint has ended"  # a Shrink's refusal's (ps.engine.hold)


class ShrinkRunningError(PsError):
    """A Shrink sent to a shard while another runs there (a client's whose deadline passed, an operator's): one at a
    time (ps.engine.shrinkprogress ShrinkRunning), since a second would decay the rows a second time. Nothing of it
    is applied; not retried: SHRINK_NOT_AGAIN; the next one shrinks what the running one leaves."""

    status = "FAILED_PRECONDITION"


class CallerGoneError(PsError):
    """A request's caller left (its RPC was cancelled or passed its deadline) while the request waited: a stamped
    request for its job's other workers (ps.engine.jobs), a request for request room or its reply for reply room
    (ps.engine.room, ps.replies), a checkpoint hold for the pushes in flight (dropped: ps.engine.hold); or during a
    checkpoint save: before each write (nothing more is written: ps.engine.hold.save_into), after the flush (nothing
    written) and once the checkpoint is written and read back (it is removed: ps.engine.checkpointing
    ShardCheckpoints.write). Nobody reads the status; the RPC thread is free again. A PushBatch whose rows to
    return waited for reply room was applied (ps.service)."""

    status = "CANCELLED"


class BarrierTimeoutError(PsError):
    """A stamped request's wait for the other workers of its training job ended without them (ps.engine.jobs):
    its barrier_timeout_s passed, or another job took the shard over. The message names the workers waited for.
    Never retried: the job stops (a worker that is gone does not come back by waiting longer)."""

    status = "ABORTED"


class FileTooLargeError(PsError):
    """A write the limit on a file's size refused (EFBIG: the process's `ulimit -f`, or the file system's largest
    file): a resource of the server, as a full disk is."""

    status = "RESOURCE_EXHAUSTED"


class StorageError(PsError):
    """The on-disk store failed or holds data that cannot be read back."""

    status = "INTERNAL"


class DataLossError(StorageError):
    """The data dir's files are damaged: RocksDB found a block whose checksum fails, or cannot read a file it
    needs. `ps-server verify DIR` lists what is damaged."""

    status = "DATA_LOSS"


class CheckpointDamagedError(StorageError):
    """A checkpoint's files are damaged: RocksDB found a block of one whose checksum fails, or cannot read a file
    it needs, or a value it holds does not read as the store's grammar says. Restore and export refuse it;
    `ps-server verify CHECKPOINT` lists what is damaged. checkpoint: its directory; where: the file (relative to
    it) and offset, as far as RocksDB named them, or the shard's folder ("" if none is named); what: the damage, as
    the message says it after "is damaged: ". Not a DataLossError, which is the data dir's damage (as is damage a
    save meets reading back the checkpoint it just wrote: ps.storage.store.Store.saved_counts)."""

    status = "DATA_LOSS"

    def __init__(self, message: str, checkpoint: str = "", where: str = "", what: str = ""):
        super().__init__(message)
        self.checkpoint, self.where, self.what = checkpoint, where, what

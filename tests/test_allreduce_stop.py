"""worker/allreduce_stop.py: a --dense allreduce worker that stops writes its MLP to the servers unless its error
rules the write out, and logs what happened, with a stand-in writer whose write raises each kind of error."""

from __future__ import annotations

import pytest

from ps import diskfull, errors
from ps.errors import ModelStateReplacedError, ServerUnavailableError
from worker.allreduce_stop import save_dense_on_stop


def test_a_worker_stopped_by_anything_but_a_server_error_saves_the_mlp_and_a_failure_is_logged(caplog):
    dense = StoppedDense()
    save_dense_on_stop(dense, KeyboardInterrupt())
    save_dense_on_stop(dense, ValueError("a bad line"))
    save_dense_on_stop(dense, ServerUnavailableError("shard 0 is down"))
    save_dense_on_stop(object(), KeyboardInterrupt())  # the PS path: nothing to do
    assert dense.saved == 2
    dense.fails = ConnectionError("shard 0 did not answer")
    save_dense_on_stop(dense, KeyboardInterrupt())
    assert "could not write the MLP to the servers as this worker stopped" in caplog.text


class StoppedDense:
    """A stand-in for AllReduceDense's writer as it stops: save_on_stop counts its writes, or raises `fails`."""

    def __init__(self, fails: BaseException | None = None):
        self.saved, self.fails = 0, fails

    def writes_on_stop(self) -> bool:
        return True

    def save_on_stop(self) -> bool:
        if self.fails is not None:
            raise self.fails
        self.saved += 1
        return True


def _refusals() -> list:
    """(error, what the log says of it, whether a stop on it still writes the MLP) for each kind of error a
    stopped worker or its save can meet (worker/allreduce_stop.py)."""
    failed, refused = "the servers failed", "a request was refused, the servers are up"
    job, replaced = (
        "the shards refuse this worker's job",
        "the servers hold another model state than the one this run trained",
    )
    return [
        (errors.InvalidArgumentError("grads holds NaN"), refused, True),
        (errors.TableNotFoundError("no table dense_0"), refused, True),
        (errors.RequestTooLargeError("too many ids"), refused, True),
        (errors.BarrierTimeoutError("worker 1 did not come"), refused, True),
        (errors.JobConflictError("shard 0 holds job 'other'"), job, False),
        (errors.WorkerDoneError("worker 0 is done"), job, False),
        (errors.JobIdReusedError("step 3 applied before"), job, False),
        (errors.ClientIdInUseError("applied before"), job, False),
        (diskfull.DiskFullError.of("No space left on device", "the journal of /d"), failed, False),
        (errors.ServerUnavailableError("shard 0 did not answer"), failed, False),
        (errors.RequestOutcomeUnknownError("no answer in time"), failed, False),
        (errors.ShardClosingError("shutting down"), failed, False),
        (errors.ShardStartingError("shard 0 is starting"), failed, False),
        (errors.DataDirLostError("the data dir was deleted"), failed, False),
        (errors.ShardNeedsRestartError("restart it"), failed, False),
        (errors.DataLossError("a block's checksum fails"), failed, False),
        (errors.PsError("an error of no class"), failed, False),
        (errors.ModelStateReplacedError("shard 0 holds another model state"), replaced, False),
    ]


@pytest.mark.parametrize(
    "error, said, writes", _refusals(), ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None
)
def test_a_stop_writes_the_mlp_unless_its_error_rules_the_write_out_and_says_which(caplog, error, said, writes):
    """A worker stopped by a refusal of a request (the client's fault, a request too large, a barrier timeout) still
    writes the MLP; one stopped by the servers failing, the model state replaced or the job refused does not, and
    its writer logs that, naming what happened (not a server failure for every PsError); a non-writer says
    nothing. A write that fails logs what its error says; nothing is raised."""
    dense = StoppedDense()
    save_dense_on_stop(dense, error)
    assert dense.saved == int(writes)
    assert (f"did not write the MLP of this worker's last step to the servers as it stopped (--dense allreduce): "
            f"{said}" in caplog.text) is not writes, caplog.text  # fmt: skip
    caplog.clear()
    dense.writes_on_stop = lambda: False  # another rank: the writer says it
    save_dense_on_stop(dense, error)
    assert "did not write" not in caplog.text
    caplog.clear()
    save_dense_on_stop(StoppedDense(fails=error), KeyboardInterrupt())
    assert f"could not write the MLP to the servers as this worker stopped (--dense allreduce): {said} (" in caplog.text
    kept = "they hold the MLP written last"
    assert (kept in caplog.text) is not isinstance(error, ModelStateReplacedError), caplog.text
    assert ("unless a shard applied part of this write before it failed" in caplog.text) is not isinstance(
        error, ModelStateReplacedError
    ), caplog.text  # a write is a push per table and shard: one that failed may have landed in part


def test_a_stop_on_a_refusal_that_stopped_the_job_writes_no_mlp(caplog):
    """A shard's refusal relayed as "shard N: job J stops: ..." (ps.stamp stopping_refusal): the shards that
    stopped the job refuse the write and the others would apply it, so none is made. The same error without the
    job's stamp, or of the worker's own making (no shard refused it), leaves the write made."""
    from ps.stamp import WorkerStamp

    stamp = WorkerStamp(7, 0, 2, 0, setup="mode=async", unclocked=True)

    def refused(by_shard: bool) -> errors.InvalidArgumentError:
        error = errors.InvalidArgumentError("shard 0 at h:1: PushBatch failed: shard 0: job 7 stops: worker 1 differs")
        if by_shard:
            error.refused_by = 0  # (worker.retry: a shard's refusal)
        return error

    dense = StoppedDense()
    save_dense_on_stop(dense, refused(by_shard=True), stamp)
    assert dense.saved == 0 and "a shard's refusal stopped the job (InvalidArgumentError: " in caplog.text
    save_dense_on_stop(dense, refused(by_shard=True))  # no stamp: the job is not known
    save_dense_on_stop(dense, refused(by_shard=False), stamp)
    assert dense.saved == 2

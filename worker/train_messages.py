"""What a training run says of itself beyond its figures: its mode, a validation set too small to choose epochs
by, and, when it stops early, what its pushes left on the servers and the flags that train on from there.
"""

from __future__ import annotations

from typing import Any

from ps.bytesize import human_bytes
from worker.loop import LoopResult, TrainingDataError
from worker.models.spec import MLP_MODELS
from worker.train_config import TrainConfig


def mode_line(cfg: TrainConfig) -> str:
    """What the run's mode means, in one line of output."""
    who = f"worker {cfg.worker_id} of {cfg.num_workers}"
    what = {
        "async": "async: each push applied as it arrives",
        "sync": f"sync: each step's pushes of all workers summed, applied once (waits up to {cfg.barrier_timeout_s:g} s)",
        "ssp": f"ssp: at most {cfg.staleness} steps ahead of the slowest worker (waits up to {cfg.barrier_timeout_s:g} s)"
        + (f", row cache {human_bytes(cfg.row_cache_bytes)}" if cfg.row_cache_bytes else ""),
        "geo": f"geo: local rows, their deltas pushed every {cfg.geo_every} steps",
    }[cfg.mode]
    dense = (
        "allreduce among the job's workers (torch.distributed)"
        if cfg.dense == "allreduce"
        else (
            f"on the servers, at most {cfg.dense_staleness} steps behind"
            if cfg.dense_staleness
            else "on the servers, in the step"
        )
    )
    return f"{who}, mode {what}" + (f"; MLP {dense}" if cfg.model in MLP_MODELS else "")


def stopped_message(e: TrainingDataError, cfg: TrainConfig) -> str:
    """The error of a run that stopped on bad training data, saying what its pushes left on the servers."""
    if not e.steps or cfg.local_shards:  # local shards go, with what was pushed to them
        return str(e)
    if cfg.launched:  # under launch, which says where the job's workers can resume
        return f"{e}; the run stopped after {e.steps:,} steps ({e.examples:,} examples) had pushed their updates"
    how = (f"the same command trains on from there: {_kept_position(cfg)}" if cfg.resume_file else
           f"{_resume_flags(cfg.skip_examples + e.examples, cfg)} trains on from there")  # fmt: skip
    return (
        f"{e}; the run stopped after {e.steps:,} steps ({e.examples:,} examples) had pushed their updates: the "
        f"servers now hold a partly trained model (once the line is fixed or --max-bad-lines raised, {how})"
    )


def resume_hint(loop: LoopResult, cfg: TrainConfig) -> str:
    """What an interrupted run trained, and the flags that train on from there (none: it had trained every
    example, or its model was on local shards, gone with them)."""
    done = cfg.skip_examples + loop.pushed  # geo: its last steps' deltas may be held here, not on the servers
    if not loop.examples:
        how = _kept_position(cfg) if cfg.resume_file else _resume_flags(done, cfg)
        return (f"ps-worker: stopped before its first step, while reading the {done:,} examples it skips: to train on, "
                f"run the same command again ({how})")  # fmt: skip
    if cfg.local_shards:
        trained = cfg.skip_examples + loop.examples
        return (f"ps-worker: stopped in epoch {loop.epoch} of {cfg.epochs} after {trained:,} training examples; the "
                "model was on local shards, stopped with this run: nothing to resume (train with --servers to keep "
                "what a stopped run trained)")  # fmt: skip
    if loop.training_over:
        if loop.restoring_best:
            return (f"ps-worker: the run had trained all its {done:,} examples when it stopped, as it put early "
                    f"stopping's best model back: nothing to resume, but {_NOT_THE_BEST}")  # fmt: skip
        return (f"ps-worker: the run had trained all its {done:,} examples when it stopped (after its last step): "
                "nothing to resume")  # fmt: skip
    flight = (f" (the step under way as it stopped, {loop.in_flight:,} examples more, may have reached some shards "
              "too: a resumed run trains it again)") if loop.in_flight else ""  # fmt: skip
    how = (f"run the same command again ({_kept_position(cfg)})" if cfg.resume_file
           else f"run the same command with {_resume_flags(done, cfg)}")  # fmt: skip
    held = loop.examples - loop.pushed
    steps = "" if held else f" in {loop.steps:,} steps"
    lost = (f" (the {held:,} examples it trained after them, in geo's local rows, were not pushed, or not whole: a "
            "resumed run trains them again)") if held else ""  # fmt: skip
    return (f"ps-worker: stopped in epoch {loop.epoch} of {cfg.epochs} after {done:,} training examples (this run's "
            f"{loop.pushed:,}{steps}) had pushed their updates, which the servers keep{lost}{flight}; to train on "
            f"from there, {how}")  # fmt: skip


_NOT_THE_BEST = (
    "the tables hold the last model, or part of the best one (some tables' or shards' deltas pushed, not others'), "
    "not the best, which lived only in the stopped worker's memory"
)


def best_not_put_back(cfg: TrainConfig) -> str:
    """What a --resume-file start whose run stopped as early stopping's best model was put back says before its
    evaluation (worker/resume.py best_not_put_back)."""
    return (f"--resume-file {cfg.resume_file}: the run stopped as it put early stopping's best model back, so "
            f"{_NOT_THE_BEST}: this evaluation scores the model the tables hold")  # fmt: skip


def _kept_position(cfg: TrainConfig) -> str:
    """What resumes a run of --resume-file: the same command, its file holding the position (another
    --skip-examples than the command's would be refused); sync and ssp: the job's every worker, under a new job id
    (worker/resume.py)."""
    whole = (f"; a --mode {cfg.mode} job resumes whole: every worker again, each with its file, and a new --job-id "
             "if you gave one") if cfg.mode in ("sync", "ssp") else ""  # fmt: skip
    return f"--resume-file {cfg.worker_resume_file()} holds the position{whole}"


def _resume_flags(done: int, cfg: TrainConfig) -> str:
    """The flags of a run that resumes after `done` training examples."""
    job = (
        " (and a new --job-id, if you gave one: each worker of the job resumed with its own count)"
        if cfg.mode in ("sync", "ssp")
        else ""
    )
    return f"--skip-examples {done}{job}"


MIN_VALIDATION_CLASS = 30  # of each label: fewer, and the validation AUC's noise picks the epochs


def one_class_labels(label: str | None, share: Any, data: str | None, num_workers: int) -> str | None:
    """What to say when every training label of this worker's share (share: its worker.data.LabelOrder, known
    once the share was read to its end, or None) is the same: a model trained on it only learns that rate. None
    otherwise."""
    if share is None or data is None:
        return None
    positives, n = share.positives, share.examples
    if n == 0 or 0 < positives < n:
        return None
    column = f"'{label}'" if label else "the label (the header's first column)"
    in_share = "" if num_workers == 1 else " of this worker's share"
    return (
        f"{column} is {1 if positives else 0} in all {n:,} examples{in_share} of {data}: there is nothing "
        "to learn but that rate (is the label column right? --label-column, or `label` in the schema, names it)"
    )


def sorted_by_label(order: Any, data: str | None, read_as_trained: bool = False) -> str | None:
    """A warning when the labels, in reading order, change less than half as often as in a random order
    (2 p (1 - p) (n - 1) changes expected; checked where that is 20 or more): the file looks sorted or grouped by
    its label, and training reads it in that order, batch after batch of one label. None otherwise. order: the
    worker.data.LabelOrder of what was read (None: nothing to tell); read_as_trained: counted as the training read
    it (its first epoch, in file order): said after training."""
    if order is None or data is None:
        return None
    positives, n, changes = order.positives, order.examples, order.changes
    if n < 2:
        return None
    p = positives / n
    expected = 2 * p * (1 - p) * (n - 1)
    if expected < 20 or changes >= expected / 2:
        return None
    times = "time" if changes == 1 else "times"
    return (f"{data} looks sorted or grouped by its label: in reading order the label changes {changes:,} {times}, "
            f"where a random order of its {n:,} examples would change it about {expected:,.0f} times; training "
            f"{'read' if read_as_trained else 'reads'} the lines in that order (--shuffle off), so its batches "
            f"{'held' if read_as_trained else 'hold'} one label for long stretches, which trains a worse model: "
            "train with --shuffle on (it holds the examples in memory), or shuffle the lines first (e.g. `shuf`, "
            "keeping a CSV header on top)")  # fmt: skip


def _label_counts(validation: list) -> tuple[int, int]:
    """(positives, negatives) of the validation batches."""
    n = sum(len(b) for b in validation)
    ones = int(sum(float(b.labels.sum()) for b in validation))
    return ones, n - ones


def validation_auc_undefined(validation: list, metric: str) -> str | None:
    """Where metric is "auc" and the validation batches hold one label only: the refusal's text (every evaluation's
    AUC is undefined, so early stopping and the best model kept would go by nothing), else None."""
    if metric != "auc" or not validation:
        return None
    ones, zeros = _label_counts(validation)
    if ones and zeros:
        return None
    return (f"--early-stop-metric auc: the validation set holds {ones:,} positive and {zeros:,} negative "
            "examples, so its AUC is undefined at every evaluation and early stopping and the best model kept would "
            "go by nothing; give --validation-data a held-out file of both labels, a larger --validation-fraction, "
            "or --early-stop-metric logloss")  # fmt: skip


def validation_too_small(validation: list) -> str | None:
    """A warning when the validation batches hold fewer than MIN_VALIDATION_CLASS examples of either label, else
    None."""
    ones, zeros = _label_counts(validation)
    if min(ones, zeros) >= MIN_VALIDATION_CLASS:
        return None
    return (f"the validation set holds {ones:,} positive and {zeros:,} negative examples: too few to tell epochs "
            "apart (its AUC moves by chance), so early stopping and the best epoch follow noise; give "
            "--validation-data a larger held-out file, a larger --validation-fraction, or --epochs with "
            "--early-stop 0")  # fmt: skip

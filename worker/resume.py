"""`ps-worker train --resume-file FILE`: where one worker keeps its position in its stream of training examples,
so that the same command started again (a container's restart policy, a Job's retry) trains on from there
instead of from the stream's start.

The file is JSON, replaced whole (written to a temporary file beside it, flushed to disk, renamed over FILE):

    {"format": 1, "run": {SETTING: VALUE, ...}, "started_from": S, "examples": N, "trained": false,
     "finished": false, "state_ids": [ID, ...], "job_id": J, "job_name": NAME, "token": T,
     "resuming_as": [R, ...], "best_not_put_back": false}

- run: this worker's settings that define its stream and its model (RUN_SETTINGS), as given (before a recipe
  fills in what was left unset), but for format: the format the data is read in (data_format: --format auto's
  is the one it detects, a CSV's delimiter other than a comma with it; null where no --format is read, with
  --schema or on synthetic data), and libsvm_values: how the data is read under it (libsvm_reading: --libsvm-values
  auto's is what the built-in schema chooses for libsvm data, one-hot or weights), and data, schema and
  validation_data: the files by their full paths (full_paths: train.tsv and ./train.tsv are one file, train.tsv
  run from another directory another). A start whose settings differ is refused: the position would be another
  stream's; format and libsvm_values are compared as the data is read under each (a file's auto, as a file
  written before they were resolved holds, resolved by the data now), the files by their full paths (a relative
  one, as a file written before they were resolved holds, taken from the working directory now). A setting a
  file lacks (written before it was recorded: RECORDED_LATER) reads as its value then.
- started_from: the --skip-examples the first start of the run was given (0: none); a start given that same
  value again (the same command) resumes from the file, another value is refused.
- examples: the count of the worker's stream (over epochs, the examples a resumed start skipped included) whose
  updates the servers acknowledged: `--skip-examples N` trains on from there, as a stopped run's hint says.
- trained: the run's training is over (its stream trained, or early stopping or --max-examples ended it, the
  best model put back; or a stop came after its last step, every row update pushed, as the best model was put
  back or the MLP's last gradients pushed, those of up to --dense-staleness steps pending then left unpushed:
  DenseSync.close; its hint's "nothing to resume"); a start then trains nothing and runs the final evaluation.
- best_not_put_back: the stop came as early stopping's best model was put back (worker/loop.py restoring_best):
  the tables hold the last model, or part of the best one (some tables' or shards' deltas pushed, not others'),
  and the best lived only in the stopped worker's memory; a start's evaluation says so. Absent (a file written
  before it was recorded): false.
- finished: the run ended, its final evaluation done too; a start then does nothing and says so (but a sync or
  ssp worker's start under a new job id, which tells that job it is done and evaluates again: below).
- state_ids: each shard's model state id (StatsResponse state_id) as the run found it, in shard order; absent or
  empty: not known. A start that finds another on a shard (restored from a checkpoint, or on a new data dir, since
  the position was written) is refused: the servers no longer hold the model the position was trained into.
- job_id: the job id the run trains under (its --job-id, or the one made up at its first start); absent or null:
  not known. A start without --job-id takes it (and `ps-worker launch` gives it to every worker): a shard holds
  a job whose worker was killed without a word (SIGKILL, an OOM kill, a lost node) for its barrier timeout, and
  refuses another job's table creations and pushes until then (ps/engine/tenancy.py), but lets its own job push on.
  A start given another --job-id is refused, as for the run settings (async and geo; sync and ssp take none
  from the file, and refuse its own: below).
- job_name: the job's name, the --job-id text J is the hash of (ps.stamp job_hash), which the run's stamps carry
  for the shards' messages; absent or null: none (an integer --job-id, or one made up). A start under J takes it
  (and `ps-worker launch` gives it as every worker's --job-id), so that a worker started again without --job-id
  names its job as before.
- token: the worker process's token (ps.stamp WorkerStamp.token, made up at the run's first start); absent or null:
  not known. A start takes it: for the shards it is the same process, and pushes on at once, where another process
  given the same --worker-id (or this worker started again without the file) is refused while the first one's
  requests are heard (within the job's barrier timeout, not done or stopped).
- resuming_as: the new job ids R a sync or ssp worker was started under while the file still names the job J it
  resumes from (below: until a new job trained from the position), oldest first, the last RESUMING_AS_KEPT; absent,
  null or empty: none (the file names the job it trains under); a lone id R (a file written before it kept
  several) reads as [R]. `ps-worker launch` takes a file of job J resuming as R to be of job R too, so that the
  workers' files of one job resumed in part (some trained under R, others stopped before their first step) are
  taken as one job's; it keeps every R, as a worker refused under R can be started again alone under another new
  id and be refused again, while its peers' files name R.

It is written as the run starts (before its first CreateTable, which holds the shards for its job: the job id and
token are kept from then on; a first start that fails before it trains, refused by the shards say, or given
--skip-examples past its stream, removes the file it wrote: it records nothing),
every resume_writer.WRITE_EVERY_S seconds of training, when the run stops (an error, Ctrl-C, SIGTERM), when its
training is over and at its end. After a kill -9 the last periodic write is what is left: a restart trains again the
examples of at most the last WRITE_EVERY_S seconds, whose updates the servers then apply twice (as async
training takes a stale gradient). The MLP gradients a --dense ps run had not pushed yet (--dense-sync-every,
--dense-staleness) are not in the servers' model, as for a --skip-examples resume.

While a run uses FILE it holds a lock on a hidden file beside it (.FILE.lock, kept): the same command started again
while the first still runs is refused (both would train the worker's share and write one position).

A sync or ssp job's worker keeps its position the same way (a step's push is answered once the shards applied it:
the step's sum, in sync), but its job resumes only whole, every worker started again with its file under a new job
id: the shards keep a job's clocks, done workers and applied sync steps under its id, so a worker of the stopped job
would be refused, and a sync step of a run under its id again taken as applied. So, for these modes: a start given
the file's job id is refused while the file's training is not over (the file names the job; a start without
--job-id, one worker's, draws a new one); each worker resumes from its own position (the steps of the new job pair
other examples than the first run's did); and a worker whose training was over (trained, or finished: its run
ended) tells the new job it is done before it evaluates (a finished one evaluates again), so that its resumed
peers wait for nobody. The file names the new job only once that job trained from the position (its first step
acknowledged, or its done stamp sent): a start refused before then (the old job still holds the shards, say)
leaves the file's job (with the new one added to resuming_as), and the same command runs again.

FILE may hold "{worker}", replaced by the worker's id: workers that share a machine (torchrun's
LOCAL_WORLD_SIZE > 1) need it, each keeping its own file. The file is not used (a warning says so) with --dense
allreduce (the MLP lives in the workers, written to the servers only every 30 s: a worker's position can be ahead
of the MLP the servers hold).

The run settings compared are resume_settings.py's; the lock on FILE and its writes, resume_writer.py's.
"""

from __future__ import annotations

import dataclasses
import json
import os

from ps.errors import echo
from ps.stamp import job_named, names_job
from worker.resume_settings import (
    PATH_SETTINGS,
    RECORDED_LATER,
    RUN_SETTINGS,
    data_format,
    full_paths,
    given_settings,
    libsvm_reading,
    run_settings,
    shown_setting,
)
from worker.train_config import RESUME_WORKER, TrainConfig

FORMAT = 1
RESUMING_AS_KEPT = 8  # the new job ids a file keeps as resuming_as (a chain of refused starts: the last ones)


def resumes_whole(cfg: TrainConfig) -> bool:
    """Whether cfg's job resumes only whole, under a new job id (sync and ssp: the module docstring)."""
    return cfg.mode in ("sync", "ssp")


def rejoins(cfg: TrainConfig, position: Position) -> bool:
    """Whether a start of cfg with the file's position joins a new run of its job (sync or ssp, several workers,
    under another job id than the file's), which its worker tells that it is done where its training was over."""
    return resumes_whole(cfg) and cfg.num_workers > 1 and cfg.job_id != position.job_id


def unused_because(cfg: TrainConfig) -> str | None:
    """Why --resume-file is not used by this run (the module docstring), or None."""
    if cfg.dense == "allreduce":
        return ("--dense allreduce keeps the MLP in the workers, so a worker's position can be ahead of the MLP the "
                "servers hold; a stopped run prints the --skip-examples that resumes it")  # fmt: skip
    return None


def resume_path(cfg: TrainConfig) -> str:
    """cfg.worker_resume_file(). ValueError where workers on this machine (LOCAL_WORLD_SIZE > 1) would share one
    file."""
    path = cfg.worker_resume_file()
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if path == cfg.resume_file and local.isdigit() and int(local) > 1:
        raise ValueError(f"--resume-file {path}: the {local} workers of this machine (LOCAL_WORLD_SIZE) would share "
                         f"it; put {RESUME_WORKER} in its name (each worker's id takes its place)")  # fmt: skip
    return path


@dataclasses.dataclass(frozen=True)
class Position:
    started_from: int
    examples: int
    trained: bool
    finished: bool
    state_ids: tuple[int, ...] = ()
    job_id: int | None = None
    token: int | None = None
    job_name: str = ""
    best_not_put_back: bool = False


def read_position(cfg: TrainConfig) -> Position | None:
    """The position cfg.resume_file holds for this run; None when there is no such file (a first start).
    ValueError, naming the file, for one that cannot be read or parsed, or that is another run's."""
    path = cfg.resume_file
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(f"--resume-file {path} cannot be read: {e.strerror}") from None
    try:
        record = json.loads(text)
        if record.get("format") != FORMAT:
            raise ValueError(f"format {record.get('format')!r}, expected {FORMAT}")
        state_ids, job_id, token = record.get("state_ids", []), record.get("job_id"), record.get("token")
        job_name = record.get("job_name") or ""
        if not isinstance(state_ids, list) or not isinstance(job_name, str):
            raise ValueError("a field of the wrong type")
        if job_name and not names_job(job_name, job_id):
            raise ValueError(f"job_name {echo(job_name, 40)} is not the name of job_id {job_id}")
        position = Position(record["started_from"], record["examples"], record["trained"], record["finished"],
                            tuple(state_ids), job_id, token, job_name, record.get("best_not_put_back", False))  # fmt: skip
        run = record["run"]
        counts = (position.started_from, position.examples, *state_ids)
        flags = (position.trained, position.finished, position.best_not_put_back)
        if not (all(type(n) is int and n >= 0 for n in counts) and all(type(b) is bool for b in flags)
                and isinstance(run, dict) and all(n is None or _is_id(n) for n in (job_id, token))):  # fmt: skip
            raise ValueError("a field of the wrong type")
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        raise ValueError(f"--resume-file {path} is no position this program wrote ({e}): remove it to train from "
                         "the start, or give --skip-examples N yourself") from None  # fmt: skip
    ours, given = run_settings(cfg), {**RECORDED_LATER, **run}
    run = {**given, "format": data_format(run.get("format"), cfg),
           "libsvm_values": libsvm_reading(given["libsvm_values"], cfg),
           **{name: full_paths(given.get(name)) for name in PATH_SETTINGS}}  # fmt: skip
    now = given_settings(cfg)
    differ = [f"{name}: {shown_setting(given.get(name), run.get(name))} in the file != {shown_setting(now[name], ours[name])} "
              "now" for name in RUN_SETTINGS if run.get(name) != ours[name]]  # fmt: skip
    if position.job_id and cfg.job_id and position.job_id != cfg.job_id and not resumes_whole(cfg):
        # (not given: the file's is taken); each job by its name where it has one, as --job-id was typed
        differ.append(f"job_id: {job_named(position.job_id, position.job_name)} in the file != "
                      f"{job_named(cfg.job_id, cfg.job_name)} now")  # fmt: skip
    if differ:
        raise ValueError(f"--resume-file {path} is the position of a run with other settings ({'; '.join(differ)}): "
                         "give that run's settings to resume it, or remove the file to train from the start")  # fmt: skip
    if resumes_whole(cfg) and position.job_id and cfg.job_id == position.job_id and not position.trained:
        job = job_named(position.job_id, position.job_name)
        raise ValueError(
            f"--resume-file {path} is this worker's position in job {job} (--mode {cfg.mode}), which stopped after "
            f"{position.examples:,} of its examples, and a --mode {cfg.mode} job resumes only under a new --job-id: "
            f"the shards keep job {job}'s clocks and applied steps under its id, so its workers would be refused, or "
            "their steps taken as applied; start every worker of the job again with its --resume-file and a new "
            "--job-id (each resumes from its own position); nothing was trained"
        )
    return position


def recorded(path: str) -> tuple[tuple[int, str] | None, tuple[int, ...]]:
    """What the file at path keeps of its jobs, from one read: (job, resuming_as).

    job: the job id it keeps, with the job's name where it keeps one that is that id's ("" where not), else None
    (no such file, one that cannot be read, or no id kept): the job a launcher gives the workers it starts again
    (read_position checks the rest when each starts). resuming_as: the new job ids it keeps as resuming_as, oldest
    first (the module docstring: a sync or ssp worker's file that still names the job it resumes from); () where
    there are none. What is not a job id is left out of either."""
    record = _file_record(path)
    job_id, name = record.get("job_id"), record.get("job_name")
    job = (job_id, name if isinstance(name, str) and names_job(name, job_id) else "") if _is_id(job_id) else None
    resuming_as = record.get("resuming_as")
    ids = resuming_as if isinstance(resuming_as, list) else [resuming_as]
    return job, tuple(job_id for job_id in ids if _is_id(job_id))


def _file_record(path: str) -> dict:
    """The JSON object the file at path holds, for a launcher's look at it; {} where there is none (no such file,
    one that cannot be read, or no object)."""
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _is_id(value: object) -> bool:
    """Whether value is a job id or token as a file keeps it: an integer in [1, 2**64)."""
    return type(value) is int and 0 < value < 2**64


_NOT_TRAINED = (
    "nothing was trained. To train on from a checkpoint, give the position it was saved at "
    "(--skip-examples) without the file; remove the file to train from the start"
)


def state_changed(path: str, written: tuple[int, ...], found: tuple[int, ...], servers: list[str]) -> str | None:
    """Why the position of --resume-file `path`, written with the shards' model state ids `written`, does not
    apply to shards that give `found` (another shard count, or another id on a shard), or None when it does (or
    `written` is unknown; an id 0, a server that does not say, is unknown for its shard)."""
    if not written or tuple(written) == tuple(found):
        return None
    if len(written) != len(found):
        return (
            f"--resume-file {path} holds the position of a model on {len(written)} shard{'s' * (len(written) != 1)}, and the servers are "
            f"{len(found)}: new data dirs, or a restore onto another shard count; {_NOT_TRAINED}"
        )
    changed = [i for i, (a, b) in enumerate(zip(written, found, strict=True)) if a and b and a != b]  # 0: unknown
    if not changed:
        return None
    names = ", ".join(f"shard {i} ({servers[i]})" for i in changed)
    return (
        f"--resume-file {path} holds the position of a model the servers no longer hold: {names} "
        f"{'was' if len(changed) == 1 else 'were'} restored from a checkpoint, or started on a new data dir, "
        f"since it was written; {_NOT_TRAINED}"
    )

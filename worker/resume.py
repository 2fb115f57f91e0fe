"""`ps-worker train --resume-file FILE`: where one worker keeps its position in its stream of training examples,
so that the same command started again (a container's restart policy, a Job's retry) trains on from there
instead of from the stream's start.

The file is JSON, replaced whole (written to a temporary file beside it, flushed to disk, renamed over FILE):

    {"format": 1, "run": {SETTING: VALUE, ...}, "started_from": S, "examples": N, "trained": false,
     "finished": false, "state_ids": [ID, ...], "job_id": J, "job_name": NAME, "token": T,
     "resuming_as": [R, ...]}

- run: this worker's settings that define its stream and its model (RUN_SETTINGS), as given (before a recipe
  fills in what was left unset), but for format: the format the data is read in (data_format: --format auto's
  is the one it detects, a CSV's delimiter other than a comma with it; null where no --format is read, with
  --schema or on synthetic data), and libsvm_values: how the data is read under it (libsvm_reading: --libsvm-values
  auto's is what the built-in schema chooses for libsvm data, one-hot or weights). A start whose settings differ
  is refused: the position would be another stream's; format and libsvm_values are compared as the data is read
  under each (a file's auto, as a file written before they were resolved holds, resolved by the data now). A
  setting a file lacks (written before it was recorded: RECORDED_LATER) reads as its value then.
- started_from: the --skip-examples the first start of the run was given (0: none); a start given that same
  value again (the same command) resumes from the file, another value is refused.
- examples: the count of the worker's stream (over epochs, the examples a resumed start skipped included) whose
  updates the servers acknowledged: `--skip-examples N` trains on from there, as a stopped run's hint says.
- trained: the run's training is over (its stream trained, or early stopping or --max-examples ended it, the
  best model put back); a start then trains nothing and runs the final evaluation.
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
every WRITE_EVERY_S seconds of training, when the run stops (an error, Ctrl-C, SIGTERM), when its
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
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import json
import logging
import os
import time
from collections.abc import Iterator

from ps.errors import echo
from ps.stamp import job_named, names_job
from ps.storage.atomicfile import temp_prefix_within, write_json_whole
from worker.schema_columns import AUTO_FORMAT
from worker.train_config import RESUME_WORKER, TrainConfig

FORMAT = 1
WRITE_EVERY_S = 10.0
RUN_SETTINGS = ("data", "format", "schema", "label_column", "drop_columns", "numeric_columns", "libsvm_fields",
                "libsvm_values", "validation_data", "validation_fraction", "worker_id", "num_workers", "recipe",
                "epochs", "max_examples", "shuffle", "synthetic_rows", "synthetic_seed", "synthetic_interactions",
                "synthetic_history", "model", "mode")  # fmt: skip
RESUMING_AS_KEPT = 8  # the new job ids a file keeps as resuming_as (a chain of refused starts: the last ones)
RECORDED_LATER = {"libsvm_values": "auto"}  # settings a file written before they were recorded lacks: their value then

log = logging.getLogger("worker.resume")


def run_settings(cfg: TrainConfig) -> dict:
    """The settings a position belongs to (RUN_SETTINGS), as JSON reads them back (tuples as lists); format as
    data_format reads it."""
    read_as = {"format": data_format(cfg.format, cfg), "libsvm_values": libsvm_reading(cfg.libsvm_values, cfg)}
    return {**_given_settings(cfg), **read_as}


def _given_settings(cfg: TrainConfig) -> dict:
    """cfg's RUN_SETTINGS as given, as JSON reads them back (tuples as lists)."""
    return json.loads(json.dumps({name: getattr(cfg, name) for name in RUN_SETTINGS}))


def libsvm_reading(values: object, cfg: TrainConfig) -> object:
    """How cfg's data is read under the --libsvm-values value `values`: for auto on data read as libsvm
    (data_format), what the built-in schema reads it as (libsvm_reader.libsvm_values_read_as, of the sample
    libsvm_sample takes of its first file with content, as schema_builtin.resolve_schema does); else values as
    given."""
    if values != "auto" or data_format(cfg.format, cfg) != "libsvm":
        return values
    from worker.formats import first_with_content
    from worker.readers.libsvm_reader import libsvm_sample, libsvm_values_read_as

    return libsvm_values_read_as(values, libsvm_sample(first_with_content(cfg.data))[1])


def data_format(fmt: object, cfg: TrainConfig) -> object:
    """The format cfg's data is read in under the --format value fmt: for auto, the one formats.detect_format tells,
    with a CSV's delimiter other than a comma ("csv (delimiter ';')"; a file written as given holds auto, or the
    default criteo of a version without auto); None where no --format is read (a --schema file's own format, or
    synthetic data). ValueError where auto cannot tell it."""
    if cfg.data is None or cfg.schema is not None:
        return None
    if fmt == AUTO_FORMAT:
        from worker.formats import detect_format

        told, delimiter, _ = detect_format(cfg.data)
        return told if delimiter in (None, ",") else f"{told} (delimiter {delimiter!r})"
    return fmt


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


@contextlib.contextmanager
def held(path: str) -> Iterator[None]:
    """Holds the run's --resume-file `path` (an exclusive lock on .NAME.lock beside it, a file kept: removing it
    could let two runs lock two files). ValueError, naming the holder's process id, where another run holds it.
    Where the lock file cannot be made (or is a symbolic link, never followed), or the file system has no locks,
    nothing is held (the position's own writes say what fails)."""
    directory, name = os.path.split(os.path.abspath(path))
    lock_path = os.path.join(directory, f".{name}.lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # never a link's target
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ValueError(f"--resume-file {path} is in use by another run (process {holder}, which holds "
                             f"{lock_path}): the same command started twice would train this worker's share twice "
                             "and write one position; stop that run first, or give another file") from None  # fmt: skip
        except OSError:  # no locks here (some network file systems)
            pass
        else:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


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
                            tuple(state_ids), job_id, token, job_name)  # fmt: skip
        run = record["run"]
        counts, flags = (position.started_from, position.examples, *state_ids), (position.trained, position.finished)
        if not (all(type(n) is int and n >= 0 for n in counts) and all(type(b) is bool for b in flags)
                and isinstance(run, dict) and all(n is None or _is_id(n) for n in (job_id, token))):  # fmt: skip
            raise ValueError("a field of the wrong type")
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        raise ValueError(f"--resume-file {path} is no position this program wrote ({e}): remove it to train from "
                         "the start, or give --skip-examples N yourself") from None  # fmt: skip
    ours, given = run_settings(cfg), {**RECORDED_LATER, **run}
    run = {**given, "format": data_format(run.get("format"), cfg),
           "libsvm_values": libsvm_reading(given["libsvm_values"], cfg)}  # fmt: skip
    now = _given_settings(cfg)
    differ = [f"{name}: {_setting(given.get(name), run.get(name))} in the file != {_setting(now[name], ours[name])} "
              "now" for name in RUN_SETTINGS if run.get(name) != ours[name]]  # fmt: skip
    if position.job_id and cfg.job_id and position.job_id != cfg.job_id and not resumes_whole(cfg):
        differ.append(f"job_id: {position.job_id} in the file != {cfg.job_id} now")  # (not given: the file's is taken)
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


def ended_before(path: str) -> int | None:
    """The examples of the run whose position the file at path holds where it says that run ended ("finished"),
    else None (no such file, one that cannot be read, or a run that did not end): what a launcher tells of a worker
    that exited having nothing to do (read_position checks the rest when that worker starts)."""
    record = _file_record(path)
    examples = record.get("examples") if record.get("finished") is True else None
    return examples if type(examples) is int else None


def recorded_job(path: str) -> tuple[int, str] | None:
    """The job id the file at path keeps, with the job's name where it keeps one that is that id's ("" where not),
    else None (no such file, one that cannot be read, or no id kept): the job a launcher gives the workers it
    starts again (read_position checks the rest when each starts)."""
    record = _file_record(path)
    job_id, name = record.get("job_id"), record.get("job_name")
    if not _is_id(job_id):
        return None
    return job_id, name if isinstance(name, str) and names_job(name, job_id) else ""


def recorded_resuming_as(path: str) -> tuple[int, ...]:
    """The new job ids the file at path keeps as resuming_as, oldest first (the module docstring: a sync or ssp
    worker's file that still names the job it resumes from); () where there are none (no such file, one that
    cannot be read, or none kept). What is not a job id is left out."""
    resuming_as = _file_record(path).get("resuming_as")
    ids = resuming_as if isinstance(resuming_as, list) else [resuming_as]
    return tuple(job_id for job_id in ids if _is_id(job_id))


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


def _setting(value: object, read_as: object) -> str:
    """A run setting as a mismatch names it, given as value and read as read_as: None (a flag not given, its
    default or the recipe's; a format no --format gives) as 'not given'; a value the data resolves (--format auto,
    --libsvm-values auto) with what it is read as."""
    if read_as is None:
        return "not given"
    return repr(read_as) if value == read_as else f"{value!r} (read as {read_as!r})"


class PositionWriter:
    """Writes cfg.resume_file: at most every WRITE_EVERY_S seconds (update), and at once (write). cfg: the run's
    settings as given (before prepare fills in a recipe's), which read_position compares."""

    def __init__(self, cfg: TrainConfig, every_s: float = WRITE_EVERY_S):
        self.path, self.run, self.every_s = cfg.resume_file, run_settings(cfg), every_s
        self.started_from = cfg.skip_examples if cfg.resume_started_from is None else cfg.resume_started_from
        self.last = time.monotonic()
        self.written: int | None = None
        self.failing = False  # the last periodic write failed (logged once)
        self.state_ids = tuple(cfg.resume_state_ids)  # the shards' model state ids: the file's until the run reads them
        self.job_id = cfg.job_id  # the one given, or the file's; train() sets the one the run trains under
        self.job_name = cfg.job_name  # its name (the one given, or the file's; "": none)
        self.token = cfg.worker_token or None  # the file's; train() sets the one the run's stamps carry
        self.kept_job: tuple[int, str] | None = None  # keep_job_until_past: the file's job, written instead of job_id
        self.kept_until = 0  # ... while the position is this count, training not over
        self.resumed_as: tuple[int, ...] = ()  # ... and the new job ids the file was started under before this one
        directory, name = os.path.split(os.path.abspath(self.path))
        leftover = glob.escape(temp_prefix_within(f".{name}.")) + "*.tmp"  # write's temporary files (replaced_whole)
        for left in glob.glob(os.path.join(glob.escape(directory), leftover)):
            with contextlib.suppress(OSError):  # a write killed part way (kill -9): never renamed, never read
                os.unlink(left)

    def update(self, examples: int) -> None:
        """The position as the run starts (written at once: its job id and token kept before it holds a shard)
        and after a step (written if WRITE_EVERY_S seconds have passed since the last write and it moved). A write
        that fails (a full disk) is logged, once until one succeeds, and training goes on: the file keeps the last
        position written, which is behind, never ahead."""
        now = time.monotonic()
        first = self.written is None and not self.failing
        first |= self.kept_job is not None and examples != self.kept_until  # the new job's id, written at once
        if first or (now - self.last >= self.every_s and examples != self.written):
            try:
                self.write(examples)
            except OSError as e:
                self.last = now
                if not self.failing:
                    log.warning("%s: it keeps the position of %s examples; training goes on", e,
                                f"{self.written:,}" if self.written else "no")  # fmt: skip
                self.failing = True

    def keep_job_until_past(self, examples: int) -> None:
        """A sync or ssp run resumed under a new job id (resumes_whole) from the file's position `examples`: the
        file keeps the job id (and name) it holds until the position moves past `examples` (a step of the new job
        acknowledged) or training is over (its done stamp sent), so that a start refused before it trains (the old
        job still holds the shards, say) leaves the file's job as it was, and the same command runs again. Until
        then the file names job_id as resuming_as, after the ids it held there (the last RESUMING_AS_KEPT in all),
        which tells a launcher that the file belongs to each of these new jobs too."""
        kept = recorded_job(self.path)
        if kept is not None and kept[0] != self.job_id:
            self.kept_job, self.kept_until = kept, examples
            self.resumed_as = tuple(j for j in recorded_resuming_as(self.path) if j not in (self.job_id, kept[0]))

    def write(self, examples: int, trained: bool = False, finished: bool = False) -> None:
        if self.kept_job is not None and (examples != self.kept_until or trained or finished):
            self.kept_job, self.resumed_as = None, ()  # the new job trained from the position: its id from now on
        job_id, job_name = self.kept_job or (self.job_id, self.job_name)
        resuming_as = [*self.resumed_as, self.job_id][-RESUMING_AS_KEPT:] if self.kept_job is not None else []
        record = {"format": FORMAT, "run": self.run, "started_from": self.started_from, "examples": int(examples),
                  "trained": trained or finished, "finished": finished, "state_ids": list(self.state_ids),
                  "job_id": job_id, "job_name": job_name or None, "token": self.token,
                  "resuming_as": resuming_as}  # fmt: skip
        try:
            write_json_whole(self.path, record, temp_prefix=f".{os.path.basename(self.path)}.")  # hidden while written
        except OSError as e:  # (a full disk): named, not as the temporary file
            raise OSError(f"could not write --resume-file {self.path} ({e.strerror or e})") from None
        self.last, self.written, self.failing = time.monotonic(), examples, False

    def forget(self) -> None:
        """Removes the file, written by this run as it started (there was none before) with nothing trained since:
        a first start that fails before it trains (refused by the shards, or for its --skip-examples) records
        nothing, and the same file serves the command corrected."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.written = None


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

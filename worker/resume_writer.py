"""--resume-file kept (worker/resume.py): the lock a run holds on the file, and PositionWriter, which writes the
position as the run trains."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import time
from collections.abc import Iterator

from ps.storage.atomicfile import temp_prefix_within, write_json_whole
from worker.resume import FORMAT, RESUMING_AS_KEPT, recorded
from worker.resume_settings import run_settings
from worker.train_config import TrainConfig

WRITE_EVERY_S = 10.0


log = logging.getLogger("worker.resume")


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
        self.best_not_put_back = cfg.resume_best_not_put_back  # kept once set: the best model is gone with its run
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
        kept, resuming_as = recorded(self.path)
        if kept is not None and kept[0] != self.job_id:
            self.kept_job, self.kept_until = kept, examples
            self.resumed_as = tuple(j for j in resuming_as if j not in (self.job_id, kept[0]))

    def write(
        self, examples: int, trained: bool = False, finished: bool = False, best_not_put_back: bool = False
    ) -> None:
        """The position written at once (OSError, naming the file, where it cannot be); best_not_put_back: the run
        stopped as early stopping's best model was put back, recorded from then on (kept once set)."""
        self.best_not_put_back |= best_not_put_back
        if self.kept_job is not None and (examples != self.kept_until or trained or finished):
            self.kept_job, self.resumed_as = None, ()  # the new job trained from the position: its id from now on
        job_id, job_name = self.kept_job or (self.job_id, self.job_name)
        resuming_as = [*self.resumed_as, self.job_id][-RESUMING_AS_KEPT:] if self.kept_job is not None else []
        record = {"format": FORMAT, "run": self.run, "started_from": self.started_from, "examples": int(examples),
                  "trained": trained or finished, "finished": finished, "state_ids": list(self.state_ids),
                  "job_id": job_id, "job_name": job_name or None, "token": self.token,
                  "resuming_as": resuming_as, "best_not_put_back": self.best_not_put_back}  # fmt: skip
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

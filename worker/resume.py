"""`ps-worker train --resume-file FILE`: where one worker keeps its position in its stream of training examples,
so that the same command started again (a container's restart policy, a Job's retry) trains on from there
instead of from the stream's start.

The file is JSON, replaced whole (written to FILE.tmp, flushed to disk, renamed over FILE):

    {"format": 1, "run": {SETTING: VALUE, ...}, "examples": N, "finished": false}

- run: this worker's settings that define its stream and its model (RUN_SETTINGS), as given (before a recipe
  fills in what was left unset). A start whose settings differ is refused: the position would be another
  stream's.
- examples: the count of the worker's stream (over epochs, the examples a resumed start skipped included) whose
  updates the servers acknowledged: `--skip-examples N` trains on from there, as a stopped run's hint says.
- finished: the run trained its whole stream; a start then trains nothing and says so.

It is written every WRITE_EVERY_S seconds of training, when the run stops (an error, Ctrl-C, SIGTERM) and when it
has trained its whole stream. After a kill -9 the last periodic write is what is left: a restart trains again
the examples of at most the last WRITE_EVERY_S seconds, whose updates the servers then apply twice (as async
training takes a stale gradient). Only async and geo workers resume alone (sync and ssp jobs resume together:
worker/train_messages.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from worker.train_config import TrainConfig

FORMAT = 1
WRITE_EVERY_S = 10.0
RUN_SETTINGS = ("data", "format", "schema", "validation_data", "validation_fraction", "worker_id", "num_workers",
                "epochs", "max_examples", "shuffle", "synthetic_rows", "synthetic_seed", "model", "mode")  # fmt: skip


def run_settings(cfg: TrainConfig) -> dict:
    """The settings a position belongs to (RUN_SETTINGS), JSON's types."""
    return {name: getattr(cfg, name) for name in RUN_SETTINGS}


@dataclasses.dataclass(frozen=True)
class Position:
    examples: int
    finished: bool


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
        examples, finished, run = record["examples"], record["finished"], record["run"]
        if not (type(examples) is int and examples >= 0 and type(finished) is bool and isinstance(run, dict)):
            raise ValueError("examples, finished or run of the wrong type")
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        raise ValueError(f"--resume-file {path} is no position this program wrote ({e}): remove it to train from "
                         "the start, or give --skip-examples N yourself") from None  # fmt: skip
    ours = run_settings(cfg)
    differ = [f"{name}: {run.get(name)!r} in the file != {ours[name]!r} now" for name in RUN_SETTINGS
              if run.get(name) != ours[name]]  # fmt: skip
    if differ:
        raise ValueError(f"--resume-file {path} is the position of a run with other settings ({'; '.join(differ)}): "
                         "give that run's settings to resume it, or remove the file to train from the start")  # fmt: skip
    return Position(examples, finished)


class PositionWriter:
    """Writes cfg.resume_file: at most every WRITE_EVERY_S seconds (update), and at once (write). cfg: the run's
    settings as given (before prepare fills in a recipe's), which read_position compares."""

    def __init__(self, cfg: TrainConfig, every_s: float = WRITE_EVERY_S):
        self.path, self.run, self.every_s = cfg.resume_file, run_settings(cfg), every_s
        self.last = time.monotonic()
        self.written: int | None = None

    def update(self, examples: int) -> None:
        """The position, written if WRITE_EVERY_S seconds have passed since the last write and it moved."""
        now = time.monotonic()
        if now - self.last >= self.every_s and examples != self.written:
            self.write(examples)

    def write(self, examples: int, finished: bool = False) -> None:
        record = {"format": FORMAT, "run": self.run, "examples": int(examples), "finished": finished}
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.last, self.written = time.monotonic(), examples

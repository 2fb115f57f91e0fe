"""The training positions a checkpoint records (`ps-worker checkpoint save DIR --record-positions FILE`), and the
--skip-examples that trains on from it once the servers were restored from it.

A checkpoint holds every push acknowledged before its hold (ps/checkpoint.py); the servers know no worker's count
of examples, so the save reads each worker's --resume-file (worker/resume.py) just before it holds the shards, and
records what it holds in the manifest's "positions":

    position := {"resume_file": full path, "worker_id": i, "num_workers": n, "examples": N, "trained": bool,
                 "state_ids": [ID, ...], "run": {SETTING: VALUE, ...}}

examples: the file's count then, whose updates the checkpoint holds (each was acknowledged before the file was
written, and the file was read before the hold). A running worker writes its file every resume_writer.WRITE_EVERY_S
seconds, so the count can be behind the cut by that many seconds of examples and the moments from the read to the
hold of shard 0, which a run trained on from it trains again (their updates then applied twice, as after a kill -9).
A read within the hold would be closer to the saved rows by those moments, but every shard would refuse pushes
while the files are read (a slow disk, a hung mount); the read before keeps the hold to the shards' own work. A
worker stopped or finished before the save wrote its count at its stop, and the count is the cut's. trained: the
run's training was over. state_ids: the shards' model state ids the file's position was trained into, which must be
the saved shards' (check_same_model; empty: not known). run: the file's run settings, which a resumed run's must equal.

A `train --resume-file FILE` refused because the servers were restored from a checkpoint since FILE was written
(resume.state_changed) says the --skip-examples of this worker's position there (restored_position_words): the one
check (check_resumed_model) of a resumed run (worker/train.py) and of a finished worker's rerun (worker/cli_train.py).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ps.checkpoint import load_manifest
from ps.errors import StorageError
from worker.resume import FORMAT, state_changed
from worker.resume_settings import RECORDED_LATER
from worker.train_config import RESUME_WORKER, resume_file_of


def read_positions(resume_file: str) -> list[dict]:
    """The position (the module docstring's grammar) of each worker's --resume-file: resume_file itself, or where it
    holds RESUME_WORKER, the file of each worker 0..n-1, n the num_workers worker 0's file ran with. ValueError,
    naming the file, for one missing, that is no position a run wrote, or (RESUME_WORKER) that is not worker i's of
    that job of n workers (another job's file)."""
    first = _position(resume_file_of(resume_file, 0))
    if RESUME_WORKER not in resume_file:
        return [first]
    positions = [first, *(_position(resume_file_of(resume_file, i)) for i in range(1, first["num_workers"]))]
    n = first["num_workers"]
    for i, position in enumerate(positions):
        if (position["worker_id"], position["num_workers"]) != (i, n):
            raise ValueError(f"--resume-file {position['resume_file']} holds the position of worker "
                             f"{position['worker_id']} of {position['num_workers']}, expected worker {i} of {n} (as "
                             f"{first['resume_file']} ran with): each {RESUME_WORKER} file must be of one job")  # fmt: skip
    return positions


def _position(path: str) -> dict:
    """The position the --resume-file at path holds, as a checkpoint records it. ValueError where it cannot."""
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read())
        run = {**RECORDED_LATER, **record["run"]}
        position = {"resume_file": os.path.abspath(path), "worker_id": run["worker_id"],
                    "num_workers": run["num_workers"], "examples": record["examples"],
                    "trained": record["trained"], "state_ids": record.get("state_ids", []), "run": run}  # fmt: skip
        wrong = "a format other than this sparseps's" if record.get("format") != FORMAT else position_problem(position)
        if wrong is not None:
            raise ValueError(wrong)
    except FileNotFoundError:
        raise ValueError(f"--resume-file {path} does not exist: give the file a training run keeps its position "
                         "in (its --resume-file, {worker} in its name for a job of several workers)") from None  # fmt: skip
    except OSError as e:
        raise ValueError(f"--resume-file {path} cannot be read: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--resume-file {path} is no position a training run wrote ({e})") from None
    return position


def position_problem(position: object) -> str | None:
    """What makes position no position of the module docstring's grammar (a key missing, a count that is no
    integer >= 0, a worker_id not below num_workers, ...), said in a few words; None where it is one."""
    if not isinstance(position, dict):
        return f"a position that is no object ({type(position).__name__})"
    missing = [
        k for k in ("resume_file", "worker_id", "num_workers", "examples", "trained", "run") if k not in position
    ]
    if missing:
        return f"a position without {', '.join(missing)}"
    counts = {k: position[k] for k in ("worker_id", "num_workers", "examples")}
    wrong = [f"{k} {v!r}" for k, v in counts.items() if type(v) is not int or v < 0]
    if wrong:
        return f"{', '.join(wrong)}, expected an integer >= 0"
    if counts["worker_id"] >= counts["num_workers"]:
        return f"worker_id {counts['worker_id']} of num_workers {counts['num_workers']}, expected one below it"
    state_ids = position.get("state_ids", [])
    if not isinstance(state_ids, list) or not all(type(n) is int for n in state_ids):
        return f"state_ids {state_ids!r}, expected a list of integers"
    if type(position["trained"]) is not bool or not isinstance(position["run"], dict):
        return "a trained that is no true or false, or a run that is no object"
    if not isinstance(position["resume_file"], str):
        return f"resume_file {position['resume_file']!r}, expected a path"
    return None


def check_same_model(positions: list[dict], state_ids: tuple[int, ...], servers: list[str]) -> None:
    """ValueError where a position was trained into another model than the servers' (state_ids, as the client read
    them: resume.state_changed tells, another shard count or another id on a shard)."""
    for position in positions:
        if state_changed(position["resume_file"], position["state_ids"], state_ids, servers):
            raise ValueError(f"--resume-file {position['resume_file']} holds the position of a model these servers do "
                             "not hold (another shard count, or shards restored or started on new data dirs since it "
                             "was written): a checkpoint of them would record a position none of their rows has seen")  # fmt: skip


def positions_line(positions: list[dict]) -> str:
    """What a save says of the positions it recorded: each worker's count, and the --skip-examples of the job."""
    each = ", ".join(f"worker {p['worker_id']} at {p['examples']:,} examples{', trained' * p['trained']}"
                     for p in positions)  # fmt: skip
    return (f"positions recorded ({each}): a run on servers restored from it trains on with --skip-examples "
            f"{min(p['examples'] for p in positions)} (its --resume-file removed)")  # fmt: skip


def check_resumed_model(
    resume_file: str, state_ids: tuple[int, ...], client: Any, run: dict, shard_stats: list
) -> None:
    """ValueError where the servers hold another model than the one resume_file's position was trained into (its
    shards' model state ids `state_ids`; client: a Client whose Stats round, shard_stats, ran before this call,
    reading the servers' ids into client.state_ids; resume.state_changed says what changed), adding, where they were restored from a checkpoint, the
    --skip-examples that trains on from it (restored_position_words; run: the file's run settings)."""
    changed = state_changed(resume_file, state_ids, client.state_ids, client.servers)
    if changed:
        restored = restored_position_words(resume_file, run, shard_stats)
        raise ValueError(f"{changed}. {restored}" if restored else changed)


def restored_position_words(resume_file: str, run: dict, shard_stats: list) -> str:
    """Where every shard was restored from one checkpoint (Stats restored_from, restored_sha256) that this machine
    reads at the same path: the position it recorded of resume_file (a worker's --resume-file, written with the
    run settings `run`) as the --skip-examples that trains on from it, or that it recorded none; "" where the
    shards were not all restored from one checkpoint, or it cannot be read here."""
    froms = {(s.restored_from, s.restored_sha256) for s in shard_stats}
    if len(froms) != 1 or not all(next(iter(froms))):
        return ""
    ((directory, digest),) = froms
    try:
        manifest = load_manifest(directory)
    except StorageError:
        return ""
    if manifest["sha256"] != digest:  # another checkpoint at that path now
        return ""
    positions = manifest.get("positions", [])
    path = os.path.abspath(resume_file)
    damaged = _positions_damage(positions)
    ours = [] if damaged else [p for p in positions if p["resume_file"] == path]
    if not ours or ours[0]["run"] != {**RECORDED_LATER, **run}:
        why = (f"its positions key is damaged: {damaged}" if damaged else
               "it was saved without `--record-positions`")  # fmt: skip
        return (f"The servers were restored from checkpoint {directory}, which records no usable position of {path} "
                f"under these settings ({why}): take the count from FILE's `examples` where the run had stopped "
                "before the save, or from the progress the run printed")  # fmt: skip
    position = ours[0]
    if position.get("trained"):
        return (f"The servers were restored from checkpoint {directory}, saved once this worker's training was over "
                f"({position['examples']:,} examples): there is nothing to train on from it (ps-worker eval scores "
                "it)")  # fmt: skip
    job = [p for p in positions if p["num_workers"] == position["num_workers"]]
    of_job = (f" (a job's workers, given one value by ps-worker launch: --skip-examples "
              f"{min(p['examples'] for p in job)}, the fewest of its {len(job)} recorded)"
              ) if position["num_workers"] > 1 else ""  # fmt: skip
    remove = resume_file if position["num_workers"] == 1 else f"each worker's FILE ({_files_template(job)})"
    return (f"The servers were restored from checkpoint {directory}, saved at {position['examples']:,} examples of "
            f"this worker's run: to train on from it, remove {remove} and run the same command with "
            f"--skip-examples {position['examples']}{of_job}")  # fmt: skip


def _files_template(job: list[dict]) -> str:
    """The --resume-file of a job's recorded positions as one name with RESUME_WORKER where the worker ids differ
    (/d/p{worker}.json), where their paths are one name so; else each path, in worker order."""
    paths = [p["resume_file"] for p in sorted(job, key=lambda p: p["worker_id"])]
    start = len(os.path.commonprefix(paths))
    end = len(os.path.commonprefix([path[start:][::-1] for path in paths]))
    template = paths[0][:start] + RESUME_WORKER + paths[0][len(paths[0]) - end :]
    if all(resume_file_of(template, p["worker_id"]) == p["resume_file"] for p in job):
        return template
    return ", ".join(paths)


def _positions_damage(positions: object) -> str | None:
    """What makes a manifest's positions no list of positions (position_problem), in a few words; None where they
    are one."""
    if not isinstance(positions, list):
        return f"{type(positions).__name__}, expected a list of positions"
    for i, position in enumerate(positions):
        problem = position_problem(position)
        if problem is not None:
            return f"in entry {i}, {problem}"
    return None

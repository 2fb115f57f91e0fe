"""`ps-worker launch`: a job's workers started as child processes of one command, watched, and summed up.

    launch --workers N [--backends b0,b1,..] (--servers a,b | --local-shards S) [--metrics-out F] [TRAIN FLAGS]
      1. checks before anything starts: the TRAIN FLAGS through train's own parser, then the TrainConfig they make
         (worker/cli_train.py train_config_from_argv) validated for every worker's backend and device (an entry
         "backend:device" of --backends, else TRAIN FLAGS' --device); flags launch sets are refused; cuda workers
         need a GPU torch sees, and --dense allreduce one kind of device (and a GPU per cuda worker); then train's
         checks of the job's data and tables, as worker 0 runs them (worker/job.py check_training): their warnings
         (the schema's) and what train says of the job before it trains (the recipe, a csv's columns, the files
         read) are said here, once: the workers, given --launched, say neither
      2. --local-shards S: a LocalCluster (worker/cluster.py) with --threads 2 x N + 4 (sync waits hold threads)
      3. worker i:  python -m worker train TRAIN FLAGS --servers ADDRESSES --worker-id i --num-workers N
                      --backend b_i --device d_i --job-id J --metrics-out TMP/worker-i.json --progress-lines
                      --launched --no-final-eval
                    environment RANK=i WORLD_SIZE=N LOCAL_RANK=i MASTER_ADDR=127.0.0.1 MASTER_PORT=P: the env://
                    rendezvous of torch.distributed (--dense allreduce); J a new name, launch-<16 random hex
                    digits> (the job the workers' --resume-files keep, by its name, else its id, where they keep
                    one: the job launched again goes on); P a free port;
                    a cuda worker's LOCAL_RANK is its index among the cuda workers (local_ranks: their GPU)
      4. each worker's output lines printed as "[worker i] LINE"; its PROGRESS lines merged into one bar
      5. all exit 0: the model evaluated once on the servers, on --eval-data or the synthetic eval rows (a job on
         --data without --eval-data is not: no held-out file), by launch only: the workers, under --no-final-eval,
         do not score it as each finishes; a summary printed, --metrics-out written
Failure: a worker exits non-zero or is killed: the others get SIGTERM, SIGKILL after the grace period (10 s), the
local shards stop, the failed worker's exit code and last lines are printed, exit 1. A local shard that dies fails
the job too, with no final evaluation (exit 1): while the workers run they are stopped; after they finished, their
training figures are printed. Ctrl-C: the workers stopped, exit 130 (SIGTERM to launch: exit 143); in the final
evaluation, once every worker finished, the job's training figures are printed with the evaluation marked
interrupted, and where the model is (on --servers: ps-worker eval scores it). Each worker runs
in its own process group (a terminal's Ctrl-C reaches launch only, and a stop reaches the worker's children too)
and, on Linux, gets SIGTERM when launch dies however it dies (prctl PR_SET_PDEATHSIG); local shards stop when
launch's end of their stdin pipe closes. The workers' metrics go to a temporary directory that launch removes, or,
if it was killed by SIGKILL, the next launch (or train with --local-shards) does (worker/temp_dirs.py).

The PROGRESS lines it reads and the --metrics-out object it writes: worker/launch_report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ps.errors import MODEL_STATE_REPLACED, PsError
from ps.settings import unknown_environment
from ps.stamp import job_named
from ps.terminate import EXIT_CODE as TERMINATED_EXIT_CODE
from ps.terminate import TERMINATED, Terminated, child_setup, how_it_ended, sigterm_raises
from worker.cluster import free_port, without_security_variables
from worker.flags import check_not_an_input, check_output_file, same_file, server_list
from worker.launch_report import MergedProgress, format_summary, merge_metrics
from worker.progress_lines import parse_progress
from worker.results import UNTRAINED, local_shards_gone, model_kept, write_metrics
from worker.temp_dirs import make_temp_dir, remove_stale_temp_dirs
from worker.train_config import RESUME_WORKER

BACKENDS = ("numpy", "torch")
DEVICES = ("cpu", "cuda")
GRACE_S = 10.0  # SIGTERM to SIGKILL
TAIL_LINES = 20  # lines of a failed worker's output repeated in the failure report
STOPPED_LINE = f"ps-worker: {TERMINATED}"  # what a worker says as launch's SIGTERM stops it (ps.terminate.exit_code)
_REFUSED = {  # train dests launch sets for every worker: (flag, what launch gives)
    "worker_id": ("--worker-id", "worker i gets --worker-id i"),
    "num_workers": ("--num-workers", "every worker gets --num-workers N (set N with --workers)"),
    "backend": ("--backend", "worker i gets the i-th of --backends (one per worker, or one for all)"),
    "job_id": (
        "--job-id",
        "every worker gets the same new job name, launch-<16 random hex digits> (or, async and geo, the job their "
        "--resume-files keep)",
    ),
    "progress_lines": ("--progress-lines", "every worker gets it, and launch merges the lines"),
    "launched": ("--launched", "every worker gets it: launch says once for the job what each would say"),
    "no_final_eval": ("--no-final-eval", "every worker gets it: launch scores the job's model once, at the end"),
    "create_tables_only": ("--create-tables-only", "launch trains; `ps-worker train --create-tables-only` does that"),
}
_UNSET = object()


def add_launch_parser(subparsers: Any) -> None:
    """The `launch` subcommand; its unknown flags are the workers' train flags (parse with parse_known_args)."""
    p = subparsers.add_parser(
        "launch",
        help="start several training workers on this machine with one command",
        allow_abbrev=False,  # a shortened train flag (--backend for --backends) must reach the train checks
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="ps-worker launch --workers N [--backends B,...] (--servers HOST:PORT,... | --local-shards S)\n"
        "       [--metrics-out FILE] [--no-progress] [--barrier-timeout S] [TRAIN FLAGS ...]",
        description="Start N `ps-worker train` workers as child processes of one job: other flags go to every\n"
        "worker's train (checked before anything starts); launch sets --servers, --worker-id, --num-workers,\n"
        "--backend, --job-id, --metrics-out, --progress-lines, --launched and --no-final-eval of each (launch\n"
        "scores the job's model once, at the end), and RANK, WORLD_SIZE, LOCAL_RANK,\n"
        "MASTER_ADDR, MASTER_PORT (torch.distributed's env://, for --dense allreduce); giving one of those\n"
        "flags, or --create-tables-only (ps-worker train does that), is refused. Each worker's --device is its\n"
        "--backends entry's (torch:cuda), else the --device given.\n"
        "Output lines come as '[worker i] ...'; progress is one merged bar (or a line every 10 s).\n"
        "If a worker fails (or on Ctrl-C) the others get SIGTERM, then SIGKILL after 10 s, local shards stop,\n"
        "the failed worker's exit code and last lines are printed, and launch exits 1 (Ctrl-C: 130, SIGTERM:\n"
        "143); a local shard that dies stops the job too (exit 1).\n"
        "At the end the model is evaluated once on the servers, on --eval-data (or the synthetic eval rows; not\n"
        "without --eval-data when training on --data), and a summary printed (and --metrics-out written).",
        epilog="example: ps-worker launch --workers 4 --backends numpy,numpy,torch,torch --local-shards 2 "
        "--mode sync --model deepfm --synthetic-rows 200000",
    )
    p.add_argument("--workers", type=int, required=True, help="worker processes to start")
    p.add_argument(
        "--backends",
        default="numpy",
        help="comma-separated: one backend per worker, or one for all, each optionally with its device: "
        "numpy,torch:cuda runs worker 1 on the GPU (default: numpy; a worker without its own device gets --device)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--servers", default=None, help="comma-separated host:port list, in shard order")
    where.add_argument("--local-shards", type=int, default=None,
                       help="instead of --servers: N throwaway shards (no TLS or token, on 127.0.0.1) started here "
                            "first and stopped at the end")  # fmt: skip
    p.add_argument(
        "--metrics-out",
        default=None,
        help="write the job's figures as one JSON object to this file (replaced if it exists)",
    )
    p.add_argument("--no-progress", action="store_true", help="a merged progress line every 10 s instead of a bar")
    p.add_argument("--barrier-timeout", type=float, default=None,
                   help="given to every worker's train: seconds a sync or ssp wait may last (default: train's)")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """What a launch runs, checked: the workers' shared train flags, their backends, where the servers are."""

    workers: int
    backends: tuple[str, ...]  # each worker's: "numpy", "torch" (on the CPU), "torch:cuda" (resolve_workers)
    servers: tuple[str, ...]  # () with local_shards
    local_shards: int | None
    train_flags: tuple[str, ...]  # every worker's train flags before launch's own
    train_config: Any  # the TrainConfig of train_flags, for the final evaluation (with worker 0's backend, device)
    job_id: str  # every worker's --job-id: a new name (new_job_name), or the job the workers' --resume-files keep
    metrics_out: str | None = None
    progress_bar: bool = True
    global_flags: tuple[str, ...] = ()  # before `train`: --log-level
    job_lines: tuple[str, ...] = ()  # what train says of the job before it trains (worker.job.job_lines), said once


def expand_backends(text: str, workers: int) -> tuple[str, ...]:
    """One entry per worker from --backends, each "backend" or "backend:device" (torch:cuda; spaces around either
    part dropped): as many as workers, or one for all. ValueError otherwise (the pairing of backend and device is
    TrainConfig's to check)."""
    entries = []
    for raw in text.split(","):
        backend, device = split_backend(raw)
        if backend not in BACKENDS:
            raise ValueError(f"--backends {text!r}: {raw.strip()!r} is not a backend; expected "
                             f"{' or '.join(BACKENDS)}, each optionally with its device (torch:cuda)")  # fmt: skip
        if device is not None and device not in DEVICES:
            named = f"names the device {device!r}" if device else "names no device after ':'"
            raise ValueError(f"--backends {text!r}: {raw.strip()!r} {named}; expected {' or '.join(DEVICES)}")
        entries.append(backend if device is None else f"{backend}:{device}")
    if len(entries) == 1:
        return tuple(entries) * workers
    if len(entries) != workers:
        raise ValueError(f"--backends {text!r} names {len(entries)} backends for --workers {workers}: give one per "
                         "worker, or one for all")  # fmt: skip
    return tuple(entries)


def split_backend(entry: str) -> tuple[str, str | None]:
    """("torch", "cuda") of "torch:cuda"; ("numpy", None) of "numpy" (the worker keeps the train flags' --device);
    each part stripped."""
    backend, colon, device = entry.partition(":")
    return backend.strip(), (device.strip() if colon else None)


def cuda_device_count() -> tuple[int, str]:
    """(the GPUs torch sees here, torch's version), asked of a child Python: CUDA started in launch itself could
    start driver threads before launch forks its workers (WorkerGroup.start)."""
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0, torch.__version__)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ValueError(f"could not ask torch how many GPUs it sees (the child Python that asks "
                         f"{how_it_ended(done.returncode)}): {last}")  # fmt: skip
    count, version = done.stdout.split()
    return int(count), version


def check_devices(workers: Sequence[str], dense: str, gpus: Callable[[], tuple[int, str]] | None = None) -> None:
    """ValueError, before anything starts, for workers' devices that cannot run: --dense allreduce over more than
    one kind of device (gloo and nccl do not mix in one group); cuda workers where torch sees no GPU; --dense
    allreduce with more cuda workers than GPUs (nccl wants a GPU per worker). workers: resolve_workers's; gpus:
    what cuda_device_count gives (the default)."""
    devices = sorted({split_backend(w)[1] or "cpu" for w in workers})
    if dense == "allreduce" and len(devices) > 1:
        raise ValueError(f"--dense allreduce joins the workers in one torch.distributed group, gloo on the CPU and "
                         f"nccl on CUDA: its workers must all run on one kind of device, not {' and '.join(devices)} "
                         "(--dense ps trains the MLP on the servers and mixes devices)")  # fmt: skip
    on_cuda = [i for i, w in enumerate(workers) if split_backend(w)[1] == "cuda"]
    if not on_cuda:
        return
    count, version = (gpus or cuda_device_count)()
    which = f"worker{'s' * (len(on_cuda) > 1)} {', '.join(map(str, on_cuda))}"
    if count == 0:
        raise ValueError(f"{which} would run on cuda (--backends torch:cuda, or --device cuda), but torch {version} "
                         "sees no CUDA device here: run them on cpu, or on a machine with an NVIDIA GPU and a CUDA "
                         "build of torch")  # fmt: skip
    if dense == "allreduce" and len(on_cuda) > count:
        raise ValueError(f"--dense allreduce with {len(on_cuda)} cuda workers, but torch sees {count} "
                         f"GPU{'s' * (count != 1)} here: nccl wants a GPU of its own for each worker (worker i runs "
                         "on cuda:i); start fewer cuda workers, or use --dense ps, whose workers may share a GPU")  # fmt: skip


def resolve_workers(entries: Sequence[str], cfg: Any) -> tuple[str, ...]:
    """Each worker's backend and device as the launch plan, its summary and --metrics-out name them: "numpy",
    "torch" on the CPU, "torch:cuda" on a GPU. The device is the --backends entry's, else the train flags'
    (cfg.device); the pair, and the rest of the worker's config (as worker i: its --max-examples share), is
    checked by TrainConfig.validate (ValueError naming the entry and the worker)."""
    workers = []
    for i, entry in enumerate(entries):
        backend, device = split_backend(entry)
        worker_cfg = dataclasses.replace(cfg, backend=backend, device=device or cfg.device,  # its own share of
                                         worker_id=min(i, cfg.num_workers - 1))  # --max-examples, too  # fmt: skip
        try:
            worker_cfg.validate()
        except ValueError as e:
            if _not_the_entrys(worker_cfg, e):  # a flag of every worker's, not this backend or device
                raise ValueError(f"{e} (worker {i})" if cfg.num_workers > 1 and i else str(e)) from None
            hint = ""
            if device is None and cfg.device != "cpu":  # --device for every worker: give it to the torch ones
                torch_ones = any(split_backend(b)[0] == "torch" for b in entries)
                hint = (f"; to put only the torch workers on {cfg.device}, name it in --backends (torch:{cfg.device})"
                        " and leave --device out" if torch_ones else f"; {cfg.device} runs torch workers only: give "
                        f"--backends torch:{cfg.device}")  # fmt: skip
            raise ValueError(f"--backends {entry} (worker {i}): {e}{hint}") from None
        workers.append(backend if worker_cfg.device == "cpu" else f"{backend}:{worker_cfg.device}")
    return tuple(workers)


def _not_the_entrys(worker_cfg: Any, error: ValueError) -> bool:
    """Whether worker_cfg's validation error comes from the train flags, not from its --backends entry: the same
    config on numpy and the cpu fails the same way."""
    try:
        dataclasses.replace(worker_cfg, backend="numpy", device="cpu").validate()
    except ValueError as neutral:
        return str(neutral) == str(error)
    return False


def check_train_flags(flags: Sequence[str]) -> None:
    """ValueError when train's parser rejects `flags` (unknown or abbreviated flag, bad value) or when they set
    what launch sets."""
    from ps.settings import add_config_flag, unrecognized
    from worker.cli_train import add_train_parser

    def fail(message: str) -> None:
        raise ValueError(f"{message} (flags launch does not know go to every worker's `ps-worker train`)")

    sub = argparse.ArgumentParser(prog="ps-worker").add_subparsers(dest="command")
    add_train_parser(sub)
    add_launch_parser(sub)
    train = sub.choices["train"]
    add_config_flag(train)
    known = {o for p in sub.choices.values() for a in p._actions for o in a.option_strings if o.startswith("--")}
    for token in flags:
        name = token.split("=", 1)[0]
        if len(name) > 2 and name.startswith("--") and name not in known:
            spelled = sorted(o for o in known if o.startswith(name))
            if spelled:
                fail(f"{name} is no flag (abbreviations are not taken): spell out {' or '.join(spelled)}")
    train.allow_abbrev = False
    train.error = fail  # type: ignore[method-assign]  # argparse's messages, as a ValueError
    train.set_defaults(**dict.fromkeys(_REFUSED, _UNSET))
    parsed, rest = train.parse_known_args(list(flags))
    if rest:
        fail(unrecognized(train, rest))
    parsed = vars(parsed)
    for dest, (flag, why) in _REFUSED.items():
        if parsed.get(dest, _UNSET) is not _UNSET:
            raise ValueError(f"{flag} is set by launch: {why}")
    if parsed.get("metrics_port"):
        raise ValueError(f"--metrics-port {parsed['metrics_port']} would be every worker's port: give 0 (each worker "
                         "takes a free port and logs it)")  # fmt: skip


def plan_launch(args: argparse.Namespace, passthrough: Sequence[str],
                train_config: Callable[[list[str]], Any] | None = None) -> LaunchPlan:  # fmt: skip
    """The checked plan of `launch` arguments; ValueError naming the flag at fault. train_config(argv): the
    TrainConfig `ps-worker train ARGV` would run with (default: worker.cli_train.train_config_from_argv)."""
    if args.workers < 1:
        raise ValueError(f"--workers {args.workers}: expected an integer >= 1")
    backends = expand_backends(args.backends, args.workers)
    if any(split_backend(b)[0] == "torch" for b in backends) and importlib.util.find_spec("torch") is None:
        from worker.job import TORCH_HINT

        raise ValueError(f"--backends torch needs PyTorch, which this Python does not have: {TORCH_HINT}")
    if args.servers is not None and args.local_shards is not None:
        raise ValueError("give --servers or --local-shards, not both (either may come from its flag, its variable "
                         "PS_SERVERS or PS_LOCAL_SHARDS, or a config file)")  # fmt: skip
    servers = server_list(args.servers)
    if not servers and args.local_shards is None:
        raise ValueError("no servers: give --servers host:port,... (in shard order), or --local-shards N")
    if args.local_shards is not None and args.local_shards < 1:
        raise ValueError(f"--local-shards {args.local_shards}: expected an integer >= 1")
    check_output_file("--metrics-out", args.metrics_out)
    config = getattr(args, "config", None)
    flags = [*passthrough, *(["--config", config] if config else [])]
    check_train_flags(flags)
    if args.barrier_timeout is not None:
        flags += ["--barrier-timeout", repr(args.barrier_timeout)]
    if train_config is None:
        from worker.cli_train import train_config_from_argv

        # the workers' environment: against local shards, without a client's TLS and token variables
        environ = without_security_variables(dict(os.environ)) if args.local_shards is not None else None
        train_config = functools.partial(train_config_from_argv, environ=environ)
    # the workers get the local shards' addresses: checked with a stand-in address
    where = ["--servers", ",".join(servers) if servers else "127.0.0.1:1"]
    job_id = new_job_name()
    try:
        cfg = train_config([*flags, *where, "--worker-id", "0", "--num-workers", str(args.workers), "--job-id",
                            job_id])  # fmt: skip
    except SystemExit:
        raise ValueError("the train flags were refused (see the message above)") from None
    workers = resolve_workers(backends, cfg)
    check_devices(workers, getattr(cfg, "dense", "ps"))
    if getattr(cfg, "dense", "ps") == "allreduce" and importlib.util.find_spec("torch") is None:
        from worker.job import TORCH_HINT

        raise ValueError(f"--dense allreduce needs PyTorch (torch.distributed), which this Python does not have: "
                         f"{TORCH_HINT}")  # fmt: skip
    resume_file = getattr(cfg, "resume_file", None)
    if resume_file and RESUME_WORKER not in resume_file:
        raise ValueError(f"--resume-file {resume_file} (a flag, PS_RESUME_FILE or the config file) keeps one "
                         f"worker's position, and launch's workers would share it: put {RESUME_WORKER} in its name "
                         "(each worker's id takes its place), or leave it out")  # fmt: skip
    kept = kept_job(cfg, args.workers)
    if kept is not None:  # the job launched again: its workers go on under its id, named by its name
        job_id, cfg = kept[1] or str(kept[0]), dataclasses.replace(cfg, job_id=kept[0], job_name=kept[1])
    if args.local_shards is not None:
        check_no_security(cfg)
    if args.local_shards is not None and getattr(cfg, "skip_examples", 0):
        raise ValueError("--skip-examples resumes training a model that servers hold; --local-shards starts new, "
                         "empty ones (give --servers)")  # fmt: skip
    check_not_an_input("--metrics-out", args.metrics_out, {**cfg.input_files(), "--config": config})
    for i in range(args.workers if resume_file and args.metrics_out else 0):
        if same_file(args.metrics_out, resume_file.replace(RESUME_WORKER, str(i))):
            raise ValueError(f"--metrics-out {args.metrics_out} is worker {i}'s --resume-file ({resume_file}): "
                             "each would replace the other (the job's figures lost, or the worker's position read "
                             "from them); give another file name")  # fmt: skip
    log_level = getattr(args, "log_level", None)
    return LaunchPlan(
        workers=args.workers, backends=workers, servers=servers, local_shards=args.local_shards,
        train_flags=tuple(flags), train_config=cfg, job_id=job_id, metrics_out=args.metrics_out, progress_bar=not args.no_progress,
        global_flags=("--log-level", log_level) if log_level else (), job_lines=checked_job_lines(cfg, workers[0]),
    )  # fmt: skip


def new_job_name() -> str:
    """The --job-id of a job launched anew: launch-<16 random hex digits>, a name (its hash the job's id,
    worker.cli_train job_id), by which the shards' messages name the job."""
    return f"launch-{secrets.token_hex(8)}"


def kept_job(cfg: Any, workers: int) -> tuple[int, str] | None:
    """The job id the workers' --resume-files keep (worker.resume.recorded_job), where the workers use them, with
    the job's name where one keeps it ("" where none does): the same launch again goes on under the job's id, which
    the shards let push while they hold the job for workers killed without a word (a job's own workers would
    otherwise be refused for its barrier timeout), and which each worker's file would refuse another of. None
    where no file keeps one, and for sync and ssp, whose job resumes under a new id (worker.resume.resumes_whole);
    ValueError where two do differ (files of two jobs: in every mode, a job resumed from them would pair the
    positions of two runs)."""
    from worker.resume import recorded_job, resumes_whole, unused_because

    resume_file = getattr(cfg, "resume_file", None)
    if not resume_file or unused_because(cfg) is not None:
        return None
    files = [resume_file.replace(RESUME_WORKER, str(i)) for i in range(workers)]
    kept = {path: job for path in files if (job := recorded_job(path)) is not None}
    if len({job_id for job_id, _ in kept.values()}) > 1:
        named = ", ".join(f"{path} job {job_named(*job)}" for path, job in kept.items())
        raise ValueError(f"the workers' --resume-files keep the positions of different jobs ({named}): remove "
                         "the files of the job not to resume")  # fmt: skip
    if resumes_whole(cfg):
        return None
    return max(kept.values(), key=lambda job: job[1], default=None)  # a file's name (an older file keeps none)


def checked_job_lines(cfg: Any, worker: str) -> tuple[str, ...]:
    """train's checks of the job's data and settings that hold for every worker (worker.job.check_training), run
    here, as worker 0 (worker: its resolve_workers entry) runs them, before any shard or worker starts: a wrong
    --format, a held-out file of another format, a csv whose label cannot be chosen fail here with train's
    message, and their warnings are said once (the workers do not repeat them). What train says of the job
    before it trains (worker.job.job_lines), which launch says once for its workers."""
    from worker.job import check_training, job_lines

    backend, device = split_backend(worker)
    return tuple(job_lines(check_training(dataclasses.replace(cfg, backend=backend, device=device or "cpu"))))


def check_no_security(cfg: Any) -> None:
    """ValueError when the train flags or the config file set TLS or a token: local shards take neither (they
    listen on 127.0.0.1, worker/cluster.py), and workers that used them could not connect. The PS_* variables of
    a client's security are dropped instead (SECURITY_VARIABLES: a compose worker's environment has them)."""
    for flag, dest in (("--tls-ca", "tls_ca"), ("--tls-cert", "tls_cert"), ("--tls-key", "tls_key"),
                       ("--auth-token-file", "auth_token_file")):  # fmt: skip
        if getattr(cfg, dest, None):
            raise ValueError(f"{flag} {getattr(cfg, dest)}: --local-shards starts shards with no TLS or token "
                             "(on 127.0.0.1); drop it (from the config file too), or give --servers")  # fmt: skip


def worker_commands(plan: LaunchPlan, addresses: Sequence[str], metrics_dir: str,
                    program: Sequence[str]) -> list[list[str]]:  # fmt: skip
    """Every worker's command line: program (e.g. python -m worker), --log-level, `train` and its flags."""
    commands = []
    for i, worker in enumerate(plan.backends):
        backend, device = split_backend(worker)
        commands.append(
            [*program, *plan.global_flags, "train", *plan.train_flags, "--servers", ",".join(addresses),
             "--worker-id", str(i), "--num-workers", str(plan.workers), "--backend", backend, "--device",
             device or "cpu", "--job-id", plan.job_id, "--metrics-out",
             os.path.join(metrics_dir, f"worker-{i}.json"), "--progress-lines", "--launched", "--no-final-eval"]
        )  # fmt: skip
    return commands


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
LAUNCH_SETS_VARIABLES = frozenset(  # ps.settings' variables of the train flags launch sets for each worker
    f"PS_{dest.upper()}" for dest in ("servers", "local_shards", "worker_id", "num_workers", "backend", "job_id",
                                      "metrics_out", "progress_lines", "launched", "no_progress",
                                      "create_tables_only", "no_final_eval")
)  # fmt: skip


def local_ranks(backends: Sequence[str]) -> list[int]:
    """Each worker's LOCAL_RANK: its rank, but for a worker on "cuda" its index among those workers, by which
    worker_device spreads them over the GPUs (by rank, the workers of numpy,torch:cuda,numpy,torch:cuda would both
    land on cuda:1 of 2 GPUs). Under --dense allreduce every worker runs on one kind of device: each its rank."""
    on_gpu = [split_backend(b)[1] == "cuda" for b in backends]
    return [sum(on_gpu[:i]) if gpu else i for i, gpu in enumerate(on_gpu)]


def worker_environment(rank: int, world_size: int, master_port: int, base: dict[str, str],
                       local_rank: int | None = None) -> dict[str, str]:  # fmt: skip
    """base less the PS_* variables of the flags launch sets itself and those that set nothing (launch warned of
    them), with torch.distributed's env:// variables
    for worker `rank` (LOCAL_RANK local_rank, else rank: local_ranks), unbuffered Python output, and each
    worker's math libraries (numpy's BLAS, torch) limited to its share of this machine's cores, cores // workers
    (at least 1), unless base sets their thread counts: workers on one machine otherwise each start a thread per
    core, and the threads of all of them fight over the cores."""
    threads = str(max(1, (os.cpu_count() or 1) // world_size))
    limits = {name: base.get(name, threads) for name in THREAD_VARIABLES}
    unknown = unknown_environment(base)  # warned of once, by launch: not again by every worker
    base = {k: v for k, v in base.items() if k not in LAUNCH_SETS_VARIABLES and k not in unknown}  # flags
    return {**base, **limits, "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank if local_rank is None else local_rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
            "PYTHONUNBUFFERED": "1"}  # fmt: skip


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """signum to the worker and to its process group (the worker's children, unless they left it)."""
    proc.send_signal(signum)
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class WorkerGroup:
    """The job's worker processes: started together, their output read by one thread each (PROGRESS lines to
    on_progress(i, report), other lines to on_output(i, line) and the last TAIL_LINES kept), stopped together. A
    worker's STOPPED_LINE once stop() began is kept, not passed on: launch says it stopped the workers."""

    def __init__(self, commands: Sequence[Sequence[str]], envs: Sequence[dict[str, str]],
                 on_output: Callable[[int, str], None], on_progress: Callable[[int, dict], None]):  # fmt: skip
        self.commands, self.envs = [list(c) for c in commands], list(envs)
        self.on_output, self.on_progress = on_output, on_progress
        self.procs: list[subprocess.Popen] = []
        self.tails: list[deque[str]] = [deque(maxlen=TAIL_LINES) for _ in self.commands]
        self._threads: list[threading.Thread] = []
        self._stopping = False
        # Each worker's exit is awaited by a thread of its own, never by the main thread: a Ctrl-C raised there
        # just after Popen.poll() took the Popen's lock (before its try) left the lock held, and stop()'s wait()
        # then blocked forever. Wake-ups go through a SimpleQueue (in C: no Python-level lock for a
        # KeyboardInterrupt to leave held, as one raised inside Event.wait() can leave the Event's).
        self._changed: queue.SimpleQueue[None] = queue.SimpleQueue()

    def start(self) -> None:
        """Starts every worker; call before any thread of this process starts (preexec_fn runs after a fork)."""
        setup = child_setup()
        for command, env in zip(self.commands, self.envs):
            self.procs.append(subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, preexec_fn=setup))  # fmt: skip

    def read_output(self) -> None:
        """Starts the output threads and the threads that await the workers' exits."""
        for i in range(len(self.procs)):
            threading.Thread(target=self._reap, args=(i,), name=f"launch-reap-{i}", daemon=True).start()
            thread = threading.Thread(target=self._read, args=(i,), name=f"launch-worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _read(self, i: int) -> None:
        pipe = self.procs[i].stdout
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            report = parse_progress(line)
            if report is not None:
                self.on_progress(i, report)
            else:
                self.tails[i].append(line)
                if not (self._stopping and line == STOPPED_LINE):
                    self.on_output(i, line)
        self._changed.put(None)

    def _reap(self, i: int) -> None:
        self.procs[i].wait()
        self._changed.put(None)

    def wait(self, tick: Callable[[float], None] = lambda now: None, poll_s: float = 0.5) -> tuple[int, int] | None:
        """Until every worker exited 0 (None) or one did not: (its index, its exit code; -N: killed by signal N).
        tick(now) runs between checks. Call after read_output (its threads reap the workers)."""
        while True:
            codes = [p.returncode for p in self.procs]  # set by the reapers (read_output)
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                return failed[0]
            if all(c == 0 for c in codes):
                return None
            with contextlib.suppress(queue.Empty):
                self._changed.get(timeout=poll_s)
            tick(time.monotonic())

    def stop(self, grace_s: float = GRACE_S) -> None:
        """SIGTERM to every worker's process group, SIGKILL to them after grace_s; reaps the workers and ends the
        output threads. Interrupted (a second Ctrl-C), it kills at once."""
        self._stopping = True
        for p in self.procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        try:
            for p in self.procs:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p in self.procs:
                _signal_group(p, signal.SIGKILL)  # the group's stragglers too
                p.wait()
            for thread in self._threads:
                thread.join(timeout=5.0)
            for i, p in enumerate(self.procs):
                if i >= len(self._threads) or not self._threads[i].is_alive():  # a reader holds its pipe's lock
                    p.stdout.close()  # (a process outside the group keeps the pipe open: its thread, a daemon, stays)


@contextlib.contextmanager
def _servers(plan: LaunchPlan) -> Iterator[tuple[list[str], Callable[[], str | None]]]:
    """(the plan's servers, or its local shards started (and stopped on the way out); a function that says why a
    local shard died, or None while they all run)."""
    if plan.local_shards is None:
        yield list(plan.servers), lambda: None
        return
    from worker.cluster import LocalCluster

    threads = 2 * plan.workers + 4  # a sync step's waits hold server threads: at least 2 x workers + 2 (ps.service)
    with LocalCluster(plan.local_shards, extra_args=["--threads", str(threads)]) as cluster:
        print(
            f"started {plan.local_shards} local shard{'s' * (plan.local_shards != 1)}: {','.join(cluster.addresses)}",
            flush=True,
        )
        yield cluster.addresses, cluster.died


def run_launch(args: argparse.Namespace, passthrough: list[str], *, worker_command: Sequence[str] | None = None,
               train_config: Callable[[list[str]], Any] | None = None,
               evaluate: Callable[[Any], dict] | None = None, grace_s: float = GRACE_S,
               progress_every_s: float = 10.0) -> int:  # fmt: skip
    """Runs `ps-worker launch`; the exit code: 0, 1 when a worker failed (or a local shard died), 130 on Ctrl-C,
    143 on SIGTERM. ValueError for wrong arguments, before anything starts. worker_command: the program before `train` (default: this
    Python's -m worker); train_config: see plan_launch; evaluate(cfg): the final evaluation (default:
    worker.served.evaluate_servers)."""
    plan = plan_launch(args, passthrough, train_config)
    for line in plan.job_lines:
        print(line, flush=True)
    program = list(worker_command) if worker_command is not None else [sys.executable, "-m", "worker"]
    try:
        with sigterm_raises(ctrl_c_again_raises=True):  # a second Ctrl-C kills the workers at once (WorkerGroup.stop)
            return _run(plan, program, evaluate, grace_s, progress_every_s)
    except KeyboardInterrupt:
        print("ps-worker launch: interrupted; the workers were stopped", file=sys.stderr)
        return 130
    except Terminated:
        print("ps-worker launch: terminated; the workers were stopped", file=sys.stderr)
        return TERMINATED_EXIT_CODE


def _run(plan: LaunchPlan, program: list[str], evaluate: Callable[[Any], dict] | None, grace_s: float,
         progress_every_s: float) -> int:  # fmt: skip
    remove_stale_temp_dirs()  # those of earlier runs killed by SIGKILL
    metrics_dir, lock_fd = make_temp_dir("launch")
    try:
        with _servers(plan) as (addresses, shard_died):
            commands = worker_commands(plan, addresses, metrics_dir, program)
            port, base = free_port(), dict(os.environ)
            if plan.local_shards:  # shards with no TLS or token (worker/cluster.py): the workers' client uses none
                base = without_security_variables(base)
            local = local_ranks(plan.backends)
            envs = [worker_environment(i, plan.workers, port, base, local[i]) for i in range(plan.workers)]
            bar = plan.progress_bar and sys.stderr.isatty()  # a log file gets the plain lines, not a bar's redraws
            progress = MergedProgress(plan.workers, bar, progress_every_s)
            group = WorkerGroup(commands, envs, lambda i, line: progress.print(f"[worker {i}] {line}"), progress.report)
            failure: tuple[int, int] | None = None
            finished = interrupted = False
            died: str | None = None

            def tick(now: float) -> None:
                progress.tick(now)
                why = shard_died()
                if why:  # the workers would wait for it for their --server-timeout: it never comes back
                    raise LocalShardDied(why)

            try:
                group.start()
                progress.open()
                group.read_output()
                failure = group.wait(tick)
                finished = failure is None
            except LocalShardDied as e:
                died = str(e)
            except (KeyboardInterrupt, Terminated):  # said by run_launch, after what the workers had trained
                interrupted = True
                raise
            finally:
                try:
                    group.stop(grace_s)
                finally:
                    progress.close()
                    said = [line for tail in group.tails for line in tail]
                    # no position to resume from where the servers hold a checkpoint's model, not those counts
                    # (replaced), or where a worker's share left it no example: a job of other workers or another
                    # split reads other shares (untrained)
                    replaced = any(MODEL_STATE_REPLACED in line for line in said)
                    untrained = any(UNTRAINED in line for line in said)
                    if not finished and not replaced and not untrained:
                        _say_where_to_resume(plan, progress.latest(), interrupted)
            if died is not None:
                print(f"ps-worker launch: {died}; the workers were stopped", file=sys.stderr, flush=True)
                return 1
            if failure is not None:
                _report_failure(*failure, group.tails)
                return 1
            per_worker = _read_worker_metrics(metrics_dir, plan)
            if per_worker is None:
                return 1
            if not per_worker:  # every worker's run had ended before: each said so and exited 0, with no figures
                print("ps-worker launch: every worker's --resume-file says its run ended before: nothing to do "
                      "(remove the files to train again)", flush=True)  # fmt: skip
                return 0
            backend, device = split_backend(plan.backends[0])  # worker 0's, for the final evaluation
            cfg = dataclasses.replace(plan.train_config, servers=tuple(addresses), local_shards=None, worker_id=0,
                                      num_workers=1, backend=backend, device=device or "cpu",
                                      metrics_out=None,
                                      **workers_bad_lines(plan.train_config, per_worker))  # fmt: skip
            died = shard_died()  # after the workers exited: the final evaluation would wait for it
            stopped: BaseException | None = None  # a Ctrl-C or SIGTERM in the final evaluation
            try:
                evaluation = final_evaluation(cfg, evaluate, plan.local_shards is not None) if died is None else {
                    "eval_error": f"{died}, after every worker had finished training (the model went with the local "
                                  "shards; the job was not evaluated)"}  # fmt: skip
            except (KeyboardInterrupt, Terminated) as e:  # the training is done: reported below, as for a failure
                stopped, evaluation = e, {"eval_error": evaluation_stopped(e, plan.local_shards is not None, addresses)}
        mode = getattr(plan.train_config, "mode", "async")
        merged = merge_metrics(per_worker, plan.backends, mode, evaluation, len(addresses))
        print(format_summary(merged), flush=True)
        metrics_error = None
        if plan.metrics_out:  # a failure (a full disk) is said after the rest of the summary; launch then fails
            metrics_error = write_metrics(plan.metrics_out, merged, "the job's figures")
            if metrics_error is None:
                print(f"metrics written to {plan.metrics_out}", flush=True)
        if plan.local_shards is not None:
            print(local_shards_gone("launch"), flush=True)
        else:
            print(model_kept(",".join(addresses)), flush=True)
        if "eval_error" in evaluation:  # the training is done and reported; its evaluation is not
            said = "ps-worker launch" if stopped is not None else "ps-worker: error"
            print(f"{said}: {evaluation['eval_error']}", file=sys.stderr, flush=True)
        if metrics_error is not None:
            print(f"ps-worker: error: {metrics_error}", file=sys.stderr, flush=True)
        if stopped is not None:
            return 130 if isinstance(stopped, KeyboardInterrupt) else TERMINATED_EXIT_CODE
        if "eval_error" in evaluation or metrics_error is not None:
            return 2 if died is None else 1
        return 0
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.close(lock_fd)


def workers_bad_lines(train_config: Any, per_worker: list[dict]) -> dict:
    """{"max_bad_lines", "max_bad_share"}: the bounds the job's final evaluation reads --eval-data with: the flag's,
    else those the workers' recipe gave them (their --metrics-out config), as each worker's own final evaluation
    would."""
    given = getattr(train_config, "max_bad_lines", None)
    if given is not None or not per_worker:
        return {"max_bad_lines": given}
    config = per_worker[0].get("config", {})
    return {"max_bad_lines": config.get("max_bad_lines"), "max_bad_share": config.get("max_bad_share")}


def final_evaluation(cfg: Any, evaluate: Callable[[Any], dict] | None, local_shards: bool = False) -> dict:
    """The job's figures on its eval set: evaluate(cfg) (default: worker.served.evaluate_servers, which computes the
    mean and std of standardized columns the schema leaves without them over --data, as the workers did) on --eval-data,
    or on the synthetic eval rows without --data; {} for a job on --data without --eval-data, which has no
    held-out file to score (format_summary says so). --eval-data is read as it is scored (launch checked a small
    file whole, of a larger one its start, before anything started): a ValueError of reading it (a malformed line
    past --max-bad-lines) gives {"eval_error": what happened, that the training had finished (local_shards: the
    model goes with them, else it stays on the servers)}: the job's training figures are still reported and
    written, and launch then fails. The data's warnings (the schema's) are not said again: launch said them as it
    checked the job."""
    if cfg.data is not None and cfg.eval_data is None:
        return {}
    if evaluate is None:
        from worker.served import evaluate_servers

        evaluate = functools.partial(evaluate_servers, trained_on_data=True, warn=False)  # warned as it started
    try:
        return evaluate(cfg)
    except PsError:
        raise
    except ValueError as e:
        kept = " (the model went with the local shards)" if local_shards else (
            " (the model stays on the servers: ps-worker eval scores it once the file is fixed or --max-bad-lines "
            "raised)")  # fmt: skip
        return {"eval_error": f"{e}; in the job's final evaluation, after every worker had finished training{kept}"}


def evaluation_stopped(e: BaseException, local_shards: bool, servers: Sequence[str]) -> str:
    """What a Ctrl-C (KeyboardInterrupt) or SIGTERM (Terminated) in the job's final evaluation stopped: the
    evaluation only, every worker having finished training; and where the model is."""
    how = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated"
    kept = ("the model went with the local shards" if local_shards else
            f"the model stays on the servers: ps-worker eval scores it, with --servers {','.join(servers)} and this "
            "run's model and data flags")  # fmt: skip
    return f"{how} in the job's final evaluation, after every worker had finished training ({kept})"


def _say_where_to_resume(plan: LaunchPlan, reports: dict[int, dict], interrupted: bool = False) -> None:
    """After a job that did not finish: how many examples each worker had trained (its last PROGRESS line: a
    worker stopped by a signal writes one as it stops), and the --skip-examples that trains on from there: the
    fewest, so that no worker leaves examples out (the others train up to the difference twice). Workers that
    keep a --resume-file resume from it: the same command again, which a --skip-examples would only refuse. On
    local shards, that the model went with them. interrupted (Ctrl-C or SIGTERM to launch): nothing to fix first."""
    trained = [
        int(reports[i].get("pushed", reports[i].get("examples")) or 0) if i in reports else 0
        for i in range(plan.workers)
    ]  # geo: the examples whose deltas were pushed
    if not any(trained):
        return
    if plan.local_shards is not None:
        print("ps-worker launch: the model the workers trained was on the local shards, stopped with this run: "
              "nothing to resume (launch with --servers to keep what a stopped job trained)",
              file=sys.stderr, flush=True)  # fmt: skip
        return
    from worker.resume import unused_because

    fixed = "" if interrupted else "once what stopped the job is fixed (a bad line, say), "
    resume_file = getattr(plan.train_config, "resume_file", None)
    if resume_file and unused_because(plan.train_config) is None:  # the workers keep their positions there
        print(f"ps-worker launch: the workers' positions are in their --resume-file {resume_file}, and the examples "
              f"they had trained are on the servers; to train on from there, {fixed}run the same command again (its "
              "--skip-examples, if any, unchanged: a file refuses another, and its position wins)",
              file=sys.stderr, flush=True)  # fmt: skip
        return
    skip = getattr(plan.train_config, "skip_examples", 0)
    done = [skip + n for n in trained]
    listed = ", ".join(f"{n:,}" for n in done)
    print(f"ps-worker launch: the workers had trained {listed} examples of their shares (their last progress "
          f"reports), which the servers keep; to train on from there, {fixed}run the same command with "
          f"--skip-examples {min(done)}"
          + (f" (worker {done.index(min(done))}'s: the others train up to {max(done) - min(done):,} examples again)"
             if max(done) > min(done) else ""), file=sys.stderr, flush=True)  # fmt: skip


class LocalShardDied(Exception):
    """A local shard of the job exited while its workers ran (its message says which and how)."""


# what a sync or ssp worker's error says when its job stopped because another worker stopped (ps.engine.jobs)
PEER_STOPPED = re.compile(r"job \d+ stops: worker (\d+) stopped before its end")


def _report_failure(worker: int, code: int, tails: Sequence[Sequence[str]]) -> None:
    """Says that worker exited with code (-N: killed by signal N) and repeats its last lines (tails: every
    worker's). Where those lines say the job stopped because another worker stopped before its end (a sync or ssp
    job: the workers stop within moments of each other, and the one that stopped first may exit second), that
    worker is named as the one that stopped the job, and its lines come first."""
    how = how_it_ended(code)
    causes = {int(m.group(1)) for line in tails[worker] if (m := PEER_STOPPED.search(line))} - {worker}
    cause = min(causes) if len(causes) == 1 and min(causes) < len(tails) else None
    if cause is not None:
        print(f"ps-worker launch: worker {cause} stopped the job, and worker {worker} {how} as it stopped with it; "
              f"the other workers were stopped. Worker {cause}'s last lines:", file=sys.stderr)  # fmt: skip
        for line in tails[cause]:
            print(f"  [worker {cause}] {line}", file=sys.stderr)
        print(f"Worker {worker}'s last lines:", file=sys.stderr)
    else:
        print(f"ps-worker launch: worker {worker} {how}; the other workers were stopped. Its last lines:",
              file=sys.stderr)  # fmt: skip
    for line in tails[worker]:
        print(f"  [worker {worker}] {line}", file=sys.stderr)


def _read_worker_metrics(metrics_dir: str, plan: LaunchPlan) -> list[dict] | None:
    """Every worker's --metrics-out object; [] where none wrote one because each one's --resume-file says its run
    ended before (resume.ended_before: such a worker exits 0 having nothing to do); None (reported) when one is
    missing or not JSON otherwise."""
    from worker.resume import ended_before

    out, ended = [], []
    for i in range(plan.workers):
        path = os.path.join(metrics_dir, f"worker-{i}.json")
        try:
            with open(path) as f:
                out.append(json.load(f))
            continue
        except (OSError, ValueError) as e:
            problem = e
        resume_file = getattr(plan.train_config, "resume_file", None)  # as TrainConfig.worker_resume_file gives it
        examples = (
            None
            if not resume_file or os.path.exists(path)
            else ended_before(resume_file.replace(RESUME_WORKER, str(i)))
        )
        if examples is None:
            print(f"ps-worker launch: worker {i} exited 0 but its metrics {path} are unreadable: {problem}",
                  file=sys.stderr)  # fmt: skip
            return None
        ended.append((i, examples))
    if ended and out:
        i, examples = ended[0]
        print(f"ps-worker launch: worker {i}'s --resume-file says its run ended before, after {examples:,} examples, "
              "while other workers trained: there are no figures of the job to merge; remove that file (or all of "
              "them) and run the command again", file=sys.stderr)  # fmt: skip
        return None
    return out

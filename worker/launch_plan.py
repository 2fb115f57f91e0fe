"""The plan of a `ps-worker launch`: its parser, its flags and the workers' train flags checked, and the job it runs
(a new job name, or the job the workers' --resume-files keep, each file checked as its worker would check it),
all before anything starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import os
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from ps.config import MAX_BARRIER_S
from ps.flagtypes import number, plain_int
from ps.stamp import job_named
from worker.cluster import without_security_variables
from worker.flags import check_not_an_input, check_output_file, same_file, server_list
from worker.launch_devices import check_devices, expand_backends, resolve_workers, split_backend
from worker.train_config import RESUME_WORKER, resume_file_of

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
    p.add_argument("--workers", type=plain_int, required=True, help="worker processes to start")
    p.add_argument(
        "--backends",
        default="numpy",
        help="comma-separated: one backend per worker, or one for all, each optionally with its device: "
        "numpy,torch:cuda runs worker 1 on the GPU (default: numpy; a worker without its own device gets --device)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--servers", default=None, help="comma-separated host:port list, in shard order")
    where.add_argument("--local-shards", type=plain_int, default=None,
                       help="instead of --servers: N throwaway shards (no TLS or token, on 127.0.0.1) started here "
                            "first and stopped at the end")  # fmt: skip
    p.add_argument(
        "--metrics-out",
        default=None,
        help="write the job's figures as one JSON object to this file (replaced if it exists)",
    )
    p.add_argument("--no-progress", action="store_true", help="a merged progress line every 10 s instead of a bar")
    p.add_argument("--barrier-timeout", type=number(0, MAX_BARRIER_S, above=True), default=None,
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


def check_train_flags(flags: Sequence[str]) -> None:
    """ValueError when train's parser rejects `flags` (unknown or abbreviated flag, bad value) or when they set
    what launch sets."""
    from ps.settings import add_config_flag, unrecognized
    from worker.cli_train_flags import add_train_parser

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
    TrainConfig `ps-worker train ARGV` would run with (default: worker.cli_train_config.train_config_from_argv)."""
    backends, servers = _check_launch_flags(args)
    config = getattr(args, "config", None)
    flags = [*passthrough, *(["--config", config] if config else [])]
    check_train_flags(flags)
    if args.barrier_timeout is not None:
        flags += ["--barrier-timeout", repr(args.barrier_timeout)]
    job_id = new_job_name()
    cfg = _worker_config(args, flags, servers, job_id, train_config)
    workers = resolve_workers(backends, cfg)
    check_devices(workers, getattr(cfg, "dense", "ps"))
    _check_dense_and_resume_file(cfg)
    kept = kept_job(cfg, args.workers)
    if kept is not None:  # the job launched again: its workers go on under its id, named by its name
        job_id, cfg = kept[1] or str(kept[0]), dataclasses.replace(cfg, job_id=kept[0], job_name=kept[1])
    check_resume_files(cfg, args.workers)
    _check_against_launch(args, cfg, config)
    log_level = getattr(args, "log_level", None)
    return LaunchPlan(
        workers=args.workers, backends=workers, servers=servers, local_shards=args.local_shards,
        train_flags=tuple(flags), train_config=cfg, job_id=job_id, metrics_out=args.metrics_out, progress_bar=not args.no_progress,
        global_flags=("--log-level", log_level) if log_level else (), job_lines=checked_job_lines(cfg, workers[0]),
    )  # fmt: skip


def _check_launch_flags(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(each worker's --backends entry, the --servers list) of launch's own flags, checked: --workers, the
    backends (torch needs PyTorch here), --servers or --local-shards (one of them), --metrics-out."""
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
    return backends, servers


def _worker_config(args: argparse.Namespace, flags: list[str], servers: tuple[str, ...], job_id: str,
                   train_config: Callable[[list[str]], Any] | None) -> Any:  # fmt: skip
    """The TrainConfig worker 0 of the job job_id would run with (train_config, by default train's own, in the
    workers' environment), its servers the --servers list or a stand-in address of the local shards; ValueError
    where train refuses the flags."""
    if train_config is None:
        from worker.cli_train_config import train_config_from_argv

        # the workers' environment: against local shards, without a client's TLS and token variables
        environ = without_security_variables(dict(os.environ)) if args.local_shards is not None else None
        train_config = functools.partial(train_config_from_argv, environ=environ)
    # the workers get the local shards' addresses: checked with a stand-in address
    where = ["--servers", ",".join(servers) if servers else "127.0.0.1:1"]
    try:
        return train_config([*flags, *where, "--worker-id", "0", "--num-workers", str(args.workers), "--job-id",
                             job_id])  # fmt: skip
    except SystemExit:
        raise ValueError("the train flags were refused (see the message above)") from None


def _check_dense_and_resume_file(cfg: Any) -> None:
    """ValueError where --dense allreduce lacks PyTorch here, or a --resume-file has no RESUME_WORKER in its name
    (the workers would share one)."""
    if getattr(cfg, "dense", "ps") == "allreduce" and importlib.util.find_spec("torch") is None:
        from worker.job import TORCH_HINT

        raise ValueError(f"--dense allreduce needs PyTorch (torch.distributed), which this Python does not have: "
                         f"{TORCH_HINT}")  # fmt: skip
    resume_file = getattr(cfg, "resume_file", None)
    if resume_file and RESUME_WORKER not in resume_file:
        raise ValueError(f"--resume-file {resume_file} (a flag, PS_RESUME_FILE or the config file) keeps one "
                         f"worker's position, and launch's workers would share it: put {RESUME_WORKER} in its name "
                         "(each worker's id takes its place), or leave it out")  # fmt: skip


def _check_against_launch(args: argparse.Namespace, cfg: Any, config: str | None) -> None:
    """ValueError where the train flags (cfg) conflict with launch's: security settings or --skip-examples with
    --local-shards; --metrics-out one of the inputs (config: the --config file) or a worker's --resume-file."""
    resume_file = getattr(cfg, "resume_file", None)
    if args.local_shards is not None:
        check_no_security(cfg)
    if args.local_shards is not None and getattr(cfg, "skip_examples", 0):
        raise ValueError("--skip-examples resumes training a model that servers hold; --local-shards starts new, "
                         "empty ones (give --servers)")  # fmt: skip
    check_not_an_input("--metrics-out", args.metrics_out, {**cfg.input_files(), "--config": config})
    for i in range(args.workers if resume_file and args.metrics_out else 0):
        if same_file(args.metrics_out, resume_file_of(resume_file, i)):
            raise ValueError(f"--metrics-out {args.metrics_out} is worker {i}'s --resume-file ({resume_file}): "
                             "each would replace the other (the job's figures lost, or the worker's position read "
                             "from them); give another file name")  # fmt: skip


def new_job_name() -> str:
    """The --job-id of a job launched anew: launch-<16 random hex digits>, a name (its hash the job's id,
    worker.cli_train_config job_id), by which the shards' messages name the job."""
    return f"launch-{secrets.token_hex(8)}"


def kept_job(cfg: Any, workers: int) -> tuple[int, str] | None:
    """The job id the workers' --resume-files keep (worker.resume.recorded), where the workers use them, with
    the job's name where one keeps it ("" where none does): the same launch again goes on under the job's id, which
    the shards let push while they hold the job for workers killed without a word (a job's own workers would
    otherwise be refused for its barrier timeout), and which each worker's file would refuse another of. None
    where no file keeps one, and for sync and ssp, whose job resumes under a new id (worker.resume.resumes_whole);
    ValueError where no one job is every file's (files of two jobs: in every mode, a job resumed from them would
    pair the positions of two runs). For sync and ssp a file that names job J resuming as R (its worker stopped
    before the new job R trained from it; worker.resume.recorded reads both) is of both J and R, so the files of a
    job resumed in part as R (some name R, others J resuming as R) are one job's; a file resuming as several new
    jobs (its worker refused under each) is of each of them."""
    from worker.resume import recorded, resumes_whole

    kept, resuming_as = {}, {}
    for path in _resume_files(cfg, workers):
        job, resuming = recorded(path)
        if job is not None:
            kept[path], resuming_as[path] = job, resuming if resumes_whole(cfg) else ()
    jobs_of = [{job_id, *resuming_as[path]} for path, (job_id, _) in kept.items()]
    if kept and not set.intersection(*jobs_of):
        also = {path: f" resuming as job{'s' * (len(ids) > 1)} {', '.join(map(str, ids))}"
                for path, ids in resuming_as.items() if ids}  # fmt: skip
        named = ", ".join(f"{path} job {job_named(*job)}{also.get(path, '')}" for path, job in kept.items())
        raise ValueError(f"the workers' --resume-files keep the positions of different jobs ({named}): remove "
                         "the files of the job not to resume")  # fmt: skip
    if resumes_whole(cfg):
        return None
    return max(kept.values(), key=lambda job: job[1], default=None)  # a file's name (an older file keeps none)


def check_resume_files(cfg: Any, workers: int) -> None:
    """ValueError where a worker's --resume-file would refuse its start (worker.resume.read_position: the file of a
    run of other settings, or no position this program wrote), as that worker would say it, here before any worker
    starts: not by that worker alone while the others train, stopped part way. cfg: worker 0's, under the job the
    files keep (kept_job)."""
    from worker.resume import read_position

    for i, path in enumerate(_resume_files(cfg, workers)):
        read_position(dataclasses.replace(cfg, worker_id=i, resume_file=path))


def _resume_files(cfg: Any, workers: int) -> list[str]:
    """Each worker's --resume-file (RESUME_WORKER replaced by its id, worker 0's first); [] where the workers use
    none (no --resume-file, or worker.resume.unused_because)."""
    from worker.resume import unused_because

    resume_file = getattr(cfg, "resume_file", None)
    if not resume_file or unused_because(cfg) is not None:
        return []
    return [resume_file_of(resume_file, i) for i in range(workers)]


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

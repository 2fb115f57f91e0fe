"""`ps-worker launch`: a job's workers started as child processes of one command, watched, and summed up.

    launch --workers N [--backends b0,b1,..] (--servers a,b | --local-shards S) [--metrics-out F] [TRAIN FLAGS]
      1. checks before anything starts: the TRAIN FLAGS through train's own parser, then the TrainConfig they make
         (worker/cli_train_config.py train_config_from_argv) validated for every worker's backend and device (an entry
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

Its parts: the checks of step 1 and the plan they make, worker/launch_plan.py (each worker's backend and device,
worker/launch_devices.py); the workers' commands, environments and processes, worker/launch_workers.py; the
workers' figures read back, the final evaluation, a failed worker's report and where to resume,
worker/launch_outcome.py; the PROGRESS lines it reads and the --metrics-out object it writes,
worker/launch_report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ps.errors import MODEL_STATE_REPLACED
from ps.terminate import EXIT_CODE as TERMINATED_EXIT_CODE
from ps.terminate import Terminated, sigterm_raises
from worker.cluster import free_port, without_security_variables
from worker.launch_devices import split_backend
from worker.launch_outcome import (
    evaluation_stopped,
    final_evaluation,
    read_worker_metrics,
    report_failure,
    say_where_to_resume,
    workers_bad_lines,
)
from worker.launch_plan import LaunchPlan, plan_launch
from worker.launch_report import MergedProgress, format_summary, merge_metrics
from worker.launch_workers import GRACE_S, WorkerGroup, local_ranks, worker_commands, worker_environment
from worker.results import UNTRAINED, local_shards_gone, model_kept, write_metrics
from worker.temp_dirs import make_temp_dir, remove_stale_temp_dirs


class LocalShardDied(Exception):
    """A local shard of the job exited while its workers ran (its message says which and how)."""


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
    143 on SIGTERM. ValueError for wrong arguments, before anything starts. worker_command: the program before `train`
    (default: this Python's -m worker); train_config: see plan_launch; evaluate(cfg): the final evaluation (default:
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
    """run_launch's job in its temporary metrics dir: the servers, the workers watched to their end, their figures
    read back, the final evaluation (on the servers, before local shards stop) and the summary; the exit code."""
    remove_stale_temp_dirs()  # those of earlier runs killed by SIGKILL
    metrics_dir, lock_fd = make_temp_dir("launch")
    try:
        with _servers(plan) as (addresses, shard_died):
            group, progress = _worker_group(plan, addresses, metrics_dir, program, progress_every_s)
            failed = _watch(plan, group, progress, shard_died, grace_s)
            if failed is not None:
                return failed
            per_worker = read_worker_metrics(metrics_dir, plan)
            if per_worker is None:
                return 1
            if not per_worker:  # every worker's run had ended before: each said so and exited 0, with no figures
                print("ps-worker launch: every worker's --resume-file says its run ended before: nothing to do "
                      "(remove the files to train again)", flush=True)  # fmt: skip
                return 0
            died, stopped, evaluation = _evaluate(plan, addresses, shard_died, evaluate, per_worker)
        return _summary(plan, per_worker, evaluation, addresses, died, stopped)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.close(lock_fd)


def _worker_group(plan: LaunchPlan, addresses: list[str], metrics_dir: str, program: list[str],
                  progress_every_s: float) -> tuple[WorkerGroup, MergedProgress]:  # fmt: skip
    """The job's workers (not started yet): their commands and environments, their lines printed through the
    merged progress (a bar on a terminal, plain lines in a log)."""
    commands = worker_commands(plan, addresses, metrics_dir, program)
    port, base = free_port(), dict(os.environ)
    if plan.local_shards:  # shards with no TLS or token (worker/cluster.py): the workers' client uses none
        base = without_security_variables(base)
    local = local_ranks(plan.backends)
    envs = [worker_environment(i, plan.workers, port, base, local[i]) for i in range(plan.workers)]
    bar = plan.progress_bar and sys.stderr.isatty()  # a log file gets the plain lines, not a bar's redraws
    progress = MergedProgress(plan.workers, bar, progress_every_s)
    group = WorkerGroup(commands, envs, lambda i, line: progress.print(f"[worker {i}] {line}"), progress.report)
    return group, progress


def _watch(plan: LaunchPlan, group: WorkerGroup, progress: MergedProgress, shard_died: Callable[[], str | None],
           grace_s: float) -> int | None:  # fmt: skip
    """The workers started and watched until they all exit, one fails or a local shard dies; then stopped (after
    grace_s), and where to resume said unless they finished. None when every worker exited 0, else the exit code
    (1), the failure reported. A Ctrl-C or SIGTERM propagates, the workers stopped."""
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
            if not finished:
                _say_where_to_resume(plan, group, progress, interrupted)
    if died is not None:
        print(f"ps-worker launch: {died}; the workers were stopped", file=sys.stderr, flush=True)
        return 1
    if failure is not None:
        report_failure(*failure, group.tails)
        return 1
    return None


def _say_where_to_resume(plan: LaunchPlan, group: WorkerGroup, progress: MergedProgress, interrupted: bool) -> None:
    """Where a job that did not finish can resume from (say_where_to_resume), unless the workers' lines say there
    is no such position."""
    said = [line for tail in group.tails for line in tail]
    # no position to resume from where the servers hold a checkpoint's model, not those counts (replaced), or where
    # a worker's share left it no example: a job of other workers or another split reads other shares (untrained)
    replaced = any(MODEL_STATE_REPLACED in line for line in said)
    untrained = any(UNTRAINED in line for line in said)
    if not replaced and not untrained:
        say_where_to_resume(plan, progress.latest(), interrupted)


def _evaluate(plan: LaunchPlan, addresses: list[str], shard_died: Callable[[], str | None],
              evaluate: Callable[[Any], dict] | None,
              per_worker: list[dict]) -> tuple[str | None, BaseException | None, dict]:  # fmt: skip
    """(why a local shard died, the Ctrl-C or SIGTERM that stopped the evaluation, the evaluation's figures or its
    "eval_error"): the job's final evaluation as worker 0's backend runs it, on the servers, after the workers
    exited; none where a local shard died."""
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
    return died, stopped, evaluation


def _summary(plan: LaunchPlan, per_worker: list[dict], evaluation: dict, addresses: list[str], died: str | None,
             stopped: BaseException | None) -> int:  # fmt: skip
    """The job's summary printed, --metrics-out written, where the model is and what failed said; the exit code:
    130 or 143 where the evaluation was stopped, 2 where it or the metrics file failed (1 after a shard died)."""
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

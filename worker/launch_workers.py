"""The running workers of a `ps-worker launch`: each worker's command line and environment, and WorkerGroup, which
starts them, reads their output, awaits their exits and stops them together.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from ps.settings import unknown_environment
from ps.terminate import TERMINATED, child_setup
from worker.launch_devices import split_backend
from worker.launch_plan import LaunchPlan
from worker.progress_lines import parse_progress

GRACE_S = 10.0  # SIGTERM to SIGKILL
TAIL_LINES = 20  # lines of a failed worker's output repeated in the failure report
STOPPED_LINE = f"ps-worker: {TERMINATED}"  # what a worker says as launch's SIGTERM stops it (ps.terminate.exit_code)


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
    """signum, once, to the worker's process group: the worker, its leader (child_setup), and its children, unless
    they left it; to the worker itself too where it is no longer the group's leader (a wrapper moved it to another
    group, its children staying in this one: killpg would reach them alone, and stop()'s wait would block) or the
    group has no process left to signal. Once: a worker that runs between two SIGTERMs (a loaded machine) gets both,
    and the second re-enters a handler still running (its line said twice) or, after ps-worker's handler is gone
    (ps.terminate.exit_code saying its line), ends the worker as SIGTERM's default action does (-15, its exit cut
    short). SIGKILL goes to the worker's pid as well in any case (a second delivery of it changes nothing), should
    the worker leave the group between the check and the killpg. The group is the one the worker was started to
    lead (child_setup), its id the worker's pid: signalled even once the worker exited and was reaped, when its
    children (torch's helpers, a data loader) may still run in it."""
    group = proc.pid  # the id of the group child_setup made the worker lead at its start
    try:
        leads = os.getpgid(proc.pid) == group
    except ProcessLookupError:  # the worker was reaped: it leads nothing
        leads = False
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):  # none left in the group, or none this process may signal
        leads = False
    if not leads or signum == signal.SIGKILL:
        proc.send_signal(signum)  # nothing if the worker was reaped


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

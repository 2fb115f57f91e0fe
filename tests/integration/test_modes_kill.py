"""A sync job whose worker is killed ends within the barrier deadline, naming the worker, and leaves no process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.waiting import PipeReader, wait_until
from worker.client import Client
from worker.cluster import DISCARDED_STOP_S
from worker.launch_workers import GRACE_S

PY = sys.executable
TRAIN = ["--model", "fm", "--recipe", "large", "--batch-size", "256", "--synthetic-rows", "2000000",
         "--synthetic-eval-rows", "1000", "--mode", "sync"]  # fmt: skip
LAUNCH_BARRIER_S = 60  # above launch's bound on stopping a job, so that a job ending before it proves launch stopped it


def _children(pid: int) -> list[int]:
    """The pids of pid's children (Linux /proc); none once pid has exited, which a child may do while we walk."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_worker_killed_in_a_sync_launch_stops_the_job_naming_it(tmp_path):
    """launch stops the other worker at once (SIGTERM, SIGKILL after GRACE_S), not at its barrier deadline, and
    the job ends, its shards stopped too (SIGKILL after DISCARDED_STOP_S), before that deadline. The stop takes
    its time: the other worker's step waits STEP_GRACE_S for its push, its exit collects its garbage, and a shard
    waits for a call compiling a numba kernel (a cold cache) to return: 15-18 s on one busy core."""
    assert GRACE_S + DISCARDED_STOP_S < LAUNCH_BARRIER_S - 15  # launch's own bound on the stop, with room to exit
    launcher = subprocess.Popen([PY, "-m", "worker", "launch", "--workers", "2", "--local-shards", "2",
                                 "--no-progress", "--barrier-timeout", str(LAUNCH_BARRIER_S), *TRAIN],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    reader = PipeReader(launcher.stdout)
    try:
        victim = []

        def worker_one_trains() -> bool:
            if launcher.poll() is not None:
                raise AssertionError(f"launch exited with {launcher.returncode}: {reader.close()}")
            kids = [p for p in _descendants(launcher.pid) if "--worker-id 1" in _cmdline(p)]
            victim[:] = kids[:1]
            return bool(kids)

        wait_until(worker_one_trains, timeout_s=60, what="worker 1 to start")
        shards = reader.wait_for(r"started 2 local shards: (\S+)", 60, "launch to start its shards").group(1)
        with Client(shards.split(","), timeout_s=30) as client:  # into training: both workers' steps run
            wait_until(lambda: min(s.min_clock for s in client.stats()) >= 3, timeout_s=90,
                       what=lambda: f"both workers to train; read:\n{reader.text()}")  # fmt: skip
        everything = _descendants(launcher.pid)
        survivor = [p for p in everything if "--worker-id 0" in _cmdline(p)]
        assert launcher.poll() is None, "the job ended before the kill"
        assert len(survivor) == 1, [(p, _cmdline(p)) for p in everything]
        killed_at = time.monotonic()
        os.kill(victim[0], signal.SIGKILL)
        wait_until(lambda: not _alive(survivor[0]), timeout_s=GRACE_S + 10,
                   what=lambda: f"launch to stop worker 0 (SIGKILL after {GRACE_S:g} s); read:\n{reader.text()}")  # fmt: skip
        launcher.wait(timeout=LAUNCH_BARRIER_S + 30)
        took = time.monotonic() - killed_at
        output = reader.close()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 1, output
    assert "worker 1 was killed by SIGKILL" in output, output[-3000:]
    assert "is it alive" not in output, output[-3000:]  # no wait ran into its deadline
    assert took < LAUNCH_BARRIER_S, took  # launch stops the job at once: the barrier deadline bounds it anyway
    left = [p for p in everything if _alive(p)]
    assert not left, [(p, _cmdline(p)) for p in left]


def test_a_sync_worker_whose_peer_died_stops_at_the_barrier_deadline_naming_it(servers):
    """Without a launcher: worker 0 waits for killed worker 1 at most --barrier-timeout, then exits naming it."""
    addresses, started = servers(2)  # 20 s: a worker compiling its kernels (a cold cache, a busy host) may lag 6 s
    common = ["--servers", ",".join(addresses), "--num-workers", "2", "--job-id", "23", "--barrier-timeout", "20",
              "--no-progress", *TRAIN]  # fmt: skip
    procs = [subprocess.Popen([PY, "-m", "worker", "train", *common, "--worker-id", str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]  # fmt: skip
    try:
        wait_until(lambda: started[0].shard.jobs.min_clock() >= 3, timeout_s=90, what="both workers to train")
        procs[1].kill()
        killed_at = time.monotonic()
        _, err = procs[0].communicate(timeout=60)
        took = time.monotonic() - killed_at
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert procs[0].returncode == 2, err
    assert "worker 1" in err and "is it alive" in err, err[-3000:]
    assert took < 20 + 10, took  # the deadline, and the time to say so

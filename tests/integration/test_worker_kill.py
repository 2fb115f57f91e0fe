"""A worker killed without a word (SIGKILL: an OOM kill, a lost node) leaves its job holding the shard for its
barrier timeout. Another job is refused until then, told how long and what to do; the killed worker started again
with the same command and its --resume-file goes on under its job's id at once: the file keeps the id and the
worker's token, so the shards take the restart for the same process. A sync job whose worker was killed resumes
whole, under a new job id, each worker from its own file."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

from tests.server_process import ServerProcess
from tests.waiting import PipeReader, wait_until

ROWS, BATCH = 20_000, 256
FLAGS = ["--model", "lr", "--recipe", "large", "--batch-size", str(BATCH), "--synthetic-eval-rows", "100",
         "--progress-lines"]  # fmt: skip
# `ps-worker train` that writes its --resume-file after every step and, as its step FROZEN_AT ends (its position
# written), waits for ever: a worker killed there deterministically, its file holding that step's position
FROZEN = """
import functools, sys, threading
import worker.loop, worker.train
from worker.__main__ import main
from worker.resume_writer import PositionWriter
worker.train.PositionWriter = functools.partial(PositionWriter, every_s=0.0)
real, steps = worker.loop.logloss, [0]
def logloss(labels, probs):
    steps[0] += 1
    if steps[0] == FROZEN_AT:
        threading.Event().wait()
    return real(labels, probs)
worker.loop.logloss = logloss
sys.exit(main(["train", *sys.argv[1:]]))
"""
FROZEN_AT = 5


def train(*flags: str, frozen: bool = False) -> subprocess.Popen:
    program = ["-c", FROZEN.replace("FROZEN_AT", str(FROZEN_AT))] if frozen else ["-m", "worker", "train"]
    return subprocess.Popen([sys.executable, *program, *flags, *FLAGS, "--synthetic-rows", str(ROWS)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def test_a_killed_worker_restarted_with_its_resume_file_trains_on_and_another_job_is_told_when_to_come(tmp_path):
    server = ServerProcess(tmp_path / "data")
    address = server.started()
    position = tmp_path / "position.json"
    try:
        first = train("--servers", address, "--resume-file", str(position), frozen=True)
        reader = PipeReader(first.stdout)
        try:
            wait_until(lambda: position.exists() and json.loads(position.read_text())["examples"] == FROZEN_AT * BATCH,
                       120, lambda: f"the first worker's position of its step {FROZEN_AT}: {reader.text()}")  # fmt: skip
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        job, token = (json.loads(position.read_text())[key] for key in ("job_id", "token"))

        other = subprocess.run([sys.executable, "-m", "worker", "train", "--servers", address, *FLAGS],
                               capture_output=True, text=True, timeout=300)  # fmt: skip
        assert other.returncode == 2, other.stdout + other.stderr
        said = re.search(rf"shard 0 holds job {job} .* for (\S+) s more .*: wait that long, or resume job {job} "
                         rf"\(its workers' command with --job-id {job}", other.stderr)  # fmt: skip
        assert said and 0 < float(said.group(1)) <= 60, other.stderr

        again = train("--servers", address, "--resume-file", str(position))
        out, _ = again.communicate(timeout=300)
        assert again.returncode == 0, out
        resumed = int(re.search(r"resuming after ([\d,]+) training examples", out).group(1).replace(",", ""))
        trained = re.search(r"trained lr .* on ([\d,]+) examples", out)
        assert resumed == FROZEN_AT * BATCH, out  # the position of the step it was killed after
        assert trained and int(trained.group(1).replace(",", "")) == ROWS - resumed, out
        assert (json.loads(position.read_text())["job_id"], json.loads(position.read_text())["token"]) == (job, token)
    finally:
        server.stop()


def test_a_sync_job_whose_worker_was_killed_resumes_whole_from_each_workers_resume_file(tmp_path):
    """A sync worker killed mid-run (SIGKILL, once its --resume-file holds the position of its step 5: its job id
    and the examples whose steps the shards applied) leaves that file; its peer stops at its barrier timeout and
    writes its own. Under a new --job-id both resume, each from its own position, and train the rest of their
    shares once."""
    server = ServerProcess(tmp_path / "data")
    address = server.started()
    position = str(tmp_path / "position-{worker}.json")
    killed = tmp_path / "position-1.json"

    def sync_worker(worker: int, job: str, frozen: bool = False) -> subprocess.Popen:
        return train("--servers", address, "--mode", "sync", "--num-workers", "2", "--worker-id", str(worker),
                     "--job-id", job, "--barrier-timeout", "3", "--resume-file", position,
                     frozen=frozen)  # fmt: skip

    def killed_examples() -> int:
        return json.loads(killed.read_text())["examples"] if killed.exists() else 0

    try:
        first = [sync_worker(0, "j1"), sync_worker(1, "j1", frozen=True)]
        readers = [PipeReader(p.stdout) for p in first]
        try:
            wait_until(lambda: killed_examples() == FROZEN_AT * BATCH, 120,
                       lambda: f"worker 1's position of its step {FROZEN_AT}: {readers[1].text()}")  # fmt: skip
        finally:
            first[1].send_signal(signal.SIGKILL)
            first[1].wait()
        assert first[0].wait(timeout=120) != 0, readers[0].close()  # its step waited for worker 1: the job stops
        kept = [json.loads((tmp_path / f"position-{w}.json").read_text()) for w in (0, 1)]
        assert [k["job_id"] for k in kept] == [kept[0]["job_id"]] * 2 and not any(k["trained"] for k in kept), kept
        assert kept[0]["examples"] > 0, kept

        again = [sync_worker(w, "j2") for w in (0, 1)]
        outs = [p.communicate(timeout=300)[0] for p in again]
        for w, out in enumerate(outs):
            assert again[w].returncode == 0, out
            resumed = int(re.search(r"resuming after ([\d,]+) training examples", out).group(1).replace(",", ""))
            assert resumed == kept[w]["examples"], out
            trained = re.search(r"trained lr .* on ([\d,]+) examples", out)
            assert trained and int(trained.group(1).replace(",", "")) == ROWS // 2 - resumed, out
    finally:
        server.stop()

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
from tests.waiting import PipeReader

ROWS = 150_000
FLAGS = ["--model", "lr", "--recipe", "large", "--batch-size", "256", "--synthetic-rows", str(ROWS),
         "--synthetic-eval-rows", "100", "--progress-lines"]  # fmt: skip


def train(*flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "worker", "train", *flags, *FLAGS], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def test_a_killed_worker_restarted_with_its_resume_file_trains_on_and_another_job_is_told_when_to_come(tmp_path):
    server = ServerProcess(tmp_path / "data")
    address = server.started()
    position = tmp_path / "position.json"
    try:
        first = train("--servers", address, "--resume-file", str(position))
        try:
            PipeReader(first.stdout).wait_for(r'"examples": [1-9]', 120, "the first worker's pushes")
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
        assert trained and int(trained.group(1).replace(",", "")) == ROWS - resumed, out
        assert (json.loads(position.read_text())["job_id"], json.loads(position.read_text())["token"]) == (job, token)
    finally:
        server.stop()


def test_a_sync_job_whose_worker_was_killed_resumes_whole_from_each_workers_resume_file(tmp_path):
    """A sync worker killed mid-run (SIGKILL) leaves its --resume-file's last write (its job id and a count of
    examples whose steps the shards applied); its peer stops at its barrier timeout and writes its own. Started
    again under the stopped job's id, a worker is refused, saying why; under a new --job-id both resume, each
    from its own position, and train the rest of their shares once."""
    server = ServerProcess(tmp_path / "data")
    address = server.started()
    position = str(tmp_path / "position-{worker}.json")

    def sync_worker(worker: int, job: str) -> subprocess.Popen:
        return train("--servers", address, "--mode", "sync", "--num-workers", "2", "--worker-id", str(worker),
                     "--job-id", job, "--barrier-timeout", "3", "--resume-file", position)  # fmt: skip

    try:
        first = [sync_worker(w, "j1") for w in (0, 1)]
        readers = [PipeReader(p.stdout) for p in first]
        try:
            readers[1].wait_for(r'"examples": [1-9]', 120, "worker 1's pushes")
        finally:
            first[1].send_signal(signal.SIGKILL)
            first[1].wait()
        assert first[0].wait(timeout=120) != 0, readers[0].close()  # its step waited for worker 1: the job stops
        kept = [json.loads((tmp_path / f"position-{w}.json").read_text()) for w in (0, 1)]
        assert [k["job_id"] for k in kept] == [kept[0]["job_id"]] * 2 and not any(k["trained"] for k in kept), kept

        same = subprocess.run([sys.executable, "-m", "worker", "train", "--servers", address, "--mode", "sync",
                               "--num-workers", "2", "--worker-id", "1", "--job-id", "j1", "--resume-file", position,
                               *FLAGS], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert same.returncode == 2 and "a --mode sync job resumes only under a new --job-id" in same.stderr, (
            same.stdout + same.stderr
        )

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

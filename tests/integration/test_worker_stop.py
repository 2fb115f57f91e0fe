"""`ps-worker train` stopped by SIGTERM (kill, a container runtime, a launcher) cleans up as on Ctrl-C: a message,
its local shards stopped, their temporary directory removed, exit code 143."""

import os
import signal
import subprocess
import sys

from tests.waiting import PipeReader, wait_until


def processes_mentioning(text: str) -> list[int]:
    """Pids of the processes whose command line holds text (this machine's /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


def test_sigterm_to_train_stops_its_local_shards_and_removes_their_directory(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # LocalCluster makes its root there
    p = subprocess.Popen([sys.executable, "-m", "worker", "train", "--local-shards", "1", "--synthetic-rows", "5000000",
                          "--recipe", "large", "--no-progress"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        out, err = PipeReader(p.stdout), PipeReader(p.stderr)
        out.wait_for("large-data recipe", 120, "the recipe line: the shards run, the tables exist")
        [root] = [name for name in os.listdir(tmp_path) if name.startswith("sparseps-")]
        assert os.listdir(tmp_path / root)  # the shard's data and log
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 143
    finally:
        p.kill()
        p.wait()
    assert "ps-worker: terminated" in err.close() and "Traceback" not in err.text()
    assert os.listdir(tmp_path) == []
    wait_until(lambda: not processes_mentioning(str(tmp_path)), 10, "the local shard's exit")

"""The command-line entry points, as a user runs them."""

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.waiting import PipeReader, wait_until

PY = sys.executable


def run(*args, timeout=300):
    return subprocess.run([PY, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args",
    [
        ("-m", "ps", "--help"),
        ("-m", "worker", "train", "--help"),
        ("-m", "worker", "synth", "--help"),
        ("-m", "worker", "schema", "--help"),
    ],  # fmt: skip
)
def test_help_explains_the_flags(args):
    r = run(*args)
    assert r.returncode == 0
    assert "--" in r.stdout and "default" in r.stdout


def test_train_on_synthetic_data_reports_auc_next_to_the_oracle(tmp_path):
    out = tmp_path / "m.json"
    r = run("-m", "worker", "train", "--local-shards", "2", "--synthetic-rows", "60000", "--synthetic-eval-rows", "20000",
            "--recipe", "large", "--no-progress", "--metrics-out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    m = json.loads(out.read_text())
    for key in ("eval_auc", "eval_logloss", "examples_per_s", "oracle_auc", "oracle_logloss"):
        assert isinstance(m[key], float), key
    assert m["eval_examples"] == 20000 and m["train_examples"] == 60000
    # The run is deterministic (one worker, a seeded generator): AUC 0.7532 and logloss 0.4941 against the planted
    # model's 0.7792 and 0.4665. The margins fail a real regression: a logistic regression instead of the FM
    # (0.7505, 0.5305), the sparse learning rate halved (0.7487, 0.5241) or doubled (0.7472, 0.4951).
    assert m["oracle_auc"] - 0.029 < m["eval_auc"] <= m["oracle_auc"]
    assert m["oracle_logloss"] <= m["eval_logloss"] < m["oracle_logloss"] + 0.032
    assert re.search(r"eval\s+AUC 0\.\d{4}", r.stdout) and "oracle AUC" in r.stdout


def test_train_from_criteo_files(tmp_path):
    train, test = tmp_path / "train.txt", tmp_path / "test.txt"
    assert run("-m", "worker", "synth", "--out", str(train), "--rows", "30000").returncode == 0
    assert run("-m", "worker", "synth", "--out", str(test), "--rows", "10000", "--start", "30000").returncode == 0
    out = tmp_path / "m.json"
    r = run("-m", "worker", "train", "--local-shards", "1", "--data", str(train), "--eval-data", str(test),
            "--model", "lr", "--epochs", "3", "--no-progress", "--metrics-out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    m = json.loads(out.read_text())
    # 30,000 rows: the small-data recipe (batch 256, a 10% validation split), said in the output; 3 of its epochs
    # (its early stopping, some 20 epochs in here, is tested in tests/test_train.py)
    assert "small-data recipe for 30,000 lines of training data" in r.stdout, r.stdout
    assert m["batch_size"] == 256 and m["eval_examples"] == 10000 and len(m["curve"]) == m["epochs_run"] == 3
    assert (
        m["train_examples"] == m["epochs_run"] * m["curve"][0]["examples"] and 26000 < m["curve"][0]["examples"] < 28000
    )
    assert re.search(r"epoch 1 step \d+: train logloss 0\.\d{4}  validation AUC 0\.\d{4}", r.stdout), r.stdout
    assert m["eval_auc"] > 0.725
    assert "oracle_auc" not in m  # files carry no planted probabilities


def test_a_synthetic_csv_with_a_history_bag_trains_through_its_schema(tmp_path):
    """synth --history writes a CSV with a multi-hot column and the schema that reads it; train --schema uses
    it; ps-worker schema infers a starting schema from the same file (the history column: multi_hot)."""
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    r = run("-m", "worker", "synth", "--out", str(train), "--rows", "20000", "--history", "1")
    assert r.returncode == 0, r.stderr
    assert "wrote its schema to" in r.stdout and (tmp_path / "train.csv.schema.toml").exists()
    assert train.read_text().split("\n")[0].endswith(",C26,history")
    r = run("-m", "worker", "synth", "--out", str(test), "--rows", "5000", "--start", "20000", "--history", "1")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "m.json"
    r = run("-m", "worker", "train", "--local-shards", "1", "--data", str(train), "--eval-data", str(test),
            "--schema", str(tmp_path / "train.csv.schema.toml"), "--model", "deepfm", "--hidden", "16",
            "--recipe", "large", "--no-progress", "--metrics-out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    m = json.loads(out.read_text())
    assert m["train_examples"] == 20000 and m["eval_examples"] == 5000 and m["eval_auc"] > 0.65
    inferred = run("-m", "worker", "schema", "--data", str(train), "--rows", "2000")
    assert inferred.returncode == 0, inferred.stderr
    assert 'label = "label"' in inferred.stdout
    history = inferred.stdout.split("# 'history': ")[1].split("\n\n")[0]
    assert history.startswith("lists split by '|'") and 'kind = "multi_hot"' in history


def test_bad_arguments_fail_with_a_message_not_a_traceback(tmp_path):
    r = run("-m", "worker", "train", "--data", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and "missing.txt does not exist" in r.stderr and "Traceback" not in r.stderr
    r = run("-m", "ps", "--data-dir", str(tmp_path), "--shard-id", "3", "--num-shards", "2")
    assert r.returncode == 2 and "--shard-id 3 must be in 0..1 (--num-shards 2)" in r.stderr


def _sigterm_to_a_thread_not_the_main_one(pid: int) -> None:
    import ctypes

    tasks = f"/proc/{pid}/task"
    deadline = time.monotonic() + 30  # the flusher names itself once it runs, which a loaded host may delay
    while True:
        names = {}
        for t in os.listdir(tasks):
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                names[int(t)] = pathlib.Path(f"{tasks}/{t}/comm").read_text().strip()
        flusher = next((t for t, name in names.items() if name == "ps-flusher"), None)
        if flusher is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert flusher is not None, f"no thread named ps-flusher among {sorted(names.values())}"
    assert ctypes.CDLL(None, use_errno=True).tgkill(pid, flusher, signal.SIGTERM) == 0


@pytest.mark.parametrize("to_a_thread", [False, True], ids=["to the process", "to a thread not the main one"])
def test_server_prints_its_port_and_stops_cleanly_on_sigterm(tmp_path, to_a_thread):
    """The kernel may deliver a process's SIGTERM to any of its threads; the main thread acts on it either way."""
    p = subprocess.Popen([PY, "-m", "ps", "--port", "0", "--data-dir", str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        out, err = PipeReader(p.stdout), PipeReader(p.stderr)
        out.wait_for(r"listening on 127\.0\.0\.1:\d+", 60, "the server's first line")
        if to_a_thread:
            _sigterm_to_a_thread_not_the_main_one(p.pid)
        else:
            p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        assert "stopped cleanly" in err.close()
    finally:
        p.kill()
    r = run("-m", "ps", "--data-dir", str(tmp_path), "--shard-id", "1", "--num-shards", "2")
    assert r.returncode == 2 and "belongs to shard 0 of 1" in r.stderr


def test_a_taken_port_is_a_clear_error_and_leaves_the_data_dir_alone(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run("-m", "ps", "--data-dir", str(tmp_path / "d"), "--port", str(port))
        assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port} (--host, --port)" in r.stderr
        assert "Traceback" not in r.stderr and not (tmp_path / "d").exists()
        r = run("-m", "ps", "--data-dir", str(tmp_path / "d"), "--port", "0", "--metrics-port", str(port))
        assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port} (--metrics-port)" in r.stderr
        assert "Traceback" not in r.stderr and not (tmp_path / "d").exists()


def test_two_servers_cannot_share_a_port(servers, tmp_path):
    addresses, _ = servers(1)
    port = addresses[0].rsplit(":", 1)[1]
    r = run("-m", "ps", "--data-dir", str(tmp_path / "other"), "--port", port)
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr


def test_stats_and_shrink_commands(tmp_path):
    import numpy as np

    from ps.config import EvictionConfig, TableConfig
    from worker.client import Client
    from worker.cluster import LocalCluster

    with LocalCluster(2, root=str(tmp_path)) as cluster, Client(cluster.addresses) as client:
        client.wait_ready()
        client.create_table(TableConfig("t", 4, eviction=EvictionConfig(ttl_steps=5)))
        old, new = np.arange(1000, dtype=np.uint64), np.arange(1000, 1300, dtype=np.uint64)
        client.push("t", old, np.ones((1000, 4)))
        client.advance_clock(10)
        client.push("t", new, np.ones((300, 4)))
        servers = ",".join(cluster.addresses)
        r = run("-m", "worker", "shrink", "--servers", servers, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"dropped": 1000, "num_rows": 300, "pending_ids": 0}
        r = run("-m", "worker", "stats", "--servers", servers)
        assert r.returncode == 0, r.stderr
        lines = [line.split() for line in r.stdout.splitlines() if line.split()[1:2] == ["t"]]
        assert len(lines) == 2 and sum(int(cols[2].replace(",", "")) for cols in lines) == 300  # num_rows
        assert "clock 10" in r.stdout


PARENT = """
import sys, time
from worker.cluster import LocalCluster
cluster = LocalCluster(2, root=sys.argv[1])
cluster.start()
print(" ".join(str(p.pid) for p in cluster.procs), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_local_shards_stop_cleanly_when_the_process_that_started_them_is_killed(tmp_path):
    """A killed trainer (SIGKILL: no handler runs) must not leave its local servers running: their stdin pipe
    closes with it, and they stop as on SIGTERM (flushed, 'stopped cleanly' in their logs)."""
    parent = subprocess.Popen([PY, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        line = PipeReader(parent.stdout).wait_for(r"^(\d+) (\d+)$", 120, "the pids of the 2 local shards")
        pids = [int(p) for p in line.groups()]
        assert all(_alive(p) for p in pids)
    finally:
        parent.kill()
        parent.wait(timeout=30)
    wait_until(lambda: not any(_alive(p) for p in pids), 60, "the local shards to stop after their parent was killed")
    for shard in range(2):
        log = (tmp_path / f"shard-{shard}.log").read_text()
        assert "standard input closed" in log and "stopped cleanly" in log, log[-2000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_terminals_ctrl_c_reaches_the_trainer_not_its_local_shards(tmp_path):
    """A terminal sends Ctrl-C's SIGINT to its foreground process group. The local shards run in a session of
    their own, so it reaches the trainer alone, which stops them once its step is done; when they got it too
    they quit under that step, which logged them as down ('waiting for it for up to 300 s') and sometimes
    waited out its 5 s grace. Here the trainer, a bare script, dies of it: its shards stop on their closed
    stdin, not on the SIGINT."""
    parent = subprocess.Popen([PY, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, start_new_session=True)  # fmt: skip
    try:
        line = PipeReader(parent.stdout).wait_for(r"^(\d+) (\d+)$", 120, "the pids of the 2 local shards")
        pids = [int(p) for p in line.groups()]
        os.killpg(parent.pid, signal.SIGINT)  # the terminal's Ctrl-C: to the parent's process group
        parent.wait(timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
    wait_until(lambda: not any(_alive(p) for p in pids), 60, "the local shards to stop after their parent")
    for shard in range(2):
        log = (tmp_path / f"shard-{shard}.log").read_text()
        assert "standard input closed" in log and "received SIGINT" not in log, log[-2000:]


def test_a_sigterm_during_ps_server_verify_exits_143_and_removes_its_read_only_view(tmp_path):
    """A command has no server's handler: SIGTERM still unwinds it, so its temporary folder goes with it."""
    data_dir, tmp = tmp_path / "d", tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.Popen([PY, "-m", "ps", "--port", "0", "--data-dir", str(data_dir)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        PipeReader(p.stdout).wait_for(r"listening on", 60, "the server's first line")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
    stopped_inside_the_view = (  # the view open, the signal comes: as a user's kill would, mid-verify
        "import contextlib, os, signal, sys, time\n"
        "import ps.storage.verifyscan as scan\n"
        "opened = scan.opened_read_only\n"
        "def held(*args, **kwargs):\n"
        "    with opened(*args, **kwargs) as got:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(30)\n"
        "        yield got\n"
        "scan.opened_read_only = contextlib.contextmanager(held)\n"
        "from ps.__main__ import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    r = subprocess.run([PY, "-c", stopped_inside_the_view, "verify", str(data_dir)], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "TMPDIR": str(tmp)})  # fmt: skip
    assert r.returncode == 143 and "ps-server: terminated" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and os.listdir(tmp) == [], (r.stderr, os.listdir(tmp))


def test_a_sigterm_while_ps_server_imports_stops_it_cleanly(tmp_path):
    """Before the server's own handler is in place (its imports take a second or two), a SIGTERM still ends it
    with a message, not by the signal's default action (which PID 1 of a container would not even take)."""
    p = subprocess.Popen([PY, "-m", "ps", "--port", "0", "--data-dir", str(tmp_path / "d")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        err = PipeReader(p.stderr)
        err.wait_for(r"settings \(defaults left out\)", 60, "ps-server's settings line, logged before its imports")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) in (143, 0), err.close()  # 0: the server's handler was in place by then
        said = err.close()
    finally:
        p.kill()
    assert "Traceback" not in said and ("ps-server: terminated" in said or "stopped" in said), said

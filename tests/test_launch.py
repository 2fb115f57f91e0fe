"""`ps-worker launch` (worker/launch*.py): argument checks, the workers' command lines and environment, merging of
PROGRESS lines and metrics, and the lifecycle of the children, run with fake worker scripts: a failing worker
stops the others, Ctrl-C and SIGTERM stop them all, and no process is left behind."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import inspect
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ps.stamp import job_hash
from ps.terminate import Terminated, how_it_ended
from tests.waiting import wait_until
from worker import launch_devices
from worker.cli_train_config import job_id
from worker.launch import run_launch
from worker.launch_devices import expand_backends
from worker.launch_outcome import final_evaluation
from worker.launch_plan import add_launch_parser, check_train_flags, plan_launch
from worker.launch_report import (
    MergedProgress,
    format_progress,
    format_summary,
    merge_metrics,
    merge_progress,
)
from worker.launch_workers import WorkerGroup, local_ranks, worker_commands, worker_environment
from worker.loop import LoopResult
from worker.loop_progress import ProgressLines
from worker.progress_lines import parse_progress
from worker.results import NOT_EVALUATED, ended_figures, local_shards_gone
from worker.temp_dirs import KEPT, LOCK, make_temp_dir, remove_stale_temp_dirs
from worker.train_config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
SERVERS = "127.0.0.1:7"
EVALUATION = {"eval_auc": 0.75, "eval_logloss": 0.5, "eval_examples": 1000, "oracle_auc": 0.8, "oracle_logloss": 0.45}

# A stand-in for `ps-worker train`: behaves as plan["workers"][its --worker-id] says, records its pid (and its
# child's) under plan["pids"], prints its environment and flags, then its PROGRESS lines, waits for the files
# named in "wait_for", and acts: metrics (write --metrics-out, exit 0), exit (code), kill (SIGKILL itself), sleep
# (after its "say" lines, if any, and a record "said-<i>"). ignore_term: it ignores SIGTERM; note_term: it records
# "term-<i>" on SIGTERM and runs on; say_term: it says "ps-worker: terminated" on SIGTERM, as ps-worker does, and
# exits 143.
FAKE_WORKER = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    plan = json.load(open(sys.argv[1]))
    train = sys.argv[sys.argv.index("train") + 1 :]
    flag = lambda name: train[len(train) - 1 - train[::-1].index(name) + 1]  # the last occurrence wins
    i = int(flag("--worker-id"))
    me, pids = plan["workers"][i], plan["pids"]

    def record(name, pid):
        with open(os.path.join(pids, name + ".tmp"), "w") as f:
            f.write(str(pid))
        os.replace(os.path.join(pids, name + ".tmp"), os.path.join(pids, name))

    if me.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if me.get("note_term"):  # it records "term-<i>" on SIGTERM, and sleeps on
        signal.signal(signal.SIGTERM, lambda *a: record(f"term-{i}", os.getpid()))
    if me.get("say_term"):  # as ps-worker says a SIGTERM (ps.terminate.exit_code)
        signal.signal(signal.SIGTERM, lambda *a: (print("ps-worker: terminated", file=sys.stderr, flush=True),
                                                  os._exit(143)))
    if me.get("grandchild"):
        record(f"grandchild-{i}", subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid)
    print(f"hello from {i}: RANK={os.environ['RANK']} WORLD_SIZE={os.environ['WORLD_SIZE']} "
          f"LOCAL_RANK={os.environ['LOCAL_RANK']} MASTER={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
          f"backend={flag('--backend')} job={flag('--job-id')} servers={flag('--servers')} "
          f"lines={'--progress-lines' in train} argv={' '.join(train[:train.index('--servers')])}")
    print("a line on stderr", file=sys.stderr)
    for report in me.get("progress", []):
        print("PROGRESS " + json.dumps(dict(report, worker=i)))
    sys.stdout.flush()
    record(f"worker-{i}", os.getpid())
    deadline = time.monotonic() + 30
    while not all(os.path.exists(os.path.join(pids, n)) for n in me.get("wait_for", [])):
        assert time.monotonic() < deadline, "the other fake workers did not start"
        time.sleep(0.01)
    if me["action"] == "metrics":
        with open(flag("--metrics-out"), "w") as f:
            json.dump(me["metrics"], f)
    elif me["action"] == "exit":
        print("\\n".join([*(f"boom {k}" for k in range(3)), *me.get("say", [])]), flush=True)
        sys.exit(me["code"])
    elif me["action"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif me["action"] == "sleep":
        if me.get("say"):  # its lines, then "said-<i>" for others to wait for
            print("\\n".join(me["say"]), flush=True)
            record(f"said-{i}", os.getpid())
        time.sleep(600)
""")


def launch_args(*argv: str) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="ps-worker")
    add_launch_parser(parser.add_subparsers(dest="command"))
    return parser.parse_known_args(["launch", *argv])


def stand_in_train_config(argv: list[str]) -> TrainConfig:
    """The TrainConfig the fake workers' flags make: the defaults, with the servers given."""
    return TrainConfig(servers=(SERVERS,))


def alive(pid: int) -> bool:
    """pid runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def recorded_pids(pids: Path) -> dict[str, int]:
    return {p.name: int(p.read_text()) for p in pids.iterdir() if not p.name.endswith(".tmp")}


def assert_all_gone(pids: Path, expected: set[str]) -> None:
    got = recorded_pids(pids)
    assert set(got) == expected
    wait_until(lambda: not any(alive(pid) for pid in got.values()), 10, lambda: f"the end of {got}")


@pytest.fixture
def fakes(tmp_path):
    """Factory: (worker_command, pids dir) for fake workers behaving as `workers` (a list of dicts) say."""

    def make(workers: list[dict]) -> tuple[list[str], Path]:
        script, plan, pids = tmp_path / "fake_worker.py", tmp_path / "plan.json", tmp_path / "pids"
        script.write_text(FAKE_WORKER)
        pids.mkdir()
        plan.write_text(json.dumps({"workers": workers, "pids": str(pids)}))
        return [sys.executable, str(script), str(plan)], pids

    return make


# --- arguments ---------------------------------------------------------------------------------------------------


def test_backends_one_per_worker_or_one_for_all():
    assert expand_backends("torch", 3) == ("torch", "torch", "torch")
    assert expand_backends("numpy, torch,numpy", 3) == ("numpy", "torch", "numpy")
    assert expand_backends("numpy,torch:cuda", 2) == ("numpy", "torch:cuda")
    assert expand_backends(" torch : cuda ", 2) == ("torch:cuda", "torch:cuda")
    with pytest.raises(ValueError, match="'torch:tpu' names the device 'tpu'; expected cpu or cuda"):
        expand_backends("numpy,torch:tpu", 2)
    with pytest.raises(ValueError, match="'torch:' names no device after ':'; expected cpu or cuda"):
        expand_backends("numpy,torch:", 2)
    with pytest.raises(ValueError, match="names 2 backends for --workers 3"):
        expand_backends("numpy,torch", 3)
    with pytest.raises(ValueError, match="'jax' is not a backend"):
        expand_backends("numpy,jax", 2)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--worker-id", "1"], "--worker-id is set by launch"),
        (["--worker", "1"], r"--worker is no flag \(abbreviations are not taken\): spell out --worker-id or --workers"),
        (["--epoch", "3"], r"--epoch is no flag \(abbreviations are not taken\): spell out --epochs \(flags launch"),
        (["--num-workers=2"], "--num-workers is set by launch"),
        (["--backend", "torch"], "--backend is set by launch: .* --backends"),
        (["--job-id", "7"], "--job-id is set by launch"),
        (["--progress-lines"], "--progress-lines is set by launch"),
        (["--launched"], "--launched is set by launch"),
        (["--create-tables-only"], "--create-tables-only is set by launch"),
        (["--metrics-o", "x.json"], "--metrics-o is no flag .*: spell out --metrics-out"),
        (["--epochz", "3"], r"unrecognized arguments: --epochz 3 \(--epochz: did you mean --epochs\?\)"),
        (["--epochs", "three"], "--epochs: expected an integer, got 'three'"),
        (["--batch-size", "0"], "--batch-size: expected an integer >= 1, got 0"),
        (["--learning-rate", "-1"], r"--learning-rate: a learning rate must be finite, >= 1e-30 and <= 1e\+30"),
        (["--model", "gbdt"], "--model: invalid choice"),
    ],
)
def test_train_flags_launch_sets_or_train_refuses_fail_before_anything_starts(flags, message):
    with pytest.raises(ValueError, match=message):
        check_train_flags(["--model", "lr", *flags])


CRITEO_LINE = "1" + "\t1" * 13 + "\ta" * 26 + "\n"


@pytest.mark.parametrize(
    "case, refusal",
    [
        ("format", "train.csv line 1: 1 tab-separated columns, expected 40"),
        ("eval-data", r"eval.tsv reads as criteo \(its first line is 40 tab-separated columns"),
        ("validation-data", r"eval.tsv reads as criteo \(its first line is 40 tab-separated columns"),
        ("label", "counts.csv: no column can be the label"),
        ("bad-label", "label '3', expected 0 or 1"),
        ("held-out", "--eval-data .*train.csv is also training data"),
        ("empty-eval", "empty.csv: no examples to evaluate on"),
        ("table-config", "names tables"),
    ],
)
def test_data_train_refuses_is_refused_by_launch_before_anything_starts_with_trains_message(
    tmp_path, monkeypatch, capsys, case, refusal
):
    """launch runs train's checks of the job's data and settings (worker.job.check_training) before it starts a
    shard or a worker: the same message as `ps-worker train`'s, the same exit code, nothing started."""
    import worker.cluster
    from worker.__main__ import main

    csv, tsv, counts = tmp_path / "train.csv", tmp_path / "eval.tsv", tmp_path / "counts.csv"
    csv.write_text("click,city\n" + "".join(f"{i % 2},c{i % 5}\n" for i in range(40)))
    tsv.write_text(CRITEO_LINE * 4)
    counts.write_text("id,clicks,city\n7,3,a\n8,0,b\n")
    (tmp_path / "bad.csv").write_text("click,city\n1,a\n3,b\n")
    (tmp_path / "empty.csv").write_text("click,city\n")
    (tmp_path / "tables.toml").write_text("[nosuch]\ndim = 4\n")
    flags = {
        "format": ["--data", csv, "--format", "criteo"],
        "eval-data": ["--data", csv, "--eval-data", tsv],
        "validation-data": ["--data", csv, "--validation-data", tsv],
        "label": ["--data", counts],
        "bad-label": ["--data", tmp_path / "bad.csv"],
        "held-out": ["--data", csv, "--eval-data", csv],
        "empty-eval": ["--data", csv, "--eval-data", tmp_path / "empty.csv"],
        "table-config": ["--data", csv, "--table-config", tmp_path / "tables.toml"],
    }[case]

    def refuse(*args, **kwargs):
        raise AssertionError("a local shard was started")

    monkeypatch.setattr(worker.cluster.LocalCluster, "__init__", refuse)
    errors = []
    for command in (["train", "--local-shards", "1"], ["launch", "--workers", "2", "--local-shards", "1"]):
        assert main([*command, "--model", "lr", *map(str, flags)]) == 2
        errors.append([line for line in capsys.readouterr().err.splitlines() if line.startswith("ps-worker: error:")])
    assert errors[0] == errors[1] and len(errors[0]) == 1, errors
    assert re.search(refusal, errors[0][0]), errors[0][0]


def test_train_flags_of_train_pass():
    check_train_flags(
        ["--model", "deepfm", "--epochs", "2", "--mode", "sync", "--hidden=16,8", "--synthetic-interactions", "-1"]
    )


def test_plan_takes_launch_flags_and_passes_the_rest_in_order():
    seen = []
    args, rest = launch_args("--workers", "2", "--model", "lr", "--servers", SERVERS, "--epochs", "3",
                             "--metrics-out", "out.json", "--no-progress", "--barrier-timeout", "5")  # fmt: skip
    plan = plan_launch(args, rest, lambda argv: seen.append(argv) or stand_in_train_config(argv))
    assert plan.train_flags == ("--model", "lr", "--epochs", "3", "--barrier-timeout", "5.0")
    assert plan.servers == (SERVERS,) and plan.metrics_out == "out.json" and not plan.progress_bar
    assert re.fullmatch(r"launch-[0-9a-f]{16}", plan.job_id), plan.job_id  # a name the shards' messages show
    assert seen == [[*plan.train_flags, "--servers", SERVERS, "--worker-id", "0", "--num-workers", "2",
                     "--job-id", plan.job_id]]  # fmt: skip


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workers", "2", "--servers", SERVERS, "--backend", "torch"], "--backend is set by launch"),
        (["--workers", "2"], "no servers"),
        (["--workers", "0", "--servers", SERVERS], "--workers 0"),
        (["--workers", "2", "--local-shards", "0"], "--local-shards 0"),
        (["--workers", "2", "--servers", ""], "--servers is empty"),
        (["--workers", "3", "--servers", SERVERS, "--backends", "numpy,torch"], "names 2 backends"),
    ],
)
def test_plan_refuses(argv, message):
    args, rest = launch_args(*argv)
    with pytest.raises(ValueError, match=message):
        plan_launch(args, rest, stand_in_train_config)


def test_torch_backends_without_pytorch_are_refused_before_anything_starts(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--backends", "numpy,torch")
    with pytest.raises(ValueError, match=r"--backends torch needs PyTorch, .*pip install torch==2.13.0"):
        plan_launch(args, rest, stand_in_train_config)
    args, rest = launch_args("--workers", "2", "--servers", SERVERS)
    assert list(plan_launch(args, rest, stand_in_train_config).backends) == ["numpy", "numpy"]
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--model", "deepfm", "--dense", "allreduce")
    with pytest.raises(ValueError, match=r"--dense allreduce needs PyTorch \(torch.distributed\), which this Python"):
        plan_launch(args, rest)  # numpy workers whose MLP torch.distributed would average


def test_a_skip_past_the_last_workers_share_of_max_examples_is_refused_before_anything_starts():
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--max-examples", "11", "--skip-examples", "5")
    with pytest.raises(ValueError, match=r"--skip-examples 5 reaches this worker's --max-examples limit \(5"):
        plan_launch(args, rest)  # worker 0's share is 6, worker 1's 5


def test_geo_with_ftrl_is_refused_before_any_worker_starts():
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--mode", "geo", "--optimizer", "ftrl")
    with pytest.raises(ValueError, match="--mode geo cannot train with --optimizer ftrl"):
        plan_launch(args, rest)


def test_a_resume_file_the_workers_would_share_is_refused_before_any_worker_starts(tmp_path, monkeypatch):
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--resume-file", str(tmp_path / "p.json"))
    with pytest.raises(ValueError, match=r"p.json \(a flag, PS_RESUME_FILE or the config file\) keeps one worker's "
                                         r"position, and launch's workers would share it: put \{worker\} in"):  # fmt: skip
        plan_launch(args, rest)
    monkeypatch.setenv("PS_RESUME_FILE", str(tmp_path / "p.json"))
    args, rest = launch_args("--workers", "2", "--servers", SERVERS)
    with pytest.raises(ValueError, match="launch's workers would share it"):
        plan_launch(args, rest)
    monkeypatch.setenv("PS_RESUME_FILE", str(tmp_path / "p-{worker}.json"))  # one file each
    assert plan_launch(args, rest).train_config.resume_file == str(tmp_path / "p-{worker}.json")


def test_a_launch_again_gives_its_workers_the_job_id_their_resume_files_keep(tmp_path):
    """A job's workers killed without a word leave it holding the shards: the same launch again goes on under its
    id (which each worker's file would refuse another of), given as its name where a file keeps one; files of two
    jobs are refused, in every mode; sync and ssp workers, whose job resumes only under a new id, get a new one."""
    from worker.resume_writer import PositionWriter

    def position(worker: int, job: int, name: str = "", mode: str = "async") -> None:  # worker's file in job
        PositionWriter(TrainConfig(servers=(SERVERS,), resume_file=str(tmp_path / f"p-{worker}.json"), mode=mode,
                                   num_workers=3, worker_id=worker, job_id=job, job_name=name)).write(300)  # fmt: skip

    resume = ["--resume-file", str(tmp_path / "p-{worker}.json")]
    args, rest = launch_args("--workers", "3", "--servers", SERVERS, *resume)
    assert plan_launch(args, rest).job_id != plan_launch(args, rest).job_id  # no file yet: a new one each time
    position(1, 12345)  # worker 0 and 2: none yet
    plan = plan_launch(args, rest)
    assert plan.job_id == "12345" and plan.train_config.job_id == 12345 and plan.train_config.job_name == ""
    assert worker_commands(plan, [SERVERS], "/m", ["w"])[2].count("12345") == 1
    sync = launch_args("--workers", "3", "--servers", SERVERS, *resume, "--mode", "sync")
    position(1, 12345, mode="sync")
    assert plan_launch(*sync).job_id.startswith("launch-")
    position(2, 678, mode="sync")
    with pytest.raises(ValueError, match="keep the positions of different jobs"):  # a new id, from one job's files
        plan_launch(*sync)
    position(1, 12345)
    position(2, 678)
    with pytest.raises(ValueError, match=r"keep the positions of different jobs \(.*p-1.json job 12345, .*p-2.json "
                                         r"job 678\): remove the files of the job not to resume"):  # fmt: skip
        plan_launch(args, rest)
    j3 = job_hash("j3")  # a job launched as --job-id j3: its files keep its name (an older file of it, none)
    position(1, j3)
    position(2, j3, "j3")
    plan = plan_launch(args, rest)
    assert (plan.job_id, plan.train_config.job_id, plan.train_config.job_name) == ("j3", j3, "j3")
    command = worker_commands(plan, [SERVERS], "/m", ["w"])[1]
    assert command[command.index("--job-id") + 1] == "j3"
    (tmp_path / "p-2.json").write_text(json.dumps({"format": 1, "job_id": 678, "job_name": "j4"}))  # not 678's
    with pytest.raises(ValueError, match=rf"\(.*p-1.json job {j3}, .*p-2.json job 678\)"):
        plan_launch(args, rest)


def test_an_ssp_job_resumed_in_part_launches_again_and_files_of_two_jobs_are_still_refused(tmp_path):
    """An ssp job j1 of 2 workers resumed by launch as j2: worker 0 trained a step under j2 (its file names j2),
    worker 1 was killed before its first step (its file still names j1, resuming as j2). The same launch again
    resumes them (under a new id), as it does after that launch (as j3) was refused before a step; a file of j1 with
    one of j2, unless the j1 file resumes as j2, is refused."""
    from worker.resume_writer import PositionWriter

    j1, j2, j3 = job_hash("j1"), job_hash("j2"), job_hash("j3")

    def writer(worker: int, job: int) -> PositionWriter:
        return PositionWriter(TrainConfig(servers=(SERVERS,), resume_file=str(tmp_path / f"p-{worker}.json"),
                                          mode="ssp", num_workers=2, worker_id=worker, job_id=job), every_s=3600)  # fmt: skip

    def resumed(worker: int, job: int, steps: int) -> None:  # as train() leaves the file of a worker resumed as job
        position = writer(worker, job)
        position.keep_job_until_past(300)
        position.update(300)  # the start
        for step in range(steps):
            position.update(400 + 100 * step)  # a step acknowledged

    for worker in range(2):
        writer(worker, j1).write(300)
    resumed(0, j2, steps=1)
    resumed(1, j2, steps=0)
    files = [json.loads((tmp_path / f"p-{worker}.json").read_text()) for worker in range(2)]
    assert [(f["job_id"], f["resuming_as"]) for f in files] == [(j2, []), (j1, [j2])], files
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--resume-file", str(tmp_path / "p-{worker}.json"),
                             "--mode", "ssp")  # fmt: skip
    plan = plan_launch(args, rest)
    assert plan.job_id.startswith("launch-") and plan.train_config.job_id not in (j1, j2)
    for worker in range(2):  # that launch, as j3, refused before a step: j2 and j1 files, each resuming as j3
        resumed(worker, j3, steps=0)
    assert plan_launch(args, rest).train_config.job_id not in (j1, j2, j3)
    other = job_hash("other")
    writer(0, other).write(400)  # a file of another job altogether
    with pytest.raises(ValueError, match=rf"p-0.json job {other}, .*p-1.json job {j1} resuming as jobs {j2}, {j3}\)"):
        plan_launch(args, rest)
    writer(0, j2).write(400)
    writer(1, j1).write(300)  # an older file of j1: none resumed as j2
    with pytest.raises(ValueError, match=rf"different jobs \(.*p-0.json job {j2}, .*p-1.json job {j1}\): remove"):
        plan_launch(args, rest)


def test_a_chain_of_refused_restarts_keeps_every_job_a_file_was_started_as(tmp_path):
    """An ssp job j1 of 2 workers resumed as j2: worker 0 trained a step under j2, worker 1 was refused before its
    first (worker 0's file names j2; worker 1's j1, resuming as j2). Worker 1 started again as j3, refused again, and
    again as j4: its file resumes as j2, j3 and j4, so a launch still takes the two files as one job's."""
    from worker.resume import recorded
    from worker.resume_writer import PositionWriter

    j1, j2, j3, j4 = (job_hash(name) for name in ("j1", "j2", "j3", "j4"))

    def resumed(worker: int, job: int, steps: int) -> None:  # as train() leaves the file of a worker resumed as job
        position = PositionWriter(TrainConfig(servers=(SERVERS,), resume_file=str(tmp_path / f"p-{worker}.json"),
                                              mode="ssp", num_workers=2, worker_id=worker, job_id=job), every_s=3600)  # fmt: skip
        if job == j1:
            position.write(300)
            return
        position.keep_job_until_past(300)
        position.update(300)  # the start
        for step in range(steps):
            position.update(400 + 100 * step)  # a step acknowledged

    for worker in range(2):
        resumed(worker, j1, steps=0)
    resumed(0, j2, steps=1)
    for job in (j2, j3, j4, j3):  # refused before a step each time (j3 twice: the same command again)
        resumed(1, job, steps=0)
    assert recorded(str(tmp_path / "p-1.json")) == ((j1, ""), (j2, j4, j3))
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--resume-file", str(tmp_path / "p-{worker}.json"),
                             "--mode", "ssp")  # fmt: skip
    assert plan_launch(args, rest).train_config.job_id not in (j1, j2, j3, j4)
    resumed(1, j3, steps=1)  # worker 1 trained under j3: its file names j3 alone
    assert json.loads((tmp_path / "p-1.json").read_text())["resuming_as"] == []
    with pytest.raises(ValueError, match=rf"different jobs \(.*p-0.json job {j2}, .*p-1.json job {j3}\): remove"):
        plan_launch(args, rest)


def test_launch_metrics_out_naming_a_workers_resume_file_is_refused_before_any_worker_starts(tmp_path):
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--resume-file", str(tmp_path / "p-{worker}.json"),
                             "--metrics-out", str(tmp_path / "p-1.json"))  # fmt: skip
    with pytest.raises(ValueError, match=r"--metrics-out .*p-1.json is worker 1's --resume-file"):
        plan_launch(args, rest)


def test_servers_and_local_shards_are_refused_together():
    with pytest.raises(SystemExit):  # the parser's mutually exclusive group
        launch_args("--workers", "2", "--servers", SERVERS, "--local-shards", "1")
    args, rest = launch_args("--workers", "2", "--servers", SERVERS)
    args.local_shards = 1
    with pytest.raises(ValueError, match="give --servers or --local-shards, not both"):
        plan_launch(args, rest, stand_in_train_config)


def test_plan_with_trains_own_config_checks_every_backend():
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--model", "lr", "--mode", "sync")
    plan = plan_launch(args, rest)
    assert (plan.train_config.model, plan.train_config.mode, plan.train_config.job_name) == ("lr", "sync", plan.job_id)
    assert plan.train_config.job_id == job_id(plan.job_id)[0]  # the name's hash: the id every worker's stamps carry
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--backends", "torch,numpy", "--model", "dnn",
                             "--device", "cuda")  # fmt: skip
    with pytest.raises(ValueError, match="--device cuda needs --backend torch.*name it in --backends \\(torch:cuda\\)"):
        plan_launch(args, rest)


def test_each_worker_gets_its_device_and_the_pairing_is_checked(monkeypatch):
    gpus = [(1, "2.x+cu")]  # what the child Python would say: one GPU
    monkeypatch.setattr(launch_devices, "cuda_device_count", lambda: gpus[0])
    args, rest = launch_args("--workers", "3", "--servers", SERVERS, "--backends", "numpy,torch:cuda,torch",
                             "--model", "fm")  # fmt: skip
    plan = plan_launch(args, rest)
    assert plan.backends == ("numpy", "torch:cuda", "torch")
    devices = [c[c.index("--backend") : c.index("--backend") + 4] for c in worker_commands(plan, ["h:1"], "/m", ["p"])]
    assert devices == [["--backend", "numpy", "--device", "cpu"], ["--backend", "torch", "--device", "cuda"],
                       ["--backend", "torch", "--device", "cpu"]]  # fmt: skip
    args, rest = launch_args(
        "--workers", "2", "--servers", SERVERS, "--backends", "torch:cpu,torch", "--device", "cuda"
    )
    assert plan_launch(args, rest).backends == ("torch", "torch:cuda")  # the flag's device, where no entry names one
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--device", "cuda")  # numpy workers only
    with pytest.raises(ValueError, match="--device cuda needs --backend torch .*; cuda runs torch workers only: give "
                                         "--backends torch:cuda"):  # fmt: skip
        plan_launch(args, rest)
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--backends", "numpy,numpy:cuda")
    with pytest.raises(ValueError, match=r"--backends numpy:cuda \(worker 1\): --device cuda needs --backend torch"):
        plan_launch(args, rest)
    gpus[0] = (0, "2.x+cpu")  # no GPU: the mixed devices of allreduce are said first, then the missing GPU
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--backends", "torch,torch:cuda", "--model",
                             "dnn", "--dense", "allreduce")  # fmt: skip
    with pytest.raises(ValueError, match="--dense allreduce .* one kind of device, not cpu and cuda"):
        plan_launch(args, rest)
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--backends", "numpy,torch:cuda")
    with pytest.raises(ValueError, match="worker 1 would run on cuda .* torch 2.x\\+cpu sees no CUDA device here"):
        plan_launch(args, rest)
    gpus[0] = (1, "2.x+cu")
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--backends", "torch", "--model", "dnn",
                             "--dense", "allreduce", "--device", "cuda")  # fmt: skip
    with pytest.raises(ValueError, match="--dense allreduce with 2 cuda workers, but torch sees 1 GPU here"):
        plan_launch(args, rest)


def test_the_gpus_are_asked_of_a_child_python():
    torch = pytest.importorskip("torch")
    assert launch_devices.cuda_device_count() == (torch.cuda.device_count() if torch.cuda.is_available() else 0,
                                          torch.__version__)  # fmt: skip


def test_how_a_child_ended_names_its_exit_code_or_its_signal():
    assert [how_it_ended(c) for c in (0, 2, -signal.SIGABRT, -signal.SIGKILL, -200)] == [
        "exited with code 0", "exited with code 2", "was killed by SIGABRT", "was killed by SIGKILL",
        "was killed by signal 200"]  # fmt: skip


def test_a_gpu_probe_killed_by_a_signal_is_said_so(monkeypatch):
    real = subprocess.run

    def killed(command, *args, **kwargs):  # the child Python dies of a signal, saying nothing
        return real([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], *args,
                    **kwargs)  # fmt: skip

    monkeypatch.setattr(subprocess, "run", killed)
    with pytest.raises(ValueError, match=r"the child Python that asks was killed by SIGKILL\): no message"):
        launch_devices.cuda_device_count()


def test_worker_commands_and_environment():
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--backends", "numpy,torch", "--epochs", "1")
    args.log_level = "INFO"
    plan = plan_launch(args, rest, stand_in_train_config)
    commands = worker_commands(plan, ["h:1", "h:2"], "/m", ["prog"])
    assert commands[1] == ["prog", "--log-level", "INFO", "train", "--epochs", "1", "--servers", "h:1,h:2",
                           "--worker-id", "1", "--num-workers", "2", "--backend", "torch", "--device", "cpu", "--job-id",
                           str(plan.job_id), "--metrics-out", "/m/worker-1.json", "--progress-lines",
                           "--launched", "--no-final-eval"]  # fmt: skip
    base = {"PATH": "/bin", "MKL_NUM_THREADS": "3", "PS_MODLE": "fm"}  # PS_MODLE sets nothing: launch warned of it
    env = worker_environment(1, 2, 29500, base)
    share = str(max(1, (os.cpu_count() or 1) // 2))  # each worker's share of the cores, unless base sets one
    assert env == {"PATH": "/bin", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "PYTHONUNBUFFERED": "1",
                   "OMP_NUM_THREADS": share, "OPENBLAS_NUM_THREADS": share, "MKL_NUM_THREADS": "3"}  # fmt: skip


def test_cuda_workers_local_ranks_count_the_cuda_workers_alone():
    """worker_device spreads "cuda" workers over the GPUs by LOCAL_RANK mod their count: numpy workers between them
    must not push two onto one GPU (by rank, workers 1 and 3 would both take cuda:1 of 2)."""
    assert local_ranks(["numpy", "torch:cuda", "numpy", "torch:cuda"]) == [0, 0, 2, 1]
    assert local_ranks(["torch:cuda"] * 3) == [0, 1, 2]  # allreduce's: one kind of device, each its rank
    assert local_ranks(["numpy", "torch:cpu", "torch:cuda:1"]) == [0, 1, 2]  # a named GPU is the worker's own
    env = worker_environment(3, 4, 29500, {}, local_rank=1)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("3", "1", "4")


# --- merging -----------------------------------------------------------------------------------------------------


def test_parse_progress():
    assert parse_progress('PROGRESS {"worker": 1, "examples": 5, "total": 0}') == {
        "worker": 1,
        "examples": 5,
        "total": 0,
    }
    assert parse_progress("PROGRESS {not json") is None
    assert parse_progress('PROGRESS {"steps": 3}') is None  # no examples: an output line
    assert parse_progress('progress {"examples": 5}') is None


def test_merge_progress_against_sums_and_means():
    a = {"examples": 100, "total": 400, "logloss": 0.6, "examples_per_s": 50.0, "cache_hit_rate": 0.5}
    b = {
        "examples": 300,
        "total": 600,
        "logloss": None,
        "examples_per_s": 25.0,
        "cache_hit_rate": 0.9,
        "cache_bytes_saved": 3 << 20,
    }
    c = {"examples": 0, "total": 0, "logloss": 0.4, "examples_per_s": 0.0}
    assert merge_progress([a, b], 2) == {"examples": 400, "total": 1000, "at_most": False, "estimated": False,
                                         "examples_per_s": 75.0,
                                         "logloss": 0.6, "cache_hit_rate": (0.5 * 100 + 0.9 * 300) / 400,
                                         "cache_bytes_saved": 3 << 20}  # fmt: skip
    assert merge_progress([a, b], 3)["total"] == 0  # a worker has not reported: the total is unknown
    m = merge_progress([a, c], 2)
    assert (m["total"], m["logloss"], m["cache_hit_rate"]) == (0, pytest.approx(0.5), 0.5)
    assert merge_progress([c], 1)["cache_hit_rate"] is None
    assert format_progress(merge_progress([a, b], 2)) == (
        "progress: 400 / 1,000 examples (40%), 75 examples/s, logloss 0.6000, cache hit rate 0.800, 3.0 MiB not pulled"
    )
    assert format_progress(merge_progress([c], 2)) == "progress: 0 examples, 0 examples/s, logloss 0.4000"
    stopping = merge_progress([a, {**b, "at_most": True}], 2)  # early stopping may end b's run sooner
    assert format_progress(stopping).startswith("progress: 400 / at most 1,000 examples (40%), ")


def test_progress_lines_never_count_past_their_total_and_end_at_the_examples_trained(capsys):
    """A worker's total may be an estimate (its share of a large file's lines, counted from its bytes)."""
    lines = ProgressLines(worker=0, total=90, every_s=0.0)
    result = LoopResult()
    for examples, final in ((50, False), (92, False), (92, True)):
        result.examples = examples
        lines.update(result, 0.5, seconds=1.0, extra={}, final=final)
    reports = [parse_progress(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["examples"], r["total"]) for r in reports] == [(50, 90), (92, 92), (92, 92)]
    early = ProgressLines(worker=0, total=900, every_s=60.0)
    result.examples = 300
    early.update(result, 0.5, seconds=1.0, extra={}, final=True)  # stopped early: done at what it trained
    assert parse_progress(capsys.readouterr().out)["total"] == 300
    bounded = ProgressLines(worker=0, total=900, every_s=0.0, at_most=True)  # --early-stop over several epochs
    bounded.update(result, 0.5, seconds=1.0, extra={})
    bounded.update(result, 0.5, seconds=1.0, extra={}, final=True)
    assert [parse_progress(line).get("at_most") for line in capsys.readouterr().out.splitlines()] == [True, None]
    plain = ProgressLines(worker=0, total=900, plain=True, every_s=0.0, at_most=True)
    plain.update(result, 0.5, seconds=1.0, extra={})
    assert "progress: 300 of at most 900 examples (33%)" in capsys.readouterr().err


def test_an_estimated_total_is_marked_about_and_never_reads_100_percent_before_the_end(capsys):
    """A large file's total is an estimate from its bytes (worker/linecount.py): the count may pass it."""
    lines = ProgressLines(worker=0, total=1000, every_s=0.0, estimated=True)
    result = LoopResult()
    for examples, final in ((400, False), (1000, False), (1500, False), (1500, True)):
        result.examples = examples
        lines.update(result, 0.5, seconds=1.0, extra={}, final=final)
    reports = [parse_progress(line) for line in capsys.readouterr().out.splitlines()]
    assert [r.get("estimated") for r in reports] == [True, True, True, None]
    assert reports[0]["total"] == 1000 and reports[-1]["total"] == 1500  # the end: the examples trained
    assert all(round(100 * r["examples"] / r["total"]) <= 99 for r in reports[:-1]), reports
    plain = ProgressLines(worker=0, total=1000, plain=True, every_s=0.0, estimated=True)
    result.examples = 1000
    plain.update(result, 0.5, seconds=1.0, extra={})
    assert "progress: 1,000 of about 1,012 examples (99%)" in capsys.readouterr().err
    a = {"examples": 600, "total": 500, "examples_per_s": 1.0, "estimated": True}  # past its estimate
    b = {"examples": 100, "total": 500, "examples_per_s": 1.0}
    m = merge_progress([a, b], 2)
    assert m["estimated"] and m["total"] == 1000
    assert format_progress(m).startswith("progress: 700 / about 1,000 examples (70%), ")
    assert format_progress(merge_progress([{**a, "examples": 995}, b], 2)).startswith(
        "progress: 1,095 / about 1,108 examples (99%), "
    )


def test_merged_progress_line_every_period_and_at_the_end():
    out = io.StringIO()
    progress = MergedProgress(2, bar=False, every_s=10.0, out=out)
    start = time.monotonic()
    progress.tick(start + 11)  # nothing reported yet: no line
    progress.report(0, {"examples": 10, "total": 20, "logloss": 0.5, "examples_per_s": 4})
    progress.print("[worker 0] hello")
    progress.tick(start + 12)  # within 10 s of the last check
    progress.tick(start + 22)
    progress.report(1, {"examples": 20, "total": 20, "logloss": 0.7, "examples_per_s": 6})
    progress.close()
    assert out.getvalue().splitlines() == [
        "[worker 0] hello",
        "progress: 10 examples, 4 examples/s, logloss 0.5000",
        "progress: 30 / 40 examples (75%), 10 examples/s, logloss 0.6000",
    ]
    out = io.StringIO()
    progress = MergedProgress(1, bar=False, every_s=10.0, out=out)
    progress.report(0, {"examples": 20, "total": 20, "logloss": 0.5, "examples_per_s": 4})
    progress.tick(start + 11)
    progress.close()  # nothing new since the last line: not printed twice
    assert out.getvalue().splitlines() == ["progress: 20 / 20 examples (100%), 4 examples/s, logloss 0.5000"]


def test_merged_progress_bar_counts_every_workers_examples():
    progress = MergedProgress(2, bar=True, out=io.StringIO())
    progress.open()
    try:
        progress.report(0, {"examples": 10, "total": 50, "logloss": 0.5, "cache_hit_rate": 0.25})
        progress.report(1, {"examples": 30, "total": 50, "logloss": 0.7})
        progress.report(0, {"examples": 25, "total": 50, "logloss": 0.5, "cache_hit_rate": 0.25})
        bar = progress._bar
        assert (bar.n, bar.total) == (55, 100)
        assert bar.postfix == "logloss=0.6000, hit=0.250"
    finally:
        progress.close()


def test_the_final_evaluation_runs_with_worker_0s_backend_and_device(fakes, monkeypatch, capsys):
    monkeypatch.setattr(launch_devices, "cuda_device_count", lambda: (1, "2.x+cu"))
    metrics = [{"train_examples": 20, "train_seconds": 1.0}] * 2
    command, _ = fakes([{"progress": [], "metrics": m, "action": "metrics"} for m in metrics])
    args, rest = launch_args("--workers", "2", "--backends", "torch:cuda,numpy", "--servers", SERVERS,
                             "--no-progress", "--model", "lr")  # fmt: skip
    evaluated = []
    rc = run_launch(args, rest, worker_command=command, train_config=stand_in_train_config,
                    evaluate=lambda cfg: evaluated.append(cfg) or EVALUATION)  # fmt: skip
    assert rc == 0, capsys.readouterr().out
    [cfg] = evaluated
    assert (cfg.backend, cfg.device) == ("torch", "cuda")
    assert "launched 2 workers (torch:cuda, numpy; mode async)" in capsys.readouterr().out


def test_a_final_evaluation_that_meets_a_bad_eval_line_says_the_training_had_finished():
    """The workers check a long --eval-data's start only; a bad line further on fails launch's final evaluation, which
    says so (and, on --servers, that the model is kept there) in the job's figures, in place of the eval line."""

    def bad_line(cfg):
        raise ValueError("test.tsv line 9: 3 tab-separated columns")

    cfg = TrainConfig(servers=("h:1",), data="train.tsv", eval_data="test.tsv")
    error = final_evaluation(cfg, bad_line)["eval_error"]
    assert re.match(r"test.tsv line 9: .*; in the job's final evaluation, after every worker had finished training "
                    r"\(the model stays on the servers: ps-worker eval scores it", error), error  # fmt: skip
    error = final_evaluation(cfg, bad_line, local_shards=True)["eval_error"]
    assert error.endswith("after every worker had finished training (the model went with the local shards)"), error
    summary = format_summary(merge_metrics([{"train_examples": 10, "train_seconds": 1.0}], ["numpy"], "async",
                                           {"eval_error": error}, 1))  # fmt: skip
    assert f"eval   failed: {error}" in summary


@pytest.mark.parametrize("servers", [True, False])
@pytest.mark.parametrize("stop, how, code", [(KeyboardInterrupt, "interrupted", 130), (Terminated, "terminated", 143)])
def test_a_ctrl_c_or_sigterm_in_the_final_evaluation_says_the_training_had_finished(fakes, monkeypatch, capsys, stop,
                                                                                   how, code, servers):  # fmt: skip
    """Every worker finished training; a Ctrl-C (or SIGTERM) stops the job's final evaluation: launch says so, not
    that it stopped the workers, reports the job's training figures, and on --servers points to ps-worker eval for
    the model the servers keep."""
    monkeypatch.setattr("worker.cluster.LocalCluster", FakeCluster)
    monkeypatch.setattr(FakeCluster, "made", [])
    monkeypatch.setattr(FakeCluster, "dies", {})
    command, _ = fakes([{"action": "metrics", "metrics": {"train_examples": 20, "train_seconds": 1.0}}] * 2)
    where = ("--servers", SERVERS) if servers else ("--local-shards", "1")
    args, rest = launch_args("--workers", "2", *where, "--no-progress")

    def stopped(cfg):
        raise stop()

    rc = run_launch(args, rest, worker_command=command, train_config=stand_in_train_config, evaluate=stopped)
    out, err = capsys.readouterr()
    assert rc == code, err
    kept = (f"the model stays on the servers: ps-worker eval scores it, with --servers {SERVERS} and this run's "
            "model and data flags" if servers else "the model went with the local shards")  # fmt: skip
    said = f"{how} in the job's final evaluation, after every worker had finished training ({kept})"
    assert f"ps-worker launch: {said}\n" in err and "the workers were stopped" not in err, err
    assert (
        "launched 2 workers (numpy, numpy; mode async) on 1 shard: 40 examples" in out
        and f"eval   failed: {said}" in out
    )
    assert [c.stopped for c in FakeCluster.made] == ([] if servers else [True])


def test_merge_metrics_and_summary():
    workers = [
        {"train_examples": 100, "train_seconds": 2.0, "cache_hit_rate": 0.5, "backend": "numpy"},
        {"train_examples": 300, "train_seconds": 4.0, "cache_hit_rate": 0.9, "backend": "torch"},
    ]
    m = merge_metrics(workers, ["numpy", "torch"], "sync", EVALUATION, 2)
    assert m == {"workers": 2, "backends": ["numpy", "torch"], "mode": "sync", "shards": 2, "train_examples": 400,
                 "train_seconds": 4.0, "examples_per_s": 100.0, **EVALUATION, "cache_hit_rate": pytest.approx(0.8),
                 "per_worker": workers}  # fmt: skip
    unevaluated = merge_metrics([{"train_examples": 1, "train_seconds": 1.0}], ["numpy"], "a", {}, 1)
    assert "cache_hit_rate" not in unevaluated and "eval_auc" not in unevaluated
    assert format_summary(unevaluated).splitlines()[1] == NOT_EVALUATED
    assert format_summary(m).splitlines() == [
        "launched 2 workers (numpy, torch; mode sync) on 2 shards: 400 examples in 4.0 s (the slowest worker): "
        "100 examples/s",
        "uneven examples per worker: worker 0 100, worker 1 300; each worker stops on its own (its early stopping, "
        "on its own validation split, or the end of its share)",
        "eval   AUC 0.7500  logloss 0.5000  (1,000 examples)",
        "oracle AUC 0.8000  logloss 0.4500  (the planted model)",
        "gap    AUC +0.0500",
        "cache  hit rate 0.800 (examples-weighted over the workers)",
    ]
    stopped = [dict(workers[0], epochs_run=2, stopped_early=True), dict(workers[1], train_examples=140, epochs_run=3)]
    assert "worker 0 100 (2 epochs, stopped early), worker 1 140 (3 epochs)" not in format_summary(
        merge_metrics(stopped, ["numpy", "torch"], "async", {}, 2)
    )  # 1.4x: even enough
    stopped[1]["train_examples"] = 150
    assert "uneven examples per worker: worker 0 100 (2 epochs, stopped early), worker 1 150 (3 epochs); " in (
        format_summary(merge_metrics(stopped, ["numpy", "torch"], "async", {}, 2))
    )
    limited = [dict(w, max_examples=400, stopped_at_max_examples=i == 1) for i, w in enumerate(workers)]
    m = merge_metrics(limited, ["numpy", "torch"], "sync", {}, 2)
    assert (m["max_examples"], m["stopped_at_max_examples"]) == (400, True)
    assert format_summary(m).splitlines()[0].startswith("launched 2 workers (numpy, torch; mode sync) on 2 shards: "
                                                        "400 examples (stopped at --max-examples 400) in 4.0 s")  # fmt: skip


def test_a_resumed_jobs_summary_says_what_its_workers_had_trained_before():
    """A job launched again after a stop: each worker trains on from its position (skipped_examples, its
    --resume-file's or --skip-examples), and the job's line and --metrics-out say so; the uneven line says that a
    resumed worker trains what its stopped run left, beside early stopping and its share's end. No uneven line
    where no worker trained any example."""
    workers = [
        {"train_examples": 22_150, "skipped_examples": 157_696, "train_seconds": 3.5, "epochs_run": 1},
        {"train_examples": 179_846, "train_seconds": 19.2, "epochs_run": 1},
    ]
    m = merge_metrics(workers, ["numpy", "numpy"], "async", {}, 2)
    assert (m["train_examples"], m["skipped_examples"]) == (201_996, 157_696)
    lines = format_summary(m).splitlines()
    assert lines[0].startswith("launched 2 workers (numpy, numpy; mode async) on 2 shards: 201,996 examples "
                               "(resumed after 157,696 examples) in 19.2 s")  # fmt: skip
    assert lines[1] == (
        "uneven examples per worker: worker 0 22,150 (1 epoch, resumed after 157,696), worker 1 179,846 (1 epoch); "
        "each worker stops on its own (its early stopping, on its own validation split, or the end of its share); "
        "a resumed worker trains what its stopped run left"
    )
    fresh = merge_metrics([dict(w, skipped_examples=0) for w in workers], ["numpy", "numpy"], "async", {}, 2)
    assert "skipped_examples" not in fresh and "resumed" not in format_summary(fresh)
    idle = [dict(w, train_examples=0) for w in workers]  # every worker resumed at the end of its share
    assert "uneven" not in format_summary(merge_metrics(idle, ["numpy", "numpy"], "async", {}, 2))


# --- the children ------------------------------------------------------------------------------------------------


def test_a_job_of_fake_workers_merges_their_output_progress_and_metrics(fakes, tmp_path, capsys):
    progress = [
        [{"examples": 10, "steps": 1, "total": 20, "logloss": 0.6, "examples_per_s": 5},
         {"examples": 20, "steps": 2, "total": 20, "logloss": 0.4, "examples_per_s": 10, "cache_hit_rate": 0.5}],
        [{"examples": 20, "steps": 2, "total": 20, "logloss": 0.6, "examples_per_s": 10, "cache_hit_rate": 1.0}],
    ]  # fmt: skip
    metrics = [{"train_examples": 20, "train_seconds": 1.0, "cache_hit_rate": 0.5},
               {"train_examples": 20, "train_seconds": 2.0, "cache_hit_rate": 1.0}]  # fmt: skip
    command, pids = fakes([{"progress": p, "metrics": m, "action": "metrics"} for p, m in zip(progress, metrics)])
    out = tmp_path / "job.json"
    args, rest = launch_args("--workers", "2", "--backends", "numpy,torch", "--servers", SERVERS, "--no-progress",
                             "--metrics-out", str(out), "--model", "lr", "--epochs", "1")  # fmt: skip
    evaluated = []
    rc = run_launch(args, rest, worker_command=command, train_config=stand_in_train_config,
                    evaluate=lambda cfg: evaluated.append(cfg) or EVALUATION)  # fmt: skip
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    hello = sorted(line for line in stdout.splitlines() if "hello from" in line)  # the workers' lines interleave
    assert len(hello) == 2 and hello[0].startswith("[worker 0] hello from 0: RANK=0 WORLD_SIZE=2 LOCAL_RANK=0")
    port, job = hello[0].split("MASTER=")[1].split()[0], hello[0].split("job=")[1].split()[0]
    assert f"MASTER={port} backend=torch job={job} servers={SERVERS} lines=True argv=--model lr --epochs 1" in hello[1]
    assert port.startswith("127.0.0.1:") and re.fullmatch(r"launch-[0-9a-f]{16}", job)
    assert "[worker 1] a line on stderr" in stdout and "PROGRESS" not in stdout
    assert "progress: 40 / 40 examples (100%), 20 examples/s, logloss 0.5000, cache hit rate 0.750" in stdout
    assert "launched 2 workers (numpy, torch; mode async) on 1 shard: 40 examples in 2.0 s" in stdout
    job_metrics = json.loads(out.read_text())
    assert job_metrics == merge_metrics(metrics, ["numpy", "torch"], "async", EVALUATION, 1)
    assert job_metrics["examples_per_s"] == 20.0 and job_metrics["cache_hit_rate"] == 0.75
    [cfg] = evaluated
    assert (cfg.servers, cfg.local_shards, cfg.backend, cfg.worker_id, cfg.num_workers) == (
        (SERVERS,),
        None,
        "numpy",
        0,
        1,
    )
    assert_all_gone(pids, {"worker-0", "worker-1"})


def test_a_job_on_a_data_file_without_eval_data_is_not_evaluated_and_says_so(fakes, tmp_path, capsys):
    """The training file's figures are no evaluation: launch scores --eval-data (evaluate_servers) or nothing."""
    command, pids = fakes([{"metrics": {"train_examples": 20, "train_seconds": 1.0}, "action": "metrics"}])
    out = tmp_path / "job.json"
    args, rest = launch_args("--workers", "1", "--servers", SERVERS, "--no-progress", "--metrics-out", str(out))
    (tmp_path / "train.tsv").write_text(CRITEO_LINE * 4)  # checked as train checks it; the fake worker reads nothing
    on_file = TrainConfig(servers=(SERVERS,), data=str(tmp_path / "train.tsv"))
    rc = run_launch(args, rest, worker_command=command, train_config=lambda argv: on_file,
                    evaluate=lambda cfg: pytest.fail("the training file evaluated as if held out"))  # fmt: skip
    assert rc == 0
    assert NOT_EVALUATED in capsys.readouterr().out
    assert not {"eval_auc", "eval_logloss", "eval_examples"} & set(json.loads(out.read_text()))
    assert_all_gone(pids, {"worker-0"})


@pytest.mark.skipif(
    not os.path.exists("/dev/full"), reason="needs /dev/full (Linux): a write that fails as on a full disk"
)
def test_a_metrics_out_that_cannot_be_written_fails_the_job_after_its_summary_naming_the_flag(fakes, capsys):
    worker_metrics = {"train_examples": 20, "train_seconds": 1.0}
    command, pids = fakes([{"metrics": worker_metrics, "action": "metrics"}])
    args, rest = launch_args("--workers", "1", "--servers", SERVERS, "--no-progress", "--metrics-out", "/dev/full")
    rc = run_launch(args, rest, worker_command=command, train_config=stand_in_train_config, evaluate=lambda cfg: {})
    captured = capsys.readouterr()
    assert rc == 2 and "launched 1 worker (" in captured.out and "metrics written" not in captured.out
    assert ("ps-worker: error: --metrics-out /dev/full: could not write the job's figures: [Errno 28] No space left "
            "on device") in captured.err, captured.err  # fmt: skip
    assert_all_gone(pids, {"worker-0"})


def test_a_bad_eval_line_after_training_keeps_the_jobs_figures_and_reads_with_the_workers_limit(fakes, tmp_path,
                                                                                                  capsys):  # fmt: skip
    """A malformed --eval-data line past the limit fails the job (exit 2) after its summary and --metrics-out are
    written with the error; the evaluation reads with the --max-bad-lines the workers' recipe gave them."""
    worker_metrics = {"train_examples": 20, "train_seconds": 1.0, "config": {"max_bad_lines": 0, "max_bad_share": 0.01}}
    command, pids = fakes([{"metrics": worker_metrics, "action": "metrics"}])
    out = tmp_path / "job.json"
    args, rest = launch_args("--workers", "1", "--servers", SERVERS, "--no-progress", "--metrics-out", str(out))
    for name in ("train.tsv", "test.tsv"):
        (tmp_path / name).write_text(CRITEO_LINE * 4)  # checked as train checks it; the fake worker reads nothing
    on_files = TrainConfig(servers=(SERVERS,), data=str(tmp_path / "train.tsv"), eval_data=str(tmp_path / "test.tsv"))
    limits = []

    def bad_line(cfg):
        limits.append((cfg.max_bad_lines, cfg.max_bad_share))
        raise ValueError("test.tsv line 9: 3 tab-separated columns; 1 bad line, more than --max-bad-lines 0")

    rc = run_launch(args, rest, worker_command=command, train_config=lambda argv: on_files, evaluate=bad_line)
    captured = capsys.readouterr()
    assert rc == 2 and limits == [(0, 0.01)]
    assert "launched 1 worker (" in captured.out and "eval   failed: test.tsv line 9: " in captured.out
    assert "ps-worker: error: test.tsv line 9: " in captured.err
    assert "after every worker had finished training" in json.loads(out.read_text())["eval_error"]
    assert_all_gone(pids, {"worker-0"})


@pytest.mark.parametrize("action, how", [({"action": "exit", "code": 3}, "exited with code 3"),
                                         ({"action": "kill"}, "was killed by SIGKILL")])  # fmt: skip
def test_a_failing_worker_stops_the_others_and_their_children(fakes, capsys, action, how):
    wait = {"wait_for": ["worker-1", "grandchild-1", "worker-2"]}
    command, pids = fakes([{**action, **wait}, {"action": "sleep", "grandchild": True}, {"action": "sleep"}])
    args, rest = launch_args("--workers", "3", "--servers", SERVERS, "--no-progress")
    started = time.monotonic()
    rc = run_launch(args, rest, worker_command=command, train_config=stand_in_train_config,
                    evaluate=lambda cfg: pytest.fail("no evaluation after a failure"), grace_s=60.0)  # fmt: skip
    assert time.monotonic() - started < 60.0  # SIGTERM did it: no wait for the grace period
    err = capsys.readouterr().err
    assert rc == 1
    assert f"worker 0 {how}; the other workers were stopped" in err
    if action["action"] == "exit":
        assert "  [worker 0] boom 2" in err and "  [worker 0] a line on stderr" in err
    assert_all_gone(pids, {"worker-0", "worker-1", "grandchild-1", "worker-2"})


def test_a_job_that_stops_says_which_skip_trains_on_from_where_its_slowest_worker_was(fakes, capsys):
    """The workers' last PROGRESS reports (a stopped worker writes one as it stops), after a resumed run's skip."""
    wait = {"wait_for": ["worker-1"]}
    command, pids = fakes([{"action": "exit", "code": 3, "progress": [{"examples": 300}], **wait},
                           {"action": "sleep", "progress": [{"examples": 100}, {"examples": 500}]}])  # fmt: skip
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--no-progress")
    resumed = TrainConfig(servers=(SERVERS,), skip_examples=1000)
    assert run_launch(args, rest, worker_command=command, train_config=lambda argv: resumed) == 1
    err = capsys.readouterr().err
    assert ("the workers had trained 1,300, 1,500 examples of their shares (their last progress reports), which the "
            "servers keep; to train on from there, once what stopped the job is fixed (a bad line, say), run the same "
            "command with --skip-examples 1300 (worker 0's: the others train up to 200 examples again)"
            ) in err, err  # fmt: skip
    assert_all_gone(pids, {"worker-0", "worker-1"})
    args, rest = launch_args("--workers", "2", "--local-shards", "1", "--no-progress")
    with pytest.raises(ValueError, match="--skip-examples resumes training a model that servers hold"):
        run_launch(args, rest, worker_command=command, train_config=lambda argv: resumed)


@pytest.mark.parametrize("where", ["servers", "local shards"])
def test_a_ctrl_c_while_the_workers_train_says_where_to_train_on_from_with_nothing_to_fix(fakes, monkeypatch, capsys,
                                                                                        where):  # fmt: skip
    """A Ctrl-C stopped the job, not a fault: the hint says to run the command again with the skip, not to fix
    what stopped it first; on local shards, that the model went with them."""
    monkeypatch.setattr("worker.cluster.LocalCluster", FakeCluster)
    monkeypatch.setattr(FakeCluster, "made", [])
    monkeypatch.setattr(FakeCluster, "dies", {})
    command, pids = fakes([{"action": "sleep", "progress": [{"examples": 300}], "say": ["ready"]},
                           {"action": "sleep", "progress": [{"examples": 500}], "say": ["ready"]}])  # fmt: skip

    def read(group) -> bool:  # both workers' "ready", read after their progress
        try:
            return all("ready" in tail for tail in group.tails)
        except RuntimeError:  # a reader thread appended to the deque meanwhile
            return False

    def interrupted(group, tick=None, poll_s=0.5):  # once both workers' progress was read: a Ctrl-C
        said = [pids / f"said-{i}" for i in range(2)]  # recorded just after "ready": a stop before it loses them
        wait_until(lambda: read(group) and all(p.exists() for p in said), 30, "the workers' lines")
        raise KeyboardInterrupt

    monkeypatch.setattr(WorkerGroup, "wait", interrupted)
    flags = ("--servers", SERVERS) if where == "servers" else ("--local-shards", "1")
    args, rest = launch_args("--workers", "2", *flags, "--no-progress")
    assert run_launch(args, rest, worker_command=command, train_config=stand_in_train_config) == 130
    err = capsys.readouterr().err
    assert "once what stopped the job is fixed" not in err, err
    if where == "servers":
        assert (
            "the workers had trained 300, 500 examples of their shares (their last progress reports), which the "
            "servers keep; to train on from there, run the same command with --skip-examples 300"
        ) in err, err
    else:
        assert "--skip-examples" not in err and "was on the local shards, stopped with this run: nothing to " in err
    assert err.rstrip().endswith("ps-worker launch: interrupted; the workers were stopped"), err
    assert_all_gone(pids, {"worker-0", "worker-1", "said-0", "said-1"})


def test_the_workers_launch_stops_do_not_each_say_they_were_terminated(fakes, capsys):
    """launch says it stopped the other workers: their own 'ps-worker: terminated' as its SIGTERM lands is not
    printed once more for each of them."""
    command, pids = fakes([{"action": "exit", "code": 3, "wait_for": ["worker-1", "worker-2"]},
                           {"action": "sleep", "say_term": True}, {"action": "sleep", "say_term": True}])  # fmt: skip
    args, rest = launch_args("--workers", "3", "--servers", SERVERS, "--no-progress")
    assert run_launch(args, rest, worker_command=command, train_config=stand_in_train_config) == 1
    out, err = capsys.readouterr()
    assert "worker 0 exited with code 3; the other workers were stopped" in err, err
    assert "terminated" not in out + err and "[worker 1] hello from 1" in out, out + err
    assert_all_gone(pids, {"worker-0", "worker-1", "worker-2"})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a POSIX process group; /proc")
def test_stop_sends_each_worker_one_sigterm_even_where_it_runs_between_signals(tmp_path, monkeypatch):
    """stop()'s SIGTERM reaches a worker once. Each signal stop() sends the worker's pid (kill) or group (killpg) is
    waited on until the worker has handled it, as on a loaded machine where the worker runs before launch sends its
    next signal: two sends would then be two deliveries (pending, they merge into one), the second re-entering the
    handler of the first (the fake's 'ps-worker: terminated' said twice)."""
    count = tmp_path / "terms"
    script = ("import signal, time\n"
              f"signal.signal(signal.SIGTERM, lambda *a: open({str(count)!r}, 'a').write('term\\n'))\n"
              "print('ready', flush=True)\n"
              "while True:\n    time.sleep(1)\n")  # fmt: skip
    lines: list[str] = []
    group = WorkerGroup([[sys.executable, "-c", script]], [dict(os.environ)], lambda i, line: lines.append(line),
                        lambda i, report: None)  # fmt: skip

    def handled() -> int:  # SIGTERMs the worker's handler saw
        return len(count.read_text().splitlines()) if count.exists() else 0

    real_kill, real_killpg = os.kill, os.killpg

    def handled_before_the_next(send):
        def signal_and_wait(pid: int, signum: int) -> None:
            before = handled()
            send(pid, signum)
            if signum == signal.SIGTERM and group.procs and pid == group.procs[0].pid:
                with contextlib.suppress(AssertionError):  # a send that does not reach it: the count says so
                    wait_until(lambda: handled() > before, 5, "the worker's SIGTERM handler")

        return signal_and_wait

    monkeypatch.setattr(os, "kill", handled_before_the_next(real_kill))
    monkeypatch.setattr(os, "killpg", handled_before_the_next(real_killpg))
    group.start()
    group.read_output()
    wait_until(lambda: "ready" in lines, 30, "the worker's 'ready'")
    group.stop(grace_s=0.5)  # the worker runs on after SIGTERM: SIGKILL ends it
    assert handled() == 1 and group.procs[0].returncode == -signal.SIGKILL, (handled(), group.procs[0].returncode)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a POSIX process group")
def test_stop_kills_a_worker_that_left_its_group_while_its_child_stayed_in_it(tmp_path):
    """A worker (as a wrapper may make it) that moved to another process group, its child left in the group launch
    made for it, both ignoring SIGTERM: stop()'s SIGKILL reaches the worker itself, not the child alone, so its
    wait ends."""
    script = ("import os, signal, subprocess, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
              "os.setpgid(0, os.getpgid(os.getppid()))\n"
              "print('ready', child.pid, flush=True)\n"
              "while True:\n    time.sleep(1)\n")  # fmt: skip
    lines: list[str] = []
    group = WorkerGroup([[sys.executable, "-c", script]], [dict(os.environ)], lambda i, line: lines.append(line),
                        lambda i, report: None)  # fmt: skip
    group.start()
    group.read_output()
    stopper = threading.Thread(target=group.stop, kwargs={"grace_s": 0.5}, daemon=True)
    try:
        wait_until(lambda: any(line.startswith("ready") for line in lines), 30, "the worker's 'ready'")
        worker = group.procs[0]
        assert os.getpgid(worker.pid) != worker.pid  # it left the group launch made for it
        stopper.start()
        stopper.join(timeout=60)
        assert not stopper.is_alive(), "stop() still waits for the worker that left its group"
        assert worker.returncode == -signal.SIGKILL, worker.returncode
    finally:
        for pid in [group.procs[0].pid, *(int(line.split()[1]) for line in lines if line.startswith("ready"))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="runs `sh` and `sleep`; /proc")
def test_stop_ends_the_children_a_worker_that_exited_left_in_its_group():
    """A worker that exited at once (reaped by its thread, as when one worker ends and launch stops the rest),
    leaving a child in the group launch made for it: stop()'s signals still reach that group, so the child ends."""
    lines: list[str] = []
    group = WorkerGroup([["sh", "-c", "sleep 60 >/dev/null & echo $!"]], [dict(os.environ)],
                        lambda i, line: lines.append(line), lambda i, report: None)  # fmt: skip
    group.start()
    group.read_output()
    worker = group.procs[0]
    child = None
    try:
        child = int(wait_until(lambda: lines and lines[0], 30, "the worker's child's pid"))
        wait_until(lambda: worker.returncode is not None, 30, "the worker's exit, reaped by its thread")
        assert alive(child) and os.getpgid(child) == worker.pid  # left behind in the worker's group
        group.stop(grace_s=0.5)
        wait_until(lambda: not alive(child), 10, "the end of the child the worker left in its group")
    finally:
        if child is not None and alive(child):  # the test's own `sleep`, still running
            os.kill(child, signal.SIGKILL)


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period(fakes, capsys):
    command, pids = fakes([{"action": "exit", "code": 2, "wait_for": ["worker-1"]},
                           {"action": "sleep", "ignore_term": True}])  # fmt: skip
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--no-progress")
    started = time.monotonic()
    rc = run_launch(args, rest, worker_command=command, train_config=stand_in_train_config, grace_s=0.5)
    assert rc == 1 and time.monotonic() - started >= 0.5
    assert_all_gone(pids, {"worker-0", "worker-1"})


def test_a_worker_without_metrics_fails_the_job(fakes, capsys):
    command, pids = fakes([{"action": "none"}])
    args, rest = launch_args("--workers", "1", "--servers", SERVERS, "--no-progress")
    rc = run_launch(args, rest, worker_command=command, train_config=stand_in_train_config,
                    evaluate=lambda cfg: pytest.fail("no evaluation without metrics"))  # fmt: skip
    assert rc == 1 and "worker 0 exited 0 but its metrics" in capsys.readouterr().err


class FakeCluster:
    """worker.cluster.LocalCluster's stand-in: records how it was made and whether it was stopped."""

    made: list[FakeCluster] = []

    dies: dict[int, str] = {}  # shard -> what gone() says of it once the workers run

    def __init__(self, num_shards: int, extra_args: list[str] = ()):
        self.num_shards, self.extra_args, self.stopped = num_shards, list(extra_args), False
        self.addresses = [f"127.0.0.1:{17 + i}" for i in range(num_shards)]
        FakeCluster.made.append(self)

    def died(self) -> str | None:
        return next(iter(FakeCluster.dies.values()), None)

    def __enter__(self) -> FakeCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stopped = True


def test_local_shards_start_first_with_threads_for_the_workers_and_stop_at_the_end(fakes, monkeypatch, capsys):
    monkeypatch.setattr("worker.cluster.LocalCluster", FakeCluster)
    FakeCluster.made = []
    command, pids = fakes([{"action": "sleep"}, {"action": "sleep"}, {"action": "exit", "code": 1,
                                                                      "wait_for": ["worker-0", "worker-1"]}])  # fmt: skip
    args, rest = launch_args("--workers", "3", "--local-shards", "2", "--no-progress")
    assert run_launch(args, rest, worker_command=command, train_config=stand_in_train_config) == 1
    [cluster] = FakeCluster.made
    assert (cluster.num_shards, cluster.extra_args, cluster.stopped) == (2, ["--threads", "10"], True)
    out, err = capsys.readouterr()
    assert "servers=127.0.0.1:17,127.0.0.1:18" in out
    assert "worker 2 exited with code 1" in err, f"another worker failed first:\n{out}\n{err}"
    assert_all_gone(pids, {"worker-0", "worker-1", "worker-2"})


def test_a_local_shard_that_dies_stops_the_job_at_once_saying_which(fakes, monkeypatch, capsys):
    """Nothing restarts a local shard: its workers would wait for it for their --server-timeout (300 s)."""
    monkeypatch.setattr("worker.cluster.LocalCluster", FakeCluster)
    monkeypatch.setattr(FakeCluster, "made", [])
    monkeypatch.setattr(FakeCluster, "dies", {1: "local shard 1 (pid 9) was killed by SIGKILL, and ..."})
    command, pids = fakes([{"action": "sleep"}, {"action": "sleep"}])
    died = FakeCluster.died  # the shard dies once both workers run (recorded their pids), however slow their start
    monkeypatch.setattr(FakeCluster, "died", lambda self: died(self) if len(recorded_pids(pids)) == 2 else None)
    args, rest = launch_args("--workers", "2", "--local-shards", "2", "--no-progress")
    started = time.monotonic()
    rc = run_launch(args, rest, worker_command=command, train_config=stand_in_train_config,
                    evaluate=lambda cfg: pytest.fail("no evaluation after a shard died"))  # fmt: skip
    assert rc == 1 and time.monotonic() - started < 60 and FakeCluster.made[0].stopped
    err = capsys.readouterr().err
    assert "ps-worker launch: local shard 1 (pid 9) was killed by SIGKILL, and ...; the workers were stopped" in err
    assert_all_gone(pids, {"worker-0", "worker-1"})


def test_a_local_shard_dead_once_the_workers_finished_fails_the_job_before_its_evaluation(fakes, monkeypatch, capsys):
    """The workers' pushes were answered, but the final evaluation would wait for the dead shard."""
    import worker.launch as launch

    monkeypatch.setattr("worker.cluster.LocalCluster", FakeCluster)
    monkeypatch.setattr(FakeCluster, "made", [])
    monkeypatch.setattr(FakeCluster, "dies", {})
    read_metrics = launch.read_worker_metrics

    def read_then_die(*args):  # the workers all exited 0: from now on shard 0 is dead
        FakeCluster.dies[0] = "local shard 0 (pid 9) exited with code 1"
        return read_metrics(*args)

    monkeypatch.setattr(launch, "read_worker_metrics", read_then_die)
    command, pids = fakes([{"metrics": {"train_examples": 20, "train_seconds": 1.0}, "action": "metrics"}])
    args, rest = launch_args("--workers", "1", "--local-shards", "1", "--no-progress")
    rc = run_launch(args, rest, worker_command=command, train_config=stand_in_train_config,
                    evaluate=lambda cfg: pytest.fail("no evaluation after a shard died"))  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 1 and FakeCluster.made[0].stopped
    assert "examples" in out, "the training figures are still reported"
    assert "local shard 0 (pid 9) exited with code 1, after every worker had finished training" in err


def test_a_job_on_local_shards_ends_saying_the_model_went_with_them(fakes, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("worker.cluster.LocalCluster", FakeCluster)
    FakeCluster.made = []
    command, pids = fakes([{"metrics": {"train_examples": 20, "train_seconds": 1.0}, "action": "metrics"}])
    out = tmp_path / "job.json"
    args, rest = launch_args("--workers", "1", "--local-shards", "1", "--no-progress", "--metrics-out", str(out))
    rc = run_launch(args, rest, worker_command=command, train_config=stand_in_train_config,
                    evaluate=lambda cfg: EVALUATION)  # fmt: skip
    [cluster] = FakeCluster.made
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and cluster.stopped and lines[-2:] == [f"metrics written to {out}", local_shards_gone("launch")]
    assert "launch with --servers to keep it for eval, predict and export" in lines[-1]
    assert_all_gone(pids, {"worker-0"})


DRIVER = textwrap.dedent("""
    import argparse, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises, even if the tests run as a shell's
    # background job: one starts with SIGINT ignored, and Python keeps an inherited SIG_IGN
    sys.path.insert(0, sys.argv[1])
    from worker.launch import run_launch
    from worker.launch_plan import add_launch_parser
    from worker.train_config import TrainConfig
    parser = argparse.ArgumentParser()
    add_launch_parser(parser.add_subparsers(dest="command"))
    args, rest = parser.parse_known_args(["launch", "--workers", "2", "--servers", "127.0.0.1:7", "--no-progress"])
    sys.exit(run_launch(args, rest, worker_command=sys.argv[2:], train_config=lambda argv: TrainConfig(servers=("127.0.0.1:7",)),
                        evaluate=lambda cfg: {}))
""")


def start_driver(fakes, tmp_path, grandchild: bool) -> tuple[subprocess.Popen, Path]:
    """A launch of two sleeping fake workers (worker 0 with a child) in a process of its own, once both run."""
    command, pids = fakes([{"action": "sleep", "grandchild": grandchild}, {"action": "sleep"}])
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    temp = tmp_path / "temp"  # the launch's TMPDIR: where its metrics directory goes
    temp.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(driver), str(ROOT), *command], stdout=subprocess.DEVNULL,
                            env={**os.environ, "TMPDIR": str(temp)})  # fmt: skip
    wait_until(lambda: len(recorded_pids(pids)) == 2 + grandchild or proc.poll() is not None, 60, "the workers")
    assert proc.poll() is None, f"the launch exited with {proc.returncode}"
    return proc, pids


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_every_worker(fakes, tmp_path, signum, code):
    proc, pids = start_driver(fakes, tmp_path, grandchild=True)
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == code
    assert_all_gone(pids, {"worker-0", "grandchild-0", "worker-1"})
    assert os.listdir(tmp_path / "temp") == []  # its metrics directory removed


# `ps-worker launch` as its command line runs it (worker.__main__.main, whose sigterm_raises block encloses launch's),
# with the fake workers and a stand-in train config
CLI_DRIVER = textwrap.dedent("""
    import functools, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as DRIVER
    sys.path.insert(0, sys.argv[1])
    import worker.__main__ as cli
    from worker.launch import run_launch
    from worker.train_config import TrainConfig
    cli.run_launch = functools.partial(run_launch, worker_command=sys.argv[2:], evaluate=lambda cfg: {},
                                       train_config=lambda argv: TrainConfig(servers=("127.0.0.1:7",)))
    sys.exit(cli.main(["launch", "--workers", "2", "--servers", "127.0.0.1:7", "--no-progress"]))
""")


def test_a_second_ctrl_c_to_the_ps_worker_command_kills_the_workers_at_once(fakes, tmp_path):
    """launch's own Ctrl-C handler (every Ctrl-C raises: a second one cuts the workers' grace period short) is
    in place under ps-worker's, which encloses it: the second Ctrl-C kills the workers at once, and ps-worker's
    own stop ("stopping already: this signal is ignored while the stop finishes, 120 s after the first at most")
    does not take it."""
    command, pids = fakes([{"action": "sleep", "note_term": True}, {"action": "sleep", "note_term": True}])
    driver = tmp_path / "cli_driver.py"
    driver.write_text(CLI_DRIVER)
    proc = subprocess.Popen([sys.executable, str(driver), str(ROOT), *command], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_until(lambda: len(recorded_pids(pids)) == 2 or proc.poll() is not None, 60, "the workers")
    assert proc.poll() is None, f"the launch exited with {proc.returncode}"
    proc.send_signal(signal.SIGINT)
    wait_until(lambda: {"term-0", "term-1"} <= set(recorded_pids(pids)), 60, "the workers' SIGTERM")
    proc.send_signal(signal.SIGINT)  # while launch waits out the grace period of workers that run on
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "stopping already" not in err, err
    assert "ps-worker launch: interrupted; the workers were stopped" in err
    assert_all_gone(pids, {"worker-0", "worker-1", "term-0", "term-1"})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_killed_launcher(fakes, tmp_path):
    proc, pids = start_driver(fakes, tmp_path, grandchild=False)
    proc.kill()
    proc.wait(timeout=60)
    assert_all_gone(pids, {"worker-0", "worker-1"})  # SIGTERM from the kernel (a worker stops its own children)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_directory_of_a_killed_launcher_is_removed_by_the_next_launch(fakes, tmp_path, monkeypatch, caplog):
    proc, pids = start_driver(fakes, tmp_path, grandchild=False)
    proc.kill()
    proc.wait(timeout=60)
    assert_all_gone(pids, {"worker-0", "worker-1"})
    [left] = os.listdir(tmp_path / "temp")  # SIGKILL: nothing could remove it
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "temp"))
    worker = tmp_path / "metrics_worker.py"  # writes its --metrics-out and exits 0
    worker.write_text("import json, sys\nout = sys.argv[sys.argv.index('--metrics-out') + 1]\n"
                      "json.dump({'train_examples': 1}, open(out, 'w'))\n")  # fmt: skip
    args, rest = launch_args("--workers", "1", "--servers", SERVERS, "--no-progress")
    with caplog.at_level("WARNING", logger="worker.temp_dirs"):
        rc = run_launch(args, rest, worker_command=[sys.executable, str(worker)], train_config=stand_in_train_config,
                        evaluate=lambda cfg: {})  # fmt: skip
    assert rc == 0 and os.listdir(tmp_path / "temp") == []
    assert f"removed {tmp_path / 'temp' / left}, left by an earlier run (pid {proc.pid}) that is gone" in caplog.text


def test_only_the_directories_of_gone_runs_of_this_user_and_host_not_kept_are_removed(tmp_path, caplog):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        made, lock_fd = make_temp_dir("launch")
        os.close(lock_fd)
        shutil.rmtree(made)
        made = Path(made)
        host = made.name.split("-", 3)[3].rsplit("-", 1)[0]  # sparseps-launch-<pid>-<host>-<random>
        launch, local = "sparseps-launch-", "sparseps-local-"
        names = {
            "dead": f"{launch}{gone.pid}-{host}-abc_123",
            "dead local": f"{local}{gone.pid}-{host}-abc_123",
            "kept local": f"{local}{gone.pid}-{host}-kept_1",
            "in use": f"{local}{gone.pid}-{host}-used_1",
            "alive": f"{launch}{alive.pid}-{host}-abc_123",
            "mine": f"{local}{os.getpid()}-{host}-abc_123",
            "other host": f"{launch}{gone.pid}-not{host}-abc_123",
            "other kind": f"sparseps-other-{gone.pid}-{host}-abc_123",
            "no pid": f"{launch}abc_123",
            "a file": f"{launch}{gone.pid}-{host}-file_1",
            "a link": f"{launch}{gone.pid}-{host}-link_1",
        }
        for what, name in names.items():
            if what == "a file":
                (tmp_path / name).write_text("x")
            elif what == "a link":
                (tmp_path / name).symlink_to(tmp_path / names["alive"])
            else:
                (tmp_path / name).mkdir()
                (tmp_path / name / "worker-0.json").write_text("{}")
        (tmp_path / names["kept local"] / KEPT).write_text("a local shard failed to start\n")
        (tmp_path / names["dead"] / LOCK).write_text("")  # a lock nobody holds
        removed = [str(tmp_path / names["dead"]), str(tmp_path / names["dead local"])]
        with open(tmp_path / names["in use"] / LOCK, "w") as holder:  # a shard of a killed run, still stopping
            fcntl.flock(holder, fcntl.LOCK_EX)
            with caplog.at_level("WARNING", logger="worker.temp_dirs"):
                assert remove_stale_temp_dirs(str(tmp_path)) == removed
        assert sorted(os.listdir(tmp_path)) == sorted(n for w, n in names.items() if not w.startswith("dead"))
        assert f"left by an earlier run (pid {gone.pid}) that is gone" in caplog.text
        assert remove_stale_temp_dirs(str(tmp_path)) == [str(tmp_path / names["in use"])]
    finally:
        alive.kill()
        alive.wait()


def ctrl_c_at_check(n: int):
    """A profile hook that raises KeyboardInterrupt at the main thread's n-th check for signals from now (each
    Python call but a generator's resume, and the return of each C call), as a Ctrl-C landing there would. Calls
    of hypothesis's gc callback are not counted: an exception raised there is printed and dropped (the signal
    itself would be handled after it)."""
    checks = [0]

    def hook(frame, event, arg) -> None:
        if "hypothesis" in frame.f_code.co_filename:
            return
        if event == "c_return" or (event == "call" and not frame.f_code.co_flags & inspect.CO_GENERATOR):
            checks[0] += 1
            if checks[0] > n:
                sys.setprofile(None)
                raise KeyboardInterrupt

    return hook


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="runs the `sleep` program")
def test_a_ctrl_c_at_any_point_of_wait_still_lets_stop_end_the_workers():
    """A Ctrl-C at each of wait()'s first checks for signals in turn: stop() must still end the worker within its
    grace period. (One landing just after Popen.poll() took the Popen's lock, before its try, left the lock held and
    stop()'s wait() blocked on it forever.)"""
    for n in range(30):
        group = WorkerGroup([["sleep", "60"]], [dict(os.environ)], lambda i, line: None, lambda i, report: None)
        group.start()
        group.read_output()
        sys.setprofile(ctrl_c_at_check(n))
        try:
            group.wait(poll_s=0.01)
        except KeyboardInterrupt:
            pass
        finally:
            sys.setprofile(None)
        stopper = threading.Thread(target=group.stop, args=(1.0,), daemon=True)
        stopper.start()
        stopper.join(timeout=20)
        assert not stopper.is_alive(), f"stop() hung after a Ctrl-C at check {n} of wait()"
        assert group.procs[0].returncode is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_of_child_setup_dies_with_its_killed_parent_in_the_parents_group(tmp_path):
    """ps-worker export's `ps-server export` child: a SIGKILL of the worker stops it too (it would go on writing
    into OUT); in the parent's process group, a terminal's Ctrl-C reaches it as well."""
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from ps.terminate import child_setup\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
        "preexec_fn=child_setup(own_group=False))\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n")], cwd=ROOT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the parent did not start its child"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert os.getpgid(child) == os.getpgid(parent.pid)
    finally:
        parent.kill()
        parent.wait(timeout=60)
    deadline = time.monotonic() + 30
    while alive(child):
        assert time.monotonic() < deadline, "the child outlived its killed parent"
        time.sleep(0.05)


def test_no_resume_hint_once_a_worker_found_its_servers_restored_under_it(fakes, capsys):
    """A worker stopped by ModelStateReplacedError trained into a model the servers no longer hold (a checkpoint's,
    or none): the workers' counts are no position to resume from."""
    from ps.errors import MODEL_STATE_REPLACED

    said = (
        f"ps-worker: error: shard 0 at h:1: PushBatch failed with FAILED_PRECONDITION: shard 0 {MODEL_STATE_REPLACED}"
    )
    wait = {"wait_for": ["worker-1"]}
    command, pids = fakes([{"action": "exit", "code": 2, "progress": [{"examples": 300}], "say": [said], **wait},
                           {"action": "sleep", "progress": [{"examples": 500}]}])  # fmt: skip
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--no-progress")
    assert run_launch(args, rest, worker_command=command, train_config=stand_in_train_config) == 1
    err = capsys.readouterr().err
    assert "worker 0 exited with code 2" in err and MODEL_STATE_REPLACED in err, err
    assert "--skip-examples" not in err and "the workers had trained" not in err, err
    assert_all_gone(pids, {"worker-0", "worker-1"})


def test_no_resume_hint_when_a_workers_share_gave_it_no_example_to_train(fakes, capsys):
    """A worker that stopped because its share gave it no example: the fix is another job (fewer workers, another
    split), whose workers read other shares, so the others' counts are no --skip-examples to resume from; the
    worker's own error, which says what to do, is repeated."""
    said = ("ps-worker: error: worker 0 of the job's 2 trains no example: the 1 example of its share of d.svm went to "
            "the validation split (--validation-fraction 0.1); start fewer workers or give them more data, or train "
            "with --validation-fraction 0 (or a --validation-data file)")  # fmt: skip
    wait = {"wait_for": ["worker-1"]}
    command, pids = fakes([{"action": "exit", "code": 2, "say": [said], **wait},
                           {"action": "sleep", "progress": [{"examples": 500}]}])  # fmt: skip
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--no-progress")
    assert run_launch(args, rest, worker_command=command, train_config=stand_in_train_config) == 1
    err = capsys.readouterr().err
    assert "worker 0 exited with code 2; the other workers were stopped" in err and f"  [worker 0] {said}" in err, err
    assert "--skip-examples" not in err and "the workers had trained" not in err, err
    assert_all_gone(pids, {"worker-0", "worker-1"})


def test_a_sync_job_stopped_by_one_worker_names_it_though_another_exited_first(fakes, capsys):
    """In a sync job the worker whose bad line stopped the job and the peer its stop released exit within moments
    of each other, in either order: when the first to exit says the job stopped because worker 1 stopped before
    its end (ps.engine.followedjob), worker 1 is named as the one that stopped it, and its lines come first."""
    bad = "ps-worker: error: d.csv line 7: expected 40 columns, found 3"
    released = ("ps-worker: error: shard 0: job 7 stops: worker 1 stopped before its end (d.csv line 7: expected 40 "
                "columns, found 3); start the job anew under a new --job-id")  # fmt: skip
    command, pids = fakes([{"action": "exit", "code": 2, "say": [released], "wait_for": ["said-1"]},
                           {"action": "sleep", "say": [bad]}])  # fmt: skip
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--no-progress")
    assert run_launch(args, rest, worker_command=command, train_config=stand_in_train_config) == 1
    err = capsys.readouterr().err
    head = "ps-worker launch: worker 1 stopped the job, and worker 0 exited with code 2 as it stopped with it"
    assert head in err and "worker 0 exited with code 2; the other" not in err, err
    assert (
        err.index(f"  [worker 1] {bad}") < err.index("Worker 0's last lines:") < err.index(f"  [worker 0] {released}")
    )
    assert_all_gone(pids, {"worker-0", "worker-1", "said-1"})


def test_the_resume_hint_counts_a_geo_workers_pushed_examples_not_those_it_still_held(fakes, capsys):
    """geo holds up to --geo-every - 1 steps' deltas locally: its PROGRESS reports say how many of its examples
    were pushed, and a SIGKILL loses the rest, so the skip counts those pushed."""
    wait = {"wait_for": ["worker-1"]}
    command, pids = fakes([{"action": "exit", "code": 3, "progress": [{"examples": 300}], **wait},
                           {"action": "sleep", "progress": [{"examples": 500, "pushed": 200}]}])  # fmt: skip
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--no-progress")
    assert run_launch(args, rest, worker_command=command, train_config=stand_in_train_config) == 1
    err = capsys.readouterr().err
    assert "the workers had trained 300, 200 examples of their shares" in err and "--skip-examples 200 " in err, err
    assert_all_gone(pids, {"worker-0", "worker-1"})


def test_a_train_flag_every_worker_gets_wrong_is_not_blamed_on_backends():
    """--staleness under async is every worker's mistake, not --backends numpy's: the error says so plainly."""
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--mode", "async", "--staleness", "3")
    with pytest.raises(ValueError, match=r"^--staleness 3 is ssp's") as e:
        plan_launch(args, rest)
    assert "--backends" not in str(e.value)


def test_local_shards_refuse_tls_and_token_settings_from_flags_or_the_file_not_from_the_environment(
    tmp_path, monkeypatch
):
    """Local shards take no TLS or token: a --tls-* or --auth-token-file flag, or the config file's, would leave
    the workers unable to connect, so it is refused before anything starts. A client's PS_* variables (every
    compose worker has them) are dropped instead, for the workers and the final evaluation alike."""
    ca = tmp_path / "ca.pem"
    ca.write_text("not read before the plan")
    args, rest = launch_args("--workers", "2", "--local-shards", "1", "--model", "lr", "--tls-ca", str(ca))
    with pytest.raises(ValueError, match=r"--tls-ca .*ca.pem: --local-shards starts shards with no TLS or token"):
        plan_launch(args, rest)
    config = tmp_path / "job.toml"
    config.write_text(f'[train]\nauth_token_file = "{tmp_path / "token"}"\n')
    args, rest = launch_args("--workers", "2", "--local-shards", "1", "--model", "lr", "--config", str(config))
    with pytest.raises(ValueError, match=r"--auth-token-file .*token: --local-shards starts shards with no TLS"):
        plan_launch(args, rest)
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--model", "lr", "--tls-ca", str(ca))
    assert plan_launch(args, rest).train_config.tls_ca == str(ca)  # shards of their own: the flag is theirs
    monkeypatch.setenv("PS_TLS_CA", str(ca))
    monkeypatch.setenv("PS_AUTH_TOKEN_FILE", str(tmp_path / "token"))
    args, rest = launch_args("--workers", "2", "--local-shards", "1", "--model", "lr")
    cfg = plan_launch(args, rest).train_config
    assert (cfg.tls_ca, cfg.auth_token_file) == (None, None)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_stopped_job_whose_workers_keep_resume_files_is_told_to_run_the_same_command_again(fakes, capsys, mode):
    """With --resume-file each worker resumes from its file, which refuses a --skip-examples other than the one the
    stopped run started with: the hint is the same command, not a --skip-examples (sync too: launch run again
    gives its workers a new job id, under which a sync job resumes)."""
    wait = {"wait_for": ["worker-1"]}
    command, pids = fakes([{"action": "exit", "code": 3, "progress": [{"examples": 300}], **wait},
                           {"action": "sleep", "progress": [{"examples": 500}]}])  # fmt: skip
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--no-progress")
    keeps = TrainConfig(
        servers=(SERVERS,), resume_file="/tmp/pos-{worker}.json", mode=mode, job_id=7, skip_examples=200
    )  # a command with a --skip-examples: its workers' files refuse any other
    assert run_launch(args, rest, worker_command=command, train_config=lambda argv: keeps) == 1
    err = capsys.readouterr().err
    assert "--skip-examples 500" not in err and "run the same command again" in err, err
    assert "no --skip-examples" not in err and "its --skip-examples, if any, unchanged" in err, err
    assert "--resume-file /tmp/pos-{worker}.json" in err, err
    assert_all_gone(pids, {"worker-0", "worker-1"})


def test_a_launch_whose_workers_runs_ended_before_says_there_is_nothing_to_do(fakes, capsys, tmp_path):
    """The same command again after a finished job: each worker's --resume-file says its run ended, so it says
    "nothing to do", writes --metrics-out saying so (results.ended_figures) and exits 0; launch says there is
    nothing to do and exits 0. A worker that exits 0 with no --metrics-out is a failure whatever its --resume-file
    says: launch reads what each worker wrote, never the position files. Where only some workers' runs had ended
    (a job stopped after worker 0 finished its share), the others train on: the job ends, evaluated, its figures
    merged with the ended runs' examples counted as trained before, and no message tells the user to remove the
    ended worker's file (which would train its share twice)."""

    from worker.resume_writer import PositionWriter

    keeps = TrainConfig(servers=(SERVERS,), resume_file=str(tmp_path / "pos-{worker}.json"))

    def position(i: int, finished: bool) -> None:
        worker = dataclasses.replace(keeps, worker_id=i, resume_file=str(tmp_path / f"pos-{i}.json"))
        PositionWriter(worker).write(300 + i, finished=finished)

    def ended(i: int) -> dict:
        return {"action": "metrics", "metrics": ended_figures(300 + i)}

    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--no-progress")
    for i in range(2):
        position(i, True)
    command, _ = fakes([ended(0), ended(1)])
    assert run_launch(args, rest, worker_command=command, train_config=lambda argv: keeps) == 0
    out, err = capsys.readouterr()
    assert "every worker's --resume-file says its run ended before: nothing to do" in out and "unreadable" not in err
    (tmp_path / "pids").rename(tmp_path / "pids-0")
    command, _ = fakes([ended(0), {"action": "exit", "code": 0}])  # worker 1 wrote no figures
    assert run_launch(args, rest, worker_command=command, train_config=lambda argv: keeps) == 1
    out, err = capsys.readouterr()
    assert "worker 1 exited 0 but its metrics" in err and "are unreadable" in err and "nothing to do" not in out
    position(1, False)  # worker 1 trained (its figures below), worker 0 had nothing to do
    (tmp_path / "pids").rename(tmp_path / "pids-1")
    trained = {"train_examples": 5, "train_seconds": 1.0, "config": {"max_bad_lines": 7, "max_bad_share": 0.5}}
    command, _ = fakes([ended(0), {"action": "metrics", "metrics": trained}])
    evaluated = []
    job = tmp_path / "job.json"
    args, rest = launch_args("--workers", "2", "--servers", SERVERS, "--no-progress", "--metrics-out", str(job))
    assert run_launch(args, rest, worker_command=command, train_config=lambda argv: keeps,
                      evaluate=lambda cfg: evaluated.append(cfg) or EVALUATION) == 0  # fmt: skip
    out, err = capsys.readouterr()
    assert "ended before" not in err and "remove" not in err, err
    assert [(c.max_bad_lines, c.max_bad_share) for c in evaluated] == [(7, 0.5)]  # worker 1's, as it read
    assert "launched 2 workers (numpy, numpy; mode async) on 1 shard: 5 examples (resumed after 300 examples)" in out
    assert "worker 0 0 (its run had ended before, after 300), worker 1 5; " in out
    written = json.loads(job.read_text())
    assert (written["train_examples"], written["skipped_examples"], written["eval_auc"]) == (5, 300, 0.75)
    assert written["per_worker"][0] == {"ended_before": True, "train_examples": 0, "skipped_examples": 300,
                                        "train_seconds": 0.0}  # fmt: skip


def test_the_final_evaluation_standardizes_as_the_workers_did_where_the_schema_gives_no_mean_and_std(servers, tmp_path):
    """A schema's standardized column without a mean and std: each worker computes them over --data, the job's
    training data, and launch's final evaluation computes the same, scoring as `ps-worker eval` with them written
    into the schema (numpy's mean and population std of the column's values) scores."""
    from worker.served import evaluate_servers
    from worker.train import train

    rng = np.random.default_rng(0)

    def csv_file(name: str, rows: int) -> str:
        prices = rng.normal(30.0, 7.0, rows)
        lines = ["click,price,city"] + [f"{int(p > 30) ^ int(rng.random() < 0.2)},{p:.3f},{rng.choice(list('abc'))}"
                                        for p in prices]  # fmt: skip
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        return str(tmp_path / name)

    train_path, test_path = csv_file("train.csv", 300), csv_file("test.csv", 100)
    columns = ('[[columns]]\nname = "price"\nkind = "numeric"\ntransform = "standardize"\n{stats}'
               '[[columns]]\nname = "city"\nkind = "categorical"\n')  # fmt: skip
    schema, with_stats = tmp_path / "schema.toml", tmp_path / "stats.toml"
    schema.write_text('format = "csv"\nlabel = "click"\n' + columns.format(stats=""))
    prices = np.loadtxt(train_path, delimiter=",", skiprows=1, usecols=1)
    with_stats.write_text('format = "csv"\nlabel = "click"\n' + columns.format(
        stats=f"mean = {float(prices.mean())!r}\nstd = {float(prices.std())!r}\n"))  # fmt: skip
    addresses, _ = servers(1)
    cfg = TrainConfig(servers=tuple(addresses), data=train_path, eval_data=test_path, schema=str(schema),
                      model="deepfm", hidden=(4,), recipe="large", batch_size=50, epochs=3, progress=False,
                      server_timeout_s=0)  # fmt: skip
    trained = train(cfg)
    figures = final_evaluation(cfg, None)  # its default evaluation
    assert "eval_error" not in figures, figures["eval_error"]
    expected = evaluate_servers(dataclasses.replace(cfg, schema=str(with_stats)))
    assert figures["eval_examples"] == expected["eval_examples"] == 100
    assert figures["eval_logloss"] == pytest.approx(expected["eval_logloss"], rel=1e-6)
    assert figures["eval_auc"] == pytest.approx(expected["eval_auc"], abs=1e-9)
    assert figures["eval_logloss"] == pytest.approx(trained["eval_logloss"], rel=1e-6)  # the worker's own final eval
    with pytest.raises(ValueError, match=r"columns \['price'\] are standardized without a mean and std"):
        evaluate_servers(cfg)  # `ps-worker eval`: --data may be another file than the training data


def test_a_workers_resume_file_that_its_start_would_refuse_is_refused_before_any_worker_starts(tmp_path):
    """A worker's --resume-file of another run (other settings), or one that holds no position, is refused by
    launch before any worker starts, naming the file and what differs as that worker would: not by that worker
    alone, while the others train (exit 1, its peers stopped part way)."""
    from worker.resume_writer import PositionWriter

    def file(worker: int) -> str:
        return str(tmp_path / f"p-{worker}.json")

    args, rest = launch_args("--workers", "3", "--servers", SERVERS, "--resume-file", str(tmp_path / "p-{worker}.json"),
                             "--synthetic-rows", "9000")  # fmt: skip
    run = TrainConfig(servers=(SERVERS,), num_workers=3, synthetic_rows=9000, job_id=5)
    for worker in range(2):  # worker 2: no file yet
        PositionWriter(dataclasses.replace(run, worker_id=worker, resume_file=file(worker))).write(300)
    assert plan_launch(args, rest).train_config.job_id == 5
    PositionWriter(dataclasses.replace(run, worker_id=1, resume_file=file(1), synthetic_rows=4000)).write(300)
    with pytest.raises(ValueError, match=r"p-1.json is the position of a run with other settings \(synthetic_rows: "
                                         r"4000 in the file != 9000 now\)"):  # fmt: skip
        plan_launch(args, rest)
    (tmp_path / "p-1.json").write_text("{")
    with pytest.raises(ValueError, match=r"p-1.json is no position this program wrote"):
        plan_launch(args, rest)

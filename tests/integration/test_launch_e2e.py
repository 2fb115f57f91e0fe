"""ps-worker launch end to end, with real workers and shards."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_a_csv_jobs_schema_warnings_and_story_are_said_once_by_launch_before_it_starts_anything(tmp_path):
    """The workers read the same schema and would each say its warnings (columns of numbers read as ids) and the
    recipe's choice; launch checks the data as train does before it starts the shards, says them there once, and
    neither its workers nor its final evaluation repeat them. No worker says it skipped its final evaluation:
    launch's is the job's."""
    for name, rows in (("train.csv", 400), ("test.csv", 100)):
        lines = ["click,age,city"] + [f"{i % 3 % 2},{18 + i * 7 % 61},c{i % 5}" for i in range(rows)]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    run = subprocess.run(
        [sys.executable, "-m", "worker", "launch", "--workers", "2", "--local-shards", "1", "--no-progress",
         "--data", str(tmp_path / "train.csv"), "--eval-data", str(tmp_path / "test.csv"), "--epochs", "1"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-3000:]
    for line in ("column 'age' holds numbers of many values", "columns  format csv", "small-data recipe for 400"):
        assert said.count(line) == 1, (line, said)
    started = run.stdout.index("started 1 local shard")
    assert run.stdout.index("columns  ") < started and run.stdout.index("small-data recipe") < started, run.stdout
    assert "[worker 0] worker 0 of 2, mode async" in run.stdout and run.stdout.count("eval   ") == 1, run.stdout
    assert "\neval   AUC" in run.stdout  # launch's evaluation; its workers say nothing of the one they skip


def test_allreduce_workers_with_unequal_batch_counts_finish_and_leave_the_mlp_on_the_servers(tmp_path):
    """1,001 rows in batches of 100 over 2 workers: 6 batches for one, 5 for the other. The worker that runs out
    takes part in the other's last all_reduce; the job ends, and the MLP on the servers that launch evaluates (once:
    its workers do not) is the one each worker ended with (the trained MLP, not the servers' initial one)."""
    pytest.importorskip("torch", reason="--dense allreduce runs torch.distributed")
    out = tmp_path / "job.json"
    run = subprocess.run(
        [sys.executable, "-m", "worker", "launch", "--workers", "2", "--local-shards", "1", "--backends", "torch",
         "--metrics-out", str(out), "--no-progress", "--model", "dnn", "--hidden", "16", "--dense", "allreduce",
         "--recipe", "large", "--synthetic-rows", "1001", "--batch-size", "100", "--synthetic-eval-rows", "2000",
         "--dense-learning-rate", "0.01", "--barrier-timeout", "120"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    m = json.loads(out.read_text())
    assert m["workers"] == 2 and m["train_examples"] == 1001
    assert [w["dense_syncs"] for w in m["per_worker"]] == [6, 6]  # one all_reduce per step of the longer share
    assert "eval_auc" in m and m["eval_examples"] == 2000
    for w in m["per_worker"]:
        assert "eval_auc" not in w  # launch's evaluation is the only one
        assert w["dense_norm"] == pytest.approx(m["dense_norm"], rel=1e-6), (w["dense_norm"], m["dense_norm"])

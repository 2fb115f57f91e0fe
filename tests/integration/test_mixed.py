"""Mixed hardware: a numpy worker and a torch worker train one DeepFM together against 2 servers, and the
model they leave on the servers scores the AUC of a run with two numpy workers (within 0.005)."""

import json
import subprocess
import sys

from worker.cluster import LocalCluster

PY = sys.executable
COMMON = ["--model", "deepfm", "--hidden", "32,16", "--embedding-dim", "4", "--synthetic-rows", "160000",
          "--synthetic-eval-rows", "40000", "--batch-size", "1024"]  # fmt: skip
TRAIN = ["--learning-rate", "0.02", "--no-progress", "--num-workers", "2"]


def train_pair(tmp_path, backends: tuple[str, str]) -> float:
    """Trains with one worker per backend at once; returns the eval AUC of what the servers hold."""
    with LocalCluster(2, root=str(tmp_path / "-".join(backends))) as cluster:
        servers = ",".join(cluster.addresses)
        workers = [
            subprocess.Popen(
                [
                    PY,
                    "-m",
                    "worker",
                    "train",
                    "--servers",
                    servers,
                    "--backend",
                    b,
                    "--worker-id",
                    str(i),
                    *COMMON,
                    *TRAIN,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for i, b in enumerate(backends)
        ]
        for w in workers:
            out, err = w.communicate(timeout=600)
            assert w.returncode == 0, err
            assert f"worker {workers.index(w)}/2" in out and "80,000 examples" in out
        r = subprocess.run([PY, "-m", "worker", "eval", "--servers", servers, "--json", *COMMON],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
        assert r.returncode == 0, r.stderr
        result = json.loads(r.stdout)
        assert result["eval_examples"] == 40000
        return result["eval_auc"], result["oracle_auc"]


def test_numpy_and_torch_workers_train_one_model(tmp_path):
    mixed, oracle = train_pair(tmp_path, ("numpy", "torch"))
    homogeneous, _ = train_pair(tmp_path, ("numpy", "numpy"))
    print(f"eval AUC: numpy + torch {mixed:.4f}, numpy + numpy {homogeneous:.4f}, oracle {oracle:.4f}")
    assert mixed > 0.7 and homogeneous > 0.7  # both learned the planted model
    # Within 0.005, as issue 5 asks. At sparse learning rate 0.05 FM embeddings are sensitive to staleness (one
    # step of stale rows cost 0.09 AUC on 60K rows), so asynchronous runs varied by ~0.02; at 0.02 three runs of
    # each pair agreed within 0.0012.
    assert abs(mixed - homogeneous) <= 0.005

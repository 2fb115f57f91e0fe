"""Mixed hardware: a numpy worker and a torch worker (on the CPU, or on a CUDA GPU where torch sees one) train one
DeepFM on 2 servers, each on its half of the data, and leave on the servers the model two numpy workers leave: the
same eval AUC, and the same sparse rows and dense parameters up to float32 rounding.

The workers run one after the other, so both runs push in the same order and differ only in the backend that
computed the second half's gradients. (Two workers at once interleave their pushes in whatever order the
scheduler gives: such runs differ from each other by more than the rows moved in training, however correct the
backends. tests/test_deploy.py trains two workers at once.)"""

import json
import subprocess
import sys

import numpy as np
import pytest

from worker.client import Client
from worker.cluster import LocalCluster
from worker.data import DataSource
from worker.dense import DenseSync
from worker.job import prepare
from worker.launch_devices import split_backend
from worker.train_config import TrainConfig

PY = sys.executable


def torch_sees_cuda() -> bool:
    """Whether this Python has torch and torch sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


ROWS, EVAL_ROWS = 80_000, 20_000  # enough to learn the planted model: the test checks the eval AUC
COMMON = ["--model", "deepfm", "--hidden", "32,16", "--embedding-dim", "4", "--synthetic-rows", str(ROWS),
          "--synthetic-eval-rows", str(EVAL_ROWS), "--batch-size", "1024"]  # fmt: skip
TRAIN = ["--learning-rate", "0.02", "--no-progress", "--num-workers", "2", "--job-id", "7", "--recipe", "large"]
# the data and model of COMMON, for the ids to probe and the model's tables
CFG = TrainConfig(model="deepfm", hidden=(32, 16), embedding_dim=4, synthetic_rows=ROWS,
                  synthetic_eval_rows=EVAL_ROWS, batch_size=1024, recipe="large")  # fmt: skip


def probe_ids(data: DataSource) -> np.ndarray:
    """The ids of the first batch of each worker's half: the most pushed ids and some pushed once."""
    half = CFG.synthetic_rows // 2
    firsts = [next(data.synthetic.batches(CFG.batch_size, lo, lo + CFG.batch_size)) for lo in (0, half)]
    return np.unique(np.concatenate([bags.ids for b in firsts for bags in b.fields.values()]))


def train_pair(tmp_path, workers: tuple[str, str]) -> tuple[dict, dict[str, np.ndarray]]:
    """Worker 0 as workers[0], then worker 1 as workers[1], each "backend" or "backend:device"; returns the eval
    result of the model on the servers and its values: {"sparse": rows of probe_ids, each dense parameter's name:
    its values}."""
    with LocalCluster(2, root=str(tmp_path / "-".join(workers).replace(":", "_"))) as cluster:
        servers = ",".join(cluster.addresses)
        for i, worker in enumerate(workers):
            backend, device = split_backend(worker)
            device = device or "cpu"
            args = ["--servers", servers, "--backend", backend, "--device", device, "--worker-id", str(i),
                    *COMMON, *TRAIN]  # fmt: skip
            w = subprocess.run([PY, "-m", "worker", "train", *args], capture_output=True, text=True, timeout=600)
            assert w.returncode == 0, w.stderr
            assert f"({backend}, {device}, worker {i}/2) on {ROWS // 2:,} examples" in w.stdout, w.stdout
        r = subprocess.run([PY, "-m", "worker", "eval", "--servers", servers, "--json", *COMMON],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
        assert r.returncode == 0, r.stderr
        result = json.loads(r.stdout)
        assert result["eval_examples"] == EVAL_ROWS
        _, data, spec, _ = prepare(CFG, needs_servers=False)
        with Client(cluster.addresses) as client:
            values = {"sparse": client.pull(spec.name, probe_ids(data))}
            values.update(DenseSync(client, spec.dense_params()).pull())
        return result, values


@pytest.mark.parametrize(
    "other",
    [
        "torch",
        pytest.param(
            "torch:cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch_sees_cuda(), reason="needs a CUDA device")],
        ),
    ],
)
def test_a_torch_worker_trains_the_shared_model_as_a_numpy_worker_does(tmp_path, other):
    mixed, got = train_pair(tmp_path, ("numpy", other))
    homogeneous, want = train_pair(tmp_path, ("numpy", "numpy"))
    print(f"eval AUC: numpy + {other} {mixed['eval_auc']:.6f}, numpy + numpy {homogeneous['eval_auc']:.6f}, "
          f"oracle {mixed['oracle_auc']:.4f}")  # fmt: skip
    assert homogeneous["eval_auc"] > 0.75  # learned the planted model (0.762 here, oracle 0.782)
    assert abs(mixed["eval_auc"] - homogeneous["eval_auc"]) <= 1e-4  # 1e-8 here
    assert sorted(got) == sorted(want) and len(want) == 1 + 2 * 3 + 1  # the sparse rows, 3 layers' weights and
    # biases, the logit bias
    assert want["sparse"].shape == (
        len(probe_ids(DataSource(CFG, default_table=CFG.model))),
        1 + 4,
    )  # FM: weight, then the embedding
    for name in sorted(want):  # float32 rounding differs between the backends: here 2e-7 at most, on values ~0.03
        np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=1e-5, err_msg=name)

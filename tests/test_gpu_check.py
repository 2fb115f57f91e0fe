"""tests/gpu_check.sh before its steps: a Python that cannot run the project, or a torch that sees no GPU, stops it
with exit 1 and a line saying why, before any step runs (skipped gpu tests would otherwise pass). Runs where torch
sees no CUDA device; on a GPU machine the script itself is the check."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU: the script would run its steps")


def gpu_check(tmp_path, pythonpath: str = "") -> tuple[subprocess.CompletedProcess, pathlib.Path]:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PYTHONPATH": pythonpath}
    done = subprocess.run(["bash", "tests/gpu_check.sh", "1", "2", "3", "4"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    return done, out


def test_a_torch_that_sees_no_gpu_stops_the_check_before_any_step(tmp_path):
    done, out = gpu_check(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"gpu_check: torch {torch.__version__} sees no CUDA device here: nothing to check" in done.stderr
    assert f"torch {torch.__version__} numpy" in done.stdout  # the versions, printed before
    assert "== 1." not in done.stdout and list(out.iterdir()) == []  # no step ran, no log written


def test_a_package_the_project_needs_but_the_python_lacks_is_named_before_any_step(tmp_path):
    """grpc_health (grpcio-health-checking), which only the servers import, stands for any such package."""
    shadow = tmp_path / "shadow" / "grpc_health"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'grpc_health'\")\n")
    done, out = gpu_check(tmp_path, str(shadow.parent))
    assert done.returncode == 1, done.stdout + done.stderr
    assert (f"gpu_check: {sys.executable} cannot run the project: ImportError: No module named 'grpc_health' "
            "(wheels of what it lacks in .whl/ are installed first)") in done.stderr  # fmt: skip
    assert "== 1." not in done.stdout and list(out.iterdir()) == []

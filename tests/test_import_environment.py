"""What importing ps sets before gRPC and numba load (ps/__init__.py): gRPC's fork support off (a warning where
grpc loaded first), and a numba cache dir under the temp dir for a user who can write neither the package's dirs
nor a home cache dir."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import ps
from tests import asnobody

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_cache_dir_is_set_only_where_numbas_defaults_cannot_write(monkeypatch, tmp_path):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(ps, "_writable", lambda path: False)
    assert os.path.basename(ps.numba_cache_dir()) == f"sparseps-numba-cache-{os.getuid()}"
    monkeypatch.setattr(ps, "_writable", lambda path: path == str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert ps.numba_cache_dir() is None  # the user's cache dir is writable: numba's default
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setattr(ps, "_writable", lambda path: False)
    assert ps.numba_cache_dir() is None  # the user's own choice stands


def test_ps_server_verify_runs_as_a_user_without_a_home(tmp_path):
    reason = asnobody.why_not()
    if reason:
        pytest.skip(reason)
    data_dir = tmp_path / "d"
    data_dir.mkdir()
    os.chmod(tmp_path, 0o755)
    r = asnobody.run([sys.executable, "-m", "ps", "verify", str(data_dir)])
    # it ran to a verdict of its own (its modules, numba's cached kernels among them, loaded): "not a shard's data
    # dir", or that nobody cannot read the dir where the test's temp dirs are private
    assert r.returncode == 2 and "ps-server verify: error: " in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "cannot cache function" not in r.stderr, r.stderr


def test_importing_ps_turns_grpcs_fork_support_off_unless_set():
    code = "import os, ps, grpc; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    env = without_fork_support_setting()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.stdout.strip() == "false", out.stderr
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**env, "GRPC_ENABLE_FORK_SUPPORT": "true"})  # fmt: skip
    assert out.stdout.strip() == "true", out.stderr


def without_fork_support_setting() -> dict[str, str]:
    """This process's environment less GRPC_ENABLE_FORK_SUPPORT (set here by importing ps)."""
    return {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}


def test_importing_ps_after_grpc_warns_that_grpcs_fork_support_stays_on():
    env = without_fork_support_setting()

    def warned(code: str, **extra: str) -> bool:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                             env={**env, **extra})  # fmt: skip
        assert out.returncode == 0, out.stderr
        return "RuntimeWarning: grpc was imported before ps" in out.stderr

    assert warned("import grpc, ps")
    assert not warned("import ps, grpc")
    assert not warned("import grpc, ps", GRPC_ENABLE_FORK_SUPPORT="false")  # the user's choice, read as grpc loaded


def test_the_test_package_imports_ps_before_grpc():
    """pytest imports tests/conftest.py (which imports grpc) as tests.conftest: with gRPC's fork support on, the
    `ps-server export` child that ps-worker export forks beside an in-process server died of SIGABRT (1 run in 30)."""
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", "import tests.conftest"],
                         capture_output=True, text=True, cwd=ROOT, env=without_fork_support_setting())  # fmt: skip
    assert out.returncode == 0, out.stderr

"""A user who can write neither the package's dirs nor a home cache dir still runs the server: importing ps gives
numba a cache dir under the temp dir (ps/__init__.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import ps

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


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser to act as nobody")
def test_ps_server_verify_runs_as_a_user_without_a_home(tmp_path):
    data_dir = tmp_path / "d"
    data_dir.mkdir()
    os.chmod(tmp_path, 0o755)
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "PYTHONPATH": ROOT}
    r = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-m", "ps", "verify", str(data_dir)],
                       capture_output=True, text=True, env=env, cwd="/", timeout=300)  # fmt: skip
    assert "Traceback" not in r.stderr and "cannot cache function" not in r.stderr, r.stderr

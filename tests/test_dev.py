"""dev.py, the newcomer's script: what `env` and `demo` install into ./.venv, its subprocesses stubbed (no venv is
made, nothing installed)."""

from __future__ import annotations

import subprocess

import pytest

import dev


@pytest.fixture
def venv(tmp_path, monkeypatch) -> list[list[str]]:
    """dev.py's venv at tmp_path/.venv, made already (its python a stub); returns the pip commands it runs there,
    each run offline: only the package's own install works, as from a local wheelhouse (PIP_FIND_LINKS)."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("")
    monkeypatch.setattr(dev, "VENV", str(tmp_path / ".venv"))
    monkeypatch.setattr(dev, "BIN", str(bin_dir))
    ran: list[list[str]] = []

    def run(args, **kwargs):
        ran.append(args)
        offline = "-e" not in args  # anything but the package's install would reach for an index
        return subprocess.CompletedProcess(args, 1 if offline else 0, "", "no index can be reached" if offline else "")

    monkeypatch.setattr(dev.subprocess, "run", run)
    return ran


def test_env_offline_installs_the_package_from_what_pip_finds_locally_and_upgrades_no_pip(venv):
    python = dev.ensure_env()
    assert [args[args.index("install") + 1 :] for args in venv] == [
        ["--disable-pip-version-check", "-q", "-e", f"{dev.ROOT}[dev]"]
    ]
    venv.clear()
    assert dev.ensure_env() == python and venv == []  # installed: the stamp says so

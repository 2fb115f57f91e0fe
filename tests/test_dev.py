"""dev.py, the newcomer's script: what `env` and `demo` install into ./.venv, its subprocesses stubbed (no venv is
made, nothing installed)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

import dev

THIS = f"{sys.version_info[0]}.{sys.version_info[1]}"  # the Python running the tests, and the venv's python
NEXT = f"{sys.version_info[0]}.{sys.version_info[1] + 1}"  # a Python of another major.minor version


@pytest.fixture
def venv(tmp_path, monkeypatch) -> list[list[str]]:
    """dev.py's venv at tmp_path/.venv, made already (its python a symlink to this Python, which answers dev.py's
    probe of its version); returns the pip commands it runs there, each run offline: a pip upgrade fails, what a
    local wheelhouse (PIP_FIND_LINKS) serves is installed."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    (tmp_path / ".venv" / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion = {THIS}.7\n")
    monkeypatch.setattr(dev, "VENV", str(tmp_path / ".venv"))
    monkeypatch.setattr(dev, "BIN", str(bin_dir))
    ran: list[list[str]] = []
    real_run = subprocess.run

    def run(args, **kwargs):
        if "-c" in args:  # the probe of the venv's python: run
            return real_run(args, **kwargs)
        ran.append(args)
        offline = "--upgrade" in args  # a pip upgrade reaches for an index; the rest comes from a wheelhouse
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


def test_demo_installs_the_runtime_alone_and_an_install_with_extras_serves_it(venv, monkeypatch):
    ran = []
    monkeypatch.setattr(dev.subprocess, "call", lambda args, **kwargs: ran.append(args) or 0)
    assert dev.main(["demo"]) == 0
    assert [args[-1] for args in venv] == [dev.ROOT] and ran[0][1:4] == ["-m", "worker", "train"]
    venv.clear()
    dev.ensure_env(with_torch=True, extras="dev,bench")  # what `bench` installs
    assert [args[-1] for args in venv] == [f"{dev.ROOT}[dev,bench]", dev.TORCH_PIN]
    venv.clear()
    for command in (["demo"], ["test", "-k", "x"], ["bench", "benchmarks/x.py"]):
        assert dev.main(command) == 0
    assert venv == []  # each of them served by that install


def make_python(version: str | None = None, script: str | None = None) -> None:
    """The venv's python made a script: one that answers dev.py's probe with version, or runs `script`."""
    link = os.path.join(dev.BIN, "python")
    if os.path.lexists(link):
        os.remove(link)
    with open(link, "w") as f:
        f.write(f"#!/bin/sh\n{script or f'echo {version}'}\n")
    os.chmod(link, 0o755)


def make_cfg(version: str) -> None:
    """The venv's pyvenv.cfg, saying it was made for Python `version`."""
    with open(os.path.join(dev.VENV, "pyvenv.cfg"), "w") as f:
        f.write(f"home = /usr/bin\nversion = {version}\n")


def test_a_venv_of_another_python_or_made_again_is_installed_into_again(venv, monkeypatch):
    """The stamp of an install names the venv's Python version (pyvenv.cfg's): a venv made again by another Python
    has none of the packages; one made again by dev.py (its python gone) holds no stamp of the one before."""

    class Builder:  # venv.EnvBuilder's create, as the Python NEXT now running dev.py makes the venv
        def __init__(self, **options):
            pass

        def create(self, directory):
            make_python(NEXT)
            make_cfg(f"{NEXT}.1")

    dev.ensure_env()
    venv.clear()
    make_python(NEXT)  # made again over it by python NEXT -m venv
    make_cfg(f"{NEXT}.1")
    dev.ensure_env()
    assert [args[-1] for args in venv] == [f"{dev.ROOT}[dev]"]
    venv.clear()
    dev.ensure_env()
    assert venv == []  # installed for 3.12: the stamp says so
    os.remove(os.path.join(dev.BIN, "python"))
    monkeypatch.setattr(dev.venv, "EnvBuilder", Builder)
    dev.ensure_env()
    assert [args[-1] for args in venv] == [f"{dev.ROOT}[dev]"]


def test_an_extra_whose_name_holds_a_dash_is_told_apart_from_others(venv):
    dev.ensure_env(extras="dev,gpu-kernels")
    venv.clear()
    dev.ensure_env(extras="gpu-kernels")
    assert venv == []  # served by that install
    dev.ensure_env(extras="kernels")  # no extra of that install
    assert [args[-1] for args in venv] == [f"{dev.ROOT}[kernels]"]


@pytest.mark.parametrize(
    "python, why",
    [
        (None, "its python does not run (No such file or directory)"),  # its symlink names a removed Python
        ("#!/bin/sh\necho 3.9\n", f"its python is Python 3.9, but the venv was made for {THIS}"),
        ("#!/bin/sh\nexit 3\n", "its python does not run (exit 3)"),
    ],
)
def test_a_venv_whose_python_does_not_run_or_is_another_version_is_made_again_saying_why(
    venv, tmp_path, monkeypatch, capsys, python, why
):
    made = []

    class Builder:  # venv.EnvBuilder, as dev.py makes the venv again: cleared, its python this one
        def __init__(self, **options):
            made.append(options)

        def create(self, directory):
            for name in os.listdir(directory):  # clear=True: what the venv held goes
                if name.startswith(dev.STAMP):
                    os.remove(os.path.join(directory, name))
            os.remove(os.path.join(dev.BIN, "python"))
            os.symlink(sys.executable, os.path.join(dev.BIN, "python"))

    dev.ensure_env()
    venv.clear()
    link = os.path.join(dev.BIN, "python")
    os.remove(link)
    if python is None:
        os.symlink(tmp_path / "python3.10-removed", link)
    else:
        with open(link, "w") as f:
            f.write(python)
        os.chmod(link, 0o755)
    monkeypatch.setattr(dev.venv, "EnvBuilder", Builder)
    capsys.readouterr()
    dev.ensure_env()
    assert made == [{"with_pip": True, "clear": True}]
    assert f"{dev.VENV}: {why}: making the virtual environment again" in capsys.readouterr().out
    assert [args[-1] for args in venv] == [f"{dev.ROOT}[dev]"]  # its stamp gone with it: installed again
    venv.clear()
    dev.ensure_env()
    assert venv == [] and len(made) == 1  # its python answers now: reused


class NoOpBuilder:  # venv.EnvBuilder's object, making nothing
    def create(self, directory):
        pass


class NoBuilder:  # venv.EnvBuilder, where the venv must not be made again
    def __init__(self, **options):
        raise AssertionError(f"the venv was made again ({options})")


def test_a_venv_whose_python_runs_another_version_than_it_was_made_for_is_made_again(venv, monkeypatch, capsys):
    made = []
    monkeypatch.setattr(dev.venv, "EnvBuilder", lambda **options: made.append(options) or NoOpBuilder())
    make_cfg("3.1.4")  # made by a Python 3.1 whose python3 symlink now runs this Python
    dev.ensure_env()
    assert made == [{"with_pip": True, "clear": True}]
    assert f"{dev.VENV}: its python is Python {THIS}, but the venv was made for 3.1: making" in capsys.readouterr().out


@pytest.mark.parametrize(
    "cfg, runs, why",
    [
        ("version = 3.10.12", "3.10", "is Python 3.10, older than 3.11, which sparseps needs"),  # made by 3.10
        ("", "3.10", "is Python 3.10, older than 3.11, which sparseps needs"),  # a pyvenv.cfg of no version
        ("version_info = 3.10.12.final.0", THIS, f"is Python {THIS}, but the venv was made for 3.10"),  # virtualenv
        (f"version = {THIS}.1", "python3", "says its version is 'python3', not a Python major.minor"),
    ],
)
def test_a_venv_whose_python_is_too_old_or_unreadable_is_made_again(venv, monkeypatch, capsys, cfg, runs, why):
    """dev.py refuses to run under Python < 3.11, and a venv whose python runs one is no better, whatever its
    pyvenv.cfg says (virtualenv writes version_info, not version); nor is one whose version does not read."""
    made = []
    monkeypatch.setattr(dev.venv, "EnvBuilder", lambda **options: made.append(options) or NoOpBuilder())
    make_python(runs)
    with open(os.path.join(dev.VENV, "pyvenv.cfg"), "w") as f:
        f.write(f"home = /usr/bin\n{cfg}\n")
    dev.ensure_env()
    assert made == [{"with_pip": True, "clear": True}]
    assert f"{dev.VENV}: its python {why}: making the virtual environment again" in capsys.readouterr().out


def test_a_venv_made_for_another_python_than_the_one_running_dev_py_is_reused(venv, monkeypatch):
    monkeypatch.setattr(dev.venv, "EnvBuilder", NoBuilder)
    make_python(NEXT)  # a healthy venv of Python NEXT, dev.py run by this one
    make_cfg(f"{NEXT}.1")
    assert dev.ensure_env() == os.path.join(dev.BIN, "python")


def test_a_venv_whose_python_does_not_answer_in_time_is_reused_saying_so(venv, monkeypatch, capsys):
    monkeypatch.setattr(dev.venv, "EnvBuilder", NoBuilder)
    monkeypatch.setattr(dev, "PROBE_TIMEOUT_S", 0.2)
    make_python(script="exec sleep 60")  # a machine too busy to start it in time
    dev.ensure_env()
    assert "its python did not say its version within 0.2 s; using the virtual environment" in capsys.readouterr().err


@pytest.mark.parametrize("variable", ["PYTHONHOME", "PYTHONPATH"])
def test_the_callers_python_variables_do_not_make_a_healthy_venv_unusable(venv, monkeypatch, tmp_path, variable):
    """PYTHONHOME elsewhere leaves the venv's python without its standard library; PYTHONPATH can name a
    sitecustomize that exits: the probe is run isolated from both."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "sitecustomize.py").write_text("raise SystemExit(3)\n")
    monkeypatch.setenv(variable, str(tmp_path / "elsewhere"))
    monkeypatch.setattr(dev.venv, "EnvBuilder", NoBuilder)
    assert dev.ensure_env() == os.path.join(dev.BIN, "python")


@pytest.mark.parametrize(
    "version, said",
    [
        (
            "3.14",
            "; the venv's is Python 3.14, for which a dependency may have no wheel: make the venv again with one "
            "of those (rm -rf {venv} && python{newest} dev.py env)",
        ),  # fmt: skip
        ("3.12", "; the venv's Python, 3.12, is one of them"),
    ],
)
def test_a_failed_install_names_the_pythons_tried_and_the_venvs(venv, monkeypatch, capsys, version, said):
    """pip's output, then a line naming the Pythons the README's quick start is tried with and the venv's (a
    Python with no wheel of a dependency fails so), with how to make the venv again where it is none of them."""
    make_python(version)
    make_cfg(f"{version}.0")
    real_run = subprocess.run

    def run(args, **kwargs):
        if "-c" in args:  # the probe of the venv's python
            return real_run(args, **kwargs)
        return subprocess.CompletedProcess(args, 1, "", "ERROR: No matching distribution found for numba\n")

    monkeypatch.setattr(dev.subprocess, "run", run)
    with pytest.raises(SystemExit) as stopped:
        dev.ensure_env()
    assert stopped.value.code == (
        f"pip install -e {dev.ROOT}[dev] failed (exit 1); see the output above. sparseps is tried on Python 3.11, "
        "3.12 and 3.13" + said.format(venv=dev.VENV, newest=dev.tried_pythons()[-1])
    )
    assert capsys.readouterr().err == "ERROR: No matching distribution found for numba\n"
    assert not [name for name in os.listdir(dev.VENV) if name.startswith(dev.STAMP)]  # no install stamped


def test_the_pythons_tried_are_pyproject_classifiers_and_the_readme_names_them_all():
    """tried_pythons reads pyproject.toml's classifiers; the README's quick start names the same Pythons, so a
    Python added to one and not the other fails here."""
    with open(os.path.join(dev.ROOT, "pyproject.toml"), "rb") as f:
        classifiers = tomllib.load(f)["project"]["classifiers"]
    pythons = dev.tried_pythons()
    assert pythons and all(f"Programming Language :: Python :: {v}" in classifiers for v in pythons)
    with open(os.path.join(dev.ROOT, "README.md"), encoding="utf-8") as f:
        readme = " ".join(f.read().split())
    said = re.search(r"Python ([\d., and]+?) are tried: every dependency has a wheel for each", readme)
    assert said and re.findall(r"\d+\.\d+", said.group(1)) == pythons, said


def test_the_venv_path_in_the_advice_to_remake_it_is_quoted_for_the_shell(monkeypatch, tmp_path):
    """A venv under a directory whose name has a space (or a quote): the `rm -rf` the message says removes that
    venv, not two other paths."""
    venv_dir = str(tmp_path / "my project's dir" / ".venv")
    monkeypatch.setattr(dev, "VENV", venv_dir)
    said = dev.pip_failed(["-e", "."], 1, "3.99")
    command = said[said.index("(rm -rf ") + 1 : said.rindex(")")]
    assert shlex.split(command)[:3] == ["rm", "-rf", venv_dir], command


@pytest.mark.parametrize(
    "text", ["[project\n", '[project]\nclassifiers = ["Operating System :: POSIX :: Linux"]\n', ""]
)
def test_a_failed_install_is_said_even_where_pyproject_is_damaged_or_names_no_python(monkeypatch, tmp_path, text):
    """pip_failed runs when an install failed, maybe for pyproject.toml itself: a file that does not parse, names
    no Python, or has no [project], still gives the failure's message (no traceback), with the venv's Python."""
    (tmp_path / "pyproject.toml").write_text(text)
    monkeypatch.setattr(dev, "ROOT", str(tmp_path))
    said = dev.pip_failed(["-e", "."], 1, "3.99")
    assert said.startswith("pip install -e . failed (exit 1); see the output above") and "3.99" in said, said

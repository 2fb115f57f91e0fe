#!/usr/bin/env python3
"""The commands a newcomer needs, with nothing but Python 3.11+ installed:

    python3 dev.py demo    # local cluster of 2 shards trains an FM on synthetic data, prints AUC vs the oracle
    python3 dev.py test    # lint (ruff check, ruff format --check), then the whole test suite (pytest-xdist)
    python3 dev.py bench   # the benchmarks at fixed sizes (~15 min); writes the README's performance table
    python3 dev.py bench benchmarks/small_data.py   # one benchmark script (any of benchmarks/*.py)
    python3 dev.py env     # only create or update ./.venv (the others do it first)

Each creates ./.venv on first use and installs the package there: `pip install -e .[dev]`, but `-e .` alone (the
runtime) for `demo`, which an install with extras serves as well. pip is the venv's own, as Python gives it (an
editable install of a pyproject.toml package, PEP 660, needs pip 21.3 or newer; Python 3.11's is newer), never
upgraded: that would need the network even where a local wheelhouse (PIP_FIND_LINKS) serves the rest. Later runs
reuse the venv and reinstall only when pyproject.toml or the venv's Python version changes; a venv whose python
no longer runs (its symlink names a Python since removed) or runs another major.minor version than the one the
venv was made for (its pyvenv.cfg's), or one older than 3.11, is made again, saying why; one whose python does not answer in time is
reused, with a warning. A failed pip install shows pip's output, then names the Pythons the README's quick start is
tried with (tried_pythons: pyproject.toml's classifiers) and the venv's. `test` and `bench`
also install PyTorch (TORCH_PIN, for the torch backend: the CPU build where pip finds one, as on this project's
machines; PyPI's Linux wheel is the CUDA build, so elsewhere set
PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu), and `bench` the benchmark-only extra (`.[bench]`:
scikit-learn, the tuned logistic regression that benchmarks/small_data.py compares with). Extra arguments go to
`ps-worker train`, to pytest or to benchmarks/report.py.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
TORCH_PIN = "torch==2.13.0"  # pinned: the version the torch backend is tested with
BIN = os.path.join(VENV, "Scripts" if os.name == "nt" else "bin")
PROBE_TIMEOUT_S = 10.0  # the venv's python has this long to say its version (venv_python_unusable)
MIN_PYTHON = (3, 11)  # sparseps's oldest Python, for dev.py and for the venv's python
PYTHON_CLASSIFIER = "Programming Language :: Python :: "  # pyproject.toml's, before a tried major.minor
THIS_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"  # the Python running dev.py (major.minor)
STAMP = ".installed-"  # the venv's stamps of what is installed there (installed_with)


def ensure_env(with_torch: bool = False, extras: str = "dev") -> str:
    """Returns the venv's python, creating the venv and installing the package with `extras` (comma-separated; ""
    for the runtime alone) and TORCH_PIN (with_torch) unless an install of this pyproject.toml with them all, or
    more, is stamped there (installed_with). A venv it creates holds no stamp (one of a venv made there before is
    removed: its packages are gone)."""
    if sys.version_info < MIN_PYTHON:  # dev.py runs on whatever python3 the user has
        sys.exit(f"sparseps needs Python {'.'.join(map(str, MIN_PYTHON))} or newer; this is {sys.version.split()[0]}")
    python = os.path.join(BIN, "python")
    unusable = venv_python_unusable(python, venv_version()) if os.path.lexists(python) else None
    if unusable:  # made again from scratch: what it holds was installed for a Python it no longer runs
        print(f"{VENV}: its python {unusable}: making the virtual environment again ...", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    elif not os.path.exists(python):
        print(f"creating virtual environment in {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
        for name in os.listdir(VENV):
            if name.startswith(STAMP):
                os.remove(os.path.join(VENV, name))
    digest = install_digest()
    parts = sorted({*filter(None, extras.split(",")), *(["torch"] if with_torch else [])})
    if not installed_with(digest, parts):
        print("installing sparseps and its dependencies (first run: a minute or two) ...", flush=True)
        pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        steps = [["-e", f"{ROOT}[{extras}]" if extras else ROOT]] + ([[TORCH_PIN]] if with_torch else [])
        for args in steps:
            done = subprocess.run([*pip, *args], capture_output=True, text=True)
            if done.returncode != 0:  # show pip's output only when it failed
                sys.stderr.write(done.stdout + done.stderr)
                sys.exit(pip_failed(args, done.returncode, venv_version() or THIS_PYTHON))
        open(os.path.join(VENV, "+".join([STAMP + digest, *parts])), "w").close()
    return python


def tried_pythons() -> list[str]:
    """The Pythons (major.minor, oldest first) the README's quick start is tried with, every dependency having a
    wheel for each: pyproject.toml's classifiers "Programming Language :: Python :: 3.11" and so on. tomllib is
    imported here, after ensure_env checked MIN_PYTHON: an older Python has none. [] where pyproject.toml cannot be
    read or names none (pip_failed runs when an install failed, maybe for that very file)."""
    import tomllib

    try:
        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
            classifiers = tomllib.load(f)["project"]["classifiers"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
        return []
    versions = [c.removeprefix(PYTHON_CLASSIFIER) for c in classifiers if c.startswith(PYTHON_CLASSIFIER)]
    return sorted((v for v in versions if v.count(".") == 1), key=lambda v: tuple(map(int, v.split("."))))


def pip_failed(args: list[str], returncode: int, python_version: str) -> str:
    """The message of a failed `pip install ARGS` into the venv, whose Python is python_version (major.minor): it
    names the Pythons tried (tried_pythons) and the venv's, and where the venv's is none of them, says a dependency
    may have no wheel for it and how to make the venv again with one of them (a venv is reused whichever Python runs
    dev.py)."""
    said = f"pip install {' '.join(args)} failed (exit {returncode}); see the output above"
    pythons = tried_pythons()
    if not pythons:
        return f"{said} (pyproject.toml names no Python versions it is tried on; this venv's is {python_version})"
    tried = f"{', '.join(pythons[:-1])} and {pythons[-1]}" if len(pythons) > 1 else pythons[0]
    said += f". sparseps is tried on Python {tried}"
    if python_version in pythons:
        return f"{said}; the venv's Python, {python_version}, is one of them"
    return (
        f"{said}; the venv's is Python {python_version}, for which a dependency may have no wheel: make the venv "
        f"again with one of those (rm -rf {shlex.quote(VENV)} && python{pythons[-1]} dev.py env)"
    )


def venv_python_unusable(python: str, made_for: str) -> str | None:
    """Why the venv's python cannot serve the venv, made for Python made_for (major.minor, venv_version; "" where
    pyvenv.cfg does not say), or None: it does not run (its symlink names a Python since removed, say), or runs
    another major.minor version (its symlink names a python3 upgraded since: the venv's packages are another
    version's), or one older than MIN_PYTHON (a venv made by an older Python), or answers no version it can read.
    It is asked isolated (-I) from this process's environment (PYTHONHOME, PYTHONPATH), as the venv's
    own commands are not. One that does not answer within PROBE_TIMEOUT_S (a machine under load) is not taken as
    unusable: a warning says so, and None (making the venv again would remove what it holds)."""
    probe = [python, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except OSError as e:
        return f"does not run ({e.strerror})"
    except subprocess.TimeoutExpired:
        print(f"{VENV}: its python did not say its version within {PROBE_TIMEOUT_S:g} s; using the virtual "
              "environment as it is", file=sys.stderr, flush=True)  # fmt: skip
        return None
    if done.returncode != 0:
        return f"does not run (exit {done.returncode})"
    runs = done.stdout.strip()
    major, _, minor = runs.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return f"says its version is {runs!r}, not a Python major.minor"
    if made_for and runs != made_for:
        return f"is Python {runs}, but the venv was made for {made_for}"
    if (int(major), int(minor)) < MIN_PYTHON:
        return f"is Python {runs}, older than {'.'.join(map(str, MIN_PYTHON))}, which sparseps needs"
    return None


def venv_version() -> str:
    """The Python version (major.minor) the venv was made for, as its pyvenv.cfg says (`version`, as venv writes it,
    or virtualenv's `version_info`); "" where it does not."""
    version = ""
    try:
        with open(os.path.join(VENV, "pyvenv.cfg"), encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition("=")
                if key.strip() in ("version", "version_info"):
                    version = ".".join(value.strip().split(".")[:2])
    except OSError:
        pass
    return version


def install_digest() -> str:
    """What an install into the venv depends on, as 16 hex digits: the sha256 of pyproject.toml and of the venv's
    Python version (venv_version: a venv made again by another Python has none of its packages)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return hashlib.sha256(f.read() + f"\npython {venv_version()}".encode()).hexdigest()[:16]


def installed_with(digest: str, parts: list[str]) -> bool:
    """Whether the venv holds the stamp of an install whose install_digest was digest, with every one of parts
    (extras, and "torch" for TORCH_PIN) among its own: .installed-<digest>[+<part>...] (an extra's name may hold
    '-', never '+')."""
    try:
        names = os.listdir(VENV)
    except OSError:
        return False
    stamps = [name[len(STAMP) :].split("+") for name in names if name.startswith(STAMP)]
    return any(stamp[0] == digest and set(parts) <= set(stamp[1:]) for stamp in stamps)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "bench", "env"):
        print(__doc__.strip())
        if argv:
            print(f"\ndev.py: unknown command {argv[0]!r}: expected demo, test, bench or env", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    extras = {"demo": "", "bench": "dev,bench"}.get(command, "dev")  # the demo runs the package alone
    python = ensure_env(with_torch=command in ("test", "bench"), extras=extras)
    if command == "env":
        print(python)
        return 0
    if command == "bench":
        if rest and rest[0].endswith(".py"):  # one script, with its own arguments
            return subprocess.call([python, *rest], cwd=ROOT)
        return subprocess.call([python, os.path.join("benchmarks", "report.py"), *rest], cwd=ROOT)
    if command == "demo":  # in the caller's directory: paths it gives (--metrics-out m.json) are its own
        args = [python, "-m", "worker", "train", "--local-shards", "2", *rest]
        return subprocess.call(args)
    if not rest:  # lint the whole tree first; `dev.py test -k name` runs just those tests
        for lint in (["check", "."], ["format", "--check", "."]):
            print(f"ruff {' '.join(lint)}", flush=True)
            if subprocess.call([python, "-m", "ruff", *lint], cwd=ROOT) != 0:
                print("lint failed: `.venv/bin/ruff check --fix . && .venv/bin/ruff format .` fixes most of it")
                return 1
    return subprocess.call([python, "-m", "pytest", *test_processes(rest), *rest], cwd=ROOT)


def test_processes(args: list[str]) -> list[str]:
    """pytest-xdist's flag for 2-4 test processes (the CPU count, within that), unless args choose (-n,
    --numprocesses, -p no:xdist). Most tests wait on servers and workers in processes of their own, so two test
    processes halve the suite's time on 2 cores; more than 4 would crowd the servers each test starts. Tests marked
    with one xdist_group run in one process (--dist loadgroup), so a module fixture they share starts once."""
    if any(a.startswith(("-n", "--numprocesses")) or a == "no:xdist" for a in args):
        return []
    return ["-n", str(max(2, min(4, os.cpu_count() or 2))), "--dist", "loadgroup"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

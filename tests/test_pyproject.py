"""pyproject.toml's runtime dependencies: each bounded above (a release past the bound is untested here) and met
by the versions installed in the environment the tests run in."""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

import pytest
from packaging.requirements import Requirement

PYPROJECT = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"


def check_bounded_and_met(lines: list[str]) -> None:
    """AssertionError unless each requirement of lines has an upper bound and, where its environment marker
    applies here (or it has none), the version installed meets it; PackageNotFoundError for one not installed."""
    requirements = [Requirement(line) for line in lines]
    unbounded = [str(r) for r in requirements if not any(s.operator in ("<", "<=", "==", "~=") for s in r.specifier)]
    assert unbounded == [], f"no upper bound: {unbounded}"
    for r in requirements:
        if r.marker and not r.marker.evaluate():  # pip installs it elsewhere only
            continue
        installed = importlib.metadata.version(r.name)
        assert r.specifier.contains(installed, prereleases=True), f"{r.name} {installed} is installed; {r} asks"


def test_every_runtime_dependency_has_an_upper_bound_the_installed_version_meets():
    check_bounded_and_met(tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"])


def test_a_dependency_whose_marker_does_not_apply_here_is_not_looked_for():
    check_bounded_and_met(['sparseps-nowhere<2; python_version < "3"', 'pytest<1000; python_version >= "3"'])
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        check_bounded_and_met(['sparseps-nowhere<2; python_version >= "3"'])

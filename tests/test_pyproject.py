"""pyproject.toml's runtime dependencies: each bounded above (a release past the bound is untested here) and met
by the versions installed in the environment the tests run in."""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

from packaging.requirements import Requirement

PYPROJECT = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_every_runtime_dependency_has_an_upper_bound_the_installed_version_meets():
    requirements = [Requirement(r) for r in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]]
    unbounded = [str(r) for r in requirements if not any(s.operator in ("<", "<=", "==", "~=") for s in r.specifier)]
    assert unbounded == [], f"no upper bound: {unbounded}"
    for r in requirements:
        installed = importlib.metadata.version(r.name)
        assert r.specifier.contains(installed, prereleases=True), f"{r.name} {installed} is installed; {r} asks"

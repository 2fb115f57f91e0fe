"""Running a script of benchmarks/, or loading it as a module, for the tests of it and its pieces."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")


def run_benchmark(
    name: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python benchmarks/<name>.py args` from the repository root, its output captured as text; env: its
    environment (None: this process's)."""
    script = os.path.join(BENCHMARKS, f"{name}.py")
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env)  # fmt: skip


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py imported as the module `name` (with benchmarks/ on sys.path, for its `import
    harness`; registered in sys.modules, where its dataclasses look their module up)."""
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module

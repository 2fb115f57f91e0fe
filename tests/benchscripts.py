"""Loading a script of benchmarks/ as a module, for the tests of its pieces."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


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

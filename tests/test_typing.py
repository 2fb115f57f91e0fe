"""Public functions and methods of ps/ and worker/ are typed: every parameter (self and cls excepted) and the
return value carry an annotation, so a caller reads the contract from the signature."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def untyped(source: str) -> list[str]:
    """Public functions of a module's source that lack an annotation, as 'name (line): what is missing'."""
    out = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name.startswith("_") and node.name != "__init__":
                    continue
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
                missing = [p.arg for p in params if p.annotation is None and p.arg not in ("self", "cls")]
                if node.returns is None and node.name != "__init__":
                    missing.append("return")
                if missing:
                    out.append(f"{prefix}{node.name} (line {node.lineno}): {', '.join(missing)}")

    visit(ast.parse(source).body, "")
    return out


def test_public_functions_are_typed():
    problems = []
    for package in ("ps", "worker"):
        for path in sorted((ROOT / package).rglob("*.py")):
            problems += [f"{path.relative_to(ROOT)}: {p}" for p in untyped(path.read_text())]
    assert problems == []


def test_the_check_bites():
    assert untyped("def f(x):\n    return x\n") == ["f (line 1): x, return"]
    assert untyped("class A:\n    def g(self, y: int):\n        pass\n") == ["A.g (line 2): return"]
    assert untyped("def _private(x):\n    pass\n") == []
    assert untyped("def f(x: int, *a: int, **k: int) -> None:\n    pass\n") == []

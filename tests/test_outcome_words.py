"""The words of a refusal's outcome are written once, in ps/errors.py (NOTHING_APPLIED, NOTHING_READ_OR_APPLIED,
NOTHING_OF_THE_STEP_APPLIED, PARTLY_APPLIED, SHARDS_STAY_SHRUNK): every other module of ps/ and worker/ that
produces them uses the constant, so that the modules which read them (worker.retry, ps.partlyapplied,
ps.engine.rowloader) and the messages they read cannot drift apart. Read from the source: every string a module
builds (its implicit concatenations and f-strings joined; docstrings and bare strings left out, they only
describe)."""

from __future__ import annotations

import ast
import pathlib

import pytest

from ps.errors import (
    NOTHING_APPLIED,
    NOTHING_OF_THE_STEP_APPLIED,
    NOTHING_READ_OR_APPLIED,
    PARTLY_APPLIED,
    SHARDS_STAY_SHRUNK,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def built_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string the module builds: a constant, or an f-string with "{}" for each field."""
    described = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    out = []
    for n in ast.walk(tree):
        if id(n) in described or id(n) in parts:
            continue
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append((n.lineno, n.value))
        elif isinstance(n, ast.JoinedStr):
            out.append((n.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in n.values)))
    return out


def writers_of(words: str) -> list[str]:
    """file:line of each string in ps/ and worker/, ps/errors.py's own left out, that holds words."""
    found = []
    for path in sorted([*ROOT.glob("ps/**/*.py"), *ROOT.glob("worker/**/*.py")]):
        if path == ROOT / "ps" / "errors.py" or path.name.endswith("_pb2.py"):
            continue
        for line, text in built_strings(ast.parse(path.read_text(), str(path))):
            if words in text:
                found.append(f"{path.relative_to(ROOT)}:{line}")
    return found


def test_built_strings_sees_through_concatenations_and_f_strings_and_skips_docstrings():
    tree = ast.parse('"""nothing was applied"""\nx = f"{a}; nothing was " "applied"\ny = "nothing" + " was applied"')
    assert [t for _, t in built_strings(tree)] == ["{}; nothing was applied", "nothing", " was applied"]


@pytest.mark.parametrize(
    "words", [NOTHING_APPLIED, NOTHING_READ_OR_APPLIED, NOTHING_OF_THE_STEP_APPLIED, PARTLY_APPLIED, SHARDS_STAY_SHRUNK]
)
def test_the_outcome_words_are_written_only_in_ps_errors(words):
    assert writers_of(words) == [], f"use ps.errors' constant for {words!r} there"

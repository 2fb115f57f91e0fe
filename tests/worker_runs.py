"""ps-worker run in process by tests of a job's start against the tables the servers hold."""

from __future__ import annotations

from worker.__main__ import main as worker_main

SMALL = ["--synthetic-rows", "2000", "--synthetic-eval-rows", "500", "--batch-size", "256"]  # a run of a few steps


def run(argv: list[str], capsys) -> tuple[int, str]:
    """worker_main's exit code, and what it wrote to stderr."""
    try:
        code = worker_main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err

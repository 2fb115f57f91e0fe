"""ps.progress: pace's line, where an estimate the work passed (or none known) shows the count as the total with no
time left; a CountProgress not shown starts no thread (tqdm starts its monitor thread for every bar it makes, a
disabled one too)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from ps.progress import pace

ROOT = pathlib.Path(__file__).resolve().parent.parent

_THREADS_OF_A_PROGRESS_OFF = """
import threading

from ps.engine.export import ExportProgress
from ps.progress import CountProgress
from worker.progress_lines import ExamplesProgress
from worker.scoring import ScoringProgress


class Counted(CountProgress):
    def line(self, rate):
        return f"{self.done} done"


before = {t.ident for t in threading.enumerate()}
for progress in (Counted(10, False, unit="row"), ExportProgress("t", 10, False), ScoringProgress(10, False),
                 ScoringProgress(10, False, estimated=True), ExamplesProgress(10, False, True, "skipping 4 examples")):
    progress.update(4)
    if isinstance(progress, ExamplesProgress):  # training's bar: the first step after a skip, and its figures
        progress.restart()
        progress.postfix({"epoch": 1, "logloss": "0.6931"})
    progress.update(7)
    progress.close()
print(sorted(t.name for t in threading.enumerate() if t.ident not in before))
"""


def test_a_progress_not_shown_starts_no_thread():
    """Export, scoring and training with their bar off (every test, every log without a terminal) leave no thread
    behind. Counted in a process of its own: a test process holds the threads of the tests before it."""
    child = subprocess.run(
        [sys.executable, "-c", _THREADS_OF_A_PROGRESS_OFF], cwd=ROOT, capture_output=True, text=True, timeout=60
    )  # ROOT: the ps that this test imports
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[]", f"threads started: {child.stdout.strip()}"


def test_examples_progress_on_a_non_terminal_writes_plain_lines(capsys):
    """Shown on stderr that is no terminal (a log file), a count of examples writes plain lines, no bar."""
    from worker.progress_lines import ExamplesProgress

    progress = ExamplesProgress(10, on=True)
    progress.every_s = 0.0
    progress.update(5)
    progress.close()
    assert progress.bar is None
    assert capsys.readouterr().err.startswith("progress: 5 of 10 (50%) examples, ")


@pytest.mark.parametrize(
    "expected, line",
    [
        (30, "12 of about 30 rows read (40%), 6 rows/s, about 3 s left"),  # 18 rows left at 6 rows/s
        (12, "12 of about 12 rows read (100%), 6 rows/s"),
        (10, "12 of about 12 rows read (100%), 6 rows/s"),  # an estimate the work passed: the count is the total
        (0, "12 of about 12 rows read (100%), 6 rows/s"),  # none known
    ],
    ids=["above", "equal", "under", "none"],
)
def test_pace_shows_an_estimate_the_work_passed_as_the_count_with_no_time_left(expected, line):
    assert pace(12, expected, 2.0, "rows read") == line

"""A Ctrl-C while `python -m worker` or `python -m ps` loads its modules (most of a start's first 0.3 s) ends it as one
later does: one line, 'ps-worker: interrupted' (or ps-server's), exit 130, no traceback (ps.terminate.interrupt_exits).
The Ctrl-C is sent by the process to itself as it begins to import a chosen module, so it lands there every time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 60

# Runs `python -m MODULE --help` (as runpy does for -m), sending itself SIGINT when TRIP is first looked for.
INTERRUPTED_AT = """
import os, runpy, signal, sys
module, trip = sys.argv[1], sys.argv[2]

class Trip:
    def find_spec(self, name, path=None, target=None):
        if name == trip:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Trip())
sys.argv = [module, "--help"]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module, program", [("worker", "ps-worker"), ("ps", "ps-server")])
@pytest.mark.parametrize("trip", ["argparse", "ps.config", "numpy._core._multiarray_umath", "datetime"])
def test_a_ctrl_c_while_the_modules_load_says_interrupted_and_exits_130(module, program, trip):
    """datetime and numpy's extension: a KeyboardInterrupt raised inside numpy's C import came out as an
    ImportError ('Importing the numpy C-extensions failed') rather than as the Ctrl-C."""
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_AT, module, trip], cwd=ROOT, capture_output=True,
                          text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert (done.returncode, done.stderr, done.stdout) == (130, f"{program}: interrupted\n", "")


def test_a_ctrl_c_while_ps_worker_reads_its_arguments_says_interrupted_and_exits_130(monkeypatch, capsys):
    import worker.__main__

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(worker.__main__, "apply_defaults", interrupted)
    assert worker.__main__.main(["stats", "--servers", "127.0.0.1:1"]) == 130
    assert capsys.readouterr().err == "ps-worker: interrupted\n"


def test_a_ctrl_c_while_the_modules_load_exits_130_with_stderr_closed():
    """No stderr to say it on (a daemon's fds closed): the exit code alone says it, not an OSError raised from the
    handler into the import that was running."""
    closed = "import os; os.close(2)\n" + INTERRUPTED_AT
    done = subprocess.run([sys.executable, "-c", closed, "worker", "numpy._core._multiarray_umath"], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert (done.returncode, done.stdout) == (130, "")

"""SIGTERM's end of a command (ps/terminate.py): once the first SIGTERM's Terminated has left the sigterm_raises
block, a second SIGTERM (a container runtime repeating it) is ignored until the process exits, so the cleanup
after the block and exit_code's line run to their end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the child imports this tree's ps, from any working directory

# A command's main under exit_code whose block is stopped by a SIGTERM; a second SIGTERM lands right after the
# block's handlers are gone (the end of _SignalStop.uninstall), and a third as exit_code writes its line.
TWO_SIGTERMS = """import os, signal, sys, time
from ps import terminate
from ps.terminate import exit_code, sigterm_raises

uninstall = terminate._SignalStop.uninstall
def uninstall_then_signal(self):
    uninstall(self)
    os.kill(os.getpid(), signal.SIGTERM)  # delivered before os.kill returns: the process is single-threaded
terminate._SignalStop.uninstall = uninstall_then_signal

class SignalledStderr:
    def __init__(self, stream):
        self.stream = stream
    def write(self, text):
        os.kill(os.getpid(), signal.SIGTERM)
        return self.stream.write(text)
    def __getattr__(self, name):
        return getattr(self.stream, name)

def run():
    try:
        with sigterm_raises():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
    finally:
        print("cleaned up", flush=True)
        sys.stderr = SignalledStderr(sys.stderr)
    return 0

sys.exit(exit_code("prog", run))
"""


def test_a_second_sigterm_after_the_block_ends_is_ignored_until_the_process_exits():
    """Without it the default SIGTERM action ends the process as the block's handler is put back: exit -15, no
    'cleaned up', no 'prog: terminated' line (or half of it)."""
    done = subprocess.run([sys.executable, "-c", TWO_SIGTERMS], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert (done.returncode, done.stdout, done.stderr) == (143, "cleaned up\n", "prog: terminated\n")

"""Running a command as the unprivileged user `nobody` (runuser), for tests of what a user without a home or
without write access meets. Needs root, runuser, and a checkout and interpreter that nobody can read and run (a
clone inside a private temp dir is not): `why_not()` says which is missing, for a skip that names it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "PYTHONPATH": ROOT}


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    """args run as nobody, from /, with no home, the checkout on PYTHONPATH; text output captured."""
    return subprocess.run(["runuser", "-u", "nobody", "--", *args], capture_output=True, text=True, env=ENV, cwd="/",
                          timeout=300, **kw)  # fmt: skip


def why_not() -> str | None:
    """Why commands cannot run as nobody here, or None."""
    if os.geteuid() != 0 or not shutil.which("runuser"):
        return "needs root and runuser to act as the user nobody"
    probe = run([sys.executable, "-c", "import ps"])
    if probe.returncode != 0:
        return f"the user nobody cannot run this checkout's interpreter: {probe.stderr.strip()[-200:]}"
    return None

"""pull_push.py of this tree, with its server processes started from another checkout: the same client, echo and
timing, so two server versions compare on the same work.

    git worktree add /tmp/base <commit>
    python benchmarks/pull_push_against.py /tmp/base --rows 2000000 --ids 100000 --reps 20
    python benchmarks/pull_push_against.py .         --rows 2000000 --ids 100000 --reps 20    # this tree's servers

Run the two alternately, several times: the figures to compare are each run's "% of echo". The other checkout's
server must accept the flags worker.cluster.LocalCluster passes (--port, --shard-id, --num-shards, --data-dir,
--stop-with-stdin).
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: F401  (this tree's modules are imported before any server starts)


class _ServersFrom(subprocess.Popen):
    """subprocess.Popen that starts `python -m ps` from the checkout in _ServersFrom.tree (cwd and PYTHONPATH)."""

    tree = ""

    def __init__(self, cmd: list[str] | str, *args: object, **kwargs: object) -> None:
        if isinstance(cmd, list) and cmd[1:3] == ["-m", "ps"]:
            kwargs["env"] = {**os.environ, "PYTHONPATH": self.tree}
            kwargs["cwd"] = self.tree
        super().__init__(cmd, *args, **kwargs)


def main() -> None:
    if len(sys.argv) < 2 or not os.path.isdir(os.path.join(sys.argv[1], "ps")):
        sys.exit(f"usage: {sys.argv[0]} CHECKOUT [pull_push.py options]: CHECKOUT must hold a ps/ package")
    _ServersFrom.tree = os.path.abspath(sys.argv[1])
    print(f"servers from {_ServersFrom.tree}", flush=True)
    subprocess.Popen = _ServersFrom
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pull_push.py")
    sys.argv = [script, *sys.argv[2:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

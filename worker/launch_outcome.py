"""The end of a `ps-worker launch`: the workers' --metrics-out objects read back, the job's final evaluation, and
what is said of a job that did not finish (the failed worker's last lines, where to resume).
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ps.errors import PsError
from ps.terminate import how_it_ended
from worker.launch_plan import LaunchPlan


def workers_bad_lines(train_config: Any, per_worker: list[dict]) -> dict:
    """{"max_bad_lines", "max_bad_share"}: the bounds the job's final evaluation reads --eval-data with: the flag's,
    else those the workers' recipe gave them (their --metrics-out config), as each worker's own final evaluation
    would."""
    given = getattr(train_config, "max_bad_lines", None)
    configs = [m["config"] for m in per_worker if "config" in m]  # not of a worker whose run had ended before
    if given is not None or not configs:
        return {"max_bad_lines": given}
    config = configs[0]
    return {"max_bad_lines": config.get("max_bad_lines"), "max_bad_share": config.get("max_bad_share")}


def final_evaluation(cfg: Any, evaluate: Callable[[Any], dict] | None, local_shards: bool = False) -> dict:
    """The job's figures on its eval set: evaluate(cfg) (default: worker.served.evaluate_servers, which computes the
    mean and std of standardized columns the schema leaves without them over --data, as the workers did) on --eval-data,
    or on the synthetic eval rows without --data; {} for a job on --data without --eval-data, which has no
    held-out file to score (format_summary says so). --eval-data is read as it is scored (launch checked a small
    file whole, of a larger one its start, before anything started): a ValueError of reading it (a malformed line
    past --max-bad-lines) gives {"eval_error": what happened, that the training had finished (local_shards: the
    model goes with them, else it stays on the servers)}: the job's training figures are still reported and
    written, and launch then fails. The data's warnings (the schema's) are not said again: launch said them as it
    checked the job."""
    if cfg.data is not None and cfg.eval_data is None:
        return {}
    if evaluate is None:
        from worker.served import evaluate_servers

        evaluate = functools.partial(evaluate_servers, trained_on_data=True, warn=False)  # warned as it started
    try:
        return evaluate(cfg)
    except PsError:
        raise
    except ValueError as e:
        kept = " (the model went with the local shards)" if local_shards else (
            " (the model stays on the servers: ps-worker eval scores it once the file is fixed or --max-bad-lines "
            "raised)")  # fmt: skip
        return {"eval_error": f"{e}; in the job's final evaluation, after every worker had finished training{kept}"}


def evaluation_stopped(e: BaseException, local_shards: bool, servers: Sequence[str]) -> str:
    """What a Ctrl-C (KeyboardInterrupt) or SIGTERM (Terminated) in the job's final evaluation stopped: the
    evaluation only, every worker having finished training; and where the model is."""
    how = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated"
    kept = ("the model went with the local shards" if local_shards else
            f"the model stays on the servers: ps-worker eval scores it, with --servers {','.join(servers)} and this "
            "run's model and data flags")  # fmt: skip
    return f"{how} in the job's final evaluation, after every worker had finished training ({kept})"


def say_where_to_resume(plan: LaunchPlan, reports: dict[int, dict], interrupted: bool = False) -> None:
    """After a job that did not finish: how many examples each worker had trained (its last PROGRESS line: a
    worker stopped by a signal writes one as it stops), and the --skip-examples that trains on from there: the
    fewest, so that no worker leaves examples out (the others train up to the difference twice). Workers that
    keep a --resume-file resume from it: the same command again, which a --skip-examples would only refuse. On
    local shards, that the model went with them. interrupted (Ctrl-C or SIGTERM to launch): nothing to fix first."""
    trained = [
        int(reports[i].get("pushed", reports[i].get("examples")) or 0) if i in reports else 0
        for i in range(plan.workers)
    ]  # geo: the examples whose deltas were pushed
    if not any(trained):
        return
    if plan.local_shards is not None:
        print("ps-worker launch: the model the workers trained was on the local shards, stopped with this run: "
              "nothing to resume (launch with --servers to keep what a stopped job trained)",
              file=sys.stderr, flush=True)  # fmt: skip
        return
    from worker.resume import unused_because

    fixed = "" if interrupted else "once what stopped the job is fixed (a bad line, say), "
    resume_file = getattr(plan.train_config, "resume_file", None)
    if resume_file and unused_because(plan.train_config) is None:  # the workers keep their positions there
        print(f"ps-worker launch: the workers' positions are in their --resume-file {resume_file}, and the examples "
              f"they had trained are on the servers; to train on from there, {fixed}run the same command again (its "
              "--skip-examples, if any, unchanged: a file refuses another, and its position wins)",
              file=sys.stderr, flush=True)  # fmt: skip
        return
    skip = getattr(plan.train_config, "skip_examples", 0)
    done = [skip + n for n in trained]
    listed = ", ".join(f"{n:,}" for n in done)
    print(f"ps-worker launch: the workers had trained {listed} examples of their shares (their last progress "
          f"reports), which the servers keep; to train on from there, {fixed}run the same command with "
          f"--skip-examples {min(done)}"
          + (f" (worker {done.index(min(done))}'s: the others train up to {max(done) - min(done):,} examples again)"
             if max(done) > min(done) else ""), file=sys.stderr, flush=True)  # fmt: skip


# what a sync or ssp worker's error says when its job stopped because another worker stopped (ps.engine.followedjob)
PEER_STOPPED = re.compile(r"job \d+ stops: worker (\d+) stopped before its end")


def report_failure(worker: int, code: int, tails: Sequence[Sequence[str]]) -> None:
    """Says that worker exited with code (-N: killed by signal N) and repeats its last lines (tails: every
    worker's). Where those lines say the job stopped because another worker stopped before its end (a sync or ssp
    job: the workers stop within moments of each other, and the one that stopped first may exit second), that
    worker is named as the one that stopped the job, and its lines come first."""
    how = how_it_ended(code)
    causes = {int(m.group(1)) for line in tails[worker] if (m := PEER_STOPPED.search(line))} - {worker}
    cause = min(causes) if len(causes) == 1 and min(causes) < len(tails) else None
    if cause is not None:
        print(f"ps-worker launch: worker {cause} stopped the job, and worker {worker} {how} as it stopped with it; "
              f"the other workers were stopped. Worker {cause}'s last lines:", file=sys.stderr)  # fmt: skip
        for line in tails[cause]:
            print(f"  [worker {cause}] {line}", file=sys.stderr)
        print(f"Worker {worker}'s last lines:", file=sys.stderr)
    else:
        print(f"ps-worker launch: worker {worker} {how}; the other workers were stopped. Its last lines:",
              file=sys.stderr)  # fmt: skip
    for line in tails[worker]:
        print(f"  [worker {worker}] {line}", file=sys.stderr)


def read_worker_metrics(metrics_dir: str, plan: LaunchPlan) -> list[dict] | None:
    """Every worker's --metrics-out object, in worker order (a worker whose --resume-file says its run ended
    before writes results.ended_figures, and exits 0 having nothing to do); [] where every worker's run ended
    before; None (reported) when one is missing or not JSON."""
    out = []
    for i in range(plan.workers):
        path = os.path.join(metrics_dir, f"worker-{i}.json")
        try:
            with open(path) as f:
                out.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"ps-worker launch: worker {i} exited 0 but its metrics {path} are unreadable: {e}", file=sys.stderr)
            return None
    return [] if all(isinstance(m, dict) and m.get("ended_before") is True for m in out) else out

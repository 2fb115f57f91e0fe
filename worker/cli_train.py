"""The `train` and `eval` commands of ps-worker run: a TrainConfig (worker/cli_train_config.py) from their flags
(worker/cli_train_flags.py), --resume-file's position taken up, the run, and what it printed and exits with."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys

from worker.cli_train_config import eval_config, train_config
from worker.results import ended_figures, format_results, json_figures, local_shards_gone, model_kept, write_metrics
from worker.train_config import TrainConfig

log = logging.getLogger("worker.cli_train")


def run_train(args: argparse.Namespace) -> int:
    from worker.train import train

    cfg = train_config(args)
    with contextlib.ExitStack() as stack:
        if cfg.resume_file is not None and not cfg.create_tables_only:  # (a setup job in the workers' environment)
            cfg = resumed(cfg, stack)
            if cfg is None:
                return 0
        results = train(cfg)
    print(format_results(results, launched=cfg.launched), flush=True)
    if cfg.metrics_out and not cfg.launched and "metrics_error" not in results:  # launch reads the file (and
        print(f"metrics written to {cfg.metrics_out}")  # removes it)
    if cfg.local_shards is not None:
        print(local_shards_gone("train"), flush=True)
    elif not cfg.launched and "created_tables" not in results:  # a launcher's worker: launch says it
        print(model_kept(",".join(cfg.servers)), flush=True)
    failed = [results[k] for k in ("eval_error", "metrics_error") if k in results]
    for error in failed:  # the training is done and reported; its evaluation, or its figures' file, is not
        print(f"ps-worker: error: {error}", file=sys.stderr, flush=True)
    return 2 if failed else 0


def resumed(cfg: TrainConfig, stack: contextlib.ExitStack | None = None) -> TrainConfig | None:
    """cfg to run under --resume-file: with --skip-examples from the file's position (worker/resume.py; only the
    final evaluation when its training was over; sync and ssp under a new job id, a worker whose training was over
    telling it that it is done: resume_rejoins), as given when there is no file yet, without the file where one
    worker cannot resume alone (a warning says why); None (said, and written to --metrics-out: _write_ended) when
    the file says the run ended on the model the servers hold: that check asks the servers where the file recorded
    their state ids (Client.wait_ready), so a finished worker run again while they are down fails after
    --server-timeout (the CLI's exit 2), not "nothing to do" (exit 0). ValueError for a file of another run, for
    servers that hold another model than the one its run ended in (_check_same_model), for a --skip-examples other
    than the one the file's run started from, and, with a stack, for a file another run holds (the stack then holds
    it, worker.resume_writer.held, until it closes)."""
    from ps.stamp import job_named
    from worker.resume import read_position, rejoins, resume_path, resumes_whole, unused_because
    from worker.resume_writer import held

    cfg.validate()
    why = unused_because(cfg)
    if why:
        log.warning("--resume-file %s is not used: %s", cfg.resume_file, why)
        return dataclasses.replace(cfg, resume_file=None)
    cfg = dataclasses.replace(cfg, resume_file=resume_path(cfg))
    if stack is not None:
        stack.enter_context(held(cfg.resume_file))
    position = read_position(cfg)
    # the job id the file keeps, unless one is given (read_position refused another): a worker killed without a
    # word leaves its job holding the shards, which let only that job push; the job's name the file keeps, unless
    # one is given (an integer --job-id, the file's id, gives none); and the worker's token, which makes a
    # restart the same process for them (none: TrainConfig.with_recipe makes the run's up, and the file keeps them
    # from before its first CreateTable on: worker/train.py)
    # (sync and ssp resume under a new job id, never the file's: read_position refused it where it was given)
    job = cfg.job_id or (position and not resumes_whole(cfg) and position.job_id) or None
    kept_name = position.job_name if position and position.job_id == job else ""
    cfg = dataclasses.replace(cfg, job_id=job, job_name=cfg.job_name or kept_name,
                              worker_token=cfg.worker_token or (position and position.token) or 0)  # fmt: skip
    if position is None:
        print(f"--resume-file {cfg.resume_file}: no position yet; this run keeps it there", flush=True)
        return cfg
    if cfg.skip_examples != position.started_from:  # the same command gives the same value again
        raise ValueError(f"--skip-examples {cfg.skip_examples} and --resume-file {cfg.resume_file}, the position "
                         f"({position.examples:,} examples) of a run started with --skip-examples "
                         f"{position.started_from}: give that run's command (the file's position then wins), or "
                         "remove the file")  # fmt: skip
    rejoin = rejoins(cfg, position)  # its peers wait for it unless it says it is done
    if position.finished and not rejoin:
        _check_same_model(cfg, position.state_ids)
        print(f"--resume-file {cfg.resume_file}: this worker's run ended before, after {position.examples:,} "
              "examples; nothing to do (remove the file to train again)", flush=True)  # fmt: skip
        _write_ended(cfg, position.examples)
        return None
    if position.trained and rejoin:
        before, now = job_named(position.job_id or 0, position.job_name), job_named(job, cfg.job_name)
        print(f"--resume-file {cfg.resume_file}: this worker's training ended after {position.examples:,} examples, "
              f"in job {before}; telling job {now} (its workers resumed) that this worker is done, then evaluating"
              f"{' again' if position.finished else ''}", flush=True)  # fmt: skip
    elif position.trained:
        print(f"--resume-file {cfg.resume_file}: this worker's training ended after {position.examples:,} examples, "
              "its final evaluation did not: evaluating", flush=True)  # fmt: skip
    else:
        print(f"--resume-file {cfg.resume_file}: resuming after {position.examples:,} training examples", flush=True)
    return dataclasses.replace(cfg, skip_examples=position.examples, resume_started_from=position.started_from,
                               resume_trained=position.trained, resume_state_ids=position.state_ids,
                               resume_rejoins=rejoin and position.trained,
                               resume_best_not_put_back=position.best_not_put_back)  # fmt: skip


def _check_same_model(cfg: TrainConfig, state_ids: tuple[int, ...]) -> None:
    """ValueError where the servers hold another model than the one the file's run ended in, its shards' model
    state ids `state_ids` (resume.state_changed: restored from a checkpoint, or started on new data dirs, since),
    saying what trains them; nothing to check where the file recorded none. One Stats round (Client.wait_ready),
    the check a resumed run makes first (worker/train.py)."""
    if not state_ids:
        return
    from worker.job import client_for
    from worker.resume_checkpoint import check_resumed_model
    from worker.resume_settings import run_settings

    with client_for(cfg, list(cfg.servers)) as client:
        shard_stats = client.wait_ready()  # the Stats round that reads client.state_ids, before they are compared
        check_resumed_model(cfg.resume_file, state_ids, client, run_settings(cfg), shard_stats)


def _write_ended(cfg: TrainConfig, examples: int) -> None:
    """Writes --metrics-out, where given, saying that the run ended before, after examples (results.ended_figures):
    what a launcher reads of a worker with nothing to do. ValueError where it cannot be written."""
    if not cfg.metrics_out:
        return
    failed = write_metrics(cfg.metrics_out, ended_figures(examples), "the run's figures")
    if failed:
        raise ValueError(failed)
    if not cfg.launched:
        print(f"metrics written to {cfg.metrics_out}", flush=True)


def run_eval(args: argparse.Namespace) -> int:
    import json

    from worker.served import evaluate_servers

    r = evaluate_servers(eval_config(args))
    print(json.dumps(json_figures(r)) if args.json else format_results(r), flush=True)
    return 0

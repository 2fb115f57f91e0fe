"""train(cfg): a whole training job, from its TrainConfig (worker/train_config.py) to its figures.

    train(cfg):  data = DataSource(cfg)                    # prepare (worker/job.py): files through the schema, or
                                                           # synthetic data
                 recipe fills the flags left unset          # worker/recipe.py: small or large data
                 spec = ModelSpec(model, schema's fields, numeric features, hidden, dropout)
                 read the validation set (at most 200,000 examples, kept in memory) and --eval-data's start: a
                 malformed line there fails here, before any server is touched (what holds for every worker of a
                 job is worker/job.py check_training's, which `ps-worker launch` runs for its job before it starts
                 anything: its workers then say none of its warnings)
                 create the tables (one per schema table, one per dense parameter) on the servers
                                                           # worker/model_tables.py; with the job's stamp: each
                                                           # shard holds itself for the job from its first table
                                                           # (--resume-file's position written just before)
                 run_epochs (worker/loop.py), evaluating the validation set as it goes
                 evaluate the eval set, read batch by batch as it is scored (worker/scoring.py); results
                 printed, and written to --metrics-out as JSON
What the run says besides its figures (its mode, how to resume after a stop) is worker/train_messages.py's.
Malformed lines of --data met while training are skipped and counted; one past --max-bad-lines fails the run; with
--servers its message says that the servers hold the partly trained model. --eval-data is read before training, a
small file whole and of a larger one its start; a malformed line past that start is met in the final evaluation
(past --max-bad-lines, it fails the run then, saying that the training had finished).
Worker i of n trains on its own share of the data (--worker-id, --num-workers); all workers share the tables.
With synthetic data the planted model's probabilities give the oracle AUC and logloss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Iterator
from typing import Any

from tqdm import tqdm

from ps.bytesize import exact_bytes
from ps.errors import ModelStateReplacedError, PsError, RamTierTooSmallError
from worker.client import Client
from worker.data import DataSource
from worker.dense import dense_norm, start_logit_bias
from worker.dense import table_name as dense_table
from worker.job import CheckedJob, check_training, dense_path, job_client, job_lines, loop_settings, make_backend
from worker.loop import LoopResult, TrainingDataError, run_epochs
from worker.model_tables import (
    check_not_others_tables,
    held_features,
    initializers_given,
    missing_shares,
    sparse_table_stats,
    weaker_l2_toml,
)
from worker.models.spec import ModelSpec
from worker.results import format_evaluation, write_metrics
from worker.resume import resumes_whole
from worker.resume_checkpoint import check_resumed_model
from worker.resume_writer import PositionWriter
from worker.row_source import row_source
from worker.scoring import ScoringProgress, evaluate
from worker.stopping import abandon
from worker.tables import check_tables, held_specs, keep_held_initializers, replaced_warning
from worker.train_config import TrainConfig
from worker.train_figures import training_figures
from worker.train_messages import (
    best_not_put_back,
    mode_line,
    one_class_labels,
    resume_hint,
    sorted_by_label,
    stopped_message,
    validation_auc_undefined,
    validation_too_small,
)

log = logging.getLogger("worker.train")


def train(cfg: TrainConfig) -> dict:
    """Runs a whole job and returns its figures (also written to cfg.metrics_out as JSON)."""
    position = PositionWriter(cfg) if cfg.resume_file else None  # (the settings as given, before the recipe's)
    job = check_training(cfg, warn=not cfg.launched)  # launch said the job's warnings before it started it
    cfg = job.cfg
    if position is not None:  # the run's ids (given, the file's, or made up by with_recipe)
        _take_ids(position, cfg)
    # the labels' figures where they are known before training (the logit bias starts from them)
    labels = None if cfg.create_tables_only else _labels_before_training(cfg, job.data)
    backend = make_backend(job.spec, cfg)
    with served_metrics(cfg) as telemetry, job_client(cfg) as client:
        run = _Run(job, client, position, labels)
        run.ready_tables()
        try:
            run.create_tables()
            if cfg.create_tables_only:
                return {"model": cfg.model, "created_tables": [t.name for t in run.tables]}
            run.say_start()
            dense, validation, settings = run.before_the_loop()
        except BaseException as e:  # before training (its tables' check included): the shards hold the job no
            run.forget_start(e)  # more for this worker
            raise
        loop = run.run_loop(backend, dense, validation, settings, telemetry)
        run.check_trained(loop)
        results = training_figures(cfg, job.recipe_line, len(client.servers), loop, dense.syncs,
                                   weaker_l2_toml(run.tables, job.spec))  # fmt: skip
        run.evaluate_at_end(loop, backend, dense, results)
    _finish(cfg, job.data, position, loop, results)
    return results


def _take_ids(position: PositionWriter, cfg: TrainConfig) -> None:
    """The run's ids kept in its --resume-file position."""
    position.job_id, position.job_name, position.token = cfg.job_id, cfg.job_name, cfg.worker_token
    if resumes_whole(cfg) and cfg.resume_started_from is not None:  # the file's job until the new one trained
        position.keep_job_until_past(cfg.skip_examples)


def _labels_before_training(cfg: TrainConfig, data: DataSource) -> Any:
    """This worker's share's labels, read before any server is touched: ValueError where the validation set has no
    AUC or the one worker's data one class; the warnings of a class another worker may hold, and of a file sorted
    by label."""
    no_auc = validation_auc_undefined(data.validation(), cfg.early_stop_metric)  # a split's examples
    if no_auc:  # (--validation-data was read by check_training)
        raise ValueError(f"{no_auc}; nothing was trained")
    labels = data.labels_before_training()  # a split's read, or the examples held in memory
    one_class = one_class_labels(data.schema.label, labels, cfg.data, cfg.num_workers)  # (held or split)
    if one_class and cfg.num_workers == 1:
        raise ValueError(f"{one_class}; nothing was trained")
    if one_class:  # another worker's share may hold the other label
        log.warning("%s", one_class)
    grouped = sorted_by_label(data.share_labels, cfg.data)
    if grouped and not one_class and not cfg.shuffle:  # shuffled, the file's order does not reach training
        log.warning("%s", grouped)
    return labels


class _Run:
    """train()'s steps on the servers, in its order; each keeps what the later ones read (the tables, the row
    source and the job's stamp, the rows the servers held)."""

    def __init__(self, job: CheckedJob, client: Client, position: PositionWriter | None, labels: Any) -> None:
        self.job, self.cfg, self.data, self.spec = job, job.cfg, job.data, job.spec
        self.client, self.position, self.labels = client, position, labels
        self.tables = job.tables
        self.held, self.alone_so_far = 0, False
        self.shard_stats: list = []  # these five: ready_tables' (held_specs, the row source and the job's stamp)
        self.specs: dict = {}
        self.source, self.trains, self.stamp = None, False, None

    def ready_tables(self) -> None:
        """The servers waited for, the position's state ids checked, and the tables' configs as the shards hold
        them (each described once, for keep_held_initializers and create_tables' check); the row source and the
        job's stamp."""
        cfg, client, spec, position = self.cfg, self.client, self.spec, self.position
        self.shard_stats = client.wait_ready()  # the one Stats round every check before the tables are made reads
        if position is not None:
            check_resumed_model(cfg.resume_file, cfg.resume_state_ids, client, position.run, self.shard_stats)
            position.state_ids = client.state_ids
        features = held_features(client, self.data.schema, [t.name for t in self.tables], self.shard_stats)
        check_not_others_tables(client, spec, features, self.shard_stats)
        tables = [dataclasses.replace(t, features=features) for t in self.tables]
        dense_rows = {dense_table(p): p.shape[0] for p in spec.dense_params()}  # trained whole: its initializer kept
        self.specs = held_specs(client, [t.name for t in tables], self.shard_stats)
        self.tables = keep_held_initializers(tables, dense_rows, self.shard_stats, self.specs, cfg.table_config or "",
                                             initializers_given(cfg))  # fmt: skip
        # the job's stamp goes with the creation of its tables: each shard holds itself for the job from its first
        # table on, and refuses another job's create (ps.engine.tenancy); a run that trains nothing (one that
        # creates the tables only, or only evaluates) holds nothing
        self.source = row_source(cfg, client, spec, self.tables)
        self.trains = not cfg.create_tables_only and not cfg.resume_trained
        self.stamp = self.source.stamp if self.trains else None

    def create_tables(self) -> None:
        """The tables checked and created (with the job's stamp), the position kept just before."""
        cfg, client, position = self.cfg, self.client, self.position
        # one worker replaces tables of other settings that were never trained (a run that stopped first made
        # them); a job's workers do not: one worker's other settings would silently replace the others' tables
        replaced = check_tables(client, self.tables, "nothing was created", replace_untrained=cfg.num_workers == 1,
                                recipe_line=self.job.recipe_line if self.job.recipe_optimizer else "",
                                shard_stats=self.shard_stats, specs=self.specs)  # fmt: skip
        # rows trained before this worker's first push are an earlier run's where no other worker of the job
        # can have pushed yet: one worker, or sync (a step is applied only once every worker has sent its push)
        self.alone_so_far = cfg.num_workers == 1 or cfg.mode == "sync"
        if self.alone_so_far and not cfg.create_tables_only:
            self.held = sum(t.num_rows for t in sparse_table_stats(client, self.spec, self.shard_stats))
            for warning in missing_shares(self.shard_stats, self.spec, client.servers):
                log.warning("%s", warning)
        if position is not None and self.trains:  # kept before the job holds the shards: a restart after a kill
            position.update(cfg.skip_examples)  # is the same job and process, and pushes on at once
        for i, table in enumerate(self.tables):
            try:
                client.create_table(table, replace_untrained=table.name in replaced, stamp=self.stamp)
            except RamTierTooSmallError as e:
                raise ValueError(too_small_for_the_model(e, len(self.tables) - i - 1)) from None
        if replaced:  # said once done: a shard that holds another job refuses the replace (ps.engine.tenancy)
            log.warning("%s", replaced_warning(replaced))

    def say_start(self) -> None:
        """The job's lines, what the servers hold of the model, the mode, and the logit bias's start."""
        cfg, held = self.cfg, self.held
        if not cfg.launched:  # launch said them once for its job
            for line in job_lines(self.job):
                _say(line, cfg)
        if cfg.skip_examples:
            _say(f"resuming: the first {cfg.skip_examples:,} training examples are read and skipped", cfg)
            if held == 0 and self.alone_so_far:
                log.warning("--skip-examples %d, but the servers hold no trained row of this model: those examples "
                            "will not be trained (is --servers the cluster of the run this resumes?)",
                            cfg.skip_examples)  # fmt: skip
        elif held and cfg.worker_id == 0:  # a sync job's workers all read it: worker 0 says it for the job
            _say(f"the servers hold this model's tables with {held:,} trained rows already: this run trains that "
                 "model further (for a new one, use other servers or start them on new data dirs)", cfg)  # fmt: skip
        if cfg.num_workers > 1 or cfg.mode != "async":
            _say(mode_line(cfg), cfg)
        labels, spec = self.labels, self.spec
        if labels is not None:
            trained = held if cfg.num_workers == 1 else sum(t.num_rows for t in sparse_table_stats(self.client, spec))
            started = start_logit_bias(self.client, spec.dense_params(), labels.positives, labels.examples, trained,
                                       self.stamp)  # fmt: skip
            if started is not None:
                _say(f"logit bias started at {started:.3f}, the log-odds of the "
                     f"{labels.positives / labels.examples:.2%} positives of this worker's share of the data (a new "
                     "model)", cfg)  # fmt: skip

    def before_the_loop(self) -> tuple[Any, Any, Any]:
        """The dense path (its first pull), the validation set (said), and the loop's settings."""
        cfg = self.cfg
        dense = dense_path(cfg, self.client, self.spec, self.source)
        dense.pull()
        validation = self.data.validation()
        if validation:
            named = f" of {cfg.validation_data}" if cfg.validation_data else ""
            held_out = sum(len(b) for b in validation)
            _say(f"validating on {held_out:,} held-out example{'s' * (held_out != 1)}{named}", cfg)
            few = validation_too_small(validation)
            if few:
                log.warning("%s", few)
        return dense, validation, loop_settings(cfg, self.data, self.tables)

    def forget_start(self, e: BaseException) -> None:
        """A start that failed before training: the job abandoned where this run holds it, and the position the
        start wrote forgotten."""
        if self.trains:
            abandon(self.source, e)  # (sync and ssp: the job stops, so that no other worker waits for this one)
        if self.position is not None and self.cfg.resume_started_from is None:  # the file this start wrote: a start
            self.position.forget()  # refused (another job, another process of its worker) records nothing

    def run_loop(self, backend: Any, dense: Any, validation: Any, settings: Any, telemetry: Any) -> LoopResult:
        """run_epochs (or, training over, the final evaluation's start); a stop writes the position and says how
        to resume; the dense path and the telemetry closed."""
        cfg, position, source = self.cfg, self.position, self.source
        loop = LoopResult()
        try:
            if cfg.resume_trained:  # a --resume-file run whose training was over: its final evaluation only
                loop.trained_all = True
                if cfg.resume_best_not_put_back:
                    log.warning("%s", best_not_put_back(cfg))
                if cfg.resume_rejoins:  # the job's other workers, resumed under a new job id, wait for nobody
                    source.finish()
            else:
                run_epochs(self.client, self.spec, backend, dense, self.data.train, settings, validation, telemetry,
                           on_eval=lambda e: _say(format_evaluation(e), cfg), source=source, result=loop,
                           on_pushed=None if position is None else lambda n: position.update(cfg.skip_examples + n))  # fmt: skip
        except BaseException as e:  # run_epochs told the servers this worker stopped (stopping.abandon)
            if position is not None and not cfg.resume_trained:  # (a refused done stamp: the file stays as it was)
                # stopped after its last step (putting the best back, say), every row update pushed: training is
                # over (the MLP's gradients of up to --dense-staleness steps pending then are not pushed: dense.close)
                over = loop.training_over
                try:  # a stop as the best model was put back: the best is gone with this process
                    position.write(cfg.skip_examples + loop.pushed, trained=over,
                                   best_not_put_back=over and loop.restoring_best)  # fmt: skip
                except OSError as failed:  # e is the error to report
                    log.warning("could not write --resume-file %s as the run stopped: %s", cfg.resume_file, failed)
            if isinstance(e, TrainingDataError):
                raise ValueError(stopped_message(e, cfg)) from None
            told = (loop.examples or cfg.skip_examples) and not isinstance(e, ModelStateReplacedError)  # (its
            # servers hold a checkpoint's model now, or none: the position trained into them is not this run's)
            if told and not cfg.launched:  # launch's says it for the job
                print(resume_hint(loop, cfg), file=sys.stderr, flush=True)
            raise
        finally:
            dense.close()
            if telemetry is not None:
                telemetry.close()
        return loop

    def check_trained(self, loop: LoopResult) -> None:
        """The warnings of the labels as they were trained; ValueError where --skip-examples skipped every
        example; the position's record that training is over."""
        cfg, data, position = self.cfg, self.data, self.position
        grouped = sorted_by_label(data.stream_labels, cfg.data, read_as_trained=True)
        if grouped:
            log.warning("%s", grouped)
        one_class = None  # the labels as read while training, where none were known before
        if self.labels is None:
            one_class = one_class_labels(data.schema.label, data.stream_labels, cfg.data, cfg.num_workers)
        if one_class:
            log.warning("%s: the model learned only that rate", one_class)
        # a --resume-file position may be the whole stream (a kill between the last step and the record that
        # training was over): it then trains nothing and evaluates, not an error a restart policy would repeat
        if cfg.skip_examples and not loop.examples and cfg.resume_started_from is None:
            if position is not None:  # the file this start wrote: a refused start records nothing
                position.forget()
            raise ValueError(f"--skip-examples {cfg.skip_examples:,} skips every training example of this worker's "
                             f"{cfg.epochs} epoch{'s' * (cfg.epochs != 1)}: nothing was trained")  # fmt: skip
        if position is not None:  # training is over: a restart trains nothing, and evaluates
            position.write(cfg.skip_examples + loop.examples, trained=True)

    def evaluate_at_end(self, loop: LoopResult, backend: Any, dense: Any, results: dict) -> None:
        """The final dense values, the final evaluation, and the tables' rows, into results."""
        cfg, client, spec = self.cfg, self.client, self.spec
        try:
            final_dense = dense.pull() if cfg.dense == "ps" else dense.values  # the PS path: all workers' updates
            if final_dense:  # the MLP this worker ended with
                results["dense_norm"] = dense_norm(final_dense)
            if cfg.final_eval:
                results.update(final_evaluation(cfg, self.data, client, spec, backend, final_dense))
            else:  # --no-final-eval: ps-worker launch scores the job's model once, after all its workers
                results["final_eval_skipped"] = True
            stats = sparse_table_stats(client, spec)
        except BaseException:  # a Ctrl-C, say: the training is done and kept
            if not cfg.local_shards and not cfg.launched:
                print(f"ps-worker: the run had trained all its {cfg.skip_examples + loop.examples:,} examples when it "
                      "stopped, in its final evaluation: nothing to resume (ps-worker eval scores the model the "
                      "servers hold)", file=sys.stderr, flush=True)  # fmt: skip
            raise
        results["table_rows"] = sum(t.num_rows for t in stats)  # ids with a trained row
        results["pending_ids"] = sum(t.pending_ids for t in stats)  # ids seen but not admitted


def _finish(cfg: TrainConfig, data: DataSource, position: PositionWriter | None, loop: LoopResult,
            results: dict) -> None:  # fmt: skip
    """The bad lines' report and counts, the figures' file, and the position's record that the run ended."""
    for line in data.bad_lines_report():
        log.warning(line)
    results["bad_lines"] = sum(s.bad_lines for _, s in data.read_stats)  # every file's: training, validation, eval
    results["skipped_lines"] = data.skipped_lines()  # the training data's, one pass; never in train_examples
    if cfg.metrics_out:
        config = {**dataclasses.asdict(cfg), "format": data.schema.format}  # a --schema file's, if given
        failed = write_metrics(cfg.metrics_out, {"config": config, **results}, "the run's figures")
        if failed:  # (a full disk): the run's figures are still printed, then the run fails
            results["metrics_error"] = failed
    # the run ended: a restart does nothing (after a failed evaluation or figures' file, it does those again)
    if position is not None and not {"eval_error", "metrics_error"} & results.keys():
        position.write(cfg.skip_examples + loop.examples, finished=True)


def too_small_for_the_model(refused: RamTierTooSmallError, tables_after: int) -> str:
    """A shard's refusal of a table its RAM tier cannot share ("... cannot take table number n ... raise
    --cache-bytes (or --memory-bytes) ...", its fields `tables` = n, `floor_bytes`, the least share of each, and
    `budget`, the flags to raise), with what the whole model needs: the run makes tables_after more tables after
    this one, each with its share."""
    refusal = str(refused)
    if not tables_after:
        return refusal
    if not (refused.tables and refused.floor_bytes and refused.budget):  # a shard that sent no fields
        return f"{refusal}; this run makes {tables_after} more tables after this one, each needing its share too"
    n, floor = refused.tables + tables_after, refused.floor_bytes
    need = exact_bytes(n * floor)
    fits = " and --memory-bytes to fit it" if refused.budget == "cache+memory" else ""
    if refused.budget == "memory":  # the shard's RAM tier is what its --memory-bytes leaves
        change = (f"raise --memory-bytes until it leaves the RAM tier {need} for them all (a server given "
                  f"--cache-bytes {n * floor} with a --memory-bytes too small for it names the least that fits)")  # fmt: skip
    else:
        change = f"raise --cache-bytes to at least {need} for them all{fits}"
        if fits:
            change += " (ps-server names the least --memory-bytes that holds a --cache-bytes)"
    return (f"{refusal}. That counts the tables up to this one; this run makes up to {tables_after} more, {n} in all: "
            f"{change} (more if a later table's rows are wider); the tables made so far stay, and are replaced by a "
            "later run if they differ from its settings")  # fmt: skip


@contextlib.contextmanager
def served_metrics(cfg: TrainConfig) -> Iterator[Any]:
    """The run's TrainTelemetry serving --metrics-port (None without it), closed on the way out: started before
    the servers are asked anything, so a port that cannot be had stops the run before any table is made."""
    if cfg.metrics_port is None:
        yield None
        return
    from worker.telemetry import TrainTelemetry, metrics_url

    telemetry = TrainTelemetry()
    port = telemetry.serve(cfg.metrics_port, cfg.metrics_host)
    print(f"metrics Prometheus on {metrics_url(cfg.metrics_host, port)}", flush=True)  # a line of the run's
    try:
        yield telemetry
    finally:
        telemetry.close()


def final_evaluation(cfg: TrainConfig, data: DataSource, client: Client, spec: ModelSpec, backend: Any,
                     dense_values: dict) -> dict:  # fmt: skip
    """evaluate() on data.eval(), read as it is scored, with its own progress (a large eval file takes minutes) shown
    as training's is: a bar, plain lines, or with --progress-lines PROGRESS lines of scoring (ScoringProgress); a
    malformed line of --eval-data past --max-bad-lines (met only now: check_eval read a larger file's start only)
    gives {"eval_error": what happened} instead: the training's figures are still reported and written, and the
    command then fails (worker/cli_train.py)."""
    progress = None
    if cfg.progress or cfg.progress_lines:
        counted = data.eval_count()  # None: the synthetic eval rows, or no --eval-data
        total = cfg.synthetic_eval_rows if data.synthetic is not None else counted.estimate if counted else 0
        worker = cfg.worker_id if cfg.progress_lines else None
        progress = ScoringProgress(total, True, bool(counted and counted.more), worker) if total else None
    try:
        return evaluate(client, spec, backend, dense_values, data.eval(), progress, cfg.prefetch)
    except PsError:
        raise
    except ValueError as e:
        after = ("ps-worker eval scores the model the servers hold once the file is fixed or --max-bad-lines raised"
                 if cfg.local_shards is None else "the model went with the local shards")  # fmt: skip
        return {"eval_error": f"{e}; in the final evaluation on --eval-data, after training had finished ({after})"}


def _say(line: str, cfg: TrainConfig) -> None:
    """A line of the run's story on stdout (above the progress bar when there is one)."""
    if cfg.progress:
        tqdm.write(line)
    else:
        print(line, flush=True)

"""What ps-worker's commands write, and what they say they did: an existing output is replaced only when asked
(--overwrite) and a refused command changes nothing on disk."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import sys

import numpy as np
import pytest
from tqdm import tqdm

from ps.config import OptimizerConfig, TableConfig
from ps.server import Server
from ps.server_config import ServerConfig
from ps.storage.diskspace import low_bytes
from tests.conftest import exported
from tests.inprocess import InProcessTables
from worker.__main__ import main
from worker.client import Client
from worker.job import loop_settings, open_job
from worker.launch_report import format_summary, merge_metrics
from worker.loop import run_epochs
from worker.synthetic import SyntheticConfig
from worker.synthetic_files import write_synthetic
from worker.train_config import TrainConfig


def worker(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `ps-worker ARGV`, run in this process."""
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def tree(path) -> dict[str, bytes]:
    """{relative path: bytes} of every file under path."""
    out = {}
    for parent, _, files in os.walk(path):
        for name in files:
            full = os.path.join(parent, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


# --- an existing output is kept unless --overwrite -----------------------------------------------------------------


def test_synth_refuses_an_existing_file_and_replaces_it_with_overwrite(tmp_path, capsys):
    out = tmp_path / "data.tsv"
    out.write_text("mine\n")
    code, _, err = worker(["synth", "--out", str(out), "--rows", "10"], capsys)
    assert code == 2 and f"--out {out} exists; nothing was written" in err and "--overwrite" in err, err
    assert out.read_text() == "mine\n"
    code, stdout, err = worker(["synth", "--out", str(out), "--rows", "10", "--overwrite"], capsys)
    assert code == 0 and "wrote rows [0, 10)" in stdout, err
    assert len(out.read_text().splitlines()) == 10


def test_synth_says_the_planted_models_auc_on_the_rows_it_wrote(tmp_path, capsys):
    """The oracle's figures of rows [start, stop), as train reports them for the same synthetic rows."""
    import re

    import numpy as np

    from worker.metrics import auc
    from worker.synthetic import SyntheticConfig, SyntheticData

    code, stdout, err = worker(["synth", "--out", str(tmp_path / "d.tsv"), "--rows", "3000", "--start", "500"], capsys)
    said = re.search(
        r"click rate ([\d.]+)%; the planted model that drew their labels scores AUC ([\d.]+), logloss ", stdout
    )
    assert code == 0 and said, (stdout, err)
    batches = list(SyntheticData(SyntheticConfig(rows=3500)).batches(1000, 500, 3500))
    labels, probs = np.concatenate([b.labels for b in batches]), np.concatenate([b.probs for b in batches])
    assert float(said.group(1)) == round(100 * labels.mean(), 1) and float(said.group(2)) == round(
        auc(labels, probs), 4
    )


def test_synth_of_rows_of_one_label_says_their_auc_is_undefined(tmp_path, capsys):
    """One row holds one label: the planted model's AUC on it is undefined, said as eval says it, not 'nan'."""
    code, stdout, err = worker(["synth", "--out", str(tmp_path / "d.tsv"), "--rows", "1"], capsys)
    assert code == 0 and "scores AUC undefined (its examples hold one label only), logloss " in stdout, (stdout, err)


def test_synth_with_history_checks_its_schema_file_before_writing_the_data(tmp_path, capsys):
    out, schema = tmp_path / "h.csv", tmp_path / "h.csv.schema.toml"
    schema.write_text("# reviewed by hand\n")
    code, _, err = worker(["synth", "--out", str(out), "--rows", "10", "--history", "1"], capsys)
    assert code == 2 and f"the schema beside --out {schema} exists" in err, err
    assert not out.exists() and schema.read_text() == "# reviewed by hand\n"
    code, _, err = worker(["synth", "--out", str(out), "--rows", "10", "--history", "1", "--overwrite"], capsys)
    assert code == 0 and out.exists() and schema.read_text() != "# reviewed by hand\n", err


def test_schema_out_refuses_an_existing_file_and_replaces_it_with_overwrite(tmp_path, capsys):
    data, out = tmp_path / "d.csv", tmp_path / "s.toml"
    data.write_text("label,item\n1,a\n0,b\n")
    out.write_text("# edited by hand\n")
    code, _, err = worker(["schema", "--data", str(data), "--out", str(out)], capsys)
    assert code == 2 and f"--out {out} exists; nothing was written" in err and "--overwrite" in err, err
    assert out.read_text() == "# edited by hand\n"
    code, _, err = worker(["schema", "--data", str(data), "--out", str(out), "--overwrite"], capsys)
    assert code == 0 and "item" in out.read_text(), err


@pytest.mark.parametrize("command", [["export"], ["checkpoint", "save"]])
def test_export_and_checkpoint_refuse_a_non_empty_directory_before_any_server_is_asked(command, tmp_path, capsys):
    target = tmp_path / "out"
    target.mkdir()
    (target / "notes.txt").write_text("mine\n")
    nowhere = ["--servers", "127.0.0.1:1", "--server-timeout", "0", "--timeout-s", "1"]  # old code failed fast
    code, _, err = worker([*command, str(target), *nowhere], capsys)
    name = "OUT" if command == ["export"] else "DIR"
    assert code == 2 and f"{name} {target} is not empty (it holds notes.txt); nothing was written" in err, err
    assert ("--overwrite" in err) == (command == ["export"]), err  # a checkpoint is never written over
    assert tree(target) == {"notes.txt": b"mine\n"}
    if command == ["export"]:  # no export there to write over
        assert "or --overwrite to write beside those files" in err, err
        (target / "export.json").write_text("{}")
        code, _, err = worker([*command, str(target), *nowhere], capsys)
        assert code == 2 and "or --overwrite to write over the export there" in err, err


@pytest.mark.parametrize("holds", ["manifest.json", "CURRENT"])
def test_an_export_into_a_checkpoint_is_refused_for_that_before_any_server_is_asked(holds, tmp_path, capsys):
    """The servers would refuse to save a checkpoint inside one: --overwrite would not help, so it is not offered,
    and it is refused with the same words when given."""
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / holds).write_text("{}")
    nowhere = ["--servers", "127.0.0.1:1", "--server-timeout", "0", "--timeout-s", "1"]
    for overwrite in ([], ["--overwrite"]):
        code, _, err = worker(["export", str(target), *nowhere, *overwrite], capsys)
        assert code == 2 and f"OUT {target} is a checkpoint or a RocksDB directory" in err, err
        assert "--overwrite" not in err and tree(target) == {holds: b"{}"}, err


def test_an_export_of_tables_that_hold_no_row_is_refused(tmp_path, capsys):
    """Tables made but never trained (train --create-tables-only, the wrong --servers) export nothing of use: an
    error, and no OUT; --tables counts the rows of the tables it selects alone."""
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard-0"), port=0, checkpoint_root=str(tmp_path)))
    server.start()
    try:
        address = f"127.0.0.1:{server.port}"
        with Client([address]) as client:
            client.create_table(TableConfig("emb", 2))
            client.create_table(TableConfig("other", 2))
        out = tmp_path / "export"
        code, _, err = worker(["export", str(out), "--servers", address, "--no-progress"], capsys)
        assert code == 2 and "tables emb, other hold no trained row: an export would be empty" in err, err
        assert "--create-tables-only" in err and not out.exists()
        with Client([address]) as client:
            client.push("emb", np.arange(5, dtype=np.uint64), np.ones((5, 2), np.float32))
        code, _, err = worker(["export", str(out), "--servers", address, "--tables", "oth*", "--no-progress"], capsys)
        assert code == 2 and "tables other hold no trained row" in err and not out.exists(), err
        code, _, err = worker(["export", str(out), "--servers", address, "--no-progress"], capsys)
        assert code == 0, err
    finally:
        server.stop(grace_s=1)
    assert json.loads((out / "export.json").read_text())["tables"]["emb"]["rows"] == 5


def test_export_with_overwrite_replaces_an_earlier_export_and_its_kept_checkpoint(tmp_path, capsys):
    server = Server(ServerConfig(data_dir=str(tmp_path / "shard-0"), port=0, checkpoint_root=str(tmp_path)))
    server.start()
    try:
        address = f"127.0.0.1:{server.port}"
        with Client([address]) as client:
            client.create_table(TableConfig("emb", 2, optimizer=OptimizerConfig("sgd", 1.0)))
            client.push("emb", np.arange(5, dtype=np.uint64), np.ones((5, 2), np.float32))
        out = tmp_path / "export"
        export = ["export", str(out), "--servers", address, "--keep-checkpoint"]
        assert worker(export, capsys)[0] == 0
        code, _, err = worker(export, capsys)
        assert code == 2 and "--overwrite" in err, err
        with Client([address]) as client:
            client.push("emb", np.arange(5, 8, dtype=np.uint64), np.ones((3, 2), np.float32))
        (out / "checkpoint").mkdir()  # a folder of the user's, saved there by hand: no export's
        (out / "checkpoint" / "manifest.json").write_text("{}")
        code, _, err = worker([*export, "--overwrite"], capsys)
        assert code == 0, err
        summary = json.loads((out / "export.json").read_text())
        assert summary["checkpoint"] == str(out / summary["dir"] / "checkpoint")
        code, _, err = worker(["export", str(tmp_path / "gone"), "--servers", address], capsys)  # checkpoint deleted
        assert code == 0, err
    finally:
        server.stop(grace_s=1)
    assert len(exported(out, "emb")[0]) == 8 and (out / summary["dir"] / "checkpoint" / "manifest.json").exists()
    # the earlier export's folder gone, with its checkpoint; the user's folder left as it is
    assert sorted(os.listdir(out)) == sorted([summary["dir"], "checkpoint", "export.json"])
    assert (out / "checkpoint" / "manifest.json").read_text() == "{}"
    summary = json.loads((tmp_path / "gone" / "export.json").read_text())
    assert summary["checkpoint"] is None and summary["tables"]["emb"]["rows"] == 8
    assert sorted(os.listdir(tmp_path / "gone")) == sorted([summary["dir"], "export.json"])
    assert sorted(os.listdir(tmp_path / "gone" / summary["dir"])) == ["emb.ids.npy", "emb.rows.npy"]


@pytest.mark.parametrize("command", ["train", "launch"])
def test_help_says_metrics_out_replaces_an_existing_file(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "to this file (replaced if it exists)" in " ".join(capsys.readouterr().out.split())


# --- the progress bar ----------------------------------------------------------------------------------------------


def bar_of_a_run(monkeypatch, cfg: TrainConfig) -> tuple[list[tuple[int, int]], tuple[int, int], int]:
    """(every (count, total) the training bar showed, its (count, total) as it closed, examples trained) of a run
    of cfg's training loop on in-process tables."""
    shown, closed = [], []

    class Recording(tqdm):
        def update(self, n=1):
            super().update(n)
            shown.append((self.n, self.total))

        def close(self):
            if not self.disable and not closed:
                closed.append((self.n, self.total))
            super().close()

    monkeypatch.setattr("ps.progress.tqdm", Recording)  # the bar of the loop's ExamplesProgress
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal's bar (a log file gets lines)
    with InProcessTables(cache_bytes=64 << 20) as tables:
        cfg, data, spec, backend, dense = open_job(cfg, tables)
        result = run_epochs(tables, spec, backend, dense, data.train, loop_settings(cfg, data))
    return shown, closed[0], result.examples


@pytest.mark.parametrize("last_newline, bad_lines", [(False, 0), (True, 3)])
def test_the_training_bar_never_passes_its_total_and_closes_at_the_examples_trained(
    monkeypatch, tmp_path, last_newline, bad_lines
):
    """The bar's total is the data's line count: one short for a file whose last line has no newline, too many
    when lines are malformed."""
    path = tmp_path / "train.tsv"
    write_synthetic(path, SyntheticConfig(rows=600), 0, 600)
    text = path.read_text() + "1\t2\t3\n" * bad_lines
    path.write_text(text if last_newline else text.rstrip("\n"))
    cfg = TrainConfig(local_shards=1, data=str(path), model="lr", recipe="large", batch_size=100, epochs=2,
                      max_bad_lines=bad_lines)  # fmt: skip
    shown, closed, examples = bar_of_a_run(monkeypatch, cfg)
    assert examples == 1200
    assert all(n <= total for n, total in shown), shown
    assert closed == (1200, 1200)


def test_the_bars_figures_are_the_epoch_the_train_logloss_and_the_cache_figures_the_source_has():
    from worker.loop_progress import bar_postfix

    assert bar_postfix(2, 0.51234, {}) == {"epoch": 2, "logloss": "0.5123"}  # a source without a row cache
    cache = {"cache_hit_rate": 0.256, "cache_bytes_saved": 3 << 20, "rows_cached": 7}
    assert bar_postfix(1, 0.5, cache) == {"epoch": 1, "logloss": "0.5000", "hits": "26%", "saved": "3.0 MiB"}


def test_progress_into_a_log_file_is_lines_not_a_bar(monkeypatch, tmp_path, capsys):
    """With stderr not a terminal, a run prints a plain 'progress:' line every PLAIN_EVERY_S (and one at its
    end) instead of a bar's carriage-return redraws."""
    from worker import loop_progress

    monkeypatch.setattr(loop_progress.ProgressLines, "PLAIN_EVERY_S", 0.0)
    path = tmp_path / "train.tsv"
    write_synthetic(path, SyntheticConfig(rows=600), 0, 600)
    cfg = TrainConfig(local_shards=1, data=str(path), model="lr", recipe="large", batch_size=100, epochs=1)
    with InProcessTables(cache_bytes=64 << 20) as tables:
        cfg, data, spec, backend, dense = open_job(cfg, tables)
        run_epochs(tables, spec, backend, dense, data.train, loop_settings(cfg, data))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("progress: ")]
    assert "\r" not in err and len(lines) == 7, err  # 6 steps and the end
    assert lines[-1].startswith("progress: 600 of 600 examples (100%), ") and "train logloss 0." in lines[-1]


def _fake_clock(monkeypatch, *modules) -> list[float]:
    """now: a clock in seconds that only the test moves (now[0] += ...), as each module's time.perf_counter; the
    loop's progress lines printed at every step."""
    import types

    from worker import loop_progress

    now = [0.0]
    clock = types.SimpleNamespace(perf_counter=lambda: now[0])
    for module in modules:
        monkeypatch.setattr(module, "time", clock)
    monkeypatch.setattr(loop_progress.ProgressLines, "PLAIN_EVERY_S", 0.0)
    return now


@contextlib.contextmanager
def _lr_job_of_600_rows(tmp_path, epochs: int):
    """(tables, cfg, data, spec, backend, dense) of an lr job on 600 synthetic rows in batches of 100, nothing
    prefetched, over in-process tables (worker.job.open_job)."""
    path = tmp_path / "train.tsv"
    write_synthetic(path, SyntheticConfig(rows=600), 0, 600)
    cfg = TrainConfig(local_shards=1, data=str(path), model="lr", recipe="large", batch_size=100, epochs=epochs,
                      prefetch=0)  # fmt: skip
    with InProcessTables(cache_bytes=64 << 20) as tables:
        yield (tables, *open_job(cfg, tables))


def test_the_progress_rate_and_step_seconds_leave_out_evaluations_as_the_summarys_rate_does(
    monkeypatch, tmp_path, capsys
):
    """The last progress line's examples/s is the summary's (result.seconds: evaluations left out), not one over
    the time the validation set took too (13,345 against the summary's 14,505 on a run of 8 epochs); and the
    step after an --eval-every evaluation is not timed with it (sparseps_worker_step_seconds). The clock is a
    fake one: reading a batch takes 1 s, each evaluation of the validation set 100 s."""
    import dataclasses

    from worker import loop, loop_progress
    from worker.telemetry import TrainTelemetry

    now = _fake_clock(monkeypatch, loop, loop_progress)
    evaluate = loop.evaluate

    def slow_evaluate(*args, **kwargs):
        now[0] += 100.0
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", slow_evaluate)
    with _lr_job_of_600_rows(tmp_path, epochs=2) as (tables, cfg, data, spec, backend, dense):

        def timed(epoch: int):
            for batch in data.train(epoch):
                now[0] += 1.0
                yield batch

        validation = list(data.train(1))[:1]
        settings = dataclasses.replace(loop_settings(cfg, data), eval_every=3)
        telemetry = TrainTelemetry()
        result = run_epochs(tables, spec, backend, dense, timed, settings, validation, telemetry)
    assert len(result.curve) == 4 and result.examples == 1200 and result.seconds == 12.0  # 4 evaluations left out
    histogram = [telemetry.registry.get_sample_value(f"sparseps_worker_step_seconds_{k}") for k in ("count", "sum")]
    assert histogram == [12, 12.0]  # 12 steps of 1 s: the evaluations after steps 3 and 9 are in none of them
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("progress: ")]
    assert lines[-1].startswith("progress: 1,200 of 1,200 examples (100%), 100 examples/s"), lines
    assert lines[3].startswith("progress: 400 of 1,200 examples (33%), 100 examples/s"), lines  # after one evaluation


def test_a_plain_progress_line_gives_the_rate_since_the_line_before_and_the_time_left_at_it(
    monkeypatch, tmp_path, capsys
):
    """A run that slows down (batches of 100 read in 1 s, then in 4 s from the 4th on) shows it in the rate since
    the line before, where the whole run's rate lags; the time left is at that recent rate, and the last line gives
    none."""
    from worker import loop, loop_progress

    now = _fake_clock(monkeypatch, loop, loop_progress)
    with _lr_job_of_600_rows(tmp_path, epochs=1) as (tables, cfg, data, spec, backend, dense):

        def slowing(epoch: int):
            for k, batch in enumerate(data.train(epoch)):
                now[0] += 1.0 if k < 3 else 4.0
                yield batch

        run_epochs(tables, spec, backend, dense, slowing, loop_settings(cfg, data))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("progress: ")]
    assert lines[0].startswith("progress: 100 of 600 examples (17%), 100 examples/s, train"), lines  # the first
    assert lines[2].startswith("progress: 300 of 600 examples (50%), 100 examples/s (100 over the last 00:01), "
                               "00:03 left, train"), lines  # fmt: skip
    assert lines[4].startswith("progress: 500 of 600 examples (83%), 46 examples/s (25 over the last 00:04), "
                               "00:04 left, train"), lines  # fmt: skip
    assert lines[5].startswith("progress: 600 of 600 examples (100%), 40 examples/s (25 over the last 00:04), "
                               "train"), lines  # fmt: skip  # done: no time left
    assert lines[-1].startswith("progress: 600 of 600 examples (100%), 40 examples/s, train"), lines  # the end's


def test_a_resumed_runs_progress_rate_leaves_out_the_time_it_spent_skipping(monkeypatch, tmp_path, capsys):
    """--skip-examples reads and drops examples before the first step (84 s for 11.8M lines of a 30M-line CSV):
    the progress lines' examples/s is of the examples trained over the time training took, not over that wait
    too (which showed 24 examples/s after the first step). The clock here is a fake one: reading a batch takes 1 s,
    a skipped one 100 s."""
    import dataclasses

    from worker import loop, loop_progress, train_stream

    # the loop's clock and its progress lines', and the skip's
    now = _fake_clock(monkeypatch, loop, loop_progress, train_stream)
    with _lr_job_of_600_rows(tmp_path, epochs=1) as (tables, cfg, data, spec, backend, dense):

        def timed(epoch: int):
            for k, batch in enumerate(data.train(epoch)):
                now[0] += 100.0 if k < 3 else 1.0
                yield batch

        settings = dataclasses.replace(loop_settings(cfg, data), skip_examples=300)
        result = run_epochs(tables, spec, backend, dense, timed, settings)
    assert result.examples == 300 and result.seconds == 2.0  # batches 5 and 6 (the 4th was read by the skip)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("progress: ")]
    assert lines[-1].startswith("progress: 300 of 300 examples (100%), 150 examples/s"), lines


# --- examples trained and lines skipped ----------------------------------------------------------------------------


def test_skipped_lines_are_reported_beside_the_examples_trained_never_counted_as_examples(servers, tmp_path, capsys):
    addresses, _ = servers(1)
    data, metrics = tmp_path / "bad.tsv", tmp_path / "m.json"
    write_synthetic(data, SyntheticConfig(rows=600), 0, 600)
    data.write_text(data.read_text() + "1\t2\t3\n0\nnot a line\n")  # 3 malformed lines: 603 lines, 600 examples
    code, out, err = worker(["train", "--servers", addresses[0], "--data", str(data), "--max-bad-lines", "5",
                             "--model", "lr", "--recipe", "large", "--no-progress", "--metrics-out", str(metrics)],
                            capsys)  # fmt: skip
    assert code == 0, err
    assert "large-data recipe for 603 lines of training data" in out and "603 training examples" not in out, out
    assert "on 600 examples (3 malformed lines skipped per pass) with 1 shard" in out, out
    m = json.loads(metrics.read_text())
    assert (m["train_examples"], m["skipped_lines"]) == (600, 3)


def test_launchs_summary_sums_the_workers_skipped_lines_apart_from_their_examples():
    per_worker = [{"train_examples": 600, "skipped_lines": 2, "train_seconds": 1.0},
                  {"train_examples": 500, "skipped_lines": 1, "train_seconds": 2.0}]  # fmt: skip
    merged = merge_metrics(per_worker, ["numpy", "numpy"], "async", {}, 1)
    assert (merged["train_examples"], merged["skipped_lines"]) == (1100, 3)
    assert "on 1 shard: 1,100 examples (3 malformed lines skipped per pass) in 2.0 s" in format_summary(merged)
    clean = merge_metrics([{"train_examples": 600, "train_seconds": 1.0}], ["numpy"], "async", {}, 1)
    assert "on 1 shard: 600 examples in 1.0 s" in format_summary(clean)


def test_a_workers_figures_say_what_its_evaluations_are_of():
    from worker.results import format_results

    one = {"model": "fm", "backend": "numpy", "device": "cpu", "worker": "0/1", "shards": 1, "train_examples": 10,
           "train_seconds": 1.0, "examples_per_s": 10.0, "eval_auc": 0.7, "eval_logloss": 0.5, "eval_examples": 5,
           "best_validation_auc": 0.71, "best_validation_logloss": 0.49, "best_epoch": 20, "epochs_run": 20,
           "stopped_early": False, "model_is_best": True, "curve": [{"best": False}, {"best": True}]}  # fmt: skip
    text = format_results(one)
    assert "(5 examples)\n" in text and "the model kept is this best one" in text
    assert "the last epoch was the best: validation logloss was still improving, so a larger --epochs" in text
    assert "weaker" not in text  # the run's tables have no l2 to weaken
    assert "still improving" not in format_results({**one, "curve": [{"best": True}, {"best": False}]})
    job = format_results({**one, "worker": "1/2", "model_is_best": False})
    assert "(5 examples; the model as this worker finished, which others may have trained since: ps-worker eval" in job
    assert "this worker's evaluations; the servers keep the job's model, which every worker trains" in job
    limited = format_results({**one, "max_examples": 10, "stopped_at_max_examples": True})
    assert "on 10 examples (stopped at --max-examples 10) with 1 shard" in limited
    assert "at epoch 20 (stopped at --max-examples; the model kept" in limited and "still improving" not in limited


def test_the_mode_line_names_the_mlp_path_only_for_models_with_an_mlp():
    from worker.train_messages import mode_line

    assert mode_line(TrainConfig(mode="sync", num_workers=2, model="deepfm")).endswith(
        "; MLP on the servers, in the step"
    )
    assert "MLP" not in mode_line(TrainConfig(mode="sync", num_workers=2, model="fm"))


def test_the_mode_line_gives_the_row_cache_in_the_unit_that_reads_it():
    from worker.train_messages import mode_line

    assert ", row cache 64.0 MiB" in mode_line(TrainConfig(mode="ssp", num_workers=2, row_cache_bytes=64 << 20))
    assert ", row cache 3.00 GiB" in mode_line(TrainConfig(mode="ssp", num_workers=2, row_cache_bytes=3 << 30))


def test_stats_json_has_every_field_as_a_number_and_the_text_names_each_shards_data_dir(servers, capsys):
    addresses, shards = servers(2)
    with Client(addresses) as client:
        client.create_table(TableConfig("t", 2))
        client.push("t", np.arange(1000, dtype=np.uint64), np.ones((1000, 2), np.float32))
    code, out, err = worker(["stats", "--servers", ",".join(addresses), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["warnings"] == [] and report["notes"] == []
    figures = report["shards"]
    [[first], [second]] = [s["tables"] for s in figures]
    assert first["num_rows"] + second["num_rows"] == 1000 and isinstance(first["num_rows"], int)
    assert first["pending_ids"] == 0 and figures[0]["shard_id"] == 0 and figures[1]["shard_id"] == 1  # zeros too
    for s in figures:  # the disk: the data dir's bytes, the file system's free and total bytes
        assert isinstance(s["data_dir_bytes"], int) and s["data_dir_bytes"] > 0
        assert isinstance(s["disk_total_bytes"], int) and 0 < s["disk_free_bytes"] <= s["disk_total_bytes"]
    code, out, err = worker(["stats", "--servers", ",".join(addresses)], capsys)
    for i, shard in enumerate(shards):
        assert f"{i:>5} data dir {shard.config.data_dir}, up " in out, out
        [memory] = re.findall(rf"^{i:>5} memory \(no --memory-bytes\): block cache .*$", out, re.MULTILINE)
        assert "journal map" in memory and "room for requests" not in memory, memory  # no room kept without a bound
        size = r"([\d,.]+ (?:B|KiB|MiB|GiB))"
        low = low_bytes(figures[i]["disk_total_bytes"], figures[i]["data_dir_bytes"])  # a host's disk may be low
        mark = ", LOW: below .*, pushes fail once full" if figures[i]["disk_free_bytes"] < low else ""
        [disk] = re.findall(rf"^{i:>5} disk: data dir {size}, free {size} of {size} \(([\d.]+)%\){mark}$", out,
                            re.MULTILINE)  # fmt: skip
        used, free, total = (_bytes_of(x) for x in disk[:3])
        assert used > 0 and abs(used - figures[i]["data_dir_bytes"]) < 8 << 20, (disk, figures[i])
        assert abs(total - figures[i]["disk_total_bytes"]) <= 0.01 * total and 0 < free <= total
        assert abs(float(disk[3]) - 100 * free / total) < 0.2
    assert "cache_misses" in out and "pulls (lookups: pulls and pushes that return rows)" in out


def _bytes_of(text: str) -> float:
    """'12.5 MiB' -> its bytes (as ps.bytesize.human_bytes writes them)."""
    number, unit = text.split()
    return float(number.replace(",", "")) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[unit]


def test_stats_notes_shards_whose_clocks_differ(servers, capsys):
    """Each training step advances every shard's clock: clocks that differ are noted (a shard on an older copy of
    its data dir, a worker stopped mid-step), equal ones are not."""
    addresses, _ = servers(2)
    with Client(addresses) as client:
        client.advance_clock(3)
        code, out, err = worker(["stats", "--servers", ",".join(addresses)], capsys)
        assert code == 0 and "clocks differ" not in err, err
    with Client(addresses[1:]) as shard_1_alone:  # as a worker that stopped after advancing one shard
        shard_1_alone.advance_clock(5)
    code, out, err = worker(["stats", "--servers", ",".join(addresses)], capsys)
    assert code == 0, err
    assert "note: the shards' clocks differ (shard 0 at 3, shard 1 at 8)" in err, err
    code, out, err = worker(["stats", "--servers", ",".join(addresses), "--json"], capsys)
    (note,) = json.loads(out)["notes"]
    assert code == 0 and note.startswith("the shards' clocks differ (shard 0 at 3, shard 1 at 8)"), out


def test_stats_gives_a_small_disk_in_units_that_show_it(servers, capsys, monkeypatch):
    """A 3 MiB volume reads as MiB, not '0.00 of 0.00 GiB'."""
    from ps.storage.diskspace import low_bytes

    addresses, _ = servers(1)
    real = Client.stats

    def stats(self):
        shards = real(self)
        for s in shards:
            s.disk_total_bytes, s.data_dir_bytes, s.disk_free_bytes = 3 * 2**20, 2**20, 100 * 2**10
        return shards

    monkeypatch.setattr(Client, "stats", stats)
    code, out, err = worker(["stats", "--servers", addresses[0]], capsys)
    [line] = [x for x in out.splitlines() if x.startswith("    0 disk: ")]
    low = low_bytes(3 * 2**20, 2**20)
    assert line.startswith("    0 disk: data dir 1.0 MiB, free 100.0 KiB of 3.0 MiB (3.3%)"), line
    assert ("LOW" in line) == (low > 100 * 2**10), (line, low)


@pytest.mark.parametrize(
    ("total", "data_dir", "free", "line"),
    [  # a shard's disk of ps-server size's trillion-parameter figures (docs/capacity.md: 1.2 TiB a server)
        (8 * 2**40, 2**40 + 5, 3 * 2**40, "data dir 1.00 TiB, free 3.00 TiB of 8.00 TiB (37.5%)"),
        (2 * 2**40, 999 * 2**30, 2**40, "data dir 999.00 GiB, free 1.00 TiB of 2.00 TiB (50.0%)"),
        (2**40, 1000 * 2**20 - 1, 1000 * 2**10 - 1, "data dir 0.98 GiB, free 1.0 MiB of 1.00 TiB (0.0%)"),
    ],
)
def test_stats_gives_a_large_disk_in_tib_and_no_figure_as_1000_of_a_unit(total, data_dir, free, line, servers, capsys,
                                                                         monkeypatch):  # fmt: skip
    """A disk of terabytes reads in TiB, as ps-server size gives a server's disk, not '8,192.00 GiB'; a figure
    that rounds to 1,000 of a unit reads in the next one."""
    addresses, _ = servers(1)
    real = Client.stats

    def stats(self):
        shards = real(self)
        for s in shards:
            s.disk_total_bytes, s.data_dir_bytes, s.disk_free_bytes = total, data_dir, free
        return shards

    monkeypatch.setattr(Client, "stats", stats)
    code, out, err = worker(["stats", "--servers", addresses[0]], capsys)
    assert code == 0, err
    [disk] = [x for x in out.splitlines() if x.startswith("    0 disk: ")]
    assert disk.startswith(f"    0 disk: {line}"), disk


def test_stats_warns_of_a_shard_whose_background_flushes_are_failing(servers, capsys):
    """Stats carries each shard's background flushes failed in a row: ps-worker stats names such a shard with its
    journal and exits 1 (--json: among the warnings), and says nothing of a shard whose flushes succeed."""
    addresses, shards = servers(2)
    code, out, err = worker(["stats", "--servers", ",".join(addresses)], capsys)
    assert code == 0 and "flushes" not in err, err
    shards[1].shard.flusher.failures = 7  # as the flusher counts them (ps.engine.flusher)
    try:
        code, out, err = worker(["stats", "--servers", ",".join(addresses)], capsys)
        assert code == 1, err
        assert "warning: background flushes to RocksDB are failing on shard 1 (7 in a row; journal " in err, err
        assert "shard 0" not in err, err
        code, out, err = worker(["stats", "--servers", ",".join(addresses), "--json"], capsys)
        report = json.loads(out)
        assert code == 1 and [s["flush_failures"] for s in report["shards"]] == [0, 7], report["shards"]
        (warning,) = report["warnings"]
        assert warning.startswith("background flushes to RocksDB are failing on shard 1 (7 in a row"), warning
    finally:
        shards[1].shard.flusher.failures = 0


def test_stats_stands_each_figure_of_a_large_shard_under_its_columns_name(servers, capsys, monkeypatch):
    """A trillion-scale shard's figures (64 GiB of rows in RAM: 68,719,476,736) are wider than 12 characters: the
    column widens to its widest figure, so each figure still ends where its name does, on every table's line."""
    addresses, _ = servers(2)
    with Client(addresses) as client:
        client.create_table(TableConfig("t", 2))
        client.push("t", np.arange(100, dtype=np.uint64), np.ones((100, 2), np.float32))
    real = Client.stats
    big = {"num_rows": 250_000_000_000, "ram_bytes": 64 * 2**30, "disk_bytes": 43_500_000_000_000, "pulls": 10**10}

    def stats(self):
        shards = real(self)
        for name, value in big.items():
            setattr(shards[1].tables[0], name, value)  # shard 0's figures stay small
        return shards

    monkeypatch.setattr(Client, "stats", stats)
    code, out, err = worker(["stats", "--servers", ",".join(addresses)], capsys)
    assert code == 0, err
    header, *lines = out.splitlines()
    names = {m.group(): m.end() for m in re.finditer(r"\S+", header)}
    table_lines = [x for x in lines if x.split()[1:2] == ["t"]]
    assert len(table_lines) == 2, out
    for line in table_lines:
        figures = list(re.finditer(r"\S+", line))[2:]  # after the shard and the table's name
        assert [m.end() for m in figures] == list(names.values())[2:], (header, line)
    figures = dict(zip(list(names)[2:], (int(x.replace(",", "")) for x in table_lines[1].split()[2:]), strict=True))
    assert {name: figures[name] for name in big} == big, figures


@pytest.mark.parametrize("low", [True, False])
def test_stats_marks_a_shards_disk_low_below_the_servers_threshold(low, servers, capsys, monkeypatch):
    """The disk: line ends with LOW (and --json's disk_low is 1) when free space is under
    ps.storage.diskspace.low_bytes of the shard's figures; a real test machine's disk is faked to be low."""
    from ps.storage.diskspace import low_bytes

    addresses, _ = servers(1)
    real = Client.stats

    def stats(self):
        shards = real(self)
        for s in shards:
            s.disk_total_bytes, s.data_dir_bytes = 100 * 2**30, 2**20
            s.disk_free_bytes = low_bytes(s.disk_total_bytes, s.data_dir_bytes) + (-1 if low else 1)
        return shards

    monkeypatch.setattr(Client, "stats", stats)
    code, out, err = worker(["stats", "--servers", addresses[0]], capsys)
    assert code == 0, err
    [line] = [x for x in out.splitlines() if x.startswith("    0 disk: ")]
    assert line.endswith("GiB (5.0%), LOW: below 5.00 GiB, pushes fail once full") == low, line
    assert "free 5.00 GiB of 100.00 GiB" in line, line
    assert ("LOW" in line) == low, line
    code, out, err = worker(["stats", "--servers", addresses[0], "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["shards"][0]["disk_low"] == int(low)


def test_an_export_whose_ps_server_export_is_killed_names_the_signal_and_leaves_out_as_it_was(
    tmp_path, capsys, monkeypatch
):
    """A `ps-server export` killed by a signal (the OOM killer's SIGKILL) ends ps-worker export with a line naming
    it and 128 + its number, as a shell reports such a death (not the child's raw returncode, -9); OUT holds the
    earlier export alone, and an OUT the export made is gone."""
    from worker import export as worker_export

    server = Server(ServerConfig(data_dir=str(tmp_path / "shard-0"), port=0, checkpoint_root=str(tmp_path)))
    server.start()
    real = worker_export._run_server_export

    def killed(command, claim):  # in place of ps-server export: a child that dies of SIGKILL
        return real([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], claim)

    try:
        address = f"127.0.0.1:{server.port}"
        with Client([address]) as client:
            client.create_table(TableConfig("emb", 2))
            client.push("emb", np.arange(5, dtype=np.uint64), np.ones((5, 2), np.float32))
        out = tmp_path / "export"
        assert worker(["export", str(out), "--servers", address, "--no-progress"], capsys)[0] == 0
        before = tree(out)
        monkeypatch.setattr(worker_export, "_run_server_export", killed)
        code, _, err = worker(["export", str(out), "--servers", address, "--overwrite", "--no-progress"], capsys)
        new_code, _, new_err = worker(["export", str(tmp_path / "new"), "--servers", address, "--no-progress"], capsys)
    finally:
        server.stop(grace_s=1)
    assert code == new_code == 128 + signal.SIGKILL, (err, new_err)
    said = "ps-worker: error: `ps-server export` was killed by SIGKILL before it finished: nothing was exported"
    assert said in err and said in new_err, (err, new_err)
    assert tree(out) == before and not (tmp_path / "new").exists()  # no checkpoint.new-... left in either


# in place of ps-server export: one that writes a file into its folder of OUT, then waits; its stop (SIGTERM)
# removes the folder, as ps-server export's does (ps.engine.export: what it made is undone)
STOPPABLE_EXPORT = """
import os, shutil, signal, sys, time
folder = os.path.join(sys.argv[sys.argv.index("--out") + 1], "export-0123abcd")

def stop(*_):
    shutil.rmtree(folder)
    sys.exit(143)

signal.signal(signal.SIGTERM, stop)
os.mkdir(folder + ".tmp")
with open(os.path.join(folder + ".tmp", "emb.rows.npy"), "wb") as f:
    f.write(bytes(4096))
os.rename(folder + ".tmp", folder)
time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_export_stopped_while_ps_server_export_writes_lets_it_remove_its_files_and_removes_the_out_it_made(
    tmp_path, capsys, monkeypatch, sig
):
    """A SIGTERM (or Ctrl-C) of ps-worker export while its ps-server export writes: the child is told (SIGTERM)
    and waited for, so its stop removes the files it wrote, and the export then removes the OUT it made, as its
    docstring says a failure does; not killed with its files left in an OUT that stays."""
    import functools
    import threading

    from ps.terminate import sigterm_raises
    from tests.waiting import wait_until
    from worker import __main__ as worker_main
    from worker import export as worker_export

    server = Server(ServerConfig(data_dir=str(tmp_path / "shard-0"), port=0, checkpoint_root=str(tmp_path)))
    server.start()
    real_command, out = worker_export._server_export_command, tmp_path / "export"
    monkeypatch.setattr(worker_export, "_server_export_command", lambda *args: [
        sys.executable, "-c", STOPPABLE_EXPORT, *real_command(*args)[3:]])  # fmt: skip
    # no watchdog ending this test process after the signal (ps.terminate's cleanup limit)
    monkeypatch.setattr(worker_main, "sigterm_raises", functools.partial(sigterm_raises, cleanup_limit_s=None))
    main_thread = threading.main_thread().ident

    def stop_when_written() -> None:
        wait_until(lambda: (out / "export-0123abcd").exists(), 60, "the child's file in OUT")
        signal.pthread_kill(main_thread, sig)

    stopper = threading.Thread(target=stop_when_written, daemon=True)
    try:
        address = f"127.0.0.1:{server.port}"
        with Client([address]) as client:
            client.create_table(TableConfig("emb", 2))
            client.push("emb", np.arange(5, dtype=np.uint64), np.ones((5, 2), np.float32))
        stopper.start()
        code, _, err = worker(["export", str(out), "--servers", address, "--no-progress"], capsys)
    finally:
        stopper.join(60)
        server.stop(grace_s=1)
    assert code == 128 + sig and ("terminated" if sig == signal.SIGTERM else "interrupted") in err, err
    assert not out.exists(), sorted(str(p.relative_to(tmp_path)) for p in out.rglob("*"))


def test_an_export_interrupted_while_the_servers_save_leaves_no_checkpoint_written_again_into_out(
    tmp_path, monkeypatch
):
    """Ctrl-C while the shard writes ps-worker export's fresh checkpoint: the export ends, removing the checkpoint and
    the OUT it made under the shard's write, which fails. The shard, whose caller has gone, writes nothing: OUT
    stays gone, not made again after the export ended with a whole checkpoint of the shard in it, named by
    nothing (as a save whose directory another shard's failed save removed is written again)."""
    import subprocess
    import threading

    from ps import service
    from tests.waiting import wait_until

    server = Server(ServerConfig(data_dir=str(tmp_path / "shard-0"), port=0, checkpoint_root=str(tmp_path)))
    server.start()
    callers, real_caller = [], service.CallerGone
    monkeypatch.setattr(service, "CallerGone", lambda context: callers.append(real_caller(context)) or callers[-1])
    real_write, writes, started = server.shard.checkpoints.write, [], threading.Event()
    export: list[subprocess.Popen] = []

    def write(path: str, caller_gone=None) -> dict:  # the shard's write, with Ctrl-C pressed as it begins
        writes.append(path)
        if len(writes) == 1:
            wait_until(started.is_set, 60, "ps-worker export to start")
            os.killpg(export[0].pid, signal.SIGINT)
            wait_until(lambda: export[0].poll() is not None, 60, "ps-worker export to end")
            wait_until(lambda: callers[-1](), 30, "the server to see the caller of the save gone")
        return real_write(path, caller_gone)  # its caller gone: fails, writing nothing

    server.shard.checkpoints.write = write
    out = tmp_path / "export"
    try:
        address = f"127.0.0.1:{server.port}"
        with Client([address]) as client:
            client.create_table(TableConfig("emb", 2))
            client.push("emb", np.arange(5, dtype=np.uint64), np.ones((5, 2), np.float32))
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        export.append(subprocess.Popen([sys.executable, "-m", "worker", "export", str(out), "--servers", address,
                                        "--no-progress"], cwd=root, start_new_session=True, stderr=subprocess.PIPE,
                                       text=True))  # fmt: skip
        started.set()
        _, err = export[0].communicate(timeout=120)
        wait_until(lambda: writes and not server.shard.checkpoints.gate.save_running, 60, "the shard's save to end")
    finally:
        server.stop(grace_s=1)
    assert export[0].returncode == 130 and "ps-worker: interrupted" in err, err
    assert not out.exists(), sorted(str(p.relative_to(tmp_path)) for p in out.rglob("*"))
    assert len(writes) == 1


def test_a_server_export_that_does_not_stop_is_killed_in_time_for_the_exports_own_undo(tmp_path, monkeypatch, capsys):
    """A Ctrl-C reaches ps-worker export while its `ps-server export` runs, and that child's stop hangs: it is
    waited for CHILD_STOP_S, then killed, and the interrupt goes on to the export's own undo, inside the process's
    CLEANUP_LIMIT_S (UNDO_S of it left), not cut short by it."""
    import subprocess
    import threading

    from ps.terminate import CLEANUP_LIMIT_S
    from tests.waiting import wait_until
    from worker import export as worker_export

    assert worker_export.CHILD_STOP_S + worker_export.UNDO_S == CLEANUP_LIMIT_S and worker_export.UNDO_S > 0
    monkeypatch.setattr(worker_export, "CHILD_STOP_S", 0.5)
    children, ready = [], tmp_path / "ready"

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            children.append(self)

    monkeypatch.setattr(worker_export.subprocess, "Popen", Recorded)
    hangs = [sys.executable, "-c", "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)", str(ready)]  # fmt: skip

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    def ctrl_c_once_it_runs() -> None:
        wait_until(ready.exists, 60, "the child to start")
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    thread = threading.Thread(target=ctrl_c_once_it_runs)
    try:
        thread.start()
        with pytest.raises(KeyboardInterrupt):
            worker_export._run_server_export(hangs, None)
    finally:
        thread.join(60)
        signal.signal(signal.SIGUSR1, previous)
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert len(children) == 1 and children[0].returncode == -signal.SIGKILL
    assert "`ps-server export` did not stop within 0.5 s of its SIGTERM: killed" in capsys.readouterr().err


@pytest.mark.parametrize("no_progress", [False, True])
def test_export_passes_no_progress_to_ps_server_export(no_progress, tmp_path, capsys, monkeypatch):
    from worker import export as worker_export

    server = Server(ServerConfig(data_dir=str(tmp_path / "shard-0"), port=0, checkpoint_root=str(tmp_path)))
    server.start()
    commands = []
    real = worker_export._run_server_export

    def run(command, claim):
        commands.append(command)
        return real(command, claim)

    monkeypatch.setattr(worker_export, "_run_server_export", run)
    try:
        address = f"127.0.0.1:{server.port}"
        with Client([address]) as client:
            client.create_table(TableConfig("emb", 2))
            client.push("emb", np.arange(5, dtype=np.uint64), np.ones((5, 2), np.float32))
        flag = ["--no-progress"] if no_progress else []
        code, _, err = worker(["export", str(tmp_path / "out"), "--servers", address, *flag], capsys)
    finally:
        server.stop(grace_s=1)
    assert code == 0, err
    [command] = commands
    assert command[1:4] == ["-m", "ps", "export"] and ("--no-progress" in command) == no_progress, command


# --- a full disk under an output: named by its flag, and nothing half written left ---------------------------------


def test_synth_into_a_full_disk_names_out_and_leaves_no_part_of_the_file(tmp_path, capsys, monkeypatch):
    """The rows go to a hidden temporary file renamed once whole: a part of them left at --out would read as a
    complete data file of fewer rows (or end in a cut line)."""
    import errno

    from worker import synthetic_files

    real = synthetic_files.format_criteo
    calls = [0]

    def full_after_one_chunk(*a):
        calls[0] += 1
        if calls[0] > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*a)

    monkeypatch.setattr(synthetic_files, "format_criteo", full_after_one_chunk)
    out = tmp_path / "data.tsv"
    code, _, err = worker(["synth", "--out", str(out), "--rows", "200000"], capsys)
    assert code == 2 and f"--out {out}: could not write it (No space left on device); nothing was written" in err, err
    assert os.listdir(tmp_path) == []
    out.write_text("mine\n")
    code, _, err = worker(["synth", "--out", str(out), "--rows", "200000", "--overwrite"], capsys)
    assert code == 2 and out.read_text() == "mine\n" and os.listdir(tmp_path) == ["data.tsv"]


def test_predict_and_the_resume_file_into_a_full_disk_name_their_flag(tmp_path, monkeypatch):
    """Not '[Errno 28] No space left on device' alone, nor the name of a temporary file."""
    import errno

    from worker import predict
    from worker.resume_writer import PositionWriter
    from worker.scoring import ScoringProgress

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(predict, "_write_rows", full)
    out = tmp_path / "scores.csv"
    with pytest.raises(OSError, match=rf"^--out {out}: could not write the predictions \(No space left on device\)"):
        predict._write(str(out), [], predict._Columns(False, False, ()), ScoringProgress(0, False), False)
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr("worker.resume_writer.write_json_whole", full)
    position = tmp_path / "position.json"
    writer = PositionWriter(TrainConfig(servers=("h:1",), resume_file=str(position)))
    with pytest.raises(OSError, match=rf"^could not write --resume-file {position} \(No space left on device\)$"):
        writer.write(10)


def test_predict_whose_out_folder_goes_or_name_is_too_long_names_its_flag(tmp_path, files):
    """Out's folder removed while the rows are written: not '[Errno 2] No such file or directory' naming the
    temporary file; a name longer than the file system takes: refused up front."""
    from worker import predict
    from worker.flags import check_output_file
    from worker.formats import read_batches
    from worker.schema_builtin import builtin_schema
    from worker.scoring import ScoringProgress

    (batch,) = read_batches(files[1], builtin_schema("criteo", default_table="fm", default_dim=8), 1000)
    folder = tmp_path / "gone"
    folder.mkdir()
    out = folder / "scores.csv"

    def scored():
        shutil.rmtree(folder)  # the rows go on into the open file; its rename finds no folder
        yield files[1], batch, np.full(len(batch), 0.5, np.float32), [""] * len(batch)

    said = rf"^--out {out}: could not write the predictions \(No such file or directory\); nothing was written there$"
    with pytest.raises(OSError, match=said):
        predict._write(str(out), scored(), predict._Columns(False, False, ()), ScoringProgress(0, False), False)
    assert not folder.exists() and sorted(os.listdir(tmp_path)) == ["test.tsv", "train.tsv"]
    long = tmp_path / ("x" * 256)  # refused before anything is scored, not at the rename
    with pytest.raises(ValueError, match=rf"^--out {long}: its name is 256 bytes long; the file system of "):
        check_output_file("--out", str(long))


@pytest.mark.parametrize("overwrite", [False, True])
def test_predicts_out_is_fsynced_before_it_takes_its_name_and_its_folder_after(tmp_path, files, monkeypatch, overwrite):
    """OUT appears whole or not at all after a power loss too: the temporary file's rows are on disk before it is
    linked or renamed as OUT (else a crash can leave an OUT cut short, or empty, that reads as a whole output),
    and OUT's folder is synced after, so the new name stays."""
    from tests.test_restore_tables import recorded_syncs
    from worker import predict
    from worker.formats import read_batches
    from worker.schema_builtin import builtin_schema
    from worker.scoring import ScoringProgress

    (batch,) = read_batches(files[1], builtin_schema("criteo", default_table="fm", default_dim=8), 1000)
    out = tmp_path / "scores.csv"
    if overwrite:
        out.write_text("earlier\n")
    events = recorded_syncs(monkeypatch)
    link = os.link
    monkeypatch.setattr(os, "link", lambda src, dst: (link(src, dst), events.append(
        ("replace", os.path.realpath(src), os.path.realpath(dst))))[0])  # fmt: skip
    scored = [(files[1], batch, np.full(len(batch), 0.5, np.float32), [""] * len(batch))]
    rows = predict._write(str(out), scored, predict._Columns(True, False, ()), ScoringProgress(0, False), overwrite)
    assert rows == len(batch) and out.read_text().count("\n") == len(batch) + 1
    (named,) = [e for e in events if e[0] == "replace" and e[2] == os.path.realpath(out)]
    at = events.index(named)
    assert ("fsync", named[1]) in events[:at], f"the rows were not fsynced before the file became --out: {events}"
    assert ("fsync", str(tmp_path)) in events[at + 1 :], f"--out's folder was not fsynced after: {events}"


def test_predict_to_a_full_stdout_names_its_flag(files, monkeypatch):
    """--out - to a full disk (> /dev/full): not '[Errno 28] No space left on device' alone."""
    import errno
    import io

    from worker import predict
    from worker.formats import read_batches
    from worker.schema_builtin import builtin_schema
    from worker.scoring import ScoringProgress

    class Full(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, b) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(Full())))
    (batch,) = read_batches(files[1], builtin_schema("criteo", default_table="fm", default_dim=8), 1000)
    scored = [(files[1], batch, np.full(len(batch), 0.5, np.float32), [""] * len(batch))]
    with pytest.raises(
        OSError, match=r"^--out -: could not write the predictions to stdout \(No space left on device\)$"
    ):
        predict._write_stdout(scored, predict._Columns(True, False, ()), ScoringProgress(0, False))


@pytest.mark.parametrize("value", ["nan", "inf", "1e308"])
def test_synth_refuses_interactions_that_are_no_strength_before_writing(tmp_path, capsys, value):
    """NaN or an overflowing strength drew NaN scores: the run wrote its rows, then failed with 'scores contain
    NaN', naming no flag."""
    out = tmp_path / "data.tsv"
    with pytest.raises(SystemExit) as stop:
        main(["synth", "--out", str(out), "--rows", "100", "--interactions", value])
    err = capsys.readouterr().err
    assert (
        stop.value.code == 2
        and f"argument --interactions: expected a number >= -1000 and <= 1000, got '{value}'" in err
    )
    assert not out.exists()
    with pytest.raises(SystemExit):
        main(["train", "--local-shards", "1", "--synthetic-interactions", value])
    assert "argument --synthetic-interactions: expected a number" in capsys.readouterr().err


def test_a_synthetic_seed_out_of_range_names_its_flag(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--local-shards", "1", "--synthetic-seed", "-1"])
    assert "argument --synthetic-seed: expected an integer in 0..9223372036854775807, got -1" in capsys.readouterr().err


def test_synth_whose_schema_meets_a_full_disk_names_it_and_leaves_no_part_of_it(tmp_path, capsys, monkeypatch):
    """The schema beside --out (--history) is written whole or not at all, as --out is, and its error names it."""
    import errno

    from ps.storage import atomicfile

    real = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomicfile.os, "fsync", full)
    out = tmp_path / "data.csv"
    code, _, err = worker(["synth", "--out", str(out), "--rows", "50", "--history", "3"], capsys)
    monkeypatch.setattr(atomicfile.os, "fsync", real)
    assert code == 2, err
    assert f"the schema beside --out, {out}.schema.toml: could not write it (No space left on device)" in err, err
    assert sorted(os.listdir(tmp_path)) == ["data.csv"]  # the rows, and no part of a schema


def test_a_csv_run_says_how_it_reads_each_column(tmp_path, capsys):
    """The columns line: the label and where it came from, the fields by kind (a schema's twins apart), and the
    header's columns no field reads; the built-in schema (every other column categorical) and a schema file."""
    rng = np.random.default_rng(0)
    rows = [f"{u},{c},s{rng.integers(5)},{rng.random() * 100:.2f},{rng.integers(30)}"
            for u, c in zip(rng.permutation(400), rng.integers(0, 2, 400))]  # fmt: skip
    data = tmp_path / "d.csv"
    data.write_text("row_id,click,site,price,hour\n" + "\n".join(rows) + "\n")
    run = ["train", "--local-shards", "1", "--data", str(data), "--model", "lr", "--epochs", "1", "--no-progress"]
    code, out, err = worker([*run, "--format", "csv", "--label-column", "click", "--drop-columns", "row_id"], capsys)
    assert code == 0, err
    assert ("columns  label 'click' (--label-column); 3 categorical, each value an id: site, price, hour; not read: "
            "row_id\n") in out  # fmt: skip
    schema = tmp_path / "s.toml"
    schema.write_text('format = "csv"\nlabel = "click"\n[[columns]]\nname = "site"\nkind = "categorical"\n'
                      '[[columns]]\nname = "price"\nkind = "numeric"\ntransform = "log"\n'
                      '[[columns]]\nname = "price_b"\nsource = "price"\nkind = "numeric"\ntransform = "bucketize"\n'
                      "boundaries = [10.0, 50.0]\n")  # fmt: skip
    code, out, err = worker([*run, "--schema", str(schema)], capsys)
    assert code == 0, err
    assert ("columns  label 'click' (the schema's `label`); 1 categorical, each value an id: site; 1 numeric (log): "
            "price; 1 bucketized (bucketize): price_b; not read: row_id, hour\n") in out  # fmt: skip


@pytest.mark.parametrize("job_name", ["", "ctr-7"])
def test_stats_text_gives_each_shards_job_as_its_json_does(servers, capsys, job_name):
    """The job fields of Stats (the job a shard follows, its name, its workers, the slowest one's clock, the largest
    gap a stamped pull was served at) are a line of the text as they are fields of --json: none on a fresh shard;
    here an ssp job of 2 workers, worker 0 past 2 steps and worker 1 past 1, and worker 0's pull of step 2 served 1
    step ahead of the slowest clock. The text names the job by its name where its stamps gave one (the
    --job-id text), else by its id, as a reply without job_name (an older server's) is named."""
    from protos import ps_pb2
    from ps.engine.push import TablePush
    from ps.stamp import WorkerStamp, job_hash
    from worker.cli_cluster import _job_clause

    addresses, (server,) = servers(1)
    code, out, err = worker(["stats", "--servers", addresses[0]], capsys)
    assert code == 0 and "    0 job: none (the shard follows no training job)" in out.splitlines(), (out, err)
    job = job_hash(job_name) if job_name else 0xA51C
    setup, shard = "mode=ssp staleness=1 model=fm fields=3:abcd numeric=0", server.shard

    def stamp(w: int, step: int) -> WorkerStamp:
        return WorkerStamp(job, w, 2, step, staleness=1, setup=setup, barrier_timeout_s=30.0, acked=step,
                           job_name=job_name)  # fmt: skip

    shard.create_table(TableConfig("emb", 4), stamp=stamp(0, 0))
    ids = np.array([3, 5, 8], np.uint64)
    for seq, (w, step) in enumerate([(0, 0), (0, 1), (1, 0)], start=1):
        pushes = [TablePush(name="emb", ids=ids, grads=np.ones((3, 4), np.float32), shows=None, clicks=None)]
        shard.push_stamped(pushes, 1, 11 + w, seq, stamp(w, step))
    assert shard.jobs.wait_for_pull(stamp(0, 2)) == 1
    code, out, err = worker(["stats", "--servers", addresses[0], "--json"], capsys)
    (s,) = json.loads(out)["shards"]
    assert (s["job"], s["job_name"], s["num_workers"], s["min_clock"], s["max_gap"]) == (job, job_name, 2, 1, 1), s
    code, out, err = worker(["stats", "--servers", addresses[0]], capsys)
    assert code == 0, err
    named = "'ctr-7'" if job_name else str(job)
    assert (f"    0 job {named}: 2 workers, slowest at clock 1, largest gap 1 (steps a stamped pull was served ahead "
            "of the slowest clock)") in out.splitlines(), out  # fmt: skip
    older = ps_pb2.StatsResponse.FromString(ps_pb2.StatsResponse(job=job, num_workers=2).SerializeToString())
    assert _job_clause(older).startswith(f"job {job}: 2 workers"), "a reply without job_name: the job's id"


def test_stats_text_says_an_async_jobs_pushes_move_no_clock_instead_of_a_slowest_clock_of_0(servers, capsys):
    """An async (or geo) job's stamps are unclocked (ps.engine.followedjob): its worker pushes steps 0..4, and no
    worker clock moves, so min_clock stays 0 however far it trained. The text line says the job moves no clock, as
    the --json's job_unclocked does, not "slowest at clock 0" beside the shard's clock of 5."""
    from ps.engine.push import TablePush
    from ps.stamp import WorkerStamp

    addresses, (server,) = servers(1)
    job, setup, shard = 0xA57C, "mode=async model=fm fields=3:abcd numeric=0", server.shard
    stamp = WorkerStamp(job, 0, 1, 0, setup=setup, unclocked=True, token=7)
    shard.create_table(TableConfig("emb", 4), stamp=stamp)
    ids = np.array([3, 5, 8], np.uint64)
    for step in range(5):
        pushes = [TablePush(name="emb", ids=ids, grads=np.ones((3, 4), np.float32), shows=None, clicks=None)]
        shard.push_stamped(pushes, 1, 11, step + 1, dataclasses.replace(stamp, step=step))
    code, out, err = worker(["stats", "--servers", addresses[0], "--json"], capsys)
    (s,) = json.loads(out)["shards"]
    assert (s["job"], s["num_workers"], s["min_clock"], s["clock"], s["job_unclocked"]) == (job, 1, 0, 5, True), s
    code, out, err = worker(["stats", "--servers", addresses[0]], capsys)
    assert code == 0, err
    assert (f"    0 job {job}: 1 worker, async or geo: its pushes move no worker clock (a sync or ssp job's line gives "
            "its slowest worker's clock and the largest gap)") in out.splitlines(), out  # fmt: skip
    assert "slowest at clock" not in out

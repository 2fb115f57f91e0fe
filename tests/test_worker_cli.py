"""ps-worker's promises to its user, run in this process: the eval set is the one named, an output never replaces
an input, bad input fails before anything is trained and says what to do, and --help tells the true defaults."""

from __future__ import annotations

import http.server
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ps.errors import ServerUnavailableError
from ps.stamp import WorkerStamp
from ps.terminate import Terminated
from tests.conftest import TEST_ROWS, TRAIN_ROWS
from tests.waiting import wait_until
from worker.__main__ import build_parser, main
from worker.client import Client
from worker.cluster import LocalCluster
from worker.data import LabelOrder
from worker.job import prepare
from worker.results import EVAL_LEFT_TO_LAUNCH, format_results, local_shards_gone
from worker.schema_infer import infer_schema_text
from worker.served import evaluate_servers
from worker.temp_dirs import KEPT, remove_stale_temp_dirs
from worker.train import train
from worker.train_config import TrainConfig


def small_run(servers: list[str], data: str, **more) -> TrainConfig:
    return TrainConfig(servers=tuple(servers), data=data, model="lr", recipe="large", batch_size=100, progress=False,
                       server_timeout_s=0, **more)  # fmt: skip


# --- the eval set --------------------------------------------------------------------------------------------------


def test_eval_and_launchs_final_evaluation_score_eval_data_not_the_training_file(servers, files, capsys):
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path))
    assert evaluate_servers(small_run(addresses, train_path, eval_data=test_path))["eval_examples"] == TEST_ROWS
    assert evaluate_servers(small_run(addresses, train_path))["eval_examples"] == TRAIN_ROWS  # eval --data alone
    capsys.readouterr()
    for given in (["--data", train_path, "--eval-data", test_path], ["--eval-data", test_path]):
        assert main(["eval", "--servers", addresses[0], "--model", "lr", *given]) == 0
        out, err = capsys.readouterr()
        assert f"({TEST_ROWS} examples)" in out, (given, out, err)


def test_a_worker_under_launch_leaves_the_final_evaluation_to_launch(servers, files, monkeypatch):
    """launch gives its workers --no-final-eval and scores the job's model once: N workers, 1 evaluation."""
    import worker.train as train_module

    addresses, _ = servers(1)
    train_path, test_path = files
    scored = []
    real = train_module.evaluate
    monkeypatch.setattr(train_module, "evaluate", lambda *a, **k: scored.append(1) or real(*a, **k))
    results = train(small_run(addresses, train_path, eval_data=test_path, final_eval=False))
    assert scored == [] and "eval_auc" not in results and results["final_eval_skipped"]
    assert EVAL_LEFT_TO_LAUNCH in format_results(results).splitlines()
    launched = [line for line in format_results(results).splitlines() if line != EVAL_LEFT_TO_LAUNCH]
    assert format_results(results, launched=True).splitlines() == launched  # launch's summary has the eval line
    train(small_run(addresses, train_path, eval_data=test_path))
    assert scored == [1]  # without it a worker scores --eval-data at its end, as before


def test_max_examples_ends_the_run_as_its_end_and_the_summary_says_so(servers, files, tmp_path, capsys):
    """ps-worker train --max-examples 250 on 600 lines over 2 epochs: 250 examples trained, the final evaluation
    scored, the summary and --metrics-out say the limit stopped it; a worker of 2 takes half."""
    addresses, _ = servers(1)
    train_path, test_path = files
    metrics = tmp_path / "m.json"
    flags = ["train", "--servers", addresses[0], "--server-timeout", "0", "--data", train_path, "--eval-data",
             test_path, "--model", "lr", "--recipe", "large", "--batch-size", "100", "--epochs", "2", "--no-progress",
             "--max-examples", "250", "--metrics-out", str(metrics)]  # fmt: skip
    assert main(flags) == 0
    out = capsys.readouterr().out
    assert "on 250 examples (stopped at --max-examples 250) with 1 shard in " in out, out
    m = json.loads(metrics.read_text())
    assert (m["train_examples"], m["epochs_run"], m["stopped_at_max_examples"]) == (250, 1, True)
    assert m["eval_examples"] == TEST_ROWS
    assert main([*flags[:-4], "--metrics-out", str(metrics)]) == 0  # no limit: both epochs
    m = json.loads(metrics.read_text())
    assert (m["train_examples"], m["epochs_run"], m["stopped_at_max_examples"]) == (2 * TRAIN_ROWS, 2, False)
    capsys.readouterr()  # last: its job's worker 0 never comes, so the job holds the shard for its barrier timeout
    assert main([*flags, "--num-workers", "2", "--worker-id", "1", "--job-id", "3"]) == 0
    out = capsys.readouterr().out
    assert "on 125 examples (stopped at --max-examples 250, the job total) with " in out, out


def test_progress_lines_alone_keep_what_launch_says_for_its_workers(servers, files, capsys, caplog):
    """--progress-lines is the PROGRESS lines only (a dashboard's): a worker run by hand with them still says the
    job's warnings (check_training's), the recipe line and where the model is kept; --launched, which launch gives
    its workers as it says those once for the job, leaves them out."""
    addresses, _ = servers(1)
    train_path, _ = files
    flags = ["train", "--servers", addresses[0], "--server-timeout", "0", "--data", train_path, "--model", "lr",
             "--recipe", "large", "--batch-size", "100", "--synthetic-rows", "5000", "--progress-lines"]  # fmt: skip
    said = {}
    for launched in ([], ["--launched"]):
        caplog.clear()
        assert main([*flags, *launched]) == 0
        out = capsys.readouterr().out
        said[bool(launched)] = ("--synthetic-rows 5000 not used: --data" in caplog.text,
                                "large-data recipe for 600 lines" in out, "model  kept on the servers" in out,
                                any(line.startswith("PROGRESS {") for line in out.splitlines()))  # fmt: skip
    assert said == {False: (True, True, True, True), True: (False, False, False, True)}, said


def test_a_run_on_servers_that_hold_a_trained_model_says_it_trains_that_model_further(servers, files, capsys):
    addresses, _ = servers(1)
    train_path, _ = files
    train(small_run(addresses, train_path))
    assert "trained rows already" not in capsys.readouterr().out  # the first run: new tables
    train(small_run(addresses, train_path))
    out = capsys.readouterr().out
    assert "the servers hold this model's tables with " in out and "this run trains that model further" in out
    assert main(["train", "--servers", addresses[0], "--data", train_path, "--epochs", "1", "--no-progress"]) == 0
    assert f"model  kept on the servers: ps-worker eval and predict read it with --servers {addresses[0]} " in (
        capsys.readouterr().out
    )


def test_a_shard_holding_almost_none_of_a_trained_tables_rows_is_named():
    """Ids spread evenly over shards: a shard with under a tenth of its share was started on another data dir."""
    from protos import ps_pb2
    from worker.model_tables import missing_shares

    spec = prepare(TrainConfig(local_shards=1, model="lr", synthetic_rows=100))[2]
    [table] = spec.table_dims()

    def shard(rows: int, clock: int, data_dir: str) -> ps_pb2.StatsResponse:
        return ps_pb2.StatsResponse(
            tables=[ps_pb2.TableStats(name=table, num_rows=rows)], clock=clock, data_dir=data_dir
        )

    servers = ["h:1", "h:2", "h:3"]
    [warning] = missing_shares([shard(6000, 90, "/a"), shard(0, 3, "/new"), shard(5900, 90, "/c")], spec, servers)
    assert warning.startswith(f"shard 1 at h:2 holds 0 rows of table '{table}' while the other shards hold 11,900, "
                              "and its clock is 3: was it started on a new or another --data-dir (its: /new)?")  # fmt: skip
    assert missing_shares([shard(6000, 90, "/a"), shard(5000, 90, "/b"), shard(5900, 90, "/c")], spec, servers) == []
    assert missing_shares([shard(60, 1, "/a"), shard(0, 1, "/b"), shard(50, 1, "/c")], spec, servers) == []  # few


def test_training_data_sorted_by_its_label_is_warned_about(tmp_path):
    """The labels of a file read in order change about 2 p (1 - p) (n - 1) times when its lines are in random order;
    a file sorted by label changes once, and is named; the same lines shuffled are not."""
    from worker.train_messages import sorted_by_label

    rng = np.random.default_rng(0)
    labels = (rng.random(2000) < 0.3).astype(int)
    lines = [f"{y},c{i % 50}\n" for i, y in enumerate(labels)]
    for name, body, warned in (("random.csv", lines, False), ("sorted.csv", sorted(lines), True)):
        path = tmp_path / name
        path.write_text("clicked,city\n" + "".join(body))
        cfg, data, _, _ = prepare(TrainConfig(local_shards=1, format="csv", data=str(path)))
        data.validation()  # reads the whole share, as train does before any server is touched
        said = sorted_by_label(data.share_labels, cfg.data)
        assert (said is not None) == warned, said
    assert data.share_labels.changes == 1 and said.startswith(f"{path} looks sorted or grouped by its label: in "
                                                             "reading order the label changes 1 time, where")  # fmt: skip
    few = LabelOrder()
    few.add(np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 0], np.float32))
    assert few.changes == 1 and sorted_by_label(few, "tiny.csv") is None  # too few examples to tell


def test_a_sorted_file_read_as_it_trains_in_file_order_is_warned_about_after_training(tmp_path, caplog):
    """The large recipe reads the file as it trains (no read before training): its first epoch's labels are
    counted as they are read, and a sorted file is said once training is done; shuffled, nothing is said."""
    rng = np.random.default_rng(0)
    labels = (rng.random(3000) < 0.3).astype(int)
    path = tmp_path / "sorted.csv"
    path.write_text("clicked,city\n" + "".join(sorted(f"{y},c{i % 50}\n" for i, y in enumerate(labels))))
    for shuffle, warned in ((False, True), (True, False)):
        caplog.clear()
        cfg = TrainConfig(local_shards=1, format="csv", data=str(path), model="lr", recipe="large", shuffle=shuffle,
                          progress=False)  # fmt: skip
        with caplog.at_level("WARNING", logger="worker.train"):
            train(cfg)
        said = [r.getMessage() for r in caplog.records if "looks sorted or grouped by its label" in r.getMessage()]
        assert len(said) == warned, said
    cfg = TrainConfig(local_shards=1, format="csv", data=str(path), model="lr", recipe="large", shuffle=False)
    _, data, _, _ = prepare(cfg)
    list(data.train(1))
    assert (data.stream_labels.positives, data.stream_labels.examples) == (int(labels.sum()), 3000)
    assert data.stream_labels.changes == 1


def test_a_validation_set_with_few_examples_of_a_label_is_warned_about():
    from worker.train_messages import validation_too_small

    class Labels:  # what the check reads of a Batch
        def __init__(self, labels):
            self.labels = np.array(labels, np.float32)

        def __len__(self):
            return len(self.labels)

    batch = Labels

    assert validation_too_small([batch([1] * 40 + [0] * 40)]) is None
    few = validation_too_small([batch([1] * 5 + [0] * 40), batch([0] * 4)])
    assert few.startswith("the validation set holds 5 positive and 44 negative examples: too few to tell epochs")


def test_eval_on_synthetic_rows_says_which_rows_and_what_they_are_held_out_from(servers, capsys):
    addresses, _ = servers(1)
    flags = ["--model", "lr", "--synthetic-rows", "3000", "--synthetic-eval-rows", "500", "--synthetic-seed", "4"]
    assert main(["train", "--servers", addresses[0], "--no-progress", "--epochs", "1", *flags]) == 0
    capsys.readouterr()
    assert main(["eval", "--servers", addresses[0], *flags]) == 0
    out = capsys.readouterr().out
    assert "(500 examples)" in out
    assert ("data   synthetic rows 3,000 to 3,499 of seed 4: held out only from a training run of --synthetic-rows "
            "3,000 or fewer with the same --synthetic-* flags") in out, out  # fmt: skip
    assert main(["eval", "--servers", addresses[0], *flags, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["synthetic_eval_rows"] == [3000, 3500] and r["synthetic_seed"] == 4


# --- outputs never replace inputs ----------------------------------------------------------------------------------


def test_an_output_flag_naming_an_input_file_is_refused_and_the_file_kept(tmp_path, files, capsys):
    train_path, _ = files
    before = Path(train_path).read_text()
    (tmp_path / "link.tsv").symlink_to(train_path)
    config = tmp_path / "c.toml"
    config.write_text('[train]\nmodel = "lr"\n')
    cases = [
        (["schema", "--data", train_path, "--out", train_path], "--out .* is the file of --data"),
        (["train", "--local-shards", "1", "--data", train_path, "--metrics-out", str(tmp_path / "link.tsv")],
         "--metrics-out .*link.tsv is the file of --data"),
        (["train", "--local-shards", "1", "--config", str(config), "--metrics-out", str(config)],
         "--metrics-out .* is the file of --config"),
        (["launch", "--workers", "1", "--local-shards", "1", "--data", train_path, "--metrics-out", train_path],
         "--metrics-out .* is the file of --data"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert re.search(message, err) and "Traceback" not in err, (argv, err)
    assert Path(train_path).read_text() == before and config.read_text() == '[train]\nmodel = "lr"\n'


# --- a bad number names where it came from --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, env, source",
    [
        (["stats", "--servers", "127.0.0.1:1"], {"PS_TIMEOUT_S": "-1"},
         "environment variable PS_TIMEOUT_S (for --timeout-s): expected a number > 0 and <= 1e+07, got '-1'"),
        (["shrink", "--servers", "127.0.0.1:1"], {"PS_SERVER_TIMEOUT": "nan"},
         "environment variable PS_SERVER_TIMEOUT (for --server-timeout): expected a number >= 0 and <= 1e+07, got 'nan'"),
        (["checkpoint", "save", "ckpt", "--servers", "127.0.0.1:1"], {"PS_HOLD_TIMEOUT_S": "0"},
         "environment variable PS_HOLD_TIMEOUT_S (for --hold-timeout-s): expected a number > 0 and <= 3600, got '0'"),
        (["export", "out", "--servers", "127.0.0.1:1"], {"PS_SINCE": "-3"},
         "environment variable PS_SINCE (for --since): expected an integer >= 0, got -3"),
        (["synth", "--out", "never.tsv"], {"PS_ROWS": "0"},
         "environment variable PS_ROWS (for --rows): expected an integer >= 1, got 0"),
        (["schema", "--data", "never.csv"], {"PS_ROWS": "-5"},
         "environment variable PS_ROWS (for --rows): expected an integer >= 1, got -5"),
        (["stats", "--servers", "127.0.0.1:1", "--config", "{config}"], {},
         "config file {config} [stats] 'timeout_s' (for --timeout-s): expected a number > 0 and <= 1e+07, got '-5.0'"),
    ],
)  # fmt: skip
def test_a_bad_number_from_the_environment_or_config_names_its_source(argv, env, source, tmp_path, capsys,
                                                                     monkeypatch):  # fmt: skip
    config = tmp_path / "c.toml"
    config.write_text("[stats]\ntimeout_s = -5.0\n")
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as e:  # the parser's error: before anything runs
        main([a.format(config=config) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and source.format(config=config) in err, err
    assert os.listdir(tmp_path) == ["c.toml"]


# --- bad data fails early, and says what it left ------------------------------------------------------------------


def test_a_malformed_eval_data_line_fails_before_any_server_is_touched(files, tmp_path):
    train_path, test_path = files
    bad = tmp_path / "bad.tsv"
    bad.write_text(Path(test_path).read_text() + "1\t2\t3\n")
    nowhere = small_run(["127.0.0.1:1"], train_path, eval_data=str(bad), timeout_s=1.0, max_bad_lines=0)  # no server
    with pytest.raises(ValueError, match=rf"bad.tsv line {TEST_ROWS + 1}: 3 tab-separated columns"):
        train(nowhere)


def test_a_malformed_first_eval_data_line_or_no_example_fails_before_any_server_is_touched(files, tmp_path):
    """check_eval reads --eval-data's start only; a file whose first line is malformed, or with no example, fails
    before training as a file malformed further on does when its bad line is in that start."""
    train_path, test_path = files
    bad_first, header_only = tmp_path / "bad_first.tsv", tmp_path / "empty.tsv"
    bad_first.write_text("1\t2\t3\n" + Path(test_path).read_text())
    header_only.write_text("")
    nowhere = small_run(["127.0.0.1:1"], train_path, eval_data=str(bad_first), timeout_s=1.0, max_bad_lines=0)
    with pytest.raises(ValueError, match="bad_first.tsv line 1: 3 tab-separated columns"):
        train(nowhere)
    with pytest.raises(ValueError, match="empty.tsv: no examples to evaluate on"):
        train(replace(nowhere, eval_data=str(header_only)))


def _long_eval_file_with_a_bad_last_line(tmp_path: Path, rows: int = 5000) -> Path:
    """A Criteo eval file of `rows` examples (more than the first chunk check_eval reads) and a cut last line."""
    from worker.synthetic import SyntheticConfig
    from worker.synthetic_files import write_synthetic

    path = tmp_path / "long_eval.tsv"
    write_synthetic(path, SyntheticConfig(rows=TRAIN_ROWS), TRAIN_ROWS, TRAIN_ROWS + rows)
    with open(path, "a") as f:
        f.write("1\t2\t3\n")
    return path


def test_an_eval_file_small_enough_is_read_whole_before_training(files, tmp_path):
    """An --eval-data of at most WHOLE_EVAL_CHECK_LINES lines whose last line is malformed (past --max-bad-lines
    0) fails the run before training, and before any server is reached; --max-bad-lines 1 lets it through."""
    import worker.data_checks

    train_path, _ = files
    long_eval = _long_eval_file_with_a_bad_last_line(tmp_path)
    assert len(long_eval.read_text().splitlines()) <= worker.data_checks.WHOLE_EVAL_CHECK_LINES
    nowhere = small_run(["127.0.0.1:1"], train_path, eval_data=str(long_eval), timeout_s=1.0, max_bad_lines=0)
    with pytest.raises(ValueError, match=r"--eval-data, read whole before training \(5,001 lines\): .*long_eval.tsv "
                                         r"line 5001: 3 tab-separated columns"):  # fmt: skip
        train(nowhere)
    cfg, data, _, _ = prepare(replace(nowhere, max_bad_lines=1))
    data.check_eval()


def test_eval_data_is_read_as_it_is_scored_not_before_training(servers, files, tmp_path, caplog, monkeypatch):
    """Of an --eval-data longer than WHOLE_EVAL_CHECK_LINES, only the start is read before training: a malformed
    line past it (and past --max-bad-lines 0) fails the final evaluation, which says the training had finished:
    the training's figures are still reported and written to --metrics-out, and the command exits 2 (no warning
    calls that line skipped); the model trained is on the servers."""
    import worker.data_checks

    monkeypatch.setattr(worker.data_checks, "WHOLE_EVAL_CHECK_LINES", 4096)  # the file (5,001 lines) is a long one here
    train_path, _ = files
    long_eval = _long_eval_file_with_a_bad_last_line(tmp_path)
    cfg = small_run(["127.0.0.1:1"], train_path, eval_data=str(long_eval), max_bad_lines=0)
    cfg, data, _, _ = prepare(cfg)
    data.check_eval()  # no error: the bad line is past the start
    eval_batches = data.eval()
    assert len(next(eval_batches)) == cfg.batch_size  # lazily read: the file's end not reached yet
    with pytest.raises(ValueError, match=r"long_eval.tsv line 5001: 3 tab-separated columns"):
        list(eval_batches)
    addresses, _ = servers(1)
    results = train(small_run(addresses, train_path, eval_data=str(long_eval), max_bad_lines=0))
    assert "in the final evaluation on --eval-data, after training had finished" in results["eval_error"]
    assert results["train_examples"] > 0 and "eval_auc" not in results
    assert not [r for r in caplog.records if "skipped" in r.getMessage()], caplog.text
    metrics = tmp_path / "m.json"
    code = main(["train", "--servers", addresses[0], "--data", train_path, "--eval-data", str(long_eval),
                 "--max-bad-lines", "0", "--recipe", "large", "--no-progress", "--metrics-out", str(metrics)])  # fmt: skip
    assert code == 2 and "eval_error" in json.loads(metrics.read_text())
    figures = evaluate_servers(small_run(addresses, train_path, eval_data=str(long_eval), max_bad_lines=1))
    assert (figures["eval_examples"], figures["bad_lines"]) == (5000, 1)
    rate = figures["eval_positive_rate"]  # the baseline: the entropy of the labels, the best constant's logloss
    assert 0 < rate < 1 and figures["eval_constant_logloss"] == pytest.approx(
        -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)), rel=1e-6
    )


def test_the_final_evaluation_streamed_gives_the_figures_of_the_eval_set_scored_in_memory(servers, files):
    """Streaming --eval-data changes no figure: train's final AUC and logloss are those of evaluate() on the
    file's batches read whole into a list first (the former path), with the model the servers hold."""
    from worker.dense import DenseSync
    from worker.job import make_backend
    from worker.scoring import evaluate

    addresses, _ = servers(1)
    train_path, test_path = files
    cfg = replace(small_run(addresses, train_path, eval_data=test_path), batch_size=32)  # 150 examples: 5 batches
    results = train(cfg)
    cfg, data, spec, _ = prepare(cfg)
    with Client(addresses) as client:
        dense_values = DenseSync(client, spec.dense_params()).pull()
        in_memory = list(data.read_whole(test_path))
        assert len(in_memory) == 5
        expected = evaluate(client, spec, make_backend(spec, cfg), dense_values, in_memory)
    assert expected["eval_examples"] == TEST_ROWS
    assert {k: results[k] for k in expected} == expected


def test_eval_skips_and_reports_a_few_malformed_lines_of_its_file(servers, files, tmp_path, caplog):
    """launch's final evaluation reads --eval-data as its workers did: a cut last line is skipped and reported."""
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path))
    bad = tmp_path / "bad.tsv"
    bad.write_text(Path(test_path).read_text() + "1\t2\t3\n")
    result = evaluate_servers(small_run(addresses, train_path, eval_data=str(bad)))
    assert (result["eval_examples"], result["bad_lines"]) == (TEST_ROWS, 1)
    assert f"bad.tsv: skipped 1 malformed line of {TEST_ROWS + 1:,}" in caplog.text
    with pytest.raises(ValueError, match="1 bad line, more than --max-bad-lines 0"):
        evaluate_servers(small_run(addresses, train_path, eval_data=str(bad), max_bad_lines=0))


def test_eval_and_trains_final_evaluation_show_their_progress(servers, files, tmp_path, monkeypatch, capsys):
    """Scoring a large eval file takes minutes (2M CSV rows: 54 s, with nothing shown): eval, and train's final
    evaluation, show progress as predict does (plain lines on stderr that is no terminal); eval --no-progress
    shows none."""
    import dataclasses

    from worker.scoring import ScoringProgress

    monkeypatch.setattr(ScoringProgress, "PLAIN_EVERY_S", 0.0)
    addresses, _ = servers(1)
    train_path, test_path = files
    train(dataclasses.replace(small_run(addresses, train_path, eval_data=test_path), progress=True))
    err = capsys.readouterr().err
    assert f"progress: 100 of {TEST_ROWS} (67%) examples scored, " in err, err  # counted: no "about"
    flags = ["eval", "--servers", addresses[0], "--data", train_path, "--eval-data", test_path, "--model", "lr",
             "--batch-size", "50"]  # fmt: skip
    assert main(flags) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("progress: ")]
    assert [line.split(" examples scored")[0] for line in lines] == [
        f"progress: {n} of {TEST_ROWS} ({n / TEST_ROWS:.0%})" for n in (50, 100, 150)
    ], lines
    assert main([*flags, "--no-progress"]) == 0
    assert "progress: " not in capsys.readouterr().err


def test_trains_final_evaluation_writes_progress_lines_of_its_scoring_under_progress_lines(
    servers, files, monkeypatch, capsys
):
    """train --progress-lines (for logs and dashboards) shows its final evaluation's progress too, as PROGRESS
    lines of its scoring: examples scored of the eval set's, ending at all of them; launch's reader takes them for
    no training progress."""
    from worker.progress_lines import parse_progress

    monkeypatch.setattr("worker.scoring.JSON_EVERY_S", 0.0)
    addresses, _ = servers(1)
    train_path, test_path = files
    assert main(["train", "--servers", addresses[0], "--server-timeout", "0", "--data", train_path, "--eval-data",
                 test_path, "--model", "lr", "--recipe", "large", "--batch-size", "100",
                 "--progress-lines"]) == 0  # fmt: skip
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("PROGRESS ")]
    scoring = [json.loads(line.removeprefix("PROGRESS ")) for line in lines if '"phase": "eval"' in line]
    assert [(r["worker"], r["scored"], r["total"]) for r in scoring] == [
        (0, 100, TEST_ROWS), (0, TEST_ROWS, TEST_ROWS), (0, TEST_ROWS, TEST_ROWS)
    ], lines  # fmt: skip
    assert all(r["examples_per_s"] > 0 for r in scoring)
    assert all(parse_progress(line) is None for line in lines if '"phase": "eval"' in line)
    assert lines.index(next(line for line in lines if '"phase": "eval"' in line)) > 0  # after training's lines


def test_scoring_progress_over_an_estimated_total_says_about_and_stays_under_100_percent(monkeypatch, capsys):
    """eval and predict count a large file no further than SCORING_COUNT_LINES: its total is a guess from bytes."""
    from worker.scoring import ScoringProgress

    monkeypatch.setattr(ScoringProgress, "PLAIN_EVERY_S", 0.0)
    progress = ScoringProgress(1000, True, estimated=True)
    for n in (500, 500, 300):
        progress.update(n)
    progress.close()
    lines = [line.split(" examples scored")[0] for line in capsys.readouterr().err.splitlines()]
    assert lines == ["progress: 500 of about 1,000 (50%)", "progress: 1,000 of about 1,012 (99%)",
                     "progress: 1,300 of about 1,315 (99%)"], lines  # fmt: skip


def test_scoring_progress_lines_end_at_the_count_only_when_every_example_was_scored(monkeypatch, capsys):
    """A PROGRESS line of scoring at close: its total the examples scored when the scoring is done; an estimate
    said as one before; the total expected kept when an error or a signal stopped it (closed unfinished)."""
    monkeypatch.setattr("worker.scoring.JSON_EVERY_S", 0.0)
    from worker.scoring import ScoringProgress

    for finished in (True, False):
        progress = ScoringProgress(1000, True, estimated=True, worker=3)
        progress.update(400)
        progress.close(finished)
        out, err = capsys.readouterr()
        reports = [json.loads(line.removeprefix("PROGRESS ")) for line in out.splitlines()]
        assert [(r["worker"], r["phase"], r["scored"], r["total"], r.get("estimated")) for r in reports] == [
            (3, "eval", 400, 1000, True), (3, "eval", 400, 400 if finished else 1000, None if finished else True)
        ], out  # fmt: skip
        assert err == ""  # no bar, no plain line


def test_a_malformed_training_line_mid_run_says_the_servers_hold_a_partly_trained_model(servers, files, tmp_path):
    addresses, _ = servers(1)
    train_path, _ = files
    bad = tmp_path / "bad.tsv"
    bad.write_text(Path(train_path).read_text() * 20 + "1\t2\t3\n")  # past the reader's first chunks
    with pytest.raises(ValueError, match=r"line 12001: .*pushed their updates: the servers now hold a partly trained"):
        train(small_run(addresses, str(bad), max_bad_lines=0))  # the large recipe's default skips a few


def interrupt_at_batch(monkeypatch, n: int) -> None:
    """DataSource.train (of the real one, as it is now) raises KeyboardInterrupt as the n-th batch of the run is
    read: a Ctrl-C between two steps."""
    from worker.data import DataSource

    read, batches_read = DataSource.train, 0

    def interrupted(self, epoch=1):
        nonlocal batches_read
        for batch in read(self, epoch):
            batches_read += 1
            if batches_read == n:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(DataSource, "train", interrupted)


def test_an_interrupted_run_resumed_with_the_skip_it_prints_trains_the_model_of_an_uninterrupted_one(
    servers, files, tmp_path, monkeypatch, capsys
):
    """6 steps per epoch, 2 epochs: Ctrl-C as step 9's batch is read; the rerun with the --skip-examples the
    stopped run printed ends with the model (its predictions on every training example) of a run never stopped."""
    from worker.data import DataSource

    train_path, _ = files
    whole, _ = servers(1, root=tmp_path / "whole")
    stopped, _ = servers(1, root=tmp_path / "stopped")
    run = dict(epochs=2, prefetch=1)
    train(small_run(whole, train_path, **run))
    capsys.readouterr()
    read = DataSource.train
    interrupt_at_batch(monkeypatch, 9)
    with pytest.raises(KeyboardInterrupt):
        train(small_run(stopped, train_path, **run))
    monkeypatch.setattr(DataSource, "train", read)
    err = capsys.readouterr().err
    assert "stopped in epoch 2 of 2 after 800 training examples (this run's 800 in 8 steps)" in err, err
    skip = int(re.search(r"--skip-examples (\d+)", err).group(1))
    resumed = train(small_run(stopped, train_path, skip_examples=skip, **run))
    assert resumed["train_examples"] == 2 * TRAIN_ROWS - 800 and resumed["skipped_examples"] == 800
    assert "resuming: the first 800 training examples are read and skipped" in capsys.readouterr().out
    scores = [evaluate_servers(small_run(a, train_path))["eval_logloss"] for a in (whole, stopped)]
    assert scores[0] == scores[1]
    with pytest.raises(ValueError, match=r"--skip-examples 1,200 skips every training example of this worker's 2 "):
        train(small_run(stopped, train_path, skip_examples=1200, **run))

    interrupt_at_batch(monkeypatch, 9)  # under launch: a last PROGRESS line, launch's hint
    with pytest.raises(KeyboardInterrupt):
        train(small_run(stopped, train_path, progress_lines=True, launched=True, **run))
    out, err = capsys.readouterr()
    last = json.loads(out.strip().splitlines()[-1].removeprefix("PROGRESS "))
    assert (last["examples"], last["steps"]) == (800, 8) and "--skip-examples" not in err


def test_a_geo_run_stopped_by_its_servers_hints_at_the_examples_whose_deltas_they_hold(
    servers, files, monkeypatch, capsys
):
    """geo pushes its deltas every 4th step, and a stop the servers caused pushes none of those it holds: of 7
    steps trained, the servers hold the first 4 (400 examples), so the hint resumes after 400, not 700."""
    from worker.data import DataSource

    train_path, _ = files
    addresses, _ = servers(1)
    read = DataSource.train

    def servers_fail(self, epoch=1):
        for i, batch in enumerate(read(self, epoch)):
            if epoch == 2 and i == 1:
                raise ServerUnavailableError("shard 0 did not answer")
            yield batch

    monkeypatch.setattr(DataSource, "train", servers_fail)
    with pytest.raises(ServerUnavailableError):
        train(small_run(addresses, train_path, epochs=2, mode="geo", geo_every=4))
    err = capsys.readouterr().err
    assert "stopped in epoch 2 of 2 after 400 training examples (this run's 400) had pushed" in err, err
    assert "the 300 examples it trained after them, in geo's local rows, were not pushed" in err, err
    assert "--skip-examples 400" in err, err
    with Client(addresses) as client:
        assert client.stats()[0].clock == 4  # geo advances the clock by the steps a push of deltas carries
    # its last push failing after the last step (LoopResult.trained_all) leaves those deltas out all the same
    from worker.loop import LoopResult
    from worker.train_messages import resume_hint

    last_push_failed = LoopResult(examples=1200, pushed=800, steps=12, epoch=2, trained_all=True)
    hint = resume_hint(last_push_failed, small_run(addresses, train_path, epochs=2, mode="geo", geo_every=4))
    assert "after 800 training examples" in hint and "--skip-examples 800" in hint, hint


def test_an_interrupted_run_on_local_shards_says_how_far_it_got_and_that_nothing_is_left_to_resume(
    files, monkeypatch, capsys
):
    """Ctrl-C as step 3's batch is read, on --local-shards: the run says it stopped after 200 examples and that its
    model went with the shards, not a --skip-examples that nothing could resume."""
    train_path, _ = files
    interrupt_at_batch(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(local_shards=1, data=train_path, model="lr", recipe="large", batch_size=100, progress=False))
    err = capsys.readouterr().err
    assert "ps-worker: stopped in epoch 1 of 1 after 200 training examples; the model was on local shards" in err, err
    assert "nothing to resume" in err and "--skip-examples" not in err, err


def test_a_csv_read_as_criteo_and_a_tsv_read_as_csv_get_a_hint(tmp_path):
    """--format criteo given for another format's file: refused at once with that format's flag. --format auto (the
    default) reads a CSV and a libsvm file as such, a CSV of another delimiter too."""
    csv_file = tmp_path / "my.csv"
    csv_file.write_text("label,a,b\n1,x,y\n0,z,w\n")
    criteo = TrainConfig(local_shards=1, data=str(csv_file), format="criteo")
    with pytest.raises(ValueError, match=r"line 1: 1 tab-separated columns, expected 40 \(it looks comma-separated: "
                       r"--format csv"):  # fmt: skip
        prepare(criteo)
    with pytest.raises(ValueError, match=r"line 1: 1 tab-separated columns, .*a file of no tab is no Criteo TSV"):
        prepare(replace(criteo, recipe="large", max_bad_lines=1000))  # said at once
    assert prepare(TrainConfig(local_shards=1, data=str(csv_file)))[1].schema.format == "csv"
    for delimiter in ";|":  # another delimiter: --format auto, at once whatever --max-bad-lines allows
        other = tmp_path / "other.csv"
        other.write_text(f"label{delimiter}a{delimiter}b\n1{delimiter}x{delimiter}y\n")
        for run in ({}, {"recipe": "large", "max_bad_lines": 1000}):
            with pytest.raises(ValueError, match=rf"other.csv line 1: 1 tab-separated columns, expected 40 \(it "
                               rf"looks \{delimiter}-separated: with a header line, --format auto reads it as CSV\); "
                               r"a file of no tab is no Criteo TSV: nothing was read"):  # fmt: skip
                prepare(TrainConfig(local_shards=1, data=str(other), format="criteo", **run))
            assert prepare(TrainConfig(local_shards=1, data=str(other), **run))[1].schema.delimiter == delimiter
        assert f'delimiter = "{delimiter}"' in infer_schema_text(str(other), delimiter=delimiter)
    libsvm = tmp_path / "data.svm"
    libsvm.write_text("1 3:1 7:1\n0 2:1 9:1\n")
    with pytest.raises(ValueError, match=r"line 1: 1 tab-separated .*looks like libsvm.*--format libsvm reads it"):
        prepare(TrainConfig(local_shards=1, data=str(libsvm), format="criteo"))
    assert prepare(TrainConfig(local_shards=1, data=str(libsvm), format="libsvm"))[1] is not None
    assert prepare(TrainConfig(local_shards=1, data=str(libsvm)))[1].schema.format == "libsvm"
    tsv_file = tmp_path / "my.tsv"
    tsv_file.write_text("1\t2\t3\n0\t4\t5\n")
    with pytest.raises(ValueError, match=r"its first line has tabs and no ',': .*--format criteo.*--delimiter"):
        infer_schema_text(str(tsv_file))
    assert 'delimiter = "\\t"' in infer_schema_text(str(tsv_file), delimiter="\t")
    header_only = tmp_path / "header.csv"
    header_only.write_text("click,a,b\n")
    with pytest.raises(ValueError, match=r"header.csv: a header and no data rows: nothing to tell each column's kind"):
        infer_schema_text(str(header_only))
    trailing = tmp_path / "trailing.csv"  # every row ends in a delimiter: none has the header's width
    trailing.write_text("click,a,b\n,,,\n1,x,2,\n0,y,3,\n")
    with pytest.raises(ValueError, match=r"no sampled row has the header's 3 columns \(the first has 4: a delimiter "
                                         r"at the end of each row\?\)"):  # fmt: skip
        infer_schema_text(str(trailing))


def test_a_train_on_local_shards_ends_saying_the_model_went_with_them(tmp_path, capsys):
    out = tmp_path / "m.json"
    argv = ["train", "--local-shards", "1", "--model", "lr", "--synthetic-rows", "2000", "--synthetic-eval-rows",
            "500", "--no-progress", "--epochs", "1", "--metrics-out", str(out)]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2:] == [f"metrics written to {out}", local_shards_gone("train")]
    assert "gone: it was on local shards" in lines[-1] and "train with --servers to keep it" in lines[-1]


def test_schema_delimiter_takes_a_tab_as_typed_in_a_shell_and_refuses_other_words(tmp_path, capsys):
    tsv_file = tmp_path / "my.tsv"
    tsv_file.write_text("click\tsite\n1\ta\n0\tb\n")
    for typed in ["\\t", "tab", "TAB", "\t"]:
        assert main(["schema", "--data", str(tsv_file), "--delimiter", typed]) == 0, typed
        out = capsys.readouterr().out
        assert 'delimiter = "\\t"' in out and 'label = "click"' in out, (typed, out)
    assert main(["schema", "--data", str(tsv_file), "--delimiter", "ab"]) == 2
    err = capsys.readouterr().err
    assert "--delimiter 'ab': expected one character other than a quote or a newline (a tab: $'\\t'" in err, err


def test_schema_of_a_header_that_is_not_utf8_says_so_and_writes_no_out_file(tmp_path, capsys):
    """A Windows-1252 export's header (pr\xe9cio): a clear refusal naming the column, and --out is not left behind
    as an empty file that the next run would refuse to overwrite."""
    data = tmp_path / "latin.csv"
    data.write_bytes(b"click,pr\xe9cio,user\n1,1.5,a\n0,2.5,b\n1,3.5,a\n0,1.0,c\n")
    out = tmp_path / "schema.toml"
    assert main(["schema", "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the header's column name 'pr\\xe9cio' is not UTF-8 text" in err and "Save the file as UTF-8" in err, err
    assert not out.exists() and os.listdir(tmp_path) == ["latin.csv"]
    data.write_bytes(data.read_bytes().replace(b"\xe9", "\u00e9".encode()))
    assert main(["schema", "--data", str(data), "--out", str(out)]) == 0
    assert "pr\u00e9cio" in out.read_text(encoding="utf-8")
    mask = os.umask(0o022)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask  # as open() makes it: workers of other users read it


def test_a_server_address_that_is_not_a_sparseps_server_says_so():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{httpd.server_address[1]}"
        with (
            Client([address], timeout_s=1.0, server_timeout_s=1.0) as client,
            pytest.raises(ServerUnavailableError, match="it did not answer as a sparseps shard"),
        ):
            client.wait_ready()
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_grpc_server_of_another_service_is_said_not_to_be_a_shard():
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    other = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), other)
    port = other.add_insecure_port("127.0.0.1:0")
    other.start()
    try:
        address = f"127.0.0.1:{port}"
        with (
            Client([address], timeout_s=2.0, server_timeout_s=2.0) as client,
            pytest.raises(ServerUnavailableError, match="does not serve Stats .*: it is a gRPC server but not a "
                          "sparseps shard; is --servers the right address"),
        ):  # fmt: skip
            client.wait_ready()
    finally:
        other.stop(0)


# --- stopping -----------------------------------------------------------------------------------------------------


def test_local_shards_interrupted_while_starting_are_stopped_and_their_root_removed(monkeypatch):
    started = []

    def spawn(self, shard_id, port=0):
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE))  # fmt: skip
        return started[-1]

    def interrupted(self, shard_id, proc, deadline):
        raise Terminated

    monkeypatch.setattr(LocalCluster, "_spawn", spawn)
    monkeypatch.setattr(LocalCluster, "_await_port", interrupted)
    cluster = LocalCluster(1)
    with pytest.raises(Terminated), cluster:
        pytest.fail("the block must not run")
    assert not os.path.exists(cluster.root)
    assert started[0].poll() is not None


def test_a_shard_that_fails_to_start_keeps_its_root_with_a_note_saying_why(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    cluster = LocalCluster(1, extra_args=["--cache-bytes", "1"])  # refused at start: below any table's floor
    with pytest.raises(ServerUnavailableError, match="exited with code .* before listening"), cluster:
        pytest.fail("the block must not run")
    assert re.fullmatch(rf"sparseps-local-{os.getpid()}-.+", Path(cluster.root).name)
    note = (Path(cluster.root) / KEPT).read_text()
    assert note.startswith("a local shard failed to start: local shard 0 exited with code"), note
    assert (Path(cluster.root) / "shard-0.log").exists()


def test_a_shard_killed_before_it_listens_is_said_to_be_killed_by_its_signal(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))

    def spawn(self, shard_id, port=0):  # a shard that dies of SIGABRT as it starts
        return subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"],
                                stdout=subprocess.PIPE, stdin=subprocess.PIPE)  # fmt: skip

    monkeypatch.setattr(LocalCluster, "_spawn", spawn)
    cluster = LocalCluster(1)
    with pytest.raises(ServerUnavailableError, match="local shard 0 was killed by SIGABRT before listening"), cluster:
        pytest.fail("the block must not run")


def processes_naming(text: str) -> list[int]:
    """The pids of the processes whose command line holds text (Linux's /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_the_local_shards_dir_of_a_killed_train_is_removed_by_the_next_one(tmp_path):
    """SIGKILL leaves train --local-shards no way to remove its shards' directory (the shards stop with it); while
    a shard of it still runs, the directory is in use and stays; then the next such run removes it and says so."""
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    cmd = [sys.executable, "-m", "worker", "train", "--local-shards", "1", "--no-progress", "--model", "lr"]
    first = subprocess.Popen([*cmd, "--synthetic-rows", "5000000"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    shard = None
    try:
        wait_until(lambda: list(temp.glob("sparseps-local-*/shard-0/CURRENT")), 120, "the first run's shard")
        [left] = os.listdir(temp)
        [shard] = processes_naming(str(temp / left / "shard-0"))
        os.kill(shard, signal.SIGSTOP)  # a shard that has not stopped yet
    finally:
        first.kill()
        first.wait(timeout=60)
    try:
        assert left.startswith(f"sparseps-local-{first.pid}-")
        assert remove_stale_temp_dirs(str(temp)) == [] and os.listdir(temp) == [left]  # the shard holds its lock
    finally:
        os.kill(shard, signal.SIGCONT)
    wait_until(lambda: not processes_naming(str(temp / left)), 60, "the killed run's shard to stop")
    second = subprocess.run([*cmd, "--synthetic-rows", "3000", "--synthetic-eval-rows", "500", "--epochs", "1"],
                            env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert f"removed {temp / left}, left by an earlier run (pid {first.pid}) that is gone" in second.stderr
    assert os.listdir(temp) == []


# --- --help --------------------------------------------------------------------------------------------------------


def command_help(command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and command in a.choices)
    return " ".join(sub.choices[command].format_help().split())  # one line: help wraps anywhere


@pytest.mark.parametrize("command", ["train", "eval", "synth", "schema", "stats", "shrink", "checkpoint", "export"])
def test_help_states_each_default_once_and_no_argparse_placeholders(command):
    text = command_help(command)
    assert "(default: None)" not in text and "(default: )" not in text and "%%" not in text
    assert "(default: False)" not in text
    assert not re.search(r"default[^()]*\)\s*\(default:", text), text  # prose that gives a default, then argparse's


def test_help_gives_the_recipes_dropout_and_the_synth_defaults():
    train_help = command_help("train")
    assert "(default: the recipe's: 0.7 for small data, 0 for large)" in train_help
    assert "a 10% split" in train_help
    synth_help = command_help("synth")
    assert "rows to write (default 100,000; with --small 10,000)" in synth_help and "(default: 0)" in synth_help
    assert "--table TABLE only this table (default: all) --" in command_help("shrink")


def test_synth_small_writes_its_regimes_rows_and_its_note_counts_them(tmp_path, capsys):
    out = tmp_path / "small.tsv"
    assert main(["synth", "--small", "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 10_000
    assert "in 10,000 such rows most ids are seen once or twice" in capsys.readouterr().out
    assert main(["synth", "--small", "--out", str(out), "--rows", "12000", "--overwrite"]) == 0
    assert "in 12,000 such rows" in capsys.readouterr().out
    assert main(["synth", "--small", "--out", str(out), "--rows", "300", "--start", "10000", "--overwrite"]) == 0
    printed = capsys.readouterr().out
    assert "wrote rows [10000, 10300)" in printed and "--small:" not in printed, "eval rows get no training note"


@pytest.mark.parametrize("flag, what", [("--eval-data", "evaluate"), ("--validation-data", "validate")])
@pytest.mark.parametrize(
    "content, held",
    [
        ("", "is empty"),
        ("label,user\n", "holds only a header"),
        ("label,user\n7,u1\n", "holds only a header and 1 malformed line; the first malformed one: "),
    ],
)
def test_an_eval_or_validation_file_without_examples_fails_before_any_server_is_touched(
    tmp_path, capsys, flag, what, content, held
):
    train_path = tmp_path / "train.csv"
    train_path.write_text("label,user\n" + "".join(f"{i % 2},u{i % 9}\n" for i in range(200)))
    (tmp_path / "held.csv").write_text(content)
    flags = ["--data", str(train_path), "--format", "csv", flag, str(tmp_path / "held.csv"), "--max-bad-lines", "5"]
    assert main(["train", "--servers", "127.0.0.1:1", "--server-timeout", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert f"held.csv: no examples to {what} on ({flag} {held}" in err


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_worker_waiting_at_a_sync_barrier_stops_at_once_on_ctrl_c_or_sigterm(servers, tmp_path, sig, code):
    """Worker 0 of a 2-worker sync job waits (up to its 60 s barrier) for worker 1, which never comes: a signal
    ends it within seconds, not when the wait ends, and it tells the shard, which stops the job."""
    addresses, (server,) = servers(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "train", "--servers", addresses[0], "--mode", "sync", "--num-workers", "2",
         "--worker-id", "0", "--job-id", "77", "--synthetic-rows", "5000", "--synthetic-eval-rows", "100",
         "--barrier-timeout", "60", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's job: a background job
    )  # fmt: skip                                                        # (CI) would ignore SIGINT from its start
    try:
        jobs = server.shard.jobs  # its step's push waiting: the main thread is in the wait, past its kernels' load
        wait_until(lambda: any(s.contributions for s in list(jobs.sync.steps.values())), 120, "worker 0's sync push")
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == code, out
    assert ("interrupted" if sig == signal.SIGINT else "terminated") in out, out
    why = "interrupted (Ctrl-C)" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert f"worker 0 stopped before its end ('{why}')" in str(jobs.tenancy.stopped)  # its peers need not wait
    assert jobs.wait_for_pull(WorkerStamp(78, 0, 1, 0)) == 0  # and the shard takes another job at once


def test_a_worker_id_out_of_range_from_rank_or_world_size_names_the_variables(monkeypatch):
    """A stale $RANK (a shell torchrun left) is no --worker-id the operator typed: the error says where it came from."""
    from worker.cli_train_config import train_config_from_argv

    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ValueError, match=r"^worker 3 of 1 is no worker of the job: \$RANK is 3 \(torchrun's"):
        train_config_from_argv(["--local-shards", "1"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"^worker 3 of 2 .*: \$RANK is 3 and \$WORLD_SIZE is 2 \("):
        train_config_from_argv(["--local-shards", "1"])
    with pytest.raises(ValueError, match=r"^worker 3 of 3 .*: \$RANK is 3 \("):
        train_config_from_argv(["--servers", "h:1", "--num-workers", "3"])
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert train_config_from_argv(["--servers", "h:1"]).worker_id == 3
    with pytest.raises(ValueError, match=r"^--worker-id 5 must be in \[0, --num-workers 4\)"):  # typed: flags named
        train_config_from_argv(["--servers", "h:1", "--worker-id", "5", "--num-workers", "4"]).validate()


def test_allreduce_refuses_a_worker_id_that_its_rank_contradicts(monkeypatch):
    from worker.cli_train_config import train_config_from_argv

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"--worker-id 0 but \$RANK is 1: --dense allreduce takes its rank from"):
        train_config_from_argv(["--local-shards", "1", "--dense", "allreduce", "--worker-id", "0"])
    agreed = train_config_from_argv(["--local-shards", "1", "--dense", "allreduce", "--worker-id", "1"])
    assert (agreed.worker_id, agreed.num_workers) == (1, 2)
    assert train_config_from_argv(["--local-shards", "1", "--worker-id", "0"]).worker_id == 0  # the PS path: no rank


def test_a_sigterm_while_numba_compiles_raises_once_the_kernel_is_compiled():
    """An exception raised by a signal handler inside numba's compile (whose LLVM calls back into Python) could
    crash the process: within sigterm_raises the signal waits for the compiler lock to be let go of."""
    import numba
    from numba.core import event

    from ps.terminate import sigterm_raises

    @numba.njit(cache=False)
    def add(a, b):
        return a + b

    class SignalMidCompile(event.Listener):
        def on_start(self, ev):
            os.kill(os.getpid(), signal.SIGTERM)

        def on_end(self, ev):
            pass

    listener = SignalMidCompile()
    with sigterm_raises(cleanup_limit_s=None):  # no watchdog ending this test process 120 s later
        event.register("numba:compile", listener)
        try:
            with pytest.raises(Terminated):
                add(1, 2)
        finally:
            event.unregister("numba:compile", listener)
    assert add.signatures  # compiled whole before Terminated was raised
    assert add(2, 3) == 5


def test_a_stop_before_the_first_step_or_in_the_final_evaluation_says_what_to_do(servers, files, monkeypatch, capsys):
    """While a resumed run still skips: run it again as it was. In the final evaluation: nothing to resume."""
    import worker.train as train_module
    from worker.data import DataSource

    addresses, _ = servers(1)
    train_path, _ = files
    read = DataSource.train

    def interrupted_while_skipping(self, epoch=1):
        for k, batch in enumerate(read(self, epoch)):
            if k == 2:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(DataSource, "train", interrupted_while_skipping)
    with pytest.raises(KeyboardInterrupt):
        train(small_run(addresses, train_path, skip_examples=500, prefetch=0))
    assert ("stopped before its first step, while reading the 500 examples it skips: to train on, run the same "
            "command again (--skip-examples 500)") in capsys.readouterr().err  # fmt: skip
    monkeypatch.setattr(DataSource, "train", read)

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(small_run(addresses, train_path))
    assert f"had trained all its {TRAIN_ROWS} examples when it stopped, in its final evaluation: nothing to resume" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("signal_error, code, said", [(KeyboardInterrupt, 130, "interrupted"),
                                                      (Terminated, 143, "terminated")])  # fmt: skip
def test_a_signal_that_numba_wrapped_in_a_system_error_ends_the_command_as_the_signal(monkeypatch, capsys,
                                                                                     signal_error, code, said):  # fmt: skip
    """numba's callbacks into Python (unpickling a cached kernel's constants) turn a signal's exception into a
    SystemError: the command still ends as on the signal, with its message and exit code, not a traceback."""
    import worker.__main__ as cli
    from worker.stopping import stop_reason

    def run(args, rest):
        try:
            raise signal_error
        except BaseException as e:
            raise SystemError("<function _numba_unpickle> returned a result with an exception set") from e

    monkeypatch.setattr(cli, "_run_command", run)
    assert main(["stats", "--servers", "127.0.0.1:1"]) == code
    assert capsys.readouterr().err.strip() == f"ps-worker: {said}"
    try:
        run(None, None)
    except SystemError as wrapped:
        assert stop_reason(wrapped) == ("interrupted (Ctrl-C)" if code == 130 else "terminated (SIGTERM)")


@pytest.mark.parametrize("signum, error", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_signal_inside_a_step_waits_for_its_end_or_its_grace(signum, error):
    """signals_after_step: the signal raises once the block is done (its push counted), or, if the block runs on
    past the grace (a barrier's wait), inside it then."""
    import time

    from ps.terminate import signals_after_step, sigterm_raises

    reached = []
    with sigterm_raises(cleanup_limit_s=None), pytest.raises(error), signals_after_step(5.0):
        os.kill(os.getpid(), signum)
        time.sleep(0.2)  # the handler has run by now: the signal waits
        reached.append("the step's end")
    assert reached == ["the step's end"]
    started = time.monotonic()
    with sigterm_raises(cleanup_limit_s=None), pytest.raises(error), signals_after_step(0.5):
        os.kill(os.getpid(), signum)
        time.sleep(10)  # a wait that outlives the grace: interrupted
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("first, second", [(signal.SIGINT, signal.SIGINT), (signal.SIGINT, signal.SIGTERM),
                                           (signal.SIGTERM, signal.SIGINT)])  # fmt: skip
def test_a_second_signal_while_the_first_unwinds_does_not_cut_its_cleanup_short(first, second, capfd):
    """An impatient second Ctrl-C (or a SIGTERM after one) raised inside the cleanup that the first started: the
    resume file's last write, a prefetch thread's join, a generator's close printed 'Exception ignored' tracebacks
    or were cut short. It is ignored, saying so: the first signal's exception ends the block."""
    import time

    from ps.terminate import sigterm_raises

    cleaned = []
    error = KeyboardInterrupt if first == signal.SIGINT else Terminated
    with pytest.raises(error), sigterm_raises(cleanup_limit_s=None):
        try:
            os.kill(os.getpid(), first)
            time.sleep(5)  # interrupted by the first
        finally:
            os.kill(os.getpid(), second)
            time.sleep(0.2)  # the handler has run by now
            cleaned.append("whole")
    assert cleaned == ["whole"]
    assert "stopping already: this signal is ignored while the stop finishes (SIGKILL" in capfd.readouterr().err


LOST_IN_A_FINALIZER = """import os, signal, threading, time
from ps.terminate import sigterm_raises
sent = []  # when each Ctrl-C was sent
def interrupt():
    sent.append(time.monotonic())
    if len(sent) == 1:  # the second, 2.5 s after the first (or later, on a loaded host)
        threading.Timer(2.5, interrupt).start()
    os.kill(os.getpid(), signal.SIGINT)  # CPython runs the handler on the main thread, whichever thread sends
class Slow:
    def __del__(self):
        interrupt()  # the first Ctrl-C lands here: printed as 'Exception ignored', and dropped
        time.sleep(1.0)
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    with sigterm_raises(cleanup_limit_s=3):
        Slow()
        while time.monotonic() - sent[-1] < 30:
            time.sleep(0.05)
    print("not stopped", flush=True)
except KeyboardInterrupt:
    # past the first's watchdog (3 s after it: the second came 2.5 s or more after it), 2 s before the second's
    time.sleep(max(0.0, sent[1] + 1.0 - time.monotonic()))
    print("stopped by the second", flush=True)
"""


def test_a_first_signal_lost_in_a_finalizer_leaves_the_next_one_to_stop_the_process():
    """A Ctrl-C whose KeyboardInterrupt is raised inside a finalizer (a __del__, a generator's close) is printed
    and dropped there: the process goes on, so the next Ctrl-C must raise (not be ignored as a second one while a
    stop unwinds), and the first one's watchdog must not end the process without its cleanup."""
    done = subprocess.run([sys.executable, "-c", LOST_IN_A_FINALIZER], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert done.returncode == 0 and done.stdout == "stopped by the second\n", (done.returncode, done.stdout,
                                                                                 done.stderr)  # fmt: skip
    assert "Exception ignored" in done.stderr and "stopping already" not in done.stderr, done.stderr


def test_eval_scores_an_eval_data_directory_of_many_files_with_progress(servers, files, tmp_path):
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path))
    lines = Path(test_path).read_bytes().splitlines(keepends=True)
    (tmp_path / "parts").mkdir()
    for k, at in enumerate(range(0, len(lines), 300)):
        (tmp_path / "parts" / f"day_{k}").write_bytes(b"".join(lines[at : at + 300]))
    cfg = replace(small_run(addresses, train_path, eval_data=str(tmp_path / "parts")), progress=True)
    assert evaluate_servers(cfg)["eval_examples"] == TEST_ROWS


def test_an_auc_of_one_label_says_it_is_undefined_and_is_null_in_json(tmp_path):
    """An eval set of one label has no AUC: the line says why, and the JSON figures hold null where json.dump
    would write NaN (which strict JSON readers refuse)."""
    from worker.results import NO_AUC, json_figures

    r = {"model": "lr", "shards": 1, "eval_auc": float("nan"), "eval_logloss": 0.25, "eval_examples": 10}
    assert f"eval   AUC {NO_AUC}  logloss 0.2500  (10 examples)" in format_results(r)
    based = format_results({**r, "eval_positive_rate": 0.2, "eval_constant_logloss": 0.5004})
    assert (
        "(10 examples)\nbase   20.0% positive: predicting that rate for every example gives logloss 0.5004, the "
        "figure to beat" in based
    )  # no "(AUC 0.5)": there is no AUC
    defined = format_results({**r, "eval_auc": 0.7, "eval_positive_rate": 0.2, "eval_constant_logloss": 0.5004})
    assert "gives logloss 0.5004 (AUC 0.5), the figure to beat" in defined
    for rate in (0.0, 1.0):  # one class: a constant prediction scores logloss 0, which no model beats
        one = format_results({**r, "eval_positive_rate": rate, "eval_constant_logloss": 0.0})
        assert f"base   {rate:.1%} positive: the eval data holds one class, so no figure to beat" in one
        assert "the figure to beat" not in one
    text = json.dumps(json_figures({"a": [float("nan"), 1.5], "b": {"c": float("nan")}, "d": "nan"}))
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {"a": [None, 1.5], "b": {"c": None}, "d": "nan"}


def test_a_stopped_geo_workers_last_progress_line_counts_the_examples_it_pushed(servers, files, monkeypatch, capsys):
    """geo with --geo-every 3, Ctrl-C as step 9's batch is read: 8 steps trained, the deltas of steps 1-6 pushed
    at steps 3 and 6, those of 7 and 8 as it stops (the servers did not fail): the last line counts all 800 as
    pushed. A SIGKILL leaves the line before, whose "pushed" counts only what the servers held then."""
    from worker import loop_progress

    train_path, _ = files
    addresses, _ = servers(1)
    interrupt_at_batch(monkeypatch, 9)
    monkeypatch.setattr(loop_progress.ProgressLines, "JSON_EVERY_S", 0.0)  # a line after every step
    with pytest.raises(KeyboardInterrupt):
        train(small_run(addresses, train_path, mode="geo", geo_every=3, epochs=2, prefetch=1, progress_lines=True))
    lines = [json.loads(line.removeprefix("PROGRESS ")) for line in capsys.readouterr().out.strip().splitlines()
             if line.startswith("PROGRESS ")]  # fmt: skip
    assert (lines[-1]["examples"], lines[-1]["steps"]) == (800, 8) and "pushed" not in lines[-1], lines[-1]
    pushed = [line.get("pushed", line["examples"]) for line in lines[:-1]]  # a line a step, as a SIGKILL leaves them
    assert pushed == [0, 0, 300, 300, 300, 600, 600, 600], lines


def test_a_geo_worker_whose_last_push_fails_after_its_last_step_reports_what_the_servers_hold(
    servers, files, monkeypatch, capsys
):
    """geo --geo-every 4, 6 steps: the deltas of steps 1-4 pushed at step 4, the push of steps 5 and 6 as the run
    ends fails (its servers gone). The worker's last PROGRESS line, which launch's hint reads, says so at once (a
    run this short has written no periodic line): 600 examples trained, 400 of them pushed."""
    from worker.geo import GeoTables

    train_path, _ = files
    addresses, _ = servers(1)
    flush, flushes = GeoTables.flush, []

    def last_push_fails(self):
        flushes.append(self.steps)
        if self.steps == 6:
            raise ServerUnavailableError("shard 0 did not answer")
        return flush(self)

    monkeypatch.setattr(GeoTables, "flush", last_push_fails)
    with pytest.raises(ServerUnavailableError):
        train(small_run(addresses, train_path, mode="geo", geo_every=4, progress_lines=True))
    assert flushes == [4, 6]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("PROGRESS ")]
    assert lines, "no PROGRESS line"
    last = json.loads(lines[-1].removeprefix("PROGRESS "))
    assert (last["examples"], last["steps"], last.get("pushed")) == (600, 6, 400), last


def test_a_stopped_allreduce_run_leaves_its_mlp_on_the_servers(servers, files, monkeypatch):
    """--dense allreduce keeps the MLP in the workers until the end: a Ctrl-C between steps has worker 0 write it
    (allreduce_stop.save_dense_on_stop), so the servers' MLP tables hold rows (before, none: the MLP the job began
    with)."""
    pytest.importorskip("torch", reason="the allreduce dense path runs among torch workers only")
    train_path, _ = files
    addresses, _ = servers(1)
    interrupt_at_batch(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        train(replace(small_run(addresses, train_path), model="dnn", hidden=(8,), dense="allreduce",
                                  backend="torch"))  # fmt: skip
    with Client(addresses) as client:
        mlp = {
            t.name: t.num_rows for t in client.stats()[0].tables if t.name.startswith("dense.") and "bias" not in t.name
        }
    assert mlp and all(rows > 0 for rows in mlp.values()), mlp

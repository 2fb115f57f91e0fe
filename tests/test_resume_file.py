"""--resume-file (worker/resume.py): a worker stopped part way and started again with the same command trains on
from where its pushes had reached, not from its stream's start; a finished one trains nothing; a file of another
run, or a damaged one, is refused, naming what differs."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

import worker.loop
from ps.stamp import job_hash
from worker.__main__ import main as worker_main
from worker.cluster import LocalCluster
from worker.results import ended_figures
from worker.resume import RESUMING_AS_KEPT, read_position, recorded
from worker.resume_settings import libsvm_reading
from worker.resume_writer import PositionWriter
from worker.schema_builtin import resolve_schema
from worker.train_config import TrainConfig

ROWS, BATCH = 6000, 500  # 12 steps of the large recipe's single epoch
FLAGS = ["--model", "lr", "--recipe", "large", "--batch-size", str(BATCH), "--synthetic-rows", str(ROWS),
         "--synthetic-eval-rows", "500", "--no-progress"]  # fmt: skip


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = worker_main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def interrupt_after(monkeypatch, steps: int) -> None:
    """A Ctrl-C as the step numbered `steps` ends (its push answered and counted: loop.logloss comes after)."""
    real, calls = worker.loop.logloss, [0]

    def counting(labels, probs):
        calls[0] += 1
        if calls[0] == steps:
            raise KeyboardInterrupt
        return real(labels, probs)

    monkeypatch.setattr(worker.loop, "logloss", counting)


def test_a_stopped_worker_started_again_trains_on_from_its_position_and_a_finished_one_trains_nothing(
    tmp_path, capsys, monkeypatch
):
    """A finished one says so, writes --metrics-out saying its run ended before, and exits 0, where the servers
    hold the model its run ended in; on servers that hold another, it is refused, saying what trains them."""
    position = tmp_path / "position.json"
    with LocalCluster(1) as cluster:
        train = ["train", "--servers", cluster.addresses[0], "--resume-file", str(position), *FLAGS]
        interrupt_after(monkeypatch, 5)
        code, out, err = run(train, capsys)
        assert code == 130 and "no position yet; this run keeps it there" in out, err
        record = json.loads(position.read_text())
        assert (record["examples"], record["finished"]) == (5 * BATCH, False)  # the 5 steps whose pushes were answered
        assert f"run the same command again (--resume-file {position} holds the position)" in err, err  # the hint
        assert "--skip-examples" not in err  # which the file's position would refuse
        monkeypatch.undo()
        code, out, err = run(train, capsys)
        assert code == 0, err
        assert f"resuming after {5 * BATCH:,} training examples" in out
        assert re.search(rf"trained lr .* on {ROWS - 5 * BATCH:,} examples", out), out  # the rest, once
        assert json.loads(position.read_text())["finished"] is True
        metrics = tmp_path / "metrics.json"
        code, out, err = run([*train, "--metrics-out", str(metrics)], capsys)
        assert code == 0 and f"this worker's run ended before, after {ROWS:,} examples; nothing to do" in out, err
        assert "trained lr" not in out
        assert json.loads(metrics.read_text()) == ended_figures(ROWS)  # what a launcher reads of this worker
        code, out, err = run([*train, "--skip-examples", "100"], capsys)
        assert code == 2 and "--skip-examples 100 and --resume-file" in err and "started with --skip-examples 0" in err
        code, out, err = run([*train[:-1], "--epochs", "2", "--no-progress"], capsys)
        assert (
            code == 2 and "is the position of a run with other settings (epochs: not given in the file != 2 now)" in err
        )
    with LocalCluster(1) as emptied:  # servers that hold another model (new data dirs): the run did not end there
        code, out, err = run([*train[:2], emptied.addresses[0], *train[3:]], capsys)
        assert code == 2 and "nothing to do" not in out, out
        assert (
            f"--resume-file {position} holds the position of a model the servers no longer hold: shard 0 "
            f"({emptied.addresses[0]}) was restored from a checkpoint, or started on a new data dir"
        ) in err, err


def test_a_position_is_refused_on_servers_restored_or_emptied_since_it_was_written(tmp_path, capsys, monkeypatch):
    """The file keeps the shards' model state ids: servers that hold another model (restored from a checkpoint, or
    on new data dirs) would be trained on from a position none of their rows has seen."""
    position = tmp_path / "position.json"
    with LocalCluster(1) as cluster:
        train = ["train", "--servers", cluster.addresses[0], "--resume-file", str(position), *FLAGS]
        interrupt_after(monkeypatch, 3)
        assert run(train, capsys)[0] == 130
        monkeypatch.undo()
        written = json.loads(position.read_text())["state_ids"]
        assert len(written) == 1 and written[0] > 0
    with LocalCluster(1) as emptied:  # another data dir under the same run's settings
        train[2] = emptied.addresses[0]
        code, out, err = run(train, capsys)
        assert code == 2 and "trained lr" not in out
        assert (
            f"--resume-file {position} holds the position of a model the servers no longer hold: shard 0 "
            f"({emptied.addresses[0]}) was restored from a checkpoint, or started on a new data dir"
        ) in err, err
        assert json.loads(position.read_text())["state_ids"] == written, "the refused run wrote nothing"


def test_state_ids_of_another_shard_count_differ_and_a_zero_is_unknown():
    from worker.resume import state_changed

    servers = ["a:1", "b:1", "c:1"]
    assert state_changed("f", (), (1, 2), servers) is None  # a file that recorded none
    assert state_changed("f", (1, 2), (1, 2), servers) is None
    assert state_changed("f", (0, 2), (5, 2), servers) is None  # a server that did not say: unknown for its shard
    assert state_changed("f", (1, 2), (1, 0), servers) is None
    assert "shard 1 (b:1) was restored" in state_changed("f", (1, 2), (1, 3), servers)
    assert "on 2 shards, and the servers are 3" in state_changed("f", (1, 2), (1, 2, 3), servers)


def test_a_damaged_position_is_refused_and_a_missing_one_is_a_first_start(tmp_path):
    cfg = TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "p.json"))
    assert read_position(cfg) is None
    good = '"run": {}, "started_from": 0, "trained": false, "finished": false'
    for text in ("", "{", '{"format": 1}', '{"format": 2, "examples": 1, ' + good + "}",
                 '{"format": 1, "examples": -1, ' + good + "}", '{"format": 1, "examples": "1", ' + good + "}",
                 '{"format": 1, "examples": 1, "state_ids": 7, ' + good + "}",
                 '{"format": 1, "examples": 1, "state_ids": [-7], ' + good + "}", "[1]"):  # fmt: skip
        (tmp_path / "p.json").write_text(text)
        with pytest.raises(ValueError, match=r"p.json is no position this program wrote .*remove it to train from"):
            read_position(cfg)


def test_the_position_is_written_whole_at_most_every_interval_and_at_once_when_asked(tmp_path):
    cfg = TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "p.json"), worker_id=1, num_workers=2, job_id=3)
    writer = PositionWriter(cfg, every_s=3600)
    writer.update(10)  # the run's first step: at once, so that the file keeps the job id from the start
    assert (read_position(cfg).examples, read_position(cfg).job_id) == (10, 3)
    writer.update(15)  # too soon after
    assert read_position(cfg).examples == 10
    (tmp_path / ".p.json.killed.tmp").write_text("{")  # a write a kill -9 cut short: removed by the next writer
    writer = PositionWriter(cfg, every_s=3600)
    writer.write(20)
    assert read_position(cfg).examples == 20 and not list(tmp_path.glob(".*.tmp"))
    writer.update(30)
    assert read_position(cfg).examples == 20
    writer.every_s = 0
    writer.update(40)
    assert read_position(cfg).examples == 40
    other = TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "p.json"), worker_id=0, num_workers=2, job_id=3)
    with pytest.raises(ValueError, match=r"worker_id: 1 in the file != 0 now"):
        read_position(other)  # another worker's position


def test_a_start_without_job_id_takes_the_files_and_one_given_another_is_refused(tmp_path, capsys):
    """The file keeps the run's job id: a worker killed without a word leaves its job holding the shards, which
    let only that job push, so the same command started again (no --job-id) must train under it."""
    from worker.cli_train import resumed

    cfg = TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "p.json"))
    first = resumed(cfg)  # no file yet: no id yet (TrainConfig.with_recipe makes the run's up)
    assert first.job_id is None
    writer = PositionWriter(first)
    writer.job_id = made = first.with_recipe(1000)[
        0
    ].job_id  # as train() does: the file keeps it from the first step on
    assert made and first.with_recipe(1000)[0].job_id != made  # a new one per run
    writer.update(10)
    assert json.loads((tmp_path / "p.json").read_text())["job_id"] == made
    assert resumed(cfg).job_id == made and resumed(cfg).skip_examples == 10
    assert resumed(dataclasses.replace(cfg, job_id=made)).job_id == made
    with pytest.raises(ValueError, match=rf"other settings \(job_id: {made} in the file != 7 now\): give"):
        resumed(dataclasses.replace(cfg, job_id=7))


def test_the_file_keeps_the_jobs_name_which_a_start_under_its_id_takes_and_an_older_file_keeps_none(tmp_path):
    """A run under --job-id j3 keeps the name with the id: a start without --job-id, or given the id as a number,
    names the job 'j3' as before; a file written without the name (an older version's) loads, naming none; a
    name that is not the kept id's is damage, refused."""
    from worker.cli_train import resumed

    path, j3 = tmp_path / "p.json", job_hash("j3")
    PositionWriter(resumed(TrainConfig(servers=("h:1",), resume_file=str(path), job_id=j3, job_name="j3"))).update(10)
    record = json.loads(path.read_text())
    assert (record["job_id"], record["job_name"]) == (j3, "j3")
    bare = TrainConfig(servers=("h:1",), resume_file=str(path))
    for cfg in (bare, dataclasses.replace(bare, job_id=j3)):
        assert (resumed(cfg).job_id, resumed(cfg).job_name, resumed(cfg).skip_examples) == (j3, "j3", 10)
    assert resumed(dataclasses.replace(bare, job_id=j3, job_name="j3")).job_name == "j3"
    for other, said in ((dataclasses.replace(bare, job_id=job_hash("j4"), job_name="j4"), "'j3' in the file != 'j4'"),
                        (dataclasses.replace(bare, job_id=7), "'j3' in the file != 7")):  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(f"other settings (job_id: {said} now): give")):
            resumed(other)  # named as typed, not by the ids they hash to
    for older in ({k: v for k, v in record.items() if k != "job_name"}, {**record, "job_name": None}):
        path.write_text(json.dumps(older))
        assert (resumed(bare).job_id, resumed(bare).job_name, resumed(bare).skip_examples) == (j3, "", 10)
    for bad, why in (("j4", f"job_name 'j4' is not the name of job_id {j3}"), (7, "a field of the wrong type"),
                     ("j\n3", "job_name 'j\\n3' is not the name of job_id")):  # fmt: skip
        path.write_text(json.dumps({**record, "job_name": bad}))
        with pytest.raises(ValueError, match=re.escape(f"is no position this program wrote ({why}")):
            resumed(bare)


def test_a_restart_without_job_id_names_the_job_as_its_first_start_did(tmp_path, capsys, monkeypatch):
    """Started with --job-id j3, stopped, started again with the same command less --job-id: its stamps carry the
    job's name (the shards' messages name it 'j3'), and its file keeps it."""
    from worker.client import Client

    position, stamps = tmp_path / "position.json", []
    real = Client.create_table

    def create_table(self, cfg, replace_untrained=False, stamp=None):
        stamps.append(stamp)
        return real(self, cfg, replace_untrained, stamp)

    with LocalCluster(1) as cluster:
        train = ["train", "--servers", cluster.addresses[0], "--resume-file", str(position), *FLAGS]
        interrupt_after(monkeypatch, 3)
        code, out, err = run([*train, "--job-id", "j3"], capsys)
        assert code == 130 and json.loads(position.read_text())["job_name"] == "j3", err
        monkeypatch.undo()
        monkeypatch.setattr(Client, "create_table", create_table)
        code, out, err = run(train, capsys)
        assert code == 0 and "resuming after" in out, err
    assert stamps and all((s.job, s.job_name) == (job_hash("j3"), "j3") for s in stamps), stamps
    assert json.loads(position.read_text())["job_name"] == "j3"


def test_resume_file_is_refused_with_local_shards_and_unused_where_one_worker_cannot_resume_alone(tmp_path, caplog):
    """Local shards go with the model: refused. --dense allreduce keeps the MLP in the workers: the file is not
    used, with a warning (the deployments set it for every worker, whatever the mode)."""
    from worker.cli_train import resumed

    with pytest.raises(ValueError, match="--resume-file resumes training a model that servers hold"):
        TrainConfig(resume_file=str(tmp_path / "p.json"), local_shards=1).validate()
    cfg = resumed(TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "p.json"), dense="allreduce", model="dnn"))
    assert cfg.resume_file is None and "--dense allreduce keeps the MLP in the workers" in caplog.text
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("mode", ["sync", "ssp"])
def test_a_sync_or_ssp_position_resumes_under_a_new_job_id_and_its_own_id_is_refused(tmp_path, mode):
    """A sync or ssp job resumes whole, under a new job id (the shards keep the stopped job's clocks and applied
    steps under its id): the file's id is refused while its training is not over, never taken; a worker whose
    training was over tells the new job it is done (resume_rejoins), a finished one too, where under the file's id
    it does nothing."""
    from worker.cli_train import resumed

    path = tmp_path / "p.json"
    cfg = TrainConfig(servers=("h:1",), resume_file=str(path), mode=mode, num_workers=2, job_id=7)
    assert resumed(cfg).resume_file == str(path)  # used: no warning, no position yet
    writer = PositionWriter(cfg)
    writer.job_id = 7
    writer.update(300)
    assert json.loads(path.read_text())["examples"] == 300
    with pytest.raises(ValueError, match=rf"position in job 7 \(--mode {mode}\), which stopped after 300 of its "
                                         rf"examples, and a --mode {mode} job resumes only under a new --job-id"):  # fmt: skip
        resumed(cfg)
    again = resumed(dataclasses.replace(cfg, job_id=8))
    assert (again.job_id, again.skip_examples, again.resume_trained, again.resume_rejoins) == (8, 300, False, False)
    writer.write(500, trained=True)
    assert resumed(cfg).resume_rejoins is False  # the file's own job: it evaluates, as it would have
    trained = resumed(dataclasses.replace(cfg, job_id=8))
    assert (trained.skip_examples, trained.resume_trained, trained.resume_rejoins) == (500, True, True)
    writer.write(500, finished=True)
    assert resumed(cfg) is None  # its run ended: nothing to do
    finished = resumed(dataclasses.replace(cfg, job_id=8))
    assert (finished.resume_trained, finished.resume_rejoins) == (True, True)

    alone = TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "one.json"), mode=mode)  # one worker
    writer = PositionWriter(alone)
    writer.job_id = 7  # the one drawn at its first start
    writer.update(300)
    one = resumed(alone)
    assert one.job_id is None and one.skip_examples == 300  # a new id is drawn (with_recipe), not the file's
    writer.write(500, finished=True)
    assert resumed(alone) is None  # no peers to tell


def test_a_sync_worker_whose_training_was_over_tells_its_resumed_job_it_is_done(tmp_path, capsys):
    """Worker 1's file says its training in job j1 was over; started again with its peer under job j2, it tells j2
    that it is done before it evaluates, so worker 0 trains its share without waiting for it (a wait would end at
    the 2 s barrier timeout, stopping the job)."""
    from worker.cli_train_config import train_config_from_argv

    position = str(tmp_path / "position-{worker}.json")
    with LocalCluster(1) as cluster:

        def sync(worker: int, job: str) -> list[str]:
            return ["--servers", cluster.addresses[0], "--mode", "sync", "--num-workers", "2", "--worker-id",
                    str(worker), "--job-id", job, "--barrier-timeout", "2", "--resume-file", position, *FLAGS]  # fmt: skip

        first = train_config_from_argv(sync(1, "j1"))
        writer = PositionWriter(dataclasses.replace(first, resume_file=first.worker_resume_file()))
        writer.job_id, writer.job_name = job_hash("j1"), "j1"
        writer.write(ROWS // 2, trained=True)
        code, out, err = run(["train", *sync(1, "j2")], capsys)
        assert code == 0, out + err
        assert "telling job 'j2' (its workers resumed) that this worker is done, then evaluating" in out, out
        code, out, err = run(["train", *sync(0, "j2")], capsys)
        assert code == 0, err
        assert re.search(rf"trained lr .* on {ROWS // 2:,} examples", out), out


def test_metrics_out_naming_the_resume_file_is_refused_before_the_run(tmp_path):
    """Both written at the end: the one written last would replace the other (the figures lost, or a metrics
    object read as the position on the next start)."""
    pos = tmp_path / "p-{worker}.json"
    with pytest.raises(ValueError, match=r"--metrics-out .*p-1.json is the file of --resume-file .*p-\{worker\}"):
        TrainConfig(servers=("h:1",), resume_file=str(pos), metrics_out=str(tmp_path / "p-1.json"), worker_id=1,
                    num_workers=2, job_id=3).validate()  # fmt: skip
    TrainConfig(servers=("h:1",), resume_file=str(pos), metrics_out=str(tmp_path / "p-0.json"), worker_id=1,
                num_workers=2, job_id=3).validate()  # another worker's file: not this one's  # fmt: skip


def test_a_resume_file_that_is_a_fifo_or_a_device_is_refused_before_the_run(tmp_path):
    """Read as the position at the start (a FIFO without a writer blocked the run there for good), then replaced by
    a regular file: refused, naming it."""
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    for path in (str(fifo), os.devnull):
        with pytest.raises(ValueError, match=r"--resume-file .* is not a regular file \(a device, a FIFO\)"):
            TrainConfig(servers=("h:1",), resume_file=path).validate()


def test_workers_of_one_machine_each_keep_their_own_file(tmp_path, monkeypatch):
    from worker.resume import resume_path

    cfg = TrainConfig(
        servers=("h:1",), resume_file=str(tmp_path / "p-{worker}.json"), worker_id=3, num_workers=4, job_id=3
    )
    assert resume_path(cfg) == str(tmp_path / "p-3.json")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert resume_path(cfg) == str(tmp_path / "p-3.json")
    with pytest.raises(ValueError, match=r"the 2 workers of this machine \(LOCAL_WORLD_SIZE\) would share it; put "
                                         r"\{worker\} in its name"):  # fmt: skip
        resume_path(TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "p.json"), worker_id=3, num_workers=4))


def test_worker_in_a_folder_name_is_checked_with_the_workers_id(tmp_path):
    (tmp_path / "w2").mkdir()
    TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "w{worker}" / "p.json"), worker_id=2,
                num_workers=3, job_id=3).validate()  # fmt: skip
    with pytest.raises(ValueError, match=r"its directory .*w1 does not exist"):
        TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "w{worker}" / "p.json"), worker_id=1,
                    num_workers=3, job_id=3).validate()  # fmt: skip


def test_a_position_of_another_recipe_or_column_setting_is_refused(tmp_path):
    cfg = TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "p.json"), recipe="small",
                      drop_columns=("a", "b"))  # fmt: skip
    PositionWriter(cfg).write(100)
    assert read_position(cfg).examples == 100  # tuples read back as the same setting
    with pytest.raises(ValueError, match=r"recipe: 'small' in the file != 'large' now"):
        read_position(dataclasses.replace(cfg, recipe="large"))
    with pytest.raises(ValueError, match=r"drop_columns: \['a', 'b'\] in the file != \['a'\] now"):
        read_position(dataclasses.replace(cfg, drop_columns=("a",)))


def test_a_position_holds_the_format_its_data_is_read_in_and_one_written_as_given_resumes(tmp_path):
    """--format auto's run records the format it detects (a CSV's delimiter too); a file that recorded the flag as
    given (auto, or criteo, the default before auto) resumes where the data reads in that format, and is refused
    where it does not. Without --format read (synthetic data, a --schema) it is no setting of the stream."""
    from tests.test_format_detection import TEXTS

    for fmt, text in TEXTS.items():
        (tmp_path / fmt).write_text(text)
    cfg = TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "p.json"), data=str(tmp_path / "criteo"))
    PositionWriter(cfg).write(100)
    assert json.loads((tmp_path / "p.json").read_text())["run"]["format"] == "criteo"
    assert read_position(dataclasses.replace(cfg, format="criteo")).examples == 100
    record = json.loads((tmp_path / "p.json").read_text())
    for given in ("criteo", "auto"):  # as a file written with the flag's value holds it
        record["run"]["format"] = given
        (tmp_path / "p.json").write_text(json.dumps(record))
        assert read_position(cfg).examples == 100, given
    csv = dataclasses.replace(cfg, data=str(tmp_path / "csv"))
    record["run"].update(format="criteo", data=csv.data)
    (tmp_path / "p.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"other settings \(format: 'criteo' in the file != 'auto' \(read as 'csv'\) "
                                         r"now\)"):  # fmt: skip
        read_position(csv)
    semicolons = dataclasses.replace(cfg, data=str(tmp_path / "semicolons"), resume_file=str(tmp_path / "c.json"))
    (tmp_path / "semicolons").write_text(TEXTS["csv"].replace(",", ";"))  # (its quoted ", " too)
    PositionWriter(semicolons).write(100)  # a CSV's delimiter other than a comma is part of its format
    assert json.loads((tmp_path / "c.json").read_text())["run"]["format"] == "csv (delimiter ';')"
    assert read_position(semicolons).examples == 100
    (tmp_path / "semicolons").write_text(TEXTS["csv"])
    with pytest.raises(ValueError, match=r"other settings \(format: \"csv \(delimiter ';'\)\" in the file != 'auto' "
                                         r"\(read as 'csv'\) now\)"):  # fmt: skip
        read_position(semicolons)
    synthetic = TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "s.json"), format="criteo")
    PositionWriter(synthetic).write(100)
    assert read_position(dataclasses.replace(synthetic, format="auto")).examples == 100


def test_a_run_stopped_in_its_final_evaluation_resumes_by_evaluating_and_ends(tmp_path, capsys, monkeypatch):
    """Once training is over the file says so: a restart trains nothing, evaluates, and only then is the run's end
    recorded. With --max-examples that position is the limit, which a typed --skip-examples may not reach; a
    failed evaluation (exit 2) leaves the run not ended."""
    import worker.train

    position = tmp_path / "position.json"
    real = worker.train.final_evaluation
    with LocalCluster(1) as cluster:
        train = ["train", "--servers", cluster.addresses[0], "--resume-file", str(position), *FLAGS,
                 "--max-examples", "3000"]  # fmt: skip
        monkeypatch.setattr(worker.train, "final_evaluation", lambda *a: {"eval_error": "the eval file is gone"})
        code, out, err = run(train, capsys)
        assert code == 2 and "the eval file is gone" in err
        record = json.loads(position.read_text())
        assert type(record["job_id"]) is int and type(record["token"]) is int  # made up for the run: a restart's
        assert record | {"run": None, "state_ids": None, "job_id": None, "token": None} == {
            "format": 1,
            "run": None,
            "state_ids": None,
            "job_id": None,
            "job_name": None,  # (a job id made up: no name)
            "token": None,
            "resuming_as": [],
            "started_from": 0,
            "examples": 3000,
            "trained": True,
            "finished": False,
            "best_not_put_back": False,  # (no early stopping: no best model to put back)
        }
        monkeypatch.setattr(worker.train, "final_evaluation", real)
        code, out, err = run(train, capsys)
        assert code == 0 and "training ended after 3,000 examples, its final evaluation did not" in out, err
        assert "eval   AUC" in out
        assert json.loads(position.read_text())["finished"] is True
        code, out, err = run(train, capsys)
        assert code == 0 and "nothing to do" in out
        position.unlink()
        code, out, err = run([*train, "--skip-examples", "3000"], capsys)  # typed by a person: refused
        assert code == 2 and "--skip-examples 3,000 reaches this worker's --max-examples limit" in err, err


@pytest.mark.skipif(
    not os.path.exists("/dev/full"), reason="needs /dev/full (Linux): a write that fails as on a full disk"
)
def test_a_metrics_out_that_cannot_be_written_says_so_after_the_summary_and_the_run_is_not_ended(tmp_path, capsys):
    """A full disk under --metrics-out once training is over: the summary is still printed, then an error naming
    the flag (exit 2); the position is not marked finished, so the same command evaluates and writes them again."""
    position, metrics = tmp_path / "position.json", tmp_path / "m.json"
    with LocalCluster(1) as cluster:
        train = ["train", "--servers", cluster.addresses[0], "--resume-file", str(position), *FLAGS]
        code, out, err = run([*train, "--metrics-out", "/dev/full"], capsys)
        assert code == 2 and "eval   AUC" in out and "metrics written" not in out, (out, err)
        assert ("ps-worker: error: --metrics-out /dev/full: could not write the run's figures: [Errno 28] No space "
                "left on device") in err, err  # fmt: skip
        assert json.loads(position.read_text())["finished"] is False
        code, out, err = run([*train, "--metrics-out", str(metrics)], capsys)
        assert code == 0 and "its final evaluation did not: evaluating" in out and "metrics written" in out, err
        assert json.loads(metrics.read_text())["eval_auc"] > 0.5
        assert json.loads(position.read_text())["finished"] is True


def test_a_resume_file_another_run_still_uses_is_refused_and_free_once_it_ends(tmp_path, capsys):
    """The same command started twice at once would train the worker's share twice and write one position: the
    second is refused, naming the first's process; once the first has ended the file resumes as ever."""
    import subprocess
    import sys

    position = tmp_path / "position.json"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom worker.resume_writer import held\n"
                               f"with held({str(position)!r}):\n    print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        with LocalCluster(1) as cluster:
            train = ["train", "--servers", cluster.addresses[0], "--resume-file", str(position), *FLAGS]
            code, out, err = run(train, capsys)
            assert code == 2 and f"--resume-file {position} is in use by another run (process {holder.pid}, " in err
            assert not position.exists()  # nothing trained, nothing written
            holder.kill()
            holder.wait()
            code, out, err = run(train, capsys)
            assert code == 0 and "no position yet" in out, err
            assert json.loads(position.read_text())["finished"] is True
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_file_that_is_a_link_is_not_followed(tmp_path):
    """The lock beside the file (its holder's process id written into it) is never a link's target: a link planted
    at .NAME.lock (a shared directory such as /tmp) would have the run cut the file it points to."""
    from worker.resume_writer import held

    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not the run's\n")
    (tmp_path / ".position.json.lock").symlink_to(elsewhere)
    with held(str(tmp_path / "position.json")):
        pass
    assert elsewhere.read_text() == "not the run's\n"


def test_an_empty_resume_file_setting_is_none(monkeypatch):
    from worker.cli_train_config import train_config_from_argv

    monkeypatch.setenv("PS_RESUME_FILE", "")
    assert train_config_from_argv(["--servers", "h:1"]).resume_file is None


def early_stopped(address: str, position, *more: str) -> list[str]:
    """A train command whose early stopping ends it short of its 20 epochs (lr, the small recipe, patience 1)."""
    return ["train", "--servers", address, "--resume-file", str(position), "--model", "lr", "--recipe", "small",
            "--epochs", "20", "--early-stop", "1", "--synthetic-rows", "3000", "--synthetic-eval-rows", "500",
            "--no-progress", *more]  # fmt: skip


def interrupted(*args: object) -> None:
    raise KeyboardInterrupt


def test_an_early_stopped_run_stopped_in_its_final_evaluation_is_only_evaluated_again(tmp_path, capsys, monkeypatch):
    """Early stopping ended the training short of the stream: a restart must not train on past that point (on top
    of the best model put back), only evaluate."""
    import worker.train

    position = tmp_path / "position.json"
    with LocalCluster(1) as cluster:
        train = early_stopped(cluster.addresses[0], position)
        monkeypatch.setattr(worker.train, "final_evaluation", interrupted)
        code, out, err = run(train, capsys)
        record = json.loads(position.read_text())
        assert code == 130 and record["trained"] and not record["finished"], (out, err)
        monkeypatch.undo()
        code, out, err = run(train, capsys)
        assert code == 0 and "its final evaluation did not: evaluating" in out and "eval   AUC" in out, err
        assert re.search(r"trained lr .* on 0 examples", out), out  # no step at all
        after = json.loads(position.read_text())
        assert after["finished"] and after["examples"] == record["examples"]


def test_an_early_stopped_run_stopped_as_it_puts_the_best_model_back_is_not_trained_on_when_started_again(
    tmp_path, capsys, monkeypatch, caplog
):
    """Early stopping ended the training and a Ctrl-C came while the best model was put back (after the last step):
    the run says there is nothing to resume, but that the tables do not hold the best model, and its file agrees:
    a restart trains nothing past the early stop, only evaluates, and says the model it scores is not the best
    (the file keeps saying so once the run ended)."""
    import worker.best

    position = tmp_path / "position.json"
    with LocalCluster(1) as cluster:
        train = early_stopped(cluster.addresses[0], position)
        monkeypatch.setattr(worker.best.BestModel, "restore", interrupted)
        code, out, err = run(train, capsys)
        not_best = "the tables hold the last model, or part of the best one (some tables' or shards' deltas pushed"
        assert code == 130 and "as it put early stopping's best model back: nothing to resume, but" in err, err
        assert not_best in err, err
        record = json.loads(position.read_text())
        assert record["trained"] and not record["finished"] and record["best_not_put_back"] is True, record
        monkeypatch.undo()
        caplog.clear()
        code, out, err = run(train, capsys)
        assert code == 0 and "its final evaluation did not: evaluating" in out, err
        assert not_best in caplog.text and "this evaluation scores the model the tables hold" in caplog.text, err
        assert re.search(r"trained lr .* on 0 examples", out), out  # no step past the early stop
        ended = json.loads(position.read_text())
        assert ended["examples"] == record["examples"] and ended["finished"] and ended["best_not_put_back"], ended


def test_best_not_put_back_reads_as_false_where_a_file_lacks_it_and_refuses_another_type(tmp_path):
    """A file written before best_not_put_back was recorded resumes as one whose best model was put back (or
    kept none); a value other than true or false is damage, refused."""
    from worker.cli_train import resumed

    path = tmp_path / "p.json"
    bare = TrainConfig(servers=("h:1",), resume_file=str(path))
    PositionWriter(resumed(bare)).write(10, trained=True)
    record = json.loads(path.read_text())
    assert record["best_not_put_back"] is False
    path.write_text(json.dumps({**record, "best_not_put_back": True}))
    assert resumed(bare).resume_best_not_put_back and resumed(bare).resume_trained
    path.write_text(json.dumps({k: v for k, v in record.items() if k != "best_not_put_back"}))
    assert not resumed(bare).resume_best_not_put_back and resumed(bare).resume_trained
    path.write_text(json.dumps({**record, "best_not_put_back": 1}))
    with pytest.raises(ValueError, match=re.escape("is no position this program wrote (a field of the wrong type")):
        resumed(bare)


def test_an_early_stop_at_an_eval_every_step_stopped_as_the_worker_says_it_is_done_is_not_trained_on_again(
    tmp_path, capsys, monkeypatch
):
    """Early stopping at an --eval-every evaluation of a worker that puts no best model back (one of 2 workers):
    a Ctrl-C while it tells the servers it is done (after its last step) leaves a file that trains nothing more."""
    import worker.steprows

    position = tmp_path / "position.json"
    with LocalCluster(1) as cluster:
        train = early_stopped(cluster.addresses[0], position, "--eval-every", "3", "--num-workers", "2",
                              "--worker-id", "0", "--job-id", "j1")  # fmt: skip
        monkeypatch.setattr(worker.steprows.AsyncRows, "finish", interrupted)
        code, out, err = run(train, capsys)
        assert code == 130 and "nothing to resume" in err, (out, err)
        assert json.loads(position.read_text())["trained"], position.read_text()


def test_a_command_with_skip_examples_resumes_itself_and_a_refused_skip_is_not_recorded(tmp_path, capsys,
                                                                                        monkeypatch):  # fmt: skip
    position = tmp_path / "position.json"
    with LocalCluster(1) as cluster:
        train = ["train", "--servers", cluster.addresses[0], "--resume-file", str(position), *FLAGS]
        code, out, err = run([*train, "--skip-examples", "60000"], capsys)  # past the stream: refused
        assert code == 2 and "skips every training example" in err and not position.exists(), err
        interrupt_after(monkeypatch, 3)
        code, out, err = run([*train, "--skip-examples", "1000"], capsys)
        assert code == 130 and json.loads(position.read_text())["examples"] == 1000 + 3 * BATCH
        monkeypatch.undo()
        code, out, err = run([*train, "--skip-examples", "1000"], capsys)  # the same command, as a restart policy
        assert code == 0 and f"resuming after {1000 + 3 * BATCH:,} training examples" in out, err
        assert re.search(rf"trained lr .* on {ROWS - 1000 - 3 * BATCH:,} examples", out), out


def test_a_periodic_write_that_fails_is_logged_once_and_training_goes_on(tmp_path, caplog):
    cfg = TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "p.json"))
    writer = PositionWriter(cfg, every_s=0)
    writer.update(10)
    writer.path = str(tmp_path / "gone" / "p.json")  # its folder removed: every write fails
    writer.update(20)
    writer.update(30)
    assert caplog.text.count("could not write --resume-file") == 1 and "position of 10 examples" in caplog.text
    assert read_position(cfg).examples == 10


def test_a_position_whose_file_name_is_near_the_longest_a_file_system_takes_is_written_and_its_leftovers_found(
    tmp_path,
):
    """A --resume-file name of 250 bytes, which the file system takes: its writes' temporary files (replaced_whole)
    keep within 255 bytes, where the name, a dot, mkstemp's random part and .tmp made 264 ('File name too long' at
    every write, the position never kept), and the next writer still finds a killed write's leftover."""
    from ps.storage.atomicfile import temp_prefix_within

    path = tmp_path / ("p" * 245 + ".json")
    cfg = TrainConfig(servers=("h:1",), resume_file=str(path))
    PositionWriter(cfg).write(20)
    assert read_position(cfg).examples == 20 and sorted(os.listdir(tmp_path)) == [path.name]
    killed = tmp_path / (temp_prefix_within(f".{path.name}.") + "killed1.tmp")
    killed.write_text("{")  # a write a kill -9 cut short
    assert len(os.fsencode(killed.name)) <= 255
    PositionWriter(cfg).write(30)
    assert read_position(cfg).examples == 30 and sorted(os.listdir(tmp_path)) == [path.name]


@pytest.mark.parametrize("mode", ["async", "geo"])
def test_a_second_process_given_a_workers_id_is_refused_and_the_first_restarted_with_its_file_pushes_on(
    tmp_path, capsys, monkeypatch, mode
):
    """A's run stops without a word to the shards (as SIGKILL leaves it); B, a copy of its command with its own
    --resume-file (so another token), is refused at once, training nothing; A started again with its file is the
    same process and trains on at once; once A has said it is done, B may train."""
    from worker.client import Client

    first, second = tmp_path / "first.json", tmp_path / "second.json"
    with LocalCluster(1) as cluster:
        train = ["train", "--servers", cluster.addresses[0], *FLAGS, "--mode", mode, "--worker-id", "0",
                 "--num-workers", "2", "--job-id", "4242"]  # fmt: skip
        monkeypatch.setattr(Client, "stop_job", lambda *a, **kw: [])  # the shards are told nothing
        interrupt_after(monkeypatch, 3)
        code, out, err = run([*train, "--resume-file", str(first)], capsys)
        assert code == 130, err
        monkeypatch.undo()
        code, out, err = run([*train, "--resume-file", str(second)], capsys)
        assert code == 2 and re.search(rf"worker 0 of job 4242 \(--mode {mode}\) is trained here by another process "
                                       r"\(last heard from [\d.]+ s ago;", err), err  # fmt: skip
        assert "own --worker-id in 0..1" in err and "trained lr" not in out
        code, out, err = run([*train, "--resume-file", str(first)], capsys)
        assert code == 0 and "resuming after" in out and re.search(r"trained lr .* on [1-9][\d,]* examples", out), err
        code, out, err = run([*train, "--resume-file", str(second)], capsys)
        assert code == 0 and re.search(r"trained lr .* on 3,000 examples", out), err


def test_the_job_id_and_token_are_kept_before_the_first_create_and_a_restart_takes_them(tmp_path, capsys,
                                                                                        monkeypatch):  # fmt: skip
    """A worker killed before its first step (its kernels compiling, say) holds the shards for its job from its
    first CreateTable on: its file keeps the job id and its token by then, so that a restart is that job and
    process."""
    from worker.client import Client

    position, seen = tmp_path / "position.json", []
    real = Client.create_table

    def create_table(self, cfg, replace_untrained=False, stamp=None):
        seen.append((json.loads(position.read_text()), stamp))
        return real(self, cfg, replace_untrained, stamp)

    monkeypatch.setattr(Client, "create_table", create_table)
    with LocalCluster(1) as cluster:
        code, out, err = run(["train", "--servers", cluster.addresses[0], "--resume-file", str(position), *FLAGS],
                             capsys)  # fmt: skip
        assert code == 0, err
        record, stamp = seen[0]
        assert (record["job_id"], record["token"], record["examples"]) == (stamp.job, stamp.token, 0) and stamp.token
        kept = json.loads(position.read_text())
        assert (kept["job_id"], kept["token"]) == (stamp.job, stamp.token)


def test_a_first_start_the_shards_refuse_records_nothing_and_the_corrected_command_trains(tmp_path, capsys,
                                                                                          monkeypatch):  # fmt: skip
    """B, given A's --worker-id by mistake, is refused at its first CreateTable (A's token holds worker 0): its
    file, written as it started, is removed, so that B started again with its own --worker-id (as the refusal
    says) and the same --resume-file trains its share instead of being refused as a run of other settings."""
    from worker.client import Client

    first, second = tmp_path / "first.json", tmp_path / "second.json"
    with LocalCluster(1) as cluster:
        train = ["train", "--servers", cluster.addresses[0], *FLAGS, "--mode", "async", "--num-workers", "2",
                 "--job-id", "4343"]  # fmt: skip
        monkeypatch.setattr(Client, "stop_job", lambda *a, **kw: [])  # the shards are told nothing: A holds worker 0
        interrupt_after(monkeypatch, 3)
        code, out, err = run([*train, "--worker-id", "0", "--resume-file", str(first)], capsys)
        assert code == 130 and first.exists(), err
        monkeypatch.undo()
        code, out, err = run([*train, "--worker-id", "0", "--resume-file", str(second)], capsys)
        assert code == 2 and "is trained here by another process" in err and "own --worker-id in 0..1" in err, err
        assert not second.exists()
        code, out, err = run([*train, "--worker-id", "1", "--resume-file", str(second)], capsys)
        assert code == 0 and "no position yet" in out and re.search(r"trained lr .* on 3,000 examples", out), err
        assert json.loads(second.read_text())["finished"] is True


def _hold_for_job(address: str, name: str):
    """Job `name` (ssp, 2 workers) holds the shard at address: a push stamp of its worker 0, not done, heard now
    (its barrier timeout 60 s). Returns what ends its tenancy: that worker's stop stamp."""
    from ps.stamp import WorkerStamp
    from worker.client import Client

    stamp = WorkerStamp(job_hash(name), 0, 2, 1, staleness=1, setup="mode=ssp", barrier_timeout_s=60, job_name=name)
    client = Client([address])
    client.push_many([], stamp=stamp)

    def lapse() -> None:
        assert client.stop_job(stamp, "gone") == []
        client.close()

    return lapse


def test_a_rejoining_worker_whose_done_stamp_is_refused_leaves_its_file_as_it_was(tmp_path, capsys):
    """Worker 1's training was over in job j1; started again under j2 while another job holds the shard, its done
    stamp is refused: its file still says that its training was over (and in which job), so that a later start
    evaluates instead of training its share again."""
    from worker.cli_train_config import train_config_from_argv

    position = str(tmp_path / "position-{worker}.json")
    with LocalCluster(1) as cluster:
        argv = ["--servers", cluster.addresses[0], "--mode", "sync", "--num-workers", "2", "--worker-id", "1",
                "--barrier-timeout", "2", "--resume-file", position, *FLAGS]  # fmt: skip
        first = train_config_from_argv([*argv, "--job-id", "j1"])
        writer = PositionWriter(dataclasses.replace(first, resume_file=first.worker_resume_file()))
        writer.job_id, writer.job_name = job_hash("j1"), "j1"
        writer.write(ROWS // 2, trained=True)
        before = (tmp_path / "position-1.json").read_text()
        lapse = _hold_for_job(cluster.addresses[0], "old")
        try:
            code, out, err = run(["train", *argv, "--job-id", "j2"], capsys)
        finally:
            lapse()
        assert code != 0 and "shard 0 holds job 'old'" in err, out + err
        assert (tmp_path / "position-1.json").read_text() == before


def test_a_sync_start_refused_before_it_trains_keeps_the_files_job_and_runs_again_once_the_shards_are_free(
    tmp_path, capsys
):
    """A sync worker resumed under a new --job-id j2 from a position of job j1 is refused as it creates its tables
    (another job holds the shard): its file still names job j1, so the same command, once that tenancy lapsed,
    resumes (under j2, which the file then names), rather than being refused as a restart of job j2."""
    from worker.cli_train_config import train_config_from_argv

    path = tmp_path / "position.json"
    with LocalCluster(1) as cluster:
        argv = ["train", "--servers", cluster.addresses[0], "--mode", "sync", "--resume-file", str(path),
                "--job-id", "j2", *FLAGS]  # fmt: skip
        writer = PositionWriter(train_config_from_argv(argv[1:]))
        writer.job_id, writer.job_name = job_hash("j1"), "j1"
        writer.write(2 * BATCH)
        lapse = _hold_for_job(cluster.addresses[0], "old")
        try:
            code, out, err = run(argv, capsys)
        finally:
            lapse()
        assert code != 0 and "shard 0 holds job 'old'" in err, out + err
        record = json.loads(path.read_text())
        assert (record["job_name"], record["examples"], record["trained"]) == ("j1", 2 * BATCH, False), record
        code, out, err = run(argv, capsys)
        assert code == 0 and f"resuming after {2 * BATCH:,} training examples" in out, out + err
        record = json.loads(path.read_text())
        assert (record["job_name"], record["examples"], record["finished"]) == ("j2", ROWS, True), record


def test_a_sync_position_names_the_new_job_from_its_first_acknowledged_step(tmp_path):
    """Written under a new job id, the position keeps the file's job while it has not moved (a start, a stop before
    a step), the new job as resuming_as, and names the new job at once (resuming as none) from the first step
    acknowledged, or as training ends."""
    path = tmp_path / "p.json"

    def jobs() -> tuple[int, list[int]]:  # the file's job_id and resuming_as
        record = json.loads(path.read_text())
        return record["job_id"], record["resuming_as"]

    cfg = TrainConfig(servers=("h:1",), resume_file=str(path), mode="sync", num_workers=2, job_id=7)
    PositionWriter(cfg).write(300)
    for moved, trained in ((300, False), (400, False), (300, True)):
        writer = PositionWriter(dataclasses.replace(cfg, job_id=8), every_s=3600)
        writer.keep_job_until_past(300)
        writer.update(300)
        assert jobs() == (7, [8])
        if trained:
            writer.write(moved, trained=True)
        else:
            writer.update(moved)
        assert jobs() == ((7, [8]) if (moved, trained) == (300, False) else (8, []))
        PositionWriter(cfg).write(300)


def test_resuming_as_keeps_the_last_new_jobs_and_reads_a_lone_id_as_one(tmp_path):
    """A start refused under each of many new job ids leaves the last RESUMING_AS_KEPT of them, oldest first; a
    file that holds one id as resuming_as (not a list) reads as that id alone, and the next start adds to it."""
    path = tmp_path / "p.json"
    cfg = TrainConfig(servers=("h:1",), resume_file=str(path), mode="sync", num_workers=2, job_id=7)
    PositionWriter(cfg).write(300)
    for job_id in range(100, 100 + RESUMING_AS_KEPT + 3):
        writer = PositionWriter(dataclasses.replace(cfg, job_id=job_id), every_s=3600)
        writer.keep_job_until_past(300)
        writer.update(300)
    assert recorded(str(path)) == ((7, ""), tuple(range(103, 103 + RESUMING_AS_KEPT)))
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "resuming_as": 42}))
    assert recorded(str(path)) == ((7, ""), (42,))
    writer = PositionWriter(dataclasses.replace(cfg, job_id=43), every_s=3600)
    writer.keep_job_until_past(300)
    writer.update(300)
    assert recorded(str(path)) == ((7, ""), (42, 43))


def test_each_worker_has_its_resume_file_by_one_rule_in_train_and_in_launch():
    """{worker} in --resume-file's name is the worker's id, where a worker reads its own (TrainConfig) and where
    launch checks every worker's (worker.launch_plan); a name without it is every worker's."""
    from worker.launch_plan import _resume_files
    from worker.train_config import resume_file_of

    cfg = TrainConfig(servers=("h:1",), resume_file="/d/{worker}/p-{worker}.json", num_workers=3)
    assert resume_file_of(cfg.resume_file, 2) == "/d/2/p-2.json" and resume_file_of("/d/p.json", 2) == "/d/p.json"
    assert [dataclasses.replace(cfg, worker_id=i).worker_resume_file() for i in range(3)] == _resume_files(cfg, 3)
    assert _resume_files(cfg, 3) == ["/d/0/p-0.json", "/d/1/p-1.json", "/d/2/p-2.json"]


def test_keeping_the_files_job_reads_the_file_once(tmp_path, monkeypatch):
    """keep_job_until_past takes the file's job and its resuming_as from one read (a file replaced between two
    reads would pair one record's job with another's new jobs)."""
    from worker import resume

    path = tmp_path / "p.json"
    cfg = TrainConfig(servers=("h:1",), resume_file=str(path), mode="sync", num_workers=2, job_id=7)
    PositionWriter(cfg).write(300)
    path.write_text(json.dumps({**json.loads(path.read_text()), "resuming_as": [42]}))  # job 42 refused before
    reads = []
    real = resume._file_record
    monkeypatch.setattr(resume, "_file_record", lambda p: reads.append(p) or real(p))
    writer = PositionWriter(dataclasses.replace(cfg, job_id=43), every_s=3600)
    writer.keep_job_until_past(300)
    assert reads == [str(path)]
    assert (writer.kept_job, writer.resumed_as) == ((7, ""), (42,))


def test_a_position_records_libsvm_values_and_one_written_without_it_reads_as_auto(tmp_path):
    """--libsvm-values changes the model the position was trained into: another is refused; a file written
    before the setting was recorded (no such key) is a run of auto, its default then."""
    path = tmp_path / "p.json"
    cfg = TrainConfig(servers=("h:1",), resume_file=str(path))
    PositionWriter(cfg).write(100)
    record = json.loads(path.read_text())
    assert record["run"]["libsvm_values"] == "auto"
    with pytest.raises(ValueError, match=r"libsvm_values: 'auto' in the file != 'weights' now"):
        read_position(dataclasses.replace(cfg, libsvm_values="weights"))
    path.write_text(json.dumps({**record, "run": {k: v for k, v in record["run"].items() if k != "libsvm_values"}}))
    assert read_position(cfg).examples == 100
    with pytest.raises(ValueError, match=r"libsvm_values: 'auto' in the file != 'one-hot' now"):
        read_position(dataclasses.replace(cfg, libsvm_values="one-hot"))


def test_libsvm_values_are_compared_as_the_data_is_read_under_them(tmp_path):
    """--libsvm-values auto is recorded as what it reads the data as: a start that spells that out resumes, one
    whose auto now reads the data otherwise is refused; a file of auto (written before it was resolved) is auto
    resolved by the data now. The refusal says both values and what an auto reads as."""
    data, path = tmp_path / "d.svm", tmp_path / "p.json"
    data.write_text("".join(f"{i % 2} 1:{i + 2} 2:1\n" for i in range(20)))  # values other than 0 and 1: weights
    cfg = TrainConfig(servers=("h:1",), resume_file=str(path), data=str(data), format="libsvm")
    PositionWriter(cfg).write(100)
    record = json.loads(path.read_text())
    assert record["run"]["libsvm_values"] == "weights"
    assert read_position(dataclasses.replace(cfg, libsvm_values="weights")).examples == 100
    with pytest.raises(ValueError, match=re.escape("libsvm_values: 'weights' in the file != 'one-hot' now")):
        read_position(dataclasses.replace(cfg, libsvm_values="one-hot"))
    path.write_text(json.dumps({**record, "run": {**record["run"], "libsvm_values": "auto"}}))  # an older run's
    assert read_position(dataclasses.replace(cfg, libsvm_values="weights")).examples == 100
    with pytest.raises(ValueError, match=re.escape("libsvm_values: 'auto' (read as 'weights') in the file != "
                                                   "'one-hot' now")):  # fmt: skip
        read_position(dataclasses.replace(cfg, libsvm_values="one-hot"))
    PositionWriter(cfg).write(100)
    data.write_text("".join(f"{i % 2} 1:1 2:1\n" for i in range(20)))  # now of 0 and 1 only: auto reads one-hot
    with pytest.raises(ValueError, match=re.escape("libsvm_values: 'weights' in the file != 'auto' (read as "
                                                   "'one-hot') now")):  # fmt: skip
        read_position(cfg)


@pytest.mark.parametrize("values", ["auto", "one-hot", "weights"])
@pytest.mark.parametrize("lines", ["1 1:1 2:1\n0 3:1\n", "1 1:0.5 2:1\n0 3:2\n"], ids=["zero-one", "valued"])
def test_the_recorded_libsvm_values_name_how_the_built_in_schema_reads_the_data(tmp_path, values, lines):
    data = tmp_path / "d.svm"
    data.write_text(lines)
    cfg = TrainConfig(servers=("h:1",), data=str(data), format="auto", libsvm_values=values)
    schema = resolve_schema(str(data), schema_path=None, fmt="auto", label_column=None, drop_columns=(),
                            numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4,
                            libsvm_values=values)  # fmt: skip
    read_as = "weights" if any(c.kind == "weighted" for c in schema.columns) else "one-hot"
    assert libsvm_reading(values, cfg) == read_as


def test_a_position_names_its_files_by_their_full_path_so_another_directorys_same_named_files_are_refused(
    tmp_path, monkeypatch
):
    """The data, validation and schema files of a position are the files the run read, not the text typed: one
    spelled otherwise (./train.tsv, the full path) resumes, another directory's file of the same name is refused,
    and a file holding the name as typed (relative) reads it from the directory of the start that reads it."""
    for folder in ("a", "b"):
        for name in ("train.tsv", "more.tsv", "valid.tsv", "s.toml"):
            (tmp_path / folder).mkdir(exist_ok=True)
            (tmp_path / folder / name).write_text("1\t2\n")
    monkeypatch.chdir(tmp_path / "a")
    cfg = TrainConfig(servers=("h:1",), resume_file=str(tmp_path / "p.json"), data="train.tsv,more.tsv",
                      format="criteo", validation_data="valid.tsv")  # fmt: skip
    PositionWriter(cfg).write(100)
    record = json.loads((tmp_path / "p.json").read_text())
    a = tmp_path / "a"
    assert record["run"]["data"] == f"{a / 'train.tsv'},{a / 'more.tsv'}"
    assert record["run"]["validation_data"] == str(a / "valid.tsv")
    for data in ("./train.tsv, more.tsv", f"{a / 'train.tsv'},../a/more.tsv"):
        assert read_position(dataclasses.replace(cfg, data=data)).examples == 100, data
    monkeypatch.chdir(tmp_path / "b")
    b = tmp_path / "b"
    with pytest.raises(ValueError) as refused:
        read_position(cfg)
    assert (f"data: '{a / 'train.tsv'},{a / 'more.tsv'}' in the file != 'train.tsv,more.tsv' (read as "
            f"'{b / 'train.tsv'},{b / 'more.tsv'}') now") in str(refused.value)  # fmt: skip
    assert f"validation_data: '{a / 'valid.tsv'}' in the file != 'valid.tsv' (read as '{b / 'valid.tsv'}')" in str(
        refused.value
    )
    schema = dataclasses.replace(cfg, resume_file=str(tmp_path / "s.json"), schema="s.toml")
    PositionWriter(schema).write(7)
    assert read_position(dataclasses.replace(schema, schema=str(b / "s.toml"))).examples == 7
    monkeypatch.chdir(a)
    with pytest.raises(ValueError, match=re.escape(f"schema: '{b / 's.toml'}' in the file != 's.toml' (read as ")):
        read_position(schema)
    record["run"].update(data="train.tsv,more.tsv", validation_data="valid.tsv")  # as typed, relative
    (tmp_path / "p.json").write_text(json.dumps(record))
    assert read_position(cfg).examples == 100
    monkeypatch.chdir(b)
    with pytest.raises(ValueError, match=re.escape(f"'train.tsv,more.tsv' (read as '{b / 'train.tsv'},")):
        read_position(dataclasses.replace(cfg, data="train.tsv"))

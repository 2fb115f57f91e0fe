"""A run's tables against those the servers hold (worker/tables.py): every difference found before any table is
created or read, and models that never share an MLP."""

from __future__ import annotations

import json
import re
import zlib

import numpy as np
import pytest

from ps import codec
from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.errors import (
    InvalidArgumentError,
    RamTierTooSmallError,
    TableExistsError,
    TableNotFoundError,
)
from tests.inprocess import InProcessTables
from tests.worker_runs import SMALL, run
from worker.__main__ import main as worker_main
from worker.cli_train_config import job_id
from worker.client import Client
from worker.cluster import LocalCluster
from worker.dense import table_name
from worker.model_tables import table_configs
from worker.models.spec import FieldSpec, ModelSpec
from worker.recipe import SMALL_DATA_EXAMPLES
from worker.train_config import TrainConfig


def run_out(argv: list[str], capsys) -> tuple[int, str]:
    """run, with what it printed to stdout."""
    code = worker_main(argv)
    return code, capsys.readouterr().out


def test_a_run_whose_recipe_picks_another_optimizer_is_told_the_recipe_picked_it(capsys):
    """The small recipe made lr's tables (ftrl); a run of the large recipe (adagrad) on them is refused, and the
    message quotes this run's recipe line and names the flags that train the tables further."""
    with LocalCluster(1) as cluster:
        servers = ",".join(cluster.addresses)
        assert run(["train", "--servers", servers, "--model", "lr", "--epochs", "1", "--no-progress", *SMALL],
                   capsys)[0] == 0  # fmt: skip
        code, err = run(["train", "--servers", servers, "--model", "lr", "--recipe", "large", "--no-progress", *SMALL],
                        capsys)  # fmt: skip
        assert code == 2 and "lr: optimizer.learning_rate: 0.05 != 0.02" in err, err
        assert "this run's large-data recipe for" in err and "sparse adagrad 0.02" in err, err
        assert "A run that names no optimizer gets its recipe's, by the size of its data" in err, err
        assert run(["train", "--servers", servers, "--model", "lr", "--recipe", "small", "--epochs", "1",
                    "--no-progress", *SMALL], capsys)[0] == 0  # fmt: skip


def test_deepfm_and_dnn_with_equal_widths_keep_mlps_of_their_own():
    fields = (FieldSpec("a", "t", 4), FieldSpec("_bias", "t", 4))
    deepfm, dnn = (ModelSpec(m, fields, num_dense=2, hidden=(8,)) for m in ("deepfm", "dnn"))
    names = [{table_name(p) for p in spec.dense_params()} for spec in (deepfm, dnn)]
    assert [p.name for p in deepfm.dense_params()] == [p.name for p in dnn.dense_params()]  # the same parameters
    assert not names[0] & names[1] and "dense.deepfm.mlp.0.weight" in names[0], names


@pytest.fixture(scope="module")
def servers():
    with LocalCluster(1) as cluster:
        yield ",".join(cluster.addresses)


def test_a_run_with_other_settings_is_refused_before_it_creates_any_table(servers, capsys):
    """dnn's last MLP layer exists with another shape, trained: the run is refused naming it, and the tables
    before it in the run's order (the sparse table, the first layers) are not created."""
    with Client(servers.split(",")) as client:
        client.create_table(TableConfig("dense.dnn.mlp.1.weight", 1, InitializerConfig("uniform", 0.5, seed=1)))
        client.push("dense.dnn.mlp.1.weight", np.array([0], np.uint64), np.ones((1, 1), np.float32))
    code, err = run(["train", "--servers", servers, "--model", "dnn", "--hidden", "4", "--create-tables-only",
                     *SMALL], capsys)  # fmt: skip
    assert code == 2, err
    assert "the servers hold tables of this model with other settings than this run's" in err, err
    assert "dense.dnn.mlp.1.weight: initializer." in err and "initializer.scale: 0.5 != " in err, err
    assert "nothing was created" in err, err
    with Client(servers.split(",")) as client:
        for name in ("dnn", "dense.dnn.mlp.0.weight", "dense.dnn.mlp.0.bias"):
            with pytest.raises(TableNotFoundError):
                client.describe_table(name)


def test_tables_of_other_settings_never_trained_are_replaced_by_a_run_of_one_worker_not_by_a_job(capsys, caplog):
    """A run that stopped before it trained left fm's table with another optimizer: a job's worker is refused by
    it; a run of one worker replaces it, says so, and trains; the replaced table, trained now, binds the next
    run of other settings again."""
    with LocalCluster(1) as cluster:
        servers = ",".join(cluster.addresses)
        base = ["train", "--servers", servers, "--model", "fm", "--no-progress", *SMALL]
        code, err = run([*base, "--optimizer", "sgd", "--create-tables-only"], capsys)
        assert code == 0, err
        code, err = run(
            [*base, "--optimizer", "adagrad", "--num-workers", "2", "--worker-id", "0", "--job-id", "7"], capsys
        )
        assert code == 2 and "optimizer.name: 'sgd' != 'adagrad'" in err and "nothing was created" in err, err
        code, err = run([*base, "--optimizer", "adagrad"], capsys)
        assert code == 0, err
        said = caplog.text
        assert "held 1 of this model's tables with other settings than this run's, none of them trained" in said, said
        assert "this run replaced them. fm: " in said and "optimizer.name: 'sgd' != 'adagrad'" in said, said
        with Client(cluster.addresses) as client:
            (info,) = client.describe_table("fm")
            assert info.spec.optimizer.name == "adagrad" and info.num_rows > 0
        code, err = run([*base, "--optimizer", "sgd", "--create-tables-only"], capsys)
        assert code == 2 and "optimizer.name: 'adagrad' != 'sgd'" in err, err


def test_a_run_started_while_another_has_made_its_tables_is_refused_before_it_replaces_them(capsys, monkeypatch,
                                                                                           caplog):  # fmt: skip
    """Two runs on one cluster, the second (another --embedding-dim) started while the first is between making its
    tables and its first push (forced: the second runs from the first's dense_path): the first job holds the shard
    from its first table on, so the second's replace of those untrained tables is refused, naming both jobs as their
    --job-id named them (and it says nothing of a replace), and the first trains on the tables of its own settings.
    Its `--create-tables-only` run before holds nothing."""
    import worker.train

    with LocalCluster(1) as cluster:
        servers = ",".join(cluster.addresses)
        base = ["train", "--servers", servers, "--model", "fm", "--no-progress", *SMALL]
        assert run([*base, "--embedding-dim", "8", "--job-id", "j11", "--create-tables-only"], capsys)[0] == 0
        second, dense_path = [], worker.train.dense_path

        def the_second_run_starts(*args, **kw):
            if not second:  # (the second run's own dense_path comes here too)
                second.append("started")
                second[0] = run([*base, "--embedding-dim", "4", "--job-id", "j22"], capsys)
            return dense_path(*args, **kw)

        monkeypatch.setattr(worker.train, "dense_path", the_second_run_starts)
        code, err = run([*base, "--embedding-dim", "8", "--job-id", "j11"], capsys)
        assert code == 0, err
        ((code, err),) = second
        assert code != 0 and re.search(r"shard 0 holds job 'j11' \(--mode async, 1 of its 1 workers not done, .*\), "
                                       r"so worker 0 of job 'j22' \(--mode async\) cannot train here", err), err  # fmt: skip
        assert str(job_id("j11")[0]) not in err and str(job_id("j22")[0]) not in err, err
        assert "replace" not in caplog.text, caplog.text
        with Client(cluster.addresses) as client:
            (info,) = client.describe_table("fm")
            assert info.spec.dim == 9 and info.num_rows > 0  # fm: --embedding-dim 8 and the linear term
            assert client.stats()[0].job == job_id("j11")[0]


def test_a_run_that_fails_after_making_its_tables_frees_the_shard_at_once(capsys, monkeypatch):
    """A run whose tables hold the shard for its job and that fails before its first push tells the shards it
    stopped (as one that fails while training does): the next job trains at once, not after its barrier timeout."""
    import worker.train

    def fails(*args, **kw):
        raise ValueError("a failure after the tables were made")

    with LocalCluster(1) as cluster:
        base = ["train", "--servers", ",".join(cluster.addresses), "--model", "fm", "--no-progress", *SMALL]
        with monkeypatch.context() as patched:
            patched.setattr(worker.train, "dense_path", fails)
            code, err = run([*base, "--job-id", "11"], capsys)
        assert code == 2 and "a failure after the tables were made" in err, err
        code, err = run([*base, "--job-id", "22"], capsys)
        assert code == 0, err


def test_a_shard_replaces_a_table_only_while_it_was_never_trained(tmp_path):
    from ps.engine.shard import Shard
    from ps.server_config import ServerConfig

    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    shard.create_table(TableConfig("t", 4))
    ids = np.arange(5, dtype=np.uint64)
    assert shard.pull("t", ids).shape == (5, 4)  # rows in its RAM tier, initial: not trained
    with pytest.raises(TableExistsError, match=r"dim: 4 != 8$"):
        shard.create_table(TableConfig("t", 8))
    sized_for_the_old = np.full((5, 4), 7.0, np.float32)  # a caller's out array sized for the table replaced
    counted = ("pulls", "ids_pulled", "cache_misses", "evictions")
    counts = {k: shard.table("t").stats()[k] for k in counted}
    assert counts["pulls"] == 1 and counts["ids_pulled"] == 5
    shard.create_table(TableConfig("t", 8), replace_untrained=True)
    # the counts go on under the table's name (Stats, the metrics' counters): they count from the server's start
    assert {k: shard.table("t").stats()[k] for k in counted} == counts
    with pytest.raises(
        InvalidArgumentError,
        match=r"table 't' \(dim 8\) writes into an out array of shape \(5, 8\), "
        r"float32, C order; it got shape \(5, 4\), float32, C order",
    ):
        shard.pull("t", ids, out=sized_for_the_old)
    for wrong in (np.zeros((5, 8), np.float64), np.zeros((8, 5), np.float32).T):
        with pytest.raises(InvalidArgumentError, match="writes into an out array"):
            shard.pull("t", ids, out=wrong)
    assert (sized_for_the_old == 7.0).all()
    assert shard.pull("t", ids).shape == (5, 8)
    shard.push("t", ids[:3], np.ones((3, 8), np.float32))
    with pytest.raises(TableExistsError, match=r"it holds 3 trained rows and 0 ids pushed but not admitted, and only"):
        shard.create_table(TableConfig("t", 2), replace_untrained=True)
    shard.close()
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))  # the replaced config is the one kept
    assert shard.table("t").dim == 8 and shard.table("t").num_rows == 3
    shard.close()


def test_a_table_a_shrink_emptied_stays_trained_across_a_restart_and_is_not_replaced(tmp_path, caplog):
    """Stats' trained: false for a table never pushed to, true once pushed, and still true after a Shrink drops
    every id (num_rows and pending_ids 0) and a restart; such a table is not replaced as untrained, eval scores it
    (with a warning), export and the lost-table check say it was trained."""
    from types import SimpleNamespace

    from ps.config import EvictionConfig
    from ps.engine.shard import Shard
    from ps.server_config import ServerConfig
    from worker.export import check_rows
    from worker.served import check_trained
    from worker.tables import lost_tables, untrained_on_some_shards

    cfg = TableConfig("t", 4, eviction=EvictionConfig(ttl_steps=1))
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    shard.create_table(cfg)
    shard.create_table(TableConfig("never", 4))
    ids = np.arange(5, dtype=np.uint64)
    shard.pull("never", ids)  # initial rows in RAM: not trained
    shard.push("t", ids, np.ones((5, 4), np.float32))
    assert shard.table("t").trained and not shard.table("never").trained
    shard.advance_clock(3)
    assert shard.shrink("t")["dropped"] == 5
    shard.close()
    shard = Shard(ServerConfig(data_dir=str(tmp_path)))
    try:
        stats = {t["name"]: t for t in shard.stats()["tables"]}
        assert (stats["t"]["num_rows"], stats["t"]["pending_ids"], stats["t"]["trained"]) == (0, 0, True)
        assert stats["never"]["trained"] is False
        with pytest.raises(TableExistsError, match="it was trained, and a Shrink has dropped every id, and only"):
            shard.create_table(TableConfig("t", 8), replace_untrained=True)
        shard.create_table(TableConfig("never", 8), replace_untrained=True)  # never trained: replaced
        assert shard.table("t").dim == 4 and shard.table("never").dim == 8
    finally:
        shard.close()

    emptied = SimpleNamespace(name="t", num_rows=0, pending_ids=0, trained=True)
    shards = [SimpleNamespace(tables=[emptied]), SimpleNamespace(tables=[])]
    assert "table t (0 rows and pending ids on the other shards) is on no data dir of shard 1" in lost_tables(shards)
    assert untrained_on_some_shards(shards) == ""
    with pytest.raises(ValueError, match="They were trained, and a Shrink has dropped every row since; nothing"):
        check_rows(shards, ["t"])
    client = SimpleNamespace(stats=lambda: shards[:1], servers=["s0"])
    spec = ModelSpec("lr", (FieldSpec("f", "t", 4),), 0)
    with caplog.at_level("WARNING", logger="worker.train"):
        check_trained(client, spec, "lr", "nothing was evaluated")
    assert "were trained and are now empty: a Shrink dropped every id" in caplog.text
    never = SimpleNamespace(name="t", num_rows=0, pending_ids=0, trained=False)
    with pytest.raises(ValueError, match="no trained row in them: the model was never trained"):
        check_trained(SimpleNamespace(stats=lambda: [SimpleNamespace(tables=[never])], servers=["s0"]), spec, "lr",
                      "nothing was evaluated")  # fmt: skip


def test_eval_refuses_tables_it_lacks_or_of_another_shape_and_ignores_the_optimizer(servers, capsys):
    code, err = run(["train", "--servers", servers, "--model", "deepfm", "--hidden", "4", "--no-progress",
                     "--learning-rate", "0.05", *SMALL], capsys)  # fmt: skip
    assert code == 0, err
    code, err = run(["eval", "--servers", servers, "--model", "deepfm", "--hidden", "4", *SMALL], capsys)
    assert code == 0, err  # trained with another learning rate: the forward pass is the same
    code, err = run(["eval", "--servers", servers, "--model", "deepfm", "--hidden", "6", *SMALL], capsys)
    assert code == 2 and "dense.deepfm.mlp.0.weight: dim: 4 != 6" in err and "nothing was evaluated" in err, err
    assert "(--model, --embedding-dim, --hidden, the schema and its data), or other" in err  # eval's flags only
    code, err = run(["eval", "--servers", servers, "--model", "fm", *SMALL], capsys)
    assert code == 2 and "the servers hold no table fm" in err, err
    assert re.search(r"; they hold \w+ and \d+ dense parameter tables? \(is --model that of the run", err), err


def test_eval_compares_an_mlp_parameters_shape_not_its_initializer_scale(capsys, tmp_path):
    """A --table-config that sets an MLP parameter's initializer (which eval and predict do not take) leaves its
    shape as it was: eval scores it. The shape is the parameter's width (dim) and its rows, its layer's inputs."""
    from worker.tables import SHAPE_FIELDS, held_tables

    weight = "dense.deepfm.mlp.0.weight"
    (tmp_path / "tc.toml").write_text(f'["{weight}".initializer]\nname = "uniform"\nscale = 0.05\n')
    with LocalCluster(1) as cluster:
        servers = cluster.addresses[0]
        code, err = run(["train", "--servers", servers, "--model", "deepfm", "--hidden", "4", "--no-progress",
                         "--table-config", str(tmp_path / "tc.toml"), *SMALL], capsys)  # fmt: skip
        assert code == 0, err
        code, err = run(["eval", "--servers", servers, "--model", "deepfm", "--hidden", "4", *SMALL], capsys)
        assert code == 0, err
        with Client([servers]) as client:
            held = codec.table_config_from_proto(client.describe_table(weight)[0].spec)
            rows = sum(t.num_rows for s in client.stats() for t in s.tables if t.name == weight)
            assert rows > 1
            assert held_tables(client, [held], SHAPE_FIELDS, dense_rows={weight: rows})[0] == {}
            differ = held_tables(client, [held], SHAPE_FIELDS, dense_rows={weight: rows + 1})[0]
            assert differ == {weight: [f"rows: {rows:,} != {rows + 1:,}"]}


def test_tables_remember_the_schema_another_is_refused_and_new_data_of_the_same_is_not(tmp_path, capsys):
    """Each table carries its schema's fingerprint: a run whose schema gives ids another meaning (another column
    in a position) is refused by train and eval before anything is created or scored; the same schema over other
    data (other means and stds) trains further; a table with no fingerprint takes any."""
    rng = np.random.default_rng(0)

    def csv_file(name: str, shift: float) -> str:
        lines = ["click,price,city,device"] + [
            f"{rng.integers(2)},{rng.normal(10 + shift, 2):.3f},{rng.choice(['a', 'b', 'c'])},{rng.choice(['x', 'y'])}"
            for _ in range(400)
        ]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        return str(tmp_path / name)

    first, second = csv_file("day1.csv", 0.0), csv_file("day2.csv", 5.0)
    schema = tmp_path / "s.toml"
    schema.write_text('format = "csv"\nlabel = "click"\n[[columns]]\nname = "price"\nkind = "numeric"\n'
                      'transform = "standardize"\n[[columns]]\nname = "city"\nkind = "categorical"\n'
                      '[[columns]]\nname = "device"\nkind = "categorical"\n')  # fmt: skip
    other = tmp_path / "other.toml"  # city and device swapped: the same ids, other features (mean and std given)
    other.write_text(schema.read_text().replace('"standardize"', '"standardize"\nmean = 10.0\nstd = 2.0').replace('"city"', '"tmp"').replace('"device"', '"city"').replace('"tmp"',
                                                                                                        '"device"'))  # fmt: skip
    with LocalCluster(1) as cluster:
        servers = ",".join(cluster.addresses)
        base = ["--servers", servers, "--model", "fm", "--no-progress"]
        code, err = run(["train", *base, "--data", first, "--schema", str(schema), "--epochs", "1"], capsys)
        assert code == 0, err
        with Client(cluster.addresses) as client:
            (info,) = client.describe_table("fm")
            assert info.spec.features.startswith("schema:") and len(info.spec.features) == 23
        code, err = run(["train", *base, "--data", first, "--schema", str(other), "--epochs", "1"], capsys)
        assert code == 2 and "the servers hold this model's tables trained with another schema (" in err, err
        assert "nothing was created" in err, err
        code, err = run(["eval", *base, "--data", first, "--schema", str(other), "--eval-data", second], capsys)
        assert code == 2 and "trained with another schema" in err and "nothing was evaluated" in err, err
        code, err = run(["train", *base, "--data", second, "--schema", str(schema), "--epochs", "1"], capsys)
        assert code == 0, err  # another day's data, its own mean and std: the same meaning
        with Client(cluster.addresses) as client:
            client.create_table(TableConfig("plain", 2))  # as a client that sends no fingerprint makes it
            client.create_table(TableConfig("plain", 2, features="schema:0123456789abcdef"))
            client.create_table(TableConfig("marked", 2, features="schema:0123456789abcdef"))
            client.create_table(TableConfig("marked", 2))  # a client that sends none
            with pytest.raises(TableExistsError, match=r": features: 'schema:0123456789abcdef' != 'schema:1111"):
                client.create_table(TableConfig("marked", 2, features="schema:1111111111111111"))


def test_a_ram_tier_too_small_for_the_model_names_what_all_its_tables_need():
    from ps.storage.budget import MemoryBudget
    from worker.train import too_small_for_the_model

    budget = MemoryBudget(300 << 10)
    budget.check_room(1, 898, "holds one table")  # a share of 256 rows of 898 bytes: one fits, two do not
    with pytest.raises(RamTierTooSmallError) as refused:
        budget.check_room(2, 898, "cannot take table number 2")
    refusal = ("the RAM tier (--cache-bytes 300.0 KiB) cannot take table number 2: shared by 2 tables it gives each "
               "150.0 KiB, under the 224.5 KiB a table's share must hold (256 rows of the widest table, 898 bytes a "
               "row); raise --cache-bytes to at least 449.0 KiB")  # fmt: skip
    fields = (refused.value.tables, refused.value.floor_bytes, refused.value.budget)
    assert str(refused.value) == refusal and fields == (2, 256 * 898, "cache")
    said = too_small_for_the_model(refused.value, 5)
    assert (  # 7 shares of 229,888 bytes: 1,609,216 bytes, which 1.5 MiB rounds
        said.startswith(refusal)
        and "this run makes up to 5 more, 7 in all: raise --cache-bytes to at least 1.5 MiB (1,609,216 bytes)" in said
    )
    bounded = refusal.replace("--cache-bytes 300.0 KiB", "300.0 KiB, what --memory-bytes 200.0 MiB leaves it").replace(
        "raise --cache-bytes to at least 449.0 KiB",
        "raise --memory-bytes to at least 200M, which leaves the RAM tier 449.0 KiB",
    )
    said = too_small_for_the_model(RamTierTooSmallError(bounded, 2, 256 * 898, "memory"), 5)
    assert "raise --memory-bytes until it leaves the RAM tier 1.5 MiB (1,609,216 bytes) for them all" in said
    assert "--cache-bytes to at least" not in said
    both = refusal.replace("449.0 KiB", "449.0 KiB and --memory-bytes to at least 80M")
    said = too_small_for_the_model(RamTierTooSmallError(both, 2, 256 * 898, "cache+memory"), 5)
    assert "raise --cache-bytes to at least 1.5 MiB (1,609,216 bytes) for them all and --memory-bytes to fit it" in said
    assert too_small_for_the_model(refused.value, 0) == refusal  # the last table: the shard's figure is the whole need
    # the figures and flags come from the fields, not the message: a message naming others changes nothing
    other = refusal.replace("224.5 KiB", "1.0 GiB").replace("table number 2", "table number 9")
    other = other.replace("raise --cache-bytes", "raise --memory-bytes") + " and --memory-bytes to at least 80M"
    assert too_small_for_the_model(RamTierTooSmallError(other, 2, 256 * 898, "cache"), 5).endswith(
        "7 in all: raise --cache-bytes to at least 1.5 MiB (1,609,216 bytes) for them all (more if a later table's "
        "rows are wider); the tables made so far stay, and are replaced by a later run if they differ from its settings"
    )
    no_budget = {"tables": "2", "floor_bytes": str(256 * 898)}
    received = [RamTierTooSmallError.received(refusal, "", sent) for sent in ({"tables": "2"}, no_budget)]
    for fieldless in (RamTierTooSmallError(refusal), *received):
        assert too_small_for_the_model(fieldless, 3) == (  # a shard that sent no fields (or not all three)
            f"{refusal}; this run makes 3 more tables after this one, each needing its share too"
        )


def test_a_ram_tier_refusals_counts_cross_as_ascii_counts_and_its_budget_as_a_known_flag_or_not_at_all():
    from worker.train import too_small_for_the_model

    fields = {"tables": "3", "floor_bytes": "229888", "budget": "memory"}
    copy = RamTierTooSmallError.received("head: refused", "head: ", fields)
    assert (str(copy), copy.tables, copy.floor_bytes, copy.budget) == ("head: refused", 3, 229_888, "memory")
    copy = RamTierTooSmallError.received("head: refused", "head: ", {**fields, "tables": "-3"})  # a count unread
    assert (copy.tables, copy.floor_bytes, copy.budget) == (0, 0, "memory")
    largest = str(2**64 - 1)
    copy = RamTierTooSmallError.received(
        "head: refused", "head: ", {**fields, "tables": largest, "floor_bytes": largest}
    )
    assert (copy.tables, copy.floor_bytes) == (2**64 - 1, 2**64 - 1)
    said = too_small_for_the_model(copy, 1)  # the largest counts: no OverflowError
    assert "raise --memory-bytes until it leaves the RAM tier " in said
    for bad in ("", "-1", "1.5", "\u0663", "2,048", " 3", str(2**64), "0" * 21, "1" * 5000, "9" * 400):
        copy = RamTierTooSmallError.received("head: refused", "head: ", {**fields, "floor_bytes": bad})
        assert (str(copy), copy.tables, copy.floor_bytes) == ("head: refused", 0, 0), bad
        copy = RamTierTooSmallError.received("head: refused", "head: ", {**fields, "tables": bad})
        assert (copy.tables, copy.floor_bytes) == (0, 0), bad
        assert too_small_for_the_model(copy, 3).startswith("head: refused; this run makes 3 more tables")
    no_budget = {"tables": "3", "floor_bytes": "229888"}
    for sent in (no_budget, *({**fields, "budget": bad} for bad in ("", "Cache", "cache ", "disk"))):
        copy = RamTierTooSmallError.received("head: refused", "head: ", sent)  # the counts stay; budget ""
        assert (copy.tables, copy.floor_bytes, copy.budget) == (3, 229_888, ""), sent


def test_a_table_with_ids_pushed_but_not_admitted_on_one_shard_is_not_untrained():
    """DescribeTable counts admitted rows only: ids pushed below the admission count on one shard still make the
    table trained, so the check refuses it (a replace would go through on the other shard alone)."""
    from ps.config import AdmissionConfig, OptimizerConfig
    from ps.sharding import SlotMap
    from worker.tables import check_tables

    with LocalCluster(2) as cluster, Client(cluster.addresses) as client:
        client.create_table(TableConfig("t", 4, admission=AdmissionConfig(min_count=1000)))
        ids = np.arange(10000, dtype=np.uint64)
        ids = ids[SlotMap.contiguous(2).shard_of(ids) == 0][:20]
        client.push("t", ids, np.ones((len(ids), 4), np.float32))
        assert [i.num_rows for i in client.describe_table("t")] == [0, 0]
        other = TableConfig("t", 4, optimizer=OptimizerConfig("sgd", 0.1), admission=AdmissionConfig(min_count=1000))
        with pytest.raises(ValueError, match="with other settings than this run's"):
            check_tables(client, [other], "nothing was created", replace_untrained=True)
        assert [i.spec.optimizer.name for i in client.describe_table("t")] == ["adagrad", "adagrad"]


def test_a_run_that_names_its_optimizer_is_not_told_its_recipe_picked_one(capsys):
    with LocalCluster(1) as cluster:
        servers = ",".join(cluster.addresses)
        assert run(["train", "--servers", servers, "--model", "lr", "--epochs", "1", "--no-progress", *SMALL],
                   capsys)[0] == 0  # fmt: skip
        code, err = run(["train", "--servers", servers, "--model", "lr", "--optimizer", "sgd", "--learning-rate",
                         "0.05", "--epochs", "1", "--no-progress", *SMALL], capsys)  # fmt: skip
        assert code == 2 and "optimizer.name: 'ftrl' != 'sgd'" in err, err
        assert "gets its recipe's" not in err and "this run's small-data recipe" not in err, err


def test_a_shard_restarted_on_an_empty_data_dir_is_named_as_lost_not_filled_with_new_tables(capsys):
    """A shard's data dir lost (a deleted dir, a replaced volume) and the shard restarted on a new, empty one, as a
    container orchestrator restarts it: the model's tables are on the other shard, trained, and on none of its. A
    run is refused, naming the shard and what to do, instead of creating empty tables there and training on; eval
    too. Nothing is created on the shard."""
    import shutil

    with LocalCluster(2) as cluster:
        servers = ",".join(cluster.addresses)
        train = ["train", "--servers", servers, "--model", "fm", "--epochs", "1", "--no-progress", *SMALL]
        assert run(train, capsys)[0] == 0
        cluster.kill(1)
        shutil.rmtree(cluster.data_dir(1))
        cluster.restart(1)
        code, err = run(train, capsys)
        assert code == 2 and re.search(r"table fm \([\d,]+ rows and pending ids on the other shards\) is on no data "
                                       r"dir of shard 1: a shard that lacks a trained table started on a new, empty "
                                       r"data dir", err), err  # fmt: skip
        assert "Restore every shard from a checkpoint" in err, err
        code, err = run(["eval", "--servers", servers, "--model", "fm", *SMALL], capsys)
        assert code == 2 and "is on no data dir of shard 1" in err, err
        code, err = run(["stats", "--servers", servers], capsys)
        assert (
            code == 1 and "warning: table " in err and "table fm (" in err and "is on no data dir of shard 1" in err
        ), err
        code, out = run_out(["stats", "--servers", servers, "--json"], capsys)
        (warning,) = json.loads(out)["warnings"]  # as machines read it
        assert code == 1 and "is on no data dir of shard 1" in warning, out
        from worker.checkpoint import save

        with Client(cluster.addresses) as client:
            with pytest.raises(ValueError, match=r"is on no data dir of shard 1: .*; nothing was saved"):
                save(client, str(cluster.root) + "/ckpt")
            assert [len(s.tables) for s in client.stats()][1] == 0  # nothing was created there


def test_shards_restored_from_different_checkpoints_are_named_not_trained_as_one_model(tmp_path, capsys):
    """One shard's dir lost and restored alone from a checkpoint while the other trained on: the two shards hold two
    cuts of the model. Training, a checkpoint save and stats say what each shard was restored from; once both are
    restored from the one checkpoint, training goes on."""
    import shutil

    from worker.checkpoint import save

    root = tmp_path / "ckpts"
    root.mkdir()
    with LocalCluster(2, root=str(tmp_path / "c"), extra_args=["--checkpoint-root", str(root)]) as cluster:
        servers = ",".join(cluster.addresses)
        train = ["train", "--servers", servers, "--model", "fm", "--epochs", "1", "--no-progress", *SMALL]
        assert run(train, capsys)[0] == 0
        with Client(cluster.addresses) as client:
            save(client, str(root / "a"))
        assert run(train, capsys)[0] == 0  # shard 0 trains on past the checkpoint

        def restore(shard: int) -> None:
            cluster.kill(shard)
            shutil.rmtree(cluster.data_dir(shard))
            cluster.extra_args = ["--checkpoint-root", str(root), "--restore", str(root / "a")]
            cluster.restart(shard)

        restore(1)
        code, err = run(train, capsys)
        assert code == 2 and re.search(r"the shards were not restored from one checkpoint: shard 0 from \(never "
                                       r"restored, or a server version that does not say\), shard 1 from \S+/a \(manifest [0-9a-f]{12}\)", err), err  # fmt: skip
        assert worker_main(["stats", "--servers", servers]) == 1
        out, err = capsys.readouterr()
        assert "not restored from one checkpoint" in err, err
        assert f"data dir {cluster.data_dir(1)}, restored from {root / 'a'}, up" in out, out
        refused = r"not restored from one checkpoint: .*; nothing was saved"
        with Client(cluster.addresses) as client, pytest.raises(ValueError, match=refused):
            save(client, str(root / "b"))
        assert not (root / "b").exists()
        restore(0)
        assert run(train, capsys)[0] == 0
        assert run(["stats", "--servers", servers], capsys)[0] == 0


def test_a_run_reads_the_shards_stats_once_before_it_makes_its_tables(tmp_path, capsys, monkeypatch):
    """Every check a training run makes before its tables are created (the cluster's shape, the tables' features
    on a libsvm model, their settings, the trained rows it continues, a shard that lacks its share) reads one Stats
    round: wait_ready's. A second run on the first's tables still finds and counts them from that round."""
    rng = np.random.default_rng(0)
    data = tmp_path / "train.svm"
    data.write_text("".join(f"{rng.integers(2)} " + " ".join(f"{i}:1" for i in rng.integers(0, 500, 3)) + "\n"
                            for _ in range(1000)))  # fmt: skip
    rounds: list[str] = []  # a Stats round, or "create" at each table made
    real_stats, real_create = Client.stats, Client.create_table
    monkeypatch.setattr(Client, "stats", lambda self: rounds.append("stats") or real_stats(self))
    monkeypatch.setattr(
        Client, "create_table", lambda self, *a, **kw: rounds.append("create") or real_create(self, *a, **kw)
    )
    with LocalCluster(2) as cluster:
        argv = ["train", "--servers", ",".join(cluster.addresses), "--data", str(data), "--format", "libsvm",
                "--model", "fm", "--epochs", "1", "--batch-size", "100", "--no-progress"]  # fmt: skip
        for held in (False, True):
            with Client(cluster.addresses) as client:  # the trained rows the run continues (none at first)
                trained = sum(t.num_rows for shard in client.stats() for t in shard.tables if t.name == "fm")
            assert (trained > 0) == held
            rounds.clear()
            code = worker_main(argv)
            out, err = capsys.readouterr()
            assert code == 0, err
            assert rounds.index("create") == 1 and rounds[0] == "stats", rounds
            said = f"the servers hold this model's tables with {trained:,} trained rows already"
            assert (said in out) == held, out


def test_tables_trained_one_hot_are_refused_naming_libsvm_values_weights_as_a_reason_the_run_reads_weights():
    """Tables held under the fingerprint of the built-in libsvm schema read one-hot, and a run that reads the values
    as weights (--libsvm-values weights on a file of 0 and 1, or a file with other values): the refusal says either
    may be why, and names the table; under the run's own fingerprint they are read."""
    from types import SimpleNamespace

    from worker.model_tables import held_features
    from worker.schema_builtin import builtin_schema

    def held(fingerprint: str) -> SimpleNamespace:
        table = SimpleNamespace(name="lr")
        return SimpleNamespace(stats=lambda: [SimpleNamespace(shard_id=0, tables=[table])],
                               describe_table=lambda name, shards: [SimpleNamespace(spec=SimpleNamespace(
                                   features=fingerprint))])  # fmt: skip

    one_hot = builtin_schema("libsvm", default_table="lr", default_dim=1, libsvm_fields=3)
    weighted = builtin_schema("libsvm", default_table="lr", default_dim=1, libsvm_fields=3, libsvm_weighted=True)
    with pytest.raises(ValueError, match=r"^the servers hold table lr trained on libsvm data read one-hot .* reads "
                                         r"the data's values as weights \(its values are not all 0 and 1, or "
                                         r"--libsvm-values weights says to\): "):  # fmt: skip
        held_features(held(one_hot.fingerprint()), weighted, ["lr"])
    assert held_features(held(weighted.fingerprint()), weighted, ["lr"]) == weighted.fingerprint()


def test_a_model_of_another_schema_is_refused_in_one_line_naming_its_tables_compactly(monkeypatch):
    """A model trained with another schema (every table's fingerprint differs, an MLP's input width with it) is
    refused with one line saying so, the reason and the fix once, then the tables: the sparse ones by name, the
    MLP's counted, the other differences of each named after; a difference of a table of the same schema is listed
    as before."""
    from worker import tables

    schema = "features: 'schema:76abf9fd6cad4644' != 'schema:d8c0d5342451de39'"
    differ = {"deepfm": [schema], "dense.deepfm.mlp.0.weight": [schema, "rows: 66 != 58"],
              **{f"dense.deepfm.mlp.{k}.{p}": [schema] for k in range(1, 4) for p in ("weight", "bias")}}  # fmt: skip
    monkeypatch.setattr(tables, "held_tables", lambda *args, **kwargs: (differ, [], set()))
    with pytest.raises(ValueError) as refused:
        tables.check_tables(None, [], "nothing was written", for_eval=True)
    lines = str(refused.value).splitlines()
    assert len(lines) == 2 and lines[1].startswith("nothing was written: give the settings"), lines
    assert lines[0].startswith(f"the servers hold this model's tables trained with another schema ({schema[10:]}, "
                               f"on the servers != this run): {tables.FEATURES_HINT}; read the data with the schema "
                               "the model was trained with (--schema as trained")  # fmt: skip
    assert lines[0].endswith("(tables deepfm and 7 MLP parameter tables; shapes differ too, as the schemas do: "
                             "dense.deepfm.mlp.0.weight: rows: 66 != 58)")  # fmt: skip
    assert lines[0].count(tables.FEATURES_HINT) == 1 and "an MLP parameter of another shape" not in lines[0]
    differ["dense.deepfm.logit.bias"] = ["initializer.scale: 0.1 != 0.2"]  # of the same schema
    with pytest.raises(ValueError) as refused:
        tables.check_tables(None, [], "nothing was written", for_eval=True)
    assert "\n  dense.deepfm.logit.bias: initializer.scale: 0.1 != 0.2 (an MLP parameter of another shape" in str(
        refused.value
    )


def test_a_model_of_another_schema_lists_its_tables_other_settings_one_a_line_with_their_notes(monkeypatch):
    """Of a table of another schema, only an MLP parameter's shape joins the schema's line: a sparse table's dim and
    any table's optimizer are listed one a line, with the width note and the recipe note."""
    from worker import tables

    schema = "features: 'schema:76abf9fd6cad4644' != 'schema:d8c0d5342451de39'"
    optimizer = "optimizer.name: 'ftrl' != 'adagrad'"
    differ = {"deepfm": [schema, "dim: 9 != 17", optimizer],
              "dense.deepfm.mlp.0.weight": [schema, "optimizer.learning_rate: 0.1 != 0.05", "rows: 66 != 58"]}  # fmt: skip
    monkeypatch.setattr(tables, "held_tables", lambda *args, **kwargs: (differ, [], set()))
    with pytest.raises(ValueError) as refused:
        tables.check_tables(None, [], "nothing was created", recipe_line="recipe: small data (ftrl)")
    said = str(refused.value)
    assert ("(tables deepfm and 1 MLP parameter table; shapes differ too, as the schemas do: "
            "dense.deepfm.mlp.0.weight: rows: 66 != 58)") in said  # fmt: skip
    assert f"\n  deepfm: dim: 9 != 17; {optimizer} (a row's floats: fm and deepfm hold" in said
    assert "\n  dense.deepfm.mlp.0.weight: optimizer.learning_rate: 0.1 != 0.05\n" in said  # no shape note
    assert "\nthis run's recipe: small data (ftrl).\nA run that names no optimizer gets its recipe's" in said


def _recipe_tables(model: str, examples: int) -> tuple[ModelSpec, list[TableConfig]]:
    """(spec, its tables) of `model` under the recipe --recipe auto picks for `examples` training examples."""
    cfg, _, _ = TrainConfig(local_shards=1, model=model, hidden=(4, 3)).with_recipe(examples)
    spec = ModelSpec(model, (FieldSpec("a", "t", 4), FieldSpec("_bias", "t", 4)), num_dense=2, hidden=cfg.hidden)
    return spec, table_configs(cfg, spec)


@pytest.mark.parametrize("model", ["deepfm", "dnn"])
def test_the_small_recipe_starts_deepfms_mlp_output_layer_at_zeros_and_the_large_one_as_it_did(model):
    """Under the small-data recipe deepfm's MLP output weight (its bias is zeros under either) starts at zeros, its
    rows pulled from the servers all 0, and dnn's uniform, as under the large recipe; the large recipe's tables are
    byte for byte those it made before the small one had its own: uniform glorot weights seeded by their names,
    zero biases, adam 0.001."""
    spec, small = _recipe_tables(model, 10)
    _, large = _recipe_tables(model, SMALL_DATA_EXAMPLES)
    output = f"dense.{model}.{spec.mlp_output}"
    assert spec.mlp_output == "mlp.2.weight" and output in {t.name for t in small}
    pulled = {}
    for name, tables in (("small", small), ("large", large)):
        with InProcessTables(cache_bytes=64 << 20) as shard:
            for t in tables:
                shard.create_table(t)
            pulled[name] = shard.pull_many([(output, np.arange(3, dtype=np.uint64))])[0]
    assert pulled["small"].shape == (3, 1) and np.abs(pulled["large"]).min() > 0
    if model == "deepfm":
        assert not pulled["small"].any()
        assert [t.initializer for t in small if t.name == output] == [InitializerConfig("zeros", 0.0)]
    else:  # dnn: measured worse from zeros where positives are few (worker/recipe.py)
        np.testing.assert_array_equal(pulled["small"], pulled["large"])
    before = []
    for t in large:  # the large recipe's tables as they were made before: the dense ones from their parameters
        (p,) = [p for p in spec.dense_params() if table_name(p) == t.name] or [None]
        if p is not None:
            init = (InitializerConfig("zeros", 0.0) if p.init == "zeros" else
                    InitializerConfig("uniform", p.glorot_scale, seed=zlib.crc32(p.name.encode())))  # fmt: skip
            t = TableConfig(t.name, p.shape[1], init, OptimizerConfig("adam", 0.001))
        before.append(codec.table_config_to_proto(t).SerializeToString())
    assert [codec.table_config_to_proto(t).SerializeToString() for t in large] == before
    assert [t.initializer.name for t in large if t.name.startswith("dense.")].count("uniform") == 3


def test_a_small_data_deepfm_whose_output_layer_started_uniform_trains_on_and_is_scored(capsys, tmp_path):
    """A model trained with the output layer uniform (made before the small-data recipe started it at zeros)
    holds every row of that MLP table: a run of the recipe trains it further (the table keeps the initializer it
    was made with, which makes no row any more), and eval scores it. A sparse table's initializer, which makes
    the rows of ids not seen yet, binds a run still: another is refused."""
    from worker.train import train

    output = "dense.deepfm.mlp.1.weight"
    with LocalCluster(1) as cluster:
        servers = cluster.addresses[0]
        old = TrainConfig(servers=(servers,), model="deepfm", hidden=(4,), synthetic_rows=2000,
                          synthetic_eval_rows=500, batch_size=256, epochs=1, progress=False, mlp_output_zeros=False)  # fmt: skip
        train(old)
        capsys.readouterr()
        with Client([servers]) as client:
            held = codec.table_config_from_proto(client.describe_table(output)[0].spec).initializer
        assert held.name == "uniform" and held.scale > 0
        base = ["--servers", servers, "--model", "deepfm", "--hidden", "4", *SMALL]
        code, err = run(["train", *base, "--epochs", "1", "--no-progress"], capsys)
        assert code == 0, err
        with Client([servers]) as client:
            assert codec.table_config_from_proto(client.describe_table(output)[0].spec).initializer == held
            assert sum(t.num_rows for s in client.stats() for t in s.tables if t.name == output) == 4
        assert run(["eval", *base], capsys)[0] == 0
        (tmp_path / "tc.toml").write_text('[deepfm.initializer]\nname = "uniform"\nscale = 0.001\n')
        code, err = run(["train", *base, "--no-progress", "--table-config", str(tmp_path / "tc.toml")], capsys)
        assert code == 2 and "deepfm: initializer.scale: 0.01 != 0.001" in err and output not in err, err

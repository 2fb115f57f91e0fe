"""Models that share a schema's named sparse tables: eval and predict (worker/served.py) refuse a model of another
--model whose sparse tables these are, instead of scoring it as a model trained before models had a logit bias, or
with its own dense parameters at their initial values; train refuses a model new on the servers whose sparse tables
another model trained (worker/model_tables.py check_not_others_tables)."""

from __future__ import annotations

import numpy as np
import pytest

from ps.errors import TableNotFoundError
from tests.worker_runs import run
from worker.client import Client
from worker.cluster import LocalCluster
from worker.job import prepare
from worker.model_tables import table_configs
from worker.train_config import TrainConfig

SCHEMA = """format = "csv"
label = "click"
[tables.t]
dim = 4
[[columns]]
name = "price"
kind = "numeric"
transform = "log"
[[columns]]
name = "city"
kind = "categorical"
table = "t"
[[columns]]
name = "device"
kind = "categorical"
table = "t"
"""


def csv_data(tmp_path) -> tuple[str, str]:
    """(data, schema): a csv file of 400 rows and SCHEMA."""
    rng = np.random.default_rng(0)
    lines = ["click,price,city,device"] + [
        f"{rng.integers(2)},{rng.uniform(1, 50):.2f},{rng.choice(['a', 'b', 'c'])},{rng.choice(['x', 'y'])}"
        for _ in range(400)
    ]
    data, schema = tmp_path / "d.csv", tmp_path / "s.toml"
    data.write_text("\n".join(lines) + "\n")
    schema.write_text(SCHEMA)
    return str(data), str(schema)


def test_fms_eval_and_predict_of_deepfms_tables_of_a_named_table_are_refused_naming_deepfm(tmp_path, capsys):
    """A schema that names its table gives fm and deepfm the same sparse table (one width: fm needs no projection);
    deepfm trained it. fm lacks its logit bias there, as a model trained before models had one does, but the
    servers hold deepfm's MLP made with this schema: eval and predict with --model fm are refused, naming deepfm,
    instead of scoring deepfm's rows without its MLP and with b = 0; deepfm's own flags score it."""
    data, schema = csv_data(tmp_path)
    with LocalCluster(1) as cluster:
        flags = ["--servers", cluster.addresses[0], "--data", data, "--schema", schema]
        deepfm = ["--model", "deepfm", "--hidden", "4"]
        code, err = run(["train", *flags, *deepfm, "--epochs", "1", "--no-progress"], capsys)
        assert code == 0, err
        code, err = run(["eval", *flags, *deepfm], capsys)
        assert code == 0, err
        code, err = run(["eval", *flags, "--model", "fm"], capsys)
        assert code == 2, err
        assert "the servers hold no table dense.fm.logit.bias, the logit bias of fm, and hold the dense parameter " \
               "tables of deepfm (dense.deepfm.*)" in err, err  # fmt: skip
        assert "was trained with --model deepfm, not --model fm" in err and "nothing was evaluated" in err, err
        out = tmp_path / "p.csv"
        code, err = run(["predict", *flags, "--model", "fm", "--out", str(out), "--no-progress"], capsys)
        assert code == 2 and "trained with --model deepfm, not --model fm" in err, err
        assert "nothing was written" in err and not out.exists(), err


def test_deepfms_eval_and_predict_of_fms_tables_beside_an_untrained_mlp_are_refused_naming_fm(tmp_path, capsys):
    """fm trained the schema's table; deepfm's dense tables were made beside it and never trained (by a client of
    its own here: train refuses to make them, below). eval and predict with --model deepfm are refused, naming fm
    and the dense tables never trained, instead of scoring fm's rows through an MLP at its initial values; fm's own
    flags score its model."""
    data, schema = csv_data(tmp_path)
    with LocalCluster(1) as cluster:
        flags = ["--servers", cluster.addresses[0], "--data", data, "--schema", schema]
        deepfm = ["--model", "deepfm", "--hidden", "4"]
        code, err = run(["train", *flags, "--model", "fm", "--recipe", "large", "--no-progress"], capsys)
        assert code == 0, err
        cfg, made, spec, _ = prepare(TrainConfig(servers=tuple(cluster.addresses), data=data, schema=schema,
                                                 model="deepfm", hidden=(4,), recipe="large"))  # fmt: skip
        with Client(cluster.addresses) as client:
            for t in table_configs(cfg, spec, made.schema.table_overrides(), made.schema.fingerprint()):
                if t.name.startswith("dense.deepfm."):
                    client.create_table(t)
        code, err = run(["eval", *flags, *deepfm], capsys)
        assert code == 2, err
        assert "the servers hold the sparse tables of deepfm (t) trained, but never trained its dense parameter " \
               "tables dense.deepfm.mlp.0.weight, " in err, err  # fmt: skip
        assert "the sparse tables were trained by --model fm" in err and "nothing was evaluated" in err, err
        out = tmp_path / "p.csv"
        code, err = run(["predict", *flags, *deepfm, "--out", str(out), "--no-progress"], capsys)
        assert code == 2 and "trained by --model fm" in err and "nothing was written" in err, err
        assert not out.exists()
        code, err = run(["eval", *flags, "--model", "fm"], capsys)
        assert code == 0, err


def test_a_model_new_on_the_servers_is_not_trained_on_the_sparse_tables_another_model_trained(tmp_path, capsys):
    """fm trained the schema's table (the large recipe gives deepfm the same sparse table config): train --model
    deepfm, and --create-tables-only, are refused naming fm, creating nothing, where they would train fm's rows as
    deepfm's; fm trains further. On servers of its own, deepfm trains."""
    data, schema = csv_data(tmp_path)
    with LocalCluster(1) as cluster:
        flags = ["--servers", cluster.addresses[0], "--data", data, "--schema", schema, "--recipe", "large"]
        deepfm = ["--model", "deepfm", "--hidden", "4"]
        code, err = run(["train", *flags, "--model", "fm", "--no-progress"], capsys)
        assert code == 0, err
        for more in (["--no-progress"], ["--create-tables-only"]):
            code, err = run(["train", *flags, *deepfm, *more], capsys)
            assert code == 2, err
            assert "the servers hold the sparse tables of this run (t) trained by --model fm (its dense tables " \
                   "dense.fm.* were made with this run's schema" in err, err  # fmt: skip
            assert "Train that model further with --model fm" in err and "nothing was created" in err, err
        with Client(cluster.addresses) as client, pytest.raises(TableNotFoundError):
            client.describe_table("dense.deepfm.logit.bias")
        code, err = run(["train", *flags, "--model", "fm", "--no-progress"], capsys)
        assert code == 0, err
    with LocalCluster(1) as cluster:
        code, err = run(["train", "--servers", cluster.addresses[0], "--data", data, "--schema", schema, "--recipe",
                         "large", *deepfm, "--no-progress"], capsys)  # fmt: skip
        assert code == 0, err

"""Tests for the model eval and predict score with (worker/served.py): a model of another --model whose sparse
tables these are is refused, not scored as a model trained before models had a logit bias, nor with its own dense
parameters at their initial values."""

from __future__ import annotations

import numpy as np

from tests.worker_runs import run
from worker.cluster import LocalCluster

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
    """fm trained the schema's table; `train --model deepfm --create-tables-only` made deepfm's dense tables beside
    it (the large recipe gives both models one sparse table config). eval and predict with --model deepfm are
    refused, naming fm and the dense tables never trained, instead of scoring fm's rows through an MLP at its
    initial values; fm's own flags score its model."""
    data, schema = csv_data(tmp_path)
    with LocalCluster(1) as cluster:
        flags = ["--servers", cluster.addresses[0], "--data", data, "--schema", schema]
        deepfm = ["--model", "deepfm", "--hidden", "4"]
        code, err = run(["train", *flags, "--model", "fm", "--recipe", "large", "--no-progress"], capsys)
        assert code == 0, err
        code, err = run(["train", *flags, *deepfm, "--recipe", "large", "--create-tables-only"], capsys)
        assert code == 0, err
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

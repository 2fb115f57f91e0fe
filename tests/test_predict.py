"""Tests for `ps-worker predict` (worker/predict.py): against a model trained on in-process servers, its
probabilities equal a reference FM's on the rows the servers hold, and lr's and deepfm's computed from its export
(ids never trained by their initial rows), and give eval's AUC and logloss; a file without
labels scores as the same file with them (criteo, csv, libsvm); malformed lines keep `line` right; --out refusals.
Training and eval still refuse a file without labels."""

from __future__ import annotations

import csv
import dataclasses
import errno
import gzip
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from ps.config import InitializerConfig
from ps.rows.initializers import init_rows
from tests.conftest import TEST_ROWS, exported
from tests.reference_models import FactorizationMachine
from worker import predict as predict_module
from worker.__main__ import build_parser, main
from worker.cli_predict import predict_config
from worker.client import Client
from worker.formats import read_batches
from worker.metrics import auc, logloss, sigmoid
from worker.models.spec import BIAS_FIELD
from worker.recipe import SMALL
from worker.schema_builtin import builtin_schema
from worker.served import evaluate_servers
from worker.train import train
from worker.train_config import TrainConfig


def small_run(servers: list[str], data: str, **more) -> TrainConfig:
    more = {"model": "fm", **more}
    return TrainConfig(servers=tuple(servers), data=data, recipe="large", batch_size=100, progress=False,
                       server_timeout_s=0, **more)  # fmt: skip


def predict(address: str, out, *flags: str) -> int:
    return main(["predict", "--servers", address, "--out", str(out), "--no-progress", "--batch-size", "64", *flags])


def read_out(path) -> tuple[list[str], dict[str, np.ndarray]]:
    """(header, {column: values}) of a predict output file."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], np.array(rows[1:], dtype=np.float64).reshape(-1, len(rows[0]))
    return header, {name: body[:, k] for k, name in enumerate(header)}


def without_label(src, dst, fmt: str) -> None:
    """dst: src with its label column taken out (csv: the first column; criteo, libsvm: the first token)."""
    with open(src) as f, open(dst, "w") as g:
        for line in f:
            sep = {"criteo": "\t", "csv": ",", "libsvm": " "}[fmt]
            g.write(line.split(sep, 1)[1] if sep in line else line)


def test_probabilities_are_a_reference_fms_and_give_evals_figures(servers, files, tmp_path, capsys):
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path))
    out = tmp_path / "p.csv"
    assert predict(addresses[0], out, "--data", train_path, "--predict-data", test_path, "--model", "fm") == 0
    said = capsys.readouterr().out
    assert f"wrote {TEST_ROWS} predictions of fm (line, probability, label) for {test_path} to {out} in " in said
    seconds, rate = re.search(r" in ([0-9.]+) s \(([0-9,]+) rows/s\)", said).groups()
    assert abs(TEST_ROWS / int(rate.replace(",", "")) - float(seconds)) <= 0.005, said  # seconds said to 0.01
    header, got = read_out(out)
    assert header == ["line", "probability", "label"]
    assert got["line"].tolist() == list(range(1, TEST_ROWS + 1))
    labels = np.array([float(line.split("\t")[0]) for line in Path(test_path).read_text().splitlines()])
    assert np.array_equal(got["label"], labels)

    figures = evaluate_servers(small_run(addresses, train_path, eval_data=test_path))
    assert auc(got["label"], got["probability"]) == pytest.approx(figures["eval_auc"], abs=1e-6)
    assert logloss(got["label"], got["probability"]) == pytest.approx(figures["eval_logloss"], abs=1e-6)

    # the oracle: each example's rows pulled one field at a time, through tests/reference_models.py's FM
    schema = builtin_schema("criteo", default_table="fm", default_dim=8)
    (batch,) = read_batches(test_path, schema, TEST_ROWS)
    with Client(addresses) as client:
        rows = np.stack([client.pull("fm", bags.ids) for bags in batch.fields.values()], axis=1)
        logit_bias = float(client.pull("dense.fm.logit.bias", np.zeros(1, np.uint64))[0, 0])
    assert BIAS_FIELD in batch.fields and rows.shape == (TEST_ROWS, 40, 9)
    expected = sigmoid(FactorizationMachine(8, None).logits(rows.astype(np.float64)) + logit_bias)
    np.testing.assert_allclose(got["probability"], expected, rtol=0, atol=2e-6)


def test_a_small_data_fm_starts_its_rows_at_the_recipes_scale_and_is_scored_and_trained_on(servers, files, tmp_path):
    """The small-data recipe's (--recipe auto) fm tables start their rows in +-SMALL.fm_init_scale (an id no line
    holds pulls its initial row); eval, predict and a second training run read the tables it made."""
    addresses, _ = servers(1)
    train_path, test_path = files
    run = TrainConfig(servers=tuple(addresses), data=train_path, model="fm", epochs=2, progress=False,
                      server_timeout_s=0)  # fmt: skip
    train(run)
    with Client(addresses) as client:
        fresh = client.pull("fm", np.array([2**63 + 12345], np.uint64))
    assert 0 < np.abs(fresh).max() <= SMALL.fm_init_scale < 0.01
    assert predict(addresses[0], tmp_path / "p.csv", "--data", train_path, "--predict-data", test_path) == 0
    assert 0.0 <= evaluate_servers(dataclasses.replace(run, eval_data=test_path))["eval_auc"] <= 1.0
    assert train(run)["epochs_run"] == 2


def exported_rows(folder, table: str, ids: np.ndarray) -> np.ndarray:
    """(len(ids), dim) float64: each id's row in export folder's table, or, for an id it holds no row of, its
    table's initial one (export.json's initializer: docs/reliability.md, what a serving system computes)."""
    info = json.loads((folder / "export.json").read_text())["tables"][table]
    held, rows = exported(folder, table)
    out = np.zeros((len(ids), info["dim"]), np.float32)
    init = info["initializer"]
    init_rows(InitializerConfig(init["name"], init["scale"], seed=init["seed"]), ids, out, info["dim"])
    where = {int(i): k for k, i in enumerate(held)}
    for k, i in enumerate(ids.tolist()):
        if i in where:
            out[k] = rows[where[i]]
    return out.astype(np.float64)


def test_lr_and_deepfm_score_as_their_export_with_initial_rows_for_ids_never_trained(servers, files, tmp_path):
    """predict's probabilities against numpy over `ps-worker export`'s files: every 4th line's categorical values
    are ones no training line has (rows the servers never trained: their initializer's), and scoring them adds
    no row to the servers."""
    addresses, _ = servers(1, checkpoint_root=str(tmp_path))
    train_path, test_path = files
    lines = Path(test_path).read_text().splitlines(True)
    for k in range(0, len(lines), 4):
        cells = lines[k].rstrip("\n").split("\t")
        lines[k] = "\t".join(cells[:14] + [f"{0xABC0000 + 100 * k + j:x}" for j in range(26)]) + "\n"
    unseen = tmp_path / "unseen.tsv"
    unseen.write_text("".join(lines))
    schema = builtin_schema("criteo", default_table="t", default_dim=8)
    (batch,) = read_batches(str(unseen), schema, TEST_ROWS)
    for model in ("lr", "deepfm"):
        train(small_run(addresses, train_path, model=model, hidden=(8, 4)))
    with Client(addresses) as client:
        rows_before = {t.name: t.num_rows for t in client.stats()[0].tables}
    export = tmp_path / "export"
    assert main(["export", "--servers", addresses[0], str(export), "--no-progress"]) == 0
    for model in ("lr", "deepfm"):
        out = tmp_path / f"{model}.csv"
        hidden = ["--hidden", "8,4"] if model == "deepfm" else []  # (lr has no MLP: --hidden is refused)
        assert predict(addresses[0], out, "--data", train_path, "--predict-data", str(unseen), "--model", model,
                       *hidden) == 0  # fmt: skip
        rows = np.stack([exported_rows(export, model, bags.ids) for bags in batch.fields.values()], axis=1)
        logit = exported_rows(export, f"dense.{model}.logit.bias", np.zeros(1, np.uint64))[0, 0] + rows[:, :, 0].sum(1)
        if model == "deepfm":
            v = rows[:, :, 1:]
            logit += 0.5 * ((v.sum(1) ** 2).sum(1) - (v * v).sum((1, 2)))
            h = np.concatenate([v.reshape(len(v), -1), batch.dense.astype(np.float64)], axis=1)
            for i, width in enumerate((8, 4, 1)):
                weight = exported_rows(export, f"dense.{model}.mlp.{i}.weight", np.arange(h.shape[1], dtype=np.uint64))
                h = h @ weight + exported_rows(export, f"dense.{model}.mlp.{i}.bias", np.zeros(1, np.uint64))
                h = np.maximum(h, 0) if width > 1 else h
            logit += h[:, 0]
        got = read_out(out)[1]
        assert got["line"].tolist() == list(range(1, TEST_ROWS + 1))
        np.testing.assert_allclose(got["probability"], sigmoid(logit), rtol=0, atol=2e-6)
        held = set(exported(export, model)[0].tolist())
        assert not held & set(batch.fields["C1"].ids[::4].tolist())  # those lines' ids were never trained
    with Client(addresses) as client:
        assert {t.name: t.num_rows for t in client.stats()[0].tables} == rows_before


def to_csv(src, dst) -> None:
    """A CSV of a Criteo file's label and its categorical columns C1..C6."""
    with open(src) as f, open(dst, "w") as g:
        g.write("click," + ",".join(f"C{k}" for k in range(1, 7)) + "\n")
        for line in f:
            cells = line.rstrip("\n").split("\t")
            g.write(",".join([cells[0], *cells[14:20]]) + "\n")


def to_libsvm(src, dst) -> None:
    """A libsvm file of a Criteo file's label and its columns C1..C6 (an empty cell: id 0 with value 0)."""
    with open(src) as f, open(dst, "w") as g:
        for line in f:
            cells = line.rstrip("\n").split("\t")
            tokens = [f"{int(c, 16)}:1" if c else "0:0" for c in cells[14:20]]
            g.write(" ".join([cells[0], *tokens]) + "\n")


CONVERT = {"criteo": lambda src, dst: os.link(src, dst), "csv": to_csv, "libsvm": to_libsvm}


def test_predict_and_eval_pulling_ahead_give_the_scores_of_pulling_each_batch_in_turn(servers, files, tmp_path, capsys):
    """--prefetch 0 (each batch read, pulled and scored in turn), 1 (the default) and 3: the same output file, byte
    for byte, and the same eval figures; the file's 150 rows in batches of 64 end with a short batch."""
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path))
    outs = []
    for depth in (0, 1, 3):
        outs.append(tmp_path / f"p{depth}.csv")
        given = ["--data", train_path, "--predict-data", test_path, "--model", "fm", "--prefetch", str(depth)]
        assert predict(addresses[0], outs[-1], *given) == 0
    texts = [out.read_text() for out in outs]
    assert texts[0].count("\n") == TEST_ROWS + 1 and texts[1] == texts[0] and texts[2] == texts[0]
    figures = [evaluate_servers(small_run(addresses, train_path, eval_data=test_path, prefetch=k)) for k in (0, 1, 3)]
    assert figures[1] == figures[0] and figures[2] == figures[0] and figures[0]["eval_examples"] == TEST_ROWS


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
def test_a_file_without_labels_scores_as_the_file_with_them(servers, files, tmp_path, fmt):
    addresses, _ = servers(1)
    train_path, test_path = (str(tmp_path / f"{name}.{fmt}") for name in ("train", "test"))
    for src, dst in zip(files, (train_path, test_path)):
        CONVERT[fmt](src, dst)
    train(small_run(addresses, train_path, model="lr", format=fmt))
    unlabeled = str(tmp_path / f"new.{fmt}")
    without_label(test_path, unlabeled, fmt)
    flags = ["--data", train_path, "--format", fmt, "--model", "lr"]
    assert predict(addresses[0], tmp_path / "labeled.out", *flags, "--predict-data", test_path) == 0
    assert predict(addresses[0], tmp_path / "new.out", *flags, "--predict-data", unlabeled) == 0
    header, labeled = read_out(tmp_path / "labeled.out")
    new_header, new = read_out(tmp_path / "new.out")
    assert (header, new_header) == (["line", "probability", "label"], ["line", "probability"])
    assert np.array_equal(new["line"], labeled["line"]) and len(new["line"]) == TEST_ROWS
    assert np.array_equal(new["probability"], labeled["probability"])
    assert len(np.unique(new["probability"])) > 10  # the model tells examples apart
    alone = ["--format", fmt, "--model", "lr", "--data", unlabeled]
    if fmt != "csv":  # the unlabeled file alone gives the schema
        assert predict(addresses[0], tmp_path / "alone.out", *alone) == 0
        assert np.array_equal(read_out(tmp_path / "alone.out")[1]["probability"], labeled["probability"])
    else:  # a csv header's first column would be taken for the label: refused unless that column holds labels
        with pytest.raises(ValueError, match="its label column is unknown"):
            predict_config(build_parser().parse_args(["predict", "--servers", addresses[0], "--out",
                                                      str(tmp_path / "alone.out"), *alone])).validate()  # fmt: skip
        assert predict(addresses[0], tmp_path / "itself.out", *alone[:-1], test_path) == 0  # a labeled file alone
    # training and eval refuse it, as any file without labels
    with pytest.raises(ValueError, match=r"(holds|has) no labels .*(eval scores a model against them|training and "
                                         r"evaluation read labeled lines); `ps-worker predict`"):  # fmt: skip
        evaluate_servers(small_run(addresses, train_path, model="lr", format=fmt, eval_data=unlabeled))
    with pytest.raises(ValueError, match="label|columns"):
        train(small_run(addresses, unlabeled, model="lr", format=fmt, max_bad_lines=0))


def test_a_libsvm_model_scores_only_with_the_field_count_it_was_trained_with(servers, files, tmp_path, capsys):
    """Each field a line leaves out adds its missing id's row: the training file's K (6 here) scores a file whose
    lines hold at most 3 features otherwise than that file's own K (3) would, so predict refuses the file alone
    and scores it with the training file, or with --libsvm-fields 6, alike."""
    addresses, _ = servers(1)
    train_path, short = str(tmp_path / "train.svm"), str(tmp_path / "short.svm")
    to_libsvm(files[0], train_path)
    with open(files[1]) as f, open(short, "w") as g:
        for line in f:
            cells = line.rstrip("\n").split("\t")
            g.write(" ".join([cells[0], *(f"{int(c, 16)}:1" for c in cells[14:17] if c)]) + "\n")
    train(small_run(addresses, train_path, model="lr", format="libsvm"))
    flags = ["--format", "libsvm", "--model", "lr"]
    assert predict(addresses[0], tmp_path / "alone.csv", *flags, "--predict-data", short) == 2
    err = capsys.readouterr().err
    assert "trained with another schema" in err and "unless --libsvm-fields gives the training run's" in err, err
    assert not (tmp_path / "alone.csv").exists()
    assert predict(addresses[0], tmp_path / "k.csv", *flags, "--libsvm-fields", "6", "--predict-data", short) == 0
    assert predict(addresses[0], tmp_path / "train.csv", *flags, "--data", train_path, "--predict-data", short) == 0
    assert (tmp_path / "k.csv").read_text() == (tmp_path / "train.csv").read_text()


def test_a_libsvm_model_made_before_its_field_count_was_recorded_is_read_as_it_was_trained(
    servers, files, tmp_path, monkeypatch
):
    """Tables whose fingerprint is the built-in libsvm schema's without K (Schema.legacy_fingerprint) are scored
    and trained on under it, whatever K the run reads: their K was never recorded."""
    from worker.schema import Schema

    addresses, _ = servers(1)
    train_path, short = str(tmp_path / "train.svm"), str(tmp_path / "short.svm")
    to_libsvm(files[0], train_path)
    lines = Path(train_path).read_text().splitlines()
    Path(short).write_text("".join(" ".join(line.split(" ")[:3]) + "\n" for line in lines))  # K = 2
    current = Schema.fingerprint
    monkeypatch.setattr(Schema, "fingerprint", lambda self, *a, **k: current(self, False))
    train(small_run(addresses, train_path, model="lr", format="libsvm"))
    monkeypatch.undo()
    flags = ["--format", "libsvm", "--model", "lr"]
    assert predict(addresses[0], tmp_path / "alone.csv", *flags, "--predict-data", short) == 0
    train(small_run(addresses, short, model="lr", format="libsvm"))  # trains on, under the tables' fingerprint
    with Client(addresses) as client:
        held = {client.describe_table(t.name)[0].spec.features for t in client.stats()[0].tables}
    schema = builtin_schema("libsvm", default_table="lr", default_dim=1, libsvm_fields=2)
    assert held == {schema.legacy_fingerprint()} != {schema.fingerprint()}


def test_tables_trained_under_a_schema_files_spaced_label_are_read_with_that_schema_file(
    servers, tmp_path, monkeypatch, capsys
):
    """`ps-worker schema` wrote a header `id, click, ...`'s label as `label = " click"`, and tables trained with that
    file carry the fingerprint of the label as written (the oracle: the fingerprint of the schema whose label is
    " click"). The same schema file, whose label is now read as "click", scores and trains them further (its
    legacy_fingerprint), where a schema of another label is still refused."""
    from worker.schema import Schema
    from worker.schema_file import load_schema

    addresses, _ = servers(1)
    data = tmp_path / "people.csv"
    write_people(data, 300, seed=4)
    data.write_text(data.read_text().replace("id,click,site,note", "id, click, site, note", 1))
    schema_path = tmp_path / "schema.toml"
    schema_path.write_text('format = "csv"\nlabel = " click"\n\n[[columns]]\nname = "site"\nkind = "categorical"\n')
    schema = load_schema(str(schema_path), default_table="lr", default_dim=1)
    assert schema.label == "click"
    written = Schema.fingerprint(dataclasses.replace(schema, label=" click"))  # as tables made before carry it
    current = Schema.fingerprint
    monkeypatch.setattr(Schema, "fingerprint", lambda self, *a, **k: current(dataclasses.replace(self, label=" click")))
    train(small_run(addresses, str(data), model="lr", schema=str(schema_path)))
    monkeypatch.undo()
    with Client(addresses) as client:
        held = {client.describe_table(t.name)[0].spec.features for t in client.stats()[0].tables}
    assert held == {written} != {schema.fingerprint()}
    flags = ["--data", str(data), "--schema", str(schema_path), "--model", "lr"]
    assert predict(addresses[0], tmp_path / "out.csv", *flags) == 0, capsys.readouterr().err
    train(small_run(addresses, str(data), model="lr", schema=str(schema_path)))  # trains on, under their fingerprint
    other = tmp_path / "other.toml"
    other.write_text(schema_path.read_text().replace('" click"', '"id"'))
    assert (
        predict(addresses[0], tmp_path / "other.csv", "--data", str(data), "--schema", str(other), "--model", "lr") == 2
    )
    assert "trained with another schema" in capsys.readouterr().err


def test_tables_trained_on_the_built_in_schema_of_a_spaced_header_are_refused_naming_the_schema_that_reads_them(
    servers, tmp_path, monkeypatch, capsys
):
    """A worker that read a csv header's names as written (`id, click, site, note`: ' click', ' site', ...) trained
    tables on its built-in schema whose fingerprint and ids are those of the names with their spaces; the oracle is
    a schema file naming the columns so (a30a7a2's built-in schema of such a header carried that file's
    fingerprint, and its predictions, checked by hand). The built-in schema now reads the names trimmed: a run on it
    is refused, naming a schema file, and that file scores the tables as the oracle file does."""
    from worker.schema import Schema

    addresses, _ = servers(1)
    data = tmp_path / "people.csv"
    write_people(data, 300, seed=4)
    data.write_text(data.read_text().replace("id,click,site,note", "id, click, site, note", 1))
    oracle = tmp_path / "oracle.toml"
    oracle.write_text('format = "csv"\nlabel = " click"\n' + "".join(
        f'\n[[columns]]\nname = "{name}"\nkind = "categorical"\n' for name in ("id", " site", " note")))  # fmt: skip
    current = Schema.fingerprint  # trained as a worker that kept the label's spaces did
    monkeypatch.setattr(Schema, "fingerprint", lambda self, *a, **k: current(dataclasses.replace(self, label=" click")))
    train(small_run(addresses, str(data), model="lr", schema=str(oracle)))
    monkeypatch.undo()
    flags = ["--data", str(data), "--model", "lr"]
    assert predict(addresses[0], tmp_path / "refused.csv", *flags) == 2
    err = capsys.readouterr().err
    assert "names the columns as written" in err and not (tmp_path / "refused.csv").exists()
    named = tmp_path / "named.toml"
    named.write_text(err[err.index('format = "csv"') :])
    assert predict(addresses[0], tmp_path / "named.csv", *flags, "--schema", str(named)) == 0, capsys.readouterr().err
    assert predict(addresses[0], tmp_path / "oracle.csv", *flags, "--schema", str(oracle)) == 0
    got, want = read_out(tmp_path / "named.csv")[1], read_out(tmp_path / "oracle.csv")[1]
    assert (
        np.array_equal(got["probability"], want["probability"]) and np.ptp(want["probability"]) > 0.01
    )  # trained rows: lr starts at 0


def test_malformed_lines_keep_each_row_on_its_line(servers, files, tmp_path, capsys, caplog):
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path, model="lr"))
    flags = ["--data", train_path, "--model", "lr"]
    assert predict(addresses[0], tmp_path / "clean.csv", *flags, "--predict-data", test_path) == 0
    clean = read_out(tmp_path / "clean.csv")[1]
    lines = Path(test_path).read_text().splitlines(keepends=True)
    unlabeled = [line.split("\t", 1)[1] for line in lines]
    damaged, where = [], []  # where: the line of each original example in the damaged file
    for k, line in enumerate(unlabeled):
        if k in (0, 7, 70):
            damaged.append("not\ta criteo line\n")
        if k == 30:
            damaged.append("\n")
        damaged.append(line)
        where.append(len(damaged))
    (tmp_path / "damaged.tsv").write_text("".join(damaged))
    capsys.readouterr()
    out = tmp_path / "damaged.csv"
    assert predict(addresses[0], out, *flags, "--predict-data", str(tmp_path / "damaged.tsv")) == 0
    said = capsys.readouterr().out
    assert f"wrote {TEST_ROWS} predictions" in said and "skipped 3 malformed lines" in said
    assert not [r for r in caplog.records if "malformed" in r.getMessage()], caplog.text  # said once, in the summary
    assert "line 1: 2 tab-separated columns, expected 39" in said
    header, got = read_out(out)
    assert header == ["line", "probability"]
    assert got["line"].tolist() == where
    assert np.array_equal(got["probability"], clean["probability"])
    # past --max-bad-lines: an error, and no file (nor a partial one) left
    assert predict(addresses[0], tmp_path / "none.csv", *flags, "--predict-data", str(tmp_path / "damaged.tsv"),
                   "--max-bad-lines", "2") == 2  # fmt: skip
    assert "more than --max-bad-lines 2" in capsys.readouterr().err
    assert not [name for name in os.listdir(tmp_path) if name.startswith((".none", "none"))]
    labeled = ["not\ta criteo line\n" * (k in (0, 7, 70)) + line for k, line in enumerate(lines)]
    (tmp_path / "damaged-labeled.tsv").write_text("".join(labeled))
    assert main(["eval", "--servers", addresses[0], *flags, "--eval-data", str(tmp_path / "damaged-labeled.tsv"),
                 "--no-progress"]) == 0  # fmt: skip
    assert f"({TEST_ROWS:,} examples; 3 malformed lines skipped (--max-bad-lines))" in capsys.readouterr().out
    none = tmp_path / "none.tsv"  # no example: what the file holds instead is said
    none.write_text("1\t1.2.3" + "\t1" * 12 + "\ta" * 26 + "\n\n")  # I1 no number
    held = f"holds only blank lines and 1 malformed line; the first malformed one: {none} line 1: "
    assert predict(addresses[0], tmp_path / "n.csv", *flags, "--predict-data", str(none), "--max-bad-lines", "1") == 2
    assert f"{none}: no examples to score (it {held}" in capsys.readouterr().err
    assert main(["eval", "--servers", addresses[0], *flags, "--eval-data", str(none), "--no-progress",
                 "--max-bad-lines", "1"]) == 2  # fmt: skip
    assert f"{none}: no examples to evaluate on (it {held}" in capsys.readouterr().err


def test_eval_and_predict_read_only_the_start_of_the_training_file(servers, files, tmp_path, capsys):
    """--data gives eval and predict the schema, from its first lines: they make no pass over the whole file (a
    large training file took minutes to count, gzip ones most), so a gzip file cut short past its start serves."""
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path))
    packed = gzip.compress(Path(train_path).read_bytes() * 200)  # 120,000 lines, about 55 MB unpacked
    cut = tmp_path / "cut.tsv.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ValueError, match="the gzip file is cut short"):  # what a pass over it meets
        train(small_run(addresses, str(cut)))
    figures = evaluate_servers(small_run(addresses, str(cut), eval_data=test_path))
    assert figures == evaluate_servers(small_run(addresses, train_path, eval_data=test_path))
    capsys.readouterr()
    out = tmp_path / "p.csv"
    assert predict(addresses[0], out, "--data", str(cut), "--predict-data", test_path, "--model", "fm") == 0
    assert f"wrote {TEST_ROWS} predictions of fm" in capsys.readouterr().out


def test_out_naming_the_file_scored_is_refused_by_the_flag_given(files, tmp_path):
    """--predict-data alone also stands for --data (the file whose first lines give the schema): an --out naming
    that file is refused naming --predict-data, the flag given, before any server is asked."""
    _, test_path = files
    for given in (["--predict-data", test_path], ["--data", test_path]):
        args = ["predict", "--servers", "127.0.0.1:1", "--out", test_path, "--overwrite", "--model", "lr", *given]
        with pytest.raises(ValueError, match=rf"--out {test_path} is the file of {given[0]} {test_path}: writing"):
            predict_config(build_parser().parse_args(args)).validate()


def test_out_is_refused_where_it_would_replace_a_file_or_the_servers_lack_the_model(servers, files, tmp_path, capsys):
    addresses, _ = servers(1)
    train_path, test_path = files
    flags = ["--data", train_path, "--predict-data", test_path, "--model", "lr"]
    out = tmp_path / "p.csv"
    assert predict(addresses[0], out, *flags) == 2  # no model on the servers yet
    err = capsys.readouterr().err
    assert "the servers hold no table lr" in err and "they hold no table at all" in err and not out.exists()
    train(small_run(addresses, train_path, model="lr"))
    out.write_text("mine\n")
    assert predict(addresses[0], out, *flags) == 2
    assert f"--out {out} exists; nothing was written" in capsys.readouterr().err
    assert out.read_text() == "mine\n"
    for input_file in (train_path, test_path):
        assert predict(addresses[0], input_file, *flags, "--overwrite") == 2
        assert f"--out {input_file} is the file of --" in capsys.readouterr().err
    assert predict(addresses[0], tmp_path, *flags) == 2
    assert "is a directory" in capsys.readouterr().err
    assert predict(addresses[0], tmp_path / "no" / "p.csv", *flags) == 2
    assert "does not exist" in capsys.readouterr().err
    assert predict(addresses[0], out, *flags, "--model", "fm") == 2  # another model than the servers hold
    assert "nothing was written" in capsys.readouterr().err and out.read_text() == "mine\n"
    fifo, link = tmp_path / "fifo", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(out)
    for special in (fifo, link):  # --overwrite would have renamed a regular file over them (over /dev/null as root)
        assert predict(addresses[0], special, *flags, "--overwrite") == 2
        assert "is not a regular file (a link, a device or a FIFO): it is never replaced" in capsys.readouterr().err
    assert os.path.islink(link) and not os.path.isfile(fifo) and out.read_text() == "mine\n"
    empty_labels = tmp_path / "empty-labels.tsv"  # a file exported for scoring with its label cells left empty
    empty_labels.write_text(
        "".join("\t" + line.split("\t", 1)[1] for line in Path(test_path).read_text().splitlines(True))
    )
    assert predict(addresses[0], tmp_path / "e.csv", "--data", train_path, "--predict-data", str(empty_labels),
                   "--model", "lr") == 0  # fmt: skip
    rows = (tmp_path / "e.csv").read_text().splitlines()  # every row scored, its label cell empty
    assert len(rows) == TEST_ROWS + 1 and all(row.endswith(",") for row in rows[1:]), rows[:3]
    assert predict(addresses[0], out, *flags, "--overwrite") == 0
    assert read_out(out)[0] == ["line", "probability", "label"]
    assert Path(train_path).read_text().splitlines()[0].count("\t") == 39  # the inputs are as they were


@pytest.mark.parametrize("link_refused", [None, errno.EPERM, errno.ENOSYS])
def test_an_out_made_by_another_process_while_predict_ran_is_replaced_only_with_overwrite(servers, files, tmp_path,
                                                                                            capsys, monkeypatch,
                                                                                            link_refused):  # fmt: skip
    """OUT did not exist as predict began, and another process (a second predict into it) wrote it while this one
    scored: without --overwrite that file stays as it is, the run fails and leaves no temporary file; with it, the
    run's predictions replace it. Alike on a file system that makes no hard link (os.link refused: EPERM, or ENOSYS
    as FUSE file systems say it)."""
    if link_refused is not None:

        def no_link(*args, **kwargs):
            raise OSError(link_refused, os.strerror(link_refused))

        monkeypatch.setattr(os, "link", no_link)
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path, model="lr"))
    out = tmp_path / "p.csv"
    write_rows = predict_module._write_rows

    def another_writes_out(*args):
        rows = write_rows(*args)
        out.write_text("line,probability\n1,0.5\n")  # the other run's, put in place meanwhile
        return rows

    monkeypatch.setattr(predict_module, "_write_rows", another_writes_out)
    flags = ["--data", train_path, "--predict-data", test_path, "--model", "lr"]
    assert predict(addresses[0], out, *flags) == 2
    err = capsys.readouterr().err
    assert f"--out {out} was made by another process while this predict ran" in err and "nothing was written" in err
    assert out.read_text() == "line,probability\n1,0.5\n" and os.listdir(tmp_path).count("p.csv") == 1
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]
    out.unlink()
    assert predict(addresses[0], out, *flags, "--overwrite") == 0
    assert len(read_out(out)[1]["line"]) == TEST_ROWS


def test_a_failed_fsync_of_outs_folder_after_its_rename_is_a_warning_with_out_whole(tmp_path, monkeypatch, caplog):
    """OUT is renamed into place whole, then the fsync of its folder fails: the run goes on (OUT is there, whole;
    only whether its name survives a power loss is unsure), with a warning that says so, and no temporary file."""
    import stat

    real_fsync, failed = os.fsync, []

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            failed.append(fd)
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    class Progress:
        def close(self) -> None:
            pass

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(predict_module, "_write_rows", lambda f, *rest: f.write("line,probability\n1,0.5\n") and 1)
    out = tmp_path / "p.csv"
    caplog.set_level("WARNING", "worker.predict")
    assert predict_module._write(str(out), [], None, Progress(), overwrite=False) == 1
    assert failed and out.read_text() == "line,probability\n1,0.5\n" and os.listdir(tmp_path) == ["p.csv"]
    assert f"--out {out} is written whole (1 rows), but the fsync of its folder failed (Input/output error)" in (
        caplog.text
    )


def test_eval_and_predict_ask_each_shard_for_its_stats_once(servers, files, tmp_path, monkeypatch):
    """served_model's checks (the cluster ready, the tables' features and shapes, the logit bias, a trained row)
    read one Stats of each shard, the one wait_ready reads, whatever the model's tables."""
    addresses, started = servers(2)
    train_path, test_path = files
    train(small_run(addresses, train_path, model="deepfm", hidden=(8,)))
    asked = []
    for server in started:
        real = server.shard.stats
        monkeypatch.setattr(
            server.shard, "stats", lambda real=real, shard=server.shard.shard_id: asked.append(shard) or real()
        )
    flags = ["--data", train_path, "--predict-data", test_path, "--model", "deepfm", "--hidden", "8"]
    assert predict(",".join(addresses), tmp_path / "p.csv", *flags) == 0
    assert sorted(asked) == [0, 1]
    asked.clear()
    figures = evaluate_servers(small_run(addresses, train_path, eval_data=test_path, model="deepfm", hidden=(8,)))
    assert sorted(asked) == [0, 1] and figures["eval_examples"] == TEST_ROWS


def test_a_model_whose_tables_hold_no_trained_row_is_neither_scored_nor_evaluated(servers, files, tmp_path, capsys):
    """Tables made by `train --create-tables-only` (or a train that failed before its first push, or the wrong
    --servers) hold the model's initial values alone: predict and eval refuse it, predict writing nothing."""
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path, create_tables_only=True))
    flags = ["--data", train_path, "--model", "fm"]
    out = tmp_path / "p.csv"
    capsys.readouterr()
    assert predict(addresses[0], out, *flags, "--predict-data", test_path) == 2
    err = capsys.readouterr().err
    assert "the servers hold the tables of fm (fm) but no trained row in them" in err, err
    assert "--create-tables-only" in err and "nothing was written" in err and not out.exists()
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".p.csv")]
    assert main(["eval", "--servers", addresses[0], *flags, "--eval-data", test_path, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "but no trained row in them" in err and "nothing was evaluated" in err, err
    train(small_run(addresses, train_path))  # trained: scored
    assert predict(addresses[0], out, *flags, "--predict-data", test_path) == 0 and out.exists()


def test_a_model_whose_ids_all_wait_for_admission_is_scored(servers, files, tmp_path):
    """Pushes of ids not admitted yet (min_count above any id's count) trained the rest of the model: its tables
    hold pending ids, no row, and predict scores it."""
    addresses, _ = servers(1)
    train_path, test_path = files
    (tmp_path / "tc.toml").write_text("[fm]\nadmission = { min_count = 1000000 }\n")
    train(small_run(addresses, train_path, table_config=str(tmp_path / "tc.toml")))
    with Client(addresses) as client:
        [stats] = [t for t in client.stats()[0].tables if t.name == "fm"]
        assert stats.num_rows == 0 and stats.pending_ids > 0
    flags = ["--data", train_path, "--model", "fm", "--predict-data", test_path]
    assert predict(addresses[0], tmp_path / "p.csv", *flags) == 0


def test_out_where_a_directory_or_glob_of_the_input_takes_it_in_is_refused_up_front(files, tmp_path, capsys):
    """--out in the --predict-data directory (or matched by its glob) would be read as data by the next run over
    that input: refused before any server is asked, nothing written; a name the input skips, or one outside, is
    not refused (the refusal after it is the servers', none answering)."""
    train_path, test_path = files
    dd = tmp_path / "dd"
    dd.mkdir()
    for name in ("a.tsv", "b.tsv"):
        (dd / name).write_bytes(Path(test_path).read_bytes())
    flags = ["--data", train_path, "--model", "lr", "--server-timeout", "0", "--timeout-s", "1"]
    for data, out in ((dd, dd / "preds.csv"), (f"{dd}/*", dd / "preds.csv"), (f"{tmp_path}/d?/*.?sv", dd / "p.csv"),
                      (f"{test_path},{dd}", dd / "preds.csv")):  # fmt: skip
        assert predict("127.0.0.1:1", out, *flags, "--predict-data", str(data)) == 2
        err = capsys.readouterr().err
        assert f"--out {out} lies where --predict-data {data} reads its files: the next run over that input would " \
               "read it as data" in err, err  # fmt: skip
        assert not out.exists()
    for data, out in ((dd, dd / ".preds.csv"), (dd, dd / "_preds.csv"), (f"{dd}/*.tsv", dd / "p.csv"),
                      (dd, tmp_path / "p.csv")):  # fmt: skip
        assert predict("127.0.0.1:1", out, *flags, "--predict-data", str(data)) == 2
        err = capsys.readouterr().err
        assert "lies where" not in err and "127.0.0.1:1" in err, err


def test_out_dash_writes_the_csv_alone_to_stdout(servers, files, tmp_path, capsys, monkeypatch):
    """--out -: stdout holds the CSV of --out FILE, and nothing else (the final line, and --json's object, go to
    stderr); no file named '-' is made. /dev/stdout, no regular file, is refused with a pointer to -."""
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path, model="lr"))
    flags = ["--data", train_path, "--predict-data", test_path, "--model", "lr"]
    assert predict(addresses[0], tmp_path / "p.csv", *flags) == 0
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    assert predict(addresses[0], "-", *flags) == 0
    out, err = capsys.readouterr()
    assert out == (tmp_path / "p.csv").read_text(), out
    assert f"wrote {TEST_ROWS} predictions" in err and " to stdout in " in err, err
    assert predict(addresses[0], "-", *flags, "--json") == 0
    out, err = capsys.readouterr()
    assert out == (tmp_path / "p.csv").read_text() and f'"rows": {TEST_ROWS}' in err
    assert not os.path.lexists(tmp_path / "-")
    assert predict(addresses[0], "/dev/stdout", *flags, "--overwrite") == 2
    assert "--out - writes the CSV to stdout" in capsys.readouterr().err


def test_out_dash_without_a_stdout_is_refused_up_front(files, capsys, monkeypatch):
    """A predict started with its stdout closed (`>&-`): an error naming --out, not AttributeError's traceback."""
    train_path, test_path = files
    monkeypatch.setattr(sys, "stdout", None)
    code = main(["predict", "--servers", "127.0.0.1:1", "--out", "-", "--data", train_path, "--model", "fm"])
    assert code == 2
    assert "--out -: this process has no stdout (it was closed); give a file to write" in capsys.readouterr().err


def test_many_files_are_scored_in_order_with_a_file_column_as_each_alone(servers, files, tmp_path, capsys):
    """A directory (its _SUCCESS skipped) is scored file by file in name order: each row names its file, and a
    file's rows are those predict writes for it alone; --data alone may name the directory; a file of another
    format is refused by name and nothing is written."""
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path))
    lines = Path(test_path).read_text().splitlines(keepends=True)
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-10").write_text("".join(lines[TEST_ROWS // 2 :]))  # after part-2, in number order
    (parts / "part-2").write_text("".join(lines[: TEST_ROWS // 2]))
    (parts / "_SUCCESS").write_text("")
    out = tmp_path / "all.csv"
    assert predict(addresses[0], out, "--data", train_path, "--predict-data", str(parts), "--model", "fm") == 0
    assert f"(file, line, probability, label) for {parts} (2 files) to {out}" in capsys.readouterr().out
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["file", "line", "probability", "label"] and len(rows) == TEST_ROWS + 1
    for name in ("part-2", "part-10"):
        alone = tmp_path / f"{name}.csv"
        assert (
            predict(addresses[0], alone, "--data", train_path, "--predict-data", str(parts / name), "--model", "fm")
            == 0
        )
        with open(alone, newline="") as f:
            want = list(csv.reader(f))[1:]
        assert [r[1:] for r in rows[1:] if r[0] == str(parts / name)] == want
    assert [r[0] for r in rows[1:]] == [str(parts / "part-2")] * (TEST_ROWS // 2) + [str(parts / "part-10")] * (
        TEST_ROWS - TEST_ROWS // 2
    )
    by_data = tmp_path / "by-data.csv"
    assert predict(addresses[0], by_data, "--data", str(parts), "--model", "fm") == 0
    assert by_data.read_text() == out.read_text()
    (parts / "part-3").write_text("1\t2\t3\n")
    capsys.readouterr()
    assert predict(addresses[0], tmp_path / "none.csv", "--data", train_path, "--predict-data", str(parts)) == 2
    assert "part-3: its first line has 3 tab-separated columns, expected 40" in capsys.readouterr().err
    assert not (tmp_path / "none.csv").exists()


def test_predict_over_a_directory_counts_bad_lines_over_all_files_and_keeps_its_file_column(servers, files, tmp_path,
                                                                                           capsys):  # fmt: skip
    """--max-bad-lines counts over the files (as eval does), not per file; a directory that matches one file still
    gets the file column, so the output's columns do not depend on how many parts a day has."""
    addresses, _ = servers(1)
    train_path, test_path = files
    train(small_run(addresses, train_path))
    lines = Path(test_path).read_text().splitlines(keepends=True)
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "part-0").write_text("".join(lines))
    (two / "part-0").write_text("".join(lines[:10]) + "garbage\n")
    (two / "part-1").write_text("".join(lines[10:20]) + "garbage\n")
    (one / "x\udcff.csv").write_text("".join(lines[:3]))  # a name that is not UTF-8, as os.listdir gives it
    assert predict(addresses[0], tmp_path / "one.csv", "--data", train_path, "--predict-data", str(one)) == 0
    assert f"(file, line, probability, label) for {one} (2 files)" in capsys.readouterr().out
    assert (tmp_path / "one.csv").read_bytes().startswith(b"file,line,probability,label\n")
    assert f"{one}/x\udcff.csv,2,".encode("utf-8", "surrogateescape") in (tmp_path / "one.csv").read_bytes()
    (one / "x\udcff.csv").unlink()
    assert predict(addresses[0], tmp_path / "one.csv", "--data", train_path, "--predict-data", str(one),
                   "--overwrite") == 0  # fmt: skip
    assert f"(file, line, probability, label) for {one} to" in capsys.readouterr().out
    capsys.readouterr()
    flags = ["--data", train_path, "--predict-data", str(two), "--max-bad-lines"]
    assert predict(addresses[0], tmp_path / "two.csv", *flags, "1") == 2
    err = capsys.readouterr().err  # the first bad line over the files is named (part-1's line 11 crossed the limit)
    assert "part-0 line 11: " in err and "2 bad lines, more than --max-bad-lines 1" in err
    assert predict(addresses[0], tmp_path / "two.csv", *flags, "2") == 0
    assert "skipped 2 malformed lines (first: " in capsys.readouterr().out


def test_a_csv_whose_first_column_holds_labels_and_blank_labels_is_taken_as_labeled(tmp_path):
    from worker.predict import _csv_label_unknown

    for text, labeled in (("label,a\n,1\n1,2\nNA,3\n0,4\n", True), ("label,a\n,1\nNA,2\n", False),
                          ("label,a\n,1\n1,2\nx,3\n", False)):  # fmt: skip
        (tmp_path / "s.csv").write_text(text)
        for fmt in ("csv", "auto"):
            assert _csv_label_unknown(fmt, str(tmp_path / "s.csv")) is not labeled, text


def test_a_csv_whose_first_column_holds_true_and_false_is_taken_as_labeled(tmp_path):
    """The readers take True/False and yes/no as labels; predict's check of the built-in schema's first column does
    too."""
    from worker.predict import _csv_label_unknown

    (tmp_path / "tf.csv").write_text("label,a\nTrue,x\nfalse,y\n1,z\nYES,u\nno,v\n")
    (tmp_path / "maybe.csv").write_text("label,a\nmaybe,x\n")
    assert not _csv_label_unknown("csv", str(tmp_path / "tf.csv")) and _csv_label_unknown(
        "csv", str(tmp_path / "maybe.csv")
    )


def test_a_csv_whose_label_is_a_column_named_like_one_is_taken_as_labeled(tmp_path):
    """Where the first column holds no labels, the one column named like a label that holds them is the label
    (schema_builtin.csv_label): the file is labeled, and predict scores it alone; two such columns, or none, leave
    the label unknown."""
    from worker.predict import _csv_label_unknown

    for text, unknown in (("id,click,a\n10,1,x\n11,0,y\n", False), ("id,click,y,a\n10,1,0,x\n", True),
                          ("id,a\n10,x\n", True), ("id,click,a\n10,maybe,x\n", True),
                          ("id,click,a\n10,yes,x\n", False)):  # fmt: skip
        (tmp_path / "s.csv").write_text(text)
        assert _csv_label_unknown("auto", str(tmp_path / "s.csv")) is unknown, text
    (tmp_path / "s.tsv").write_text("\t".join(["1", *["5"] * 39]) + "\n")  # criteo: no csv label to tell
    assert not _csv_label_unknown("auto", str(tmp_path / "s.tsv"))


def test_a_model_trained_before_models_had_a_logit_bias_is_scored_with_it_at_0(servers, files, tmp_path, caplog):
    """Its tables lack dense.fm.logit.bias: eval and predict give the model's own probabilities (b = 0) and say
    why, instead of refusing it as the model of other settings."""
    from worker.job import prepare
    from worker.model_tables import table_configs

    addresses, _ = servers(1)
    train_path, test_path = files
    cfg, data, spec, _ = prepare(small_run(addresses, train_path))
    schema = builtin_schema("criteo", default_table="fm", default_dim=8)
    (batch,) = read_batches(test_path, schema, TEST_ROWS)
    rng = np.random.default_rng(0)
    with Client(addresses) as client:
        for t in table_configs(cfg, spec, data.schema.table_overrides(), data.schema.fingerprint()):
            if t.name != "dense.fm.logit.bias":
                client.create_table(t)
        ids = np.unique(np.concatenate([bags.ids for bags in batch.fields.values()]))
        client.push("fm", ids, rng.normal(0, 0.3, (len(ids), 9)).astype(np.float32))  # rows of some model
        rows = np.stack([client.pull("fm", bags.ids) for bags in batch.fields.values()], axis=1)
    out = tmp_path / "p.csv"
    with caplog.at_level("WARNING"):
        assert predict(addresses[0], out, "--data", train_path, "--predict-data", test_path, "--model", "fm") == 0
    assert any("hold no table dense.fm.logit.bias: the model was trained before models had a logit bias; it is "
               "scored with that bias at 0" in r.getMessage() for r in caplog.records)  # fmt: skip
    _, got = read_out(out)
    expected = FactorizationMachine(8, None).predict(rows.astype(np.float64))
    np.testing.assert_allclose(got["probability"], expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize("fmt", ["criteo", "csv"])
def test_a_blank_label_cell_is_a_row_to_score_not_a_bad_line(servers, files, tmp_path, fmt):
    """A file of rows to score that keeps its label column with the cells left blank (csv: or NA): each such row
    is scored as the labeled one is, its label cell written empty; eval still takes no row without a label."""
    addresses, _ = servers(1)
    train_path, test_path = (str(tmp_path / f"{name}.{fmt}") for name in ("train", "test"))
    for src, dst in zip(files, (train_path, test_path)):
        CONVERT[fmt](src, dst)
    train(small_run(addresses, train_path, model="lr", format=fmt))
    sep = {"criteo": "\t", "csv": ","}[fmt]
    blanked = str(tmp_path / f"blank.{fmt}")
    with open(test_path) as f, open(blanked, "w") as g:
        for i, line in enumerate(f):
            if i % 3 == 1 and not (fmt == "csv" and i == 0):  # a csv's header stays
                line = ("NA" if fmt == "csv" and i % 2 else "") + sep + line.split(sep, 1)[1]
            g.write(line)
    flags = ["--data", train_path, "--format", fmt, "--model", "lr"]
    assert predict(addresses[0], tmp_path / "labeled.out", *flags, "--predict-data", test_path) == 0
    assert predict(addresses[0], tmp_path / "blank.out", *flags, "--predict-data", blanked) == 0
    with open(tmp_path / "labeled.out", newline="") as f, open(tmp_path / "blank.out", newline="") as g:
        labeled, blank = list(csv.reader(f)), list(csv.reader(g))
    assert labeled[0] == blank[0] == ["line", "probability", "label"] and len(blank) == TEST_ROWS + 1
    first = 2 if fmt == "csv" else 1  # the line number of the first example
    for (line, p, y), (line_b, p_b, y_b) in zip(labeled[1:], blank[1:], strict=True):
        assert (line, p) == (line_b, p_b)
        assert y_b == ("" if (int(line) - 1) % 3 == 1 else y) and y in ("0", "1"), (line, y, y_b)
    assert first == int(blank[1][0])
    figures = evaluate_servers(small_run(addresses, train_path, model="lr", format=fmt, eval_data=blanked,
                                         max_bad_lines=TEST_ROWS))  # fmt: skip
    assert figures["eval_examples"] == TEST_ROWS - sum(1 for row in blank[1:] if row[2] == "")


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
def test_a_label_cell_that_is_no_label_is_a_row_to_score_under_predict_and_a_bad_line_under_eval(
    servers, files, tmp_path, caplog, fmt
):
    """predict reads no label: a row whose label cell holds 2 or maybe is scored as its labeled twin, its label cell
    written empty, and one warning counts them (more than 1 in 100 of them no longer fails the run); eval still
    skips such lines as malformed."""
    addresses, _ = servers(1)
    train_path, test_path = (str(tmp_path / f"{name}.{fmt}") for name in ("train", "test"))
    for src, dst in zip(files, (train_path, test_path)):
        CONVERT[fmt](src, dst)
    train(small_run(addresses, train_path, model="lr", format=fmt))
    sep = {"criteo": "\t", "csv": ",", "libsvm": " "}[fmt]
    odd = str(tmp_path / f"odd.{fmt}")
    changed = 0
    with open(test_path) as f, open(odd, "w") as g:
        for i, line in enumerate(f):
            if i % 3 == 1 and not (fmt == "csv" and i == 0):  # a third of the rows: far past 1 in 100
                line = ("2" if i % 2 else "maybe") + sep + line.split(sep, 1)[1]
                changed += 1
            g.write(line)
    flags = ["--data", train_path, "--format", fmt, "--model", "lr"]
    assert predict(addresses[0], tmp_path / "labeled.out", *flags, "--predict-data", test_path) == 0
    caplog.clear()
    assert predict(addresses[0], tmp_path / "odd.out", *flags, "--predict-data", odd) == 0
    with open(tmp_path / "labeled.out", newline="") as f, open(tmp_path / "odd.out", newline="") as g:
        labeled, scored = list(csv.reader(f)), list(csv.reader(g))
    assert labeled[0] == scored[0] == ["line", "probability", "label"] and len(scored) == TEST_ROWS + 1
    for (line, p, y), (line_o, p_o, y_o) in zip(labeled[1:], scored[1:], strict=True):
        assert (line, p) == (line_o, p_o)
        assert y_o == ("" if (int(line) - 1) % 3 == 1 else y) and y in ("0", "1"), (line, y, y_o)
    notes = [r.getMessage() for r in caplog.records if "neither 0 nor 1 nor blank" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith(f"{changed:,} rows had a label cell"), notes
    assert f"(first: {odd} line 2: label '2')" in notes[0], notes  # the file's second line (csv: its first row)
    figures = evaluate_servers(small_run(addresses, train_path, model="lr", format=fmt, eval_data=odd,
                                         max_bad_lines=TEST_ROWS))  # fmt: skip
    assert figures["eval_examples"] == TEST_ROWS - changed and figures["bad_lines"] == changed


def test_a_labeled_criteo_file_whose_first_line_lost_its_empty_last_column_is_still_labeled(tmp_path):
    """A tool that strips trailing whitespace turns a labeled line whose C26 is empty into 39 columns, the count
    of a line without a label: the file is told by most of its first lines, not the first alone."""
    from worker.readers.criteo_reader import has_labels

    labeled = "1\t" + "\t".join(["5"] * 13 + ["a1b2"] * 25) + "\t\n"  # C26 empty: 40 columns with its tab
    stripped = labeled.rstrip() + "\n"  # 39 columns
    unlabeled = "\t".join(["5"] * 13 + ["a1b2"] * 26) + "\n"
    (tmp_path / "a.tsv").write_text(stripped + labeled * 5)
    (tmp_path / "b.tsv").write_text(unlabeled * 5 + labeled)
    (tmp_path / "c.tsv").write_text(stripped + labeled)  # a tie: labeled
    (tmp_path / "d.tsv").write_text("")
    assert [has_labels(str(tmp_path / f"{n}.tsv")) for n in "abcd"] == [True, False, True, True]


def write_people(path, rows: int, seed: int, damaged: bool = False) -> list[tuple[int, str, str]]:
    """A CSV of id, click, site and a note (some notes quoted, holding commas, quotes and a line end, so that a
    record spans two lines); damaged: a line of another width and an empty line among them. Returns (first line,
    id, note) of each good record: the oracle of what --keep-columns id,note copies."""
    rng = np.random.default_rng(seed)
    text, records, line = ["id,click,site,note\n"], [], 2
    for i in range(rows):
        if damaged and i in (3, 40):
            text.append("a line,of another width\n" if i == 3 else "\n")
            line += 1
        site = int(rng.integers(6))
        click = int(rng.random() < (0.8 if site < 3 else 0.2))
        ident, note = f"u{seed}-{i:04d}", 'said "hi, there"\nand left' if i % 17 == 0 else f"n{i % 4}"
        written = '"said ""hi, there""\nand left"' if i % 17 == 0 else note  # quoted as CSV quotes it
        text.append(f"{ident},{click},s{site},{written}\n")
        records.append((line, ident, note))
        line += 1 + note.count("\n")
    Path(path).write_text("".join(text))
    return records


def test_keep_columns_copies_a_csvs_columns_into_each_row_verbatim(servers, tmp_path, capsys):
    """--keep-columns id,note: each row ends with its record's id and note as the file holds them (a note of
    commas, quotes and a line end read back whole), on the row of its line, malformed and empty lines skipped; the
    probabilities are those of the run without it; a header's names are read without the spaces around them. A
    column the header lacks, one predict writes itself, or an input with no header is refused, and nothing is
    written."""
    addresses, _ = servers(1)
    train_path, test_path = tmp_path / "train.csv", tmp_path / "test.csv"
    write_people(train_path, 400, seed=1)
    records = write_people(test_path, 120, seed=2, damaged=True)
    train(small_run(addresses, str(train_path), model="lr", max_bad_lines=0))
    flags = ["--data", str(train_path), "--model", "lr", "--predict-data", str(test_path), "--max-bad-lines", "5"]
    assert predict(addresses[0], tmp_path / "plain.csv", *flags) == 0
    capsys.readouterr()
    out = tmp_path / "kept.csv"
    assert predict(addresses[0], out, *flags, "--keep-columns", "id, note") == 0
    assert f"(line, probability, label, id, note) for {test_path} to {out}" in capsys.readouterr().out
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["line", "probability", "label", "id", "note"]
    assert [(int(r[0]), r[3], r[4]) for r in rows[1:]] == records
    with open(tmp_path / "plain.csv", newline="") as f:
        assert [r[:3] for r in rows[1:]] == list(csv.reader(f))[1:]
    for keep, said in (
        ("id,user", "--keep-columns: " + str(test_path) + ": columns ['user'] are not in the header; its columns are "
                    "['id', 'click', 'site', 'note']"),
        ("id,line", "--keep-columns id,line: ['line'] is a column predict writes itself"),
        ("id,id", "--keep-columns id,id: a column is named twice"),
    ):  # fmt: skip
        assert predict(addresses[0], tmp_path / "none.csv", *flags, "--keep-columns", keep) == 2
        assert said in capsys.readouterr().err
    spaced = tmp_path / "spaced.csv"  # a header's names are read without the spaces around them
    spaced.write_text(test_path.read_text().replace("id,click,site,note", "id, click, site, note", 1))
    out = tmp_path / "spaced-kept.csv"
    assert predict(addresses[0], out, *flags[:-3], str(spaced), "--max-bad-lines", "5", "--keep-columns", "note") == 0
    with open(out, newline="") as f:
        spaced_rows = list(csv.reader(f))
    assert spaced_rows[0] == ["line", "probability", "label", "note"]
    assert [r[:3] + r[4:] for r in rows] == spaced_rows
    svm = tmp_path / "d.svm"
    svm.write_text("1 3:1 4:1\n0 4:1\n")
    assert (
        predict(addresses[0], tmp_path / "none.csv", "--data", str(svm), "--model", "lr", "--keep-columns", "id") == 2
    )
    assert (
        f"--keep-columns copies columns a CSV file's header names; {svm} is read as libsvm" in capsys.readouterr().err
    )
    assert not [name for name in os.listdir(tmp_path) if "none" in name]


def write_valued_libsvm(path, n: int, seed: int, w: np.ndarray) -> np.ndarray:
    """A libsvm file of n lines, each 6 of the len(w) features with real values N(0, 1), its label drawn from the
    planted logistic model w (and a bias of -0.5); returns the true logits."""
    rng = np.random.default_rng(seed)
    logits, lines = [], []
    for _ in range(n):
        ids = np.sort(rng.choice(len(w), 6, replace=False))
        x = rng.normal(0, 1, 6)
        logits.append(float(w[ids] @ x) - 0.5)
        y = int(rng.random() < sigmoid(np.float64(logits[-1])))
        lines.append(f"{y} " + " ".join(f"{i}:{v:.4g}" for i, v in zip(ids, x)))
    Path(path).write_text("\n".join(lines) + "\n")
    return np.array(logits)


def test_a_libsvm_files_values_are_weights_and_tables_trained_one_hot_are_refused_or_read_so(servers, tmp_path):
    """A planted logistic model over real-valued libsvm features: read one-hot (a schema file of categorical
    fields: the values left out) lr scores near chance; the built-in schema reads the values as weights and
    scores near the planted model's own AUC (the oracle). Tables trained one-hot are refused by eval with the
    built-in schema, naming why, and read with the one-hot schema file; predict reads the file as train did."""
    w = np.random.default_rng(0).normal(0, 1, 20)
    train_path, eval_path = tmp_path / "train.svm", tmp_path / "eval.svm"
    write_valued_libsvm(train_path, 3000, 1, w)
    true_logits = write_valued_libsvm(eval_path, 1000, 2, w)
    labels = np.array([float(line.split()[0]) for line in eval_path.read_text().splitlines()])
    oracle = auc(labels, true_logits)
    assert main(["schema", "--data", str(train_path), "--out", str(tmp_path / "s.toml")]) == 0
    one_hot = tmp_path / "one_hot.toml"
    one_hot.write_text((tmp_path / "s.toml").read_text().replace('kind = "weighted"', 'kind = "categorical"'))
    (a,), _ = servers(1, root=tmp_path / "a")
    run = dict(data=str(train_path), eval_data=str(eval_path), model="lr", progress=False, server_timeout_s=0)
    before = train(TrainConfig(servers=(a,), schema=str(one_hot), **run))["eval_auc"]
    with pytest.raises(ValueError, match=r"the servers hold table lr trained on libsvm data read one-hot \(each "
                                         r"feature's value left out\), and this run reads the data's values as "
                                         r"weights"):  # fmt: skip
        evaluate_servers(TrainConfig(servers=(a,), data=str(train_path), eval_data=str(eval_path), model="lr"))
    again = evaluate_servers(TrainConfig(servers=(a,), data=str(train_path), eval_data=str(eval_path),
                                         model="lr", schema=str(one_hot)))  # fmt: skip
    assert again["eval_auc"] == pytest.approx(before, abs=1e-6)
    (b,), _ = servers(1, root=tmp_path / "b")
    after = train(TrainConfig(servers=(b,), **run))["eval_auc"]
    assert after > before + 0.2 and after > oracle - 0.03, (before, after, oracle)
    without_label(eval_path, tmp_path / "score.svm", "libsvm")
    assert predict(b, tmp_path / "out.csv", "--model", "lr", "--predict-data", str(tmp_path / "score.svm")) == 0
    _, out = read_out(tmp_path / "out.csv")
    assert auc(labels, out["probability"]) == pytest.approx(after, abs=1e-4)


def test_a_file_of_values_0_and_1_scored_on_tables_trained_with_weights_is_refused_naming_the_training_file(
    servers, tmp_path, capsys
):
    """Tables trained on libsvm values read as weights: a file to score whose values are all 1 reads one-hot by
    its own lines, which predict and eval refuse, naming why and the flags that read it as trained; with --data the
    training file its lines score as they do among lines that carry other values (the oracle: that file read
    weighted by its own lines)."""
    train_path = tmp_path / "train.svm"
    write_valued_libsvm(train_path, 500, 1, np.random.default_rng(0).normal(0, 1, 20))
    (a,), _ = servers(1, root=tmp_path / "a")
    train(TrainConfig(servers=(a,), data=str(train_path), model="fm", progress=False, server_timeout_s=0))
    ones, mixed = tmp_path / "ones.svm", tmp_path / "mixed.svm"
    ones.write_text("1:1 3:1\n4:1 7:1 9:1\n")
    mixed.write_text("1:1 3:1\n4:1 7:1 9:1\n2:0.5\n")
    refused = "the servers hold table fm trained on libsvm data read with its values as weights"
    assert predict(a, tmp_path / "out.csv", "--model", "fm", "--predict-data", str(ones)) == 2
    assert refused in capsys.readouterr().err and not (tmp_path / "out.csv").exists()
    (tmp_path / "ev.svm").write_text("1 1:1 3:1\n0 4:1 7:1 9:1\n")
    with pytest.raises(ValueError, match=refused):
        evaluate_servers(
            TrainConfig(servers=(a,), data=str(tmp_path / "ev.svm"), eval_data=str(tmp_path / "ev.svm"), model="fm")
        )
    assert predict(a, tmp_path / "out.csv", "--model", "fm", "--predict-data", str(ones), "--data",
                   str(train_path)) == 0  # fmt: skip
    assert predict(a, tmp_path / "mixed.csv", "--model", "fm", "--predict-data", str(mixed)) == 0
    _, out = read_out(tmp_path / "out.csv")
    _, oracle = read_out(tmp_path / "mixed.csv")
    assert out["probability"].tolist() == oracle["probability"][:2].tolist()


def test_predict_warns_of_the_first_value_its_auto_one_hot_read_left_out(servers, files, tmp_path, monkeypatch, caplog):
    """A file scored one-hot because the training file's first lines of data carry only 0 and 1 (--libsvm-values
    auto) warns once, as train and eval do, naming the first scored line whose value other than 0 and 1 was left
    out (of the second file, the first holding none)."""
    from worker.data_reports import LEFT_VALUES
    from worker.readers import libsvm_reader

    monkeypatch.setattr(libsvm_reader, "FIELD_COUNT_LINES", 20)
    addresses, _ = servers(1)
    train_path = str(tmp_path / "train.svm")
    to_libsvm(files[0], train_path)
    train(small_run(addresses, train_path, model="lr", format="libsvm"))
    scored = tmp_path / "scored"
    scored.mkdir()
    (scored / "a.svm").write_text("1 1:1 2:1\n0 3:1\n")
    (scored / "b.svm").write_text("1 1:1\n0 2:1 3:0.5\n1 4:2\n")
    flags = ["--data", train_path, "--format", "libsvm", "--model", "lr", "--predict-data", str(scored)]
    assert predict(addresses[0], tmp_path / "out.csv", *flags) == 0
    said = [r.getMessage() for r in caplog.records if "other than 0 and 1" in r.getMessage()]
    assert said == [LEFT_VALUES.format(first=f"{scored / 'b.svm'} line 2: value 0.5", data=train_path)]


def test_an_example_the_model_scores_as_nan_is_named_by_its_line_not_written_as_a_probability(servers, tmp_path,
                                                                                               capsys):  # fmt: skip
    """A weight of 3e38 (finite in float32, as the reader takes it) overflows FM's sum of squares: the example's
    probability is NaN. predict fails naming the file and line and writes no OUT (no "nan" probability); eval names
    the file and line too, of a directory's second file where one batch holds examples of both files."""
    train_path, score_path = tmp_path / "train.svm", tmp_path / "score.svm"
    write_valued_libsvm(train_path, 600, 1, np.random.default_rng(0).normal(0, 1, 20))
    lines = train_path.read_text().splitlines()
    lines[3] = "1 2:3e38 5:1"
    score_path.write_text("\n".join(lines) + "\n")
    (a,), _ = servers(1)
    train(small_run([a], str(train_path)))
    out = tmp_path / "out.csv"
    assert predict(a, out, "--model", "fm", "--data", str(train_path), "--predict-data", str(score_path)) == 2
    assert (
        f"the model's probability for the example of line 4 of {score_path} is NaN (1 of the batch's 64 "
        "examples): the example's numbers, or the model's weights, overflow float32"
    ) in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(
        ValueError, match=rf"the model's probability for the example of line 4 of {re.escape(str(score_path))} is NaN"
    ):
        evaluate_servers(TrainConfig(servers=(a,), data=str(train_path), eval_data=str(score_path), model="fm"))
    several = tmp_path / "several"
    several.mkdir()
    (several / "a.svm").write_text("\n".join(lines[:3]) + "\n")  # 3 finite lines, then b.svm's line 1 is the huge one
    (several / "b.svm").write_text("\n".join(lines[3:6]) + "\n")
    named = re.escape(f"line 1 of {several / 'b.svm'} is NaN (1 of the batch's 6 examples)")
    with pytest.raises(ValueError, match=rf"the model's probability for the example of {named}"):
        evaluate_servers(TrainConfig(servers=(a,), data=str(train_path), eval_data=str(several), model="fm"))

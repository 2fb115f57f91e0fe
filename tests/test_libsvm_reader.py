"""Tests for worker/readers/libsvm_reader.py: its chunks' bad lines and what counts as a data line, against per-line
oracles written here."""

import dataclasses

import numpy as np
import pytest

from worker.cells import FLOAT32_MAX
from worker.cli_train_config import train_config_from_argv
from worker.data_reports import LEFT_VALUES
from worker.formats import read_batches
from worker.job import prepare
from worker.readers import libsvm_reader
from worker.readers.libsvm_reader import FIELD_COUNT_LINES, libsvm_cells, libsvm_field_count, libsvm_sample
from worker.readers.share import BadLines, ReadStats, Share
from worker.schema_builtin import builtin_schema, resolve_schema
from worker.schema_columns import libsvm_column
from worker.train_config import TrainConfig

TOO_LARGE = "a weight beyond float32's range (|x| <= 3.4e38)"


def chunks(path, schema, size, worker_id=0, num_workers=1, blank_labels=False):
    share = Share(worker_id, num_workers, BadLines(str(path), 10**9, ReadStats()))
    return list(libsvm_cells(str(path), schema, size, share, blank_labels=blank_labels))


@pytest.mark.parametrize("num_workers", [1, 2])
def test_each_line_with_a_weight_beyond_float32_is_bad_naming_its_first_such_value(tmp_path, num_workers):
    """f0..f2 weighted, f3 one-hot: a line whose value at a weighted position passes float32's range is a bad line
    naming the first such value (by position), in line order among the chunk's other problems; a large value at
    the one-hot position is read; a line read as no label (blank_labels) that is bad is no unread label. The
    oracle checks each line's tokens in turn."""
    schema = builtin_schema("libsvm", default_table="t", default_dim=4, libsvm_fields=4, libsvm_weighted=True)
    schema = dataclasses.replace(schema, columns=(*schema.columns[:3], libsvm_column("f3", "t")))
    rng = np.random.default_rng(3)
    lines = []
    for k in range(60):
        values = rng.choice([0.5, -2.0, 1e39, -5e38, 1.0], size=4, p=[0.4, 0.3, 0.1, 0.1, 0.1]).tolist()
        label = "x" if k % 7 == 3 else str(k % 2)
        lines.append(f"{label} " + " ".join(f"{i + 10 * k}:{v!r}" for i, v in enumerate(values)))
    lines[5] = "1 1:1e39 2:-1e40 3:0.5"  # two beyond: the first named
    lines[9] = "1 1:0.5 2:0.5 3:0.5 4:1e39"  # the one-hot f3's: read
    lines[11] = "1 1:0.5 2:x"  # another bad line among them
    path = tmp_path / "w.libsvm"
    path.write_text("\n".join(lines) + "\n")
    for worker_id in range(num_workers):
        mine = range(worker_id, len(lines), num_workers)
        problems, good, unread = [], [], {}
        for k in mine:
            tokens = lines[k].split()
            values = [float(t.split(":")[1]) for t in tokens[1:] if t != "2:x"]
            large = next((v for v in values[:3] if abs(v) > FLOAT32_MAX), None)
            if "2:x" in tokens:
                problems.append((k + 1, "feature '2:x': value 'x', expected a finite number"))
            elif large is not None:
                problems.append((k + 1, f"feature {large!r}: {TOO_LARGE}"))
            else:
                good.append(k + 1)
                if tokens[0] == "x":
                    unread[k + 1] = "x"
        got = chunks(path, schema, 8, worker_id, num_workers, blank_labels=True)
        assert [p for c in got for p in c.problems] == problems
        for c in got:
            assert [p[0] for p in c.problems] == sorted(p[0] for p in c.problems)
            assert len(c.labels) == len(c.line_nos) == len(c.parsed.weights["f0"]) == len(c.parsed.cats["f3"])
        assert np.concatenate([c.line_nos for c in got]).tolist() == good
        assert {k: v for c in got for k, v in c.unread_labels.items()} == unread
        weights = np.concatenate([c.parsed.weights["f2"] for c in got])
        assert weights.dtype == np.float32 and np.isfinite(weights).all()
        assert any(f"feature {1e39!r}" in p[1] for c in got for p in c.problems)


def test_the_sample_takes_the_first_lines_of_data_past_comment_and_blank_lines(tmp_path):
    """libsvm_sample's FIELD_COUNT_LINES lines are lines of data: a file that opens with that many lines of comments
    and blanks is sampled on the lines under them (their K and their values), and a line of data past the first
    FIELD_COUNT_LINES of data is not."""
    path = tmp_path / "c.svm"
    above = ["# exported by a tool", "", "   # its columns: ..."] * (FIELD_COUNT_LINES // 3 + 1)
    data = [f"{k % 2} {k}:1 {k + 1}:1" for k in range(FIELD_COUNT_LINES - 1)] + ["1 1:0.5 2:1 3:1"]
    path.write_text("\n".join([*above, *data, "0 1:2 2:1 3:1 4:1"]) + "\n")  # the last: past the sample
    assert libsvm_sample(path) == (3, True)
    assert libsvm_field_count(path) == 3


def one_hot_file(path, n, valued):
    """n lines of 0/1 values (one 1.0, a qid and a comment with ":" among them), `valued` {line: token} replacing
    the last token of those lines."""
    lines = []
    for k in range(1, n + 1):
        tokens = [str(k % 2), "qid:3" if k == 2 else "", f"{k % 5}:1", f"{5 + k % 3}:{'1.0' if k == 3 else 0}"]
        tokens[-1] = valued.get(k, tokens[-1])
        lines.append(" ".join(t for t in tokens if t) + (" # note: a:b" if k == 4 else ""))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("values", ["auto", "one-hot", "weights"])
def test_libsvm_values_chooses_how_the_values_are_read(tmp_path, monkeypatch, values):
    """--libsvm-values weights or one-hot reads every field so whatever the sample holds; auto reads one-hot a file
    whose sampled lines carry only 0 and 1, and names the first good line past them that carries another value
    (once, from any chunk, whatever comments, qids and 1.0 come before it); one-hot and weights name none."""
    monkeypatch.setattr(libsvm_reader, "FIELD_COUNT_LINES", 20)
    path = tmp_path / "d.svm"
    one_hot_file(path, 60, {37: "6:0.5", 45: "7:2", 41: "x"})  # 41: a bad line
    schema = resolve_schema(str(path), schema_path=None, fmt="auto", label_column=None, drop_columns=(),
                            numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4,
                            libsvm_values=values)  # fmt: skip
    assert {c.kind for c in schema.columns} == {"weighted" if values == "weights" else "categorical"}
    assert schema.libsvm_values == values
    for size in (8, 4096):
        stats = ReadStats()
        batches = list(read_batches(path, schema, size, max_bad_lines=1, stats=stats))
        assert sum(map(len, batches)) == 59 and stats.bad_lines == 1
        assert stats.first_left_value == (f"{path} line 37: value 0.5" if values == "auto" else None)
    one_hot_file(path, 60, {12: "6:0.5"})  # in the sample: auto reads the values as weights
    kinds = {c.kind for c in schema_of(path, values).columns}
    assert kinds == {"categorical" if values == "one-hot" else "weighted"}


def schema_of(path, values):
    return resolve_schema(str(path), schema_path=None, fmt="libsvm", label_column=None, drop_columns=(),
                          numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4,
                          libsvm_values=values)  # fmt: skip


def test_libsvm_values_is_for_libsvm_data_and_the_built_in_schema(tmp_path):
    """--libsvm-values other than auto is refused with a schema file, for data of another format, and by --format
    csv; auto goes with any."""
    csv_file = tmp_path / "d.csv"
    csv_file.write_text("y,a\n1,x\n")
    with pytest.raises(ValueError, match=r"reads as csv .*--libsvm-values is for libsvm data: give --format libsvm"):
        resolve_schema(str(csv_file), schema_path=None, fmt="auto", label_column=None, drop_columns=(),
                       numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4,
                       libsvm_values="weights")  # fmt: skip
    toml = tmp_path / "s.toml"
    toml.write_text('format = "libsvm"\n[[columns]]\nname = "f0"\nkind = "categorical"\n')
    with pytest.raises(ValueError, match=r"cannot be combined with \['--libsvm-values'\]"):
        resolve_schema(None, schema_path=str(toml), fmt="auto", label_column=None, drop_columns=(),
                       numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4,
                       libsvm_values="one-hot")  # fmt: skip
    with pytest.raises(ValueError, match="--libsvm-values is for --format libsvm data only"):
        TrainConfig(data=str(csv_file), format="csv", libsvm_values="weights", local_shards=1).validate()
    with pytest.raises(ValueError, match="--libsvm-values 'dense': expected one of auto, one-hot, weights"):
        TrainConfig(data=str(csv_file), libsvm_values="dense", local_shards=1).validate()


def test_a_run_reports_once_the_first_value_its_auto_one_hot_read_left_out(tmp_path, monkeypatch):
    """A training run on a file read one-hot by --libsvm-values auto (its sampled lines all 0 and 1) warns once, of
    its first pass, naming the first line past the sample with another value; --libsvm-values reaches the schema
    from the command line."""
    monkeypatch.setattr(libsvm_reader, "FIELD_COUNT_LINES", 20)
    path = tmp_path / "d.svm"
    one_hot_file(path, 60, {37: "6:0.5", 50: "7:3"})
    _, data, _, _ = prepare(TrainConfig(data=str(path), format="libsvm", local_shards=1, progress=False))
    for _ in range(2):  # the first pass is the one reported
        list(data.read_whole(str(path)))
    said = [line for line in data.bad_lines_report() if "other than 0 and 1" in line]
    assert said == [LEFT_VALUES.format(first=f"{path} line 37: value 0.5", data=path)]
    assert said[0].startswith(f"{path} line 37: value 0.5, other than 0 and 1, and every such value")
    cfg = train_config_from_argv(["--data", str(path), "--libsvm-values", "weights", "--local-shards", "1"])
    _, data, _, _ = prepare(dataclasses.replace(cfg, progress=False))
    assert {c.kind for c in data.schema.columns} == {"weighted"} and data.schema.libsvm_values == "weights"


def test_the_auto_one_hot_look_parses_no_line_for_query_ids_and_comments(monkeypatch):
    """A chunk of 0/1 values whose lines all carry a qid (qid:0 and qid:1 among them) and a comment holding ':'
    is passed by the search of its bytes, no line parsed; a value other than 0 and 1 beside them is found (the
    oracle: each line's tokens read by hand), one in a comment or a qid is none."""
    parsed = []
    real = libsvm_reader._libsvm_line
    monkeypatch.setattr(libsvm_reader, "_libsvm_line", lambda *a, **k: parsed.append(a[0]) or real(*a, **k))
    lines = [f"{k % 2} qid:{k % 3} {k}:1 {k + 1}:0 # a:0.5 qid:7 b:2\n".encode() for k in range(50)]
    good = np.arange(1, 51)
    assert libsvm_reader._left_value(lines, good, 1, 1, True, False) is None and parsed == []
    lines[31] = b"1 qid:0 3:1 4:0.25 # c:1\n"
    assert libsvm_reader._left_value(lines, good, 1, 1, True, False) == (32, 0.25)
    assert parsed == [lines[31]]


def test_a_value_left_out_once_found_is_not_looked_for_on_later_passes(tmp_path, monkeypatch):
    """Once the first pass over a file found a value its auto one-hot read leaves out, later passes (each epoch's
    fresh ReadStats) look at no chunk for another; the report names the first pass's, once."""
    monkeypatch.setattr(libsvm_reader, "FIELD_COUNT_LINES", 20)
    path = tmp_path / "d.svm"
    one_hot_file(path, 60, {37: "6:0.5"})
    _, data, _, _ = prepare(TrainConfig(data=str(path), format="libsvm", local_shards=1, progress=False))
    looked = []
    real = libsvm_reader._left_value
    monkeypatch.setattr(libsvm_reader, "_left_value", lambda *a: looked.append(a[2]) or real(*a))
    list(data.read_whole(str(path)))
    assert looked  # the first pass looked, up to the chunk that holds line 37
    looked.clear()
    for _ in range(2):
        assert sum(map(len, data.read_whole(str(path)))) == 60
    assert looked == []
    said = [line for line in data.bad_lines_report() if "other than 0 and 1" in line]
    assert said == [LEFT_VALUES.format(first=f"{path} line 37: value 0.5", data=path)]

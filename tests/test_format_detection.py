"""Tests for `--format auto`, the default (format_detection.detect_format), and the built-in csv schema's label
(schema_builtin.csv_label): each format told by its first line (plain, gzip'ed, CRLF, a directory of parts, quoted
CSV cells) and read as the explicit flag reads it; what auto cannot tell refused naming --format; the label of an
Avazu-like file, of a label column in the middle, two candidates refused; a run with no flags on an Avazu-like file
that learns its planted model, and eval and predict reading files as that training run did."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import replace

import numpy as np
import pytest

from tests.test_predict import predict, read_out
from worker.__main__ import build_parser, main
from worker.cli_predict import predict_config
from worker.criteo import format_criteo
from worker.format_detection import detect_format
from worker.formats import file_has_labels, read_batches, read_csv_sample
from worker.metrics import auc
from worker.readers.share import ReadStats
from worker.schema_builtin import csv_label, resolve_schema
from worker.served import evaluate_servers
from worker.train import train
from worker.train_config import TrainConfig

AVAZU = ["id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain",
         "app_category", "device_id", "device_ip", "device_model", "device_type", "device_conn_type",
         *(f"C{k}" for k in range(14, 22))]  # fmt: skip
PLANTED = ("site_id", "app_id", "device_model", "C14")  # the columns whose values draw the label


def write_avazu(path, rows: int, seed: int, start: int = 0, label: bool = True, delimiter: str = ",") -> None:
    """An Avazu-like CSV: a header of 24 names, a row id of 19 digits first, the 0/1 label `click` second (left out
    where not label), 22 categorical columns of 12 values each, separated by delimiter; the label drawn from a
    planted logistic model of PLANTED's values (weights of one seed, rows of `seed`), so a model that reads the file
    right scores well above AUC 0.5."""
    weights = np.random.default_rng(0).normal(0, 1.5, (len(PLANTED), 12))
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 12, (rows, len(AVAZU) - 2))
    logits = sum(weights[k, values[:, AVAZU.index(c) - 2]] for k, c in enumerate(PLANTED)) - 1.0
    clicks = (rng.random(rows) < 1 / (1 + np.exp(-logits))).astype(int)
    with open(path, "w") as f:
        f.write(delimiter.join(h for h in AVAZU if label or h != "click") + "\n")
        for i in range(rows):
            cells = [f"{c[:3]}{v:x}" for c, v in zip(AVAZU[2:], values[i])]
            f.write(delimiter.join([str(10**18 + 7919 * (start + i)), *[str(clicks[i])] * label, *cells]) + "\n")


def criteo_text(rows: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    return format_criteo(rng.integers(0, 2, rows), rng.integers(0, 50, (rows, 13)),
                         rng.integers(0, 2**32, (rows, 26), dtype=np.uint64))  # fmt: skip


TEXTS = {  # a small file of each format, as --format names it
    "criteo": criteo_text(20),
    "csv": '"id","click","site, name",price\n' + "".join(f'{i},{i % 2},"s{i % 3}, x",{i}.5\n' for i in range(20)),
    "libsvm": "".join(f"{i % 2} {i}:1 {100 + i % 3}:1\n" for i in range(20)),
}
SEEN = {
    "criteo": "its first line is 40 tab-separated columns, a label (0 or 1) first, no header",
    "csv": "a header line of 4 comma-separated names",
    "libsvm": "its first line is a label and id:value tokens",
}


def schema(path, fmt: str = "auto", **flags):
    given = {"label_column": None, "drop_columns": (), "numeric_columns": (), "libsvm_fields": None, **flags}
    return resolve_schema(str(path), schema_path=None, fmt=fmt, default_table="t", default_dim=4, **given)


def batches(path, s, **read) -> list[tuple]:
    return [(b.labels.tolist(), {k: v.ids.tolist() for k, v in b.fields.items()})
            for b in read_batches(path, s, 64, **read)]  # fmt: skip


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
@pytest.mark.parametrize("how", ["plain", "gzip", "crlf", "parts"])
def test_each_format_is_told_by_its_first_line_and_read_as_its_flag_reads_it(tmp_path, fmt, how):
    text = TEXTS[fmt].replace("\n", "\r\n") if how == "crlf" else TEXTS[fmt]
    path = tmp_path / f"d.{fmt}"
    if how == "gzip":
        path = tmp_path / f"d.{fmt}.gz"
        path.write_bytes(gzip.compress(text.encode()))
    elif how == "parts":  # a directory: an empty part (Spark's of an empty partition), then the data in two parts
        path = tmp_path / "parts"
        path.mkdir()
        lines = text.splitlines(keepends=True)
        head = lines[:1] if fmt == "csv" else []
        (path / "part-0").write_text("")
        (path / "part-1").write_text("".join(lines[:11]))
        (path / "part-2").write_text("".join(head + lines[11:]))
    else:
        path.write_bytes(text.encode())
    assert detect_format(str(path)) == (fmt, "," if fmt == "csv" else None, SEEN[fmt])
    detected = schema(path)
    assert detected.format == fmt and detected.format_from == f"detected: {SEEN[fmt]}"
    given = schema(path, fmt)
    assert detected == given and given.format_from == ""  # (format_from is no part of the schema's value)
    assert batches(path, detected) == batches(path, given) and len(batches(path, given)[0][0]) == 20


def test_libsvm_separated_by_tabs_is_told_as_libsvm_and_read_as_its_flag_reads_it(tmp_path):
    path = tmp_path / "tabs.libsvm"  # the libsvm reader splits a line at any whitespace
    path.write_text(TEXTS["libsvm"].replace(" ", "\t"))
    assert detect_format(str(path)) == ("libsvm", None, SEEN["libsvm"])
    assert batches(path, schema(path)) == batches(path, schema(path, "libsvm"))


def test_svmlight_query_ids_and_comments_are_told_as_libsvm_and_read_as_the_lines_without_them(tmp_path):
    """SVMlight's lines (`label qid:3 id:value ... # comment`, comment lines above them, as scikit-learn's
    dump_svmlight_file writes them) read as the same lines without the query ids and comments; a line of a comment
    only is an empty line, and a qid elsewhere than after the label is a bad token, naming it."""
    plain = tmp_path / "plain.libsvm"
    plain.write_text(TEXTS["libsvm"])
    lines = TEXTS["libsvm"].splitlines()
    svmlight = tmp_path / "d.svmlight"
    text = ["# Generated by dump_svmlight_file", "#"]
    for i, line in enumerate(lines):
        label, features = line.split(" ", 1)
        text += [f"{label} qid:{i // 4} {features}" + (f" # row {i}" if i % 3 else "")] + ["  # a note"] * (i == 5)
    svmlight.write_text("\n".join(text) + "\n")
    seen = "its first data line, below comment lines (# ...), is a label and id:value tokens"  # not line 1's
    assert detect_format(str(svmlight)) == ("libsvm", None, seen)
    assert detect_format(str(plain)) == ("libsvm", None, SEEN["libsvm"])
    assert schema(svmlight) == schema(plain)
    assert (
        batches(svmlight, schema(svmlight)) == batches(plain, schema(plain))
        and len(batches(plain, schema(plain))[0][0]) == 20
    )
    stats = ReadStats()
    list(read_batches(svmlight, schema(svmlight), 64, stats=stats))
    assert (stats.empty_lines, stats.bad_lines) == (3, 0)
    misplaced = tmp_path / "misplaced.libsvm"
    misplaced.write_text("1 1:1 qid:3 2:1\n")
    with pytest.raises(ValueError, match="line 1: feature 'qid:3', expected id:value with a non-negative integer id"):
        list(read_batches(misplaced, schema(plain), 64))


def test_svmlight_lines_without_labels_read_as_the_lines_without_their_query_ids(tmp_path):
    """A file to score made of SVMlight lines without their labels (`qid:3 id:value ... # comment`: the query id
    first) is a file without labels, read as the same lines without the query ids."""
    lines = [line.split(" ", 1)[1] for line in TEXTS["libsvm"].splitlines()]
    plain = tmp_path / "plain.libsvm"
    plain.write_text("".join(f"{line}\n" for line in lines))
    svmlight = tmp_path / "new.svmlight"
    svmlight.write_text("# to score\n" + "".join(f"qid:{i // 4} {line} # row {i}\n" for i, line in enumerate(lines)))
    s = schema(plain)
    assert (file_has_labels(plain, s), file_has_labels(svmlight, s)) == (False, False)
    read = [batches(path, s, labeled=False) for path in (plain, svmlight)]
    assert [fields for _, fields in read[1]] == [fields for _, fields in read[0]] and len(read[0][0][1]["f0"]) == 20
    assert np.isnan(read[1][0][0]).all() and len(read[1]) == 1  # (no labels: NaN)


def test_criteo_without_labels_is_told_by_its_39_columns(tmp_path):
    path = tmp_path / "new.tsv"
    path.write_text("".join(line.split("\t", 1)[1] + "\n" for line in criteo_text(5).splitlines()))
    assert detect_format(str(path)) == ("criteo", None, "its first line is 39 tab-separated columns, Criteo TSV "
                                                        "without labels")  # fmt: skip


def test_a_criteo_file_with_a_header_line_reads_as_a_tab_separated_csv_and_with_the_flag_as_before(tmp_path):
    """A header line over Criteo TSV (which has none) is a tab-separated header of 40 names: auto reads the file as
    CSV with tabs, its label the column named so; the explicit flag reads the file as it always did, that line a
    bad one."""
    path = tmp_path / "h.tsv"
    names = ["label", *(f"I{k}" for k in range(1, 14)), *(f"C{k}" for k in range(1, 27))]
    path.write_text("\t".join(names) + "\n" + criteo_text(30))
    assert detect_format(str(path)) == ("csv", "\t", "a header line of 40 tab-separated names")
    detected = schema(path)
    assert (detected.delimiter, detected.label) == ("\t", "label") and len(detected.columns) == 39
    criteo = schema(path, "criteo")
    with pytest.raises(ValueError, match=r"line 1: label 'label', expected '0' or '1' \(a header line\? Criteo TSV "
                                         r"has none"):  # fmt: skip
        batches(path, criteo)
    read = list(read_batches(path, criteo, 64, max_bad_lines=1))
    assert [b[0] for b in batches(path, detected)] == [b.labels.tolist() for b in read] and len(read[0].labels) == 30


def test_criteo_lines_are_told_as_criteo_or_refused_not_taken_for_a_tab_separated_header(tmp_path):
    """A Criteo line of a blank label (a file to score) is Criteo TSV; one of another label, or a damaged first line
    over Criteo lines, is no header of names: refused as before (check_same_format then reads the file as the
    training data's format, the bad line counted)."""
    path = tmp_path / "d.tsv"
    lines = criteo_text(30).splitlines(keepends=True)
    path.write_text("".join("\t" + line.split("\t", 1)[1] for line in lines))
    assert detect_format(str(path)) == ("criteo", None, "its first line is 40 tab-separated columns, a blank label "
                                                        "first (a file to score), integers next")  # fmt: skip
    damaged = "splits into 2 cells at tab, and most of the 30 records under it into other counts (the first: 40)"
    for text, said in (("2" + "".join(lines)[1:], "is 40 tab-separated columns, '2' first, not a label (0 or 1)"),
                       ("not\ta criteo line\n" + "".join(lines), damaged)):  # fmt: skip
        path.write_text(text)
        with pytest.raises(ValueError, match=re.escape(said)):
            detect_format(str(path))


CSV_ROWS = [["id", "click", "site name", "price"], *([str(i), str(i % 2), f"s{i % 3}, x", f"{i}.5"] for i in range(20))]


def write_csv(path, delimiter: str, rows=CSV_ROWS) -> None:
    import csv

    with open(path, "w", newline="") as f:
        csv.writer(f, delimiter=delimiter).writerows(rows)


@pytest.mark.parametrize("delimiter, named", [("\t", "tab"), (";", "';'"), ("|", "'|'")])
def test_a_csv_of_another_delimiter_is_told_and_read_as_the_same_rows_as_with_commas(tmp_path, capsys, delimiter,
                                                                                     named):  # fmt: skip
    """A header of names separated by tabs, ';' or '|' (a spreadsheet export, a TSV dump): auto tells the delimiter,
    carries it in the schema, and reads the same examples as from the file written with commas; `ps-worker schema`
    writes it into the schema, and a run says it on its columns line."""
    comma, other = tmp_path / "comma.csv", tmp_path / "other.csv"
    write_csv(comma, ",")
    write_csv(other, delimiter)
    assert detect_format(str(other)) == ("csv", delimiter, f"a header line of 4 {named}-separated names")
    s = schema(other)
    assert s.delimiter == delimiter and s.format_from == f"detected: a header line of 4 {named}-separated names"
    assert batches(other, s) == batches(comma, schema(comma)) and len(batches(other, s)[0][0]) == 20
    assert main(["schema", "--data", str(other)]) == 0
    text = capsys.readouterr().out
    assert f"delimiter = {json.dumps(delimiter)}\n" in text and 'label = "click"' in text, text
    assert main(["train", "--local-shards", "1", "--data", str(other), "--model", "lr", "--epochs", "1",
                 "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"columns  format csv (detected: a header line of 4 {named}-separated names; --format sets it); label " \
           "'click'" in out, out  # fmt: skip
    (tmp_path / "schema.toml").write_text(text)  # a schema's delimiter: said as such
    assert main(["train", "--local-shards", "1", "--data", str(other), "--schema", str(tmp_path / "schema.toml"),
                 "--model", "lr", "--epochs", "1", "--no-progress"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"columns  {named}-separated; label 'click' (the schema's `label`)" in out, out


def test_the_delimiter_is_the_one_the_records_under_the_header_agree_with(tmp_path):
    """A header that several delimiters split: the one that gives the records under it the header's cell count
    (of those, the one of most cells) is the delimiter; records that leave it open are refused, naming the counts."""
    path = tmp_path / "d.csv"
    path.write_text("id;price, EUR;click\n" + "".join(f"{i};{i},5;{i % 2}\n" for i in range(10)))  # a decimal comma
    assert detect_format(str(path))[:2] == ("csv", ";")  # comma: 2 cells a record too, ';' 3
    path.write_text("id\tprice, EUR\tclick\n" + "".join(f"{i}\t{i}.5\t{i % 2}\n" for i in range(10)))
    assert detect_format(str(path))[:2] == ("csv", "\t")  # comma: 1 cell a record, not 2
    path.write_text("a,b|c,click\n" + "".join(f"x{i},y|z,{i % 2}\n" for i in range(10)))  # '|' inside a cell
    assert detect_format(str(path))[:2] == ("csv", ",")
    path.write_text("a,b;c,click\n" + "".join(f"x{i},y;z,{i % 2}\n" for i in range(9)) + "x,y,z,w,1\n")  # 9 in 10
    assert detect_format(str(path))[:2] == ("csv", ",")
    path.write_text("a,b,click\n" + "".join(f"x{i},y,{i % 2}\n" for i in range(6)) + "x,y,z,1\n" * 4)  # 6 in 10
    assert detect_format(str(path))[:2] == ("csv", ",")  # (the reader counts the bad records)
    for text, said in (
        ("a,b;c\n1,2;3\n", "splits into 2 cells at comma and 2 at ';', and the records under it read as well "
                           "separated by comma or ';'"),
        ("a,b;c\n1,2,3;4;5\n", "splits into 2 cells at comma and 2 at ';', and most of the records under it into "
                               "other counts at each"),
        ("a,b,c\n1,2,3,\n", "splits into 3 cells at comma, and the record under it into other counts (the first: "
                            "4: a delimiter at the end of each row?)"),
    ):  # fmt: skip
        path.write_text(text)
        with pytest.raises(ValueError) as e:
            detect_format(str(path))
        first = repr(text.split("\n")[0])
        said = f"{path}: --format auto cannot tell its format: its first line ({first}) {said}"
        assert str(e.value).startswith(said) and "--delimiter" in str(e.value), e.value


@pytest.mark.parametrize(
    "text, said",
    [
        ("1,5,abc\n0,3,def\n", "its first line (1,5,abc) reads like an example, not a header"),
        ("1;5;abc\n0;3;def\n", "its first line (1;5;abc) reads like an example, not a header"),
        (
            "0,1,2,3\n1,5,2,0\n",
            "its first line (0,1,2,3) reads like an example, not a header: a file without a "
            "header line? A csv file's first line gives the column names: add a header line (if those "
            "are column numbers, as pandas writes for a frame without column names, name the columns",
        ),
        ("2,3,4\n1,5,2\n", "its first line (2,3,4) reads like an example"),
        ("1\t5\t3\n0\t4\t5\n", "its first line ('1\\t5\\t3') is 3 tab-separated columns, not Criteo's 40"),
        ("\t".join(["-1"] + ["3"] * 39) + "\n", "is 40 tab-separated columns, '-1' first, not a label (0 or 1)"),
        ("label\n1\n", "its first line ('label') is one column; it tells libsvm, Criteo TSV and CSV"),
        (
            "PK\x05\x06a,b\x00,c\n\x01,\x02\n",
            "its first line ('PK\\x05\\x06a,b\\x00,c') holds control bytes, "
            "which text does not: a binary file, or a damaged one?",
        ),  # (as a CSV header: names a, b and c)
        (
            "\nid,click\n1,0\n",
            "its first line is blank, and the first with content ('id,click') is further down: a "
            "CSV file's header is its first line; remove the blank lines above it",
        ),
        ("\n" * 1000 + "1 3:1\n", "its first 1,000 lines are blank; give --format"),
    ],
)
def test_what_auto_cannot_tell_is_refused_naming_format_and_what_was_seen(tmp_path, text, said):
    path = tmp_path / "d.txt"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        schema(path)
    assert str(e.value).startswith(f"{path}: --format auto cannot tell its format: ") and said in str(e.value), e.value


@pytest.mark.parametrize(
    "delimiter, compressed, bom", [(",", False, False), (";", True, False), ("\t", False, False), (",", False, True),
                                   (";", True, True)]
)  # fmt: skip
def test_a_csv_without_a_header_line_is_refused_with_a_command_that_adds_one_which_works(tmp_path, delimiter,
                                                                                        compressed, bom):  # fmt: skip
    """A CSV whose first line is an example is refused by --format auto (tab-separated, where auto says Criteo's
    columns: `ps-worker schema --delimiter` says it), with a shell command writing a copy with a header line: run
    as given, in a folder whose name needs quoting, the copy reads as csv, every line of the file an example, the
    label its first column (of a file starting with a BOM, the first line's too: the BOM is left out)."""
    import subprocess

    from worker.schema_infer import infer_schema

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 40).tolist()
    lines = [delimiter.join([str(y), f"s{rng.integers(5)}", f"{rng.random():.3f}"]) for y in labels]
    folder = tmp_path / "my data"
    folder.mkdir()
    path = folder / ("clicks.csv.gz" if compressed else "clicks.csv")
    text = "\ufeff" * bom + "\n".join(lines) + "\n"
    path.write_bytes(gzip.compress(text.encode()) if compressed else text.encode())
    if delimiter == "\t":
        said = infer_schema(str(path), fmt="csv", delimiter=delimiter)[1][0]
    else:
        with pytest.raises(ValueError) as e:
            schema(path)
        said = str(e.value)
    assert "reads like an example, not a header" in said, said
    (command,) = re.findall(r"`(\{ printf [^`]*)`", said)
    subprocess.run(["bash", "-c", command], check=True, cwd=tmp_path)
    copy = folder / ("clicks-with-header.csv.gz" if compressed else "clicks-with-header.csv")
    s = schema(copy)
    assert (s.format, s.delimiter, s.label) == ("csv", delimiter, "label")
    assert [c.source for c in s.columns] == ["c1", "c2"]
    assert sum((b.labels.tolist() for b in read_batches(str(copy), s, 16)), []) == labels


@pytest.mark.parametrize("how", ["directory", "list", "directory of one"])
def test_the_command_adding_a_header_to_many_csv_files_writes_each_file_with_one(tmp_path, how):
    """Data of many headerless parts (Spark's default): an empty first part, a gzip'ed one, two starting with a BOM,
    _SUCCESS beside them; or a list of files of one name in two folders. Each file's first line is its header, so
    the command (run as given) writes every file with one into a new folder: read through it, every line of every
    file is an example, in the data's order. So it does for a directory of one file (a copy beside it would be
    read with it)."""
    import subprocess

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 30).tolist()
    lines = [f"{y},s{rng.integers(5)},{rng.random():.3f}\n" for y in labels]
    parts = ["", "".join(lines[:10]), "".join(lines[10:20]), "".join(lines[20:])]
    if how == "directory":
        data = tmp_path / "my parts"
        data.mkdir()
        (data / "_SUCCESS").write_text("")
        for k, text in enumerate(parts):
            name = data / f"part-{k:05d}.csv{'.gz' * (k == 2)}"
            text = "\ufeff" * (k in (1, 2)) + text  # (a spreadsheet's export)
            name.write_bytes(gzip.compress(text.encode()) if k == 2 else text.encode())
        spec = str(data)
    elif how == "directory of one":
        parts = ["".join(lines)]
        (tmp_path / "one").mkdir()
        (tmp_path / "one" / "part-00000.csv").write_text(parts[0])
        spec = str(tmp_path / "one")
    else:  # day0/part-00000.csv, day1/part-00000.csv, day0/part-00001.csv: two of one name, not in name order
        parts = parts[1:]
        names = [tmp_path / "day0" / "part-00000.csv", tmp_path / "day1" / "part-00000.csv",
                 tmp_path / "day0" / "part-00001.csv"]  # fmt: skip
        for name, text in zip(names, parts):
            name.parent.mkdir(exist_ok=True)
            name.write_text(text)
        spec = ",".join(map(str, names))
    with pytest.raises(ValueError) as e:
        schema(spec)
    said = str(e.value)
    copies = f"a copy of each of the {len(parts)} data files" if len(parts) > 1 else "a copy of the data's file"
    assert "reads like an example, not a header" in said and f"{copies} with one into" in said, said
    (command,) = re.findall(r"`(mkdir [^`]*)`", said)
    subprocess.run(["bash", "-c", command], check=True, cwd=tmp_path)
    (copy,) = re.findall(r"then give --data ([^)]*)\)", said)
    s = schema(copy)
    assert (s.format, s.label, [c.source for c in s.columns]) == ("csv", "label", ["c1", "c2"])
    assert sum((b.labels.tolist() for b in read_batches(copy, s, 16)), []) == labels


def test_an_empty_file_is_said_to_be_empty(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match=re.escape(f"{empty}: no examples in it (it is empty)")):
        schema(empty)


def test_a_column_flag_of_another_format_is_refused_once_the_format_is_told(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text(criteo_text(3))
    with pytest.raises(ValueError, match=re.escape(f"{path} reads as criteo (its first line is 40 tab-separated "
                                                   "columns, a label (0 or 1) first, no header), and --label-column "
                                                   "is for csv data: give --format csv to read it as csv, or leave "
                                                   "--label-column out")):  # fmt: skip
        schema(path, label_column="click")


def labels_of(text: str, tmp_path) -> tuple[str | None, str]:
    path = tmp_path / "l.csv"
    path.write_text(text)
    s = schema(path)
    return s.label, s.label_from


def test_the_csv_label_is_the_first_column_holding_labels_else_the_one_column_named_like_a_label(tmp_path):
    write_avazu(tmp_path / "a.csv", 50, seed=1)
    s = schema(tmp_path / "a.csv")
    assert (s.label, s.label_from) == ("click", "named like a label and holding 0 and 1 in the first 50 rows, where "
                                                "the first column, 'id', holds other values")  # fmt: skip
    assert "id" in [c.source for c in s.columns] and "click" not in [c.source for c in s.columns]
    assert schema(tmp_path / "a.csv", label_column="click") == s  # the flag's schema: the same model
    middle = "user,site,Label,price\nu1,s1,1,2\nu2,s2,0,3\nu3,s1,,4\n"  # any case; a blank label cell too
    assert labels_of(middle, tmp_path)[0] == "Label"
    first = "is_new,site,click\n1,s1,1\n0,s2,0\n"  # 0 and 1 in the first column too: the one named so wins
    assert labels_of(first, tmp_path) == ("click", "named like a label and holding 0 and 1 in the first 2 rows, "
                                                   "where the first column, 'is_new', holds 0 and 1 too but is not "
                                                   "named like a label")  # fmt: skip
    assert labels_of("is_new,site\n1,s1\n0,s2\n", tmp_path) == ("is_new", "first column")
    for text in ("id,click,converted,a\n7,1,0,x\n8,0,0,y\n",  # two candidates: the user says which
                 "id,site,a\n7,x,y\n"):  # none  # fmt: skip
        assert labels_of(text, tmp_path) == ("id", "first column"), text
    header, rows = read_csv_sample(tmp_path / "l.csv", ",", 10)
    assert csv_label(header, rows) is None
    # a word of a label's name (schema_columns.LABEL_WORDS) where no column has one of LABEL_NAMES, as
    # `ps-worker schema`
    assert labels_of("id,has_clicked,a\n7,1,x\n8,0,y\n", tmp_path)[0] == "has_clicked"
    assert labels_of("id,has_clicked,y,a\n7,1,0,x\n8,0,1,y\n", tmp_path)[0] == "y"
    two = tmp_path / "two.csv"
    two.write_text("id,click,converted,a\n7,1,0,x\n8,0,0,y\n")
    with pytest.raises(ValueError, match=re.escape("label '7', expected 0 or 1 (column 'id', the first column, the "
                                                   "built-in default: --label-column or the schema's `label` names "
                                                   "another; the header has 'click' and 'converted', named like a "
                                                   "label: --label-column names the one to predict)")):  # fmt: skip
        batches(two, schema(two))
    assert batches(two, schema(two, label_column="converted"))[0][0] == [0.0, 0.0]


@pytest.mark.parametrize(
    "text, holds",
    [  # (named like a label, of other values: the reader's refusal of the first column would point to it)
        (
            "id,clicks,a\n" + "".join(f"{7 + i},{i % 6},x\n" for i in range(8)),
            "the first column, 'id', holds '7', '8', '9', '10' and 4 others; 'clicks', named like a label, holds '0', "
            "'1', '2', '3' and 2 others",
        ),  # a count
        (
            "id,click,a\n7,-1,x\n8,1,y\n",
            "the first column, 'id', holds '7' and '8'; 'click', named like a label, holds '-1' and '1'.",
        ),  # labels of -1 and 1: no labels to the readers (the 1 among them is none either)
        ("id,click,a\n7,,x\n8,NA,y\n", "'click', named like a label, is blank"),  # fmt: skip
    ],
)
def test_no_column_that_can_be_the_label_is_refused_before_reading_naming_what_each_holds(tmp_path, text, holds):
    path = tmp_path / "l.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        schema(path)
    said = str(e.value)
    assert said.startswith(f"{path}: no column can be the label (0 or 1, or true and false, yes and no, any case): "
                           "in the first ") and holds in said and said.endswith(
        ". No flag reads these values as labels: write the column to predict as 0 and 1 (-1 as 0, a count as 1 where "
        "it is above 0), then train on the rewritten file with --label-column naming that column"), said  # fmt: skip
    assert schema(path, label_column="a").label == "a"  # the flag names it (its reader refuses its values)
    path.write_text(text.split("\n", 1)[0] + "\n")  # a header alone: nothing to tell by
    assert schema(path).label == "id"


def test_no_label_refusal_names_a_column_of_0_and_1_that_the_flag_would_take(tmp_path):
    """Where a column neither first nor named like a label holds 0 and 1, the refusal names it as what
    --label-column would take as it is; with that flag the file reads."""
    path = tmp_path / "l.csv"
    path.write_text("id,clicks,is_mobile\n7,3,1\n8,0,0\n")
    with pytest.raises(ValueError) as e:
        schema(path)
    assert str(e.value).endswith("; or, where 'is_mobile', of 0 and 1 already, is the outcome to predict, give "
                                 "--label-column is_mobile"), str(e.value)  # fmt: skip
    assert schema(path, label_column="is_mobile").label == "is_mobile"


def test_a_run_with_no_flags_trains_an_avazu_like_file_and_says_how_it_read_it(servers, tmp_path, capsys):
    """No flags of how to read the data (the runs' shards: in-process ones, a fresh one for each run)."""
    train_path, test_path = tmp_path / "train.csv", tmp_path / "test.csv"
    write_avazu(train_path, 3000, seed=1)
    write_avazu(test_path, 1000, seed=2, start=3000)
    code = main(["train", "--servers", servers(1, root=tmp_path / "first")[0][0], "--data", str(train_path),
                 "--eval-data", str(test_path), "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "columns  format csv (detected: a header line of 24 comma-separated names; --format sets it); label " \
           "'click' (named like a label and holding 0 and 1 in the first 1,000 rows, where the first column, 'id', " \
           "holds other values; " \
           "--label-column sets it); 23 categorical" in out  # fmt: skip
    figure = float(re.search(r"^eval   AUC ([0-9.]+) ", out, re.M)[1])
    assert figure > 0.6, out
    code = main(["train", "--servers", servers(1, root=tmp_path / "second")[0][0], "--data", str(train_path),
                 "--format", "csv", "--label-column", "click", "--no-progress", "--epochs", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "columns  label 'click' (--label-column); 23 categorical" in out, out  # given: not said


def test_a_criteo_run_says_its_detected_format_on_its_recipe_line(tmp_path, capsys):
    path = tmp_path / "d.tsv"
    path.write_text(criteo_text(200))
    assert main(["train", "--local-shards", "1", "--data", str(path), "--model", "lr", "--epochs", "1",
                 "--no-progress"]) == 0  # fmt: skip
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("small-data recipe for 200 lines") and first.endswith(
        f"; format criteo (detected: {SEEN['criteo']}; --format sets it)"
    ), first


@pytest.mark.parametrize("delimiter", [",", ";"])
def test_eval_and_predict_read_files_as_the_auto_run_trained_on_them(servers, tmp_path, delimiter):
    """Trained with no flags on an Avazu-like file: eval's figures are those of the explicit flags (a schema file
    naming the delimiter ';'), and predict scores a file without the label column as the same rows with it."""
    addresses, _ = servers(1)
    train_path, test_path, new_path = (tmp_path / f"{n}.csv" for n in ("train", "test", "new"))
    write_avazu(train_path, 2000, seed=1, delimiter=delimiter)
    write_avazu(test_path, 500, seed=2, start=2000, delimiter=delimiter)
    write_avazu(new_path, 500, seed=2, start=2000, label=False, delimiter=delimiter)  # test.csv without `click`
    run = TrainConfig(servers=tuple(addresses), data=str(train_path), model="lr", progress=False, server_timeout_s=0)
    train(run)
    auto = evaluate_servers(replace(run, eval_data=str(test_path)))
    flags = {"format": "csv", "label_column": "click"}
    if delimiter != ",":
        columns = "".join(f'\n[[columns]]\nname = "{h}"\nkind = "categorical"\n' for h in AVAZU if h != "click")
        (tmp_path / "schema.toml").write_text(f'format = "csv"\ndelimiter = "{delimiter}"\nlabel = "click"\n{columns}')
        flags = {"schema": str(tmp_path / "schema.toml")}  # the built-in schema's columns, written out
    given = evaluate_servers(replace(run, eval_data=str(test_path), **flags))
    assert auto["eval_auc"] == given["eval_auc"] > 0.6 and auto["eval_logloss"] == given["eval_logloss"]
    flags = ["--data", str(train_path), "--model", "lr"]
    assert predict(addresses[0], tmp_path / "labeled.out", *flags, "--predict-data", str(test_path)) == 0
    assert predict(addresses[0], tmp_path / "new.out", *flags, "--predict-data", str(new_path)) == 0
    header, labeled = read_out(tmp_path / "labeled.out")
    new_header, new = read_out(tmp_path / "new.out")
    assert (header, new_header) == (["line", "probability", "label"], ["line", "probability"])
    assert np.array_equal(new["probability"], labeled["probability"]) and len(new["probability"]) == 500
    assert auc(labeled["label"], labeled["probability"]) == pytest.approx(auto["eval_auc"], abs=1e-6)
    with pytest.raises(ValueError, match="its label column is unknown"):  # the file alone: no label column to find
        predict_config(build_parser().parse_args(["predict", "--servers", addresses[0], "--out",
                                                  str(tmp_path / "alone.out"), "--data", str(new_path)])).validate()  # fmt: skip
    assert predict(addresses[0], tmp_path / "itself.out", "--data", str(test_path), "--model", "lr") == 0
    assert np.array_equal(read_out(tmp_path / "itself.out")[1]["probability"], labeled["probability"])


def test_ps_worker_schema_tells_the_format_as_train_does(tmp_path, capsys):
    write_avazu(tmp_path / "a.csv", 100, seed=1)
    assert main(["schema", "--data", str(tmp_path / "a.csv")]) == 0
    text = capsys.readouterr().out
    assert "# Format csv (detected: a header line of 24 comma-separated names; --format sets it).\n" in text
    assert 'format = "csv"' in text and 'label = "click"' in text
    (tmp_path / "d.tsv").write_text(criteo_text(20))
    assert main(["schema", "--data", str(tmp_path / "d.tsv")]) == 0
    assert 'format = "criteo"' in capsys.readouterr().out
    (tmp_path / "s.csv").write_text("a;click\nx;1\ny;0\n")  # --delimiter given: csv, nothing to tell
    assert main(["schema", "--data", str(tmp_path / "s.csv"), "--delimiter", ";"]) == 0
    text = capsys.readouterr().out
    assert "# Format" not in text and 'delimiter = ";"' in text and 'label = "click"' in text


@pytest.mark.parametrize("train_fmt", ["criteo", "csv", "libsvm"])
@pytest.mark.parametrize("held_fmt", ["criteo", "csv", "libsvm"])
def test_held_out_data_of_another_format_than_the_auto_training_data_is_refused_naming_both(tmp_path, train_fmt,
                                                                                            held_fmt):  # fmt: skip
    """--eval-data or --validation-data of another format than the one auto told --data's is refused before a line
    is read, naming each file's format and what was seen (not the reader's first bad line, or a CSV header that
    lacks the training file's columns); one of the same format passes."""
    from worker.format_detection import check_same_format

    train_path, held = tmp_path / f"train.{train_fmt}", tmp_path / f"held.{held_fmt}"
    train_path.write_text(TEXTS[train_fmt])
    held.write_text(TEXTS[held_fmt])
    s = schema(train_path)
    if held_fmt == train_fmt:
        check_same_format(str(held), s)
        return
    with pytest.raises(ValueError) as e:
        check_same_format(str(held), s)
    assert str(e.value) == (
        f"{held} reads as {held_fmt} ({SEEN[held_fmt]}), but the training data as {train_fmt} (detected: "
        f"{SEEN[train_fmt]}): every file a run reads must be in the training data's format; nothing was read"
    )


def test_held_out_data_of_another_delimiter_than_the_auto_training_data_is_refused_naming_both(tmp_path):
    from worker.format_detection import check_same_format

    train_path, held = tmp_path / "train.csv", tmp_path / "held.csv"
    write_csv(train_path, ",")
    write_csv(held, ";")
    check_same_format(str(train_path), schema(train_path))
    with pytest.raises(ValueError) as e:
        check_same_format(str(held), schema(train_path))
    assert str(e.value) == (
        f"{held} reads as csv (a header line of 4 ';'-separated names), but the training data as csv (detected: a "
        "header line of 4 comma-separated names): every file a run reads must be in the training data's format; "
        "nothing was read"
    )

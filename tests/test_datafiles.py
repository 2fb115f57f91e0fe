"""Tests for worker/datafiles.py and many-file reading (worker/formats.py): a directory, a glob or a list reads
the examples of the files' concatenation (the single-file reader is the oracle); worker shares across file
boundaries; files of another format refused by name; bad lines named by their own file and line."""

import gzip
import os
import re

import numpy as np
import pytest

from tests.test_formats import SAMPLES, assert_same_batches, ids_matrix, join, read, schema_of
from tests.test_operator_errors import TINY_RUN, worker
from worker.data_checks import count_lines
from worker.datafiles import data_files
from worker.format_detection import check_same_format
from worker.formats import csv_records, file_has_labels, first_with_content
from worker.linecount import LineCount, count_files_upto
from worker.predict import _csv_label_unknown
from worker.schema_infer import infer_schema


def split(path, out_dir, sizes, fmt, gz=()):
    """Cut a data file into files of `sizes` data lines (a csv header repeated in each), the k-th gzipped when
    k is in gz; (their paths in order, the oracle: the whole file)."""
    lines = path.read_bytes().splitlines(keepends=True)
    header, body = (lines[:1], lines[1:]) if fmt == "csv" else ([], lines)
    assert sum(sizes) == len(body)
    out_dir.mkdir()
    paths, at = [], 0
    for k, n in enumerate(sizes):
        name = out_dir / f"part-{k:05d}.{fmt}" if k not in gz else out_dir / f"part-{k:05d}.{fmt}.gz"
        text = b"".join(header + body[at : at + n])
        name.write_bytes(gzip.compress(text) if k in gz else text)
        paths.append(name)
        at += n
    return paths, path


SIZES = [5, 1, 0, 9, 8]  # 23 lines: files of odd and even lengths, one empty


def specs(paths):
    d = paths[0].parent
    return {
        "directory": str(d),
        "glob": str(d / "part-*"),
        "list": ",".join(map(str, paths)),
        "list of globs and files": f"{paths[0]},{d / 'part-0000[1-3]*'},{paths[4]}",
    }


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
@pytest.mark.parametrize("batch_size", [1, 4, 7])
def test_many_files_read_the_batches_of_their_concatenation(tmp_path, fmt, batch_size):
    paths, whole = split(SAMPLES[fmt](tmp_path), tmp_path / "parts", SIZES, fmt, gz={1, 3})
    schema = schema_of(whole, fmt)
    expected = read(whole, fmt, batch_size, schema=schema)
    assert sum(map(len, expected)) == 23
    for how, spec in specs(paths).items():
        assert data_files(spec) == [str(p) for p in paths], how
        assert_same_batches(read(spec, fmt, batch_size, schema=schema), expected)
        assert count_lines(spec, header=fmt == "csv") == 23


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
@pytest.mark.parametrize("num_workers", [2, 3])
def test_worker_shares_of_many_files_cover_every_example_once(tmp_path, fmt, num_workers):
    paths, whole = split(SAMPLES[fmt](tmp_path), tmp_path / "parts", SIZES, fmt)
    schema = schema_of(whole, fmt)
    spec = specs(paths)["directory"]

    def rows(batches):
        joined = join(batches)
        return sorted(map(tuple, np.column_stack([joined.labels, ids_matrix(joined)]).tolist()))

    shares = [read(spec, fmt, 4, schema=schema, worker_id=i, num_workers=num_workers) for i in range(num_workers)]
    assert sorted(sum((rows(s) for s in shares), [])) == rows(read(whole, fmt, 4, schema=schema))
    sizes = [sum(map(len, s)) for s in shares]
    assert max(sizes) - min(sizes) <= 2  # the files' extra lines go to different workers


def test_one_line_files_spread_over_the_workers(tmp_path):
    paths, whole = split(SAMPLES["criteo"](tmp_path), tmp_path / "parts", [1] * 23, "criteo")
    schema = schema_of(whole, "criteo")
    sizes = [sum(map(len, read(str(tmp_path / "parts"), "criteo", 4, schema=schema, worker_id=i, num_workers=2)))
             for i in range(2)]  # fmt: skip
    assert sizes == [12, 11]


def test_a_bad_line_is_named_by_its_own_file_and_line(tmp_path):
    paths, whole = split(SAMPLES["criteo"](tmp_path), tmp_path / "parts", SIZES, "criteo")
    lines = paths[3].read_text().splitlines(keepends=True)
    lines[2] = "2\tnot a criteo line\n"
    paths[3].write_text("".join(lines))
    schema = schema_of(whole, "criteo")
    with pytest.raises(ValueError, match=rf"^{paths[3]} line 3: "):
        read(str(tmp_path / "parts"), "criteo", 4, schema=schema)
    with pytest.raises(ValueError, match=rf"^{paths[3]} line 3: "):  # the second worker's share of file 3
        read(str(tmp_path / "parts"), "criteo", 4, schema=schema, worker_id=1, num_workers=2)


def test_a_directory_skips_hidden_and_side_files(tmp_path):
    for name in ["b.tsv", "a.tsv.gz", ".hidden", "_SUCCESS", "a.tsv.crc", "schema.toml", "README.md"]:
        (tmp_path / name).write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.tsv").write_text("")
    assert data_files(tmp_path) == [str(tmp_path / "a.tsv.gz"), str(tmp_path / "b.tsv")]
    assert data_files(tmp_path / "_SUCCESS") == [str(tmp_path / "_SUCCESS")]  # named alone, it is read


def test_a_directory_whose_name_holds_a_comma_is_one_entry_not_a_list(tmp_path):
    from worker.datafiles import describe_files, takes_in

    parts = tmp_path / "day=1,hour=2"
    parts.mkdir()
    (parts / "part-0.svm").write_text("1 3:1\n")
    (parts / "notes.md").write_text("")
    other = tmp_path / "day=1"  # what the name's part before the comma names: never read
    other.mkdir()
    (other / "stray.svm").write_text("0 4:1\n")
    assert data_files(parts) == [str(parts / "part-0.svm")]
    assert describe_files("--data", str(parts)).endswith("skipped as not data: notes.md")
    assert takes_in(str(parts), str(parts / "out.svm")) and not takes_in(str(parts), str(other / "out.svm"))


def test_empty_matches_and_repeats_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"the pattern '.*day_\*\.tsv' matches no data file"):
        data_files(str(tmp_path / "day_*.tsv"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is a directory holding no data file"):
        data_files(tmp_path / "empty")
    (tmp_path / "a.tsv").write_text("")
    with pytest.raises(ValueError, match="a.tsv is named twice"):
        data_files(f"{tmp_path / 'a.tsv'},{tmp_path / '*.tsv'}")


@pytest.mark.parametrize("odd", ["broken link", "fifo"])
def test_a_data_entry_that_is_no_file_is_refused_not_left_out(tmp_path, odd):
    (tmp_path / "part-0.tsv").write_text("")
    if odd == "broken link":
        (tmp_path / "part-1.tsv").symlink_to(tmp_path / "gone" / "part-1.tsv")
    else:
        os.mkfifo(tmp_path / "part-1.tsv")
    (tmp_path / "_part-2.tsv").symlink_to(tmp_path / "gone")  # not data by its name: skipped
    what = "a broken link" if odd == "broken link" else "not a regular file"
    for spec in (tmp_path, tmp_path / "part-*"):
        with pytest.raises(ValueError, match=re.escape(f"part-1.tsv, taken in by {spec}, is {what}")):
            data_files(spec)
    (tmp_path / "part-1.tsv").unlink()
    assert data_files(tmp_path) == data_files(tmp_path / "part-*") == [str(tmp_path / "part-0.tsv")]


def test_a_file_of_another_format_or_header_is_refused_naming_it(tmp_path):
    paths, whole = split(SAMPLES["csv"](tmp_path), tmp_path / "parts", SIZES, "csv")
    schema = schema_of(whole, "csv")
    check_same_format(str(tmp_path / "parts"), schema)
    paths[3].write_text(paths[3].read_text().replace("click,site,price", "click,price,site", 1))
    with pytest.raises(ValueError, match=rf"^{paths[3]}: its CSV header \['click', 'price'.* differs from that of "):
        check_same_format(str(tmp_path / "parts"), schema)
    criteo_paths, criteo = split(SAMPLES["criteo"](tmp_path), tmp_path / "c", SIZES, "criteo")
    libsvm = SAMPLES["libsvm"](tmp_path)
    with pytest.raises(ValueError, match=rf"^{libsvm}: its first line has 1 tab-separated columns, expected 40"):
        check_same_format(f"{criteo_paths[0]},{libsvm}", schema_of(criteo, "criteo"))
    with pytest.raises(ValueError, match=rf"^{criteo}: its first line is not libsvm"):
        check_same_format(f"{libsvm},{criteo}", schema_of(libsvm, "libsvm"))
    with pytest.raises(ValueError) as e:  # the first file itself: named once, with the flag that reads it
        check_same_format(f"{libsvm},{criteo_paths[0]}", schema_of(criteo, "criteo"))
    assert str(e.value).startswith(f"{libsvm} line 1: 1 tab-separated columns, expected 40 (it looks like libsvm")
    assert "--format libsvm reads it" in str(e.value) and "unlike" not in str(e.value)
    tsv = tmp_path / "other.tsv"  # a first file of tabs, of another layout: the flag to check
    tsv.write_text("1\ta\tb\n")
    with pytest.raises(ValueError) as e:
        check_same_format(f"{tsv},{criteo_paths[0]}", schema_of(criteo, "criteo"))
    assert str(e.value).startswith(f"{tsv}: its first line has 3 tab-separated columns, expected 40")
    assert str(e.value).endswith(": the data must be criteo (is --format right?)") and "unlike" not in str(e.value)


def test_train_refuses_a_differing_file_and_an_empty_glob_before_training(tmp_path, capsys):
    paths, whole = split(SAMPLES["csv"](tmp_path), tmp_path / "parts", SIZES, "csv")
    paths[4].write_text("label,other\n1,2\n")
    code, err = worker(["train", "--local-shards", "1", "--format", "csv", "--data", str(tmp_path / "parts"),
                        *TINY_RUN], capsys)  # fmt: skip
    assert code == 2 and f"{paths[4]}: its CSV header ['label', 'other'] differs" in err, err
    code, err = worker(["train", "--local-shards", "1", "--data", str(tmp_path / "day_*"), *TINY_RUN], capsys)
    assert code == 2 and f"--data: the pattern '{tmp_path / 'day_*'}' matches no data file" in err, err


def test_train_on_a_directory_of_gzipped_and_plain_files(tmp_path, capsys):
    split(SAMPLES["criteo"](tmp_path), tmp_path / "parts", SIZES, "criteo", gz={0, 3})
    code, err = worker(["train", "--local-shards", "1", "--data", str(tmp_path / "parts"), "--model", "lr",
                        "--no-progress", "--epochs", "1"], capsys)  # fmt: skip
    assert code == 0, err


def test_schema_inference_samples_every_file_and_refuses_another_header(tmp_path):
    paths, whole = split(SAMPLES["csv"](tmp_path), tmp_path / "parts", SIZES, "csv")
    text, _ = infer_schema(str(tmp_path / "parts"), sample_rows=100)
    assert text == infer_schema(str(whole), sample_rows=100)[0].replace(str(whole), str(tmp_path / "parts"))
    paths[4].write_text("label,other\n1,2\n")
    with pytest.raises(ValueError, match=rf"^{paths[4]}: its CSV header"):
        infer_schema(str(tmp_path / "parts"))


def test_empty_part_files_of_a_directory_hold_no_examples(tmp_path, capsys):
    """Spark writes a gzip'ed part file of no content for an empty partition: among others it is read as no
    examples, by the format check, the schema, the sampler, the reader and a train run; alone, it is refused."""
    paths, whole = split(SAMPLES["csv"](tmp_path), tmp_path / "parts", [0, 12, 0, 11], "csv", gz={0, 2})
    paths[0].write_bytes(gzip.compress(b""))
    paths[2].write_bytes(gzip.compress(b" \n\n"))
    parts = str(tmp_path / "parts")
    schema = schema_of(parts, "csv")
    assert schema == schema_of(whole, "csv")
    check_same_format(parts, schema)
    assert file_has_labels(parts, schema) and first_with_content(parts) == str(paths[1])
    assert_same_batches(read(parts, "csv", 5, schema=schema), read(whole, "csv", 5, schema=schema))
    text, _ = infer_schema(parts, sample_rows=100)
    assert text == infer_schema(str(whole), sample_rows=100)[0].replace(str(whole), parts)
    code, err = worker(["schema", "--data", parts], capsys)
    assert code == 0, err
    code, err = worker(["train", "--local-shards", "1", "--format", "csv", "--data", parts, "--model", "lr",
                        "--no-progress", "--epochs", "1"], capsys)  # fmt: skip
    assert code == 0, err
    with pytest.raises(ValueError, match=rf"^{paths[0]}: the file is empty; expected a header line"):
        infer_schema(str(paths[0]))
    with pytest.raises(ValueError, match=rf"^{paths[2]}: the file is empty; a csv file starts with a header line"):
        schema_of(paths[2], "csv")
    with pytest.raises(ValueError, match=r"its 2 files are all empty: no examples to read"):
        check_same_format(f"{paths[0]},{paths[2]}", schema)
    criteo_paths, criteo = split(SAMPLES["criteo"](tmp_path), tmp_path / "c", [0, 23], "criteo", gz={0})
    unlabeled = tmp_path / "c" / "part-00001.criteo"
    unlabeled.write_bytes(b"".join(line.split(b"\t", 1)[1] for line in criteo.read_bytes().splitlines(True)))
    assert not file_has_labels(str(tmp_path / "c"), schema_of(criteo, "criteo"))
    check_same_format(str(tmp_path / "c"), schema_of(criteo, "criteo"))
    libsvm_paths, libsvm = split(SAMPLES["libsvm"](tmp_path), tmp_path / "l", [0, 23], "libsvm", gz={0})
    text, _ = infer_schema(str(tmp_path / "l"), fmt="libsvm")  # the fields of the first file with content
    assert text == infer_schema(str(libsvm), fmt="libsvm")[0].replace(str(libsvm), str(tmp_path / "l"))


def test_a_first_part_file_of_its_header_alone_does_not_hide_the_label(tmp_path):
    """A part file of an empty partition may hold its CSV header alone: the built-in schema (and predict's check of a
    label it cannot tell) reads the label from the records of the first file holding some, as of the whole data."""
    header, rows = "id,click,site\n", "".join(f"{i},{i % 2},s{i % 3}\n" for i in range(2, 40))
    whole = tmp_path / "whole.csv"
    whole.write_text(header + rows)
    paths, _ = split(whole, tmp_path / "parts", [0, 0, 38], "csv", gz={1})
    parts = str(tmp_path / "parts")
    assert schema_of(parts, "auto") == schema_of(whole, "auto")
    assert schema_of(parts, "auto").label == "click"
    assert csv_records(parts, ",", 100) == (["id", "click", "site"], [r.split(",") for r in rows.split()])
    assert not _csv_label_unknown("auto", parts)
    paths[1].write_bytes(gzip.compress(b"id,site,click\n2,s2,0\n"))  # another header ends the search
    assert csv_records(parts, ",", 100) == (["id", "click", "site"], [])


def test_a_directory_and_a_glob_read_numbered_files_in_number_order(tmp_path):
    names = ["day_10", "day_2", "day_0", "day_1", "part-9", "part-10"]
    for n in names:
        (tmp_path / n).write_text("x\n")
    expected = ["day_0", "day_1", "day_2", "day_10", "part-9", "part-10"]
    assert [os.path.basename(p) for p in data_files(str(tmp_path))] == expected
    assert [os.path.basename(p) for p in data_files(str(tmp_path / "day_*"))] == expected[:4]


def test_a_count_over_many_files_stops_at_its_limit_and_estimates_the_files_not_reached(tmp_path):
    d = tmp_path / "parts"
    d.mkdir()
    for k, gz in enumerate([False, True, False]):
        text = b"".join(b"%06d\tline\n" % i for i in range(50))
        (d / f"day_{k}{'.gz' if gz else ''}").write_bytes(gzip.compress(text) if gz else text)
    files = data_files(str(d))
    assert count_files_upto(files, None) == LineCount(150, False, 150, sum(os.path.getsize(f) for f in files),
                                                      (50, 50, 50))  # fmt: skip
    assert count_lines(str(d)) == 150
    counted = count_files_upto(files, 70)  # stops in the gzip'ed second file; the third is estimated from bytes
    assert (
        counted.lines == 70
        and counted.more
        and counted.bytes_read <= os.path.getsize(files[0]) + os.path.getsize(files[1])
    )
    assert 140 <= counted.estimate <= 160, counted  # the third file at the first's lines per byte: 50
    assert counted.per_file == (50,)  # the files counted to their end


def test_describe_files_names_the_files_read_in_order_and_those_skipped(tmp_path):
    from worker.datafiles import describe_files

    day = tmp_path / "day"
    day.mkdir()
    for name in ("part-10", "part-2", "_SUCCESS", ".part-2.crc", "README.md"):
        (day / name).write_text("x\n")
    assert describe_files("--data", str(day)) == (f"--data {day}: 2 files read in this order (part-2, part-10); "
                                                  "skipped as not data: .part-2.crc, README.md, _SUCCESS")  # fmt: skip
    assert describe_files("--data", str(day / "part-2")) is None and describe_files("--data", None) is None
    many = tmp_path / "many"
    many.mkdir()
    for k in range(7):
        (many / f"p{k}").write_text("x\n")
    assert describe_files("--eval-data", f"{many}/p*").endswith("(p0, p1, p2, p3, p4, ... (2 more))")


def test_a_directory_of_csv_parts_read_as_criteo_is_refused_with_the_flag_a_single_csv_gets(tmp_path):
    """The first part with content, read as Criteo TSV, is refused as one CSV file is: named at its line 1, with
    the --format that reads it (an empty part before it is passed over)."""
    paths, _ = split(SAMPLES["csv"](tmp_path), tmp_path / "parts", SIZES, "csv", gz={1})
    paths[0].write_bytes(b"")  # no content
    schema = schema_of(SAMPLES["criteo"](tmp_path), "criteo")
    for spec in (str(tmp_path / "parts"), str(paths[1])):
        with pytest.raises(ValueError) as e:
            check_same_format(spec, schema)
        assert str(e.value) == (f"{paths[1]} line 1: 1 tab-separated columns, expected 40 (it looks comma-separated: "
                                "--format csv reads a CSV file with a header); a file of no tab is no Criteo TSV: "
                                "nothing was read")  # fmt: skip

"""worker.train and worker.data: progress totals, one field count for libsvm train and eval files, the recipe by
data size, the validation split, early stopping, L2 on the rows a step touches, flag checks."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import logging
import math
import os
import re

import numpy as np
import pytest

from tests.inprocess import InProcessTables
from worker import job, recipe, train_config
from worker.client import Client
from worker.data_checks import count_lines
from worker.datafiles import check_held_out
from worker.job import loop_settings, open_job, prepare
from worker.linecount import CHUNK_BYTES, LineCount, count_data_upto, count_lines_upto
from worker.loop import run_epochs
from worker.recipe import BIG_BATCH_EXAMPLES, LARGE, SMALL, SMALL_DATA_EXAMPLES, choose
from worker.train import train
from worker.train_config import TrainConfig
from worker.validation_split import validation_mask


def test_count_lines_reads_gzip_and_drops_a_csv_header(tmp_path):
    plain, packed = tmp_path / "a.csv", tmp_path / "a.csv.gz"
    text = "label,c1\n" + "".join(f"{i % 2},x{i}\n" for i in range(7))
    plain.write_text(text)
    with gzip.open(packed, "wt") as f:
        f.write(text)
    assert count_lines(str(plain)) == count_lines(str(packed)) == 8
    assert count_lines(str(packed), header=True) == 7


def test_count_lines_skips_gzip_padding_and_counts_old_mac_line_ends(tmp_path):
    """Zero bytes after a gzip member are padding (gzip -t and Python's gzip module pass them); a file of lone CR
    line ends, which the CSV reader reads, counts its lines too."""
    text = b"".join(b"%d,x\n" % (i % 2) for i in range(300))
    padded = tmp_path / "p.csv.gz"
    padded.write_bytes(gzip.compress(text) + b"\0" * 70_000 + gzip.compress(text) + b"\0" * 3)
    assert count_lines_upto(str(padded), None).lines == 600 == len(gzip.decompress(padded.read_bytes()).splitlines())
    junk = tmp_path / "j.csv.gz"
    junk.write_bytes(gzip.compress(text) + b"\0\0junk")
    with pytest.raises(ValueError, match="its name ends in .gz, but it does not read as gzip"):
        count_lines_upto(str(junk), None)
    old_mac = tmp_path / "cr.csv"
    old_mac.write_bytes(b"label,a\r" + text.replace(b"\n", b"\r"))
    assert count_lines_upto(str(old_mac), None, header=True).lines == 300
    assert count_lines_upto(str(old_mac), 100, header=True) == LineCount(100, True, 300, old_mac.stat().st_size)
    mixed = tmp_path / "mixed.csv"  # CR, then LF, then CRLF with one cut by a chunk's end: the csv module's count
    first = b"label,a\n1," + b"x" * (CHUNK_BYTES - 11) + b"\r\n"  # its CR ends the first chunk
    mixed.write_bytes(first + text[:600].replace(b"\n", b"\r") + text[600:1200] + text[1200:].replace(b"\n", b"\r\n"))
    records = len(list(csv.reader(io.StringIO(mixed.read_text(), newline="")))) - 1
    assert count_lines_upto(str(mixed), None, header=True).lines == records == 301
    assert count_lines_upto(str(mixed), None).lines == mixed.read_bytes().count(b"\n")  # no header: LF only


@pytest.mark.parametrize("packed", [False, True])
def test_a_file_over_the_threshold_takes_the_large_recipe_after_reading_a_bounded_prefix(tmp_path, monkeypatch,
                                                                                        packed):  # fmt: skip
    """The count stops at the recipe's threshold: the progress total of a larger file is estimated from bytes."""
    monkeypatch.setattr(recipe, "SMALL_DATA_EXAMPLES", 100)
    path = tmp_path / ("big.svm.gz" if packed else "big.svm")
    text = "".join(f"{i % 2} {i % 97}:1 {100 + i % 13}:1\n" for i in range(30_000))
    with gzip.open(path, "wt") if packed else open(path, "w") as f:
        f.write(text)
    cfg, data, _, line = prepare(TrainConfig(data=str(path), format="libsvm", local_shards=1, progress=False))
    counted = data.line_count
    assert (counted.lines, counted.more) == (100, True)
    assert counted.bytes_read <= max(CHUNK_BYTES, path.stat().st_size // 4)  # not the whole file
    assert line.startswith("large-data recipe for at least 100 lines of training data (counted no further): ")
    assert cfg.batch_size == LARGE.batch_size
    settings = loop_settings(cfg, data)
    assert settings.total_estimated and 15_000 < settings.total_examples < 60_000  # 30,000: an estimate


@pytest.mark.parametrize("packed", [False, True])
def test_a_libsvm_files_comment_and_blank_lines_are_no_lines_of_data(tmp_path, monkeypatch, packed):
    """Lines of whitespace or of a comment only (# ...) are not counted: the recipe, its line and the progress total
    count the 60 lines of data; a count stopped at a limit stops at that data line; a last line without its end
    counts where it holds data."""
    monkeypatch.setattr(recipe, "SMALL_DATA_EXAMPLES", 100)
    lines = ["# made by a tool", ""]
    for i in range(60):
        lines.append(f"{i % 2} {i}:1 # line {i}")
        lines += ["  # a note", " \t", ""] if i % 3 == 0 else []
    text = "\n".join(lines) + "\n# the end"
    path = tmp_path / ("c.svm.gz" if packed else "c.svm")
    with gzip.open(path, "wt") if packed else open(path, "w") as f:
        f.write(text)
    cfg, data, _, line = prepare(TrainConfig(data=str(path), format="libsvm", local_shards=1, progress=False))
    assert (data.line_count.lines, data.line_count.more) == (60, False)
    assert line.startswith("small-data recipe for 60 lines of training data (under 100): ")
    assert loop_settings(cfg, data).total_examples == 60 - int(validation_mask(0, 60, 0.1).sum())  # the split's picks
    assert count_lines_upto(str(path), None).lines == len(lines) + 1  # every line, without empty
    assert count_data_upto([str(path)], 60, "libsvm").more and count_data_upto([str(path)], 61, "libsvm").lines == 60
    half = count_data_upto([str(path)], 30, "libsvm")
    assert (half.lines, half.more) == (30, True) and 45 <= half.estimate <= 80  # 60, from the bytes of the first 30
    with open(path, "ab") as f:
        f.write(b"\n1 60:1" if not packed else gzip.compress(b"\n1 60:1"))  # a data line without its end
    assert count_data_upto([str(path)], None, "libsvm").lines == 61


def test_the_libsvm_count_and_the_reader_agree_on_which_lines_hold_data(tmp_path):
    """count_data_upto's lines of a libsvm file are the lines the reader reads other than empty (the oracle:
    ReadStats' lines read less its empty ones), whatever whitespace, CRs, query ids and comments a line holds:
    a line of a query id only is empty, one with a CR before its end is a bad line (CR_ALONE), comment or not."""
    from worker.formats import ReadStats, read_batches
    from worker.schema_builtin import builtin_schema

    pieces = [
        "",
        " ",
        "\t",
        "\r",
        "\x0b",
        "qid:3",
        "qid:3 qid:4",
        "#x",
        "# a:b\r",
        "1 1:1",
        "1",
        "x",
        "\r # x",
        "qid:x",
    ]
    schema = builtin_schema("libsvm", default_table="t", default_dim=4, libsvm_fields=2)
    rng = np.random.default_rng(5)
    for case in range(30):
        lines = ["".join(rng.choice(pieces, size=int(rng.integers(1, 4)))) for _ in range(int(rng.integers(1, 30)))]
        path = tmp_path / f"m{case}.svm"
        text = "\n".join(lines) + ("\n" if rng.random() < 0.5 else "")
        path.write_bytes(text.encode())
        stats = ReadStats()
        for _ in read_batches(str(path), schema, 8, max_bad_lines=10**6, stats=stats):
            pass
        counted = count_data_upto([str(path)], None, "libsvm")
        assert counted.lines == stats.lines_read - stats.empty_lines, (lines, counted, stats)
        if counted.lines:  # a count to a limit of them all stops at the last line of data
            assert count_data_upto([str(path)], counted.lines, "libsvm").more


CRITEO_LINE = "1" + "\t5" * 13 + "\t68fd1e64" * 26


@pytest.mark.parametrize("fmt", ["csv", "criteo"])
def test_the_csv_and_criteo_counts_and_readers_agree_on_which_lines_hold_data(tmp_path, fmt):
    """Blank lines are no data in every format, as in libsvm's: count_data_upto's lines are the lines the reader
    reads other than empty (the oracle: ReadStats' lines read less its empty ones), whatever blank lines, CRs
    (a csv line end of its own) and bad lines a file holds; so a file with trailing blank lines counts its data
    lines alike in every format. The shares' residues are the data lines' (idle_workers against the shares read);
    a CSV's, of its records, csv_data_places' alone."""
    from worker.formats import ReadStats, idle_workers, read_batches
    from worker.readers.csv_records import csv_data_places
    from worker.schema_builtin import builtin_schema

    good = {"csv": ["1,x", "0,y"], "criteo": [CRITEO_LINE, "0" + CRITEO_LINE[1:]]}[fmt]
    pieces = [*good, "", " ", "\t", "  \r", "x"]
    if fmt == "csv":  # rows of blank cells, quoted or not (skipped), and cells that are not blank: a quoted comma,
        pieces += [",", " , ", '""', '"",""', '"" , ', ' ""', '","', ";"]  # a quote after a space (bad lines)
    header = "click,a\n" if fmt == "csv" else ""
    schema = builtin_schema(fmt, default_table="t", default_dim=4, header=["click", "a"] if fmt == "csv" else None)
    rng = np.random.default_rng(7)
    for case in range(30):
        lines = [str(rng.choice(pieces)) for _ in range(int(rng.integers(1, 20)))]
        path = tmp_path / f"m{case}.{fmt}"
        path.write_bytes((header + "\n".join(lines) + ("\n" if rng.random() < 0.5 else "")).encode())
        stats = ReadStats()
        for _ in read_batches(str(path), schema, 8, max_bad_lines=10**6, stats=stats):
            pass
        n = int(rng.integers(1, 5))
        counted = count_data_upto([str(path)], None, fmt, modulus=n)
        assert counted.lines == stats.lines_read - stats.empty_lines, (lines, counted, stats)
        read = [sum(map(len, read_batches(str(path), schema, 10, worker_id=i, num_workers=n, max_bad_lines=10**6)))
                for i in range(n)]  # fmt: skip
        residues = (csv_data_places(str(path), ",", n).residues,) if fmt == "csv" else counted.per_file_residues
        assert counted.per_file_residues == (() if fmt == "csv" else residues)
        if not stats.bad_lines:  # (a bad line is a line of data, of a worker that reads no example of it)
            assert idle_workers(residues, n) == [i for i in range(n) if not read[i]], (lines, n)
        if counted.lines:  # a count to a limit of them all stops at the last line of data
            assert count_data_upto([str(path)], counted.lines, fmt).more
    trailing = {f: tmp_path / f"t.{f}" for f in ("csv", "criteo", "libsvm")}
    trailing["csv"].write_text("click,a\n" + "1,x\n" * 5 + "\n\n")
    trailing["criteo"].write_text(f"{CRITEO_LINE}\n" * 5 + "\n\n")
    trailing["libsvm"].write_text("1 1:1\n" * 5 + "\n\n")
    assert {f: count_data_upto([str(p)], None, f).lines for f, p in trailing.items()} == dict.fromkeys(trailing, 5)
    old_mac = tmp_path / "cr.csv"  # lines ended by CR alone, which the csv reader reads
    old_mac.write_bytes(b"click,a\r" + b"1,x\r" * 5 + b"\r \r,\r")
    assert count_data_upto([str(old_mac)], None, "csv").lines == 5
    semicolons = tmp_path / "semi.csv"  # rows of blank cells by the file's delimiter: ;; is one, ,, one cell of data
    semicolons.write_text("click;a\n1;x\n;;\n;;\n,,\n")
    assert count_data_upto([str(semicolons)], None, "csv", delimiter=";").lines == 2
    assert count_data_upto([str(semicolons)], None, "csv").lines == 3


def test_a_small_files_count_is_exact_and_its_total_not_an_estimate(tmp_path, monkeypatch):
    monkeypatch.setattr(recipe, "SMALL_DATA_EXAMPLES", 100)
    path = tmp_path / "small.svm"
    path.write_text("".join(f"{i % 2} {i}:1\n" for i in range(99)))  # one under the threshold
    cfg, data, _, line = prepare(TrainConfig(data=str(path), format="libsvm", local_shards=1, progress=False))
    assert (data.line_count.lines, data.line_count.more) == (99, False)
    assert line.startswith("small-data recipe for 99 lines of training data (under 100): ")
    settings = loop_settings(cfg, data)
    assert (settings.total_examples, settings.total_estimated) == (99 - int(validation_mask(0, 99, 0.1).sum()), False)
    assert count_lines_upto(str(path), 99) == LineCount(99, True, 99, path.stat().st_size)  # at the threshold: more
    assert count_lines_upto(str(path), None).lines == count_lines(str(path)) == 99
    unended = tmp_path / "unended.svm"  # a last line without its line end is a line the readers read
    unended.write_text("".join(f"{i % 2} {i}:1\n" for i in range(99)) + "1 99:1")
    assert count_lines_upto(str(unended), None).lines == 100
    assert count_lines_upto(str(unended), 100) == LineCount(100, True, 100, unended.stat().st_size)  # at the limit
    assert count_lines_upto(str(unended), 101) == LineCount(100, False, 100, unended.stat().st_size)


def test_a_file_of_fewer_lines_than_workers_is_refused_by_every_worker_naming_the_most_it_takes(tmp_path):
    """Worker i of n reads every n-th line: with fewer lines than workers some would train nothing (and with
    `ps-worker launch` the job's summary would read 0 examples). A last line without its line end is a line the
    workers read. An empty file keeps its own error."""
    path = tmp_path / "three.svm"
    path.write_text("".join(f"{i % 2} {i}:1\n" for i in range(3)))
    for worker in (0, 4):
        cfg = TrainConfig(servers=("h:1",), data=str(path), format="libsvm", job_id=1, num_workers=5, worker_id=worker)
        with pytest.raises(ValueError, match=r"three.svm holds 3 lines of data, shared by the job's 5 workers "
                                             r"\(worker i reads lines i \+ 1, i \+ 6, i \+ 11, \.\.\.\): workers 3, 4 "
                                             r"would read none of them: each trains no example; start at most 3$"):  # fmt: skip
            prepare(cfg)
    _, data, _, _ = prepare(
        TrainConfig(servers=("h:1",), data=str(path), format="libsvm", job_id=1, num_workers=3, worker_id=2)
    )
    assert data.line_count.lines == 3
    unended = tmp_path / "unended.svm"
    unended.write_text("0 1:1\n1 2:1")
    _, data, _, _ = prepare(TrainConfig(servers=("h:1",), data=str(unended), format="libsvm", job_id=1, num_workers=2))
    assert data.line_count.lines == 2
    (tmp_path / "empty.svm").write_text("")
    with pytest.raises(ValueError, match="no examples in it"):
        prepare(
            TrainConfig(servers=("h:1",), data=str(tmp_path / "empty.svm"), format="libsvm", job_id=1, num_workers=2)
        )


def test_files_that_leave_a_worker_no_line_are_refused_however_many_lines_they_hold(tmp_path):
    """Worker i reads, of the k-th file, the lines whose number % n == (i + k) % n: files of 1 and 2 lines give
    3 workers 3 lines, but worker 1 none (the oracle: each worker's share read). Every worker refuses them."""
    from worker.formats import idle_workers, read_batches

    (tmp_path / "a.svm").write_text("0 1:1\n")
    (tmp_path / "b.svm").write_text("1 2:1\n0 3:1\n")
    files = f"{tmp_path / 'a.svm'},{tmp_path / 'b.svm'}"
    _, data, _, _ = prepare(TrainConfig(servers=("h:1",), data=files, format="libsvm"))
    assert [sum(map(len, read_batches(files, data.schema, 10, worker_id=i, num_workers=3))) for i in range(3)] == [
        2, 0, 1]  # fmt: skip
    for worker in range(3):
        cfg = TrainConfig(servers=("h:1",), data=files, format="libsvm", job_id=1, num_workers=3, worker_id=worker)
        with pytest.raises(ValueError, match=r"holds 3 lines of data in 2 files, shared by the job's 3 workers "
                                             r"\(worker i reads file k's lines whose number % 3 == \(i \+ k\) % 3, files and "
                                             r"lines counted from 1\): "
                                             r"worker 1 would read none of them: it trains no example; start fewer "
                                             r"workers$"):  # fmt: skip
            prepare(cfg)
    prepare(TrainConfig(servers=("h:1",), data=files, format="libsvm", job_id=1, num_workers=2, worker_id=1))
    rng = np.random.default_rng(0)
    no_data = ["\n", "# c: 1\n", " \t\n", "  # x\n"]
    for case in range(60):  # idle_workers against the shares read_batches reads of random small files
        lines, n = rng.integers(0, 7, rng.integers(1, 5)).tolist(), int(rng.integers(1, 7))
        paths = [tmp_path / f"r{case}_{k}.svm" for k in range(len(lines))]
        for path, c in zip(paths, lines):  # lines of data among lines of none (a comment or blank), the last unended
            text = "".join(f"1 {j}:1\n" if rng.random() < 0.6 else str(rng.choice(no_data)) for j in range(c))
            path.write_text(text[:-1] if rng.random() < 0.3 else text)
        spec = ",".join(map(str, paths))
        read = [sum(map(len, read_batches(spec, data.schema, 10, worker_id=i, num_workers=n))) for i in range(n)]
        counted = count_data_upto(list(map(str, paths)), None, "libsvm", modulus=n)
        assert idle_workers(counted.per_file_residues, n) == [i for i in range(n) if not read[i]]


def test_the_idle_worker_check_goes_by_where_the_lines_of_data_stand_among_comments_and_blanks(tmp_path):
    """The shares take every n-th line, comments and blank lines among them: a comment that opens one file of 1
    line of data, then a file of 2, leave each of 3 workers a line of data (accepted); 3 lines of data with a blank
    line third leave worker 2 none (refused, naming it; fewer workers may serve, not 'at most 3')."""
    from worker.formats import read_batches

    (tmp_path / "a.svm").write_text("# c\n1 1:1 2:1\n")
    (tmp_path / "b.svm").write_text("0 1:1\n1 2:1\n")
    files = f"{tmp_path / 'a.svm'},{tmp_path / 'b.svm'}"
    for worker in range(3):
        _, data, _, _ = prepare(TrainConfig(servers=("h:1",), data=files, format="libsvm", job_id=1, num_workers=3,
                                            worker_id=worker))  # fmt: skip
        assert sum(map(len, read_batches(files, data.schema, 10, worker_id=worker, num_workers=3))) == 1
    gap = tmp_path / "gap.svm"
    gap.write_text("1 1:1\n0 2:1\n\n1 3:1\n")
    cfg = TrainConfig(servers=("h:1",), data=str(gap), format="libsvm", job_id=1, num_workers=3, worker_id=0)
    with pytest.raises(ValueError, match=r"gap.svm holds 3 lines of data, shared by the job's 3 workers \(worker i "
                                         r"reads lines i \+ 1, i \+ 4, i \+ 7, \.\.\.\): worker 2 would read none of them: "
                                         r"it trains no example; start fewer workers$"):  # fmt: skip
        prepare(cfg)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_worker_whose_share_gives_it_no_example_to_train_stops_at_its_first_epoch_saying_why(tmp_path, shuffle):
    """Each of 2 workers reads a line of data, so the up-front check passes; but worker 1's share gives it nothing
    to train: its one example is the split's first pick (validation_mask), or its lines are malformed or empty
    within --max-bad-lines. Its first epoch, read to its end, is a ValueError saying which, and what to do; worker
    0 trains what its share holds (the oracle: its lines less its validation picks)."""
    assert validation_mask(0, 2, 0.1).tolist() == [True, False]  # a share's first example validates
    lines = tmp_path / "lines.svm"
    lines.write_text("1 3:1 5:1\n0 4:1\n1 3:1\n")  # worker 0: lines 0 and 2; worker 1: line 1
    bad = tmp_path / "bad.svm"
    bad.write_text("1 3:1 5:1\nbad one\n0 3:1\n\n1 5:1\nalso bad\n")  # worker 1: lines 1, 3, 5
    one_bad = tmp_path / "one_bad.svm"
    one_bad.write_text("1 3:1 5:1\nbad one\n0 3:1\n")  # worker 1: line 1
    cases = [
        (lines, 0.1, [1, 1],
         r"the 1 example of its share of .*lines.svm went to the validation split \(--validation-fraction 0.1\); start "
         r"fewer workers or give them more data, or train with --validation-fraction 0 \(or a --validation-data "
         r"file\)"),
        (bad, 0.0, [2, 1, 2, 1],
         r"all 3 lines of its share of .*bad.svm are malformed or empty \(2 malformed, skipped under --max-bad-lines "
         r"5; first: .*bad.svm line 2: label 'bad', expected 0, 1, -1 or \+1; 1 empty\); fix the data, or its "
         r"--format or --schema"),
        (one_bad, 0.0, [2, 2],
         r"the 1 line of its share of .*one_bad.svm is malformed or empty \(1 malformed, skipped under "
         r"--max-bad-lines 5; first: .*one_bad.svm line 2: label 'bad', expected 0, 1, -1 or \+1; 0 empty\); fix the "
         r"data, or its --format or --schema"),
    ]  # fmt: skip
    for path, fraction, expected, why in cases:
        trained = []
        for worker in (0, 1):
            cfg = TrainConfig(servers=("h:1",), data=str(path), format="libsvm", job_id=1, num_workers=2,
                              worker_id=worker, validation_fraction=fraction, max_bad_lines=5, shuffle=shuffle,
                              batch_size=2)  # fmt: skip
            _, data, _, _ = prepare(cfg)
            data.validation()  # as train() reads it, before training
            if worker == 0:
                trained = [len(b) for epoch in (1, 2) for b in data.train(epoch)]
                continue
            with pytest.raises(ValueError, match=rf"^worker 1 of the job's 2 trains no example: {why}$"):
                list(data.train(1))
        assert trained == expected


def test_a_run_whose_examples_all_go_to_the_validation_split_fails_before_a_step_instead_of_training_nothing(
    tmp_path, capsys
):
    """Both examples of a one-worker run are the split's picks at --validation-fraction 0.5: the run stops with a
    data error (exit 2) saying so, rather than running its epochs on nothing ('train logloss nan') and exiting 0."""
    from worker.__main__ import main

    assert validation_mask(0, 2, 0.5).tolist() == [True, True]
    path = tmp_path / "two.svm"
    path.write_text("1 3:1 5:1\n0 4:1\n")
    code = main(["train", "--data", str(path), "--format", "libsvm", "--local-shards", "1", "--validation-fraction",
                 "0.5", "--epochs", "2", "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.endswith(f"ps-worker: error: the worker trains no example: all 2 examples of {path} went to the "
                        "validation split (--validation-fraction 0.5); give it more data, or train with "
                        "--validation-fraction 0 (or a --validation-data file)\n"), err  # fmt: skip


def test_counts_of_one_are_said_in_the_singular(tmp_path, capsys):
    """A run validating on, and evaluated on, one example says "1 held-out example" and "(1 example)"; a run's
    summary of 1 trained example, "on 1 example"; `ps-worker schema` of a file of one row, "a sample of 1 row"."""
    from worker.__main__ import main
    from worker.results import format_results

    data, held, evals = tmp_path / "d.svm", tmp_path / "v.svm", tmp_path / "e.svm"
    data.write_text("1 3:1 5:1\n0 4:1\n")
    held.write_text("1 3:1\n")
    evals.write_text("0 4:1\n")
    code = main(["train", "--data", str(data), "--format", "libsvm", "--local-shards", "1", "--validation-data",
                 str(held), "--eval-data", str(evals), "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and f"validating on 1 held-out example of {held}\n" in out and "(1 example)\n" in out, out
    r = {"model": "lr", "backend": "numpy", "device": "cpu", "worker": "0/1", "shards": 1, "train_examples": 1,
         "train_seconds": 1.0, "examples_per_s": 1.0}  # fmt: skip
    assert " on 1 example with 1 shard in " in format_results(r)
    one = tmp_path / "one.csv"
    one.write_text("click,site\n1,a\n")
    assert main(["schema", "--data", str(one)]) == 0
    assert "# Inferred from the header and a sample of 1 row (" in capsys.readouterr().out


def test_libsvm_eval_file_is_read_with_the_training_files_fields(tmp_path):
    train, evals = tmp_path / "train.svm", tmp_path / "eval.svm"
    train.write_text("1 3:1 8:1 9:1 12:1\n0 4:1 8:1\n")
    evals.write_text("0 3:1\n1 5:1 6:1 7:1\n")  # its first line has 1 feature: alone it would mean K = 1
    cfg = TrainConfig(data=str(train), eval_data=str(evals), format="libsvm", batch_size=10, local_shards=1)
    _, data, spec, _ = prepare(cfg)
    assert [len(b.fields) for b in data.train()] == [5]  # K = 4, plus the bias
    assert [len(b.fields) for b in data.eval()] == [5]
    assert len(spec.fields) == 5
    with pytest.raises(ValueError, match=r"--libsvm-fields is for --format libsvm data only \(the format here is "):
        TrainConfig(data=str(train), format="criteo", libsvm_fields=3, local_shards=1).validate()
    csv = tmp_path / "train.csv"  # --format auto: refused once the format is told
    csv.write_text("click,a\n1,x\n0,y\n")
    with pytest.raises(ValueError, match=r"train.csv reads as csv \(a header line of 2 comma-separated names\), and "
                       r"--libsvm-fields is for libsvm data: give --format libsvm to read it as libsvm, or leave "
                       r"--libsvm-fields out"):  # fmt: skip
        prepare(TrainConfig(data=str(csv), libsvm_fields=3, local_shards=1))
    assert prepare(TrainConfig(data=str(train), libsvm_fields=4, local_shards=1))[1].schema.format == "libsvm"


def test_shuffled_epochs_are_new_orders_of_the_same_examples_seeded_by_the_epoch():
    def epochs(n: int, **kw) -> list[np.ndarray]:
        """Field C3's ids (one per example, nearly all distinct) of n epochs of train(), each epoch's joined."""
        cfg = TrainConfig(local_shards=1, synthetic_rows=3000, batch_size=256, validation_fraction=0.2, **kw)
        _, data, _, _ = prepare(cfg)
        out = []
        for epoch in range(1, n + 1):
            batches = list(data.train(epoch))
            assert [len(b) for b in batches[:-1]] == [256] * (len(batches) - 1)
            out.append(np.concatenate([b.fields["C3"].ids for b in batches]))
        return out

    in_order = epochs(1, shuffle=False)[0]
    first, second = epochs(2)  # the small recipe shuffles
    assert sorted(first.tolist()) == sorted(second.tolist()) == sorted(in_order.tolist())  # the same examples
    assert not np.array_equal(first, in_order) and not np.array_equal(first, second)  # each epoch its own order
    np.testing.assert_array_equal(epochs(2)[1], second)  # seeded: a rerun trains the same orders
    cfg = TrainConfig(local_shards=1, synthetic_rows=3000, batch_size=256, validation_fraction=0.2)
    _, data, _, _ = prepare(cfg)
    list(data.train(5))  # another epoch asked for first (or twice) does not move an epoch's order
    np.testing.assert_array_equal(np.concatenate([b.fields["C3"].ids for b in data.train(2)]), second)


def test_the_small_recipe_trains_in_bigger_batches_from_big_batch_examples():
    # where the recipe was tuned (10,000-50,000 examples) it is the same recipe; from BIG_BATCH_EXAMPLES on only the
    # batch differs, the large recipe's, and a batch size given still wins
    assert choose("auto", 10_000) == choose("auto", 50_000) == choose("auto", BIG_BATCH_EXAMPLES - 1) == SMALL
    for examples in (BIG_BATCH_EXAMPLES, 500_000, SMALL_DATA_EXAMPLES - 1):
        assert choose("auto", examples) == dataclasses.replace(SMALL, batch_size=LARGE.batch_size)
    assert choose("small", 5 * SMALL_DATA_EXAMPLES).batch_size == LARGE.batch_size
    assert choose("small", 1000) == SMALL and choose("large", 1000) == LARGE
    cfg, line, _ = TrainConfig(local_shards=1, model="lr").with_recipe(500_000)
    assert (cfg.batch_size, cfg.epochs, cfg.early_stop) == (LARGE.batch_size, SMALL.epochs, SMALL.early_stop)
    assert "small-data recipe for 500,000 training examples" in line and f"batch {LARGE.batch_size}," in line
    assert TrainConfig(local_shards=1, batch_size=256).with_recipe(500_000)[0].batch_size == 256


def test_the_recipe_follows_the_data_size_and_flags_given_win():
    small, line, _ = TrainConfig(local_shards=1, synthetic_rows=5000).with_recipe(5000)
    assert (small.batch_size, small.epochs, small.validation_fraction, small.early_stop) == (
        SMALL.batch_size, SMALL.epochs, SMALL.validation_fraction, SMALL.early_stop)  # fmt: skip
    assert line.startswith("small-data recipe for 5,000 training examples") and "--recipe auto" in line
    large, line, _ = TrainConfig(local_shards=1).with_recipe(SMALL_DATA_EXAMPLES)
    assert (large.batch_size, large.epochs, large.validation_fraction, large.early_stop) == (
        LARGE.batch_size, LARGE.epochs, 0.0, 0)  # fmt: skip
    given, _, _ = TrainConfig(local_shards=1, batch_size=64, epochs=3, early_stop=0).with_recipe(10)
    assert (given.batch_size, given.epochs, given.early_stop, given.validation_fraction) == (64, 3, 0, 0.1)
    assert (small.optimizer, small.learning_rate, small.optimizer_params, small.dropout, small.dense_l2) == (
        "ftrl",
        0.05,
        {"l2": 300.0},
        None,  # the recipe's dropout and dense L2 are the MLP's: fm has none
        None,
    )
    mlp, mlp_line, _ = TrainConfig(local_shards=1, model="deepfm").with_recipe(10)
    assert (mlp.dropout, mlp.dense_l2) == (0.7, 1.0)
    assert "sparse ftrl 0.05 l2=300, dropout 0.7, dense l2 1, MLP output layer starting at 0, batch 256" in mlp_line
    large_mlp = TrainConfig(local_shards=1, model="deepfm").with_recipe(SMALL_DATA_EXAMPLES)
    assert "MLP output layer" not in large_mlp[1] and large_mlp[0].mlp_output_zeros is False
    dnn = TrainConfig(local_shards=1, model="dnn").with_recipe(10)  # deepfm's alone (recipe.py says why)
    assert "MLP output layer" not in dnn[1] and dnn[0].mlp_output_zeros is False
    assert "sparse ftrl 0.05 l2=300, batch 256" in TrainConfig(local_shards=1, model="lr").with_recipe(10)[1]
    fm_line = TrainConfig(local_shards=1, model="fm").with_recipe(10)[1]  # no MLP: no dropout, no dense l2
    assert "sparse ftrl 0.05 l2=300, fm rows starting in +-0.001, batch 256" in fm_line
    assert "fm rows" not in TrainConfig(local_shards=1, model="fm").with_recipe(SMALL_DATA_EXAMPLES)[1]
    assert (small.fm_init_scale, large.fm_init_scale) == (0.001, 0.01)
    chosen, _, _ = TrainConfig(local_shards=1, optimizer="adagrad").with_recipe(10)
    assert (chosen.optimizer, chosen.learning_rate, chosen.optimizer_params) == ("adagrad", 0.02, {})
    assert (large.optimizer, large.learning_rate, large.dropout) == ("adagrad", 0.02, None)  # fm: no MLP
    assert (small.dense_l2, large.dense_l2) == (None, None)  # fm
    large_dnn = TrainConfig(local_shards=1, model="dnn").with_recipe(SMALL_DATA_EXAMPLES)[0]
    assert (large_dnn.dropout, large_dnn.dense_l2) == (0.0, 0.0)
    forced, line, _ = TrainConfig(local_shards=1, recipe="large").with_recipe(10)
    assert forced.epochs == 1 and line.startswith("large-data recipe")
    with_file, line, _ = TrainConfig(local_shards=1, validation_data="v.csv").with_recipe(10)
    assert with_file.validation_fraction == 0.0  # a validation file replaces the split
    assert "up to 50 epochs, each shuffled, evaluated on v.csv after each" in line
    assert (small.shuffle, large.shuffle, forced.shuffle) == (True, False, False)
    kept, line, _ = TrainConfig(local_shards=1, shuffle=False).with_recipe(10)
    assert kept.shuffle is False and line.endswith("instead, as given: --shuffle off")


def test_dnn_on_small_data_is_warned_about_and_deepfm_named(caplog):
    """dnn has no linear term, and small data does not train it well: the small recipe says so; large data and
    the other models are not warned about."""
    with caplog.at_level("WARNING"):
        prepare(TrainConfig(local_shards=1, model="dnn", hidden=(4,), synthetic_rows=2000))
    assert "dnn has no first-order (linear) term" in caplog.text and "deepfm adds the linear" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        prepare(TrainConfig(local_shards=1, model="deepfm", hidden=(4,), synthetic_rows=2000))
        prepare(TrainConfig(local_shards=1, model="dnn", hidden=(4,), synthetic_rows=2000, recipe="large"))
    assert "first-order" not in caplog.text


def test_the_large_recipe_on_small_data_is_warned_about_with_its_steps(caplog, monkeypatch):
    """--recipe large on 10,000 examples trains 5 steps of 2048, too few to move the model from its initial values
    (test AUC near 0.5, or below it): the run says so before it trains, of the recipe chosen once; --recipe auto,
    enough steps (epochs or batches given), or eval and predict (which read the model with the large recipe) do
    not."""
    chosen = []
    counted = lambda *a: chosen.append(a) or choose(*a)
    monkeypatch.setattr(train_config, "choose", counted)
    monkeypatch.setattr(job, "choose", counted, raising=False)  # a second choice there would be counted too
    with caplog.at_level("WARNING"):
        prepare(TrainConfig(local_shards=1, model="lr", synthetic_rows=10_000, recipe="large"))
    assert chosen == [("large", 10_000)], chosen
    monkeypatch.undo()
    assert "--recipe large on 10,000 training examples: 1 epoch in batches of 2,048 is 5 steps, where the large " \
           "recipe makes 489 or more" in caplog.text  # fmt: skip
    assert "; --recipe auto (the small-data recipe on this data), more --epochs or a smaller --batch-size train " \
           "it" in caplog.text  # fmt: skip
    caplog.clear()
    with caplog.at_level("WARNING"):
        prepare(TrainConfig(local_shards=1, model="lr", synthetic_rows=10_000))
        prepare(TrainConfig(local_shards=1, model="lr", synthetic_rows=10_000, recipe="large", epochs=98))
        prepare(TrainConfig(local_shards=1, model="lr", synthetic_rows=10_000, recipe="large", batch_size=20))
        prepare(TrainConfig(local_shards=1, model="lr", synthetic_rows=10_000, recipe="large"), training=False)
    assert "--recipe large on" not in caplog.text
    assert recipe.FEWEST_LARGE_STEPS == math.ceil(SMALL_DATA_EXAMPLES / LARGE.batch_size) == 489
    last_short = (recipe.FEWEST_LARGE_STEPS - 1) * LARGE.batch_size  # 488 steps; one example more makes 489
    assert "is 488 steps" in recipe.few_steps(LARGE, last_short, LARGE.batch_size, 1)
    assert recipe.few_steps(LARGE, last_short + 1, LARGE.batch_size, 1) is None
    assert "2 epochs in batches of 2,048 is 2 steps" in recipe.few_steps(LARGE, 1, LARGE.batch_size, 2)
    assert recipe.few_steps(SMALL, 1, LARGE.batch_size, 1) is None  # the small recipe is never warned about


def test_the_large_recipe_cut_short_by_max_examples_is_warned_about_with_its_steps(caplog):
    """--max-examples 10,000 of 2,000,000 examples (the large recipe, --recipe auto's choice there) trains 5 steps
    of 2048: warned, naming the flag; a --max-examples past the data's epochs changes nothing."""
    with caplog.at_level("WARNING"):
        prepare(TrainConfig(local_shards=1, model="lr", synthetic_rows=2_000_000, max_examples=10_000))
    assert "--recipe large on 2,000,000 training examples: --max-examples 10,000 in batches of 2,048 is 5 steps, " \
           "where the large recipe makes 489 or more" in caplog.text  # fmt: skip
    assert caplog.text.rstrip().endswith("; a larger --max-examples or a smaller --batch-size train it")  # not auto
    assert "is 5 steps" in recipe.few_steps(LARGE, 10**7, LARGE.batch_size, 3, max_examples=10_000)
    assert recipe.few_steps(LARGE, 10**7, LARGE.batch_size, 1, max_examples=10**6) is None
    assert "1 epoch in batches of 2,048 is 5 steps" in recipe.few_steps(LARGE, 10_000, LARGE.batch_size, 1,
                                                                         max_examples=10**6)  # fmt: skip
    # a count that stopped at 1,000,000 lines: the --max-examples alone tells the steps, above the count's or not
    assert "--max-examples 1,500,000 in batches of 4,096 is 367 steps" in recipe.few_steps(
        LARGE, 10**6, 4096, 1, max_examples=1_500_000, at_least=True)  # fmt: skip
    assert recipe.few_steps(LARGE, 10**6, 4096, 1, max_examples=4_000_000, at_least=True) is None
    assert recipe.few_steps(LARGE, 10**6, 4096, 1, at_least=True) is None


def test_the_few_steps_warning_counts_the_examples_the_validation_split_leaves_to_train(caplog):
    """--validation-fraction 0.5 of 10,000 examples leaves about 5,000 to train: 3 steps of 2048, as many as the
    training batches the data yields (the oracle), not the 5 of every example; 1,100,000 examples, of which the
    split takes 110,000, make 484 steps (under 489: warned), where all of them would make 538."""
    with caplog.at_level("WARNING"):
        cfg, data, _, _ = prepare(TrainConfig(local_shards=1, model="lr", synthetic_rows=10_000, recipe="large",
                                              validation_fraction=0.5))  # fmt: skip
    steps = sum(1 for _ in data.train())
    trained = sum(len(b) for b in data.train())
    assert steps == math.ceil(trained / cfg.batch_size) == 3, (steps, trained)
    assert "--recipe large on 10,000 training examples (5,000 train, 5,000 in the validation split): 1 epoch in " \
           f"batches of 2,048 is {steps} steps" in caplog.text  # fmt: skip
    caplog.clear()
    with caplog.at_level("WARNING"):
        prepare(TrainConfig(local_shards=1, model="lr", synthetic_rows=1_100_000, recipe="large",
                            validation_fraction=0.1))  # fmt: skip
    assert "(990,000 train, 110,000 in the validation split): 1 epoch in batches of 2,048 is 484 steps" in caplog.text
    assert math.ceil(990_000 / 2048) == 484 < recipe.FEWEST_LARGE_STEPS <= math.ceil(1_100_000 / 2048)
    assert "is 245 steps" in recipe.few_steps(LARGE, 10**6, LARGE.batch_size, 1, held_out=499_000)
    assert recipe.few_steps(LARGE, 10**6, LARGE.batch_size, 1, held_out=0) is None


def test_a_file_counted_no_further_warns_of_few_steps_only_where_max_examples_cuts_it(tmp_path, monkeypatch, caplog):
    """A file past the recipe's threshold is counted only to it, so the steps that count gives are a floor: the
    README's large-data advice (--validation-fraction) on such a file makes the steps the data yields (the oracle),
    more than the large recipe's fewest, and is not warned of; a --max-examples under the floor is, naming the count
    as the floor it is. (Threshold 4,096 lines and fewest steps 2 here, for a 30,000-line file.)"""
    monkeypatch.setattr(recipe, "SMALL_DATA_EXAMPLES", 4096)
    monkeypatch.setattr(recipe, "FEWEST_LARGE_STEPS", 2)
    path = tmp_path / "big.svm"
    path.write_text("".join(f"{i % 2} {i % 97}:1 {100 + i % 13}:1\n" for i in range(30_000)))
    flags = dict(data=str(path), format="libsvm", local_shards=1, progress=False, model="lr")
    with caplog.at_level("WARNING"):
        cfg, data, _, line = prepare(TrainConfig(**flags, validation_fraction=0.5))
    assert line.startswith("large-data recipe for at least 4,096 lines of training data (counted no further)")
    steps = sum(1 for _ in data.train())
    assert steps >= recipe.FEWEST_LARGE_STEPS, steps  # about 15,000 examples train: 8 steps of 2048
    assert "--recipe large on" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        prepare(TrainConfig(**flags, max_examples=100))
    assert "--recipe large on at least 4,096 lines of training data: --max-examples 100 in batches of 2,048 is 1 " \
           "step, where the large recipe makes 2 or more" in caplog.text  # fmt: skip


def test_geo_mode_takes_adagrad_for_small_data_and_refuses_ftrl_before_any_server_is_touched(tmp_path):
    """--optimizer ftrl with --mode geo is refused by the flags' checks (launch makes them before any worker
    starts); ftrl that a --table-config (or a schema) gives a table, when the tables are configured."""
    geo, line, _ = TrainConfig(local_shards=1, mode="geo").with_recipe(10)
    assert (geo.optimizer, geo.learning_rate, geo.optimizer_params) == ("adagrad", 0.02, {})
    assert line.startswith("small-data recipe for 10 training examples (under 1,000,000)")
    assert line.endswith("; sparse adagrad, not ftrl, in geo mode (see --mode)")
    assert TrainConfig(local_shards=1, mode="async").with_recipe(10)[0].optimizer == "ftrl"
    nowhere = TrainConfig(servers=("127.0.0.1:1",), mode="geo", optimizer="ftrl", synthetic_rows=1000,
                          synthetic_eval_rows=100, timeout_s=1.0, server_timeout_s=0)  # fmt: skip
    with pytest.raises(ValueError, match=r"--mode geo cannot train with --optimizer ftrl: FTRL derives"):
        nowhere.validate()
    sets = tmp_path / "sets.toml"
    sets.write_text('[fm]\noptimizer = { name = "ftrl" }\n')
    with pytest.raises(ValueError, match=r"--mode geo cannot train table\(s\) fm with ftrl: FTRL derives"):
        train(dataclasses.replace(nowhere, optimizer=None, table_config=str(sets)))
    sets.write_text("[fm]\nl2 = 0.5\n")  # geo's add-delta pushes get no lazy l2: refused as the flag's is
    with pytest.raises(ValueError, match=r"--mode geo cannot apply the lazy l2 of table\(s\) fm \(l2 0.5\): geo "):
        train(dataclasses.replace(nowhere, optimizer=None, table_config=str(sets)))


def test_an_mlp_table_of_values_at_rest_float16_is_refused_a_sparse_one_is_not(tmp_path):
    """The MLP's values at rest as float16 would be rounded as they go through RocksDB: the servers would hold
    another MLP than the one trained and scored. Refused in --table-config before any server is touched."""
    from worker.model_tables import table_configs

    cfg, _, spec, _ = prepare(TrainConfig(servers=("h:1",), model="fm", synthetic_rows=100, progress=False))
    sets = tmp_path / "sets.toml"
    sets.write_text('["dense.fm.logit.bias"]\nvalues_at_rest = "float16"\n')
    with pytest.raises(ValueError, match=r"sets.toml: table dense.fm.logit.bias: values_at_rest 'float16' is not for "
                                         r"an MLP table: the servers would hold its values rounded to float16 .*; "
                                         r"leave it out \(the MLP's tables are 'float32'\)$"):  # fmt: skip
        table_configs(dataclasses.replace(cfg, table_config=str(sets)), spec)
    sets.write_text('[fm]\nvalues_at_rest = "float16"\n["dense.fm.logit.bias"]\nvalues_at_rest = "float32"\n')
    tables = table_configs(dataclasses.replace(cfg, table_config=str(sets)), spec)
    assert [(t.name, t.values_at_rest) for t in tables] == [("fm", "float16"), ("dense.fm.logit.bias", "float32")]


@pytest.mark.parametrize("dense", ["ps", "allreduce"])
def test_an_mlp_table_with_eviction_is_refused_a_sparse_one_is_not(dense, tmp_path):
    """A Shrink of every table would drop rows of the MLP's weights, which the servers would then serve at their
    initial values: eviction settings that drop rows (a TTL, a score threshold, a decay) on an MLP table are refused
    in --table-config before any server is touched, whichever --dense path trains it; coefficients alone drop
    none and are taken."""
    from worker.model_tables import table_configs

    cfg, _, spec, _ = prepare(TrainConfig(servers=("h:1",), model="fm", synthetic_rows=100, progress=False))
    cfg = dataclasses.replace(cfg, dense=dense, table_config=str(tmp_path / "sets.toml"))
    (tmp_path / "sets.toml").write_text('["dense.fm.logit.bias"]\neviction = { ttl_steps = 10, decay = 0.5 }\n')
    with pytest.raises(ValueError) as refused:
        table_configs(cfg, spec)
    assert str(refused.value) == (
        f"{tmp_path / 'sets.toml'}: table dense.fm.logit.bias: eviction ttl_steps=10 decay=0.5 is not for an MLP "
        "table: a Shrink (ps-worker shrink, of every table) would drop rows of the MLP's weights, which the servers "
        "would then serve at their initial values; the MLP's tables keep every row; leave it out"
    )
    (tmp_path / "sets.toml").write_text('[fm]\neviction = { ttl_steps = 10 }\n["dense.fm.logit.bias"]\neviction = {}\n')
    assert [(t.name, t.eviction.ttl_steps) for t in table_configs(cfg, spec)] == [
        ("fm", 10),
        ("dense.fm.logit.bias", 0),
    ]
    (tmp_path / "sets.toml").write_text('["dense.fm.logit.bias"]\neviction = { nonclk_coeff = 0.2 }\n')  # drops no row
    assert [t.eviction.nonclk_coeff for t in table_configs(cfg, spec)] == [0.1, 0.2]


def test_the_large_recipe_skips_a_few_malformed_lines_and_the_small_one_none(tmp_path):
    """Large data is read as it trains: a stray line would stop a long run part way. Small data is read whole
    (its validation split) before the first push."""
    data = _csv(tmp_path, 300, bad=2)
    large = TrainConfig(local_shards=1, data=data, format="csv", numeric_columns=("price",), recipe="large",
                        progress=False)  # fmt: skip
    resolved, line, _ = large.with_recipe(300, "lines of training data")
    assert resolved.max_bad_lines == LARGE.max_bad_lines == 1000 and "up to 1,000 malformed lines skipped" in line
    assert "malformed" not in TrainConfig(local_shards=1, recipe="large").with_recipe(300)[1]  # synthetic rows
    result = train(large)
    assert (result["train_examples"], result["skipped_lines"]) == (300, 2)
    small, line, _ = dataclasses.replace(large, recipe="auto").with_recipe(300, "lines of training data")
    assert small.max_bad_lines == 0 and "malformed" not in line
    with pytest.raises(ValueError, match="2 bad lines, more than --max-bad-lines 1"):
        train(dataclasses.replace(large, max_bad_lines=1))
    given = dataclasses.replace(large, max_bad_lines=5).with_recipe(300)[1]
    assert given.endswith("instead, as given: --max-bad-lines 5")
    assert (resolved.max_bad_share, dataclasses.replace(large, max_bad_lines=5).with_recipe(300)[0].max_bad_share) == (
        0.01, 1.0)  # the recipe's bound has a share; a given one does not  # fmt: skip


def test_the_large_recipe_stops_at_a_file_of_many_malformed_lines(tmp_path):
    """More than 10 malformed lines making more than 1 in 100 of the lines read: the wrong format or labels (-1
    and 1), not a stray line: the run stops (here in its first batch), unless --max-bad-lines is given."""
    lines = ["label,item"] + [f"{'1' if i % 2 else '-1'},i{i % 7}" for i in range(500)]
    (tmp_path / "pm.csv").write_text("\n".join(lines) + "\n")
    cfg = TrainConfig(local_shards=1, data=str(tmp_path / "pm.csv"), format="csv", recipe="large", progress=False)
    with pytest.raises(ValueError, match=r"pm.csv line 2: label '-1', expected 0 or 1 .*; 11 bad records of the first 500 lines read, "
                                         r"more than 1 in 100: is the data in this format, with labels of 0 and 1\?"):  # fmt: skip
        train(cfg)
    result = train(dataclasses.replace(cfg, max_bad_lines=250))
    assert (result["train_examples"], result["skipped_lines"]) == (250, 250)


def test_early_stop_or_eval_every_without_a_validation_set_is_refused(tmp_path):
    """They act on a validation set: given to a run that holds none they would do nothing, silently."""
    data = _csv(tmp_path, 300)
    base = TrainConfig(local_shards=1, data=data, format="csv", numeric_columns=("price",), progress=False)
    for cfg, said in [(dataclasses.replace(base, recipe="large", early_stop=3, eval_every=5),
                       "--early-stop 3 and --eval-every 5 act on a validation set, and this run has none "
                       "(--validation-fraction 0, the recipe's): give --validation-fraction F"),
                      (dataclasses.replace(base, validation_fraction=0.0, early_stop=2),
                       "--early-stop 2 acts on a validation set, and this run has none (--validation-fraction 0): "),
                      (dataclasses.replace(base, validation_fraction=0.0, early_stop_metric="auc"),
                       "--early-stop-metric auc acts on a validation set, and this run has none ")]:  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(said)):
            prepare(cfg)
    prepare(dataclasses.replace(base, recipe="large", early_stop=3, validation_fraction=0.1))
    prepare(dataclasses.replace(base, validation_fraction=0.0, early_stop=0))  # 0: never, nothing to act on
    prepare(dataclasses.replace(base, validation_fraction=0.0))  # the recipe's early stop (5), unused: no refusal


def test_a_best_model_too_large_to_copy_is_not_put_back_and_the_summary_says_why(monkeypatch):
    """Past MAX_BEST_FLOATS of trained rows BestModel keeps nothing: the last model stays, and the run says so,
    with the limit, rather than only "the model kept is the last one"."""
    from worker import best
    from worker.results import format_results

    monkeypatch.setattr(best, "MAX_BEST_FLOATS", 1000)
    cfg = TrainConfig(local_shards=1, model="deepfm", hidden=(8,), synthetic_rows=2000, synthetic_eval_rows=500,
                      learning_rate=0.5, epochs=30, early_stop=2, progress=False)  # fmt: skip
    result = train(cfg)
    assert result["stopped_early"] and not result["restored_best"] and result["best_copy_limit_bytes"] == 4000
    assert ("(best by logloss; stopped early; the model kept is the last one: its trained rows are more than early stopping copies "
            "to put the best back (3.9 KiB))") in format_results(result)  # fmt: skip
    monkeypatch.setattr(best, "MAX_BEST_FLOATS", 64 << 20)
    result = train(cfg)
    assert result["restored_best"] and "best_copy_limit_bytes" not in result
    assert "the model kept is this best one" in format_results(result)


def test_the_validation_split_is_deterministic_disjoint_and_complete():
    mask = validation_mask(0, 100_000, 0.1)
    assert 0.09 < mask.mean() < 0.11
    np.testing.assert_array_equal(np.concatenate([validation_mask(0, 500, 0.1), validation_mask(500, 500, 0.1)]),
                                  validation_mask(0, 1000, 0.1))  # fmt: skip
    assert not validation_mask(0, 1000, 0.0).any()
    cfg = TrainConfig(local_shards=1, synthetic_rows=3000, batch_size=256, validation_fraction=0.2, epochs=1,
                      shuffle=False)  # fmt: skip
    cfg, data, _, _ = prepare(cfg)
    train_ids = np.concatenate([b.fields["C3"].ids for b in data.train()])
    val = data.validation()
    val_ids = np.concatenate([b.fields["C3"].ids for b in val])
    assert all(len(b) == 256 for b in list(data.train())[:-1])  # rebatched to the batch size
    every = np.concatenate([b.fields["C3"].ids for b in data.synthetic.batches(3000, 0, 3000)])
    picked = validation_mask(0, 3000, 0.2)
    np.testing.assert_array_equal(val_ids, every[picked])
    np.testing.assert_array_equal(train_ids, every[~picked])
    data.max_validation, data._validation = 100, None  # picks past the first 100 train: none is left out
    capped = np.concatenate([b.fields["C3"].ids for b in data.validation()])
    np.testing.assert_array_equal(capped, every[picked][:100])
    kept = np.zeros(3000, dtype=bool)
    kept[np.flatnonzero(picked)[:100]] = True
    np.testing.assert_array_equal(np.concatenate([b.fields["C3"].ids for b in data.train()]), every[~kept])


def _run(cfg: TrainConfig, field: str = "C1", train_ids: bool = False):
    """(loop result, rows of the eval (or training) ids of `field` after training, and before)."""
    with InProcessTables(cache_bytes=64 << 20) as tables:
        cfg, data, spec, backend, dense = open_job(cfg, tables)
        batches = data.train() if train_ids else data.eval()
        ids = np.unique(np.concatenate([b.fields[field].ids for b in batches]))
        before = tables.pull(cfg.model, ids)
        result = run_epochs(tables, spec, backend, dense, data.train, loop_settings(cfg, data), data.validation())
        return result, tables.pull(cfg.model, ids), before


def test_early_stopping_stops_after_p_validations_without_improvement():
    # a learning rate far too high for FM on a few thousand rows: validation logloss soon gets worse
    cfg = TrainConfig(local_shards=1, model="fm", synthetic_rows=4000, synthetic_eval_rows=500, learning_rate=0.5,
                      epochs=30, early_stop=2, progress=False)  # fmt: skip
    result, _, _ = _run(cfg)
    assert result.stopped_early
    losses = [e["validation_logloss"] for e in result.curve]
    best = int(np.argmin(losses))
    assert len(losses) == best + 3  # the best, then two evaluations without a better one
    assert result.best["validation_logloss"] == losses[best] and result.curve[best]["best"]
    assert [e["epoch"] for e in result.curve] == list(range(1, len(losses) + 1))


def test_patience_running_out_at_the_last_epoch_is_not_a_stop_before_the_end():
    cfg = TrainConfig(local_shards=1, model="fm", synthetic_rows=4000, synthetic_eval_rows=500, learning_rate=0.5,
                      epochs=30, early_stop=2, progress=False)  # fmt: skip
    losses = [e["validation_logloss"] for e in _run(cfg)[0].curve]
    cfg = dataclasses.replace(cfg, epochs=len(losses))  # patience runs out after the last epoch exactly
    result, _, _ = _run(cfg)
    assert len(result.curve) == cfg.epochs and not result.curve[-1]["best"] and not result.stopped_early


def test_eval_every_n_steps_and_no_early_stop_runs_every_epoch_and_validates_each_epochs_end():
    cfg = TrainConfig(local_shards=1, model="lr", synthetic_rows=2000, synthetic_eval_rows=200, batch_size=200,
                      epochs=2, early_stop=0, eval_every=4, validation_fraction=0.1, progress=False)  # fmt: skip
    result, _, _ = _run(cfg)
    assert not result.stopped_early
    steps_per_epoch = -(-int(2000 - validation_mask(0, 2000, 0.1).sum()) // 200)
    assert steps_per_epoch == 9
    assert [e["step"] for e in result.curve] == [4, 8, 9, 12, 16, 18]  # and the model as each epoch ended


def test_max_examples_ends_training_part_way_through_an_epoch_and_validates_there():
    """4,000 examples of a stream of 3 epochs of ~2,700: epoch 2 stops part way (its last batch cut to fit), the
    validation set is evaluated there, and no third epoch starts."""
    cfg = TrainConfig(local_shards=1, model="lr", synthetic_rows=3000, synthetic_eval_rows=200, batch_size=256,
                      epochs=3, early_stop=0, validation_fraction=0.1, max_examples=4000, progress=False)  # fmt: skip
    result, _, _ = _run(cfg)
    assert (result.examples, result.epoch, result.stopped_at_limit) == (4000, 2, True)
    per_epoch = int(3000 - validation_mask(0, 3000, 0.1).sum())
    assert result.steps == -(-per_epoch // 256) + -(-(4000 - per_epoch) // 256)
    assert [(e["epoch"], e["examples"]) for e in result.curve] == [(1, per_epoch), (2, 4000)]
    unlimited, _, _ = _run(dataclasses.replace(cfg, max_examples=0))
    assert (unlimited.examples, unlimited.epoch, unlimited.stopped_at_limit) == (3 * per_epoch, 3, False)


def test_a_run_resumed_under_max_examples_ends_where_the_stopped_run_would_have():
    """--skip-examples counts toward --max-examples: 1,400 examples, then a resume from 1,400 to the same limit of
    2,600 (into epoch 2), train the model one run of 2,600 does (one async worker, the same batches: exactly), and
    no example past the limit."""
    from worker.dense import DenseSync

    base = TrainConfig(servers=("127.0.0.1:1",), model="fm", synthetic_rows=2000, synthetic_eval_rows=10,
                       batch_size=200, epochs=2, recipe="large", early_stop=0, learning_rate=0.05, progress=False)  # fmt: skip

    def rows(*runs: TrainConfig) -> tuple[list[int], np.ndarray]:
        trained = []
        with InProcessTables(cache_bytes=64 << 20) as tables:
            for cfg in runs:
                cfg, data, spec, backend, dense = open_job(cfg, tables)
                trained.append(run_epochs(tables, spec, backend, dense, data.train, loop_settings(cfg, data)).examples)
                DenseSync(tables, spec.dense_params()).pull()
            ids = np.unique(np.concatenate([b.fields["C1"].ids for b in data.train()]))
            return trained, tables.pull(cfg.model, ids)

    whole, one_run = rows(dataclasses.replace(base, max_examples=2600))
    parts, resumed = rows(dataclasses.replace(base, max_examples=1400),
                          dataclasses.replace(base, max_examples=2600, skip_examples=1400))  # fmt: skip
    assert whole == [2600] and parts == [1400, 1200]
    np.testing.assert_array_equal(resumed, one_run)
    _, further = rows(dataclasses.replace(base, max_examples=2800))
    assert not np.array_equal(further, one_run)  # the comparison can tell one step more


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_run_resumed_with_dropout_draws_the_masks_of_a_run_never_stopped(backend):
    """deepfm with dropout 0.5: 1,400 examples (7 steps of epoch 1: a stop on a batch boundary), then a resume
    from 1,400, train the model (its MLP and its rows) that one run of 2 epochs trains, exactly: the resumed run
    draws the dropout masks of the steps it skips before its own."""
    from worker.dense import DenseSync

    base = TrainConfig(servers=("127.0.0.1:1",), model="deepfm", hidden=(8, 4), dropout=0.5, backend=backend,
                       synthetic_rows=2000, synthetic_eval_rows=10, batch_size=200, epochs=2, recipe="large",
                       early_stop=0, learning_rate=0.05, progress=False)  # fmt: skip

    def model(*runs: TrainConfig) -> tuple[dict[str, np.ndarray], np.ndarray]:
        with InProcessTables(cache_bytes=64 << 20) as tables:
            for cfg in runs:
                cfg, data, spec, backend, dense = open_job(cfg, tables)
                run_epochs(tables, spec, backend, dense, data.train, loop_settings(cfg, data))
            ids = np.unique(np.concatenate([b.fields["C1"].ids for b in data.train()]))
            return DenseSync(tables, spec.dense_params()).pull(), tables.pull(cfg.model, ids)

    one_run, one_run_rows = model(base)
    resumed, resumed_rows = model(dataclasses.replace(base, max_examples=1400),
                                  dataclasses.replace(base, skip_examples=1400))  # fmt: skip
    assert sorted(resumed) == sorted(one_run) and "mlp.0.weight" in one_run
    for name, values in one_run.items():
        np.testing.assert_array_equal(resumed[name], values, err_msg=name)
    np.testing.assert_array_equal(resumed_rows, one_run_rows)


def test_max_examples_is_the_jobs_total_shared_by_its_workers():
    shares = [TrainConfig(max_examples=10, num_workers=3, worker_id=i).worker_max_examples() for i in range(3)]
    assert shares == [4, 3, 3] and TrainConfig(max_examples=0, num_workers=3).worker_max_examples() == 0
    for n_total, n in ((11, 2), (10, 3), (7, 7), (1000, 6)):  # each worker's lines below N: the first N lines
        counts = [TrainConfig(max_examples=n_total, num_workers=n, worker_id=i).worker_max_examples() for i in range(n)]
        assert counts == [len(range(i, n_total, n)) for i in range(n)]
    with pytest.raises(ValueError, match="--max-examples 2 is the job's total, shared by its 3 workers"):
        TrainConfig(servers=("h:1",), max_examples=2, job_id=1, num_workers=3).validate()
    with pytest.raises(ValueError, match="--synthetic-rows 2 are the job's rows, shared by its 3 workers"):
        TrainConfig(servers=("h:1",), synthetic_rows=2, job_id=1, num_workers=3).validate()
    TrainConfig(servers=("h:1",), synthetic_rows=3, job_id=1, num_workers=3, worker_id=2).validate()
    with pytest.raises(ValueError, match=r"--skip-examples 3 reaches this worker's --max-examples limit \(3 "):
        TrainConfig(servers=("h:1",), max_examples=10, job_id=1, num_workers=3, worker_id=2, skip_examples=3).validate()
    with pytest.raises(ValueError, match="--max-examples -1: expected an integer >= 0"):
        TrainConfig(local_shards=1, max_examples=-1).validate()


def test_l2_is_the_sparse_tables_lazy_l2_and_shrinks_their_rows():
    from worker.model_tables import table_configs

    cfg = TrainConfig(local_shards=1, model="fm", synthetic_rows=500, synthetic_eval_rows=10, batch_size=250, epochs=4,
                      recipe="large", learning_rate=0.05, progress=False)  # fmt: skip
    _, plain, _ = _run(cfg, train_ids=True)
    _, shrunk, _ = _run(dataclasses.replace(cfg, l2=2.0), train_ids=True)  # decay 0.9 a step between pushes
    assert np.abs(shrunk[:, 1:]).mean() < 0.7 * np.abs(plain[:, 1:]).mean()
    l2_cfg, _, spec, _ = prepare(dataclasses.replace(cfg, l2=2.0))
    assert [(t.name, t.l2) for t in table_configs(l2_cfg, spec)] == [("fm", 2.0), ("dense.fm.logit.bias", 0.0)]


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(validation_fraction=0.7), "--validation-fraction 0.7: expected a number in"),
        (dict(dropout=1.0), "--dropout 1.0: expected a number in"),
        (dict(l2=-1.0), "--l2 -1.0: expected a number in"),
        (dict(early_stop=-1), "--early-stop -1: expected an integer >= 0"),
        (dict(learning_rate=-1.0), r"--learning-rate must be finite, >= 1e-30 and <= 1e\+30, got -1.0"),
        (
            dict(dense_learning_rate=float("nan")),
            "--dense-learning-rate must be finite, >= 1e-30 and <= 1e\\+30, got nan",
        ),
        (dict(recipe="medium"), "--recipe 'medium' is unknown"),
        (
            dict(early_stop_metric="aucpr"),
            r"--early-stop-metric 'aucpr' is unknown; expected one of \['logloss', 'auc'\]",
        ),
        (dict(schema="s.toml"), "--schema needs --data"),
        (dict(validation_fraction=0.1, validation_data="v.csv"), "not both"),
        (dict(skip_examples=-1), "--skip-examples -1: expected an integer >= 0"),
        (dict(skip_examples=100), "--skip-examples resumes training a model that servers hold; --local-shards"),
    ],
)
def test_bad_settings_name_their_flag(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TrainConfig(local_shards=1), **change).validate()


@pytest.mark.parametrize("flag", ["validation_data", "eval_data"])
@pytest.mark.parametrize("given", ["the same file", "a link to it", "the dir of the training files"])
def test_held_out_data_that_is_also_training_data_is_refused_before_anything_runs(tmp_path, flag, given):
    """A model scored on the rows it trained on: --validation-data or --eval-data naming one of --data's files (the
    file itself, a link to it, or a directory holding it) is refused, and no shard is started; another file is
    not."""
    parts = tmp_path / "parts"
    parts.mkdir()
    for name in ("a.csv", "b.csv"):
        (parts / name).write_text("click,item\n1,x\n0,y\n")
    (tmp_path / "new.csv").write_text("click,item\n1,x\n0,y\n")
    os.symlink(parts / "b.csv", tmp_path / "link.csv")
    data = str(parts) if given == "the dir of the training files" else str(parts / "b.csv")
    held = {"the same file": str(parts / "b.csv"), "a link to it": str(tmp_path / "link.csv"),
            "the dir of the training files": str(parts)}[given]  # fmt: skip
    cfg = TrainConfig(servers=("127.0.0.1:1",), data=data, format="csv", **{flag: held})  # no server is reached
    option = "--" + flag.replace("_", "-")
    with pytest.raises(ValueError, match=rf"{option} {re.escape(held)} is also training data: --data "
                                         rf"{re.escape(data)} reads {re.escape(str(parts))}/[ab].csv.* scores far better than on new rows"):  # fmt: skip
        train(cfg)
    other = dataclasses.replace(cfg, **{flag: str(tmp_path / "new.csv")})  # other rows: no refusal
    check_held_out(other.data, other.validation_data, other.eval_data)


def test_early_stopping_with_one_worker_puts_the_best_model_back():
    """The rows and dense parameters at the end equal those at the best evaluation (kept by the test when the
    curve reported it), for the ids trained up to then."""
    from worker.scoring import evaluate

    cfg = TrainConfig(local_shards=1, model="deepfm", hidden=(8,), synthetic_rows=4000, synthetic_eval_rows=500,
                      learning_rate=0.5, epochs=30, early_stop=2, progress=False)  # fmt: skip
    with InProcessTables(cache_bytes=64 << 20) as tables:
        cfg, data, spec, backend, dense = open_job(cfg, tables)
        ids = np.unique(np.concatenate([bags.ids for b in data.train() for bags in b.fields.values()]))
        kept = {}

        def on_eval(entry):
            if entry["best"]:
                kept["rows"], kept["dense"] = (
                    tables.pull(cfg.model, ids),
                    {k: v.copy() for k, v in dense.values.items()},
                )

        settings = dataclasses.replace(loop_settings(cfg, data), restore_best=True)
        result = run_epochs(tables, spec, backend, dense, data.train, settings, data.validation(), on_eval=on_eval)
        assert result.stopped_early and result.restored_best and not result.curve[-1]["best"]
        np.testing.assert_allclose(tables.pull(cfg.model, ids), kept["rows"], rtol=1e-5, atol=1e-6)
        for name, value in dense.pull().items():
            np.testing.assert_allclose(value, kept["dense"][name], rtol=1e-5, atol=1e-6)
        again = evaluate(tables, spec, backend, dense.values, data.validation())
        assert abs(again["eval_logloss"] - result.best["validation_logloss"]) < 1e-5


def test_early_stopping_by_auc_stops_on_and_puts_back_the_best_validation_auc():
    """--early-stop-metric auc: the best evaluation is the one of highest validation AUC (here a later epoch than
    the lowest logloss's), the run stops P evaluations after it, and the model put back scores that AUC again."""
    from worker.results import format_results
    from worker.scoring import evaluate

    cfg = TrainConfig(local_shards=1, model="fm", synthetic_rows=4000, synthetic_eval_rows=500, learning_rate=0.5,
                      epochs=30, early_stop=2, early_stop_metric="auc", progress=False)  # fmt: skip
    with InProcessTables(cache_bytes=64 << 20) as tables:
        cfg, data, spec, backend, dense = open_job(cfg, tables)
        result = run_epochs(tables, spec, backend, dense, data.train, loop_settings(cfg, data), data.validation())
        aucs = [e["validation_auc"] for e in result.curve]
        losses = [e["validation_logloss"] for e in result.curve]
        best = int(np.argmax(aucs))
        assert best > int(np.argmin(losses[: best + 1]))  # the two metrics pick different epochs here
        assert result.stopped_early and len(aucs) == best + 3  # the best, then two evaluations without a better AUC
        assert result.best is result.curve[best] and [e["best"] for e in result.curve] == [
            a > max(aucs[:i], default=-1.0) for i, a in enumerate(aucs)]  # fmt: skip
        assert result.restored_best
        again = evaluate(tables, spec, backend, dense.values, data.validation())
        assert abs(again["eval_auc"] - aucs[best]) < 1e-4
    summary = format_results({"best_validation_auc": aucs[best], "best_validation_logloss": losses[best],
                              "best_epoch": best + 1, "early_stop_metric": "auc", "stopped_early": True,
                              "model_is_best": True})  # fmt: skip
    assert f"at epoch {best + 1} (best by AUC; stopped early; the model kept is this best one)" in summary


def test_a_better_evaluation_is_lower_logloss_or_higher_auc_and_a_nan_beats_nothing():
    from worker.loop import better

    def e(auc, loss):
        return {"validation_auc": auc, "validation_logloss": loss}

    assert better(e(0.6, 0.4), e(0.7, 0.5), "logloss") and not better(e(0.6, 0.4), e(0.7, 0.5), "auc")
    assert better(e(0.7, 0.5), e(0.6, 0.4), "auc") and not better(e(0.7, 0.5), e(0.6, 0.4), "logloss")
    assert not better(e(0.7, 0.5), e(0.7, 0.4), "auc")  # equal: not better
    assert better(e(0.5, 0.5), e(math.nan, 0.5), "auc") and not better(e(math.nan, 0.1), e(0.5, 0.5), "auc")
    assert not better(e(math.nan, 0.1), e(math.nan, 0.5), "auc")


def test_a_schema_of_two_tables_of_two_widths_with_a_shared_id_space_trains(tmp_path):
    """item_id and clicked (a bag) share the item table and its ids; a narrow table is projected for FM; the
    tables, the dense parameters and a learned signal come out as the schema says."""
    rng = np.random.default_rng(0)
    lines = ["label,item_id,clicked,color,price"]
    for _ in range(3000):
        item = int(rng.integers(0, 50))
        clicked = "|".join(str(x) for x in rng.integers(0, 50, rng.integers(0, 4)))
        label = int(rng.random() < (0.8 if item < 10 else 0.2))
        lines.append(f"{label},{item},{clicked},c{rng.integers(0, 3)},{rng.exponential(10):.2f}")
    data = tmp_path / "d.csv"
    data.write_text("\n".join(lines) + "\n")
    schema = tmp_path / "s.toml"
    schema.write_text(
        'label = "label"\n[tables.item]\ndim = 8\n[tables.small]\ndim = 2\n'
        '[[columns]]\nname = "item_id"\nkind = "categorical"\ntable = "item"\nid_space = "item"\n'
        '[[columns]]\nname = "clicked"\nkind = "multi_hot"\ntable = "item"\nid_space = "item"\npooling = "mean"\n'
        '[[columns]]\nname = "color"\nkind = "categorical"\ntable = "small"\n'
        '[[columns]]\nname = "price"\nkind = "numeric"\ntransform = "standardize"\n'
    )
    cfg = TrainConfig(local_shards=1, data=str(data), eval_data=str(data), schema=str(schema), model="deepfm",
                      hidden=(8,), epochs=2, recipe="large", batch_size=200, progress=False)  # fmt: skip
    from worker.model_tables import table_configs
    from worker.scoring import evaluate

    with InProcessTables(cache_bytes=64 << 20) as tables:
        cfg, data_source, spec, backend, dense = open_job(cfg, tables)
        assert {t.name: t.dim for t in table_configs(cfg, spec)}["item"] == 9
        assert {t.name: t.dim for t in table_configs(cfg, spec)}["small"] == 3
        assert "proj.small" in dense.values and dense.values["proj.small"].shape == (2, 8)
        first = next(iter(data_source.train()))
        assert first.dense.shape == (200, 1) and abs(float(first.dense.mean())) < 0.3  # standardized
        same = first.fields["item_id"].ids[:1]
        assert np.isin(same, np.concatenate([b.fields["clicked"].ids for b in data_source.train()])).all()
        run_epochs(tables, spec, backend, dense, data_source.train, loop_settings(cfg, data_source))
        # the planted rule (items 0-9 clicked 80%, the others 20%) scores AUC 0.72; a model that learned nothing 0.5
        assert evaluate(tables, spec, backend, dense.values, data_source.eval())["eval_auc"] > 0.7


def _csv(tmp_path, rows: int, bad: int = 0):
    lines = ["label,item,price"] + [f"{i % 2},i{i % 7},{i % 5}" for i in range(rows)] + ["1,x,notanumber"] * bad
    path = tmp_path / "d.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_bad_lines_are_reported_once_per_file_however_many_passes(tmp_path):
    cfg = TrainConfig(local_shards=1, data=_csv(tmp_path, 60, bad=3), format="csv", numeric_columns=("price",),
                      max_bad_lines=3, epochs=3, validation_fraction=0.2, early_stop=0, progress=False)  # fmt: skip
    with InProcessTables(cache_bytes=64 << 20) as tables:
        cfg, data, spec, backend, dense = open_job(cfg, tables)
        run_epochs(tables, spec, backend, dense, data.train, loop_settings(cfg, data), data.validation())
    assert [s.bad_lines for _, s in data.read_stats] == [3]
    assert len(data.bad_lines_report()) == 1 and "skipped 3 malformed lines of 63" in data.bad_lines_report()[0]


def test_a_header_alone_is_refused_as_no_examples_with_no_warning_of_its_label_first(tmp_path, caplog):
    """A header naming a label elsewhere than first (`id,country,clicked`) and no rows: the refusal is all a run
    says, not a warning that the first column is taken as the label before it."""
    path = tmp_path / "h.csv"
    path.write_text("id,country,clicked\n")
    with pytest.raises(ValueError, match=r"h.csv: no examples in it \(it holds only a header\)$"):
        prepare(TrainConfig(local_shards=1, data=str(path)))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    path.write_text("id,country,clicked\n1,us,maybe\n")  # with a row (the first column of labels), the warning stands
    prepare(TrainConfig(local_shards=1, data=str(path), progress=False))
    assert any("but the header also has 'clicked'" in r.getMessage() for r in caplog.records)


def test_no_examples_is_an_error_not_a_run_of_zero(tmp_path):
    (tmp_path / "c.svm").write_text("# made by a tool: v1\n\n# no lines of data\n")
    with pytest.raises(ValueError, match=r"c.svm: no examples in it \(it holds only comments and blank lines\)$"):
        prepare(TrainConfig(local_shards=1, data=str(tmp_path / "c.svm"), format="libsvm"))
    with pytest.raises(ValueError, match=r"d.csv: no examples in it \(it holds only a header\)$"):
        prepare(TrainConfig(local_shards=1, data=_csv(tmp_path, 0), format="csv"))
    with pytest.raises(ValueError, match=r"d.csv: no examples in it \(it holds only a header and 3 "
                                         r"malformed lines; the first malformed one: .*d.csv line 2: "):  # fmt: skip
        prepare(
            TrainConfig(
                local_shards=1, data=_csv(tmp_path, 0, bad=3), format="csv", max_bad_lines=5, numeric_columns=("price",)
            )
        )


def test_a_schema_of_no_feature_is_refused_before_any_server_is_touched(tmp_path):
    data = _csv(tmp_path, 20)
    with pytest.raises(ValueError, match=r"d.csv: no feature to train on: its header has no column besides the label "
                                         r"'label', and --drop-columns drops item, price; a model needs at least one"):  # fmt: skip
        prepare(TrainConfig(servers=("127.0.0.1:1",), data=data, format="csv", drop_columns=("item", "price")))
    svm = tmp_path / "labels.svm"
    svm.write_text("1\n0\n")
    with pytest.raises(ValueError, match="labels.svm: no feature to train on: no line of it has an id:value token"):
        prepare(TrainConfig(servers=("127.0.0.1:1",), data=str(svm), format="libsvm"))


def test_lr_and_fm_say_which_numeric_features_they_do_not_use(tmp_path, caplog):
    from worker.schema_infer import infer_schema_text

    data = str(tmp_path / "d.csv")
    with open(data, "w") as f:
        f.write("label,item,price\n" + "".join(f"{i % 2},i{i % 7},{i * 1.37 % 50:.2f}\n" for i in range(80)))
    prepare(TrainConfig(servers=("127.0.0.1:1",), data=data, format="csv", numeric_columns=("price",), model="lr"))
    assert "lr uses sparse fields only: the numeric features price are not used" in caplog.text
    caplog.clear()
    prepare(TrainConfig(servers=("127.0.0.1:1",), data=data, format="csv", numeric_columns=("price",), model="deepfm"))
    schema = tmp_path / "s.toml"
    schema.write_text(infer_schema_text(data))  # price with a bucketized twin
    assert "price_bucket" in schema.read_text()
    prepare(TrainConfig(servers=("127.0.0.1:1",), data=data, schema=str(schema), model="fm"))
    assert "sparse fields only" not in caplog.text


def test_metrics_out_records_the_format_of_the_schema_file(servers, tmp_path):
    addresses, _ = servers(1)
    data = _csv(tmp_path, 40)
    schema = tmp_path / "s.toml"
    schema.write_text('label = "label"\n[[columns]]\nname = "item"\nkind = "categorical"\n')
    metrics = tmp_path / "m.json"
    train(TrainConfig(servers=tuple(addresses), data=data, schema=str(schema), model="lr", progress=False,
                      metrics_out=str(metrics), recipe="large"))  # fmt: skip
    assert json.loads(metrics.read_text())["config"]["format"] == "csv"  # the schema's, not --format's default


def test_eval_needs_the_training_statistics_of_standardized_columns_in_the_schema(tmp_path, caplog):
    data = _csv(tmp_path, 40)
    schema = tmp_path / "s.toml"
    schema.write_text('label = "label"\n[[columns]]\nname = "item"\nkind = "categorical"\n'
                      '[[columns]]\nname = "price"\nkind = "numeric"\ntransform = "standardize"\n')  # fmt: skip
    cfg = TrainConfig(local_shards=1, data=data, schema=str(schema), model="lr")
    prepare(cfg)  # training computes them, in a pass over the file it says it makes (minutes on a large one)
    said = [r.getMessage() for r in caplog.records if r.name == "worker.data"]
    assert said[0] == (f"computing the mean and std of standardized columns price over {data}: a pass over the "
                       "whole file before training starts (give them in the schema to skip it)")  # fmt: skip
    assert said[1].startswith(f"standardized columns, mean and std over {data}: price mean = ")
    with pytest.raises(ValueError, match=r"columns \['price'\] are standardized without a mean and std"):
        prepare(cfg, training=False)


def test_the_recipe_line_names_what_table_config_changes(tmp_path):
    """The recipe says ftrl; a --table-config that sets table fm's optimizer (and one that sets only its
    admission) is reported as it is, so the line does not claim an optimizer the table does not use."""
    from worker.model_tables import table_config_note, table_configs

    cfg, data, spec, _ = prepare(TrainConfig(servers=("h:1",), synthetic_rows=20_000, progress=False))
    assert cfg.optimizer == "ftrl"
    sets = tmp_path / "sets.toml"
    sets.write_text('[fm]\noptimizer = { name = "adagrad", learning_rate = 0.05 }\nl2 = 0.5\n')
    admits = tmp_path / "admits.toml"
    admits.write_text("[fm]\nadmission = { min_count = 2 }\n")
    overrides = data.schema.table_overrides()
    for path, expected in ((sets, "; --table-config sets table fm: adagrad 0.05 epsilon=1e-07 initial_accumulator=0.1, "
                                  "lazy l2 0.5 instead"), (admits, "")):  # fmt: skip
        with_file = dataclasses.replace(cfg, table_config=str(path))
        assert table_config_note(with_file, spec, overrides, table_configs(with_file, spec, overrides)) == expected
    assert table_config_note(cfg, spec, overrides, table_configs(cfg, spec, overrides)) == ""


def test_the_best_line_names_the_step_where_the_run_validated_every_few_steps():
    from worker.results import format_results

    r = {"best_validation_auc": 0.79, "best_validation_logloss": 0.45, "best_epoch": 1, "best_step": 1500,
         "model_is_best": True, "curve": [{"best": False}]}  # fmt: skip
    assert "at epoch 1, step 1,500 (ran to its end; the model kept is this best one)" in format_results(
        {**r, "eval_every": 500}
    )
    assert "at epoch 1 (ran to its end;" in format_results({**r, "eval_every": 0})


def test_a_resumed_runs_best_line_says_it_judges_its_own_part_and_gives_no_epochs_advice():
    from worker.results import format_results

    r = {"best_validation_auc": 0.79, "best_validation_logloss": 0.45, "best_epoch": 2, "best_step": 64,
         "model_is_best": True, "curve": [{"best": True}]}  # fmt: skip
    assert "a larger --epochs may give a better model" in format_results(r)  # no table of an l2
    resumed = format_results({**r, "skipped_examples": 475_136})
    assert "of this resumed run's evaluations only" in resumed and "a larger --epochs" not in resumed


def test_the_still_improving_hint_gives_the_table_config_of_a_weaker_l2_for_the_runs_tables_which_trains(tmp_path):
    """A small-data run (ftrl, l2 300) whose last epoch was its best says the --table-config file of its l2 divided
    by 10 for its own table and optimizer, indented to copy; that file, copied, parses and trains with that l2."""
    from worker.model_tables import table_configs, weaker_l2_toml
    from worker.results import format_results

    cfg = TrainConfig(local_shards=1, synthetic_rows=600, batch_size=100, epochs=2, early_stop=0, progress=False)
    cfg, data, spec, _ = prepare(cfg)
    snippet = '[fm]\noptimizer = { name = "ftrl", learning_rate = 0.05, params = { l2 = 30 } }'
    assert weaker_l2_toml(table_configs(cfg, spec, data.schema.table_overrides()), spec) == snippet
    said = format_results({"best_validation_auc": 0.7, "best_validation_logloss": 0.5, "best_epoch": 2,
                           "curve": [{"best": True}], "weaker_l2_toml": snippet})  # fmt: skip
    assert ("or a weaker sparse l2, may give a better model: e.g. this run's divided by 10, a file for --table-config"
            " of\n         [fm]\n         optimizer = { name = \"ftrl\", learning_rate = 0.05, params = { l2 = 30 } }"
            ) in said  # fmt: skip
    copied = "\n".join(line.strip() for line in said.split("--table-config of\n")[1].splitlines())
    (tmp_path / "weaker.toml").write_text(copied + "\n")
    weaker = dataclasses.replace(cfg, table_config=str(tmp_path / "weaker.toml"))
    fm = {t.name: t for t in table_configs(weaker, spec, data.schema.table_overrides())}["fm"]
    assert (fm.optimizer.name, fm.optimizer.learning_rate, fm.optimizer.params["l2"]) == ("ftrl", 0.05, 30.0)
    result, after, before = _run(weaker, train_ids=True)
    assert result.examples == 2 * len(np.concatenate([b.labels for b in data.train()])) and (after != before).any()


def test_the_weaker_l2_file_keeps_a_tables_other_settings_and_leaves_out_tables_without_l2():
    """ftrl keeps its parameters that differ from the defaults; a lazy l2 is divided likewise; a table with no l2,
    and the dense tables, get no section."""
    from ps.config import InitializerConfig, OptimizerConfig, TableConfig
    from ps.table_toml import table_configs_from_toml
    from worker.model_tables import weaker_l2_toml

    cfg, _, spec, _ = prepare(TrainConfig(local_shards=1, synthetic_rows=600, progress=False))
    init = InitializerConfig("uniform", 0.01)
    ftrl = TableConfig("fm", 9, init, OptimizerConfig("ftrl", 0.1, {"beta": 0.5, "l1": 0.0, "l2": 1e-6}))
    lazy = TableConfig("fm", 9, init, OptimizerConfig("adagrad", 0.02), l2=0.5)
    plain = TableConfig("fm", 9, init, OptimizerConfig("adagrad", 0.02))
    dense = TableConfig("dense.fm.logit.bias", 1, init, OptimizerConfig("ftrl", 0.1, {"l2": 5.0}))
    assert weaker_l2_toml([ftrl, dense], spec) == (
        '[fm]\noptimizer = { name = "ftrl", learning_rate = 0.1, params = { beta = 0.5, l2 = 1e-07 } }'
    )
    assert table_configs_from_toml(weaker_l2_toml([ftrl], spec))["fm"]["optimizer"].params == {"beta": 0.5, "l2": 1e-7}
    assert weaker_l2_toml([lazy], spec) == "[fm]\nl2 = 0.05"
    assert weaker_l2_toml([plain, dense], spec) == ""


def test_the_weaker_l2_file_names_a_dotted_table_as_one_key():
    """A table named with a dot (as TABLE_NAME_RE allows) is one quoted key of the file, which reads back to it."""
    import dataclasses

    from ps.config import InitializerConfig, OptimizerConfig, TableConfig
    from ps.table_toml import table_configs_from_toml
    from worker.model_tables import weaker_l2_toml
    from worker.models.spec import FieldSpec

    _, _, spec, _ = prepare(TrainConfig(local_shards=1, synthetic_rows=600, progress=False))
    spec = dataclasses.replace(spec, fields=(FieldSpec("user", "user.emb", 9), *spec.fields))
    init = InitializerConfig("uniform", 0.01)
    ftrl = TableConfig("user.emb", 9, init, OptimizerConfig("ftrl", 0.1, {"l2": 1e-6}))
    lazy = TableConfig("user.emb", 9, init, OptimizerConfig("adagrad", 0.02), l2=0.5)
    assert table_configs_from_toml(weaker_l2_toml([ftrl], spec))["user.emb"]["optimizer"].params == {"l2": 1e-7}
    assert table_configs_from_toml(weaker_l2_toml([lazy], spec))["user.emb"]["l2"] == 0.05


def test_a_first_step_that_took_much_of_the_training_time_is_pointed_out():
    from worker.results import format_results

    r = {"model": "fm", "backend": "numpy", "device": "cpu", "worker": "0/1", "shards": 2, "train_examples": 44_980,
         "train_seconds": 44.0, "examples_per_s": 1_022.0, "first_step_seconds": 33.0}  # fmt: skip
    assert "1,022 examples/s (the first step took 33.0 s of it: a fresh checkout's first run builds" in format_results(
        r
    )
    for first, total in ((33.0, 200.0), (3.0, 4.0)):  # a small share of the time, or a short step: nothing said
        assert "the first step took" not in format_results({**r, "first_step_seconds": first, "train_seconds": total})


def test_the_loop_measures_its_first_step_without_the_examples_it_skips():
    import time

    cfg = TrainConfig(local_shards=1, synthetic_rows=6000, synthetic_eval_rows=500, model="lr", epochs=1,
                      batch_size=500, progress=False)  # fmt: skip
    with InProcessTables(cache_bytes=64 << 20) as tables:
        cfg, data, spec, backend, dense = open_job(cfg, tables)

        def slow(epoch):  # reading a batch takes 0.1 s: the 8 skipped ones 0.8 s
            for batch in data.train(epoch):
                time.sleep(0.1)
                yield batch

        settings = dataclasses.replace(loop_settings(cfg, data), skip_examples=4000)
        result = run_epochs(tables, spec, backend, dense, slow, settings)
    assert 0 < result.first_step_seconds < 0.6 and result.first_step_seconds <= result.seconds


def test_early_stoppings_restore_gives_ids_first_trained_after_the_best_their_rows_then():
    """An id first trained after the best evaluation gets back the row it had then: its initial embedding on a
    fresh table, or what an earlier run trained (a resumed run, a model trained further); the ids trained by the
    best get their best rows."""
    from ps.config import InitializerConfig, TableConfig
    from worker.batch import TableIds
    from worker.best import BestModel
    from worker.models.spec import ModelSpec, uniform_fields

    spec = ModelSpec("fm", uniform_fields(2, 4, table="lr"), 0, ())
    cfg = TableConfig("lr", 4, initializer=InitializerConfig("normal", 0.3, 5))
    early, later = np.array([1, 2, 3], np.uint64), np.array([3, 40, 50, 60], np.uint64)
    with InProcessTables(cache_bytes=64 << 20) as tables:
        tables.create_table(cfg)
        tables.push("lr", np.array([60], np.uint64), np.full((1, cfg.dim), 2.0, np.float32))  # an earlier run's
        fresh = tables.pull("lr", np.array([40, 50, 60], np.uint64))  # at the best: initial rows, and 60's
        best = BestModel(tables, spec)
        best.add({"lr": TableIds(early, None, None, None)})
        tables.push("lr", early, np.ones((3, cfg.dim), np.float32))
        kept = tables.pull("lr", early)
        best.keep({})
        best.add({"lr": TableIds(later, None, None, None)})
        tables.push("lr", later, np.full((4, cfg.dim), 5.0, np.float32))
        assert best.restore(_NoDense())
        np.testing.assert_allclose(tables.pull("lr", early), kept, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(tables.pull("lr", np.array([40, 50, 60], np.uint64)), fresh, rtol=1e-6, atol=1e-6)


def test_early_stoppings_restore_on_a_table_with_admission_puts_back_every_row_or_names_the_ids_it_could_not():
    """On a table admitting ids at 2 shows, the restore's pushes (0 shows) put back the best row of every id still
    admitted, and of ids pending at the best or first trained since; an id a Shrink dropped since the best is not
    admitted again by them: it keeps its initial row, and the restore names it rather than claiming the best."""
    from ps.config import AdmissionConfig, EvictionConfig, InitializerConfig, TableConfig
    from worker.batch import TableIds
    from worker.best import BestModel
    from worker.models.spec import ModelSpec, uniform_fields
    from worker.results import format_results

    spec = ModelSpec("fm", uniform_fields(2, 4, table="lr"), 0, ())
    cfg = TableConfig("lr", 4, initializer=InitializerConfig("normal", 0.3, 5), admission=AdmissionConfig(2),
                      eviction=EvictionConfig(ttl_steps=2))  # fmt: skip
    ids = np.arange(1, 7, dtype=np.uint64)
    before = ids[:4]  # trained before the best: 1, 2, 3 admitted (2 shows), 4 pending (1 show); 5, 6 since
    with InProcessTables(cache_bytes=64 << 20) as tables:
        tables.create_table(cfg)
        initial = tables.pull("lr", ids)
        best = BestModel(tables, spec)
        best.add({"lr": TableIds(before, None, None, None)})
        tables.push("lr", before, np.ones((4, 4), np.float32), shows=np.array([2, 2, 2, 1], np.float32))
        kept = tables.pull("lr", ids)  # at the best (5 and 6: initial)
        best.keep({})
        tables.advance_clock(5)
        best.add({"lr": TableIds(np.array([1, 4, 5, 6], np.uint64), None, None, None)})
        tables.push("lr", np.array([1, 4, 5, 6], np.uint64), np.full((4, 4), 3.0, np.float32),
                    shows=np.full(4, 2, np.float32))  # fmt: skip
        assert tables.shard.shrink()["dropped"] == 2  # 2 and 3: last pushed 5 steps ago
        tables.push("lr", ids[2:3], np.ones((1, 4), np.float32), shows=np.ones(1, np.float32))  # 3: pending again
        assert best.restore(_NoDense())
        after = tables.pull("lr", ids)
    dropped = np.isin(ids, [2, 3])
    assert best.not_restored.keys() == {"lr"} and best.not_restored["lr"].tolist() == [2, 3]
    np.testing.assert_allclose(after[~dropped], kept[~dropped], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(after[dropped], initial[dropped])
    assert not np.allclose(kept[dropped], initial[dropped])  # the rows not put back do differ from the best ones
    summary = format_results({"best_validation_auc": 0.7, "best_validation_logloss": 0.5, "best_epoch": 2,
                              "model_is_best": True, "best_ids_not_restored": {"lr": 2}})  # fmt: skip
    assert ("the model kept is this best one, but for 2 ids of table lr (dropped by a Shrink since it, not admitted "
            "again: they hold their initial rows)") in summary  # fmt: skip


def test_early_stoppings_restore_on_a_table_with_a_weight_bound_names_no_id_whose_row_it_put_back_clipped():
    """Ids first trained after the best get back their initial rows, which a weight_bound clips as every admitted
    row is clipped: their rows are the best ones as the table holds them, not ids left out of the restore; an id
    a Shrink dropped since the best is still named."""
    from ps.config import AdmissionConfig, EvictionConfig, InitializerConfig, TableConfig
    from worker.batch import TableIds
    from worker.best import BestModel
    from worker.models.spec import ModelSpec, uniform_fields

    spec = ModelSpec("fm", uniform_fields(2, 4, table="lr"), 0, ())
    bound = 0.1
    cfg = TableConfig("lr", 4, initializer=InitializerConfig("normal", 0.3, 5), weight_bound=bound,
                      admission=AdmissionConfig(1), eviction=EvictionConfig(ttl_steps=2))  # fmt: skip
    before, since = np.array([1, 2], np.uint64), np.array([5, 6, 7], np.uint64)
    with InProcessTables(cache_bytes=64 << 20) as tables:
        tables.create_table(cfg)
        initial = tables.pull("lr", since)
        best = BestModel(tables, spec, {"lr": bound})
        best.add({"lr": TableIds(before, None, None, None)})
        tables.push("lr", before, np.full((2, 4), 0.01, np.float32))
        kept = tables.pull("lr", before)
        best.keep({})
        tables.advance_clock(5)
        best.add({"lr": TableIds(np.array([1, 5, 6, 7], np.uint64), None, None, None)})
        tables.push("lr", np.array([1, 5, 6, 7], np.uint64), np.full((4, 4), 3.0, np.float32))
        assert tables.shard.shrink()["dropped"] == 1  # 2: last pushed 5 steps ago
        assert best.restore(_NoDense())
        after = tables.pull("lr", np.concatenate([before, since]))
    assert (np.abs(initial) > bound).any(axis=1).all()  # each row of 5, 6, 7 is clipped when put back
    assert best.not_restored.keys() == {"lr"} and best.not_restored["lr"].tolist() == [2]
    np.testing.assert_allclose(after[0], kept[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(after[2:], np.clip(initial, -bound, bound), rtol=1e-6, atol=1e-6)
    run, data, _, _ = prepare(TrainConfig(servers=("h:1",), synthetic_rows=100, progress=False))
    assert loop_settings(run, data, [cfg, TableConfig("fm", 4)]).weight_bounds == {"lr": bound}  # the loop's


class _EvictingAfterPulls:
    """A table source whose pull_many, once evict is set, then trains `others` of `table` (zero grads), so the RAM
    tier evicts the rows it read."""

    def __init__(self, tables: InProcessTables, table: str, others: np.ndarray):
        self.tables, self.table, self.others, self.evict = tables, table, others, False

    def pull_many(self, items: list) -> list:
        rows = self.tables.pull_many(items)
        if self.evict:
            zeros = np.zeros((len(self.others), self.tables.dim(self.table)), np.float32)
            self.tables.push(self.table, self.others, zeros)
        return rows

    def push_many(self, *args, **kwargs) -> list | None:
        return self.tables.push_many(*args, **kwargs)


def test_early_stoppings_restore_on_a_float16_table_names_no_id_whose_row_came_back_rounded_from_rocksdb():
    """On a table of values_at_rest "float16" whose rows fit its RAM tier, the restore pulls them unrounded; once
    other rows evict them, its push finds them as RocksDB holds them, rounded to float16: every row is put back
    but for that rounding (under 2**-11 of the row), and no id is named as not admitted."""
    from ps.config import InitializerConfig, OptimizerConfig, TableConfig
    from ps.rows.layout import layout_of
    from worker.batch import TableIds
    from worker.best import BestModel
    from worker.models.spec import ModelSpec, uniform_fields

    spec = ModelSpec("fm", uniform_fields(2, 4, table="lr"), 0, ())
    cfg = TableConfig("lr", 4, initializer=InitializerConfig("normal", 0.3, 5), optimizer=OptimizerConfig("sgd", 1.0),
                      values_at_rest="float16")  # fmt: skip
    ids = np.arange(1, 201, dtype=np.uint64)
    grads = np.random.default_rng(0).standard_normal((len(ids), 4)).astype(np.float32)
    with InProcessTables(cache_bytes=300 * layout_of(4, "sgd", "float16").ram_bytes) as tables:
        tables.create_table(cfg)
        evicting = _EvictingAfterPulls(tables, "lr", np.arange(1000, 2000, dtype=np.uint64))
        best = BestModel(evicting, spec, half_at_rest={"lr"})
        best.add({"lr": TableIds(ids, None, None, None)})
        tables.push("lr", ids, grads)
        kept = tables.pull("lr", ids)
        best.keep({})
        tables.push("lr", ids, grads / 3)
        current = tables.pull("lr", ids)  # in RAM, unrounded
        evicting.evict = True
        assert best.restore(_NoDense())
        after = tables.pull("lr", ids)
    assert (current != current.astype(np.float16)).any()
    assert best.not_restored == {}
    np.testing.assert_allclose(after, kept, rtol=0, atol=2.0**-10 * np.abs(current).max())
    run, data, _, _ = prepare(TrainConfig(servers=("h:1",), synthetic_rows=100, progress=False))
    assert loop_settings(run, data, [cfg, TableConfig("fm", 4)]).half_at_rest == {"lr"}  # the loop's


@pytest.mark.parametrize("bound", [0.0, 0.3, 1.0])
def test_early_stoppings_check_allows_the_float16_at_rest_of_rows_clipped_to_their_bound(bound):
    """A restore's push may find a row of a float16 table as RocksDB holds it (ps.storage.rowformat.as_stored: a
    value clipped to the weight_bound, 0.3, goes to the float16 below it, a whole step away): the row so put back
    is not named as not admitted; a row that kept another value is."""
    from ps.storage.rowformat import as_stored
    from worker.best import _not_put_back

    rng = np.random.default_rng(1)
    cur = np.clip(rng.standard_normal((500, 4)).astype(np.float32), -0.3, 0.3)
    cur[:10] = np.float32(0.3)  # clipped to the bound
    want = np.clip(rng.standard_normal((500, 4)).astype(np.float32), -0.3, 0.3)
    got = as_stored(cur, bound) + (want - cur)
    assert not _not_put_back(got, want, cur, bound, half=True).any()
    assert _not_put_back(cur, want, cur, bound, half=True)[np.abs(want - cur).max(axis=1) > 0.01].all()


def test_early_stopping_stops_keeping_ids_once_a_restore_could_not_copy_their_rows(monkeypatch):
    """Past MAX_BEST_FLOATS floats of trained rows a restore is refused: the ids seen are no longer kept (they
    grew with every step of a long run), and the sorted ids kept until then are the union of the steps' ids."""
    from worker import best as best_module
    from worker.batch import TableIds
    from worker.best import BestModel
    from worker.models.spec import ModelSpec, uniform_fields

    spec = ModelSpec("lr", uniform_fields(2, 1, table="lr"), 0, ())
    monkeypatch.setattr(best_module, "MAX_BEST_FLOATS", 1000 * spec.row_dim("lr"))
    best, rng, union = BestModel(None, spec), np.random.default_rng(0), set()
    for _ in range(best_module.SEEN_MERGE_STEPS):  # 64 steps of 10 ids from 2,000: under 1,000 distinct
        ids = np.unique(rng.integers(0, 2000, 10).astype(np.uint64))
        union |= set(ids.tolist())
        best.add({"lr": TableIds(ids, None, None, None)})
    assert not best.too_big and best.seen["lr"][0].tolist() == sorted(union)
    for step in range(3 * best_module.SEEN_MERGE_STEPS):  # 100 new ids a step: past 1,000 at the next merge
        best.add({"lr": TableIds(np.arange(step * 100, step * 100 + 100, dtype=np.uint64) + 10_000, None, None,
                                 None)})  # fmt: skip
    assert best.too_big and best.seen == {"lr": []} and not best.restore(_NoDense())
    best.keep({})  # nothing pulled (its tables are None): nothing is kept
    assert best.rows == {}


class _NoDense:
    """A DenseSync of a model without an MLP."""

    params: list = []
    ids: dict = {}

    def pull(self) -> dict:
        return {}


def test_a_new_models_logit_bias_starts_at_the_labels_log_odds_and_a_model_trained_further_keeps_its_own(capsys):
    """A run that reads its data before training (the small recipe) starts the bias of a new model, and says so;
    a second run on the same servers trains the model further from the bias the first left."""
    from worker.cluster import LocalCluster

    cfg = TrainConfig(model="lr", synthetic_rows=3000, synthetic_eval_rows=300, recipe="small", epochs=1,
                      progress=False)  # fmt: skip
    with LocalCluster(1) as cluster:
        cfg = dataclasses.replace(cfg, servers=tuple(cluster.addresses))
        train(cfg)
        first = capsys.readouterr().out
        (line,) = [s for s in first.splitlines() if s.startswith("logit bias started at ")]
        value, rate = re.fullmatch(r"logit bias started at (-?[\d.]+), the log-odds of the ([\d.]+)% positives of "
                                   r"this worker's share of the data \(a new model\)", line).groups()  # fmt: skip
        p = float(rate) / 100
        assert float(value) == pytest.approx(np.log(p / (1 - p)), abs=2e-3) and 0.1 < p < 0.4
        with Client(cluster.addresses) as client:
            after_first = float(client.pull("dense.lr.logit.bias", np.zeros(1, np.uint64))[0, 0])
        assert after_first != 0.0
        train(cfg)
        assert "logit bias started" not in capsys.readouterr().out


def test_the_labels_before_training_are_a_splits_or_the_held_examples_or_none():
    """What the logit bias starts from: the read that takes a split counts the share; without a split, the small
    recipe's examples held in memory (read now, as the first epoch would, and trained as counted); data read as it
    trains gives none."""
    split = TrainConfig(local_shards=1, synthetic_rows=3000, validation_fraction=0.2)
    _, data, _, _ = prepare(split)
    data.validation()
    assert data.labels_before_training() is data.share_labels and data.share_labels.examples == 3000
    _, held, _, _ = prepare(dataclasses.replace(split, validation_fraction=0.0, early_stop=0))
    counts = held.labels_before_training()
    trained = np.concatenate([b.labels for b in held.train(1)])
    assert counts.examples == len(trained) == 3000 and counts.positives == int((trained > 0.5).sum()) > 0
    _, streamed, _, _ = prepare(dataclasses.replace(split, validation_fraction=0.0, early_stop=0, shuffle=False))
    assert streamed.labels_before_training() is None


def test_a_resumed_runs_trained_line_says_where_it_resumed_naming_no_flag_it_may_not_have_had():
    """A run resumed from its --resume-file's position was given no --skip-examples: the line names neither."""
    from worker.results import format_results

    r = {"model": "fm", "backend": "numpy", "device": "cpu", "worker": "0/1", "shards": 2, "train_examples": 653_888,
         "train_seconds": 11.0, "examples_per_s": 59_444.0}  # fmt: skip
    assert "on 653,888 examples with 2 shards" in format_results(r)
    resumed = format_results({**r, "skipped_examples": 346_112})
    assert "on 653,888 examples (resumed after 346,112 examples) with 2 shards" in resumed, resumed


def test_l2_follows_the_optimizer_table_config_gives_a_table(tmp_path, caplog):
    """--l2 is left out of an ftrl table, as the optimizer the table trains with says, --table-config's included:
    the small recipe's ftrl turned adagrad by the file takes --l2 (and no warning says it is ftrl); the large
    recipe's adagrad turned ftrl by the file leaves it out, with the warning, not an error blaming the file."""
    from worker.model_tables import table_configs

    adagrad, ftrl = tmp_path / "adagrad.toml", tmp_path / "ftrl.toml"
    adagrad.write_text('[fm]\noptimizer = { name = "adagrad", learning_rate = 0.05 }\n')
    ftrl.write_text('[fm]\noptimizer = { name = "ftrl", learning_rate = 0.05 }\n')
    for which, path, expected in (("small", adagrad, ("adagrad", 0.5)), ("large", ftrl, ("ftrl", 0.0))):
        cfg, data, spec, _ = prepare(TrainConfig(servers=("h:1",), synthetic_rows=20_000, progress=False, l2=0.5,
                                                 recipe=which, table_config=str(path)))  # fmt: skip
        caplog.clear()
        fm = {t.name: t for t in table_configs(cfg, spec, data.schema.table_overrides())}["fm"]
        assert (fm.optimizer.name, fm.l2) == expected
        assert ("--l2 does not apply to table fm" in caplog.text) == (expected[0] == "ftrl"), caplog.text


def test_early_stopping_by_auc_on_a_validation_set_of_one_label_is_refused_before_training(tmp_path):
    """Every AUC of a one-label validation set is undefined: --early-stop-metric auc would stop after P evaluations
    and put back the first epoch's model, going by nothing; the run is refused, naming the counts, and logloss,
    which is defined there, trains."""
    rng = np.random.default_rng(0)
    rows = [f"{rng.integers(2)},i{rng.integers(20)}" for _ in range(400)]
    (tmp_path / "train.csv").write_text("click,item\n" + "\n".join(rows) + "\n")
    (tmp_path / "valid.csv").write_text("click,item\n" + "\n".join(f"0,i{k}" for k in range(50)) + "\n")
    cfg = TrainConfig(local_shards=1, data=str(tmp_path / "train.csv"), format="csv", epochs=3, early_stop=1,
                      validation_data=str(tmp_path / "valid.csv"), early_stop_metric="auc", progress=False)  # fmt: skip
    with pytest.raises(ValueError, match=re.escape("--early-stop-metric auc: the validation set holds 0 positive and "
                                                   "50 negative examples, so its AUC is undefined")):  # fmt: skip
        train(cfg)
    result = train(dataclasses.replace(cfg, early_stop_metric="logloss"))
    assert result["early_stop_metric"] == "logloss" and math.isnan(result["best_validation_auc"])
    assert result["weaker_l2_toml"] == (  # the small-data recipe's table, said if the last epoch is the best
        '[fm]\noptimizer = { name = "ftrl", learning_rate = 0.05, params = { l2 = 30 } }'
    )


@pytest.mark.parametrize(
    "fmt, files, held",
    [
        ("criteo", [""], "it is empty"),  # a Criteo or libsvm file has no header to hold
        ("criteo", ["\n \n"], "it holds only blank lines"),
        ("libsvm", [""], "it is empty"),
        ("libsvm", ["# c\n", "", "qid:3 # q\n"], "its 3 files hold only comments"),
        ("csv", ["label,a\n", "label,a\n\n"], "its 2 files hold only headers and blank lines"),
        ("csv", ["label,a\n,\n"], "it holds only a header and rows of blank cells"),
    ],
)
def test_a_file_without_examples_is_said_to_hold_what_it_holds_in_its_format(tmp_path, fmt, files, held):
    paths = []
    for k, text in enumerate(files):
        paths.append(tmp_path / f"d{k}.{fmt}")
        paths[-1].write_text(text)
    data = ",".join(map(str, paths))
    with pytest.raises(ValueError, match=re.escape(f"{data}: no examples in it ({held})") + "$"):
        prepare(TrainConfig(local_shards=1, data=data, format=fmt, max_bad_lines=5))


@pytest.mark.parametrize("fmt", ["libsvm", "csv"])
@pytest.mark.parametrize("files", [1, 2])
def test_the_share_rule_a_refusal_states_numbers_the_data_each_worker_reads_as_the_readers_do(tmp_path, fmt, files):
    """share_rule, in files and lines (a CSV's records after its header) counted from 1, against the line numbers
    read_batches gives each worker's examples: a CSV's first record spans two lines, so its record r starts on
    line r + 2 (the header line 1), and a rule in lines would name the wrong ones."""
    from worker.data_checks import share_rule
    from worker.formats import read_batches

    n, count = 3, 7
    paths = [tmp_path / f"d{k}.{fmt}" for k in range(files)]
    for path in paths:
        rows = [f"{j % 2},{j}" if fmt == "csv" else f"{j % 2} {j}:1" for j in range(count)]
        rows[0] = '1,"x\ny"' if fmt == "csv" else rows[0]
        path.write_text("label,a\n" * (fmt == "csv") + "\n".join(rows) + "\n")
    first_line = {r: r + (fmt == "csv") * (1 + (r > 1)) for r in range(1, count + 1)}  # of record (line) r
    spec = ",".join(map(str, paths))
    _, data, _, _ = prepare(TrainConfig(servers=("h:1",), data=spec, format=fmt))
    rule = share_rule(n, files, fmt == "csv")
    for i in range(n):
        read = [b.line_nos.tolist() for b in read_batches(spec, data.schema, count * files, worker_id=i, num_workers=n)]
        if files == 1:  # "lines i + a, i + b, ...": an arithmetic run from the first
            first, second = (int(x) for x in re.findall(r"i \+ (\d+)", rule)[:2])
            numbers = list(range(i + first, count + 1, second - first))
        else:  # "file k's lines whose number % n == (i + k) % n", k from 1
            assert f"whose number % {n} == (i + k) % {n}" in rule
            numbers = [r for k in range(1, files + 1) for r in range(1, count + 1) if r % n == (i + k) % n]
        assert sum(read, []) == [first_line[r] for r in numbers], (rule, i)


def test_the_idle_worker_check_counts_a_csv_by_records_not_lines(tmp_path):
    """A record whose quoted field spans two lines is one record: 3 lines of data, 2 records, leave worker 2 of 3
    none (the oracle: each worker's share read), which the check refuses in records."""
    from worker.formats import read_batches

    path = tmp_path / "quoted.csv"
    path.write_text('label,a\n1,"x\ny"\n0,z\n')
    _, data, _, _ = prepare(TrainConfig(servers=("h:1",), data=str(path), format="csv"))
    assert [sum(map(len, read_batches(str(path), data.schema, 10, worker_id=i, num_workers=3))) for i in range(3)] == [
        1, 1, 0]  # fmt: skip
    cfg = TrainConfig(servers=("h:1",), data=str(path), format="csv", job_id=1, num_workers=3, worker_id=0)
    with pytest.raises(ValueError, match=r"quoted.csv holds 2 records of data, shared by the job's 3 workers \(worker "
                                         r"i reads records i \+ 1, i \+ 4, i \+ 7, \.\.\. after the header\): worker 2 "
                                         r"would read none of them: it trains no example; start at most 2$"):  # fmt: skip
        prepare(cfg)
    prepare(TrainConfig(servers=("h:1",), data=str(path), format="csv", job_id=1, num_workers=2, worker_id=1))
    path.write_text('"la\nbel",a\n')  # two lines, a header and no record: refused as no examples, not idle workers
    with pytest.raises(ValueError, match=r"quoted.csv: no examples in it"):
        prepare(TrainConfig(servers=("h:1",), data=str(path), format="csv", num_workers=2, job_id=1))


def test_the_idle_worker_check_of_a_csv_goes_by_its_records_of_data_not_its_blank_ones(tmp_path, monkeypatch):
    """A blank record (an empty line, a row of blank cells) holds no data though it takes its place in a share: a
    blank line second of 3 records leaves worker 1 of 2 none (the oracle: each worker's share read), refused with
    the records of data held, not the records; fewer workers may serve, not 'at most'; the check reads the file
    once. A blank record over several lines (a quoted line end) is skipped as a blank one, and holds no data; a
    record the csv module cannot read holds no data either. Random files of data and blank records: the
    refused workers are those whose share reads no example."""
    from worker.formats import ReadStats, read_batches
    from worker.readers import csv_records
    from worker.readers.csv_records import CsvDataPlaces, csv_data_places

    path = tmp_path / "gap.csv"
    path.write_text("label,a\n1,x\n\n0,y\n")
    _, data, _, _ = prepare(TrainConfig(servers=("h:1",), data=str(path), format="csv"))
    assert [sum(map(len, read_batches(str(path), data.schema, 10, worker_id=i, num_workers=2))) for i in range(2)] == [
        2, 0]  # fmt: skip
    scans = []
    records_hold_data = csv_records._records_hold_data
    monkeypatch.setattr(csv_records, "_records_hold_data", lambda *a: scans.append(a) or records_hold_data(*a))
    with pytest.raises(ValueError, match=r"gap.csv holds 2 records of data, shared by the job's 2 workers \(worker "
                                         r"i reads records i \+ 1, i \+ 3, i \+ 5, \.\.\. after the header\): worker 1 "
                                         r"would read none of them: it trains no example; start fewer workers$"):  # fmt: skip
        prepare(TrainConfig(servers=("h:1",), data=str(path), format="csv", job_id=1, num_workers=2, worker_id=0))
    assert scans == [(str(path), ",")]  # read once for the residues and the records it holds
    spans = tmp_path / "spans.csv"  # blank records over 2 lines: skipped as blank ones, no data, not malformed
    spans.write_text('label,a\n1,x\n"\n"\n"\n",""\n0,y\n')
    stats = ReadStats()
    assert sum(map(len, read_batches(str(spans), data.schema, 10, stats=stats))) == 2
    assert (stats.lines_read, stats.empty_lines, stats.blank_cell_rows, stats.bad_lines) == (4, 2, 1, 0)
    assert csv_data_places(str(spans), ",", 4) == CsvDataPlaces(frozenset({0, 3}), 4, 2)
    stray = tmp_path / "stray.csv"  # a quote left open: a record of 100 lines the csv module cannot read
    stray.write_text('label,a\n1,x\n,\n1,"x\n' + "z\n" * 99 + "0,y\n")
    assert csv_data_places(str(stray), ",", 4) == CsvDataPlaces(frozenset({0, 3}), 4, 2)
    assert csv_data_places(str(stray), ",", 2) == CsvDataPlaces(frozenset({0, 1}), None, None)  # stopped at record 4
    pieces = ["1,x", "0,y", "", ",", " , ", '1,"x\ny"']
    rng = np.random.default_rng(3)
    for case in range(25):
        path = tmp_path / f"r{case}.csv"
        path.write_text("label,a\n" + "\n".join(rng.choice(pieces, int(rng.integers(1, 7))).tolist()) + "\n")
        n = int(rng.integers(2, 5))
        read = [sum(map(len, read_batches(str(path), data.schema, 10, worker_id=i, num_workers=n,
                                          max_bad_lines=100))) for i in range(n)]  # fmt: skip
        cfg = TrainConfig(servers=("h:1",), data=str(path), format="csv", job_id=1, num_workers=n, max_bad_lines=100)
        try:
            prepare(cfg)
            refused = []
        except ValueError as e:
            if "no examples in it" in str(e):
                assert not any(read)
                continue
            refused = [int(w) for w in re.search(r"workers? ([\d, ]+) would read", str(e)).group(1).split(", ")]
            assert f"holds {sum(read)} record" in str(e), (path.read_text(), str(e))
        assert refused == [i for i in range(n) if not read[i]], (path.read_text(), n)


@pytest.mark.parametrize(
    "fmt, text, held",
    [
        ("csv", '"la\nbel",a\n', "it holds only a header)"),  # a quoted line end inside the header
        ("csv", "label,a\r,\r\r", "it holds only a header, rows of blank cells and blank lines)"),  # CR line ends
        ("csv", 'label,a\n"\n"\n', "it holds only a header and blank lines)"),  # a quoted line end: one blank line
        ("csv", 'label,a\n"\n", \n', "it holds only a header and rows of blank cells)"),  # blank cells over 2 lines
        (
            "csv",
            'label,a\n,\n1,"x\ny",z\n',
            "it holds only a header, rows of blank cells and 2 malformed lines; "
            "the first malformed one: {path} line 3: 3 columns",
        ),  # a record of 2 lines
        (
            "libsvm",
            "# a\r# b\n",
            "it holds only 1 malformed line; the first malformed one: {path} line 1: it holds carriage returns",
        ),  # fmt: skip
    ],
)
def test_what_a_file_without_examples_holds_is_what_its_reader_read(tmp_path, fmt, text, held):
    """The words come from the read's counts, not from a scan of physical lines of its own: records that span
    lines, CR line ends and a libsvm line the reader refuses are said as the reader read them (held: all of the
    words where it ends in ")", else their start)."""
    path = tmp_path / f"d.{fmt}"
    path.write_bytes(text.encode())
    whole = "$" if held.endswith(")") else ""
    with pytest.raises(ValueError, match=re.escape(f"{path}: no examples in it ({held.format(path=path)}") + whole):
        prepare(TrainConfig(local_shards=1, data=str(path), format=fmt, max_bad_lines=5))


@pytest.mark.parametrize("lines", [60, 99, 200])
def test_the_progress_total_is_what_the_epochs_train_once_the_split_has_held_its_examples_out(tmp_path, monkeypatch,
                                                                                               lines):  # fmt: skip
    """The validation split picks its examples by a hash (worker/validation_split.py), so it holds out about, not
    exactly, --validation-fraction of them (99 lines at 0.1: 8, not 10): the progress total ("of at most N
    examples") is what the epochs train, the examples read less those the split held out, never more or less."""
    monkeypatch.setattr(recipe, "SMALL_DATA_EXAMPLES", 1000)
    path = tmp_path / "small.svm"
    path.write_text("".join(f"{i % 2} {i}:1\n" for i in range(lines)))
    cfg, data, _, _ = prepare(TrainConfig(data=str(path), format="libsvm", local_shards=1, progress=False))
    held = sum(len(b) for b in data.validation())
    trained = sum(len(b) for b in data.train(1))
    assert held + trained == lines and held != lines - int(lines * (1 - cfg.validation_fraction))  # not the estimate
    settings = loop_settings(cfg, data)
    assert (settings.total_examples, settings.total_estimated) == (trained, False)

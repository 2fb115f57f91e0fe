"""Tests for worker/formats.py and worker/readers/: criteo, csv and libsvm files (plain or gzipped) through a
schema into Batches; worker shares; bad lines skipped, counted and fatal over the limit (bad cells included); the
csv column options; the libsvm field rule; column_stats."""

import gzip
import hashlib
import re

import numpy as np
import pytest

from worker.batch import Batch
from worker.criteo import write_criteo
from worker.features import (
    BIAS_ID,
    MISSING_CAT,
    MISSING_INT,
    NUM_CAT_FIELDS,
    NUM_FIELDS,
    NUM_INT_FIELDS,
    cat_values,
    dense_features,
    example_ids,
    field_ids,
    space_ids,
)
from worker.format_detection import detect_format
from worker.formats import (
    ReadStats,
    column_stats,
    file_has_labels,
    libsvm_field_count,
    read_batches,
    read_csv_header,
    read_csv_sample,
)
from worker.models.spec import BIAS_FIELD
from worker.readers.csv_dialect import csv_delimiter
from worker.readers.csv_records import column_cells
from worker.schema_builtin import builtin_schema, resolve_schema
from worker.schema_file import load_schema
from worker.schema_infer import infer_schema_text


def schema_of(path, fmt, label_column=None, drop_columns=(), numeric_columns=(), libsvm_fields=None):
    """The built-in schema of a file, as a run without --schema resolves it."""
    return resolve_schema(
        str(path), schema_path=None, fmt=fmt, label_column=label_column, drop_columns=drop_columns,
        numeric_columns=numeric_columns, libsvm_fields=libsvm_fields, default_table="t", default_dim=4,
    )  # fmt: skip


def read(path, fmt, batch_size=4, *, schema=None, columns=None, **kw):
    schema = schema or schema_of(path, fmt, **(columns or {}))
    return list(read_batches(path, schema, batch_size, **kw))


def ids_matrix(batch: Batch) -> np.ndarray:
    """(n, F) ids of a batch whose fields hold one id per example, checking that they do."""
    for bags in batch.fields.values():
        np.testing.assert_array_equal(bags.offsets, np.arange(len(batch) + 1))
    return np.stack([bags.ids for bags in batch.fields.values()], axis=1).reshape(len(batch), -1)


def join(batches):
    return Batch.concat(batches)


def assert_same_batches(a, b):
    assert [len(x) for x in a] == [len(x) for x in b]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.labels, y.labels)
        assert list(x.fields) == list(y.fields)
        for name in x.fields:
            np.testing.assert_array_equal(x.fields[name].ids, y.fields[name].ids)
            np.testing.assert_array_equal(x.fields[name].offsets, y.fields[name].offsets)
        assert (x.dense is None) == (y.dense is None)
        if x.dense is not None:
            np.testing.assert_array_equal(x.dense, y.dense)


def random_criteo(path, n, seed=0):
    """Write n random examples; (path, labels, int values, cat values)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=n).astype(np.float32)
    ints = rng.integers(-5, 10**6, size=(n, NUM_INT_FIELDS))
    ints[rng.random(ints.shape) < 0.05] = np.iinfo(np.int64).max
    ints[rng.random(ints.shape) < 0.2] = MISSING_INT
    cats = rng.integers(0, 2**32, size=(n, NUM_CAT_FIELDS), dtype=np.uint64)
    cats[rng.random(cats.shape) < 0.2] = rng.integers(0, 2**64 - 1, dtype=np.uint64)
    cats[rng.random(cats.shape) < 0.2] = MISSING_CAT
    write_criteo(path, labels, ints, cats)
    return path, labels, ints, cats


def gzipped(path):
    gz = path.with_name(path.name + ".gz")
    gz.write_bytes(gzip.compress(path.read_bytes()))
    return gz


def sample_csv(tmp_path, n=23):
    rng = np.random.default_rng(1)
    lines = ["click,site,price,id,device,count"]
    for i in range(n):
        site = ['"a,b"', "c", '"say ""hi"""', ""][rng.integers(4)]
        lines.append(f"{rng.integers(2)},{site},{rng.random() * 10:.3f},{i},{['phone', 'tv'][i % 2]},{i % 7}")
    path = tmp_path / "data.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def sample_libsvm(tmp_path, n=23):
    rng = np.random.default_rng(2)
    lines = []
    for i in range(n):
        k = rng.integers(1, 5) if i else 4
        feats = " ".join(f"{rng.integers(0, 10**6)}:{rng.integers(0, 2)}" for _ in range(k))
        lines.append(f"{['-1', '+1', '0', '1'][i % 4]} {feats}")
    path = tmp_path / "data.svm"
    path.write_text("\n".join(lines) + "\n")
    return path


SAMPLES = {"criteo": lambda p: random_criteo(p / "train.txt", 23)[0], "csv": sample_csv, "libsvm": sample_libsvm}


# --- criteo ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_criteo_gives_example_ids_and_dense_features_plain_and_gzipped(tmp_path, batch_size):
    path, labels, ints, cats = random_criteo(tmp_path / "train.txt", 300)
    for p in (path, gzipped(path)):
        batches = read(p, "criteo", batch_size)
        assert [len(b) for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
        b = join(batches)
        np.testing.assert_array_equal(b.labels, labels)
        np.testing.assert_array_equal(ids_matrix(b), example_ids(ints, cats))
        np.testing.assert_array_equal(b.dense, dense_features(ints))
        assert list(b.fields)[-1] == BIAS_FIELD and b.probs is None


def test_criteo_crlf_and_missing_last_newline(tmp_path):
    path, *_ = random_criteo(tmp_path / "train.txt", 10)
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(path.read_bytes().replace(b"\n", b"\r\n")[:-2])
    assert_same_batches(read(crlf, "criteo", 3), read(path, "criteo", 3))


def criteo_with_bad_lines(tmp_path):
    """50 good lines with 4 bad ones inserted: file lines 4, 11, 12 and 30."""
    path, labels, ints, cats = random_criteo(tmp_path / "good.txt", 50)
    lines = path.read_text().splitlines(keepends=True)
    bad = {
        4: "2" + lines[0][1:],  # label 2
        11: "1\tnot enough columns\n",
        12: "0\n",  # (an empty line is no bad line: test_empty_lines_are_skipped_not_bad_in_every_format)
        30: "0\t12\tx3" + lines[0][lines[0].index("\t", 6) :],  # integer column I2 is 'x3'
    }
    for line_no in sorted(bad):
        lines.insert(line_no - 1, bad[line_no])
    out = tmp_path / "bad.txt"
    out.write_text("".join(lines))
    return out, example_ids(ints, cats)


@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_criteo_bad_lines_are_skipped_and_counted(tmp_path, batch_size):
    bad, good_ids = criteo_with_bad_lines(tmp_path)
    stats = ReadStats()
    got = read(bad, "criteo", batch_size, max_bad_lines=4, stats=stats)
    assert (stats.lines_read, stats.bad_lines) == (54, 4)
    assert stats.first_bad == f"{bad} line 4: label '2', expected '0' or '1'"
    assert [len(b) for b in got] == [batch_size] * (50 // batch_size) + ([50 % batch_size] if 50 % batch_size else [])
    np.testing.assert_array_equal(ids_matrix(join(got)), good_ids)


INT_PROBLEM = (
    "integer column 'I2' is 'x3', expected empty, NA (missing) or a base-10 integer in (-9223372036854775808, "
)


@pytest.mark.parametrize(
    "line_no, problem",
    [
        (4, "label '2', expected '0' or '1'"),
        (
            11,
            "2 tab-separated columns, expected 40 (another tab-separated layout? with a header line, --format auto "
            "reads it as CSV)",
        ),
        (12, "1 tab-separated columns, expected 40"),
        (30, f"{INT_PROBLEM}9223372036854775807]"),
    ],
)
def test_criteo_bad_lines_name_their_problem(tmp_path, line_no, problem):
    bad, _ = criteo_with_bad_lines(tmp_path)
    lines = bad.read_text().splitlines(keepends=True)
    for other in (4, 11, 12, 30):  # the other bad lines made empty (skipped, not bad): this one alone is bad
        lines[other - 1] = lines[other - 1] if other == line_no else "\n"
    bad.write_text("".join(lines))
    with pytest.raises(ValueError) as e:
        read(bad, "criteo", 64)
    assert str(e.value) == f"{bad} line {line_no}: {problem}; 1 bad line, more than --max-bad-lines 0"


@pytest.mark.parametrize("limit", [0, 1, 2, 3])
def test_criteo_too_many_bad_lines_raise_naming_the_first_bad_line_and_the_count(tmp_path, limit):
    """The trouble starts at the first bad line (line 4), whichever line crossed the limit (4, 11, 12 or 30)."""
    bad, _ = criteo_with_bad_lines(tmp_path)
    for batch_size in (1, 64, 10000):  # the order of the problems does not depend on how the lines are chunked
        with pytest.raises(ValueError) as e:
            read(bad, "criteo", batch_size, max_bad_lines=limit)
        bad_lines = f"{limit + 1} bad line{'s' * (limit > 0)}"
        assert (
            str(e.value)
            == f"{bad} line 4: label '2', expected '0' or '1'; {bad_lines}, more than --max-bad-lines {limit}"
        )


def test_bad_lines_are_counted_by_the_worker_whose_share_they_are_in(tmp_path):
    bad, _ = criteo_with_bad_lines(tmp_path)  # bad file lines 4, 12, 30 are worker 1's, 11 worker 0's
    stats = [ReadStats() for _ in range(2)]
    rows = [join(read(bad, "criteo", 8, worker_id=i, num_workers=2, max_bad_lines=9, stats=stats[i])) for i in range(2)]
    assert [(s.lines_read, s.bad_lines) for s in stats] == [(27, 1), (27, 3)]
    assert stats[0].first_bad.startswith(f"{bad} line 11: ")
    assert stats[1].first_bad.startswith(f"{bad} line 4: ")
    assert len(rows[0]) + len(rows[1]) == 50
    with pytest.raises(ValueError, match=r"bad.txt line 4: .*; 2 bad lines, more than --max-bad-lines 1"):
        read(bad, "criteo", 8, worker_id=1, num_workers=2, max_bad_lines=1)  # (its share's first: line 4, of 4, 12)


@pytest.mark.parametrize(
    "labeled, blank_labels, asked",
    [(True, False, ", with labels of 0 and 1"), (True, True, ""), (False, False, "")],
)
def test_the_hint_past_a_share_of_bad_lines_names_labels_only_where_they_are_read(
    tmp_path, labeled, blank_labels, asked
):
    """Training and eval read labels: the hint asks for labels of 0 and 1; predict (blank_labels) reads none, nor
    does it in a file without labels (labeled=False): the hint asks for the format alone."""
    path, *_ = random_criteo(tmp_path / "data.txt", 300)
    lines = path.read_text().splitlines(keepends=True)
    if not labeled:
        lines = [line.split("\t", 1)[1] for line in lines]  # 39 columns: a file without labels
    lines[1::2] = ["1\tthree\tcolumns\n"] * len(lines[1::2])  # every other line bad, whatever its label
    path.write_text("".join(lines))
    with pytest.raises(ValueError) as e:
        read(path, "criteo", 64, max_bad_lines=1000, max_bad_share=0.01, labeled=labeled, blank_labels=blank_labels)
    said = str(e.value)
    assert said.startswith(f"{path} line 2: ") and said.endswith(
        f"more than 1 in 100: is the data in this format{asked}? (--max-bad-lines N skips up to N bad lines, "
        "whatever their share)"
    ), said


def _criteo_with_bad_every(tmp_path, rows: int, every: int):
    """A Criteo file of `rows` lines whose every `every`-th line (from line `every`) has the label -1."""
    path, _, _, _ = random_criteo(tmp_path / "good.txt", rows)
    lines = path.read_text().splitlines(keepends=True)
    for k in range(every - 1, rows, every):
        lines[k] = "-1" + lines[k][1:]
    out = tmp_path / "bad.txt"
    out.write_text("".join(lines))
    return out


@pytest.mark.parametrize("every, stops", [(2, True), (50, True), (150, False)])
def test_a_share_of_bad_lines_stops_the_reading_past_ten_of_them(tmp_path, every, stops):
    bad = _criteo_with_bad_every(tmp_path, 3000, every)  # 1 in `every` bad: 1 in 50 is over 1 in 100
    stats = ReadStats()
    if stops:
        with pytest.raises(ValueError) as e:
            read(bad, "criteo", 64, max_bad_lines=1000, max_bad_share=0.01, stats=stats)
        k = stats.bad_records  # the first bad line past 10 and past 1 in 100 of the lines read (a chunk at a time)
        assert stats.stopped and k == max(11, stats.lines_read // 100 + 1) and k * every <= stats.lines_read
        assert str(e.value).startswith(f"{bad} line {every}: label '-1', expected '0' or '1'; {k} bad records of the "
                                       f"first {stats.lines_read:,} lines read, more than 1 in 100: is the data in this "
                                       "format, with labels of 0 and 1?")  # fmt: skip
    else:  # 20 bad lines of 3,000: under 1 in 100
        got = read(bad, "criteo", 64, max_bad_lines=1000, max_bad_share=0.01, stats=stats)
        assert (stats.bad_lines, sum(len(b) for b in got)) == (20, 2980)
    stats = ReadStats()  # without a share, only the limit counts
    read(bad, "criteo", 64, max_bad_lines=3000, stats=stats)
    assert stats.bad_lines == 3000 // every and not stats.stopped
    with pytest.raises(ValueError, match="max_bad_share is 0, expected a share in"):
        read(bad, "criteo", 64, max_bad_share=0)


def test_a_stray_quote_is_one_bad_record_against_the_share_however_many_lines_it_takes(tmp_path):
    """An unclosed quote runs a CSV record over up to MAX_RECORD_LINES lines, each a bad line for --max-bad-lines,
    but one bad record for the share: a stray quote early in a file is the stray line the recipe skips."""
    lines = ["label,item"] + [f"{i % 2},i{i}" for i in range(6000)]
    lines[11] = '1,"i10'
    path = tmp_path / "quote.csv"
    path.write_text("\n".join(lines) + "\n")
    stats = ReadStats()
    got = read(path, "csv", 64, max_bad_lines=1000, max_bad_share=0.01, stats=stats)
    assert stats.bad_records == 1 and stats.bad_lines > 10 and not stats.stopped
    assert sum(len(b) for b in got) == 6000 - stats.bad_lines


# --- worker shares and gzip, every format -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
def test_gzipped_file_gives_the_same_batches(tmp_path, fmt):
    path = SAMPLES[fmt](tmp_path)
    for size in (1, 5, 100):
        assert_same_batches(read(gzipped(path), fmt, size, schema=schema_of(path, fmt)), read(path, fmt, size))


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
def test_worker_shares_are_disjoint_and_cover_every_line(tmp_path, fmt):
    path = SAMPLES[fmt](tmp_path)
    everything = join(read(path, fmt, 100))
    assert len(everything) == 23
    for n in (2, 3, 5, 30):
        seen = []
        for i in range(n):
            stats = ReadStats()
            share = read(path, fmt, 4, worker_id=i, num_workers=n, stats=stats)
            assert stats.lines_read == len(range(i, 23, n))
            if share:
                assert all(len(b) == 4 for b in share[:-1])
                part = join(share)
                np.testing.assert_array_equal(part.labels, everything.labels[i::n])
                np.testing.assert_array_equal(ids_matrix(part), ids_matrix(everything)[i::n])
                seen.extend(range(i, 23, n))
        assert sorted(seen) == list(range(23))


# --- csv ----------------------------------------------------------------------------------------------------


def test_csv_columns_roles_quoting_and_ids(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text(
        "\ufeffid,site,click,price,device,n2\r\n"
        '1,"a,b",1,3.5,phone,7\r\n'
        '2,"multi\nline",0,,tablet,-4\r\n'
        '3,"a,b",1,-2,,1e3\r\n'
    )
    columns = {"label_column": "click", "drop_columns": ["id"], "numeric_columns": ["n2", "price"]}
    (b,) = read(path, "csv", 10, columns=columns)
    assert b.labels.tolist() == [1, 0, 1] and b.labels.dtype == np.float32
    assert b.dense.dtype == np.float32 and list(b.fields) == ["site", "device", BIAS_FIELD]
    np.testing.assert_allclose(b.dense, np.log1p([[7, 3.5], [0, 0], [1000, 0]]), rtol=1e-6)
    cats = np.array([["a,b", "phone"], ["multi\nline", "tablet"], ["a,b", ""]])
    expected = np.stack([field_ids(f, cat_values(cats[:, f])) for f in range(2)] + [np.full(3, BIAS_ID)], axis=1)
    np.testing.assert_array_equal(ids_matrix(b), expected)
    assert b.fields["device"].ids[2] == field_ids(1, np.array([MISSING_CAT]))[0]  # an empty cell: the missing id


def test_csv_defaults_first_column_label_no_numeric(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("y,a,b\n1,x,y\n0,y,x\n")
    (b,) = read(path, "csv", 10)
    assert b.labels.tolist() == [1, 0] and b.dense is None and ids_matrix(b).shape == (2, 3)
    assert b.fields["a"].ids[0] != b.fields["b"].ids[1]  # the same string in two fields: two ids


def test_csv_unknown_or_conflicting_columns_are_rejected(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("y,a,b\n1,x,2\n")
    for kw in ({"numeric_columns": ["nope"]}, {"label_column": "z"}, {"drop_columns": ["a", "nope"]}):
        with pytest.raises(
            ValueError, match=r"d.csv: columns .* are not in the header; its columns are \['y', 'a', 'b'\]"
        ):
            schema_of(path, "csv", **kw)
    with pytest.raises(ValueError, match=r"\['b'\] are both drop and numeric"):
        schema_of(path, "csv", drop_columns=["b"], numeric_columns=["b"])
    with pytest.raises(ValueError, match=r"\['y'\] are both label and numeric"):
        schema_of(path, "csv", numeric_columns=["y"])
    with pytest.raises(ValueError, match="apply to csv only"):
        schema_of(path, "criteo", numeric_columns=["b"])


def test_header_names_and_the_names_given_are_read_without_the_spaces_around_them(tmp_path):
    """`id, country ,clicked ` names id, country and clicked: --label-column and --drop-columns name them with or
    without spaces, a schema's label and sources alike, the built-in schema's fields take the trimmed names, and
    the header repeated in a file (concatenated files) is still named as such; cells that name one column but for
    their spaces (`a`, ` a`) are refused, naming both."""
    path = tmp_path / "d.csv"
    path.write_text("id, country ,clicked \n1, us,1\n2, fr,0\n")
    assert read_csv_header(path, ",") == ["id", "country", "clicked"]
    for label, drop in (("clicked", "id"), (" clicked", "id "), ("clicked ", " id")):
        (b,) = read(path, "csv", columns={"label_column": label, "drop_columns": [drop]})
        assert b.labels.tolist() == [1, 0] and list(b.fields) == ["country", BIAS_FIELD], (label, drop)
    for label, source in (("clicked", "country"), (" clicked ", " country")):
        (tmp_path / "s.toml").write_text(f'format = "csv"\nlabel = "{label}"\n[[columns]]\nname = "c"\n'
                                         f'source = "{source}"\nkind = "categorical"\n')  # fmt: skip
        schema = load_schema(str(tmp_path / "s.toml"), default_table="t", default_dim=4)
        assert (schema.label, schema.columns[0].source) == ("clicked", "country")
        (b,) = read(path, "csv", schema=schema)
        assert b.labels.tolist() == [1, 0] and list(b.fields) == ["c", BIAS_FIELD]
    concatenated = tmp_path / "cat.csv"
    concatenated.write_text(path.read_text() + "id, country ,clicked \n3, de,1\n")
    stats = ReadStats()
    read(concatenated, "csv", columns={"label_column": "clicked"}, max_bad_lines=1, stats=stats)
    assert "a repeated header line (files concatenated?)" in stats.first_bad, stats.first_bad
    twice = tmp_path / "twice.csv"
    twice.write_text("click,a, a\n1,x,y\n")
    message = r"twice.csv: the header's cells 'a' and ' a' both name column 'a' \(the spaces around a name are no " \
              r"part of it\): rename one of them"  # fmt: skip
    with pytest.raises(ValueError, match=message):
        read_csv_header(twice, ",")
    with pytest.raises(ValueError, match=message):
        schema_of(twice, "csv")
    with pytest.raises(ValueError, match=message):
        read(twice, "csv", schema=schema_of(path, "csv", label_column="clicked"))


@pytest.mark.parametrize("delimiter", [",", ";", "\t"])
def test_a_header_whose_names_differ_only_by_spaces_is_probed_for_its_delimiter_and_refused_when_read(
    tmp_path, delimiter
):
    """--format auto tells the delimiter of a header whose cells `a` and ` a` name one column (the probe refuses
    nothing); the run's schema, read from that header, refuses it naming both cells, as every reader does."""
    twice = tmp_path / "twice.csv"
    twice.write_text(delimiter.join(["click", "a", " a"]) + "\n" + delimiter.join(["1", "x", "y"]) + "\n")
    assert csv_delimiter(str(twice)) == (delimiter, ["click", "a", "a"])
    assert detect_format(twice)[:2] == ("csv", delimiter)
    message = r"twice.csv: the header's cells 'a' and ' a' both name column 'a' \(the spaces around a name are no " \
              r"part of it\): rename one of them$"  # fmt: skip
    with pytest.raises(ValueError, match=message):
        schema_of(twice, "auto")
    with pytest.raises(ValueError, match=message):
        read_csv_sample(twice, delimiter, 10)


def test_csv_header_must_hold_the_schemas_columns(tmp_path):
    schema = schema_of(sample_csv(tmp_path), "csv")
    other = tmp_path / "other.csv"
    other.write_text("click,site,price\n1,a,2\n")
    with pytest.raises(ValueError, match=r"other.csv: columns \['id', 'device', 'count'\] are not in the header"):
        read(other, "csv", schema=schema)
    twice = tmp_path / "twice.csv"
    twice.write_text("click,site,price,id,device,count,site\n")
    with pytest.raises(ValueError, match=r"columns \['site'\] appear more than once in the header"):
        read(twice, "csv", schema=schema)
    assert read_csv_header(twice, ",") == ["click", "site", "price", "id", "device", "count", "site"]


def test_column_cells_refuse_columns_the_header_lacks_or_repeats_as_the_reader_does(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("id;site;site\n1;a;b\n")
    with pytest.raises(ValueError, match=r"d.csv: columns \['id'\] are not in the header; its columns are \['id;site;site'\] "
                       r"\(the header looks ';'-separated"):  # fmt: skip
        list(column_cells(str(path), ",", ["id"]))
    with pytest.raises(ValueError, match=r"d.csv: columns \['site'\] appear more than once in the header"):
        list(column_cells(str(path), ";", ["id", "site"]))
    assert list(column_cells(str(path), ";", ["id"])) == [(2, ["1"])]


def test_csv_bad_rows_are_skipped_with_their_line_numbers(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('y,a,n\n1,x,1\n7,x,1\n0,y\n1,"two\nlines",abc\n\n1,z,inf\n0,w,\n')
    stats = ReadStats()
    (b,) = read(path, "csv", 10, columns={"numeric_columns": ["n"]}, max_bad_lines=5, stats=stats)
    assert b.labels.tolist() == [1, 0] and b.dense[:, 0].tolist() == [np.log1p(np.float32(1)), 0]
    assert (stats.lines_read, stats.bad_lines, stats.empty_lines) == (7, 4, 1)  # line 6 is empty: skipped
    assert stats.first_bad.startswith(
        f"{path} line 3: label '7', expected 0 or 1 (column 'y', the first column, the built-in default: "
        "--label-column or the schema's `label` names another)"
    )
    for limit in (1, 2, 3):  # the first bad line is named, whichever crossed the limit, with the count
        with pytest.raises(ValueError) as e:
            read(path, "csv", 10, columns={"numeric_columns": ["n"]}, max_bad_lines=limit)
        assert str(e.value) == f"{stats.first_bad}; {limit + 1} bad lines, more than --max-bad-lines {limit}"
    records = ["1,x,1\n", "7,x,1\n", "0,y\n", '1,"two\nlines",abc\n', "\n", "1,z,inf\n", "0,w,\n"]
    for at, said in (
        (2, "line 4: 2 columns, expected 3 as in the header"),
        (3, "line 5: numeric column 'n' is 'abc', expected a finite float32 number (|x| <= 3.4e38) or empty"),
        (5, "line 8: numeric column 'n' is 'inf', expected a finite float32 number (|x| <= 3.4e38) or empty"),
    ):  # each bad record alone, the others before it made blank lines (skipped): its problem is named
        kept = [r if k == at or k not in (1, 2, 3, 5) else "\n" * r.count("\n") for k, r in enumerate(records)]
        path.write_text("y,a,n\n" + "".join(kept))
        with pytest.raises(ValueError) as e:
            read(path, "csv", 10, columns={"numeric_columns": ["n"]})
        assert str(e.value).startswith(f"{path} {said}; "), str(e.value)


@pytest.mark.parametrize("scan", [True, False])
def test_csv_labels_true_and_false_yes_and_no_read_as_1_and_0(tmp_path, monkeypatch, scan):
    from worker.readers import csv_reader

    monkeypatch.setattr(csv_reader, "CSV_SCAN", scan)
    path = tmp_path / "d.csv"
    cells = ["True", "False", " true ", "FALSE", "false", "yes", "No", " YES", "no ", "yess"]
    path.write_text("clicked,site\n" + "".join(f"{c},s{i}\n" for i, c in enumerate(cells)))
    stats = ReadStats()
    (b,) = read(path, "csv", 20, max_bad_lines=1, stats=stats)
    oracle = [float(c.strip().lower() in ("true", "yes")) for c in cells[:-1]]
    assert b.labels.tolist() == oracle and b.line_nos.tolist() == list(range(2, 11))
    assert stats.bad_lines == 1 and stats.first_bad.startswith(f"{path} line 11: label 'yess', expected 0 or 1")
    (b,) = read(path, "csv", 20, columns={"label_column": "clicked"}, max_bad_lines=1)  # the flag reads them alike
    assert b.labels.tolist() == oracle


@pytest.mark.parametrize("scan", [True, False])
def test_a_bad_label_names_its_column_and_where_it_came_from_and_a_repeated_header_is_named(
    tmp_path, monkeypatch, scan
):
    from worker.readers import csv_reader

    monkeypatch.setattr(csv_reader, "CSV_SCAN", scan)
    part = "id,click,site\n" + "".join(f"u{i},{i % 2},s{i}\n" for i in range(3))
    path = tmp_path / "cat.csv"
    path.write_text(part + part + "u9,,s9\n")  # `cat a.csv b.csv`: line 5 repeats the header; line 9's label is empty
    (tmp_path / "s.toml").write_text(
        'format = "csv"\nlabel = "click"\n[[columns]]\nname = "site"\nkind = "categorical"\n'
    )
    schema = load_schema(str(tmp_path / "s.toml"), default_table="t", default_dim=4)
    stats = ReadStats()
    (b,) = read(path, "csv", 10, schema=schema, max_bad_lines=2, stats=stats)
    assert len(b) == 6 and stats.bad_lines == 2
    assert stats.first_bad == f"{path} line 5: a repeated header line (files concatenated?)"
    path.write_text(part + part.split("\n", 1)[1] + "u9,,s9\n")  # without the repeated header: line 8 is bad
    with pytest.raises(ValueError, match=re.escape("line 8: an empty label, expected 0 or 1 (column 'click', the "
                                                   "schema's label); 1 bad line")):  # fmt: skip
        read(path, "csv", 10, schema=schema)
    flagged = schema_of(path, "csv", label_column="click")
    with pytest.raises(ValueError, match=re.escape("line 8: an empty label, expected 0 or 1 (column 'click', given "
                                                   "by --label-column); 1 bad line")):  # fmt: skip
        read(path, "csv", 10, schema=flagged)
    first = tmp_path / "first.csv"
    first.write_text("click,site\n1,a\n\n2,b\n")
    with pytest.raises(ValueError, match=re.escape("line 4: label '2', expected 0 or 1 (column 'click', the first "
                                                   "column, the built-in default: --label-column or the schema's "
                                                   "`label` names another); 1 bad line")):  # fmt: skip
        read(first, "csv", 10)
    named = tmp_path / "named.csv"  # a label-named column that is not the first: named in the message
    named.write_text("site,clicked\na,1\nb,0\nc,\n")  # the label (schema_builtin.csv_label), where 'site' is none
    with pytest.raises(ValueError, match=re.escape("line 4: an empty label, expected 0 or 1 (column 'clicked', named "
                                                   "like a label and holding 0 and 1 in the first 3 rows, where the "
                                                   "first column, 'site', "
                                                   "holds other values: --label-column or the schema's `label` names "
                                                   "another); 1 bad line")):  # fmt: skip
        read(named, "csv", 10)
    named.write_text("site,clicked\na,maybe\n")  # named so, but no labels: no column can be the label
    with pytest.raises(ValueError, match=re.escape("no column can be the label (0 or 1, or true and false, yes and "
                                                   "no, any case): in the first row, the first column, 'site', holds "
                                                   "'a'; 'clicked', named like a label, holds 'maybe'. No flag reads "
                                                   "these values as labels: write the column to predict as 0 and 1 "
                                                   "(-1 as 0, a count as 1 where it is above 0), then train on the "
                                                   "rewritten file with --label-column naming that column")):  # fmt: skip
        read(named, "csv", 10)
    named.write_text("site,price,is_click,y\na,2.5,1,0\n")  # two label columns: which one is for the user to say
    with pytest.raises(ValueError, match=re.escape("(column 'site', the first column, the built-in default: "
                                                   "--label-column or the schema's `label` names another; the header "
                                                   "has 'is_click' and 'y', named like a label: --label-column names "
                                                   "the one to predict)")):  # fmt: skip
        read(named, "csv", 10)
    named.write_text("site,price,has_clicked\na,2.5,1\nb,3,0\n")  # LABEL_NAMES first, then LABEL_WORDS, as
    (b,) = read(named, "csv", 10)  # `ps-worker schema` takes them
    assert b.labels.tolist() == [1.0, 0.0]
    named.write_text("site,price,has_clicked\na,2.5,maybe\n")  # named so, of no labels: said as above
    with pytest.raises(ValueError, match=re.escape("'has_clicked', named like a label, holds 'maybe'. No flag")):
        read(named, "csv", 10)
    coded = tmp_path / "coded.csv"  # labels coded -1/1 or other words: how to write them; 2 or NA: a bad cell
    rewrite = (": rewrite the column as 1 for the outcome the model predicts and 0 for the other (true and false, yes "
               "and no, any case are read as 1 and 0 too); 1 bad line")  # fmt: skip
    for cell, told in (
        ("-1", rewrite),
        (" clicked", rewrite),
        ("Nope", rewrite),
        ("2", "; 1 bad line"),
        ("NA", "; 1 bad line"),
    ):
        coded.write_text(f"id,click,site\nu1,1,a\nu2,{cell},b\n")
        for how in (schema, flagged):
            with pytest.raises(ValueError) as e:
                read(coded, "csv", 10, schema=how)
            assert f"line 3: label {cell!r}, expected 0 or 1 (column 'click', " in str(e.value)
            assert f"){told}, more than --max-bad-lines 0" in str(e.value), str(e.value)
    coded.write_text("label,site\n1,a\n-1,b\n")  # the default first column, named as the label: its coding
    with pytest.raises(ValueError, match=re.escape("label '-1', expected 0 or 1 (column 'label', the first column)"
                                                   f"{rewrite}")):  # fmt: skip
        read(coded, "csv", 10)


@pytest.mark.parametrize("fmt", ["csv", "criteo", "libsvm"])
def test_empty_lines_are_skipped_not_bad_in_every_format(tmp_path, fmt):
    """Blank lines (in the middle, at the end, CRLF, whitespace only) are no examples and no bad lines: a file
    that a spreadsheet saved with trailing blank lines reads under --max-bad-lines 0."""
    line = {"csv": "1,x,2", "criteo": "1" + "\t" * 39, "libsvm": "1 3:1 5:1"}[fmt]
    header = "y,a,n\r\n" if fmt == "csv" else ""
    path = tmp_path / f"blank.{fmt}"
    path.write_bytes((header + f"{line}\r\n\r\n{line}\r\n   \r\n{line}\n\n\n").encode())
    stats = ReadStats()
    (b,) = read(path, fmt, 10, max_bad_lines=0, stats=stats)
    assert b.labels.tolist() == [1, 1, 1]
    assert (stats.lines_read, stats.bad_lines, stats.empty_lines) == (7, 0, 4)


def test_csv_more_than_39_categorical_fields(tmp_path):
    path = tmp_path / "wide.csv"
    width = NUM_FIELDS + 6
    path.write_text("y," + ",".join(f"c{i}" for i in range(width)) + "\n1," + ",".join(["0"] * width) + "\n")
    (b,) = read(path, "csv")
    ids = ids_matrix(b)[0]
    assert len(ids) == width + 1 and len(set(ids.tolist())) == width + 1 and BIAS_ID not in ids[:-1]
    assert ids[5] == field_ids(5, np.zeros(1, np.uint64))[0]
    assert ids[NUM_FIELDS + 2] == space_ids(NUM_FIELDS + 2, np.zeros(1, np.uint64))[0]


def test_a_schema_file_reads_a_csv_with_bags_and_bad_tokens(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("tags,y,price,wt\na|b|a|c,1,2,u:2|v:0.5\n,0,,\nx,1,4,u:abc\ny|,0,6,u\nz,1,6,v:1\n")
    schema_file = tmp_path / "s.toml"
    schema_file.write_text(
        'format = "csv"\nlabel = "y"\n'
        '[[columns]]\nname = "tags"\nkind = "multi_hot"\nmax_length = 3\n'
        '[[columns]]\nname = "wt"\nkind = "weighted"\n'
        '[[columns]]\nname = "price"\nkind = "numeric"\ntransform = "standardize"\n'
    )
    schema = load_schema(str(schema_file), default_table="t", default_dim=4)
    with pytest.raises(ValueError, match="standardize columns without mean and std"):
        read_batches(path, schema, 4)
    assert column_stats(path, schema) == {"price": (4.0, 2.0)}  # lines 2 and 6: lines 4 and 5 are bad
    schema = schema.with_stats(column_stats(path, schema))
    stats = ReadStats()
    (b,) = read(path, "csv", 4, schema=schema, max_bad_lines=2, stats=stats)
    assert (stats.bad_lines, stats.truncated_bags) == (2, 1)
    assert (
        stats.first_bad == f"{path} line 4: column 'wt' has the token 'u:abc', expected id:weight with a finite weight"
    )
    assert b.labels.tolist() == [1, 0, 1]
    tags, wt = b.fields["tags"], b.fields["wt"]
    assert tags.offsets.tolist() == [0, 3, 3, 4] and tags.weights is None
    np.testing.assert_array_equal(tags.ids, space_ids(0, cat_values(np.array(["a", "b", "a", "z"]))))
    assert wt.offsets.tolist() == [0, 2, 2, 3] and wt.weights.tolist() == [2.0, 0.5, 1.0]
    np.testing.assert_array_equal(wt.ids, space_ids(1, cat_values(np.array(["u", "v", "v"]))))
    np.testing.assert_array_equal(b.dense, [[-1.0], [0.0], [1.0]])  # a missing price is the mean
    path.write_text(path.read_text().replace("x,1,4,u:abc\n", "\n"))  # line 4 blank: line 5 is the first bad
    with pytest.raises(ValueError, match=r"line 5: column 'wt' has the token 'u', expected id:weight.*; 1 bad line"):
        read(path, "csv", 4, schema=schema)


def test_column_stats_are_of_the_good_lines_present_values(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("y,a,b\n1,1,x\n0,,x\n1,3,x\n7,100,x\n0,5,x\n")  # line 5 is bad (label 7); a is missing on 3
    schema_file = tmp_path / "s.toml"
    schema_file.write_text('label = "y"\n[[columns]]\nname = "a"\nkind = "numeric"\ntransform = "standardize"\n')
    schema = load_schema(str(schema_file), default_table="t", default_dim=4)
    mean, std = column_stats(path, schema)["a"]
    assert mean == pytest.approx(3.0) and std == pytest.approx(np.std([1, 3, 5]))
    (b,) = read(path, "csv", 10, schema=schema.with_stats({"a": (mean, std)}), max_bad_lines=1)
    np.testing.assert_allclose(b.dense[:, 0], (np.array([1, 3, 3, 5]) - 3) / std, rtol=1e-6)
    path.write_text("y,a,b\n1,5,x\n0,5,x\n")  # a constant column: std 1, the value a schema may hold (> 0)
    assert column_stats(path, schema) == {"a": (5.0, 1.0)}
    path.write_text("y,a,b\n" + "1,0.1,x\n" * 100_000)  # whose float sums would leave a std of 1e-17
    assert column_stats(path, schema) == {"a": (0.1, 1.0)}


def test_the_logged_statistics_of_standardized_columns_copied_into_the_schema_give_the_same_features(tmp_path,
                                                                                                     caplog):  # fmt: skip
    """Training logs the mean and std it computed, to copy into the schema for eval and predict: in full."""
    import re

    from worker.data import DataSource
    from worker.train_config import TrainConfig

    path = tmp_path / "d.csv"
    path.write_text("y,a,k\n" + "".join(f"{i % 2},{i * 1.37 + 0.1},5\n" for i in range(1, 40)))
    text = 'label = "y"\n[[columns]]\nname = "a"\nkind = "numeric"\ntransform = "standardize"\n'
    text += '[[columns]]\nname = "k"\nkind = "numeric"\ntransform = "standardize"\n'
    (tmp_path / "s.toml").write_text(text)
    cfg = TrainConfig(data=str(path), schema=str(tmp_path / "s.toml"), local_shards=1)
    computed = DataSource(cfg, default_table="t").schema
    found = re.findall(r"(\w+) mean = ([-\d.e]+), std = ([-\d.e]+)", caplog.text)
    assert [name for name, _, _ in found] == ["a", "k"]
    written = text
    for name, mean, std in found:
        written = written.replace(f'name = "{name}"\nkind = "numeric"\ntransform = "standardize"\n',
                                  f'name = "{name}"\nkind = "numeric"\ntransform = "standardize"\nmean = {mean}\n'
                                  f"std = {std}\n")  # fmt: skip
    (tmp_path / "fixed.toml").write_text(written)
    fixed = load_schema(str(tmp_path / "fixed.toml"), default_table="t", default_dim=4)  # std 0 would be refused
    assert [(c.mean, c.std) for c in fixed.dense_columns()] == [(c.mean, c.std) for c in computed.dense_columns()]


# --- libsvm -------------------------------------------------------------------------------------------------


def test_libsvm_labels_fields_missing_and_padding(tmp_path):
    """K is the longest line's feature count; every field's ids are in one id space (a feature id is one row
    wherever its token stands); a line with more than K features is bad. A file of values 0 and 1 reads one-hot:
    each field one categorical id a line (its value 0 or past the line's end: the missing id)."""
    path = tmp_path / "d.svm"
    path.write_text("1 3:1 7:1 9:1\n-1 3:1 8:1\n+1 4:1 7:0 9:1\n0 1:1 2:1 3:1 4:1\nx 1:1\n0\n1.0 5:1 6:1 7:1\n")
    assert libsvm_field_count(path) == 4
    assert {c.kind for c in schema_of(path, "libsvm").columns} == {"categorical"}
    stats = ReadStats()
    (b,) = read(path, "libsvm", 10, max_bad_lines=1, stats=stats)
    assert b.labels.tolist() == [1, 0, 1, 0, 0, 1] and b.dense is None
    assert (stats.lines_read, stats.bad_lines) == (7, 1)
    m = MISSING_CAT
    raw = np.array([[3, 7, 9, m], [3, 8, m, m], [4, m, 9, m], [1, 2, 3, 4], [m] * 4, [5, 6, 7, m]], dtype=np.uint64)
    expected = np.concatenate([field_ids(0, raw), np.full((6, 1), BIAS_ID)], axis=1)  # id space 0 for all
    np.testing.assert_array_equal(ids_matrix(b), expected)
    assert ids_matrix(b)[0, 0] == ids_matrix(b)[3, 2]  # feature 3, first in line 1, third in line 4: one id
    stats = ReadStats()
    (b,) = read(path, "libsvm", 10, columns={"libsvm_fields": 3}, max_bad_lines=2, stats=stats)
    assert b.labels.tolist() == [1, 0, 1, 0, 1] and stats.bad_lines == 2
    assert stats.first_bad.startswith(
        f"{path} line 4: 4 features, more than the schema's 3 fields (the built-in schema's count is the most of a "
        "line among the training file's first 10,000; --libsvm-fields sets it)"
    )
    with pytest.raises(ValueError) as e:
        read(path, "libsvm", 10, max_bad_lines=0)
    assert str(e.value) == f"{path} line 5: label 'x', expected 0, 1, -1 or +1; 1 bad line, more than --max-bad-lines 0"


def test_libsvm_large_ids_keep_their_value(tmp_path):
    path = tmp_path / "d.svm"
    path.write_text(f"1 {2**64 - 2}:1 {2**32}:1 0:1\n")
    (b,) = read(path, "libsvm")
    raw = np.array([2**64 - 2, 2**32, 0], dtype=np.uint64)
    np.testing.assert_array_equal(ids_matrix(b)[0, :3], field_ids(0, raw))  # the built-in schema's one id space


def test_libsvm_raw_ids_are_the_tokens_ids_and_a_libsvm_column_is_categorical(tmp_path):
    path = tmp_path / "d.svm"
    path.write_text("1 9:1 16:1\n0 10:1 255:1\n1 100:1 4096:1\n0 7:1 0:0\n")
    text = 'format = "libsvm"\n[[columns]]\nname = "f0"\nkind = "categorical"\nids = "raw"\n' + \
        '[[columns]]\nname = "f1"\nkind = "categorical"\n'  # fmt: skip
    (tmp_path / "s.toml").write_text(text)
    schema = load_schema(str(tmp_path / "s.toml"), default_table="t", default_dim=4)
    (b,) = read(path, "libsvm", 10, schema=schema)
    assert b.fields["f0"].ids.tolist() == [9, 10, 100, 7]  # the ids as written, not read as hex
    hashed = np.array([16, 255, 4096, MISSING_CAT], dtype=np.uint64)
    np.testing.assert_array_equal(b.fields["f1"].ids, space_ids(schema.id_spaces()["f1"], hashed))
    for kind in ('"numeric"\ntransform = "none"', '"multi_hot"'):
        (tmp_path / "n.toml").write_text(f'format = "libsvm"\n[[columns]]\nname = "f0"\nkind = {kind}\n')
        with pytest.raises(ValueError, match="a libsvm column holds the id of a line's k-th feature token, so its "
                                             "kind is 'categorical' .* or 'weighted'"):  # fmt: skip
            load_schema(str(tmp_path / "n.toml"), default_table="t", default_dim=4)
    (tmp_path / "n.toml").write_text(
        'format = "libsvm"\n[[columns]]\nname = "f0"\nkind = "weighted"\nseparator = ";"\n'
    )
    with pytest.raises(ValueError, match=r"column 'f0' \(a libsvm weighted column: one id:value token\): unknown key "
                                         "'separator'"):  # fmt: skip
        load_schema(str(tmp_path / "n.toml"), default_table="t", default_dim=4)
    (tmp_path / "far.toml").write_text('format = "libsvm"\n[[columns]]\nname = "a"\nsource = "f3000000"\n'
                                       'kind = "categorical"\n')  # fmt: skip
    with pytest.raises(ValueError, match="source 'f3000000': a libsvm field is the position of a line's feature "):
        load_schema(str(tmp_path / "far.toml"), default_table="t", default_dim=4)
    wide = tmp_path / "wide.svm"
    wide.write_text("1 " + " ".join(f"{i}:1" for i in range(2000)) + "\n")
    with pytest.raises(ValueError, match="2000 libsvm fields, more than 1024: a field is a position"):
        read(wide, "libsvm")


def test_missing_texts_in_a_log_buckets_column_are_its_missing_bucket(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("y,cnt\n1,NA\n0,\n1,?\n0,null\n1,3\n")
    (tmp_path / "s.toml").write_text('format = "csv"\nlabel = "y"\n[[columns]]\nname = "cnt"\nkind = "numeric"\n'
                                     'transform = "log_buckets"\n')  # fmt: skip
    schema = load_schema(str(tmp_path / "s.toml"), default_table="t", default_dim=4)
    (b,) = read(path, "csv", 10, schema=schema, max_bad_lines=0)
    ids = b.fields["cnt"].ids
    assert len(ids) == 5 and len(set(ids[:4].tolist())) == 1 and ids[4] != ids[0]


def test_libsvm_width_is_the_files_not_the_shares_and_can_be_given(tmp_path, monkeypatch):
    path = tmp_path / "d.svm"
    path.write_text("bad\n1 1:1 2:1\n0 1:1\n1 1:1 2:1 3:1\n")
    assert libsvm_field_count(path) == 3  # the longest good line's
    stats = ReadStats()
    (b,) = read(path, "libsvm", worker_id=0, num_workers=2, max_bad_lines=5, stats=stats)
    assert ids_matrix(b).shape == (1, 4) and stats.bad_lines == 1  # the share's only good line has 1 feature: K is 3
    (b,) = read(path, "libsvm", worker_id=1, num_workers=2, max_bad_lines=5, stats=stats)
    assert ids_matrix(b).shape == (2, 4) and stats.bad_lines == 1
    (b,) = read(path, "libsvm", columns={"libsvm_fields": 5}, max_bad_lines=1)
    assert ids_matrix(b).shape == (3, 6)
    from worker.readers import libsvm_reader

    monkeypatch.setattr(libsvm_reader, "FIELD_COUNT_LINES", 3)  # line 4 is past the lines counted
    assert libsvm_field_count(path) == 2
    monkeypatch.setattr(libsvm_reader, "MAX_LIBSVM_FIELDS", 2)  # line 4's 3 features: a bad line, not K
    monkeypatch.setattr(libsvm_reader, "FIELD_COUNT_LINES", 10)
    assert libsvm_field_count(path) == 2


@pytest.mark.parametrize(
    "token, problem",
    [
        ("3", "feature '3', expected id:value with a non-negative integer id"),
        ("-3:1", "feature '-3:1', expected id:value with a non-negative integer id"),
        ("a:1", "feature 'a:1', expected id:value with a non-negative integer id"),
        ("3:x", "feature '3:x': value 'x', expected a finite number"),
        ("3:nan", "feature '3:nan': value 'nan', expected a finite number"),
        (f"{2**64 - 1}:1", f"feature '{2**64 - 1}:1': id too large, expected < 2**64 - 1"),
    ],
)
def test_libsvm_bad_tokens(tmp_path, token, problem):
    path = tmp_path / "d.svm"
    path.write_text(f"1 1:1 2:1\n0 1:1 {token}\n")
    with pytest.raises(ValueError) as e:
        read(path, "libsvm")
    assert str(e.value) == f"{path} line 2: {problem}; 1 bad line, more than --max-bad-lines 0"


# --- arguments and batch sizes ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
@pytest.mark.parametrize("batch_size", [1, 4, 23, 24])
def test_batch_sizes(tmp_path, fmt, batch_size):
    batches = read(SAMPLES[fmt](tmp_path), fmt, batch_size)
    sizes = [len(b) for b in batches]
    assert sum(sizes) == 23 and all(s == batch_size for s in sizes[:-1]) and 1 <= sizes[-1] <= batch_size
    for b in batches:
        assert b.labels.dtype == np.float32 and (b.fields[BIAS_FIELD].ids == BIAS_ID).all()


def test_bad_arguments(tmp_path):
    path = tmp_path / "x.txt"
    schema = builtin_schema("criteo", default_table="t", default_dim=4)
    for args, kw in [
        ((0,), {}),
        ((4,), {"worker_id": 2, "num_workers": 2}),
        ((4,), {"max_bad_lines": -1}),
    ]:
        with pytest.raises(ValueError):
            read_batches(path, schema, *args, **kw)  # raised at the call, before any file is opened
    with pytest.raises(ValueError, match="libsvm_fields is 3 for format criteo"):
        schema_of(path, "criteo", libsvm_fields=3)


def test_empty_files(tmp_path):
    for fmt in ("criteo", "libsvm"):
        path = tmp_path / f"empty.{fmt}"
        path.write_text("")
        assert read(path, fmt) == []
    header_only = tmp_path / "h.csv"
    header_only.write_text("y,a\n")
    assert read(header_only, "csv") == []
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert read(empty, "csv", schema=schema_of(header_only, "csv")) == []
    with pytest.raises(ValueError, match="empty.csv: the file is empty"):
        schema_of(empty, "csv")


def test_a_bag_cell_longer_than_the_csv_modules_field_limit_is_read_and_cut(tmp_path):
    long = "|".join(f"{i:x}" for i in range(30_000))  # ~150K characters: past csv's default 128 KiB field limit
    path = tmp_path / "long.csv"
    path.write_text(f"label,clicked\n1,{long}\n0,a|b\n")
    schema = tmp_path / "s.toml"
    schema.write_text('label = "label"\n[[columns]]\nname = "clicked"\nkind = "multi_hot"\nmax_length = 5\n')
    stats = ReadStats()
    (batch,) = read_batches(path, load_schema(str(schema), default_table="t", default_dim=4), 8, stats=stats)
    assert stats.bad_lines == 0 and stats.truncated_bags == 1
    assert batch.fields["clicked"].lengths().tolist() == [5, 2]


def test_a_long_csv_cell_shrinks_its_chunk_not_the_memory_and_reads_the_same(tmp_path, monkeypatch):
    """numpy's string arrays pad each cell to a chunk's longest: a 100,000-character cell among 4,096 rows took
    1.6 GB a column. A chunk holds at most CHUNK_CHARS of rows x longest cell, and the batches are those of one
    chunk per batch."""
    from worker.readers import csv_reader
    from worker.readers.share import BadLines, Share

    path = tmp_path / "long.csv"
    rows = [f"{i % 2},u{i % 37},{'x' * 20_000 if i == 10 else f'i{i % 11}'}" for i in range(3000)]
    path.write_text("label,user,item\n" + "\n".join(rows) + "\n")
    schema = builtin_schema("csv", default_table="t", default_dim=4, header=["label", "user", "item"])
    share = Share(0, 1, BadLines(str(path), 0, ReadStats()))
    chunks = list(csv_reader.csv_cells(str(path), schema, 4096, share))
    for chunk in chunks:
        longest = max(max(len(c) for c in col) for col in chunk.cells.values())
        assert len(chunk.labels) == 1 or len(chunk.labels) * longest <= csv_reader.CHUNK_CHARS, (
            len(chunk.labels),
            longest,
        )
    assert sum(len(c.labels) for c in chunks) == 3000 and len(chunks) > 1
    small = list(read_batches(path, schema, 1000))
    monkeypatch.setattr(csv_reader, "CHUNK_CHARS", 1 << 40)  # one chunk: the batches must not change
    whole = list(read_batches(path, schema, 1000))
    assert [len(b) for b in small] == [len(b) for b in whole] == [1000, 1000, 1000]
    for a, b in zip(small, whole):
        np.testing.assert_array_equal(a.labels, b.labels)
        for name in a.fields:
            np.testing.assert_array_equal(a.fields[name].ids, b.fields[name].ids)


def test_a_stray_quote_loses_each_line_it_swallows_as_a_bad_line(tmp_path):
    """A quote left open on line 12 would run its record to the end of the file (the csv module reads every line
    after it into one field): the record is cut at 100 lines, counted as 100 bad lines (the run fails at the limit,
    naming the span), and the records after it are read as records."""
    quote = '"'
    rows = [f"{i % 2},{quote if i == 10 else ''}u{i},i{i % 7}" for i in range(300)]
    path = tmp_path / "quote.csv"
    path.write_text("label,user,item\n" + "\n".join(rows) + "\n")
    schema = builtin_schema("csv", default_table="t", default_dim=4, header=["label", "user", "item"])
    with pytest.raises(ValueError, match=r"line 12: unreadable CSV: a record of more than 100 lines, cut there \(a "
                                         r"record from line 12 to line 111: a quoted field spans them; a stray quote"
                                         r"\?\); 100 bad lines, more than --max-bad-lines 1"):  # fmt: skip
        list(read_batches(path, schema, 64, max_bad_lines=1))
    stats = ReadStats()
    assert sum(len(b) for b in read_batches(path, schema, 64, max_bad_lines=100, stats=stats)) == 200
    assert stats.bad_lines == 100 and stats.lines_read == 300
    # the quote in the last column: the same
    path.write_text("label,user,item\n" + "\n".join(f"{i % 2},u{i},{quote if i == 10 else ''}i{i % 7}"
                                                      for i in range(300)) + "\n")  # fmt: skip
    with pytest.raises(ValueError, match=r"line 12: unreadable CSV: a record of more than 100 lines, cut there \(a "
                                         r"record from line 12 to line 111"):  # fmt: skip
        list(read_batches(path, schema, 64))
    path.write_text('label,user,item\n1,"two\nlines",i1\n0,u2,i2\n')  # a short multi-line field is a record
    assert [len(b) for b in read_batches(path, schema, 64)] == [2]


def test_a_schema_without_a_label_takes_the_training_files_first_column_for_every_file(tmp_path):
    """The eval file puts its columns in another order: it is still scored against the training file's label
    column, not against whatever column comes first in it."""
    from worker.schema_builtin import resolve_schema

    (tmp_path / "s.toml").write_text('format = "csv"\n[[columns]]\nname = "user"\nkind = "categorical"\n'
                                     '[[columns]]\nname = "flag"\nkind = "categorical"\n')  # fmt: skip
    train = tmp_path / "train.csv"
    train.write_text("label,flag,user\n" + "".join(f"{i % 2},{1 - i % 2},u{i}\n" for i in range(50)))
    held = tmp_path / "eval.csv"
    held.write_text("flag,label,user\n" + "".join(f"{1 - i % 2},{i % 2},u{i}\n" for i in range(50)))
    flags = dict(fmt="csv", label_column=None, drop_columns=(), numeric_columns=(), libsvm_fields=None,
                 default_table="t", default_dim=4)  # fmt: skip
    schema = resolve_schema(str(train), schema_path=str(tmp_path / "s.toml"), **flags)
    assert schema.label == "label"
    labels = np.concatenate([b.labels for b in read_batches(held, schema, 64)])
    np.testing.assert_array_equal(labels, np.arange(50) % 2)


@pytest.mark.parametrize("sep", ["\t", ";"])
def test_a_csv_whose_header_holds_another_separator_is_named_as_such(tmp_path, sep):
    from worker.schema_builtin import resolve_schema

    path = tmp_path / "d.txt"
    path.write_text(f"label{sep}user\n1{sep}u1\n")
    flags = dict(fmt="csv", label_column=None, drop_columns=(), numeric_columns=(), libsvm_fields=None,
                 default_table="t", default_dim=4)  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(f"one column holding {sep!r} and no ',': a {sep!r}-separated")):
        resolve_schema(str(path), schema_path=None, **flags)


def test_a_label_only_csv_whose_header_name_holds_a_bar_is_read(tmp_path):
    from worker.schema_builtin import resolve_schema

    path = tmp_path / "d.csv"
    path.write_text("is|click\n1\n0\n")
    flags = dict(fmt="csv", label_column=None, drop_columns=(), numeric_columns=(), libsvm_fields=None,
                 default_table="t", default_dim=4)  # fmt: skip
    assert resolve_schema(str(path), schema_path=None, **flags).label in (None, "is|click")


def test_a_header_read_as_one_column_that_a_tab_would_split_gets_a_hint():
    from worker.readers.csv_header import csv_columns
    from worker.schema_builtin import builtin_schema

    schema = builtin_schema("csv", default_table="t", default_dim=4, header=["clicked", "city"])
    with pytest.raises(ValueError, match=r"its columns are \['city\\tclicked'\] \(the header looks tab-separated: "):
        csv_columns("t.tsv", ["city\tclicked"], schema)
    with pytest.raises(ValueError, match=r"its columns are \['town', 'clicked'\]$"):  # two columns: no hint
        csv_columns("t.csv", ["town", "clicked"], schema)


def test_a_header_hint_names_each_delimiter_as_the_other_messages_do():
    from worker.readers.csv_header import DELIMITERS, csv_columns, delimiter_name
    from worker.schema_builtin import builtin_schema

    for delimiter in DELIMITERS:
        schema = builtin_schema("csv", default_table="t", default_dim=4, header=["clicked", "city"], delimiter="^")
        with pytest.raises(ValueError) as e:
            csv_columns("t.txt", [f"city{delimiter}clicked"], schema)
        assert f"(the header looks {delimiter_name(delimiter)}-separated: --format auto" in str(e.value)
    assert [delimiter_name(d) for d in DELIMITERS] == ["comma", "tab", "';'", "'|'"]


def test_a_format_flag_a_schema_file_overrides_is_said_to_be_unused(tmp_path, caplog):
    from worker.schema_builtin import resolve_schema

    (tmp_path / "s.toml").write_text('format = "csv"\nlabel = "label"\n[[columns]]\nname = "user"\n'
                                     'kind = "categorical"\n')  # fmt: skip
    flags = dict(label_column=None, drop_columns=(), numeric_columns=(), libsvm_fields=None, default_table="t",
                 default_dim=4)  # fmt: skip
    for fmt, said in (("libsvm", True), ("criteo", False), ("csv", False)):  # criteo: the default, no choice
        caplog.clear()
        schema = resolve_schema(None, schema_path=str(tmp_path / "s.toml"), fmt=fmt, **flags)
        assert schema.format == "csv"
        assert ("--format libsvm is not used: --schema" in caplog.text) == said, (fmt, caplog.text)


def test_synthetic_settings_given_with_data_are_said_to_be_unused(tmp_path, caplog):
    from worker.job import prepare
    from worker.synthetic import SyntheticConfig
    from worker.synthetic_files import write_synthetic
    from worker.train_config import TrainConfig

    data = str(tmp_path / "d.txt")
    write_synthetic(data, SyntheticConfig(rows=300))
    assert TrainConfig(synthetic_rows=5000).unused_synthetic_settings() == []  # no --data: they make the data
    assert TrainConfig(data=data).unused_synthetic_settings() == []  # the defaults are no choice of the user's
    cfg = TrainConfig(data=data, synthetic_rows=5000, synthetic_eval_rows=7, synthetic_seed=3, local_shards=1)
    assert cfg.unused_synthetic_settings() == ["--synthetic-rows 5000", "--synthetic-eval-rows 7"]  # the seed seeds
    prepare(cfg, needs_servers=False)  # dropout and the shuffle too
    assert f"--synthetic-rows 5000, --synthetic-eval-rows 7 not used: --data {data} is read" in caplog.text


@pytest.mark.parametrize("fmt", ["csv", "criteo", "libsvm"])
def test_gzip_data_under_another_name_is_named_as_such(tmp_path, fmt):
    line = {"csv": "y,a\n1,x\n", "criteo": "1" + "\t" * 39 + "\n", "libsvm": "1 3:1\n"}[fmt]
    path = tmp_path / f"d.{fmt}"
    path.write_bytes(gzip.compress(line.encode()))
    with pytest.raises(ValueError, match=rf"^{path}: it holds gzip-compressed data, but its name does not end in .gz"):
        read(path, fmt)  # the schema's look at the file (csv, libsvm) or the read (criteo) says it
    for utf in ("UTF-16", "UTF-32"):
        path.write_bytes(line.encode(utf))
        with pytest.raises(ValueError, match=rf"^{path}: {utf} text \(it starts with {utf}'s byte order mark\)"):
            read(path, fmt)
    import bz2
    import lzma
    import zipfile

    for kind, data in (("bzip2", bz2.compress(line.encode())), ("xz", lzma.compress(line.encode())),
                       ("zstd", b"\x28\xb5\x2f\xfd" + b"\x00" * 20)):  # fmt: skip
        path.write_bytes(data)
        with pytest.raises(ValueError, match=rf"^{path}: it holds {kind}-compressed data, which data files are not"):
            read(path, fmt)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("d", line)
    with pytest.raises(ValueError, match=rf"^{path}: it holds zip-compressed data"):
        read(path, fmt)
    for kind, magic in (("Parquet", b"PAR1"), ("ORC", b"ORC"), ("Avro", b"Obj\x01"), ("Arrow/Feather", b"ARROW1")):
        path.write_bytes(magic + bytes(range(256)))
        with pytest.raises(
            ValueError, match=rf"^{path}: a {kind} file, which data files are not: .*Write it out as CSV"
        ):
            read(path, fmt)
    path.write_text("ORC" + line)  # text that starts as a binary format's magic does is text
    try:
        read(path, fmt)
    except ValueError as e:
        assert "ORC file" not in str(e)
    path.write_text("BZh" + line)  # text that starts as bzip2 does is text (read, or refused for what it holds)
    try:
        read(path, fmt)
    except ValueError as e:
        assert "compressed" not in str(e)


def _hints(caplog, path, fmt, **columns) -> list[str]:
    caplog.clear()
    with caplog.at_level("WARNING", logger="worker.schema_hints"):
        schema_of(path, fmt, **columns)
    return [r.getMessage() for r in caplog.records if r.name == "worker.schema_hints"]


def test_the_builtin_csv_schema_takes_a_label_named_elsewhere_and_warns_of_columns_of_numbers(tmp_path, caplog):
    rng = np.random.default_rng(0)
    rows = [f"{m},s{rng.integers(5)},{rng.normal() * 100:.3f},{rng.integers(3)},{c}"
            for m, c in zip(rng.integers(0, 2, 300), rng.integers(0, 2, 300))]  # fmt: skip
    data = tmp_path / "d.csv"
    data.write_text("is_mobile,site,price,hour,click\n" + "\n".join(rows) + "\n")
    (numbers,) = _hints(caplog, data, "csv")  # click, named like a label, before is_mobile's 0 and 1
    assert schema_of(data, "csv").label == "click"
    two = tmp_path / "two.csv"  # two columns named like a label: the first column stays, with a word of the others
    two.write_text("is_mobile,y,click\n1,0,1\n0,1,0\n")
    (label,) = _hints(caplog, two, "csv")
    assert "the label is the first column, 'is_mobile' (the built-in csv schema's default), but the header also " \
           "has 'y', named like a label: give --label-column y" in label  # fmt: skip
    assert "column 'price' holds numbers of many values (a sample of 300 rows)" in numbers  # not hour: 3 values
    assert "ps-worker schema --data" in numbers
    one = tmp_path / "one.csv"  # a sample of one row is named so
    one.write_text("click,price\n1,2.5\n")
    assert any("(a sample of 1 row)" in h for h in _hints(caplog, one, "csv"))
    (only,) = _hints(caplog, data, "csv", label_column="click", numeric_columns=("price",))
    assert "column 'price' holds numbers below 0" in only  # normal * 100: about half of them
    assert len(_hints(caplog, data, "csv", label_column="is_mobile")) == 1  # only the numbers'


def test_the_builtin_csv_schema_warns_of_numbers_written_with_thousands_separators(tmp_path, caplog):
    """Numbers exported with thousands separators ('"15,726"' quoted, '8 402') are no numbers to the readers: the
    built-in schema reads each as an id, and says so of each such column, with a value of it and the fix; a column
    of ids ('u7') or of plain numbers says nothing of separators, and neither does a tab-separated file's column of
    lists of ids of mixed lengths ('12,3456,7'); lists of 3-digit ids read as numbers too, and the warning says so."""
    rng = np.random.default_rng(3)
    revenue, spaced = rng.integers(0, 10**7, 300), rng.integers(0, 10**6, 300)
    rows = [f'{c},"{r:,}",{s:,},u{u},{p:.2f}'.replace(f"{s:,}", f"{s:,}".replace(",", " "))
            for c, r, s, u, p in zip(rng.integers(0, 2, 300), revenue, spaced, rng.integers(0, 9, 300),
                                     rng.random(300))]  # fmt: skip
    data = tmp_path / "d.csv"
    data.write_text("click,revenue,visits,user,price\n" + "\n".join(rows) + "\n")
    hints = _hints(caplog, data, "csv")
    said = {h.split("column ", 1)[1].split(" ", 1)[0]: h for h in hints if "separat" in h}
    assert set(said) == {"'revenue'", "'visits'"}, hints
    first_grouped = next(f"{r:,}" for r in revenue if r >= 1000 and "," in f"{r:,}")
    assert f"holds numbers with thousands separators (as '{first_grouped}') (a sample of 300 rows): the built-in " \
           "csv schema reads each value as an id of its own" in said["'revenue'"]  # fmt: skip
    assert (
        "read_csv(..., thousands=',')" in said["'revenue'"] and f"ps-worker schema --data {data}" in said["'revenue'"]
    )
    first_spaced = next(f"{s:,}".replace(",", " ") for s in spaced if s >= 1000)
    assert f"holds numbers with thousands separated by ' ' (as '{first_spaced}')" in said["'visits'"]
    assert "read_csv(..., thousands=' ')" in said["'visits'"]
    assert 'kind = "multi_hot", separator = ",")' in said["'revenue'"], said["'revenue'"]
    assert 'kind = "multi_hot", separator = " ")' in said["'visits'"], said["'visits'"]
    lists = tmp_path / "lists.tsv"
    tags = [",".join(str(rng.integers(1, 10 ** rng.integers(1, 5))) for _ in range(rng.integers(1, 4)))
            for _ in range(300)]  # fmt: skip
    lists.write_text("click\tuser\ttags\n" + "".join(f"{i % 2}\tu{i % 7}\t{t}\n" for i, t in enumerate(tags)))
    assert schema_of(lists, "auto").delimiter == "\t"
    assert not [h for h in _hints(caplog, lists, "auto") if "separat" in h or "decimal" in h]
    three = tmp_path / "three.tsv"
    three.write_text("click\tuser\ttags\n" + "".join(f"{i % 2}\tu{i % 7}\t{100 + i % 9},{200 + i % 13},{300 + i % 5}\n"
                                                        for i in range(300)))  # fmt: skip
    (warned,) = [h for h in _hints(caplog, three, "auto") if "separat" in h]
    assert "column 'tags' holds numbers with thousands separators (as '100,200,300')" in warned
    assert warned.endswith('(lists of 3-digit ids look the same: a schema reads those with kind = "multi_hot", '
                           'separator = ",")')  # fmt: skip


def test_the_builtin_csv_schema_warns_of_a_column_of_lists_that_ps_worker_schema_reads_as_multi_hot(tmp_path, caplog):
    """A column of '|'-separated lists whose items repeat is read by the built-in schema as one id per whole cell:
    warned of, naming the column, a cell and the fix, where `ps-worker schema` writes it multi_hot; judged on the
    schema's sample, in which items repeat that do not in the built-in schema's first 1,000 rows. A column of one
    id per cell, and lists whose items never repeat, are not warned of."""
    rng = np.random.default_rng(5)
    hist = ["|".join(f"ad{a}" for a in rng.integers(0, 1500, 2)) for _ in range(2000)]
    once = [f"x{2 * i}|x{2 * i + 1}" for i in range(2000)]  # items that never repeat: no list of ids to learn
    data = tmp_path / "d.csv"
    data.write_text("click,ad,hist,once\n" + "".join(f"{i % 2},ad{i % 50},{h},{o}\n" for i, (h, o) in
                                                    enumerate(zip(hist, once))))  # fmt: skip
    lists = [h for h in _hints(caplog, data, "csv") if "lists" in h]
    assert lists == [f"{data}: column 'hist' holds lists split by '|' (as '{hist[0]}'; a sample of 2,000 rows): the "
                     "built-in csv schema reads each whole cell as one id, so the model never sees a list's items. "
                     f"`ps-worker schema --data {data} > schema.toml`, then --schema schema.toml, reads each item as "
                     "an id of its own (kind multi_hot)"]  # fmt: skip
    assert 'name = "hist"\nkind = "multi_hot"' in infer_schema_text(str(data))
    assert 'name = "once"\nkind = "categorical"' in infer_schema_text(str(data))


def test_only_the_columns_that_hold_a_list_separator_are_judged_on_the_larger_sample(tmp_path, caplog, monkeypatch):
    """A '|' in the first 1,000 rows of one column (and a ',' in another, of free text) reads the larger sample for
    those two columns alone: the others are inferred from the built-in schema's own rows."""
    import worker.column_infer
    from worker.schema_hints import HINT_SAMPLE_ROWS

    judged: list[tuple[str, int]] = []
    infer = worker.column_infer.infer_column
    monkeypatch.setattr(worker.column_infer, "infer_column",
                        lambda name, *a, **k: judged.append((name, len(a[1]))) or infer(name, *a, **k))  # fmt: skip
    data = tmp_path / "d.csv"
    data.write_text("click,hist,note,ad,site,app\n" + "".join(f'{i % 2},h{i % 9}|h{i % 7},"a, b{i % 3}",ad{i % 50},'
                                                              f"s{i % 11},p{i % 13}\n" for i in range(2500)))  # fmt: skip
    assert [h for h in _hints(caplog, data, "csv") if "lists" in h]
    larger = sorted(name for name, cells in judged if cells > HINT_SAMPLE_ROWS)
    assert larger == ["hist", "note"] and {"ad", "site", "app"} <= {name for name, _ in judged}


def test_the_builtin_csv_schema_warns_of_a_column_of_another_value_in_each_row_as_ps_worker_schema_marks(
    tmp_path, caplog
):
    """A first column `id` of another value in every row is trained by the built-in schema as a feature: warned of,
    with the fixes, as `ps-worker schema` marks it; measurements (numbers with a fraction) and times, each distinct
    too, are not row ids, and neither is a column of fewer than ROW_ID_MIN_CELLS sampled cells."""
    from worker.schema_hints import ROW_ID_MIN_CELLS

    rng = np.random.default_rng(6)
    n = ROW_ID_MIN_CELLS + 50
    rows = [f"r{1000 + i},{i % 2},ad{rng.integers(20)},{rng.random() * 100:.6f},{1_700_000_000 + 3607 * i}"
            for i in range(n)]  # fmt: skip
    data = tmp_path / "d.csv"
    data.write_text("id,click,ad,price,ts\n" + "\n".join(rows) + "\n")
    ids = [h for h in _hints(caplog, data, "csv") if "a row's own id" in h]
    assert ids == [f"{data}: column 'id' holds another value in each of its {n} non-empty cells (a sample of {n} "
                   "rows): a row's own id? The built-in csv schema trains it as a feature, each value an id seen once "
                   "that a later row never has. If it is, leave it out: --drop-columns id, or `ps-worker schema --data "
                   f"{data} > schema.toml` (which marks it: delete its entry), then --schema schema.toml"]  # fmt: skip
    assert "every value distinct: an identifier? then delete this entry" in infer_schema_text(str(data))
    assert not [h for h in _hints(caplog, data, "csv", drop_columns=("id",)) if "a row's own id" in h]
    few = tmp_path / "few.csv"
    few.write_text("id,click,ad,price,ts\n" + "\n".join(rows[: ROW_ID_MIN_CELLS - 1]) + "\n")
    assert not [h for h in _hints(caplog, few, "csv") if "a row's own id" in h]


def test_a_column_of_another_value_in_each_sampled_row_of_a_larger_file_is_no_row_id_to_drop(tmp_path, caplog):
    """Where the rows read are a sample of the file (1,000 of 1,500), distinct ids may be users seen a few times in
    all: the warning says it as `ps-worker schema` does of a sample, with no advice to drop the column."""
    from worker.column_infer import SAMPLED_DISTINCT

    data = tmp_path / "d.csv"
    data.write_text("user,click,ad\n" + "".join(f"u{i},{i % 2},ad{i % 20}\n" for i in range(1500)))
    (said,) = [h for h in _hints(caplog, data, "csv") if "a row's own id" in h]
    assert said.startswith(f"{data}: column 'user' holds another value in each of its 1,000 non-empty cells")
    assert said.endswith(f"says: {SAMPLED_DISTINCT}; then --schema schema.toml") and "--drop-columns" not in said
    assert SAMPLED_DISTINCT in infer_schema_text(str(data), sample_rows=1000)


@pytest.mark.parametrize("first, warned", [("1,u40,i14,1.1140", True), ("0,u3,i7,0.5", True),
                                            ("click,user,item,price", False), ("label,2020,2021,site", False),
                                            ("0,1,2,label", False), ("user,2019,2020,2021", False),
                                            ("0,1,2,3", True), ("2,3,4,5", True)])  # fmt: skip
def test_a_first_line_that_reads_like_an_example_is_warned_of_as_no_header(tmp_path, caplog, first, warned):
    """The built-in csv schema takes the first line as the header: one whose label cell is 0 or 1, or whose cells
    are mostly numbers, is an example (a file written without a header), said; so is a line of numbers only that
    run on as pandas' column numbers do (a first row as likely), unlike such numbers among names."""
    rng = np.random.default_rng(0)
    rows = [f"{c},u{rng.integers(50)},i{rng.integers(20)},{rng.random():.4f}" for c in rng.integers(0, 2, 300)]
    data = tmp_path / "d.csv"
    data.write_text(first + "\n" + "\n".join(rows) + "\n")
    hints = _hints(caplog, data, "csv")
    said = [h for h in hints if "reads like an example, not a header: a file without a header line?" in h]
    assert bool(said) == warned, hints
    from worker.schema_infer import infer_schema

    checks = infer_schema(str(data))[1]  # ps-worker schema says it too
    assert any("reads like an example, not a header" in c for c in checks) == warned, checks


def test_eval_and_predict_leave_the_schema_advice_to_training_and_keep_the_first_line_warning(
    tmp_path, caplog, servers
):
    """The built-in csv schema's advice to write a schema is given by the training run: eval and predict read the
    model it trained, with the schema it trained with, so they do not repeat it; a first line that reads like an
    example is of their own file, said by them too."""
    from worker.__main__ import main

    rng = np.random.default_rng(0)
    data = tmp_path / "d.csv"
    data.write_text("click,price,site\n" + "".join(f"{rng.integers(2)},{rng.random() * 100:.3f},s{rng.integers(20)}\n"
                                                  for _ in range(500)))  # fmt: skip
    (address,), _ = servers(1)
    said = {}
    for command in (["train"], ["eval"], ["predict", "--out", str(tmp_path / "p.csv")]):
        caplog.clear()
        with caplog.at_level("WARNING", logger="worker.schema_hints"):
            assert main([*command, "--servers", address, "--data", str(data), "--no-progress"]) == 0
        said[command[0]] = [r.getMessage() for r in caplog.records if r.name == "worker.schema_hints"]
    (advice,) = said["train"]
    assert advice.startswith(f"{data}: column 'price' holds numbers of many values (a sample of 500 rows)"), advice
    assert said["eval"] == said["predict"] == [], said
    headless = tmp_path / "headless.csv"
    headless.write_text("".join(f"{rng.integers(2)},{rng.random():.4f},{rng.random():.4f}\n" for _ in range(300)))
    caplog.clear()
    with caplog.at_level("WARNING", logger="worker.schema_hints"):
        resolve_schema(str(headless), schema_path=None, fmt="csv", label_column=None, drop_columns=(),
                       numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4, training=False)  # fmt: skip
    (first,) = [r.getMessage() for r in caplog.records if r.name == "worker.schema_hints"]
    assert "reads like an example, not a header: a file without a header line?" in first, first


@pytest.mark.parametrize("shift, warned", [(-10.0, True), (10.0, False)])
def test_numeric_columns_below_0_are_warned_of_as_lost_to_the_log(tmp_path, caplog, shift, warned):
    """--numeric-columns reads log(1 + x), x below 0 as 0: a column of such values is said to be lost."""
    rng = np.random.default_rng(0)
    rows = [f"{c},s{rng.integers(5)},{rng.normal() + shift:.3f}" for c in rng.integers(0, 2, 300)]
    data = tmp_path / "d.csv"
    data.write_text("click,site,price\n" + "\n".join(rows) + "\n")
    hints = _hints(caplog, data, "csv", numeric_columns=("price",))
    said = [h for h in hints if "column 'price' holds numbers below 0 (300 of a sample of 300 rows, the least -1" in h]
    assert bool(said) == warned, hints
    assert not warned or "every x below 0 as 0" in said[0]


@pytest.mark.parametrize("shift, warned", [(-10.0, True), (10.0, False)])
def test_a_schema_files_log_columns_below_0_are_warned_of_as_numeric_columns_are(tmp_path, caplog, shift, warned):
    """A --schema file's transform = "log" reads x below 0 as 0 too: said once per column (two fields of one column:
    once), with how many of the sample, and what to change in the file; a column of standardize is not said."""
    rng = np.random.default_rng(0)
    rows = [f"{c},{rng.normal() + shift:.3f},{rng.normal() - 10:.3f}" for c in rng.integers(0, 2, 300)]
    data = tmp_path / "d.csv"
    data.write_text("click,price,delta\n" + "\n".join(rows) + "\n")
    path = tmp_path / "s.toml"
    path.write_text('label = "click"\n' + "".join(f'[[columns]]\nname = "{n}"\nsource = "{s}"\nkind = "numeric"\n'
                                                f'transform = "{t}"\n' for n, s, t in [("p", "price", "log"),
                    ("p2", "price", "log"), ("d", "delta", "standardize")]))  # fmt: skip
    caplog.clear()
    with caplog.at_level("WARNING", logger="worker.schema_hints"):
        resolve_schema(str(data), schema_path=str(path), fmt="auto", label_column=None, drop_columns=(),
                       numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4)  # fmt: skip
    hints = [r.getMessage() for r in caplog.records if r.name == "worker.schema_hints"]
    assert len(hints) == warned, hints
    assert not warned or hints[0].startswith(
        f"{data}: column 'price' holds numbers below 0 (300 of a sample of 300 rows, the least -1"
    ) and f'the schema {path} (transform = "log") reads a number as log(1 + x) and every x below 0 as 0, so those ' \
        f'values are lost to the model. Shift the column to 0 and above, or give it transform = "standardize" in ' \
        f"{path}" in hints[0]  # fmt: skip


@pytest.mark.parametrize("twin, warned", [(None, True), ("bucketize", True), ("log_buckets", False)])
def test_a_log_column_below_0_is_not_warned_of_where_log_buckets_reads_it_too(tmp_path, caplog, twin, warned):
    """An integer column reaching -3 read by transform = "log" and by a log_buckets field (each value up to 2 its own
    id): its values below 0 are not lost to the model, and no warning says so; with a bucketize twin whose buckets
    hold them together with 0, or alone, it is said."""
    rng = np.random.default_rng(0)
    rows = [f"{c},{rng.integers(-3, 50)}" for c in rng.integers(0, 2, 300)]
    data = tmp_path / "d.csv"
    data.write_text("click,count\n" + "\n".join(rows) + "\n")
    twins = {None: "", "bucketize": "boundaries = [10.0]\n", "log_buckets": ""}
    path = tmp_path / "s.toml"
    path.write_text('label = "click"\n[[columns]]\nname = "count_log"\nsource = "count"\nkind = "numeric"\n'
                    'transform = "log"\n' + (f'[[columns]]\nname = "count"\nkind = "numeric"\ntransform = "{twin}"\n'
                                              f"{twins[twin]}" if twin else ""))  # fmt: skip
    caplog.clear()
    with caplog.at_level("WARNING", logger="worker.schema_hints"):
        resolve_schema(str(data), schema_path=str(path), fmt="auto", label_column=None, drop_columns=(),
                       numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4)  # fmt: skip
    hints = [r.getMessage() for r in caplog.records if r.name == "worker.schema_hints"]
    assert [h.startswith(f"{data}: column 'count' holds numbers below 0") for h in hints] == [True][:warned], hints


@pytest.mark.parametrize("name, taken", [("is_click", True), ("converted", True), ("clicks_7d", False)])
def test_the_builtin_csv_schema_takes_a_column_of_0_and_1_named_like_a_label(tmp_path, caplog, name, taken):
    """is_click, converted: named like a label (schema_columns.labels_by_name) and holding only 0 and 1: the label,
    before a first column of 0 and 1 not named so, as `ps-worker schema` takes it; a count named so (clicks_7d: many
    values) is no label: the first column stays, unwarned."""
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2, 300) if taken else rng.integers(0, 40, 300)
    rows = [f"{m},s{rng.integers(5)},{c}" for m, c in zip(rng.integers(0, 2, 300), values)]
    data = tmp_path / "d.csv"
    data.write_text(f"is_mobile,site,{name}\n" + "\n".join(rows) + "\n")
    assert not [h for h in _hints(caplog, data, "csv") if "the label is the first column" in h]
    assert schema_of(data, "csv").label == (name if taken else "is_mobile")


def test_the_builtin_libsvm_schema_reads_a_files_values_as_weights(tmp_path, caplog):
    """Where a file's first lines carry values other than 0 and 1, each field is weighted: its token's id with the
    value as the weight, in the one id space; a value of 0, or a line's end, is an empty bag; a value beyond
    float32 is a bad line, a non-finite one too. A file of 0 and 1 only stays one-hot: a value other than those
    counts among the first FIELD_COUNT_LINES lines. ps-worker schema writes the weighted schema, which reads back alike."""
    path = tmp_path / "w.libsvm"
    path.write_text("1 1:1 7:0.25\n0 2:1 9:-3\n0 3:2 4:0\n1 5:1e39\n0 6:nan\n")
    schema = schema_of(path, "libsvm")
    assert [(c.name, c.kind, c.id_space, c.pooling) for c in schema.columns] == [
        ("f0", "weighted", "all", "sum"), ("f1", "weighted", "all", "sum")]  # fmt: skip
    assert _hints(caplog, path, "libsvm") == []
    stats = ReadStats()
    (b,) = read(path, "libsvm", 10, schema=schema, max_bad_lines=2, stats=stats)
    assert stats.bad_lines == 2 and "line 4: feature 1e+39: a weight beyond float32's range" in stats.first_bad
    f0, f1 = b.fields["f0"], b.fields["f1"]
    np.testing.assert_array_equal(f0.ids, field_ids(0, np.array([[1], [2], [3]], dtype=np.uint64))[:, 0])  # as one-hot
    assert f0.offsets.tolist() == [0, 1, 2, 3] and f0.weights.tolist() == [1.0, 1.0, 2.0]
    np.testing.assert_array_equal(f1.ids, field_ids(0, np.array([[7], [9]], dtype=np.uint64))[:, 0])
    assert f1.offsets.tolist() == [0, 1, 2, 2] and f1.weights.tolist() == [0.25, -3.0]  # 4:0: an empty bag
    written = tmp_path / "s.toml"
    written.write_text(infer_schema_text(str(path), fmt="libsvm"))
    assert "weighted: the values are not all 0 and 1" in written.read_text()
    again = load_schema(str(written), default_table="t", default_dim=4)
    assert again.columns == schema.columns and again.fingerprint() == schema.fingerprint()
    one_hot = tmp_path / "o.libsvm"
    one_hot.write_text("1 1:1 7:1\n0 2:1 9:0\n" * 3 + "1 1:0.5\n")
    assert {c.kind for c in schema_of(one_hot, "libsvm").columns} == {"weighted"}  # line 7 is sampled
    from worker.readers import libsvm_reader

    with pytest.MonkeyPatch.context() as m:
        m.setattr(libsvm_reader, "FIELD_COUNT_LINES", 6)  # the lines sampled hold 0 and 1 only
        assert {c.kind for c in schema_of(one_hot, "libsvm").columns} == {"categorical"}


def test_a_libsvm_weighted_column_takes_raw_ids_and_the_fingerprint_says_weighted_without_k(tmp_path):
    path = tmp_path / "d.svm"
    path.write_text("1 9:0.5\n0 10:0\n")
    (tmp_path / "s.toml").write_text('format = "libsvm"\n[[columns]]\nname = "f0"\nkind = "weighted"\n'
                                     'ids = "raw"\n')  # fmt: skip
    schema = load_schema(str(tmp_path / "s.toml"), default_table="t", default_dim=4)
    (b,) = read(path, "libsvm", 10, schema=schema)
    assert b.fields["f0"].ids.tolist() == [9] and b.fields["f0"].offsets.tolist() == [0, 1, 1]
    assert b.fields["f0"].weights.tolist() == [0.5]
    three, four = (builtin_schema("libsvm", default_table="t", default_dim=4, libsvm_fields=k, libsvm_weighted=True)
                   for k in (3, 4))  # fmt: skip
    assert three.fingerprint() == four.fingerprint()  # a field a line leaves out adds nothing
    one_hot = builtin_schema("libsvm", default_table="t", default_dim=4, libsvm_fields=3)
    assert three.fingerprint() != one_hot.fingerprint() == three.libsvm_fingerprint(weighted=False)
    assert one_hot.libsvm_fingerprint(weighted=False) is None and three.libsvm_fingerprint(weighted=True) is None
    assert one_hot.libsvm_fingerprint(weighted=True) == three.fingerprint()  # any K: tables trained weighted


def test_a_schema_sample_reads_a_bounded_number_of_records_and_a_stray_quote_does_not_swallow_the_file(tmp_path):
    """read_csv_sample looks at SAMPLE_EXAMINED records per record it wants (plus 1,000), not the whole file, when
    no record has the header's width; a quote left open costs the sample 100 lines, not the rest of the file."""
    from worker.readers import csv_sample

    read = []

    def rows():
        for i in range(1_000_000):
            read.append(i)
            yield ["one column"]

    assert csv_sample._good_records(rows(), 2, 10) == [] and len(read) == 10 * csv_sample.SAMPLE_EXAMINED + 1000
    path = tmp_path / "quote.csv"
    path.write_text('user,item\nu0,"i0\n' + "".join(f"u{i},i{i}\n" for i in range(1, 5000)))
    header, sample = csv_sample.read_csv_sample(path, ",", 1000)
    assert header == ["user", "item"] and len(sample) == 1000 and sample[0] == ["u100", "i100"], sample[:2]


def _cr_ended_file(tmp_path, fmt: str, labeled: bool, lines: int) -> tuple:
    """(path, schema, line): a Criteo or libsvm file (2 fields) of `lines` copies of one good line (with a label
    or without), each ended by CR alone, and the built-in schema it is read with."""
    line = "\t".join(["1"] * 13 + ["a"] * 26) if fmt == "criteo" else "1:1 2:1"
    line = ("1\t" if fmt == "criteo" else "1 ") + line if labeled else line
    path = tmp_path / "cr.txt"
    path.write_bytes(("\r".join([line] * lines) + "\r").encode())
    more = {"libsvm_fields": 2} if fmt == "libsvm" else {}
    return path, builtin_schema(fmt, default_table="t", default_dim=4, **more), line


@pytest.mark.parametrize("fmt", ["criteo", "libsvm"])
def test_a_line_file_whose_lines_end_in_cr_alone_is_refused_at_a_bounded_line_length(fmt, tmp_path, monkeypatch):
    """Iterating a file splits lines at \\n only: a file of CR-ended lines would be read whole as one line. A line
    of MAX_LINE_BYTES with no line end is refused, naming CR line ends when it holds CRs."""
    from worker.readers import share

    monkeypatch.setattr(share, "MAX_LINE_BYTES", 4096)
    path, schema, _ = _cr_ended_file(tmp_path, fmt, labeled=True, lines=2000)
    with pytest.raises(ValueError, match=r"cr.txt line 1: 4,096 bytes with no line end; it holds carriage returns: are "
                                         r"its lines ended by CR alone\?"):  # fmt: skip
        list(read_batches(path, schema, 64, max_bad_lines=10**6))


@pytest.mark.parametrize("fmt", ["criteo", "libsvm"])
@pytest.mark.parametrize("labeled", [True, False])
def test_a_short_line_file_whose_lines_end_in_cr_alone_names_them(fmt, labeled, tmp_path):
    """A small file of CR-ended lines reads as one line: its bad line names the CRs, not another tab-separated
    layout (criteo) or a feature token "0" (libsvm: split() takes a CR for a blank). Its libsvm lines without a
    label are all id:value tokens: one line of more features than the schema's fields."""
    path, schema, line = _cr_ended_file(tmp_path, fmt, labeled, lines=3)
    with pytest.raises(ValueError, match=r"cr.txt line 1: (.*; )?it holds carriage returns: are its lines ended by "
                                         r"CR alone\? \(`tr '\\r' '\\n'` converts them\); 1 bad line"):  # fmt: skip
        list(read_batches(path, schema, 64, labeled=labeled))
    path.write_bytes(("\n".join([line] * 3) + "\r\n").encode())  # CRLF or LF ends: no CR inside a line
    assert len(next(read_batches(path, schema, 64, labeled=labeled))) == 3


def test_libsvm_lines_ended_by_cr_alone_are_a_bad_line_even_where_the_schema_takes_all_their_features(tmp_path):
    """Unlabeled libsvm lines ended by CR alone read as one line of every line's tokens: with a field count taken
    from that same file, it would be one good example of them all, silently; a CR inside a line makes it bad."""
    path = tmp_path / "cr.txt"
    path.write_bytes(b"1:1 2:1\r1:1 2:1\r1:1 2:1\r")
    schema = builtin_schema("libsvm", default_table="t", default_dim=4, libsvm_fields=6)
    with pytest.raises(ValueError, match=r"cr.txt line 1: it holds carriage returns: are its lines ended by CR"):
        list(read_batches(path, schema, 64, labeled=False))


@pytest.mark.parametrize("fmt", ["criteo", "csv"])
@pytest.mark.parametrize("scan", [True, False])
def test_blank_labels_reads_a_label_cell_that_is_no_label_as_none_and_counts_it(tmp_path, monkeypatch, fmt, scan):
    """read_batches blank_labels (predict): a line whose label cell holds 2 or maybe is read as its labeled twin, its
    label NaN, counted in stats.unread_labels; a bad line stays bad and is not counted; the compiled scans (csv_fast,
    criteo_fast) and the reference paths agree. Without blank_labels (eval) such lines are bad."""
    from worker.readers import criteo_reader, csv_reader

    monkeypatch.setattr(csv_reader, "CSV_SCAN", scan)
    monkeypatch.setattr(criteo_reader, "CRITEO_SCAN", scan)
    if fmt == "criteo":
        clean, sep, first = random_criteo(tmp_path / "clean.txt", 40)[0], "\t", 0
    else:
        rows = [f"{k % 2},s{k % 5},{k * 0.5},d{k % 3}" for k in range(40)]
        clean, sep, first = tmp_path / "clean.csv", ",", 1
        clean.write_text("click,site,price,device\n" + "\n".join(rows) + "\n")
    lines = clean.read_text().splitlines(keepends=True)
    odd = {first + k: ("2", "maybe", " 7 ")[k % 3] for k in range(3, 40, 4)}  # index in lines: the new label cell
    for i, cell in odd.items():
        lines[i] = cell + sep + lines[i].split(sep, 1)[1]
    changed = tmp_path / f"odd{clean.suffix}"
    changed.write_text("".join(lines))
    bad = tmp_path / f"bad{clean.suffix}"  # a line of too few columns whose label is no label either
    bad.write_text("".join(lines) + f"yes{sep}1{sep}2\n")
    schema = schema_of(clean, fmt)
    want = join(read(clean, fmt, 8, schema=schema))
    for path in (changed, bad):
        stats = ReadStats()
        got = join(read(path, fmt, 8, schema=schema, blank_labels=True, max_bad_lines=5, stats=stats))
        at = [i - first for i in odd]  # the examples changed
        assert np.isnan(got.labels[at]).all() and np.array_equal(np.delete(got.labels, at), np.delete(want.labels, at))
        assert got.line_nos.tolist() == want.line_nos.tolist() and list(got.fields) == list(want.fields)
        for name in want.fields:
            np.testing.assert_array_equal(got.fields[name].ids, want.fields[name].ids)
        np.testing.assert_array_equal(got.dense, want.dense)
        assert stats.unread_labels == len(odd) and stats.bad_lines == (path == bad), stats
        assert stats.first_unread_label == f"{path} line {min(odd) + 1}: label '2'", stats
    stats = ReadStats()
    assert len(join(read(changed, fmt, 8, schema=schema, max_bad_lines=len(odd), stats=stats))) == 40 - len(odd)
    assert stats.bad_lines == len(odd) and stats.unread_labels == 0 and "label '2'" in stats.first_bad


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
@pytest.mark.parametrize("labeled", [True, False])
def test_a_utf8_bom_at_the_start_of_a_file_is_left_out_in_every_format(tmp_path, fmt, labeled):
    """Windows tools start a UTF-8 file with a BOM: each format reads it as the file without it (the oracle), labels,
    field count and all, plain or gzipped, and its first line is no bad line."""
    plain = SAMPLES[fmt](tmp_path)
    schema = schema_of(plain, fmt)
    if not labeled:  # the file without its labels: the first column (criteo's, csv's), libsvm's first token
        lines = plain.read_text().splitlines()
        plain.write_text("\n".join(re.split("[\t, ]", line, maxsplit=1)[1] for line in lines) + "\n")
    bom = plain.with_name("bom_" + plain.name)
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    for path in (bom, gzipped(bom)):
        assert file_has_labels(path, schema) == file_has_labels(plain, schema) == labeled
        if fmt == "libsvm":
            assert libsvm_field_count(path) == libsvm_field_count(plain)
        stats, expected_stats = ReadStats(), ReadStats()
        got = read(path, fmt, 5, schema=schema, labeled=labeled, stats=stats)
        assert_same_batches(got, read(plain, fmt, 5, schema=schema, labeled=labeled, stats=expected_stats))
        assert stats == expected_stats and stats.bad_lines == 0 and sum(map(len, got)) == 23


@pytest.mark.parametrize("scan", [True, False])
def test_a_categorical_cell_hashes_its_raw_bytes_in_every_format_utf8_or_not(tmp_path, monkeypatch, scan):
    """The same cell gives the same raw value in a Criteo file and in a CSV file (the scan's path and the csv
    module's): the blake2b digest of its bytes as they are in the file, those that are not UTF-8 included; so a
    serving system that hashes the bytes it receives computes the ids training used."""
    from worker.readers import csv_reader

    monkeypatch.setattr(csv_reader, "CSV_SCAN", scan)
    cells = [b"caf\xe9", b"\xff\xfe", b"a\x80b\xed\xa0\x80", "café".encode(), b"xyz", b"ff"]
    blake = [int.from_bytes(hashlib.blake2b(c, digest_size=8).digest(), "little") for c in cells[:-1]]
    raw = np.array([*blake, 0xFF], dtype=np.uint64)  # "ff": a hex number
    criteo = tmp_path / "d.txt"
    criteo.write_bytes(b"".join(b"1" + b"\t" * 14 + c + b"\t" * 25 + b"\n" for c in cells))
    csv = tmp_path / "d.csv"
    csv.write_bytes(b"y,c\n" + b"".join(b"1," + c + b"\n" for c in cells))
    (b,) = read(criteo, "criteo", 10)
    np.testing.assert_array_equal(b.fields["C1"].ids, field_ids(NUM_INT_FIELDS, raw))
    (b,) = read(csv, "csv", 10)
    np.testing.assert_array_equal(b.fields["c"].ids, field_ids(0, raw))

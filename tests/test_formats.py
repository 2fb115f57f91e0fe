"""Tests for worker/formats.py: criteo, csv and libsvm files (plain or gzipped) into Batches; worker shares;
bad lines skipped, counted and fatal over the limit; the csv column options; the libsvm field rule."""

import gzip

import numpy as np
import pytest

from worker.criteo import read_criteo, write_criteo
from worker.features import (
    BIAS_ID,
    MISSING_CAT,
    MISSING_INT,
    NUM_CAT_FIELDS,
    NUM_FIELDS,
    NUM_INT_FIELDS,
    Batch,
    cat_values,
    field_ids,
)
from worker.formats import ReadStats, libsvm_field_count, read_batches, wide_field_ids


def read(path, fmt, batch_size=4, **kw):
    return list(read_batches(path, fmt, batch_size, **kw))


def cat(batches, attr):
    return np.concatenate([getattr(b, attr) for b in batches])


def assert_same_batches(a, b):
    assert [len(x) for x in a] == [len(x) for x in b]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.labels, y.labels)
        np.testing.assert_array_equal(x.ids, y.ids)
        assert (x.dense is None) == (y.dense is None)
        if x.dense is not None:
            np.testing.assert_array_equal(x.dense, y.dense)


def random_criteo(path, n, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=n).astype(np.float32)
    ints = rng.integers(-5, 10**6, size=(n, NUM_INT_FIELDS))
    ints[rng.random(ints.shape) < 0.05] = np.iinfo(np.int64).max
    ints[rng.random(ints.shape) < 0.2] = MISSING_INT
    cats = rng.integers(0, 2**32, size=(n, NUM_CAT_FIELDS), dtype=np.uint64)
    cats[rng.random(cats.shape) < 0.2] = rng.integers(0, 2**64 - 1, dtype=np.uint64)
    cats[rng.random(cats.shape) < 0.2] = MISSING_CAT
    write_criteo(path, labels, ints, cats)
    return path


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


SAMPLES = {"criteo": lambda p: random_criteo(p / "train.txt", 23), "csv": sample_csv, "libsvm": sample_libsvm}


# --- criteo ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_criteo_equals_read_criteo_plain_and_gzipped(tmp_path, batch_size):
    path = random_criteo(tmp_path / "train.txt", 300)
    expected = list(read_criteo(path, batch_size))
    assert_same_batches(read(path, "criteo", batch_size), expected)
    assert_same_batches(read(gzipped(path), "criteo", batch_size), expected)


def test_criteo_crlf_and_missing_last_newline(tmp_path):
    path = random_criteo(tmp_path / "train.txt", 10)
    expected = list(read_criteo(path, 3))
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(path.read_bytes().replace(b"\n", b"\r\n")[:-2])
    assert_same_batches(read(crlf, "criteo", 3), expected)


def criteo_with_bad_lines(tmp_path):
    """50 good lines with 4 bad ones inserted: file lines 4, 11, 12 and 30."""
    path = random_criteo(tmp_path / "good.txt", 50)
    lines = path.read_text().splitlines(keepends=True)
    bad = {
        4: "2" + lines[0][1:],  # label 2
        11: "1\tnot enough columns\n",
        12: "\n",
        30: "0\t12\tx3" + lines[0][lines[0].index("\t", 6) :],  # integer feature I2 is 'x3'
    }
    for line_no in sorted(bad):
        lines.insert(line_no - 1, bad[line_no])
    out = tmp_path / "bad.txt"
    out.write_text("".join(lines))
    return path, out


@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_criteo_bad_lines_are_skipped_and_counted(tmp_path, batch_size):
    good, bad = criteo_with_bad_lines(tmp_path)
    stats = ReadStats()
    got = read(bad, "criteo", batch_size, max_bad_lines=4, stats=stats)
    assert (stats.lines_read, stats.bad_lines) == (54, 4)
    assert stats.first_bad == f"{bad} line 4: label '2', expected '0' or '1'"
    assert [len(b) for b in got] == [batch_size] * (50 // batch_size) + ([50 % batch_size] if 50 % batch_size else [])
    assert_same_batches([_join(got)], list(read_criteo(good, 50)))  # the good lines' ids and dense features


def _join(batches):
    """One Batch of all the rows of `batches`."""
    dense = None if batches[0].dense is None else cat(batches, "dense")
    return Batch(labels=cat(batches, "labels"), ids=cat(batches, "ids"), dense=dense)


@pytest.mark.parametrize(
    "limit, message",
    [
        (0, "line 4: label '2', expected '0' or '1'; 1 bad lines, more than --max-bad-lines 0"),
        (1, "line 11: 2 tab-separated columns, expected 40; 2 bad lines, more than --max-bad-lines 1"),
        (2, "line 12: 1 tab-separated columns, expected 40; 3 bad lines, more than --max-bad-lines 2"),
        (3, "line 30: integer feature I2 is 'x3', expected empty or a base-10 integer"),
    ],
)
def test_criteo_too_many_bad_lines_raise_at_the_line_that_crossed_the_limit(tmp_path, limit, message):
    _, bad = criteo_with_bad_lines(tmp_path)
    for batch_size in (1, 64):  # the order of the problems does not depend on how the lines are chunked
        with pytest.raises(ValueError) as e:
            read(bad, "criteo", batch_size, max_bad_lines=limit)
        assert str(e.value).startswith(f"{bad} {message}")
        if limit == 3:
            assert str(e.value).endswith("; 4 bad lines, more than --max-bad-lines 3")


def test_bad_lines_are_counted_by_the_worker_whose_share_they_are_in(tmp_path):
    _, bad = criteo_with_bad_lines(tmp_path)  # bad file lines 4, 12, 30 are worker 1's, 11 worker 0's
    stats = [ReadStats() for _ in range(2)]
    rows = [
        cat(read(bad, "criteo", 8, worker_id=i, num_workers=2, max_bad_lines=9, stats=stats[i]), "ids")
        for i in range(2)
    ]
    assert [(s.lines_read, s.bad_lines) for s in stats] == [(27, 1), (27, 3)]
    assert stats[0].first_bad.startswith(f"{bad} line 11: ")
    assert stats[1].first_bad.startswith(f"{bad} line 4: ")
    assert len(rows[0]) + len(rows[1]) == 50
    with pytest.raises(ValueError, match=r"bad.txt line 12: .*; 2 bad lines, more than --max-bad-lines 1"):
        read(bad, "criteo", 8, worker_id=1, num_workers=2, max_bad_lines=1)


# --- worker shares and gzip, every format -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
def test_gzipped_file_gives_the_same_batches(tmp_path, fmt):
    path = SAMPLES[fmt](tmp_path)
    for size in (1, 5, 100):
        assert_same_batches(read(gzipped(path), fmt, size), read(path, fmt, size))


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
def test_worker_shares_are_disjoint_and_cover_every_line(tmp_path, fmt):
    path = SAMPLES[fmt](tmp_path)
    everything = _join(read(path, fmt, 100))
    assert len(everything) == 23
    for n in (2, 3, 5, 30):
        seen = []
        for i in range(n):
            stats = ReadStats()
            share = read(path, fmt, 4, worker_id=i, num_workers=n, stats=stats)
            assert stats.lines_read == len(range(i, 23, n))
            if share:
                assert all(len(b) == 4 for b in share[:-1])
                part = _join(share)
                np.testing.assert_array_equal(part.labels, everything.labels[i::n])
                np.testing.assert_array_equal(part.ids, everything.ids[i::n])  # same width K for libsvm too
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
    (b,) = read(path, "csv", 10, label_column="click", drop_columns=["id"], numeric_columns=["n2", "price"])
    assert b.labels.tolist() == [1, 0, 1] and b.labels.dtype == np.float32
    assert b.dense.dtype == np.float32
    np.testing.assert_allclose(b.dense, np.log1p([[7, 3.5], [0, 0], [1000, 0]]), rtol=1e-6)
    cats = np.array([["a,b", "phone"], ["multi\nline", "tablet"], ["a,b", ""]])
    expected = np.stack([field_ids(f, cat_values(cats[:, f])) for f in range(2)] + [np.full(3, BIAS_ID)], axis=1)
    np.testing.assert_array_equal(b.ids, expected)
    assert b.ids[2, 1] == field_ids(1, np.array([MISSING_CAT]))[0]  # an empty cell is the field's missing value


def test_csv_defaults_first_column_label_no_numeric(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("y,a,b\n1,x,y\n0,y,x\n")
    (b,) = read(path, "csv", 10)
    assert b.labels.tolist() == [1, 0] and b.dense is None and b.ids.shape == (2, 3)
    assert b.ids[0, 0] != b.ids[1, 1]  # the same string in two fields: two ids


def test_csv_unknown_or_conflicting_columns_are_rejected(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("y,a,b\n1,x,2\n")
    for kw in ({"numeric_columns": ["nope"]}, {"label_column": "z"}, {"drop_columns": ["a", "nope"]}):
        with pytest.raises(ValueError, match=r"are not in the header; its columns are \['y', 'a', 'b'\]"):
            read(path, "csv", **kw)
    with pytest.raises(ValueError, match=r"\['b'\] are both drop and numeric"):
        read(path, "csv", drop_columns=["b"], numeric_columns=["b"])
    with pytest.raises(ValueError, match=r"\['y'\] are both label and numeric"):
        read(path, "csv", numeric_columns=["y"])
    with pytest.raises(ValueError, match="apply to csv only"):
        read_batches(path, "criteo", 4, numeric_columns=["b"])


def test_csv_bad_rows_are_skipped_with_their_line_numbers(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('y,a,n\n1,x,1\n7,x,1\n0,y\n1,"two\nlines",abc\n\n1,z,inf\n0,w,\n')
    stats = ReadStats()
    (b,) = read(path, "csv", 10, numeric_columns=["n"], max_bad_lines=5, stats=stats)
    assert b.labels.tolist() == [1, 0] and b.dense[:, 0].tolist() == [np.log1p(np.float32(1)), 0]
    assert (stats.lines_read, stats.bad_lines) == (7, 5)
    assert stats.first_bad == f"{path} line 3: label '7', expected 0 or 1"
    expected = [
        "line 4: 2 columns, expected 3 as in the header; 2 bad lines",
        "line 5: numeric column 'n' is 'abc', expected a finite number or empty; 3 bad lines",
        "line 7: empty line; 4 bad lines",
        "line 8: numeric column 'n' is 'inf', expected a finite number or empty; 5 bad lines",
    ]
    for limit, message in enumerate(expected, start=1):
        with pytest.raises(ValueError) as e:
            read(path, "csv", 10, numeric_columns=["n"], max_bad_lines=limit)
        assert str(e.value) == f"{path} {message}, more than --max-bad-lines {limit}"


def test_csv_more_than_39_categorical_fields(tmp_path):
    path = tmp_path / "wide.csv"
    width = NUM_FIELDS + 6
    path.write_text("y," + ",".join(f"c{i}" for i in range(width)) + "\n1," + ",".join(["0"] * width) + "\n")
    (b,) = read(path, "csv")
    assert b.ids.shape == (1, width + 1) and len(set(b.ids[0].tolist())) == width + 1
    assert BIAS_ID not in b.ids[0, :-1]
    assert b.ids[0, 5] == field_ids(5, np.zeros(1, np.uint64))[0]
    np.testing.assert_array_equal(wide_field_ids(np.zeros((1, NUM_FIELDS), np.uint64))[0], b.ids[0, :NUM_FIELDS])


# --- libsvm -------------------------------------------------------------------------------------------------


def test_libsvm_labels_fields_missing_and_padding(tmp_path):
    path = tmp_path / "d.svm"
    path.write_text("1 3:1 7:1 9:1\n-1 3:1 8:0.5\n+1 4:1 7:0 9:1\n0 1:1 2:1 3:1 4:1\nx 1:1\n0\n1.0 5:1 6:1 7:1\n")
    stats = ReadStats()
    (b,) = read(path, "libsvm", 10, max_bad_lines=2, stats=stats)
    assert b.labels.tolist() == [1, 0, 1, 0, 1] and b.dense is None
    assert (stats.lines_read, stats.bad_lines) == (7, 2)
    assert stats.first_bad == f"{path} line 4: 4 features, more than 3 fields"
    raw = np.array([[3, 7, 9], [3, 8, MISSING_CAT], [4, MISSING_CAT, 9], [MISSING_CAT] * 3, [5, 6, 7]], dtype=np.uint64)
    expected = np.stack([field_ids(k, raw[:, k]) for k in range(3)] + [np.full(5, BIAS_ID)], axis=1)
    np.testing.assert_array_equal(b.ids, expected)
    with pytest.raises(ValueError) as e:
        read(path, "libsvm", 10, max_bad_lines=1)
    assert (
        str(e.value) == f"{path} line 5: label 'x', expected 0, 1, -1 or +1; 2 bad lines, more than --max-bad-lines 1"
    )


def test_libsvm_width_is_the_files_not_the_shares_and_can_be_given(tmp_path):
    path = tmp_path / "d.svm"
    path.write_text("bad\n1 1:1 2:1\n0 1:1\n1 1:1 2:1 3:1\n")
    assert libsvm_field_count(path) == 2
    stats = ReadStats()
    (b,) = read(path, "libsvm", worker_id=0, num_workers=2, max_bad_lines=5, stats=stats)
    assert b.ids.shape == (1, 3) and stats.bad_lines == 1  # the share's only good line has 1 feature: K is still 2
    (b,) = read(path, "libsvm", worker_id=1, num_workers=2, max_bad_lines=5, stats=stats)
    assert b.ids.shape == (1, 3) and stats.bad_lines == 2  # line 4 has 3 features
    (b,) = read(path, "libsvm", libsvm_fields=5, max_bad_lines=1)
    assert b.ids.shape == (3, 6)


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
    assert str(e.value) == f"{path} line 2: {problem}; 1 bad lines, more than --max-bad-lines 0"


# --- arguments and batch sizes ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm"])
@pytest.mark.parametrize("batch_size", [1, 4, 23, 24])
def test_batch_sizes(tmp_path, fmt, batch_size):
    batches = read(SAMPLES[fmt](tmp_path), fmt, batch_size)
    sizes = [len(b) for b in batches]
    assert sum(sizes) == 23 and all(s == batch_size for s in sizes[:-1]) and 1 <= sizes[-1] <= batch_size
    assert all(
        b.ids.dtype == np.uint64 and b.labels.dtype == np.float32 and (b.ids[:, -1] == BIAS_ID).all() for b in batches
    )


def test_bad_arguments(tmp_path):
    path = tmp_path / "x.txt"
    for args, kw in [
        (("tsv", 4), {}),
        (("criteo", 0), {}),
        (("criteo", 4), {"worker_id": 2, "num_workers": 2}),
        (("criteo", 4), {"max_bad_lines": -1}),
        (("criteo", 4), {"libsvm_fields": 3}),
    ]:
        with pytest.raises(ValueError):
            read_batches(path, *args, **kw)  # raised at the call, before any file is opened


def test_empty_files(tmp_path):
    for fmt in ("criteo", "csv", "libsvm"):
        path = tmp_path / f"empty.{fmt}"
        path.write_text("")
        assert read(path, fmt) == []
    header_only = tmp_path / "h.csv"
    header_only.write_text("y,a\n")
    assert read(header_only, "csv") == []

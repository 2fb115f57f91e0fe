"""Tests for the time transforms (worker/timestamps.py, the schema's yymmddhh_*, unix_* and iso_*): hours and weekdays
against Python's datetime, bad times refused as bad lines, the grammar, `ps-worker schema` writing them only for
a column named like a time whose every value is one, the `columns` line, and a run whose train, eval and predict
read a file through them alike."""

from __future__ import annotations

import datetime as dt
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from tests.test_predict import predict, read_out
from worker import column_infer
from worker.__main__ import main
from worker.encode import encode_examples
from worker.features import MISSING_CAT, space_ids
from worker.formats import read_batches, read_csv_header
from worker.metrics import auc
from worker.schema import Schema, TableSchema
from worker.schema_builtin import resolve_schema
from worker.schema_columns import Column
from worker.schema_file import load_schema, schema_from_text
from worker.schema_infer import infer_schema_text
from worker.schema_notes import columns_line
from worker.served import evaluate_servers
from worker.timestamps import iso_parts, time_format, time_parts, untold_time
from worker.train import train
from worker.train_config import TrainConfig

UTC = dt.UTC


def oracle(text: str, fmt: str) -> tuple[int, int] | None:
    """(hour, weekday) of a time cell by datetime, or None where it is no time of the format."""
    try:
        if fmt == "iso":
            return iso_oracle(text)
        if fmt == "unix":
            t = dt.datetime.fromtimestamp(int(text), UTC)
        else:
            t = dt.datetime(2000 + int(text[:2]), int(text[2:4]), int(text[4:6]), int(text[6:8]))
    except ValueError:
        return None
    return t.hour, t.weekday()


def iso_oracle(text: str) -> tuple[int, int] | None:
    """(hour, weekday) of an iso cell by datetime.fromisoformat, on its own grammar's cells only: the date, a T or a
    space, two digits of hour, then :MM[:SS[.f]] and a zone (Z, +HH, +HHMM, +HH:MM), the hour as written."""
    import re

    text = text.strip()
    form = r"\d{4}-\d\d-\d\d[T ]\d\d(:\d\d(:\d\d(\.\d+)?)?)?(Z|[+-]\d\d(:?\d\d)?)?"
    if not re.fullmatch(form, text):
        return None
    clock = re.sub(r"(Z|[+-]\d\d(:?\d\d)?)$", "", text[10:]) if len(text) > 13 else text[10:]
    parts = (clock[1:].split(":") + ["00", "00"])[:3]
    if int(parts[1]) > 59 or float(parts[2]) >= 61:
        return None
    try:
        t = dt.datetime(int(text[:4]), int(text[5:7]), int(text[8:10]), int(parts[0]))
    except ValueError:
        return None
    return t.hour, t.weekday()


def iso_cells(n: int, seed: int) -> list[str]:
    """n cells of dates and times, mostly valid (leap days among them), in the grammar's forms; some past a month's
    days, 23 hours or 59 minutes, or of another form."""
    rng = np.random.default_rng(seed)
    tails = ["", ":05", ":05:59", ":05:60", ":05:09.123", "Z", ":05:09Z", "+05:30", "-0800", "+02", ":61", ":5",
             ":05:09.", " ", "x", "+5", "GMT"]  # fmt: skip
    cells = [f"{rng.integers(1900, 2100)}-{rng.integers(1, 14):02d}-{rng.integers(1, 32):02d}"
             f"{rng.choice(['T', ' ', '_'])}{rng.integers(0, 25):02d}{rng.choice(tails)}" for _ in range(n)]  # fmt: skip
    return cells + ["2024-02-29 12", "2023-02-29 12", "2000-02-29T00:00:00", "1900-02-29T00", " 2014-10-21 07:30 ",
                    "2014-10-21", "2014-10-21 7:30", "14-10-21 07:30", "2014/10/21 07:30", "", "NA"]  # fmt: skip


def yymmddhh_cells(n: int, seed: int) -> list[str]:
    """n cells of 8 digits, mostly valid times (leap days among them), some past a month's days or 23 hours."""
    rng = np.random.default_rng(seed)
    cells = [f"{rng.integers(0, 100):02d}{rng.integers(1, 13):02d}{rng.integers(1, 32):02d}{rng.integers(0, 25):02d}"
             for _ in range(n)]  # fmt: skip
    return cells + ["00022900", "01022900", "96022912", "14102100", "14103123", "14113100", "14000100", "14011300"]


def test_time_parts_match_datetime():
    cells = yymmddhh_cells(3000, 0)
    hour, weekday, ok = time_parts(np.array(cells, dtype=np.float64), "yymmddhh")
    expected = [oracle(c, "yymmddhh") for c in cells]
    assert ok.tolist() == [e is not None for e in expected] and 0 < ok.mean() < 1
    assert [(h, w) for h, w, e in zip(hour.tolist(), weekday.tolist(), expected) if e] == [e for e in expected if e]
    seconds = np.random.default_rng(1).integers(0, 10**10, 3000)
    hour, weekday, ok = time_parts(seconds.astype(np.float64), "unix")
    assert ok.all() and list(zip(hour.tolist(), weekday.tolist())) == [oracle(str(s), "unix") for s in seconds]
    assert not time_parts(np.array([-1.0, 1.5, 1e10, 1414000000000.0]), "unix")[2].any()  # the last in ms
    assert time_parts(np.array([9999999999.0]), "unix")[2].all()
    assert not time_parts(np.array([-14102100.0, 14102100.5, 114102100.0]), "yymmddhh")[2].any()


@pytest.mark.parametrize("kind", ["U", "S"])
def test_iso_parts_match_datetime(kind, monkeypatch):
    monkeypatch.delattr(np.strings, "slice", raising=False)  # slice is NumPy 2.3's; pyproject.toml asks for 2.1
    cells = iso_cells(3000, 3)
    hour, weekday, ok, missing = iso_parts(np.array(cells).astype(kind))
    expected = [iso_oracle(c) for c in cells]
    assert ok.tolist() == [e is not None for e in expected] and 0.2 < ok.mean() < 0.8
    assert [(h, w) for h, w, e in zip(hour.tolist(), weekday.tolist(), expected) if e] == [e for e in expected if e]
    assert missing.tolist() == [c in ("", "NA") for c in cells]
    assert not hour[~ok].any() and not weekday[~ok].any()
    short = iso_parts(np.array(["2024-02-29 12", "2023-02-29 12", "NA"]).astype(kind))  # no cell past the head
    assert short[2].tolist() == [True, False, False] and short[0].tolist() == [12, 0, 0]


def test_encode_gives_each_hour_and_weekday_its_id_and_refuses_a_bad_time():
    fields = {
        part: Column(part, "t", "numeric", "x", part, transform=f"yymmddhh_{part}") for part in ("hour", "weekday")
    }
    schema = Schema("csv", ",", "y", tuple(fields.values()), {"x": TableSchema(4)}, "x")
    cells = yymmddhh_cells(500, 2) + ["", "NA", "abc"]
    out = encode_examples(schema, np.zeros(len(cells), np.float32), {"t": np.array(cells)})
    expected = [oracle(c, "yymmddhh") if c.isdigit() else c for c in cells]
    bad = [i for i, e in enumerate(expected) if e is None or e == "abc"]
    assert out.bad.tolist() == bad
    assert out.problems[0] == (f"time column 't' is {cells[bad[0]]!r}, expected a time YYMMDDHH (14102100: "
                               "2014-10-21, hour 00; a month 01-12, a day of it, an hour 00-23) or empty")  # fmt: skip
    good = [e for i, e in enumerate(expected) if i not in bad]
    for k, part in enumerate(("hour", "weekday")):
        values = np.array([MISSING_CAT if e in ("", "NA") else e[k] for e in good], dtype=np.uint64)
        space = schema.id_spaces()[part]
        assert out.batch.fields[part].ids.tolist() == space_ids(space, values).tolist()


def test_encode_reads_iso_times_from_their_text_and_refuses_a_bad_one():
    """A column of dates and times (iso_*): each example's hour and weekday as datetime reads them, a missing cell
    its own id, and a cell that is no date and time a bad line naming the column and the format, in both the
    scan's bytes cells and str cells."""
    fields = {part: Column(part, "t", "numeric", "x", part, transform=f"iso_{part}") for part in ("hour", "weekday")}
    schema = Schema("csv", ",", "y", tuple(fields.values()), {"x": TableSchema(4)}, "x")
    cells = iso_cells(500, 4)
    expected = [iso_oracle(c) if c not in ("", "NA") else c for c in cells]
    bad = [i for i, e in enumerate(expected) if e is None]
    for kind in ("U", "S"):
        out = encode_examples(schema, np.zeros(len(cells), np.float32), {"t": np.array(cells).astype(kind)})
        assert out.bad.tolist() == bad
        assert out.problems[0] == (f"time column 't' is {cells[bad[0]]!r}, expected a date and time YYYY-MM-DD "
                                   "HH:MM:SS or YYYY-MM-DDTHH:MM:SS (minutes, seconds and a zone optional; a valid "
                                   "date, an hour 00-23) or empty")  # fmt: skip
        good = [e for i, e in enumerate(expected) if i not in bad]
        for k, part in enumerate(("hour", "weekday")):
            values = np.array([MISSING_CAT if e in ("", "NA") else e[k] for e in good], dtype=np.uint64)
            assert out.batch.fields[part].ids.tolist() == space_ids(schema.id_spaces()[part], values).tolist()


def test_a_unix_time_in_milliseconds_is_a_bad_line():
    """13 digits in a column of unix seconds (a time in milliseconds) would be a time 44,000 years on, its hour
    and weekday of no use: refused as a bad line, as no time."""
    schema = Schema("csv", ",", "y", (Column("h", "ts", "numeric", "x", "h", transform="unix_hour"),),
                    {"x": TableSchema(4)}, "x")  # fmt: skip
    cells = np.array(["1414000000", "1414000000000", ""])
    out = encode_examples(schema, np.zeros(3, np.float32), {"ts": cells})
    assert out.bad.tolist() == [1] and out.problems == [
        "time column 'ts' is '1414000000000', expected a time in unix seconds (an integer from 0 to 9999999999: "
        "not milliseconds) or empty"]  # fmt: skip
    space = schema.id_spaces()["h"]
    assert out.batch.fields["h"].ids.tolist() == space_ids(space, np.array([17, MISSING_CAT], np.uint64)).tolist()


def test_the_grammar_reads_the_time_transforms_as_sparse_and_round_trips(tmp_path):
    text = ('label = "click"\n[[columns]]\nname = "h"\nsource = "ts"\nkind = "numeric"\ntransform = "unix_hour"\n'
            'table = "time"\n[[columns]]\nname = "w"\nsource = "ts"\nkind = "numeric"\ntransform = "unix_weekday"\n')  # fmt: skip
    s = schema_from_text(text, "s.toml", default_table="time", default_dim=4)
    assert [(c.name, c.table, c.is_sparse) for c in s.columns] == [("h", "time", True), ("w", "time", True)]
    (tmp_path / "s.toml").write_text(s.to_toml())
    assert load_schema(str(tmp_path / "s.toml"), default_table="time", default_dim=4) == s
    with pytest.raises(ValueError, match="boundaries does not apply to a numeric column with transform unix_hour"):
        schema_from_text(text.replace('"unix_hour"', '"unix_hour"\nboundaries = [1.0]'), "s", default_table="t",
                         default_dim=4)  # fmt: skip
    with pytest.raises(ValueError, match="transform 'unix_minute' is unknown"):
        schema_from_text(text.replace("unix_hour", "unix_minute"), "s", default_table="t", default_dim=4)


@pytest.mark.parametrize(
    "name, cells, fmt",
    [
        ("hour", ["14102100", "14102223", ""], "yymmddhh"),
        ("click_time", ["14102100", "16022905"], "yymmddhh"),
        ("eventTs", ["1414000000", "1414003600"], "unix"),
        ("hour", ["14102100", "NA", " ? ", "null"], "yymmddhh"),  # missing, as encode reads them
        ("ts", ["1414000000", "nan"], "unix"),
        ("ts", ["NA", ""], None),
        ("timestamp", ["1414000000", "14102100"], None),  # two formats
        ("hour", ["14102100", "14133100"], None),  # no 31st of October
        ("hour", ["14102100", "14102124"], None),  # no hour 24
        ("hour", ["14102100", "1410210"], None),  # 7 digits
        ("id", ["14102100", "14102101"], None),  # not named like a time
        ("hours", ["14102100", "14102101"], None),
        ("ts", ["0414000000", "1414000000"], None),  # 10 digits, 0 first
        ("ts", ["141400000", "1414000000"], None),
        ("time", ["", " "], None),
        ("date", ["20120301", "20120323"], None),  # dates YYYYMMDD, YYMMDDHH too: their 24th would be no time
        ("date", ["20120301", "20120323", "20120300"], "yymmddhh"),  # hour 00: no date
        ("event_time", ["2024-01-05 13:22:00", "NA", "2024-01-06T00:00:00Z"], "iso"),
        ("created", ["2024-01-05 13:22", "2024-01-05 13:22:00.5+01:00"], "iso"),  # the text says it: any name
        ("created", ["2024-01-05 13:22", "2024-01-05"], None),  # a date alone has no hour
        ("created", ["2024-01-05 13:22", "2024-02-30 13:22"], None),  # no 30th of February
        ("time", ["05/01/2024 13:22", "06/01/2024 13:22"], None),  # day or month first: no telling
    ],
)
def test_a_time_is_told_by_its_name_and_every_value(name, cells, fmt):
    assert time_format(name, cells) == fmt


def test_a_long_cell_costs_the_time_test_its_own_size_not_the_column_padded_to_it(tmp_path, capsys):
    """One long cell (a blob, a long list) among a sample's: time_format tells it no time by its text, without the
    column as a numpy array of cells each padded to it (so padded, 1,000 cells with one of 8 MB are 31 GiB: a
    MemoryError out of `ps-worker train` and `ps-worker schema`)."""
    cells = ["2024-01-05 13:22:00"] * 199 + ["x" * 50_000]
    path = tmp_path / "d.csv"
    rows = [f"{i % 2},w{i % 7},{i}" for i in range(200)]
    rows[100] = "1," + "x" * 50_000 + ",5"
    path.write_text("y,c,n\n" + "\n".join(rows) + "\n")
    peaks = []
    tracemalloc.start()
    try:
        for run in (
            lambda: time_format("created", cells),
            lambda: main(["schema", "--data", str(path)]),
            lambda: resolve_schema(
                str(path),
                schema_path=None,
                fmt="auto",
                label_column=None,
                drop_columns=(),
                numeric_columns=(),
                libsvm_fields=None,
                default_table="t",
                default_dim=4,
            ),
        ):
            tracemalloc.reset_peak()
            peaks.append((run(), tracemalloc.get_traced_memory()[1]))
    finally:
        tracemalloc.stop()
    assert peaks[0][0] is None and peaks[1][0] == 0 and 'name = "c"' in capsys.readouterr().out
    assert all(peak < 8 << 20 for _, peak in peaks), peaks  # padded: 200 x 50,000 x 4 bytes, 40 MB, a few times


@pytest.mark.parametrize(
    "name, cells, form",
    [
        ("ts", ["1704067200123", "NA", "1704153600000"], "unix_ms"),
        ("eventTime", ["1704067200123"], "unix_ms"),
        ("ts", ["1704067200123", "1704067200"], None),  # seconds and milliseconds
        ("ts", ["0704067200123"], None),  # 0 first
        ("user", ["1704067200123", "1704153600000"], None),  # not named like a time: an id of 13 digits
        ("date", ["20120301", "20120323"], "yyyymmdd"),
        ("date", ["20120301", "19691231"], None),  # before 1970
        ("date", ["20120301", "20120300"], None),  # time_format's yymmddhh
        ("date", ["20120301", "20120230"], None),  # no 30th of February
        ("hour", ["1414000000"], None),  # unix seconds: time_format's
        ("ts", ["", "NA"], None),
    ],
)
def test_a_time_no_transform_reads_is_told_by_its_name_and_every_value(name, cells, form):
    assert untold_time(name, cells) == form


def test_a_column_is_told_a_time_no_transform_reads_once(monkeypatch):
    calls = []
    monkeypatch.setattr(column_infer, "untold_time", lambda *a: calls.append(a) or untold_time(*a))
    comment = column_infer.infer_column("event_ts", "event_ts", ["1414000000123", "1414000360456"])[1]
    assert "milliseconds" in comment and len(calls) == 1, (comment, calls)


def test_ps_worker_schema_says_how_to_read_unix_milliseconds_and_dates_yyyymmdd(tmp_path):
    """A column of unix milliseconds, and one of dates YYYYMMDD, named like times: their comments say what they are
    and what to do (no transform reads them, and their values are new each later day); an id of 13 digits is no
    time."""
    data = tmp_path / "d.csv"
    t0 = int(dt.datetime(2024, 1, 1, tzinfo=UTC).timestamp())
    rows = [(t0 + 3607 * i, i % 2) for i in range(200)]
    data.write_text("click,ts,date,user\n" + "".join(
        f"{y},{t * 1000 + i % 1000},{dt.datetime.fromtimestamp(t, UTC):%Y%m%d},{t * 1000 + i}\n"
        for i, (t, y) in enumerate(rows)))  # fmt: skip
    comments: dict[str, str] = {}  # each column's first comment, its entry's
    for line in infer_schema_text(str(data)).splitlines():
        if line.startswith("# '"):
            comments.setdefault(line.split("'")[1], line)
    assert "; times in unix milliseconds: as a number or as ids, each later day's values are new; write them in " \
        "unix seconds (divided by 1000) and infer the schema again: it then reads their hour of day and weekday" \
        in comments["ts"]  # fmt: skip
    assert "; dates YYYYMMDD: as a number or as ids, each later day's values are new; derive columns such as the " \
        "weekday from them, and delete this column's entries" in comments["date"]  # fmt: skip
    assert "milliseconds" not in comments["user"] and "YYYYMMDD" not in comments["user"]


def write_log(path, rows: int, seed: int, day0: int, days: int, iso: bool = False) -> None:
    """An Avazu-like file: click, hour (YYMMDDHH from 2014-10-21 + day0, over days days; iso: a column `when` of
    dates and times YYYY-MM-DD HH:MM:SS instead), site; clicks far more likely from 18h to 22h."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        f.write(f"click,{'when' if iso else 'hour'},site\n")
        for _ in range(rows):
            day, hour = dt.date(2014, 10, 21) + dt.timedelta(days=int(day0 + rng.integers(days))), rng.integers(24)
            click = int(rng.random() < (0.6 if 18 <= hour <= 22 else 0.15))
            when = f"{day:%Y-%m-%d} {hour:02d}:{rng.integers(60):02d}:{rng.integers(60):02d}" if iso else \
                f"{day:%y%m%d}{hour:02d}"  # fmt: skip
            f.write(f"{click},{when},s{rng.integers(5)}\n")


def test_ps_worker_schema_writes_the_hour_and_weekday_of_a_time_column_and_the_run_says_so(tmp_path, capsys):
    data = tmp_path / "train.csv"
    write_log(data, 300, seed=1, day0=0, days=3)
    assert main(["schema", "--data", str(data), "--out", str(tmp_path / "s.toml")]) == 0
    text = (tmp_path / "s.toml").read_text()
    assert "# 'hour': times, YYMMDDHH" in text and "the time itself is no feature" in text
    s = load_schema(str(tmp_path / "s.toml"), default_table="t", default_dim=4)
    assert [(c.name, c.source, c.transform) for c in s.columns if c.source == "hour"] == [
        ("hour_hour_of_day", "hour", "yymmddhh_hour"), ("hour_weekday", "hour", "yymmddhh_weekday")]  # fmt: skip
    line = columns_line(s, read_csv_header(str(data), ","))
    assert "2 hour of day or weekday of a time, each an id: hour_hour_of_day, hour_weekday" in line, line
    assert "time hour read as hour of day and weekday only, not as a number" in line, line
    (tmp_path / "n.csv").write_text(data.read_text().replace("click,hour,", "click,stamp,"))  # not named so
    assert "yymmddhh" not in infer_schema_text(str(tmp_path / "n.csv"))
    lines = data.read_text().splitlines()
    (tmp_path / "bad.csv").write_text("\n".join([*lines[:100], "1,14103124,s1", *lines[100:]]) + "\n")  # hour 24
    assert "yymmddhh" not in infer_schema_text(str(tmp_path / "bad.csv"))


def _train_eval_predict(addresses, tmp_path, train_path, test_path) -> dict:
    """Trains lr through tmp_path/s.toml on train_path, asserts eval of test_path learnt the hour (AUC > 0.65) and
    that predict gives eval's AUC; returns predict's scored columns."""
    run = TrainConfig(servers=tuple(addresses), data=str(train_path), schema=str(tmp_path / "s.toml"), model="lr",
                      progress=False, server_timeout_s=0)  # fmt: skip
    train(run)
    figures = evaluate_servers(replace(run, eval_data=str(test_path)))
    assert figures["eval_auc"] > 0.65, figures  # the hour alone: 0.70 at best (of these click rates)
    flags = ["--data", str(train_path), "--schema", str(tmp_path / "s.toml"), "--model", "lr"]
    assert predict(addresses[0], tmp_path / "p.out", *flags, "--predict-data", str(test_path)) == 0
    _, scored = read_out(tmp_path / "p.out")
    assert auc(scored["label"], scored["probability"]) == pytest.approx(figures["eval_auc"], abs=1e-6)
    return scored


def test_train_eval_and_predict_read_the_hour_of_day_alike_and_learn_it(servers, tmp_path):
    """Trained through an inferred schema with the hour of day on one week, eval of the next days' file scores
    well (their YYMMDDHH values never seen in training), and predict gives eval's AUC."""
    addresses, _ = servers(1)
    train_path, test_path = tmp_path / "train.csv", tmp_path / "test.csv"
    write_log(train_path, 3000, seed=1, day0=0, days=7)
    write_log(test_path, 1000, seed=2, day0=7, days=2)
    assert main(["schema", "--data", str(train_path), "--out", str(tmp_path / "s.toml")]) == 0
    schema = load_schema(str(tmp_path / "s.toml"), default_table="t", default_dim=4)
    trained = {b for batch in read_batches(str(train_path), schema, 512) for b in batch.fields["hour_hour_of_day"].ids}
    held = {b for batch in read_batches(str(test_path), schema, 512) for b in batch.fields["hour_hour_of_day"].ids}
    assert len(held) == 24 and held <= trained  # every hour of the later days has its row
    scored = _train_eval_predict(addresses, tmp_path, train_path, test_path)
    hours = [int(line.split(",")[1][-2:]) for line in test_path.read_text().splitlines()[1:]]
    evening = np.array([18 <= h <= 22 for h in hours])
    assert scored["probability"][evening].mean() > scored["probability"][~evening].mean() + 0.3


def test_a_column_of_dates_and_times_trains_its_hour_of_day_and_eval_and_predict_read_it_alike(servers, tmp_path):
    """A column of dates and times (not named like a time): `ps-worker schema` reads its hour of day and weekday
    (iso_*); trained on one week, eval of the next days' file scores well, and predict gives eval's AUC."""
    addresses, _ = servers(1)
    train_path, test_path = tmp_path / "train.csv", tmp_path / "test.csv"
    write_log(train_path, 3000, seed=1, day0=0, days=7, iso=True)
    write_log(test_path, 1000, seed=2, day0=7, days=2, iso=True)
    assert main(["schema", "--data", str(train_path), "--out", str(tmp_path / "s.toml")]) == 0
    assert "# 'when': times, YYYY-MM-DD HH:MM:SS (the hour as written" in (tmp_path / "s.toml").read_text()
    schema = load_schema(str(tmp_path / "s.toml"), default_table="t", default_dim=4)
    assert [(c.name, c.transform) for c in schema.columns if c.source == "when"] == [
        ("when_hour_of_day", "iso_hour"), ("when_weekday", "iso_weekday")]  # fmt: skip
    _train_eval_predict(addresses, tmp_path, train_path, test_path)


def test_the_builtin_csv_schema_warns_of_a_time_column_read_as_ids(tmp_path, caplog):
    data = tmp_path / "train.csv"
    write_log(data, 300, seed=1, day0=0, days=3)
    with caplog.at_level("WARNING", logger="worker.schema_hints"):
        resolve_schema(str(data), schema_path=None, fmt="auto", label_column=None, drop_columns=(),
                       numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4)  # fmt: skip
    (said,) = [r.getMessage() for r in caplog.records if r.name == "worker.schema_hints"]
    assert said == (f"{data}: column 'hour' holds times (a sample of 300 rows): the built-in csv schema reads each "
                    "value as an id of its own, and a later day's values are ids never trained. `ps-worker schema "
                    f"--data {data} > schema.toml`, then --schema schema.toml, reads their hour of day and weekday")  # fmt: skip

"""Tests for worker/schema.py and the modules beside it: loading the grammar (worker/schema_file.py, every
mistake named with its file and key), the built-in schemas, resolve_schema, stats, the TOML round trip and the
schema inferred from a sample."""

import dataclasses
import math

import numpy as np
import pytest

from ps.config import OptimizerConfig
from worker.column_infer import infer_column
from worker.features import NUM_CAT_FIELDS, NUM_INT_FIELDS
from worker.formats import read_batches
from worker.models.spec import BIAS_FIELD, FieldSpec
from worker.schema import TableSchema
from worker.schema_builtin import builtin_schema, resolve_schema
from worker.schema_columns import CRITEO_COLUMNS, Column, libsvm_column
from worker.schema_file import load_schema, schema_from_text
from worker.schema_infer import infer_schema, infer_schema_text

EXAMPLE = """
format = "csv"
delimiter = ";"
label = "click"
bias_table = "item"

[tables.item]
dim = 16
optimizer = { name = "adagrad", learning_rate = 0.02 }
weight_bound = 10.0

[[columns]]
name = "clicked"
source = "clicked_items"
kind = "multi_hot"
table = "item"
id_space = "item"
separator = "|"
pooling = "mean"
max_length = 50

[[columns]]
name = "item"
kind = "categorical"
table = "item"

[[columns]]
name = "user"
kind = "categorical"
ids = "raw"

[[columns]]
name = "price"
kind = "numeric"
transform = "standardize"

[[columns]]
name = "age"
kind = "numeric"
transform = "bucketize"
boundaries = [18, 30.5, 65]

[[columns]]
name = "ratings"
kind = "weighted"
separator = ","
"""


def load(tmp_path, text, name="s.toml", default_table="fm", default_dim=8):
    path = tmp_path / name
    path.write_text(text)
    return load_schema(str(path), default_table=default_table, default_dim=default_dim)


def test_the_grammar_example_loads(tmp_path):
    s = load(tmp_path, EXAMPLE)
    assert (s.format, s.delimiter, s.label, s.bias_table) == ("csv", ";", "click", "item")
    clicked, item, user, price, age, ratings = s.columns
    assert clicked == Column("clicked", "clicked_items", "multi_hot", "item", "item", pooling="mean", max_length=50)
    assert item == Column("item", "item", "categorical", "item", "item")
    assert user == Column("user", "user", "categorical", "fm", None, ids="raw")
    assert price == Column("price", "price", "numeric", transform="standardize")
    assert age == Column("age", "age", "numeric", "fm", "age", transform="bucketize", boundaries=(18.0, 30.5, 65.0))
    assert ratings.kind == "weighted" and ratings.separator == "," and ratings.table == "fm"
    assert [c.name for c in s.sparse_columns()] == ["clicked", "item", "user", "age", "ratings"]
    assert [c.name for c in s.dense_columns()] == ["price"]
    assert s.id_spaces() == {"item": 0, "age": 1, "ratings": 2}  # clicked and item share one space; user is raw
    assert s.model_fields() == (
        FieldSpec("clicked", "item", 16, "mean"),
        FieldSpec("item", "item", 16),
        FieldSpec("user", "fm", 8),
        FieldSpec("age", "fm", 8),
        FieldSpec("ratings", "fm", 8),
        FieldSpec(BIAS_FIELD, "item", 16),
    )
    assert s.table_dims() == {"item": 16, "fm": 8}
    assert s.tables == {"item": TableSchema(16, s.tables["item"].overrides), "fm": TableSchema(8)}
    overrides = s.table_overrides()
    assert overrides["fm"] == {"name": "fm"}
    assert overrides["item"] == {"name": "item", "optimizer": OptimizerConfig("adagrad", 0.02), "weight_bound": 10.0}
    assert s.needs_stats()


def test_defaults_the_first_column_label_and_the_first_sparse_table(tmp_path):
    s = load(tmp_path, '[tables.b]\ndim = 3\n[[columns]]\nname = "n"\nkind = "numeric"\ntransform = "log"\n'
             '[[columns]]\nname = "c"\nkind = "categorical"\ntable = "b"\n')  # fmt: skip
    assert (s.format, s.delimiter, s.label, s.bias_table) == ("csv", ",", None, "b")
    assert s.table_dims() == {"b": 3}
    s = load(tmp_path, '[[columns]]\nname = "n"\nkind = "numeric"\ntransform = "none"\n', default_dim=5)
    assert s.bias_table == "fm" and s.model_fields() == (FieldSpec(BIAS_FIELD, "fm", 5),)
    s = load(tmp_path, '[tables.fm]\ndim = 2\n[[columns]]\nname = "c"\nkind = "categorical"\n', default_dim=5)
    assert s.table_dims() == {"fm": 2}  # the default table declared: its section's dim


COLUMN = '[[columns]]\nname = "a"\nkind = "categorical"\n'


@pytest.mark.parametrize(
    "text, message",
    [
        ("colums = 3\n" + COLUMN, "unknown key 'colums'"),
        ('format = "tsv"\n' + COLUMN, "format 'tsv' is unknown; expected one of"),
        ('format = "criteo"\ndelimiter = ";"\n' + COLUMN, "delimiter is for csv only"),
        ('delimiter = "ab"\n' + COLUMN, "delimiter 'ab', expected one character"),
        ('format = "criteo"\nlabel = "y"\n[[columns]]\nname = "C1"\nkind = "categorical"\n', "label 'y'"),
        ('label = "y"\n', r"no \[\[columns\]\]"),
        ("columns = 3\n", "columns is 3, expected a list"),
        ("[[columns]]\nkind = 'categorical'\n", r"columns\[0\]: name is missing"),
        (COLUMN + "pooling = 'mean'\n", r"column 'a' \(categorical\): unknown key 'pooling'"),
        ("[[columns]]\nname = 'a'\n", "column 'a': kind is missing"),
        ("[[columns]]\nname = 'a'\nkind = 'dense'\n", "column 'a': kind 'dense' is unknown"),
        ("[[columns]]\nname = 'a'\nkind = 'multi_hot'\npooling = 'avg'\n", "column 'a': pooling 'avg' is unknown"),
        ("[[columns]]\nname = 'a'\nkind = 'numeric'\n", "column 'a': transform is missing"),
        ("[[columns]]\nname = 'a'\nkind = 'numeric'\ntransform = 'sqrt'\n", "transform 'sqrt' is unknown"),
        ("[[columns]]\nname = 'a'\nkind = 'numeric'\ntransform = 'bucketize'\n", "column 'a': boundaries is missing"),
        (
            "[[columns]]\nname = 'a'\nkind = 'numeric'\ntransform = 'bucketize'\nboundaries = [3, 1]\n",
            r"column 'a': boundaries \[3, 1\], expected finite numbers in increasing order",
        ),
        (
            "[[columns]]\nname = 'a'\nkind = 'numeric'\ntransform = 'bucketize'\nboundaries = [1, 1]\n",
            "expected finite numbers in increasing order",
        ),
        (
            "[[columns]]\nname = 'a'\nkind = 'numeric'\ntransform = 'log'\nboundaries = [1]\n",
            "boundaries does not apply",
        ),
        ("[[columns]]\nname = 'a'\nkind = 'numeric'\ntransform = 'log'\ntable = 't'\n", "table does not apply"),
        ("[[columns]]\nname = 'a'\nkind = 'numeric'\ntransform = 'standardize'\nstd = 0\n", "std 0.0, expected > 0"),
        ("[[columns]]\nname = 'a'\nkind = 'numeric'\ntransform = 'standardize'\nmean = 'x'\n", "mean is 'x'"),
        (COLUMN + "table = 'item'\n", "column 'a': table 'item' is not declared"),
        (COLUMN + "table = 'a b'\n", r"column 'a': table name 'a b' is invalid; expected 1-128 characters of \["),
        ("[tables.'a b']\n" + COLUMN, r"\[tables.a b\]: table name 'a b' is invalid; expected 1-128 characters"),
        (COLUMN + COLUMN, "column 'a' appears twice"),
        ("[[columns]]\nname = '_bias'\nkind = 'categorical'\n", "a name must be non-empty and not start with '_'"),
        ("[[columns]]\nname = ''\nkind = 'categorical'\n", "a name must be non-empty"),
        ("[[columns]]\nname = 'a'\nkind = 'multi_hot'\nmax_length = 0\n", "column 'a': max_length 0, expected >= 1"),
        ("[[columns]]\nname = 'a'\nkind = 'multi_hot'\nmax_length = '3'\n", "max_length is '3', expected an integer"),
        ("[[columns]]\nname = 'a'\nkind = 'multi_hot'\nseparator = '||'\n", "column 'a': separator '||'"),
        ("[[columns]]\nname = 'a'\nkind = 'weighted'\nseparator = ':'\n", "column 'a': separator ':'"),
        (COLUMN + "ids = 'x'\n", "column 'a': ids 'x' is unknown"),
        (COLUMN + "ids = 'raw'\nid_space = 's'\n", "raw ids have no id space"),
        ("label = 'a'\n" + COLUMN, "column 'a' reads 'a', the label column"),
        ("[tables.x]\nlr = 1\n" + COLUMN, r"\[tables\]: \[x\] has unknown key 'lr'"),
        ("[tables.x]\ndim = 0\n" + COLUMN + "table = 'x'\n", r"\[tables.x\]: dim 0, expected 1..4096"),
        (
            "[tables.x]\noptimizer = { name = 'sgd', learning_rate = -1.0 }\n" + COLUMN + "table = 'x'\n",
            r"\[tables.x\]: learning_rate must be finite",
        ),
        ("[tables.x]\ndim = 4\n" + COLUMN, r"tables \['x'\] are declared but no column"),
        ("bias_table = 'zz'\n" + COLUMN, "bias_table 'zz' is not declared"),
        ('format = "criteo"\n[[columns]]\nname = "I14"\nkind = "categorical"\n', "source 'I14' is not a criteo column"),
        ('format = "libsvm"\n[[columns]]\nname = "x"\nkind = "categorical"\n', "source 'x' is not a libsvm column"),
        ("[[columns\n", "not valid TOML"),
    ],
)
def test_every_mistake_names_the_file_and_key(tmp_path, text, message):
    with pytest.raises(ValueError, match=message) as e:
        load(tmp_path, text, name="bad.toml")
    assert str(e.value).startswith(str(tmp_path / "bad.toml"))


@pytest.mark.parametrize("model, widest", [("fm", 4095), ("deepfm", 4095), ("dnn", 4096), ("lr", 4096), (None, 4096)])
def test_a_tables_dim_past_the_models_rows_is_refused_naming_the_file_the_table_and_the_models_widest(
    tmp_path, model, widest
):
    """fm's and deepfm's rows hold the linear term's weight beside the embedding: a dim of 4096 makes rows of 4097
    floats, which no server holds. Refused where the schema is read, for the model that reads it; lr's rows are
    one float whatever the dim, and no model given (`ps-worker schema`'s files) bounds it by a server's rows."""
    path = tmp_path / "s.toml"
    for dim in (widest, widest + 1):
        path.write_text(f"[tables.wide]\ndim = {dim}\n" + COLUMN + "table = 'wide'\n")
        if dim == widest:
            assert load_schema(str(path), default_table="t", default_dim=4, model=model).table_dims()["wide"] == dim
            continue
        with pytest.raises(ValueError) as e:
            load_schema(str(path), default_table="t", default_dim=4, model=model)
        expected = (f"{path}: [tables.wide]: dim 4096: expected 1..4095 for --model {model} (its rows hold the 4096 "
                    "floats of an embedding and 1 of the linear term: 4097, and a server holds rows of at most 4096)"
                    if widest < 4096 else f"{path}: [tables.wide]: dim 4097, expected 1..4096")  # fmt: skip
        assert str(e.value) == expected


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path / 'none.toml'}: cannot read the schema"):
        load_schema(str(tmp_path / "none.toml"), default_table="t", default_dim=1)


# --- built-in schemas ---------------------------------------------------------------------------------------


def test_builtin_criteo():
    s = builtin_schema("criteo", default_table="t", default_dim=6)
    ints, cats = CRITEO_COLUMNS[1:14], CRITEO_COLUMNS[14:]
    assert [c.name for c in s.sparse_columns()] == [*ints, *cats]
    assert [(c.name, c.source, c.transform) for c in s.dense_columns()] == [(f"{i}_log", i, "log") for i in ints]
    assert all(c.transform == "log_buckets" for c in s.columns[:NUM_INT_FIELDS])
    assert s.id_spaces() == {name: f for f, name in enumerate([*ints, *cats])}
    assert len(s.model_fields()) == NUM_INT_FIELDS + NUM_CAT_FIELDS + 1 and s.table_dims() == {"t": 6}
    assert s.label == "label" and not s.needs_stats()


def test_builtin_csv_and_libsvm():
    header = ["id", "click", "site", "price", "device", "n"]
    s = builtin_schema("csv", default_table="t", default_dim=4, header=header, label_column="click",
                       drop_columns=["id"], numeric_columns=["n", "price"])  # fmt: skip
    assert s.label == "click"
    assert [(c.name, c.kind, c.transform) for c in s.columns] == [
        ("site", "categorical", None),
        ("device", "categorical", None),
        ("n", "numeric", "log"),
        ("price", "numeric", "log"),
    ]
    assert s.id_spaces() == {"site": 0, "device": 1}
    assert builtin_schema("csv", default_table="t", default_dim=4, header=["y", "a"]).label == "y"
    s = builtin_schema("libsvm", default_table="t", default_dim=4, libsvm_fields=3)
    assert [c.source for c in s.columns] == ["f0", "f1", "f2"] and s.id_spaces() == {"all": 0}  # one id space


@pytest.mark.parametrize(
    "header, kw, message",
    [
        (["y", "a", "a"], {}, r"columns \['a'\] appear more than once"),
        (["y", "_x"], {}, r"columns \['_x'\]: a field name must be non-empty"),
        (["", "click", "a"], {}, r"the label column 1 of the header \['', 'click', 'a'\] has no name"),
        (
            ["", "y", "a", " "],
            {"label_column": "y"},
            r"columns 1, 4 of the header \['', 'y', 'a', ' '\] have no name "
            r"\(a row index that pandas' to_csv wrote\?\)",
        ),  # fmt: skip
        (
            ["y", "a", ""],
            {},
            r"column 3 of the header \['y', 'a', ''\] has no name \(a delimiter at the end of each line\?\)",
        ),  # a spreadsheet's export: y;a;
        ([], {}, "the header line names no columns"),
        (["y", "a"], {"numeric_columns": ["b"]}, r"columns \['b'\] are not in the header"),
    ],
)
def test_builtin_csv_mistakes(header, kw, message):
    with pytest.raises(ValueError, match=message):
        builtin_schema("csv", default_table="t", default_dim=4, header=header, **kw)
    ok = builtin_schema("csv", default_table="t", default_dim=4, header=["y", "a", "a", "_x"], drop_columns=["a", "_x"])
    assert ok.columns == ()


def test_resolve_schema(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("y,a,b\n1,x,2\n")
    common = dict(fmt="csv", label_column=None, drop_columns=(), numeric_columns=(), libsvm_fields=None,
                  default_table="t", default_dim=4)  # fmt: skip
    s = resolve_schema(str(data), schema_path=None, **{**common, "numeric_columns": ["b"]})
    assert [c.name for c in s.columns] == ["a", "b"] and s.dense_columns()[0].transform == "log"
    schema_file = tmp_path / "s.toml"
    schema_file.write_text('label = "y"\n' + COLUMN)
    assert resolve_schema(str(data), schema_path=str(schema_file), **common).columns[0].name == "a"
    with pytest.raises(ValueError, match=r"cannot be combined with \['--numeric-columns'\]"):
        resolve_schema(str(data), schema_path=str(schema_file), **{**common, "numeric_columns": ["b"]})
    with pytest.raises(ValueError, match="needs the data file"):
        resolve_schema(None, schema_path=None, **common)
    svm = tmp_path / "d.svm"
    svm.write_text("1 3:1 4:1\n")
    s = resolve_schema(str(svm), schema_path=None, **{**common, "fmt": "libsvm"})
    assert [c.name for c in s.columns] == ["f0", "f1"]
    with pytest.raises(ValueError, match="d.csv: columns .'z'. are not in the header"):
        resolve_schema(str(data), schema_path=None, **{**common, "label_column": "z"})


@pytest.mark.parametrize(
    "header, flags, label, columns",
    [
        (" clicked ,country , n", {"numeric_columns": ("n",)}, " clicked ",
         [("country ", "country ", "country ", "categorical"), (" n", " n", None, "numeric")]),
        ("y,a , b", {}, "y", [("a ", "a ", "a ", "categorical"), (" b", " b", " b", "categorical")]),
        ("x, y ,z", {"label_column": "y", "drop_columns": ("z",)}, " y ", [("x", "x", "x", "categorical")]),
    ],
)  # fmt: skip
def test_as_written_names_the_label_columns_sources_and_id_spaces_as_the_header_writes_them(
    tmp_path, header, flags, label, columns
):
    """The built-in csv schema of a header with spaces around names: as_written is that schema with the label and
    each column's name, source and id space the cell as written (the oracle: each written out here), the rest
    the same; the schema file it writes reads back under its fingerprint (or, for a spaced label, the legacy
    one), as model_tables' refusal says. A header without such spaces has none."""
    data = tmp_path / "d.csv"
    data.write_text(header + "\n1,us,3\n")
    common = dict(fmt="csv", label_column=None, drop_columns=(), numeric_columns=(), libsvm_fields=None,
                  default_table="t", default_dim=4)  # fmt: skip
    schema = resolve_schema(str(data), schema_path=None, **{**common, **flags})
    written = schema.as_written
    assert written.label == label and schema.label == label.strip()
    assert [(c.name, c.source, c.id_space, c.kind) for c in written.columns] == columns
    assert [c.name for c in schema.columns] == [name.strip() for name, *_ in columns]
    same = ("format", "delimiter", "tables", "bias_table")
    assert [getattr(written, k) for k in same] == [getattr(schema, k) for k in same]
    assert written.fingerprint() != schema.fingerprint()
    back = schema_from_text(written.to_toml(), "written", default_table="t", default_dim=4)
    assert written.fingerprint() in (back.fingerprint(), back.legacy_fingerprint())
    data.write_text(header.replace(" ", "") + "\n1,us,3\n")
    assert resolve_schema(str(data), schema_path=None, **{**common, **flags}).as_written is None


# --- stats and the TOML round trip --------------------------------------------------------------------------


def test_with_stats_fills_only_what_is_missing(tmp_path):
    s = load(tmp_path, EXAMPLE.replace('transform = "standardize"', 'transform = "standardize"\nmean = 2.0'))
    assert s.needs_stats()
    filled = s.with_stats({"price": (9.0, 0.0)})
    price = filled.dense_columns()[0]
    assert (price.mean, price.std) == (2.0, 1.0) and not filled.needs_stats()  # std 0 -> 1; the given mean kept
    with pytest.raises(ValueError, match="no statistics for standardize column 'price'"):
        s.with_stats({})


def test_to_toml_round_trips(tmp_path):
    schemas = [
        load(tmp_path, EXAMPLE),
        load(tmp_path, EXAMPLE).with_stats({"price": (1.5, 0.25)}),
        builtin_schema("criteo", default_table="t", default_dim=6),
        builtin_schema("csv", default_table="t", default_dim=4, header=["y", 'a "q"', "b"], numeric_columns=["b"]),
        load(
            tmp_path,
            '[tables."x.y"]\ndim = 3\noptimizer = { name = "ftrl", learning_rate = 0.1, params = { l1 = 1.0 } }\n'
            'admission = { min_count = 2 }\n[[columns]]\nname = "é z"\nsource = "tab\\tcol"\nkind = "categorical"\n'
            'table = "x.y"\n',
        ),  # fmt: skip
    ]
    for s in schemas:
        path = tmp_path / "round.toml"
        path.write_text(s.to_toml())
        assert load_schema(str(path), default_table="other", default_dim=99) == s


# --- inferred schemas ---------------------------------------------------------------------------------------


def test_infer_schema_from_a_small_csv(tmp_path):
    rng = np.random.default_rng(0)
    lines = ["id,price,count,tags,hour,city,click,ratings"]
    for i in range(200):
        tags = "|".join(rng.choice(["a", "b", "c", "d"], size=rng.integers(0, 4)))
        ratings = ";".join(f"{t}:{rng.random():.2f}" for t in rng.choice(["u", "v", "w"], size=rng.integers(1, 3)))
        city = '"portland, or"' if i == 5 else rng.choice(["paris", "rome", "oslo"])  # one comma: not a list
        count = int(rng.pareto(1.5) * 10)
        lines.append(f"{i},{rng.normal(10, 2):.3f},{count},{tags},{rng.integers(6)},{city},{rng.integers(2)},{ratings}")
    data = tmp_path / "d.csv"
    data.write_text("\n".join(lines) + "\n")
    text = infer_schema_text(str(data), sample_rows=150)
    assert (
        "a sample of 150 rows" in text
        and "150 of 150 cells non-empty, 150 distinct; every value distinct in the sample: ids that come back" in text
    )  # 200 rows: the sample is not the whole file
    whole = infer_schema_text(str(data), sample_rows=1000)
    assert "200 of 200 cells non-empty, 200 distinct; every value distinct: an identifier? then delete" in whole
    assert "integers in a column named like an id" in text
    path = tmp_path / "inferred.toml"
    path.write_text(text)
    s = load_schema(str(path), default_table="t", default_dim=4)
    assert s.label == "click"  # a 0/1 column with a label's name, not the first
    kinds = {c.name: (c.kind, c.transform) for c in s.columns}
    assert kinds == {
        "id": ("categorical", None),  # integers, named like an id
        "price": ("numeric", "standardize"),
        "price_bucket": ("numeric", "bucketize"),  # a sparse twin of each numeric column, for lr and fm
        "count": ("numeric", "log"),
        "count_bucket": ("numeric", "bucketize"),
        "tags": ("multi_hot", None),
        "hour": ("categorical", None),
        "city": ("categorical", None),
        "ratings": ("weighted", None),
    }
    price = next(c for c in s.columns if c.name == "price")
    sample = np.array([float(line.split(",")[1]) for line in lines[1:151]])
    assert price.mean == pytest.approx(sample.mean()) and price.std == pytest.approx(sample.std())
    assert next(c for c in s.columns if c.name == "ratings").separator == ";"
    twin = next(c for c in s.columns if c.name == "price_bucket")
    quantiles = np.quantile(sample, np.arange(1, 16) / 16)
    assert twin.source == "price" and twin.is_sparse and len(twin.boundaries) == 15
    assert np.allclose(twin.boundaries, quantiles, atol=0.1)  # the sample's 16-quantiles
    for name in ("uid", "userid", "item_id", "adId"):  # named like ids; "paid" is not
        assert infer_column(name, name, [str(i) for i in range(100)])[0].kind == "categorical"
    assert infer_column("paid", "paid", [str(i) for i in range(100)])[0].kind == "numeric"


def test_infer_names_a_semicolon_separated_file_and_reads_a_bar_in_a_label_only_header(tmp_path):
    semi = tmp_path / "semi.csv"
    semi.write_text("label;a;b\n1;x;2\n0;y;3\n")
    with pytest.raises(ValueError, match="its first line has ';' and no ',': a ';'-separated file\\? Give --delimiter"):
        infer_schema_text(str(semi))
    assert 'delimiter = ";"' in infer_schema_text(str(semi), delimiter=";")
    bar = tmp_path / "bar.csv"
    bar.write_text("is|click\n1\n0\n")  # a label-only file: no '|'-separated one, and no feature to infer
    with pytest.raises(ValueError, match="no column to read features from: the header is one column, 'is|click'"):
        infer_schema_text(str(bar))


@pytest.mark.parametrize(
    "text, delimiter, why",
    [
        ("y\n1\n0\n", ",", "the header is one column, 'y', taken as the label \\(a schema needs at least one"),
        ("y,a,a\n1,x,z\n0,y,w\n", ",", "columns other than the label 'y' repeat a name"),
        ("1 1:1 2:1\n0 1:1 3:1\n", ",", "its first line looks like libsvm .*: give --format libsvm"),
        ("y,a,b\n1,x,3\n0,y,4\n", ";", "its first line has ',': a comma-separated file\\? Leave --delimiter out"),
    ],
)
def test_infer_refuses_a_file_that_gives_no_column_saying_why(tmp_path, text, delimiter, why):
    """A schema of no [[columns]] is one load_schema refuses: ps-worker schema says so, and why, instead of writing
    it."""
    data = tmp_path / "d.csv"
    data.write_text(text)
    with pytest.raises(ValueError, match=f"d.csv: no column to read features from: .*{why}"):
        infer_schema_text(str(data), delimiter=delimiter)


def test_infer_label_falls_back_to_the_first_binary_column(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("a,b,_c\nx,1,0\ny,0,1\n")
    text = infer_schema_text(str(data))
    path = tmp_path / "s.toml"
    path.write_text(text)
    s = load_schema(str(path), default_table="t", default_dim=4)
    assert s.label == "b" and [(c.name, c.source) for c in s.columns] == [("a", "a"), ("column2", "_c")]
    assert "# CHECK: the label is a guess: 'b' is the first column holding only 0 and 1 (of 'b', '_c')" in text
    data.write_text("click,is_new,cat\n0,1,a\n1,0,b\n2,1,c\n")  # a column named like a label of 3 values
    text = infer_schema_text(str(data))
    assert 'label = "is_new"' in text and "and 'click', named like a label, holds 3 distinct values ('0', '1', " in text
    data.write_text("click,is_new,cat\n,0,a\n,1,b\n")
    assert "and 'click', named like a label, is empty in every row of the sample" in infer_schema_text(str(data))
    svm = tmp_path / "d.svm"
    svm.write_text("1 3:1 4:1\n")
    path.write_text(infer_schema_text(str(svm), fmt="libsvm"))
    assert [c.name for c in load_schema(str(path), default_table="t", default_dim=4).columns] == ["f0", "f1"]


@pytest.mark.parametrize("zeros", [0.5, 0.95])
def test_infer_buckets_a_column_of_zeros_mostly_with_the_zeros_apart(tmp_path, zeros):
    """A numeric column whose least value fills many of the sample's quantiles (a spend, 0 on most rows): its
    bucketized twin (bucket b holds boundaries[b-1] <= x < boundaries[b]) gives the zeros a bucket of their own,
    no value above them in it, and leaves no bucket the sample does not fill."""
    rng = np.random.default_rng(0)
    spend = np.where(rng.random(400) < zeros, 0.0, np.round(rng.lognormal(3, 1, 400), 2))
    data = tmp_path / "d.csv"
    data.write_text("click,spend\n" + "".join(f"{i % 2},{v:g}\n" for i, v in enumerate(spend)))
    path = tmp_path / "s.toml"
    path.write_text(infer_schema_text(str(data)))
    s = load_schema(str(path), default_table="t", default_dim=4)
    bounds = next(c for c in s.columns if c.name == "spend_bucket").boundaries
    buckets = np.searchsorted(np.asarray(bounds), spend, side="right")
    assert set(buckets[spend == 0]).isdisjoint(buckets[spend > 0])
    assert sorted(set(buckets)) == list(range(len(set(buckets)))) == list(range(len(bounds) + 1))


@pytest.mark.parametrize("name, values", [("target", ["0.25", "3.5", "1.75"]), ("clicks", ["0", "2", "1", "5"])])
def test_infer_takes_a_column_named_like_a_label_of_other_values_as_the_label_not_a_feature(tmp_path, name, values):
    """A file of no column of 0 and 1 whose column named like a label holds other values (a regression's target, a
    count of clicks): that column is the label, checked with what it holds (train stops at its first value other
    than 0 and 1, naming it), not a feature beside a first column taken as the label."""
    data = tmp_path / "d.csv"
    data.write_text(f"id,{name},site\n" + "".join(f"{i},{values[i % len(values)]},s{i % 3}\n" for i in range(40)))
    text, checks = infer_schema(str(data))
    path = tmp_path / "s.toml"
    path.write_text(text)
    s = load_schema(str(path), default_table="t", default_dim=4)
    assert s.label == name and [c.source for c in s.columns] == ["id", "site"]
    shown = ", ".join(map(repr, sorted(values)))
    said = f"{name!r}, named like a label, holds {len(values)} distinct values ({shown}), "
    assert [c.startswith(said + "not only 0 and 1") for c in checks] == [True] and f"# CHECK: {said}" in text


def test_infer_says_a_column_of_no_name_may_be_the_row_index_pandas_wrote(tmp_path):
    """A first column of no name (pandas' to_csv wrote its row index) is read as column0, a CHECK in the schema and
    on stderr, as the built-in csv schema refuses it; so is one of no name elsewhere, without that guess."""
    data = tmp_path / "d.csv"
    rows = [(i, 7 * i, i % 2, f"c{i % 3}") for i in range(50)]
    for header, columns, said in (
        (",id,click,city", (0, 1, 2, 3), "column 1 of the header has no name (a row index that pandas' to_csv "
                                         "wrote?): read as 'column0' here"),
        ("id,click,,city", (1, 2, 0, 3), "column 3 of the header has no name: read as 'column2' here"),
        ("id,click,city", (1, 2, 3), None),
    ):  # fmt: skip
        data.write_text(header + "\n" + "".join(",".join(str(r[k]) for k in columns) + "\n" for r in rows))
        text, checks = infer_schema(str(data))
        s = schema_from_text(text, "inferred", default_table="t", default_dim=4)
        assert s.label == "click" and {"id", "city"} <= {c.source for c in s.columns}
        if said is None:
            assert not any("no name" in c for c in checks) and "CHECK" not in text, (checks, text)
        else:
            assert [c for c in checks if c.startswith(said)] and f"# CHECK: {said}" in text, (checks, text)
            assert "" in {c.source for c in s.columns}  # read, as the check says, until a person deletes it


def test_infer_prefers_a_label_by_its_name_keeps_codes_and_reads_missing_markers(tmp_path):
    """is_click, not the first 0/1 column, is the label; zip codes with leading zeros stay categorical; numbers
    with NA / nan markers are numeric, and the reader takes the markers as missing."""
    rng = np.random.default_rng(1)
    rows = ["is_mobile,zip,score,is_click"]
    for i in range(300):
        score = ("NA", "nan", "NULL")[i % 3] if i % 10 == 0 else f"{rng.normal(5, 2):.3f}"
        rows.append(f"{rng.integers(2)},{rng.integers(0, 3000):05d},{score},{rng.integers(2)}")
    data = tmp_path / "d.csv"
    data.write_text("\n".join(rows) + "\n")
    text, checks = infer_schema(str(data))
    assert checks == [] and "CHECK" not in text
    path = tmp_path / "s.toml"
    path.write_text(text)
    s = load_schema(str(path), default_table="t", default_dim=4)
    kinds = {c.name: (c.kind, c.transform) for c in s.columns}
    assert s.label == "is_click"
    assert kinds["is_mobile"] == ("categorical", None) and kinds["zip"] == ("categorical", None)
    assert kinds["score"] == ("numeric", "standardize") and "integers with leading zeros, codes" in text
    (batch,) = read_batches(str(data), s, 1000)
    score = next(i for i, c in enumerate(s.dense_columns()) if c.name == "score")
    assert len(batch) == 300 and (batch.dense[::10, score] == 0).all()  # missing: the mean, standardized to 0


def test_infer_says_which_columns_carry_nothing_or_are_dates():
    dates = [f"2023-12-{d % 28 + 1:02d} {d % 24:02d}:{d % 60:02d}:00" for d in range(200)]
    assert "dates or times: as ids, nearly every value is new" in infer_column("ts", "ts", dates)[1]
    assert "one value only: it carries nothing" in infer_column("c", "c", ["7"] * 50)[1]
    assert "no value at all: it carries nothing" in infer_column("e", "e", ["", " "] * 25)[1]
    assert "one value only" in infer_column("na", "na", ["", "NA"] * 25)[1]  # a category's NA is a value
    card = infer_column("pay", "pay", ["none", "card"] * 25)
    assert card[0].kind == "categorical" and "carries nothing" not in card[1]
    prices = infer_column("price", "price", [f"{i * 1.37:.2f}" for i in range(150)])[1]
    assert "nearly every value distinct" not in prices  # numbers: no identifiers
    near = [f"u{i}" for i in range(190)] + ["u1"] * 10
    assert "nearly every value distinct: an identifier or a time?" in infer_column("u", "u", near)[1]
    assert "nearly every value distinct in the sample: ids that come back" in infer_column("u", "u", near, True)[1]
    assert "distinct in the sample" not in infer_column("u", "u", [f"u{i % 50}" for i in range(200)], True)[1]
    for sampled in (False, True):  # measurements: distinct values are no sign of an identifier
        assert "identifier" not in infer_column("p", "p", [f"{i * 1.37:.2f}" for i in range(150)], sampled)[1]


def test_a_table_named_like_the_mlps_tables_is_refused(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[tables."dense.mlp.0.bias"]\ndim = 4\n[[columns]]\nname = "a"\nkind = "categorical"\n'
                    'table = "dense.mlp.0.bias"\n')  # fmt: skip
    with pytest.raises(ValueError, match=r"\[tables.dense.mlp.0.bias\]: names starting with 'dense.' are the MLP's"):
        load_schema(str(path), default_table="t", default_dim=4)


def test_a_schema_file_that_is_not_utf8_is_named_in_the_error(tmp_path):
    path = tmp_path / "s.toml"
    path.write_bytes(b'label = "\xff"\n')
    with pytest.raises(ValueError, match=r"s.toml: not valid TOML: not UTF-8 text"):
        load_schema(str(path), default_table="t", default_dim=4)


def test_infer_a_column_empty_in_the_whole_sample_is_categorical(tmp_path):
    data = tmp_path / "e.csv"
    data.write_text("label,a,b\n1,,x\n0,,y\n")
    path = tmp_path / "s.toml"
    path.write_text(infer_schema_text(str(data)))
    kinds = {c.name: c.kind for c in load_schema(str(path), default_table="t", default_dim=4).columns}
    assert kinds == {"a": "categorical", "b": "categorical"}


@pytest.mark.parametrize("gz, end", [(False, "\n"), (True, "\n"), (False, "\r\n"), (False, "\r")])
def test_the_schema_sample_of_a_file_sorted_by_time_sees_its_later_rows(tmp_path, gz, end):
    """A log sorted by time whose 'promo' column is filled only in its last third: the sample takes half the file's
    first records and half from spots spread over the rest, so it sees them (a .gz file: the first records only).
    Lines end in LF, CRLF or a lone CR (a spreadsheet's "CSV (Macintosh)"): a spot finds each kind."""
    import gzip
    import re

    from worker.formats import read_csv_sample

    n = 250_000
    text = f"click,promo,price{end}" + "".join(
        f"{i % 5 == 0:d},{f'p{i % 7}' if i >= 2 * n // 3 else ''},{i % 100}{end}" for i in range(n)
    )
    path = tmp_path / ("log.csv.gz" if gz else "log.csv")
    with gzip.open(path, "wt", newline="") if gz else open(path, "w", newline="") as f:
        f.write(text)
    header, rows = read_csv_sample(path, ",", 2000)
    assert header == ["click", "promo", "price"] and len(rows) == 2000
    first = [line.split(",") for line in text.splitlines()[1:2001]]
    assert rows == first if gz else rows[:1000] == first[:1000]  # the first half: the file's first records
    filled = sum(r[1] != "" for r in rows)
    assert filled == 0 if gz else 250 <= filled <= 400, filled  # a third of the spread half
    said = re.search(
        r"'promo': text \(([\d,]+) of 2,000 cells non-empty", infer_schema_text(str(path), sample_rows=2000)
    )
    assert gz or (said and int(said.group(1).replace(",", "")) == filled)


def test_infer_names_a_label_of_two_words_and_a_label_of_one_value(tmp_path):
    """A column named like a label holding two words other than true/false, yes/no is the label, with a CHECK that
    says to write them as 0 and 1; one of yes and no is a label as it is; a label that is the same in every row is a
    CHECK too."""
    words = tmp_path / "w.csv"
    words.write_text(
        "city,clicked,price\n" + "".join(f"c{i % 4},{'buy' if i % 3 else 'skip'},{i}\n" for i in range(30))
    )
    text, checks = infer_schema(str(words))
    assert 'label = "clicked"' in text
    assert checks == ["'clicked' holds 'buy' and 'skip', not 0 and 1: the readers take a label as 0 or 1 (or true "
                      "and false, yes and no, any case) only, so training stops at its first line: write its values "
                      "as 1 for the outcome the model predicts and 0 for the other"]  # fmt: skip
    words.write_text("city,clicked,price\n" + "".join(f"c{i % 4},{'Yes' if i % 3 else 'no'},{i}\n" for i in range(30)))
    text, checks = infer_schema(str(words))
    assert 'label = "clicked"' in text and checks == []
    zeros = tmp_path / "z.csv"
    zeros.write_text("city,clicked,price\n" + "".join(f"c{i % 4},0,{i}\n" for i in range(30)))
    text, checks = infer_schema(str(zeros))
    assert 'label = "clicked"' in text and len(checks) == 1
    assert checks[0].startswith("'clicked' is 0 in every row of the sample: a model learns nothing but that rate")


def test_a_label_column_with_some_empty_cells_is_still_the_label_and_the_blanks_are_counted(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("city,clicked,price\nparis,1,3\nrome,0,4\noslo,,5\nrome,0,6\nparis,1,2\n")
    text, checks = infer_schema(str(data))
    assert 'label = "clicked"' in text
    assert checks == ["1 of the sample's 5 rows have no label (an empty 'clicked' cell): training stops at the first "
                      "such line, unless --max-bad-lines lets it skip them: remove those rows"]  # fmt: skip


def test_the_spread_sample_reads_no_record_twice_even_of_long_lines(tmp_path):
    """Spans end where the next begins: a file of 400-byte lines barely past the spread threshold, sampled for
    more rows than it holds, gives each of its rows once at most."""
    from worker.formats import read_csv_sample

    path = tmp_path / "wide.csv"
    with open(path, "w") as f:
        f.write("click,id,text\n" + "".join(f"{i % 2},{i},{'x' * 390}\n" for i in range(7720)))
    _, rows = read_csv_sample(path, ",", 10_000)
    ids = [r[1] for r in rows]
    assert len(ids) == len(set(ids)) and len(ids) > 5000, (len(ids), len(set(ids)))
    with open(path, "a") as f:
        f.write("1,last,x")  # a last line without its newline is a record the last span holds
    _, rows = read_csv_sample(path, ",", 10_000)
    assert rows[-1] == ["1", "last", "x"], rows[-1]


def test_a_file_of_quoted_fields_over_lines_is_sampled_from_its_start_not_at_spots_inside_them(tmp_path):
    """A spot of the spread sample that starts inside a quoted field over two lines read the field's second line as a
    record of the header's 4 cells ('z3', ' k', ...): its label and price no label and no number, so `ps-worker
    schema` guessed the label (CHECK) and read price as text. Such a file is sampled from its start: every sampled
    record is one of the file's."""
    import csv

    from worker.formats import read_csv_sample
    from worker.readers.csv_sample import SPREAD_MIN_BYTES

    rows = [[str(i % 2), str(i % 500 + 1), f'w{i % 13} x, y\nz{i % 7}, k, "ok"', f"s{i % 40}"] for i in range(80_000)]
    path = tmp_path / "ads.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([["click", "price", "desc", "site"], *rows])
    assert path.stat().st_size > 2 * SPREAD_MIN_BYTES  # (a file the spots would sample)
    header, sample = read_csv_sample(path, ",", 10_000)
    assert header == ["click", "price", "desc", "site"] and sample == rows[:10_000]
    text, checks = infer_schema(str(path))
    kinds = {c.name: c.kind for c in schema_from_text(text, "inferred", default_table="t", default_dim=4).columns}
    assert 'label = "click"' in text and checks == [] and kinds["price"] == "numeric", (checks, kinds)


def test_a_file_whose_quoted_fields_over_lines_start_past_its_first_rows_is_sampled_without_invented_records(tmp_path):
    """Fields over two lines only from row 20,000 on (every third row): the sample's first half, read from the
    start, holds none, and a spot inside such a field must not read its second line as a record (5 of 10,000
    sampled records were invented so)."""
    import csv

    from worker.formats import read_csv_sample

    def desc(i: int) -> str:
        return f'w{i % 13} x, y\nz{i % 7}, k, "ok"' if i >= 20_000 and i % 3 == 0 else f"w{i % 13} x"

    rows = [[str(i % 2), str(i % 500 + 1), desc(i), f"s{i % 40}"] for i in range(200_000)]
    path = tmp_path / "ads.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([["click", "price", "desc", "site"], *rows])
    header, sample = read_csv_sample(path, ",", 10_000)
    in_file = {tuple(r) for r in rows}
    invented = [r for r in sample if tuple(r) not in in_file]
    assert header == ["click", "price", "desc", "site"] and len(sample) == 10_000 and invented == [], invented[:3]


def test_infer_gives_repeated_integer_codes_a_categorical_twin_and_not_a_wide_quantity(tmp_path):
    """150 category codes over 3,000 rows lost 0.05 AUC as a standardized number with 15 buckets: such a column
    gets `<name>_code` too (each value its own id); integers of many values (cents) do not."""
    rng = np.random.default_rng(1)
    lines = ["click,category_code,cents"] + [
        f"{rng.integers(2)},{rng.integers(100, 250)},{rng.integers(0, 10**6)}" for _ in range(3000)
    ]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    text = infer_schema_text(str(tmp_path / "d.csv"))
    s = schema_from_text(text, "inferred", default_table="t", default_dim=4)
    kinds = {c.name: (c.kind, c.source) for c in s.columns}
    assert kinds["category_code_code"] == ("categorical", "category_code"), kinds
    assert kinds["category_code"][0] == "numeric" and "cents_code" not in kinds, kinds
    assert "each seen 20 times on average: codes or small counts" in text


def test_infer_comments_count_with_thousands_separators_and_the_toml_still_loads(tmp_path):
    """The comments a person reads say "a sample of 3,000 rows" and "3,000 of 3,000 cells non-empty"; the values
    load as TOML (a separator is in comments only)."""
    rng = np.random.default_rng(2)
    lines = ["click,user_id,timestamp"] + [f"{rng.integers(2)},{i},{1_700_000_000 + 3600 * i}" for i in range(3000)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    text = infer_schema_text(str(tmp_path / "d.csv"))
    assert "# Inferred from the header and a sample of 3,000 rows (" in text, text
    assert "# 'user_id': integers in a column named like an id (3,000 of 3,000 cells non-empty, 3,000 distinct" in text
    assert "# 'timestamp': times, unix seconds (UTC) (3,000 of 3,000 cells non-empty, 3,000 distinct)" in text
    s = schema_from_text(text, "inferred", default_table="t", default_dim=4)
    assert [c.source for c in s.columns] == ["user_id", "timestamp", "timestamp"], s.columns


def test_infer_label_true_false_several_label_names_decimal_commas_prose_and_repeated_names(tmp_path):
    """A True/False label is found; a second column named like a label is said on stderr; numbers with decimal
    commas are not a list and are said on stderr; prose with ', ' is text, not a list; a column named twice is
    said on stderr as well as in the schema."""
    rng = np.random.default_rng(2)
    rows = ["timestamp;clicked_before;is_clicked;score;title;dev;dev"]
    for i in range(300):
        title = rng.choice(["Big sale, 50% off", "New, fresh and cheap", "Plain"])
        rows.append(f"2024-01-{i % 28 + 1:02d};{rng.integers(2)};{rng.choice(['True', 'False'])};"
                    f"{rng.integers(0, 2)},{rng.integers(1000, 9999)};{title};a;b")  # fmt: skip
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    text, checks = infer_schema(str(tmp_path / "d.csv"), delimiter=";")
    assert 'label = "clicked_before"' in text  # named like a label (LABEL_WORDS) and first: still a pick to check
    assert any("the first of the columns named like a label that hold only 0 and 1 ('clicked_before', "
               "'is_clicked')" in c for c in checks), checks  # fmt: skip
    assert any("'score' holds numbers written with a decimal comma" in c for c in checks), checks
    assert any("the header names 2 columns 'dev': they are left out" in c for c in checks), checks
    s = schema_from_text(text, "inferred", default_table="t", default_dim=4)
    kinds = {c.name: c.kind for c in s.columns}
    assert kinds["score"] == "categorical" and kinds["title"] == "categorical" and "dev" not in kinds, kinds
    bools = tmp_path / "b.csv"
    bools.write_text("ts,click\n" + "".join(f"{i},{'True' if i % 3 else 'False'}\n" for i in range(50)))
    assert 'label = "click"' in infer_schema_text(str(bools))


def test_infer_numbers_with_thousands_separators_are_said_as_such_not_lists_nor_decimal_commas(tmp_path):
    """Numbers exported with thousands separators (quoted '1,234,567', '512' among them) are no list of ids and no
    decimal commas: text, and on stderr the separators to remove; 4- and 5-digit ones ('49,490' in every comma cell)
    read either way, and the check says both; lists of ids of other lengths stay lists."""
    rng = np.random.default_rng(7)
    rows = ["click,revenue,visits,items"]
    for _ in range(1000):
        revenue, visits = int(rng.lognormal(9, 2)), int(rng.integers(1000, 99999))
        items = ",".join(str(v) for v in rng.integers(1, 60, rng.integers(1, 4)))
        rows.append(f'{rng.integers(2)},"{revenue:,}","{visits:,}","{items}"')
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    text, checks = infer_schema(str(tmp_path / "d.csv"))
    kinds = {c.name: c.kind for c in schema_from_text(text, "inferred", default_table="t", default_dim=4).columns}
    assert kinds == {"revenue": "categorical", "visits": "categorical", "items": "multi_hot"}, kinds
    revenue = next(c for c in checks if c.startswith("'revenue'"))
    assert "holds numbers with thousands separators (as '" in revenue and "read_csv(..., thousands=',')" in revenue
    assert "decimal" not in revenue, revenue
    assert "then to_csv(..., index=False)" in revenue, revenue  # (pandas' row index would be a column of the file)
    visits = next(c for c in checks if c.startswith("'visits'"))
    assert "a thousands separator or a decimal comma" in visits and "thousands=','" in visits, visits
    assert "decimal=','" in visits and not any(c.startswith("'items'") for c in checks), checks
    assert "then to_csv(..., index=False)" in visits, visits


def test_infer_numbers_with_spaces_as_thousands_separators_are_said_as_such(tmp_path):
    """Numbers exported with spaces between thousands ('8 402', a no-break space or a narrow one alike; '1 234,5'
    with a decimal comma) are text to the readers: categorical, and on stderr the separator to remove; a column of
    words with spaces or of codes like '12 34' is not."""
    rng = np.random.default_rng(11)
    grouped = lambda v, sep: f"{v:,}".replace(",", sep)  # 1,234,567 with sep between thousands
    rows = ["click;plain;nbsp;french;words;codes"]
    for _ in range(500):
        v = [int(rng.lognormal(8, 2)) for _ in range(3)]
        rows.append(f"{rng.integers(2)};{grouped(v[0], ' ')};{grouped(v[1], chr(0xA0))};"
                    f"{grouped(v[2], chr(0x202F))},{rng.integers(10)};big sale {rng.integers(9)};"
                    f"{rng.integers(10, 99)} {rng.integers(10, 99)}")  # fmt: skip
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    text, checks = infer_schema(str(tmp_path / "d.csv"), delimiter=";")
    kinds = {c.name: c.kind for c in schema_from_text(text, "inferred", default_table="t", default_dim=4).columns}
    assert kinds["plain"] == kinds["nbsp"] == kinds["french"] == "categorical", kinds
    said = {c.split("'", 2)[1]: c for c in checks if "thousands separated by" in c}
    assert set(said) == {"plain", "nbsp", "french"}, checks
    assert "thousands separated by ' ' (as '" in said["plain"] and "read_csv(..., thousands=' ')" in said["plain"]
    assert "thousands separated by '\\xa0'" in said["nbsp"] and "thousands='\\xa0')" in said["nbsp"]
    assert "thousands='\\u202f', decimal=',')" in said["french"], said["french"]
    assert all("then to_csv(..., index=False)" in said[k] for k in said), said


def test_a_column_of_ids_and_space_separated_lists_of_them_is_not_said_to_hold_numbers(tmp_path):
    """A column of single ids (nine in ten cells) and lists of ids split by spaces ('3 17 25', '17 250') holds no
    numbers with thousands separators, though '17 250' alone reads as one: every cell holding a space must be such a
    number, as every cell holding a comma must for the comma form. A column whose spaced cells are all grouped in
    threes is said to hold such numbers, and that lists of 3-digit ids look the same."""
    rng = np.random.default_rng(5)
    lists = ["3 17 25", "17 250", "40 101", "1 2 3", "12 345 7"]
    rows = ["click,tags,grouped"]
    for k in range(500):
        tags = lists[k // 100] if k % 100 == 0 else str(rng.integers(1, 999))
        grouped = "17 250" if k % 100 == 0 else str(rng.integers(1, 999))
        rows.append(f"{rng.integers(2)},{tags},{grouped}")
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    _, checks = infer_schema(str(tmp_path / "d.csv"))
    said = {c.split("'", 2)[1]: c for c in checks if "thousands separated by" in c}
    assert set(said) == {"grouped"}, checks
    assert (
        'lists of 3-digit ids look the same: a schema reads those with kind = "multi_hot", separator = " "'
        in (said["grouped"])
    )


def test_the_fingerprint_holds_the_label_and_the_builtin_libsvm_field_count():
    """Another label trains the rows toward another target: another fingerprint. The built-in libsvm schema read
    with 3 fields or 4 scores a line of 3 features otherwise (the 4th field's missing id adds its row): another
    fingerprint."""
    three, four = (builtin_schema("libsvm", default_table="t", default_dim=4, libsvm_fields=k) for k in (3, 4))
    assert three.fingerprint() != four.fingerprint()
    assert three.fingerprint() == builtin_schema("libsvm", default_table="t", default_dim=4,
                                                 libsvm_fields=3).fingerprint()  # fmt: skip
    header = ["click", "purchase", "user", "item"]
    click = builtin_schema("csv", default_table="t", default_dim=4, header=header, label_column="click",
                           drop_columns=("purchase",))  # fmt: skip
    purchase = builtin_schema("csv", default_table="t", default_dim=4, header=header, label_column="purchase",
                              drop_columns=("click",))  # fmt: skip
    assert [c.name for c in click.columns] == [c.name for c in purchase.columns]
    assert click.fingerprint() != purchase.fingerprint()
    f012, f7 = (builtin_schema("csv", default_table="t", default_dim=4, header=["label", *names])
                for names in (["f0", "f1", "f2"], ["f7"]))  # fmt: skip
    assert f012.fingerprint() != f7.fingerprint()  # a csv's columns named like libsvm's count one by one


def test_a_column_of_numbers_with_some_junk_cells_is_text_and_says_which_cells(tmp_path):
    """'-', '#N/A' and 'inf' in 3 of 300 price cells make the column text (each value its own id): the schema's
    comment and the checks on stderr name those cells and the fix; NA cells are missing numbers, not junk; a column
    where more than one cell in ten is not a number is plain text, with nothing to check."""
    rng = np.random.default_rng(5)
    rows = ["click,price,size,word,code"]
    for i in range(300):
        price = {7: "-", 8: "#N/A", 9: "inf", 10: "NA"}.get(i, f"{rng.uniform(1, 50):.2f}")
        size = f"{rng.uniform(1, 9):.1f}" if i % 5 else "big"
        code = "other" if i in (3, 4) else str(rng.integers(1, 4))  # codes even without "other": nothing to check
        rows.append(f"{i % 2},{price},{size},w{rng.integers(40)},{code}")
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    text, checks = infer_schema(str(tmp_path / "d.csv"))
    kinds = {c.name: c.kind for c in schema_from_text(text, "inferred", default_table="t", default_dim=4).columns}
    assert kinds["price"] == kinds["size"] == "categorical", kinds
    note = "'price': 296 of its 299 filled cells in the sample are numbers, the others are not ('-' (1), '#N/A' (1), "
    assert [c for c in checks if c.startswith(note)] and f"CHECK {note}" in text, (checks, text)
    assert not [c for c in checks if "size" in c or "word" in c or "code" in c], checks
    assert kinds["code"] == "categorical" and "CHECK 'code'" not in text


def test_libsvm_fields_in_one_id_space_and_in_their_own_have_other_fingerprints():
    """The built-in libsvm schema hashes every field in one id space; a schema file's f<k> that names none keeps
    an id space of its own, as the built-in schema once did. Tables trained one way must refuse the other (their
    rows stand for other ids), and a model trained with per-position spaces keeps its fingerprint (the value the
    built-in schema of dim 8 on table "default" gave with K = 3)."""
    shared = builtin_schema("libsvm", default_table="default", default_dim=8, libsvm_fields=3)
    own = dataclasses.replace(
        shared, columns=tuple(libsvm_column(c.name, c.table, shared=False) for c in shared.columns)
    )
    assert shared.id_spaces() == {"all": 0} and own.id_spaces() == {"f0": 0, "f1": 1, "f2": 2}
    assert own.fingerprint() == "schema:f404cdf06d3d863e" != shared.fingerprint()
    text = 'format = "libsvm"\n' + "".join(f'[[columns]]\nname = "f{k}"\nkind = "categorical"\n' for k in range(4))
    written = schema_from_text(text, "s.toml", default_table="default", default_dim=8)  # K = 4, spaces their own
    assert written.fingerprint() == own.fingerprint()


def test_the_comment_of_a_number_column_counts_its_na_cells_as_missing(tmp_path):
    path = tmp_path / "na.csv"
    rows = [f"{i % 2},{'NA' if i % 10 == 0 else f'{i % 37}.5'},c{i % 5}" for i in range(1, 301)]
    path.write_text("label,price,cat\n" + "\n".join(rows) + "\n")
    text = infer_schema_text(str(path), sample_rows=300)
    assert "'price': numbers, skewness" in text
    assert "300 of 300 cells non-empty, 30 of them NA or another missing value; 38 distinct" in text
    assert "'cat': " in text and "NA or another" not in text.split("'cat': ")[1].split("\n")[0]


def test_numbers_past_float32_are_no_numbers_to_infer_from(tmp_path):
    """A cell the readers refuse as a number (|x| > 3.4e38, float32's largest) is not one to the inference either:
    among numbers it is a junk cell named in the checks (the statistics of a column holding 1e200 overflowed
    Python's floats, and `ps-worker schema`, and train, eval and predict through the built-in csv schema's hints,
    failed with a traceback); 3e38 is still a number."""
    rows = ["click,price,big"]
    for i in range(300):
        price = "1e200" if i == 7 else f"{(i * 37) % 50 + 1.5}"
        rows.append(f"{i % 2},{price},{'3e38' if i % 3 else f'{i}.5'}")
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    text, checks = infer_schema(str(tmp_path / "d.csv"))
    columns = {c.name: c for c in schema_from_text(text, "inferred", default_table="t", default_dim=4).columns}
    assert columns["price"].kind == "categorical", text
    assert [c for c in checks if c.startswith("'price': 299 of its 300 filled cells") and "'1e200' (1)" in c], checks
    assert columns["big"].kind == "numeric", text
    for cells in (["1e39", "2", "5.5"], ["-1e120", "0.5", "7.25"]):
        assert infer_column("v", "v", cells * 10)[0].kind == "categorical"
    # the built-in csv schema's hints infer each column of a sample too: train, eval and predict failed the same way
    schema = resolve_schema(str(tmp_path / "d.csv"), schema_path=None, fmt="csv", label_column=None, drop_columns=(),
                            numeric_columns=(), libsvm_fields=None, default_table="t", default_dim=4)  # fmt: skip
    assert [(c.name, c.kind) for c in schema.columns] == [("price", "categorical"), ("big", "categorical")]


def test_the_statistics_of_tiny_numbers_are_those_of_numpy():
    """A column of numbers near 1e-110 is standardized with its mean and std (numpy's, to rounding): their cubes
    underflowed to 0.0 and the skewness divided by zero, a traceback."""
    cells = ["1e-110", "3e-110", "2e-110", "5.5e-110", "7e-110", "0"] * 5
    column, comment = infer_column("v", "v", cells)
    values = np.array([float(c) for c in cells])
    assert column.transform == "standardize" and "skewness 0.4" in comment, comment
    assert math.isclose(column.mean, values.mean(), rel_tol=1e-12) and math.isclose(column.std, values.std(),
                                                                                     rel_tol=1e-12)  # fmt: skip


def test_ps_worker_schema_says_which_line_of_the_sample_has_another_column_count_and_how_many(tmp_path):
    """A record of another column count than the header's is left out of the sample and said: its file, its line
    (the header's is 1; a quoted cell over two lines counts both) and its count against the header's; of several,
    how many and the first, line numbered as `ps-worker train` names it. Blank lines and a spreadsheet's empty row
    are no such record, and a file without misfits says nothing of them."""
    rows = [f"{i % 2},u{i % 7},{i % 3}" for i in range(40)]
    rows[3] = '1,"u\n1",2'  # lines 5 and 6
    rows[6:6] = ["", ",,"]  # lines 9 and 10: an empty line and an empty row
    one = tmp_path / "one.csv"
    one.write_text("click,user,site\n" + "\n".join(rows[:12] + ["1,u3"] + rows[12:]) + "\n")
    text, checks = infer_schema(str(one))
    assert checks == [f"{one}: line 15 has 2 columns, where the header has 3: the schema is inferred without it, but "
                      "`ps-worker train` stops at such a line (--max-bad-lines N skips up to N of them): fix or remove "
                      "it"]  # fmt: skip
    assert "sample of 40 rows" in text
    schema = schema_from_text(text, "inferred", default_table="t", default_dim=4)
    with pytest.raises(ValueError, match=f"{one} line 15: 2 columns, expected 3 as in the header"):
        list(read_batches(str(one), schema, 1000))  # the line training names
    many = tmp_path / "many.csv"
    many.write_text("click,user,site\n" + "\n".join(rows[:5] + ["0,u1,2,9", "1"] + rows[5:]) + "\n")
    assert infer_schema(str(many))[1] == [f"{many}: 2 of the lines sampled from its start have another column count "
                                          "than the header's 3 (the first, line 8, has 4): the schema is inferred "
                                          "without them, but `ps-worker train` stops at such a line (--max-bad-lines "
                                          "N skips up to N of them): fix or remove them"]  # fmt: skip
    clean = tmp_path / "clean.csv"
    clean.write_text("click,user,site\n" + "\n".join(rows) + "\n")
    assert infer_schema(str(clean))[1] == []

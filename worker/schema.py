"""The feature schema: how the columns of a data file become a model's sparse fields and numeric features.

A schema is a TOML file (`--schema FILE`); `--format criteo|csv|libsvm` with the column flags are built-in
schemas (worker/schema_builtin.py), so every run reads its data through one (`--format auto`, the default: the
format of the data's first line, formats.detect_format). Grammar (keys not listed are errors):

    format    = "csv"              # csv (default) | criteo | libsvm: how a line splits into columns, and the
                                   # columns' names (worker/readers/): csv the header's (trimmed, as are the
                                   # label and sources named here); criteo label, I1..I13,
                                   # C1..C26; libsvm label, f0, f1, ... (f<k> the k-th id:value token's id)
    delimiter = ","                # csv only: one character
    label     = "label"            # the label column (0/1); default: the training file's first column, for
                                   #   every file the run reads ("label" for criteo, libsvm)
    bias_table = "item"            # the table holding the bias row (default: the first sparse column's table)

    [tables.<name>]                # one section per table; a column without `table` uses the default table
    dim = 16                       # v's width k (floats per row: 1 + k for lr/fm/deepfm, k for dnn); default:
                                   #   the run's --embedding-dim
    optimizer   = { name = "adagrad", learning_rate = 0.02 }      # and initializer, admission, eviction,
    weight_bound = 10.0                                           # as in a --table-config section

    [[columns]]                    # one entry per column used, in any order; other columns are ignored
    name      = "clicked"          # the field's name, and the data column it reads unless `source` is given
    source    = "clicked_items"    # the data column (default: name); two fields may read one column
    kind      = "multi_hot"        # categorical | multi_hot | weighted | numeric
    table     = "item"             # sparse kinds and numerics giving ids: the table looked up
    id_space  = "item"             # columns of one id space give one value one id (default: the name)
    ids       = "hashed"           # hashed (default) | raw: the cell is a decimal uint64, used as the id
    separator = "|"                # multi_hot / weighted: between ids (default "|"); weighted: id:weight
    pooling   = "mean"             # multi_hot / weighted: sum (default) | mean | sqrtn; mean divides the
                                   #   weighted sum by the sum of |weight| (worker/models/spec.py)
    max_length = 256               # multi_hot / weighted: ids kept per bag, the first ones (default 256)
    transform = "log"              # numeric: log | standardize | none -> a numeric feature;
                                   #          bucketize | log_buckets -> an id in `table`;
                                   #          yymmddhh_hour | yymmddhh_weekday | unix_hour | unix_weekday |
                                   #          iso_hour | iso_weekday -> the hour of day (0-23) or weekday (0-6,
                                   #          Monday 0) of a time, an id in `table`: a cell YYMMDDHH (Avazu's
                                   #          `hour`: 14102100), unix seconds (UTC) or a date and time
                                   #          (2024-01-05 13:22:00, 2024-01-05T13:22:00Z: the hour as written)
                                   #          (worker/timestamps.py), not the time's own value
    boundaries = [1.0, 10.0, 100.0] # bucketize: sorted; bucket b holds boundaries[b-1] <= x < boundaries[b]
    mean = 3.2                     # standardize: (x - mean) / std; missing here -> one pass over the
    std  = 1.7                     #   training data computes them (a constant column takes std 1)

Rules: a field name is unique and does not start with "_" (BIAS_FIELD, the bias's field, is the last field of
every model); the label column is no column's source; a sparse column's table is declared under [tables] or
is the default table; a declared table is used; `table` and `id_space` belong to sparse columns and numerics
giving ids, `ids` to sparse kinds, and raw ids have no id space; a libsvm column is categorical (its cell is
a feature token's id: raw takes the id itself, hashed mixes it into the id space) or weighted (that id with the
token's value as its weight: a bag of one id, empty where the line has no k-th token or its value is 0; no
separator nor max_length), its source f0..f1023.
Sparse fields come in column order, numeric features too.

Values and ids (see worker/encode.py for the arrays): a categorical or bag token's value is
features.cat_values of its text (hex of 1..16 digits is its number, else a hash of its bytes in the file, UTF-8 or
not; empty = missing); a hashed id
is features' field hash of the value with the salt of its id space: id spaces are numbered in the order their
first column appears among the schema's sparse columns, and space i takes salt index i (skipping 39, the
bias's), so the Criteo schema gives exactly features.example_ids. log_buckets is features.int_bucket (Criteo's
integer treatment); a numeric cell that is empty or says NA, nan, null, none or ? (cells.MISSING_TEXTS, any
case) is missing: 0 for log and none, the mean for standardize, and its own bucket (its own hour or weekday id
for a time). A time transform's id is its hour or weekday, hashed in its id space like any value: two fields read
one time column for both (`ps-worker schema` writes them for a column whose sampled values are all dates and times
of the iso format, or one named like a time, hour or ts, whose sampled values are all valid YYMMDDHH or ten-digit
unix seconds): its hours of day and weekdays come back every day and week, where the time's own values (as ids, or numbers standardized or bucketized) are new on every later day.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass, field

from ps.config import MAX_DIM, TABLE_NAME_RE, TableConfig, table_configs_from_dict
from worker.features import NUM_CAT_FIELDS, NUM_INT_FIELDS
from worker.models.spec import BIAS_FIELD, POOLINGS, FieldSpec

FORMATS = ("criteo", "csv", "libsvm")
AUTO_FORMAT = "auto"  # --format's value that takes the data's format from its first line (formats.detect_format)
FORMAT_CHOICES = (AUTO_FORMAT, *FORMATS)  # --format's values
DEFAULT_FORMAT = AUTO_FORMAT  # a run's --format when none is given (TrainConfig.format)
LABEL_NAMES = ("label", "click", "clicked", "is_click", "y", "target", "conversion", "converted")  # a label's usual
# names, any case: the built-in csv schema's label where the first column holds none (schema_builtin.csv_label),
# `ps-worker schema`'s first pick (schema_infer)
LABEL_WORDS = re.compile(r"(?i)click|label|target|conver|purchase|bought|outcome")  # in a label's other names
# (has_clicked, purchased): the pick where no column is named as LABEL_NAMES


def is_label_name(name: str) -> bool:
    """name reads as a label's: one of LABEL_NAMES (any case) or holding one of LABEL_WORDS."""
    return name.lower() in LABEL_NAMES or LABEL_WORDS.search(name) is not None


def labels_by_name(names: list[str]) -> list[str]:
    """The names a label is taken by, in order: those of LABEL_NAMES (any case) if any, else those holding one of
    LABEL_WORDS (the rule of `ps-worker schema` and of the built-in csv schema's label)."""
    return [h for h in names if h.lower() in LABEL_NAMES] or [h for h in names if LABEL_WORDS.search(h)]


KINDS = ("categorical", "multi_hot", "weighted", "numeric")
ID_KINDS = ("hashed", "raw")
DENSE_TRANSFORMS = ("log", "standardize", "none")
BUCKET_TRANSFORMS = ("bucketize", "log_buckets")
TIME_TRANSFORMS = ("yymmddhh_hour", "yymmddhh_weekday", "unix_hour", "unix_weekday", "iso_hour", "iso_weekday")
# <time format>_<part>: worker/timestamps.py's formats
SPARSE_TRANSFORMS = BUCKET_TRANSFORMS + TIME_TRANSFORMS  # a numeric column of these gives ids
CRITEO_COLUMNS = ("label", *(f"I{i + 1}" for i in range(NUM_INT_FIELDS)), *(f"C{i + 1}" for i in range(NUM_CAT_FIELDS)))
LIBSVM_COLUMN = re.compile(r"f(0|[1-9][0-9]*)")
# --libsvm-values: the built-in libsvm schema's fields read a token's value as its weight (weights) or leave it out
# (one-hot); auto: weights where libsvm_sample finds a value other than 0 and 1 in the data's first lines
LIBSVM_VALUES = ("auto", "one-hot", "weights")
MAX_LIBSVM_FIELDS = 1024  # f0..f1023: a libsvm field is a token's position (a chunk of lines holds K ids a line)
_TOP_KEYS = ("format", "delimiter", "label", "bias_table", "tables", "columns")
_SPARSE_KEYS = ("table", "id_space")
_KEYS = {
    "categorical": ("name", "source", "kind", *_SPARSE_KEYS, "ids"),
    "multi_hot": ("name", "source", "kind", *_SPARSE_KEYS, "ids", "separator", "pooling", "max_length"),
    "numeric": ("name", "source", "kind", "transform", *_SPARSE_KEYS, "boundaries", "mean", "std"),
}
_KEYS["weighted"] = _KEYS["multi_hot"]


@dataclass(frozen=True)
class Column:
    """One field of a schema (see the module docstring). Sparse columns carry their table (the default table
    filled in) and, for hashed ids, their id space; numeric features carry neither."""

    name: str
    source: str
    kind: str
    table: str | None = None
    id_space: str | None = None
    ids: str = "hashed"
    separator: str = "|"
    pooling: str = "sum"
    max_length: int = 256
    transform: str | None = None
    boundaries: tuple[float, ...] = ()
    mean: float | None = None
    std: float | None = None

    @property
    def is_sparse(self) -> bool:
        """Whether the column gives ids (a sparse field) rather than a numeric feature."""
        return self.kind != "numeric" or self.transform in SPARSE_TRANSFORMS


# The one id space of the built-in libsvm schema's fields: a libsvm id names a feature wherever its token stands in
# the line, and lines that leave features out put one feature at other positions. On an audit's data (60 binary
# features, 3 to 21 per line) LR reached AUC 0.9362 with one id space against 0.9103 with a space per position
# (a logistic regression fitted directly: 0.9367); with 30% of two fields missing, 0.8132 against 0.8103.
LIBSVM_ID_SPACE = "all"


def libsvm_column(name: str, table: str | None, shared: bool = True, weighted: bool = False) -> Column:
    """Column f<k> of the built-in libsvm schema (worker/schema_builtin.py): the k-th token, in the id space all
    of its fields share (LIBSVM_ID_SPACE); shared=False: in an id space of its own (a schema file's column that
    names none), which reads ids as they were read before the built-in schema shared one. weighted: the token's
    id with its value as the weight (a weighted column, pooling sum), as the built-in schema reads a file whose
    values are not all 0 and 1; else categorical, the id alone (one-hot)."""
    return Column(name, name, "weighted" if weighted else "categorical", table, LIBSVM_ID_SPACE if shared else name)


@dataclass(frozen=True)
class TableSchema:
    """A table of a schema: its width k, and its other TableConfig fields as table_configs_from_dict gives them
    (name and dim left out)."""

    dim: int
    overrides: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Schema:
    """A parsed schema (see the module docstring); label None means the csv header's first column. label_from
    says where label came from, for messages about it: "schema" (a schema's `label`), "--label-column", or
    "first column" (the training file's first column, the built-in default), or why the built-in csv schema took
    another column (schema_builtin.csv_label); format_from, how the format was chosen, for the run's output: ""
    (given: --format, or the schema file's `format`) or what formats.detect_format saw. Neither is part of the
    schema's value (equality, to_toml, fingerprint). label_written: a schema file's `label` as it writes it, where
    spaces around it make it differ from label (legacy_fingerprint). as_written: the built-in csv schema of a header
    whose names have spaces around them, with its cells as written in their place, spaces kept (names, sources,
    label and id spaces: schema_builtin._as_written), as the worker read such a header before it trimmed its
    names: tables trained on it carry its fingerprint and hashed its ids so (model_tables.held_features says which
    schema file reads them). libsvm_values: the built-in libsvm schema's --libsvm-values (LIBSVM_VALUES), None for
    any other schema; its "auto" read one-hot has the reader watch for a value other than 0 and 1 that it leaves
    out (libsvm_reader.libsvm_cells)."""

    format: str
    delimiter: str
    label: str | None
    columns: tuple[Column, ...]
    tables: dict[str, TableSchema]
    bias_table: str
    label_from: str = field(default="schema", compare=False)
    format_from: str = field(default="", compare=False)
    label_written: str | None = field(default=None, compare=False)
    as_written: Schema | None = field(default=None, compare=False, repr=False)
    libsvm_values: str | None = field(default=None, compare=False)

    def sparse_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.is_sparse)

    def fingerprint(self, field_count: bool = True, label_written: bool = False) -> str:
        """ "schema:" and 16 hex digits of a hash of what the model's rows mean: the label column, every column in
        order, less where its cells come from (source) and the statistics train computes from the data (mean,
        std), and the bias table. In a libsvm schema the columns f<k> in their shared id space (the
        built-in schema's) count as one entry with their number K: each field a line leaves out adds its missing
        id's row, so a model read with another K scores the same lines otherwise. Weighted ones (the built-in
        schema of a file with values) count as one other entry, without K: a field a line leaves out is an empty
        bag, which adds nothing, so any K scores a line alike. Those in id spaces of their own
        (a schema file's f<k> that names none) count as one other entry, whatever their number (a schema file
        fixes it). Columns of other formats count one by one, whatever their names. Each table the model creates
        carries it (TableConfig.features): another schema, whose ids would land on rows trained for other features
        or toward another label, is refused by the servers' tables (worker/tables.py). field_count False: the
        shared fields' entry without K; label_written: the label as the schema file writes it (legacy_fingerprint)."""
        drop = {"source", "mean", "std"}
        fields = [c for c in self.columns if self.format == "libsvm" and re.fullmatch(r"f\d+", c.name)]
        shared = {c.name for c in fields if c == libsvm_column(c.name, c.table)}
        own = {c.name for c in fields if c == libsvm_column(c.name, c.table, shared=False)}
        weighted = {c.name for c in fields if c == libsvm_column(c.name, c.table, weighted=True)}
        columns = [{k: v for k, v in dataclasses.asdict(c).items() if k not in drop}
                   for c in self.columns if c.name not in shared | own | weighted]  # fmt: skip
        label = self.label_written if label_written and self.label_written is not None else self.label
        described = {"label": label, "columns": columns, "bias_table": self.bias_table,
                     "libsvm_fields": (len(shared) if field_count else "shared") if shared else bool(own)}  # fmt: skip
        if weighted:
            described["libsvm_weighted"] = True
        text = json.dumps(described, sort_keys=True, default=list)
        return "schema:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def legacy_fingerprint(self) -> str | None:
        """The fingerprint that tables trained with this schema carry when they were made before the built-in
        libsvm fields' count K was part of it (their K unrecorded), or before a schema file's label was read without
        the spaces around it (label_written: `label = " clicked"`, as `ps-worker schema` wrote a header
        `id, clicked`'s); None where it was the same."""
        legacy = self.fingerprint(field_count=False, label_written=True)
        return legacy if legacy != self.fingerprint() else None

    def libsvm_fingerprint(self, weighted: bool) -> str | None:
        """The fingerprint of this schema with its libsvm fields in their shared id space (the built-in schema's)
        read the other way: weighted: its categorical ones as weighted (a file whose values are not all 0 and 1,
        read with them as weights), else its weighted ones as categorical (one-hot, each value left out): that of
        tables trained on a file read so; None where it has no such fields."""
        columns = tuple(libsvm_column(c.name, c.table, weighted=weighted)
                        if c == libsvm_column(c.name, c.table, weighted=not weighted) else c
                        for c in self.columns) if self.format == "libsvm" else self.columns  # fmt: skip
        return dataclasses.replace(self, columns=columns).fingerprint() if columns != self.columns else None

    def dense_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if not c.is_sparse)

    def id_spaces(self) -> dict[str, int]:
        """{id space: its number, features.space_ids' space}, in the order of first appearance among the sparse
        columns."""
        out: dict[str, int] = {}
        for c in self.sparse_columns():
            if c.id_space is not None:
                out.setdefault(c.id_space, len(out))
        return out

    def model_fields(self) -> tuple[FieldSpec, ...]:
        """One FieldSpec per sparse column, then the bias field on bias_table."""
        out = [FieldSpec(c.name, c.table, self.tables[c.table].dim, c.pooling) for c in self.sparse_columns()]
        return (*out, FieldSpec(BIAS_FIELD, self.bias_table, self.tables[self.bias_table].dim))

    def table_dims(self) -> dict[str, int]:
        """{table: its width k}, in the order the model fields first use them."""
        return {f.table: f.dim for f in self.model_fields()}

    def table_overrides(self) -> dict[str, dict]:
        """{table: the TableConfig fields its [tables] section sets, and its name} (not dim: the schema's dim is
        the width k, which the model turns into the row width)."""
        return {name: {"name": name, **self.tables[name].overrides} for name in self.table_dims()}

    def needs_stats(self) -> bool:
        """Whether a standardize column lacks its mean or std (formats.column_stats computes them)."""
        return any(c.transform == "standardize" and (c.mean is None or c.std is None) for c in self.columns)

    def with_stats(self, stats: dict[str, tuple[float, float]]) -> Schema:
        """The schema with the missing means and stds of standardize columns taken from stats {column name:
        (mean, std)}; a std of 0 becomes 1."""
        columns = []
        for c in self.columns:
            if c.transform == "standardize" and (c.mean is None or c.std is None):
                if c.name not in stats:
                    raise ValueError(f"no statistics for standardize column {c.name!r}; got {sorted(stats)}")
                mean, std = (float(v) for v in stats[c.name])
                std = std if std > 0 else 1.0
                c = dataclasses.replace(c, mean=mean if c.mean is None else c.mean, std=std if c.std is None else c.std)
            columns.append(c)
        return dataclasses.replace(self, columns=tuple(columns))

    def to_toml(self) -> str:
        """The schema as a TOML file that load_schema reads back to an equal Schema (every table spelled out)."""
        lines = [f"format = {_toml(self.format)}"]
        if self.format == "csv":
            lines.append(f"delimiter = {_toml(self.delimiter)}")
        if self.label is not None:
            lines.append(f"label = {_toml(self.label)}")
        lines.append(f"bias_table = {_toml(self.bias_table)}")
        for name, t in self.tables.items():
            lines += ["", f"[tables.{toml_key(name)}]", f"dim = {t.dim}"]
            for key, value in t.overrides.items():
                value = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
                lines.append(f"{key} = {_toml(value)}")
        for c in self.columns:
            lines += ["", "[[columns]]", *_entry(c, with_table=True)]
        return "\n".join(lines) + "\n"


def _toml(value: object) -> str:
    """A TOML value: strings, numbers, booleans, lists and inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else f"{'-' * (value < 0)}inf")
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {_toml(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise ValueError(f"cannot write {value!r} as TOML")


def toml_key(key: str) -> str:
    """key as a TOML key that names it whole: bare where it may be (letters, digits, _ and -), else quoted (so that
    a dotted table name such as `user.emb` is one key, not a table inside another)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------------------
# Reading a schema file


def load_schema(path: str, *, default_table: str, default_dim: int) -> Schema:
    """The schema of a TOML file; ValueError naming the file, the column or key, and what is expected."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise ValueError(f"{path}: cannot read the schema: {e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return schema_from_text(text, str(path), default_table=default_table, default_dim=default_dim)


def schema_from_text(text: str, source: str, *, default_table: str, default_dim: int) -> Schema:
    """The schema of TOML text; errors name `source` as load_schema's name the file."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{source}: not valid TOML: {e}") from None
    return _parse(doc, source, default_table, default_dim)


def _parse(doc: dict, path: str, default_table: str, default_dim: int) -> Schema:
    _known(doc, _TOP_KEYS, path)
    fmt = _value(doc, "format", str, path, "csv", FORMATS)
    delimiter = ","
    if "delimiter" in doc:
        if fmt != "csv":
            raise ValueError(f"{path}: delimiter is for csv only, the format is {fmt}")
        delimiter = _value(doc, "delimiter", str, path)
        if len(delimiter) != 1 or delimiter in '"\r\n\0':
            raise ValueError(f"{path}: delimiter {delimiter!r}, expected one character other than a quote or newline")
    written = _value(doc, "label", str, path, None if fmt == "csv" else "label")
    label = written.strip() if written is not None else None  # as csv header names are read (header_names)
    if fmt != "csv" and label != "label":
        raise ValueError(f"{path}: label {label!r}: a {fmt} file's label column is 'label'")
    tables = _tables(_value(doc, "tables", dict, path, {}), path, default_dim)
    entries = _value(doc, "columns", list, path, [])
    if not entries:
        raise ValueError(f"{path}: no [[columns]]; expected at least one column")
    columns = tuple(_column(e, path, i, fmt, default_table) for i, e in enumerate(entries))
    _check_columns(columns, label, tables, default_table, path)
    for c in columns:
        if c.table is not None and c.table not in tables:
            tables[c.table] = TableSchema(default_dim)
    first_table = next((c.table for c in columns if c.is_sparse), default_table)
    bias_table = _value(doc, "bias_table", str, path, first_table)
    if bias_table not in tables and bias_table != default_table:
        raise ValueError(f"{path}: bias_table {bias_table!r} is not declared; tables: {sorted(tables)}")
    tables.setdefault(bias_table, TableSchema(default_dim))
    used = {c.table for c in columns} | {bias_table}
    unused = [t for t in tables if t not in used]
    if unused:
        raise ValueError(f"{path}: tables {unused} are declared but no column (nor bias_table) uses them")
    return Schema(
        fmt, delimiter, label, columns, tables, bias_table, label_written=None if written == label else written
    )


def _known(spec: dict, keys: tuple[str, ...], where: str) -> None:
    unknown = [k for k in spec if k not in keys]
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; expected some of {list(keys)}")


def _value(spec: dict, key: str, kind: type, where: str, default: object = ..., choices: tuple = ()) -> object:
    """spec[key] checked to be of `kind` (and among choices); default when absent (required without one)."""
    if key not in spec:
        if default is ...:
            raise ValueError(f"{where}: {key} is missing")
        return default
    value = spec[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "a table"}[kind]
        raise ValueError(f"{where}: {key} is {value!r}, expected {expected}")
    if choices and value not in choices:
        raise ValueError(f"{where}: {key} {value!r} is unknown; expected one of {list(choices)}")
    return value


def _tables(doc: dict, path: str, default_dim: int) -> dict[str, TableSchema]:
    out = {}
    for name, fields in table_configs_from_dict(doc, f"{path} [tables]").items():
        where = f"{path}: [tables.{name}]"
        if not TABLE_NAME_RE.fullmatch(name):
            raise ValueError(f"{where}: the name is invalid; expected 1-128 characters of [A-Za-z0-9_.-]")
        if name.startswith("dense."):
            raise ValueError(f"{where}: names starting with 'dense.' are the MLP's tables; choose another name")
        dim = _value(fields, "dim", int, where, default_dim)
        if not 1 <= dim <= MAX_DIM:
            raise ValueError(f"{where}: dim {dim}, expected 1..{MAX_DIM}")
        try:
            TableConfig(**{**fields, "dim": dim}).validate()
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        out[name] = TableSchema(dim, {k: v for k, v in fields.items() if k not in ("name", "dim")})
    return out


def _column(spec: object, path: str, index: int, fmt: str, default_table: str) -> Column:
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: columns[{index}]: expected a [[columns]] table, got {spec!r}")
    name = _value(spec, "name", str, f"{path}: columns[{index}]")
    where = f"{path}: column {name!r}"
    if not name or name.startswith("_"):
        raise ValueError(f"{where}: a name must be non-empty and not start with '_' (reserved: {BIAS_FIELD!r})")
    kind = _value(spec, "kind", str, where, ..., KINDS)
    _known(spec, _KEYS[kind], f"{where} ({kind})")
    source = _value(spec, "source", str, where, name).strip()  # as csv header names are read
    if fmt == "criteo" and source not in CRITEO_COLUMNS[1:]:
        raise ValueError(f"{where}: source {source!r} is not a criteo column; expected I1..I13 or C1..C26")
    if fmt == "libsvm" and not LIBSVM_COLUMN.fullmatch(source):
        raise ValueError(f"{where}: source {source!r} is not a libsvm column; expected f0, f1, ...")
    if fmt == "libsvm" and int(source[1:]) >= MAX_LIBSVM_FIELDS:
        raise ValueError(f"{where}: source {source!r}: a libsvm field is the position of a line's feature token "
                         f"(f0 the first), at most f{MAX_LIBSVM_FIELDS - 1}; it is not the feature's id")  # fmt: skip
    if fmt == "libsvm" and kind not in ("categorical", "weighted"):
        raise ValueError(f"{where}: kind {kind!r}: a libsvm column holds the id of a line's k-th feature "
                         "token, so its kind is 'categorical' (the id alone) or 'weighted' (the id, its value the "
                         "weight)")  # fmt: skip
    if fmt == "libsvm" and kind == "weighted":
        _known(spec, tuple(k for k in _KEYS[kind] if k not in ("separator", "max_length")),
               f"{where} (a libsvm weighted column: one id:value token)")  # fmt: skip
    transform = None
    if kind == "numeric":
        transform = _value(spec, "transform", str, where, ..., DENSE_TRANSFORMS + SPARSE_TRANSFORMS)
    sparse = kind != "numeric" or transform in SPARSE_TRANSFORMS
    for key, applies in (("table", sparse), ("id_space", sparse), ("boundaries", transform == "bucketize"),
                         ("mean", transform == "standardize"), ("std", transform == "standardize")):  # fmt: skip
        if key in spec and not applies:
            raise ValueError(f"{where}: {key} does not apply to a {kind} column with transform {transform}")
    ids = _value(spec, "ids", str, where, "hashed", ID_KINDS)
    if ids == "raw" and "id_space" in spec:
        raise ValueError(f"{where}: raw ids have no id space; drop id_space or use ids = 'hashed'")
    table = _value(spec, "table", str, where, default_table) if sparse else None
    if table is not None and not TABLE_NAME_RE.fullmatch(table):
        raise ValueError(f"{where}: table {table!r}, expected 1-128 characters of [A-Za-z0-9_.-]")
    id_space = _value(spec, "id_space", str, where, name) if sparse and ids == "hashed" else None
    if id_space == "":
        raise ValueError(f"{where}: id_space is empty")
    separator = _value(spec, "separator", str, where, "|")
    if len(separator) != 1 or separator in "\r\n\0" or (kind == "weighted" and separator == ":"):
        raise ValueError(f"{where}: separator {separator!r}, expected one character (not a newline, nor ':')")
    max_length = _value(spec, "max_length", int, where, 256)
    if max_length < 1:
        raise ValueError(f"{where}: max_length {max_length}, expected >= 1")
    pooling = _value(spec, "pooling", str, where, "sum", POOLINGS)
    return Column(name, source, kind, table, id_space, ids, separator, pooling, max_length, transform,
                  _boundaries(spec, where, transform), _number(spec, "mean", where), _std(spec, where))  # fmt: skip


def _boundaries(spec: dict, where: str, transform: str | None) -> tuple[float, ...]:
    if transform != "bucketize":
        return ()
    values = _value(spec, "boundaries", list, where)
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    if not values or not ok or any(a >= b for a, b in zip(values, values[1:])):
        raise ValueError(f"{where}: boundaries {values!r}, expected finite numbers in increasing order")
    return tuple(float(v) for v in values)


def _number(spec: dict, key: str, where: str) -> float | None:
    value = _value(spec, key, float, where, None)
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{where}: {key} {value}, expected a finite number")
    return value


def _std(spec: dict, where: str) -> float | None:
    std = _number(spec, "std", where)
    if std is not None and std <= 0:
        raise ValueError(f"{where}: std {std}, expected > 0")
    return std


def _check_columns(columns: tuple[Column, ...], label: str | None, tables: dict, default_table: str, path: str) -> None:
    seen: set[str] = set()
    for c in columns:
        if c.name in seen:
            raise ValueError(f"{path}: column {c.name!r} appears twice; field names must be unique")
        seen.add(c.name)
        if c.source == label:
            raise ValueError(f"{path}: column {c.name!r} reads {c.source!r}, the label column")
        if c.table is not None and c.table not in tables and c.table != default_table:
            raise ValueError(
                f"{path}: column {c.name!r}: table {c.table!r} is not declared ([tables.{c.table}]) and is not "
                f"the default table {default_table!r}"
            )


# ---------------------------------------------------------------------------------------------------------
# A column as TOML (Schema.to_toml, ps-worker schema)


def _entry(c: Column, with_table: bool) -> list[str]:
    """The TOML lines of one [[columns]] entry: name, kind, the table if with_table, other keys not at their
    defaults (source and id_space are the name's by default)."""
    defaults = dataclasses.replace(Column(c.name, c.source, c.kind), source=c.name, id_space=c.name)
    out = []
    for f in dataclasses.fields(Column):
        value = getattr(c, f.name)
        if value is None or (f.name == "table" and not with_table):
            continue
        if f.name in ("name", "kind", "table") or value != getattr(defaults, f.name):
            out.append(f"{f.name} = {_toml(value)}")
    return out

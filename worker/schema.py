"""The feature schema: how the columns of a data file become a model's sparse fields and numeric features.

A schema is a TOML file (`--schema FILE`); `--format criteo|csv|libsvm` with the column flags are built-in
schemas (worker/schema_builtin.py), so every run reads its data through one (`--format auto`, the default: the
format of the data's first line, format_detection.detect_format). A file is read by worker/schema_file.py, its
column kinds and Column are worker/schema_columns.py's, and Schema.to_toml writes one through worker/schema_toml.py.
Grammar (keys not listed are errors):

    format    = "csv"              # csv (default) | criteo | libsvm: how a line splits into columns, and the
                                   # columns' names (worker/readers/): csv the header's (trimmed, as are the
                                   # label and sources named here); criteo label, I1..I13,
                                   # C1..C26; libsvm label, f0, f1, ... (f<k> the k-th id:value token's id)
    delimiter = ","                # csv only: one character
    label     = "label"            # the label column (0/1); default: the training file's first column, for
                                   #   every file the run reads ("label" for criteo, libsvm)
    bias_table = "item"            # the table holding the bias row (default: the first sparse column's table)

    [tables.<name>]                # one section per table; a column without `table` uses the default table
    dim = 16                       # v's width k (floats per row: 1 + k for fm/deepfm, 1 for lr, k for dnn); default:
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
not; empty or blank, whitespace only: missing, a categorical cell's missing id and a bag's no token); a hashed id
is features' field hash of the value with the salt of its id space: id spaces are numbered in the order their
first column appears among the schema's sparse columns, and space i takes salt index i (skipping 39, the
bias's), so the Criteo schema gives exactly features.example_ids. log_buckets is features.int_bucket (Criteo's
integer treatment); a numeric cell that is empty or says NA, nan, null, none or ? (cells.MISSING_TEXTS, any
case) is missing: 0 for log and none, the mean for standardize, and its own bucket (its own hour or weekday id
for a time). A time transform's id is its hour or weekday, hashed in its id space like any value: two fields read
one time column for both (`ps-worker schema` writes them for a column whose sampled values are all dates and times
of the iso format, or one named like a time, hour or ts, whose sampled values are all valid YYMMDDHH or ten-digit
unix seconds): its hours of day and weekdays come back every day and week, where the time's own values (as ids, or
numbers standardized or bucketized) are new on every later day.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field

from worker.models.spec import BIAS_FIELD, FieldSpec
from worker.schema_columns import Column, libsvm_column
from worker.schema_toml import column_entry, toml_key, toml_value


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
    (given: --format, or the schema file's `format`) or what format_detection.detect_format saw. Neither is part of the
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
        lines = [f"format = {toml_value(self.format)}"]
        if self.format == "csv":
            lines.append(f"delimiter = {toml_value(self.delimiter)}")
        if self.label is not None:
            lines.append(f"label = {toml_value(self.label)}")
        lines.append(f"bias_table = {toml_value(self.bias_table)}")
        for name, t in self.tables.items():
            lines += ["", f"[tables.{toml_key(name)}]", f"dim = {t.dim}"]
            for key, value in t.overrides.items():
                value = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
                lines.append(f"{key} = {toml_value(value)}")
        for c in self.columns:
            lines += ["", "[[columns]]", *column_entry(c, with_table=True)]
        return "\n".join(lines) + "\n"

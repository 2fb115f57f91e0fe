"""Reading a schema file: TOML text to a Schema, every key and rule of worker/schema.py's grammar checked, each
mistake named with the file, the column or key, and what is expected."""

from __future__ import annotations

import math
import tomllib

from ps.config import MAX_DIM, TableConfig, check_table_name
from ps.table_toml import table_configs_from_dict
from worker.models.spec import BIAS_FIELD, POOLINGS
from worker.schema import Schema, TableSchema
from worker.schema_columns import (
    CRITEO_COLUMNS,
    DENSE_TRANSFORMS,
    FORMATS,
    ID_KINDS,
    KINDS,
    LIBSVM_COLUMN,
    MAX_LIBSVM_FIELDS,
    SPARSE_TRANSFORMS,
    Column,
)
from worker.train_numbers import rows_past_a_server

_TOP_KEYS = ("format", "delimiter", "label", "bias_table", "tables", "columns")
_SPARSE_KEYS = ("table", "id_space")
_KEYS = {
    "categorical": ("name", "source", "kind", *_SPARSE_KEYS, "ids"),
    "multi_hot": ("name", "source", "kind", *_SPARSE_KEYS, "ids", "separator", "pooling", "max_length"),
    "numeric": ("name", "source", "kind", "transform", *_SPARSE_KEYS, "boundaries", "mean", "std"),
}
_KEYS["weighted"] = _KEYS["multi_hot"]


def load_schema(path: str, *, default_table: str, default_dim: int, model: str | None = None) -> Schema:
    """The schema of a TOML file; ValueError naming the file, the column or key, and what is expected (model: the
    --model whose rows its tables' dims must fit, train_numbers.rows_past_a_server; None: any dim a server holds)."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise ValueError(f"{path}: cannot read the schema: {e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return schema_from_text(text, str(path), default_table=default_table, default_dim=default_dim, model=model)


def schema_from_text(
    text: str, source: str, *, default_table: str, default_dim: int, model: str | None = None
) -> Schema:
    """The schema of TOML text; errors name `source` as load_schema's name the file."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{source}: not valid TOML: {e}") from None
    return _parse(doc, source, default_table, default_dim, model)


def _parse(doc: dict, path: str, default_table: str, default_dim: int, model: str | None) -> Schema:
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
    tables = _tables(_value(doc, "tables", dict, path, {}), path, default_dim, model)
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


def _check_table_name(name: str, where: str) -> None:
    """ValueError, after where, unless name is one a table may have (ps.config.check_table_name)."""
    try:
        check_table_name(name)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _tables(doc: dict, path: str, default_dim: int, model: str | None) -> dict[str, TableSchema]:
    out = {}
    for name, fields in table_configs_from_dict(doc, f"{path} [tables]").items():
        where = f"{path}: [tables.{name}]"
        _check_table_name(name, where)
        if name.startswith("dense."):
            raise ValueError(f"{where}: names starting with 'dense.' are the MLP's tables; choose another name")
        dim = _value(fields, "dim", int, where, default_dim)
        if not 1 <= dim <= MAX_DIM:
            raise ValueError(f"{where}: dim {dim}, expected 1..{MAX_DIM}")
        past = rows_past_a_server(model, dim) if model is not None else None
        if past:
            raise ValueError(f"{where}: dim {dim}: {past}")
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
    if table is not None:
        _check_table_name(table, where)
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

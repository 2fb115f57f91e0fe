"""Tables' settings read from TOML (a --table-config file, a feature schema's [tables.<name>] sections) into the
fields of their TableConfig, with an error that names the table and key that is wrong."""

from __future__ import annotations

import difflib
import types
import typing

from ps.config import (
    FULL_AT_REST,
    OPTIMIZER_PARAMS,
    VALUES_AT_REST,
    AdmissionConfig,
    EvictionConfig,
    InitializerConfig,
    OptimizerConfig,
    TableConfig,
)
from ps.errors import InvalidArgumentError, echo

_SECTIONS = {
    "initializer": InitializerConfig,
    "optimizer": OptimizerConfig,
    "admission": AdmissionConfig,
    "eviction": EvictionConfig,
}


_SCALARS = ("dim", "weight_bound", "l2", "values_at_rest")  # TableConfig's settings that are plain values
_SETTINGS = (*_SCALARS, *_SECTIONS)  # every key of a table's section, as messages list them
_EXAMPLES = {  # of each section, for messages
    "initializer": 'initializer = { name = "uniform", scale = 0.01 }',
    "optimizer": 'optimizer = { name = "adagrad", learning_rate = 0.05 }',
    "admission": "admission = { min_count = 2 }",
    "eviction": "eviction = { ttl_steps = 1000 }",
}


def _check_toml_type(what: str, value: object, hint: object) -> None:
    """InvalidArgumentError naming `what` unless value (parsed TOML) has the type of a config field's hint: a
    number for float (an integer too), an integer for int, a string for str, a table of numbers for dict[str,
    float]; `X | None` is X (TOML has no null)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(k for k in typing.get_args(hint) if k is not type(None))
    kind = typing.get_origin(hint) or hint
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    fits = {float: number, int: number and isinstance(value, int), str: isinstance(value, str)}.get(kind)
    if kind is dict and isinstance(value, dict):
        for k, v in value.items():
            _check_toml_type(f"{what}.{k}", v, float)
        return
    if not fits:
        expected = {float: "a number", int: "an integer", str: "a string", dict: "a table of numbers"}.get(kind, kind)
        raise InvalidArgumentError(f"{what} must be {expected}, got {value!r}")


def table_configs_from_toml(text: str, source: str = "table config") -> dict[str, dict]:
    """Parses a TOML file of tables, one section each, into {name: fields for TableConfig}:

        [fm]
        dim = 9                      # optional where the model decides it
        weight_bound = 10.0
        l2 = 0.0                     # > 0: lazy L2 (ps.rows.update); not with ftrl, which has its own
        values_at_rest = "float32"   # or "float16": embeddings in RocksDB at half the bytes (TableConfig)
        initializer = { name = "uniform", scale = 0.01, seed = 0 }
        optimizer = { name = "ftrl", learning_rate = 0.05, params = { l1 = 1.0, l2 = 0.1 } }
        admission = { min_count = 2 }
        eviction = { ttl_steps = 1000, score_threshold = 0.5, decay = 0.98 }

    InvalidArgumentError names the table and key that is wrong."""
    import tomllib

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidArgumentError(f"{source}: not valid TOML: {e}") from None
    return table_configs_from_dict(doc, source)


def table_configs_from_dict(doc: dict, source: str) -> dict[str, dict]:
    """{name: fields for TableConfig} of parsed TOML tables, one per table name (the form of
    table_configs_from_toml's file; a feature schema's [tables.<name>] sections parse the same way).
    InvalidArgumentError names `source`, the table and the key that is wrong; a values_at_rest other than
    VALUES_AT_REST's is wrong, "" included (which a TableSpec, unlike a file, may carry: TableConfig.values_at_rest).
    """
    out = {}
    for name, spec in doc.items():
        if not isinstance(spec, dict):
            raise InvalidArgumentError(f"{source}: [{name}] must be a table of settings, got {spec!r}")
        fields: dict = {"name": name}
        for key, value in spec.items():
            if key in _SECTIONS:
                cls = _SECTIONS[key]
                hints = typing.get_type_hints(cls)  # its fields' types, by name
                known = set(hints)
                if not isinstance(value, dict):
                    raise InvalidArgumentError(
                        f"{source}: [{name}] {key} must be an inline table of its settings ({_EXAMPLES[key]}), got "
                        f"{value!r}"
                    )
                unknown = sorted(set(value) - known)
                if unknown:
                    raise InvalidArgumentError(
                        f"{source}: [{name}.{key}] has unknown keys {unknown}; known: {sorted(known)}"
                    )
                if key == "optimizer" and "name" not in value:  # its defaults (learning rate, params) are per name
                    raise InvalidArgumentError(
                        f"{source}: [{name}.optimizer] needs a name, one of {sorted(OPTIMIZER_PARAMS)}"
                    )
                for field_name, field_value in value.items():
                    _check_toml_type(f"{source}: [{name}] {key}.{field_name}", field_value, hints[field_name])
                fields[key] = cls(**value)
            elif key in _SCALARS:
                _check_toml_type(f"{source}: [{name}] {key}", value, typing.get_type_hints(TableConfig)[key])
                if key == "values_at_rest" and value not in VALUES_AT_REST:  # "" too: unspecified is the wire's only
                    raise InvalidArgumentError(f"{source}: [{name}] values_at_rest {echo(value)} is unknown; expected "
                                               f"one of {VALUES_AT_REST} (without the key: {FULL_AT_REST!r})")  # fmt: skip
                fields[key] = value
            else:
                if isinstance(value, dict) and value and set(value) <= set(_SETTINGS):  # a table's settings in it
                    nested = f" (a table's settings are a section of their own: [{key}], not [{name}.{key}])"
                else:
                    close = difflib.get_close_matches(key, _SETTINGS, n=1)
                    nested = f" (did you mean {close[0]!r}?)" if close else ""
                raise InvalidArgumentError(
                    f"{source}: [{name}] has unknown key {key!r}; known: {', '.join(_SETTINGS)}{nested}"
                )
        out[name] = fields
    return out

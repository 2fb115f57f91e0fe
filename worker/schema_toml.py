"""A schema written as TOML: values, keys and one [[columns]] entry (Schema.to_toml, `ps-worker schema`)."""

from __future__ import annotations

import dataclasses
import json
import math
import re

from worker.schema_columns import Column


def toml_value(value: object) -> str:
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
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise ValueError(f"cannot write {value!r} as TOML")


def toml_key(key: str) -> str:
    """key as a TOML key that names it whole: bare where it may be (letters, digits, _ and -), else quoted (so that
    a dotted table name such as `user.emb` is one key, not a table inside another)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def column_entry(c: Column, with_table: bool) -> list[str]:
    """The TOML lines of one [[columns]] entry: name, kind, the table if with_table, other keys not at their
    defaults (source and id_space are the name's by default)."""
    defaults = dataclasses.replace(Column(c.name, c.source, c.kind), source=c.name, id_space=c.name)
    out = []
    for f in dataclasses.fields(Column):
        value = getattr(c, f.name)
        if value is None or (f.name == "table" and not with_table):
            continue
        if f.name in ("name", "kind", "table") or value != getattr(defaults, f.name):
            out.append(f"{f.name} = {toml_value(value)}")
    return out

"""Synthetic data (worker/synthetic.py) written to a file, and the schema that reads it back.

Files (`write_synthetic`): without history, the Criteo format of worker/criteo.py. With history, CSV:

    file    := header row*
    header  := "label,I1,...,I13,C1,...,C26,history" "\n"
    row     := label ("," int){13} ("," cat){26} "," history "\n"
    label   := "0" | "1"
    int     := "" | a base-10 integer          # "" = MISSING_INT
    cat     := "" | hex                        # "" = MISSING_CAT
    history := "" | hex ("|" hex)*             # the bag's values in order; "" = an empty bag
    hex     := 16 lowercase hex digits         # features.cat_values reads back the number

`schema_text(config)` is the TOML schema (worker/schema.py) that reads the written file (CSV or Criteo) into
exactly the Batches of `SyntheticData.batches`.
"""

from __future__ import annotations

import gzip
import math
import os

import numpy as np

from worker.batch import Bags
from worker.criteo import format_criteo
from worker.features import MISSING_CAT, MISSING_INT, NUM_FIELDS, NUM_INT_FIELDS
from worker.metrics import auc, logloss
from worker.synthetic import (
    BLOCK_ROWS,
    CAT_NAMES,
    FIELD_NAMES,
    HISTORY_FIELD,
    INT_NAMES,
    RawRows,
    SyntheticConfig,
    SyntheticData,
)

_WRITE_ROWS = 16 * BLOCK_ROWS


_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def write_synthetic(path: str | os.PathLike, config: SyntheticConfig, start: int = 0, stop: int | None = None) -> dict:
    """Write rows [start, stop) (stop defaults to config.rows), replacing the file: a Criteo file without
    history (the built-in criteo schema reads their ids), else the CSV of the module docstring (read by
    schema_text(config)); gzip-compressed when the path ends in .gz. Returns the rows' click rate and the planted
    model's AUC and logloss on them: {"rows", "click_rate", "oracle_auc", "oracle_logloss"}."""
    data = SyntheticData(config)
    stop = config.rows if stop is None else stop
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    labels, probs = [], []
    with opener(path, "wt", encoding="utf-8", newline="\n") as f:
        if config.history != 0:
            f.write(",".join(("label", *FIELD_NAMES, HISTORY_FIELD)) + "\n")
        for lo in range(start, stop, _WRITE_ROWS):
            rows = data.raw(lo, min(lo + _WRITE_ROWS, stop))
            labels.append(rows.labels)
            probs.append(rows.probs)
            if rows.history_values is None:
                f.write(format_criteo(rows.labels, rows.int_values, rows.cat_values))
            else:
                f.write(_format_csv(rows, rows.history_values))
    if not labels:
        return {"rows": 0, "click_rate": math.nan, "oracle_auc": math.nan, "oracle_logloss": math.nan}
    y, p = np.concatenate(labels), np.concatenate(probs)
    return {"rows": len(y), "click_rate": float(y.mean()), "oracle_auc": auc(y, p), "oracle_logloss": logloss(y, p)}


def _hex_cells(values: np.ndarray) -> np.ndarray:
    """uint64 (any shape) -> str of 16 lowercase hex digits; MISSING_CAT -> ''."""
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    digits = np.ascontiguousarray(_HEX_DIGITS[((values[..., None] >> shifts) & np.uint64(15)).astype(np.intp)])
    return np.where(values == MISSING_CAT, "", digits.view("S16")[..., 0].astype(np.str_))


def _format_csv(rows: RawRows, history_values: Bags) -> str:
    """The CSV rows (module docstring) of some rows, each ending with a newline."""
    n = len(rows.labels)
    columns = np.empty((n, 2 + NUM_FIELDS), dtype=object)
    columns[:, 0] = np.where(rows.labels == 1, "1", "0")
    ints = rows.int_values
    columns[:, 1 : 1 + NUM_INT_FIELDS] = np.where(ints == MISSING_INT, "", ints.astype(np.str_))
    columns[:, 1 + NUM_INT_FIELDS : 1 + NUM_FIELDS] = _hex_cells(rows.cat_values)
    values, bounds = _hex_cells(history_values.ids).tolist(), history_values.offsets.tolist()
    columns[:, 1 + NUM_FIELDS] = ["|".join(values[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    return "".join(",".join(row) + "\n" for row in columns.tolist())


def schema_text(config: SyntheticConfig) -> str:
    """The TOML schema (worker/schema.py) that reads the file write_synthetic writes into exactly the Batches of
    SyntheticData(config).batches: I1..I13 (log_buckets), C1..C26 (categorical), the history (multi_hot, mean
    pooling) when on, then I1_log..I13_log (log numeric features of I1..I13). The format is csv with history;
    without, criteo, its columns named label, I1..I13, C1..C26 (as a schema names the Criteo format's)."""
    history = config.history != 0
    columns = [f'name = "{name}"\nkind = "numeric"\ntransform = "log_buckets"' for name in INT_NAMES]
    columns += [f'name = "{name}"\nkind = "categorical"' for name in CAT_NAMES]
    if history:
        columns.append(
            f'name = "{HISTORY_FIELD}"\nkind = "multi_hot"\nseparator = "|"\npooling = "mean"\n'
            f"max_length = {config.history_max_length}"
        )
    columns += [f'name = "{name}_log"\nsource = "{name}"\nkind = "numeric"\ntransform = "log"' for name in INT_NAMES]
    head = [
        "# worker.synthetic's data: id spaces I1..I13 (0..12), C1..C26 (13..38)"
        + (", history (39)" if history else ""),
        'format = "csv"\ndelimiter = ","' if history else 'format = "criteo"',
        'label = "label"',
    ]
    return "\n".join(head + [f"\n[[columns]]\n{c}" for c in columns]) + "\n"

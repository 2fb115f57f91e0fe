"""Reading training data: read_batches over a CSV file, against the same rows as Criteo TSV and the csv module alone.

One file's rows (worker.synthetic's draws: a label, 13 integer columns, some empty, 26 categorical columns of hex
ids, some empty, of which TEXT_COLUMNS hold words instead) are written twice, then read in turn (alternated):

  csv         read_batches over the CSV (a header; one quoted cell holding a comma, in row QUOTED_ROW, so that
              its chunk of 4,096 rows goes through the csv module, the others through the compiled scan) through
              the built-in csv schema with --numeric-columns I1..I13: C1..C26 categorical (hashed), I1..I13
              numeric (log)
  criteo      read_batches over the same rows as Criteo TSV, through the built-in criteo schema (C1..C26 the
              same, I1..I13 both log_buckets ids and log features): the compiled scan's rate, the reference
  csv_module  csv.reader alone iterating the CSV's records, nothing encoded: the floor of a reader built on the csv
              module (the compiled scan is not)

Prints rows/s (median of the reps) of each; the last line is one JSON object.
Run: `.venv/bin/python benchmarks/parse.py` (about a minute on 2 cores with the defaults).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time

import harness  # before numpy: see its docstring
import numpy as np

from worker.criteo import hex_strings
from worker.features import MISSING_INT
from worker.formats import read_batches
from worker.schema_builtin import builtin_schema
from worker.synthetic import INT_NAMES, SyntheticConfig, SyntheticData

TEXT_COLUMNS = (2, 8, 16)  # of C1..C26 (from 0): cells "w<k>", words hashed rather than hex ids
QUOTED_ROW = 10  # its C1 cell holds a comma, so the CSV quotes it


def cells(rows: int, seed: int) -> np.ndarray:
    """str (rows, 40): label, I1..I13, C1..C26 of the synthetic rows, missing values empty."""
    raw = SyntheticData(SyntheticConfig(rows=rows, seed=seed)).raw(0, rows)
    out = np.empty((rows, 40), dtype=object)
    out[:, 0] = np.where(raw.labels == 1, "1", "0")
    out[:, 1:14] = np.where(raw.int_values == MISSING_INT, "", raw.int_values.astype(np.str_))
    cats = hex_strings(raw.cat_values).astype(object)
    for c in TEXT_COLUMNS:
        words = np.char.add("w", (raw.cat_values[:, c] % np.uint64(5000)).astype(np.str_)).astype(object)
        cats[:, c] = np.where(cats[:, c] == "", "", words)
    out[:, 14:] = cats
    out[QUOTED_ROW % rows, 14] = "a, b"
    return out


def write_files(table: np.ndarray, tmp: str) -> tuple[str, str]:
    """(CSV path, TSV path) of the same cells."""
    csv_path, tsv_path = os.path.join(tmp, "data.csv"), os.path.join(tmp, "data.tsv")
    header = ["label", *INT_NAMES, *(f"C{k + 1}" for k in range(26))]
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(table.tolist())
    with open(tsv_path, "w") as f:
        f.write("".join("\t".join(row) + "\n" for row in table.tolist()))
    return csv_path, tsv_path


def read_all(path: str, schema) -> int:
    return sum(len(b) for b in read_batches(path, schema, 4096))


def csv_module_rows(path: str) -> int:
    with open(path, newline="", encoding="utf-8") as f:
        return sum(1 for _ in csv.reader(f)) - 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000, help="rows of the file")
    p.add_argument("--reps", type=int, default=3, help="timed reads of each kind (alternated)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", metavar="DIR", help="write the files into DIR and keep them (default: a temp dir)")
    args = p.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or tmp
        os.makedirs(folder, exist_ok=True)
        csv_path, tsv_path = write_files(cells(args.rows, args.seed), folder)
        header = ["label", *INT_NAMES, *(f"C{k + 1}" for k in range(26))]
        csv_schema = builtin_schema("csv", default_table="t", default_dim=8, header=header, numeric_columns=INT_NAMES)
        tsv_schema = builtin_schema("criteo", default_table="t", default_dim=8)
        counts: dict[str, int] = {}

        def leg(name: str, fn) -> harness.Leg:
            return harness.Leg(name, lambda _: counts.__setitem__(name, fn()))

        legs = harness.alternate(
            [
                leg("csv", lambda: read_all(csv_path, csv_schema)),
                leg("criteo", lambda: read_all(tsv_path, tsv_schema)),
                leg("csv_module", lambda: csv_module_rows(csv_path)),
            ],
            reps=args.reps,
            warmup=1,
        )
        sizes = {"csv_bytes": os.path.getsize(csv_path), "tsv_bytes": os.path.getsize(tsv_path)}
    rates = {leg.name: harness.rate(args.rows, leg.seconds) for leg in legs}
    for leg in legs:
        if counts[leg.name] != args.rows:
            print(f"{leg.name}: read {counts[leg.name]:,} rows, expected {args.rows:,}", file=sys.stderr)
            return 1
        low, high = args.rows / max(leg.seconds), args.rows / min(leg.seconds)
        print(f"{leg.name:10s} {rates[leg.name]:>10,.0f} rows/s  (min-max {low:,.0f}-{high:,.0f}, "
              f"{len(leg.seconds)} reps)", flush=True)  # fmt: skip
    print(
        f"csv / criteo {rates['csv'] / rates['criteo']:.2f}; csv / csv_module {rates['csv'] / rates['csv_module']:.2f}"
    )
    harness.emit({"benchmark": "parse", "rows": args.rows, "columns": 40, **sizes,
                  "rows_per_s": rates, "seconds": time.perf_counter() - started})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`ps-worker synth` and `ps-worker schema`: their parsers, and their runs (a synthetic data file written; a schema
inferred from a data sample, printed or written)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ps.flagtypes import HelpFormatter, integer, number
from worker.flags import check_new_file, check_not_an_input, check_output_file, delimiter


def add_synth_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth",
        help="write synthetic Criteo-format data with a planted model",
        description="Write rows of the synthetic generator: a Criteo-format file (label, 13 ints, 26 hex), or with "
        "--history a CSV with a multi-hot history column and, beside it, the schema that reads it (OUT.schema.toml).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--rows", type=integer(1), default=None, help="rows to write (default 100,000; with --small 10,000)")
    p.add_argument("--start", type=integer(0), default=0, help="first row index (use a later range for eval data)")
    p.add_argument("--interactions", type=number(-1e3, 1e3), default=0.0,
                   help="strength of the planted pairwise interactions")  # fmt: skip
    p.add_argument("--history", type=number(0, 1e3), default=0.0, help="strength of a planted multi-hot history column")
    p.add_argument(
        "--small",
        action="store_true",
        help="the small-data regime: few rows over 10^5+ values, with interactions (overfits easily)",
    )
    p.add_argument(
        "--seed", type=integer(0, 2**63 - 1), default=0, help="seed of the generator: its planted model and its rows"
    )
    p.add_argument("--overwrite", action="store_true", help="replace --out (and OUT.schema.toml) if they exist; "
                   "without it an existing file is an error")  # fmt: skip


def add_schema_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "schema",
        help="print a starting feature schema inferred from a data sample",
        description="Read a sample of a data file's rows and print a TOML feature schema for --schema: the label, "
        "numeric columns (log or standardized), multi-hot columns, categorical columns. Review it before training.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--data",
        required=True,
        help="a data file (.gz read through gzip), or many: a directory, a "
        "quoted glob or a comma-separated list, sampled across their files",
    )
    p.add_argument("--format", default="auto", choices=["auto", "csv", "criteo", "libsvm"],
                   help="the file's format; auto: csv where --delimiter is given, else told by the first line as "
                   "train tells it (libsvm, criteo, or csv: a header line of names separated by commas, tabs, ; "
                   "or |, the delimiter written into the schema)")  # fmt: skip
    p.add_argument(
        "--delimiter",
        default=None,
        help="csv: the column separator, one character ($'\\t', '\\t' or tab: a tab; default ',')",
    )
    p.add_argument(
        "--rows",
        type=integer(1),
        default=10_000,
        help="rows of the sample: half the file's first, half spread over the rest (all from the start of a .gz file, "
        "or of one whose quoted fields hold line ends)",
    )
    p.add_argument("--out", default=None, help="write the schema here instead of printing it")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists (a schema you edited, say); "
                   "without it an existing file is an error")  # fmt: skip


def run_synth(args: argparse.Namespace) -> int:
    import dataclasses

    from worker.results import auc_text
    from worker.synthetic import SMALL_DATA_ROWS, SyntheticConfig, small_data_config
    from worker.synthetic_files import schema_text, write_synthetic

    if args.rows is None:
        args.rows = SMALL_DATA_ROWS if args.small else 100_000
    if args.small:
        cfg = dataclasses.replace(small_data_config(args.seed), rows=args.start + args.rows)
    else:
        cfg = SyntheticConfig(rows=args.start + args.rows, seed=args.seed, interactions=args.interactions)
    if args.history:
        cfg = dataclasses.replace(cfg, history=args.history)
    for flag, path in (("--out", args.out), ("the schema beside --out", args.out + ".schema.toml")):
        if flag == "--out" or cfg.history:  # checked before anything is written
            check_output_file(flag, path)
            check_new_file(flag, path, args.overwrite)
    written = _write_whole(args.out, lambda path: write_synthetic(path, cfg, args.start, args.start + args.rows))
    print(f"wrote rows [{args.start}, {args.start + args.rows}) to {args.out}: click rate {written['click_rate']:.1%}; "
          f"the planted model that drew their labels scores AUC {auc_text(written['oracle_auc'])}, logloss "
          f"{written['oracle_logloss']:.4f} on them: the mark for a model evaluated on these rows")  # fmt: skip
    if args.small and args.start == 0 and args.rows <= 10 * SMALL_DATA_ROWS:  # (as measured up to 100,000 rows)
        print(f"  (--small: in {args.rows:,} such rows most ids are seen once or twice, so a model learns little of "
              f"them: a tuned logistic regression trained on {SMALL_DATA_ROWS:,} scores AUC 0.63-0.65, far under "
              "that mark, benchmarks/small_data.py)")  # fmt: skip
    if cfg.history:
        import os

        from ps.storage.atomicfile import write_text_whole

        schema = args.out + ".schema.toml"
        try:  # whole or not at all, as --out is
            write_text_whole(schema, schema_text(cfg), temp_prefix=f".{os.path.basename(schema)}.", shared=True)
        except OSError as e:
            raise OSError(f"the schema beside --out, {schema}: could not write it ({e.strerror or e}); nothing was "
                          f"written there (the rows are in {args.out})") from None  # fmt: skip
        print(
            f"wrote its schema to {args.out}.schema.toml (train with --data {args.out} --schema {args.out}.schema.toml)"
        )
    return 0


def _write_whole(out: str, write: Any) -> Any:
    """write(path) into a hidden temporary file beside `out` (its .gz suffix kept), renamed to `out` once whole
    (atomicfile.replaced_whole): a write that fails (a full disk), or a stop, leaves `out` as it was, and the error
    names --out."""
    import os

    from ps.storage.atomicfile import replaced_whole

    suffix = ".tmp" + (".gz" if out.endswith(".gz") else "")
    try:
        with replaced_whole(out, f".{os.path.basename(out)}.", suffix, shared=True) as tmp:
            return write(tmp)
    except OSError as e:
        raise OSError(f"--out {out}: could not write it ({e.strerror or e}); nothing was written there") from None


def run_schema(args: argparse.Namespace) -> int:
    from worker.datafiles import check_data_input
    from worker.schema_infer import infer_schema

    check_data_input("--data", args.data, "a data file, or a directory, glob or comma-separated list of them")
    check_not_an_input("--out", args.out, {"--data": args.data})
    check_output_file("--out", args.out)
    check_new_file("--out", args.out, args.overwrite)
    fmt = "csv" if args.format == "auto" and args.delimiter is not None else args.format
    text, checks = infer_schema(args.data, fmt=fmt, delimiter=delimiter(args.delimiter or ","), sample_rows=args.rows)
    for check in checks:
        print(f"ps-worker schema: {check}", file=sys.stderr)
    if args.out:
        from ps.storage.atomicfile import write_text_whole

        try:
            write_text_whole(args.out, text, shared=True)  # whole or not at all, readable as a file open() makes
        except OSError as e:
            raise OSError(
                f"--out {args.out}: could not write it ({e.strerror or e}); nothing was written there"
            ) from None
        print(f"wrote a schema inferred from {args.data} to {args.out}")
    else:
        print(text, end="")
    return 0

"""The `predict` command of ps-worker: its flags (eval's, plus the output file), the PredictConfig they make, and
running it (worker/predict.py)."""

from __future__ import annotations

import argparse
import json
import sys

from ps.flagtypes import HelpFormatter
from worker.cli_flags import add_served_model_args
from worker.cli_train_config import common_config, names
from worker.predict import STDOUT, PredictConfig, predict_servers
from worker.train_config import TrainConfig


def add_predict_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="score files with the model the servers hold: one probability per example, written as CSV",
        description="Pull the rows and dense parameters the servers hold and write the model's click probability "
        "of every example of --predict-data (else of --data) to --out: a CSV file 'line,probability[,label]', one "
        "row per example in file order, `line` its line in the input (worker/predict.py); of a directory, a glob "
        "or a comma-separated list (as for train), 'file,line,probability[,label]', however many files it matches. The files may "
        "lack labels. The model and data flags must be those the model was trained with; --data the training file, "
        "whose first lines give the schema (a CSV without the label column needs it, or a --schema).",
        formatter_class=HelpFormatter,
    )
    add_served_model_args(p, "predict")
    out = p.add_argument_group("output")
    out.add_argument("--out", required=True, help="the CSV file to write (written whole under a temporary name, "
                     "then renamed); - writes the CSV to stdout as it is scored, and the final line to stderr")  # fmt: skip
    out.add_argument("--overwrite", action="store_true", help="replace --out if it exists; without it an existing "
                     "file is an error")  # fmt: skip
    out.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (when stderr is no terminal, a plain progress line every 30 s takes the bar's place)",
    )
    out.add_argument("--json", action="store_true", help="print one JSON object instead of the final line")
    out.add_argument("--keep-columns", default="", help="CSV input: comma-separated columns of its header copied "
                     "into each row, after the output's own (an id, to join the predictions back to the rows)")  # fmt: skip


def predict_config(args: argparse.Namespace) -> PredictConfig:
    """The PredictConfig of parsed `predict` arguments: --predict-data alone also stands for --data (the file whose
    first lines give the schema), and --data alone is the file scored."""
    scored = args.predict_data or args.data
    if scored is None:
        raise ValueError("predict scores a file: give --predict-data FILE (with --data, the training file whose first "
                         "lines give the schema), or --data FILE alone")  # fmt: skip
    run = TrainConfig(**{**common_config(args), "data": args.data or scored, "prefetch": args.prefetch})
    flag = "--predict-data" if args.predict_data else "--data"
    return PredictConfig(run, scored, args.out, overwrite=args.overwrite, progress=not args.no_progress, flag=flag,
                         keep_columns=names(args.keep_columns))  # fmt: skip


def run_predict(args: argparse.Namespace) -> int:
    r = predict_servers(predict_config(args))
    said = sys.stderr if args.out == STDOUT else sys.stdout  # stdout holds the CSV alone
    if args.json:
        print(json.dumps(r), file=said, flush=True)
        return 0
    columns = ("file, " if r["file_column"] else "") + "line, probability" + (", label" if r["labeled"] else "")
    columns += "".join(f", {c}" for c in r["kept_columns"])
    lines = f"{r['bad_lines']:,} malformed line{'s' * (r['bad_lines'] != 1)}"
    skipped = f"; skipped {lines} (first: {r['first_bad']})" if r["bad_lines"] else ""
    of_files = f" ({r['files']:,} files)" if r["files"] > 1 else ""
    dest = "stdout" if args.out == STDOUT else r["out"]
    print(f"wrote {r['rows']:,} prediction{'s' * (r['rows'] != 1)} of {r['model']} ({columns}) for {r['predict_data']}{of_files} to {dest}"
          f" in {r['seconds']:.2f} s ({r['rows'] / max(r['seconds'], 1e-9):,.0f} rows/s){skipped}", file=said,
          flush=True)  # fmt: skip
    return 0

"""Scoring a file with the model the servers hold: one probability per example, written to a CSV file as it is read.

    predict_servers(cfg: PredictConfig) -> dict      # `ps-worker predict` (flags: worker/cli_predict.py)

The output file (UTF-8, "\n" line ends):

    file        := header row*
    header      := "line,probability" [",label"] "\n"      # ",label" when the input file holds labels
    row         := line "," probability ["," label] "\n"
    line        := the 1-based physical line of the example in the input file, in decimal (a CSV header is
                   line 1; a CSV record over several lines: its first)
    probability := the model's click probability as printf's "%.9g" writes a float32 (enough digits to read
                   the same float32 back; "1e-05" style for small ones)
    label       := "0" | "1"                                # the input's label of the example

One row per example, in the input's order. Malformed lines skipped (up to --max-bad-lines, reported at the
end) and empty lines have no row, so `line` skips their numbers. A file without labels (a csv header without
the label column, criteo lines of 39 columns, libsvm lines without the label token; worker/formats.py) is scored
all the same, and its output has no label column. Rows are written a batch at a time (no more than a batch of
predictions in memory), to a file beside OUT under a temporary name that becomes OUT once whole: a failed run
leaves no OUT (and with --overwrite, the earlier OUT as it was).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from worker.batch import Batch
from worker.flags import check_input_file, check_new_file, check_not_an_input, check_output_file, same_file
from worker.formats import file_has_labels, read_csv_sample
from worker.linecount import SCORING_COUNT_LINES, LineCount, count_lines_upto
from worker.loop import ScoringProgress, predictions
from worker.train import TrainConfig, served_model

log = logging.getLogger("worker.predict")


@dataclass(frozen=True)
class PredictConfig:
    """run: the model's and the data's flags, as eval's (run.data: the training file whose first lines give the
    schema); data: the file to score; out: the CSV file written (replaced only with overwrite)."""

    run: TrainConfig
    data: str
    out: str
    overwrite: bool = False
    progress: bool = True

    def validate(self) -> None:
        """ValueError naming the flag at fault, before any server is asked or anything is written."""
        self.run.validate()
        check_input_file("--predict-data", self.data, "a data file to score (.gz read through gzip)")
        check_output_file("--out", self.out)
        check_not_an_input("--out", self.out, {**self.run.input_files(), "--predict-data": self.data})
        check_new_file("--out", self.out, self.overwrite)
        r = self.run
        if r.format == "csv" and not r.schema and not r.label_column and same_file(r.data, self.data) and \
                not _first_column_is_labels(self.data):  # fmt: skip
            raise ValueError(f"--predict-data {self.data}: a CSV scored with neither the training file (--data), nor a "
                             "--schema or --label-column: its label column is unknown (the built-in CSV schema takes "
                             "the first column), and in a file without labels a feature would be taken for it; give "
                             "one of them")  # fmt: skip


def _first_column_is_labels(path: str) -> bool:
    """The first column of a CSV file's first records holds only 0 and 1 (the built-in schema's label; commas)."""
    _, rows = read_csv_sample(path, ",", 1000)
    return bool(rows) and all(r[0].strip() in ("0", "1") for r in rows)


def predict_servers(cfg: PredictConfig) -> dict:
    """Writes cfg.out (see the module docstring) and returns what was done: model, shards, predict_data, out,
    rows, labeled, bad_lines, first_bad. ValueError when the servers lack the model's tables (nothing written) or
    the file holds no example."""
    cfg.validate()
    with served_model(cfg.run, "nothing was written", labels_optional=True) as m:
        labeled = file_has_labels(cfg.data, m.data.schema)
        header = m.data.schema.format == "csv"
        counted = LineCount(0, False, 0, 0)
        if cfg.progress:  # lines, an estimate of the examples (bad and empty lines among them); of a large
            counted = count_lines_upto(cfg.data, SCORING_COUNT_LINES, header=header)  # file, from bytes
        batches = m.data.read_whole(cfg.data)
        scored = predictions(m.client, m.spec, m.backend, m.dense_values, batches, m.cfg.prefetch)
        with contextlib.closing(scored):  # read and pulled ahead on a thread, stopped with it
            rows = _write(cfg.out, scored, labeled, ScoringProgress(counted.estimate, cfg.progress, counted.more))
        shards = m.shards
    stats = next(s for path, s in m.data.read_stats if path == cfg.data)
    if rows == 0:  # _write removed its file
        why = f"; the first malformed one: {stats.first_bad}" if stats.bad_lines else ""
        raise ValueError(f"{cfg.data}: no examples to score (the file is empty, or holds only a header or malformed "
                         f"lines{why}); nothing was written")  # fmt: skip
    for line in m.data.bad_lines_report():
        log.warning(line)
    return {"model": m.cfg.model, "shards": shards, "predict_data": cfg.data, "out": cfg.out, "rows": rows,
            "labeled": labeled, "bad_lines": stats.bad_lines, "first_bad": stats.first_bad}  # fmt: skip


def format_rows(line_nos: np.ndarray, probs: np.ndarray, labels: np.ndarray | None) -> str:
    """The rows of a batch (the module docstring's grammar); labels None: the file has none."""
    p = np.asarray(probs, dtype=np.float32).tolist()
    if labels is None:
        return "".join(f"{n},{q:.9g}\n" for n, q in zip(line_nos.tolist(), p))
    return "".join(f"{n},{q:.9g},{y:.0f}\n" for n, q, y in zip(line_nos.tolist(), p, labels.tolist()))


def _write(out: str, scored: Iterable[tuple[Batch, np.ndarray]], labeled: bool, progress: ScoringProgress) -> int:
    """Writes the header and the rows of (batch, probabilities) pairs to a temporary file, renamed to `out` when
    they are all written and there is at least one; returns the row count."""
    folder, name = os.path.split(os.path.abspath(out))
    partial = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.partial")
    rows = 0
    try:
        with open(partial, "w", encoding="utf-8", newline="\n") as f:
            f.write("line,probability,label\n" if labeled else "line,probability\n")
            for batch, probs in scored:
                f.write(format_rows(batch.line_nos, probs, batch.labels if labeled else None))
                rows += len(batch)
                progress.update(len(batch))
        if rows:
            os.replace(partial, out)
    finally:
        progress.close()
        if os.path.lexists(partial):
            os.remove(partial)
    return rows

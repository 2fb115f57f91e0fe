"""Scoring files with the model the servers hold: one probability per example, written to a CSV file as it is read.

    predict_servers(cfg: PredictConfig) -> dict      # `ps-worker predict` (flags: worker/cli_predict.py)

The input is a file, or many (worker/datafiles.py: a directory, a glob, a comma-separated list), scored in order,
each the same format as the first (format_detection.check_same_format). The output file (UTF-8, "\n" line ends):

    file        := header row*
    header      := ["file,"] "line,probability" [",label"] ("," kept)* "\n"   # "file," unless the input is named
                                                                  # as one file (a directory, glob or list:
                                                                  # whatever it matches); ",label" when the input
                                                                  # holds labels; kept: each --keep-columns name
    row         := [path ","] line "," probability ["," label] ("," cell)* "\n"
    path        := the input file of the example as its flag named it (data_files), quoted as the csv module
                   quotes a field (only when it holds a comma, a quote or a line end)
    line        := the 1-based physical line of the example in its input file, in decimal (a CSV header is
                   line 1; a CSV record over several lines: its first)
    probability := the model's click probability as printf's "%.9g" writes a float32 (enough digits to read
                   the same float32 back; "1e-05" style for small ones); never NaN: such an example fails the run
    label       := "0" | "1" | ""                           # the input's label of the example; "": its label
                                                                  # cell was blank (or NA, ?), or no label (2,
                                                                  # x: formats.py's "Blank labels", counted in
                                                                  # a warning), a row to score, not a bad line
    cell        := the example's cell of a kept column (--keep-columns: columns of a CSV input's header, to join
                   the predictions back to the rows by an id), as the csv module reads it and writes it back
                   (quoted only when it must be); in the order given

One row per example, in the input's order (file by file). Malformed lines skipped (up to --max-bad-lines over all the
files, reported at the end) and empty lines have no row, so `line` skips their numbers. A file without labels (a csv
header without the label column, criteo lines of 39 columns, libsvm lines without the label token; worker/formats.py) is
scored all the same, and its output has no label column. Rows are written a batch at a time (no more than a batch of
predictions in memory), to a file beside OUT under a temporary name that becomes OUT once whole and fsynced (its folder
fsynced after: a failure of that fsync is a warning, as OUT is whole and in place, only whether its name survives a
power loss is unsure): a failed run, or a power loss, leaves no OUT cut short (and with --overwrite, the earlier OUT as
it was). Without --overwrite, an OUT that another process made while this one scored is left as it is, and the run fails
(nothing written), as one that found it at its start. `--out -` writes them to stdout instead, as they are scored (the
header with the first rows: nothing when there is none; a failed run leaves the rows written before it, its exit status
not 0), and the final line goes to stderr with the logs and progress. The name is .<name of OUT>.<pid>-<host>-<8 hex>
.partial (worker.temp_dirs.partial_file: a name of OUT past 161 bytes is cut to its start and a hash there, so that the
whole fits in a file name); a run killed by SIGKILL leaves it, and the next predict into OUT removes those of this host
whose process is gone, with a log line each (others are reported and left).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np

from ps.diskfull import DISK_FULL_ERRNOS
from ps.storage import leftovers
from ps.storage.atomicfile import sync_directory, sync_file
from worker.batch import Batch
from worker.datafiles import check_data_input, data_files
from worker.flags import check_new_file, check_not_an_input, check_output_file, same_file
from worker.format_detection import check_same_format, detect_format
from worker.formats import ReadStats, csv_records, file_has_labels, first_with_content, read_csv_header
from worker.linecount import SCORING_COUNT_LINES, LineCount, count_data_upto
from worker.readers.csv_header import header_positions
from worker.readers.csv_records import column_cells
from worker.schema import Schema
from worker.schema_builtin import csv_label
from worker.schema_columns import AUTO_FORMAT
from worker.schema_hints import HINT_SAMPLE_ROWS
from worker.scoring import ScoringProgress, predictions
from worker.served import ServedModel, served_model
from worker.temp_dirs import dead_partial_files, hold_while_written, partial_file
from worker.train_config import TrainConfig

log = logging.getLogger("worker.predict")
STDOUT = "-"  # --out's value that writes the CSV to stdout


@dataclass(frozen=True)
class PredictConfig:
    """run: the model's and the data's flags, as eval's (run.data: the training data whose first lines give the
    schema); data: the files to score (worker/datafiles.py), given by `flag`; out: the CSV file written (replaced
    only with overwrite), or STDOUT."""

    run: TrainConfig
    data: str
    out: str
    overwrite: bool = False
    progress: bool = True
    flag: str = "--predict-data"
    keep_columns: tuple[str, ...] = ()  # columns of the input copied into each row (a CSV's only)

    def validate(self) -> None:
        """ValueError naming the flag at fault, before any server is asked or anything is written."""
        self.run.validate()
        check_data_input(self.flag, self.data, "data files to score (.gz read through gzip)")
        if self.out != STDOUT:
            check_output_file("--out", self.out)
            inputs = {self.flag: self.data, **self.run.input_files()}  # the file scored named by its flag first
            check_not_an_input("--out", self.out, inputs)
            _check_new_out(self.out, self.overwrite)
        elif sys.stdout is None:  # started with its stdout closed
            raise ValueError("--out -: this process has no stdout (it was closed); give a file to write")
        own = [c for c in self.keep_columns if c in _OWN_COLUMNS]
        if own or len(set(self.keep_columns)) < len(self.keep_columns):
            why = f"{own} {'is a column' if len(own) == 1 else 'are columns'} predict writes itself" if own else \
                "a column is named twice"  # fmt: skip
            raise ValueError(f"--keep-columns {','.join(self.keep_columns)}: {why}; each column is copied once, "
                             f"beside the output's own ({', '.join(_OWN_COLUMNS)})")  # fmt: skip
        r = self.run
        if self.keep_columns and not r.schema:  # (a schema file's format: _check_kept_columns, once it is read)
            fmt = detect_format(self.data)[0] if r.format == AUTO_FORMAT else r.format
            if fmt != "csv":
                raise ValueError(_no_header(self.data, fmt))
        if not r.schema and not r.label_column and same_file(r.data, self.data) and \
                _csv_label_unknown(r.format, self.data):  # fmt: skip
            raise ValueError(f"{self.flag} {self.data}: a CSV scored with neither the training file (--data), nor a "
                             "--schema or --label-column: its label column is unknown (the built-in CSV schema takes "
                             "the first column where it holds 0 and 1, else the one column named like a label that "
                             "does: this file has neither), and in a file without labels a feature would be taken for "
                             "it; give one of them")  # fmt: skip


_OWN_COLUMNS = ("file", "line", "probability", "label")  # the output's columns (the module docstring's header)


def _check_kept_columns(columns: tuple[str, ...], data: str, schema: Schema) -> None:
    """ValueError, before anything is scored, where the data cannot give --keep-columns' columns: it is no CSV, or
    the header of its first file with content (check_same_format: the others' are that one) lacks one or names it
    twice."""
    if not columns:
        return
    if schema.format != "csv":
        raise ValueError(_no_header(data, schema.format))
    name = first_with_content(data)
    header = read_csv_header(name, schema.delimiter) or []
    try:
        header_positions(name, header, list(columns), schema.delimiter)
    except ValueError as e:
        raise ValueError(f"--keep-columns: {e}") from None


def _no_header(data: str, fmt: str) -> str:
    return (
        f"--keep-columns copies columns a CSV file's header names; {data} is read as {fmt}, whose lines have no header"
    )


def _check_new_out(out: str, overwrite: bool) -> None:
    """check_new_file's ValueError for --out, saying for one that is no regular file (/dev/stdout) how to write to
    stdout."""
    try:
        check_new_file("--out", out, overwrite)
    except ValueError as e:
        if os.path.lexists(out) and (os.path.islink(out) or not os.path.isfile(out)):
            raise ValueError(f"{e}; --out - writes the CSV to stdout") from None
        raise


def _csv_label_unknown(fmt: str, path: str) -> bool:
    """Whether a file read through the built-in schema of fmt (auto: the format format_detection.detect_format
    tells) is a CSV whose label column the schema cannot tell from its first records (schema_builtin.csv_label)."""
    delimiter: str | None = ","
    if fmt == AUTO_FORMAT:
        fmt, delimiter, _ = detect_format(path)
    if fmt != "csv" or delimiter is None:
        return False
    header, rows = csv_records(path, delimiter, HINT_SAMPLE_ROWS)
    return csv_label(header, rows) is None


def predict_servers(cfg: PredictConfig) -> dict:
    """Writes cfg.out (see the module docstring) and returns what was done: model, shards, predict_data, files,
    out, kept_columns, rows, labeled, bad_lines, first_bad, unread_labels (rows scored whose label cell held no
    label), seconds (of reading, scoring and writing the rows). ValueError when the servers lack the model's
    tables, a file differs in format from the first, --keep-columns names what the data does not hold, or the
    files hold no example (nothing written)."""
    cfg.validate()
    files = data_files(cfg.data)
    with served_model(cfg.run, "nothing was written", labels_optional=True) as m:
        check_same_format(cfg.data, m.data.schema)
        _check_kept_columns(cfg.keep_columns, cfg.data, m.data.schema)
        labeled = file_has_labels(cfg.data, m.data.schema)
        counted = LineCount(0, False, 0, 0)
        if cfg.progress:  # lines, an estimate of the examples (bad lines among them: count_data_upto); of large files,
            schema = m.data.schema  # from their bytes
            counted = count_data_upto(files, SCORING_COUNT_LINES, schema.format, delimiter=schema.delimiter)
        stats = ReadStats()  # of the files as one stream: --max-bad-lines counts over them all, as eval's
        # (reported in the summary line, not again among the read_stats warnings)
        scored = _scored(m, files, stats, cfg.keep_columns)
        started = time.perf_counter()
        with contextlib.closing(scored):  # read and pulled ahead on threads, stopped with it
            progress = ScoringProgress(counted.estimate, cfg.progress, counted.more)
            with_file = not os.path.isfile(cfg.data)
            columns = _Columns(labeled, with_file, cfg.keep_columns)
            if cfg.out == STDOUT:
                rows = _write_stdout(scored, columns, progress)
            else:
                rows = _write(cfg.out, scored, columns, progress, cfg.overwrite)
        seconds = time.perf_counter() - started
        shards = m.shards
    bad_lines, first_bad = stats.bad_lines, stats.first_bad
    if rows == 0:  # _write removed its file
        held = m.data.no_examples_held(cfg.data, stats)
        raise ValueError(f"{cfg.data}: no examples to score ({held}); nothing was written")
    for line in m.data.bad_lines_report():
        log.warning(line)
    if left := m.data.left_values_note(stats):  # (the files' stream, which read_stats does not hold)
        log.warning("%s", left)
    if stats.unread_labels:
        log.warning("%s", unread_labels_note(stats))
    return {"model": m.cfg.model, "shards": shards, "predict_data": cfg.data, "files": len(files), "out": cfg.out,
            "file_column": with_file, "kept_columns": list(cfg.keep_columns), "rows": rows, "labeled": labeled,
            "bad_lines": bad_lines, "first_bad": first_bad, "unread_labels": stats.unread_labels,
            "seconds": seconds}  # fmt: skip


def unread_labels_note(stats: ReadStats) -> str:
    """The note on the rows scored whose label cell held no label (formats.py's "Blank labels")."""
    n = stats.unread_labels
    return (f"{n:,} row{'s' * (n != 1)} had a label cell that is neither 0 nor 1 nor blank (first: "
            f"{stats.first_unread_label}): predict reads no label, so {'they were' if n != 1 else 'it was'} scored, "
            f"{'their' if n != 1 else 'its'} label written blank; eval takes such lines for malformed ones")  # fmt: skip


Scored = tuple[str, Batch, np.ndarray, list[str]]  # a file, a batch of it, its probabilities, its rows' tails


@dataclass(frozen=True)
class _Columns:
    """What the output's rows hold besides line and probability: labels, a file column, kept columns."""

    labeled: bool
    with_file: bool
    kept: tuple[str, ...]

    def header(self) -> str:
        own = ("file," if self.with_file else "") + ("line,probability,label" if self.labeled else "line,probability")
        return own + "".join("," + _csv_field(c) for c in self.kept) + "\n"


def _scored(m: ServedModel, files: list[str], stats: ReadStats, kept: tuple[str, ...]) -> Iterator[Scored]:
    """(file, batch, probabilities, the kept columns' cells of each example as a row's tail: ",a,b", or "") of every
    batch of the files, in order, their bad lines counted into stats (each file read and pulled ahead on threads,
    which closing this generator stops). The kept cells are read beside, from a reading of the file of its own
    (csv_records.column_cells), matched to the batch's examples by their line numbers."""
    for name in files:
        batches = m.data.read_whole(name, stats)
        records = column_cells(name, m.data.schema.delimiter, list(kept)) if kept else None
        try:
            with contextlib.closing(predictions(m.client, m.spec, m.backend, m.dense_values, batches,
                                                m.cfg.prefetch)) as s:  # fmt: skip
                for batch, probs in s:
                    tails = [""] * len(batch) if records is None else _kept_tails(name, records, batch.line_nos)
                    yield name, batch, probs, tails
        finally:
            if records is not None:
                records.close()  # (its file)


def _kept_tails(name: str, records: Iterator[tuple[int, list[str]]], line_nos: np.ndarray) -> list[str]:
    """The row tails (",a,b") of the records of these line numbers, in order, read on from records."""
    tails = []
    for n in line_nos.tolist():
        for line, cells in records:
            if line == n:
                tails.append("".join("," + _csv_field(c) for c in cells))
                break
        else:  # the readers number a file's records alike: a scored record is one column_cells gives
            raise RuntimeError(f"{name} line {n}: scored, but no record of the file's second reading starts there")
    return tails


def format_rows(line_nos: np.ndarray, probs: np.ndarray, labels: np.ndarray | None, path: str | None = None,
                tails: list[str] | None = None) -> str:  # fmt: skip
    """The rows of a batch (the module docstring's grammar); labels None: the file has none; path: the file column's
    value (None: no file column); tails: each row's kept cells (",a,b"; None: no kept columns)."""
    p = np.asarray(probs, dtype=np.float32).tolist()
    lead = "" if path is None else _csv_field(path) + ","
    tails = tails or [""] * len(p)
    if labels is None:
        return "".join(f"{lead}{n},{q:.9g}{t}\n" for n, q, t in zip(line_nos.tolist(), p, tails))
    return "".join(f"{lead}{n},{q:.9g},{'' if y != y else f'{y:.0f}'}{t}\n"  # y != y: NaN, a blank label
                   for n, q, y, t in zip(line_nos.tolist(), p, labels.tolist(), tails))  # fmt: skip


def _csv_field(text: str) -> str:
    """text as one CSV field, quoted only when it must be (csv.QUOTE_MINIMAL)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow([text])  # a field holding "\r" or "\n" is quoted
    return out.getvalue()[:-2]


_NO_ROOM = {*DISK_FULL_ERRNOS, errno.EFBIG}  # a write's errors: the disk (or a quota) is full, or the file too big


def _write(out: str, scored: Iterable[Scored], columns: _Columns, progress: ScoringProgress,
           overwrite: bool) -> int:  # fmt: skip
    """Writes the header and the rows of the scored batches to a temporary file, put in place as `out` when they are
    all written and there is at least one (_put_in_place: without overwrite, never over a file made meanwhile).
    Returns the row count."""
    dead, others = dead_partial_files(out)
    leftovers.remove(dead, "a predict killed mid-write")
    leftovers.report(others, f"another predict into {out} may be running (here or on another host, or named "
                     "without its process): remove it once none is")  # fmt: skip
    partial = partial_file(out)
    rows, opened = 0, False
    try:
        # a file name that is not UTF-8 (os.listdir's surrogate escapes) is written as the bytes it has on disk
        with leftovers.open_temporary(partial, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
            opened = True
            hold_while_written(f.fileno())  # a predict of another process namespace sees it is alive
            rows = _write_rows(f, scored, columns, progress)
            if rows:  # on disk before it is named OUT: a power loss leaves no OUT cut short
                sync_file(f)
        if rows:
            _put_in_place(partial, out, overwrite)
            try:
                sync_directory(os.path.dirname(os.path.abspath(out)))  # the name, after a power loss too
            except OSError as e:  # OUT is whole and in place: only whether its name survives a power loss is unsure
                log.warning("--out %s is written whole (%s rows), but the fsync of its folder failed (%s): a power "
                            "loss soon may lose its name", out, f"{rows:,}", e.strerror or e)  # fmt: skip
    except OSError as e:
        if e.errno not in _NO_ROOM and e.filename not in (partial, out):  # a data file's read error names that file
            raise
        raise OSError(f"--out {out}: could not write the predictions ({e.strerror}); nothing was written "
                      "there") from None  # fmt: skip
    finally:
        progress.close()
        if opened and os.path.lexists(partial):  # what stands there when it could not be opened is not this run's
            os.remove(partial)
    return rows


_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}  # a file system that makes no hard link


def _put_in_place(partial: str, out: str, overwrite: bool) -> None:
    """Renames partial to out. Without overwrite, ValueError where out exists (another process made it while this
    one scored: validate found none), leaving it as it is: partial is hard-linked as out, which no file there lets
    happen (_write's cleanup then removes partial); on a file system without hard links, out is looked for just
    before the rename."""
    if overwrite:
        os.replace(partial, out)
        return
    try:
        os.link(partial, out)
    except FileExistsError:
        raise ValueError(_MADE_MEANWHILE.format(out=out)) from None
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
        if os.path.lexists(out):
            raise ValueError(_MADE_MEANWHILE.format(out=out)) from None
        os.replace(partial, out)


_MADE_MEANWHILE = (
    "--out {out} was made by another process while this predict ran (it did not exist as it began); it is left as "
    "it is, and nothing was written: give another file name, or --overwrite to replace it"
)


def _write_stdout(scored: Iterable[Scored], columns: _Columns, progress: ScoringProgress) -> int:
    """_write's rows written to stdout (--out -) as they are scored, in UTF-8 whatever the locale: nothing (not
    even the header) when there is no row; a failed run leaves the rows written before it. Returns the row
    count."""
    sys.stdout.flush()
    out = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors="surrogateescape", newline="\n")
    try:
        try:
            rows = _write_rows(out, scored, columns, progress)
            out.flush()
        finally:
            progress.close()
            out.detach()  # stdout stays open
    except OSError as e:
        if e.errno not in _NO_ROOM:
            raise
        raise OSError(f"--out -: could not write the predictions to stdout ({e.strerror})") from None
    return rows


def _write_rows(f: IO[str], scored: Iterable[Scored], columns: _Columns, progress: ScoringProgress) -> int:
    """Writes the header with the first rows, then the rest, to f; returns the row count (0: nothing written)."""
    rows, started = 0, False
    for path, batch, probs, tails in scored:
        if not started:
            started = True
            f.write(columns.header())
        labels = batch.labels if columns.labeled else None
        f.write(format_rows(batch.line_nos, probs, labels, path if columns.with_file else None, tails))
        rows += len(batch)
        progress.update(len(batch))
    return rows

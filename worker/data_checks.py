"""The checks of a run's data before training (DataChecks, a part of worker/data.py's DataSource): every worker
reads some of --data, each input read for training or evaluation has labels, --eval-data is not plainly wrong; the
rule of which data each worker reads, as the refusals state it."""

from __future__ import annotations

import os
from typing import Any

from worker.datafiles import data_files
from worker.formats import ReadStats, file_has_labels, first_with_content, idle_workers
from worker.linecount import count_data_upto, count_files_upto
from worker.readers.csv_records import csv_data_places
from worker.results import UNTRAINED

WHOLE_EVAL_CHECK_LINES = 200_000  # an --eval-data of at most this many lines ...
WHOLE_EVAL_CHECK_BYTES = 256 << 20  # ... and bytes (of its files, gzip'ed ones as they are) is read whole first


def count_lines(path: str, header: bool = False) -> int:
    """Lines of a data input's files (worker/datafiles.py; gzip read through), less each file's header line: all
    of them (worker/linecount.py)."""
    return count_files_upto(data_files(path), None, header=header).lines


def share_rule(num_workers: int, files: int, csv: bool) -> str:
    """Which data of `files` files worker i of num_workers reads (worker/formats.py: of the k-th file from 0, its
    data lines whose 0-based index % n == (i + k) % n), with files and lines numbered from 1 as editors and the
    bad-line messages number them. csv: a CSV's data are records (a quoted field may spread one over several
    lines), numbered from 1 after its header."""
    n, unit = num_workers, "records" if csv else "lines"
    if files == 1:
        return f"{unit} i + 1, i + {n + 1}, i + {2 * n + 1}, ...{' after the header' * csv}"
    return (f"file k's {unit}{' past its header' * csv} whose number % {n} == (i + k) % {n}, files and {unit} "
            "counted from 1")  # fmt: skip


class DataChecks:
    """DataSource's checks of its data. They read the DataSource's cfg, schema, synthetic and line_count, and call
    its _read and no_examples_held."""

    def _check_every_worker_reads(self, cfg: Any) -> None:
        """ValueError when the files are counted whole (fewer lines than the recipe's threshold) and some worker's
        share of them holds no line of data (the shares take lines of no data too: LineCount.per_file_residues; of a
        CSV, no record of data: csv_data_places, each file read once): it would train nothing. No lines at all:
        first_batch's error."""
        counted, n = self.line_count, cfg.num_workers
        if counted is None or counted.more or not counted.lines:
            return
        csv, paths, delimiter = self.schema.format == "csv", data_files(cfg.data), self.schema.delimiter
        residues = counted.per_file_residues  # of lines; a CSV's shares are of records, fewer where one spans lines
        if csv:
            places = [csv_data_places(path, delimiter, n) for path in paths]
            residues = tuple(p.residues for p in places)
            if not any(residues):  # lines past a header, but no record of data: first_batch's error
                return
        idle = idle_workers(residues, n)
        if not idle:
            return
        files = len(counted.per_file)
        rule = share_rule(n, files, csv)
        names = ", ".join(map(str, idle[:5])) + ", ..." * (len(idle) > 5)
        if csv:  # each file misses an idle worker's residue, so each was read to its end and counted
            held = sum(p.data for p in places)
            gapless = files == 1 and places[0].records == held  # every record holds data
        else:
            held = counted.lines
            gapless = files == 1 and count_lines(cfg.data) == counted.lines  # every line is data
        fewer = f"start at most {held:,}" if gapless else "start fewer workers"
        raise ValueError(f"{cfg.data} holds {held:,} {'record' if csv else 'line'}{'s' * (held != 1)} of data"
                         f"{f' in {files:,} files' if files > 1 else ''}, shared by the job's {n} workers (worker i "
                         f"reads {rule}): worker{'s' * (len(idle) > 1)} {names} would read none of them: "
                         f"{'each' if len(idle) > 1 else 'it'} {UNTRAINED}; {fewer}")  # fmt: skip

    def _check_labeled(self, cfg: Any, training: bool) -> None:
        """ValueError when a Criteo or libsvm input read for training or evaluation has no labels (file_has_labels;
        a csv file without the label column is refused by its reader, by name): each of its lines would be called
        malformed ("39 tab-separated columns, expected 40"), not what they are. Outside training, --data gives the
        schema only where --eval-data is the file scored, and is not looked at."""
        why = {"criteo": "more of its first lines have 39 tab-separated columns than 40: a Criteo test file, or "
                         "a labeled file whose lines lost their empty last column to a tool that strips trailing "
                         "tabs?",
               "libsvm": "its lines start with a feature token, not a label"}.get(self.schema.format)  # fmt: skip
        if why is None:
            return
        scored = cfg.data if training or not cfg.eval_data else None
        for flag, spec in (("--eval-data", cfg.eval_data), ("--validation-data", cfg.validation_data),
                           ("--data", scored)):  # fmt: skip
            if spec and not file_has_labels(spec, self.schema):
                raise ValueError(f"{flag} {first_with_content(spec)} has no labels ({why}): training and evaluation "
                                 "read labeled lines; `ps-worker predict` scores a file without labels")  # fmt: skip

    def check_eval(self) -> None:
        """ValueError now, before training, when --eval-data (if given) is plainly wrong: its CSV header is not the
        schema's, its lines are malformed past --max-bad-lines, or it holds no example. Where this worker scores it
        (cfg.final_eval; launch scores it itself), a file (or files) of at most WHOLE_EVAL_CHECK_LINES lines and
        WHOLE_EVAL_CHECK_BYTES bytes is read whole; of a larger one, only its start: the first chunk of lines
        worker/formats.py splits (4,096), and on until a good line when the chunk holds none. Its files' formats
        were compared in __init__."""
        if self.synthetic is not None or not self.cfg.eval_data:
            return
        stats = ReadStats()
        batches = iter(self._read(self.cfg.eval_data, 0, 1, track=False, batch_size=1, stats=stats))
        if next(batches, None) is None:
            held = self.no_examples_held(self.cfg.eval_data, stats, "--eval-data")
            raise ValueError(f"{self.cfg.eval_data}: no examples to evaluate on ({held})")
        files = data_files(self.cfg.eval_data)
        if not getattr(self.cfg, "final_eval", True) or sum(os.path.getsize(f) for f in files) > WHOLE_EVAL_CHECK_BYTES:
            return
        count = count_data_upto(files, WHOLE_EVAL_CHECK_LINES + 1, self.schema.format, delimiter=self.schema.delimiter)
        if count.more:  # the final evaluation meets what lies past the start
            return
        whole = ReadStats()
        try:
            for _ in self._read(self.cfg.eval_data, 0, 1, track=False, batch_size=8192, stats=whole):
                pass
        except ValueError as e:
            lines = f"{count.lines:,} line{'s' * (count.lines != 1)}"
            raise ValueError(f"--eval-data, read whole before training ({lines}): {e}") from None

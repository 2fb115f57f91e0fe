"""Where a run's examples come from: files read through a schema, or the synthetic generator; the validation split.

    train()       this worker's training batches (worker i of n reads its share), less the validation examples;
                  a ValueError saying why (untrained()) when its share, read to its end, gave it none
    validation()  the validation set, in memory (evaluated many times): the first max_validation examples of
                  --validation-data, or the examples the split selected from this worker's share, at most
                  max_validation of them; its memory is bounded by max_validation, not by the file
    eval()        the evaluation batches, read as they are asked for (one chunk of lines in memory, not the
                  file): --eval-data, or the synthetic eval rows; none otherwise
    check_eval()  reads --eval-data through the schema before training, a small file whole and of a larger one
                  its start (its header or lines wrong, or no example in it, fails the run before anything is
                  trained); in a larger file a malformed line further on is met, as --max-bad-lines says, when
                  eval() reads it
    held_out(n, fraction, max_validation)   of n examples, about how many a validation split takes
    eval_count()  --eval-data's lines, counted up to SCORING_COUNT_LINES, for a progress total

The split: the k-th example of this worker's share (counting good examples from 0, in file order) is a
validation example when mix64(k ^ VALIDATION_SALT) < fraction * 2**64, up to max_validation of them: later picks
train (the validation set is held in memory, and more would not change its figures much). The same examples are
picked on every pass, and training never sees them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ps.hashing import mix64
from worker import recipe
from worker.batch import Batch, rebatch
from worker.datafiles import data_files
from worker.formats import (
    ReadStats,
    check_same_format,
    column_stats,
    file_has_labels,
    first_with_content,
    idle_workers,
    read_batches,
)
from worker.linecount import SCORING_COUNT_LINES, LineCount, count_data_upto, count_files_upto
from worker.readers.csv_reader import csv_data_places
from worker.readers.no_examples import no_examples_held
from worker.results import UNTRAINED
from worker.schema import Schema
from worker.schema_builtin import resolve_schema
from worker.schema_file import schema_from_text
from worker.synthetic import SyntheticConfig, SyntheticData

log = logging.getLogger("worker.data")
VALIDATION_SALT = np.uint64(0x5EED_0F_5A11D)
DEFAULT_MAX_VALIDATION = 200_000
WHOLE_EVAL_CHECK_LINES = 200_000  # an --eval-data of at most this many lines ...
WHOLE_EVAL_CHECK_BYTES = 256 << 20  # ... and bytes (of its files, gzip'ed ones as they are) is read whole first
HELD_WARNING_BYTES = 1 << 30  # training examples held for --shuffle on: a WARNING from this size (else INFO)


def held_out(examples: int, fraction: float, max_validation: int) -> int:
    """The examples of `examples` that a validation split of `fraction` takes, as an estimate (its picks are by a
    hash: the module docstring): at most max_validation, whose later picks train."""
    return min(examples - int(examples * (1 - fraction)), max_validation)


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


def validation_mask(first: int, n: int, fraction: float) -> np.ndarray:
    """Which of the examples first..first+n-1 of a share the split selects (see the module docstring)."""
    if fraction <= 0:
        return np.zeros(n, dtype=bool)
    k = np.arange(first, first + n, dtype=np.uint64)
    threshold = np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))
    return mix64(k ^ VALIDATION_SALT) < threshold


class LabelOrder:
    """The positives, examples and label changes (a label unlike the one before it, in reading order) of a stream
    of labels, counted a batch at a time (worker.train_messages.sorted_by_label reads them)."""

    def __init__(self) -> None:
        self.positives = self.examples = self.changes = 0
        self._last: bool | None = None

    def add(self, labels: np.ndarray) -> None:
        if not len(labels):
            return
        ones = labels > 0.5
        self.positives += int(np.count_nonzero(ones))
        self.examples += len(ones)
        self.changes += int(np.count_nonzero(ones[1:] != ones[:-1])) + int(
            self._last is not None and ones[0] != self._last
        )
        self._last = bool(ones[-1])


LEFT_VALUES = (
    "{first}, other than 0 and 1, and every such value of the file was left out: --libsvm-values auto reads it "
    "one-hot, as the first 10,000 lines of data of {data} carry only 0 and 1; --libsvm-values weights reads the "
    "values as weights (a model trained one-hot is refused by it: train anew), one-hot says they are to be left out"
)


class DataSource:
    """The examples of one run (see the module docstring). `cfg` is a TrainConfig (worker/train_config.py).
    labels_optional: a file without labels is read as such (worker/formats.py file_has_labels; `ps-worker
    predict`), its labels NaN, and so is a blank label cell of a file with labels (read_batches blank_labels);
    otherwise every file is read with labels (a line without one is bad).
    count: self.examples is this worker's share of --data's lines, counted now up to the recipe's threshold
    (worker/linecount.py): the exact count of a smaller file, an estimate from bytes of a larger one (then
    line_count.more); without it, 0 (eval and predict, which read --data's first lines only, for the schema).
    line_count: the count, None for synthetic data or without `count`."""

    def __init__(self, cfg: Any, *, default_table: str, standardize_here: bool = True, labels_optional: bool = False,
                 count: bool = True):  # fmt: skip
        self.cfg = cfg
        self.labels_optional = labels_optional
        self.read_stats: list[tuple[str, ReadStats]] = []
        self.synthetic: SyntheticData | None = None
        self.line_count: LineCount | None = None
        self.examples = 0
        self.batch_size = cfg.batch_size
        self.max_validation = DEFAULT_MAX_VALIDATION
        if cfg.data is None:
            self.synthetic = SyntheticData(
                SyntheticConfig(
                    rows=cfg.synthetic_rows,
                    seed=cfg.synthetic_seed,
                    interactions=cfg.synthetic_interactions,
                    history=cfg.synthetic_history,
                )
            )
            self.schema = self._synthetic_schema(default_table)
            n, i = cfg.synthetic_rows, cfg.worker_id
            self.share = (n * i // cfg.num_workers, n * (i + 1) // cfg.num_workers)
            self.examples = self.share[1] - self.share[0]
        else:
            self.schema = resolve_schema(
                cfg.data, schema_path=cfg.schema, fmt=cfg.format, label_column=cfg.label_column,
                drop_columns=cfg.drop_columns, numeric_columns=cfg.numeric_columns, libsvm_fields=cfg.libsvm_fields,
                libsvm_values=cfg.libsvm_values, default_table=default_table, default_dim=cfg.embedding_dim,
            )  # fmt: skip
            for spec in (cfg.data, cfg.validation_data, cfg.eval_data):
                if spec:
                    check_same_format(spec, self.schema)
            if not labels_optional:
                self._check_labeled(cfg, training=count)
            # malformed lines included; only where a count is used (training's recipe and progress total), not for
            # eval and predict, which read --data only for its schema; no further than the recipe's threshold
            if count:
                files, fmt = data_files(cfg.data), self.schema.format
                self.line_count = count_data_upto(
                    files, recipe.SMALL_DATA_EXAMPLES, fmt, modulus=cfg.num_workers, delimiter=self.schema.delimiter
                )
                self.examples = self.line_count.estimate // cfg.num_workers
                self._check_every_worker_reads(cfg)
            if self.schema.needs_stats():
                missing = [c.name for c in self.schema.columns
                           if c.transform == "standardize" and (c.mean is None or c.std is None)]  # fmt: skip
                if not standardize_here:
                    raise ValueError(f"columns {missing} are standardized without a mean and std in the schema: this "
                                     "command cannot recompute the training data's; copy into the schema the mean "
                                     "and std the training run printed")  # fmt: skip
                log.warning("computing the mean and std of standardized columns %s over %s: a pass over the whole "
                            "file before training starts (give them in the schema to skip it)", ", ".join(missing),
                            cfg.data)  # fmt: skip
                stats = column_stats(cfg.data, self.schema)
                log.warning("standardized columns, mean and std over %s: %s (put them in the schema to fix them)",
                            cfg.data, ", ".join(f"{k} mean = {m!r}, std = {s!r}" for k, (m, s) in stats.items()))  # fmt: skip
                self.schema = self.schema.with_stats(stats)
        self._validation: list[Batch] | None = None
        self._held: Batch | None = None  # the training examples, under cfg.shuffle
        self._held_labels: LabelOrder | None = None  # their label figures (labels_before_training)
        self.share_labels: LabelOrder | None = None  # of the share, on the read before training (its split)
        self.stream_labels: LabelOrder | None = None  # of the first epoch read in file order, once read to its end

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

    def _synthetic_schema(self, default_table: str) -> Schema:
        from worker.synthetic import schema_text

        return schema_from_text(schema_text(self.synthetic.config), "the synthetic data's schema",
                                default_table=default_table, default_dim=self.cfg.embedding_dim)  # fmt: skip

    # ---- reading ---------------------------------------------------------------------------------------
    def _read(
        self,
        path: str,
        worker_id: int,
        num_workers: int,
        track: bool = True,
        batch_size: int | None = None,
        stats: ReadStats | None = None,
    ) -> Iterator[Batch]:
        stats = stats if stats is not None else ReadStats()
        reported = next((s for p, s in self.read_stats if p == path), None)
        if track and reported is None:  # the first pass over a file is reported
            self.read_stats.append((path, stats))
        elif reported is not None and reported.first_left_value and stats.first_left_value is None:
            stats.first_left_value = reported.first_left_value  # found for the run: the reader looks no more
        c = self.cfg
        size = batch_size or self.batch_size
        labeled = not self.labels_optional or file_has_labels(path, self.schema)
        return read_batches(path, self.schema, size, worker_id=worker_id, num_workers=num_workers,
                            max_bad_lines=c.max_bad_lines, max_bad_share=c.max_bad_share, stats=stats, labeled=labeled,
                            blank_labels=self.labels_optional)  # fmt: skip

    def read_whole(self, path: str, stats: ReadStats | None = None) -> Iterator[Batch]:
        """Every example of a file (not this worker's share), through the schema. stats: the ReadStats to count
        into (shared by the files of one stream: --max-bad-lines then counts over them all; the caller reports
        it), else the file's own, reported in read_stats."""
        return self._read(path, 0, 1, track=stats is None, stats=stats)

    def _share(self) -> Iterator[Batch]:
        """This worker's examples, before the split."""
        if self.synthetic is not None:
            return self.synthetic.batches(self.batch_size, *self.share)
        return self._read(self.cfg.data, self.cfg.worker_id, self.cfg.num_workers)

    def _split(self, want_validation: bool) -> Iterator[Batch]:
        fraction = self.cfg.validation_fraction or 0.0
        first = validating = 0
        counts = LabelOrder()
        for batch in self._share():
            mask = validation_mask(first, len(batch), fraction)
            first += len(batch)
            room = self.max_validation - validating  # picks past max_validation train (the module docstring)
            if room < int(mask.sum()):
                mask[np.flatnonzero(mask)[max(room, 0) :]] = False
            validating += int(mask.sum())
            if want_validation:  # the read before training: the label figures, once
                counts.add(batch.labels)
            picked = np.flatnonzero(mask if want_validation else ~mask)
            if len(picked) == len(batch):
                yield batch
            elif len(picked):
                yield batch.take(picked)
        if want_validation:
            self.share_labels = counts

    def train(self, epoch: int = 1) -> Iterator[Batch]:
        """This worker's training batches of one epoch (numbered from 1): in the data's order, read as they are
        asked for (epoch 1's labels counted into stream_labels as they are read, unless the read before training
        counted them: share_labels); or, under cfg.shuffle, from the examples held in memory (read whole as the
        first epoch asks for its first batch) in the epoch's own random order, seeded by (cfg.synthetic_seed,
        cfg.worker_id, epoch). ValueError, once read to its end, when the epoch held no example (untrained)."""
        empty = True
        for batch in self._epoch(epoch):
            empty = False
            yield batch
        if empty:
            raise ValueError(self.untrained())

    def untrained(self) -> str:
        """Why this worker's share of the data, read to its end, left it no example to train, and what to do: the
        share held no line, or its examples all went to the validation split, or its lines were all malformed or
        empty (skipped). The first pass's counts (read_stats), and the validation set (read whole by then)."""
        c, n = self.cfg, self.cfg.num_workers
        who = f"worker {c.worker_id} of the job's {n}" if n > 1 else "the worker"
        share = "its share of " if n > 1 else ""
        if self.synthetic is not None:
            source, read = "the synthetic data", ReadStats(lines_read=self.examples)
        else:  # the first pass's counts
            source, read = c.data, next((s for path, s in self.read_stats if path == c.data), ReadStats())
        validating = sum(map(len, self.validation())) if c.validation_fraction else 0
        fewer = "start fewer workers or give them more data" if n > 1 else "give it more data"
        if not read.lines_read:
            why = f"{share}{source} holds no line; {fewer}"
        elif validating:
            examples = "the 1 example" if validating == 1 else f"all {validating:,} examples"
            why = (f"{examples} of {share}{source} went to the validation split "
                   f"(--validation-fraction {c.validation_fraction:g}); {fewer}, or train with --validation-fraction 0 "
                   "(or a --validation-data file)")  # fmt: skip
        else:
            first = f"; first: {read.first_bad}" if read.first_bad else ""
            lines = "the 1 line" if read.lines_read == 1 else f"all {read.lines_read:,} lines"
            are = "is" if read.lines_read == 1 else "are"
            why = (f"{lines} of {share}{source} {are} malformed or empty ({read.bad_lines:,} "
                   f"malformed, skipped under --max-bad-lines {c.max_bad_lines}{first}; {read.empty_lines:,} empty); "
                   "fix the data, or its --format or --schema")  # fmt: skip
        return f"{who} {UNTRAINED}: {why}"

    def _epoch(self, epoch: int) -> Iterator[Batch]:
        if not getattr(self.cfg, "shuffle", False):
            if epoch != 1 or self.share_labels is not None:  # counted already, on the read before training
                yield from self._in_order()
                return
            counts = LabelOrder()
            for batch in self._in_order():
                counts.add(batch.labels)
                yield batch
            self.stream_labels = counts  # the epoch read to its end
            return
        if not self._hold():  # a share without examples
            return
        seed = [self.cfg.synthetic_seed & (2**63 - 1), self.cfg.worker_id, epoch]
        order = np.random.default_rng(seed).permutation(len(self._held))
        held, size = self._held, self.batch_size
        for lo in range(0, len(order), size):
            yield held.take(order[lo : lo + size])

    def _hold(self) -> bool:
        """Reads the share's training examples into memory (cfg.shuffle), once; whether it holds any."""
        if self._held is None:
            parts = list(self._in_order())
            if not parts:
                return False
            self._held = Batch.concat(parts)
            del parts
            held_bytes = self._held.nbytes()
            level = logging.WARNING if held_bytes >= HELD_WARNING_BYTES else logging.INFO
            log.log(level, "--shuffle on: holding this worker's %s training examples in memory (%s MiB), each epoch "
                    "in its own order (--shuffle off reads them in file order, as it trains)", f"{len(self._held):,}",
                    f"{held_bytes / 2**20:,.0f}")  # fmt: skip
        return True

    def labels_before_training(self) -> LabelOrder | None:
        """The label figures of this worker's share where they are known before training: counted by the read of
        a validation split (share_labels), or, under cfg.shuffle, of the training examples read into memory now (as
        the first epoch would); else None (data read as it trains)."""
        if self.share_labels is not None:
            return self.share_labels
        if not getattr(self.cfg, "shuffle", False):
            return None
        if self._held_labels is None:
            self._held_labels = LabelOrder()
            if self._hold():
                self._held_labels.add(self._held.labels)
        return self._held_labels

    def _in_order(self) -> Iterator[Batch]:
        if not self.cfg.validation_fraction:
            return self._share()
        return rebatch(self._split(want_validation=False), self.batch_size)

    def validation(self) -> list[Batch]:
        if self._validation is None:
            self._validation = self._load_validation()
        return self._validation

    def _load_validation(self) -> list[Batch]:
        stats = ReadStats()
        if self.cfg.validation_data:
            source: Iterable[Batch] = self._read(self.cfg.validation_data, 0, 1, stats=stats)
        elif self.cfg.validation_fraction:
            source = self._split(want_validation=True)
        else:
            return []
        out, kept = [], 0
        for batch in rebatch(source, self.batch_size):
            take = min(len(batch), self.max_validation - kept)
            out.append(batch if take == len(batch) else batch.slice(0, take))
            kept += take
            if kept >= self.max_validation:
                break
        if not out and self.cfg.validation_data:
            held = self.no_examples_held(self.cfg.validation_data, stats, "--validation-data")
            raise ValueError(f"{self.cfg.validation_data}: no examples to validate on ({held})")
        return out

    def eval(self) -> Iterator[Batch]:
        if self.synthetic is not None:
            rows = self.cfg.synthetic_rows
            return self.synthetic.batches(self.batch_size, rows, rows + self.cfg.synthetic_eval_rows)
        if self.cfg.eval_data:
            return self.read_whole(self.cfg.eval_data)
        return iter(())

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

    def eval_count(self) -> LineCount | None:
        """The data lines of --eval-data (linecount.count_data_upto), counted up to SCORING_COUNT_LINES (an estimate from bytes past
        them): a progress total for eval(); None for synthetic data (synthetic_eval_rows) or without --eval-data."""
        if self.synthetic is not None or not self.cfg.eval_data:
            return None
        files, schema = data_files(self.cfg.eval_data), self.schema
        return count_data_upto(files, SCORING_COUNT_LINES, schema.format, delimiter=schema.delimiter)

    def first_batch(self) -> Batch:
        """The first batch of the data (to check the data against the model before training)."""
        stats = ReadStats()
        source = (
            self.synthetic.batches(1, 0, 1)
            if self.synthetic is not None
            else self._read(self.cfg.data, 0, 1, False, 1, stats)
        )
        first = next(iter(source), None)
        if first is None:
            raise ValueError(f"{self.cfg.data}: no examples in it ({self.no_examples_held(self.cfg.data, stats)})")
        return first

    def no_examples_held(self, path: str, stats: ReadStats, subject: str = "it") -> str:
        """What the files of path, read whole without an example (stats: that read's), hold instead, as a refusal
        says it of subject (readers.no_examples.no_examples_held)."""
        return no_examples_held(data_files(path), stats, subject)

    def skipped_lines(self) -> int:
        """Malformed lines of the training data skipped in the first pass over this worker's share (0 for synthetic
        data). The examples trained never count them; self.examples, a line count made before reading, does."""
        return sum(s.bad_lines for path, s in self.read_stats if path == self.cfg.data)

    def bad_lines_report(self) -> list[str]:
        """A line per file read with malformed lines skipped or bags cut, or read one-hot by --libsvm-values auto
        with a value other than 0 and 1 past the lines that chose it (LEFT_VALUES); a file whose reading a bad line past
        --max-bad-lines stopped is left to the error that says so (its lines were not all skipped)."""
        out = []
        for path, s in self.read_stats:
            if s.bad_lines and not s.stopped:
                lines = "malformed line" if s.bad_lines == 1 else "malformed lines"
                out.append(f"{path}: skipped {s.bad_lines:,} {lines} of {s.lines_read:,} (first: {s.first_bad})")
            if getattr(s, "truncated_bags", 0):
                out.append(f"{path}: {s.truncated_bags:,} bags were longer than their column's max_length and cut")
            if note := self.left_values_note(s):
                out.append(note)
        return out

    def left_values_note(self, stats: ReadStats) -> str | None:
        """LEFT_VALUES for a read (its stats) that left out a value other than 0 and 1 of a file read one-hot by
        --libsvm-values auto (ReadStats.first_left_value), naming --data, whose first lines chose one-hot; else
        None."""
        first = getattr(stats, "first_left_value", None)
        return LEFT_VALUES.format(first=first, data=self.cfg.data) if first else None

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
    eval_count()  --eval-data's lines, counted up to SCORING_COUNT_LINES, for a progress total

The validation split, and held_out (of n examples, about how many it takes): worker/validation_split.py.
DataSource's checks of its data before training (check_eval among them) are worker/data_checks.py's DataChecks;
what its reads report (untrained(), malformed lines skipped) is worker/data_reports.py's DataReports.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ps.bytesize import human_bytes
from worker import recipe
from worker.batch import Batch, rebatch
from worker.data_checks import DataChecks
from worker.data_reports import DataReports
from worker.datafiles import data_files
from worker.format_detection import check_same_format
from worker.formats import ReadStats, column_stats, file_has_labels, file_residue, read_batches
from worker.linecount import SCORING_COUNT_LINES, LineCount, count_data_upto
from worker.schema import Schema
from worker.schema_builtin import resolve_schema
from worker.schema_file import schema_from_text
from worker.synthetic import SyntheticConfig, SyntheticData
from worker.validation_split import DEFAULT_MAX_VALIDATION, validation_mask

log = logging.getLogger("worker.data")
HELD_WARNING_BYTES = 1 << 30  # training examples held for --shuffle on: a WARNING from this size (else INFO)


def share_examples(count: LineCount, worker_id: int, num_workers: int) -> int:
    """Worker worker_id's share of num_workers of the lines counted: of each file counted to its end
    (count.per_file), its lines j with j % n == file_residue(worker_id, k, n) for the k-th file, as read_batches reads
    (exact where every line of the file holds data); of a count that stopped (count.more), the count of worker_id,
    worker_id + n, ... below its estimate. The shares of the job's workers sum to the count."""
    n = num_workers
    if count.more:
        return (count.estimate - worker_id + n - 1) // n
    return sum((lines - file_residue(worker_id, k, n) + n - 1) // n for k, lines in enumerate(count.per_file))


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


class DataSource(DataChecks, DataReports):
    """The examples of one run (see the module docstring). `cfg` is a TrainConfig (worker/train_config.py).
    labels_optional: a file without labels is read as such (worker/formats.py file_has_labels; `ps-worker
    predict`), its labels NaN, and so is a blank label cell of a file with labels (read_batches blank_labels);
    otherwise every file is read with labels (a line without one is bad).
    count: self.job_examples is --data's lines, counted now up to the recipe's threshold (worker/linecount.py):
    the exact count of a smaller file, an estimate from bytes of a larger one (then line_count.more), the same on
    every worker; self.examples is this worker's share of them (share_examples); without `count`, both 0 (eval and
    predict, which read --data's first lines only, for the schema; of the built-in csv schema's warnings they give
    those of the data alone: resolve_schema's training). Synthetic data: synthetic_rows and the rows of
    the share. line_count: the count, None for synthetic data or without `count`."""

    def __init__(self, cfg: Any, *, default_table: str, standardize_here: bool = True, labels_optional: bool = False,
                 count: bool = True):  # fmt: skip
        self.cfg = cfg
        self.labels_optional = labels_optional
        self.read_stats: list[tuple[str, ReadStats]] = []
        self.synthetic: SyntheticData | None = None
        self.line_count: LineCount | None = None
        self.examples = self.job_examples = 0
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
            self.examples, self.job_examples = self.share[1] - self.share[0], n
        else:
            self.schema = resolve_schema(
                cfg.data, schema_path=cfg.schema, fmt=cfg.format, label_column=cfg.label_column,
                drop_columns=cfg.drop_columns, numeric_columns=cfg.numeric_columns, libsvm_fields=cfg.libsvm_fields,
                libsvm_values=cfg.libsvm_values, default_table=default_table, default_dim=cfg.embedding_dim,
                model=cfg.model, training=count,
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
                self.job_examples = self.line_count.estimate
                self.examples = share_examples(self.line_count, cfg.worker_id, cfg.num_workers)
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

    def _synthetic_schema(self, default_table: str) -> Schema:
        from worker.synthetic_files import schema_text

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
            room = self.max_validation - validating  # picks past max_validation train (worker/validation_split.py)
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
            log.log(level, "--shuffle on: holding this worker's %s training examples in memory (%s), each epoch "
                    "in its own order (--shuffle off reads them in file order, as it trains)", f"{len(self._held):,}",
                    human_bytes(held_bytes))  # fmt: skip
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

    def eval_count(self) -> LineCount | None:
        """The data lines of --eval-data (linecount.count_data_upto), counted up to SCORING_COUNT_LINES (an estimate
        from bytes past them): a progress total for eval(); None for synthetic data (synthetic_eval_rows) or without
        --eval-data."""
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

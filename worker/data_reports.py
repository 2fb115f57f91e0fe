"""What a run's reads of its data say of themselves (DataReports, a part of worker/data.py's DataSource): why a
worker trained nothing, malformed lines skipped, bags cut, values left out of a libsvm file read one-hot."""

from __future__ import annotations

from worker.datafiles import data_files
from worker.formats import ReadStats
from worker.readers.no_examples import no_examples_held
from worker.results import UNTRAINED

LEFT_VALUES = (
    "{first}, other than 0 and 1, and every such value of the file was left out: --libsvm-values auto reads it "
    "one-hot, as the first 10,000 lines of data of {data} carry only 0 and 1; --libsvm-values weights reads the "
    "values as weights (a model trained one-hot is refused by it: train anew), one-hot says they are to be left out"
)


class DataReports:
    """DataSource's reports of its reads. They read the DataSource's cfg, synthetic, examples and read_stats, and
    call its validation."""

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

"""The run settings a --resume-file position belongs to (worker/resume.py): each as given, but format and
libsvm_values as the data is read under them, and the files (data, schema, validation_data) by their full paths."""

from __future__ import annotations

import json
import os

from worker.datafiles import data_entries
from worker.schema_columns import AUTO_FORMAT
from worker.train_config import TrainConfig

RUN_SETTINGS = ("data", "format", "schema", "label_column", "drop_columns", "numeric_columns", "libsvm_fields",
                "libsvm_values", "validation_data", "validation_fraction", "worker_id", "num_workers", "recipe",
                "epochs", "max_examples", "shuffle", "synthetic_rows", "synthetic_seed", "synthetic_interactions",
                "synthetic_history", "model", "mode")  # fmt: skip


RECORDED_LATER = {"libsvm_values": "auto"}  # settings a file written before they were recorded lacks: their value then
PATH_SETTINGS = ("data", "schema", "validation_data")  # settings that name files: compared by full_paths


def full_paths(spec: object) -> object:
    """A file setting's value (PATH_SETTINGS: a data flag's file, or its entries as worker/datafiles.py's
    data_entries reads them: comma-separated files, directories and globs; a --schema file) with each path made
    full against the working directory and normalized (os.path.abspath, links not resolved: train.tsv,
    ./train.tsv and /data/train.tsv, run from /data, are one unless /data is reached through a link, where the
    working directory is the link's target; train.tsv run from another directory is another file). None (not
    given) as None."""
    if not isinstance(spec, str):
        return spec
    if os.path.isfile(spec):  # a file, even if its name holds ',' (datafiles.data_files takes it whole)
        return os.path.abspath(spec)
    return ",".join(os.path.abspath(entry) if entry else entry for entry in data_entries(spec))


def run_settings(cfg: TrainConfig) -> dict:
    """The settings a position belongs to (RUN_SETTINGS), as JSON reads them back (tuples as lists); format as
    data_format reads it, libsvm_values as libsvm_reading does, the files' by their full_paths."""
    read_as = {"format": data_format(cfg.format, cfg), "libsvm_values": libsvm_reading(cfg.libsvm_values, cfg),
               **{name: full_paths(getattr(cfg, name)) for name in PATH_SETTINGS}}  # fmt: skip
    return {**given_settings(cfg), **read_as}


def given_settings(cfg: TrainConfig) -> dict:
    """cfg's RUN_SETTINGS as given, as JSON reads them back (tuples as lists)."""
    return json.loads(json.dumps({name: getattr(cfg, name) for name in RUN_SETTINGS}))


def libsvm_reading(values: object, cfg: TrainConfig) -> object:
    """How cfg's data is read under the --libsvm-values value `values`: for auto on data read as libsvm
    (data_format), what the built-in schema reads it as (libsvm_reader.libsvm_values_read_as, of the sample
    libsvm_sample takes of its first file with content, as schema_builtin.resolve_schema does); else values as
    given."""
    if values != "auto" or data_format(cfg.format, cfg) != "libsvm":
        return values
    from worker.formats import first_with_content
    from worker.readers.libsvm_reader import libsvm_sample, libsvm_values_read_as

    return libsvm_values_read_as(values, libsvm_sample(first_with_content(cfg.data))[1])


def data_format(fmt: object, cfg: TrainConfig) -> object:
    """The format cfg's data is read in under the --format value fmt: for auto, the one
    format_detection.detect_format tells, with a CSV's delimiter other than a comma ("csv (delimiter ';')"; a file
    written as given holds auto, or the default criteo of a version without auto); None where no --format is read
    (a --schema file's own format, or synthetic data). ValueError where auto cannot tell it."""
    if cfg.data is None or cfg.schema is not None:
        return None
    if fmt == AUTO_FORMAT:
        from worker.format_detection import detect_format

        told, delimiter, _ = detect_format(cfg.data)
        return told if delimiter in (None, ",") else f"{told} (delimiter {delimiter!r})"
    return fmt


def shown_setting(value: object, read_as: object) -> str:
    """A run setting as a mismatch names it, given as value and read as read_as: None (a flag not given, its
    default or the recipe's; a format no --format gives) as 'not given'; a value the data resolves (--format auto,
    --libsvm-values auto) with what it is read as."""
    if read_as is None:
        return "not given"
    return repr(read_as) if value == read_as else f"{value!r} (read as {read_as!r})"

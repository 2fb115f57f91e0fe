"""A schema's columns: the data formats and the columns they name, the label's usual names, the column kinds and
transforms, and Column, one field of a schema (the grammar and its rules: worker/schema.py's docstring)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from worker.features import NUM_CAT_FIELDS, NUM_INT_FIELDS

FORMATS = ("criteo", "csv", "libsvm")
AUTO_FORMAT = "auto"  # --format's value: the data's format told by its first line (format_detection.detect_format)
FORMAT_CHOICES = (AUTO_FORMAT, *FORMATS)  # --format's values
DEFAULT_FORMAT = AUTO_FORMAT  # a run's --format when none is given (TrainConfig.format)
LABEL_NAMES = ("label", "click", "clicked", "is_click", "y", "target", "conversion", "converted")  # a label's usual
# names, any case: the built-in csv schema's label where the first column holds none (schema_builtin.csv_label),
# `ps-worker schema`'s first pick (schema_infer)
LABEL_WORDS = re.compile(r"(?i)click|label|target|conver|purchase|bought|outcome")  # in a label's other names
# (has_clicked, purchased): the pick where no column is named as LABEL_NAMES


def is_label_name(name: str) -> bool:
    """name reads as a label's: one of LABEL_NAMES (any case) or holding one of LABEL_WORDS."""
    return name.lower() in LABEL_NAMES or LABEL_WORDS.search(name) is not None


def labels_by_name(names: list[str]) -> list[str]:
    """The names a label is taken by, in order: those of LABEL_NAMES (any case) if any, else those holding one of
    LABEL_WORDS (the rule of `ps-worker schema` and of the built-in csv schema's label)."""
    return [h for h in names if h.lower() in LABEL_NAMES] or [h for h in names if LABEL_WORDS.search(h)]


KINDS = ("categorical", "multi_hot", "weighted", "numeric")
ID_KINDS = ("hashed", "raw")
DENSE_TRANSFORMS = ("log", "standardize", "none")
BUCKET_TRANSFORMS = ("bucketize", "log_buckets")
TIME_TRANSFORMS = ("yymmddhh_hour", "yymmddhh_weekday", "unix_hour", "unix_weekday", "iso_hour", "iso_weekday")
# <time format>_<part>: worker/timestamps.py's formats
SPARSE_TRANSFORMS = BUCKET_TRANSFORMS + TIME_TRANSFORMS  # a numeric column of these gives ids
CRITEO_COLUMNS = ("label", *(f"I{i + 1}" for i in range(NUM_INT_FIELDS)), *(f"C{i + 1}" for i in range(NUM_CAT_FIELDS)))
LIBSVM_COLUMN = re.compile(r"f(0|[1-9][0-9]*)")
# --libsvm-values: the built-in libsvm schema's fields read a token's value as its weight (weights) or leave it out
# (one-hot); auto: weights where libsvm_sample finds a value other than 0 and 1 in the data's first lines
LIBSVM_VALUES = ("auto", "one-hot", "weights")
MAX_LIBSVM_FIELDS = 1024  # f0..f1023: a libsvm field is a token's position (a chunk of lines holds K ids a line)


@dataclass(frozen=True)
class Column:
    """One field of a schema (see worker/schema.py's docstring). Sparse columns carry their table (the default table
    filled in) and, for hashed ids, their id space; numeric features carry neither."""

    name: str
    source: str
    kind: str
    table: str | None = None
    id_space: str | None = None
    ids: str = "hashed"
    separator: str = "|"
    pooling: str = "sum"
    max_length: int = 256
    transform: str | None = None
    boundaries: tuple[float, ...] = ()
    mean: float | None = None
    std: float | None = None

    @property
    def is_sparse(self) -> bool:
        """Whether the column gives ids (a sparse field) rather than a numeric feature."""
        return self.kind != "numeric" or self.transform in SPARSE_TRANSFORMS


# The one id space of the built-in libsvm schema's fields: a libsvm id names a feature wherever its token stands in
# the line, and lines that leave features out put one feature at other positions. On an audit's data (60 binary
# features, 3 to 21 per line) LR reached AUC 0.9362 with one id space against 0.9103 with a space per position
# (a logistic regression fitted directly: 0.9367); with 30% of two fields missing, 0.8132 against 0.8103.
LIBSVM_ID_SPACE = "all"


def libsvm_column(name: str, table: str | None, shared: bool = True, weighted: bool = False) -> Column:
    """Column f<k> of the built-in libsvm schema (worker/schema_builtin.py): the k-th token, in the id space all
    of its fields share (LIBSVM_ID_SPACE); shared=False: in an id space of its own (a schema file's column that
    names none), which reads ids as they were read before the built-in schema shared one. weighted: the token's
    id with its value as the weight (a weighted column, pooling sum), as the built-in schema reads a file whose
    values are not all 0 and 1; else categorical, the id alone (one-hot)."""
    return Column(name, name, "weighted" if weighted else "categorical", table, LIBSVM_ID_SPACE if shared else name)

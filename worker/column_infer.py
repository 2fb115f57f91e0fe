"""One CSV column's schema entries, inferred from its cells in a sample (`ps-worker schema`: worker/schema_infer.py,
which picks the label and writes the TOML).

    column_entries(name, source, cells, taken, sampled) -> (TOML lines, checks)   # a comment and an entry each
    infer_column(name, source, cells, sampled=False) -> (Column, comment)          # the column alone
    every_value_distinct(source, cells) -> bool              # ids of a row's own, or seen once in the sample
    written_numbers(cells) -> (what, fix, aside) | None     # numbers with separators the readers take as text

The rules, per CSV column of the sample other than the label (a cell that is empty or one of
cells.MISSING_TEXTS is missing; a number is what the readers take as one: finite, |x| <= 3.4e38, float32's largest):
    a time: a date and time in every non-empty cell (2024-01-05 13:22:00, 2024-01-05T13:22:00Z: iso), or a name
    with the word hour, time, date, datetime, timestamp or ts, and eight digits YYMMDDHH (a valid month, day and
    hour: Avazu's `hour`; not where every one is a date YYYYMMDD too, 20120315) or ten digits of unix seconds in
    every non-empty cell (timestamps.time_format)
                                      `<name>_hour_of_day` and `<name>_weekday`, sparse fields (transforms
                                      yymmddhh_hour and yymmddhh_weekday, unix_... or iso_...:
                                      worker/timestamps.py);
                                      the time itself is no feature (as a number or as ids, its values are
                                      new on each later day)
    a name like a time's above, and unix milliseconds (13 digits) or dates YYYYMMDD (20120315) in every non-empty
    cell (timestamps.untold_time)     as numbers in every non-empty cell, next, the comment saying how to read
                                      them as times (milliseconds) or derive the weekday (dates)
    numbers in every non-empty cell   few distinct integers, integers in a column named like an id (`id`,
                                      `user_id`, `itemId`, `uid`, `userid`), or integers written with leading
                                      zeros (codes: `02415`) -> categorical;
                                      non-negative and heavy-tailed (skewness > 1) -> numeric, log; else
                                      numeric, standardize with the sample's mean and std; and beside it
                                      `<name>_bucket`, the same cells bucketized at the sample's 16-quantiles
                                      (the least value in a bucket of its own: _bucket_twin), a sparse field:
                                      lr and fm use sparse fields only, and an MLP gets both;
                                      integers of at most _MANY_CODES values, each seen _CODE_REPEATS times on
                                      average (codes, or small counts), also `<name>_code`: each value its own id
    numbers with a decimal comma (`0,6792` in most cells), or numbers with thousands separators (`1,234,567`
    or `1 234 567` in every cell holding a comma or a space, numbers in nine in ten; `49,490` reads either way):
    written_numbers
                                      categorical, and on stderr: how to convert them to plain numbers
    cells with | ; or , (in at least a tenth of the non-empty cells) whose tokens repeat, and for ',' not
    prose (most of its commas followed by a space)
                                      multi_hot (weighted when every token is id:number)
    numbers in nine in ten of its non-empty cells, not all (`-`, `#N/A`, `inf`, `1e40` in the others)
                                      categorical, and in the schema and on stderr: those cells, and to empty
                                      them (a missing number) for numbers
    anything else                     categorical
"""

from __future__ import annotations

import bisect
import collections
import math
import re

from worker.cells import FLOAT32_MAX, is_missing_text
from worker.schema_columns import Column
from worker.schema_toml import column_entry
from worker.timestamps import time_format, untold_time

BAG_SEPARATORS = "|;,"  # of a list in a cell: multi_hot (weighted) where its tokens repeat
_FEW_INTEGERS = 20  # a numeric column of at most this many distinct integers is categorical
_HEAVY_SKEW = 1.0  # a non-negative numeric column skewed more than this is log-transformed
_BAG_SHARE = 0.1  # a column is a list when at least this share of its non-empty cells holds the separator
_BUCKETS = 16  # a numeric column's twin is bucketized at the sample's quantiles k / _BUCKETS
_MANY_CODES = 1000  # an integer column of at most this many distinct values ...
_CODE_REPEATS = 10  # ... each seen this many times on average in the sample gets a categorical twin
_DECIMAL_COMMA = re.compile(r"\s*[-+]?\d+,\d+\s*")  # 0,6792: a number written with a decimal comma
_THOUSANDS = re.compile(r"\s*[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?\s*")  # 1,234,567.5: thousands separators
# said of a column of distinct values in a sample (infer_column, and the built-in schema's hint of a row's own id)
SAMPLED_DISTINCT = (
    "ids that come back a few times over the whole file (a user, an item) look like this in a sample "
    "too; delete this entry only if its values are new on nearly every row (a row's own id, a time)"
)
_SPACES = " \u00a0\u202f"  # a space, a no-break space, a narrow no-break space: thousands separators
_SPACED = re.compile(r"\s*[-+]?[1-9]\d{0,2}(?:[ \u00a0\u202f]\d{3})+(?:[.,]\d+)?\s*")  # 1 234 567,5
_SEPARATED = re.compile(f"[,{_SPACES}]")  # a comma or a space of _SPACES: in every number written_numbers tells
_DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}/\d{1,2}/\d{2,4}")  # 2023-12-02 (19:26:40), 12/02/2023
_UNTOLD_TIMES = {  # what a column of times of a form no time transform reads (timestamps.untold_time) needs
    "unix_ms": "; times in unix milliseconds: as a number or as ids, each later day's values are new; write them in "
    "unix seconds (divided by 1000) and infer the schema again: it then reads their hour of day and weekday",
    "yyyymmdd": "; dates YYYYMMDD: as a number or as ids, each later day's values are new; derive columns such as "
    "the weekday from them, and delete this column's entries",
}
_ID_NAME = re.compile(r"(?:^|[_\-. ])(?:id|Id|ID)$|[a-z0-9](?:Id|ID)$")  # id, user_id, itemId, userID; not paid
_ID_WORD = re.compile(  # uid, userid, itemid, adid, ...: an id run into its noun, in one word
    r"(?i)(?:u|uu|gu|user|item|ad|doc|product|session|device|campaign|query|shop|cat|category|creative|advertiser|"
    r"account|customer|member|video|song|movie|news|page|site|app|publisher|order|sku|vendor|seller|buyer)_?id"
)


def column_entries(
    name: str, source: str, cells: list[str], taken: set[str], sampled: bool
) -> tuple[list[str], list[str]]:
    """The TOML lines of a column named name reading source (a blank line, then a comment and a [[columns]] entry
    for each column made of it: a time's hour of day and weekday; else the column infer_column gives, and a
    numeric one's bucketized and code twins, named past those in taken), and what a person must check of it."""
    times = time_format(source, cells)
    if times is not None:
        return ["", *_time_entries(name, source, times, cells, taken)], []
    column, comment = infer_column(name, source, cells, sampled=sampled)
    lines = ["", f"# {source!r}: {comment}", "[[columns]]", *column_entry(column, with_table=False)]
    checks: list[str] = []
    written = written_numbers(cells)
    if written:
        what, fix, aside = written
        checks.append(
            f"{source!r} holds {what}: read as text they are categories; {fix} and infer the schema again{aside}"
        )
    if column.kind == "categorical" and ". CHECK " in comment:  # a column of numbers made text by a few cells
        checks.append(comment.split(". CHECK ", 1)[1])
    if column.kind == "numeric":
        values = _floats([c for c in cells if not is_missing_text(c)])
        twin = _bucket_twin(column, values, taken)
        lines += [f"# {source!r} bucketized at the sample's quantiles: a sparse field (lr and fm use no numeric "
                  "feature)", "[[columns]]", *column_entry(twin, with_table=False)]  # fmt: skip
        code = _code_twin(column, values, taken | {twin.name})
        if code is not None:
            seen = len(values) / len(set(values))
            lines += [f"# {source!r}: {len(set(values)):,} distinct integers, each seen {seen:,.0f} times on average: "
                      "codes or small counts; each value its own id too (delete this entry if they are plain "
                      "quantities)", "[[columns]]", *column_entry(code, with_table=False)]  # fmt: skip
    return lines, checks


def _time_entries(name: str, source: str, fmt: str, cells: list[str], taken: set[str]) -> list[str]:
    """The comment and the two [[columns]] entries of a column of times (timestamps.time_format): its hour of day
    and its weekday, named <name>_hour_of_day and <name>_weekday (or ..2, ... past a name in taken)."""
    present = [c.strip() for c in cells if not is_missing_text(c)]
    what = {
        "yymmddhh": "YYMMDDHH (Avazu's hour: 14102100 is 2014-10-21, hour 00)",
        "unix": "unix seconds (UTC)",
        "iso": "YYYY-MM-DD HH:MM:SS (the hour as written: a zone is not applied)",
    }[fmt]
    out = [f"# {source!r}: times, {what} ({len(present):,} of {len(cells):,} cells non-empty, {len(set(present)):,} "
           "distinct): read as the hour of day and the weekday, each a sparse field; the time itself is no feature "
           "(as a number or as ids, its values are new on each later day)"]  # fmt: skip
    for part, suffix in (("hour", "hour_of_day"), ("weekday", "weekday")):
        field, k = f"{name}_{suffix}", 2
        while field in taken:
            field, k = f"{name}_{suffix}{k}", k + 1
        taken = taken | {field}
        out += [
            "[[columns]]",
            *column_entry(Column(field, source, "numeric", transform=f"{fmt}_{part}"), with_table=False),
        ]
    return out


def _bucket_twin(column: Column, values: list[float], taken: set[str]) -> Column:
    """A bucketize column reading column's cells, at the distinct _BUCKETS-quantiles of values (6 significant
    digits), named <name>_bucket (or _bucket2, ... past a name in taken). A quantile that is the least value, whose
    bucket would hold every value from it on (a column of zeros mostly: spend, counts of rare events), is the least
    value above it instead, so the least value has a bucket of its own; a column of one value has one bucket."""
    ordered = sorted(values)
    least = ordered[0]
    above = ordered[bisect.bisect_right(ordered, least)] if ordered[-1] > least else least
    quantiles = (ordered[len(ordered) * k // _BUCKETS] for k in range(1, _BUCKETS))
    cuts = sorted({_cut(q if q > least else above, least) for q in quantiles})
    name, k = f"{column.name}_bucket", 2
    while name in taken:
        name, k = f"{column.name}_bucket{k}", k + 1
    return Column(name, column.source, "numeric", transform="bucketize", boundaries=tuple(cuts))


def _cut(value: float, least: float) -> float:
    """A boundary at value, to 6 significant digits where those keep it above least (the sample's least value)."""
    short = float(f"{value:.6g}")
    return short if short > least or value <= least else value


def _lists(separator: str) -> str:
    """written_numbers' aside for a column whose cells could be lists of 3-digit ids split at separator."""
    return f' (lists of 3-digit ids look the same: a schema reads those with kind = "multi_hot", separator = "{separator}")'


_TO_CSV = "to_csv(..., index=False)"  # how written_numbers' fixes write the file back: without pandas' row index


def written_numbers(cells: list[str]) -> tuple[str, str, str] | None:
    """(what the cells hold, how to make them plain numbers, an aside) where they are numbers the readers do not
    take as such, written with separators: thousands separated by commas (1,234,567 in every cell holding a comma,
    of the cells that are not empty or missing, numbers in nine in ten; 49,490 in all of them reads as decimal
    commas too), or by spaces (1 234 567 in every cell holding a space, no-break space or narrow no-break space;
    1 234,5 with a decimal comma), else decimal commas in nine in ten of them (0,6792); else None. The aside:
    lists of 3-digit ids split by commas or spaces look the same."""
    cells = [c.strip() for c in cells]
    if not any(map(_SEPARATED.search, cells)):  # no comma or space within a cell: plain cells (the common case)
        return None
    cells = [c for c in cells if c and not is_missing_text(c)]
    spaced = [c for c in cells if any(ch in _SPACES for ch in c)]
    if (spaced and all(_SPACED.fullmatch(c) for c in spaced)  # each cell holding a space is a number so written
            and sum(bool(_SPACED.fullmatch(c) or _DECIMAL_COMMA.fullmatch(c)) or _floats([c]) is not None
                    for c in cells) >= 0.9 * len(cells)):  # fmt: skip
        separator = next(ch for ch in spaced[0] if ch in _SPACES)
        decimal = ", decimal=','" if any("," in c for c in spaced) else ""
        return (f"numbers with thousands separated by {separator!r} (as {spaced[0]!r})",
                f"remove the separators (pandas: read_csv(..., thousands={separator!r}{decimal}) then {_TO_CSV})",
                _lists(separator) if separator == " " else "")  # fmt: skip
    commas = [c for c in cells if "," in c]
    if not commas:
        return None
    grouped = sum(bool(_THOUSANDS.fullmatch(c)) or _floats([c]) is not None for c in cells) >= 0.9 * len(cells)
    if grouped and all(_THOUSANDS.fullmatch(c) for c in commas):
        lists = _lists(",")
        other = [c for c in commas if not _DECIMAL_COMMA.fullmatch(c)]
        if other:
            return (f"numbers with thousands separators (as {other[0]!r})", "remove the separators (pandas: "
                    f"read_csv(..., thousands=',') then {_TO_CSV})", lists)  # fmt: skip
        return (f"numbers written with a comma, a thousands separator or a decimal comma (as {commas[0]!r})",
                "write them as plain numbers (pandas: read_csv(..., thousands=',') or read_csv(..., decimal=','), "
                f"then {_TO_CSV})", lists)  # fmt: skip
    if sum(bool(_DECIMAL_COMMA.fullmatch(c)) for c in cells) >= 0.9 * len(cells):
        return (f"numbers written with a decimal comma (as {commas[0]!r})", "convert them to decimal points "
                f"(pandas: read_csv(..., decimal=',') then {_TO_CSV})", "")  # fmt: skip
    return None


def _code_twin(column: Column, values: list[float], taken: set[str]) -> Column | None:
    """A categorical column reading column's cells, named <name>_code (or _code2, ... past a name in taken), when
    its values are integers of at most _MANY_CODES distinct ones seen _CODE_REPEATS times each on average; else
    None."""
    distinct = len(set(values))
    if not values or not all(v.is_integer() for v in values) or distinct > _MANY_CODES or \
            distinct * _CODE_REPEATS > len(values):  # fmt: skip
        return None
    name, k = f"{column.name}_code", 2
    while name in taken:
        name, k = f"{column.name}_code{k}", k + 1
    return Column(name, column.source, "categorical")


def _floats(cells: list[str]) -> list[float] | None:
    """The cells as numbers the readers take (finite, |x| <= FLOAT32_MAX: worker/cells.py float_values), or None if
    one is not."""
    try:
        values = [float(c) for c in cells]
    except ValueError:
        return None
    return values if all(abs(v) <= FLOAT32_MAX for v in values) else None


def _mostly_numbers(cells: list[str]) -> list[str]:
    """The cells that are not finite numbers, where nine in ten of cells are (a column of numbers with some junk:
    '-', '#N/A', 'inf'), else []."""
    others = [c for c in cells if _floats([c]) is None]
    return others if others and len(others) <= 0.1 * len(cells) else []


def _junk_making_text(name: str, source: str, numbers: list[str], sampled: bool) -> str:
    """_junk_note where a few cells that are not numbers (_mostly_numbers) make a column of numbers text, and the
    column without them would be read as numbers; else ""."""
    junk = _mostly_numbers(numbers)
    if not junk:
        return ""
    junk_cells = set(junk)
    kept = [c for c in numbers if c not in junk_cells]
    numeric = infer_column(name, source, kept, sampled)[0].kind == "numeric"
    return _junk_note(name, junk, len(numbers)) if numeric else ""


def _junk_note(name: str, junk: list[str], cells: int) -> str:
    """What a column of numbers with some other cells (junk) needs: those cells named, the fix."""
    counts = collections.Counter(c.strip() for c in junk)
    shown = ", ".join(f"{v!r} ({n})" for v, n in counts.most_common(3)) + (", ..." if len(counts) > 3 else "")
    return (
        f"{name!r}: {cells - len(junk):,} of its {cells:,} filled cells in the sample are numbers, the others are "
        f"not ({shown}), so it is read as text: each value its own id. Empty those cells (an empty cell is a "
        "missing number) and infer the schema again to read it as numbers"
    )


def _leading_zeros(cells: list[str]) -> bool:
    """Whether some cell is an integer written with a leading zero ("02415"): a code, which a number would lose."""
    return any(len(c) > 1 and c[0] == "0" and c.isdigit() for c in (c.strip() for c in cells))


def _dates(present: list[str]) -> bool:
    """Whether the first of the non-empty cells and nine in ten of them are dates (2023-12-02, 12/02/2023)."""
    return (
        bool(present)
        and bool(_DATE.match(present[0]))
        and sum(bool(_DATE.match(c)) for c in present) >= 0.9 * len(present)
    )


def every_value_distinct(source: str, cells: list[str]) -> bool:
    """Whether the non-empty cells of column source (two or more) are each another value, and are neither
    measurements (numbers with a fraction) nor dates or times (a time's values are new on each row anyway): a row's
    own id, or, in a sample, ids seen once in it that come back over the whole file. infer_column says so in its
    comment; the built-in csv schema's run warns of it (worker/schema_hints.py)."""
    present = [c for c in cells if c.strip()]
    if len(present) < 2 or len(set(present)) < len(present) or _dates(present) or untold_time(source, cells):
        return False
    numbers = [c for c in present if not is_missing_text(c)]
    values = _floats(numbers) if numbers else None
    return values is None or all(v.is_integer() for v in values)


def infer_column(name: str, source: str, cells: list[str], sampled: bool = False) -> tuple[Column, str]:
    """The column and a comment, by the rules of the module docstring. sampled: the cells are a sample of a larger
    file, where values seen once here may come back (a user id seen a few times in all is distinct in a sample)."""
    present = [c for c in cells if c.strip()]  # a categorical's NA is a value; a number's is missing
    numbers = [c for c in present if not is_missing_text(c)]
    values = _floats(numbers) if numbers else None
    seen = _seen(source, cells, present, numbers, values, sampled)
    present = numbers if values is not None else present
    if present and values is not None:
        return _numeric_column(name, source, present, values, seen)
    written = written_numbers(present)
    if written:
        what, fix, aside = written
        return Column(name, source, "categorical"), (
            f"{what} ({seen}): categorical, as text; {fix} and infer the schema again{aside}"
        )
    bag = _bag_column(name, source, present, seen)
    if bag is not None:
        return bag
    note = _junk_making_text(name, source, numbers, sampled)
    comment = f"text ({seen}): categorical" + (f". CHECK {note}" if note else "")
    return Column(name, source, "categorical"), comment


def _seen(source: str, cells: list[str], present: list[str], numbers: list[str], values: list[float] | None,
          sampled: bool) -> str:  # fmt: skip
    """What infer_column's comment says was seen of a column's cells: how many are non-empty (and NA, of a number
    column) and distinct, and what a person should do of one that carries nothing, holds dates or times, or whose
    values are (nearly) all distinct."""
    distinct = len(set(present))
    seen = f"{len(present):,} of {len(cells):,} cells non-empty, {distinct:,} distinct"
    if values is not None and len(numbers) < len(present):  # a number column: its NA cells are missing values
        seen = (f"{len(present):,} of {len(cells):,} cells non-empty, {len(present) - len(numbers):,} of them NA "
                f"or another missing value; {distinct:,} distinct")  # fmt: skip
    if not present:
        seen += "; no value at all: it carries nothing, delete this entry"
    elif distinct == 1:
        seen += "; one value only: it carries nothing, delete this entry"
    elif _dates(present):
        seen += ("; dates or times: as ids, nearly every value is new; derive columns such as the hour or the weekday "
                 "from it, and delete this entry")  # fmt: skip
    elif (untold := untold_time(source, cells)) is not None:
        seen += _UNTOLD_TIMES[untold]
    elif values is not None and not all(v.is_integer() for v in values):
        pass  # measurements: distinct values say nothing of an identifier
    elif sampled and (distinct == len(present) or values is None and distinct >= 0.9 * len(present)):
        every = "every" if distinct == len(present) else "nearly every"
        seen += f"; {every} value distinct in the sample: {SAMPLED_DISTINCT}"
    elif distinct == len(present):  # every_value_distinct: the branches above ruled out all but this of it
        seen += "; every value distinct: an identifier? then delete this entry"
    elif values is None and len(present) >= 100 and distinct >= 0.9 * len(present):
        seen += "; nearly every value distinct: an identifier or a time? such ids rarely come back"
    return seen


def _numeric_column(name: str, source: str, present: list[str], values: list[float], seen: str) -> tuple[Column, str]:
    """infer_column of a column of numbers (present: its cells, values: theirs): categorical where they are few
    distinct integers, codes with leading zeros or integers named like an id; else numeric, log where non-negative
    and skewed, else standardized with the sample's mean and std."""
    if all(v.is_integer() for v in values) and len(set(values)) <= _FEW_INTEGERS:
        return Column(name, source, "categorical"), f"few distinct integers ({seen}): categorical"
    if _leading_zeros(present):
        return Column(name, source, "categorical"), f"integers with leading zeros, codes ({seen}): categorical"
    if all(v.is_integer() for v in values) and (_ID_NAME.search(source) or _ID_WORD.fullmatch(source)):
        return Column(name, source, "categorical"), f"integers in a column named like an id ({seen}): categorical"
    n = len(values)
    mean = sum(values) / n
    deviations = [v - mean for v in values]
    scale = max(map(abs, deviations))  # powers of deviations scaled to at most 1: 1e-110 cubed is no 0.0
    std = scale * math.sqrt(sum((d / scale) ** 2 for d in deviations) / n) if scale > 0 else 0.0
    skew = sum((d / std) ** 3 for d in deviations) / n if std > 0 else 0.0
    if all(v.is_integer() for v in values):  # counts, or codes? a person knows
        seen += '; if these integers are codes or ids, not quantities, make it kind = "categorical"'
    if min(values) >= 0 and skew > _HEAVY_SKEW:
        comment = f"non-negative numbers, skewness {skew:.1f} ({seen}): log"
        return Column(name, source, "numeric", transform="log"), comment
    return (
        Column(name, source, "numeric", transform="standardize", mean=mean, std=std if std > 0 else 1.0),
        f"numbers, skewness {skew:.1f} ({seen}): standardize with the sample's mean and std below (if you "
        "delete them, train computes them in a pass over its whole file before training and prints them: eval "
        "and predict need them back in the schema)",
    )


def _bag_column(name: str, source: str, present: list[str], seen: str) -> tuple[Column, str] | None:
    """infer_column of a column of lists: the first of BAG_SEPARATORS that at least _BAG_SHARE of the cells hold
    and whose ids repeat (weighted where each token is id:number, else multi_hot); None where none is (prose, with
    ", ", is no list)."""
    for sep in BAG_SEPARATORS:
        holding = [c for c in present if sep in c]
        if sep == "," and holding and sum(", " in c for c in holding) >= 0.5 * len(holding):
            continue  # prose ("Big sale, 50% off"), not a list
        tokens = [t for c in present for t in c.split(sep) if t]
        weighted = bool(tokens) and all(t.rpartition(":")[0] and _floats([t.rpartition(":")[2]]) for t in tokens)
        keys = [t.rpartition(":")[0] for t in tokens] if weighted else tokens
        if present and sum(sep in c for c in present) >= _BAG_SHARE * len(present) and len(set(keys)) <= len(keys) / 2:
            kind = "weighted" if weighted else "multi_hot"
            longest = max(len(c.split(sep)) for c in present)
            comment = f"lists split by {sep!r} whose ids repeat ({seen}; up to {longest:,} tokens): {kind}"
            return Column(name, source, kind, separator=sep), comment
    return None

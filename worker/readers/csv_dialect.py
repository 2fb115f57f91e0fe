"""A CSV file's delimiter, told by its header line and the records under it (--format auto: format_detection.py).

    csv_delimiter(name) -> (delimiter, header) | None

The delimiters told are csv_header.DELIMITERS: comma, tab, ';' (spreadsheet exports in locales that write a
decimal comma) and '|'. A delimiter is a candidate where it splits the header (the file's first record, read by the
csv module: quotes and all) into two or more cells; the records under the header are those with content among the first
CHECKED_RECORDS. A candidate matches them where most of them (more than MATCH_SHARE) have the header's cell count,
or there is none (a header alone): a header whose width most records lack is no header of theirs (a damaged
first line over Criteo TSV, say), while a few bad records are the reader's to count. The delimiter is the
matching candidate, of several the one giving the most cells (`id;price, EUR;qty`: ';', whose 3 cells beat the
comma's 2). None: no delimiter splits the first line (one column, or a blank first line). ValueError where no
candidate matches, or two match giving as many cells. The header's names are its cells trimmed, as the readers
name columns; cells that name one column but for their spaces (`a` and ` a`) are no matter here: the readers
refuse them (csv_header.header_names), the probe does not.
"""

from __future__ import annotations

import csv
import itertools

from worker.readers.csv_header import DELIMITERS, delimiter_name
from worker.readers.csv_records import open_csv, read_header_cells

CHECKED_RECORDS = 100  # records under the header a delimiter is checked against, at most
MATCH_SHARE = 0.5  # of them with the header's cell count, more than, for a delimiter to match them (most)


def csv_delimiter(name: str) -> tuple[str, list[str]] | None:
    """(the delimiter, the header's cells split at it) of the file (see the module docstring), None where none
    splits its first line; ValueError, saying what the first line splits into and what the records under it do,
    where they match no candidate or two alike."""
    cells = {d: read_header_cells(name, d) or [] for d in DELIMITERS}
    headers = {d: [c.strip() for c in h] for d, h in cells.items() if len(h) > 1}  # (names trimmed, none refused)
    if not headers:
        return None
    widths = {d: _record_widths(name, d) for d in headers}
    matching = [d for d in headers if _matches(widths[d], len(headers[d]))]
    split = " and ".join(
        f"{len(h)}{' cells' * (k == 0)} at {delimiter_name(d)}" for k, (d, h) in enumerate(headers.items())
    )
    if len(headers) == 1 and not matching:
        ((d, header),) = headers.items()
        end = ": a delimiter at the end of each row?" if widths[d][0] == len(header) + 1 else ""
        records = "the record" if len(widths[d]) == 1 else f"most of the {len(widths[d])} records"
        raise ValueError(f"splits into {split}, and {records} under it into other counts (the first: "
                         f"{widths[d][0]}{end})")  # fmt: skip
    if not matching:
        raise ValueError(f"splits into {split}, and most of the records under it into other counts at "
                         "each")  # fmt: skip
    most = max(len(headers[d]) for d in matching)
    best = [d for d in matching if len(headers[d]) == most]
    if len(best) > 1:
        named = " or ".join(delimiter_name(d) for d in best)
        raise ValueError(f"splits into {split}, and the records under it read as well separated by {named}")
    return best[0], headers[best[0]]


def _record_widths(name: str, delimiter: str) -> list[int]:
    """The cell counts of those of the first CHECKED_RECORDS records under the header that hold more than blank
    cells (a record the csv module cannot read ends them)."""
    widths: list[int] = []
    with open_csv(name, delimiter) as reader:
        next(reader, None)
        try:
            for row in itertools.islice(reader, CHECKED_RECORDS):
                if any(cell.strip() for cell in row):
                    widths.append(len(row))
        except csv.Error:
            pass
    return widths


def _matches(widths: list[int], width: int) -> bool:
    """Whether more than MATCH_SHARE of the records' widths are the header's width (no record: yes)."""
    return not widths or sum(w == width for w in widths) > MATCH_SHARE * len(widths)

"""What data files in which a read found no example hold instead: the words of every "no examples" refusal.

The words come from that read's own counts (ReadStats), so they say what the readers read: CSV header lines,
libsvm lines of a comment or query id only, CSV records of blank cells, blank lines (the other lines read empty),
and malformed lines. A file that holds bytes of which no line was read (a CSV file of whitespace only: of no
content) holds blank lines.
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.readers.share import ReadStats, open_data


def no_examples_held(names: Sequence[str], stats: ReadStats, subject: str = "it") -> str:
    """What the files `names`, read whole without an example (stats: that read's counts), hold, as a refusal says
    it of `subject`: "<subject> is empty" where no file holds a byte, else "<subject> holds only <what>": a header
    (CSV), comments (libsvm), rows of blank cells (CSV), blank lines, and the malformed lines stats counted (then
    "; the first malformed one: <stats.first_bad>"). Of many files, "<subject>'s N files are empty" or "... hold
    only <what>". Opens each file for its first byte: for a refusal only."""
    many = len(names) > 1
    owner = "its" if subject == "it" else f"{subject}'s"
    whose = f"{owner} {len(names)} files" if many else subject
    if not any(_holds_a_byte(name) for name in names):
        return f"{whose} {'are' if many else 'is'} empty"
    blank = stats.empty_lines - stats.comment_lines - stats.blank_cell_rows
    held = [
        *(["headers" if stats.headers > 1 else "a header"] if stats.headers else []),
        *(["comments"] if stats.comment_lines else []),
        *(["rows of blank cells"] if stats.blank_cell_rows else []),
        *(["blank lines"] if blank or not (stats.headers or stats.lines_read) else []),
    ]
    if stats.bad_lines:
        held.append(f"{stats.bad_lines:,} malformed line{'s' * (stats.bad_lines != 1)}")
    held = held or ["lines that are no example"]  # stats not of a whole read
    listed = ", ".join(held[:-1]) + " and " + held[-1] if len(held) > 1 else held[0]
    first = f"; the first malformed one: {stats.first_bad}" if stats.bad_lines else ""
    return f"{whose} {'hold' if many else 'holds'} only {listed}{first}"


def _holds_a_byte(name: str) -> bool:
    """Whether a data file holds a byte (of a .gz file, once decompressed)."""
    with open_data(name) as f:
        return bool(f.read(1))

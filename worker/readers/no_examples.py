"""What data files in which a read found no example hold instead: the words of every "no examples" refusal.

Each line of such files is one of: a CSV's header (the first line of a CSV file that is not blank), a libsvm
comment (a line whose tokens, criteo.libsvm_tokens, are none: a comment or a query id only), a blank line
(whitespace only; in Criteo TSV, whose tabs part empty columns, spaces only), or another line: a malformed one,
or a CSV row of blank cells (the reader skips it as empty). The count of malformed lines is the read's
(ReadStats), not the scan's.
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.criteo import libsvm_tokens
from worker.readers.share import ReadStats, bounded_lines, open_data


def no_examples_held(names: Sequence[str], fmt: str, stats: ReadStats, subject: str = "it") -> str:
    """What the files `names` of format fmt, read whole without an example (stats: that read's counts), hold, as
    a refusal says it of `subject`: "<subject> is empty" where no file holds a byte, else "<subject> holds only
    <what>": a header (CSV), comments (libsvm), rows of blank cells (CSV), blank lines, and the malformed lines
    stats counted (then "; the first malformed one: <stats.first_bad>"). Of many files, "<subject>'s N files are
    empty" or "... hold only <what>". Reads the files: for a refusal only."""
    headers = comments = blank = other = 0
    for name in names:
        with open_data(name) as f:
            header_seen = fmt != "csv"
            for line in bounded_lines(f, name):
                text = line.rstrip(b"\r\n").strip(b" ") if fmt == "criteo" else line.strip()
                if not text:
                    blank += 1
                elif not header_seen:
                    header_seen, headers = True, headers + 1
                elif fmt == "libsvm" and not libsvm_tokens(text):
                    comments += 1
                else:
                    other += 1
    many = len(names) > 1
    owner = "its" if subject == "it" else f"{subject}'s"
    whose = f"{owner} {len(names)} files" if many else subject
    if not (headers or comments or blank or other):
        return f"{whose} {'are' if many else 'is'} empty"
    held = [
        *(["headers" if headers > 1 else "a header"] if headers else []),
        *(["comments"] if comments else []),
        *(["rows of blank cells"] if fmt == "csv" and other > stats.bad_lines else []),
        *(["blank lines"] if blank else []),
    ]
    if stats.bad_lines:
        held.append(f"{stats.bad_lines:,} malformed line{'s' * (stats.bad_lines != 1)}")
    held = held or ["lines that are no example"]  # other lines, none counted bad: stats not of a whole read
    listed = ", ".join(held[:-1]) + " and " + held[-1] if len(held) > 1 else held[0]
    first = f"; the first malformed one: {stats.first_bad}" if stats.bad_lines else ""
    return f"{whose} {'hold' if many else 'holds'} only {listed}{first}"

"""Counting a file's lines of data (worker/linecount.py count_data_upto) with and without NoData.starts' look at
each line's first byte (NoData.look), against bytes.count of its line ends, the floor.

A file of --lines lines in each format (libsvm `1 7:1 12:1`, Criteo's 40 tab-separated columns, a CSV with a
header) is written once, then counted in turn, each way as often, in CPU seconds (the count is one thread's work;
a shared machine's load moves wall time far more):

  look     count_data_upto as it runs: a chunk none of whose lines starts with a byte a line of no data can start
           with holds none, and is not searched
  regex    count_data_upto with NoData.look False: each chunk searched for lines of no data by its format's regex
  newline  the file's bytes read and their LFs counted: no line looked at

Each count is checked to equal the file's lines. Prints CPU seconds per run (median of the reps) of each; the last
line is one JSON object.
Run: `.venv/bin/python benchmarks/line_count.py` (about half a minute on 2 cores with the defaults).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time

import harness  # before numpy: see its docstring

from worker import linecount
from worker.linecount import count_files_upto, no_data

LINES = {
    "libsvm": "{label} {i}:1 {j}:1\n",
    "criteo": "{label}" + "\t5" * 13 + "\t68fd1e64" * 26 + "\n",
    "csv": "{label},x{i},{j}\n",
}


def write(path: str, fmt: str, lines: int) -> None:
    with open(path, "w") as f:
        if fmt == "csv":
            f.write("label,a,b\n")
        f.writelines(LINES[fmt].format(label=i % 2, i=i, j=i + 7) for i in range(lines))


def newlines(path: str) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(linecount.CHUNK_BYTES):
            n += chunk.count(b"\n")
    return n


def counted(path: str, fmt: str, lines: int, look: bool) -> None:
    empty = dataclasses.replace(no_data(fmt), look=look)
    got = count_files_upto([path], None, header=fmt == "csv", empty=empty).lines  # count_data_upto's, looking or not
    if got != lines:
        raise SystemExit(f"{fmt}: counted {got} lines of data, expected {lines}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    result: dict = {"benchmark": "line_count", "lines": args.lines}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in LINES:
            path = os.path.join(tmp, f"data.{fmt}")
            write(path, fmt, args.lines)
            legs = {
                "look": lambda p=path, f=fmt: counted(p, f, args.lines, True),
                "regex": lambda p=path, f=fmt: counted(p, f, args.lines, False),
                "newline": lambda p=path: newlines(p),
            }
            cpu_s: dict[str, list[float]] = {name: [] for name in legs}
            for rep in range(args.repeats + 1):  # in turn, the first round a warm-up
                for name, leg in legs.items():
                    start = time.process_time()
                    leg()
                    if rep:
                        cpu_s[name].append(time.process_time() - start)
            size_mb = os.path.getsize(path) / 1e6
            seconds = {name: statistics.median(s) for name, s in cpu_s.items()}
            print(f"{fmt:7} {args.lines:,} lines ({size_mb:.0f} MB), CPU seconds: " + ", ".join(
                f"{name} {s:.3f}" for name, s in seconds.items()) + f" (median of {args.repeats})")  # fmt: skip
            result[fmt] = {name: round(s, 4) for name, s in seconds.items()}
    harness.emit(result)


if __name__ == "__main__":
    main()

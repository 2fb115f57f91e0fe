"""benchmarks/memtable_filter.py end to end at a small size: both dirs hold the memtable rows it says (none flushed),
and each side timed the same number of reads."""

import json

from tests.benchscripts import run_benchmark


def test_memtable_filter_runs_small_and_reports_both_sides():
    args = ["--rows", "20000", "--memtable-rows", "3000", "--ids", "2000", "--reps", "3"]
    done = run_benchmark("memtable_filter", *args)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["memtable_rows"] == 3000 and result["ids"] == 2000
    assert set(result["us_per_key"]) == {"filter", "no filter"} and min(result["us_per_key"].values()) > 0
    assert result["ratio"] == result["us_per_key"]["filter"] / result["us_per_key"]["no filter"]
    assert "level-0 files {True: 0, False: 0}" in done.stdout

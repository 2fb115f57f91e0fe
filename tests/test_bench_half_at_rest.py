"""benchmarks/half_at_rest.py end to end at a small size: both settings trained the same rows through a RAM tier far
smaller than the table (rows read back from RocksDB), and the float16 one's values are 2 * dim bytes smaller."""

import json

from tests.benchscripts import run_benchmark


def test_half_at_rest_runs_small_and_reports_both_settings():
    args = ["--rows", "2000", "--eval-rows", "500", "--shards", "1", "--cache-bytes", "128K"]
    done = run_benchmark("half_at_rest", *args, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    full, half = result["float32"], result["float16"]
    assert (full["values_at_rest"], half["values_at_rest"]) == ("float32", "float16")
    assert full["dim"] == half["dim"] == 9 and full["rows"] == half["rows"] > 0
    assert full["value_bytes"] - half["value_bytes"] == 2 * half["dim"]
    assert full["read_back"] > 0 and half["read_back"] > 0
    assert 0 < half["disk_bytes_per_row"] < full["disk_bytes_per_row"]

"""benchmarks/block_reads.py end to end at a small size: every variant read the same number of requests, and the
variants' files differ as they say (block sizes)."""

import json

from tests.benchscripts import run_benchmark


def test_block_reads_runs_small_and_reports_every_variant():
    args = ["--rows", "30000", "--ids", "2000", "--reps", "2", "--variants", "1K blocks,mmap"]
    done = run_benchmark("block_reads", *args)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(result["us_per_key"]) == ["pread", "1K blocks", "mmap"]  # pread, the server's read, always first
    assert min(result["us_per_key"].values()) > 0 and result["ratio_to_pread"]["pread"] == 1.0
    assert result["ratio_to_pread"]["mmap"] == result["us_per_key"]["mmap"] / result["us_per_key"]["pread"]
    blocks = result["data_blocks"]  # 4 KB blocks hold about 24 rows, 1 KB blocks about 6
    assert blocks["mmap"] == blocks["pread"] and 3 * blocks["pread"] < blocks["1K blocks"] < 5 * blocks["pread"]
    assert all(b > 30000 * 160 for b in result["disk_bytes"].values())


def test_unknown_variants_are_refused():
    done = run_benchmark("block_reads", "--variants", "pread,4K", timeout=60)
    assert done.returncode == 2 and "unknown variants ['4K']" in done.stderr

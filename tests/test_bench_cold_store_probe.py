"""benchmarks/cold_store_probe.py: the sides read in every order equally often, ratios withheld where a side's
files are not in the page cache, and its output naming what its write and read comparisons leave out."""

import collections
import json

import pytest

from tests.benchscripts import load_benchmark, run_benchmark


@pytest.fixture(scope="module")
def probe():
    return load_benchmark("cold_store_probe")


def test_each_side_comes_first_and_right_after_each_other_side_equally_often(probe):
    firsts = collections.Counter(order[0] for order in probe.ORDERS)
    pairs = collections.Counter((a, b) for order in probe.ORDERS for a, b in zip(order, order[1:]))
    assert len(probe.ORDERS) == 6 and firsts == dict.fromkeys(probe.SIDES, 2)
    assert pairs == {(a, b): 2 for a in probe.SIDES for b in probe.SIDES if a != b}  # slot after paged: 2 of 6


def figures(paged_after: float = 1.0) -> dict:
    return {"rows": 1000, "pages": 50, "load": 0.8, "paged_bytes": 50 * 4096, "rocksdb_bytes": 10**6,
            "mem_available_before_bytes": 2**33, "mem_available_warm_bytes": 2**33, "paged_resident_before_reads": 1.0,
            "rocksdb_resident_before_reads": 0.995, "paged_resident_after_reads": paged_after,
            "rocksdb_resident_after_reads": 1.0}  # fmt: skip


def reads_and_writes() -> tuple[list[dict], dict]:
    read = {"distribution": "zipf", "threads": 1, "keys_per_request": 900, "paged_us_per_key": 2.0,
            "paged_pages_per_key": 1.01, "slot_us_per_key": 1.0, "rocksdb_us_per_key": 4.0, "paged_vs_rocksdb": 0.5,
            "slot_vs_rocksdb": 0.25}  # fmt: skip
    write = {"keys_per_request": 900, "pwrite_us_per_key": 1.0, "writebatch_us_per_key": 3.0,
             "writebatch_write_us_per_key": 2.0, "pwrite_vs_writebatch": 1 / 3, "pwrite_dirty_kb_per_key": 4.0}  # fmt: skip
    return [read], write


def test_ratios_are_shown_only_where_both_sides_files_stay_in_the_page_cache(probe, capsys):
    assert probe.shortfall(figures()) == ""
    reads, writes = reads_and_writes()
    probe.print_figures(figures(), reads, writes)
    out = capsys.readouterr().out
    assert "0.500x" in out and "0.250x" in out and "(0.333x)" in out and "withheld" not in out, out

    low = figures(paged_after=0.95)
    said = probe.shortfall(low)
    assert said == "ratios withheld: in the page cache under 99%: paged 95.0% after reads", said
    probe.withhold_ratios(reads, writes)
    assert (reads[0]["paged_vs_rocksdb"], reads[0]["slot_vs_rocksdb"], writes["pwrite_vs_writebatch"]) == (None,) * 3
    probe.print_figures(low, reads, writes)
    out = capsys.readouterr().out
    assert said in out and "0.500x" not in out and "0.250x" not in out and "(-)" in out, out
    assert out.splitlines()[-2].split()[-2:] == ["-", "-"], out  # the row's two ratio columns


def test_the_output_says_what_the_pwrite_side_and_the_paged_reads_leave_out(probe, capsys):
    probe.print_figures(figures(), *reads_and_writes())
    out = capsys.readouterr().out
    assert "checksums: RocksDB's reads verify each block's checksum; the paged and slot reads verify none" in out
    write = out.splitlines()[-1]
    assert "pwrite in place with no crash safety (no double-write, no fsync)" in write, write
    assert (
        "RocksDB with its WAL, a WriteBatch of one Python batch.put per row" in write and "neither side synced" in write
    )


def test_the_probe_runs_small_in_whole_turns_of_orders_and_records_residency_both_times():
    args = ["--rows", "20000", "--ids", "2000", "--seconds", "0.2", "--threads-list", "1", "--distributions", "zipf",
            "--write-requests", "1"]  # fmt: skip
    done = run_benchmark("cold_store_probe", *args, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    (read,) = result["reads"]
    assert read["requests"] >= 6 and read["requests"] % 6 == 0, read
    build = result["build"]
    fractions = [
        build[f"{side}_resident_{when}"] for side in ("paged", "rocksdb") for when in ("before_reads", "after_reads")
    ]
    assert all(0 <= f <= 1 for f in fractions), build
    withheld = min(fractions) < 0.99
    assert bool(result["ratios_withheld"]) == withheld and (read["paged_vs_rocksdb"] is None) == withheld, result

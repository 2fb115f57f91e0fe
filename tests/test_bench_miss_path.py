"""benchmarks/miss_path.py: its request ids and server flags against plain oracles, a run end to end at a small
size (a table that fits in the RAM tier and one that does not, filled by ingest; with and without the live
reference), the fill's file format, and a push fill then reused."""

import argparse
import json
import os
import re

import numpy as np
from rocksdict import Rdict, SstFileWriter

from tests.benchscripts import load_benchmark, run_benchmark
from worker.cluster import LocalCluster

SMALL = ["--ids", "5000", "--cache-bytes", "8M", "--server-args", "", "--seconds", "1", "--warmup-s", "0.2", "--idle-s", "0.2",
         "--reference-s", "0.5", "--reference-warmup", "1"]  # fmt: skip


def test_request_ids_are_fresh_unique_sorted_and_drawn_again_from_their_seed():
    mp = load_benchmark("miss_path")
    permutation = np.random.default_rng(0).permutation(1000).astype(np.uint64)
    for distribution in ("zipf", "uniform"):
        ids = mp.request_ids(distribution, permutation, 5000, [1, 2, 3])
        assert ids.dtype == np.uint64 and len(ids) > 0 and ids.max() < 1000
        assert np.array_equal(ids, np.unique(ids))
        assert np.array_equal(ids, mp.request_ids(distribution, permutation, 5000, [1, 2, 3]))
        assert not np.array_equal(ids, mp.request_ids(distribution, permutation, 5000, [1, 2, 4]))
    # Zipf: rank r is id permutation[r], so the hottest ids are spread over the ids, not 0..k
    calls = [mp.request_ids("zipf", permutation, 200, [7, k]) for k in range(200)]
    counts = np.bincount(np.concatenate(calls).astype(np.int64), minlength=1000)  # calls each id is in
    assert counts[int(permutation[0])] == 200
    assert counts[permutation[:10].astype(np.int64)].min() > counts[permutation[500:].astype(np.int64)].max()


def test_request_ids_past_a_rank_are_the_draws_a_cache_of_the_top_ranks_would_miss():
    mp = load_benchmark("miss_path")
    permutation = np.random.default_rng(0).permutation(1000).astype(np.uint64)
    rank_of = np.argsort(permutation)  # id -> its Zipf rank
    every = mp.request_ids("zipf", permutation, 5000, [4, 5])
    past = mp.request_ids("zipf", permutation, 5000, [4, 5], past_rank=50)
    assert len(past) > 0 and np.array_equal(past, every[rank_of[every] >= 50])
    assert np.array_equal(mp.request_ids("zipf", permutation, 5000, [4, 5], past_rank=0), every)
    uniform = mp.request_ids("uniform", permutation, 5000, [4, 5])  # no ranks: every draw
    assert np.array_equal(mp.request_ids("uniform", permutation, 5000, [4, 5], past_rank=50), uniform)


def test_server_flags_are_parsed_as_the_server_parses_them():
    mp = load_benchmark("miss_path")
    flags = mp.server_flags(256 << 20, 3, "--memory-bytes 1G --direct-reads")
    assert flags.args == ["--cache-bytes", str(256 << 20), "--read-threads", "3", "--memory-bytes", "1G",
                          "--direct-reads"]  # fmt: skip
    assert (flags.read_threads, flags.direct_reads) == (3, True)
    assert flags.plan.ram_tier_bytes == 256 << 20 and flags.plan.bounded
    assert flags.budget == (1 << 30, "--memory-bytes")
    plain = mp.server_flags(256 << 20, None, "--read-threads 4")  # the last of a repeated flag wins, as there
    assert plain.read_threads == 4 and not plain.plan.bounded
    assert plain.budget[0] == 256 << 20
    assert mp.server_flags(0, 1, "").args == ["--read-threads", "1"]
    assert mp.server_flags(0, None, "--mmap-reads").mmap_reads and not plain.mmap_reads


def filter_bytes(opts, tmp_path) -> int:
    """The filter block bytes of an SST file of 1,000 keys written and ingested with opts."""
    os.makedirs(tmp_path)
    sst, db_path = str(tmp_path / "one.sst"), str(tmp_path / "db")
    writer = SstFileWriter(opts)
    writer.open(sst)
    for i in range(1000):
        writer[i.to_bytes(8, "big")] = bytes(100)
    writer.finish()
    db = Rdict(db_path, opts)
    try:
        db.ingest_external_file([sst])
        props = db.property_value("rocksdb.aggregated-table-properties")
    finally:
        db.close()
    return int(re.search(r"filter block size=(\d+)", props).group(1))


def test_the_fill_writes_the_last_level_as_the_servers_compaction_does(tmp_path):
    mp = load_benchmark("miss_path")
    bounded = mp.server_flags(256 << 20, None, "--memory-bytes 1G")  # the last level keeps no filter
    assert filter_bytes(bounded.last_level_options(), tmp_path / "bounded") == 0
    assert filter_bytes(bounded.reference_options(), tmp_path / "upper") > 1000 * 15 // 8  # 16 bits per key
    plain = mp.server_flags(256 << 20, None, "")  # every level keeps its filter: 8 bits per key
    assert 1000 * 7 // 8 < filter_bytes(plain.last_level_options(), tmp_path / "plain") < 1000 * 12 // 8


def run(*args: str) -> dict:
    done = run_benchmark("miss_path", *SMALL, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_small_run_end_to_end(tmp_path):
    keep = str(tmp_path / "data")
    out = run("--rows-list", "20000,60000", "--distributions", "zipf", "--keep-data", keep)  # 20,000 rows fit in
    # the 8 MiB RAM tier, 60,000 do not
    assert [(f["rows"], f["method"], f["reused"], f["checked"]) for f in out["fills"]] == [
        (20000, "ingest", False, True), (60000, "ingest", False, True)]  # fmt: skip
    assert all(f["data_bytes"] > f["rows"] * 150 for f in out["fills"])  # 14-byte key + 152-byte value per row
    fits, larger = out["results"]
    assert (fits["rows"], larger["rows"]) == (20000, 60000)
    for r in (fits, larger):
        assert r["distribution"] == "zipf" and r["pairs"] >= 3 and r["pull_ids_per_s"] > 0 and r["push_ids_per_s"] > 0
        assert 0 < r["unique_ids_per_call"] <= 5000
        assert 0 < r["idle_peak_rss_bytes"] <= r["peak_rss_bytes"]
        assert r["stopped_reference_calls"] >= 1 and r["stopped_reference_us_per_key"] > 0
        # the live reference read after every timed pair, and is the one the check uses
        assert r["live_reference_calls"] == r["pairs"] and r["live_reference_us_per_key"] > 0
        assert r["reference"] == "live" and r["reference_us_per_key"] == r["live_reference_us_per_key"]
        cores = r["server_cpu_cores"]  # CPU per second of the timed calls, in all and by the server's threads
        assert cores["all"] > 0 and cores["ps-rpc"] > 0 and sum(cores.values()) <= 2 * cores["all"] + 0.5
    # every row pulled into RAM before the calls: nothing misses
    assert fits["misses_per_pull"] == 0 and fits["server_us_per_miss"] is None and fits["pull_ratio"] == 1.0
    assert larger["misses_per_pull"] > 0 and larger["server_us_per_miss"] > 0
    assert larger["pull_ratio"] == larger["pull_ids_per_s"] / fits["pull_ids_per_s"]
    assert [c["check"] for c in out["checks"]] == [
        "20,000 zipf: peak RSS <= budget + idle peak + 64 MiB",
        "60,000 zipf: pull rate / first size's",
        "60,000 zipf: server us/miss (bound) / reference us/key",
        "60,000 zipf: peak RSS <= budget + idle peak + 64 MiB",
    ]
    assert out["all_ok"] == all(c["ok"] for c in out["checks"])
    assert sorted(os.listdir(keep)) == ["rows-20000", "rows-60000"]


def test_without_the_live_reference_the_check_uses_the_one_after_the_stop(tmp_path):
    out = run("--rows-list", "20000,60000", "--distributions", "uniform", "--no-live", "--keep-data",
              str(tmp_path / "data"))  # fmt: skip
    larger = out["results"][1]
    assert larger["live_reference_calls"] == 0 and larger["live_reference_us_per_key"] is None
    assert larger["reference"] == "stopped" and larger["reference_us_per_key"] == larger["stopped_reference_us_per_key"]
    ratio = next(c for c in out["checks"] if "us/miss" in c["check"])["figure"]
    assert ratio == larger["server_us_per_miss"] / larger["stopped_reference_us_per_key"]


def test_checks_against_the_targets():
    mp = load_benchmark("miss_path")

    def result(rows, distribution, ratio, us_per_miss, peak):
        return {"rows": rows, "distribution": distribution, "pull_ratio": ratio, "server_us_per_miss": us_per_miss,
                "reference_us_per_key": 10.0, "peak_rss_bytes": peak, "rss_limit_bytes": 100}  # fmt: skip

    got = mp.checks([result(10, "uniform", 1.0, None, 100), result(99, "uniform", 0.07, 15.0, 101),
                     result(99, "zipf", 0.24, 15.1, 50)], first_rows=10)  # fmt: skip
    assert [(c["check"], c["ok"]) for c in got] == [
        ("10 uniform: peak RSS <= budget + idle peak + 64 MiB", True),
        ("99 uniform: pull rate / first size's", True),
        ("99 uniform: server us/miss (bound) / reference us/key", True),
        ("99 uniform: peak RSS <= budget + idle peak + 64 MiB", False),
        ("99 zipf: pull rate / first size's", False),
        ("99 zipf: server us/miss (bound) / reference us/key", False),
        ("99 zipf: peak RSS <= budget + idle peak + 64 MiB", True),
    ]


def test_push_fill_then_reuse(tmp_path):
    mp = load_benchmark("miss_path")
    args = argparse.Namespace(fill="push", fill_ids=4000, fill_streams=3)
    cluster = LocalCluster(1, root=str(tmp_path / "rows-10000"))
    try:
        flags = mp.server_flags(0, None, "")
        fill = mp.prepare(cluster, 10_000, args, np.random.default_rng(0), flags)
        assert (fill.method, fill.reused, fill.checked, fill.sample) == ("push", False, False, None)
        # a server started on it reports 10,000 rows: reused, not filled again
        assert mp.prepare(cluster, 10_000, args, np.random.default_rng(0), flags).reused
    finally:
        cluster.cleanup()

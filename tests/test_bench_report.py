"""benchmarks/report.py's table says which runs its figures come from: one revision and date, or each benchmark's
where a table rebuilt from saved results (--from-json, --only) mixes runs."""

from tests.benchscripts import load_benchmark


def test_the_table_names_the_run_of_each_result_where_they_differ():
    report = load_benchmark("report")
    same = {"a": {"revision": "abc", "date": "2026-12-05"}, "b": {"revision": "abc", "date": "2026-12-05"}}
    assert report.provenance(same) == "revision abc, run on 2026-12-05"
    mixed = {**same, "b": {"revision": "def+dirty", "date": "2026-12-03"}, "c": {}}
    assert report.provenance(mixed) == ("results of several runs: a at abc on 2026-12-05; b at def+dirty on "
                                        "2026-12-03; c at an unknown revision on an unknown date")  # fmt: skip


def test_the_training_row_shows_each_alternated_pair_beside_the_ratio_of_medians():
    report = load_benchmark("report")
    result = {"backend": "numpy", "rows": 200_000, "shards": 2, "repeats": 3, "ps_examples_per_s": 42_000.0,
              "inprocess_examples_per_s": 50_000.0, "ps_eval_auc": 0.76, "inprocess_eval_auc": 0.76,
              "ps_vs_inprocess": 0.84, "ps_runs_examples_per_s": [38_000.0, 42_000.0, 45_000.0],
              "inprocess_runs_examples_per_s": [50_000.0, 60_000.0, 45_000.0], "command": "python x.py"}  # fmt: skip
    (line,) = report.train_rows(result)
    assert "**0.84** (target 0.8), of the medians; pair by pair 0.76, 0.70, 1.00" in line


def test_the_scale_rows_say_the_smaller_table_ran_on_its_own():
    report = load_benchmark("report")
    common = {"cache_bytes": 2 << 30, "peak_rss_bytes": 1 << 30, "disk_bytes_per_row": 200.0,
              "raw_bytes_per_row": 166, "unique_ids_per_request": 30_000, "zipf_pull_ids_per_s": 1e6,
              "zipf_push_ids_per_s": 1e6, "misses_per_pull": 5_000, "misses_per_push": 5_000, "evictions": 0}  # fmt: skip
    small = {**common, "rows": 1_000_000, "command": "python benchmarks/scale.py --rows 1000000"}
    large = {**common, "rows": 10_000_000, "command": "python benchmarks/scale.py --rows 10000000"}
    zipf = [line for line in report.scale_rows(small, large) if line.startswith("| Zipf")]
    assert len(zipf) == 2
    assert all("the same at 1,000,000 rows, in a run of its own (scale_1e6), not alternated" in line for line in zipf)

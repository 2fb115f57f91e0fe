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

"""benchmarks/table_split.py: its rank probabilities and perfect-cache split against plain oracles, and a run end
to end at a small size whose figures add up."""

import json

import numpy as np

from tests.benchscripts import load_benchmark, run_benchmark

ts = load_benchmark("table_split")


def test_rank_probs_sum_to_one_and_match_the_draws():
    field = ts.Field("f", 5_000, 1.1)
    probs = field.rank_probs(field.num_ids)
    assert len(probs) == field.num_ids and abs(probs.sum() - 1) < 1e-9
    assert np.all(np.diff(probs) <= 0)  # rank 0 is the most frequent
    draws = ts.harness.zipf_ids(np.random.default_rng(1), 400_000, field.num_ids, field.exponent)
    seen = np.bincount(draws.astype(np.int64), minlength=field.num_ids) / len(draws)
    assert np.allclose(seen[:20], probs[:20], rtol=0.05)


def test_perfect_cuts_hold_the_most_probable_ids_of_all_fields():
    fields = (ts.Field("a", 300, 1.1), ts.Field("b", 50, 0.5), ts.Field("c", 10_000, 0.3))
    ram_rows = 200
    everyone = sorted(((p, t) for t, f in enumerate(fields) for p in f.rank_probs(f.num_ids)), reverse=True)
    oracle = np.bincount([t for _, t in everyone[:ram_rows]], minlength=len(fields))
    cuts = ts.perfect_cuts(fields, ram_rows)
    assert cuts.sum() == ram_rows and list(cuts) == list(oracle)


def test_runs_small_and_its_figures_add_up():
    args = ["--ram-rows", "12000", "--draws", "1000", "--requests", "40", "--warmup", "20"]
    done = run_benchmark("table_split", *args)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    k = len(result["tables"])
    assert result["requests"] == 20 and k == len(ts.FIELDS)
    by_table = result["misses_by_table"]
    for name, key in (("split", "misses_per_request"), ("one", "one_table_misses_per_request"),
                      ("perfect", "perfect_misses_per_request")):  # fmt: skip
        assert len(by_table[name]) == k and abs(sum(by_table[name]) - result[key]) < 1e-6
        assert all(0 <= m <= u for m, u in zip(by_table[name], result["unique_ids_per_request"]))
    held = result["rows_held"]
    assert sum(held["split"]) <= 12000 and sum(held["one"]) <= 12000 and sum(held["perfect"]) == 12000
    assert result["split_over_one_table"] == result["misses_per_request"] / result["one_table_misses_per_request"] - 1

"""benchmarks/vs_pytorch.py end to end at a small size (5,000 rows, one run of each system): both models train, their
parameter counts agree, a variant whose flag `ps-worker train` lacks is skipped; and its flag check alone."""

import json

from tests.benchscripts import load_benchmark, run_benchmark


def test_unlisted_flags_matches_whole_flags_only():
    unlisted = load_benchmark("vs_pytorch").unlisted_flags
    help_text = "  [--dense-optimizer {adam,sgd}] [--hidden HIDDEN]\n  --staleness STALENESS"
    assert unlisted("--dense ps", help_text) == ["--dense"]  # a prefix of a listed flag is not listed
    assert unlisted("--hidden 8,8 --staleness=2", help_text) == []
    assert unlisted("--dense-optimizer sgd --mode sync", help_text) == ["--mode"]
    assert unlisted("", help_text) == []


def test_small_run_end_to_end():
    done = run_benchmark("vs_pytorch", "--rows", "5000", "--test-rows", "2000", "--repeats", "1",
                         "--sparseps-args", "", "--sparseps-args", "--no-such-flag 3")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert any("skipping sparseps variant '--no-such-flag 3'" in line for line in lines), done.stdout
    result = json.loads(lines[-1])
    assert set(result["systems"]) == {"plain PyTorch", "sparseps"}
    widths = [40 * 10 + 13, 400, 400, 400, 1]  # 39 fields and the bias, dim 10, then 13 numeric features
    mlp = sum(a * b + b for a, b in zip(widths, widths[1:]))
    assert result["mlp_params"] == result["plain_mlp_params"] == mlp
    assert 0 < result["train_ids"] <= result["num_ids"]
    plain, ours = result["systems"]["plain PyTorch"], result["systems"]["sparseps"]
    assert plain["runs"][0]["embedding_params"] == result["num_ids"] * 10
    assert ours["runs"][0]["table_rows"] == result["train_ids"]  # one row per id pushed in training
    assert result["checks"]["sparseps: trained_rows_equal"] and result["checks"]["mlp_params_equal"]
    assert plain["runs"][0]["examples"] == ours["runs"][0]["train_examples"] == 5000
    for system in (plain, ours):
        assert system["examples_per_s"] > 0 and 0 < system["eval_auc"] < 1
    assert result["best_variant"] == "sparseps"
    assert result["best_vs_plain"] == ours["examples_per_s"] / plain["examples_per_s"]

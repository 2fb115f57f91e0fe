"""benchmarks/memory_bound.py end to end at its --quick sizes: every case ran on its own server, and each limit is
the bound + that case's idle peak + 64 MiB (the replay's: the big case's, a fresh server of the same flags), and
the client that keeps 64 MiB messages has each of its requests refused."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.benchscripts import load_benchmark, run_benchmark

MiB = 1 << 20


def test_memory_bound_runs_quick_and_reports_every_case():
    """With PS_LOG_LEVEL=WARNING in its environment (passed on to its servers): it gives them --log-level INFO, for
    the warm-up's INFO line it waits for."""
    done = run_benchmark("memory_bound", "--quick", timeout=600, env={**os.environ, "PS_LOG_LEVEL": "WARNING"})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    cases = {r["case"]: r for r in result["results"]}
    assert list(cases) == ["big", "clients", "large", "replay", "own-client"]
    assert result["memory_bytes"] == 256 * MiB
    for r in cases.values():
        assert r["rss_limit_bytes"] == 256 * MiB + r["idle_peak_rss_bytes"] + 64 * MiB
        assert r["peak_rss_bytes"] >= r["idle_peak_rss_bytes"] > 50 * MiB
        assert (r["refused"] is None) == (r["case"] != "own-client")
    assert cases["replay"]["idle_peak_rss_bytes"] == cases["big"]["idle_peak_rss_bytes"]
    assert cases["own-client"]["refused"] == 4  # every request of 64 MiB messages: larger than the room
    assert cases["own-client"]["ids_served"] == 0  # refused before anything was read or applied
    assert cases["big"]["ids_served"] == 4 * 200_000  # --quick: two pulls and two pushes of 200,000 ids
    assert cases["clients"]["ids_served"] > 0 and cases["large"]["ids_served"] > 0
    assert result["ok"] == all(r["ok"] for r in cases.values())
    assert "limit = the bound + the idle peak + 64 MiB" in done.stdout


def test_the_idle_peak_waits_for_the_warm_up_line_this_server_logged(tmp_path):
    """Served reads a server's idle peak once its warm-up logged its end (not once its CPU looks quiet, as a server
    starved of CPU does mid warm-up); a restarted server's log holds the line of the server before it."""
    memory_bound = load_benchmark("memory_bound")
    running = SimpleNamespace(pid=1, poll=lambda: None)
    log = tmp_path / "shard-0.log"
    log.write_text("2026-12-07 09:00:00,000 INFO ps.engine.warmup: compiled kernels loaded in 1.20 s\n")
    restart = log.stat().st_size
    with log.open("a") as f:
        f.write("2026-12-07 09:00:05,000 INFO ps.server: ps-server shard 0/1 listening on 127.0.0.1:1\n")
    with pytest.raises(SystemExit, match="logged no end in 0 s"):
        memory_bound.wait_warmed_up(str(log), restart, running, timeout_s=0.2)
    with log.open("a") as f:
        f.write(
            "2026-12-07 09:00:06,000 WARNING ps.engine.warmup: warm-up of the compiled kernels failed (the first "
            "request loads them instead): no space left on device\n"
        )
    with pytest.raises(SystemExit, match="did not load its compiled kernels: .*no space left on device"):
        memory_bound.wait_warmed_up(str(log), restart, running, timeout_s=60)
    memory_bound.wait_warmed_up(str(log), 0, running, timeout_s=60)  # the first server's line: it loaded them


def test_a_server_that_ends_before_its_warm_up_line_fails_the_wait_at_once(tmp_path):
    """Its exit and its log's last lines (undecodable bytes replaced), not a wait of timeout_s that then blames the
    warm-up."""
    memory_bound = load_benchmark("memory_bound")
    log = tmp_path / "shard-0.log"
    log.write_bytes(b"2026-12-07 09:00:00,000 ERROR ps.server: cannot open the data dir \xff\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(SystemExit, match="exited with code 3 before its warm-up logged its end") as e:
        memory_bound.wait_warmed_up(str(log), 0, proc, timeout_s=5)
    assert "cannot open the data dir \ufffd" in str(e.value)

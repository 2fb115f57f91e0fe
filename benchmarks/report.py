"""Runs the benchmarks at fixed sizes and writes one performance table into README.md, stamped with the date, the
machine and the git revision.

    python benchmarks/report.py                  # every benchmark (4-15 min on 2 cores, by the host), then README.md
    python benchmarks/report.py --dry-run        # the commands it would run, nothing else
    python benchmarks/report.py --quick --readme /tmp/README.md    # small sizes: tests this script, not a table

Each benchmark runs as its own process (its output is shown as it goes) and its last line, one JSON object, is
kept, with the revision and the date it ran at; all of them are saved to --json, and the table names the runs it
comes from (one revision and date, or each benchmark's where they differ). The table goes between the lines `<!-- benchmarks:start -->` and
`<!-- benchmarks:end -->` of --readme; it is written only when every benchmark succeeded (--from-json and --only
rebuild it from saved results, rerunning only the named benchmarks). Each row names what is measured, our
figure, the reference measured in the same run, their ratio with its target, and the command that reproduces it.
--quick runs every benchmark at small sizes to check that the scripts and this report work; its figures say
little (startup, warm-up and noise weigh more), and its table is stamped as such and never belongs in README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"

FUZZ = ["-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_fuzz.py"]
# name -> (script and arguments at the report's sizes, at --quick sizes, timeout in seconds); "-m": a module
RUNS: dict[str, tuple[list[str], list[str], int]] = {
    "pull_push": (["pull_push.py", "--rows", "2000000", "--ids", "100000", "--reps", "40"],
                  ["pull_push.py", "--rows", "200000", "--ids", "20000", "--reps", "5"], 600),
    "cold_pull": (["cold_pull.py", "--rows", "1000000", "--ids", "100000", "--reps", "8"],
                  ["cold_pull.py", "--rows", "200000", "--ids", "20000", "--reps", "3"], 600),
    "scale_1e6": (["scale.py", "--rows", "1000000", "--cache-bytes", "2G", "--reps", "30"],
                  ["scale.py", "--rows", "100000", "--cache-bytes", "64M", "--reps", "5"], 600),
    "scale_1e7": (["scale.py", "--rows", "10000000", "--cache-bytes", "2G", "--reps", "30"],
                  ["scale.py", "--rows", "200000", "--cache-bytes", "64M", "--reps", "5"], 900),
    "flush_stall": (["flush_stall.py", "--rows", "1000000", "--ids", "100000"],
                    ["flush_stall.py", "--rows", "100000", "--ids", "10000"], 600),
    "train_throughput": (["train_throughput.py", "--rows", "200000", "--backend", "numpy", "--repeats", "3"],
                         ["train_throughput.py", "--rows", "20000", "--eval-rows", "5000", "--hidden", "64,64",
                          "--repeats", "1"], 900),
    "load": (["load.py", "--seconds", "60"], ["load.py", "--seconds", "10"], 600),
    "memory_bound": (["memory_bound.py"], ["memory_bound.py", "--quick"], 900),
    "fuzz": (FUZZ, FUZZ, 600),  # a test: its result is the summary it writes to SPARSEPS_FUZZ_SUMMARY
}  # fmt: skip


def command(name: str, quick: bool) -> str:
    script, *args = RUNS[name][1 if quick else 0]
    return shlex.join(["python", *(["-m"] if script == "-m" else [f"benchmarks/{script}"]), *args])


def run(name: str, quick: bool) -> dict:
    """Runs one benchmark, showing its output; its JSON result. RuntimeError if it fails or times out (it gets
    SIGINT, so its cleanup runs, then SIGKILL)."""
    script, *args = RUNS[name][1 if quick else 0]
    timeout_s = RUNS[name][2]
    print(f"== {name}: {command(name, quick)}", flush=True)
    summary = os.path.join(tempfile.gettempdir(), f"sparseps-report-{name}-{os.getpid()}.json")
    proc = subprocess.Popen(
        [sys.executable, *(["-m"] if script == "-m" else [os.path.join(ROOT, "benchmarks", script)]), *args],
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "SPARSEPS_FUZZ_SUMMARY": summary},
    )  # fmt: skip
    timer = threading.Timer(timeout_s, _interrupt, (proc,))
    timer.start()
    last, t0 = "", time.monotonic()
    try:
        for line in proc.stdout:
            print("   " + line, end="", flush=True)
            if line.strip():
                last = line
        code = proc.wait()
    except BaseException:  # this script interrupted: so is the benchmark, which then stops its servers
        _interrupt(proc)
        raise
    finally:
        timer.cancel()
    took = time.monotonic() - t0
    if code != 0:
        raise RuntimeError(f"{name} exited with {code} after {took:.0f} s (timeout {timeout_s} s)")
    if os.path.exists(summary):  # a test's result (tests/test_fuzz.py)
        with open(summary) as f:
            result = json.load(f)
        os.unlink(summary)
    else:
        result = json.loads(last)
    result["seconds"] = took
    result["command"] = command(name, quick)
    result["quick"] = quick
    result["revision"], result["date"] = revision(), datetime.date.today().isoformat()  # of this run (provenance)
    return result


def _interrupt(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


# ---- the table --------------------------------------------------------------------------------------------
def mega(x: float, unit: str) -> str:
    return f"{x / 1e6:.2f}M {unit}" if x >= 1e5 else f"{x / 1e3:.1f}K {unit}"


def row(what: str, ours: str, ref: str, ratio: str, cmd: str) -> str:
    return f"| {what} | {ours} | {ref} | {ratio} | `{cmd}` |"


def pull_push_rows(r: dict) -> list[str]:
    n, cmd = f"{r['ids_per_request']:,}", r["command"]
    echo = lambda kind: f"bare gRPC echo of the same bytes: {mega(r[f'echo_{kind}_ids_per_s'], 'ids/s')}"
    cpu_push = r["push_server_cpu_ms_to_reply"] + r["push_server_cpu_ms_after_reply"]
    return [
        row(f"hot pull, server only: PullBatch of {n} ids, {r['table_rows']:,} rows in RAM, request pre-built, "
            "reply unparsed", mega(r["pull_ids_per_s"], "ids/s"), echo("pull"),
            f"**{r['pull_vs_echo']:.0%}** (target 50%)", cmd),
        row(f"hot pull, end to end: `Client.pull` of {n} ids (dedup, request, reply decoded)",
            mega(r["pull_e2e_ids_per_s"], "ids/s"), echo("pull"), f"{r['pull_e2e_vs_echo']:.0%}", cmd),
        row(f"hot push, server only: PushBatch of {n} ids, as the client builds it", mega(r["push_ids_per_s"], "ids/s"),
            echo("push"), f"**{r['push_vs_echo']:.0%}** (target 40%)", cmd),
        row(f"hot push, end to end: `Client.push` of {n} ids (dedup, request)", mega(r["push_e2e_ids_per_s"], "ids/s"),
            echo("push"), f"{r['push_e2e_vs_echo']:.0%}", cmd),
        row("server CPU per server-only push, all threads, mean: until the reply + after it until idle (deferred "
            "work)", f"{r['push_server_cpu_ms_to_reply']:.1f} + {r['push_server_cpu_ms_after_reply']:.1f} ms",
            f"wall time per push, median: {r['push_wall_ms']:.1f} ms", f"{cpu_push / r['push_wall_ms']:.2f} cores",
            cmd),
    ]  # fmt: skip


def cold_pull_rows(r: dict) -> list[str]:
    return [row(
        f"cold pull: {r['ids_per_request']:,} ids in no cache (own key range, direct reads) from {r['table_rows']:,} "
        f"rows, RAM tier 1/10 of them; rate of ids fetched from RocksDB",
        mega(r["cold_pull_ids_per_s"], "ids/s"),
        f"the server's own read (`options.multi_get`, {r['read_threads']} threads, calls of 1,024 keys) of the same "
        f"keys, server's options: {mega(r['multiget_ids_per_s'], 'keys/s')}",
        f"**{r['cold_vs_multiget']:.0%}** (target 80%)", r["command"],
    )]  # fmt: skip


def scale_rows(small: dict, large: dict) -> list[str]:
    out = []
    for r in (small, large):
        gib = lambda b: f"{b / 2**30:.2f} GiB"
        out.append(
            row(
                f"{r['rows']:,} rows: peak RSS (VmHWM) of the server, filling and serving",
                gib(r["peak_rss_bytes"]),
                f"RAM tier budget + 1 GiB: {gib(r['cache_bytes'] + 2**30)}",
                f"**{r['peak_rss_bytes'] / (r['cache_bytes'] + 2**30):.2f}x** (target <= 1)",
                r["command"],
            )
        )
        out.append(
            row(
                f"{r['rows']:,} rows: disk bytes per row",
                f"{r['disk_bytes_per_row']:.1f} B",
                f"raw row (key + value): {r['raw_bytes_per_row']} B",
                f"**{r['disk_bytes_per_row'] / r['raw_bytes_per_row']:.2f}x** (target <= 1.5)",
                r["command"],
            )
        )
    for kind in ("pull", "push"):
        key = f"zipf_{kind}_ids_per_s"
        out.append(
            row(
                f"Zipf {kind}, fresh requests of ~{large['unique_ids_per_request']:,.0f} unique ids over "
                f"{large['rows']:,} rows, right after a restart (the RAM tier filling: "
                f"{large.get(f'misses_per_{kind}', float('nan')):,.0f} ids per call read from RocksDB, "
                f"{large.get('evictions', float('nan')):,} evicted)",
                mega(large[key], "ids/s"),
                f"the same at {small['rows']:,} rows, in a run of its own (scale_1e6), not alternated ("
                f"{small.get(f'misses_per_{kind}', float('nan')):,.0f} read per call): {mega(small[key], 'ids/s')}",
                f"{large[key] / small[key]:.2f}x (the target, >= 0.5, is for 10^8 rows: not measured here)",
                large["command"],
            )
        )
    return out  # fmt: skip


def flush_stall_rows(r: dict) -> list[str]:
    return [row(
        f"push of {r['ids_per_push']:,} ids during a flush of {r['rows_flushed']:,} dirty rows (in process), "
        f"median (max)", f"{r['push_ms_median_during_flush']:.1f} ms ({r['push_ms_max_during_flush']:.0f} ms)",
        f"the same pushes with no flush running: {r['push_ms_median_no_flush']:.1f} ms",
        f"{r['push_ms_median_during_flush'] / r['push_ms_median_no_flush']:.2f}x (no target)", r["command"],
    )]  # fmt: skip


def train_rows(r: dict) -> list[str]:
    paired = ", ".join(
        f"{ps / local:.2f}"
        for ps, local in zip(r["ps_runs_examples_per_s"], r["inprocess_runs_examples_per_s"], strict=True)
    )
    return [row(
        f"DeepFM training ({r['backend']}), {r['rows']:,} synthetic rows, {r['shards']} server processes; median "
        f"of {r['repeats']} runs", f"{r['ps_examples_per_s']:,.0f} examples/s (AUC {r['ps_eval_auc']:.4f})",
        f"the same training in one process, no RPC, runs alternated: {r['inprocess_examples_per_s']:,.0f} "
        f"(AUC {r['inprocess_eval_auc']:.4f})",
        f"**{r['ps_vs_inprocess']:.2f}** (target 0.8), of the medians; pair by pair {paired}", r["command"],
    )]  # fmt: skip


def load_rows(r: dict) -> list[str]:
    mib = lambda b: f"{b / 2**20:,.0f} MiB"
    lat = lambda m: f"{m} p50/p99 {r[f'{m}_p50_ms']:.0f}/{r[f'{m}_p99_ms']:.0f} ms"
    return [row(
        f"load: {r['clients']} client processes x {r['duration_s']:g} s of training steps (`Client.pull_many` + "
        f"`push_many`, {r['ids_per_step']:,} ids) against 1 server on loopback: errors, latency, server peak RSS",
        f"{r['errors']} errors in {r['requests']:,} calls; {lat('PullBatch')}; {lat('PushBatch')}; peak RSS "
        f"{mib(r['peak_rss_bytes'])}", f"configured memory: RAM tier {mib(r['cache_bytes'])} + block cache "
        f"{mib(r['block_cache_bytes'])} + memtables {mib(r['memtable_bytes'])} + {mib(r['headroom_bytes'])} = "
        f"{mib(r['bound_bytes'])}", f"**{r['peak_rss_bytes'] / r['bound_bytes']:.2f}x** (target <= 1, 0 errors)",
        r["command"],
    )]  # fmt: skip


def memory_rows(r: dict) -> list[str]:
    mib = lambda b: f"{b / 2**20:,.0f} MiB"
    out = []
    for c in r["results"]:
        ratio = c["peak_rss_bytes"] / c["rss_limit_bytes"]
        out.append(
            row(
                f"`--memory-bytes {mib(r['memory_bytes'])}`: server peak RSS, {c['what']}",
                f"{mib(c['peak_rss_bytes'])} ({c['room_waits']:,} waits for request room"
                + ("" if c["refused"] is None else f"; {c['refused']} requests refused")
                + ")",
                f"the bound + the idle peak of the same server ({mib(c['idle_peak_rss_bytes'])}) + 64 MiB: "
                f"{mib(c['rss_limit_bytes'])}",
                f"**{ratio:.2f}x** (target <= 1)",
                r["command"],
            )
        )
    return out  # fmt: skip


def fuzz_rows(r: dict) -> list[str]:
    seeds = str(r["seed"]).split(", ")  # tests/test_fuzz.py merged: its streams' seeds, "16, 17"
    streams = (
        f"seed {seeds[0]}"
        if len(seeds) == 1
        else f"{len(seeds)} streams at once, seeds " + ", ".join(seeds[:-1]) + f" and {seeds[-1]}"
    )
    return [row(
        f"fuzz: {r['requests']:,} random, mutated and hostile requests over all {len(r['by_method'])} methods "
        f"({streams}), in {r['duration_s']:.0f} s", f"{r['internal_or_unknown']} INTERNAL or UNKNOWN; "
        f"{r['rejected']:,} rejected by {len(r['rules'])} rules, {r['accepted']:,} accepted, "
        f"{r.get('partly_applied', 0):,} batches refused part way (the pushes before the refused one applied, "
        "as the message says)",
        f"rejections that changed the state: {len(r['problems'])}; rules never reached: "
        f"{len(r['unreached_rules'])}", f"**{r['internal_or_unknown']}** (target 0)", r["command"],
    )]  # fmt: skip


def machine() -> str:
    with open("/proc/cpuinfo") as f:
        cpus = re.findall(r"^model name\s*:\s*(.+)$", f.read(), re.M)
    with open("/proc/meminfo") as f:
        kib = int(re.search(r"^MemTotal:\s*(\d+) kB", f.read(), re.M).group(1))
    return f"{cpus[0] if cpus else 'unknown CPU'}, {len(cpus) or os.cpu_count()} cores, {kib / 2**20:.1f} GiB RAM"


def revision() -> str:
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rev = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return rev + ("+dirty" if git("status", "--porcelain") else "")


def provenance(results: dict) -> str:
    """When and at which revision the results ran: one pair for all, or each benchmark's where they differ (a table
    rebuilt with --from-json and --only mixes runs); "an unknown revision" for a result saved without one."""
    runs = {name: (r.get("revision", "an unknown revision"), r.get("date", "an unknown date"))
            for name, r in results.items()}  # fmt: skip
    if len(set(runs.values())) == 1:
        rev, date = next(iter(runs.values()))
        return f"revision {rev}, run on {date}"
    return "results of several runs: " + "; ".join(f"{name} at {rev} on {date}" for name, (rev, date) in runs.items())


def table(results: dict, quick: bool, minutes: float) -> str:
    lines = [
        f"Generated by `python benchmarks/report.py` on {datetime.date.today().isoformat()}: {machine()}; "
        f"{provenance(results)}; the benchmarks ran {minutes:.0f} minutes in all.",
    ]
    if quick:
        lines.append("**--quick sizes: these figures test the report script and are not the project's figures.**")
    lines += [
        "Each reference is measured in the same run, its calls alternated with ours where the script says so; "
        "compare a figure with its reference, not with another machine's or day's.",
        "",
        "| measured | figure | reference, same run | ratio | command |",
        "|---|---|---|---|---|",
        *pull_push_rows(results["pull_push"]),
        *cold_pull_rows(results["cold_pull"]),
        *scale_rows(results["scale_1e6"], results["scale_1e7"]),
        *flush_stall_rows(results["flush_stall"]),
        *train_rows(results["train_throughput"]),
        *load_rows(results["load"]),
        *memory_rows(results["memory_bound"]),
        *fuzz_rows(results["fuzz"]),
    ]
    return "\n".join(lines) + "\n"


def write_readme(path: str, text: str) -> None:
    with open(path) as f:
        readme = f.read()
    if readme.count(START) != 1 or readme.count(END) != 1 or readme.index(START) > readme.index(END):
        raise SystemExit(f"{path} needs one line {START} and, after it, one line {END} around the table")
    head, rest = readme.split(START)
    _, tail = rest.split(END)
    with open(path, "w") as f:
        f.write(f"{head}{START}\n{text}{END}{tail}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--readme", default=os.path.join(ROOT, "README.md"), help="the file to write the table into")
    p.add_argument("--json", default=None, help="where to save the results (default: "
                   "sparseps-report.json, or sparseps-report-quick.json, in the temporary directory)")  # fmt: skip
    p.add_argument("--from-json", default=None, help="start from these saved results instead of running everything")
    p.add_argument("--only", default="", help=f"comma-separated benchmarks to run (of {', '.join(RUNS)})")
    p.add_argument("--quick", action="store_true", help="small sizes, to test the scripts (not for README.md)")
    p.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n] or list(RUNS)
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        p.error(f"unknown benchmarks {unknown}; known: {', '.join(RUNS)}")
    if args.dry_run:
        for name in names:
            print(f"{name} (timeout {RUNS[name][2]} s): {command(name, args.quick)}")
        return 0
    saved = args.json or os.path.join(tempfile.gettempdir(), f"sparseps-report{'-quick' if args.quick else ''}.json")
    results: dict = {}
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        if not args.only:
            names = []
    failed = []
    for name in names:
        try:
            results[name] = run(name, args.quick)
        except (RuntimeError, ValueError) as e:
            print(f"   {name} failed: {e}", flush=True)
            failed.append(name)
        with open(saved, "w") as f:
            json.dump(results, f, indent=1)
    minutes = sum(r.get("seconds", 0) for r in results.values()) / 60
    if names:
        print(f"results saved to {saved}")
    missing = [n for n in RUNS if n not in results]
    if failed or missing:
        print(f"no table written: failed {failed}, missing {missing}; rerun them with --from-json {saved} --only ...")
        return 1
    quick = any(r.get("quick") for r in results.values())
    if quick and os.path.abspath(args.readme) == os.path.join(ROOT, "README.md"):
        print("--quick figures do not belong in README.md: give --readme a copy")
        return 1
    text = table(results, quick, minutes)
    print(text)
    write_readme(args.readme, text)
    print(f"table written into {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does --memory-bytes hold under large requests, several clients at once and a journal replayed at start?

    python benchmarks/memory_bound.py [--memory 256M] [--big-ids 1500000] [--clients 4] [--quick]

Each case starts one server (worker.cluster.LocalCluster) with `--memory-bytes --memory`, fresh, waits for the end
of its warm-up (its compiled code loaded: the INFO line ps/engine/warmup.py logs as it ends, so every server is
given --log-level INFO, whatever PS_LOG_LEVEL says) and until it is idle, plus --idle-s, reads its peak RSS (VmHWM)
as the idle peak, runs the case, and reads VmHWM again. Before the cases, unmeasured, the script rehearses the
replay case on a journal of REHEARSAL_ROWS rows, so that numba's cache holds every kernel the servers run (a
warm-up's, a replay's) and each server loads them alike: a server that compiles them (no cache yet: a fresh clone,
an edited kernel) peaks 40 to 110 MiB higher. The reference is the limit issue 19 sets: the bound + the idle peak
measured on that same server + 64 MiB. Tables are dim 16, Adagrad; pushes carry random gradients.

    big          one client (ps-worker's Client, which sizes its messages by the room the shard reports) pulls
                 and pushes --big-ids new ids at once, twice
    clients      --clients processes at once, each pulling and pushing --batch fresh random ids of --rows, --rounds
                 times
    large        as clients, with batches of --large-batch ids
    replay       a server with --memory-bytes 3G (256 MiB journal segments) and no flush takes --replay-rows row
                 updates and is killed (SIGKILL); restarted with --memory, it replays them; its peak once it
                 serves. Its idle peak is the big case's (a fresh server of the same flags)
    own-client   as big, with a Client that keeps 64 MiB messages (one that does not read the shards' room, as a
                 foreign or hostile client would not): each request larger than the room is refused
                 (RESOURCE_EXHAUSTED) before the server copies anything; the refusals are counted

Checks: peak <= limit for every case, and own-client's requests refused. Also printed: the waits for request
room the server counted (ps.engine.room). The last line is one JSON object (harness.emit).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time

import harness  # before numpy: see its docstring
import numpy as np

from ps.config import TableConfig
from ps.errors import PsError
from ps.flagtypes import byte_size
from ps.terminate import how_it_ended
from worker.client import Client
from worker.cluster import LocalCluster

MiB = 1 << 20
RSS_SLACK = 64 * MiB
WARM_UP_LOGGED = " ps.engine.warmup: "  # in a shard log line: the warm-up's one line, written as it ends
WARM_UP_LOADED = "compiled kernels loaded"  # in that line: it ran through
LOGGED = ["--log-level", "INFO"]  # every server's: the warm-up's line is INFO
LOG_TAIL_LINES = 20  # of a server's log, in the error when it died before its warm-up's line
REHEARSAL_ROWS = 100_000  # of the rehearsal's journal: records large enough for the parallel paths
OWN_CLIENT_CALLS = 4  # own-client's pulls and pushes, each larger than the room: all refused
DIM = 16


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Served:
    """One server under --memory-bytes: its idle peak, read once it is idle."""

    def __init__(self, root: str, flags: list[str], idle_s: float):
        self.cluster = LocalCluster(1, root=root, start_timeout_s=600, extra_args=flags)
        log_path = self.cluster.log_path(0)
        log_start = os.path.getsize(log_path) if os.path.exists(log_path) else 0  # a restart appends to the log
        self.address = self.cluster.start()[0]
        self.pid = self.cluster.procs[0].pid
        with Client([self.address], timeout_s=600) as client:
            client.wait_ready()
        wait_warmed_up(log_path, log_start, self.cluster.procs[0], timeout_s=600)
        harness.wait_idle(self.pid, timeout_s=120)  # what the warm-up left behind (its write-behind): done
        time.sleep(idle_s)
        self.idle_peak = harness.peak_rss_bytes(self.pid)

    def client(self, **kwargs) -> Client:
        c = Client([self.address], timeout_s=600, **kwargs)
        c.wait_ready()
        return c

    def finish(self) -> tuple[int, int, int]:
        """(peak RSS, room waits, ids pulled and pushed: the work the case got done), then stops the server."""
        with Client([self.address], timeout_s=600) as client:
            stats = client.stats()[0]
        peak = harness.peak_rss_bytes(self.pid)
        self.cluster.stop()
        return peak, stats.request_room_waits, sum(t.ids_pulled + t.ids_pushed for t in stats.tables)


def wait_warmed_up(log_path: str, log_start: int, proc: subprocess.Popen, timeout_s: float) -> None:
    """Waits for the warm-up's line in the shard log past byte log_start (a quiet CPU is no sign of its end: a
    server starved of CPU looks idle), written by the server process proc; SystemExit if the warm-up did not load
    the kernels, if proc ended without the line (at once, with its exit and its log's last lines) or no line came
    in timeout_s, since the idle peak would then leave them out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ended = proc.poll()  # before the log is read: a line written before the exit is found there
        with open(log_path, "rb") as f:
            f.seek(log_start)
            lines = f.read().decode(errors="replace").splitlines(keepends=True)
        line = next((ln for ln in lines if WARM_UP_LOGGED in ln and ln.endswith("\n")), None)
        if line is not None:
            if WARM_UP_LOADED not in line:
                raise SystemExit(f"the server's warm-up did not load its compiled kernels: {line.strip()}")
            return
        if ended is not None:
            tail = "".join(lines[-LOG_TAIL_LINES:]).rstrip()
            raise SystemExit(f"the server (pid {proc.pid}) {how_it_ended(ended)} before its warm-up logged its end; "
                             f"the last lines of its log ({log_path}):\n{tail}")  # fmt: skip
        time.sleep(0.05)
    raise SystemExit(f"the server's warm-up logged no end in {timeout_s:.0f} s (log: {log_path})")


def big(served: Served, n: int, own_messages: bool) -> int:
    """The pulls and pushes; returns how many were refused as too large for the server (own_messages only)."""
    rng = np.random.default_rng(0)
    client = Client([served.address], timeout_s=600) if own_messages else served.client()
    refused = 0
    with client:
        client.create_table(TableConfig(name="t", dim=DIM))
        ids = np.arange(n, dtype=np.uint64)
        for _ in range(2):
            for call in (lambda: client.pull("t", ids),
                         lambda: client.push("t", ids, rng.standard_normal((n, DIM), dtype=np.float32))):  # fmt: skip
                try:
                    call()
                except PsError as e:
                    if not own_messages or "RESOURCE_EXHAUSTED" not in str(e):
                        raise
                    refused += 1
    return refused


def _client_process(address: str, seed: int, rows: int, batch: int, rounds: int) -> None:
    rng = np.random.default_rng(seed)
    with Client([address], timeout_s=600) as client:
        client.wait_ready()
        for _ in range(rounds):
            ids = np.unique(rng.integers(0, rows, batch).astype(np.uint64))
            client.pull("t", ids)
            client.push("t", ids, rng.standard_normal((len(ids), DIM), dtype=np.float32))


def clients(served: Served, count: int, rows: int, batch: int, rounds: int) -> None:
    with served.client() as client:
        client.create_table(TableConfig(name="t", dim=DIM))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_client_process, args=(served.address, k, rows, batch, rounds)) for k in range(count)]
    [p.start() for p in procs]
    [p.join() for p in procs]
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        raise SystemExit(f"client processes failed: exit codes {bad}")


def write_journal(root: str, rows: int, idle_s: float) -> None:
    """A server of a large bound takes rows row updates (none flushed) and is killed."""
    served = Served(root, ["--memory-bytes", "3G", "--flush-interval-s", "3600", *LOGGED], idle_s=0)
    rng = np.random.default_rng(2)
    with served.client() as client:
        client.create_table(TableConfig(name="t", dim=DIM))
        for lo in range(0, rows, 100_000):
            ids = np.arange(lo, min(rows, lo + 100_000), dtype=np.uint64)
            client.push("t", ids, rng.standard_normal((len(ids), DIM), dtype=np.float32))
    served.cluster.kill(0)


def rehearse(root: str, flags: list[str]) -> None:
    """A journal of REHEARSAL_ROWS row updates written by one server and replayed by another of flags, each
    warmed up: every kernel a server of the cases runs is then in numba's cache (compiled here if it was not)."""
    write_journal(root, REHEARSAL_ROWS, idle_s=0)
    Served(root, flags, idle_s=0).finish()
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--memory", default="256M", help="--memory-bytes of the servers")
    p.add_argument("--big-ids", type=int, default=1_500_000, help="big: ids of the one pull and push")
    p.add_argument("--clients", type=int, default=4, help="clients, large: client processes at once")
    p.add_argument("--rows", type=int, default=2_000_000, help="clients: ids drawn from (large: twice as many)")
    p.add_argument("--batch", type=int, default=100_000, help="clients: random ids per pull and push")
    p.add_argument("--rounds", type=int, default=10, help="clients: pull and push pairs per client")
    p.add_argument("--large-batch", type=int, default=500_000, help="large: random ids per pull and push")
    p.add_argument("--large-rounds", type=int, default=2, help="large: pull and push pairs per client")
    p.add_argument("--replay-rows", type=int, default=2_000_000, help="replay: row updates in the journal")
    p.add_argument("--idle-s", type=float, default=3.0, help="the idle server's wait before its peak is read")
    p.add_argument("--quick", action="store_true", help="small sizes: tests this script, not the bound")
    args = p.parse_args()
    if args.quick:
        args.big_ids, args.clients, args.rows, args.batch, args.rounds = 200_000, 2, 100_000, 20_000, 2
        args.large_batch, args.large_rounds, args.replay_rows, args.idle_s = 50_000, 1, 100_000, 0.0
    bound = byte_size(args.memory)
    flags = ["--memory-bytes", args.memory, *LOGGED]
    work = tempfile.mkdtemp(prefix="sparseps-memory-bound-")
    cases = {
        "big": lambda s: big(s, args.big_ids, own_messages=False),
        "clients": lambda s: clients(s, args.clients, args.rows, args.batch, args.rounds),
        "large": lambda s: clients(s, args.clients, 2 * args.rows, args.large_batch, args.large_rounds),
        "replay": None,
        "own-client": lambda s: big(s, args.big_ids, own_messages=True),
    }
    what = {
        "big": f"1 client, {args.big_ids:,}-id pull and push, twice",
        "clients": f"{args.clients} clients at once, {args.batch:,}-id batches x {args.rounds}",
        "large": f"{args.clients} clients at once, {args.large_batch:,}-id batches x {args.large_rounds}",
        "replay": f"journal of {args.replay_rows:,} row updates written under 3G, replayed",
        "own-client": "as big, a client keeping 64 MiB messages: refused",
    }
    results, idle_of_fresh = [], None
    try:
        progress(f"rehearsal: replay of {REHEARSAL_ROWS:,} row updates, unmeasured (the kernels into numba's cache)")
        rehearse(os.path.join(work, "rehearsal"), flags)
        for name, run in cases.items():
            root = os.path.join(work, name)
            progress(f"{name}: {what[name]}")
            t0 = time.perf_counter()
            if name == "replay":
                write_journal(root, args.replay_rows, args.idle_s)
                served = Served(root, flags, idle_s=0)
                with served.client() as client:
                    client.pull("t", np.arange(10, dtype=np.uint64))
                idle, refused = idle_of_fresh, None
            else:
                served = Served(root, flags, args.idle_s)
                outcome = run(served)
                refused = outcome if name == "own-client" else None
                idle = served.idle_peak
                idle_of_fresh = idle_of_fresh or idle
            peak, waits, ids_served = served.finish()
            shutil.rmtree(root, ignore_errors=True)
            limit = bound + idle + RSS_SLACK
            ok = peak <= limit and (refused is None or refused == OWN_CLIENT_CALLS)
            results.append({"case": name, "what": what[name], "peak_rss_bytes": peak, "idle_peak_rss_bytes": idle,
                            "rss_limit_bytes": limit, "room_waits": waits, "ids_served": ids_served,
                            "seconds": time.perf_counter() - t0,
                            "refused": refused, "ok": ok})  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"--memory-bytes {args.memory}; limit = the bound + the idle peak + 64 MiB")
    print(f"{'case':<11} {'peak MiB':>9} {'idle MiB':>9} {'limit MiB':>10} {'ratio':>6} {'room waits':>10}  what")
    for r in results:
        print(f"{r['case']:<11} {r['peak_rss_bytes'] / MiB:>9,.0f} {r['idle_peak_rss_bytes'] / MiB:>9,.0f} "
              f"{r['rss_limit_bytes'] / MiB:>10,.0f} {r['peak_rss_bytes'] / r['rss_limit_bytes']:>5.2f}x "
              f"{r['room_waits']:>10,}  {r['what']}")  # fmt: skip
    for r in results:
        refusals = "" if r["refused"] is None else f"; {r['refused']} of {OWN_CLIENT_CALLS} requests refused"
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']}: peak RSS <= --memory-bytes + idle peak + 64 MiB: "
              f"{r['peak_rss_bytes'] / MiB:,.0f} MiB (limit {r['rss_limit_bytes'] / MiB:,.0f} MiB){refusals}")  # fmt: skip
    harness.emit({"benchmark": "memory_bound", "memory_bytes": bound, "results": results,
                  "ok": all(r["ok"] for r in results)})  # fmt: skip


if __name__ == "__main__":
    main()

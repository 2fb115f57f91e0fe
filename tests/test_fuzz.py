"""Fuzzing the servicer through gRPC: over 10,000 requests to every ParameterServer method of shard 1 of 2 (random
bytes, mutated requests, valid-but-hostile values from tests/fuzz_requests.py, and valid requests that change
the state between them). None gets INTERNAL or UNKNOWN; every rejection has a status a client can act on and says
why; and a rejected request leaves the shard's state as it was, byte for byte. The requests come in STREAMS
seeded streams, each sent one at a time to a shard of its own, the streams at once (a process each: the time is
the servers' and gRPC's Python, which one process's threads would take in turns); their counts are summed.

The state (snapshot) is read from the shard directly: for every table, every row in use in its RAM arena (id,
the row's float32 values as bits, its lsn and dirty flag), and the counters that are state (admitted and pending
ids, what RocksDB is counted to hold, ids admitted and dropped, evictions); the shard's clock, next journal seq,
exactly-once table and checkpoint hold; the tables and their specs. Request counters (pulls, pushes, ids pulled,
cache misses) are not state. A rejected request may read rows into RAM (a cache fill, no visible change): a row
that appears must hold what a row not in RAM reads as, the initial row, clean, at lsn 0 (this shard never evicts:
its RAM tier is far larger than what it holds, and the snapshot checks that evictions stay 0). The background
flusher is off (a flush interval of an hour), so the dirty flags change only by requests.

Rejections are counted per validation rule (RULES: a status code and a pattern of the message; any other
rejection counts under its code and the start of its message) and printed (`pytest -s`); every rule of RULES
must be reached. With SPARSEPS_FUZZ_SUMMARY set, a JSON summary goes to that path (benchmarks/report.py)."""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import pathlib
import re
import time
from dataclasses import dataclass

import grpc
import numpy as np

from protos import ps_pb2
from ps.config import TableConfig
from ps.engine.shard import Shard
from ps.engine.table import Table
from ps.errors import PARTLY_APPLIED
from ps.rows.initializers import init_rows
from ps.rows.optim import get_optimizer
from ps.server import Server, grpc_options
from ps.server_config import ServerConfig
from ps.sharding import SlotMap
from tests.conftest import random_ids
from tests.fuzz_requests import METHODS, RequestSource

SEED = 16
REQUESTS = int(os.environ.get("SPARSEPS_FUZZ_REQUESTS", "11000"))
STREAMS = 2  # independent streams, each against a shard of its own, run at once: seeds SEED, SEED + 1, ...
LIMIT_BYTES = 1 << 20  # the shard's message limit: replies over it are refused before they are built
TIMEOUT_S = 30
WARM_UP_SEED, WARM_UP_REQUESTS, WARM_UP_S = 1000, 300, 600  # the stream before each (fuzz_a_shard)
REJECTED = {"INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED",
            "UNAVAILABLE"}  # fmt: skip
RULES = [  # (name, status code, pattern of the message); the first match names a rejection
    ("string not UTF-8", "INVALID_ARGUMENT", r"is not valid protobuf: .*not UTF-8"),
    ("bytes not protobuf", "INVALID_ARGUMENT", r"is not valid protobuf"),
    ("table name invalid", "INVALID_ARGUMENT", r"^table name .* is invalid"),
    ("dim out of range", "INVALID_ARGUMENT", r"dim must be in 1\.\."),
    ("optimizer unknown", "INVALID_ARGUMENT", r"^optimizer .* is unknown"),
    ("optimizer parameter unknown", "INVALID_ARGUMENT", r"got unknown parameters"),
    ("adam beta out of range", "INVALID_ARGUMENT", r"^adam beta. must be in"),
    ("hyperparameter out of range", "INVALID_ARGUMENT", r"must be finite, >=? -?[\d.e+-]+ and <= 1e\+30"),
    ("initializer unknown", "INVALID_ARGUMENT", r"^initializer .* is unknown"),
    ("admission min_count out of range", "INVALID_ARGUMENT", r"^admission min_count must be in"),
    ("admission probability out of range", "INVALID_ARGUMENT", r"^admission probability must be in"),
    ("eviction decay out of range", "INVALID_ARGUMENT", r"^eviction decay must be in"),
    ("table exists with another spec", "ALREADY_EXISTS", r"exists on shard \d+ with a different spec"),
    ("no such table", "NOT_FOUND", r"^table .* does not exist on shard"),
    ("push dim mismatch", "INVALID_ARGUMENT", r"^push says dim"),
    ("ids not 8-byte", "INVALID_ARGUMENT", r"^ids has \d+ bytes, expected a multiple of 8"),
    ("grads length", "INVALID_ARGUMENT", r"^grads has \d+ bytes, expected"),
    ("shows/clicks length", "INVALID_ARGUMENT", r"^(shows|clicks) has \d+ bytes, expected"),
    ("grads not finite", "INVALID_ARGUMENT", r"hold non-finite values"),
    ("shows/clicks negative or not finite", "INVALID_ARGUMENT", r"must be finite and >= 0"),
    ("clicks over shows", "INVALID_ARGUMENT", r"^clicks for table .* exceed shows: id \d+ \(position \d+\) has"),
    ("ids repeated in a push", "INVALID_ARGUMENT", r"repeats id \d+ \(positions"),
    ("ids repeated in a batch's push", "INVALID_ARGUMENT", r"of the batch .* repeats ids"),
    ("float32 overflow", "INVALID_ARGUMENT", r"would make the row of id \d+ non-finite"),
    ("ids of another shard", "FAILED_PRECONDITION", r"belong to other shards"),
    ("clock advance out of range", "INVALID_ARGUMENT", r"clock advance of [\d,]+ steps is out of range"),
    ("seq too far ahead", "INVALID_ARGUMENT", r"ahead of this client's newest request"),
    ("reply over the limit", "RESOURCE_EXHAUSTED", r"reply would be [\d,]+ bytes"),
    ("request over the limit", "RESOURCE_EXHAUSTED", r"(?i)received message larger than max"),
    ("hold timeout out of range", "INVALID_ARGUMENT", r"^hold_timeout_s must be finite"),
    ("pushes held by a checkpoint", "UNAVAILABLE", r"is taking a checkpoint"),
    ("hold while held", "FAILED_PRECONDITION", r"is held by another checkpoint"),
    ("shrink while held", "FAILED_PRECONDITION", r"^shard \d+: a checkpoint holds it since .* send the Shrink"),
    (
        "save without its hold",
        "FAILED_PRECONDITION",
        r"hold expired or was released before the save|has taken no checkpoint hold since it started",
    ),
    ("checkpoint phase unknown", "INVALID_ARGUMENT", r"^checkpoint phase .* is unknown"),
    ("checkpoint dir unusable", "INVALID_ARGUMENT", r"is not a usable path"),
    ("checkpoint dir outside the root", "INVALID_ARGUMENT", r"not inside this server's checkpoint root"),
    ("checkpoint dir exists", "INVALID_ARGUMENT", r"^checkpoint dir .* exists already"),
    ("checkpoint dir cannot be made", "FAILED_PRECONDITION", r"^cannot create checkpoint dir"),
]
_RULES = [(name, code, re.compile(pattern)) for name, code, pattern in RULES]


def rule_of(code: str, details: str) -> str:
    """The RULES name of a rejection, or its code and the start of its message, numbers and quotes blanked."""
    for name, rule_code, pattern in _RULES:
        if code == rule_code and pattern.search(details):
            return name
    start = re.sub(r"'[^']*'|\"[^\"]*\"", "'_'", re.sub(r"\d[\d,.]*", "N", details))[:48]
    return f"{code}: {start}"


def spec(name: str, dim: int, optimizer: str, lr: float, **fields: object) -> ps_pb2.TableSpec:
    return ps_pb2.TableSpec(
        name=name, dim=dim, optimizer=ps_pb2.OptimizerSpec(name=optimizer, learning_rate=lr), **fields
    )


TABLES = {
    "emb": spec("emb", 4, "adagrad", 0.1),
    "sgd": spec("sgd", 4, "sgd", 1.0, initializer=ps_pb2.InitializerSpec(name="zeros", scale=0.0)),
    "adm": spec("adm", 2, "ftrl", 0.05, admission=ps_pb2.AdmissionSpec(min_count=3),
                eviction=ps_pb2.EvictionSpec(ttl_steps=5, score_threshold=0.5, decay=0.9)),
    "wide": spec("wide", 256, "adam", 0.01, weight_bound=1.0),  # 1,025 rows fill the 1 MiB message limit
}  # fmt: skip


@dataclass
class TableState:
    spec: TableConfig
    counters: tuple
    ids: np.ndarray  # sorted
    bits: np.ndarray  # (n, width) uint32: the rows' float32 values as bits (NaN compares equal to itself)
    lsn: np.ndarray
    dirty: np.ndarray


def snapshot(shard: Shard) -> tuple[tuple, dict[str, TableState]]:
    """(the shard's own state, {table: TableState}), copies of what the shard holds now."""
    tables = {}
    for name, t in sorted(shard.tables.items()):
        a = t.arena
        with t.lock:
            live = np.flatnonzero(a.pin[: a.used] >= 0)  # rows in use; free-listed rows have pin -1
            order = live[np.argsort(a.ids[live], kind="stable")]
            counters = (t.num_rows, t.num_pending, sorted(t.writer.stored_counts.items()), t.counters["admitted"],
                        t.counters["dropped"], a.evictions)  # fmt: skip
            tables[name] = TableState(t.cfg, counters, a.ids[order].copy(), a.data[order, : t.width].view(np.uint32),
                                      a.lsn[order].copy(), a.dirty[order].copy())  # fmt: skip
    own = (shard.clock, shard.journal.next_seq, sorted(shard.journal.applied.items()), shard.checkpoints.gate.token)
    return own, tables


def initial_rows(table: Table, ids: np.ndarray) -> np.ndarray:
    """The rows of ids never pushed: initial embedding and optimizer state, zero statistics; as bits."""
    block = np.zeros((len(ids), table.width), dtype=np.float32)
    init_rows(table.cfg.initializer, ids, block, table.dim)
    get_optimizer(table.cfg.optimizer).init_state(block[:, : table.stats_col], table.dim)
    return block.view(np.uint32)


def differences(before: tuple, after: tuple, shard: Shard) -> list[str]:
    """What changed from snapshot `before` to `after`, less cache fills (rows that appear as they read from
    outside RAM: initial, clean, lsn 0)."""
    (own_b, tables_b), (own_a, tables_a) = before, after
    out = [f"shard (clock, next seq, applied, hold): {own_b} -> {own_a}"] if own_b != own_a else []
    if tables_b.keys() != tables_a.keys():
        return out + [f"tables {sorted(tables_b)} -> {sorted(tables_a)}"]
    for name, b in tables_b.items():
        a = tables_a[name]
        if (b.spec, b.counters) != (a.spec, a.counters):
            out.append(f"table {name}: counters {b.counters} -> {a.counters}")
        at = np.searchsorted(a.ids, b.ids)
        kept = at < len(a.ids)
        kept[kept] = a.ids[at[kept]] == b.ids[kept]
        if not kept.all():
            out.append(f"table {name}: {int((~kept).sum())} rows left RAM, e.g. id {int(b.ids[~kept][0])}")
            continue
        for what in ("bits", "lsn", "dirty"):
            same = getattr(a, what)[at] == getattr(b, what)
            same = same.all(axis=1) if same.ndim == 2 else same
            if not same.all():
                out.append(f"table {name}: {what} of {int((~same).sum())} rows changed, e.g. id {int(b.ids[~same][0])}")
        new = np.ones(len(a.ids), dtype=bool)
        new[at] = False
        if new.any():
            fresh = initial_rows(shard.tables[name], a.ids[new])
            if (a.dirty[new] != 0).any() or (a.lsn[new] != 0).any() or (a.bits[new] != fresh).any():
                out.append(f"table {name}: rows read into RAM are not the initial rows, clean, at lsn 0")
    return out


def test_10k_random_and_hostile_requests_never_get_internal_and_rejected_ones_change_nothing(tmp_path):
    with multiprocessing.get_context("spawn").Pool(STREAMS - 1) as pool:  # the other streams, each in a process
        others = [pool.apply_async(fuzz_a_shard, (k, str(tmp_path / f"stream-{k}"))) for k in range(1, STREAMS)]
        streams = [fuzz_a_shard(0, str(tmp_path / "stream-0"))] + [o.get(timeout=600) for o in others]
    summary = merged(streams)
    print_summary(summary)
    if os.environ.get("SPARSEPS_FUZZ_SUMMARY"):
        with open(os.environ["SPARSEPS_FUZZ_SUMMARY"], "w") as f:
            json.dump(summary, f, indent=1)
    assert summary["problems"] == [], "\n".join(summary["problems"])
    assert summary["internal_or_unknown"] == 0
    assert summary["requests"] >= 10_000 and min(summary["by_method"].values()) >= 200, summary["by_method"]
    assert summary["unreached_rules"] == [], f"rules no request reached: {summary['unreached_rules']}"
    assert summary["accepted"] >= 2_000 and summary["rejected"] >= 5_000, summary


def fuzz_a_shard(stream: int, directory: str) -> dict:
    """Stream `stream` (seed SEED + stream) of REQUESTS / STREAMS requests (rounded up) against a shard of its own
    in `directory`; its summary (fuzz's). A shorter stream of another seed on a scratch shard goes first, with
    WARM_UP_S deadlines: it loads the compiled kernels the requests run, or compiles them where no cache has them
    yet (a fresh clone: over a minute on a loaded host), which would otherwise run a fuzzed request past
    TIMEOUT_S; of its summary only the problems it found are kept."""
    tmp = pathlib.Path(directory)
    warm_up = fuzz_a_server(tmp / "warm-up", WARM_UP_SEED + stream, WARM_UP_REQUESTS, WARM_UP_S)
    summary = fuzz_a_server(tmp / "fuzzed", SEED + stream, -(-REQUESTS // STREAMS), TIMEOUT_S)
    summary["problems"] = [f"warm-up (seed {warm_up['seed']}), {p}" for p in warm_up["problems"]] + summary["problems"]
    return summary


def fuzz_a_server(tmp: pathlib.Path, seed: int, requests: int, timeout_s: float) -> dict:
    """`requests` requests of seed against a server of its own in tmp, each with a deadline of timeout_s; fuzz's
    summary."""
    root = tmp / "checkpoints"
    root.mkdir(parents=True)
    config = ServerConfig(data_dir=str(tmp / "shard-1"), shard_id=1, num_shards=2, port=0,
                          max_message_bytes=LIMIT_BYTES, flush_interval_s=3600.0, checkpoint_root=str(root))  # fmt: skip
    server = Server(config)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}", options=grpc_options(64 << 20))
    call = {m: channel.unary_unary(f"/sparseps.ParameterServer/{m}") for m in METHODS}
    try:
        for s in TABLES.values():
            call["CreateTable"](ps_pb2.CreateTableRequest(spec=s).SerializeToString(), timeout=timeout_s)
        summary = fuzz(server.shard, call, root, seed, requests, timeout_s)
        call["Stats"](b"", timeout=timeout_s)  # still serving
    finally:
        channel.close()
        server.stop(grace_s=1)
    return summary


def merged(streams: list[dict]) -> dict:
    """One summary of the streams' summaries: counts summed, rules unreached by all of them."""
    total = {key: sum((collections.Counter(s[key]) for s in streams), collections.Counter())
             for key in ("by_method", "codes", "rules")}  # fmt: skip
    return {
        "requests": sum(s["requests"] for s in streams), "seed": ", ".join(str(s["seed"]) for s in streams),
        "duration_s": max(s["duration_s"] for s in streams), "by_method": dict(total["by_method"]),
        "codes": dict(total["codes"]), **{key: sum(s[key] for s in streams) for key in
                                          ("accepted", "rejected", "partly_applied", "internal_or_unknown")},
        "rules": dict(total["rules"].most_common()), "unreached_rules": [name for name, *_ in RULES
                                                                         if not total["rules"][name]],
        "problems": [f"seed {s['seed']}, {p}" for s in streams for p in s["problems"]][:20],
    }  # fmt: skip


def fuzz(shard: Shard, call: dict, root: pathlib.Path, seed: int, requests: int, timeout_s: float) -> dict:
    """Sends `requests` requests of RequestSource(seed) one at a time, checking each reply and what each rejected
    request did to the shard's state; the summary."""
    ids = random_ids(2000, seed=11)
    owner = SlotMap.contiguous(2).shard_of(ids)
    mine, theirs = ids[owner == 1], ids[owner == 0][:16]
    source = RequestSource(seed, {n: (s.dim, s) for n, s in TABLES.items()}, mine[:46], theirs, mine[46:48], root)
    rules, by_method, codes = collections.Counter(), collections.Counter(), collections.Counter()
    problems: list[str] = []
    counts = collections.Counter()
    reference = snapshot(shard)
    started = time.monotonic()
    for i in range(requests):
        request = source.next()
        by_method[request.method] += 1
        try:
            reply = call[request.method](request.data, timeout=timeout_s)
        except grpc.RpcError as e:
            code, details = e.code().name, e.details() or ""
            codes[code] += 1
            where = (
                f"request {i}: {request.method} ({request.note}, {len(request.data)} bytes) got {code}: {details[:300]}"
            )
            if code not in REJECTED:
                problems.append(where)
            elif not details:
                problems.append(f"{where}: a rejection must say why")
            if PARTLY_APPLIED in details:
                counts["partly applied"] += 1
                reference = snapshot(shard)
                continue
            counts["rejected"] += 1
            rules[rule_of(code, details)] += 1
            now = snapshot(shard)
            changed = differences(reference, now, shard)
            if changed:
                problems.append(f"{where}\n  changed the shard: {'; '.join(changed)[:600]}")
            reference = now
            continue
        codes["OK"] += 1
        counts["accepted"] += 1
        source.observe(request, reply)
        reference = snapshot(shard)
    unreached = [name for name, *_ in RULES if not rules[name]]
    return {
        "requests": requests, "seed": seed, "duration_s": round(time.monotonic() - started, 1),
        "by_method": dict(by_method), "codes": dict(codes), "accepted": counts["accepted"],
        "rejected": counts["rejected"], "partly_applied": counts["partly applied"],
        "internal_or_unknown": codes["INTERNAL"] + codes["UNKNOWN"], "rules": dict(rules.most_common()),
        "unreached_rules": unreached, "problems": problems[:20],
    }  # fmt: skip


def print_summary(s: dict) -> None:
    print(f"\nfuzz: {s['requests']:,} requests in {s['duration_s']} s: {s['accepted']:,} accepted, {s['rejected']:,} "
          f"rejected, {s['partly_applied']} partly applied; INTERNAL or UNKNOWN: {s['internal_or_unknown']}")  # fmt: skip
    print("  by method: " + ", ".join(f"{m} {n:,}" for m, n in sorted(s["by_method"].items())))
    print("  by status: " + ", ".join(f"{c} {n:,}" for c, n in sorted(s["codes"].items())))
    for name, n in s["rules"].items():
        print(f"  {n:6,}  {name}")
    if s["unreached_rules"]:
        print(f"  never reached: {', '.join(s['unreached_rules'])}")

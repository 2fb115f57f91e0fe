"""The cluster commands run: `ps-worker stats` (what each shard holds, as text or JSON, and the warnings that make
its exit code 1), `shrink`, `checkpoint save` and `export`, each through a Client of its flags (their parsers:
worker/cli_cluster_flags.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ps.bytesize import human_bytes
from ps.stamp import job_named
from worker.flags import server_list


def _client(args):
    """A Client for the servers, deadlines and security flags of a cluster command (stats, checkpoint, ...)."""
    from worker.channels import client_token
    from worker.client import Client

    token = client_token(args.auth_token_file, args.tls_key)
    return Client(list(server_list(args.servers)), timeout_s=args.timeout_s, server_timeout_s=args.server_timeout,
                  tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key, auth_token=token)  # fmt: skip


def run_stats(args: argparse.Namespace) -> int:
    import json

    with _client(args) as client:
        shards = client.wait_ready()
    from worker.tables import cluster_damage

    warnings = [w for w in (cluster_damage(shards), _failing_flushes(shards)) if w]
    note = _clocks_note(shards)
    if args.json:  # every field, numbers as numbers (protobuf's JSON writes 64-bit ones as strings); disk_low 0 or 1
        low = [int(s.disk_free_bytes < _disk_low_bytes(s)) for s in shards]
        figures = [{**message_dict(s), "disk_low": x} for s, x in zip(shards, low, strict=True)]
        print(json.dumps({"shards": figures, "warnings": warnings, "notes": [note] if note else []}))
        return _say(warnings, note)
    width = max([12, *(len(t.name) for s in shards for t in s.tables)])  # dense.deepfm.mlp.0.weight and the like
    widths = _column_widths(shards)
    print(f"{'shard':>5} {'table':<{width}} " + " ".join(f"{c:>{w}}" for c, w in zip(COLUMNS, widths, strict=True)))
    for s in shards:
        for t in s.tables:
            figures = (f"{getattr(t, c):>{w},}" for c, w in zip(COLUMNS, widths, strict=True))
            print(f"{s.shard_id:>5} {t.name:<{width}} " + " ".join(figures))
        restored = f", restored from {s.restored_from}" if s.restored_from else ""
        print(f"{s.shard_id:>5} data dir {s.data_dir}{restored}, up {s.uptime_s:,.0f} s, clock {s.clock:,}, RAM "
              f"{human_bytes(s.ram_used_bytes)} of {human_bytes(s.ram_budget_bytes)}, journal "
              f"{human_bytes(s.journal_bytes)}")  # fmt: skip
        print(f"{s.shard_id:>5} {_memory_clause(s)}")
        low = _disk_low_bytes(s)
        mark = f", LOW: below {human_bytes(low)}, pushes fail once full" if s.disk_free_bytes < low else ""
        print(f"{s.shard_id:>5} disk: data dir {human_bytes(s.data_dir_bytes)}, free "
              f"{human_bytes(s.disk_free_bytes)} of {human_bytes(s.disk_total_bytes)} "
              f"({s.disk_free_bytes / max(s.disk_total_bytes, 1):.1%}){mark}")  # fmt: skip
        print(f"{s.shard_id:>5} {_job_clause(s)}")
    print("evictions, cache_misses (ids not in RAM: read from RocksDB, or new), admitted, dropped, pulls (lookups: pulls and pushes that "
          "return rows) and pushes count since each server started; num_rows and pending_ids are what its tables "
          "hold; rows_in_ram may exceed num_rows by ids pulled but never pushed")  # fmt: skip
    return _say(warnings, note)


COLUMNS = ("num_rows", "pending_ids", "rows_in_ram", "rows_on_disk", "disk_bytes", "ram_bytes", "evictions",
           "cache_misses", "admitted", "dropped", "pulls", "pushes")  # fmt: skip
"""The TableStats fields stats prints, a column each, in this order."""


def _column_widths(shards: list) -> list[int]:
    """The width of each of COLUMNS in stats' table of these shards (StatsResponses): 12, or the widest of its name
    and its figures as printed (with thousands separators: a shard's 64 GiB of rows reads 68,719,476,736), so
    that every figure stands under its name."""
    tables = [t for s in shards for t in s.tables]
    return [max([12, len(c), *(len(f"{getattr(t, c):,}") for t in tables)]) for c in COLUMNS]


def _memory_clause(s: Any) -> str:
    """A shard's memory line (StatsResponse s), after its shard number: the bound and each part's use."""
    bound = f"of {human_bytes(s.memory_budget_bytes)}" if s.memory_budget_bytes else "(no --memory-bytes)"
    alone = (
        " (a sync step's push larger than the room runs alone)"
        if s.request_room_used_bytes > s.request_room_bytes
        else ""
    )
    room = (f", room for requests {human_bytes(s.request_room_used_bytes)} of "
            f"{human_bytes(s.request_room_bytes)}{alone} ({s.request_room_waits:,} requests waited for it)"
            if s.request_room_bytes else "")  # fmt: skip
    sync = (f", sync steps hold {human_bytes(s.sync_steps_held_bytes)} of {human_bytes(s.sync_steps_bytes)} "
            "(counted with the copies their sums make)" if s.sync_steps_bytes else "")  # fmt: skip
    replies = _replies_clause(s)
    return (
        f"memory {bound}: block cache {human_bytes(s.block_cache_used_bytes)} of "
        f"{human_bytes(s.block_cache_budget_bytes)}, memtables {human_bytes(s.memtable_bytes)}, table readers "
        f"{human_bytes(s.table_reader_bytes)}, write-behind {human_bytes(s.write_behind_bytes)}, journal map "
        f"{human_bytes(s.journal_map_bytes)}{room}{sync}{replies}"
    )


def _job_clause(s: Any) -> str:
    """A shard's job line (StatsResponse s): the job whose worker clocks it follows, by its name where the shard
    knows one (ps.stamp job_named; a server without StatsResponse.job_name gives none: its id), its workers, the
    slowest one's clock and the largest gap a stamped pull was served at (for a sync or ssp job: an async or geo
    job's stamps move no clock, and the line says so instead); "job: none" where it follows none."""
    if not s.job:
        return "job: none (the shard follows no training job)"
    workers = f"{s.num_workers:,} worker{'s' * (s.num_workers != 1)}"
    if s.job_unclocked:
        return (
            f"job {job_named(s.job, s.job_name)}: {workers}, async or geo: its pushes move no worker clock (a sync "
            "or ssp job's line gives its slowest worker's clock and the largest gap)"
        )
    return (f"job {job_named(s.job, s.job_name)}: {workers}, slowest at clock {s.min_clock:,}, largest gap "
            f"{s.max_gap:,} (steps a stamped pull was served ahead of the slowest clock)")  # fmt: skip


def _replies_clause(s: Any) -> str:
    """The part of a shard's memory line on its replies of rows (StatsResponse s): its reply room, where it has one
    (--reply-bytes), and the calls cancelled at --reply-read-timeout-s, where there were any, room or not."""
    unread = f"{s.reply_room_expired:,} cancelled at --reply-read-timeout-s" if s.reply_room_expired else ""
    if not s.reply_room_bytes:
        return f"; outside it, replies being sent unbounded (--reply-bytes 0), {unread}" if unread else ""
    return (f"; outside it, replies being sent {human_bytes(s.reply_room_used_bytes)} of "
            f"{human_bytes(s.reply_room_bytes)} ({s.reply_room_waits:,} waited for room"
            f"{', ' + unread if unread else ''})")  # fmt: skip


def _failing_flushes(shards: list) -> str:
    """A warning naming the shards whose background flushes are failing (each one's failures in a row), "" when
    none is."""
    failing = [f"shard {s.shard_id} ({s.flush_failures:,} in a row; journal {human_bytes(s.journal_bytes)})"
               for s in shards if s.flush_failures]  # fmt: skip
    if not failing:
        return ""
    return (f"background flushes to RocksDB are failing on {', '.join(failing)}: acknowledged pushes are kept in the "
            "journal, which grows until a flush succeeds; the server's log says why (a full disk, or a RocksDB error "
            "that a restart clears)")  # fmt: skip


def _clocks_note(shards: list) -> str:
    """A note when the shards' clocks differ, "" when they agree (every training step advances every shard's clock
    by one)."""
    clocks = {s.shard_id: s.clock for s in shards}
    if len(set(clocks.values())) <= 1:
        return ""
    each = ", ".join(f"shard {i} at {c:,}" for i, c in clocks.items())
    return (f"the shards' clocks differ ({each}): each training step advances every shard's, so while a job trains "
            "they differ by the steps in flight; otherwise a worker stopped in the middle of a step, or a shard serves "
            "an older copy of its data dir")  # fmt: skip


def _say(warnings: list[str], note: str) -> int:
    """Prints the note (may be "") and the warnings to stderr; returns stats' exit code: 1 with a warning."""
    if note:
        print(f"ps-worker: note: {note}", file=sys.stderr)
    for warning in warnings:
        print(f"ps-worker: warning: {warning}", file=sys.stderr)
    return 1 if warnings else 0


def _disk_low_bytes(s: Any) -> int:
    """The free bytes under which a shard's disk (its Stats) is low, as its server reckons (ps.storage.diskspace)."""
    from ps.storage.diskspace import low_bytes

    return low_bytes(s.disk_total_bytes, s.data_dir_bytes)


def message_dict(message: Any) -> dict:
    """Every field of a protobuf message (its defaults too) as plain JSON values, by field name."""
    out = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        if f.message_type is not None:
            value = [message_dict(v) for v in value] if f.is_repeated else message_dict(value)
        elif f.is_repeated:
            value = list(value)
        out[f.name] = value
    return out


def run_shrink(args: argparse.Namespace) -> int:
    import json

    with _client(args) as client:
        shards = client.wait_ready()
        replies = client.shrink(args.table)
        names = [args.table] if args.table else list(dict.fromkeys(t.name for s in shards for t in s.tables))
        unruled = not sum(r.dropped for r in replies) and _no_rule(client, shards, replies, names)
    result = {
        "dropped": sum(r.dropped for r in replies),
        "num_rows": sum(r.num_rows for r in replies),
        "pending_ids": sum(r.pending_ids for r in replies),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for i, r in enumerate(replies):
            print(f"shard {i}: dropped {r.dropped:,} ids; {r.num_rows:,} rows and {r.pending_ids:,} pending ids left")
        print(
            f"all shards: dropped {result['dropped']:,}; {result['num_rows']:,} rows, {result['pending_ids']:,} pending"
        )
    if unruled:
        which = f"table {args.table!r} has no" if args.table else "no table has an"
        print(f"ps-worker: note: {which} eviction rule, so the shrink kept every row as it was: a table gets "
              "one from ps-worker train's --table-config (`eviction = { ttl_steps = ..., score_threshold = ..., "
              "decay = ... }`, docs/tables.md) as the table is made; a trained table keeps its spec",
              file=sys.stderr)  # fmt: skip
    return 0


def _no_rule(client: Any, shards: list, replies: list, names: list[str]) -> bool:
    """Whether none of the tables names has an eviction rule: each is in a shard's ShrinkResponse
    .tables_without_rule (a table's rule is the same on every shard holding it), where every shard's server fills
    that list (lists_tables_without_rule); else as the first shard holding each describes it (_rule_is_off: one
    DescribeTable per table, one after another)."""
    if all(r.lists_tables_without_rule for r in replies):
        listed = {name for r in replies for name in r.tables_without_rule}
        return all(name in listed for name in names)
    return all(_rule_is_off(client, shards, name) for name in names)


def _rule_is_off(client: Any, shards: list, name: str) -> bool:
    """Whether the table has no eviction rule (EvictionConfig.is_off), as the first shard holding it (stats' shards,
    StatsResponses; shard 0 where none lists it) describes it."""
    from ps.codec import table_config_from_proto

    shard = next((s.shard_id for s in shards if any(t.name == name for t in s.tables)), 0)
    (info,) = client.describe_table(name, shards=[shard])
    return table_config_from_proto(info.spec).eviction.is_off


def run_checkpoint(args: argparse.Namespace) -> int:
    from worker.checkpoint import check_save_dir, save
    from worker.resume_checkpoint import check_same_model, positions_line, read_positions

    check_save_dir("DIR", args.dir)  # before any server is asked (save checks again)
    resume_file = args.record_positions

    def read(client: Any) -> list[dict]:  # a Client, or None
        try:
            positions = read_positions(resume_file)
            if client is not None:  # read just before the hold: trained into the model the shards hold
                check_same_model(positions, client.state_ids, client.servers)
            return positions
        except ValueError as e:
            raise ValueError(f"{e}; nothing was saved") from None

    if resume_file is not None:
        read(None)  # each file read once before any server is asked: one missing is refused, nothing saved
    with _client(args) as client:
        client.wait_ready()
        positions = None if resume_file is None else lambda: read(client)
        m = save(client, args.dir, args.hold_timeout_s, positions=positions)
    rows = {t["name"]: sum(s["rows"].get(t["name"], 0) for s in m["shards"]) for t in m["tables"]}
    print(f"checkpoint of {m['num_shards']} shard{'s' * (m['num_shards'] != 1)} at clock {m['clock']:,} in {args.dir} ({m['seconds']:.1f} s, pushes "
          f"held {m['pushes_held_s']:.1f} s): " + ", ".join(f"{k} {v:,} row{'s' * (v != 1)}" for k, v in rows.items()))  # fmt: skip
    if "positions" in m:
        print(positions_line(m["positions"]))
    return 0


def run_export(args: argparse.Namespace) -> int:
    from worker.export import export_command

    return export_command(args, _client)

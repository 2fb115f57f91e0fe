"""`ps-worker` / `python -m worker`: command-line arguments in, a training run (or a data file) out."""

from __future__ import annotations

from ps.terminate import exit_code, interrupt_exits, sigterm_raises

with interrupt_exits("ps-worker"):  # a Ctrl-C while these load (most of a start's first 0.3 s)
    import argparse
    import logging
    import sys
    from typing import Any

    from ps.accel.malloc import tune_malloc
    from ps.config import DEFAULT_HOLD_S, MAX_HOLD_S
    from ps.errors import PsError
    from ps.settings import (
        LOG_LEVELS,
        HelpFormatter,
        add_config_flag,
        apply_defaults,
        command_parser,
        integer,
        number,
        reader_gone,
        unknown_arguments,
        unknown_before_command,
        unrecognized,
        warn_unknown_environment,
    )
    from worker.cli_flags import SECONDS, SECONDS_OR_0, add_security_args
    from worker.cli_predict import add_predict_parser, run_predict
    from worker.cli_train import run_eval, run_train
    from worker.cli_train_flags import add_eval_parser, add_train_parser
    from worker.flags import check_new_file, check_not_an_input, check_output_file, delimiter, server_list
    from worker.launch import run_launch
    from worker.launch_plan import add_launch_parser


def _add_synth(sub) -> None:
    p = sub.add_parser(
        "synth",
        help="write synthetic Criteo-format data with a planted model",
        description="Write rows of the synthetic generator: a Criteo-format file (label, 13 ints, 26 hex), or with "
        "--history a CSV with a multi-hot history column and, beside it, the schema that reads it (OUT.schema.toml).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--rows", type=integer(1), default=None, help="rows to write (default 100,000; with --small 10,000)")
    p.add_argument("--start", type=integer(0), default=0, help="first row index (use a later range for eval data)")
    p.add_argument("--interactions", type=number(-1e3, 1e3), default=0.0,
                   help="strength of the planted pairwise interactions")  # fmt: skip
    p.add_argument("--history", type=number(0, 1e3), default=0.0, help="strength of a planted multi-hot history column")
    p.add_argument(
        "--small",
        action="store_true",
        help="the small-data regime: few rows over 10^5+ values, with interactions (overfits easily)",
    )
    p.add_argument(
        "--seed", type=integer(0, 2**63 - 1), default=0, help="seed of the generator: its planted model and its rows"
    )
    p.add_argument("--overwrite", action="store_true", help="replace --out (and OUT.schema.toml) if they exist; "
                   "without it an existing file is an error")  # fmt: skip


def _add_schema(sub) -> None:
    p = sub.add_parser(
        "schema",
        help="print a starting feature schema inferred from a data sample",
        description="Read a sample of a data file's rows and print a TOML feature schema for --schema: the label, "
        "numeric columns (log or standardized), multi-hot columns, categorical columns. Review it before training.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--data",
        required=True,
        help="a data file (.gz read through gzip), or many: a directory, a "
        "quoted glob or a comma-separated list, sampled across their files",
    )
    p.add_argument("--format", default="auto", choices=["auto", "csv", "criteo", "libsvm"],
                   help="the file's format; auto: csv where --delimiter is given, else told by the first line as "
                   "train tells it (libsvm, criteo, or csv: a header line of names separated by commas, tabs, ; "
                   "or |, the delimiter written into the schema)")  # fmt: skip
    p.add_argument(
        "--delimiter",
        default=None,
        help="csv: the column separator, one character ($'\\t', '\\t' or tab: a tab; default ',')",
    )
    p.add_argument(
        "--rows",
        type=integer(1),
        default=10_000,
        help="rows of the sample: half the file's first, half spread over the rest (all from the start of a .gz file)",
    )
    p.add_argument("--out", default=None, help="write the schema here instead of printing it")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists (a schema you edited, say); "
                   "without it an existing file is an error")  # fmt: skip


def _add_cluster_commands(sub) -> None:
    for name, help_text in (
        (
            "stats",
            "print what each shard holds: rows in RAM and on disk, pending ids, bytes, counters, its disk's use; "
            "exit 1, warning, when a shard lacks a table others hold trained (it lost its data dir) or the shards "
            "were restored from different checkpoints",
        ),
        ("shrink", "run the tables' eviction rules (TTL, decayed score) on every shard; print how many ids went"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                           formatter_class=HelpFormatter)  # fmt: skip
        p.add_argument("--servers", required=True, help="comma-separated host:port list, in shard order")
        p.add_argument("--timeout-s", type=SECONDS, default=600.0, help="deadline of each server call")
        _add_server_timeout(p)
        p.add_argument("--json", action="store_true", help="print one JSON object" + (
            ': {"shards": [each shard\'s Stats, every field, and disk_low 0 or 1], "warnings": [the warnings that '
            'make the exit code 1], "notes": [...]}' if name == "stats" else ""))  # fmt: skip
        add_security_args(p)
        if name == "shrink":
            p.add_argument("--table", default="", help="only this table (default: all)")
    help_text = (
        "checkpoint every shard at one cut into DIR (restore with ps-server --restore DIR, onto any number of servers)"
    )
    p = sub.add_parser("checkpoint", help=help_text, description=help_text[0].upper() + help_text[1:] + ". Pushes "
                       "wait (clients retry them) while the shards flush and checkpoint. DIR must lie inside the "
                       "servers' --checkpoint-root, under the same path here (one machine, or a shared volume).",
                       formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("action", choices=["save"], help="save: write a new checkpoint")
    p.add_argument("dir", help="a new (or empty) directory for the checkpoint; a checkpoint is never written over "
                   "another, nor beside other files")  # fmt: skip
    p.add_argument("--servers", required=True, help="comma-separated host:port list, in shard order")
    p.add_argument("--timeout-s", type=SECONDS, default=600.0, help="deadline of each server call")
    _add_server_timeout(p)
    p.add_argument(
        "--hold-timeout-s",
        type=number(0, MAX_HOLD_S, above=True),
        default=DEFAULT_HOLD_S,
        help="shards take pushes again after this long even if the save never finished",
    )
    add_security_args(p)
    help_text = "write the model the servers hold, at one cut, for serving: per table ids and embeddings as .npy"
    p = sub.add_parser("export", help=help_text, description=help_text[0].upper() + help_text[1:] + " (optimizer "
                       "state left out), from a checkpoint taken first into a folder of OUT (kept in the export's folder, "
                       "OUT/<dir>/checkpoint, with --keep-checkpoint), so OUT must lie inside the servers' --checkpoint-root, at the same path "
                       "here and on the servers. --since STEP writes only "
                       "the rows pushed at clock step >= STEP: a delta for an online store.",
                       formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("out", help="output directory: new or empty, unless --overwrite. A second export into it while "
                   "one runs is refused by a lock on it, which a file system that keeps locks per machine (NFS) "
                   "keeps from this machine's exports only: there, export into one OUT from one machine")  # fmt: skip
    p.add_argument("--servers", required=True, help="comma-separated host:port list, in shard order")
    p.add_argument("--since", type=integer(0), default=None, help="only rows pushed at this clock step or later")
    p.add_argument("--tables", default=None, help="comma-separated names of the tables to write, or fnmatch "
                   "patterns (deepfm,'dense.deepfm.*': one model of several); default: every table. A choice that leaves "
                   "out some tables of a model (tables that share their features) is warned about")  # fmt: skip
    p.add_argument(
        "--keep-checkpoint",
        action="store_true",
        help="keep the checkpoint exported, in the export's folder as checkpoint, named by export.json "
        "(restorable with ps-server --restore); an export over it removes it with the rest",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar of the rows read per table (when "
                   "stderr is no terminal, a plain progress line every 30 s takes the bar's place)")  # fmt: skip
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty OUT: an earlier export there "
                   "is replaced whole once the new one is written (its folder removed then, with its kept "
                   "checkpoint; a failure leaves it as it was); other files are left as they are")  # fmt: skip
    p.add_argument("--timeout-s", type=SECONDS, default=600.0, help="deadline of each server call")
    _add_server_timeout(p)
    add_security_args(p)


def _add_server_timeout(p) -> None:
    p.add_argument(
        "--server-timeout", type=SECONDS_OR_0, default=30.0,
        help="how long a server may stay down, counted from the first failed call to it (its calls sent again), "
        "before exiting with an error (0: no retry; a server not reachable yet is waited for up to --timeout-s)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ps-worker",
        description="sparseps worker: train CTR models on parameter servers.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        help="what to log (any case; before or after the command)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_eval_parser(sub)
    add_predict_parser(sub)
    add_launch_parser(sub)
    _add_synth(sub)
    _add_schema(sub)
    _add_cluster_commands(sub)
    for command in sub.choices.values():
        add_config_flag(command)
        # also after the command (`ps-worker train --log-level INFO`); unset there, the value before it stands
        command.add_argument(
            "--log-level", default=argparse.SUPPRESS, type=str.upper, choices=LOG_LEVELS, help=argparse.SUPPRESS
        )
    return p


def _client(args):
    """A Client for the servers, deadlines and security flags of a cluster command (stats, checkpoint, ...)."""
    from worker.channels import client_token
    from worker.client import Client

    token = client_token(args.auth_token_file, args.tls_key)
    return Client(list(server_list(args.servers)), timeout_s=args.timeout_s, server_timeout_s=args.server_timeout,
                  tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key, auth_token=token)  # fmt: skip


_OUTPUTS = ("out", "metrics_out")  # the dests of the flags that name a file a command writes


def _check_config_not_written(args) -> None:
    """ValueError when an output flag names the --config file (each command checks its other inputs)."""
    for dest in _OUTPUTS:
        check_not_an_input(f"--{dest.replace('_', '-')}", getattr(args, dest, None), {"--config": args.config})


def _synth(args) -> int:
    import dataclasses

    from worker.results import auc_text
    from worker.synthetic import SMALL_DATA_ROWS, SyntheticConfig, schema_text, small_data_config, write_synthetic

    if args.rows is None:
        args.rows = SMALL_DATA_ROWS if args.small else 100_000
    if args.small:
        cfg = dataclasses.replace(small_data_config(args.seed), rows=args.start + args.rows)
    else:
        cfg = SyntheticConfig(rows=args.start + args.rows, seed=args.seed, interactions=args.interactions)
    if args.history:
        cfg = dataclasses.replace(cfg, history=args.history)
    for flag, path in (("--out", args.out), ("the schema beside --out", args.out + ".schema.toml")):
        if flag == "--out" or cfg.history:  # checked before anything is written
            check_output_file(flag, path)
            check_new_file(flag, path, args.overwrite)
    written = _write_whole(args.out, lambda path: write_synthetic(path, cfg, args.start, args.start + args.rows))
    print(f"wrote rows [{args.start}, {args.start + args.rows}) to {args.out}: click rate {written['click_rate']:.1%}; "
          f"the planted model that drew their labels scores AUC {auc_text(written['oracle_auc'])}, logloss "
          f"{written['oracle_logloss']:.4f} on them: the mark for a model evaluated on these rows")  # fmt: skip
    if args.small and args.start == 0 and args.rows <= 10 * SMALL_DATA_ROWS:  # (as measured up to 100,000 rows)
        print(f"  (--small: in {args.rows:,} such rows most ids are seen once or twice, so a model learns little of "
              f"them: a tuned logistic regression trained on {SMALL_DATA_ROWS:,} scores AUC 0.63-0.65, far under "
              "that mark, benchmarks/small_data.py)")  # fmt: skip
    if cfg.history:
        import os

        from ps.storage.atomicfile import write_text_whole

        schema = args.out + ".schema.toml"
        try:  # whole or not at all, as --out is
            write_text_whole(schema, schema_text(cfg), temp_prefix=f".{os.path.basename(schema)}.", shared=True)
        except OSError as e:
            raise OSError(f"the schema beside --out, {schema}: could not write it ({e.strerror or e}); nothing was "
                          f"written there (the rows are in {args.out})") from None  # fmt: skip
        print(
            f"wrote its schema to {args.out}.schema.toml (train with --data {args.out} --schema {args.out}.schema.toml)"
        )
    return 0


def _write_whole(out: str, write: Any) -> Any:
    """write(path) into a hidden temporary file beside `out` (its .gz suffix kept), renamed to `out` once whole
    (atomicfile.replaced_whole): a write that fails (a full disk), or a stop, leaves `out` as it was, and the error
    names --out."""
    import os

    from ps.storage.atomicfile import replaced_whole

    suffix = ".tmp" + (".gz" if out.endswith(".gz") else "")
    try:
        with replaced_whole(out, f".{os.path.basename(out)}.", suffix, shared=True) as tmp:
            return write(tmp)
    except OSError as e:
        raise OSError(f"--out {out}: could not write it ({e.strerror or e}); nothing was written there") from None


def _schema(args) -> int:
    from worker.datafiles import check_data_input
    from worker.schema_infer import infer_schema

    check_data_input("--data", args.data, "a data file, or a directory, glob or comma-separated list of them")
    check_not_an_input("--out", args.out, {"--data": args.data})
    check_output_file("--out", args.out)
    check_new_file("--out", args.out, args.overwrite)
    fmt = "csv" if args.format == "auto" and args.delimiter is not None else args.format
    text, checks = infer_schema(args.data, fmt=fmt, delimiter=delimiter(args.delimiter or ","), sample_rows=args.rows)
    for check in checks:
        print(f"ps-worker schema: {check}", file=sys.stderr)
    if args.out:
        from ps.storage.atomicfile import write_text_whole

        try:
            write_text_whole(args.out, text, shared=True)  # whole or not at all, readable as a file open() makes
        except OSError as e:
            raise OSError(
                f"--out {args.out}: could not write it ({e.strerror or e}); nothing was written there"
            ) from None
        print(f"wrote a schema inferred from {args.data} to {args.out}")
    else:
        print(text, end="")
    return 0


def _stats(args) -> int:
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
    cols = ("num_rows", "pending_ids", "rows_in_ram", "rows_on_disk", "disk_bytes", "ram_bytes", "evictions",
            "cache_misses", "admitted", "dropped", "pulls", "pushes")  # fmt: skip
    width = max([12, *(len(t.name) for s in shards for t in s.tables)])  # dense.deepfm.mlp.0.weight and the like
    print(f"{'shard':>5} {'table':<{width}} " + " ".join(f"{c:>12}" for c in cols))
    for s in shards:
        for t in s.tables:
            print(f"{s.shard_id:>5} {t.name:<{width}} " + " ".join(f"{getattr(t, c):>12,}" for c in cols))
        restored = f", restored from {s.restored_from}" if s.restored_from else ""
        print(f"{s.shard_id:>5} data dir {s.data_dir}{restored}, up {s.uptime_s:,.0f} s, clock {s.clock:,}, RAM "
              f"{_size(s.ram_used_bytes)} of {_size(s.ram_budget_bytes)}, journal {_size(s.journal_bytes)}")  # fmt: skip
        bound = f"of {_size(s.memory_budget_bytes)}" if s.memory_budget_bytes else "(no --memory-bytes)"
        alone = (
            " (a sync step's push larger than the room runs alone)"
            if s.request_room_used_bytes > s.request_room_bytes
            else ""
        )
        room = (f", room for requests {_size(s.request_room_used_bytes)} of {_size(s.request_room_bytes)}{alone} "
                f"({s.request_room_waits:,} requests waited for it)"
                if s.request_room_bytes else "")  # fmt: skip
        sync = (f", sync steps hold {_size(s.sync_steps_held_bytes)} of {_size(s.sync_steps_bytes)} (counted with "
                "the copies their sums make)" if s.sync_steps_bytes else "")  # fmt: skip
        replies = (f"; outside it, replies being sent {_size(s.reply_room_used_bytes)} of "
                   f"{_size(s.reply_room_bytes)} ({s.reply_room_waits:,} waited for room)"
                   if s.reply_room_bytes else "")  # fmt: skip
        print(
            f"{s.shard_id:>5} memory {bound}: block cache {_size(s.block_cache_used_bytes)} of "
            f"{_size(s.block_cache_budget_bytes)}, memtables {_size(s.memtable_bytes)}, table readers "
            f"{_size(s.table_reader_bytes)}, write-behind {_size(s.write_behind_bytes)}, journal map "
            f"{_size(s.journal_map_bytes)}{room}{sync}{replies}"
        )
        low = _disk_low_bytes(s)
        mark = f", LOW: below {_size(low)}, pushes fail once full" if s.disk_free_bytes < low else ""
        print(f"{s.shard_id:>5} disk: data dir {_size(s.data_dir_bytes)}, free {_size(s.disk_free_bytes)} of "
              f"{_size(s.disk_total_bytes)} ({s.disk_free_bytes / max(s.disk_total_bytes, 1):.1%}){mark}")  # fmt: skip
    print("evictions, cache_misses (ids not in RAM: read from RocksDB, or new), admitted, dropped, pulls (lookups: pulls and pushes that "
          "return rows) and pushes count since each server started; num_rows and pending_ids are what its tables "
          "hold; rows_in_ram may exceed num_rows by ids pulled but never pushed")  # fmt: skip
    return _say(warnings, note)


def _failing_flushes(shards: list) -> str:
    """A warning naming the shards whose background flushes are failing (each one's failures in a row), "" when
    none is."""
    failing = [f"shard {s.shard_id} ({s.flush_failures:,} in a row; journal {_size(s.journal_bytes)})" for s in shards
               if s.flush_failures]  # fmt: skip
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


def _size(n: int) -> str:
    """Bytes as people read them: '100.0 KiB', '12.5 MiB', '2.00 GiB' (below 1,000 B: '512 B'; a unit from 1,000
    of the one below, so that no figure reads 1,024.0)."""
    if n < 1000:
        return f"{n:,} B"
    if n < 1000 << 10:
        return f"{n / 2**10:,.1f} KiB"
    return f"{n / 2**20:,.1f} MiB" if n < 1000 << 20 else f"{n / 2**30:,.2f} GiB"


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


def _shrink(args) -> int:
    import json

    with _client(args) as client:
        client.wait_ready()
        replies = client.shrink(args.table)
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
    return 0


def _checkpoint(args) -> int:
    from worker.checkpoint import check_save_dir, save

    check_save_dir("DIR", args.dir)  # before any server is asked (save checks again)
    with _client(args) as client:
        client.wait_ready()
        m = save(client, args.dir, args.hold_timeout_s)
    rows = {t["name"]: sum(s["rows"].get(t["name"], 0) for s in m["shards"]) for t in m["tables"]}
    print(f"checkpoint of {m['num_shards']} shard{'s' * (m['num_shards'] != 1)} at clock {m['clock']} in {args.dir} ({m['seconds']:.1f} s, pushes "
          f"held {m['pushes_held_s']:.1f} s): " + ", ".join(f"{k} {v:,} row{'s' * (v != 1)}" for k, v in rows.items()))  # fmt: skip
    return 0


def _export(args) -> int:
    from worker.export import export_command

    return export_command(args, _client)


def main(argv: list[str] | None = None) -> int:
    """ps-worker and its commands; the exit code. A Ctrl-C (or, in a command, a SIGTERM: sigterm_raises) ends it
    with 'ps-worker: interrupted' (or 'terminated') and 130 (143), its cleanups run; one while the imports load
    ends it so too (interrupt_exits)."""
    return exit_code("ps-worker", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    warn_unknown_environment(parser.prog)
    try:
        apply_defaults(parser, argv)
    except ValueError as e:
        parser.error(str(e))
    # flags no parser knows, found before a missing required one is (settings.unknown_arguments); launch passes
    # the flags it does not know to each worker's train
    if early := unknown_before_command(parser, argv):
        parser.error(unrecognized(parser, early))
    loose, rest = unknown_arguments(parser, argv)
    if rest and loose.command not in (None, "launch"):  # the usage of the part of the command line they were given in
        before = argv[: argv.index(loose.command)] if loose.command in argv else []
        where = parser if all(token in before for token in rest) else command_parser(parser, loose.command)
        where.error(unrecognized(where, rest))
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_malloc()
    try:
        with sigterm_raises():
            return _run_command(args, rest)
    except BrokenPipeError:
        return reader_gone()
    except (ValueError, PsError, OSError) as e:
        print(f"ps-worker: error: {e}", file=sys.stderr)
        return 2


def _run_command(args, rest: list[str]) -> int:
    _check_config_not_written(args)
    if args.command == "launch":
        return run_launch(args, rest)
    commands = {"train": run_train, "eval": run_eval, "predict": run_predict, "synth": _synth, "schema": _schema, "stats": _stats,
                "shrink": _shrink, "checkpoint": _checkpoint, "export": _export}  # fmt: skip
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

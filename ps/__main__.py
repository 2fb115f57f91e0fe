"""`ps-server` / `python -m ps`: command-line arguments in, a running shard out."""

from __future__ import annotations

from ps.terminate import exit_code, interrupt_exits, sigterm_raises

with interrupt_exits("ps-server"):  # a Ctrl-C while these load (most of a start's first 0.3 s)
    import argparse
    import json
    import logging
    import math
    import os
    import sys

    from ps.accel.malloc import BOUNDED_MMAP_THRESHOLD, BOUNDED_TRIM_THRESHOLD, tune_malloc
    from ps.config import (
        DEFAULT_REPLY_READ_TIMEOUT_S,
        FULL_AT_REST,
        MAX_DIM,
        MAX_INTERVAL_S,
        VALUES_AT_REST,
        ServerConfig,
    )
    from ps.errors import PsError, StorageError
    from ps.replies import check_reply_bytes, reply_room_bytes
    from ps.settings import (
        LOG_LEVELS,
        HelpFormatter,
        add_config_flag,
        address,
        apply_defaults,
        byte_size,
        integer,
        number,
        reader_gone,
        unknown_arguments,
        unrecognized,
        warn_unknown_environment,
    )
    from ps.storage.memory import plan_memory


def parse_bytes(text: str, least: int = 1) -> int:
    """'512M' -> 536870912; plain numbers are bytes; ArgumentTypeError for anything but a size >= least bytes."""
    try:
        size = byte_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of bytes or a size such as 512M or 2G, got {text!r}"
        ) from None
    if size < least:
        raise argparse.ArgumentTypeError(
            f"expected a size of at least {least} byte{'' if least == 1 else 's'}, such as 512M or 2G, got {text!r}"
        )
    return size


def bound_bytes(text: str) -> int:
    """parse_bytes, or 0: no bound."""
    return parse_bytes(text, least=0)


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 and <= MAX_INTERVAL_S."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_INTERVAL_S):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0 and <= {MAX_INTERVAL_S:g}, got {text!r}")
    return value


COMMANDS = ("export", "size", "verify", "health")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ps-server",
        usage="ps-server --data-dir DIR [flags]  (run a shard)\n       ps-server {export,size,verify,health} ... "
        "(see ps-server COMMAND --help)",
        description="Run one shard of a sparseps parameter server. Each shard owns a contiguous range of the "
        "16384 hash slots, keeps hot rows in RAM and all rows in RocksDB under --data-dir, and serves "
        "the ParameterServer service of protos/ps.proto (CreateTable, DescribeTable, Pull, Push, PullBatch, PushBatch, "
        "Checkpoint, Stats, AdvanceClock, Shrink) plus the gRPC health service. "
        "`ps-server size --help`: how much RAM and disk a table needs; `ps-server verify DIR`: what is damaged in a "
        "data dir; `ps-server export CHECKPOINT`: a checkpoint's embeddings as .npy for serving; `ps-server health "
        "HOST:PORT`: whether a shard serves (a probe's exit code). SIGTERM or Ctrl-C stops it cleanly (every "
        "dirty row written to RocksDB, exit 0); a second one during that stop ends it at once (exit 143 or 130), as "
        "kill -9 would: the next start replays its journal.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--port", type=integer(0, 65535), default=0, help="TCP port; 0 takes a free one and prints it")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all interfaces)")
    p.add_argument("--shard-id", type=integer(0), default=0, help="this shard's index, 0..num-shards-1")
    p.add_argument("--num-shards", type=integer(1), default=1, help="number of shards in the cluster")
    p.add_argument("--data-dir", required=True, help="RocksDB directory of this shard (created if missing)")
    p.add_argument("--threads", type=integer(1), default=8,
                   help="gRPC worker threads; a sync or ssp job's waits hold them: give at least 2 x its workers + 2")  # fmt: skip
    p.add_argument("--max-queued-calls", type=integer(1), default=256,
                   help="calls that may wait for a free thread; a call past them is refused at once "
                   "(RESOURCE_EXHAUSTED), and ps-worker's clients send it again after a pause, as for a shard that "
                   "is down: the bound on what a flood of calls holds on a server")  # fmt: skip
    p.add_argument("--reply-bytes", type=bound_bytes, default=None,
                   help="the bytes of replies of rows (pulls, pushes' returned rows) built and not yet sent, all "
                   "calls together, each reply counted twice (the server holds an unsent reply twice: gRPC's copy "
                   "and the bytes it was made from) (K/M/G/T suffixes): a reply waits for room while "
                   "slow readers' replies hold it, and one larger than all of it is refused (RESOURCE_EXHAUSTED); 0: no "
                   "bound. The server refuses to start with less than one reply to ps-worker's largest request "
                   "needs. Default: 1G, or with --memory-bytes as much as its `requests` part (1/8 of it, 16 to 128 MiB)")  # fmt: skip
    p.add_argument("--reply-read-timeout-s", type=number(0, MAX_INTERVAL_S), default=DEFAULT_REPLY_READ_TIMEOUT_S,
                   help="seconds a reply of rows may stay unread after it was built, with or without --reply-bytes (an "
                   "unread reply holds the server's memory either way): a caller that has not read it all by then has "
                   "its call ended (CANCELLED) and its reply freed, its room under --reply-bytes given back, so that a "
                   "caller that never reads and sets no deadline cannot keep the room from every other caller; each "
                   "is counted as a call cancelled at the limit (ps-worker stats, sparseps_reply_room_expired_total; a "
                   "call whose read completes at that very moment may be counted too) and logged (a line per caller's "
                   "host a minute at most); 0: no limit, else at least 1 (a shorter limit cancels the calls of large "
                   "replies their callers are still reading). Default: 600, 5 times the longest a ps-worker call lasts with "
                   "its default deadlines (--timeout-s 60, and --barrier-timeout 60 for a sync or ssp wait), and "
                   "time to send its largest reply (64 MiB) at 1 Mbit/s; with ps-worker --timeout-s above it, give "
                   "at least as much")  # fmt: skip
    p.add_argument("--sync", action="store_true", help="fsync every push before acknowledging it")
    p.add_argument(
        "--cache-bytes", type=parse_bytes, default=None,
        help="RAM tier budget for all tables of this shard (K/M/G/T suffixes); colder rows live only in RocksDB. "
        "Each table can always hold an equal share of it (the budget / the tables, which must hold 256 rows of the "
        "widest, or 1M of rows over 4K: CreateTable is refused below that), taking rows back from tables above "
        "theirs; beyond its share a table holds what it took while bytes were free. Default: 2G, or with "
        "--memory-bytes what its other parts leave of it",
    )  # fmt: skip
    p.add_argument(
        "--memory-bytes", type=parse_bytes, default=None,
        help="one bound for the memory that holds data: the RAM tier, RocksDB's block cache (index and filter "
        "blocks included) and memtables, rows waiting to be written, the mapped journal segment, room for "
        "requests' copies of rows, room for sync steps' contributions (held until every worker of the step has "
        "pushed) and their sums; a contribution past that room stops its job (RESOURCE_EXHAUSTED). The split is "
        "logged at start, and `ps-worker stats` reports each part's use; the "
        "process's fixed overhead (an idle server's, "
        "its compiled code loaded at start) comes on top. Each pull and push takes room for its copies of rows and "
        "waits while others hold it (ps-worker stats counts the waits); a request larger than the whole room is "
        "refused (RESOURCE_EXHAUSTED), but for a sync step's push, which runs alone up to --memory-bytes of "
        "copies. Not counted: the messages waiting for a server thread, replies being sent (--reply-bytes), and what a sync "
        "step's push copies beyond the room (README, Limits). A bound "
        "past the machine's RAM, or past its container's "
        "memory limit (cgroup), is warned of at start. Default: no overall bound",
    )  # fmt: skip
    p.add_argument(
        "--read-threads",
        type=integer(1, 64),
        default=2,
        help="threads that read a request's missed rows from RocksDB at once (it reads without Python's lock)",
    )
    p.add_argument(
        "--flush-interval-s",
        type=seconds,
        default=30.0,
        help="how often dirty rows are written to RocksDB (and whenever the journal has grown by 1 GiB)",
    )
    p.add_argument("--tls-cert", default=None, help="PEM certificate to serve TLS with (needs --tls-key)")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    p.add_argument(
        "--tls-ca", default=None, help="PEM CA: require clients to present a certificate it signed (mutual TLS)"
    )
    p.add_argument(
        "--auth-token-file",
        default=None,
        help="file holding a shared token every call must carry (health checks excepted)",
    )
    p.add_argument(
        "--read-token-file",
        default=None,
        help="file holding a second token, admitted to the calls that change nothing (DescribeTable, Pull, "
        "PullBatch, Stats) and /metrics, and refused the rest (PERMISSION_DENIED): for serving and monitoring "
        "(ps-worker predict and eval read with it); needs --auth-token-file",
    )
    p.add_argument(
        "--restore",
        default=None,
        metavar="DIR",
        help="fill a new --data-dir from the checkpoint in DIR (ps-worker checkpoint save) before serving; any number of shards can restore one checkpoint",
    )
    p.add_argument(
        "--cluster", default="", metavar="NAME",
        help="the name of the cluster this shard belongs to (at most 64 letters, digits, '.', '_', '-'), the same on every "
        "shard of it: clients refuse a server list whose shards give different names (shards of two clusters "
        "mixed up). A data dir keeps the first name it runs with and refuses to start under another; default: "
        "unnamed",
    )  # fmt: skip
    p.add_argument(
        "--checkpoint-root", default=None, metavar="DIR",
        help="let clients (ps-worker checkpoint save, export) write checkpoints, only inside DIR (created if "
        "missing): the ps-worker commands send their folder as an absolute path (a relative one is from where they "
        "run), which must fall inside DIR; a request's relative path is taken from DIR. Without it, saves are refused",
    )  # fmt: skip
    p.add_argument(
        "--metrics-port",
        type=integer(0, 65535),
        default=None,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (https with --tls-cert; with --auth-token-file, "
        "requests must carry it, or the --read-token-file one, as `Authorization: Bearer`) (0: a free port; default: off)",
    )
    p.add_argument(
        "--direct-reads", action="store_true",
        help="read RocksDB's files with O_DIRECT, past the OS page cache (its block cache still applies): for "
        "benchmarking cold reads, or hosts that should keep little page cache; the data dir's file system must "
        "support O_DIRECT",
    )  # fmt: skip
    p.add_argument(
        "--mmap-reads", action="store_true",
        help="read RocksDB's files through memory maps instead of read calls, sparing a system call and a copy "
        "per block: point reads of one sorted run in the page cache take 0.6x the time (benchmarks/block_reads.py), "
        "a server's misses under sustained write-back 0.75-1.02x (benchmarks/miss_path.py). The pages read count in "
        "the server's RSS (page cache the OS can reclaim, outside --memory-bytes), and a file "
        "damaged or cut short while the server runs stops it (SIGBUS) instead of failing one request. Not with "
        "--direct-reads",
    )  # fmt: skip
    p.add_argument(
        "--accept-journal-loss", action="store_true",
        help="start even though journal records that were written (and may have been acknowledged) are missing "
        "or damaged: the server logs a warning naming them and goes on without those pushes. Without it, such a "
        "start is refused. `ps-server verify DIR` says what is damaged",
    )  # fmt: skip
    p.add_argument(
        "--verify-on-start", action="store_true",
        help="before serving, read every block of the data dir as `ps-server verify` does and refuse to start if "
        "anything is damaged (a damaged RocksDB data block is otherwise found only when a request reads it, and "
        "answered DATA_LOSS). Reads the whole data dir: start-up takes as long as reading it from disk",
    )  # fmt: skip
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, help="what to log (any case)")
    p.add_argument(
        "--stop-with-stdin", action="store_true",
        help="stop cleanly (as on SIGTERM) once standard input is closed: ps-worker's local clusters start their "
        "servers so, and they stop when the process that started them dies, even by SIGKILL",
    )  # fmt: skip
    add_config_flag(p)
    return p


def build_size_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ps-server size",
        description="Print the RAM and disk a table needs, per id and per server, from the row layout the "
        "server uses (ps/rows/layout.py). RocksDB overhead is the measured figure from benchmarks/scale.py.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--ids", type=number(1, 2**64), required=True, help="number of distinct ids (1e9 is fine)")
    p.add_argument(
        "--dim", type=integer(1, MAX_DIM), required=True, help=f"embedding dim (at most {MAX_DIM}, as a server takes)"
    )
    p.add_argument("--optimizer", default="adagrad", help="sgd, adagrad, adagrad_rowwise, adam or ftrl")
    p.add_argument("--servers", type=integer(1), default=1, help="servers the table is sharded over")
    p.add_argument("--hot-fraction", type=number(0, 1), default=0.1, help="share of rows to keep in the RAM tier")
    p.add_argument("--values-at-rest", default=FULL_AT_REST, choices=VALUES_AT_REST,
                   help="how RocksDB holds the table's embeddings (its config's values_at_rest): float16 takes half "
                   "their bytes on disk; RAM is float32 either way")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p


def size_main(argv: list[str]) -> int:
    import json

    from ps.sizing import format_report, size_report

    args = _parse(build_size_parser(), argv)
    try:
        r = size_report(int(args.ids), args.dim, args.optimizer, args.servers, args.hot_fraction, args.values_at_rest)
    except ValueError as e:
        print(f"ps-server size: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r) if args.json else format_report(r))
    return 0


def build_health_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ps-server health", description=health_main.__doc__, formatter_class=HelpFormatter)
    p.add_argument("address", type=address, help="host:port of the shard")
    p.add_argument("--timeout-s", type=number(0, above=True), default=3.0,
                   help="seconds to wait for the answer before calling the shard unhealthy")  # fmt: skip
    p.add_argument("--tls-ca", default=None, help="PEM CA to verify the shard's certificate, if it serves TLS")
    p.add_argument("--tls-cert", default=None, help="PEM client certificate, if the shard requires one (mutual TLS)")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    p.add_argument("--tls-server-name", default=None, help="name the shard's certificate holds, if not the address")
    p.add_argument("--auth-token-file", default=None, help="not needed: the shard answers health checks without its "
                   "token (accepted, and checked, so that a probe can share its clients' flags)")  # fmt: skip
    p.add_argument("--starting-ok", action="store_true", help="exit 0 for a shard that is starting too (a liveness "
                   "probe: a shard replaying its journal for an hour is alive, and says how far it is)")  # fmt: skip
    return p


HEALTH_STARTING = 3  # ps-server health's exit status for a shard that listens and is starting


def health_main(argv: list[str]) -> int:
    """`ps-server health HOST:PORT`: asks the shard's gRPC health service (for container health checks; the shard
    asks no token for it, but TLS and mutual TLS apply) and prints its answer. Exit 0: SERVING. Exit 3: the shard
    listens but its start (a journal replay, --restore, --verify-on-start, the warm-up under --memory-bytes) is not
    done: NOT_SERVING, printed with what it is doing and how far ("replaying its journal, 43% (12 s so far)"); with
    --starting-ok, 0. Exit 1:
    anything else (nothing listens, no answer in --timeout-s, a TLS mismatch, NOT_SERVING while it stops).
    Exit 2: a flag is wrong."""
    args = _parse(build_health_parser(), argv)
    from ps.health import check_health  # imported late: grpc stays out of `--help`
    from ps.security import read_token

    try:
        token = read_token(args.auth_token_file) if args.auth_token_file else None
        health = check_health(args.address, args.timeout_s, args.tls_ca, args.tls_cert, args.tls_key, token,
                              args.tls_server_name)  # fmt: skip
    except ValueError as e:  # an unreadable key, half a key pair
        print(f"ps-server health: error: {e}", file=sys.stderr)
        return 2
    code = 0 if health.serving else (0 if args.starting_ok else HEALTH_STARTING) if health.starting else 1
    print(f"{args.address}: {health.text}", file=sys.stderr if code else sys.stdout)
    return code


def build_verify_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ps-server verify", description=verify_main.__doc__, formatter_class=HelpFormatter)
    p.add_argument("data_dir", metavar="DIR", help="the --data-dir of a shard, best a stopped one (RocksDB is "
                   "opened read-only: a file that a running server deletes meanwhile would show as missing; what the journal "
                   "shows while a server runs on DIR is a note, as its flushes move the journal under verify); or a "
                   "checkpoint directory (ps-worker checkpoint save), or one shard-<i> folder of one")  # fmt: skip
    return p


def verify_main(argv: list[str]) -> int:
    """`ps-server verify DIR`: reads every block of the shard's data dir in DIR, changing nothing, and prints what
    it found: exit 0 if nothing is damaged, 1 if something is, 2 if DIR is not a shard's data dir or checkpoint,
    143 if stopped by SIGTERM.
    For a checkpoint (or a shard-<i> folder of one): its manifest's checksum, each shard's files against the
    manifest's sha256s, every block of each shard's RocksDB (damage saved into the checkpoint, which the sha256s
    cover, is found only so), and its rows against the manifest's counts."""
    args = _parse(build_verify_parser(), argv)
    with sigterm_raises():  # a stop removes the read-only view (ps.terminate; main() says it)
        return _verify(args)


def _verify(args: argparse.Namespace) -> int:
    from ps.storage.verify import verify_data_dir

    try:
        lines, damaged = verify_data_dir(args.data_dir)
    except StorageError as e:
        print(f"ps-server verify: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 1 if damaged else 0


def build_export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ps-server export", description=export_main.__doc__, formatter_class=HelpFormatter)
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint directory (ps-worker checkpoint save)")
    p.add_argument("--out", required=True, help="directory to write export.json and the folder of .npy files it "
                   "names into. A second export into it while one runs is refused by a lock on it, which a file "
                   "system that keeps locks per machine (NFS) keeps from this machine's exports only: there, export "
                   "into one --out from one machine")  # fmt: skip
    p.add_argument("--since", type=integer(0), default=None, help="only rows pushed at this clock step or later")
    p.add_argument("--tables", default=None, help="comma-separated names of the tables to write, or fnmatch "
                   "patterns (deepfm,'dense.deepfm.*': one model of several); default: every table. A choice that leaves "
                   "out some tables of a model (tables that share their features) is warned about")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar of the rows read per table (when "
                   "stderr is no terminal, a plain progress line every 30 s takes the bar's place)")  # fmt: skip
    kept = p.add_mutually_exclusive_group()
    kept.add_argument("--move-checkpoint", action="store_true", help="move CHECKPOINT (on --out's filesystem) into the "
                   "export's folder, as checkpoint, before export.json is put in place, which names it there: the "
                   "export and its checkpoint appear together, and a later export into --out removes both (ps-worker "
                   "export --keep-checkpoint)")  # fmt: skip
    kept.add_argument("--remove-checkpoint", action="store_true", help="remove CHECKPOINT once the export is in "
                      "place; export.json names no checkpoint (ps-worker export without --keep-checkpoint). A kill "
                      "before that leaves it where it is")  # fmt: skip
    claim = p.add_mutually_exclusive_group()
    claim.add_argument("--claim-fd", type=int, metavar="FD", help="an open descriptor of --out by which the caller "
                       "holds the flock that claims it and passes it on: the export claims --out through it (ps-worker "
                       "export's, so that no other export takes --out between its checkpoint and this export)")  # fmt: skip
    claim.add_argument("--unclaimed", action="store_true", help="the caller found that no lock on --out can be had "
                       "(a file system that refuses flock) and said so, reporting what killed exports left there "
                       "(ps-worker export's): the flock is still tried, and where it fails the export goes ahead holding none, "
                       "saying nothing of it again")  # fmt: skip
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out: the new one takes its "
                   "place whole once written, and the earlier one's .npy files are removed then (a failure leaves it "
                   "as it was); without it such a directory is an error")  # fmt: skip
    return p


def export_main(argv: list[str]) -> int:
    """`ps-server export CHECKPOINT --out DIR`: writes the model in a checkpoint for serving: `export.json`, and the
    folder it names ("dir") holding per table `<table>.ids.npy` (uint64) and `<table>.rows.npy` (float32 (n, dim),
    embeddings only), admitted rows only. Reads the checkpoint's files; no server needs to run. Exit 0, or 2 with a
    message (143: stopped by SIGTERM, its temporary files removed)."""
    args = _parse(build_export_parser(), argv)
    with sigterm_raises():  # a stop removes the read-only view and the temporary files (ps.terminate)
        return _export(args)


def _export(args: argparse.Namespace) -> int:
    from ps.checkpoint import read_manifest, table_patterns
    from ps.engine.restore import export, left_out_of_models

    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        print(f"ps-server export: error: --out {args.out} exists and is not a directory", file=sys.stderr)
        return 2
    try:
        tables = None if args.tables is None else table_patterns(args.tables)
        specs = read_manifest(args.checkpoint)["tables"] if tables else []  # read before --move-checkpoint
        summary = export(args.checkpoint, args.out, args.since, progress=not args.no_progress, tables=tables,
                         move_checkpoint=args.move_checkpoint, overwrite=args.overwrite,
                         remove_checkpoint=args.remove_checkpoint, claim_fd=args.claim_fd,
                         unclaimed=args.unclaimed)  # fmt: skip
    except (StorageError, OSError, ValueError) as e:
        print(f"ps-server export: error: {e}", file=sys.stderr)
        return 2
    for line in left_out_of_models(specs, [t for t in specs if t["name"] in summary["tables"]]):
        print(f"ps-server export: warning: --tables leaves out {line}: this export holds only part of that model",
              file=sys.stderr)  # fmt: skip
    if args.since is not None and args.since > summary["checkpoint_clock"]:
        print(f"ps-server export: warning: --since {args.since:,} is past the checkpoint's clock "
              f"({summary['checkpoint_clock']:,}): no row was pushed at or after it, so every table is empty",
              file=sys.stderr)  # fmt: skip
    if args.json:
        print(json.dumps(summary))
    else:
        what = "rows" if args.since is None else f"rows pushed at step >= {args.since}"
        tables = ", ".join(f"{k} {v['rows']:,} x {v['dim']}" for k, v in summary["tables"].items())
        delta = (f"; the next delta's --since: {summary['clock']}" if summary["clock"] != summary["checkpoint_clock"]
                 else "")  # fmt: skip
        folder = os.path.join(args.out, summary["dir"])  # named by OUT/export.json: readers read that first
        print(f"exported the model at clock {summary['checkpoint_clock']} to {folder} ({what}; named by "
              f"{os.path.join(args.out, 'export.json')}): {tables}{delta}")  # fmt: skip
    return 0


COMMAND_PARSERS = {
    "export": build_export_parser, "size": build_size_parser, "verify": build_verify_parser,
    "health": build_health_parser,
}  # fmt: skip
"""Each command's parser (flags only: no environment variable or --config file applies to them)."""


def _given_settings(args: argparse.Namespace) -> str:
    """The flags whose values differ from their built-in defaults (from the command line, PS_* variables or
    --config alike), as a command line would give them: a token file's path, never a token."""
    out = []
    for action in build_parser()._actions:  # a new parser: its defaults are the built-in ones
        if not action.option_strings or action.dest in ("help", "config"):
            continue
        value = getattr(args, action.dest, None)
        if value != action.default:
            out.append(action.option_strings[-1] if value is True else f"{action.option_strings[-1]} {value}")
    return " ".join(out) or "none"


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parser.parse_args(argv), naming a mistyped flag before a missing required one (settings.unknown_arguments);
    an abbreviated flag is refused, as in every command (settings.apply_defaults)."""
    parser.allow_abbrev = False
    _, rest = unknown_arguments(parser, argv)
    if rest:
        parser.error(unrecognized(parser, rest))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """ps-server and its commands; the exit code. Once its arguments are read, a SIGTERM before the server's own
    handler is in place (its imports, ps.server.serve) or during `export` or `verify` ends the program with its
    cleanups run (a read-only view's temporary folder, an export's temporary files), 'ps-server: terminated' and
    EXIT_CODE (143): with no handler a process dies at once, or, as PID 1 of a container without an init, ignores
    the signal. (sigterm_raises imports numba for its guard: not before `--help`.)"""
    return exit_code("ps-server", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"export": export_main, "size": size_main, "verify": verify_main, "health": health_main}
    if argv[:1] and argv[0] in commands:
        try:
            return commands[argv[0]](argv[1:])
        except BrokenPipeError:
            return reader_gone()
    parser = build_parser()
    if argv and not argv[0].startswith("-"):  # a mistyped command would otherwise be told to give --data-dir
        parser.error(f"unknown command {argv[0]!r}: the commands are {', '.join(COMMANDS)}; without one, "
                     "ps-server runs a shard (flags only)")  # fmt: skip
    warn_unknown_environment(parser.prog)
    try:
        apply_defaults(parser, argv, section="server")
    except ValueError as e:
        parser.error(str(e))
    args = _parse(parser, argv)
    with sigterm_raises():  # until serve() puts its own handler in place (ps.terminate; main() says it)
        return _run_server(args)


def _run_server(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.memory_bytes is not None:
        tune_malloc(BOUNDED_TRIM_THRESHOLD, BOUNDED_MMAP_THRESHOLD)
    else:
        tune_malloc()
    config = ServerConfig(
        data_dir=args.data_dir,
        shard_id=args.shard_id,
        num_shards=args.num_shards,
        host=args.host,
        port=args.port,
        threads=args.threads,
        max_queued_calls=args.max_queued_calls,
        reply_bytes=args.reply_bytes,
        reply_read_timeout_s=args.reply_read_timeout_s,
        sync=args.sync,
        cache_bytes=args.cache_bytes,
        memory_bytes=args.memory_bytes,
        read_threads=args.read_threads,
        flush_interval_s=args.flush_interval_s,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        auth_token_file=args.auth_token_file,
        read_token_file=args.read_token_file,
        restore_dir=args.restore,
        metrics_port=args.metrics_port,
        direct_reads=args.direct_reads,
        mmap_reads=args.mmap_reads,
        accept_journal_loss=args.accept_journal_loss,
        checkpoint_root=args.checkpoint_root,
        cluster=args.cluster,
        verify_on_start=args.verify_on_start,
    )
    logging.getLogger("ps.server").info("settings (defaults left out): %s", _given_settings(args))
    try:
        config.validate()
        plan = plan_memory(config.memory_bytes, config.cache_bytes)
        logging.getLogger("ps.server").info(plan.describe())
        check_reply_bytes(reply_room_bytes(config.reply_bytes, config.memory_bytes), plan.request_bytes)
        limit, whose = memory_limit()
        for flag, size in (("--memory-bytes", config.memory_bytes), ("--cache-bytes", config.cache_bytes)):
            if size is not None and size > limit:
                logging.getLogger("ps.server").warning(
                    "%s %.1f GiB is more than %s %.1f GiB: the server will not be held to it, and the RAM tier may "
                    "grow until the machine swaps or the kernel kills the server", flag, size / 2**30, whose,
                    limit / 2**30)  # fmt: skip
        from ps.server import serve  # imported late: `--help` stays fast

        serve(config, stop_with_stdin=args.stop_with_stdin)
    except (ValueError, PsError, OSError) as e:  # PsError: StorageError, DiskFullError (a replay's flush), ...
        print(f"ps-server: error: {e}", file=sys.stderr)
        return 2
    return 0


CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v2, v1


def memory_limit(cgroup_files: tuple[str, ...] = CGROUP_LIMITS) -> tuple[int, str]:
    """(bytes, whose) of the memory this process may use: the machine's RAM, or its container's (cgroup) memory
    limit where that is lower (a pod's limits.memory, docker --memory)."""
    limit, whose = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this machine's RAM of"
    for path in cgroup_files:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < limit:  # "max", or v1's huge number when unlimited, leaves the RAM
            return int(text), "this container's memory limit (cgroup) of"
    return limit, whose


if __name__ == "__main__":
    sys.exit(main())

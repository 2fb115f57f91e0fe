"""`ps-server size`, `health`, `verify` and `export`: their parsers, and their runs (a table's RAM and disk printed;
a shard's health asked; a data dir or checkpoint checked; a checkpoint's embeddings written as .npy)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from ps.config import FULL_AT_REST, MAX_DIM, VALUES_AT_REST
from ps.errors import StorageError
from ps.flagtypes import HelpFormatter, address, integer, number, whole_number
from ps.settings import unknown_arguments, unrecognized
from ps.terminate import sigterm_raises


def parse_strictly(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parser.parse_args(argv), naming a mistyped flag before a missing required one (settings.unknown_arguments);
    an abbreviated flag is refused, as in every command (settings.apply_defaults)."""
    parser.allow_abbrev = False
    _, rest = unknown_arguments(parser, argv)
    if rest:
        parser.error(unrecognized(parser, rest))
    return parser.parse_args(argv)


def build_size_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ps-server size",
        description="Print the RAM and disk a table needs, per id and per server, from the row layout the "
        "server uses (ps/rows/layout.py), and the --cache-bytes, or the --memory-bytes alone, that holds its hot rows "
        "in each server's RAM tier. RocksDB overhead is the measured figure from benchmarks/scale.py.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--ids", type=whole_number(1, 2**64), required=True, help="number of distinct ids (1e9 is fine)")
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

    args = parse_strictly(build_size_parser(), argv)
    try:
        r = size_report(args.ids, args.dim, args.optimizer, args.servers, args.hot_fraction, args.values_at_rest)
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
                   "token (accepted, and checked, so that a probe can share its clients' flags; never sent)")  # fmt: skip
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
    args = parse_strictly(build_health_parser(), argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # stderr
    from ps.health import check_health  # imported late: grpc stays out of `--help`
    from ps.secretfiles import optional_token

    try:
        optional_token("--auth-token-file", args.auth_token_file)  # checked as a client checks it; not sent
        health = check_health(args.address, args.timeout_s, args.tls_ca, args.tls_cert, args.tls_key,
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
    cover, is found only so), and its rows against the manifest's counts. A long read logs its progress on stderr
    every 10 s (rows read of about how many, rate, time left), and how long it took."""
    args = parse_strictly(build_verify_parser(), argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # stderr
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
                   "export --keep-checkpoint). Through a symbolic link (a `latest`), the checkpoint it leads to is moved, not the "
                   "link")  # fmt: skip
    kept.add_argument("--remove-checkpoint", action="store_true", help="remove CHECKPOINT once the export is in "
                      "place; export.json names no checkpoint (ps-worker export without --keep-checkpoint). A kill "
                      "before that leaves it where it is. Through a symbolic link, the checkpoint it leads to is removed, not the "
                      "link")  # fmt: skip
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
    args = parse_strictly(build_export_parser(), argv)
    with sigterm_raises():  # a stop removes the read-only view and the temporary files (ps.terminate)
        return _export(args)


def _export(args: argparse.Namespace) -> int:
    from ps.checkpoint import pinned, table_patterns
    from ps.engine.export import export
    from ps.engine.exportout import left_out_of_models

    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        print(f"ps-server export: error: --out {args.out} exists and is not a directory", file=sys.stderr)
        return 2
    try:
        tables = None if args.tables is None else table_patterns(args.tables)
        read = pinned(args.checkpoint) if tables else None  # the manifest exported: read once, before a move
        specs = read[1]["tables"] if read else []
        summary = export(args.checkpoint, args.out, args.since, progress=not args.no_progress, tables=tables,
                         move_checkpoint=args.move_checkpoint, overwrite=args.overwrite,
                         remove_checkpoint=args.remove_checkpoint, claim_fd=args.claim_fd,
                         unclaimed=args.unclaimed, read=read)  # fmt: skip
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
        what = "rows" if args.since is None else f"rows pushed at step >= {args.since:,}"
        tables = ", ".join(f"{k} {v['rows']:,} x {v['dim']}" for k, v in summary["tables"].items())
        delta = (f"; the next delta's --since: {summary['clock']}" if summary["clock"] != summary["checkpoint_clock"]
                 else "")  # fmt: skip
        folder = os.path.join(args.out, summary["dir"])  # named by OUT/export.json: readers read that first
        print(f"exported the model at clock {summary['checkpoint_clock']:,} to {folder} ({what}; named by "
              f"{os.path.join(args.out, 'export.json')}): {tables}{delta}")  # fmt: skip
    return 0


COMMAND_PARSERS = {
    "export": build_export_parser, "size": build_size_parser, "verify": build_verify_parser,
    "health": build_health_parser,
}  # fmt: skip
"""Each command's parser (flags only: no environment variable or --config file applies to them)."""

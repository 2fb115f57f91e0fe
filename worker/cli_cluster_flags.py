"""The parsers of the cluster commands: `ps-worker stats`, `shrink`, `checkpoint save` and `export` (their runs:
worker/cli_cluster.py)."""

from __future__ import annotations

import argparse

from ps.config import DEFAULT_HOLD_S, MAX_HOLD_S
from ps.flagtypes import HelpFormatter, integer, number, table_name
from worker.cli_flags import SECONDS, SECONDS_OR_0, add_security_args


def add_cluster_parsers(sub: argparse._SubParsersAction) -> None:
    for name, help_text in (
        (
            "stats",
            "print what each shard holds: rows in RAM and on disk, pending ids, bytes, counters, its disk's use, the "
            "training job it follows; "
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
            p.add_argument("--table", type=table_name, default="", help="only this table (default: all)")
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
    p.add_argument("--record-positions", metavar="FILE", default=None, help="a training run's --resume-file "
                   "({worker} in its name: each worker's, worker 0's telling how many): the position each holds just "
                   "before the shards are held is recorded in the manifest, and a train --resume-file on servers restored "
                   "from the checkpoint says the --skip-examples that trains on from it")  # fmt: skip
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

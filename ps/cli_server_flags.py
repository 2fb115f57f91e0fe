"""ps-server's own parser, the flags of a running shard, and the argparse types of its sizes and seconds (its
commands' parsers: ps/cli_commands.py; the run: ps/cli_server.py)."""

from __future__ import annotations

import argparse

from ps.config import DEFAULT_REPLY_READ_TIMEOUT_S, MAX_INTERVAL_S
from ps.flagtypes import HelpFormatter, integer, number, size_flag
from ps.settings import LOG_LEVELS, add_config_flag

parse_bytes = size_flag(1)  # '512M' -> 536870912; plain numbers are bytes; a size of 1 byte or more
bound_bytes = size_flag(0)  # parse_bytes, or 0: no bound


seconds = number(0, MAX_INTERVAL_S, above=True)  # a finite number of seconds > 0 and <= MAX_INTERVAL_S


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

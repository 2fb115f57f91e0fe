"""A shard run from ps-server's parsed flags: the ServerConfig they make, the memory checks made before it serves,
and the settings line logged at start."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ps.accel.malloc import BOUNDED_MMAP_THRESHOLD, BOUNDED_TRIM_THRESHOLD, tune_malloc
from ps.bytesize import exact_bytes, human_bytes
from ps.cli_server_flags import bound_bytes, build_parser, parse_bytes
from ps.errors import PsError
from ps.replies import check_reply_bytes, reply_room_bytes
from ps.server_config import ServerConfig
from ps.storage.memory import plan_memory


def _given_settings(args: argparse.Namespace) -> str:
    """The flags whose values differ from their built-in defaults (from the command line, PS_* variables or
    --config alike), as a command line would give them, but for sizes, in ps.bytesize.exact_bytes' form ("--cache-bytes
    64.0 MiB"): a token file's path, never a token."""
    out = []
    for action in build_parser()._actions:  # a new parser: its defaults are the built-in ones
        if not action.option_strings or action.dest in ("help", "config"):
            continue
        value = getattr(args, action.dest, None)
        if value != action.default:
            shown = exact_bytes(value) if action.type in (parse_bytes, bound_bytes) else value
            out.append(action.option_strings[-1] if value is True else f"{action.option_strings[-1]} {shown}")
    return " ".join(out) or "none"


def run_server(args: argparse.Namespace) -> int:
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
                    "%s %s is more than %s %s: the server will not be held to it, and the RAM tier may grow until "
                    "the machine swaps or the kernel kills the server", flag, human_bytes(size), whose,
                    human_bytes(limit))  # fmt: skip
        from ps.server_run import serve  # imported late: `--help` stays fast

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

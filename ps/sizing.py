"""`ps-server size`: bytes per id in RAM and on disk, and per server, from the layout constants the code uses."""

from __future__ import annotations

import math

from ps.bytesize import human_bytes
from ps.config import FULL_AT_REST
from ps.flagtypes import SIZE_UNITS
from ps.rows.layout import KEY_BYTES, RAM_OVERHEAD_BYTES, half_floats_of, layout_of
from ps.server_config import ServerConfig
from ps.storage import memory
from ps.storage.budget import MIN_SHARE_ROWS, min_share_bytes
from ps.storage.memory import DEFAULT_JOURNAL_SEGMENT_BYTES, INFO_LOG_BYTES, KEEP_INFO_LOGS, MAX_WAL_BYTES

LOG_BYTES = (ServerConfig.journal_flush_bytes + DEFAULT_JOURNAL_SEGMENT_BYTES + MAX_WAL_BYTES
             + KEEP_INFO_LOGS * INFO_LOG_BYTES)  # fmt: skip
"""Disk a server's logs may take beside its rows, at most: the journal until a flush (--flush-interval-s, or once
it grew by journal_flush_bytes) plus the segment in use, RocksDB's write-ahead logs and its text logs."""


def size_report(
    ids: int, dim: int, optimizer: str, servers: int, hot_fraction: float, values_at_rest: str = FULL_AT_REST
) -> dict:
    """Figures for a table of `ids` rows spread over `servers`, with `hot_fraction` of its rows in RAM (at least
    the RAM tier a table may have: ps.storage.budget.min_share_bytes), whose embeddings RocksDB holds as
    values_at_rest (its rows on disk of the sizes ps.storage.rowformat's grammar writes: RowLayout.sizes_at_rest;
    in RAM float32 either way); the --memory-bytes that holds those rows is the one whose split
    (ps.storage.memory.plan_memory) leaves them the RAM tier. ValueError for an unknown optimizer or values_at_rest."""
    lay = layout_of(dim, optimizer, values_at_rest)
    per_server = -(-ids // servers)
    hot_rows = math.ceil(round(per_server * hot_fraction, 6))  # a part of a row is a row; 0.1 of 1000 is 100
    cache_bytes = max(hot_rows * lay.ram_bytes, min_share_bytes(lay.ram_bytes))
    return {
        "ids": ids,
        "dim": dim,
        "optimizer": optimizer,
        "values_at_rest": values_at_rest,
        "servers": servers,
        "parameters": ids * dim,
        "floats_per_row": lay.width,
        "ram_bytes_per_row": lay.ram_bytes,
        "disk_bytes_per_row": lay.disk_bytes,
        "raw_row_bytes": KEY_BYTES + lay.value_bytes,
        "disk_bytes_per_server": per_server * lay.disk_bytes,
        "log_bytes_per_server": LOG_BYTES,
        "ram_bytes_per_server_all_rows": per_server * lay.ram_bytes,
        "hot_rows_per_server": hot_rows,
        # at least the RAM tier a table may have (a server refuses a smaller --cache-bytes, CreateTable a smaller share)
        "cache_bytes_per_server_for_hot_fraction": cache_bytes,
        # --memory-bytes alone that leaves the RAM tier cache_bytes (and at least the least a server takes)
        "memory_bytes_per_server_for_hot_fraction": memory.smallest_memory_bytes(
            max(cache_bytes, memory.MIN_RAM_TIER_BYTES)
        ),
        "hot_fraction": hot_fraction,
        "ram_overhead_bytes_per_row": RAM_OVERHEAD_BYTES,
    }


def flag_size(n: int) -> str:
    """n bytes as a size flag takes them (ps.flagtypes.byte_size): in the largest unit n reaches, rounded up to a
    tenth of it, so that a flag given the text holds at least n bytes ("98.5M" for 103,200,000, which is 98.42 MiB)."""
    for unit, scale in sorted(SIZE_UNITS.items(), key=lambda kv: -kv[1]):
        if n >= scale:
            tenths = -(-n * 10 // scale)
            return f"{tenths // 10}{unit}" if tenths % 10 == 0 else f"{tenths // 10}.{tenths % 10}{unit}"
    return str(n)


def _floor_note(r: dict) -> str:
    """The note " (...)" where the --cache-bytes figure is the least RAM tier a table may have, more than its hot
    rows."""
    if r["cache_bytes_per_server_for_hot_fraction"] <= r["hot_rows_per_server"] * r["ram_bytes_per_row"]:
        return ""
    return f" (the least a table's RAM tier may be: {MIN_SHARE_ROWS} rows, or 1 MiB of rows over 4 KiB)"


def format_report(r: dict) -> str:
    """size_report's figures as `ps-server size` prints them: the row's makeup in RAM, and on disk where the table's
    values_at_rest makes it another (half_floats_of), then the bytes per id and per server."""
    half = half_floats_of(r["dim"], r["values_at_rest"])
    at_rest, on_disk = "", "the same"
    if half:
        at_rest = f" (values_at_rest {r['values_at_rest']!r})"
        on_disk = f"{half} float16 (embedding) + {r['floats_per_row'] - half} float32 (optimizer state + 4 statistics)"
    return "\n".join(
        [
            f"table: {r['ids']:,} ids x dim {r['dim']} ({r['parameters']:,} parameters), optimizer {r['optimizer']}, "
            f"{r['servers']} server{'s' * (r['servers'] != 1)}",
            f"row in RAM: {r['floats_per_row']} float32 (embedding + optimizer state + 4 statistics); "
            f"on disk{at_rest}: {on_disk} + 8-byte lsn",
            f"per id:      RAM {r['ram_bytes_per_row']} B    disk {r['disk_bytes_per_row']} B "
            f"(raw key+value {r['raw_row_bytes']} B)",
            f"per server:  disk {human_bytes(r['disk_bytes_per_server'])} (+ up to "
            f"{human_bytes(r['log_bytes_per_server'])} of journal, write-ahead and text logs, + free space for "
            "compaction)    RAM for every row "
            f"{human_bytes(r['ram_bytes_per_server_all_rows'])}",
            f"to hold the hottest {r['hot_fraction']:.0%} in RAM, give each server --cache-bytes "
            f"{flag_size(r['cache_bytes_per_server_for_hot_fraction'])}{_floor_note(r)}, or --memory-bytes "
            f"{flag_size(r['memory_bytes_per_server_for_hot_fraction'])} alone (the RAM tier, RocksDB's caches, the "
            "mapped journal and room for requests and sync steps; the process itself, an idle ps-server's RSS, on top)",
        ]
    )

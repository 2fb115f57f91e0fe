"""What a shard reports of itself beyond its tables: the line its server starts with, and the parts of Stats and
the metrics read from its memory plan, RocksDB, journal, request room, sync steps, restore and disk watch.

Each function reads the parts it names and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from ps.engine.jobs import JobClocks
from ps.engine.room import RequestRoom
from ps.engine.table import Table, rows_text
from ps.storage.diskspace import DiskWatch, low_bytes
from ps.storage.journal import Journal
from ps.storage.memory import MemoryPlan
from ps.storage.store import Store


def describe_start(store: Store, restored_from: str, tables: Mapping[str, Table], clock: int) -> str:
    """What the data dir held at start, for the server's first line: "new, no tables", or the tables with their
    rows and the clock (an operator who mistyped --data-dir sees "new" where a model was expected). restored_from:
    the checkpoint restored into the dir at this start, "" if none."""
    origin = "new" if store.created else "existing"
    if restored_from:
        origin = f"restored from {restored_from}"
    if not tables:
        return f"{origin}, no tables"
    listed = ", ".join(f"{name} {rows_text(t.num_rows)}" for name, t in sorted(tables.items()))
    return f"{origin}, tables {listed}, clock {clock:,}"


def restore_stats(store: Store) -> dict[str, str]:
    """The checkpoint the data dir was restored from (path and manifest sha256; empty: never restored)."""
    done = store.meta.restored() or {}
    return {"restored_from": done.get("checkpoint", ""), "restored_sha256": done.get("sha256", "")}


def health_stats(journal: Journal, disk_watch: DiskWatch) -> dict[str, int]:
    """For the metrics: the clients in the exactly-once table (ps.storage.applied), whether the disk was low at the
    flusher's last look (ps.storage.diskspace) and the free bytes under which it is low, from that look (0 before
    the first)."""
    last = disk_watch.last
    return {
        "clients": len(journal.applied),
        "disk_low": int(disk_watch.low),
        "disk_low_bytes": low_bytes(last.disk_total_bytes, last.data_dir_bytes) if last else 0,
    }


def memory_stats(
    memory: MemoryPlan, store: Store, journal: Journal, room: RequestRoom, jobs: JobClocks
) -> dict[str, int]:
    """The memory plan's bound and each part's use now (bytes; memory_budget_bytes 0: no overall bound)."""
    rocksdb = store.memory_usage()
    return {
        "memory_budget_bytes": memory.memory_bytes or 0,
        "block_cache_budget_bytes": memory.block_cache_bytes,
        "block_cache_used_bytes": rocksdb["block_cache"],
        "memtable_bytes": rocksdb["memtables"],
        "table_reader_bytes": rocksdb["table_readers"],
        "write_behind_bytes": store.write_behind_bytes,
        "journal_map_bytes": journal.mapped_bytes,
        "request_room_bytes": memory.request_bytes,
        "request_room_used_bytes": room.in_use,
        "request_room_waits": room.waits,
        "sync_steps_bytes": memory.sync_step_bytes,
        "sync_steps_held_bytes": jobs.sync_held_bytes,
    }

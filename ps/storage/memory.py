"""MemoryPlan: how one server's memory for data is split among the parts that hold it.

    part           holds                                                          with --memory-bytes M
    ram_tier       arena rows and their id index (--cache-bytes)                  what the others leave
    block_cache    RocksDB's data blocks, and its index and filter blocks          clamp(M / 8, 16 MiB, 128 MiB)
    memtables      RocksDB's write buffers: 2 column families x 2 buffers          4 x clamp(M / 64, 2 MiB, 16 MiB)
    write_behind   evicted rows waiting for their RocksDB write                   clamp(M / 32, 4 MiB, 32 MiB)
    journal_map    the journal segment mapped for appends                         clamp(M / 16, 16 MiB, 256 MiB)
    requests       room kept for the copies a request makes of its rows: the      clamp(M / 8, 16 MiB, 128 MiB)
                   rows read for its misses, an update's undo copy, the reply
    sync_steps     sync steps' contributions, held until every worker of the      clamp(M / 8, 16 MiB, 256 MiB)
                   step has pushed, and the copies their sum makes of them

With --memory-bytes, RocksDB keeps its index and filter blocks in the block cache (those of level-0 files pinned
there), so they are inside its bound; without it they live in RocksDB's table readers, about 2 bytes per row
outside any bound, the block cache is 128 MiB, and --cache-bytes is the RAM tier (2 GiB if not given).
Given both, --cache-bytes must fit in what --memory-bytes leaves. `requests` is taken by each pull and push for
its copies of rows and given back when it is done (ps.engine.room); worker.client sizes its messages by it.
`sync_steps` is taken by each contribution to a sync step, for it and its sum's copies, until the step ends
(ps.engine.syncsteps); a contribution that does not fit stops its job. Without --memory-bytes neither is bounded.
What is not data (the Python runtime, gRPC, compiled code) is outside the plan: `ps-server` started idle
shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ps.bytesize import bytes_apart, exact_bytes, human_bytes
from ps.rows.layout import layout_of
from ps.storage import budget

MiB = 1 << 20
DEFAULT_RAM_TIER_BYTES = 2 << 30
DEFAULT_BLOCK_CACHE_BYTES = 128 * MiB
DEFAULT_WRITE_BUFFER_BYTES = 16 * MiB
DEFAULT_WRITE_BEHIND_BYTES = 32 * MiB
DEFAULT_JOURNAL_SEGMENT_BYTES = 256 * MiB
MAX_WAL_BYTES = 256 * MiB  # RocksDB's write-ahead logs, at most (max_total_wal_size): disk, not memory
KEEP_INFO_LOGS = 8  # RocksDB's own text logs (LOG, LOG.old.*) kept in a data dir: disk, not memory
INFO_LOG_BYTES = 8 * MiB  # ... each rolled over at this size (max_log_file_size): at most 64 MiB of them
WRITE_BUFFERS = 2 * 2  # column families ("meta", "rows") x buffers each (max_write_buffer_number)
MIN_RAM_TIER_BYTES = 16 * MiB
REQUEST_SHARE = 8  # the `requests` part is 1/REQUEST_SHARE of --memory-bytes, clamped to MIN/MAX_REQUEST_BYTES
MIN_REQUEST_BYTES = 16 * MiB  # the smallest `requests` part
MAX_REQUEST_BYTES = 128 * MiB  # the largest `requests` part
MAX_SYNC_STEP_BYTES = 256 * MiB  # the largest `sync_steps` part


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of each part; memory_bytes None: no overall bound (the defaults)."""

    memory_bytes: int | None
    ram_tier_bytes: int
    block_cache_bytes: int
    write_buffer_bytes: int  # one memtable
    write_behind_bytes: int
    journal_segment_bytes: int
    request_bytes: int = 0  # room for requests' copies of rows (none without an overall bound)
    sync_step_bytes: int = 0  # room for sync steps' contributions and their sums (none without an overall bound)
    cache_given: bool = True  # False: --memory-bytes without --cache-bytes, the RAM tier is what the others leave

    @property
    def memtable_bytes(self) -> int:
        return WRITE_BUFFERS * self.write_buffer_bytes

    @property
    def bounded(self) -> bool:
        """Whether RocksDB's index and filter blocks go into the block cache (inside the plan)."""
        return self.memory_bytes is not None

    def parts(self) -> dict[str, int]:
        return {
            "ram_tier": self.ram_tier_bytes,
            "block_cache": self.block_cache_bytes,
            "memtables": self.memtable_bytes,
            "write_behind": self.write_behind_bytes,
            "journal_map": self.journal_segment_bytes,
            "requests": self.request_bytes,
            "sync_steps": self.sync_step_bytes,
        }

    def ram_tier_source(self) -> str:
        """How the RAM tier got its size, for messages: "--cache-bytes N", or what --memory-bytes leaves."""
        if self.bounded and not self.cache_given:
            return f"{exact_bytes(self.ram_tier_bytes)}, what --memory-bytes {human_bytes(self.memory_bytes)} leaves it"
        return f"--cache-bytes {exact_bytes(self.ram_tier_bytes)}"

    def raise_ram_tier_to(self, need_bytes: int) -> tuple[str, str]:
        """(what to change so that the RAM tier holds need_bytes, in words; the flags those words raise,
        ram_tier_budget's): a MemoryBudget's raise_to."""
        budget = self.ram_tier_budget(need_bytes)
        if budget == "cache":
            return f"raise --cache-bytes to at least {exact_bytes(need_bytes)}", budget
        least = smallest_memory_bytes(need_bytes) // MiB
        if budget == "memory":
            words = f"raise --memory-bytes to at least {least}M, which leaves the RAM tier {exact_bytes(need_bytes)}"
        else:
            words = f"raise --cache-bytes to at least {exact_bytes(need_bytes)} and --memory-bytes to at least {least}M"
        return words, budget

    def ram_tier_budget(self, need_bytes: int) -> str:
        """The flags to raise so that the RAM tier holds need_bytes (ps.errors.RAM_TIER_BUDGETS): "cache", the
        flag that set it; "memory", where the tier is what --memory-bytes leaves; "cache+memory", --cache-bytes and
        --memory-bytes too, where the larger tier would not fit in it."""
        if not self.bounded:
            return "cache"
        if not self.cache_given:
            return "memory"
        return "cache+memory" if smallest_memory_bytes(need_bytes) > self.memory_bytes else "cache"

    def describe(self) -> str:
        """The plan as the server logs it at start, every part in MiB (_in_mib: they add up to the bound). Without a
        bound, requests and sync steps take no room: they are unbounded."""
        sizes = {**self.parts(), **({} if self.bounded else {"requests": "unbounded", "sync_steps": "unbounded"})}
        parts = ", ".join(f"{name} {size if isinstance(size, str) else _in_mib(size)}" for name, size in sizes.items())
        head = f"memory {_in_mib(self.memory_bytes)}" if self.bounded else "memory unbounded"
        return f"{head}: {parts}"


def _in_mib(n: int) -> str:
    """n bytes in MiB to a tenth, as human_bytes shows MiB ('80.0 MiB'), but in MiB at any size ('2,048.0 MiB'):
    for the parts of one bound, listed with their sum or with what they leave, which a reader adds up only if
    they share a unit. Every other byte count here is human_bytes."""
    return f"{n / MiB:,.1f} MiB"


def smallest_ram_tier_bytes() -> int:
    """The least RAM tier any table can use: the floor of one table's share (ps.storage.budget) for the narrowest
    row there is (dim 1, sgd)."""
    return budget.min_share_bytes(layout_of(1, "sgd").ram_bytes)


def check_ram_tier(cache_bytes: int) -> None:
    """ValueError, saying what a table needs, when --cache-bytes is under what the narrowest table can use: such a
    server would start and refuse every CreateTable."""
    floor = smallest_ram_tier_bytes()
    if cache_bytes < floor:
        typical = budget.min_share_bytes(layout_of(16, "adagrad").ram_bytes)
        given, least = bytes_apart(cache_bytes, floor)
        raise ValueError(
            f"--cache-bytes {given} is less than any table can use: a table's RAM tier must hold "
            f"{budget.MIN_SHARE_ROWS} rows ({least} for the narrowest, dim 1 with sgd; "
            f"{human_bytes(typical)} for dim 16 with adagrad, times the number of tables); give a larger --cache-bytes"
        )


def _fixed_parts(memory_bytes: int) -> MemoryPlan:
    """The parts other than the RAM tier under --memory-bytes (ram_tier_bytes 0)."""
    m = memory_bytes
    return MemoryPlan(m, 0, _clamp(m // 8, 16 * MiB, DEFAULT_BLOCK_CACHE_BYTES),
                      _clamp(m // 64, 2 * MiB, DEFAULT_WRITE_BUFFER_BYTES),
                      _clamp(m // 32, 4 * MiB, DEFAULT_WRITE_BEHIND_BYTES),
                      _clamp(m // 16, 16 * MiB, DEFAULT_JOURNAL_SEGMENT_BYTES),
                      request_room_bytes(m),
                      _clamp(m // 8, 16 * MiB, MAX_SYNC_STEP_BYTES))  # fmt: skip


def request_room_bytes(memory_bytes: int | None) -> int:
    """The `requests` part of --memory-bytes; 0 without it (requests take no room)."""
    return 0 if memory_bytes is None else _clamp(memory_bytes // REQUEST_SHARE, MIN_REQUEST_BYTES, MAX_REQUEST_BYTES)


def _left_for_ram_tier(memory_bytes: int) -> int:
    return memory_bytes - sum(_fixed_parts(memory_bytes).parts().values())


def smallest_memory_bytes(ram_tier_bytes: int) -> int:
    """The least --memory-bytes, in whole MiB, that leaves ram_tier_bytes for the RAM tier. What the other parts
    take grows by at most 17/32 of each byte added (the sum of their fractions), so what is left never falls as
    --memory-bytes grows and a bisection finds it."""
    low, high = 0, max(1, -(-ram_tier_bytes // MiB)) * 2 + 1024  # in MiB; high always leaves enough
    while low < high:
        mid = (low + high) // 2
        if _left_for_ram_tier(mid * MiB) >= ram_tier_bytes:
            high = mid
        else:
            low = mid + 1
    return low * MiB


def plan_memory(memory_bytes: int | None, cache_bytes: int | None) -> MemoryPlan:
    """The plan for --memory-bytes and --cache-bytes (either may be None). ValueError, naming the parts and the
    least --memory-bytes that would do, when --cache-bytes does not fit in --memory-bytes or is under what any
    table can use (check_ram_tier), or --memory-bytes leaves the RAM tier under MIN_RAM_TIER_BYTES."""
    if cache_bytes is not None:
        check_ram_tier(cache_bytes)
    if memory_bytes is None:
        return MemoryPlan(None, cache_bytes if cache_bytes is not None else DEFAULT_RAM_TIER_BYTES,
                          DEFAULT_BLOCK_CACHE_BYTES, DEFAULT_WRITE_BUFFER_BYTES, DEFAULT_WRITE_BEHIND_BYTES,
                          DEFAULT_JOURNAL_SEGMENT_BYTES)  # fmt: skip
    m = memory_bytes
    fixed = _fixed_parts(m)
    others = sum(fixed.parts().values())
    left = m - others
    # the parts, what they take together and what they leave the RAM tier: in one unit (_in_mib), to add up
    detail = ", ".join(f"{name} {_in_mib(size)}" for name, size in fixed.parts().items() if name != "ram_tier")
    if cache_bytes is not None:
        if cache_bytes > left:
            given, leaving = bytes_apart(cache_bytes, max(left, 0), form_b=_in_mib)
            raise ValueError(
                f"--cache-bytes {given} does not fit in --memory-bytes {human_bytes(m)}: "
                f"{detail} take {_in_mib(others)}, leaving {leaving} for the RAM tier; "
                f"give --memory-bytes {smallest_memory_bytes(cache_bytes) // MiB}M or more, or a smaller "
                "--cache-bytes (or leave it out: it takes what is left)"
            )
        left = cache_bytes
    elif left < MIN_RAM_TIER_BYTES:
        leaving, least = bytes_apart(max(left, 0), MIN_RAM_TIER_BYTES, _in_mib, _in_mib)
        raise ValueError(
            f"--memory-bytes {human_bytes(m)} is too small: {detail} take {_in_mib(others)}, leaving "
            f"{leaving} for the RAM tier (at least {least}); "
            f"give --memory-bytes {smallest_memory_bytes(MIN_RAM_TIER_BYTES) // MiB}M or more"
        )
    return MemoryPlan(m, left, fixed.block_cache_bytes, fixed.write_buffer_bytes, fixed.write_behind_bytes,
                      fixed.journal_segment_bytes, fixed.request_bytes, fixed.sync_step_bytes,
                      cache_bytes is not None)  # fmt: skip

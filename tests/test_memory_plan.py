"""--memory-bytes (ps.storage.memory): the split of one bound over the parts that hold data, the refusals, and a
server that reports each part."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from ps.config import TableConfig
from ps.engine.shard import Shard
from ps.server_config import ServerConfig
from ps.storage.memory import (
    DEFAULT_BLOCK_CACHE_BYTES,
    MIN_RAM_TIER_BYTES,
    MiB,
    plan_memory,
    smallest_memory_bytes,
    smallest_ram_tier_bytes,
)


@pytest.mark.parametrize("memory", [96 * MiB, 256 * MiB, 640 * MiB, 8 << 30])
def test_the_parts_add_up_to_the_bound(memory):
    plan = plan_memory(memory, None)
    assert sum(plan.parts().values()) == memory
    assert plan.ram_tier_bytes >= MIN_RAM_TIER_BYTES and plan.bounded
    assert plan.block_cache_bytes <= DEFAULT_BLOCK_CACHE_BYTES


def test_a_given_cache_must_fit_and_keeps_its_size():
    plan = plan_memory(640 * MiB, 256 * MiB)
    assert plan.ram_tier_bytes == 256 * MiB and sum(plan.parts().values()) <= 640 * MiB
    with pytest.raises(ValueError, match=r"--cache-bytes 1\.00 GiB does not fit in --memory-bytes 640\.0 MiB"):
        plan_memory(640 * MiB, 1 << 30)
    with pytest.raises(
        ValueError,
        match=r"--memory-bytes 80\.0 MiB is too small: .* requests 16\.0 MiB, sync_steps 16\.0 MiB take 76\.0 MiB, "
        r"leaving 4\.0 MiB ",
    ):
        plan_memory(80 * MiB, None)


def _fits(memory: int, cache: int | None) -> bool:
    try:
        plan_memory(memory, cache)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("cache", [None, 5 * MiB, 16 * MiB, 100 * MiB + 1, 256 * MiB, 1 << 30, 3 << 30])
def test_the_refusal_names_the_least_memory_that_fits(cache):
    """The oracle is plan_memory itself, tried MiB by MiB: the size the error names fits, one MiB less does not,
    and the error says it."""
    least = smallest_memory_bytes(cache if cache is not None else MIN_RAM_TIER_BYTES)
    assert least % MiB == 0 and _fits(least, cache) and not _fits(least - MiB, cache)
    first = next(m for m in range(1, 8192) if _fits(m * MiB, cache))
    assert first * MiB == least
    with pytest.raises(ValueError, match=rf"give --memory-bytes {least // MiB}M or more"):
        plan_memory(least - MiB, cache)


def test_without_a_bound_the_defaults_hold():
    plan = plan_memory(None, None)
    assert (plan.ram_tier_bytes, plan.block_cache_bytes, plan.bounded) == (2 << 30, DEFAULT_BLOCK_CACHE_BYTES, False)
    assert plan_memory(None, 5 * MiB).ram_tier_bytes == 5 * MiB
    # the start's log line: unbounded requests and sync steps are not "0 bytes" (as if they had no room)
    assert plan.describe().startswith("memory unbounded: ram_tier 2,048.0 MiB, ") and plan.describe().endswith(
        ", requests unbounded, sync_steps unbounded"
    )
    bounded = plan_memory(256 * MiB, None)
    assert bounded.describe().endswith(
        f", requests {bounded.request_bytes // MiB}.0 MiB, sync_steps {bounded.sync_step_bytes // MiB}.0 MiB"
    )


@pytest.mark.parametrize("memory", [96 * MiB, 1000 * MiB + 12345, 8 << 30])
def test_the_logged_parts_add_up_to_the_bound_in_one_unit(memory):
    """The start's log line shows every part in MiB, above 1,000 MiB too, so a reader sees them add up: the figures
    printed sum to the bound printed, within their rounding (half a tenth each)."""
    head, parts = plan_memory(memory, None).describe().split(": ", 1)
    figures = [float(p.rsplit(" ", 2)[1].replace(",", "")) for p in parts.split(", ")]
    assert all(p.endswith(" MiB") for p in parts.split(", ")) and head.endswith(" MiB")
    total = float(head.split()[1].replace(",", ""))
    assert abs(sum(figures) - total) <= 0.05 * (len(figures) + 1), (head, parts)


def test_a_bounded_shard_uses_the_plan_and_reports_every_part(tmp_path):
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), memory_bytes=256 * MiB))
    try:
        plan = plan_memory(256 * MiB, None)
        shard.create_table(TableConfig(name="t", dim=4))
        assert shard.stats()["journal_map_bytes"] == 0  # no segment mapped before the first push
        ids = np.arange(1000, dtype=np.uint64)
        shard.push_batch([("t", ids, np.ones((1000, 4), np.float32), np.ones(1000, np.float32),
                           np.zeros(1000, np.float32))])  # fmt: skip
        assert shard.stats()["journal_map_bytes"] == plan.journal_segment_bytes  # the segment the push went to
        shard.flush()
        shard.store.flush()
        shard.pull("t", ids)
        s = shard.stats()
        assert s["memory_budget_bytes"] == 256 * MiB and s["ram_budget_bytes"] == plan.ram_tier_bytes
        assert s["block_cache_budget_bytes"] == plan.block_cache_bytes
        assert 0 < s["block_cache_used_bytes"] <= plan.block_cache_bytes  # index and filter blocks are cached
        assert s["table_reader_bytes"] >= 0 and s["memtable_bytes"] > 0 and s["write_behind_bytes"] == 0
        assert s["request_room_bytes"] == plan.request_bytes > 0
        assert s["sync_steps_bytes"] == plan.sync_step_bytes == 32 * MiB and s["sync_steps_held_bytes"] == 0
    finally:
        shard.close()


def test_the_server_refuses_a_cache_that_does_not_fit(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ps", "--data-dir", str(tmp_path / "d"), "--memory-bytes", "256M",
                           "--cache-bytes", "1G"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--cache-bytes 1.00 GiB does not fit in --memory-bytes 256.0 MiB" in done.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was created


def _refusal(memory: int | None, cache: int | None) -> str:
    with pytest.raises(ValueError) as refused:
        plan_memory(memory, cache)
    return str(refused.value)


def test_a_refusal_one_byte_short_shows_two_figures_apart():
    """A value one byte under its limit is refused with the two figures told apart (exact counts where the rounded
    ones would read the same), never as 'X is less than X'."""
    floor = smallest_ram_tier_bytes()
    text = _refusal(None, floor - 1)
    given, least = re.search(r"--cache-bytes (.+?) is less .*? rows \((.+?) for the narrowest", text).groups()
    assert (given, least) == (f"{floor - 1:,} bytes", f"{floor:,} bytes")
    left = plan_memory(256 * MiB, None).ram_tier_bytes
    text = _refusal(256 * MiB, left + 1)
    given, leaving = re.search(r"--cache-bytes (.+?) does not fit .*, leaving (.+?) for the RAM tier", text).groups()
    assert (given, leaving) == (f"{left + 1:,} bytes", f"{left:,} bytes")
    memory = smallest_memory_bytes(MIN_RAM_TIER_BYTES) - 1  # leaves the RAM tier one byte under its least
    text = _refusal(memory, None)
    leaving, least = re.search(r"leaving (.+?) for the RAM tier \(at least (.+?)\)", text).groups()
    assert (leaving, least) == (f"{MIN_RAM_TIER_BYTES - 1:,} bytes", f"{MIN_RAM_TIER_BYTES:,} bytes")
    assert "--cache-bytes 20.0 KiB is less" in _refusal(None, 20 * 1024)  # figures that read apart keep their form


def test_a_ram_tier_refusal_names_its_flags_in_words_and_in_its_budget_field():
    """raise_ram_tier_to's words and flags (RamTierTooSmallError.budget, ram_tier_budget's) name the same flags: the
    --cache-bytes that set the tier; --memory-bytes where the tier is what it leaves; both where a --cache-bytes
    large enough would not fit in --memory-bytes."""
    need = 512 * MiB
    cases = [
        (plan_memory(None, 64 * MiB), "cache", "raise --cache-bytes to at least 512.0 MiB"),
        (plan_memory(640 * MiB, None), "memory", "raise --memory-bytes to at least "),
        (plan_memory(640 * MiB, 64 * MiB), "cache+memory", "raise --cache-bytes to at least 512.0 MiB and --memory"),
        (plan_memory(8 << 30, 64 * MiB), "cache", "raise --cache-bytes to at least 512.0 MiB"),
    ]
    for plan, budget, words in cases:
        said, flags = plan.raise_ram_tier_to(need)
        assert plan.ram_tier_budget(need) == flags == budget
        assert said.startswith(words) and ("--memory-bytes" in said) == ("memory" in budget), said

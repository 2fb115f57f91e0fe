"""The disk under a data dir: measure against a du-like oracle and statvfs, the low-disk warning's threshold, its
repetition and recovery (a fake measure, no real disk filled), and the flusher that polls it."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import grpc
import numpy as np

from protos import ps_pb2, ps_pb2_grpc
from ps.config import TableConfig
from ps.engine.shard import Shard
from ps.server_config import ServerConfig
from ps.storage import diskspace
from ps.storage.diskspace import CHECK_S, REPEAT_S, DiskSpace, DiskWatch, low_bytes, measure
from worker.client import Client

GiB = 1 << 30


def du(path) -> int:
    """The oracle: st_size of every regular file under path, by a walk of its own."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def test_measure_counts_every_file_under_the_dir_and_reads_the_file_system(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "x").write_bytes(b"1" * 1000)
    (tmp_path / "a" / "y").write_bytes(b"2" * 4097)
    (tmp_path / "a" / "b" / "z").write_bytes(b"")
    space = measure(str(tmp_path))
    fs = os.statvfs(tmp_path)
    assert space.data_dir_bytes == du(tmp_path) == 5097
    assert space.disk_total_bytes == fs.f_blocks * fs.f_frsize
    assert abs(space.disk_free_bytes - fs.f_bavail * fs.f_frsize) < 512 << 20  # the other test process writes meanwhile
    assert 0 < space.disk_free_bytes <= space.disk_total_bytes


def test_the_threshold_is_the_largest_of_5_percent_2_gib_and_a_tenth_of_the_data_dir():
    assert low_bytes(1000 * GiB, 1 * GiB) == 50 * GiB  # 5% of a large disk
    assert low_bytes(20 * GiB, 1 * GiB) == 2 * GiB  # the floor: the logs
    assert low_bytes(1000 * GiB, 800 * GiB) == 80 * GiB  # a compaction's output
    assert low_bytes(4 * GiB, 0) == 1 * GiB  # a small disk: a quarter of it, not all of it


def watched(monkeypatch, free_gib: list[float], total_gib: float = 100, dir_gib: float = 1):
    """A DiskWatch on a fake disk whose free space is free_gib[0] (change it to change the disk), and a fake
    clock: returns (watch, advance(seconds))."""
    now = [1000.0]

    def fake_measure(data_dir):
        return DiskSpace(int(dir_gib * GiB), int(free_gib[0] * GiB), int(total_gib * GiB))

    monkeypatch.setattr(diskspace, "measure", fake_measure)
    watch = DiskWatch("/data/shard-0", clock=lambda: now[0])

    def advance(seconds: float) -> None:
        now[0] += seconds

    return watch, advance


def records(caplog) -> list[tuple[int, str]]:
    out = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ps.storage.diskspace"]
    caplog.clear()
    return out


def test_low_disk_warns_once_when_crossed_then_every_few_minutes_and_says_when_it_recovers(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="ps.storage.diskspace")
    free = [20.0]  # of 100 GiB: the threshold is 5 GiB
    watch, advance = watched(monkeypatch, free)
    watch.poll()
    assert records(caplog) == [] and not watch.low
    free[0] = 4.5
    advance(CHECK_S)
    watch.poll()
    [(level, text)] = records(caplog)
    assert level == logging.WARNING and watch.low
    assert text == (
        "low disk space: 4.50 GiB free of 100.00 GiB (4.5%) on the disk of data dir /data/shard-0, which holds "
        "1.00 GiB; below 5.00 GiB, pushes and flushes will fail once it is full (RESOURCE_EXHAUSTED): free space, "
        "grow the disk, or move the shard (ps-server size predicts a table's bytes)"
    )
    for _ in range(int(REPEAT_S // CHECK_S) - 1):  # still low, checked every CHECK_S: no repeat yet
        advance(CHECK_S)
        watch.poll()
    assert records(caplog) == []
    advance(CHECK_S)
    watch.poll()
    assert [level for level, _ in records(caplog)] == [logging.WARNING]  # REPEAT_S after the first
    free[0] = 5.2  # above the line, but within the margin: still low, no flapping
    advance(CHECK_S)
    watch.poll()
    assert records(caplog) == [] and watch.low
    free[0] = 30.0
    advance(CHECK_S)
    watch.poll()
    assert records(caplog) == [
        (logging.INFO, "disk space recovered: 30.00 GiB free of 100.00 GiB on the disk of data dir /data/shard-0 "
         "(low below 5.00 GiB)")
    ]  # fmt: skip
    assert not watch.low
    free[0] = 1.0  # low again: warned at once, not REPEAT_S after the last warning
    advance(CHECK_S)
    watch.poll()
    assert [level for level, _ in records(caplog)] == [logging.WARNING]


def test_a_poll_within_check_s_measures_nothing(monkeypatch, caplog):
    free = [1.0]
    watch, advance = watched(monkeypatch, free)
    calls = []
    monkeypatch.setattr(diskspace, "measure", lambda d: calls.append(d) or DiskSpace(0, GiB, 100 * GiB))
    watch.poll()
    advance(CHECK_S / 2)
    watch.poll()
    assert calls == ["/data/shard-0"]
    advance(CHECK_S / 2)
    watch.poll()
    assert len(calls) == 2


def test_the_flusher_polls_the_disk_and_the_metrics_show_it_low(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="ps.storage.diskspace")
    monkeypatch.setattr(diskspace, "CHECK_S", 0.0)
    free = [50.0]
    monkeypatch.setattr(diskspace, "measure", lambda d: DiskSpace(GiB, int(free[0] * GiB), 100 * GiB))
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), flush_interval_s=0.05))
    try:
        assert shard.health_stats()["disk_low"] == 0 and shard.health_stats()["disk_low_bytes"] == 5 * GiB
        free[0] = 1.0
        deadline = time.monotonic() + 30
        while not shard.health_stats()["disk_low"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shard.health_stats()["disk_low"] == 1
        free[0] = 50.0
        while shard.health_stats()["disk_low"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shard.health_stats()["disk_low"] == 0
    finally:
        shard.close()
    levels = [r.levelno for r in caplog.records if r.name == "ps.storage.diskspace"]
    assert levels == [logging.WARNING, logging.INFO]  # polled many times while low: warned once


def test_the_disk_is_watched_every_check_s_even_when_flushes_are_minutes_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(diskspace, "CHECK_S", 0.1)
    free = [50.0]
    monkeypatch.setattr(diskspace, "measure", lambda d: DiskSpace(GiB, int(free[0] * GiB), 100 * GiB))
    shard = Shard(ServerConfig(data_dir=str(tmp_path / "d"), flush_interval_s=600.0))
    try:
        free[0] = 1.0
        deadline = time.monotonic() + 20
        while not shard.health_stats()["disk_low"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shard.health_stats()["disk_low"] == 1  # seen within seconds, not at the flush 10 minutes on
    finally:
        shard.close()


def test_stats_reports_the_data_dirs_bytes_and_its_disks_space(servers):
    addresses, shards = servers(2)
    with Client(addresses) as client:
        client.create_table(TableConfig("t", 8))
        client.push("t", np.arange(5000, dtype=np.uint64), np.ones((5000, 8), np.float32))
    for address, server in zip(addresses, shards):
        data_dir = Path(server.config.data_dir)
        server.shard.flush()
        with grpc.insecure_channel(address) as channel:
            before = du(data_dir)
            fs = os.statvfs(data_dir)
            reply = ps_pb2_grpc.ParameterServerStub(channel).Stats(ps_pb2.StatsRequest(), timeout=30)
            after = du(data_dir)
        assert reply.data_dir_bytes > 0 and min(before, after) <= reply.data_dir_bytes <= max(before, after), (
            before,
            reply.data_dir_bytes,
            after,
        )
        assert reply.disk_total_bytes == fs.f_blocks * fs.f_frsize
        assert 0 < reply.disk_free_bytes <= reply.disk_total_bytes
        assert (
            abs(reply.disk_free_bytes - fs.f_bavail * fs.f_frsize) < 512 << 20
        )  # the other test process writes meanwhile

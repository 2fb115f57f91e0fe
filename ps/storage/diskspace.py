"""The disk under a data dir: its bytes used and free (measure), and DiskWatch, which logs while free space is low.

A shard whose disk fills stops taking pushes (RESOURCE_EXHAUSTED, ps.diskfull.DiskFullError) and its background
flushes fail; DiskWatch says so in the log beforehand. The flusher thread calls DiskWatch.poll at each wake-up, so
no request pays for the directory walk and statvfs it costs (at most one measure every CHECK_S).

The disk is low while its free bytes (to this user: statvfs f_bavail) are under low_bytes(total, data dir):
  - 5% of the disk (LOW_FRACTION), the level at which file systems slow down and disk alerts usually fire;
  - 2 GiB (LOW_MIN_BYTES; a quarter of a disk under 8 GiB): room for the logs a data dir grows by between flushes,
    up to 1.6 GiB of journal and RocksDB's write-ahead and text logs (docs/capacity.md; a sizing audit saw an
    835 MB data dir reach ~1.2 GB while training);
  - a tenth of the data dir's bytes (COMPACTION_FRACTION): a compaction writes its output, about a level's
    rewrite, before it deletes its inputs;
whichever is largest. It stops being low once free bytes exceed that by RECOVER_MARGIN (10%), so that a disk
hovering at the line does not log at every check.

Log lines (logger ps.storage.diskspace): one WARNING when the disk becomes low, again every REPEAT_S while it stays
low, one INFO when it recovers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import NamedTuple

from ps.bytesize import human_bytes

log = logging.getLogger("ps.storage.diskspace")

CHECK_S = 30.0  # between two measures of the disk (the flusher may wake more often)
REPEAT_S = 300.0  # between two warnings while the disk stays low
LOW_FRACTION = 0.05
LOW_MIN_BYTES = 2 << 30
COMPACTION_FRACTION = 0.1
RECOVER_MARGIN = 1.1


class DiskSpace(NamedTuple):
    data_dir_bytes: int  # every file under the data dir: RocksDB (write-ahead logs included), the journal
    disk_free_bytes: int  # free to this user on the data dir's file system (statvfs f_bavail * f_frsize)
    disk_total_bytes: int  # that file system's size (f_blocks * f_frsize)


def dir_bytes(path: str) -> int:
    """The bytes of every file under path (st_size; a file deleted while walked counts 0)."""
    used = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # RocksDB deletes files as it compacts
                used += os.stat(os.path.join(root, name)).st_size
    return used


def measure(data_dir: str) -> DiskSpace:
    """The data dir's bytes and its file system's free and total bytes now: a stat per file, and one statvfs."""
    used = dir_bytes(data_dir)
    fs = os.statvfs(data_dir)
    return DiskSpace(used, fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize)


def low_bytes(disk_total_bytes: int, data_dir_bytes: int) -> int:
    """Free bytes under which the disk is low (the module's docstring says why these)."""
    floor = min(LOW_MIN_BYTES, disk_total_bytes // 4)
    return max(int(disk_total_bytes * LOW_FRACTION), floor, int(data_dir_bytes * COMPACTION_FRACTION))


class DiskWatch:
    """Watches one data dir's disk. Not thread-safe: one thread (the flusher) polls; others read `low` and
    `last`, each replaced whole."""

    def __init__(self, data_dir: str, clock: Callable[[], float] = time.monotonic):
        self.data_dir = data_dir
        self.clock = clock
        self.low = False  # the disk was low at the last measure
        self.last: DiskSpace | None = None  # the last measure
        self._checked = self._told = -float("inf")

    def poll(self) -> None:
        """Measures the disk if CHECK_S have passed since the last measure, and logs what changed. A failed
        measure (the dir unreadable) is logged at debug and tried at the next poll; poll never raises OSError."""
        now = self.clock()
        if now - self._checked < CHECK_S:
            return
        self._checked = now
        try:
            space = measure(self.data_dir)
        except OSError as e:
            log.debug("cannot measure the disk of %s: %s", self.data_dir, e)
            return
        self.check(space, now)

    def check(self, space: DiskSpace, now: float) -> None:
        """Logs a warning if space is low (once, then every REPEAT_S), info when it is no longer."""
        self.last = space
        threshold = low_bytes(space.disk_total_bytes, space.data_dir_bytes)
        if space.disk_free_bytes < threshold:
            if not self.low or now - self._told >= REPEAT_S:
                self._told = now
                log.warning(
                    "low disk space: %s free of %s (%.1f%%) on the disk of data dir %s, which holds %s; below %s, "
                    "pushes and flushes will fail once it is full (RESOURCE_EXHAUSTED): free space, grow the disk, "
                    "or move the shard (ps-server size predicts a table's bytes)",
                    human_bytes(space.disk_free_bytes), human_bytes(space.disk_total_bytes),
                    100 * space.disk_free_bytes / max(space.disk_total_bytes, 1), self.data_dir,
                    human_bytes(space.data_dir_bytes), human_bytes(threshold),
                )  # fmt: skip
            self.low = True
        elif self.low and space.disk_free_bytes >= threshold * RECOVER_MARGIN:
            self.low = False
            log.info("disk space recovered: %s free of %s on the disk of data dir %s (low below %s)",
                     human_bytes(space.disk_free_bytes), human_bytes(space.disk_total_bytes), self.data_dir,
                     human_bytes(threshold))  # fmt: skip

"""The journal where its optional accelerations are unavailable (ps.accel): each fallback path writes, byte for
byte, the segment that the mapped path writes (ps.accel.filemap, ps.accel.prefault, copy_with_checksum64), and it
replays the same records."""

from __future__ import annotations

import errno
import logging
import os
import threading

import numpy as np
import pytest

from ps.accel import filemap, prefault
from ps.storage.journal import Journal
from tests.waiting import wait_until

PUSHES = ((1, 40), (2, 1), (3, 5000), (4, 7))  # (seed, ids) of each push; the first of a segment is never mapped
DIM = 3
BTRFS = 0x9123683E  # statfs f_type of a copy-on-write file system, which the journal does not map


def _push(j: Journal, seed: int, n: int) -> int:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
    grads = rng.standard_normal((n, DIM)).astype(np.float32)
    shows, clicks = np.ones(n, np.float32), rng.integers(0, 2, n).astype(np.float32)
    return j.append("t", ids, grads, shows, clicks, step=seed, origin=(9, seed, 0, 2**64 - seed))


def _write(directory, before_each) -> tuple[bytes, Journal]:
    """The bytes of the one segment a journal in directory holds after PUSHES, closed; before_each(j) runs
    before every push but the first."""
    os.makedirs(directory)
    j = Journal(str(directory))
    for k, (seed, n) in enumerate(PUSHES):
        if k:
            before_each(j)
        assert _push(j, seed, n) == k + 1
    j.close()
    (name,) = os.listdir(directory)
    return (directory / name).read_bytes(), j


def _replays_every_push(directory) -> None:
    records = list(Journal(str(directory)).replay(0))
    assert [(r.seq, r.step, r.origin, len(r.ids)) for r in records] == [
        (k + 1, seed, (9, seed, 0, 2**64 - seed), n) for k, (seed, n) in enumerate(PUSHES)
    ]


def _prepared_ahead(j: Journal) -> None:
    wait_until(lambda: os.path.getsize(j._path) > j._segment_size, 10, "space prepared ahead of the appends")


@pytest.fixture
def mapped(tmp_path) -> bytes:
    """The segment written through the mapping: every append after the first a copy into prepared space."""
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fs = filemap.file_system_type(fd)
    finally:
        os.close(fd)
    if fs not in filemap.MAPPABLE_FILE_SYSTEMS:
        pytest.skip(f"the journal maps segments only on ext4, xfs or tmpfs; {tmp_path} is on file system {fs!r}")
    data, j = _write(
        tmp_path / "mapped",
        lambda j: wait_until(lambda: j._prefault.mapped_end > j._segment_size + 200_000, 10, "mapped space"),
    )
    assert j.mapped_appends == len(PUSHES) - 1
    return data


@pytest.mark.parametrize("why", ["file system", "no libc"])
def test_without_a_mapping_appends_are_written_with_pwritev(mapped, tmp_path, monkeypatch, why):
    """FileMap.open returns None on a file system it does not map, or without libc's mmap (not Linux)."""
    if why == "file system":
        monkeypatch.setattr(filemap, "file_system_type", lambda fd: BTRFS)
    else:
        monkeypatch.setattr(filemap, "_LIBC", None)
    maps = []

    def prepared_and_unmapped(j: Journal) -> None:
        _prepared_ahead(j)  # the prefault thread still prepares space ...
        maps.append(j._map)  # ... but there is no mapping to copy into

    data, j = _write(tmp_path / "fallback", prepared_and_unmapped)
    assert maps == [None] * (len(PUSHES) - 1) and j.mapped_appends == 0
    assert data == mapped
    _replays_every_push(tmp_path / "fallback")


def test_without_fallocate_appends_allocate_as_they_go(mapped, tmp_path, monkeypatch):
    monkeypatch.setattr(prefault, "_fallocate", None)  # no fallocate(2): not Linux, or an old libc
    sizes = []

    def nothing_prepared(j: Journal) -> None:
        assert j._prefault._thread is None  # no thread was started
        sizes.append(os.path.getsize(j._path) - j._segment_size)

    data, j = _write(tmp_path / "fallback", nothing_prepared)
    assert sizes == [0] * (len(PUSHES) - 1) and j.mapped_appends == 0
    assert data == mapped
    _replays_every_push(tmp_path / "fallback")


@pytest.mark.parametrize("error, level", [(errno.EOPNOTSUPP, logging.INFO), (errno.ENOSPC, logging.WARNING)])
def test_a_refused_fallocate_stops_preparing_and_appends_continue(mapped, tmp_path, monkeypatch, caplog, error, level):
    """A file system without fallocate (EOPNOTSUPP) or a full disk (ENOSPC): the prefault thread gives up."""
    refused = threading.Event()

    def fallocate(fd: int, offset: int, length: int) -> None:
        refused.set()
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(prefault, "_fallocate", fallocate)
    caplog.set_level(logging.INFO, logger=prefault.__name__)
    data, j = _write(tmp_path / "fallback", lambda j: refused.wait(10) or pytest.fail("fallocate was never called"))
    assert j.mapped_appends == 0
    assert data == mapped
    (record,) = [r for r in caplog.records if r.name == prefault.__name__]
    assert record.levelno == level and "appends allocate as they go" in record.getMessage()
    _replays_every_push(tmp_path / "fallback")


def test_where_the_kernel_cannot_populate_the_mapping_appends_use_pwritev(mapped, tmp_path, monkeypatch):
    """A kernel without MADV_POPULATE_WRITE (before Linux 5.14) answers EINVAL, as it does to this unknown advice:
    space is still prepared, but the writer's mapping is never populated, so nothing is copied into it."""
    monkeypatch.setattr(filemap, "MADV_POPULATE_WRITE", 0x7FFF)

    def refused(j: Journal) -> None:
        wait_until(lambda: not j._map.populate_works, 10, "refusal of MADV_POPULATE_WRITE")
        _prepared_ahead(j)
        assert j._prefault.mapped_end == 0

    data, j = _write(tmp_path / "fallback", refused)
    assert j.mapped_appends == 0
    assert data == mapped
    _replays_every_push(tmp_path / "fallback")

"""FileMap: a shared, writable memory mapping of a file, so the journal can write records with memory copies.

Optional: correctness never depends on it. Where `FileMap.open` returns None (not Linux, no libc mmap, a file
system other than ext4, xfs or tmpfs, or mmap fails), or where space is not prepared and populated ahead
(ps.accel.prefault), the journal writes each record with one pwritev: the same bytes in the same file. What
correctness needs of the writer that uses it: copy only into bytes the file holds (touching a byte past the
file's end raises SIGBUS, which kills the process), and map only files on a file system where writing into
allocated space needs no new blocks (ext4, xfs, tmpfs). On a copy-on-write file system (btrfs, zfs) such a
write may need blocks, and a full disk would arrive as SIGBUS in the middle of a copy instead of as an error of
a write call; so those are not mapped.

Why: writing into the page cache with pwritev costs the kernel work for every 4 KB page; a copy into pages
whose page tables were populated for writing beforehand (MADV_POPULATE_WRITE, from ps.accel.prefault's thread)
takes no page faults and no system call. A copy is in the page cache once it returns, so it survives a crash of
the process like a write(2) does, and fsync(2) of the file writes it to disk like any other dirty page. Mapped
pages count in the process's RSS: the owner releases the ones it is done with (release()), so only the page
cache holds them, as after write(2).
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np

MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault the range in as if written (EINVAL where the kernel lacks it)


def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mmap_fn, munmap_fn, madvise_fn, fstatfs_fn = libc.mmap, libc.munmap, libc.madvise, libc.fstatfs
    except (OSError, AttributeError):
        return None
    mmap_fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64)
    mmap_fn.restype = ctypes.c_void_p
    munmap_fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    munmap_fn.restype = ctypes.c_int
    madvise_fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise_fn.restype = ctypes.c_int
    fstatfs_fn.argtypes = (ctypes.c_int, ctypes.c_void_p)
    fstatfs_fn.restype = ctypes.c_int
    return mmap_fn, munmap_fn, madvise_fn, fstatfs_fn


MAPPABLE_FILE_SYSTEMS = {0xEF53: "ext4", 0x58465342: "xfs", 0x01021994: "tmpfs"}  # statfs f_type magic numbers


def file_system_type(fd: int) -> int | None:
    """statfs(2) f_type of the file system holding fd (Linux), or None."""
    if _LIBC is None:
        return None
    buf = (ctypes.c_long * 32)()  # struct statfs, f_type first
    if _LIBC[3](fd, ctypes.addressof(buf)) != 0:
        return None
    return buf[0] & 0xFFFFFFFF


_LIBC = _libc() if sys.platform.startswith("linux") else None  # statfs and madvise as Linux defines them
_MAP_FAILED = ctypes.c_void_p(-1).value


class FileMap:
    """The first `length` bytes of a file, mapped shared and writable; `array` is a uint8 view of them, for the
    owner to write into (only bytes the file holds). populate() may run on another thread meanwhile; close()
    must not (the owner stops that thread first)."""

    def __init__(self, address: int, length: int):
        self._address = address
        self.length = length
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * length).from_address(address))
        self.populate_works = True  # False once the kernel refused MADV_POPULATE_WRITE

    @classmethod
    def open(cls, fd: int, length: int) -> FileMap | None:
        """A mapping of fd's first length bytes, or None where this platform, file system or file cannot be
        mapped."""
        if _LIBC is None or length <= 0 or file_system_type(fd) not in MAPPABLE_FILE_SYSTEMS:
            return None
        address = _LIBC[0](None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            return None
        return cls(address, length)

    def populate(self, lo: int, hi: int) -> bool:
        """Populates the page tables of [lo, hi) for writing (pages the file holds), so later copies take no
        page faults; False (and populate_works is cleared) if the kernel cannot."""
        if not self.populate_works or self._address is None:
            return False
        start = lo - lo % mmap.PAGESIZE
        if _LIBC[2](self._address + start, hi - start, MADV_POPULATE_WRITE) != 0:
            self.populate_works = False
            return False
        return True

    def release(self, lo: int, hi: int) -> None:
        """Drops the whole pages of [lo, hi) from this process's page tables (MADV_DONTNEED): they stay in the
        page cache, dirty ones too, so nothing written is lost, but they no longer count in the process's RSS.
        For bytes the owner will not touch again (they would fault back in, reading what was written)."""
        start = -(-lo // mmap.PAGESIZE) * mmap.PAGESIZE
        stop = hi - hi % mmap.PAGESIZE
        if self._address is not None and stop > start:
            _LIBC[2](self._address + start, stop - start, mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Unmaps (array must not be used afterwards)."""
        if self._address is not None:
            self.array = None
            _LIBC[1](self._address, self.length)
            self._address = None

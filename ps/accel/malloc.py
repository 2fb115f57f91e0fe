"""tune_malloc: glibc malloc settings for processes that move multi-MB messages.

Optional: correctness never depends on it. Where glibc's mallopt is missing (musl, macOS), tune_malloc changes
nothing and returns False: the platform's default allocation applies, and the messages are the same, each large
one allocated (and page-faulted) anew.
"""

from __future__ import annotations

import ctypes
import ctypes.util

BOUNDED_TRIM_THRESHOLD = 4 << 20  # under a memory bound (ps-server --memory-bytes): freed heap goes back sooner
BOUNDED_MMAP_THRESHOLD = 1 << 20  # and every buffer of 1 MiB or more is its own mapping, unmapped when freed


def tune_malloc(trim_threshold: int = 64 << 20, mmap_threshold: int = 16 << 20) -> bool:
    """Stops glibc from mmap-ing (and page-faulting) every large message buffer; True if every setting took.

    Sets M_MMAP_THRESHOLD to mmap_threshold (16 MiB: smaller buffers come from the heap and are reused) and
    M_TRIM_THRESHOLD to trim_threshold (64 MiB) through mallopt (freed heap above that goes back to the OS: a
    server's RSS stays near its budget), and M_ARENA_MAX to 2: each malloc arena may keep up to the trim threshold
    of freed memory, and without a cap every gRPC and kernel thread gets its own. A server given --memory-bytes
    uses BOUNDED_TRIM_THRESHOLD and BOUNDED_MMAP_THRESHOLD: the multi-MB arrays of a request with many misses are
    mapped and unmapped instead of fragmenting the heap (a bounded server's peak under uniform misses: 774 -> 745
    MiB), for a page fault per 4 KB of each. Call at process start-up, before the first big allocation. Returns
    False where glibc's mallopt is not available (nothing is changed then).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    ok = mallopt(m_mmap_threshold, mmap_threshold) == 1
    ok = ok and mallopt(m_arena_max, 2) == 1
    return ok and mallopt(m_trim_threshold, trim_threshold) == 1

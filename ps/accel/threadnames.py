"""name_os_thread: gives the calling thread's Python name to the operating system, so that `top -H`, `ps -L`,
perf and /proc/PID/task/TID/comm tell a server's threads apart (readers, write-behind, flusher, RPC handlers)
instead of showing each as "python".

Optional: correctness never depends on it. Linux only (prctl PR_SET_NAME, which keeps the first 15 bytes);
elsewhere, or where libc cannot be loaded, it does nothing. RocksDB names its own threads (rocksdb:low for
compactions, rocksdb:high for flushes).
"""

from __future__ import annotations

import ctypes
import sys
import threading

PR_SET_NAME = 15
MAX_NAME_BYTES = 15  # the kernel's limit, without the terminating NUL

_prctl = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(None).prctl
        _prctl.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
        _prctl.restype = ctypes.c_int
    except (OSError, AttributeError):
        _prctl = None


def name_os_thread() -> bool:
    """Sets the OS name of the calling thread to its Python name (its first 15 bytes); True if it was set. Call
    it first thing in a thread's target, or as a ThreadPoolExecutor's initializer."""
    if _prctl is None:
        return False
    name = threading.current_thread().name.encode("utf-8", "replace")[:MAX_NAME_BYTES]
    return _prctl(PR_SET_NAME, name, 0, 0, 0) == 0

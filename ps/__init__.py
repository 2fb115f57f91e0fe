"""sparseps server package: sharded gRPC parameter servers backed by RocksDB.

Importing it sets two things before gRPC and numba load (unless the variables are set already):
- GRPC_ENABLE_FORK_SUPPORT=false. With gRPC's fork support on (its default), a process with live channels that
  starts a child through fork (subprocess.Popen with preexec_fn, as `ps-worker launch` starts its workers) has
  gRPC restart its poller in the child, where Popen's closing of file descriptors makes it abort (SIGABRT) before
  the exec: 5 of 150 such children here (grpc/grpc#43055). sparseps never uses gRPC in a forked child. gRPC reads
  the variable as it loads: in a program that imported grpc first, fork support stays on, and a RuntimeWarning
  says so (import ps, or worker, before grpc; the test package does, tests/__init__.py).
- NUMBA_CACHE_DIR, where numba's defaults cannot write: numba caches compiled kernels beside their source files
  (__pycache__) or, where the package is not writable, in the user's cache dir (~/.cache); a user with neither
  (a service account without a home, on a read-only install) got a RuntimeError at the first compile. Then it is
  a dir of this user's under the temp dir.
"""

import os
import sys
import tempfile
import warnings

__version__ = "0.1.0"


def _writable(path: str) -> bool:
    """Whether path, or the nearest of its parents that exists, is writable by this process."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.access(path, os.W_OK)


def numba_cache_dir() -> str | None:
    """The NUMBA_CACHE_DIR to set (None: numba's defaults can write, or the variable is set)."""
    if "NUMBA_CACHE_DIR" in os.environ or _writable(os.path.dirname(os.path.abspath(__file__))):
        return None
    user_cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if _writable(user_cache):
        return None
    return os.path.join(tempfile.gettempdir(), f"sparseps-numba-cache-{os.getuid()}")


if "grpc" in sys.modules and "GRPC_ENABLE_FORK_SUPPORT" not in os.environ:
    warnings.warn("grpc was imported before ps, so gRPC's fork support stays on in this process: a child started "
                  "through fork while gRPC runs (ps-worker export's `ps-server export`) can die of SIGABRT before it "
                  "starts; import ps (or worker) before grpc, or set GRPC_ENABLE_FORK_SUPPORT=false", RuntimeWarning,
                  stacklevel=2)  # fmt: skip
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
_cache_dir = numba_cache_dir()
if _cache_dir is not None:
    os.environ["NUMBA_CACHE_DIR"] = _cache_dir

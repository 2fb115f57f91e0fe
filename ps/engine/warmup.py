"""warm_up: loads a server's compiled kernels before its first request, by pulling and pushing a scratch table.

The first pull and push of a server load its compiled kernels (numba's cached machine code, and LLVM to link it, or
compile it where no cache is there: a new install, another CPU): about 0.9 s (the time it logs; README.md, memory
bound, says how it was measured) and 78 MB of RSS that otherwise land on the first requests. A server given
--memory-bytes runs warm_up at start, on a background thread, so that its fixed footprint (code and runtime) is in
place before data arrives: what grows afterwards is data; its health says NOT_SERVING until warm_up returns
(ps.server; calls are served meanwhile), so a readiness probe finds it Ready only then. So it takes
the paths requests take, with the arrays requests bring (ids and grads decoded from bytes by ps.wire: read-only
views, for which numba compiles kernels of their own; grads checked as a shard checks a push): a few ids; a pull
of MISSES_IDS new ids (misses, split over the kernel threads, in one pass); then LARGE_IDS ids at once (a request
in passes, a journal record hashed in parallel: ps.rows.parallel.MIN_PART, ps.storage.checksum.PARALLEL_BYTES),
twice, with a RAM tier that cannot hold both (eviction: victims, the ghost, index deletes, the write-behind). The
scratch table has its own small RocksDB, journal (1 MiB segments) and RAM tier (SCRATCH_TIER_BYTES) in a temporary
directory, removed afterwards; the shard's own data is not touched. Optional: a failure is logged and changes nothing. A
server that stops meanwhile sets `stop`: the warm-up ends after the step it is in, its directory removed, and the
server waits for that (a thread cut off at exit could be inside RocksDB or compiled code, and abort the process).
It logs one line (logger ps.engine.warmup) as it ends, saying how: benchmarks/memory_bound.py waits for it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time

import numpy as np

from ps.config import TableConfig
from ps.engine.table import Table
from ps.rows.layout import layout_of
from ps.rows.parallel import MIN_PART
from ps.rows.pushcheck import check_push_values
from ps.signalsafe import StopFlag
from ps.storage.budget import MemoryBudget
from ps.storage.checksum import PARALLEL_BYTES
from ps.storage.journal import Journal
from ps.storage.store import Store
from ps.wire import decode_ids, decode_rows

log = logging.getLogger("ps.engine.warmup")
SCRATCH_BYTES = 1 << 20  # block cache, memtable and journal segment of the scratch table, each
SCRATCH_IDS = 8
DIM = 8
MISSES_IDS = 2 * MIN_PART  # new ids of one pull: in one pass (under Arena.max_pinnable), misses over the threads
LARGE_IDS = max(2 * MIN_PART, PARALLEL_BYTES // (8 + 4 * DIM + 8) + 1)  # ids, grads, shows and clicks of a record
SCRATCH_TIER_BYTES = 3 * LARGE_IDS * layout_of(DIM, "adagrad").ram_bytes // 2  # one large push, not two


class _Stopped(Exception):
    pass


def warm_up(stop: StopFlag | None = None) -> bool:
    """Pulls, pushes and pulls again SCRATCH_IDS ids, pulls MISSES_IDS new ids, then pushes and pulls LARGE_IDS new
    ids twice, of a scratch table (default settings, dim 8) in a temporary directory (the module docstring); True if
    it ran through (False, with a log line, if anything failed or stop was set: it is looked at between steps)."""
    start = time.perf_counter()

    def step() -> None:
        if stop is not None and stop.is_set():
            raise _Stopped

    try:
        with tempfile.TemporaryDirectory(prefix="ps-warm-up-") as tmp:
            store = Store(os.path.join(tmp, "rows"), block_cache_bytes=SCRATCH_BYTES, write_buffer_bytes=SCRATCH_BYTES)
            journal = Journal(os.path.join(tmp, "journal"), segment_bytes=SCRATCH_BYTES)
            try:
                store.meta.check_identity(0, 1)
                for _ in journal.replay(0):  # a new journal: nothing to replay; appends may follow
                    pass
                cfg = TableConfig("warm-up", DIM).normalized()
                store.create_table(cfg)
                table = Table(cfg, store, journal, MemoryBudget(SCRATCH_TIER_BYTES))
                ids = _as_sent(np.arange(SCRATCH_IDS, dtype=np.uint64))
                for run in (lambda: table.pull(ids), lambda: _push(table, ids), lambda: table.pull(ids)):
                    step()
                    run()
                step()
                table.pull(_as_sent(np.arange(SCRATCH_IDS, SCRATCH_IDS + MISSES_IDS, dtype=np.uint64)))
                for first in (1 << 20, 2 << 20):  # two large pushes of new ids: the second evicts
                    large = _as_sent(np.arange(first, first + LARGE_IDS, dtype=np.uint64))
                    step()
                    _push(table, large)
                    step()
                    table.pull(large)
                step()
                table.flush()
            finally:
                journal.close()
                store.close()
    except _Stopped:
        log.info("warm-up of the compiled kernels stopped after %.2f s: the server is stopping",
                 time.perf_counter() - start)  # fmt: skip
        return False
    except Exception as e:  # optional: the first request loads what this did not
        log.warning("warm-up of the compiled kernels failed (the first request loads them instead): %s", e)
        return False
    log.info("compiled kernels loaded in %.2f s", time.perf_counter() - start)
    return True


def _as_sent(ids: np.ndarray) -> np.ndarray:
    """ids as a request brings them: decoded from its bytes."""
    return decode_ids(ids.tobytes())


def _push(table: Table, ids: np.ndarray) -> None:
    """A push of ids as a request brings it: grads decoded from bytes, checked, then applied, with shows 1 and
    clicks 0 (what a shard gives a push that leaves them out; the update kernel sees every array read-only,
    ps.rows.update.update)."""
    grads = decode_rows(np.full((len(ids), DIM), 0.01, dtype=np.float32).tobytes(), len(ids), DIM, "grads")
    check_push_values(table.name, ids, grads, None, None)
    ones = np.ones(len(ids), dtype=np.float32)
    table.push(ids, grads, ones, ones * 0, 1)

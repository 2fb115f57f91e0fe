"""The benchmarks' harness: raw batch requests, an echo server, alternated timing, and a process's CPU and memory.

Benchmarks are scripts (`python benchmarks/NAME.py`), not tests: each prints its figures next to a reference
measured in the same run, and its last line is one JSON object (emit), which benchmarks/report.py collects.
A script imports this module before numpy (`import harness` sorts first among them): it imports the worker
package first, which sets how numpy's BLAS threads wait. Requests are built with the generated classes
(protos.ps_pb2) as worker/client.py builds them; raw calls send their bytes and take the reply's bytes unparsed.
"""

from __future__ import annotations

import json
import mmap
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import worker  # noqa: E402, F401  (before numpy: it sets how OpenBLAS threads wait, see worker/__init__.py)

# isort: split
import grpc  # noqa: E402
import numpy as np  # noqa: E402
from rocksdict import IngestExternalFileOptions, Options, Rdict, SstFileWriter  # noqa: E402

from protos import ps_pb2  # noqa: E402
from ps.server import grpc_options  # noqa: E402
from ps.sharding import slot_of  # noqa: E402
from ps.storage.rowformat import encode_keys  # noqa: E402

MAX_MSG = 512 << 20
SERVICE = "/sparseps.ParameterServer/"
CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def channel(address: str) -> grpc.Channel:
    ch = grpc.insecure_channel(address, options=grpc_options(MAX_MSG))
    grpc.channel_ready_future(ch).result(timeout=60)
    return ch


def raw_method(ch: grpc.Channel, method: str) -> Callable[[bytes], bytes]:
    """A ParameterServer method that takes request bytes and returns the reply's bytes, unparsed."""
    return ch.unary_unary(SERVICE + method)


# ---- requests, as worker/client.py builds them ------------------------------------------------------------
def pull_batch_bytes(table: str, ids: np.ndarray) -> bytes:
    """A PullBatchRequest of one pull of ids (the client sends its unique ids sorted)."""
    pull = ps_pb2.PullRequest(table=table, ids=np.ascontiguousarray(ids, dtype="<u8").tobytes())
    return ps_pb2.PullBatchRequest(pulls=[pull]).SerializeToString()


def push_batch_body(table: str, ids: np.ndarray, grads: np.ndarray, return_rows: bool = False) -> bytes:
    """The pushes field of a PushBatchRequest of one push as Client.push sends it: unique sorted ids, grads, and
    neither shows nor clicks (one show and no click per id: the defaults, left out). Complete it with
    push_batch_tail."""
    push = ps_pb2.PushRequest(
        table=table,
        ids=np.ascontiguousarray(ids, dtype="<u8").tobytes(),
        grads=np.ascontiguousarray(grads, dtype="<f4").tobytes(),
        dim=grads.shape[1],
        return_rows=return_rows,
    )
    return ps_pb2.PushBatchRequest(pushes=[push]).SerializeToString()


def push_batch_tail(client_id: int, seq: int, advance_clock: int = 0) -> bytes:
    """The other fields of a PushBatchRequest. body + tail is the whole request, byte for byte what serializing
    it at once gives (protobuf merges concatenated messages; both write fields in number order), so a large body
    is built once and each call gets a fresh seq: the shard applies a (client_id, seq) only once."""
    return ps_pb2.PushBatchRequest(advance_clock=advance_clock, client_id=client_id, seq=seq).SerializeToString()


def zipf_ids(rng: np.random.Generator, n: int, num_rows: int, exponent: float = 1.1) -> np.ndarray:
    """n ids with Zipf-like frequencies over the ids 0..num_rows-1 (rank r -> id r)."""
    u = rng.random(n)
    a = 1.0 - exponent
    ranks = np.floor(((num_rows**a - 1.0) * u + 1.0) ** (1.0 / a)) - 1.0
    return np.clip(ranks, 0, num_rows - 1).astype(np.uint64)


# ---- a process's CPU and memory, from /proc --------------------------------------------------------------
def _stat_cpu_s(path: str) -> float:
    """user + system CPU seconds of a /proc stat file (a process's or a thread's), counted in clock ticks."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * CLOCK_TICK_S  # utime, stime: fields 14 and 15 of stat(5)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads, exited ones included) the process has used."""
    return _stat_cpu_s(f"/proc/{pid}/stat")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of the process's live threads, summed by OS thread name less a trailing "_N" (a pool's
    threads: ps-rpc_0 and ps-rpc_1 count as ps-rpc). A server names its threads (ps.accel.threadnames), RocksDB
    its own (rocksdb:low compacts, rocksdb:high flushes memtables)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            seconds = _stat_cpu_s(f"/proc/{pid}/task/{tid}/stat")
        except OSError:  # the thread ended meanwhile
            continue
        head, _, tail = name.rpartition("_")
        name = head if head and tail.isdigit() else name
        out[name] = out.get(name, 0.0) + seconds
    return out


def wait_idle(pid: int, window_s: float = 0.1, timeout_s: float = 10.0) -> bool:
    """Waits until the process used at most one clock tick of CPU over two successive windows (its deferred work
    is done); False if it did not go idle within timeout_s."""
    deadline, quiet, last = time.monotonic() + timeout_s, 0, cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(window_s)
        now = cpu_s(pid)
        quiet = quiet + 1 if now - last <= CLOCK_TICK_S * 1.5 else 0
        last = now
        if quiet >= 2:
            return True
    return False


def _status_bytes(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes(pid: int) -> int:
    """Resident memory now (VmRSS)."""
    return _status_bytes(pid, "VmRSS")


def file_rss_bytes(pid: int) -> int:
    """Resident pages of mapped files now (RssFile): part of VmRSS, page cache the OS can reclaim."""
    return _status_bytes(pid, "RssFile")


def peak_rss_bytes(pid: int) -> int:
    """The largest resident memory the process has had (VmHWM): the peak, however short."""
    return _status_bytes(pid, "VmHWM")


def dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def _mount_of(path: str) -> tuple[str, str, str]:
    """(mount point, file system type, device) of the mount that holds path."""
    best = ("/", "?", "?")
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        for line in f:
            device, point, kind = line.split()[:3]
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, kind, device)
    return best


def direct_io_dir(candidates: list[str]) -> tuple[str, str]:
    """(directory, description) of the first candidate on a disk-backed file system that reads with O_DIRECT:
    not tmpfs or ramfs, whose "direct" reads come from memory. RuntimeError if none is."""
    tried = []
    for d in candidates:
        _, kind, device = _mount_of(d)
        if not os.path.isdir(d) or kind in ("tmpfs", "ramfs", "devtmpfs"):
            tried.append(f"{d} ({kind})")
            continue
        probe = os.path.join(d, f".sparseps-odirect-{os.getpid()}")
        try:
            with open(probe, "wb") as f:
                f.write(bytes(4096))
            fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
            try:
                os.readv(fd, [mmap.mmap(-1, 4096)])  # an aligned buffer, as O_DIRECT needs
            finally:
                os.close(fd)
            return d, f"{d}: {kind} on {device}, O_DIRECT reads"
        except OSError as e:
            tried.append(f"{d} ({kind}: {e.strerror})")
        finally:
            if os.path.exists(probe):
                os.unlink(probe)
    raise RuntimeError(f"no directory on a disk that reads with O_DIRECT among {', '.join(tried)}; give --dir")


def ingest_in_key_order(cf: Rdict, opts: Options, number: int, ids: np.ndarray,
                        values: Callable[[int, np.ndarray], list[bytes]], scratch: str, file_rows: int,
                        done: Callable[[int], None] = lambda rows: None) -> None:  # fmt: skip
    """Ingests rows of ids into cf (a RocksDB or one of its column families), keyed ps.storage.rowformat.encode_keys(
    number, id): written in RocksDB's key order (slot, id) with opts to SST files of file_rows rows under scratch,
    then moved into cf. values(k, part): the stored values (one bytes per id) of part, the ids of the k-th file in
    key order. done(rows written so far) after each file."""
    ids = ids[np.lexsort((ids, slot_of(ids)))]
    files = []
    for k, lo in enumerate(range(0, len(ids), file_rows)):
        part = ids[lo : lo + file_rows]
        files.append(os.path.join(scratch, f"ingest-{k}.sst"))
        writer = SstFileWriter(opts)
        writer.open(files[-1])
        for key, value in zip(encode_keys(number, part), values(k, part), strict=True):
            writer[key] = value
        writer.finish()
        done(lo + len(part))
    ingest = IngestExternalFileOptions()
    ingest.set_move_files(True)
    cf.ingest_external_file(files, ingest)


def read_into_page_cache(path: str) -> tuple[int, float]:
    """Reads every file under path once (the OS keeps them in its page cache while it has room); (bytes,
    seconds)."""
    t0, total, buf = time.perf_counter(), 0, bytearray(8 << 20)
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    total += n
    return total, time.perf_counter() - t0


# ---- timing ----------------------------------------------------------------------------------------------
def timed(fn: Callable[[], object], reps: int, warmup: int = 2, max_s: float = 60.0) -> list[float]:
    """Seconds per call of fn over reps calls after warmup calls (stops early after max_s)."""
    for _ in range(warmup):
        fn()
    out, start = [], time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
        if time.perf_counter() - start > max_s:
            break
    return out


@dataclass
class Leg:
    """One kind of call in an alternation. prepare() builds its argument, untimed; call(arg) is timed.
    cpu_pid: read that process's CPU time before the call, after the reply, and once it is idle again (its
    deferred work done). idle_pid: wait for that process to be idle before the call."""

    name: str
    call: Callable[[object], object]
    prepare: Callable[[], object] = lambda: None
    cpu_pid: int | None = None
    idle_pid: int | None = None
    seconds: list[float] = field(default_factory=list)
    cpu_in_call_s: list[float] = field(default_factory=list)  # the process's CPU from send to reply
    cpu_after_s: list[float] = field(default_factory=list)  # ... from the reply until it went idle
    not_idle: int = 0  # waits that ended at their deadline with the process still busy

    def run(self, record: bool) -> None:
        arg = self.prepare()
        if self.idle_pid is not None and not wait_idle(self.idle_pid):
            self.not_idle += record
        c0 = cpu_s(self.cpu_pid) if self.cpu_pid is not None else 0.0
        t = time.perf_counter()
        self.call(arg)
        dt = time.perf_counter() - t
        if self.cpu_pid is not None:
            c1 = cpu_s(self.cpu_pid)
            if not wait_idle(self.cpu_pid):
                self.not_idle += record
            c2 = cpu_s(self.cpu_pid)
            if record:
                self.cpu_in_call_s.append(c1 - c0)
                self.cpu_after_s.append(c2 - c1)
        if record:
            self.seconds.append(dt)

    def cpu_ms(self) -> tuple[float, float]:
        """Mean CPU milliseconds per call of the watched process: (from send to reply, after the reply)."""
        n = max(1, len(self.cpu_in_call_s))
        return 1e3 * sum(self.cpu_in_call_s) / n, 1e3 * sum(self.cpu_after_s) / n


def alternate(legs: list[Leg], reps: int, warmup: int = 2, max_s: float = 300.0) -> list[Leg]:
    """Runs the legs in turn (leg 0, leg 1, ..., leg 0, ...) warmup times unrecorded, then reps times recorded
    (stopping early after max_s), so that a change in this shared machine's speed hits all of them alike."""
    for _ in range(warmup):
        for leg in legs:
            leg.run(record=False)
    start = time.perf_counter()
    for _ in range(reps):
        for leg in legs:
            leg.run(record=True)
        if time.perf_counter() - start > max_s:
            break
    return legs


def rate(n: int, seconds: list[float]) -> float:
    """Items per second at the median call time."""
    return n / statistics.median(seconds)


def spread(n: int, seconds: list[float]) -> str:
    low, high = n / max(seconds) / 1e6, n / min(seconds) / 1e6
    return f"median {rate(n, seconds) / 1e6:.2f}M/s (min-max {low:.2f}-{high:.2f}M, {len(seconds)} reps)"


# ---- the reference: a bare gRPC server ----------------------------------------------------------------------
class EchoServer:
    """A bare gRPC server in its own process: a generic unary method whose reply is N bytes, where N is the
    first 8 bytes of the request (little-endian). No protobuf, no work: the transport's ceiling."""

    def __enter__(self) -> EchoServer:
        self.proc = subprocess.Popen(  # it stops when our end of its stdin closes, however this process ends
            [sys.executable, os.path.abspath(__file__), "echo-server"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.address = f"127.0.0.1:{int(self.proc.stdout.readline())}"
        self.call = channel(self.address).unary_unary("/echo/Echo")
        return self

    @staticmethod
    def request(payload_bytes: int, reply_bytes: int) -> bytes:
        """Request bytes of payload_bytes (plus 8) asking for a reply of reply_bytes: built once, as the
        benchmarks' requests to the server are."""
        return np.uint64(reply_bytes).tobytes() + bytes(payload_bytes)

    def round_trip(self, request: bytes) -> bytes:
        return self.call(request)

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()


def _serve_echo() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from ps.accel.malloc import tune_malloc

    tune_malloc()
    replies: dict[int, bytes] = {}

    def echo(request: bytes, context) -> bytes:
        n = int(np.frombuffer(request[:8], dtype="<u8")[0])
        if n not in replies:
            replies[n] = bytes(n)
        return replies[n]

    handler = grpc.method_handlers_generic_handler("echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
    server = grpc.server(ThreadPoolExecutor(8), options=grpc_options(MAX_MSG))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)

    def stop_with_stdin() -> None:  # the raw descriptor: a thread blocked in sys.stdin's buffer can hang exit
        while os.read(0, 4096):
            pass
        server.stop(0)

    threading.Thread(target=stop_with_stdin, daemon=True).start()
    server.wait_for_termination()


def emit(result: dict) -> None:
    """The last line of every benchmark: one JSON object."""
    print(json.dumps(result), flush=True)


if __name__ == "__main__" and sys.argv[1:] == ["echo-server"]:
    _serve_echo()

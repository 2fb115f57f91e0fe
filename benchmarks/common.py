"""Shared pieces of the benchmarks: a server process, a raw stub, an echo server, timing and process stats.

Benchmarks are scripts (`python benchmarks/NAME.py`), not tests: each prints its figures and its reference, and
its last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import worker  # noqa: E402, F401  (before numpy: it sets how OpenBLAS threads wait, see worker/__init__.py)
from protos import ps_pb2, ps_pb2_grpc  # noqa: E402
from ps import wire  # noqa: E402
from ps.server import grpc_options  # noqa: E402

MAX_MSG = 512 << 20


def channel(address: str) -> grpc.Channel:
    ch = grpc.insecure_channel(address, options=grpc_options(MAX_MSG))
    grpc.channel_ready_future(ch).result(timeout=60)
    return ch


def stub(address: str) -> ps_pb2_grpc.ParameterServerStub:
    return ps_pb2_grpc.ParameterServerStub(channel(address))


def timed(fn, reps: int, warmup: int = 2, max_s: float = 60.0) -> list[float]:
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


def timed_alternately(fns: list, reps: int, warmup: int = 2, max_s: float = 120.0) -> list[list[float]]:
    """Seconds per call of each fn, calling them in turn (fn 0, fn 1, ..., fn 0, ...) so that a change in the
    machine's speed during the measurement hits all of them alike."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    out, start = [[] for _ in fns], time.perf_counter()
    for _ in range(reps):
        for k, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            out[k].append(time.perf_counter() - t)
        if time.perf_counter() - start > max_s:
            break
    return out


def rate(n: int, seconds: list[float]) -> float:
    """Items per second at the median call time."""
    return n / statistics.median(seconds)


def spread(n: int, seconds: list[float]) -> str:
    return f"median {rate(n, seconds) / 1e6:.2f}M/s (min-max {n / max(seconds) / 1e6:.2f}-{n / min(seconds) / 1e6:.2f}M, {len(seconds)} reps)"


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def zipf_ids(rng: np.random.Generator, n: int, num_rows: int, exponent: float = 1.1) -> np.ndarray:
    """n ids with Zipf-like frequencies over the ids 0..num_rows-1 (rank r -> id r)."""
    u = rng.random(n)
    a = 1.0 - exponent
    ranks = np.floor(((num_rows**a - 1.0) * u + 1.0) ** (1.0 / a)) - 1.0
    return np.clip(ranks, 0, num_rows - 1).astype(np.uint64)


def create_table(s, name: str, dim: int, optimizer: str = "adagrad") -> None:
    spec = ps_pb2.TableSpec(name=name, dim=dim, optimizer=ps_pb2.OptimizerSpec(name=optimizer))
    s.CreateTable(ps_pb2.CreateTableRequest(spec=spec))


def pull_request(table: str, ids: np.ndarray) -> ps_pb2.PullRequest:
    return ps_pb2.PullRequest(table=table, ids=wire.encode_ids(ids))


def push_request(table: str, ids: np.ndarray, grads: np.ndarray) -> ps_pb2.PushRequest:
    return ps_pb2.PushRequest(table=table, ids=wire.encode_ids(ids), grads=wire.encode_rows(grads), dim=grads.shape[1])


class EchoServer:
    """A bare gRPC server in its own process: a generic unary method whose reply is N bytes, where N is the
    first 8 bytes of the request (little-endian). No protobuf, no work: the transport's ceiling."""

    def __enter__(self) -> EchoServer:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "benchmarks", "common.py"), "echo-server"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.address = f"127.0.0.1:{int(self.proc.stdout.readline())}"
        ch = channel(self.address)
        self.call = ch.unary_unary("/echo/Echo")
        return self

    @staticmethod
    def request(payload: bytes, reply_bytes: int) -> bytes:
        """The request bytes asking for a reply of reply_bytes: build it once, as the real clients' requests are."""
        return np.uint64(reply_bytes).tobytes() + payload

    def round_trip(self, request: bytes) -> bytes:
        return self.call(request)

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait()


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
    server.wait_for_termination()


def emit(result: dict) -> None:
    """The last line of every benchmark: one JSON object."""
    print(json.dumps(result))


if __name__ == "__main__" and sys.argv[1:] == ["echo-server"]:
    _serve_echo()

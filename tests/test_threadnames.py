"""ps.accel.threadnames: a thread's Python name becomes its OS name (/proc/.../comm), cut to the kernel's 15
bytes; a running server's threads carry theirs, and benchmarks/harness.thread_cpu_s sums CPU by those names."""

import os
import sys
import threading

import pytest

from ps.accel.threadnames import MAX_NAME_BYTES, name_os_thread
from tests.benchscripts import load_benchmark
from worker.client import Client
from worker.cluster import LocalCluster

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OS thread names are read from /proc")


def os_name(tid: int, pid: int | None = None) -> str:
    with open(f"/proc/{pid or os.getpid()}/task/{tid}/comm") as f:
        return f.read().strip()


def test_a_thread_takes_its_python_name_cut_to_15_bytes():
    seen = {}

    def run() -> None:
        seen["before"] = os_name(threading.get_native_id())
        seen["set"] = name_os_thread()
        seen["after"] = os_name(threading.get_native_id())

    t = threading.Thread(target=run, name="sparseps-test-thread-name")
    t.start()
    t.join()
    assert seen["set"] is True
    assert seen["after"] == "sparseps-test-thread-name"[:MAX_NAME_BYTES] == "sparseps-test-t"
    assert seen["before"] != seen["after"]
    assert os_name(threading.get_native_id()) != "sparseps-test-t"  # only the calling thread is renamed


def test_a_servers_threads_carry_their_names_and_harness_sums_cpu_by_them():
    harness = load_benchmark("harness")
    cluster = LocalCluster(1, extra_args=["--read-threads", "2"])
    try:
        with Client(cluster.start(), timeout_s=60) as client:
            client.wait_ready()
            pid = cluster.procs[0].pid
            names = {os_name(int(tid), pid) for tid in os.listdir(f"/proc/{pid}/task")}
            assert {"ps-flusher", "ps-write-behind", "journal-mark"} <= names
            assert any(n.startswith("ps-rpc_") for n in names)  # a pool's thread starts with its first task
            by_name = harness.thread_cpu_s(pid)
            assert "ps-rpc" in by_name and not any(n.startswith("ps-rpc_") for n in by_name)  # _N dropped
            assert all(c >= 0 for c in by_name.values())
            ticks = len(os.listdir(f"/proc/{pid}/task")) * harness.CLOCK_TICK_S  # each thread rounds down its own
            assert sum(by_name.values()) <= harness.cpu_s(pid) + ticks  # live threads: a share of the process
    finally:
        cluster.cleanup()

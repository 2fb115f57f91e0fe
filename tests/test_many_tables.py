"""Many tables on one shard, black box (`python -m ps` processes driven through worker.client, measured in
/proc): the RAM tier's memory comes out of --cache-bytes, what the server maps grows with what its tables hold,
and CreateTable writes the same whatever the number of tables. tests/test_budget.py tests the sharing inside."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ps.config import TableConfig
from ps.errors import PsError, TableNotFoundError
from tests.server_process import ServerProcess
from worker.client import Client

MiB = 1 << 20
DIM = 4096
ROW_BYTES = 32_880  # a row of dim 4096 with adagrad in the RAM tier (`ps-server size`)
TABLES = 12
IDS = 400  # per table: 12 x 400 rows would be 158 MB, ten times the budget below


@pytest.fixture
def server(tmp_path):
    started = []

    def start(*flags: str) -> ServerProcess:
        started.append(ServerProcess(tmp_path / "data", *flags))
        started[-1].address = started[-1].started()
        assert started[-1].address, f"ps-server exited:\n{started[-1].output()}"
        return started[-1]

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop_cleanly()


def linux_only():
    if not os.path.exists("/proc/self/status"):
        pytest.skip("measures the server through /proc/<pid>/status, which only Linux has")


def test_twelve_wide_tables_keep_to_the_budget_in_rss_virtual_memory_and_stats(server):
    """12 tables of dim 4096 under a 16 MiB RAM tier, each pulled and pushed 400 ids: the server's anonymous
    RSS grows by at most the budget plus RocksDB's memtables (2 x 16 MiB) and request buffers; what it maps (from
    before the tables exist) by at most twice the budget plus thread stacks; Stats' ram_bytes add up to what the
    budget accounts, within it; and every table holds rows."""
    linux_only()
    budget = 16 * MiB
    s = server("--cache-bytes", str(budget))
    with Client([s.address]) as client:
        client.wait_ready()
        client.create_table(TableConfig("warm", 4))
        client.push("warm", np.arange(10, dtype=np.uint64), np.ones((10, 4), np.float32))  # compiles the kernels
        vm0 = s.status_kib("VmSize")
        for t in range(TABLES):
            client.create_table(TableConfig(f"wide{t}", DIM))
        ids = np.arange(IDS, dtype=np.uint64) * np.uint64(7919)
        grads = np.full((100, DIM), 0.5, dtype=np.float32)
        client.push("wide0", ids[:100], grads)  # buffers for rows of dim 4096: the baseline of RSS after it
        rss0 = s.status_kib("RssAnon")
        for t in range(TABLES):
            for lo in range(0, IDS, 100):
                client.pull(f"wide{t}", ids[lo : lo + 100])
                client.push(f"wide{t}", ids[lo : lo + 100], grads)
        rss, vm = s.status_kib("RssAnon"), s.status_kib("VmSize")
        stats = client.stats()[0]
    grew_rss, grew_vm = (rss - rss0) * 1024, (vm - vm0) * 1024
    print(f"RssAnon {rss0} -> {rss} KiB, VmSize {vm0} -> {vm} KiB")
    assert grew_rss <= budget + 96 * MiB, f"anonymous RSS grew {grew_rss / MiB:.0f} MiB under a 16 MiB RAM tier"
    assert grew_vm <= 2 * budget + 512 * MiB, f"virtual memory grew {grew_vm / MiB:.0f} MiB"
    ram = [t.ram_bytes for t in stats.tables]
    assert sum(ram) == stats.ram_used_bytes <= stats.ram_budget_bytes == budget
    assert all(t.rows_in_ram > 0 for t in stats.tables), [t.rows_in_ram for t in stats.tables]


def test_create_table_writes_no_rocksdb_options_file_and_tables_keep_their_own_rows(server, tmp_path):
    """RocksDB rewrites and re-reads its OPTIONS file (every column family's options) for each column family it
    creates; tables 2..60 must not make it write one. Same ids in two tables stay two rows, across a restart."""
    s = server()

    def options() -> list[str]:
        return sorted(f for f in os.listdir(tmp_path / "data") if f.startswith("OPTIONS-"))

    ids = np.array([0, 5, 2**64 - 1], dtype=np.uint64)
    with Client([s.address]) as client:
        client.wait_ready()
        client.create_table(TableConfig("t0", 4))
        after_first = options()
        for t in range(1, 60):
            client.create_table(TableConfig(f"t{t}", 4))
        assert options() == after_first
        for t in (7, 59):
            client.push(f"t{t}", ids, np.full((3, 4), t, dtype=np.float32))
        before = {t: client.pull(f"t{t}", ids) for t in (7, 30, 59)}
    s.stop_cleanly()
    s = server()
    with Client([s.address]) as client:
        client.wait_ready()
        assert len(client.stats()[0].tables) == 60
        for t, rows in before.items():
            np.testing.assert_array_equal(client.pull(f"t{t}", ids), rows)
    assert not np.array_equal(before[7], before[59]) and not np.array_equal(before[7], before[30])


def test_a_table_the_ram_tier_cannot_hold_is_refused_and_leaves_nothing(server):
    """A table's share of the RAM tier must hold 1 MiB of rows of dim 4096 (31 rows): 4 MiB take 4 such tables, a
    5th would get a share under that. CreateTable says so (RESOURCE_EXHAUSTED, naming --cache-bytes) and writes
    nothing: after a restart the table does not exist."""
    s = server("--cache-bytes", "4M")
    fits = 4
    with Client([s.address]) as client:
        client.wait_ready()
        for t in range(fits):
            client.create_table(TableConfig(f"w{t}", DIM))
        with pytest.raises(PsError, match=r"--cache-bytes 4.0 MiB\) cannot take table number 5") as e:
            client.create_table(TableConfig("one_too_many", DIM))
        assert e.value.status == "RESOURCE_EXHAUSTED"
        client.pull("w0", np.arange(10, dtype=np.uint64))  # the tables there still work
    s.stop_cleanly()
    s = server("--cache-bytes", "4M")
    with Client([s.address]) as client:
        client.wait_ready()
        assert len(client.stats()[0].tables) == fits
        with pytest.raises(TableNotFoundError):
            client.describe_table("one_too_many")

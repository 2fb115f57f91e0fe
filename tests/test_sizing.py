import json
import subprocess
import sys

import numpy as np

from ps.rows.layout import layout_of
from ps.sizing import format_report, size_report
from ps.storage.arena import Arena
from ps.storage.budget import MemoryBudget
from ps.storage.rowformat import encode_keys, value_dtype


def test_size_report_uses_the_layout_the_server_uses():
    r = size_report(10**9, 16, "adagrad", 4, 0.1)
    assert r["floats_per_row"] == 16 + 16 + 4 and r["parameters"] == 16 * 10**9  # embedding, state, statistics
    key = len(encode_keys(1, np.array([7], np.uint64))[0])  # a RocksDB key as the store writes it
    assert key == 14 and r["raw_row_bytes"] == key + 36 * 4 + 8  # key + floats + lsn
    assert r["ram_bytes_per_row"] == Arena(36, MemoryBudget(1 << 20)).row_charge
    assert r["disk_bytes_per_server"] == 250_000_000 * layout_of(16, "adagrad").disk_bytes
    assert size_report(10, 16, "sgd", 1, 1.0)["floats_per_row"] == 20
    assert size_report(10, 16, "adam", 1, 1.0)["floats_per_row"] == 16 + 33 + 4


def test_size_command_prints_json_and_rejects_unknown_optimizers():
    out = subprocess.run([sys.executable, "-m", "ps", "size", "--ids", "1e6", "--dim", "8", "--json"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and json.loads(out.stdout)["ids"] == 10**6
    bad = subprocess.run([sys.executable, "-m", "ps", "size", "--ids", "10", "--dim", "8", "--optimizer", "lamb"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "optimizer 'lamb' is unknown" in bad.stderr


def test_a_float16_tables_rows_are_sized_as_the_grammar_writes_them_and_only_the_known_settings_are_taken():
    """--values-at-rest float16 sizes a row on disk with its embedding as float16 (rowformat's value_dtype, the
    dtype the store writes with), RAM as float32; a setting a table config refuses is refused, "" included."""
    full, half = size_report(10**6, 16, "adagrad", 2, 0.1), size_report(10**6, 16, "adagrad", 2, 0.1, "float16")
    assert full["raw_row_bytes"] == 14 + value_dtype(36).itemsize == 14 + 36 * 4 + 8
    assert half["raw_row_bytes"] == 14 + value_dtype(36, 16).itemsize == 14 + 16 * 2 + 20 * 4 + 8
    assert full["disk_bytes_per_row"] - half["disk_bytes_per_row"] == 16 * 2
    assert half["disk_bytes_per_server"] == 500_000 * half["disk_bytes_per_row"]
    assert half["ram_bytes_per_row"] == full["ram_bytes_per_row"]
    assert (full["values_at_rest"], half["values_at_rest"]) == ("float32", "float16")
    command = [sys.executable, "-m", "ps", "size", "--ids", "10", "--dim", "16", "--values-at-rest"]
    out = subprocess.run([*command, "float16"], capture_output=True, text=True)
    assert (
        out.returncode == 0
        and (
            "row in RAM: 36 float32 (embedding + optimizer state + 4 statistics); on disk (values_at_rest 'float16'): "
            "16 float16 (embedding) + 20 float32 (optimizer state + 4 statistics) + 8-byte lsn\n"
        )
        in out.stdout
    )
    assert "row in RAM: 36 float32 (embedding + optimizer state + 4 statistics); on disk: the same + 8-byte lsn\n" in (
        format_report(full)
    )
    assert f"disk {half['disk_bytes_per_row']} B" in out.stdout
    for bad in ("", "bfloat16"):
        refused = subprocess.run([*command, bad], capture_output=True, text=True)
        assert refused.returncode == 2 and f"--values-at-rest: invalid choice: '{bad}'" in refused.stderr


def test_the_size_outputs_docs_capacity_quotes_are_what_the_command_prints():
    """Each `$ ps-server size ...` block of docs/capacity.md shows the command's output as it is now."""
    import os
    import re
    import shlex

    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "capacity.md")) as f:
        blocks = re.findall(r"```\n\$ ps-server size (.*?)\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 2  # the float32 and the float16 examples
    for args, shown in blocks:
        out = subprocess.run([sys.executable, "-m", "ps", "size", *shlex.split(args)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert out == shown, args

import json
import subprocess
import sys

import numpy as np
import pytest

from ps.cli_commands import size_main
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


@pytest.mark.parametrize("text", ["2.5", "1.9", "1e-3", "inf", "nan"])
def test_size_refuses_an_id_count_that_is_no_whole_number(text, capsys):
    """--ids 2.5 is a slip: refused, not sized as 2 ids."""
    with pytest.raises(SystemExit) as exited:
        size_main(["--ids", text, "--dim", "8"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"--ids: expected a whole number (1e9 is fine), got {text!r}" in err, err


def test_size_takes_an_id_count_exactly_however_large_and_in_scientific_notation(capsys):
    """The ids sized are the ids given: past 2**53 a float would round them ("9007199254740993" read as
    9,007,199,254,740,992)."""
    for text, ids in (("9007199254740993", 2**53 + 1), ("1e9", 10**9), ("2.5e6", 2_500_000), (str(2**64), 2**64)):
        assert size_main(["--ids", text, "--dim", "8", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["ids"] == ids, text
        assert size_main(["--ids", text, "--dim", "8"]) == 0
        assert capsys.readouterr().out.startswith(f"table: {ids:,} ids x dim 8 "), text


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


def _flag_after(text: str, flag: str) -> str:
    """The value the text gives `flag` (`--cache-bytes 98.5M` -> "98.5M")."""
    import re

    found = re.search(rf"{flag} (\S+?)[,)]?(?:\s|$)", text)
    assert found, f"no {flag} in:\n{text}"
    return found.group(1)


def test_the_cache_bytes_size_prints_holds_the_hot_rows_in_a_real_arena():
    """The --cache-bytes figure, given to the flag as printed (ps.flagtypes.byte_size, the server's parser), holds
    every hot row in an arena of that budget: rounded up, never to the nearest (200,000 rows of dim 32 with adam
    take 103,200,000 bytes, 98.42 MiB: "98.4" of a MiB holds 39 rows fewer), and a fraction of a row is a row."""
    from ps.flagtypes import byte_size

    for ids, dim, optimizer, hot in [(200_000, 32, "adam", 1.0), (999, 8, "adagrad", 0.5), (6.25e10, 16, "adagrad", 0.01),
                                     (2_000_000, 8, "adagrad", 1.0), (12_345, 7, "ftrl", 0.3)]:  # fmt: skip
        r = size_report(int(ids), dim, optimizer, 1, hot)
        lay = layout_of(dim, optimizer)
        hot_rows = -(-int(ids) * round(hot * 1000) // 1000)  # the hot fraction's rows, a part of one counted whole
        assert r["cache_bytes_per_server_for_hot_fraction"] >= hot_rows * lay.ram_bytes
        given = byte_size(_flag_after(format_report(r), "--cache-bytes"))
        assert given >= hot_rows * lay.ram_bytes, (ids, dim, optimizer, hot)
        assert given - hot_rows * lay.ram_bytes <= max(given // 100, 1024), "rounded up by more than a tenth of a unit"
        if hot_rows < 1_000_000:  # an arena of that budget (its own charge per row) takes them all
            assert Arena(lay.width, MemoryBudget(given)).max_rows >= hot_rows


def test_flag_size_is_the_least_tenth_of_a_unit_at_or_above_the_bytes():
    from ps.flagtypes import byte_size
    from ps.sizing import flag_size

    rng = np.random.default_rng(7)
    for n in [1, 1023, 1024, 1025, 5 << 30, (5 << 30) + 1, 103_200_000, *rng.integers(1, 1 << 50, 2000).tolist()]:
        text = flag_size(n)
        assert byte_size(text) >= n, (n, text)
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1], 1)
        assert byte_size(text) - n < unit / 10 + 1, (n, text)
    assert (flag_size(103_200_000), flag_size(5 << 30), flag_size(1000)) == ("98.5M", "5G", "1000")


def test_the_cache_bytes_size_prints_is_one_a_server_takes_and_a_table_can_join():
    """A small table's hot rows take fewer bytes than the least RAM tier a table may have (256 rows: budget's
    min_share_bytes): size prints that least, which the server starts with and CreateTable takes, not a figure
    the server refuses at start ("less than any table can use")."""
    from ps.flagtypes import byte_size
    from ps.storage.memory import plan_memory

    for ids, dim, optimizer, hot in [(1000, 8, "adagrad", 0.1), (10, 1, "sgd", 1.0), (5000, 4096, "adam", 0.0),
                                     (10**6, 16, "adagrad", 0.0001)]:  # fmt: skip
        r = size_report(ids, dim, optimizer, 1, hot)
        given = byte_size(_flag_after(format_report(r), "--cache-bytes"))
        assert given >= r["cache_bytes_per_server_for_hot_fraction"]
        plan_memory(None, r["cache_bytes_per_server_for_hot_fraction"])  # ValueError: the server would not start
        plan_memory(None, given)
        MemoryBudget(given).check_join(layout_of(dim, optimizer).ram_bytes)  # RamTierTooSmallError: no CreateTable


def test_size_says_what_to_give_memory_bytes_and_a_server_given_it_holds_the_hot_rows():
    """The --memory-bytes figure size prints, given alone, leaves the RAM tier (ps.storage.memory.plan_memory, the
    split a server makes) room for the hot rows in an arena, and is a bound the server starts with: 200,000 rows of
    dim 8 with adagrad print 112M, which holds them all (no eviction) in a real shard."""
    from ps.flagtypes import byte_size
    from ps.storage.memory import plan_memory

    for ids, dim, optimizer, hot in [(200_000, 8, "adagrad", 1.0), (2_000_000, 32, "adam", 0.5), (1000, 8, "sgd", 0.1),
                                     (6.25e10, 16, "adagrad", 0.01)]:  # fmt: skip
        r = size_report(int(ids), dim, optimizer, 8 if ids > 1e9 else 1, hot)
        text = format_report(r)
        memory = byte_size(_flag_after(text, "--memory-bytes"))
        assert memory >= r["memory_bytes_per_server_for_hot_fraction"]
        plan = plan_memory(memory, None)  # ValueError: a server refuses it
        assert plan.ram_tier_bytes >= r["cache_bytes_per_server_for_hot_fraction"]
        if r["hot_rows_per_server"] < 10**6:
            width = layout_of(dim, optimizer).width
            assert Arena(width, MemoryBudget(plan.ram_tier_bytes)).max_rows >= r["hot_rows_per_server"]
    assert "--memory-bytes 112M" in format_report(size_report(200_000, 8, "adagrad", 1, 1.0))

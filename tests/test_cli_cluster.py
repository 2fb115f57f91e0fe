"""The cluster commands as a user reads them (worker/cli_cluster.py): what `ps-worker shrink` and `ps-worker
checkpoint save` print."""

import logging

import numpy as np

from ps.config import EvictionConfig, TableConfig
from worker.__main__ import main


def test_a_shrink_of_tables_without_an_eviction_rule_says_it_changed_nothing_and_why(servers, capsys, caplog):
    """A table made without `eviction` in its config has no rule for Shrink to run (docs/tables.md): a shrink of
    such tables only keeps every row. The command says so, and where to set a rule; the server's log names the
    tables it ran rules on, none here, and how many it left as they were. Once a table has a rule, no such note."""
    (address,), (server,) = servers(1)
    server.shard.create_table(TableConfig("plain", 2))
    ids = np.arange(3, dtype=np.uint64)
    server.shard.push("plain", ids, np.ones((3, 2), np.float32))
    with caplog.at_level(logging.INFO, logger="ps.engine.shard"):
        assert main(["shrink", "--servers", address]) == 0
    out, err = capsys.readouterr()
    assert "shard 0: dropped 0 ids; 3 rows and 0 pending ids left" in out
    assert "no table has an eviction rule" in err and "--table-config" in err and "docs/tables.md" in err
    assert "dropped 0 ids from no table (0 rows scanned in" in caplog.text
    assert "1 table without an eviction rule left as it was" in caplog.text
    assert main(["shrink", "--servers", address, "--table", "plain", "--json"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == '{"dropped": 0, "num_rows": 3, "pending_ids": 0}'
    assert "table 'plain' has no eviction rule, so the shrink kept every row as it was" in err
    server.shard.create_table(TableConfig("aged", 2, eviction=EvictionConfig(ttl_steps=5)))
    server.shard.push("aged", ids, np.ones((3, 2), np.float32))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ps.engine.shard"):
        assert main(["shrink", "--servers", address]) == 0
    out, err = capsys.readouterr()
    assert "shard 0: dropped 0 ids; 6 rows and 0 pending ids left" in out and "eviction rule" not in err
    assert "dropped 0 ids from aged (3 rows scanned in" in caplog.text
    assert "1 table without an eviction rule left as it was" in caplog.text


def test_the_shrink_note_reads_the_tables_without_a_rule_from_the_replies_and_asks_an_older_server(
    servers, capsys, monkeypatch
):
    """The shards' ShrinkResponses list the tables they left for having no eviction rule: the note needs no
    DescribeTable. A reply without that list (a server that predates it) is asked DescribeTable as before."""
    from protos import ps_pb2
    from worker.client import Client

    addresses, shards = servers(2)
    for server in shards:
        server.shard.create_table(TableConfig("plain", 2))
        server.shard.create_table(TableConfig("aged", 2, eviction=EvictionConfig(ttl_steps=5)))
    described = []
    real_describe = Client.describe_table
    monkeypatch.setattr(Client, "describe_table", lambda c, *a, **k: described.append(a) or real_describe(c, *a, **k))
    assert main(["shrink", "--servers", ",".join(addresses), "--table", "plain"]) == 0
    assert "table 'plain' has no eviction rule" in capsys.readouterr().err and described == []
    assert main(["shrink", "--servers", ",".join(addresses)]) == 0
    assert "eviction rule" not in capsys.readouterr().err and described == []  # aged has one
    real_shrink = Client.shrink

    def older(client, table=""):  # the replies of servers without fields 4 and 5
        return [ps_pb2.ShrinkResponse(dropped=r.dropped, num_rows=r.num_rows, pending_ids=r.pending_ids)
                for r in real_shrink(client, table)]  # fmt: skip

    monkeypatch.setattr(Client, "shrink", older)
    assert main(["shrink", "--servers", ",".join(addresses), "--table", "plain"]) == 0
    assert "table 'plain' has no eviction rule" in capsys.readouterr().err and described == [("plain",)]
    assert main(["shrink", "--servers", ",".join(addresses)]) == 0
    assert "eviction rule" not in capsys.readouterr().err and len(described) == 3


def test_a_checkpoint_save_prints_its_clock_and_rows_with_thousands_separators(servers, capsys, tmp_path):
    """The clock in `ps-worker checkpoint save`'s line reads as the other lines print one: 3,920, not 3920."""
    (address,), (server,) = servers(1, checkpoint_root=str(tmp_path / "root"))
    server.shard.create_table(TableConfig("emb", 2))
    server.shard.push("emb", np.arange(1200, dtype=np.uint64), np.ones((1200, 2), np.float32))
    server.shard.advance_clock(3920)
    clock = server.shard.clock
    assert clock >= 3920
    assert main(["checkpoint", "save", str(tmp_path / "root" / "c"), "--servers", address]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint of 1 shard at clock {clock:,} in {tmp_path / 'root' / 'c'} (" in out, out
    assert out.rstrip().endswith("): emb 1,200 rows"), out

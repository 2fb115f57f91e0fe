"""Client.shrink where one shard fails and another shrank (worker.shrinkreplies): the error names the shard that
shrank and what it dropped, so that nobody sends the Shrink again and decays its rows twice."""

import numpy as np
import pytest

from ps.config import EvictionConfig, InitializerConfig, OptimizerConfig, TableConfig
from ps.diskfull import SHRINK_REMEDY, DiskFullError
from ps.errors import NOTHING_APPLIED, PARTLY_APPLIED, SHARDS_STAY_SHRUNK, CheckpointHoldError, TableNotFoundError
from ps.rows.layout import SHOW
from worker.client import Client

CFG = TableConfig("t", 2, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0),
                  eviction=EvictionConfig(decay=0.5, score_threshold=0.1))  # fmt: skip


def _two_shards_t_on_shard_0(servers):
    """Two shards; table t on shard 0 only (shard 1 as started on a new data dir), holding ids 1 (4 shows) and 2 (1
    show: it scores 0.05 once decayed, under 0.1)."""
    addresses, (s0, s1) = servers(2)
    s0.shard.create_table(CFG)
    s0.shard.push("t", np.array([1, 2], np.uint64), np.ones((2, 2), np.float32), shows=np.array([4, 1], np.float32),
                  clicks=np.zeros(2, np.float32))  # fmt: skip
    return addresses, s0, s1


def test_a_shrink_one_shard_refuses_names_the_shards_that_shrank(servers):
    """Shard 1 lost its table (a new data dir): its NOT_FOUND, and that shard 0 shrank, dropping id 2 and decaying
    id 1 (a Shrink sent again once shard 1 is restored would decay it twice)."""
    addresses, s0, _ = _two_shards_t_on_shard_0(servers)
    with Client(addresses, timeout_s=10, server_timeout_s=5) as client, pytest.raises(TableNotFoundError) as e:
        client.shrink("t")
    said = str(e.value)
    assert said.startswith(f"Shrink failed on shard 1: shard 1 at {addresses[1]}: Shrink failed with NOT_FOUND: "
                           "table 't' does not exist on shard 1")  # fmt: skip
    assert said.endswith(". Of the Shrink, shard(s) 0 shrank (shard 0 dropped 1 ids, 1 rows and 0 pending ids left); "
                         f"{SHARDS_STAY_SHRUNK}: shard(s) 0 must take no Shrink before the next one is due, also once "
                         "shard 1 is mended: one sent again would decay their rows a second time")  # fmt: skip
    assert PARTLY_APPLIED not in said and "clock" not in said, said  # a Shrink has no clock
    table = s0.shard.table("t")
    assert table.peek(np.array([1], np.uint64))[0, table.stats_col + SHOW] == 2.0  # shard 0 did shrink: 4 * 0.5


def test_a_shrink_one_shard_refuses_while_a_checkpoint_holds_it_says_to_wait_for_the_next_one(servers):
    """Shard 1 is held by a checkpoint: its refusal (CheckpointHoldError, nothing applied there) loses its advice to
    send the Shrink once that checkpoint has ended (CheckpointHoldError.shrink_remedy), and the error says instead
    that shard 0 shrank and that no Shrink goes before the next one is due, also once shard 1's checkpoint has ended
    (shard 0's rows would decay twice): when to send a Shrink is said once."""
    addresses, s0, s1 = _two_shards_t_on_shard_0(servers)
    s1.shard.create_table(CFG)
    s1.shard.hold(60)
    with Client(addresses, timeout_s=10, server_timeout_s=5) as client, pytest.raises(CheckpointHoldError) as e:
        client.shrink("t")
    said = str(e.value)
    assert said.startswith(f"Shrink failed on shard 1: shard 1 at {addresses[1]}: Shrink failed with "
                           "FAILED_PRECONDITION: shard 1: a checkpoint holds it since ")  # fmt: skip
    assert said.endswith(". Of the Shrink, shard(s) 0 shrank (shard 0 dropped 1 ids, 1 rows and 0 pending ids left); "
                         f"{SHARDS_STAY_SHRUNK}: shard(s) 0 must take no Shrink before the next one is due, also once "
                         "shard 1's checkpoint has ended: one sent again would decay their rows a second time")  # fmt: skip
    assert CheckpointHoldError.shrink_remedy not in said and said.count("checkpoint has ended") == 1, said
    assert "while a checkpoint holds it or saves. Of the Shrink, shard(s) 0 shrank (" in said, said


def test_a_shrink_every_shard_refuses_raises_the_first_refusal_as_it_is(servers):
    """No shard holds table u: nothing shrank, and the error is shard 0's refusal, unchanged."""
    addresses, _, _ = _two_shards_t_on_shard_0(servers)
    with Client(addresses, timeout_s=10, server_timeout_s=5) as client, pytest.raises(TableNotFoundError) as e:
        client.shrink("u")
    assert str(e.value).startswith(f"shard 0 at {addresses[0]}: Shrink failed with NOT_FOUND: table 'u' does not")


def test_a_full_disk_on_one_shard_while_another_shrank_says_to_send_no_shrink_once_space_is_freed(servers):
    """Shard 1's disk is full: the error, in a full disk's words and with its fields, says to free space and wait
    for the next Shrink (not to retry), and no longer that nothing was applied: shard 0 shrank."""
    addresses, s0, s1 = _two_shards_t_on_shard_0(servers)
    s1.shard.create_table(CFG)

    def disk_full(name: str = "") -> dict:
        raise DiskFullError.of("No space left on device", "writing the rows of table 't' in data dir D")

    s1.shard.shrink = disk_full
    with Client(addresses, timeout_s=10, server_timeout_s=5) as client, pytest.raises(DiskFullError) as e:
        client.shrink()
    said = str(e.value)
    assert said == (
        f"the server's disk is full (No space left on device): shard 1 at {addresses[1]}: Shrink failed with "
        "RESOURCE_EXHAUSTED: writing the rows of table 't' in data dir D; free space on that disk (or raise the "
        f"quota) and {SHRINK_REMEDY}; Shrink failed on shard 1. Of the Shrink, shard(s) 0 shrank (shard 0 dropped 1 "
        f"ids, 1 rows and 0 pending ids left); {SHARDS_STAY_SHRUNK}: shard(s) 0 must take no Shrink before the next "
        "one is due, also once shard 1 is mended: one sent again would decay their rows a second time"
    )
    assert (e.value.remedy, e.value.reason, e.value.refused_by) == (SHRINK_REMEDY, "No space left on device", 1)
    assert NOTHING_APPLIED not in said and e.value.outcome.startswith("Shrink failed on shard 1. Of the Shrink")


# a path of 1,213 characters, "é" among them: the shard's message, clipped to 1,024 bytes, cannot hold it
LONG_DIR = "/data/donn\u00e9es/" + "/".join(f"{i:02d}" + "d" * 97 for i in range(12))


def _quota_on_shard_1(s1) -> None:
    """Shard 1's Shrink fails for a spent disk quota under LONG_DIR."""

    def quota(name: str = "") -> dict:
        raise DiskFullError.of("Disk quota exceeded", f"writing the rows of table 't' in data dir {LONG_DIR}",
                               disk=LONG_DIR)  # fmt: skip

    s1.shard.create_table(CFG)
    s1.shard.shrink = quota


def test_a_quota_refusal_with_a_long_path_reaches_the_client_with_its_fields(servers):
    """The refusal's fields cross beside its message (ps.errornames), whole: the client's error says the quota is
    spent on the disk of LONG_DIR, once, and to wait for the next Shrink, though the message that crossed was cut
    short of the path."""
    addresses, _, s1 = _two_shards_t_on_shard_0(servers)
    _quota_on_shard_1(s1)
    with Client(addresses, timeout_s=10, server_timeout_s=5) as client, pytest.raises(DiskFullError) as e:
        client.shrink()
    assert (e.value.reason, e.value.disk, e.value.remedy) == ("Disk quota exceeded", LONG_DIR, SHRINK_REMEDY)
    assert e.value.refused_by == 1
    assert str(e.value) == (
        f"the server's disk is full (Disk quota exceeded): shard 1 at {addresses[1]}: Shrink failed with "
        f"RESOURCE_EXHAUSTED: writing the rows of table 't' in data dir {LONG_DIR}; free space on the disk of "
        f"{LONG_DIR} (or raise the quota) and {SHRINK_REMEDY}; Shrink failed on shard 1. Of the Shrink, shard(s) 0 "
        f"shrank (shard 0 dropped 1 ids, 1 rows and 0 pending ids left); {SHARDS_STAY_SHRUNK}: shard(s) 0 must "
        "take no Shrink before the next one is due, also once shard 1 is mended: one sent again would decay their "
        "rows a second time"
    )


def test_a_quota_refusal_of_a_shard_that_sends_no_fields_is_reworded_as_its_message(servers, monkeypatch):
    """A shard that names the class but sends no fields (an older server): the client's DiskFullError has its
    message alone, its fields empty (none made up: no reason, no remedy), and the Shrink's error is that message
    reworded, in the shard's words, then what shard 0 changed."""
    from ps import service_calls

    monkeypatch.setattr(service_calls, "error_metadata", lambda e: (("sparseps-error", type(e).__name__),))
    addresses, _, s1 = _two_shards_t_on_shard_0(servers)
    _quota_on_shard_1(s1)
    with Client(addresses, timeout_s=10, server_timeout_s=5) as client, pytest.raises(DiskFullError) as e:
        client.shrink()
    fields = (e.value.reason, e.value.what, e.value.disk, e.value.outcome, e.value.remedy, e.value.refused_by)
    assert fields == ("", "", "", "", "", 1)
    said = str(e.value)
    assert said.startswith(f"Shrink failed on shard 1: shard 1 at {addresses[1]}: Shrink failed with "
                           "RESOURCE_EXHAUSTED: the server's disk is full (Disk quota exceeded): writing the rows of "
                           "table 't' in data dir /data/donn\u00e9es/"), said  # fmt: skip
    assert said.count("the server's disk is full") == 1 and "No space left on device" not in said, said
    assert said.endswith(f"more bytes cut). Of the Shrink, shard(s) 0 shrank (shard 0 dropped 1 ids, 1 rows and 0 "
                         f"pending ids left); {SHARDS_STAY_SHRUNK}: shard(s) 0 must take no Shrink before the next "
                         "one is due, also once shard 1 is mended: one sent again would decay their rows a second "
                         "time"), said  # fmt: skip


def test_a_full_disk_refusal_without_fields_says_to_wait_for_the_next_shrink_not_to_retry():
    """A client's copy of a shard's DiskFullError that came without its fields (over MAX_FIELDS_BYTES, its message
    whole) ends its disk-full sentence "and retry": the Shrink's error says SHRINK_REMEDY there instead, as the
    outcome after it does, its fields left "" (none came); a message cut short keeps its words."""
    from protos import ps_pb2
    from worker.shrinkreplies import shrink_replies

    head = "shard 1 at h:1: Shrink failed with RESOURCE_EXHAUSTED: "
    shard_said = str(DiskFullError.of("Disk quota exceeded", "writing the rows of table 't' in data dir /d"))
    assert shard_said.endswith("(or raise the quota) and retry; nothing was applied"), shard_said
    shrank = ps_pb2.ShrinkResponse(dropped=1, num_rows=1, pending_ids=0)
    fieldless = DiskFullError.received(head + shard_said, head, {})
    with pytest.raises(DiskFullError) as e:
        shrink_replies([shrank, fieldless])
    said = str(e.value)
    assert said.startswith(f"Shrink failed on shard 1: {head}the server's disk is full (Disk quota exceeded): "
                           "writing the rows of table 't' in data dir /d; free space on that disk (or raise the quota) "
                           f"and {SHRINK_REMEDY}. Of the Shrink, shard(s) 0 shrank"), said  # fmt: skip
    assert "retry" not in said and NOTHING_APPLIED not in said, said
    assert (e.value.reason, e.value.what, e.value.remedy) == ("", "", "")
    assert str(fieldless) == head + shard_said  # the refusal itself is not changed

    cut = DiskFullError.received(head + shard_said[:60] + " ... (99 more bytes cut)", head, {})
    with pytest.raises(DiskFullError) as e:
        shrink_replies([shrank, cut])
    assert str(e.value).startswith(f"Shrink failed on shard 1: {head}{shard_said[:60]} ... (99 more bytes cut). Of")

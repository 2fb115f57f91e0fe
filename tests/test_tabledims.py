"""A Client's dim of a table (worker.tabledims): after another client replaced the table with one of another dim
(CreateTable replace_untrained), a pull says so (TableReplacedError, both dims), not that its rows have the wrong
byte length; describe_table reads the dim anew."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ps.config import InitializerConfig, OptimizerConfig, TableConfig
from ps.errors import PsError
from tests.conftest import random_ids
from worker.client import Client
from worker.tabledims import TableReplacedError


def _table(dim: int) -> TableConfig:
    return TableConfig("t", dim, InitializerConfig("zeros", 0.0), OptimizerConfig("sgd", 1.0))


def test_a_pull_of_a_table_another_client_replaced_with_another_dim_says_so(servers):
    addresses, _ = servers(2)
    ids = random_ids(20, seed=3)
    with Client(addresses, timeout_s=10, server_timeout_s=5) as first, Client(addresses, timeout_s=10) as other:
        first.wait_ready()
        other.wait_ready()
        first.create_table(_table(2))
        np.testing.assert_array_equal(first.pull("t", ids), np.zeros((20, 2), np.float32))
        other.create_table(_table(15), replace_untrained=True)  # untrained: a pull makes no row
        for pull in (lambda: first.pull("t", ids), lambda: first.pull_many([("t", ids), ("t", ids[:3])])):
            with pytest.raises(TableReplacedError) as replaced:
                pull()
            said = str(replaced.value)
            assert re.fullmatch(
                r"shard [01] at \S+: table 't' has dim 15, not the dim 2 this client read when it opened the table: "
                r"another client replaced it since \(CreateTable replace_untrained\) with a table of dim 15; the rows "
                r"pulled were not returned\. A model built for dim 2 cannot use it: start again on the table as it "
                r"is now \(a new client, or describe_table\('t'\) to read its dim anew\)",
                said,
            ), said
            assert replaced.value.status == "FAILED_PRECONDITION"
        assert first.dim("t") == 2  # kept: the caller's model is of dim 2
        first.describe_table("t")
        assert first.dim("t") == 15
        np.testing.assert_array_equal(first.pull("t", ids), np.zeros((20, 15), np.float32))


def test_a_push_of_a_table_another_client_replaced_with_another_dim_says_so_as_a_pull_does(servers):
    """The shard knows the dims of the tables of a name it replaced: a push of such a dim is refused in the words of
    the pull's TableReplacedError (ps.replacedstate.table_replaced), and changes nothing; a dim no table of the
    name had keeps the plain refusal."""
    addresses, (s0, s1) = servers(2)
    ids = random_ids(20, seed=4)
    with Client(addresses, timeout_s=10) as first, Client(addresses, timeout_s=10) as other:
        first.wait_ready()
        other.wait_ready()
        first.create_table(_table(2))
        other.create_table(_table(15), replace_untrained=True)
        with pytest.raises(PsError) as replaced:
            first.push("t", ids, np.ones((20, 2), np.float32))
        said = str(replaced.value)
        assert replaced.value.status == "INVALID_ARGUMENT"
        assert re.search(
            r"push says dim 2: table 't' has dim 15, not the dim 2 this client read when it opened the table: another "
            r"client replaced it since \(CreateTable replace_untrained\) with a table of dim 15\. A model built for "
            r"dim 2 cannot use it: start again on the table as it is now \(a new client, or describe_table\('t'\) to "
            r"read its dim anew\)",
            said,
        ), said
        assert [info.num_rows for info in other.describe_table("t")] == [0, 0]
        first._dims.note("t", 7)  # a dim no table named t had on these shards
        with pytest.raises(PsError, match=r"push says dim 7, but table 't' has dim 15\. This push"):
            first.push("t", ids, np.ones((20, 7), np.float32))

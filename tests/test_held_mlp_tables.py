"""A training job's start against the tables the servers hold (worker/tables.py held_specs, keep_held_initializers):
each table described once, and an MLP table held whole keeping the initializer it was made with."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from ps import codec
from ps.config import InitializerConfig, TableConfig
from tests.worker_runs import SMALL, run
from worker.client import Client
from worker.cluster import LocalCluster
from worker.tables import keep_held_initializers

OUTPUT = "dense.deepfm.mlp.1.weight"  # deepfm's MLP output layer under --hidden 4: 4 rows


def held(servers: str) -> tuple[dict[str, int], InitializerConfig]:
    """({table: rows over the shards}, the output layer's initializer) as the servers hold them."""
    with Client(servers.split(",")) as client:
        rows = Counter()
        for shard in client.stats():
            for t in shard.tables:
                rows[t.name] += t.num_rows
        init = codec.table_config_from_proto(client.describe_table(OUTPUT)[0].spec).initializer
    return dict(rows), init


def recorded(monkeypatch) -> list[str]:
    """The calls of Client.describe_table ("describe <table>") and of Client.create_table ("create"), in order."""
    events: list[str] = []
    real_describe, real_create = Client.describe_table, Client.create_table

    def describe(self: Client, name: str, *args, **kwargs) -> list:
        events.append(f"describe {name}")
        return real_describe(self, name, *args, **kwargs)

    def create(self: Client, *args, **kwargs) -> None:
        events.append("create")
        return real_create(self, *args, **kwargs)

    monkeypatch.setattr(Client, "describe_table", describe)
    monkeypatch.setattr(Client, "create_table", create)
    return events


def test_a_jobs_start_describes_each_table_it_holds_once(capsys, monkeypatch):
    """A run on a trained deepfm (its MLP tables held whole, whose initializers the run takes) asks DescribeTable of
    each of its tables once before it makes them: keep_held_initializers and check_tables read one held_specs."""
    events = recorded(monkeypatch)
    with LocalCluster(2) as cluster:
        servers = ",".join(cluster.addresses)
        argv = ["train", "--servers", servers, "--model", "deepfm", "--hidden", "4", "--epochs", "1", "--no-progress",
                *SMALL]  # fmt: skip
        assert run(argv, capsys)[0] == 0
        rows, _ = held(servers)
        assert rows[OUTPUT] == 4 and len(rows) == 6, rows  # deepfm, 4 MLP tables, the logit bias: all trained
        events.clear()
        code, err = run(argv, capsys)
        assert code == 0, err
    start = events[: events.index("create")]
    assert Counter(start) == Counter(f"describe {name}" for name in rows), start


def test_a_table_config_initializer_of_an_mlp_table_held_whole_is_refused_unless_it_is_the_held_one(
    capsys, tmp_path, monkeypatch
):
    """--table-config's initializer of an MLP table is taken where the table is new; once the servers hold it
    trained and whole, another is refused before anything is created, naming the file, the table, the key, both
    initializers and what to do; the one it was made with is taken, as is no initializer at all."""
    events = recorded(monkeypatch)
    given = tmp_path / "given.toml"
    given.write_text(f'["{OUTPUT}"]\ninitializer = {{ name = "uniform", scale = 0.5, seed = 7 }}\n')
    other = tmp_path / "other.toml"
    other.write_text(f'["{OUTPUT}"]\ninitializer = {{ name = "uniform", scale = 0.25, seed = 7 }}\n')
    with LocalCluster(1) as cluster:
        servers = cluster.addresses[0]
        base = ["train", "--servers", servers, "--model", "deepfm", "--hidden", "4", "--epochs", "1", "--no-progress",
                *SMALL]  # fmt: skip
        assert run([*base, "--table-config", str(given)], capsys)[0] == 0  # a new table: the file's is taken
        rows, init = held(servers)
        assert rows[OUTPUT] == 4 and init == InitializerConfig("uniform", 0.5, 7), (rows, init)
        events.clear()
        code, err = run([*base, "--table-config", str(other)], capsys)
        assert code == 2 and "create" not in events, (code, events, err)
        assert (
            f'{other}: table {OUTPUT}: initializer {{ name = "uniform", scale = 0.25, seed = 7 }} would make no '
            "row: the servers hold this MLP parameter table trained and whole (all 4 rows pushed, made with "
            f'initializer {{ name = "uniform", scale = 0.5, seed = 7 }}), and this run trains those rows further. '
            f'Leave `initializer` out of ["{OUTPUT}"] in {other} (the run takes the table as held), or train a new '
            "model with it (other servers, or servers started on new data dirs); nothing was created"
        ) in err, err
        assert "Traceback" not in err and held(servers) == (rows, init)
        for ok in ([], ["--table-config", str(given)]):  # the held initializer, given or not
            code, err = run([*base, *ok], capsys)
            assert code == 0, err
            assert held(servers)[1] == init


def test_an_initializer_that_makes_the_held_rows_is_not_refused():
    """zeros makes zeros whatever its scale and seed: a file's `{ name = "zeros" }` (scale 0.01 by default) against a
    table held with zeros of scale 0 is the held initializer; uniform against it is not."""
    name = OUTPUT
    stats = [SimpleNamespace(tables=[SimpleNamespace(name=name, trained=True, num_rows=4)])]
    specs = {name: TableConfig(name, 1, InitializerConfig("zeros", 0.0))}
    given = [TableConfig(name, 1, InitializerConfig("zeros", 0.01, 7))]
    (kept,) = keep_held_initializers(given, {name: 4}, stats, specs, "f.toml", frozenset([name]))
    assert kept.initializer == InitializerConfig("zeros", 0.0)
    other = [TableConfig(name, 1, InitializerConfig("uniform", 0.01))]
    with pytest.raises(
        ValueError, match=r'initializer \{ name = "uniform", scale = 0.01, seed = 0 \} would make no row'
    ):
        keep_held_initializers(other, {name: 4}, stats, specs, "f.toml", frozenset([name]))

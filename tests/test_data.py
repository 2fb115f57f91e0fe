"""worker/data.py's DataSource: a job's line count and each worker's share of it, as the readers share the lines."""

from __future__ import annotations

import gzip

import pytest

from worker.data import DataSource
from worker.job import prepare
from worker.train_config import TrainConfig


def _write_files(tmp_path, sizes):
    """A directory of CSV files of these many records each (every other one gzip'ed); their total."""
    for k, n in enumerate(sizes):
        text = "".join(["label,site\n"] + [f"{(i + k) % 2},s{k}_{i % 3}\n" for i in range(n)]).encode()
        name = tmp_path / f"part-{k}.csv{'.gz' * (k % 2)}"
        name.write_bytes(gzip.compress(text) if k % 2 else text)
    return sum(sizes)


def _config(tmp_path, worker_id, num_workers):
    return TrainConfig(data=str(tmp_path), servers=("127.0.0.1:1",), worker_id=worker_id, num_workers=num_workers,
                       job_id=1, batch_size=4, max_bad_lines=0, validation_fraction=0.0, shuffle=False)  # fmt: skip


@pytest.mark.parametrize("sizes", [[10], [1, 300, 2, 7], [20, 20, 20]])
@pytest.mark.parametrize("num_workers", [1, 3, 7])
def test_each_workers_count_is_its_share_and_the_job_counts_every_line(tmp_path, sizes, num_workers):
    total = _write_files(tmp_path, sizes)
    read, counted, job = [], [], set()
    for i in range(num_workers):
        data = DataSource(_config(tmp_path, i, num_workers), default_table="t")
        counted.append(data.examples)
        read.append(sum(len(b) for b in data.train()))
        job.add(getattr(data, "job_examples", None))
    assert counted == read and sum(read) == total
    assert job == {total}


def test_the_recipe_line_names_every_line_of_the_data_whatever_the_workers(tmp_path):
    total = _write_files(tmp_path, [1, 300, 2, 7])
    for i in range(3):
        _, _, _, line = prepare(_config(tmp_path, i, 3), needs_servers=False)
        assert line.startswith(f"small-data recipe for {total} lines of training data "), line

"""worker.formats.file_residue, the one rule of which lines of which file a worker reads: read_batches reads by it,
worker.data.share_examples and worker.formats.idle_workers count by it. The oracle: the examples each worker's
read_batches yields, of files every line of which holds data."""

from __future__ import annotations

import numpy as np
import pytest

from worker.data import share_examples
from worker.formats import file_residue, idle_workers, read_batches
from worker.linecount import count_data_upto
from worker.schema_builtin import builtin_schema

SCHEMA = builtin_schema("libsvm", default_table="t", default_dim=4, libsvm_fields=1)


def write_files(tmp_path, lines_per_file: list[int]) -> list[str]:
    """Files of libsvm lines, every line one of data."""
    paths = []
    for k, lines in enumerate(lines_per_file):
        path = tmp_path / f"f{k}.svm"
        path.write_text("".join(f"{j % 2} {j + 1}:1\n" for j in range(lines)))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("lines_per_file", [[1], [5], [3, 0, 2], [1, 1, 1, 1], [7, 4], [0, 9, 1]])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_each_workers_count_is_the_lines_it_reads_and_the_counts_sum_to_the_lines(tmp_path, lines_per_file, n):
    """For n over and under the lines of a file (n > lines: some workers read none of it), and several files."""
    paths = write_files(tmp_path, lines_per_file)
    spec = ",".join(paths)
    counted = count_data_upto(paths, None, "libsvm", modulus=n)
    read = [sum(map(len, read_batches(spec, SCHEMA, 4, worker_id=i, num_workers=n))) for i in range(n)]
    assert [share_examples(counted, i, n) for i in range(n)] == read
    assert sum(read) == sum(lines_per_file)
    assert idle_workers(counted.per_file_residues, n) == [i for i in range(n) if not read[i]]


@pytest.mark.parametrize("n", [1, 2, 3, 7])
@pytest.mark.parametrize("files", [1, 2, 5, 9])
def test_each_line_has_one_worker_and_files_of_one_line_spread_over_the_workers(n, files):
    for k in range(files):
        for j in range(2 * n + 1):
            assert sum(j % n == file_residue(i, k, n) for i in range(n)) == 1, (k, j)
        assert file_residue(np.arange(n), k, n).tolist() == [file_residue(i, k, n) for i in range(n)]
    first_line_readers = {next(i for i in range(n) if file_residue(i, k, n) == 0) for k in range(files)}
    assert len(first_line_readers) == min(files, n)

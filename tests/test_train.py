"""worker.train's data plumbing: progress totals and one field count for the train and eval files of libsvm."""

from __future__ import annotations

import gzip

import pytest

from worker.train import DataSource, TrainConfig, count_lines


def test_count_lines_reads_gzip_and_drops_a_csv_header(tmp_path):
    plain, packed = tmp_path / "a.csv", tmp_path / "a.csv.gz"
    text = "label,c1\n" + "".join(f"{i % 2},x{i}\n" for i in range(7))
    plain.write_text(text)
    with gzip.open(packed, "wt") as f:
        f.write(text)
    assert count_lines(str(plain)) == count_lines(str(packed)) == 8
    assert count_lines(str(packed), header=True) == 7


def test_libsvm_eval_file_is_read_with_the_training_files_fields(tmp_path):
    train, evals = tmp_path / "train.svm", tmp_path / "eval.svm"
    train.write_text("1 3:1 8:1 9:1 12:1\n0 4:1 8:1\n")
    evals.write_text("0 3:1\n1 5:1 6:1 7:1\n")  # its first line has 1 feature: alone it would mean K = 1
    cfg = TrainConfig(data=str(train), eval_data=str(evals), format="libsvm", batch_size=10)
    data = DataSource(cfg)
    assert [b.ids.shape for b in data.train()] == [(2, 5)]  # K = 4, plus the bias
    assert [b.ids.shape for b in data.eval()] == [(2, 5)]
    assert data.spec().num_fields == 5
    assert DataSource(TrainConfig(data=str(evals), format="libsvm", libsvm_fields=4)).spec().num_fields == 5
    with pytest.raises(ValueError, match="--libsvm-fields 3: expected >= 1, with --format libsvm"):
        TrainConfig(data=str(train), libsvm_fields=3).validate()

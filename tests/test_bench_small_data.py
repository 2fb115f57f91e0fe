"""benchmarks/small_data.py: its --against/--set settings read as TrainConfig values of each field's type."""

from tests.benchscripts import load_benchmark

sd = load_benchmark("small_data")


def test_settings_take_each_fields_type_and_a_dict_of_name_number_pairs():
    got = sd.settings(["batch_size=256", "learning_rate=0.1", "optimizer=adagrad", "optimizer_params=l2:1000,l1:1"])
    assert got == {"batch_size": 256, "learning_rate": 0.1, "optimizer": "adagrad",
                   "optimizer_params": {"l2": 1000.0, "l1": 1.0}}  # fmt: skip
    assert isinstance(got["batch_size"], int) and isinstance(got["learning_rate"], float)

"""Table settings: TOML files, validation, and initial rows that do not depend on the cluster."""

import dataclasses
import math

import numpy as np
import pytest

from ps import codec
from ps.config import (
    DEFAULT_LEARNING_RATES,
    OPTIMIZER_PARAMS,
    AdmissionConfig,
    EvictionConfig,
    InitializerConfig,
    OptimizerConfig,
    TableConfig,
)
from ps.errors import InvalidArgumentError, TableExistsError
from ps.newtable import check_new
from ps.table_toml import table_configs_from_toml
from worker.client import Client
from worker.train_config import TrainConfig

EXAMPLE = """
[fm]
dim = 9
weight_bound = 10.0
initializer = { name = "normal", scale = 0.05, seed = 7 }
optimizer = { name = "ftrl", learning_rate = 0.05, params = { l1 = 1.0, l2 = 0.1 } }
admission = { min_count = 2 }
eviction = { ttl_steps = 1000, score_threshold = 0.5, decay = 0.98 }
"""


def test_a_toml_file_gives_every_setting():
    fields = table_configs_from_toml(EXAMPLE)["fm"]
    cfg = TableConfig(**fields).normalized()
    assert cfg.dim == 9 and cfg.weight_bound == 10.0 and cfg.initializer.name == "normal"
    assert cfg.optimizer == OptimizerConfig("ftrl", 0.05, {"beta": 1.0, "l1": 1.0, "l2": 0.1})
    assert cfg.admission == AdmissionConfig(min_count=2)
    assert cfg.eviction == EvictionConfig(ttl_steps=1000, score_threshold=0.5, decay=0.98)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[fm]\nlearning_rate = 1", "unknown key 'learning_rate'"),
        ("[fm]\noptimizer = { name = 'sgd', lr = 1 }", r"\[fm.optimizer\] has unknown keys \['lr'\]"),
        ("[fm\n", "not valid TOML"),
        ("fm = 3", r"\[fm\] must be a table"),
        ("[fm]\noptimizer = { learning_rate = 0.1 }", r"\[fm.optimizer\] needs a name, one of \['adagrad'"),
        ("[fm]\noptimizer = 'adagrad'", r"\[fm\] optimizer must be an inline table of its settings \(optimizer = \{"),
        (
            "[tables.fm]\noptimizer = { name = 'sgd' }",
            r"unknown key 'fm'; .* \(a table's settings are a section of "
            r"their own: \[fm\], not \[tables.fm\]\)",
        ),  # fmt: skip
        ("[fm]\noptimiser = { name = 'sgd' }", r"unknown key 'optimiser'; .* \(did you mean 'optimizer'\?\)"),
        ("[fm]\noptimizer = { name = [1] }", r"\[fm\] optimizer.name must be a string, got \[1\]"),
        ("[fm]\noptimizer = { name = 'sgd', learning_rate = '0.05' }", r"learning_rate must be a number, got '0.05'"),
        ("[fm]\nadmission = { min_count = 2.5 }", r"\[fm\] admission.min_count must be an integer, got 2.5"),
        ("[fm]\noptimizer = { name = 'ftrl', params = { l1 = 'x' } }", r"optimizer.params.l1 must be a number"),
        ("[fm]\nweight_bound = [1]", r"\[fm\] weight_bound must be a number, got \[1\]"),
    ],
)
def test_bad_toml_names_the_table_and_key(text, message):
    with pytest.raises(InvalidArgumentError, match=message):
        table_configs_from_toml(text)


@pytest.mark.parametrize(
    "cfg, message",
    [
        (TableConfig("t", 2, admission=AdmissionConfig(min_count=0)), "min_count must be in"),
        (TableConfig("t", 2, admission=AdmissionConfig(probability=0.0)), r"probability must be in \(0, 1\]"),
        (TableConfig("t", 2, eviction=EvictionConfig(decay=1.5)), r"decay must be in \(0, 1\]"),
        (TableConfig("t", 2, eviction=EvictionConfig(ttl_steps=-1)), "ttl_steps must be >= 0"),
        (TableConfig("t", 2, weight_bound=-1.0), "weight_bound must be finite, >= 0"),
        (TableConfig("t", 2, l2=-0.5), "table 't': l2 must be finite, >= 0"),
        (TableConfig("t", 2, l2=math.nan), "table 't': l2 must be finite, >= 0"),
        (TableConfig("t", 2, l2=math.inf), "table 't': l2 must be finite, >= 0"),
        (TableConfig("t", 2, optimizer=OptimizerConfig("ftrl"), l2=0.1), "table 't': l2 does not apply to ftrl"),
        (TableConfig("t", 2, features="schema 1"), r"table 't': features 'schema 1' is invalid; expected at most 64"),
        (TableConfig("t", 2, features="x" * 65), r"features 'x+' is invalid"),
    ],
)
def test_invalid_table_settings_are_rejected(cfg, message):
    with pytest.raises(InvalidArgumentError, match=message):
        cfg.validate()


TINY = 1e-320  # subnormal in float64, 0 in float32
TINY_SAID = " must be 0 or at least 1e-30 in magnitude (a smaller one is 0 or subnormal in float32), got 1e-320"
FLOAT_OPTIONS = {  # each float option of a table at a value other than 0 too small for float32, and its message
    "initializer scale": (dict(initializer=InitializerConfig(scale=TINY)), "initializer scale" + TINY_SAID),
    "weight_bound": (dict(weight_bound=TINY), "weight_bound" + TINY_SAID),
    "l2": (dict(l2=TINY), "l2" + TINY_SAID),
    "adagrad initial_accumulator": (
        dict(optimizer=OptimizerConfig("adagrad", 0.1, {"initial_accumulator": TINY})),
        "adagrad initial_accumulator" + TINY_SAID),
    "adam beta1": (dict(optimizer=OptimizerConfig("adam", 0.1, {"beta1": TINY})), "adam beta1" + TINY_SAID),
    "ftrl l1": (dict(optimizer=OptimizerConfig("ftrl", 0.1, {"l1": TINY})), "ftrl l1" + TINY_SAID),
    "ftrl l2": (dict(optimizer=OptimizerConfig("ftrl", 0.1, {"l2": TINY})), "ftrl l2" + TINY_SAID),
    "ftrl beta": (dict(optimizer=OptimizerConfig("ftrl", 0.1, {"beta": TINY})), "ftrl beta" + TINY_SAID),
    "score_threshold": (dict(eviction=EvictionConfig(score_threshold=TINY)), "eviction score_threshold" + TINY_SAID),
    "nonclk_coeff": (dict(eviction=EvictionConfig(nonclk_coeff=TINY)), "eviction nonclk_coeff" + TINY_SAID),
    "click_coeff": (dict(eviction=EvictionConfig(click_coeff=TINY)), "eviction click_coeff" + TINY_SAID),
    "decay": (dict(eviction=EvictionConfig(decay=TINY)), "eviction decay must be in [1e-30, 1] (a smaller one is 0 "
              "or subnormal in float32: it would zero the counts), got 1e-320"),
    "admission probability": (dict(admission=AdmissionConfig(probability=TINY)), "admission probability must be in "
                              "[2**-53, 1] (a draw is a multiple of 2**-53, so a smaller one admits as 2**-53 does), "
                              "got 1e-320"),
}  # fmt: skip


@pytest.mark.parametrize("option", sorted(FLOAT_OPTIONS))
def test_a_float_option_too_small_for_float32_but_not_0_is_refused_for_a_new_table_naming_it_and_its_range(option):
    """1e-320 is 0 in the kernels' float32 (a decay of it zeroes the counts; a weight_bound of it is no bound): a
    new table may not have it (check_new), while validate(), which a stored table's config meets when its data dir
    opens, takes it."""
    cfg = TableConfig("t", 2, **dict(FLOAT_OPTIONS[option][0]))
    cfg.validate()
    with pytest.raises(InvalidArgumentError) as refused:
        check_new(cfg)
    assert str(refused.value) == "table 't': " + FLOAT_OPTIONS[option][1]


@pytest.mark.parametrize("optimizer", [OptimizerConfig("sgd", TINY), OptimizerConfig("adam", 0.1, {"epsilon": TINY})])
def test_a_learning_rate_or_epsilon_below_1e_30_is_refused_by_validate(optimizer):
    with pytest.raises(InvalidArgumentError, match=r"must be finite, >= 1e-30 and <= 1e\+30, got 1e-320$"):
        TableConfig("t", 2, optimizer=optimizer).validate()


def test_the_smallest_float_options_other_than_0_are_taken():
    """The bounds themselves: 1e-30 for each option whose range spans 0 (and for decay), 2**-53 for admission."""
    small = 1e-30
    for cfg in [
        TableConfig("t", 2, initializer=InitializerConfig(scale=small), weight_bound=small, l2=small,
                    optimizer=OptimizerConfig("adagrad", small, {"initial_accumulator": small, "epsilon": small}),
                    admission=AdmissionConfig(probability=2.0**-53),
                    eviction=EvictionConfig(score_threshold=small, decay=small, nonclk_coeff=-0.0)),
        TableConfig("t", 2, optimizer=OptimizerConfig("ftrl", small, {"beta": small, "l1": small, "l2": small})),
        TableConfig("t", 2, optimizer=OptimizerConfig("adam", small, {"beta1": small, "beta2": 0.0})),
    ]:  # fmt: skip
        cfg.validate()
        check_new(cfg)


def test_a_toml_decay_of_a_subnormal_is_refused_for_a_new_table():
    cfg = TableConfig(**table_configs_from_toml("[emb]\ndim = 4\neviction = { decay = 1e-320 }")["emb"])
    cfg.validate()
    with pytest.raises(InvalidArgumentError, match=r"^table 'emb': eviction decay must be in \[1e-30, 1\]"):
        check_new(cfg)


@pytest.mark.parametrize("name", sorted(OPTIMIZER_PARAMS))
def test_an_optimizer_without_a_learning_rate_takes_its_own_default_everywhere(name):
    """A table config, a CreateTable spec without the field, and --optimizer without --learning-rate agree."""
    from_toml = TableConfig(**table_configs_from_toml(f"[emb]\ndim = 4\noptimizer = {{ name = '{name}' }}")["emb"])
    spec = codec.table_config_to_proto(TableConfig("emb", 4, optimizer=OptimizerConfig(name, 1.0)))
    spec.optimizer.ClearField("learning_rate")
    from_proto = codec.table_config_from_proto(spec)
    from_flags, _, _ = TrainConfig(data="x", optimizer=name).with_recipe(100)
    rates = {from_toml.optimizer.learning_rate, from_proto.optimizer.learning_rate, from_flags.learning_rate}
    assert rates == {DEFAULT_LEARNING_RATES[name]}
    assert TableConfig("emb", 4).optimizer.learning_rate == DEFAULT_LEARNING_RATES["adagrad"]


def test_l2_travels_from_toml_through_the_stored_form_and_the_proto():
    fields = table_configs_from_toml("[emb]\ndim = 4\nl2 = 0.5\noptimizer = { name = 'sgd' }")["emb"]
    cfg = TableConfig(**fields).normalized()
    assert cfg.l2 == 0.5
    assert TableConfig.from_dict(cfg.to_dict()) == cfg
    stored = {k: v for k, v in cfg.to_dict().items() if k != "l2"}  # a stored spec without the key: l2 0
    assert TableConfig.from_dict(stored) == dataclasses.replace(cfg, l2=0.0)
    spec = codec.table_config_to_proto(cfg)
    assert spec.l2 == 0.5 and codec.table_config_from_proto(spec) == cfg
    assert cfg.differences(dataclasses.replace(cfg, l2=0.25)) == ["l2: 0.5 != 0.25"]
    assert TableConfig(**table_configs_from_toml("[emb]\ndim = 4")["emb"]).l2 == 0.0


def test_a_table_created_again_with_another_l2_is_a_conflict(servers):
    cfg = TableConfig("emb", 4, optimizer=OptimizerConfig("adagrad", 0.1), l2=0.5)
    addresses, _ = servers(1)
    with Client(addresses) as client:
        client.create_table(cfg)
        client.create_table(cfg)  # the same spec: a no-op
        assert [info.spec.l2 for info in client.describe_table("emb")] == [0.5]
        with pytest.raises(TableExistsError, match=r"l2: 0.5 != 0.25"):
            client.create_table(dataclasses.replace(cfg, l2=0.25))


def test_initial_rows_do_not_depend_on_shard_count_or_restarts(servers, tmp_path):
    cfg = TableConfig("emb", 8)
    ids = np.random.default_rng(0).integers(0, 2**64 - 1, 500, dtype=np.uint64, endpoint=True)
    pulled = []
    for n, root in ((1, tmp_path / "one"), (3, tmp_path / "three"), (3, tmp_path / "three")):  # last: restart
        addresses, started = servers(n, root=root)
        with Client(addresses) as client:
            client.create_table(cfg)
            pulled.append(client.pull("emb", ids))
        for s in started:
            s.stop(grace_s=0)
    assert np.array_equal(pulled[0], pulled[1]) and np.array_equal(pulled[1], pulled[2])
    assert len(np.unique(pulled[0][:, 0])) == 500  # distinct ids, distinct rows

"""One training step (worker/step.py): --dense-l2 adds l2 * W to the gradients of the MLP's weights only, not to
its biases, the logit bias or FM's projections, and the MLP's step gets them with the rows' push beside it; a step
whose predictions or gradients hold an Inf or NaN says the model diverged and pushes nothing, and scoring's NaN
probabilities name their example, neither after a numpy RuntimeWarning, in both backends; a logit that overflows
to Inf is such a case, not a probability of exactly 0 or 1."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from worker.batch import Bags, Batch, table_ids
from worker.models.numpy_backend import NumpyModel
from worker.models.spec import BIAS_FIELD, FieldSpec, ModelSpec
from worker.scoring import field_tables, predictions
from worker.step import DivergedError, Prepared, Step, check_finite


class _ZeroGrads:
    """A backend whose every gradient is 0: what reaches the MLP's step is the L2 term alone."""

    def forward_backward(self, inputs, params, labels):
        rows = {t: np.zeros_like(r) for t, r in inputs.rows.items()}
        return np.full(len(labels), 0.5, np.float32), rows, {k: np.zeros_like(v) for k, v in params.items()}


class _Dense:
    """A dense path that runs its step here and keeps the gradients it was given."""

    inline = False

    def __init__(self, values):
        self.values, self.given = values, None

    def step(self, grads):
        self.given = {k: v.copy() for k, v in grads.items()}

    def diverged(self, error):
        raise error


class _Source:
    def __init__(self, spec):
        self.spec, self.pushed = spec, []

    def rows(self, step, tids, prepared):
        rng = np.random.default_rng(step)
        return {t: rng.normal(size=(len(ti.uniq), self.spec.row_dim(t))).astype(np.float32) for t, ti in tids.items()}

    def push(self, step, tids, row_grads, extra):
        self.pushed.append(step)
        return []


def test_dense_l2_reaches_the_mlp_weights_and_nothing_else():
    fields = (FieldSpec("a", "wide", 3), FieldSpec("b", "narrow", 2), FieldSpec(BIAS_FIELD, "wide", 3))
    spec = ModelSpec("deepfm", fields, num_dense=1, hidden=(4,))
    params = spec.initial_params(seed=1)
    for k in params:  # no parameter at 0, so that an L2 term reaching any would show
        params[k] = params[k] + np.float32(0.5)
    assert {"proj.narrow", "mlp.0.weight", "mlp.0.bias", "mlp.1.weight", "mlp.1.bias", "logit.bias"} == set(params)
    n = 3
    batch = Batch(np.array([0, 1, 0], np.float32),
                  {f.name: Bags.one_per_example(np.arange(n) + 10 * i) for i, f in enumerate(fields)},
                  np.ones((n, 1), np.float32))  # fmt: skip
    tids = table_ids(batch, field_tables(spec))
    dense, source = _Dense(params), _Source(spec)
    step = Step(spec, _ZeroGrads(), dense, source, dense_l2=0.25)
    try:
        step(Prepared(0, batch, tids, None))
    finally:
        step.pusher.shutdown()
    assert source.pushed == [0] and spec.mlp_weights() == ["mlp.0.weight", "mlp.1.weight"]
    for name, value in params.items():
        want = np.float32(0.25) * value if name in spec.mlp_weights() else np.zeros_like(value)
        np.testing.assert_array_equal(dense.given[name], want, err_msg=name)


def test_models_without_an_mlp_have_no_mlp_weights():
    fields = (FieldSpec("a", "wide", 3), FieldSpec("b", "narrow", 2), FieldSpec(BIAS_FIELD, "wide", 3))
    assert ModelSpec("fm", fields, num_dense=0).mlp_weights() == []
    assert "proj.narrow" in ModelSpec("fm", fields, num_dense=0).initial_params()


class _HugeRows(_Source):
    """Rows of `value` (1e20: FM's sum of squares overflows float32 (Inf - Inf); 3e38: LR's sum of the fields'
    weights overflows to Inf), as the rows of a model trained at too high a learning rate are."""

    def __init__(self, spec, value=1e20):
        super().__init__(spec)
        self.value = value

    def rows(self, step, tids, prepared):
        return {t: np.full((len(ti.uniq), self.spec.row_dim(t)), self.value, np.float32) for t, ti in tids.items()}


def _model(backend):
    """The backend's model class; torch's where torch is installed (a skip naming it where not)."""
    if backend == "torch":
        return pytest.importorskip("worker.models.torch_backend", reason="torch is not installed").TorchModel
    return NumpyModel


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize(("name", "value"), [("fm", 1e20), ("lr", 3e38)])
def test_a_step_whose_model_diverged_says_so_and_pushes_nothing(backend, name, value):
    """Predictions of NaN end the step with DivergedError, which says what diverged and what to change, before any
    push of the rows or of the MLP: FM's Inf - Inf, and LR's logit of Inf (the fields' weights, finite each, sum past
    float32), whose sigmoid would be exactly 1 with finite gradients."""
    model = _model(backend)
    fields = (FieldSpec("a", "wide", 3), FieldSpec("b", "wide", 3), FieldSpec(BIAS_FIELD, "wide", 3))
    spec = ModelSpec(name, fields, num_dense=0)
    n = 4
    batch = Batch(np.array([0, 1, 0, 1], np.float32),
                  {f.name: Bags.one_per_example(np.arange(n) + 10 * i) for i, f in enumerate(fields)},
                  np.zeros((n, 0), np.float32))  # fmt: skip
    dense, source = _Dense(spec.initial_params(seed=1)), _HugeRows(spec, value)
    step = Step(spec, model(spec), dense, source, dense_l2=0.0)
    try:
        with pytest.raises(DivergedError, match=r"^training diverged in step 8: the model's predictions hold nan \(4 "
                           r"of 4 values not finite\).* lower --learning-rate"), warnings.catch_warnings():  # fmt: skip
            warnings.simplefilter("error")  # numpy's overflow and invalid-value warnings: none before the message
            step(Prepared(7, batch, table_ids(batch, field_tables(spec)), None))
    finally:
        step.pusher.shutdown()
    assert source.pushed == [] and dense.given is None


class _HugeTables:
    """Tables whose every row is `value` (a pull_many of worker/steprows.py)."""

    def __init__(self, spec, value):
        self.spec, self.value = spec, value

    def pull_many(self, requests):
        return [np.full((len(ids), self.spec.row_dim(t)), self.value, np.float32) for t, ids in requests]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize(("name", "value"), [("fm", 1e20), ("lr", 3e38)])
def test_scoring_a_model_whose_probabilities_are_nan_says_so_with_no_numpy_warning_before(backend, name, value):
    """NaN probabilities end the scoring with the message naming the example, and numpy prints no RuntimeWarning
    (overflow, invalid value) before it: FM's Inf - Inf, and LR's logit of Inf (two weights of 3e38), whose sigmoid
    would be a probability of exactly 1."""
    fields = (FieldSpec("a", "wide", 3), FieldSpec(BIAS_FIELD, "wide", 3))
    spec = ModelSpec(name, fields, num_dense=0)
    batch = Batch(np.array([0, 1], np.float32), {f.name: Bags.one_per_example(np.arange(2) + 10 * i)
                                                for i, f in enumerate(fields)}, np.zeros((2, 0), np.float32))  # fmt: skip
    tables, params = _HugeTables(spec, value), spec.initial_params(seed=1)
    scored = predictions(tables, spec, _model(backend)(spec), params, [batch], prefetch=0)
    with pytest.raises(ValueError, match=r"^the model's probability for the example of example 1 of a batch of 2 is "
                                         r"NaN \(2 of the batch's 2 examples\)"), warnings.catch_warnings():  # fmt: skip
        warnings.simplefilter("error")
        next(scored)


def test_the_first_non_finite_gradient_is_named_by_table_or_parameter():
    probs = np.full(2, 0.5, np.float32)
    rows = {"wide": np.zeros((3, 2), np.float32), "narrow": np.array([[0, 1], [np.inf, 2]], np.float32)}
    dense = {"mlp.0.weight": np.array([[np.nan]], np.float64)}
    with pytest.raises(DivergedError, match=r"step 1: the model's gradients for table 'narrow' hold inf \(1 of 4"):
        check_finite(0, probs, rows, dense)
    rows["narrow"][1, 0] = 0
    with pytest.raises(DivergedError, match=r"gradients of dense parameter 'mlp.0.weight' hold nan \(1 of 1 "):
        check_finite(0, probs, rows, dense)
    dense["mlp.0.weight"][0, 0] = 1e300  # finite in float64
    check_finite(0, probs, rows, dense)

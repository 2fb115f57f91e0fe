"""The model backends over fields of two tables of different widths (so FM projects the narrower one), bags with
weights and every pooling, and dense features: numpy's hand-written backward pass against finite differences,
every model against a forward written out from spec.py, numpy against torch (autograd), LR and FM over one id per
field against tests/reference_models.py, dropout, large logits, bad inputs; GPU tests skip without CUDA."""

import ast
import dataclasses
import pathlib
import warnings

import numpy as np
import pytest
import torch

from ps.config import OptimizerConfig
from tests.reference_models import MODELS
from tests.test_pooling import oracle_pool, random_bags
from worker.models.numpy_backend import NumpyModel
from worker.models.spec import (
    BIAS_FIELD,
    MODEL_NAMES,
    POOLINGS,
    FieldInput,
    FieldSpec,
    ModelInputs,
    ModelSpec,
    uniform_fields,
)
from worker.models.torch_backend import TorchModel

NUM_ROWS = {"wide": 6, "narrow": 5}  # unique rows per table in a test batch


def make_spec(name, pooling=None, num_dense=2, hidden=(4, 3), dropout=0.0):
    """Fields a (table wide, k=3), b and c (table narrow, k=2), the bias (wide); pooling None: sum, mean, sqrtn."""
    poolings = [pooling] * 3 if pooling else ["sum", "mean", "sqrtn"]
    fields = (
        FieldSpec("a", "wide", 3, poolings[0]),
        FieldSpec("b", "narrow", 2, poolings[1]),
        FieldSpec("c", "narrow", 2, poolings[2]),
        FieldSpec(BIAS_FIELD, "wide", 3),
    )
    return ModelSpec(name, fields, num_dense, hidden, dropout)


def make_batch(spec, n, seed=0, dtype=np.float32, bags=True):
    """(inputs, params, labels): random rows; bags with empty ones and repeated ids, weights on every other field
    (one id per example and no weights where bags is False); the bias field one id, row 0 of its table."""
    rng = np.random.default_rng(seed)
    rows = {t: rng.normal(0, 0.5, (NUM_ROWS.get(t, 7), spec.row_dim(t))).astype(dtype) for t in spec.table_dims()}
    fields = {}
    for i, f in enumerate(spec.fields):
        num_rows = len(rows[f.table])
        if f.name == BIAS_FIELD:
            fields[f.name] = FieldInput(np.zeros(n, np.int64), np.arange(n + 1))
        elif bags:
            fields[f.name] = random_bags(rng, n, num_rows, weighted=i % 2 == 0)
        else:
            fields[f.name] = FieldInput(rng.integers(0, num_rows, n), np.arange(n + 1))
    dense_x = rng.normal(0, 1, (n, spec.num_dense)).astype(dtype)
    labels = rng.integers(0, 2, n).astype(dtype)
    params = {k: v.astype(dtype) for k, v in spec.initial_params(seed).items()}
    for k in params:  # biases start at zero; make them non-zero so their gradients are checked too
        params[k] += rng.normal(0, 0.1, params[k].shape).astype(dtype)
    return ModelInputs(rows, fields, dense_x), params, labels


def summed_logloss(probs, labels):
    return float(-(labels * np.log(probs) + (1 - labels) * np.log(1 - probs)).sum())


def assert_matches_finite_differences(loss, inputs, params, row_grads, param_grads, eps=1e-6):
    """Every row element of every table and every param element: the analytic gradient against a central
    difference of loss() (which reads the arrays, changed in place)."""

    def numeric(array, idx):
        old = array[idx]
        array[idx] = old + eps
        plus = loss()
        array[idx] = old - eps
        minus = loss()
        array[idx] = old
        return (plus - minus) / (2 * eps)

    for table, rows in inputs.rows.items():
        for idx in np.ndindex(rows.shape):
            assert row_grads[table][idx] == pytest.approx(numeric(rows, idx), rel=1e-4, abs=1e-7), (table, idx)
    for k, p in params.items():
        for idx in np.ndindex(p.shape):
            assert param_grads[k][idx] == pytest.approx(numeric(p, idx), rel=1e-4, abs=1e-7), (k, idx)


def assert_backends_agree(spec, inputs, params, labels, device="cpu", rtol=1e-4, atol=1e-5):
    pa, ra, ga = NumpyModel(spec).forward_backward(inputs, params, labels)
    torch_model = TorchModel(spec, device)
    pb, rb, gb = torch_model.forward_backward(inputs, params, labels)
    assert pa.shape == pb.shape == (len(labels),)
    np.testing.assert_allclose(pa, pb, rtol=rtol, atol=atol)
    np.testing.assert_allclose(torch_model.predict(inputs, params), pb, rtol=rtol, atol=atol)
    assert set(ra) == set(rb) == set(spec.table_dims())
    for t in ra:
        assert ra[t].dtype == rb[t].dtype == np.float32 and ra[t].shape == rb[t].shape == inputs.rows[t].shape
        np.testing.assert_allclose(ra[t], rb[t], rtol=rtol, atol=atol, err_msg=t)
    assert set(ga) == set(gb) == {p.name for p in spec.dense_params()}
    for k in ga:
        assert ga[k].dtype == gb[k].dtype == np.float32 and ga[k].shape == gb[k].shape == params[k].shape, k
        np.testing.assert_allclose(ga[k], gb[k], rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_numpy_gradients_match_finite_differences(name):
    spec = make_spec(name)
    model = NumpyModel(spec)
    inputs, params, labels = make_batch(spec, 6, dtype=np.float64)
    probs, row_grads, param_grads = model.forward_backward(inputs, params, labels)
    np.testing.assert_allclose(probs, model.predict(inputs, params))
    assert set(param_grads) == set(params) and ("proj.narrow" in params) == spec.has_fm
    assert all(row_grads[t].dtype == np.float64 for t in row_grads)
    loss = lambda: summed_logloss(model.predict(inputs, params), labels)
    assert_matches_finite_differences(loss, inputs, params, row_grads, param_grads)


def spec_forward(spec, inputs, params):
    """The logit as spec.py writes it: pooled rows bag by bag, FM as the sum of pairwise products (projected
    where a table is narrow), the MLP layer by layer over the field-major pv's then dense_x."""
    pooled = [oracle_pool(inputs.rows[f.table], inputs.fields[f.name], f.pooling) for f in spec.fields]
    off = spec.embedding_offset
    v = [p[:, off : off + f.dim] for p, f in zip(pooled, spec.fields)]
    logit = np.full(inputs.n, params["logit.bias"][0, 0])
    if spec.name != "dnn":
        logit += sum(p[:, 0] for p in pooled)
    if spec.has_fm:
        e = [x if f.dim == spec.fm_width else x @ params[f"proj.{f.table}"] for x, f in zip(v, spec.fields)]
        logit += sum((e[i] * e[j]).sum(axis=1) for i in range(len(e)) for j in range(i + 1, len(e)))
    if spec.has_mlp:
        h = np.concatenate([*v, inputs.dense_x], axis=1)
        layers = len(spec.hidden) + 1
        for i in range(layers):
            h = h @ params[f"mlp.{i}.weight"] + params[f"mlp.{i}.bias"]
            h = np.maximum(h, 0) if i < layers - 1 else h
        logit += h[:, 0]
    return logit


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_models_compute_the_formulas_of_the_spec(name):
    """Catches what both backends could get wrong the same way: the MLP's input order, a projection, a layer."""
    spec = make_spec(name, num_dense=3, hidden=(5, 4))
    inputs, params, _ = make_batch(spec, 9, dtype=np.float64)
    expected = 1 / (1 + np.exp(-spec_forward(spec, inputs, params)))
    np.testing.assert_allclose(NumpyModel(spec).predict(inputs, params), expected, rtol=1e-12)
    np.testing.assert_allclose(TorchModel(spec).predict(inputs, params), expected, rtol=1e-5)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("pooling", POOLINGS)
def test_numpy_and_torch_agree(name, pooling):
    spec = make_spec(name, pooling, hidden=(16, 8))
    assert_backends_agree(spec, *make_batch(spec, 64, seed=1))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_numpy_and_torch_agree_over_one_id_per_field_without_dense_features(name):
    spec = make_spec(name, num_dense=0, hidden=(16, 8))
    assert_backends_agree(spec, *make_batch(spec, 64, seed=2, bags=False))


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("one_table", [False, True])
def test_a_batch_of_no_examples_gives_no_probabilities_and_zero_gradients_on_both_backends(name, one_table):
    """check_inputs takes n = 0 (offsets [0]); over one table and one id per field torch gathers every field at
    once (TorchModel._stacked), whose MLP input is reshaped to (0, fields * width)."""
    spec = ModelSpec(name, uniform_fields(4, 3), num_dense=2, hidden=(4,)) if one_table else make_spec(name)
    inputs, params, labels = make_batch(spec, 0, bags=False)
    assert_backends_agree(spec, inputs, params, labels)
    probs, row_grads, param_grads = TorchModel(spec).forward_backward(inputs, params, labels)
    assert probs.shape == (0,) and all((g == 0).all() for g in [*row_grads.values(), *param_grads.values()])


@pytest.mark.parametrize("name", ["lr", "fm"])
def test_lr_and_fm_over_one_id_per_field_equal_the_reference(name):
    """The reference works on the row of every (example, field); a backend's gradient of a unique row is the sum
    of the reference's over the row's occurrences."""
    spec = ModelSpec(name, uniform_fields(5, 3), num_dense=0)
    inputs, params, labels = make_batch(spec, 20, bags=False)
    params["logit.bias"][:] = 0.0  # the reference has no logit bias
    table = inputs.rows["t"]
    index = np.stack([inputs.fields[f.name].index for f in spec.fields], axis=1)  # (n, F)
    p_ref, g_ref = MODELS[name](3, OptimizerConfig()).forward_backward(table[index], labels)
    expected = np.zeros_like(table)
    np.add.at(expected, index, g_ref)
    for model in (NumpyModel(spec), TorchModel(spec)):
        probs, row_grads, param_grads = model.forward_backward(inputs, params, labels)
        np.testing.assert_allclose(probs, p_ref, rtol=1e-6)
        np.testing.assert_allclose(row_grads["t"], expected, rtol=1e-5, atol=1e-6)
        assert row_grads["t"].dtype == np.float32 and list(param_grads) == ["logit.bias"]
        np.testing.assert_allclose(param_grads["logit.bias"], [[(p_ref - labels).sum()]], rtol=1e-5, atol=1e-6)


def test_fm_logit_equals_the_pairwise_sum():
    model = MODELS["fm"](2, OptimizerConfig())
    rows = np.random.default_rng(1).normal(size=(3, 5, 3))
    w, v = rows[:, :, 0], rows[:, :, 1:]
    pairs = sum((v[:, i] * v[:, j]).sum(axis=1) for i in range(5) for j in range(i + 1, 5))
    np.testing.assert_allclose(model.logits(rows), w.sum(axis=1) + pairs)


@pytest.mark.parametrize("backend", [NumpyModel, TorchModel])
def test_zero_dropout_is_no_dropout_and_predict_never_drops(backend):
    inputs, params, labels = make_batch(make_spec("deepfm"), 32)
    plain = backend(make_spec("deepfm"), seed=1).forward_backward(inputs, params, labels)
    again = backend(make_spec("deepfm"), seed=2).forward_backward(inputs, params, labels)
    np.testing.assert_array_equal(plain[0], again[0])
    np.testing.assert_array_equal(plain[2]["mlp.0.weight"], again[2]["mlp.0.weight"])
    np.testing.assert_allclose(backend(make_spec("deepfm")).predict(inputs, params), plain[0], rtol=1e-6)
    dropping = backend(make_spec("deepfm", dropout=0.5))
    for _ in range(2):
        np.testing.assert_array_equal(dropping.predict(inputs, params), plain[0])


@pytest.mark.parametrize("backend", [NumpyModel, TorchModel])
@pytest.mark.parametrize("name", ["deepfm", "dnn"])
def test_dropout_changes_training_outputs_by_seed(backend, name):
    spec = make_spec(name, hidden=(32, 16), dropout=0.5)
    inputs, params, labels = make_batch(spec, 32)
    model = backend(spec, seed=3)
    first, second = model.forward_backward(inputs, params, labels), model.forward_backward(inputs, params, labels)
    replay = backend(spec, seed=3).forward_backward(inputs, params, labels)
    predicted = model.predict(inputs, params)
    assert np.abs(first[0] - predicted).max() > 1e-3 and np.abs(first[0] - second[0]).max() > 1e-3
    np.testing.assert_array_equal(first[0], replay[0])
    np.testing.assert_array_equal(first[2]["mlp.1.weight"], replay[2]["mlp.1.weight"])


def test_the_torch_worker_of_the_largest_synthetic_seed_trains_as_numpys_does():
    """make_backend seeds the dropout masks with --synthetic-seed (up to 2**63 - 1) times 1,000 plus the worker id:
    a seed past 2**64, which numpy's generator takes and torch's does not by itself."""
    from worker.job import make_backend
    from worker.train_config import TrainConfig

    spec = make_spec("deepfm", hidden=(32, 16), dropout=0.5)
    inputs, params, labels = make_batch(spec, 32)
    for backend in ("numpy", "torch"):
        cfg = TrainConfig(backend=backend, synthetic_seed=2**63 - 1, worker_id=1)
        first = make_backend(spec, cfg).forward_backward(inputs, params, labels)
        replay = make_backend(spec, cfg).forward_backward(inputs, params, labels)
        np.testing.assert_array_equal(first[0], replay[0])
        other = make_backend(spec, dataclasses.replace(cfg, worker_id=2)).forward_backward(inputs, params, labels)
        assert np.abs(first[0] - other[0]).max() > 1e-3, backend  # another worker drops other units


@pytest.mark.parametrize("name", ["deepfm", "dnn"])
def test_numpy_backward_with_dropout_matches_finite_differences(name):
    """A model's masks depend only on its seed and the batch's shape: a fresh model with the same seed drops
    the same units, so its training probabilities are a fixed function to differentiate."""
    spec = make_spec(name, dropout=0.4)
    inputs, params, labels = make_batch(spec, 6, dtype=np.float64)
    probs, row_grads, param_grads = NumpyModel(spec, seed=5).forward_backward(inputs, params, labels)
    assert np.abs(probs - NumpyModel(spec).predict(inputs, params)).max() > 1e-6  # some unit was dropped
    loss = lambda: summed_logloss(NumpyModel(spec, seed=5).forward_backward(inputs, params, labels)[0], labels)
    assert_matches_finite_differences(loss, inputs, params, row_grads, param_grads)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_large_logits_stay_finite(name):
    """|logit| in the hundreds: probabilities saturate to 0 or 1 without overflow warnings, gradients stay finite."""
    spec = make_spec(name, pooling="sum", num_dense=3, hidden=(16, 8))
    inputs, params, labels = make_batch(spec, 64, bags=False)
    for t, rows in inputs.rows.items():
        inputs.rows[t] = np.where(rows > 0, 40, -40).astype(np.float32)
    inputs.rows["wide"][0] = 20  # the bias row: the sum of the w's is never 0
    if spec.has_mlp:
        params[f"mlp.{len(spec.hidden)}.weight"] *= 1000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs, row_grads, param_grads = NumpyModel(spec).forward_backward(inputs, params, labels)
    assert all(np.isfinite(g).all() for g in [*row_grads.values(), *param_grads.values()])
    saturated_low, saturated_high = probs < 1e-6, probs > 1 - 1e-6  # the batch really is saturated, both ways
    assert (saturated_low | saturated_high).mean() > 0.9 and saturated_low.any() and saturated_high.any()
    np.testing.assert_allclose(probs, TorchModel(spec).predict(inputs, params), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_float16_rows_train_as_their_float32_values(name):
    """Rows of a table held in float16: both backends compute in float32, as over the rows' values in float32."""
    spec = make_spec(name)
    inputs, params, labels = make_batch(spec, 16)
    half = ModelInputs({t: r.astype(np.float16) for t, r in inputs.rows.items()}, inputs.fields, inputs.dense_x)
    upcast = ModelInputs({t: r.astype(np.float32) for t, r in half.rows.items()}, inputs.fields, inputs.dense_x)
    for backend in (NumpyModel, TorchModel):
        probs, row_grads, param_grads = backend(spec).forward_backward(half, params, labels)
        expected = NumpyModel(spec).forward_backward(upcast, params, labels)
        np.testing.assert_allclose(probs, expected[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(backend(spec).predict(half, params), expected[0], rtol=1e-5, atol=1e-6)
        for t, grads in row_grads.items():
            assert grads.dtype == np.float32
            np.testing.assert_allclose(grads, expected[1][t], rtol=1e-4, atol=1e-5, err_msg=t)
        for k, grads in param_grads.items():
            np.testing.assert_allclose(grads, expected[2][k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_big_endian_rows_give_what_native_rows_give():
    """Rows of either byte order are floats the numpy backend takes (np.dtype('>f4') is float32's value set)."""
    spec = make_spec("deepfm")
    inputs, params, labels = make_batch(spec, 16)
    swapped = ModelInputs({t: r.astype(r.dtype.newbyteorder(">")) for t, r in inputs.rows.items()}, inputs.fields,
                          inputs.dense_x)  # fmt: skip
    got, expected = (NumpyModel(spec).forward_backward(x, params, labels) for x in (swapped, inputs))
    np.testing.assert_array_equal(got[0], expected[0])
    for t in expected[1]:
        np.testing.assert_array_equal(got[1][t], expected[1][t])


@pytest.mark.parametrize("backend", [NumpyModel, TorchModel])
def test_rows_in_fortran_order_give_what_rows_in_c_order_give(backend):
    """Rows are any (u, row_dim) array: a column-major one (a transpose, columns filled one by one) too."""
    spec = make_spec("deepfm")
    inputs, params, labels = make_batch(spec, 16)
    columns = ModelInputs({t: np.asfortranarray(r) for t, r in inputs.rows.items()}, inputs.fields, inputs.dense_x)
    assert not columns.rows["wide"].flags.c_contiguous
    expected = backend(spec).forward_backward(inputs, params, labels)
    probs, row_grads, param_grads = backend(spec).forward_backward(columns, params, labels)
    np.testing.assert_array_equal(probs, expected[0])
    for t in row_grads:
        np.testing.assert_array_equal(row_grads[t], expected[1][t], err_msg=t)
    for k in param_grads:
        np.testing.assert_array_equal(param_grads[k], expected[2][k], err_msg=k)


def test_the_dense_params_follow_the_spec():
    spec = ModelSpec("deepfm", uniform_fields(40, 8), num_dense=13)
    shapes = {p.name: p.shape for p in spec.dense_params()}
    assert shapes["mlp.0.weight"] == (40 * 8 + 13, 400) and shapes["mlp.3.weight"] == (400, 1)
    assert shapes["mlp.3.bias"] == (1, 1) and shapes["logit.bias"] == (1, 1) and len(shapes) == 9
    two_widths = {p.name: p.shape for p in make_spec("deepfm").dense_params()}
    assert two_widths["proj.narrow"] == (2, 3) and "proj.wide" not in two_widths
    assert two_widths["mlp.0.weight"] == (3 + 2 + 2 + 3 + 2, 4)
    assert {p.name for p in make_spec("fm").dense_params()} == {"proj.narrow", "logit.bias"}
    assert [(p.name, p.shape, p.init) for p in make_spec("lr").dense_params()] == [("logit.bias", (1, 1), "zeros")]


def bad_inputs(inputs, params, labels):
    """(what to change, the error it must give) for a batch of make_spec("deepfm") and 8 examples."""
    fields = inputs.fields
    narrow_only = {"narrow": inputs.rows["narrow"]}
    a = fields["a"]
    yield dict(rows=narrow_only), r"rows lack \['wide'\] and hold unknown \[\]"
    yield dict(rows={**inputs.rows, "wide": inputs.rows["wide"][:, :3]}), r"rows of table wide have shape \(6, 3\)"
    wide = {**inputs.rows, "wide": inputs.rows["wide"].astype(np.longdouble)}
    yield dict(rows=wide), r"rows of table wide have shape \(6, 4\) and dtype float\d+, expected float16, float32 or"
    yield dict(fields={k: v for k, v in fields.items() if k != "b"}), r"fields lack \['b'\]"
    yield dict(fields={**fields, "a": FieldInput(a.index, a.offsets[:-1], a.weights)}), r"field a: 8 offsets, expected"
    yield dict(fields={**fields, "a": FieldInput(a.index[:-1], a.offsets, None)}), r"field a: offsets run from 0 to"
    yield dict(fields={**fields, "b": FieldInput(fields["b"].index + 5, fields["b"].offsets)}), "field b: index runs"
    yield dict(dense_x=inputs.dense_x[:, :1]), r"dense_x has shape \(8, 1\), expected \(n, 2\)"
    yield dict(params={k: v for k, v in params.items() if k != "proj.narrow"}), r"params lack \['proj.narrow'\]"
    yield dict(params={**params, "mlp.0.weight": params["mlp.0.weight"][:3]}), r"param mlp.0.weight has shape"
    yield dict(labels=labels[:4]), r"labels have shape \(4,\), expected \(8,\)"


@pytest.mark.parametrize("backend", [NumpyModel, TorchModel])
def test_inputs_that_do_not_match_the_spec_are_clear_errors(backend):
    spec = make_spec("deepfm")
    inputs, params, labels = make_batch(spec, 8)
    model = backend(spec)
    for change, message in bad_inputs(inputs, params, labels):
        rows, fields = change.get("rows", inputs.rows), change.get("fields", inputs.fields)
        bad = ModelInputs(rows, fields, change.get("dense_x", inputs.dense_x))
        with pytest.raises(ValueError, match=message):
            model.forward_backward(bad, change.get("params", params), change.get("labels", labels))
        if "labels" not in change:
            with pytest.raises(ValueError, match=message):
                model.predict(bad, change.get("params", params))


def test_torch_takes_read_only_arrays_without_a_warning():
    """Pulled rows may be views of received bytes (np.frombuffer), which torch would warn about sharing."""
    spec = make_spec("deepfm")
    inputs, params, labels = make_batch(spec, 6)
    for a in (*inputs.rows.values(), inputs.dense_x, labels, *params.values()):
        a.flags.writeable = False
    for f in inputs.fields.values():
        for a in (f.index, f.offsets, f.weights):
            if a is not None:
                a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_backends_agree(spec, inputs, params, labels)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cuda_agrees_with_numpy(name):
    spec = make_spec(name, num_dense=13, hidden=(32, 16))
    # TF32 matmuls (if enabled) round to ~1e-3: the tolerance allows for them
    assert_backends_agree(spec, *make_batch(spec, 256), device="cuda", rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cuda_agrees_with_numpy_over_one_table_and_one_id_per_field(name):
    """The gather of every field at once (TorchModel._stacked), the path of one table and one id per field."""
    spec = ModelSpec(name, uniform_fields(6, 4), num_dense=13, hidden=(32, 16))
    assert_backends_agree(spec, *make_batch(spec, 256, bags=False), device="cuda", rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_dropout_replays_by_seed():
    spec = make_spec("deepfm", hidden=(32, 16), dropout=0.5)
    inputs, params, labels = make_batch(spec, 64)
    first = TorchModel(spec, "cuda", seed=4).forward_backward(inputs, params, labels)
    replay = TorchModel(spec, "cuda", seed=4).forward_backward(inputs, params, labels)
    np.testing.assert_array_equal(first[0], replay[0])
    assert np.abs(first[0] - TorchModel(spec, "cuda").predict(inputs, params)).max() > 1e-3


TORCH_FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange",
                   "linspace", "eye", "Generator"}  # fmt: skip


def test_the_cuda_path_makes_every_tensor_on_its_device_and_reads_results_through_the_cpu():
    """What a run on the CPU cannot show: in the modules a CUDA worker runs, every torch factory names device= (a
    tensor made without one is on the CPU, and mixing it with the GPU's fails), every torch.from_numpy is moved
    .to() the device, and every .numpy() reads a .cpu() tensor (a CUDA tensor has no numpy view)."""
    root = pathlib.Path(__file__).resolve().parent.parent
    made = 0
    for path in ("worker/models/torch_backend.py", "worker/allreduce.py", "worker/allreduce_group.py"):
        tree = ast.parse((root / path).read_text())
        parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
            name, owner, where = call.func.attr, call.func.value, f"{path}:{call.lineno}"
            of_torch = isinstance(owner, ast.Name) and owner.id == "torch"
            if of_torch and name in TORCH_FACTORIES:
                made += 1
                assert "device" in {k.arg for k in call.keywords}, f"{where}: torch.{name} without device="
            if of_torch and name == "from_numpy":
                up = parent[call]
                assert isinstance(up, ast.Attribute) and up.attr == "to", f"{where}: torch.from_numpy not moved .to()"
            if name == "numpy":
                cpu = isinstance(owner, ast.Call) and isinstance(owner.func, ast.Attribute) and owner.func.attr == "cpu"
                assert cpu, f"{where}: .numpy() of a tensor not .cpu()'d"
    assert made >= 3  # as_tensor, Generator, rand: the scan sees the backend's factories


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error given where there is no CUDA device")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="--device cuda: no CUDA device is available to torch"):
        TorchModel(make_spec("dnn"), "cuda")

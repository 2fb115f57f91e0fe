"""The model backends: numpy's hand-written backward pass against finite differences, DeepFM and DNN against a
forward written out from spec.py, numpy against torch (autograd) for every model, LR and FM against the first
numpy models, large logits, bad shapes; GPU tests skip without CUDA."""

import warnings

import numpy as np
import pytest
import torch

from ps.config import OptimizerConfig
from tests.reference_models import MODELS
from worker.models.numpy_backend import NumpyModel
from worker.models.spec import MODEL_NAMES, ModelSpec
from worker.models.torch_backend import TorchModel


def batch(spec: ModelSpec, n: int, seed: int = 0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    rows = rng.normal(0, 0.5, (n, spec.num_fields, spec.sparse_dim)).astype(dtype)
    dense_x = rng.normal(0, 1, (n, spec.num_dense)).astype(dtype)
    labels = rng.integers(0, 2, n).astype(dtype)
    params = {k: v.astype(dtype) for k, v in spec.initial_params(seed).items()}
    for k in params:  # biases start at zero; make them non-zero so their gradients are checked too
        params[k] += rng.normal(0, 0.1, params[k].shape).astype(dtype)
    return rows, dense_x, params, labels


def summed_logloss(model, rows, dense_x, params, labels):
    p = model.predict(rows, dense_x, params)
    return float(-(labels * np.log(p) + (1 - labels) * np.log(1 - p)).sum())


def assert_backends_agree(spec, rows, dense_x, params, labels, device="cpu", rtol=1e-4, atol=1e-5):
    pa, ra, ga = NumpyModel(spec).forward_backward(rows, dense_x, params, labels)
    torch_model = TorchModel(spec, device)
    pb, rb, gb = torch_model.forward_backward(rows, dense_x, params, labels)
    n = len(labels)
    assert pa.shape == pb.shape == (n,)
    np.testing.assert_allclose(pa, pb, rtol=rtol, atol=atol)
    np.testing.assert_allclose(torch_model.predict(rows, dense_x, params), pb, rtol=rtol, atol=atol)
    assert ra.dtype == rb.dtype == np.float32 and ra.shape == rb.shape == rows.shape
    np.testing.assert_allclose(ra, rb, rtol=rtol, atol=atol)
    assert set(ga) == set(gb) == {p.name for p in spec.dense_params()}
    for k in ga:
        assert ga[k].dtype == gb[k].dtype == np.float32 and ga[k].shape == gb[k].shape == params[k].shape, k
        np.testing.assert_allclose(ga[k], gb[k], rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_numpy_gradients_match_finite_differences(name):
    spec = ModelSpec(name, num_fields=3, num_dense=2, embedding_dim=2, hidden=(4, 3))
    model = NumpyModel(spec)
    rows, dense_x, params, labels = batch(spec, 5, dtype=np.float64)
    probs, row_grads, param_grads = model.forward_backward(rows, dense_x, params, labels)
    np.testing.assert_allclose(probs, model.predict(rows, dense_x, params))
    assert row_grads.shape == rows.shape and set(param_grads) == set(params)
    eps = 1e-6

    def numeric(array, idx):
        old = array[idx]
        array[idx] = old + eps
        plus = summed_logloss(model, rows, dense_x, params, labels)
        array[idx] = old - eps
        minus = summed_logloss(model, rows, dense_x, params, labels)
        array[idx] = old
        return (plus - minus) / (2 * eps)

    for idx in np.ndindex(rows.shape):
        assert row_grads[idx] == pytest.approx(numeric(rows, idx), rel=1e-4, abs=1e-7), idx
    for k, p in params.items():
        for idx in np.ndindex(p.shape):
            assert param_grads[k][idx] == pytest.approx(numeric(p, idx), rel=1e-4, abs=1e-7), (k, idx)


@pytest.mark.parametrize("name", ["deepfm", "dnn"])
def test_mlp_models_compute_the_formulas_of_the_spec(name):
    """The forward written out from spec.py, field by field: catches an input order (field-major v, then dense_x)
    or a layer that both backends would get wrong the same way."""
    spec = ModelSpec(name, num_fields=4, num_dense=3, embedding_dim=2, hidden=(5, 4))
    rows, dense_x, params, _ = batch(spec, 7, dtype=np.float64)
    off, k = spec.embedding_offset, spec.embedding_dim
    h = np.concatenate([rows[:, f, off : off + k] for f in range(spec.num_fields)] + [dense_x], axis=1)
    for i in range(3):
        h = h @ params[f"mlp.{i}.weight"] + params[f"mlp.{i}.bias"]
        h = np.maximum(h, 0) if i < 2 else h
    logit = h[:, 0]
    if name == "deepfm":
        logit = logit + MODELS["fm"](k, OptimizerConfig()).logits(rows)
    expected = 1 / (1 + np.exp(-logit))
    np.testing.assert_allclose(NumpyModel(spec).predict(rows, dense_x, params), expected, rtol=1e-12)
    np.testing.assert_allclose(TorchModel(spec).predict(rows, dense_x, params), expected, rtol=1e-5)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("num_dense", [0, 3])
def test_numpy_and_torch_agree(name, num_dense):
    spec = ModelSpec(name, num_fields=5, num_dense=num_dense, embedding_dim=4, hidden=(16, 8))
    assert_backends_agree(spec, *batch(spec, 64, seed=num_dense))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_large_logits_stay_finite(name):
    """|logit| in the hundreds: probabilities saturate to 0 or 1 without overflow warnings, gradients to -1 or 1."""
    spec = ModelSpec(name, num_fields=5, num_dense=3, embedding_dim=4, hidden=(16, 8))
    rows, dense_x, params, labels = batch(spec, 64)
    rows = np.where(rows > 0, 40, -40).astype(np.float32)
    if spec.has_mlp:
        params[f"mlp.{len(spec.hidden)}.weight"] *= 1000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs, row_grads, param_grads = NumpyModel(spec).forward_backward(rows, dense_x, params, labels)
    assert np.isfinite(row_grads).all() and all(np.isfinite(g).all() for g in param_grads.values())
    saturated_low, saturated_high = probs < 1e-6, probs > 1 - 1e-6  # the batch really is saturated, both ways
    assert (saturated_low | saturated_high).mean() > 0.9 and saturated_low.any() and saturated_high.any()
    np.testing.assert_allclose(probs, TorchModel(spec).predict(rows, dense_x, params), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["lr", "fm"])
def test_lr_and_fm_equal_the_first_numpy_models(name):
    old = MODELS[name](3, OptimizerConfig())
    spec = ModelSpec(name, num_fields=5, num_dense=0, embedding_dim=3)
    rows, dense_x, params, labels = batch(spec, 20)
    p_old, g_old = old.forward_backward(rows, labels)
    p_new, g_new, dense_grads = NumpyModel(spec).forward_backward(rows, dense_x, params, labels)
    np.testing.assert_allclose(p_new, p_old, rtol=1e-6)
    np.testing.assert_allclose(g_new, g_old, rtol=1e-5, atol=1e-7)
    assert g_new.dtype == np.float32 and dense_grads == {}


def test_fm_logit_equals_the_pairwise_sum():
    model = MODELS["fm"](2, OptimizerConfig())
    rows = np.random.default_rng(1).normal(size=(3, 5, 3))
    w, v = rows[:, :, 0], rows[:, :, 1:]
    pairs = sum((v[:, i] * v[:, j]).sum(axis=1) for i in range(5) for j in range(i + 1, 5))
    np.testing.assert_allclose(model.logits(rows), w.sum(axis=1) + pairs)


def test_the_mlp_shapes_follow_the_spec():
    spec = ModelSpec("deepfm", num_fields=40, num_dense=13, embedding_dim=8)
    shapes = {p.name: p.shape for p in spec.dense_params()}
    assert shapes["mlp.0.weight"] == (40 * 8 + 13, 400) and shapes["mlp.3.weight"] == (400, 1)
    assert shapes["mlp.3.bias"] == (1, 1) and len(shapes) == 8
    with pytest.raises(ValueError, match="unknown"):
        ModelSpec("wide", 3, 0)


@pytest.mark.parametrize("backend", [NumpyModel, TorchModel])
def test_a_batch_of_the_wrong_shape_is_a_clear_error(backend):
    spec = ModelSpec("fm", num_fields=5, num_dense=2, embedding_dim=3)
    rows, dense_x, params, labels = batch(spec, 8)
    model = backend(spec)
    with pytest.raises(ValueError, match=r"rows have shape \(8, 5, 3\), expected \(n, 5, 4\)"):
        model.forward_backward(rows[:, :, :3], dense_x, params, labels)
    with pytest.raises(ValueError, match="dense_x has shape"):
        model.predict(rows, dense_x[:, :1], params)
    with pytest.raises(ValueError, match="labels have shape"):
        model.forward_backward(rows, dense_x, params, labels[:4])


def test_torch_takes_read_only_arrays_without_a_warning():
    """Pulled rows may be views of received bytes (np.frombuffer), which torch would warn about sharing."""
    spec = ModelSpec("deepfm", num_fields=3, num_dense=2, embedding_dim=2, hidden=(4,))
    rows, dense_x, params, labels = batch(spec, 6)
    for a in (rows, dense_x, labels, *params.values()):
        a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_backends_agree(spec, rows, dense_x, params, labels)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cuda_agrees_with_numpy(name):
    spec = ModelSpec(name, num_fields=6, num_dense=13, embedding_dim=4, hidden=(32, 16))
    # TF32 matmuls (if enabled) round to ~1e-3: the tolerance allows for them
    assert_backends_agree(spec, *batch(spec, 256), device="cuda", rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error given where there is no CUDA device")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="--device cuda: no CUDA device is available to torch"):
        TorchModel(ModelSpec("dnn", 2, 0), "cuda")

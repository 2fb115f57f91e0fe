"""The model backends: numpy's hand-written backward pass against finite differences, numpy against torch
(autograd) for every model, LR and FM against the first numpy models; GPU tests skip without CUDA."""

import numpy as np
import pytest
import torch

from ps.config import OptimizerConfig
from worker.models.numpy_backend import NumpyModel
from worker.models.numpy_models import MODELS
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
        assert row_grads[idx] == pytest.approx(numeric(rows, idx), rel=1e-4, abs=1e-7)
    for k, p in params.items():
        for idx in np.ndindex(p.shape):
            assert param_grads[k][idx] == pytest.approx(numeric(p, idx), rel=1e-4, abs=1e-7), (k, idx)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("num_dense", [0, 13])
def test_numpy_and_torch_agree(name, num_dense):
    spec = ModelSpec(name, num_fields=6, num_dense=num_dense, embedding_dim=4, hidden=(32, 16))
    rows, dense_x, params, labels = batch(spec, 128, seed=num_dense)
    a, b = NumpyModel(spec), TorchModel(spec, "cpu")
    pa, ra, ga = a.forward_backward(rows, dense_x, params, labels)
    pb, rb, gb = b.forward_backward(rows, dense_x, params, labels)
    np.testing.assert_allclose(pa, pb, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.predict(rows, dense_x, params), pb, rtol=1e-6, atol=1e-7)
    assert ra.dtype == rb.dtype == np.float32 and ra.shape == rb.shape == rows.shape
    np.testing.assert_allclose(ra, rb, rtol=1e-4, atol=1e-5)
    assert set(ga) == set(gb) == {p.name for p in spec.dense_params()}
    for k in ga:
        assert ga[k].dtype == np.float32 and ga[k].shape == params[k].shape
        np.testing.assert_allclose(ga[k], gb[k], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["lr", "fm"])
def test_lr_and_fm_equal_the_first_numpy_models(name):
    old = MODELS[name](3, OptimizerConfig())
    spec = ModelSpec(name, num_fields=5, num_dense=0, embedding_dim=3)
    rows, dense_x, params, labels = batch(spec, 20)
    p_old, g_old = old.forward_backward(rows, labels)
    p_new, g_new, dense_grads = NumpyModel(spec).forward_backward(rows, dense_x, params, labels)
    np.testing.assert_allclose(p_new, p_old, rtol=1e-6)
    np.testing.assert_allclose(g_new, g_old, rtol=1e-5, atol=1e-7)
    assert dense_grads == {}


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cuda_agrees_with_numpy(name):
    spec = ModelSpec(name, num_fields=6, num_dense=13, embedding_dim=4, hidden=(32, 16))
    rows, dense_x, params, labels = batch(spec, 256)
    pa, ra, ga = NumpyModel(spec).forward_backward(rows, dense_x, params, labels)
    pb, rb, gb = TorchModel(spec, "cuda").forward_backward(rows, dense_x, params, labels)
    np.testing.assert_allclose(pa, pb, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ra, rb, rtol=1e-3, atol=1e-4)
    for k in ga:
        np.testing.assert_allclose(ga[k], gb[k], rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error given where there is no CUDA device")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA device is available"):
        TorchModel(ModelSpec("dnn", 2, 0), "cuda")

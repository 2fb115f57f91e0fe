"""CTR models that run on the worker: forward and backward over pulled embedding rows and dense parameters.

spec.py fixes each model's parameterization (names, shapes, formulas); numpy_backend.py (hand-written backward,
CPU) and torch_backend.py (autograd, CPU or CUDA) implement it and agree to float32 rounding. numpy_models.py
keeps the first LR and FM, the oracle the backends are tested against.
"""

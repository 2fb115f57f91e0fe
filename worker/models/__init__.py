"""CTR models that run on the worker: forward and backward over pulled embedding rows and dense parameters.

spec.py fixes each model's parameterization (names, shapes, formulas); numpy_backend.py (hand-written backward,
CPU) and torch_backend.py (autograd, CPU or CUDA) implement it and agree to float32 rounding. The plain
LR and FM the backends are tested against live in tests/reference_models.py.
"""

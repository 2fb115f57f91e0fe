"""CTR models that run on the worker: forward and backward over the pulled rows of a batch's tables and the dense
parameters.

spec.py fixes each model's parameterization (fields and their tables, names, shapes, formulas); pooling.py pools
a field's bags of rows into one vector per example and sends the gradient back; numpy_backend.py (hand-written
backward, CPU) and torch_backend.py (autograd, CPU or CUDA) implement the models and agree to float32 rounding.
The plain LR and FM the backends are tested against live in tests/reference_models.py.
"""

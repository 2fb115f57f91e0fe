"""What a model that overflows float32 raises: DivergedError, a training step whose predictions or gradients hold an
Inf or NaN (worker/step.py's check_finite, worker/allreduce.py's other ranks).
"""

from __future__ import annotations


class DivergedError(ValueError):
    """A training step whose predictions or gradients hold an Inf or NaN: the model diverged (its weights, or the
    features fed to them, overflow float32). The worker whose step diverged pushed nothing of it."""

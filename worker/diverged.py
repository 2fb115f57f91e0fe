"""What a model that overflows float32 raises and advises: DivergedError, a training step whose predictions or
gradients hold an Inf or NaN (worker/step.py's check_finite, worker/allreduce.py's other ranks), and the advice its
messages and a NaN score's (worker/scoring.py) end with.
"""

from __future__ import annotations

# what to look for where float32 overflows in the model (a NaN score, a diverged step)
HUGE_NUMBERS_ADVICE = "look for huge numbers in the data (numeric columns, feature weights)"
# the sentence a diverged step's message ends with, on the worker whose step diverged and on the others
DIVERGED_ADVICE = (
    "Train with a lower --learning-rate (the sparse tables') or --dense-learning-rate (the MLP's), and "
    + HUGE_NUMBERS_ADVICE
)


class DivergedError(ValueError):
    """A training step whose predictions or gradients hold an Inf or NaN: the model diverged (its weights, or the
    features fed to them, overflow float32). The worker whose step diverged pushed nothing of it."""

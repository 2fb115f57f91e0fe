"""check_new: the rules a table made now must meet beyond TableConfig.validate (a table a data dir holds already, a
checkpoint's included, opens without them).

ps.engine.tablemaker checks a new table's config (and a replacing one's) with check_new before it makes anything.
"""

from __future__ import annotations

import math

import numpy as np

from ps.config import FTRL_TINY_GRADIENT, MIN_POSITIVE_HYPERPARAMETER, TableConfig, ftrl_divides_by_zero
from ps.errors import InvalidArgumentError

MIN_ADMISSION_PROBABILITY = 2.0**-53  # a new table's least: the admission draw is a multiple of 2**-53
# (ps.rows.update), so a smaller probability admits as often as this one does
FLOAT32_MAX = float(np.finfo(np.float32).max)
NORMAL_DRAW_MAX = math.sqrt(48 * math.log(2))  # the largest |draw| / scale of the normal initializer (~5.77):
# Box-Muller's radius sqrt(-2 ln u) at its least u, 2**-24 (ps.rows.initializers)


def check_new(cfg: TableConfig) -> None:
    """InvalidArgumentError for settings that validate() takes (cfg passed it) but a table made now may not have:
    - an option other than 0 of magnitude below MIN_POSITIVE_HYPERPARAMETER (check_float32_magnitude), an eviction
      decay below it included: 0 or subnormal in the kernels' float32, it acts as 0 (a weight_bound of it is no
      bound, a decay of it zeroes the counts) or slows every step;
    - an admission probability below MIN_ADMISSION_PROBABILITY, which admits as often as that one does;
    - ftrl with beta 0 and l2 0. FTRL holds its embedding as a function of its state, -(z - sign(z) l1) /
      ((beta + sqrt(n)) / lr + l2), whose divisor is then 0 at every dim whose n is 0: such a row cannot hold an
      initial embedding other than 0 (a dim's first gradient of exactly 0 sets it to 0), and a gradient whose
      square is 0 in float32 (|g| <= FTRL_TINY_GRADIENT) makes it non-finite: the push is refused (with a
      weight_bound, the dim is clipped to the bound instead);
    - ftrl whose initial z passes float32's largest (ftrl_initial_z_overflow)."""
    _check_new_floats(cfg)
    p = cfg.optimizer.all_params() if cfg.optimizer.name == "ftrl" else {}
    if p and p["beta"] == 0 and p["l2"] == 0:
        advice = ftrl_divides_by_zero(
            "a dim until a gradient's square there is non-zero in float32: it cannot hold initial embeddings "
            f"other than 0, and a gradient of |g| <= {FTRL_TINY_GRADIENT:.2g} would make the row non-finite"
        )
        raise InvalidArgumentError(f"table {cfg.name!r}: {advice}")
    overflow = ftrl_initial_z_overflow(cfg)
    if overflow:
        raise InvalidArgumentError(f"table {cfg.name!r}: {overflow}")


def check_float32_magnitude(what: str, value: float) -> None:
    """InvalidArgumentError unless value is 0 or of magnitude at least MIN_POSITIVE_HYPERPARAMETER: 1e-320 is no
    value a float32 kernel holds."""
    if 0 < abs(value) < MIN_POSITIVE_HYPERPARAMETER:
        raise InvalidArgumentError(f"{what} must be 0 or at least {MIN_POSITIVE_HYPERPARAMETER:g} in magnitude (a "
                                   f"smaller one is 0 or subnormal in float32), got {value!r}")  # fmt: skip


def ftrl_initial_z_overflow(cfg: TableConfig) -> str | None:
    """Why ftrl's initial z = -w (beta / learning_rate + l2) - sign(w) l1 (ps.rows.optim.Ftrl.init_state) may pass
    float32's largest for the initial embeddings w the initializer makes (|w| up to scale, or NORMAL_DRAW_MAX times
    scale for normal): such a row's z is Inf, and every push to it is refused as a float32 overflow. None for other
    optimizers, zeros, and z within float32."""
    if cfg.optimizer.name != "ftrl" or cfg.initializer.name == "zeros":
        return None
    p, lr, init = cfg.optimizer.all_params(), float(cfg.optimizer.learning_rate), cfg.initializer
    w = float(np.float32(init.scale)) * (NORMAL_DRAW_MAX if init.name == "normal" else 1.0)
    z = w * (p["beta"] / lr + p["l2"]) + p["l1"]
    if z <= FLOAT32_MAX:
        return None
    most = f"{NORMAL_DRAW_MAX:.4g} times scale" if init.name == "normal" else "scale"
    return (f"ftrl's initial z = -w (beta / learning_rate + l2) - sign(w) l1 reaches {z:.3g} for initial embeddings "
            f"|w| up to {w:.3g} ({init.name} initializer: {most} {init.scale:g}; learning_rate {lr:g}, params.beta "
            f"{p['beta']:g}, l2 {p['l2']:g}, l1 {p['l1']:g}), past float32's {FLOAT32_MAX:.3g}: such a row's z "
            "is Inf and every push to it would be refused; lower the initializer's scale or beta, l2 and l1, or "
            "raise learning_rate")  # fmt: skip


def _check_new_floats(cfg: TableConfig) -> None:
    """check_new's rules of the float options: each other than 0 is a normal float32, and admission probability is
    at least MIN_ADMISSION_PROBABILITY."""
    at = f"table {cfg.name!r}: "
    if cfg.eviction.decay < MIN_POSITIVE_HYPERPARAMETER:
        raise InvalidArgumentError(f"{at}eviction decay must be in [{MIN_POSITIVE_HYPERPARAMETER:g}, 1] (a smaller "
                                   "one is 0 or subnormal in float32: it would zero the counts), got "
                                   f"{cfg.eviction.decay!r}")  # fmt: skip
    if cfg.admission.probability < MIN_ADMISSION_PROBABILITY:
        raise InvalidArgumentError(f"{at}admission probability must be in [2**-53, 1] (a draw is a multiple of "
                                   f"2**-53, so a smaller one admits as 2**-53 does), got "
                                   f"{cfg.admission.probability!r}")  # fmt: skip
    options = {"initializer scale": cfg.initializer.scale, "weight_bound": cfg.weight_bound, "l2": cfg.l2}
    options |= {f"{cfg.optimizer.name} {k}": v for k, v in cfg.optimizer.all_params().items()}
    options |= {f"eviction {k}": getattr(cfg.eviction, k) for k in ("score_threshold", "nonclk_coeff", "click_coeff")}
    for what, value in options.items():
        check_float32_magnitude(at + what, value)

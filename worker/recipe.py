"""Training settings that suit the size of the data, for the flags a user leaves unset (`--recipe auto`).

    recipe  used when                                   batch  epochs (at most)  validation   early stop
    small   under SMALL_DATA_EXAMPLES training examples  256    20                10% split    2 evaluations
    large   otherwise                                    2048   1                none         none

Small data overfits: many of its ids are seen once or twice, so several epochs of small steps help at first and
then hurt; evaluating a held-out split after every epoch and stopping once its logloss stops improving keeps the
best of both. Large data is seen once, in big batches for throughput. Flags given explicitly always win; the
run prints the recipe it chose and why.
"""

from __future__ import annotations

from dataclasses import dataclass

RECIPES = ("auto", "small", "large")
SMALL_DATA_EXAMPLES = 1_000_000


@dataclass(frozen=True)
class Recipe:
    name: str
    batch_size: int
    epochs: int
    validation_fraction: float
    early_stop: int
    l2: float
    dropout: float


SMALL = Recipe("small", batch_size=256, epochs=20, validation_fraction=0.1, early_stop=2, l2=0.0, dropout=0.0)
LARGE = Recipe("large", batch_size=2048, epochs=1, validation_fraction=0.0, early_stop=0, l2=0.0, dropout=0.0)


def choose(recipe: str, examples: int) -> Recipe:
    """The recipe for `examples` training examples (all workers together)."""
    if recipe not in RECIPES:
        raise ValueError(f"--recipe {recipe!r} is unknown; expected one of {list(RECIPES)}")
    if recipe == "auto":
        return SMALL if examples < SMALL_DATA_EXAMPLES else LARGE
    return SMALL if recipe == "small" else LARGE


def describe(r: Recipe, examples: int, auto: bool) -> str:
    """One line saying which settings the recipe set, for the run's output."""
    why = f"{examples:,} training examples" + (f" (under {SMALL_DATA_EXAMPLES:,})" if r is SMALL else "")
    what = f"batch {r.batch_size}, "
    if r.early_stop:
        what += (f"up to {r.epochs} epochs, evaluated on a {r.validation_fraction:.0%} validation split after each, "
                 f"stopping after {r.early_stop} without a better validation logloss")  # fmt: skip
    else:
        what += f"{r.epochs} epoch{'s' if r.epochs > 1 else ''}"
    how = "chosen by --recipe auto; flags you give win" if auto else f"--recipe {r.name}; flags you give win"
    return f"{r.name}-data recipe for {why}: {what} ({how})"

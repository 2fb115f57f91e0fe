"""Training settings that suit the size of the data, for the flags a user leaves unset (`--recipe auto`).

    recipe  used when                 batch  epochs (at most)  validation  early stop  sparse optimizer     MLP
    small   under SMALL_DATA_EXAMPLES  256*  50                10% split   5           ftrl a=0.05, l2=300  dropout 0.7,
            training examples,                                                                              dense l2 1,
            each epoch shuffled                                                                             output layer
                                                                                                            at 0
    large   otherwise, in file order  2048   1                 none        none        adagrad 0.02         -

    * 2048 (large's) from BIG_BATCH_EXAMPLES (100,000) training examples on

    malformed lines skipped (and reported) before the run fails: small 0, large 1,000, while they are at most
    MAX_BAD_SHARE (1 in 100) of the lines read once more than 10 are malformed (readers/share.py's BadLines)
    fm's rows (w and factors) start uniform in +-0.001 (small) or +-0.01 (large: EMBEDDING_INIT_SCALE, the start of
    deepfm's and dnn's rows under either recipe)

Small data overfits: most of its ids are seen once or twice, so several epochs of small steps help at first and
then hurt, and the weights of rare ids are mostly noise. Evaluating a held-out split after every epoch and
stopping once its logloss stops improving (the best model is put back) keeps the good epochs (the epoch cap is a
bound, not the usual end: where ids are seen often, FTRL's small steps on a strong l2 keep improving past 20
epochs: benchmarks/small_data.py's frequent-ids regime, lr, 3 seeds: 0.0079 under the tuned LR stopped at 20,
0.0031 at 50; the rare-ids regime stops early, before 20, either way). A cap of 100 gains too little to pay for
its time: the same lr, 3 seeds, runs 59-100 epochs for a median test AUC 0.0006 higher at 10,000 rows and 0.0002 at
100,000, in 1.4-1.5 times the seconds; fm there (deepfm too at 10,000 rows) and lr, fm and deepfm on 10,000 rows of rare
ids stop before 20 epochs either way, with the same AUC (--against epochs=100). It waits 5 evaluations for a better
logloss, since the best one is put back and small data's epochs are cheap: a split with few positives (20-30 in
the benchmark's imbalanced regime) moves by chance from one epoch to the next, and waiting 2 stopped some runs
after epoch 3 with epoch 1's barely trained model (deepfm test AUC 0.531 where the tuned LR had 0.599; over 5
seeds fm -0.0051 and deepfm -0.0071 under the tuned LR, +0.0014 and -0.0013 waiting 5; the rare and frequent
regimes' medians moved by at most 0.0006). It goes by logloss, not AUC
(--early-stop-metric auc): over the benchmark's regimes at 10,000 and 100,000 rows AUC did no better (median
0.0000), and on a split with few positives it follows chance into overfit epochs (README). FTRL-proximal with
a strong l2 shrinks rare ids far more than frequent ones (its l2 adds to a denominator that grows with an id's
accumulated squared gradients); dropout and an L2 penalty keep the MLP from memorizing the rows. On the small-data
regime of the synthetic generator, benchmarks/small_data.py measures these settings against a tuned L2 logistic
regression.
From BIG_BATCH_EXAMPLES on, small data trains in large's batches of 2048: the epochs of batches of 256 that suit
10,000-50,000 examples (where the recipe was tuned) make a run of 500,000 take many minutes, and a batch's gradient
is the sum over its examples, so an id seen once in a batch gets the same FTRL step in either, and the models come
out nearly the same in a fraction of the time (benchmarks/small_data.py --train-rows 100000 --against
batch_size=256, rare ids, seeds 1-3: fm's test AUC -0.0027, 0.0000, +0.0007 in 22, 17, 19 s against 40, 36, 44 s;
lr's (seed 1) the same in 22 s against 70 s; README, "Train on your own data").
On small data fm's rows start 10 times smaller than elsewhere: FTRL's l2 of 300 (a denominator of 320 or more)
moves a coordinate little from where it starts, so the factors of an id seen once or twice stay near their random
start, and the pairwise products of those starts enter every prediction the id takes part in. Chosen on
benchmarks/small_data.py's seeds 1-10, fm (--against fm_init_scale=0.01): per seed, a median test AUC 0.0008
(rare ids), -0.0002 (frequent) and 0.0008 (imbalanced) above a start of 0.01's; judged on seeds 11-20, never tuned
on: 0.0009, 0.0001 and 0.0005 above it, and fm's median gaps to the tuned LR -0.0025, -0.0024 and +0.0033 where a
start of 0.01 has -0.0037, -0.0044 and +0.0033 (README). deepfm and dnn, whose MLP reads the rows too, and large
data were not measured, and keep 0.01.
On small data deepfm's MLP output layer (its last weight, the last hidden width by 1) starts at zeros, not uniform
as the MLP's other weights do (mlp_output_zeros; the layer's bias and the logit bias start at 0 under either
recipe): the model starts as its FM part, and the MLP's share of the logit grows from 0 as it trains, where a
uniform output layer adds a random function of the rows to every prediction from the first step. Small data's
epochs are few, and early stopping on a split of 20-30 positives keeps an epoch by chance: a uniform start
collapsed some runs (benchmarks/small_data.py's imbalanced regime, seeds 12 and 14: test AUC 0.0253 and 0.0423
under the tuned LR, -0.0044 and +0.0039 from zeros). Judged on seeds 11-20, never tuned on (--models deepfm
--against mlp_output_zeros=false): per seed, a median test AUC 0.0008 (rare ids), 0.0000 (frequent: -0.0035 to
+0.0016) and 0.0016 (imbalanced) above a uniform start's, and deepfm's median gaps to the tuned LR -0.0037, -0.0045
and +0.0033 where a uniform start has -0.0054, -0.0034 and -0.0002; its worst seed -0.0081, a uniform start's
-0.0423 (README).
dnn keeps a uniform one: from zeros, its test AUC against a uniform start's was +0.0121, +0.0014, -0.0166, +0.0038
and -0.0011 on rare ids (seeds 11-15), +0.0171, -0.2943 (a collapse) and -0.0021 on frequent ids (11-13), -0.0165,
-0.0105 and +0.0081 imbalanced (11-13): medians +0.0014, -0.0021 and -0.0105. Large data keeps a uniform output layer
for both: the large recipe's tables are the configs they were (tests/test_worker_tables.py holds them byte for byte); it
was not measured. A model trained with the other start trains on under either recipe: its MLP tables hold every row, so
their initializer makes none, and the run takes each with the initializer it was made with (worker/tables.py
keep_held_initializers).
Small data is held in memory and trained in a fresh random order each epoch (worker/data.py): a file sorted or
grouped by its label, or by anything that goes with it, trains as well as a shuffled one (benchmarks/small_data.py's
files with their lines sorted by label: fm's test AUC 0.0107 (rare ids), 0.0112 (frequent) and 0.0923 (imbalanced)
lower in file order, within 0.0011 shuffled where the validation split holds enough positives), and the order of a
shuffled file makes no difference either way (the benchmark's medians within 0.0004). Large data is seen once, in big
batches for throughput, read as it trains (not held in memory). Small data is read whole before the first push to take
its validation split (the default), so a malformed line stops the run before it changes the model; large data is read as
it trains, so a stray line (a last line cut short, most often) would stop a long run part way: it skips up to 1,000 and
reports them, but not a file whose lines are malformed by the dozen (labels of -1 and 1, another format): past 10
malformed records (a CSV record over several lines counts once), a share over 1 in 100 of the lines read stops the run,
before the rest of the file trains a model on what is left. An explicit --max-bad-lines N skips up to N, whatever their
share. Flags given explicitly always win; the run prints the recipe it chose and why.
The large recipe's one epoch needs large data: on 10,000 examples it is 5 steps, which leave the model near its
initial values (logloss worse than the base rate's, AUC near 0.5 or below it by chance; README, "Train on your own
data"), so --recipe large is warned about before it trains where it makes fewer steps than FEWEST_LARGE_STEPS
(few_steps), the fewest it makes where --recipe auto picks it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

RECIPES = ("auto", "small", "large")
EARLY_STOP_METRICS = ("logloss", "auc")  # what early stopping and the best model kept go by (--early-stop-metric)
METRIC_NAMES = {"logloss": "logloss", "auc": "AUC"}  # as the run's output names them
WEAKER_L2_DIVISOR = 10  # a still-improving run's hint: its sparse l2 divided by this (model_tables.weaker_l2_toml)
SMALL_DATA_EXAMPLES = 1_000_000
BIG_BATCH_EXAMPLES = 100_000  # training examples from which the small recipe trains in LARGE's batches
EMBEDDING_INIT_SCALE = 0.01  # the rows of fm, deepfm and dnn start uniform in +-this, unless a recipe says otherwise
MAX_BAD_SHARE = 0.01  # of the lines read, malformed, at most (past readers.share.BAD_SHARE_AFTER), where
# --max-bad-lines is the recipe's


@dataclass(frozen=True)
class Recipe:
    name: str
    batch_size: int
    epochs: int
    validation_fraction: float
    early_stop: int
    l2: float
    dropout: float
    dense_l2: float
    optimizer: str
    learning_rate: float
    optimizer_params: dict
    max_bad_lines: int  # malformed lines skipped (and reported) before the run fails
    shuffle: bool  # each epoch in a fresh random order, the training examples held in memory
    early_stop_metric: str = "logloss"  # the validation figure early stopping and the best model kept go by
    fm_init_scale: float = EMBEDDING_INIT_SCALE  # fm's rows (w and factors) start uniform in +-this
    mlp_output_zeros: tuple[str, ...] = ()  # the models whose MLP output layer (its last weight) starts at zeros,
    # not uniform (glorot) as the MLP's other weights


SMALL = Recipe("small", batch_size=256, epochs=50, validation_fraction=0.1, early_stop=5, l2=0.0, dropout=0.7,
               dense_l2=1.0, optimizer="ftrl", learning_rate=0.05, optimizer_params={"l2": 300.0},
               max_bad_lines=0, shuffle=True, fm_init_scale=0.001,
               mlp_output_zeros=("deepfm",))  # fmt: skip
LARGE = Recipe("large", batch_size=2048, epochs=1, validation_fraction=0.0, early_stop=0, l2=0.0, dropout=0.0,
               dense_l2=0.0, optimizer="adagrad", learning_rate=0.02, optimizer_params={},
               max_bad_lines=1000, shuffle=False)  # fmt: skip


FEWEST_LARGE_STEPS = -(-SMALL_DATA_EXAMPLES // LARGE.batch_size)  # the large recipe's steps on the least data
# --recipe auto gives it (SMALL_DATA_EXAMPLES examples, one epoch): a run of it that makes fewer is warned (few_steps)


def choose(recipe: str, examples: int) -> Recipe:
    """The recipe for `examples` training examples (all workers together)."""
    if recipe not in RECIPES:
        raise ValueError(f"--recipe {recipe!r} is unknown; expected one of {list(RECIPES)}")
    small = recipe == "small" or (recipe == "auto" and examples < SMALL_DATA_EXAMPLES)
    if not small:
        return LARGE
    return SMALL if examples < BIG_BATCH_EXAMPLES else dataclasses.replace(SMALL, batch_size=LARGE.batch_size)


def few_steps(r: Recipe, examples: int, batch_size: int, epochs: int, unit: str = "training examples",
              max_examples: int = 0, held_out: int = 0, at_least: bool = False) -> str | None:  # fmt: skip
    """The warning for a run of the large recipe that makes fewer steps (of `batch_size`, over `epochs` passes of
    the examples that train: `examples`, all workers together, less the `held_out` of them the validation split
    takes, or the first max_examples of them, --max-examples, counted over the epochs) than FEWEST_LARGE_STEPS,
    the recipe's steps on the least data --recipe auto gives it: --recipe large on small data. None for another
    recipe, or as many steps (flags given: more epochs, smaller batches). at_least: `examples` is a count that
    stopped at the recipe's threshold (worker/linecount.py), so the steps it gives are a floor, not the run's:
    only --max-examples tells the steps (its own, whatever the floor), and warns where they are few."""
    training = examples - held_out
    steps = -(-training // batch_size) * epochs
    trained = f"{epochs} epoch{'s' * (epochs != 1)}"
    # a count that stopped (at_least) gives no upper bound on the steps: only --max-examples tells them
    cut = bool(max_examples) and (at_least or -(-max_examples // batch_size) < steps)
    if cut:
        steps, trained = -(-max_examples // batch_size), f"--max-examples {max_examples:,}"
    if r.name != LARGE.name or steps >= FEWEST_LARGE_STEPS or (at_least and not cut):
        return None
    split = f" ({training:,} train, {held_out:,} in the validation split)" if held_out and not at_least else ""
    examples_text = f"at least {examples:,}" if at_least else f"{examples:,}"
    remedies = (["--recipe auto (the small-data recipe on this data)"] if examples < SMALL_DATA_EXAMPLES else []) + [
        "a larger --max-examples" if cut else "more --epochs", "a smaller --batch-size"]  # fmt: skip
    return (f"--recipe large on {examples_text} {unit}{split}: {trained} in batches of {batch_size:,} "
            f"is {steps:,} step{'s' * (steps != 1)}, where the large recipe makes {FEWEST_LARGE_STEPS} or more on the "
            f"least data --recipe auto gives it ({SMALL_DATA_EXAMPLES:,} examples): the model stays near its start "
            f"(AUC near 0.5, logloss near the base rate's or worse); {', '.join(remedies[:-1])} or {remedies[-1]} "
            "train it")  # fmt: skip


def describe(
    r: Recipe,
    examples: int,
    auto: bool,
    mlp: bool = True,
    fm: bool = False,
    unit: str = "training examples",
    files: bool = False,
    validation_file: str | None = None,
    at_least: bool = False,
    zero_output: bool = False,
) -> str:
    """One line saying which settings the recipe set, for the run's output (mlp: whether the model has an MLP,
    which the dropout and dense l2 settings are for; fm: whether the model is fm, whose rows start in
    +-fm_init_scale, named where it is not EMBEDDING_INIT_SCALE; unit: what `examples` counts, e.g. "lines of training
    data" for a count made before the data is read, malformed lines included; files: whether the data is read from
    files, which may hold malformed lines; validation_file: --validation-data, evaluated instead of a split;
    at_least: the count stopped at `examples`, and the data holds more, e.g. "at least 1,000,000 lines of training
    data (counted no further)": worker/linecount.py); zero_output: whether the MLP's output layer starts at zeros
    (TrainConfig.mlp_output_zeros), named for a model with an MLP."""
    why = f"{examples:,} {unit}" + (f" (under {SMALL_DATA_EXAMPLES:,})" if r.name == "small" else "")
    why = f"at least {why} (counted no further)" if at_least else why
    what = f"sparse {r.optimizer} {r.learning_rate}{_params(r.optimizer_params)}, "
    what += f"dropout {r.dropout}, dense l2 {r.dense_l2:g}, " if r.dropout and mlp else ""
    what += "MLP output layer starting at 0, " if mlp and zero_output else ""
    what += f"fm rows starting in +-{r.fm_init_scale:g}, " if fm and r.fm_init_scale != EMBEDDING_INIT_SCALE else ""
    what += f"batch {r.batch_size}, "
    if r.early_stop:
        held_out = validation_file or f"a {r.validation_fraction:.0%} validation split"
        what += (f"up to {r.epochs} epochs{', each shuffled' if r.shuffle else ''}, evaluated on {held_out} after "
                 f"each, stopping after {r.early_stop} without a better validation {METRIC_NAMES[r.early_stop_metric]}")  # fmt: skip
    else:
        what += f"{r.epochs} epoch{'s' if r.epochs > 1 else ''}"
    if files and r.max_bad_lines:
        what += f", up to {r.max_bad_lines:,} malformed lines skipped (at most 1 in {round(1 / MAX_BAD_SHARE)})"
    how = "chosen by --recipe auto; flags you give win" if auto else f"--recipe {r.name}; flags you give win"
    return f"{r.name}-data recipe for {why}: {what} ({how})"


def _params(params: dict) -> str:
    return "".join(f" {k}={v:g}" for k, v in params.items())

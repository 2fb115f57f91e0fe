"""The one push update path: a compiled kernel that applies a push to a table's rows, in place or into a buffer.

Every push goes through `update_rows`: a push that fits in RAM (in place, keeping an undo copy), a push processed
in chunks (into a buffer, put into the arena by `commit` once the push is journaled) and journal replay (in
place). Per block of rows small enough to stay in cache, the kernel runs these steps, each written once:

    load     the block's rows from the arena into `new`, the rows worked on (in place: through the undo copy)
    rule     OPTIMIZE: lazy L2, then the optimizer step (ps.rows.optim.apply_kernel); ADD_DELTA:
             new[:, :dim] += grads, the optimizer state kept, but FTRL's z set to give the new embedding
             (ps.rows.optim.ftrl_match_state: FTRL computes its embedding from z and n at each step)
    account  show and click added, last step stamped, admission decided, from the old statistics still in
             the arena; a row not admitted gets its old embedding and state back (its pushes only count);
             admitted embeddings are clipped to the weight bound
    check    the first value of the block that is not finite (the caller rejects the push)
    store    in place: the arena row := new; the row becomes dirty at lsn `seq` and is touched (its use count,
             which eviction reads, goes up: see `touch`);
             buffered: the result row := new, the arena is untouched

Inputs, packed so that no two arguments of one type can be swapped unnoticed (ps.rows.updateio):
    hp       float64[NUM_SLOTS] built by hyper_params() once per table, the clock step set per push by at_step();
             a slot holds a float32 value exactly where the kernel computes in float32
    Push     ids u64 (n,), rows i64 (n,) (arena rows, unique), grads f32 (n, dim), shows f32 (n,), clicks f32 (n,);
             `update` hands the kernel read-only views of them all, whatever the caller brings (a request's views of
             its bytes, a shard's default shows and clicks, a replay's copies): numba compiles one version per
             array kind, so every push runs the one the warm-up (ps.engine.warmup) loaded
    RowState the arena: data f32 (capacity, line) and per row lsn u64, dirty u8, stored u8, ref u8
    Target   rows f32 (n, width), lsn u64 (n,), dirty u8 (n,), seq u64, in_place bool. In place: the undo copy
             of what the push overwrote (for `undo`), and seq the lsn the rows get. Buffered: the rows after the
             push (lsn and dirty unused).

Lazy L2 (slot l2 > 0, rule OPTIMIZE only): w *= 1 - lr * l2 for every admitted row at every clock step, each row
paying it when it is pushed. Before the optimizer step, the embedding (columns [0, dim), not the optimizer state nor
the statistics) of a row admitted before this push is multiplied by max(0, 1 - lr * l2) ** (step - last_step):
`step` is the push's clock step (hp's STEP slot, set by at_step: journal replay passes the record's step, so it
reproduces the same rows) and last_step the row's own, still in its stats column then. A row admitted by this push,
or never pushed, is not decayed (its embedding is the initial one; a row not admitted keeps it anyway); two pushes
at one step decay once. A pull therefore returns a row as of its last push: the decay of the steps since is paid at
its next push. The factor is computed in float64 and applied in float32; LAST_STEP is float32, so step gaps are
exact below 2**24 steps (ps.config.MAX_CLOCK). FTRL recomputes its embedding from its state at each step, so
TableConfig refuses l2 with it (FTRL has its own l2).

Where the callers plug in: a sync step's summed pushes (ps.engine.syncsum) arrive as one push of unique ids and
run the kernel once, like any other; geo's deltas use rule=ADD_DELTA (statistics and admission apply, the optimizer
state is left as it is, FTRL's z aside). Only `_load`, `_old` and `_store` read and write RowState.data (and `_undo`
puts back what `_load` read): a row layout other than float32 (fp16 values at rest, say) would decode and encode there
alone, rule, account and check staying as they are.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ps.config import AdmissionConfig
from ps.hashing import mix64_scalar
from ps.rows.finite import first_non_finite_bits
from ps.rows.layout import ADMITTED, CLICK, LAST_STEP, SHOW, STATS_FLOATS
from ps.rows.optim import FTRL, OPTIMIZERS, Optimizer, apply_kernel, ftrl_match_state
from ps.rows.parallel import run_parts
from ps.rows.rowcopy import gather_for_update
from ps.rows.updateio import Outcome, Push, RowState, Target

UPDATE_BLOCK = 256  # rows updated per block: loaded, stepped and accounted while the block is in cache
BLOCK_FLOATS = 8192  # ... and at most this many floats (32 KB, about L1): wide rows (dense tables) take fewer

USE_CAP = 7  # a row's use count (RowState.ref) stops here


@numba.njit(inline="always")
def touch(uses: np.ndarray, r: int) -> None:
    """Counts one use of arena row r (a lookup, a pull's gather, a push): its use count goes up by one, to
    USE_CAP. A count at the cap is not written, so the line of a hot row stays clean. Used by every path that
    reads or writes a row for a request; ps.storage.eviction lowers the counts and evicts at 0."""
    if uses[r] < USE_CAP:
        uses[r] += 1


# ---- the hyper-parameter vector: slot indices ------------------------------------------------------------------
SLOT_NAMES = (
    "rule",  # OPTIMIZE or ADD_DELTA
    "optimizer",  # the optimizer's kernel code (ps.rows.optim: SGD, ADAGRAD, ADAGRAD_ROWWISE, ADAM, FTRL)
    "lr",  # learning rate (FTRL: alpha); then the optimizer's KERNEL_PARAMS in order, unused ones 0
    "param1",
    "param2",
    "param3",
    "min_count",  # admission: an id gets a trained row once its show count reaches this ...
    "probability",  # ... and then with this probability per push
    "weight_bound",  # > 0: admitted embeddings are clipped to [-bound, bound]
    "l2",  # > 0: lazy L2, embeddings decay by (1 - lr * l2) per clock step (see the module docstring)
    "step",  # the shard's clock step of the push (stamped as the rows' last step)
)
RULE, OPTIMIZER, LR, PARAM1, PARAM2, PARAM3, MIN_COUNT, PROBABILITY, WEIGHT_BOUND, L2, STEP = range(len(SLOT_NAMES))
NUM_SLOTS = len(SLOT_NAMES)
KERNEL_PARAM_SLOTS = PARAM3 - LR + 1  # lr and up to three parameters: what apply_kernel takes
OPTIMIZE, ADD_DELTA = 0, 1  # rules: the optimizer step on grads; or grads added to the embedding as a delta
RULES = {"optimize": OPTIMIZE, "add_delta": ADD_DELTA}


def hyper_params(
    optimizer: Optimizer, admission: AdmissionConfig, weight_bound: float, *, l2: float = 0.0, rule: int = OPTIMIZE
) -> np.ndarray:
    """The hyper-parameter vector of a table (step 0): float64[NUM_SLOTS], slots as named in SLOT_NAMES."""
    if rule not in RULES.values():
        raise ValueError(f"rule {rule} is unknown; expected one of {RULES}")
    if not (math.isfinite(l2) and l2 >= 0):
        raise ValueError(f"l2 must be finite and >= 0, got {l2}")
    params = np.asarray(optimizer.kernel_params, dtype=np.float32)
    if not 1 <= len(params) <= KERNEL_PARAM_SLOTS:
        raise ValueError(
            f"optimizer {optimizer.name!r} has {len(params)} kernel params, expected 1..{KERNEL_PARAM_SLOTS}"
        )
    hp = np.zeros(NUM_SLOTS, dtype=np.float64)
    hp[RULE] = rule
    hp[OPTIMIZER] = optimizer.CODE
    hp[LR : LR + len(params)] = params  # float32 values, exact in float64
    hp[MIN_COUNT] = admission.min_count
    hp[PROBABILITY] = admission.probability
    hp[WEIGHT_BOUND] = weight_bound
    hp[L2] = l2
    return hp


def at_step(hp: np.ndarray, step: int) -> np.ndarray:
    """A copy of hp for a push at clock step `step`."""
    out = hp.copy()
    out[STEP] = step
    return out


def describe(hp: np.ndarray) -> dict:
    """{slot name: value} of a hyper-parameter vector, the optimizer and rule by name (for messages and tests)."""
    if hp.shape != (NUM_SLOTS,) or hp.dtype != np.float64:
        raise ValueError(
            f"hyper-parameter vector has shape {hp.shape} and dtype {hp.dtype}, expected ({NUM_SLOTS},) float64"
        )
    out = dict(zip(SLOT_NAMES, hp.tolist()))
    out["rule"] = {v: k for k, v in RULES.items()}[int(hp[RULE])]
    out["optimizer"] = {cls.CODE: name for name, cls in OPTIMIZERS.items()}[int(hp[OPTIMIZER])]
    return out


# ---- the kernel ------------------------------------------------------------------------------------------------
# The steps are inlined into the kernels (numba's inline="always"), so each kernel compiles to one function.
@numba.njit(inline="always")
def _block_rows(width):
    """Rows per block of a `width`-float row."""
    return max(1, min(UPDATE_BLOCK, BLOCK_FLOATS // width))


@numba.njit(inline="always")
def _load(state, rows, b, e, out):
    """out[:e - b] = rows[b:e] of the arena as float32 rows (prefetching rows further on in `rows` for writing)."""
    gather_for_update(state.data, rows, b, e, out.shape[1], out)


@numba.njit(inline="always")
def _old(data, r, col):
    """Column col of arena row r as float32, before the push has written it."""
    return data[r, col]


@numba.njit(inline="always")
def _decay_lazily(hp, lr, new, dim):
    """Lazy L2 of new[i], rows before the push: an admitted row's embedding times max(0, 1 - lr * l2) ** (steps
    since its last push), its last step read from its own stats column (the rule has not written it)."""
    stats_col = new.shape[1] - STATS_FLOATS
    step = np.float32(hp[STEP])  # as _account stamps it: two pushes at one step see no gap
    base = max(1.0 - np.float64(lr) * hp[L2], 0.0)
    for i in range(new.shape[0]):
        last = new[i, stats_col + LAST_STEP]
        if new[i, stats_col + ADMITTED] > 0 and step > last:
            factor = np.float32(base ** (np.float64(step) - np.float64(last)))
            for j in range(dim):
                new[i, j] *= factor


@numba.njit(nogil=True, cache=True)
def _apply_rule(hp, params, new, grads):
    if np.int64(hp[RULE]) == ADD_DELTA:
        for i in range(grads.shape[0]):
            for j in range(grads.shape[1]):
                new[i, j] += grads[i, j]
        if np.int64(hp[OPTIMIZER]) == FTRL:  # its w is a function of its state: the state made to give the new w
            ftrl_match_state(new, grads.shape[1], params[0], params[1], params[2], params[3])
    else:
        if hp[L2] > 0:
            _decay_lazily(hp, params[0], new, grads.shape[1])
        apply_kernel(np.int64(hp[OPTIMIZER]), new, grads, params)


@numba.njit(inline="always")
def _account(hp, state, new, push, b):
    """Statistics, admission and clipping of new[i], the row of push position b + i after the rule; the arena
    still holds the row before the push. Returns the ids this block admits."""
    data = state.data
    ids, rows, shows, clicks = push.ids, push.rows, push.shows, push.clicks  # once per block, as in _store
    stats_col = new.shape[1] - STATS_FLOATS
    dim = push.grads.shape[1]
    min_count, probability = np.float32(hp[MIN_COUNT]), hp[PROBABILITY]
    bound, step = np.float32(hp[WEIGHT_BOUND]), np.float32(hp[STEP])
    admitted_now = 0
    for i in range(new.shape[0]):
        r = rows[b + i]
        show = _old(data, r, stats_col + SHOW) + shows[b + i]
        admitted = _old(data, r, stats_col + ADMITTED) > 0
        if not admitted and show >= min_count:
            if probability >= 1.0:
                admitted = True
            else:  # a pure function of (id, show): replaying the journal decides the same way
                h = mix64_scalar(ids[b + i] ^ mix64_scalar(np.uint64(show * 16.0)))
                admitted = np.float64(h >> np.uint64(11)) * (1.0 / 9007199254740992.0) < probability
            if admitted:
                admitted_now += 1
        if admitted:
            if bound > 0:
                for j in range(dim):
                    new[i, j] = min(max(new[i, j], -bound), bound)
        else:
            for j in range(stats_col):
                new[i, j] = _old(data, r, j)
        new[i, stats_col + SHOW] = show
        new[i, stats_col + CLICK] = _old(data, r, stats_col + CLICK) + clicks[b + i]
        new[i, stats_col + LAST_STEP] = step
        new[i, stats_col + ADMITTED] = 1.0 if admitted else 0.0
    return admitted_now


@numba.njit(inline="always")
def _store(state, rows, new, seq, undo_lsn, undo_dirty):
    """Arena row rows[i] := new[i], dirty at lsn seq and touched; its lsn and dirty flag before go to undo_lsn
    and undo_dirty (as long as rows, or empty: nothing kept). Returns the change in (admitted ids, ids not
    admitted yet): a row exists once it is stored or dirty, and leaves its old count."""
    data, lsn, dirty, stored, ref = state  # once per block, not per row: numba counts a reference at each read
    width = new.shape[1]
    admitted_col = width - STATS_FLOATS + ADMITTED
    for i in range(undo_lsn.shape[0]):  # the rows' lines are in cache: _load has just read them
        undo_lsn[i] = lsn[rows[i]]
        undo_dirty[i] = dirty[rows[i]]
    d_admitted = 0
    d_pending = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        if stored[r] > 0 or dirty[r] > 0:
            if data[r, admitted_col] > 0:
                d_admitted -= 1
            else:
                d_pending -= 1
        if new[i, admitted_col] > 0:
            d_admitted += 1
        else:
            d_pending += 1
        for j in range(width):
            data[r, j] = new[i, j]
        lsn[r] = seq
        dirty[r] = 1
        touch(ref, r)
    return d_admitted, d_pending


@numba.njit(nogil=True, cache=True)
def update_rows(
    hp: np.ndarray, push: Push, state: RowState, target: Target, lo: int, hi: int
) -> tuple[int, int, int, int]:
    """Applies positions [lo, hi) of push to their rows (see the module docstring), a block at a time. Returns
    (ids admitted, change in admitted ids, change in ids not admitted yet, first position not finite or -1); the
    two changes are 0 when buffered. Positions of other parts are only read (prefetched)."""
    rows, grads, out = push.rows, push.grads, target.rows
    width = out.shape[1]
    size = _block_rows(width)
    block = np.empty((size if target.in_place else 0, width), np.float32)  # in place: the new rows
    params = np.zeros(KERNEL_PARAM_SLOTS, np.float32)
    for k in range(KERNEL_PARAM_SLOTS):
        params[k] = np.float32(hp[LR + k])
    admitted, d_admitted, d_pending, bad = 0, 0, 0, -1
    for b in range(lo, hi, size):
        e = min(hi, b + size)
        m = e - b
        if target.in_place:  # the old rows go to out (the undo copy), the new ones are computed in block
            new = block[:m]
            _load(state, rows[:hi], b, e, out[b:e])
            for i in range(m):
                for j in range(width):
                    new[i, j] = out[b + i, j]
        else:  # computed in out
            new = out[b:e]
            _load(state, rows[:hi], b, e, new)
        _apply_rule(hp, params, new, grads[b:e])
        admitted += _account(hp, state, new, push, b)
        x = first_non_finite_bits(new.view(np.uint32).reshape(-1))  # an Inf or NaN has every exponent bit set
        if bad < 0 and x >= 0:
            bad = b + x // width
        if target.in_place:
            da, dp = _store(state, rows[b:e], new, target.seq, target.lsn[b:e], target.dirty[b:e])
            d_admitted += da
            d_pending += dp
    return admitted, d_admitted, d_pending, bad


@numba.njit(nogil=True, cache=True)
def _commit(state, rows, buf, seq, lo, hi):
    return _store(state, rows[lo:hi], buf[lo:hi], seq, np.empty(0, np.uint64), np.empty(0, np.uint8))


@numba.njit(nogil=True, cache=True)
def _undo(state, rows, target, lo, hi):
    data, lsn, dirty = state.data, state.lsn, state.dirty
    undo_rows, undo_lsn, undo_dirty = target.rows, target.lsn, target.dirty
    width = undo_rows.shape[1]
    for i in range(lo, hi):
        r = rows[i]
        for j in range(width):
            data[r, j] = undo_rows[i, j]
        lsn[r] = undo_lsn[i]
        dirty[r] = undo_dirty[i]


@numba.njit(nogil=True, cache=True)
def _set_lsn(lsn, rows, seq, lo, hi):
    for i in range(lo, hi):
        lsn[rows[i]] = seq


# ---- callers' entry points (the work split over threads by ps.rows.parallel) -------------------------------------
def update(hp: np.ndarray, push: Push, state: RowState, target: Target) -> Outcome:
    """Applies a push (unique rows) to target: the arena itself (in_place) or a buffer (buffered)."""
    push = Push(*(_read_only(a) for a in push))  # one array kind, one compiled version (the module docstring)
    results = run_parts(lambda lo, hi: update_rows(hp, push, state, target, lo, hi), len(push.rows))
    return Outcome(
        admitted=sum(r[0] for r in results),
        d_admitted=sum(r[1] for r in results),
        d_pending=sum(r[2] for r in results),
        first_bad=min((r[3] for r in results if r[3] >= 0), default=-1),
    )


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of a (no copy); a itself where it is read-only already."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


def undo(state: RowState, rows: np.ndarray, target: Target) -> None:
    """Puts back what an in-place update of rows overwrote: data, lsn and dirty flags (use counts stay)."""
    run_parts(lambda lo, hi: _undo(state, rows, target, lo, hi), len(rows))


def commit(state: RowState, rows: np.ndarray, buf: np.ndarray, seq: int) -> tuple[int, int]:
    """Puts rows computed by a buffered update into arena rows `rows` as dirty rows at lsn seq; returns the
    change in (admitted ids, ids not admitted yet)."""
    results = run_parts(lambda lo, hi: _commit(state, rows, buf, np.uint64(seq), lo, hi), len(rows))
    return sum(a for a, _ in results), sum(p for _, p in results)


def restamp(state: RowState, rows: np.ndarray, seq: int) -> None:
    """Sets the lsn of rows to seq (an in-place update whose journal seq came out other than expected)."""
    run_parts(lambda lo, hi: _set_lsn(state.lsn, rows, np.uint64(seq), lo, hi), len(rows))

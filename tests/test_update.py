"""The push update kernel (ps.rows.update) against a per-row numpy oracle: every optimizer, in place and
buffered, admission, clipping, counts, undo, the first non-finite row, lazy L2 (also through a table's push,
chunked push and journal replay), and the hyper-parameter vector's slots. conftest splits every batch over 3
threads, so the kernel runs in parts here."""

import numpy as np
import pytest

from ps.config import AdmissionConfig, OptimizerConfig, TableConfig
from ps.engine.shard import Shard
from ps.hashing import mix64
from ps.rows import update, updateio
from ps.rows.layout import ADMITTED, CLICK, LAST_STEP, SHOW, STATS_FLOATS
from ps.rows.optim import get_optimizer
from ps.rows.updateio import Push, RowState
from ps.server_config import ServerConfig
from ps.storage.arena import Arena
from ps.storage.budget import MemoryBudget
from tests.conftest import crash

DIM = 4
CONFIGS = {
    "sgd": OptimizerConfig("sgd", 0.1),
    "adagrad": OptimizerConfig("adagrad", 0.1, {"initial_accumulator": 0.5, "epsilon": 1e-6}),
    "adagrad_rowwise": OptimizerConfig("adagrad_rowwise", 0.1, {"initial_accumulator": 0.5, "epsilon": 1e-6}),
    "adam": OptimizerConfig("adam", 0.01, {"beta1": 0.8, "beta2": 0.95, "epsilon": 1e-6}),
    "ftrl": OptimizerConfig("ftrl", 0.5, {"beta": 1.0, "l1": 0.05, "l2": 0.1}),
}


class Setup:
    """An arena of n rows in random but valid states (some admitted, some stored or dirty) and a push to all of
    them in a shuffled order. Built from a seed, so two Setups of one seed are equal."""

    def __init__(self, name: str, n: int = 600, seed: int = 0, scale: float = 1.0):
        rng = np.random.default_rng(seed)
        self.opt = get_optimizer(CONFIGS[name])
        self.name, self.n = name, n
        self.width = DIM + self.opt.state_floats(DIM) + STATS_FLOATS
        self.sc = self.width - STATS_FLOATS
        self.arena = a = Arena(self.width, MemoryBudget(1 << 24))
        stamp = a.new_stamp()
        rows = a.grow(n, stamp)
        ids = rng.permutation(n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # distinct, spread over u64
        block = np.zeros((n, self.width), np.float32)
        block[:, :DIM] = rng.normal(0, 0.5, (n, DIM))
        self.opt.init_state(block[:, : self.sc], DIM)
        state = block[:, DIM : self.sc]
        if name in ("adagrad", "adagrad_rowwise"):
            state += rng.random(state.shape).astype(np.float32)
        elif name == "adam":
            state[:, :DIM] = rng.normal(0, 0.1, (n, DIM))
            state[:, DIM : 2 * DIM] = rng.random((n, DIM))
            state[:, 2 * DIM] = rng.integers(0, 5, n)
        elif name == "ftrl":
            state[:, DIM:] = rng.random((n, DIM)) * 2
        show = rng.integers(0, 3, n).astype(np.float32)
        block[:, self.sc + SHOW] = show
        block[:, self.sc + CLICK] = np.minimum(show, rng.integers(0, 2, n))
        block[:, self.sc + LAST_STEP] = rng.integers(0, 4, n)
        block[:, self.sc + ADMITTED] = rng.random(n) < 0.4
        a.install(rows, ids, block, rng.integers(1, 50, n).astype(np.uint64), rng.integers(0, 3, n).astype(np.uint8), stamp)  # fmt: skip
        a.dirty[rows] = rng.integers(0, 2, n)
        a.ref[rows] = 0
        self.state = RowState(a.data, a.lsn, a.dirty, a.stored, a.ref)
        order = rng.permutation(n)
        shows = rng.integers(0, 3, n).astype(np.float32)
        self.push = Push(
            ids[order], rows[order], (rng.normal(0, 1, (n, DIM)) * scale).astype(np.float32),
            shows, np.minimum(shows, rng.integers(0, 2, n)).astype(np.float32),
        )  # fmt: skip

    def snapshot(self) -> tuple:
        a = self.arena
        return a.data[: a.used, : self.width].copy(), a.lsn[: a.used].copy(), a.dirty[: a.used].copy()

    def rows_of_push(self) -> np.ndarray:
        return self.arena.data[self.push.rows, : self.width]


def optimizer_step(name: str, p: dict, lr: float, w: np.ndarray, s: np.ndarray, g: np.ndarray) -> tuple:
    """One step for one row in float64, from the formulas; returns (w, state)."""
    if name == "sgd":
        return w - lr * g, s
    if name == "adagrad":
        acc = s + g * g
        return w - lr * g / (np.sqrt(acc) + p["epsilon"]), acc
    if name == "adagrad_rowwise":  # one accumulator per row: the mean of g^2 over the dims
        acc = s + np.mean(g * g)
        return w - lr * g / (np.sqrt(acc) + p["epsilon"]), acc
    if name == "adam":
        t = s[2 * DIM] + 1
        m = p["beta1"] * s[:DIM] + (1 - p["beta1"]) * g
        v = p["beta2"] * s[DIM : 2 * DIM] + (1 - p["beta2"]) * g * g
        c1, c2 = 1 - p["beta1"] ** t, 1 - p["beta2"] ** t
        return w - lr * (m / c1) / (np.sqrt(v / c2) + p["epsilon"]), np.concatenate([m, v, [t]])
    z, acc = s[:DIM], s[DIM:]
    new_acc = acc + g * g
    z = z + g - (np.sqrt(new_acc) - np.sqrt(acc)) / lr * w
    w = np.where(np.abs(z) <= p["l1"], 0.0, -(z - np.sign(z) * p["l1"]) / ((p["beta"] + np.sqrt(new_acc)) / lr + p["l2"]))  # fmt: skip
    return w, np.concatenate([z, new_acc])


def admits(i: int, show: np.float32, probability: float) -> bool:
    h = int(mix64(np.array([i], np.uint64) ^ mix64(np.array([np.uint64(show * 16.0)])))[0])
    return (h >> 11) * (1.0 / 2**53) < probability


def ftrl_z_of(w: np.ndarray, z: np.ndarray, n: np.ndarray, alpha: float, p: dict) -> np.ndarray:
    """FTRL's z whose w (with accumulators n) is w, solved from the optimizer's formula, one entry at a time: w 0
    keeps a z within l1, else z at sign(z) l1; otherwise -w ((beta + sqrt(n)) / alpha + l2) - sign(w) l1."""
    beta, l1, l2 = p.get("beta", 1.0), p.get("l1", 0.0), p.get("l2", 0.0)
    out = z.astype(np.float64).copy()
    for j in range(len(w)):
        if w[j] == 0:
            out[j] = z[j] if abs(z[j]) <= l1 else np.sign(z[j]) * l1
        else:
            out[j] = -w[j] * ((beta + np.sqrt(n[j])) / alpha + l2) - np.sign(w[j]) * l1
    return out


def oracle(s: Setup, old: np.ndarray, adm: AdmissionConfig, bound: float, step: int, rule: int) -> tuple:
    """(rows after the push, ids admitted, change in admitted ids, change in pending ids), one row at a time."""
    sc, lr, p = s.sc, float(s.opt.lr), s.opt.given_params
    want = old.astype(np.float64)
    admitted_now = d_admitted = d_pending = 0
    for k in range(s.n):
        o, g = old[k], s.push.grads[k].astype(np.float64)
        show = np.float32(o[sc + SHOW] + s.push.shows[k])
        was = o[sc + ADMITTED] > 0
        now = was or (show >= adm.min_count and admits(int(s.push.ids[k]), show, adm.probability))
        admitted_now += now and not was
        if now:
            if rule == update.ADD_DELTA:
                want[k, :DIM] = o[:DIM] + g
                if s.name == "ftrl":  # z set so that FTRL's w of (z, n) is the new embedding (before the clip)
                    want[k, DIM : 2 * DIM] = ftrl_z_of(want[k, :DIM], o[DIM : 2 * DIM], o[2 * DIM : 3 * DIM], lr, p)
            else:
                want[k, :DIM], want[k, DIM:sc] = optimizer_step(s.name, p, lr, o[:DIM].astype(np.float64), o[DIM:sc].astype(np.float64), g)  # fmt: skip
            if bound > 0:
                want[k, :DIM] = np.clip(want[k, :DIM], -np.float32(bound), np.float32(bound))
        r = s.push.rows[k]
        if s.arena.stored[r] > 0 or s.arena.dirty[r] > 0:
            d_admitted, d_pending = d_admitted - was, d_pending - (not was)
        d_admitted, d_pending = d_admitted + now, d_pending + (not now)
        want[k, sc:] = show, o[sc + CLICK] + s.push.clicks[k], step, float(now)
    return want, admitted_now, d_admitted, d_pending


@pytest.mark.parametrize("rule", [update.OPTIMIZE, update.ADD_DELTA])
@pytest.mark.parametrize("probability", [1.0, 0.5])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_kernel_matches_the_per_row_oracle_in_place_and_buffered(name, probability, rule):
    adm = AdmissionConfig(min_count=2, probability=probability)
    hp = update.at_step(update.hyper_params(get_optimizer(CONFIGS[name]), adm, 0.4, rule=rule), 5)
    s = Setup(name)
    old = s.rows_of_push().copy()
    want, admitted_now, d_admitted, d_pending = oracle(s, old, adm, 0.4, 5, rule)
    assert 0 < (want[:, s.sc + ADMITTED] > old[:, s.sc + ADMITTED]).sum() < s.n  # some rows admitted now, not all
    assert (want[:, :DIM] == np.float32(0.4)).any()  # and the bound clips some

    buf = updateio.buffered(s.n, s.width)
    before = s.snapshot()
    out = update.update(hp, s.push, s.state, buf)
    for a, b in zip(before, s.snapshot()):
        np.testing.assert_array_equal(a, b)  # buffered: the arena is untouched
    stats = slice(s.sc, s.width)
    np.testing.assert_array_equal(buf.rows[:, stats], want[:, stats].astype(np.float32))
    np.testing.assert_allclose(buf.rows, want, rtol=1e-4, atol=1e-5)
    assert (out.admitted, out.first_bad) == (admitted_now, -1)

    t = Setup(name)  # the same arena and push again, updated in place this time
    out_in_place = update.update(hp, t.push, t.state, updateio.in_place(t.n, t.width, 77))
    np.testing.assert_array_equal(t.rows_of_push(), buf.rows)  # bit for bit the buffered result
    assert (out_in_place.admitted, out_in_place.d_admitted, out_in_place.d_pending) == (admitted_now, d_admitted, d_pending)  # fmt: skip
    assert (t.arena.lsn[t.push.rows] == 77).all() and (t.arena.dirty[t.push.rows] == 1).all()
    assert (t.arena.ref[t.push.rows] == 1).all()

    assert update.commit(s.state, s.push.rows, buf.rows, 77) == (d_admitted, d_pending)
    for a, b in zip(s.snapshot(), t.snapshot()):
        np.testing.assert_array_equal(a, b)  # buffered + commit == in place: rows, lsn and dirty flags


def test_probabilistic_admission_decides_alike_in_place_and_buffered():
    adm = AdmissionConfig(min_count=1, probability=0.3)
    s, t = Setup("adagrad", n=4000, seed=3), Setup("adagrad", n=4000, seed=3)
    for x in (s, t):  # not admitted, no shows yet: an id is a candidate once this push shows it
        x.arena.data[x.push.rows, x.sc + ADMITTED] = 0
        x.arena.data[x.push.rows, x.sc + SHOW] = 0
    hp = update.at_step(update.hyper_params(s.opt, adm, 0.0), 2)
    buf = updateio.buffered(s.n, s.width)
    a = update.update(hp, s.push, s.state, buf)
    b = update.update(hp, t.push, t.state, updateio.in_place(t.n, t.width, 9))
    got = t.rows_of_push()[:, t.sc + ADMITTED]
    np.testing.assert_array_equal(buf.rows[:, s.sc + ADMITTED], got)
    assert a.admitted == b.admitted == int(got.sum())
    candidates = np.flatnonzero(s.push.shows >= 1)
    assert abs(a.admitted / len(candidates) - 0.3) < 0.04
    assert all(got[k] == admits(int(s.push.ids[k]), np.float32(s.push.shows[k]), 0.3) for k in candidates[:500])


def test_undo_puts_back_rows_lsn_and_dirty_flags():
    s = Setup("adam", seed=1)
    before = s.snapshot()
    target = updateio.in_place(s.n, s.width, 1234)
    update.update(update.hyper_params(s.opt, AdmissionConfig(), 0.0), s.push, s.state, target)
    assert not np.array_equal(before[0], s.snapshot()[0])
    update.undo(s.state, s.push.rows, target)
    for a, b in zip(before, s.snapshot()):
        np.testing.assert_array_equal(a, b)


def test_restamp_sets_the_lsn_of_the_rows_only():
    s = Setup("sgd", seed=2)
    lsn = s.arena.lsn[: s.arena.used].copy()
    update.restamp(s.state, s.push.rows[:10], 999)
    lsn[s.push.rows[:10]] = 999
    np.testing.assert_array_equal(s.arena.lsn[: s.arena.used], lsn)


def read_only_copy(a: np.ndarray) -> np.ndarray:
    """a as a request brings it: a read-only view of bytes."""
    return np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)


def test_writable_and_read_only_arrays_run_one_compiled_version():
    """A push's arrays as a shard makes them (writable) and as a request brings them (read-only views of its bytes),
    in any mix: the kernel is called with one array kind, so the second push loads no version the first did not."""
    s = Setup("sgd", n=50, seed=5)
    hp = update.hyper_params(s.opt, AdmissionConfig(), 0.0)
    update.update(hp, s.push, s.state, updateio.buffered(s.n, s.width))
    loaded = set(update.update_rows.signatures)
    for which in (("shows", "clicks"), ("clicks",), ("ids", "grads", "shows", "clicks")):
        sent = s.push._replace(**{f: read_only_copy(getattr(s.push, f)) for f in which})
        update.update(hp, sent, s.state, updateio.buffered(s.n, s.width))
        assert set(update.update_rows.signatures) == loaded, which


@pytest.mark.parametrize("target", ["in_place", "buffered"])
def test_the_first_row_that_would_not_be_finite_is_reported(target):
    s = Setup("sgd", seed=4)
    s.arena.data[s.push.rows, s.sc + ADMITTED] = 1
    s.push.grads[[123, 400, 77]] = np.float32(3e38)  # w - 0.1 g is finite; the stats keep the row finite too
    s.push.grads[[400, 500], 1] = -np.inf  # w + inf
    hp = update.hyper_params(s.opt, AdmissionConfig(), 0.0)
    tgt = updateio.in_place(s.n, s.width, 5) if target == "in_place" else updateio.buffered(s.n, s.width)
    assert update.update(hp, s.push, s.state, tgt).first_bad == 400
    if target == "in_place":
        update.undo(s.state, s.push.rows, tgt)
    s.push.grads[:] = 0
    assert update.update(hp, s.push, s.state, tgt).first_bad == -1


def test_add_delta_leaves_the_optimizer_state_alone():  # FTRL's z aside: the oracle test above
    s = Setup("adagrad", seed=5)
    s.arena.data[s.push.rows, s.sc + ADMITTED] = 1
    old = s.rows_of_push().copy()
    hp = update.hyper_params(s.opt, AdmissionConfig(), 0.0, rule=update.ADD_DELTA)
    update.update(hp, s.push, s.state, updateio.in_place(s.n, s.width, 3))
    new = s.rows_of_push()
    np.testing.assert_array_equal(new[:, :DIM], old[:, :DIM] + s.push.grads)
    np.testing.assert_array_equal(new[:, DIM : s.sc], old[:, DIM : s.sc])


def test_hyper_parameter_slots_are_named_and_hold_their_values():
    names = update.SLOT_NAMES
    assert len(set(names)) == update.NUM_SLOTS == len(names)
    slots = {n: getattr(update, n.upper()) for n in names}
    assert sorted(slots.values()) == list(range(update.NUM_SLOTS))
    assert all(names[i] == n for n, i in slots.items())
    opt = get_optimizer(CONFIGS["adam"])
    base = update.hyper_params(opt, AdmissionConfig(min_count=3, probability=0.25), 0.5, l2=0.125)
    hp = update.at_step(base, 7)
    assert base[update.STEP] == 0 and hp.dtype == np.float64
    assert update.describe(hp) == {
        "rule": "optimize", "optimizer": "adam", "lr": float(np.float32(0.01)), "param1": float(np.float32(0.8)),
        "param2": float(np.float32(0.95)), "param3": float(np.float32(1e-6)), "min_count": 3.0,
        "probability": 0.25, "weight_bound": 0.5, "l2": 0.125, "step": 7.0,
    }  # fmt: skip
    sgd = update.describe(update.hyper_params(get_optimizer(CONFIGS["sgd"]), AdmissionConfig(), 0.0, rule=update.ADD_DELTA))  # fmt: skip
    assert (sgd["rule"], sgd["optimizer"], sgd["param1"], sgd["param2"], sgd["param3"]) == ("add_delta", "sgd", 0, 0, 0)


def test_hyper_parameter_vectors_are_checked():
    opt = get_optimizer(CONFIGS["sgd"])
    with pytest.raises(ValueError, match="rule 7 is unknown"):
        update.hyper_params(opt, AdmissionConfig(), 0.0, rule=7)
    for l2 in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="l2 must be finite and >= 0"):
            update.hyper_params(opt, AdmissionConfig(), 0.0, l2=l2)
    with pytest.raises(ValueError, match=r"expected \(11,\) float64"):
        update.describe(np.zeros(10))
    with pytest.raises(ValueError, match=r"expected \(11,\) float64"):
        update.describe(np.zeros(11, np.float32))


# ---- lazy L2 ---------------------------------------------------------------------------------------------------
class L2History:
    """n rows never pushed (initial embedding and optimizer state, zero statistics) and pushes at clock steps:
    rows [0, 2n/3) at step 1, every third row at step 4, every row at step 10 (rows [2n/3, n) first pushed then,
    some rows skip step 4: gaps of 3, 6 and 9 steps). Built from a seed, so two of one seed are equal."""

    def __init__(self, name: str, n: int = 300, seed: int = 11, steps: tuple = (1, 4, 10)):
        self.setup = s = Setup(name, n=n, seed=seed)
        s.arena.data[s.push.rows, s.sc :] = 0  # never pushed: no statistics, not admitted
        rng = np.random.default_rng(seed + 1)
        members = (np.arange(n) < 2 * n // 3, np.arange(n) % 3 == 0, np.ones(n, bool))
        self.pushes = []
        for step, member in zip(steps, members):
            k = np.flatnonzero(member)
            grads = rng.normal(0, 1, (len(k), DIM)).astype(np.float32)
            push = Push(s.push.ids[k], s.push.rows[k], grads, np.ones(len(k), np.float32), np.zeros(len(k), np.float32))
            self.pushes.append((step, k, push))

    def run(self, l2: float, how: str = "in_place", rule: int = update.OPTIMIZE) -> np.ndarray:
        """Applies the pushes through the kernel (in place, or buffered then committed); returns the rows of the
        setup's push order after them."""
        s = self.setup
        base = update.hyper_params(s.opt, AdmissionConfig(), 0.0, l2=l2, rule=rule)
        for seq, (step, k, push) in enumerate(self.pushes, 1):
            hp = update.at_step(base, step)
            if how == "in_place":
                out = update.update(hp, push, s.state, updateio.in_place(len(k), s.width, seq))
            else:
                buf = updateio.buffered(len(k), s.width)
                out = update.update(hp, push, s.state, buf)
                update.commit(s.state, push.rows, buf.rows, seq)
            assert out.first_bad == -1
        return s.rows_of_push().copy()


def l2_oracle(h: L2History, old: np.ndarray, l2: float) -> np.ndarray:
    """The rows after h's pushes, one row and one push at a time: an admitted row's embedding times
    (1 - lr * l2) ** (steps since its last push), then the optimizer step; rows stored as float32 in between."""
    s = h.setup
    sc, lr, p = s.sc, float(s.opt.lr), s.opt.given_params
    rows = old.copy()
    for step, k, push in h.pushes:
        for pos, r in enumerate(k):
            w, state, last, admitted = rows[r, :DIM], rows[r, DIM:sc], rows[r, sc + LAST_STEP], rows[r, sc + ADMITTED]
            if admitted and step > last:
                w = w * np.float32(max(0.0, 1.0 - lr * l2) ** (step - float(last)))
            g = push.grads[pos].astype(np.float64)
            w, state = optimizer_step(s.name, p, lr, w.astype(np.float64), state.astype(np.float64), g)
            rows[r, :DIM], rows[r, DIM:sc] = w, state
            rows[r, sc + SHOW] += 1
            rows[r, sc + LAST_STEP], rows[r, sc + ADMITTED] = step, 1
    return rows


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adagrad_rowwise", "adam"])
def test_lazy_l2_decays_an_admitted_row_by_the_steps_it_was_not_pushed_before_the_step(name):
    h = L2History(name)
    old = h.setup.rows_of_push().copy()
    got = h.run(l2=0.5)  # lr 0.1: a factor of 0.95 per step not pushed
    want = l2_oracle(h, old, 0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    without = l2_oracle(h, old, 0.0)
    n = h.setup.n
    first_at_10 = (np.arange(n) >= 2 * n // 3) & (np.arange(n) % 3 != 0)  # new rows at step 10: not decayed
    np.testing.assert_array_equal(want[first_at_10], without[first_at_10])
    np.testing.assert_array_equal(got[first_at_10], L2History(name).run(l2=0.0)[first_at_10])
    assert (np.abs(want[~first_at_10, :DIM] - without[~first_at_10, :DIM]).max(axis=1) > 1e-3).all()


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_lazy_l2_in_place_and_buffered_agree_bit_for_bit(name):
    in_place, buffered = L2History(name), L2History(name)
    np.testing.assert_array_equal(in_place.run(l2=0.5), buffered.run(l2=0.5, how="buffered"))
    for a, b in zip(in_place.setup.snapshot(), buffered.setup.snapshot()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_l2_zero_or_no_gap_or_add_delta_change_nothing_bit_for_bit(name):
    spread = L2History(name).run(l2=0.0)
    same_step = L2History(name, steps=(7, 7, 7)).run(l2=0.0)
    stats = slice(Setup(name).sc, None)
    np.testing.assert_array_equal(spread[:, : stats.start], same_step[:, : stats.start])  # gaps do nothing at l2 0
    if name != "ftrl":  # TableConfig refuses l2 with ftrl
        np.testing.assert_array_equal(L2History(name, steps=(7, 7, 7)).run(l2=0.5), same_step)  # one step: no decay
    delta = L2History(name).run(l2=0.0, rule=update.ADD_DELTA)
    np.testing.assert_array_equal(L2History(name).run(l2=0.5, rule=update.ADD_DELTA), delta)


def test_a_decay_factor_below_zero_is_clamped_to_zero():
    h = L2History("sgd")
    got = h.run(l2=20.0)  # 1 - 0.1 * 20 < 0: a row not pushed for a step loses its embedding
    step, k, push = h.pushes[-1]
    again = np.isin(k, h.pushes[0][1])  # pushed at step 1 and again at 10
    np.testing.assert_array_equal(got[k[again], :DIM], np.float32(0) - np.float32(0.1) * push.grads[again])


def test_lazy_l2_rows_agree_pushed_in_place_in_chunks_and_replayed_after_a_crash(tmp_path):
    """A table's three paths through the kernel, each push at its own clock step: in place, in chunks (buffered,
    then committed), and replayed from the journal at start-up (a crash before any flush loses every row)."""
    rng = np.random.default_rng(5)
    ids = np.arange(1, 301, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    n = len(ids)
    members = (np.arange(n) < 2 * n // 3, np.arange(n) % 3 == 0, np.ones(n, bool))
    schedule = [(step, np.flatnonzero(m)) for step, m in zip((1, 4, 10), members)]
    grads = [rng.normal(0, 1, (len(k), DIM)).astype(np.float32) for _, k in schedule]

    def run(directory, l2: float, chunk: int = 0) -> tuple[Shard, np.ndarray]:
        shard = Shard(ServerConfig(data_dir=str(directory), flush_interval_s=3600))
        table = shard.create_table(TableConfig("t", DIM, optimizer=CONFIGS["adagrad"], l2=l2))
        if chunk:
            table.arena.max_pinnable = lambda: chunk  # pushes of more ids are taken in chunks
        for (step, k), g in zip(schedule, grads):
            shard.advance_clock(step - shard.clock)
            shard.push("t", ids[k], g)
        return shard, table.peek(ids)

    shard, in_place = run(tmp_path / "in_place", 0.5)
    crash(shard)
    reopened = Shard(ServerConfig(data_dir=str(tmp_path / "in_place"), flush_interval_s=3600))
    replayed = reopened.table("t").peek(ids)
    chunked_shard, chunked = run(tmp_path / "chunked", 0.5, chunk=64)
    undecayed_shard, undecayed = run(tmp_path / "undecayed", 0.0)
    for s in (reopened, chunked_shard, undecayed_shard):
        s.close()
    np.testing.assert_array_equal(replayed, in_place)
    np.testing.assert_array_equal(chunked, in_place)
    assert (in_place[:, -STATS_FLOATS + LAST_STEP] == 10).all()
    decayed = (np.arange(n) < 2 * n // 3) | (np.arange(n) % 3 == 0)  # pushed before step 10
    assert (np.abs(in_place[decayed, :DIM] - undecayed[decayed, :DIM]).max(axis=1) > 1e-3).all()
    np.testing.assert_array_equal(in_place[~decayed], undecayed[~decayed])

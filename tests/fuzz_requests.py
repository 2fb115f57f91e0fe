"""The requests of tests/test_fuzz.py: for every ParameterServer method, random bytes, mutated requests, and
well-formed requests with one valid-but-hostile value each (extreme counts, ids, dims, clocks, seqs, timeouts,
names, directories), mixed with valid requests so that the shard's state keeps changing. Seeded: the same seed
gives the same requests, given the same replies (RequestSource.observe learns tables, tokens, seqs and the clock
from the requests the shard accepted).

A hostile request is a valid one with one aspect drawn bad, so that each validation rule is reached, not hidden
behind another that a request breaks first. A string drawn as PLACE is replaced, in the serialized request, by
bytes that are not UTF-8 (proto3 forbids them in a string field)."""

from __future__ import annotations

import math
import os
import pathlib
import random
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import Message

from protos import ps_pb2

MAX64 = 2**64 - 1
MAX_CLOCK = 2**40  # what the shard refuses to pass (ps.config.MAX_CLOCK), drawn around here
SEQ_JUMP = 2**20  # ps.config.MAX_SEQ_JUMP
PLACE = "\x01\x02\x03\x04"
NON_UTF8 = [b"\xff\xfe\xfd\xfc", b"ab\x80c", b"a\xed\xa0\x80", b"abc\xc3"]
BAD_NAMES = ["", "nope", "\u00e9" * 3, "x" * 20_000, "t" * 129, "a/b", "emb\x00", " emb", "EMB", "..", PLACE]
BAD_FLOATS = [math.nan, math.inf, -math.inf, -1.0, 0.0, 1e31, 5e-324, -0.0]
SPECIAL = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38], dtype=np.float32)
# hold_timeout_s: refused, -0.0 aside (it equals 0, the field unset: the default)
TIMEOUTS = [math.nan, math.inf, -math.inf, -1.0, -1e-9, 3600.5, 1e308, -0.0]
METHODS = ["CreateTable", "DescribeTable", "Pull", "Push", "PullBatch", "PushBatch", "Checkpoint", "Stats",
           "AdvanceClock", "Shrink"]  # fmt: skip
WEIGHTS = [10, 4, 14, 16, 12, 20, 9, 3, 6, 6]
CLIENTS = [0, 0, 21, 22, 23]  # 0: no exactly-once bookkeeping
NEW_TABLES = {"t1": 3, "t2": 8, "t.3-x_": 1}  # CreateTable may create these (valid names, dim)


@dataclass
class Request:
    method: str
    data: bytes
    note: str  # how it was drawn, for a failure's message


class RequestSource:
    """Draws requests for shard 1 of 2. tables: {name: (dim, spec)} the shard starts with; mine / theirs: ids
    this shard owns / does not own; overflow_ids: ids of table "sgd" that only the float32-overflow draws use;
    root: the shard's checkpoint root (a file `file` and a link `out` to a directory outside are put in it)."""

    def __init__(self, seed: int, tables: dict, mine: np.ndarray, theirs: np.ndarray, overflow_ids: np.ndarray,
                 root: pathlib.Path):  # fmt: skip
        self.rng = random.Random(seed)
        self.gen = np.random.default_rng(seed)
        self.tables = dict(tables)
        self.mine, self.theirs, self.overflow_ids = mine, theirs, overflow_ids
        self.root = root
        (root / "file").write_bytes(b"not a directory")
        (root.parent / "outside").mkdir(exist_ok=True)
        os.symlink(root.parent / "outside", root / "out")
        self.newest: dict[int, int] = {}  # client id -> its newest seq the shard accepted
        self.clock = 0
        self.token = ""  # of the hold in force, if any
        self.held_for = 0  # requests drawn since it was taken
        self.saves = 0
        self.saved = "c0"  # the dir of the last save the shard took (none yet: a new dir)

    # ---- the stream ---------------------------------------------------------------------------------------
    def next(self) -> Request:
        if self.token:
            self.held_for += 1
            if self.held_for > 12:  # pushes cannot wait for long
                return self._encode(
                    "Checkpoint", ps_pb2.CheckpointRequest(phase="release", token=self.token), "release"
                )
        method = self.rng.choices(METHODS, WEIGHTS)[0]
        form = self.rng.random()
        if form < 0.05:
            return Request(method, self.rng.randbytes(self.rng.randint(0, 48)), "random bytes")
        message, note = getattr(self, method.lower())()
        request = self._encode(method, message, note)
        if form < 0.13:
            return Request(method, self._mutate(request.data), f"mutated {note}")
        return request

    def observe(self, request: Request, reply: bytes) -> None:
        """Learns from a request the shard accepted (with its reply's bytes)."""
        if request.method == "CreateTable":
            created = ps_pb2.CreateTableRequest.FromString(request.data)
            if not created.check_only:  # a check creates nothing
                self.tables.setdefault(created.spec.name, (created.spec.dim, created.spec))
        elif request.method == "PushBatch":
            r = ps_pb2.PushBatchRequest.FromString(request.data)
            if r.client_id:
                self.newest[r.client_id] = max(self.newest.get(r.client_id, 0), r.seq)
            self.clock = ps_pb2.PushBatchResponse.FromString(reply).step
        elif request.method == "AdvanceClock":
            self.clock = ps_pb2.ClockResponse.FromString(reply).step
        elif request.method == "Checkpoint":
            r, out = ps_pb2.CheckpointRequest.FromString(request.data), ps_pb2.CheckpointResponse.FromString(reply)
            if out.token:
                self.token, self.held_for = out.token, 0
            elif out.shard_json:
                self.saved = r.dir
            elif r.phase == "release" and r.token == self.token:
                self.token = ""

    def _encode(self, method: str, message: Message, note: str) -> Request:
        data = message.SerializeToString()
        if PLACE.encode() in data:
            data = data.replace(PLACE.encode(), self.rng.choice(NON_UTF8))
        return Request(method, data, note)

    def _mutate(self, data: bytes) -> bytes:
        out = bytearray(data)
        for _ in range(self.rng.randint(1, 3)):
            at = self.rng.randrange(min(len(out), 64) + 1)
            kind = self.rng.randrange(5)
            if kind == 0 and at < len(out):
                out[at] ^= self.rng.randrange(1, 256)
            elif kind == 1:
                del out[at:]
            elif kind == 2:
                out[at:at] = self.rng.randbytes(self.rng.randint(1, 4))
            elif kind == 3 and at < len(out):
                del out[at]
            else:
                out += self.rng.randbytes(self.rng.randint(1, 8))
        return bytes(out)

    # ---- values -------------------------------------------------------------------------------------------
    def _bad(self, aspects: list[str], p_valid: float = 0.35, rare: tuple[str, ...] = ()) -> str | None:
        """None (a valid request) with probability p_valid, else the one aspect to draw bad; each of `rare` (the
        costly ones: megabytes, thousands of fields) is drawn in about 1 of 250 requests."""
        for aspect in rare:
            if self.rng.random() < 0.004:
                return aspect
        return None if self.rng.random() < p_valid else self.rng.choice(aspects)

    def _table(self, bad: bool = False) -> str:
        if bad:
            return self.rng.choice(BAD_NAMES)
        return self.rng.choice([n for n in self.tables if n != "wide"] * 4 + ["wide"])

    def _mine(self, k: int | None = None) -> np.ndarray:
        k = k or self.rng.randint(1, 12)
        return self.gen.choice(self.mine, size=min(k, len(self.mine)), replace=False)

    def _ids(self, bad: str | None) -> np.ndarray | bytes:
        """Ids of a push or pull: an array (mine, distinct) or, drawn bad, an array or raw bytes."""
        ids = self._mine()
        if bad == "theirs":
            return self.gen.choice(self.theirs, size=self.rng.randint(1, 4), replace=False)
        if bad == "mixed":
            return np.concatenate([ids, self.theirs[:1]])
        if bad == "ragged":
            return ids.astype("<u8").tobytes() + self.rng.randbytes(self.rng.randint(1, 7))
        if bad == "random":  # random ids: about half of them this shard's
            return self.rng.randbytes(8 * self.rng.randint(1, 3))
        if bad == "extremes":  # 0, 2**63 and 2**64 - 1, with some of mine
            return np.concatenate([ids[:2], np.array([0, 2**63, MAX64], dtype=np.uint64)])
        if bad == "huge":  # a request past the shard's 1 MiB message limit
            return bytes(8 * 140_000)
        return ids

    def _grads(self, n: int, dim: int, bad: str | None) -> bytes:
        grads = self.gen.normal(0, 0.1, (n, dim)).astype("<f4")
        if bad == "non-finite" and grads.size:
            grads.flat[self.rng.randrange(grads.size)] = self.rng.choice(SPECIAL[:3])
        raw = grads.tobytes()
        if bad == "grads length":
            return self.rng.choice([raw[: -self.rng.randint(1, 4)] if raw else b"\0", raw + bytes(4), b"", raw * 2])
        return raw

    def _counts(self, n: int, bad: bool, at_most: bytes | None = None) -> bytes:
        """shows or clicks: empty (the defaults), or n finite values >= 0, each at most its at_most (clicks: the
        shows, empty meaning 1 each); drawn bad, a wrong length or value."""
        if not bad:
            values = [b"", np.ones(n, "<f4").tobytes(), self.gen.integers(0, 5, n).astype("<f4").tobytes()]
            if at_most is None:
                return self.rng.choice(values)
            limit = np.frombuffer(at_most, "<f4") if len(at_most) == 4 * n else np.ones(n, "<f4")
            chosen = self.rng.choice(values)
            return np.minimum(np.frombuffer(chosen, "<f4"), limit).tobytes() if chosen else chosen
        values = np.ones(n, "<f4")
        values[self.rng.randrange(n)] = self.rng.choice([-1.0, np.nan, np.inf, -np.inf])
        return self.rng.choice([values.tobytes(), values.tobytes(), b"\0\0\0", bytes(4 * (n + 1))])

    # ---- one request per method ---------------------------------------------------------------------------
    PUSH_ASPECTS = ["table", "theirs", "mixed", "ragged", "random", "extremes", "grads length", "non-finite",
                    "dim", "shows", "clicks", "clicks over shows", "duplicate", "overflow"]  # fmt: skip

    def _push(self, bad: str | None) -> ps_pb2.PushRequest:
        """A push; a quarter of them add their grads as deltas (add_delta), the others go through the optimizer."""
        add_delta = self.rng.random() < 0.25
        if bad == "overflow":  # sgd with lr 1 (or a delta): 3e38 added twice overflows float32
            ids = self.overflow_ids
            grads = np.full((len(ids), 4), 3e38 if add_delta else -3e38, "<f4")
            return ps_pb2.PushRequest(table="sgd", ids=ids.tobytes(), grads=grads.tobytes(), dim=4, add_delta=add_delta)
        table = self._table(bad == "table")
        dim = self.tables[table][0] if table in self.tables else 4
        ids = self._ids(bad if bad in ("theirs", "mixed", "ragged", "random", "extremes") else None)
        if bad == "duplicate":
            ids = np.concatenate([ids, ids[-1:]])
        raw = ids if isinstance(ids, bytes) else ids.astype("<u8").tobytes()
        n = len(raw) // 8
        req_dim = self.rng.choice([0, dim + 1, dim - 1, 2**32 - 1]) if bad == "dim" else dim
        shows = self._counts(n, bad == "shows")
        clicks = self._counts(n, bad == "clicks", shows)
        if bad == "clicks over shows" and n:  # one id clicked once more than shown
            over = np.frombuffer(shows, "<f4").copy() if len(shows) == 4 * n else np.ones(n, "<f4")
            over[self.rng.randrange(n)] += 1
            clicks = over.tobytes()
        return ps_pb2.PushRequest(
            table=table, ids=raw, grads=self._grads(n, dim, bad), dim=req_dim, shows=shows, clicks=clicks,
            add_delta=add_delta,
        )  # fmt: skip

    def push(self) -> tuple[Message, str]:
        bad = self._bad(self.PUSH_ASPECTS, rare=("huge",))
        if bad == "huge":
            return ps_pb2.PushRequest(table="emb", ids=self._ids("huge"), dim=4), "push over the message limit"
        return self._push(bad), f"push, bad {bad}"

    def pushbatch(self) -> tuple[Message, str]:
        bad = self._bad(["push", "advance", "seq jump", "batch duplicate", "partial", "new client max seq"])
        pushes = [self._push(None) for _ in range(self.rng.randint(0, 3))]
        if bad == "push":
            pushes.insert(self.rng.randint(0, len(pushes)), self._push(self.rng.choice(self.PUSH_ASPECTS)))
        elif bad == "batch duplicate":
            pushes += [self._push(None), self._push("duplicate")]
        elif bad == "partial":  # an overflow found while applying the second push: the first stays applied
            pushes = [self._push(None), self._push("overflow")]
        for p in pushes:
            p.return_rows = self.rng.random() < 0.3
        advance = self.rng.choice([0, 0, 1, 2])
        if bad == "advance":
            advance = self.rng.choice([MAX_CLOCK - self.clock + 1, 2 ** self.rng.randint(40, 63), MAX64])
        client = self.rng.choice(CLIENTS)
        newest = self.newest.get(client)
        seq = self.rng.choice([0, 1, 2]) if newest is None else newest + self.rng.choice([1, 1, 1, 0, -1])
        if bad == "seq jump" and client and newest is not None:
            seq = self.rng.choice([newest + SEQ_JUMP + 1, MAX64])
        if bad == "new client max seq":  # allowed: a client the shard holds nothing of starts at any seq
            client, seq = self.rng.randrange(1000, MAX64), MAX64
        request = ps_pb2.PushBatchRequest(pushes=pushes, advance_clock=advance, client_id=client, seq=max(seq, 0))
        return request, f"push batch, bad {bad}"

    def pull(self) -> tuple[Message, str]:
        bad = self._bad(["table", "theirs", "mixed", "ragged", "random", "extremes", "reply too large"], rare=("huge",))
        if bad == "reply too large":  # 1,025+ rows of dim 256 do not fit in a 1 MiB reply
            ids = self.gen.integers(0, MAX64, self.rng.randint(1025, 20_000), dtype=np.uint64, endpoint=True)
            return ps_pb2.PullRequest(table="wide", ids=ids.tobytes()), "pull, reply too large"
        ids = self._ids(bad if bad != "table" else None)
        raw = ids if isinstance(ids, bytes) else np.concatenate([ids, ids[:1]]).astype("<u8").tobytes()  # dups ok
        return ps_pb2.PullRequest(table=self._table(bad == "table"), ids=raw), f"pull, bad {bad}"

    def pullbatch(self) -> tuple[Message, str]:
        bad = self._bad(["one pull", "reply too large"], rare=("many pulls",))
        pulls = [
            self.pull()[0] if bad == "one pull" and i == 0 else self._valid_pull()
            for i in range(self.rng.randint(0, 4))
        ]
        if bad == "reply too large":  # together over 1 MiB, each under it
            ids = self.gen.integers(0, MAX64, 400, dtype=np.uint64, endpoint=True).tobytes()
            pulls = [ps_pb2.PullRequest(table="wide", ids=ids) for _ in range(3)]
        elif bad == "many pulls":  # past the codec's field budget; the last names no table
            one = ps_pb2.PullRequest(table="emb", ids=self.mine[:1].astype("<u8").tobytes())
            pulls = [one] * 2100 + [ps_pb2.PullRequest(table=self._table(True), ids=b"")]
        self.rng.shuffle(pulls)
        return ps_pb2.PullBatchRequest(pulls=pulls), f"pull batch, bad {bad}"

    def _valid_pull(self) -> ps_pb2.PullRequest:
        return ps_pb2.PullRequest(table=self._table(), ids=self._mine().astype("<u8").tobytes())

    def createtable(self) -> tuple[Message, str]:
        aspects = ["name", "dim", "optimizer", "learning_rate", "params", "param value", "initializer", "scale",
                   "weight_bound", "min_count", "probability", "decay", "score_threshold", "different spec"]  # fmt: skip
        bad = self._bad(aspects, p_valid=0.15)
        name = self.rng.choice(sorted(NEW_TABLES) + [n for n in self.tables if n != "wide"])
        spec = ps_pb2.TableSpec()
        spec.CopyFrom(
            self.tables[name][1] if name in self.tables else ps_pb2.TableSpec(name=name, dim=NEW_TABLES[name])
        )
        if bad == "name":
            spec.name = self.rng.choice([n for n in BAD_NAMES if n not in ("nope", "EMB", "..")])  # valid names
        elif bad == "dim":
            spec.dim = self.rng.choice([0, 4097, 2**32 - 1])
        elif bad == "optimizer":
            spec.optimizer.name = self.rng.choice(["bogus", "SGD", PLACE, "x" * 5000])
        elif bad == "learning_rate":
            spec.optimizer.learning_rate = self.rng.choice(BAD_FLOATS[:6])
        elif bad == "params":
            spec.optimizer.name = "adagrad"
            spec.optimizer.params["momentum"] = 0.9
        elif bad == "param value":
            opt, param, value = self.rng.choice([("adagrad", "epsilon", 0.0), ("adagrad", "initial_accumulator", -1.0),
                                                 ("adam", "beta1", 1.0), ("adam", "beta2", math.nan),
                                                 ("ftrl", "l1", math.inf), ("ftrl", "beta", -1e31)])  # fmt: skip
            spec.optimizer.name = opt
            spec.optimizer.params[param] = value
        elif bad == "initializer":
            spec.initializer.name = self.rng.choice(["what", "Uniform", PLACE])
        elif bad == "scale":
            spec.initializer.scale = self.rng.choice([math.nan, -1.0, math.inf, 1e31])
        elif bad == "weight_bound":
            spec.weight_bound = self.rng.choice([math.nan, -1.0, math.inf, 1e31])
        elif bad == "min_count":
            spec.admission.min_count = self.rng.choice([0, 2**24 + 1, 2**32 - 1])
        elif bad == "probability":
            spec.admission.probability = self.rng.choice([0.0, 1.5, math.nan, -0.1])
        elif bad == "decay":
            spec.eviction.decay = self.rng.choice([0.0, 1.5, math.nan, -1.0])
        elif bad == "score_threshold":
            spec.eviction.score_threshold = self.rng.choice([math.nan, -1.0, math.inf])
        elif bad == "different spec" and name in self.tables:
            spec.dim += 1
        check_only = self.rng.random() < 0.2  # answered as a create would be, creating nothing (observe)
        what = "check create table" if check_only else "create table"
        return ps_pb2.CreateTableRequest(spec=spec, check_only=check_only), f"{what}, bad {bad}"

    def describetable(self) -> tuple[Message, str]:
        return ps_pb2.DescribeTableRequest(table=self._table(self.rng.random() < 0.5)), "describe table"

    def stats(self) -> tuple[Message, str]:
        return ps_pb2.StatsRequest(), "stats"

    def advanceclock(self) -> tuple[Message, str]:
        if self.rng.random() < 0.4:
            return ps_pb2.AdvanceClockRequest(steps=self.rng.randint(0, 3)), "advance clock"
        steps = self.rng.choice(
            [MAX_CLOCK - self.clock + 1, 2 ** self.rng.randint(40, 63) + self.rng.randint(0, 9), MAX64]
        )
        return ps_pb2.AdvanceClockRequest(steps=steps), "advance clock, out of range"

    def shrink(self) -> tuple[Message, str]:
        bad = self.rng.random() < 0.6
        name = self._table(True) if bad else self.rng.choice(["", *self.tables])
        return ps_pb2.ShrinkRequest(table=name), f"shrink{', bad table' if bad else ''}"

    def checkpoint(self) -> tuple[Message, str]:
        r = self.rng.random()
        if not self.token:
            if r < 0.45:
                timeout = self.rng.choice(TIMEOUTS) if self.rng.random() < 0.5 else self.rng.choice([0.0, 60.0, 5e-324])
                return ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=timeout), f"hold {timeout}"
            if r < 0.6:
                return ps_pb2.CheckpointRequest(phase="save", dir=f"c{self.saves}", token="stale"), "save, no hold"
            if r < 0.8:
                return ps_pb2.CheckpointRequest(
                    phase=self.rng.choice(["", "HOLD", "restore", PLACE, "x" * 20_000])
                ), "bad phase"
            return ps_pb2.CheckpointRequest(
                phase="release", token=self.rng.choice(["", "stale", PLACE])
            ), "release, bad token"
        if r < 0.2:
            return ps_pb2.CheckpointRequest(phase="hold", hold_timeout_s=60.0), "hold while held"
        if r < 0.35:
            return ps_pb2.CheckpointRequest(phase="release", token=self.token), "release"
        return self._save()

    def _save(self) -> tuple[Message, str]:
        self.saves += 1
        outside = str(self.root.parent / "outside" / f"c{self.saves}")
        dirs = [f"c{self.saves}", str(self.root / f"abs{self.saves}"), self.saved, "", "../x", "a/../../b",
                "/etc/sparseps", outside, "file/sub", "out/x", "a\0b", ".", "/", PLACE, "y" * 5000]  # fmt: skip
        directory = self.rng.choice(dirs[:2] * 3 + dirs[2:3] * 2 + dirs[3:])
        return ps_pb2.CheckpointRequest(phase="save", dir=directory, token=self.token), f"save to {directory[:40]!r}"

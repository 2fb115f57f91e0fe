"""Frozen configuration dataclasses for tables, with validation and a JSON-able form, and the limits and defaults
both sides share (a shard's settings: ps/server_config.py; tables read from TOML: ps/table_toml.py)."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

import numpy as np

from ps.errors import InvalidArgumentError, echo

INITIALIZERS = ("zeros", "uniform", "normal")
FULL_AT_REST = "float32"  # the TableConfig.values_at_rest whose embeddings RocksDB holds as float32 (the default)
HALF_AT_REST = "float16"  # the TableConfig.values_at_rest whose embeddings RocksDB holds as float16
VALUES_AT_REST = (FULL_AT_REST, HALF_AT_REST)  # every TableConfig.values_at_rest: how RocksDB holds an embedding
HALF_MAX = float(np.finfo(np.float16).max)  # 65504: a float16 embedding at rest is clipped to +-HALF_MAX
TABLE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
TABLE_NAME_RULE = "1-128 characters of [A-Za-z0-9_.-]"  # TABLE_NAME_RE, as the messages refusing a name say it
FEATURES_RE = re.compile(r"[A-Za-z0-9_.:-]{0,64}")  # a TableConfig.features value
MAX_DIM = 4096
MAX_HYPERPARAMETER = 1e30  # rows are float32 (max 3.4e38): larger factors overflow them at once
ADAM_BETA_MAX = float(np.nextafter(np.float32(1), np.float32(0)))  # the largest float32 below 1
MIN_POSITIVE_HYPERPARAMETER = 1e-30  # the least learning rate and epsilon, and the least magnitude other than 0 of
# a new table's other hyperparameters (a decay, l1/l2, a bound, a threshold: ps.newtable.check_new): a normal float32
# whose reciprocal is finite (smaller ones become 0 or subnormal in the kernels' float32, so that they act as 0 or
# slow every step, and a division by them overflows)
FTRL_TINY_GRADIENT = 2.0**-75  # the largest |g| whose float32 square is 0 (2**-150 rounds to 0, to even)
MAX_MESSAGE_BYTES = 512 * 1024 * 1024  # default gRPC message limit, both ways; the servicer bounds replies by it
DEFAULT_REPLY_BYTES = 1 << 30  # replies of rows built and not sent yet, all calls together, without --memory-bytes
# (ps.replies.reply_room_bytes)
DEFAULT_REPLY_READ_TIMEOUT_S = 600.0  # a reply of rows unread this long after it was handed to gRPC ends its call
# (ps.unreadreplies): 5 times the longest a ps-worker call lasts with its default deadlines (--timeout-s 60, plus
# --barrier-timeout 60 for a stamped call's wait, which comes before its reply is built), and its largest reply
# (64 MiB, CLIENT_MESSAGE_BYTES) sent in that time at 1 Mbit/s
MIN_REPLY_READ_TIMEOUT_S = 1.0  # the least limit but 0 (none): ps-worker's largest reply (64 MiB) takes half of it
# to send at 1 Gbit/s, and a shorter one would cancel the calls of replies their callers are still reading
CLIENT_MESSAGE_BYTES = 64 << 20  # the default largest message a worker.client.Client sends
ROOM_SHARE = 16  # a client's message (its ids and rows) takes at most this share of a shard's request room
MIN_CLIENT_MESSAGE_BYTES = 1 << 20
MAX_CLUSTER_CHARS = 64  # of a --cluster name
MAX_HOLD_S = 3600.0  # of a checkpoint's hold (ps-worker checkpoint --hold-timeout-s, a Checkpoint hold request)
DEFAULT_HOLD_S = 120.0  # a hold's, where none is given (a Checkpoint hold request's hold_timeout_s 0)
DEFAULT_BARRIER_S = 60.0  # a sync or ssp wait's deadline where none is given (a stamp's barrier_timeout_s 0)
MAX_STAMP_TEXT = 1000  # characters of a stamp's setup, and of a stop stamp's reason
MAX_JOB_NAME_CHARS = 100  # of a stamp's job_name (printable ASCII: ps.stamp is_job_name)
MAX_BARRIER_S = 3600.0  # of a sync or ssp wait (a stamp's barrier_timeout_s, --barrier-timeout)
MAX_MEMORY_BYTES = 1 << 50  # of --cache-bytes and --memory-bytes (1 PiB): beyond any machine's memory
MAX_MEMORY_TEXT = f"{MAX_MEMORY_BYTES >> 40}T ({MAX_MEMORY_BYTES:,} bytes, beyond any machine's memory)"  # as said
# by the messages refusing a size over it (the servers' and ps-worker's --row-cache-bytes), spelled as sizes are
MAX_INTERVAL_S = 1e7  # of a time flag (~115 days): Python's waits take at most threading.TIMEOUT_MAX (~9.2e9 s)
MAX_CLOCK = 2**40  # a shard's clock never passes it: an advance that would is refused. Rows stamp the clock as
# float32 last_step, exact up to 2**24 and within 2**-24 of the clock above (65,536 steps at MAX_CLOCK); the
# journal and the replies carry it as uint64. 2**40 steps: 35 years at 1,000 advances a second
MAX_SEQ_JUMP = 2**20  # a PushBatch's seq may be at most this far ahead of its client's newest request on a shard
# The exactly-once table (ps.storage.applied): a shard forgets a client's newest request once it is unchanged for
# REQUEST_RETENTION_S, and a worker's Client sends no attempt of a request once its first attempt is RETRY_WINDOW_S
# old, so no retry meets a forgotten request. RETRY_MARGIN_S covers an attempt's way to its shard and a server's
# wall clock set forward. MAX_CLIENTS: entries a shard keeps (~250 bytes of RAM each, its request's content digest
# included); a new client past it is refused
REQUEST_RETENTION_S = 7 * 86400.0
RETRY_MARGIN_S = 86400.0
RETRY_WINDOW_S = REQUEST_RETENTION_S - RETRY_MARGIN_S
MAX_CLIENTS = 1_000_000


def check_hyperparameter(what: str, value: float, low: float = 0.0, low_inclusive: bool = True) -> None:
    """InvalidArgumentError unless low (<= or <) value <= MAX_HYPERPARAMETER; `> 0` means at least
    MIN_POSITIVE_HYPERPARAMETER. A stored table's config meets this check when it opens: a new table's meets
    ps.newtable.check_new too."""
    if not low_inclusive and low == 0:
        low, low_inclusive = MIN_POSITIVE_HYPERPARAMETER, True
    ok = math.isfinite(value) and (value >= low if low_inclusive else value > low) and value <= MAX_HYPERPARAMETER
    if not ok:
        op = ">=" if low_inclusive else ">"
        raise InvalidArgumentError(f"{what} must be finite, {op} {low:g} and <= {MAX_HYPERPARAMETER:g}, got {value!r}")


def check_table_name(name: str) -> None:
    """InvalidArgumentError unless name is one a table may have (TABLE_NAME_RE): the check of a new table's spec,
    and of a name a request gives before a shard looks it up, so that a name no table can have is refused as
    such, not as a table the shard lacks."""
    if not TABLE_NAME_RE.fullmatch(name):
        raise InvalidArgumentError(f"table name {echo(name)} is invalid; expected {TABLE_NAME_RULE}")


def ftrl_divides_by_zero(at: str, whose: str = "") -> str:
    """The advice for ftrl with beta 0 and l2 0, whose divisor is 0 at `at` (a dim, and why): ps.newtable.check_new
    adds the table's name before it, ps.rows.optim.Ftrl.non_finite_cause the dim, and whose="the table's "."""
    return (f"ftrl with beta 0 and l2 0 divides by (beta + sqrt(n)) / learning_rate + l2, 0 at {at}; give "
            f"{whose}ftrl params.beta > 0 (default 1) or params.l2 > 0")  # fmt: skip


def message_bytes_for(max_request_bytes: int, rooms: list[int]) -> int:
    """The message size a worker.client.Client uses with shards that keep rooms[i] bytes for requests' copies
    (StatsResponse request_room_bytes; 0: none, the shard started without --memory-bytes): at most
    max_request_bytes and 1/ROOM_SHARE of the smallest room (not below MIN_CLIENT_MESSAGE_BYTES). A push's copies
    on the shard are up to about six times its message (ps.engine.room's costs; adam and ftrl rows), and the
    shard's threads hold the messages waiting for room: smaller messages keep both inside the shard's memory
    bound, and a request is never refused as larger than the room. A sync step's push is one message per shard,
    whatever its size (the shard runs it alone). The rows a message asks back are at most its size: a shard's
    reply room holds one such reply (ps.replies.least_reply_bytes)."""
    bounded = [r for r in rooms if r]
    if not bounded:
        return max_request_bytes
    return min(max_request_bytes, max(MIN_CLIENT_MESSAGE_BYTES, min(bounded) // ROOM_SHARE))


@dataclass(frozen=True)
class InitializerConfig:
    """How a row that was never pushed looks: a pure function of (seed, id, column)."""

    name: str = "uniform"
    scale: float = 0.01  # uniform: [-scale, scale]; normal: standard deviation
    seed: int = 0

    def normalized(self) -> InitializerConfig:
        """The same initializer spelled one way: zeros without a scale or seed (it makes the same rows whatever
        they are), for a worker comparing the initializer it was given with one a table is held with."""
        return InitializerConfig("zeros", 0.0, 0) if self.name == "zeros" else self

    def validate(self) -> None:
        if self.name not in INITIALIZERS:
            raise InvalidArgumentError(f"initializer {echo(self.name)} is unknown; expected one of {INITIALIZERS}")
        check_hyperparameter("initializer scale", self.scale)
        if not 0 <= self.seed < 2**64:
            raise InvalidArgumentError(f"initializer seed must fit in uint64, got {self.seed}")


OPTIMIZER_PARAMS: dict[str, dict[str, float]] = {
    "sgd": {},
    "adagrad": {"initial_accumulator": 0.1, "epsilon": 1e-7},
    "adagrad_rowwise": {"initial_accumulator": 0.1, "epsilon": 1e-7},
    "adam": {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
    "ftrl": {"beta": 1.0, "l1": 0.0, "l2": 0.0},
}
"""Each optimizer's parameters and their defaults (the update rules are in ps.rows.optim)."""

DEFAULT_LEARNING_RATES: dict[str, float] = {
    "sgd": 0.01, "adagrad": 0.02, "adagrad_rowwise": 0.02, "adam": 0.001, "ftrl": 0.05,
}  # fmt: skip
"""Each optimizer's learning rate where none is given (a table spec, a table config, --optimizer)."""


@dataclass(frozen=True)
class OptimizerConfig:
    """The server-side optimizer of a table; `params` holds optimizer-specific values (OPTIMIZER_PARAMS).
    A learning_rate of None takes the optimizer's DEFAULT_LEARNING_RATES entry."""

    name: str = "adagrad"
    learning_rate: float | None = None
    params: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.learning_rate is None:  # an unknown name keeps None: validate() names the optimizer
            object.__setattr__(self, "learning_rate", DEFAULT_LEARNING_RATES.get(self.name))

    def validate(self) -> None:
        defaults = OPTIMIZER_PARAMS.get(self.name)
        if defaults is None:
            raise InvalidArgumentError(
                f"optimizer {echo(self.name)} is unknown; expected one of {sorted(OPTIMIZER_PARAMS)}"
            )
        check_hyperparameter("learning_rate", self.learning_rate, low_inclusive=False)
        unknown = sorted(set(self.params) - set(defaults))
        if unknown:
            raise InvalidArgumentError(
                f"optimizer {self.name!r} got unknown parameters {echo(unknown)}; expected some of {sorted(defaults)}"
            )
        p = self.all_params()
        if self.name in ("adagrad", "adagrad_rowwise"):
            check_hyperparameter(f"{self.name} initial_accumulator", p["initial_accumulator"])
            check_hyperparameter(f"{self.name} epsilon", p["epsilon"], low_inclusive=False)
        elif self.name == "adam":
            for b in ("beta1", "beta2"):  # the kernel's 1 - b ** t divides: b must stay below 1 in float32
                if not (0 <= p[b] < 1 and np.float32(p[b]) < 1):
                    raise InvalidArgumentError(
                        f"adam {b} must be in [0, 1) and below 1 in float32 (at most {ADAM_BETA_MAX!r}), got {p[b]!r}"
                    )
            check_hyperparameter("adam epsilon", p["epsilon"], low_inclusive=False)
        elif self.name == "ftrl":
            for k in ("beta", "l1", "l2"):
                check_hyperparameter(f"ftrl {k}", p[k])
        for k, v in p.items():  # each parameter of each optimizer has its range above; this bounds any other
            check_hyperparameter(f"optimizer {self.name!r} parameter {k}", v, low=-MAX_HYPERPARAMETER)

    def all_params(self) -> dict[str, float]:
        """Every parameter of this optimizer: the given ones, defaults for the rest (name must be known)."""
        return {k: float(v) for k, v in {**OPTIMIZER_PARAMS[self.name], **self.params}.items()}

    def normalized(self) -> OptimizerConfig:
        """Validated, with every parameter spelled out (defaults filled in), for comparing specs."""
        self.validate()
        return OptimizerConfig(self.name, self.learning_rate, dict(sorted(self.all_params().items())))


@dataclass(frozen=True)
class AdmissionConfig:
    """When a pushed id gets a trained row. Until then its pulls return the initial value and its pushes only
    count (show, click, last step), stored compactly. Defaults: create on the first push."""

    min_count: int = 1  # admitted once its show count reaches this
    probability: float = 1.0  # ... and then, at each push, with this probability

    def validate(self) -> None:
        if not 1 <= self.min_count <= 2**24:
            raise InvalidArgumentError(f"admission min_count must be in 1..{2**24}, got {self.min_count}")
        if not (math.isfinite(self.probability) and 0 < self.probability <= 1):
            raise InvalidArgumentError(f"admission probability must be in (0, 1], got {self.probability!r}")


@dataclass(frozen=True)
class EvictionConfig:
    """What Shrink drops. score = (show - click) * nonclk_coeff + click * click_coeff, after each Shrink
    multiplies show and click by `decay`; an id is dropped when its score < score_threshold (a score at it, to
    ps.engine.shrinkrule's SCORE_SLACK, keeps its id), or when it was last pushed more than ttl_steps clock steps
    ago. 0 turns a rule off."""

    ttl_steps: int = 0
    score_threshold: float = 0.0
    decay: float = 1.0
    nonclk_coeff: float = 0.1
    click_coeff: float = 1.0

    @property
    def is_off(self) -> bool:
        """Whether a Shrink changes nothing of a table of this config: no TTL, no score threshold, no decay."""
        return self.ttl_steps == 0 and self.score_threshold == 0 and self.decay == 1

    def validate(self) -> None:
        if self.ttl_steps < 0:
            raise InvalidArgumentError(f"eviction ttl_steps must be >= 0, got {self.ttl_steps}")
        if not (math.isfinite(self.decay) and 0 < self.decay <= 1):
            raise InvalidArgumentError(f"eviction decay must be in (0, 1], got {self.decay!r}")
        for k in ("score_threshold", "nonclk_coeff", "click_coeff"):
            check_hyperparameter(f"eviction {k}", getattr(self, k))


@dataclass(frozen=True)
class TableConfig:
    name: str
    dim: int
    initializer: InitializerConfig = InitializerConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    weight_bound: float = 0.0  # > 0: embeddings are clipped to [-weight_bound, weight_bound] after each step
    admission: AdmissionConfig = AdmissionConfig()
    eviction: EvictionConfig = EvictionConfig()
    l2: float = 0.0  # > 0: lazy L2, embeddings decay by (1 - learning_rate * l2) per clock step (ps.rows.update)
    # What the table's ids mean, as its creator names it (a worker: a fingerprint of its schema, "schema:<hex>"); ""
    # none. Part of the spec like the rest, except that "" on either side of a comparison matches any value (a
    # table made before fingerprints, or by a client that sends none).
    features: str = ""
    # How RocksDB holds the embedding of each row at rest (ps.storage.rowformat): "float16" halves its bytes there, and
    # a row read back from RocksDB has its embedding rounded to float16 (clipped to +-65504); the RAM tier, the
    # optimizer state and the statistics stay float32. A table keeps the setting it was created with. "" is
    # unspecified (a client that sends none): it matches an existing table's either setting, as features does, and
    # a table made of it is "float32" (as_new).
    values_at_rest: str = FULL_AT_REST

    def validate(self) -> None:
        check_table_name(self.name)
        if not 1 <= self.dim <= MAX_DIM:
            raise InvalidArgumentError(f"table {self.name!r}: dim must be in 1..{MAX_DIM}, got {self.dim}")
        self.initializer.validate()
        self.optimizer.validate()
        check_hyperparameter(f"table {self.name!r}: weight_bound", self.weight_bound)
        check_hyperparameter(f"table {self.name!r}: l2", self.l2)
        if self.l2 > 0 and self.optimizer.name == "ftrl":
            raise InvalidArgumentError(
                f"table {self.name!r}: l2 does not apply to ftrl, whose step recomputes the embedding from its state;"
                " use the optimizer's own params.l2"
            )
        self.admission.validate()
        self.eviction.validate()
        if not FEATURES_RE.fullmatch(self.features):
            raise InvalidArgumentError(f"table {self.name!r}: features {echo(self.features)} is invalid; expected at "
                                       "most 64 characters of [A-Za-z0-9_.:-]")  # fmt: skip
        if self.values_at_rest and self.values_at_rest not in VALUES_AT_REST:
            raise InvalidArgumentError(f"table {self.name!r}: values_at_rest {echo(self.values_at_rest)} is unknown; "
                                       f"expected one of {VALUES_AT_REST}, or '' for unspecified")  # fmt: skip

    def as_new(self) -> TableConfig:
        """The config of a table made of self: an unspecified values_at_rest ("") is FULL_AT_REST, "float32"."""
        return self if self.values_at_rest else dataclasses.replace(self, values_at_rest=FULL_AT_REST)

    def normalized(self) -> TableConfig:
        """Validated, with optimizer defaults spelled out: two specs that mean the same compare equal."""
        self.validate()
        return dataclasses.replace(self, optimizer=self.optimizer.normalized())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TableConfig:
        return cls(
            name=d["name"],
            dim=int(d["dim"]),
            initializer=InitializerConfig(**d["initializer"]),
            optimizer=OptimizerConfig(**d["optimizer"]),
            weight_bound=float(d.get("weight_bound", 0.0)),
            admission=AdmissionConfig(**d.get("admission", {})),
            eviction=EvictionConfig(**d.get("eviction", {})),
            l2=float(d.get("l2", 0.0)),
            features=str(d.get("features", "")),
            values_at_rest=str(d.get("values_at_rest", FULL_AT_REST)),
        )

    def differences(self, other: TableConfig) -> list[str]:
        """Human-readable list of fields where self and other differ ("dim: 8 != 16"); features and values_at_rest
        only when both are set."""
        a, b = _flatten(self.to_dict()), _flatten(other.to_dict())
        for key in ("features", "values_at_rest"):
            if not (a[key] and b[key]):
                del a[key], b[key]
        return [f"{k}: {a.get(k)!r} != {b.get(k)!r}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out

"""Frozen configuration dataclasses for tables and servers, with validation and a JSON-able form."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field

import numpy as np

from ps.errors import InvalidArgumentError, echo

INITIALIZERS = ("zeros", "uniform", "normal")
FULL_AT_REST = "float32"  # the TableConfig.values_at_rest whose embeddings RocksDB holds as float32 (the default)
HALF_AT_REST = "float16"  # the TableConfig.values_at_rest whose embeddings RocksDB holds as float16
VALUES_AT_REST = (FULL_AT_REST, HALF_AT_REST)  # every TableConfig.values_at_rest: how RocksDB holds an embedding
HALF_MAX = float(np.finfo(np.float16).max)  # 65504: a float16 embedding at rest is clipped to +-HALF_MAX
TABLE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
FEATURES_RE = re.compile(r"[A-Za-z0-9_.:-]{0,64}")  # a TableConfig.features value
MAX_DIM = 4096
MAX_HYPERPARAMETER = 1e30  # rows are float32 (max 3.4e38): larger factors overflow them at once
ADAM_BETA_MAX = float(np.nextafter(np.float32(1), np.float32(0)))  # the largest float32 below 1
MIN_POSITIVE_HYPERPARAMETER = 1e-30  # a learning rate or epsilon: a normal float32 whose reciprocal is finite
# (smaller ones become 0 or subnormal in the kernels' float32, and a division by them overflows)
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
# wall clock set forward. MAX_CLIENTS: entries a shard keeps (~250 bytes of RAM each); a new client past it is refused
REQUEST_RETENTION_S = 7 * 86400.0
RETRY_MARGIN_S = 86400.0
RETRY_WINDOW_S = REQUEST_RETENTION_S - RETRY_MARGIN_S
MAX_CLIENTS = 1_000_000


def check_hyperparameter(what: str, value: float, low: float = 0.0, low_inclusive: bool = True) -> None:
    """InvalidArgumentError unless low (<= or <) value <= MAX_HYPERPARAMETER; `> 0` means at least
    MIN_POSITIVE_HYPERPARAMETER."""
    if not low_inclusive and low == 0:
        low, low_inclusive = MIN_POSITIVE_HYPERPARAMETER, True
    ok = math.isfinite(value) and (value >= low if low_inclusive else value > low) and value <= MAX_HYPERPARAMETER
    if not ok:
        op = ">=" if low_inclusive else ">"
        raise InvalidArgumentError(f"{what} must be finite, {op} {low:g} and <= {MAX_HYPERPARAMETER:g}, got {value}")


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
        for k, v in p.items():
            check_hyperparameter(f"optimizer {self.name!r} parameter {k}", v, low=-MAX_HYPERPARAMETER)
        if self.name in ("adagrad", "adagrad_rowwise"):
            check_hyperparameter(f"{self.name} initial_accumulator", p["initial_accumulator"])
            check_hyperparameter(f"{self.name} epsilon", p["epsilon"], low_inclusive=False)
        elif self.name == "adam":
            for b in ("beta1", "beta2"):  # the kernel's 1 - b ** t divides: b must stay below 1 in float32
                if not (0 <= p[b] < 1 and np.float32(p[b]) < 1):
                    raise InvalidArgumentError(
                        f"adam {b} must be in [0, 1) and below 1 in float32 (at most {ADAM_BETA_MAX!r}), got {p[b]}"
                    )
            check_hyperparameter("adam epsilon", p["epsilon"], low_inclusive=False)
        elif self.name == "ftrl":
            for k in ("beta", "l1", "l2"):
                check_hyperparameter(f"ftrl {k}", p[k])

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
            raise InvalidArgumentError(f"admission probability must be in (0, 1], got {self.probability}")


@dataclass(frozen=True)
class EvictionConfig:
    """What Shrink drops. score = (show - click) * nonclk_coeff + click * click_coeff, after each Shrink
    multiplies show and click by `decay`; an id is dropped when its score < score_threshold, or when it was last
    pushed more than ttl_steps clock steps ago. 0 turns a rule off."""

    ttl_steps: int = 0
    score_threshold: float = 0.0
    decay: float = 1.0
    nonclk_coeff: float = 0.1
    click_coeff: float = 1.0

    def validate(self) -> None:
        if self.ttl_steps < 0:
            raise InvalidArgumentError(f"eviction ttl_steps must be >= 0, got {self.ttl_steps}")
        if not (math.isfinite(self.decay) and 0 < self.decay <= 1):
            raise InvalidArgumentError(f"eviction decay must be in (0, 1], got {self.decay}")
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
        if not TABLE_NAME_RE.fullmatch(self.name):
            raise InvalidArgumentError(
                f"table name {echo(self.name)} is invalid; expected 1-128 characters of [A-Za-z0-9_.-]"
            )
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

    def check_new(self) -> None:
        """InvalidArgumentError for settings that validate() takes but a table made now may not have: ftrl with
        beta 0 and l2 0 over an initializer that is not all zeros. FTRL holds its embedding as a function of its
        state, -(z - sign(z) l1) / ((beta + sqrt(n)) / lr + l2), which at n = 0 cannot give an initial row other
        than 0: each dim's first step with a gradient of exactly 0 would set it to 0. A table a data dir holds
        already (a checkpoint's included) opens without this check."""
        p = self.optimizer.all_params() if self.optimizer.name == "ftrl" else {}
        zeros = self.initializer.name == "zeros" or self.initializer.scale == 0
        if p and p["beta"] == 0 and p["l2"] == 0 and not zeros:
            raise InvalidArgumentError(
                f"table {self.name!r}: ftrl with beta 0 and l2 0 cannot hold the initializer's non-zero embeddings "
                f"({self.initializer.name}, scale {self.initializer.scale:g}): its state gives w = 0 until a dim's "
                "first non-zero gradient; give ftrl params.beta > 0 (default 1) or params.l2 > 0, or the initializer "
                "zeros"
            )

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


@dataclass(frozen=True)
class ServerConfig:
    """One shard process. `port` 0 takes a free port."""

    data_dir: str
    shard_id: int = 0
    num_shards: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    threads: int = 8
    max_queued_calls: int = 256  # calls waiting for one of the threads; past them RESOURCE_EXHAUSTED (ps.server)
    sync: bool = False  # fsync each acknowledged push (survives power loss, not only a process crash)
    max_message_bytes: int = MAX_MESSAGE_BYTES  # largest request and reply (gRPC's limits and the servicer's)
    reply_bytes: int | None = None  # room for replies of rows built and not sent yet, each counted twice
    # (ps.replies.REPLY_COPIES); 0: no bound; None: 1 GiB, or the request room under memory_bytes (reply_room_bytes)
    reply_read_timeout_s: float = DEFAULT_REPLY_READ_TIMEOUT_S  # a reply of rows its caller has not read this long
    # after it was handed to gRPC ends its call, its room given back (ps.unreadreplies); 0: no limit, else at least
    # MIN_REPLY_READ_TIMEOUT_S
    cache_bytes: int | None = None  # RAM tier budget shared by all tables; None: 2 GiB, or what memory_bytes leaves
    memory_bytes: int | None = None  # one bound for the data: RAM tier, RocksDB, write-behind (ps.storage.memory)
    read_threads: int = 2  # threads reading a request's missed rows from RocksDB
    flush_interval_s: float = 30.0  # the background flusher writes dirty rows to RocksDB this often
    journal_flush_bytes: int = 1 << 30  # ... or as soon as the journal has grown by this much
    tls_cert: str | None = None  # PEM certificate and key: serve TLS (ps/security.py)
    tls_key: str | None = None
    tls_ca: str | None = None  # with cert and key: mutual TLS, clients must present a certificate it signed
    auth_token_file: str | None = None  # every call but health checks must carry this token
    read_token_file: str | None = None  # ... or this one, for the calls that change nothing (ps/security.py)
    restore_dir: str | None = None  # a checkpoint to fill a new data dir from (ps/checkpoint.py)
    metrics_port: int | None = None  # serve Prometheus metrics on this port (0: a free one; None: off)
    direct_reads: bool = False  # RocksDB reads SST files with O_DIRECT, past the page cache (benchmarks, small hosts)
    mmap_reads: bool = False  # RocksDB reads SST files through memory maps (ps.storage.options.rocksdb_options)
    accept_journal_loss: bool = False  # start even if journal records are missing or damaged (ps.storage.journalreplay)
    checkpoint_root: str | None = None  # Checkpoint saves write only inside this directory; None: saves refused
    cluster: str = ""  # the name of the cluster this shard belongs to, in Stats (clients compare their shards')
    verify_on_start: bool = False  # read every block of a data dir with data first; refuse it if damaged (ps.server)

    def validate(self) -> None:
        if self.direct_reads and self.mmap_reads:
            raise ValueError("--direct-reads and --mmap-reads exclude each other: give one of them")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("give both --tls-cert and --tls-key, or neither")
        if self.tls_ca and not self.tls_cert:
            raise ValueError("--tls-ca (mutual TLS) needs --tls-cert and --tls-key")
        if self.read_token_file and not self.auth_token_file:
            raise ValueError("--read-token-file admits read-only callers beside those of --auth-token-file, whose "
                             "token may do everything: give --auth-token-file too")  # fmt: skip
        if not self.num_shards >= 1:
            raise ValueError(f"--num-shards must be >= 1, got {self.num_shards}")
        if not 0 <= self.shard_id < self.num_shards:
            raise ValueError(f"--shard-id {self.shard_id} must be in 0..{self.num_shards - 1} (--num-shards "
                             f"{self.num_shards})")  # fmt: skip
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        for flag, size in (("--cache-bytes", self.cache_bytes), ("--memory-bytes", self.memory_bytes)):
            if size is not None and not 1 <= size <= MAX_MEMORY_BYTES:
                raise ValueError(f"{flag} must be at least 1 byte and at most {MAX_MEMORY_TEXT}, got {size:,}")
        if self.read_threads < 1:
            raise ValueError(f"read_threads must be >= 1, got {self.read_threads}")
        if self.max_queued_calls < 1:
            raise ValueError(f"--max-queued-calls must be >= 1, got {self.max_queued_calls}")
        if self.reply_bytes is not None and self.reply_bytes < 0:
            raise ValueError(f"--reply-bytes must be >= 0 (0: no bound), got {self.reply_bytes:,}")
        if self.reply_read_timeout_s and not MIN_REPLY_READ_TIMEOUT_S <= self.reply_read_timeout_s <= MAX_INTERVAL_S:
            raise ValueError(f"--reply-read-timeout-s must be 0 (no limit) or from {MIN_REPLY_READ_TIMEOUT_S:g} to "
                             f"{MAX_INTERVAL_S:g} s (a shorter limit cancels the calls of large replies their callers "
                             f"are still reading), got {self.reply_read_timeout_s:g}")  # fmt: skip
        if not 0 < self.flush_interval_s <= MAX_INTERVAL_S:
            raise ValueError(f"--flush-interval-s must be > 0 and <= {MAX_INTERVAL_S:g} s, got {self.flush_interval_s}")
        if len(self.cluster) > MAX_CLUSTER_CHARS or not all(
            c.isascii() and (c.isalnum() or c in "._-") for c in self.cluster
        ):
            raise ValueError(f"--cluster {self.cluster[:MAX_CLUSTER_CHARS + 1]!r}: expected at most "
                             f"{MAX_CLUSTER_CHARS} letters, digits, '.', '_' or '-'")  # fmt: skip
        if self.checkpoint_root is not None and not self.checkpoint_root.strip():
            raise ValueError(
                "--checkpoint-root is empty; give a directory, or leave the flag out to refuse checkpoints"
            )
        if self.checkpoint_root and os.path.exists(self.checkpoint_root) and not os.path.isdir(self.checkpoint_root):
            raise ValueError(f"--checkpoint-root {self.checkpoint_root} is not a directory; give a directory, or "
                             "leave the flag out to refuse checkpoints")  # fmt: skip
        if not self.data_dir.strip():
            raise ValueError("--data-dir is empty; give the shard's data directory")
        for flag, path in (("--data-dir", self.data_dir), ("--restore", self.restore_dir),
                           ("--checkpoint-root", self.checkpoint_root)):  # fmt: skip
            try:
                (path or "").encode("utf-8")
            except UnicodeEncodeError:  # a name of bytes not in the locale's encoding (os.fsdecode's surrogates)
                raise ValueError(f"{flag} {path!r} is no UTF-8 path name: RocksDB takes UTF-8 paths only; give a "
                                 "path of UTF-8 characters") from None  # fmt: skip
        if self.checkpoint_root and _within(self.checkpoint_root, self.data_dir):
            raise ValueError(f"--checkpoint-root {self.checkpoint_root} lies inside --data-dir {self.data_dir}: a "
                             "checkpoint there would be written into the shard's own files; give a directory "
                             "outside it (a checkpoint's files are hard links on the same file system)")  # fmt: skip
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(f"--metrics-port {self.metrics_port} is --port too: give the metrics their own port")


def _within(path: str, directory: str) -> bool:
    """path is directory or lies inside it (symbolic links resolved)."""
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory


_SECTIONS = {
    "initializer": InitializerConfig,
    "optimizer": OptimizerConfig,
    "admission": AdmissionConfig,
    "eviction": EvictionConfig,
}


_SCALARS = ("dim", "weight_bound", "l2", "values_at_rest")  # TableConfig's settings that are plain values
_SETTINGS = (*_SCALARS, *_SECTIONS)  # every key of a table's section, as messages list them
_EXAMPLES = {  # of each section, for messages
    "initializer": 'initializer = { name = "uniform", scale = 0.01 }',
    "optimizer": 'optimizer = { name = "adagrad", learning_rate = 0.05 }',
    "admission": "admission = { min_count = 2 }",
    "eviction": "eviction = { ttl_steps = 1000 }",
}


def _check_toml_type(what: str, value: object, hint: object) -> None:
    """InvalidArgumentError naming `what` unless value (parsed TOML) has the type of a config field's hint: a
    number for float (an integer too), an integer for int, a string for str, a table of numbers for dict[str,
    float]; `X | None` is X (TOML has no null)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(k for k in typing.get_args(hint) if k is not type(None))
    kind = typing.get_origin(hint) or hint
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    fits = {float: number, int: number and isinstance(value, int), str: isinstance(value, str)}.get(kind)
    if kind is dict and isinstance(value, dict):
        for k, v in value.items():
            _check_toml_type(f"{what}.{k}", v, float)
        return
    if not fits:
        expected = {float: "a number", int: "an integer", str: "a string", dict: "a table of numbers"}.get(kind, kind)
        raise InvalidArgumentError(f"{what} must be {expected}, got {value!r}")


def table_configs_from_toml(text: str, source: str = "table config") -> dict[str, dict]:
    """Parses a TOML file of tables, one section each, into {name: fields for TableConfig}:

        [fm]
        dim = 9                      # optional where the model decides it
        weight_bound = 10.0
        l2 = 0.0                     # > 0: lazy L2 (ps.rows.update); not with ftrl, which has its own
        values_at_rest = "float32"   # or "float16": embeddings in RocksDB at half the bytes (TableConfig)
        initializer = { name = "uniform", scale = 0.01, seed = 0 }
        optimizer = { name = "ftrl", learning_rate = 0.05, params = { l1 = 1.0, l2 = 0.1 } }
        admission = { min_count = 2 }
        eviction = { ttl_steps = 1000, score_threshold = 0.5, decay = 0.98 }

    InvalidArgumentError names the table and key that is wrong."""
    import tomllib

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidArgumentError(f"{source}: not valid TOML: {e}") from None
    return table_configs_from_dict(doc, source)


def table_configs_from_dict(doc: dict, source: str) -> dict[str, dict]:
    """{name: fields for TableConfig} of parsed TOML tables, one per table name (the form of
    table_configs_from_toml's file; a feature schema's [tables.<name>] sections parse the same way).
    InvalidArgumentError names `source`, the table and the key that is wrong; a values_at_rest other than
    VALUES_AT_REST's is wrong, "" included (which a TableSpec, unlike a file, may carry: TableConfig.values_at_rest).
    """
    out = {}
    for name, spec in doc.items():
        if not isinstance(spec, dict):
            raise InvalidArgumentError(f"{source}: [{name}] must be a table of settings, got {spec!r}")
        fields: dict = {"name": name}
        for key, value in spec.items():
            if key in _SECTIONS:
                cls = _SECTIONS[key]
                hints = typing.get_type_hints(cls)  # its fields' types, by name
                known = set(hints)
                if not isinstance(value, dict):
                    raise InvalidArgumentError(
                        f"{source}: [{name}] {key} must be an inline table of its settings ({_EXAMPLES[key]}), got "
                        f"{value!r}"
                    )
                unknown = sorted(set(value) - known)
                if unknown:
                    raise InvalidArgumentError(
                        f"{source}: [{name}.{key}] has unknown keys {unknown}; known: {sorted(known)}"
                    )
                if key == "optimizer" and "name" not in value:  # its defaults (learning rate, params) are per name
                    raise InvalidArgumentError(
                        f"{source}: [{name}.optimizer] needs a name, one of {sorted(OPTIMIZER_PARAMS)}"
                    )
                for field_name, field_value in value.items():
                    _check_toml_type(f"{source}: [{name}] {key}.{field_name}", field_value, hints[field_name])
                fields[key] = cls(**value)
            elif key in _SCALARS:
                _check_toml_type(f"{source}: [{name}] {key}", value, typing.get_type_hints(TableConfig)[key])
                if key == "values_at_rest" and value not in VALUES_AT_REST:  # "" too: unspecified is the wire's only
                    raise InvalidArgumentError(f"{source}: [{name}] values_at_rest {echo(value)} is unknown; expected "
                                               f"one of {VALUES_AT_REST} (without the key: {FULL_AT_REST!r})")  # fmt: skip
                fields[key] = value
            else:
                if isinstance(value, dict) and value and set(value) <= set(_SETTINGS):  # a table's settings in it
                    nested = f" (a table's settings are a section of their own: [{key}], not [{name}.{key}])"
                else:
                    close = difflib.get_close_matches(key, _SETTINGS, n=1)
                    nested = f" (did you mean {close[0]!r}?)" if close else ""
                raise InvalidArgumentError(
                    f"{source}: [{name}] has unknown key {key!r}; known: {', '.join(_SETTINGS)}{nested}"
                )
        out[name] = fields
    return out

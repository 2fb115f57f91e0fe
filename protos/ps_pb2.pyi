from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OptimizerSpec(_message.Message):
    __slots__ = ("name", "learning_rate", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    learning_rate: float
    params: _containers.ScalarMap[str, float]
    def __init__(self, name: _Optional[str] = ..., learning_rate: _Optional[float] = ..., params: _Optional[_Mapping[str, float]] = ...) -> None: ...

class InitializerSpec(_message.Message):
    __slots__ = ("name", "scale", "seed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    name: str
    scale: float
    seed: int
    def __init__(self, name: _Optional[str] = ..., scale: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class AdmissionSpec(_message.Message):
    __slots__ = ("min_count", "probability")
    MIN_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    min_count: int
    probability: float
    def __init__(self, min_count: _Optional[int] = ..., probability: _Optional[float] = ...) -> None: ...

class EvictionSpec(_message.Message):
    __slots__ = ("ttl_steps", "score_threshold", "decay", "nonclk_coeff", "click_coeff")
    TTL_STEPS_FIELD_NUMBER: _ClassVar[int]
    SCORE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    DECAY_FIELD_NUMBER: _ClassVar[int]
    NONCLK_COEFF_FIELD_NUMBER: _ClassVar[int]
    CLICK_COEFF_FIELD_NUMBER: _ClassVar[int]
    ttl_steps: int
    score_threshold: float
    decay: float
    nonclk_coeff: float
    click_coeff: float
    def __init__(self, ttl_steps: _Optional[int] = ..., score_threshold: _Optional[float] = ..., decay: _Optional[float] = ..., nonclk_coeff: _Optional[float] = ..., click_coeff: _Optional[float] = ...) -> None: ...

class TableSpec(_message.Message):
    __slots__ = ("name", "dim", "initializer", "optimizer", "weight_bound", "admission", "eviction", "l2", "features", "values_at_rest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    INITIALIZER_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BOUND_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    EVICTION_FIELD_NUMBER: _ClassVar[int]
    L2_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    VALUES_AT_REST_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    initializer: InitializerSpec
    optimizer: OptimizerSpec
    weight_bound: float
    admission: AdmissionSpec
    eviction: EvictionSpec
    l2: float
    features: str
    values_at_rest: str
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., initializer: _Optional[_Union[InitializerSpec, _Mapping]] = ..., optimizer: _Optional[_Union[OptimizerSpec, _Mapping]] = ..., weight_bound: _Optional[float] = ..., admission: _Optional[_Union[AdmissionSpec, _Mapping]] = ..., eviction: _Optional[_Union[EvictionSpec, _Mapping]] = ..., l2: _Optional[float] = ..., features: _Optional[str] = ..., values_at_rest: _Optional[str] = ...) -> None: ...

class CreateTableRequest(_message.Message):
    __slots__ = ("spec", "replace_untrained", "check_only", "stamp", "state_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REPLACE_UNTRAINED_FIELD_NUMBER: _ClassVar[int]
    CHECK_ONLY_FIELD_NUMBER: _ClassVar[int]
    STAMP_FIELD_NUMBER: _ClassVar[int]
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    spec: TableSpec
    replace_untrained: bool
    check_only: bool
    stamp: WorkerStamp
    state_id: int
    def __init__(self, spec: _Optional[_Union[TableSpec, _Mapping]] = ..., replace_untrained: _Optional[bool] = ..., check_only: _Optional[bool] = ..., stamp: _Optional[_Union[WorkerStamp, _Mapping]] = ..., state_id: _Optional[int] = ...) -> None: ...

class DescribeTableRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("spec", "num_rows", "row_floats")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    ROW_FLOATS_FIELD_NUMBER: _ClassVar[int]
    spec: TableSpec
    num_rows: int
    row_floats: int
    def __init__(self, spec: _Optional[_Union[TableSpec, _Mapping]] = ..., num_rows: _Optional[int] = ..., row_floats: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("table", "ids")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: bytes
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[bytes] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("rows", "dim")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    rows: bytes
    dim: int
    def __init__(self, rows: _Optional[bytes] = ..., dim: _Optional[int] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("table", "ids", "grads", "dim", "shows", "clicks", "return_rows", "add_delta")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    SHOWS_FIELD_NUMBER: _ClassVar[int]
    CLICKS_FIELD_NUMBER: _ClassVar[int]
    RETURN_ROWS_FIELD_NUMBER: _ClassVar[int]
    ADD_DELTA_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: bytes
    grads: bytes
    dim: int
    shows: bytes
    clicks: bytes
    return_rows: bool
    add_delta: bool
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[bytes] = ..., grads: _Optional[bytes] = ..., dim: _Optional[int] = ..., shows: _Optional[bytes] = ..., clicks: _Optional[bytes] = ..., return_rows: _Optional[bool] = ..., add_delta: _Optional[bool] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("num_applied",)
    NUM_APPLIED_FIELD_NUMBER: _ClassVar[int]
    num_applied: int
    def __init__(self, num_applied: _Optional[int] = ...) -> None: ...

class WorkerStamp(_message.Message):
    __slots__ = ("job", "worker", "num_workers", "step", "staleness", "sync", "barrier_timeout_s", "done", "acked", "setup", "stopped", "unclocked", "token", "apart", "stopped_by", "job_name")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    BARRIER_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    SETUP_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    UNCLOCKED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    APART_FIELD_NUMBER: _ClassVar[int]
    STOPPED_BY_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    job: int
    worker: int
    num_workers: int
    step: int
    staleness: int
    sync: bool
    barrier_timeout_s: float
    done: bool
    acked: int
    setup: str
    stopped: str
    unclocked: bool
    token: int
    apart: bool
    stopped_by: str
    job_name: str
    def __init__(self, job: _Optional[int] = ..., worker: _Optional[int] = ..., num_workers: _Optional[int] = ..., step: _Optional[int] = ..., staleness: _Optional[int] = ..., sync: _Optional[bool] = ..., barrier_timeout_s: _Optional[float] = ..., done: _Optional[bool] = ..., acked: _Optional[int] = ..., setup: _Optional[str] = ..., stopped: _Optional[str] = ..., unclocked: _Optional[bool] = ..., token: _Optional[int] = ..., apart: _Optional[bool] = ..., stopped_by: _Optional[str] = ..., job_name: _Optional[str] = ...) -> None: ...

class PullBatchRequest(_message.Message):
    __slots__ = ("pulls", "stamp", "state_id")
    PULLS_FIELD_NUMBER: _ClassVar[int]
    STAMP_FIELD_NUMBER: _ClassVar[int]
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    pulls: _containers.RepeatedCompositeFieldContainer[PullRequest]
    stamp: WorkerStamp
    state_id: int
    def __init__(self, pulls: _Optional[_Iterable[_Union[PullRequest, _Mapping]]] = ..., stamp: _Optional[_Union[WorkerStamp, _Mapping]] = ..., state_id: _Optional[int] = ...) -> None: ...

class PullBatchResponse(_message.Message):
    __slots__ = ("replies", "min_clock")
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    MIN_CLOCK_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[PullResponse]
    min_clock: int
    def __init__(self, replies: _Optional[_Iterable[_Union[PullResponse, _Mapping]]] = ..., min_clock: _Optional[int] = ...) -> None: ...

class PushBatchRequest(_message.Message):
    __slots__ = ("pushes", "advance_clock", "client_id", "seq", "stamp", "shared", "state_id")
    PUSHES_FIELD_NUMBER: _ClassVar[int]
    ADVANCE_CLOCK_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STAMP_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    pushes: _containers.RepeatedCompositeFieldContainer[PushRequest]
    advance_clock: int
    client_id: int
    seq: int
    stamp: WorkerStamp
    shared: bool
    state_id: int
    def __init__(self, pushes: _Optional[_Iterable[_Union[PushRequest, _Mapping]]] = ..., advance_clock: _Optional[int] = ..., client_id: _Optional[int] = ..., seq: _Optional[int] = ..., stamp: _Optional[_Union[WorkerStamp, _Mapping]] = ..., shared: _Optional[bool] = ..., state_id: _Optional[int] = ...) -> None: ...

class PushBatchResponse(_message.Message):
    __slots__ = ("num_applied", "step", "rows", "min_clock")
    NUM_APPLIED_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    MIN_CLOCK_FIELD_NUMBER: _ClassVar[int]
    num_applied: int
    step: int
    rows: _containers.RepeatedCompositeFieldContainer[PullResponse]
    min_clock: int
    def __init__(self, num_applied: _Optional[int] = ..., step: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[PullResponse, _Mapping]]] = ..., min_clock: _Optional[int] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("phase", "dir", "hold_timeout_s", "token", "state_id")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    DIR_FIELD_NUMBER: _ClassVar[int]
    HOLD_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    phase: str
    dir: str
    hold_timeout_s: float
    token: str
    state_id: int
    def __init__(self, phase: _Optional[str] = ..., dir: _Optional[str] = ..., hold_timeout_s: _Optional[float] = ..., token: _Optional[str] = ..., state_id: _Optional[int] = ...) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("clock", "shard_json", "token")
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    SHARD_JSON_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    clock: int
    shard_json: str
    token: str
    def __init__(self, clock: _Optional[int] = ..., shard_json: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TableStats(_message.Message):
    __slots__ = ("name", "dim", "num_rows", "pulls", "pushes", "ids_pulled", "ids_pushed", "rows_in_ram", "rows_on_disk", "dirty_rows", "evictions", "ram_bytes", "cache_misses", "pending_ids", "disk_bytes", "admitted", "dropped", "trained")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    PULLS_FIELD_NUMBER: _ClassVar[int]
    PUSHES_FIELD_NUMBER: _ClassVar[int]
    IDS_PULLED_FIELD_NUMBER: _ClassVar[int]
    IDS_PUSHED_FIELD_NUMBER: _ClassVar[int]
    ROWS_IN_RAM_FIELD_NUMBER: _ClassVar[int]
    ROWS_ON_DISK_FIELD_NUMBER: _ClassVar[int]
    DIRTY_ROWS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    RAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    PENDING_IDS_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    num_rows: int
    pulls: int
    pushes: int
    ids_pulled: int
    ids_pushed: int
    rows_in_ram: int
    rows_on_disk: int
    dirty_rows: int
    evictions: int
    ram_bytes: int
    cache_misses: int
    pending_ids: int
    disk_bytes: int
    admitted: int
    dropped: int
    trained: bool
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., num_rows: _Optional[int] = ..., pulls: _Optional[int] = ..., pushes: _Optional[int] = ..., ids_pulled: _Optional[int] = ..., ids_pushed: _Optional[int] = ..., rows_in_ram: _Optional[int] = ..., rows_on_disk: _Optional[int] = ..., dirty_rows: _Optional[int] = ..., evictions: _Optional[int] = ..., ram_bytes: _Optional[int] = ..., cache_misses: _Optional[int] = ..., pending_ids: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., admitted: _Optional[int] = ..., dropped: _Optional[int] = ..., trained: _Optional[bool] = ...) -> None: ...

class AdvanceClockRequest(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    def __init__(self, steps: _Optional[int] = ...) -> None: ...

class ClockResponse(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class ShrinkRequest(_message.Message):
    __slots__ = ("table", "state_id")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    table: str
    state_id: int
    def __init__(self, table: _Optional[str] = ..., state_id: _Optional[int] = ...) -> None: ...

class ShrinkResponse(_message.Message):
    __slots__ = ("dropped", "num_rows", "pending_ids", "tables_without_rule", "lists_tables_without_rule")
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    PENDING_IDS_FIELD_NUMBER: _ClassVar[int]
    TABLES_WITHOUT_RULE_FIELD_NUMBER: _ClassVar[int]
    LISTS_TABLES_WITHOUT_RULE_FIELD_NUMBER: _ClassVar[int]
    dropped: int
    num_rows: int
    pending_ids: int
    tables_without_rule: _containers.RepeatedScalarFieldContainer[str]
    lists_tables_without_rule: bool
    def __init__(self, dropped: _Optional[int] = ..., num_rows: _Optional[int] = ..., pending_ids: _Optional[int] = ..., tables_without_rule: _Optional[_Iterable[str]] = ..., lists_tables_without_rule: _Optional[bool] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("shard_id", "num_shards", "num_slots", "tables", "data_dir", "uptime_s", "ram_budget_bytes", "ram_used_bytes", "journal_bytes", "clock", "job", "num_workers", "min_clock", "max_gap", "memory_budget_bytes", "block_cache_budget_bytes", "block_cache_used_bytes", "memtable_bytes", "table_reader_bytes", "write_behind_bytes", "journal_map_bytes", "cluster", "data_dir_bytes", "disk_free_bytes", "disk_total_bytes", "request_room_bytes", "flushing", "request_room_waits", "restored_from", "restored_sha256", "request_room_used_bytes", "state_id", "flush_failures", "sync_steps_bytes", "sync_steps_held_bytes", "reply_room_bytes", "reply_room_used_bytes", "reply_room_waiting", "reply_room_waits", "reply_room_expired", "job_unclocked", "job_name")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    RAM_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MIN_CLOCK_FIELD_NUMBER: _ClassVar[int]
    MAX_GAP_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_CACHE_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_CACHE_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMTABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TABLE_READER_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITE_BEHIND_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_MAP_BYTES_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ROOM_BYTES_FIELD_NUMBER: _ClassVar[int]
    FLUSHING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ROOM_WAITS_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_FIELD_NUMBER: _ClassVar[int]
    RESTORED_SHA256_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ROOM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FAILURES_FIELD_NUMBER: _ClassVar[int]
    SYNC_STEPS_BYTES_FIELD_NUMBER: _ClassVar[int]
    SYNC_STEPS_HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLY_ROOM_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLY_ROOM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLY_ROOM_WAITING_FIELD_NUMBER: _ClassVar[int]
    REPLY_ROOM_WAITS_FIELD_NUMBER: _ClassVar[int]
    REPLY_ROOM_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    JOB_UNCLOCKED_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    shard_id: int
    num_shards: int
    num_slots: int
    tables: _containers.RepeatedCompositeFieldContainer[TableStats]
    data_dir: str
    uptime_s: float
    ram_budget_bytes: int
    ram_used_bytes: int
    journal_bytes: int
    clock: int
    job: int
    num_workers: int
    min_clock: int
    max_gap: int
    memory_budget_bytes: int
    block_cache_budget_bytes: int
    block_cache_used_bytes: int
    memtable_bytes: int
    table_reader_bytes: int
    write_behind_bytes: int
    journal_map_bytes: int
    cluster: str
    data_dir_bytes: int
    disk_free_bytes: int
    disk_total_bytes: int
    request_room_bytes: int
    flushing: int
    request_room_waits: int
    restored_from: str
    restored_sha256: str
    request_room_used_bytes: int
    state_id: int
    flush_failures: int
    sync_steps_bytes: int
    sync_steps_held_bytes: int
    reply_room_bytes: int
    reply_room_used_bytes: int
    reply_room_waiting: int
    reply_room_waits: int
    reply_room_expired: int
    job_unclocked: bool
    job_name: str
    def __init__(self, shard_id: _Optional[int] = ..., num_shards: _Optional[int] = ..., num_slots: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[TableStats, _Mapping]]] = ..., data_dir: _Optional[str] = ..., uptime_s: _Optional[float] = ..., ram_budget_bytes: _Optional[int] = ..., ram_used_bytes: _Optional[int] = ..., journal_bytes: _Optional[int] = ..., clock: _Optional[int] = ..., job: _Optional[int] = ..., num_workers: _Optional[int] = ..., min_clock: _Optional[int] = ..., max_gap: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., block_cache_budget_bytes: _Optional[int] = ..., block_cache_used_bytes: _Optional[int] = ..., memtable_bytes: _Optional[int] = ..., table_reader_bytes: _Optional[int] = ..., write_behind_bytes: _Optional[int] = ..., journal_map_bytes: _Optional[int] = ..., cluster: _Optional[str] = ..., data_dir_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., disk_total_bytes: _Optional[int] = ..., request_room_bytes: _Optional[int] = ..., flushing: _Optional[int] = ..., request_room_waits: _Optional[int] = ..., restored_from: _Optional[str] = ..., restored_sha256: _Optional[str] = ..., request_room_used_bytes: _Optional[int] = ..., state_id: _Optional[int] = ..., flush_failures: _Optional[int] = ..., sync_steps_bytes: _Optional[int] = ..., sync_steps_held_bytes: _Optional[int] = ..., reply_room_bytes: _Optional[int] = ..., reply_room_used_bytes: _Optional[int] = ..., reply_room_waiting: _Optional[int] = ..., reply_room_waits: _Optional[int] = ..., reply_room_expired: _Optional[int] = ..., job_unclocked: _Optional[bool] = ..., job_name: _Optional[str] = ...) -> None: ...

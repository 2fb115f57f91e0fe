"""The keys and values of a store's "meta" column family: their grammar (below; META_GRAMMAR holds a reader
per key or key prefix), and meta_value, which reads a stored value by it, raising damage where it does not read.

Keys are bytes; a name is UTF-8 (a key of a table whose name is not is damaged), "decimal" an ASCII decimal
integer < 2^64. In parentheses, what writes each value: a method of ps.storage.store.Store for the keys of a table
("table/", "tid/", "count/"), of ps.storage.shardmeta.ShardMeta for the others, unless another module is named.
    column family "meta", key -> value:
        "shard"                  -> JSON {"shard_id": i, "num_shards": n, "num_slots": s}   (check_identity, synced,
                                    at the first start; shard.json beside RocksDB holds a copy)
        "cluster"                -> the --cluster name   (record_cluster, synced, the first time the dir runs with a
                                    nonempty one; absent: the dir takes any name)
        "table/" name            -> JSON TableConfig.to_dict()                               (create_table: both
        "tid/" name              -> decimal < 2^32: the table's number, its rows' key prefix  in one batch)
        "count/" name            -> JSON {"admitted": ids stored with a trained row, "pending": ids stored not
                                    admitted yet, "trained": whether any write stored a row or pending id of
                                    the table (kept once a Shrink drops them all, and by import_slots; absent:
                                    as admitted + pending > 0)}   (in the batch of every write of the table's rows;
                                    absent: none written yet. One of a name no table has is stray: read as no
                                    rows, and deleted by the create_table of that name)
        "clock"                  -> decimal <= MAX_CLOCK: the shard's clock (steps)
        "advanced/" client:u64be -> decimal [" " decimal]: the client_seq of that client's newest request whose
                                    clock advance is applied, then the digest of that request's content
                                    (ps.engine.pushpath; absent in a note of the versions before the digest, and
                                    0, for a request of none: unknown)   (set_clock: with the clock it set, in one
                                    batch; deleted once the client's "applied/" entry is dropped: forget_advanced)
        "flushed_seq"            -> decimal: journal records <= this are all in RocksDB
        "lsn_high"               -> decimal: the largest lsn of a row written so far   (lsn_high_raised, in the
                                    batch of the write of rows that raised it; read by written_seq): every journal
                                    record <= it was written, so replay requires the records after flushed_seq up
                                    to it, and appends go on past it (ps.storage.journal)
        "applied/" client:u64be  -> client_seq:u64le parts:u32le used_s:u64le digest:u64le   (28 bytes,
                                    APPLIED_VALUE): that client's entry of the journal's `applied` table
                                    (ps.storage.applied) as of flushed_seq: its newest request, how many of its
                                    pushes are applied, when the entry last changed (whole seconds since the
                                    epoch, rounded up) and the digest of that request's content (0: unknown). A
                                    value of the versions before the digest is 20 bytes, without it
                                    (OLDER_APPLIED_VALUE): read as digest 0, unknown
                                    (set_flushed_seq: the entries changed since the last flush written, those
                                    dropped deleted, with flushed_seq in one batch)
        "applied"                -> JSON {client (decimal, as a string): [client_seq, parts]}: the whole table as
                                    one value, as versions before "applied/" wrote it; read by applied(), deleted by
                                    the first set_flushed_seq given changes, which writes its entries as "applied/"
        "restore_pending"        -> the absolute path of the checkpoint a restore copies from; there only from the
                                    restore's first write to its end (set_restore_pending, ps.engine.restore)
        "restored"               -> JSON {"checkpoint": its absolute path, "sha256": its manifest's}: the restore
                                    the dir began from   (set_restored, with the end of the restore)
        "state_id"               -> decimal: a random id of the model state the dir holds, in [1, 2^63)   (state_id,
                                    synced: drawn at the first start, and again with each restore's "restored")
        "job_done"               -> JSON {"job": job id, "num_workers": n, "done": [worker, ...]}: the workers of
                                    the job the shard follows that said they are done (set_job_done, synced, as
                                    each says so: ps.engine.followedjob reads it when it follows the job after a
                                    restart, and logs one that does not read and reads it as none: it only spares
                                    waits)
    The key prefixes are TABLE_CONFIG_PREFIX, TABLE_ID_PREFIX, COUNT_PREFIX, ADVANCED_PREFIX and APPLIED_PREFIX. A
    client's key (CLIENT_PREFIXES) is its prefix and 8 bytes (client_key, client_of): one of another length is
    damaged (meta_value).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from typing import Any

from ps.config import MAX_CLOCK, TableConfig
from ps.errors import StorageError, echo
from ps.storage.options import iter_prefixed
from ps.storage.rocks import ColumnFamily
from ps.storage.sidefiles import IDENTITY_FIELDS, counts_object

META_CF = "meta"
TABLE_CONFIG_PREFIX = b"table/"
TABLE_ID_PREFIX = b"tid/"
COUNT_PREFIX = b"count/"
ADVANCED_PREFIX = b"advanced/"
APPLIED_PREFIX = b"applied/"
APPLIED_VALUE = struct.Struct("<QIQQ")  # an "applied/" key's value: client_seq, parts, used_s, digest
OLDER_APPLIED_VALUE = struct.Struct("<QIQ")  # the same without the digest, as the versions before it wrote it
LEGACY_APPLIED = b"applied"  # the whole `applied` table as one JSON value: what versions before APPLIED_PREFIX wrote
NAMED_PREFIXES = (TABLE_CONFIG_PREFIX, TABLE_ID_PREFIX, COUNT_PREFIX)  # the prefixes a table's name follows
CLIENT_PREFIXES = (ADVANCED_PREFIX, APPLIED_PREFIX)  # the prefixes a client id follows, a u64 big-endian
CLIENT_ID_BYTES = 8
TABLE_NUMBER_BITS = 32  # a table number is below 2^32: its rows' keys hold it in a u32 (ps.storage.rowformat.KEY_DTYPE)
MAX_TABLE_NUMBER = (1 << TABLE_NUMBER_BITS) - 1
STATE_ID_BITS = 63  # a model state's id is in [1, 2^STATE_ID_BITS): one past it is no shard's


def _decimal(raw: bytes, bits: int | None = 64) -> int:
    """A decimal value of the grammar: ASCII digits only, of a `bits`-bit unsigned integer (None: of any size)."""
    if not raw.isdigit():
        raise ValueError("not a decimal integer")
    value = int(raw)
    if bits is not None and value >> bits:
        raise ValueError(f"not below 2^{bits}")
    return value


def _clock(raw: bytes) -> int:
    """The "clock" value: a decimal of at most MAX_CLOCK, which a shard never passes (an advance that would is
    refused)."""
    clock = _decimal(raw, None)
    if clock > MAX_CLOCK:
        raise ValueError(f"{clock:,} is past the largest clock a shard takes, {MAX_CLOCK:,} (an out-of-range clock "
                         "advance put it there)")  # fmt: skip
    return clock


def _advanced(raw: bytes) -> tuple[int, int]:
    """An "advanced/" value: (client_seq, digest), the digest 0 where the value has none (the versions before it)."""
    seq, space, digest = raw.partition(b" ")
    return _decimal(seq), _decimal(digest) if space else 0


def _applied_value(raw: bytes) -> tuple[int, int, int, int]:
    """An "applied/" value: (client_seq, parts, used_s, digest), of APPLIED_VALUE or (digest 0: unknown)
    OLDER_APPLIED_VALUE; a value of another length is struct.error (damage)."""
    if len(raw) == OLDER_APPLIED_VALUE.size:
        return (*OLDER_APPLIED_VALUE.unpack(raw), 0)
    return APPLIED_VALUE.unpack(raw)


def _table_number(raw: bytes) -> int:
    """A "tid/" value: a decimal below 2^32 (TABLE_NUMBER_BITS), the table field of its rows' keys."""
    return _decimal(raw, TABLE_NUMBER_BITS)


def _state_id(raw: bytes) -> int:
    """The "state_id" value: a decimal in [1, 2^STATE_ID_BITS). 0 is what a request carries for "no state id seen",
    so a shard holding it (or one past the range, which no shard draws) would take every request's as its own."""
    state_id = _decimal(raw, STATE_ID_BITS)
    if not state_id:
        raise ValueError(f"0 is no model state's id, which is in [1, 2^{STATE_ID_BITS})")
    return state_id


def _parse_counts(raw: bytes) -> dict:
    """A "count/" value: JSON {"admitted": int >= 0, "pending": int >= 0, "trained": bool (optional)}."""
    counts = json.loads(raw)
    if not isinstance(counts, dict) or not all(
        type(counts.get(k)) is int and counts[k] >= 0 for k in ("admitted", "pending")
    ):
        raise ValueError('not {"admitted": n, "pending": n} with counts >= 0')
    return counts


def _parse_config(raw: bytes) -> TableConfig:
    return TableConfig.from_dict(json.loads(raw))


def _json_object(raw: bytes) -> dict:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def shard_record(raw: bytes) -> dict:
    """A "shard" value: JSON {"shard_id": i, "num_shards": n, "num_slots": s}, integers >= 0, as in shard.json."""
    return counts_object(json.loads(raw), IDENTITY_FIELDS)


def _legacy_applied(raw: bytes) -> dict[int, tuple[int, int, None, int]]:
    """The legacy "applied" value: JSON {client (decimal): [client_seq, parts]}, integers >= 0 of the sizes an
    "applied/" entry holds (APPLIED_VALUE: set_flushed_seq writes them as such), as applied() returns it (no time,
    digest 0: unknown)."""
    out = {}
    for client, entry in _json_object(raw).items():
        if not (type(entry) is list and len(entry) == 2 and all(type(n) is int and n >= 0 for n in entry)
                and entry[0] >> 64 == 0 and entry[1] >> 32 == 0):  # fmt: skip
            raise ValueError(f"the entry of client {client!r} is not [client_seq, parts], integers below 2^64 and 2^32")
        out[_decimal(client.encode())] = (entry[0], entry[1], None, 0)
    return out


def _job_done(raw: bytes) -> dict:
    """The "job_done" value: JSON {"job": int, "num_workers": int, "done": [worker, ...]}, each worker an int in
    0..num_workers - 1."""
    record = _json_object(raw)
    job, num_workers, done = record["job"], record["num_workers"], record["done"]
    if type(job) is not int or type(num_workers) is not int or type(done) is not list:
        raise ValueError('not {"job": int, "num_workers": int, "done": [worker, ...]}')
    if not all(type(w) is int and 0 <= w < num_workers for w in done):
        raise ValueError(f"a worker that is not an int in 0..{num_workers - 1}")
    return record


def _restored(raw: bytes) -> dict:
    """A "restored" value: JSON {"checkpoint": path, "sha256": hex}."""
    value = _json_object(raw)
    if not all(isinstance(value.get(k), str) for k in ("checkpoint", "sha256")):
        raise ValueError('not {"checkpoint": path, "sha256": hex}')
    return value


META_GRAMMAR: dict[bytes, Callable[[bytes], Any]] = {  # a meta key, or a key prefix, -> what reads its value
    b"shard": shard_record,
    b"cluster": bytes.decode,
    TABLE_CONFIG_PREFIX: _parse_config,
    TABLE_ID_PREFIX: _table_number,
    COUNT_PREFIX: _parse_counts,
    b"clock": _clock,
    ADVANCED_PREFIX: _advanced,
    b"flushed_seq": _decimal,
    b"lsn_high": _decimal,
    APPLIED_PREFIX: _applied_value,
    LEGACY_APPLIED: _legacy_applied,
    b"restore_pending": bytes.decode,
    b"restored": _restored,
    b"state_id": _state_id,
    b"job_done": _job_done,
}


def grammar_key(key: bytes) -> bytes:
    """key's entry in META_GRAMMAR: its prefix up to its first "/" (every prefix ends there), or key itself."""
    head, slash, _ = key.partition(b"/")
    return head + slash


def damaged_name(key: bytes) -> bool:
    """Whether key is a table's (NAMED_PREFIXES) whose name is not UTF-8: damage, which meta_value refuses."""
    prefix = grammar_key(key)
    if prefix not in NAMED_PREFIXES:
        return False
    try:
        key[len(prefix) :].decode()
    except UnicodeDecodeError:
        return True
    return False


def key_name(key: bytes) -> str:
    """The table name a key of NAMED_PREFIXES holds after its prefix. Bytes that are not UTF-8 (damage: meta_value
    refuses the key) are kept as lone surrogates ("surrogateescape"): a name no table has, so that the damaged key
    fails no other table."""
    return key.partition(b"/")[2].decode("utf-8", "surrogateescape")


def client_key(prefix: bytes, client: int) -> bytes:
    """The key of client `client` (a u64) under prefix, one of CLIENT_PREFIXES: the prefix, then the id big-endian."""
    return prefix + client.to_bytes(CLIENT_ID_BYTES, "big")


def client_of(key: bytes, prefix: bytes) -> int:
    """The client id a key of prefix (one of CLIENT_PREFIXES) holds after it: client_key's inverse (damaged_client
    says whether its id is CLIENT_ID_BYTES long)."""
    return int.from_bytes(key[len(prefix) :], "big")


def damaged_client(key: bytes) -> int | None:
    """The length of the client id of a client's key (CLIENT_PREFIXES) that is not CLIENT_ID_BYTES long: damage,
    which meta_value refuses (read as a u64, it would name some other client); None for any other key."""
    prefix = grammar_key(key)
    size = len(key) - len(prefix)
    return size if prefix in CLIENT_PREFIXES and size != CLIENT_ID_BYTES else None


def meta_value(key: bytes, raw: bytes, damaged: Callable[[str], StorageError]) -> Any:
    """raw, the stored value of meta key `key`, read as the module's grammar says (META_GRAMMAR); where it does not
    read so (its reader raises ValueError, LookupError, TypeError or struct.error), or where the key's table name is
    not UTF-8, or its client id not CLIENT_ID_BYTES long (damaged_client), damaged(a text naming the key and the
    value) is raised: damage, never a bug's traceback."""
    parse = META_GRAMMAR[grammar_key(key)]
    if damaged_name(key):
        raise damaged(f"meta key {echo(key)} holds {echo(raw)}, but its table name is not UTF-8 (the key is damaged)")
    size = damaged_client(key)
    if size is not None:
        raise damaged(f"meta key {echo(key)} holds {echo(raw)}, but its client id is {size} bytes, not "
                      f"{CLIENT_ID_BYTES} (the key is damaged)")  # fmt: skip
    try:
        return parse(raw)
    except (ValueError, LookupError, TypeError, struct.error) as e:  # LookupError: a key or an index missing
        name = key.decode() if key.isascii() and key.decode().isprintable() else echo(key)
        raise damaged(f"meta key {name} holds {echo(raw)}, which does not read as its value ({type(e).__name__}: "
                      f"{e})") from None  # fmt: skip


def trained(counts: Mapping) -> bool:
    """Whether a table's "count/" value says it was trained: its "trained" flag, else (a value written without it)
    whether it counts any row or pending id."""
    return bool(counts.get("trained") or counts["admitted"] + counts["pending"] > 0)


def missing_number(table: str) -> str:
    """What is damaged where a table's config is stored without its number."""
    return f"table {table!r} has no number (meta key tid/{table})"


def first_unread(unread: dict[str, str], damaged: Callable[[str], StorageError], why: str = "") -> None:
    """Raises damaged(the first of unread's texts + why) where unread (read_table_numbers') holds any."""
    if unread:
        raise damaged(next(iter(unread.values())) + why)


def read_table_numbers(meta: ColumnFamily) -> tuple[dict[str, int], dict[str, str]]:
    """({table name: table number} of each "tid/" value that reads, {table name: what is damaged} of each that does
    not: meta_value's text, naming the key and the value), from the meta column family of a store (or of a
    checkpoint's)."""
    numbers, unread = {}, {}
    for key, raw in iter_prefixed(meta, TABLE_ID_PREFIX):
        name = key_name(key)
        try:
            numbers[name] = meta_value(key, raw, StorageError)
        except StorageError as e:
            unread[name] = str(e)
    return numbers, unread


def table_ids(meta: ColumnFamily, damaged: Callable[[str], StorageError]) -> dict[str, int]:
    """{table name: table number} from the meta column family of a store (or of a checkpoint's); damaged(what) is
    raised for the first number that does not read as one (meta_value)."""
    numbers, unread = read_table_numbers(meta)
    first_unread(unread, damaged)
    return numbers

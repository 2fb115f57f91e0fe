"""Which shard owns an id: a mixing hash to a fixed number of slots, and a slot map from slots to shards.

Contract, shared by client and server (both call `SlotMap.shard_of`):
    slot(id)  = mix64(id) & (NUM_SLOTS - 1)          # NUM_SLOTS is fixed forever: data on disk is keyed by it
    shard(id) = slot_map.owner[slot(id)]             # contiguous slot ranges, one per shard

`id % num_shards` is never used: sequential ids would pile onto one shard, and a change of the shard count
would move almost every id. With slots, a shard's data is a set of whole slot key ranges that can be moved.
"""

from __future__ import annotations

import numpy as np

from ps.hashing import mix64

NUM_SLOTS = 16384  # a power of two; never change it: RocksDB keys start with the slot.

_U64 = np.uint64


def slot_of(ids: np.ndarray) -> np.ndarray:
    """Slot of each id, as uint16 (NUM_SLOTS <= 65536)."""
    return (mix64(ids) & _U64(NUM_SLOTS - 1)).astype(np.uint16)


class SlotMap:
    """Slot -> shard. `owner` is an int32 array of NUM_SLOTS entries; shard i owns the slots where owner == i."""

    def __init__(self, owner: np.ndarray):
        owner = np.asarray(owner, dtype=np.int32)
        if owner.shape != (NUM_SLOTS,):
            raise ValueError(f"slot map has {owner.shape} entries, expected ({NUM_SLOTS},)")
        if owner.min() < 0:
            raise ValueError("slot map has negative shard ids")
        self.owner = owner
        self.num_shards = int(owner.max()) + 1

    @classmethod
    def contiguous(cls, num_shards: int) -> SlotMap:
        """Shard i owns slots [i * NUM_SLOTS // n, (i + 1) * NUM_SLOTS // n)."""
        if not 1 <= num_shards <= NUM_SLOTS:
            raise ValueError(f"num_shards must be in 1..{NUM_SLOTS}, got {num_shards}")
        bounds = np.arange(num_shards + 1, dtype=np.int64) * NUM_SLOTS // num_shards
        return cls(np.repeat(np.arange(num_shards, dtype=np.int32), np.diff(bounds)))

    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        """Owning shard of each id (int32)."""
        return self.owner[slot_of(ids)]

    def slots_of_shard(self, shard_id: int) -> np.ndarray:
        return np.flatnonzero(self.owner == shard_id).astype(np.uint16)

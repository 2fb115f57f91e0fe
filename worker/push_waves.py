"""A push_many's batches in waves: each shard's k-th batch in wave k, stamped and numbered, and a wave's replies.

A shard's batches go in order: wave k+1 is sent once wave k had every reply (worker/client.py push_many sends
them). The clock of a clocked stamp moves with a shard's last batch only; the batches before it carry the stamp
marked apart. A sync batch carries no request number: the shard applies the step's sum under the job's key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from protos import ps_pb2
from ps import codec, wire
from ps.stamp import WorkerStamp
from worker.request_numbers import RequestNumbers, check_applied, check_contributed


def push_waves(groups: list[tuple[int, list]], advance_clock: int, stamp: WorkerStamp | None, client_id: int,
               state_ids: list[int], numbers: RequestNumbers) -> list[list]:  # fmt: skip
    """The PushBatch calls of groups (Router.group's (shard, requests) batches) in waves: wave k holds
    (("PushBatch", shard, request), its requests) of each shard's k-th batch. advance_clock and the stamp go on a
    shard's last batch; its batches before carry the stamp marked apart where clocked (they move no clock). Takes
    a request number per batch from numbers (sync: none), under the caller's hold of numbers.lock."""
    sync = stamp is not None and stamp.sync
    clocked = stamp is not None and not stamp.unclocked
    last = {shard: i for i, (shard, _) in enumerate(groups)}  # the clock moves after a shard's last batch
    proto = None if stamp is None else codec.stamp_to_proto(stamp)
    before = proto  # the stamp of a shard's batches before its last: apart where clocked (they move no clock)
    if clocked and not sync and not stamp.apart and len(last) < len(groups):  # a shard gets two batches
        before = codec.stamp_to_proto(replace(stamp, apart=True))
    waves: list[list] = []  # wave k: the k-th batch of each shard; a shard's batches go in order
    for i, (shard, g) in enumerate(groups):
        request = ps_pb2.PushBatchRequest(
            pushes=[r[1] for r in g], advance_clock=advance_clock if last[shard] == i else 0,
            stamp=proto if last[shard] == i else before,
        )  # fmt: skip
        request.client_id = client_id  # a sync batch's tells two workers of one worker id apart
        request.state_id = state_ids[shard]
        if not sync:  # a sync batch is applied under the job's key, not this client's request numbers
            request.seq = numbers.next(shard)
        k = sum(1 for s, _ in groups[:i] if s == shard)
        waves += [[] for _ in range(k + 1 - len(waves))]
        waves[k].append((("PushBatch", shard, request), g))
    return waves


def check_wave(wave: list, replies: list, retried: set[int], stamp: WorkerStamp | None, client_id: int,
               where: Callable[[int], str], min_clock: int | None) -> int | None:  # fmt: skip
    """Each reply of a wave checked against its request (sync: check_contributed, else check_applied; not where
    its call was sent again: a retry's reply counts only what the lost attempts left); the smallest min_clock of
    min_clock and the replies to stamped requests."""
    sync = stamp is not None and stamp.sync
    for k, (((_, shard, request), _), reply) in enumerate(zip(wave, replies)):
        if k not in retried and sync:  # a retry's reply counts only what the lost attempts left
            check_contributed(where(shard), request, reply, stamp)  # undone
        elif k not in retried:
            check_applied(where(shard), client_id, request, reply)
        if request.HasField("stamp"):
            min_clock = reply.min_clock if min_clock is None else min(min_clock, reply.min_clock)
    return min_clock


def scatter_rows(wave: list, replies: list[Any]) -> None:
    """The rows a wave's replies return written into their items' row arrays (a request's (rows, sel, dim))."""
    for (_, group), batch in zip(wave, replies):
        for (_, _, _, (rows, sel, dim)), reply in zip(group, batch.rows, strict=True):
            rows[sel] = wire.decode_rows(reply.rows, len(sel), dim)

"""Routing: which shard each unique id goes to, in requests and batches of at most max_request_bytes.

An id's shard is its slot's owner (ps.sharding.SlotMap); a call's unique ids are grouped by owner and chunked so
that a request stays under the size limit, and requests are packed into per-shard batches (one PullBatch or
PushBatch each). Pure numpy over positions in the unique ids: no gRPC.
"""

from __future__ import annotations

import numpy as np

from ps.sharding import SlotMap

MAX_ROUTES = 256  # routes kept before the cache is cleared
MAX_ROUTED_IDS = 4096  # the routes of more ids than this are not kept: at most MAX_ROUTES x 4,096 x 16 bytes (16 MiB)


class Router:
    """Routes ids over num_shards shards by slot_map; keeps the routes of the last ids seen (see route)."""

    def __init__(self, slot_map: SlotMap, num_shards: int):
        self.slot_map = slot_map
        self.num_shards = num_shards
        self._routes: dict[tuple[int, int, int], tuple[np.ndarray, list]] = {}

    def route(
        self, uniq: np.ndarray, dim: int, max_request_bytes: int, per_id: int = 8
    ) -> list[tuple[int, np.ndarray]]:
        """(shard, positions in uniq) per request: grouped by owner, chunked to max_request_bytes at 4 * dim + per_id
        bytes an id (per_id: what a request carries per id besides its row: 8, the id, for a pull; for a push, 4
        more for each of its show and click that it sends). The routes of the last ids seen per (count, bytes an
        id, request size limit) are kept, for at most MAX_ROUTED_IDS ids: a dense table pushes the same few ids
        every step, while a sparse table's steps, each of another count, would fill the cache with copies of ids
        never asked for again. Callers only index with the positions, never change them."""
        id_bytes = 4 * dim + per_id
        if len(uniq) > MAX_ROUTED_IDS:
            return list(self._compute_route(uniq, id_bytes, max_request_bytes))
        key = (len(uniq), id_bytes, max_request_bytes)
        known = self._routes.get(key)
        if known is not None and np.array_equal(known[0], uniq):
            return known[1]
        routes = list(self._compute_route(uniq, id_bytes, max_request_bytes))
        if len(self._routes) >= MAX_ROUTES:
            self._routes.clear()
        self._routes[key] = (uniq.copy(), routes)
        return routes

    def _compute_route(self, uniq: np.ndarray, id_bytes: int, max_request_bytes: int):
        owner = self.slot_map.shard_of(uniq)
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(self.num_shards + 1))
        chunk = max(1, max_request_bytes // id_bytes)
        for shard in range(self.num_shards):
            sel = order[bounds[shard] : bounds[shard + 1]]
            for start in range(0, len(sel), chunk):
                yield shard, sel[start : start + chunk]

    def group(
        self, requests: list[tuple], max_request_bytes: int, every_shard: bool = False, whole: bool = False
    ) -> list[tuple[int, list]]:
        """Packs (shard, request, bytes, extra) into (shard, [those tuples]) batches of at most
        max_request_bytes each (a larger request alone), in order; whole: one batch per shard, whatever its size;
        every_shard: an empty batch for each shard that has none."""
        groups, open_group = [], {}
        for r in requests:
            shard, size = r[0], r[2]
            g = open_group.get(shard)
            if g is None or (not whole and g[1] and g[2] + size > max_request_bytes):
                g = open_group[shard] = [shard, [], 0]
                groups.append(g)
            g[1].append(r)
            g[2] += size
        if every_shard:
            groups += [[s, [], 0] for s in range(self.num_shards) if s not in open_group]
        return [(shard, rs) for shard, rs, _ in groups]

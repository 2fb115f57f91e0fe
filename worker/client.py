"""Client: pull and push any batch of ids against a sharded cluster.

Every call: dedup the ids once (`np.unique`), sum the gradients of duplicates, route each unique id to the
shard that owns its slot (ps.sharding), send one request per shard (chunked past `max_request_bytes`) with a
deadline, all in flight at once, and reassemble the answers in the caller's order. A shard that does not answer
within `timeout_s` raises ServerUnavailableError naming it; pulls are retried a bounded number of times, pushes
are not (a repeated push would apply twice).
"""

from __future__ import annotations

import time

import grpc
import numba
import numpy as np

from protos import ps_pb2, ps_pb2_grpc
from ps import wire
from ps.config import TableConfig
from ps.errors import STATUS_TO_ERROR, PsError, ServerUnavailableError
from ps.sharding import SlotMap

MAX_MESSAGE_BYTES = 512 * 1024 * 1024


@numba.njit(nogil=True, cache=True)
def segment_sum(inverse, grads, out):
    """out[inverse[i], :] += grads[i, :]."""
    dim = grads.shape[1]
    for i in range(inverse.shape[0]):
        u = inverse[i]
        for j in range(dim):
            out[u, j] += grads[i, j]


def sum_duplicates(ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique sorted ids, their summed grads)."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    out = np.zeros((len(uniq), grads.shape[1]), dtype=np.float32)
    segment_sum(inverse.ravel().astype(np.int64), np.ascontiguousarray(grads, dtype=np.float32), out)
    return uniq, out


class Client:
    def __init__(
        self,
        servers: list[str],
        timeout_s: float = 60.0,
        pull_retries: int = 2,
        max_request_bytes: int = 64 * 1024 * 1024,
    ):
        if not servers:
            raise ValueError("Client needs at least one server address")
        self.servers = list(servers)
        self.timeout_s = timeout_s
        self.pull_retries = pull_retries
        self.max_request_bytes = max_request_bytes
        self.slot_map = SlotMap.contiguous(len(servers))
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ]
        self._channels = [grpc.insecure_channel(a, options=options) for a in self.servers]
        self._stubs = [ps_pb2_grpc.ParameterServerStub(c) for c in self._channels]
        self._dims: dict[str, int] = {}

    # ---- cluster --------------------------------------------------------------------------------------
    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Waits for every shard to answer, and checks that shard i says it is shard i of len(servers)."""
        deadline = time.monotonic() + timeout_s
        for i, channel in enumerate(self._channels):
            try:
                grpc.channel_ready_future(channel).result(timeout=max(0.1, deadline - time.monotonic()))
            except grpc.FutureTimeoutError:
                raise ServerUnavailableError(
                    f"shard {i} at {self.servers[i]} did not accept a connection within {timeout_s:.0f} s"
                ) from None
        for i, stats in enumerate(self.stats()):
            if (stats.shard_id, stats.num_shards) != (i, len(self.servers)):
                raise PsError(
                    f"server {self.servers[i]} is shard {stats.shard_id} of {stats.num_shards}, but it is at "
                    f"position {i} of {len(self.servers)} in the server list; list the servers in shard order"
                )

    def stats(self) -> list[ps_pb2.StatsResponse]:
        return self._call_all("Stats", [ps_pb2.StatsRequest()] * len(self._stubs))

    def create_table(self, cfg: TableConfig) -> None:
        """Creates the table on every shard (idempotent for the same spec)."""
        cfg.validate()
        spec = wire.table_config_to_proto(cfg)
        self._call_all("CreateTable", [ps_pb2.CreateTableRequest(spec=spec)] * len(self._stubs))
        self._dims[cfg.name] = cfg.dim

    def describe_table(self, name: str) -> list[ps_pb2.TableInfo]:
        infos = self._call_all("DescribeTable", [ps_pb2.DescribeTableRequest(table=name)] * len(self._stubs))
        self._dims[name] = infos[0].spec.dim
        return infos

    def dim(self, table: str) -> int:
        if table not in self._dims:
            self.describe_table(table)
        return self._dims[table]

    # ---- data -----------------------------------------------------------------------------------------
    def pull(self, table: str, ids: np.ndarray) -> np.ndarray:
        """(len(ids), dim) float32 rows of ids (any shape, flattened; duplicates allowed), in order."""
        return self.pull_many([(table, ids)])[0]

    def pull_many(self, items: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        """pull() of several (table, ids) at once: one PullBatch per shard (more past max_request_bytes), all in
        flight together, one wait."""
        plans, requests = [], []
        for table, ids in items:
            ids = np.ascontiguousarray(ids, dtype=np.uint64).ravel()
            dim = self.dim(table)
            uniq, inverse = np.unique(ids, return_inverse=True)
            rows = np.empty((len(uniq), dim), dtype=np.float32)
            for shard, sel in self._route(uniq, dim):
                request = ps_pb2.PullRequest(table=table, ids=wire.encode_ids(uniq[sel]))
                requests.append((shard, request, len(sel) * (4 * dim + 8), (rows, sel, dim)))
            plans.append((rows, inverse))
        groups = self._group(requests)
        calls = [("PullBatch", shard, ps_pb2.PullBatchRequest(pulls=[r[1] for r in g])) for shard, g in groups]
        for attempt in range(self.pull_retries + 1):
            try:
                replies = self._call_mixed(calls)
                break
            except ServerUnavailableError:
                if attempt == self.pull_retries:
                    raise
                time.sleep(0.2 * 2**attempt)
        for (_, group), batch in zip(groups, replies):
            for (_, _, _, (rows, sel, dim)), reply in zip(group, batch.replies, strict=True):
                rows[sel] = wire.decode_rows(reply.rows, len(sel), dim)
        return [rows[inverse.ravel()] for rows, inverse in plans]

    def push(self, table: str, ids: np.ndarray, grads: np.ndarray, clicks: np.ndarray | None = None) -> None:
        """Sums the grads of duplicate ids, then applies them on the owning shards. grads: (len(ids), dim).
        Each occurrence of an id is one show; clicks (len(ids),), e.g. the label of each occurrence's example,
        are summed per id the same way (None: no clicks)."""
        self.push_many([(table, ids, grads, clicks)])

    def push_many(self, items: list[tuple], advance_clock: int = 0, return_rows: bool = False) -> list | None:
        """push() of several (table, ids, grads, clicks) at once and (if advance_clock > 0) the clock advance of
        every shard after them: one PushBatch per shard (more past max_request_bytes), all in flight together.
        A shard applies its batch only if every push in it is valid.

        An item may carry a fifth entry, shows (len(ids),): then its ids must be unique (a shard rejects
        duplicates) and grads, clicks and shows are sent per id as given, for a caller that summed them already.
        return_rows: returns, per item, the rows of its ids (in its order) right after the push, as a pull()
        then would: a training step's push and pull in one round trip."""
        requests, plans = [], []
        for table, ids, grads, clicks, *shows in items:
            ids = np.ascontiguousarray(ids, dtype=np.uint64).ravel()
            dim = self.dim(table)
            grads = np.asarray(grads, dtype=np.float32).reshape(len(ids), dim)
            counts = np.ones((len(ids), 2), dtype=np.float32)  # show, click per occurrence
            counts[:, 1] = 0.0 if clicks is None else np.asarray(clicks, dtype=np.float32).ravel()
            if shows and shows[0] is not None:
                counts[:, 0] = np.asarray(shows[0], dtype=np.float32).ravel()
                uniq, summed, order = ids, np.concatenate([grads, counts], axis=1), None
            else:
                uniq, summed = sum_duplicates(ids, np.concatenate([grads, counts], axis=1))
                order = np.searchsorted(uniq, ids)  # uniq is sorted: where each given id's row lands
            rows = np.empty((len(uniq), dim), dtype=np.float32) if return_rows else None
            for shard, sel in self._route(uniq, dim):
                request = ps_pb2.PushRequest(
                    table=table,
                    ids=wire.encode_ids(uniq[sel]),
                    grads=wire.encode_rows(summed[sel, :dim]),
                    dim=dim,
                    shows=wire.encode_rows(summed[sel, dim]),
                    clicks=wire.encode_rows(summed[sel, dim + 1]),
                    return_rows=return_rows,
                )
                requests.append((shard, request, len(sel) * (4 * dim + 16), (rows, sel, dim)))
            plans.append((rows, order))
        groups = self._group(requests, every_shard=advance_clock > 0)
        last = {shard: i for i, (shard, _) in enumerate(groups)}  # the clock moves after a shard's last batch
        calls = [
            ("PushBatch", shard, ps_pb2.PushBatchRequest(
                pushes=[r[1] for r in g], advance_clock=advance_clock if last[shard] == i else 0))
            for i, (shard, g) in enumerate(groups)
        ]  # fmt: skip
        replies = self._call_mixed(calls)
        if not return_rows:
            return None
        for (_, group), batch in zip(groups, replies):
            for (_, _, _, (rows, sel, dim)), reply in zip(group, batch.rows, strict=True):
                rows[sel] = wire.decode_rows(reply.rows, len(sel), dim)
        return [rows if order is None else rows[order] for rows, order in plans]

    def advance_clock(self, steps: int = 1) -> int:
        """Advances every shard's clock; returns the new step (of shard 0)."""
        replies = self._call_all("AdvanceClock", [ps_pb2.AdvanceClockRequest(steps=steps)] * len(self._stubs))
        return int(replies[0].step)

    def shrink(self, table: str = "") -> list[ps_pb2.ShrinkResponse]:
        """Runs the eviction rules of one table (or all) on every shard."""
        return self._call_all("Shrink", [ps_pb2.ShrinkRequest(table=table)] * len(self._stubs))

    # ---- plumbing -------------------------------------------------------------------------------------
    def _route(self, uniq: np.ndarray, dim: int):
        """(shard, positions in uniq) per request: grouped by owner, chunked to max_request_bytes."""
        owner = self.slot_map.shard_of(uniq)
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(len(self._stubs) + 1))
        chunk = max(1, self.max_request_bytes // (4 * dim + 8))
        for shard in range(len(self._stubs)):
            sel = order[bounds[shard] : bounds[shard + 1]]
            for start in range(0, len(sel), chunk):
                yield shard, sel[start : start + chunk]

    def _group(self, requests: list[tuple], every_shard: bool = False) -> list[tuple[int, list]]:
        """Packs (shard, request, bytes, extra) into (shard, [those tuples]) batches of at most
        max_request_bytes each (a larger request alone), in order; every_shard: an empty batch for each shard
        that has none."""
        groups, open_group = [], {}
        for r in requests:
            shard, size = r[0], r[2]
            g = open_group.get(shard)
            if g is None or (g[1] and g[2] + size > self.max_request_bytes):
                g = open_group[shard] = [shard, [], 0]
                groups.append(g)
            g[1].append(r)
            g[2] += size
        if every_shard:
            groups += [[s, [], 0] for s in range(len(self._stubs)) if s not in open_group]
        return [(shard, rs) for shard, rs, _ in groups]

    def _call_all(self, method: str, requests: list) -> list:
        return self._call_many(method, list(range(len(self._stubs))), requests)

    def _call_many(self, method: str, shards: list[int], requests: list) -> list:
        """Sends all requests at once (one per entry of shards), waits for all, raises the first error."""
        return self._call_mixed([(method, s, r) for s, r in zip(shards, requests)])

    def _call_mixed(self, calls: list[tuple[str, int, object]]) -> list:
        """Sends every (method, shard, request) at once, waits for all; returns the replies in order or raises
        the first error."""
        futures = [getattr(self._stubs[s], m).future(r, timeout=self.timeout_s) for m, s, r in calls]
        replies, error = [], None
        for (method, shard, _), future in zip(calls, futures):
            try:
                replies.append(future.result())
            except grpc.RpcError as e:
                error = error or self._error(method, shard, e)
        if error is not None:
            raise error
        return replies

    def _error(self, method: str, shard: int, e: grpc.RpcError) -> PsError:
        code, where = e.code(), f"shard {shard} at {self.servers[shard]}"
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return ServerUnavailableError(
                f"{where} did not answer {method} within {self.timeout_s:.0f} s ({code.name}: {e.details()})"
            )
        cls = STATUS_TO_ERROR.get(code.name, PsError)
        return cls(f"{where}: {method} failed with {code.name}: {e.details()}")

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

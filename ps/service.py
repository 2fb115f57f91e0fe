"""The gRPC servicer: decodes and validates requests, calls the Shard, maps every exception to a status.

No client ever sees UNKNOWN: ps.errors exceptions map to their status; anything else is INTERNAL, logged.
"""

from __future__ import annotations

import functools
import logging

import grpc

from protos import ps_pb2, ps_pb2_grpc
from ps import wire
from ps.errors import PsError
from ps.shard import Shard

log = logging.getLogger("ps.service")


def _rpc(method):
    """Runs a servicer method; turns exceptions into a status code and message (one place for all RPCs)."""

    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except PsError as e:
            log.info("%s rejected: %s", method.__name__, e)
            context.abort(grpc.StatusCode[e.status], str(e))
        except Exception as e:  # a bug or an I/O failure: say so, never hang or return UNKNOWN
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__} failed on the server: {type(e).__name__}: {e}")

    return wrapper


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    def __init__(self, shard: Shard):
        self.shard = shard

    def _info(self, table) -> ps_pb2.TableInfo:
        return ps_pb2.TableInfo(
            spec=wire.table_config_to_proto(table.cfg), num_rows=table.num_rows, row_floats=table.width
        )

    @_rpc
    def CreateTable(self, request, context):
        return self._info(self.shard.create_table(wire.table_config_from_proto(request.spec)))

    @_rpc
    def DescribeTable(self, request, context):
        return self._info(self.shard.table(request.table))

    @_rpc
    def Pull(self, request, context):
        ids = wire.decode_ids(request.ids)
        rows = self.shard.pull(request.table, ids)
        return ps_pb2.PullResponse(rows=wire.encode_rows(rows), dim=rows.shape[1])

    @_rpc
    def Push(self, request, context):
        table = self.shard.table(request.table)
        if request.dim != table.dim:
            raise wire.InvalidArgumentError(
                f"push says dim {request.dim}, but table {request.table!r} has dim {table.dim}"
            )
        ids = wire.decode_ids(request.ids)
        grads = wire.decode_rows(request.grads, len(ids), table.dim, field="grads")
        shows = wire.decode_rows(request.shows, len(ids), 1, "shows")[:, 0] if request.shows else None
        clicks = wire.decode_rows(request.clicks, len(ids), 1, "clicks")[:, 0] if request.clicks else None
        self.shard.push(request.table, ids, grads, shows, clicks)
        return ps_pb2.PushResponse(num_applied=len(ids))

    @_rpc
    def AdvanceClock(self, request, context):
        return ps_pb2.ClockResponse(step=self.shard.advance_clock(request.steps))

    @_rpc
    def Shrink(self, request, context):
        return ps_pb2.ShrinkResponse(**self.shard.shrink(request.table))

    @_rpc
    def Stats(self, request, context):
        s = self.shard.stats()
        tables = [ps_pb2.TableStats(**t) for t in s.pop("tables")]
        return ps_pb2.StatsResponse(tables=tables, **s)

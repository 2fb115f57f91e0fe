"""A failed gRPC call as a client sees it, for tests that hand the client's retry and error paths a failure
without a server: its status code, its details and the trailing metadata given."""

from __future__ import annotations

import grpc


class RefusedCall(grpc.RpcError):
    """A call that failed with code and details, the server's trailing metadata trailers ((key, value) pairs)."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple = ()):
        super().__init__()
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailers

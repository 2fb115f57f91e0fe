"""TLS, mutual TLS and a shared token for every gRPC call, on the server and in the client.

- TLS: the server presents --tls-cert / --tls-key (PEM); clients verify it against --tls-ca.
- Mutual TLS: a server given --tls-ca as well requires every client to present a certificate signed by it
  (clients pass --tls-cert / --tls-key).
- Token: a server given --auth-token-file answers UNAUTHENTICATED to any call whose metadata does not carry
  `authorization: Bearer <token>`. The one exception is the standard health service (grpc.health.v1.Health),
  so that orchestrators' probes need no secret; it says only whether the shard is serving.
- Read-only token: a server given --read-token-file as well admits callers of that second token to the calls that
  change nothing (READ_ONLY_METHODS, a PullBatch without a training job's stamp) and answers PERMISSION_DENIED to
  their other calls, before reading them (a stamped PullBatch once read): a token for serving (predictions,
  evaluations) and monitoring that cannot train, create, drop or checkpoint, nor start or hold up a job.
Certificates must name the address clients dial (a subjectAltName such as IP:127.0.0.1 or DNS:ps-0).
The metrics port follows the same settings (ps/metrics.py). docs/security.md: who may reach which port, and what
an admitted caller can do; deploy/gen-secrets.sh makes a token, a CA and certificates. The files of the
secrets are read and checked by ps/secretfiles.py; what a client that cannot connect is told comes from
ps/tlsprobe.py.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
from google.protobuf.message import Message

from protos import ps_pb2
from ps.secretfiles import check_tls_files, check_token, read_file, refuse_empty
from ps.tlsprobe import uses_tls

HEALTH_PREFIX = "/grpc.health.v1.Health/"
SERVICE_PREFIX = "/sparseps.ParameterServer/"
READ_ONLY_METHODS = ("DescribeTable", "Pull", "PullBatch", "Stats")  # the calls that change nothing on a shard
# ... unstamped: a stamped PullBatch is a training job's (ps.engine.jobs), and its stamp may start a job
# (ps.engine.followedjob)
STAMPED_METHODS = ("PullBatch",)
METHODS = frozenset(ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].methods_by_name)


def server_credentials(cert: str, key: str, ca: str | None = None) -> tuple[grpc.ServerCredentials, list[str]]:
    """TLS with the server's certificate; with ca, clients must present a certificate that ca signed. With them, the
    warnings of check_tls_files (certificates not yet valid), for the server to log as it serves."""
    warnings = check_tls_files(cert, key, ca)
    pair = [(read_file(key, "TLS key"), read_file(cert, "TLS certificate"))]
    if ca is None:
        return grpc.ssl_server_credentials(pair), warnings
    roots = read_file(ca, "TLS CA")
    return grpc.ssl_server_credentials(pair, root_certificates=roots, require_client_auth=True), warnings


def channel_credentials(ca: str | None, cert: str | None = None,
                        key: str | None = None) -> tuple[grpc.ChannelCredentials, list[str]]:  # fmt: skip
    """Verify servers against ca (None: the system's roots); present cert/key to servers that require one. With them,
    the warnings of check_tls_files (the client's certificate or CA not yet valid), for the client to log once."""
    if (cert is None) != (key is None):
        raise ValueError("give both --tls-cert and --tls-key, or neither")
    warnings = check_tls_files(cert, key, ca, client=True)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read_file(ca, "TLS CA") if ca else None,
        private_key=read_file(key, "TLS key") if key else None,
        certificate_chain=read_file(cert, "TLS certificate") if cert else None,
    )
    return credentials, warnings


class TokenCheck(grpc.ServerInterceptor):
    """Rejects, with UNAUTHENTICATED, every call but health checks that lacks `authorization: Bearer <token>` (or
    `Bearer <read_token>`); a call of read_token's to a method outside READ_ONLY_METHODS gets PERMISSION_DENIED.
    Neither refusal reads the request: a refused caller's bytes are neither taken in nor parsed (a stamped
    PullBatch's, PERMISSION_DENIED too, is read), and both are answered as the call arrives, holding no thread and
    no call slot (answered_on_arrival): callers without the token cannot crowd out those with it. refused(method, code),
    if given, is told of each refusal: the ParameterServer method's name, or "other" for a path that names none (the
    caller chose it: counted under its own name, a caller without the token could add labels to a metric without bound),
    and the status's name."""

    def __init__(self, token: str, read_token: str | None = None,
                 refused: Callable[[str, str], None] | None = None):  # fmt: skip
        self._expected = f"Bearer {check_token(token)}".encode()
        self._read_only = f"Bearer {check_token(read_token)}".encode() if read_token else None
        if self._read_only is not None and hmac.compare_digest(self._expected, self._read_only):
            raise ValueError("the read-only token (--read-token-file) is the auth token (--auth-token-file): its "
                             "callers would be admitted to every call; give it a token of its own")  # fmt: skip

        def deny(requests, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token (authorization: Bearer ...)")

        self._deny = grpc.stream_unary_rpc_method_handler(answered_on_arrival(deny))
        self._refused = refused or (lambda method, code: None)

    def intercept_service(
        self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if method.startswith(HEALTH_PREFIX):
            return continuation(handler_call_details)
        name = method.removeprefix(SERVICE_PREFIX)
        label = name if method.startswith(SERVICE_PREFIX) and name in METHODS else "other"
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                if hmac.compare_digest(given, self._expected):
                    return continuation(handler_call_details)
                if self._read_only is not None and hmac.compare_digest(given, self._read_only):
                    if label not in READ_ONLY_METHODS:
                        self._refused(label, "PERMISSION_DENIED")
                        return _read_only_refusal(name)
                    handler = continuation(handler_call_details)
                    if name not in STAMPED_METHODS:
                        return handler
                    return _unstamped_only(name, handler, lambda: self._refused(label, "PERMISSION_DENIED"))
        self._refused(label, "UNAUTHENTICATED")
        return self._deny


def _unstamped_only(method: str, handler: grpc.RpcMethodHandler | None,
                    refused: Callable[[], None]) -> grpc.RpcMethodHandler | None:  # fmt: skip
    """handler, refusing (PERMISSION_DENIED, refused() told) a request that carries a worker stamp: a training
    job's."""
    if handler is None or handler.unary_unary is None:
        return handler
    serve = handler.unary_unary
    text = (f"a {method} with a worker stamp (a training job's step) is refused to the read-only token "
            "(--read-token-file): a stamp takes part in a job; it needs the auth token (--auth-token-file); nothing "
            "was changed")  # fmt: skip

    def unstamped(request, context):
        stamped = request.HasField("stamp") if isinstance(request, Message) else getattr(request, "stamp", None)
        if stamped:
            refused()
            context.abort(grpc.StatusCode.PERMISSION_DENIED, text)
        return serve(request, context)

    return grpc.unary_unary_rpc_method_handler(unstamped, request_deserializer=handler.request_deserializer,
                                               response_serializer=handler.response_serializer)  # fmt: skip


def _read_only_refusal(method: str) -> grpc.RpcMethodHandler:
    """The handler that refuses a read-only token's call to method (not one of READ_ONLY_METHODS)."""
    text = (
        f"{method} is refused to the read-only token (--read-token-file), which may call "
        f"{', '.join(READ_ONLY_METHODS)} only; it needs the auth token (--auth-token-file); nothing was changed"
    )

    def refuse(requests, context):
        context.abort(grpc.StatusCode.PERMISSION_DENIED, text)

    return grpc.stream_unary_rpc_method_handler(answered_on_arrival(refuse))


class _OnArrival(ThreadPoolExecutor):
    """An executor that runs what it is given at once, on the thread that submits it, and returns its future
    done."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)  # starts no thread: submit never reaches the pool's own

    def submit(self, fn: Callable, /, *args: object, **kwargs: object) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # the future carries it, as a pool's would
            future.set_exception(e)
        return future


_ON_ARRIVAL = _OnArrival()


def answered_on_arrival(refuse: Callable) -> Callable:
    """refuse (a stream-unary behavior that reads no request and only aborts), run by gRPC on its thread that
    takes calls in, as the call arrives, through gRPC's per-behavior executor (`experimental_thread_pool`):
    the refusal takes no thread of the server's pool and holds no call slot (maximum_concurrent_rpcs counts a
    call from its submission to the pool until its handler returns), so a flood of refused calls cannot keep
    admitted ones out. Correctness needs nothing of it: a gRPC without that hook runs refuse in the pool, as
    any call."""
    refuse.experimental_thread_pool = _ON_ARRIVAL  # type: ignore[attr-defined]
    return refuse


class TokenHeader(grpc.UnaryUnaryClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call of a channel."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {check_token(token)}")

    def intercept_unary_unary(
        self, continuation: Callable, client_call_details: grpc.ClientCallDetails, request: object
    ) -> object:
        metadata = list(client_call_details.metadata or []) + [self._header]
        details = client_call_details._replace(metadata=metadata) if hasattr(client_call_details, "_replace") else None
        if details is None:
            details = _CallDetails(client_call_details, metadata)
        return continuation(details, request)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, base, metadata):
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def client_channels(addresses: list[str], options: list, tls_ca: str | None = None, tls_cert: str | None = None,
                    tls_key: str | None = None, token: str | None = None) -> tuple[list[grpc.Channel], list[str]]:  # fmt: skip
    """A channel to each server of addresses, in order: plain, TLS (tls_ca or a client certificate given) or mutual
    TLS, and with the token header on every call if token is given; with the warnings of channel_credentials, which
    reads the TLS files once for all the channels, for the caller to log (once, not once a channel). ValueError for an
    empty path: taken as none, it would make the channels plain without a word."""
    refuse_empty(("--tls-ca", tls_ca), ("--tls-cert", tls_cert), ("--tls-key", tls_key))
    credentials, warnings = channel_credentials(tls_ca, tls_cert, tls_key) if uses_tls(tls_ca, tls_cert, tls_key) else (
        None, [])  # fmt: skip
    channels = []
    for address in addresses:
        if credentials is not None:
            channel = grpc.secure_channel(address, credentials, options=options)
        else:
            channel = grpc.insecure_channel(address, options=options)
        channels.append(grpc.intercept_channel(channel, TokenHeader(token)) if token else channel)
    return channels, warnings

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
an admitted caller can do; deploy/gen-secrets.sh makes a token, a CA and certificates.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import hmac
import os
import re
import socket
import ssl
import stat
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
from google.protobuf.message import Message

from protos import ps_pb2

HEALTH_PREFIX = "/grpc.health.v1.Health/"
SERVICE_PREFIX = "/sparseps.ParameterServer/"
READ_ONLY_METHODS = ("DescribeTable", "Pull", "PullBatch", "Stats")  # the calls that change nothing on a shard
# ... unstamped: a stamped PullBatch is a training job's (ps.engine.jobs), and its stamp may start a job (ps.engine.followedjob)
STAMPED_METHODS = ("PullBatch",)
METHODS = frozenset(ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].methods_by_name)


def read_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"cannot read {what} {path}: {e.strerror}") from None
    if not data.strip():
        raise ValueError(f"{what} {path} is empty")
    return data


def readable_by_all(path: str) -> str | None:
    """What a secret's file (a token, a private key) says when any user of the machine may read it: a warning
    naming the file and its mode, or None (not readable by others, or no such file)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if not mode & stat.S_IROTH:
        return None
    return (f"{path} is readable by every user of this machine (mode {stat.S_IMODE(mode):04o}): anyone logged in can "
            f"read the secret it holds; chmod o-r it (deploy/gen-secrets.sh writes its secrets 0600)")  # fmt: skip


TOKEN_FILE = "auth token file (--auth-token-file)"
READ_TOKEN_FILE = "read-only token file (--read-token-file)"
_CONTROL_NAMES = {0x00: "a NUL byte", 0x09: "a tab", 0x0B: "a vertical tab", 0x0C: "a form feed", 0x1B: "an escape",
                  0x7F: "a DEL"}  # fmt: skip


def token_problem(token: bytes, offset: int = 0, of: str = "the token") -> str | None:
    """What makes token unfit to send (None if nothing does): it must be one line of printable ASCII, 0x20-0x7E,
    as gRPC metadata values and HTTP headers are, and not empty. Says where the first bad byte is (byte offset + N
    of `of`, counting from 1) and what kind it is, never the token itself."""
    if not token:
        return "it is empty"
    for i, byte in enumerate(token):
        if 0x20 <= byte <= 0x7E:
            continue
        where = f"byte {offset + i + 1} of {of}"
        if byte in (0x0A, 0x0D):
            return f"it holds more than one line (a line break at {where})"
        if byte >= 0x80:
            return (f"{where} is not ASCII (a letter such as é, a typographic quote, a byte-order mark, or a binary "
                    "file?)")  # fmt: skip
        return f"{where} is a control character ({_CONTROL_NAMES.get(byte, f'0x{byte:02x}')})"
    return None


def read_token(path: str, what: str = TOKEN_FILE) -> str:
    """The token in a file, surrounding whitespace (a trailing newline) ignored. ValueError naming the flag (what)
    and the file, and what is wrong but never the token, for a file that cannot be read, is empty, or holds
    anything but one line of printable ASCII (gRPC would refuse every call that carried it: "Invalid metadata")."""
    data = read_file(path, what)
    token = data.strip()  # bytes.strip: ASCII whitespace only
    problem = token_problem(token, offset=len(data) - len(data.lstrip()), of="the file")
    if problem:
        raise ValueError(f"{what} {path} does not hold a usable token: {problem}; the token must be one line "
                         "of printable ASCII (0x20-0x7E)")  # fmt: skip
    return token.decode("ascii")


def check_token(token: str) -> str:
    """token, if it can be sent as `authorization: Bearer <token>`; else ValueError saying why (not showing it)."""
    problem = token_problem(token.encode("utf-8", "surrogateescape"))
    if problem:
        raise ValueError(f"the auth token is unusable: {problem}; it must be one line of printable ASCII "
                         "(0x20-0x7E)")  # fmt: skip
    return token


def check_tls_files(cert: str | None, key: str | None, ca: str | None = None) -> None:
    """ValueError naming the file that is wrong, and why, unless cert holds PEM certificates, the first of them
    not expired, key the unencrypted PEM private key of that one, and ca PEM certificates, not all expired (each
    where given). gRPC itself reports a bad pair only when it binds a port ("Failed to bind") or as a connection
    that never comes up, and an expired certificate as a handshake the other side fails."""
    for path, what in ((cert, "TLS certificate (--tls-cert)"), (ca, "TLS CA (--tls-ca)")):
        if path:
            pem = read_file(path, what)
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
            except ssl.SSLError as e:
                raise ValueError(f"{what} {path} holds no PEM certificate (expected '-----BEGIN CERTIFICATE-----' "
                                 f"blocks; {e.reason or e})") from None  # fmt: skip
            ends = [not_after(block) for block in PEM_CERTIFICATE.findall(pem)]
            ends = ends[:1] if path == cert else ends  # a certificate's own, not its chain's; a CA: any may do
            now = time.time()
            if ends and all(end is not None and end < now for end in ends):
                when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(max(ends)))
                raise ValueError(f"{what} {path} expired on {when} (this machine's clock says "
                                 f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(now))}): the other side of "
                                 "every connection refuses it; make new certificates (deploy/gen-secrets.sh)")  # fmt: skip
    if not (cert and key):
        return
    read_file(key, "TLS key (--tls-key)")

    def encrypted() -> bytes:
        raise ValueError(f"TLS key (--tls-key) {key} is encrypted; gRPC needs an unencrypted PEM private key")

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=encrypted)
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise ValueError(f"TLS key (--tls-key) {key} is not the private key of TLS certificate (--tls-cert) "
                             f"{cert}: their public keys differ") from None  # fmt: skip
        raise ValueError(f"TLS key (--tls-key) {key} holds no PEM private key (expected a '-----BEGIN ... PRIVATE "
                         "KEY-----' block)") from None  # fmt: skip


PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)


def not_after(pem_body: bytes) -> float | None:
    """The end of a certificate's validity (Unix time), from the base64 body of its PEM block: the DER of
    Certificate { tbsCertificate { [0] version (optional), serial, signature, issuer, validity { notBefore,
    notAfter } ... } ... } (RFC 5280); None where it does not parse so (ssl, which loaded it, is the judge)."""
    try:
        (_, certificate), *_ = _der_elements(base64.b64decode(pem_body))
        (_, tbs), *_ = _der_elements(certificate)
        fields = [(tag, value) for tag, value in _der_elements(tbs) if tag != 0xA0]  # the version, if any
        (_, validity) = fields[3]
        tag, end = _der_elements(validity)[1]
        text = end.decode("ascii")
        if tag == 0x17:  # UTCTime YYMMDDHHMMSSZ: years 50-99 are 19xx (RFC 5280 4.1.2.5.1)
            text = ("19" if int(text[:2]) >= 50 else "20") + text
        return calendar.timegm(time.strptime(text, "%Y%m%d%H%M%SZ"))
    except (ValueError, IndexError, binascii.Error):
        return None


def _der_elements(data: bytes) -> list[tuple[int, bytes]]:
    """(tag, contents) of each DER element in data, in order."""
    out, at = [], 0
    while at < len(data):
        tag, size = data[at], data[at + 1]
        at += 2
        if size & 0x80:  # the long form: the next size & 0x7F bytes hold the length
            count = size & 0x7F
            size, at = int.from_bytes(data[at : at + count], "big"), at + count
        if at + size > len(data):
            raise ValueError("a DER element longer than what holds it")
        out.append((tag, data[at : at + size]))
        at += size
    return out


def server_credentials(cert: str, key: str, ca: str | None = None) -> grpc.ServerCredentials:
    """TLS with the server's certificate; with ca, clients must present a certificate that ca signed."""
    check_tls_files(cert, key, ca)
    pair = [(read_file(key, "TLS key"), read_file(cert, "TLS certificate"))]
    if ca is None:
        return grpc.ssl_server_credentials(pair)
    return grpc.ssl_server_credentials(pair, root_certificates=read_file(ca, "TLS CA"), require_client_auth=True)


def channel_credentials(ca: str | None, cert: str | None = None, key: str | None = None) -> grpc.ChannelCredentials:
    """Verify servers against ca (None: the system's roots); present cert/key to servers that require one."""
    if (cert is None) != (key is None):
        raise ValueError("give both --tls-cert and --tls-key, or neither")
    check_tls_files(cert, key, ca)
    return grpc.ssl_channel_credentials(
        root_certificates=read_file(ca, "TLS CA") if ca else None,
        private_key=read_file(key, "TLS key") if key else None,
        certificate_chain=read_file(cert, "TLS certificate") if cert else None,
    )


class TokenCheck(grpc.ServerInterceptor):
    """Rejects, with UNAUTHENTICATED, every call but health checks that lacks `authorization: Bearer <token>` (or
    `Bearer <read_token>`); a call of read_token's to a method outside READ_ONLY_METHODS gets PERMISSION_DENIED.
    Neither refusal reads the request: a refused caller's bytes are neither taken in nor parsed (a stamped
    PullBatch's, PERMISSION_DENIED too, is read), and both are answered as the call arrives, holding no thread and
    no call slot (answered_on_arrival): callers without the token cannot crowd out those with it. refused(method, code), if given, is told of each refusal: the
    ParameterServer method's name, or "other" for a path that names none (the caller chose it: counted under its
    own name, a caller without the token could add labels to a metric without bound), and the status's name."""

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


def client_channel(address: str, options: list, tls_ca: str | None = None, tls_cert: str | None = None,
                   tls_key: str | None = None, token: str | None = None) -> grpc.Channel:  # fmt: skip
    """A channel to one server: plain, TLS (tls_ca or a client certificate given) or mutual TLS, and with the
    token header on every call if token is given."""
    if tls_ca or tls_cert or tls_key:
        channel = grpc.secure_channel(address, channel_credentials(tls_ca, tls_cert, tls_key), options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(channel, TokenHeader(token)) if token else channel


# ---- what a client that cannot connect tells its user ---------------------------------------------------------
GRPC_DNS = "dns:///"  # gRPC's own name for a host:port resolved by DNS, which a channel takes as it is


def host_and_port(address: str) -> tuple[str, str]:
    """(host, port) of host:port or dns:///host:port, the host without IPv6 brackets; no check."""
    host, _, port = address.removeprefix(GRPC_DNS).rpartition(":")
    return host.strip("[]"), port


def speaks_tls(address: str, timeout_s: float = 1.0) -> str | None:
    """What listens at host:port, as a TLS handshake that verifies nothing and presents no certificate finds it
    within timeout_s: "tls" (a TLS server that took the connection), "mutual" (a TLS server that closed it after
    the handshake: it wants a client certificate), "plain" (it answered, not in TLS), None (no connection, no
    answer, or not host:port)."""
    deadline = time.monotonic() + timeout_s
    host, port = host_and_port(address)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        raw = socket.create_connection((host, int(port)), timeout=timeout_s)
    except (OSError, ValueError):
        return None
    with raw:
        try:
            raw.settimeout(max(deadline - time.monotonic(), 0.01))
            tls = context.wrap_socket(raw)
        except TimeoutError:
            return None
        except ssl.SSLError as e:  # an alert is the other side speaking TLS; any other failure: it does not
            return "tls" if "ALERT" in str(e.reason or "") else "plain"
        except OSError:  # reset or closed at our hello
            return "plain"
        with tls:  # gRPC sends its HTTP/2 settings at once to a client it took; one wanting a certificate closes
            try:
                tls.settimeout(max(deadline - time.monotonic(), 0.01))
                return "tls" if tls.recv(1) else "mutual"
            except TimeoutError:
                return "tls"
            except OSError:  # an alert (certificate required) or a reset
                return "mutual"


def verified_handshake(address: str, ca: str | None, cert: str | None, key: str | None,
                       server_name: str | None = None, timeout_s: float = 1.0) -> str | None:  # fmt: skip
    """What a TLS handshake with the client's own settings finds at host:port within timeout_s, as gRPC's would:
    "untrusted: WHY" (the shard's certificate does not verify against ca, the system's roots without one, or does
    not name server_name, else the address's host: WHY is the verifier's reason), "refused" (the shard closed the
    connection after the handshake, or alerted during it, with cert presented: it does not accept that
    certificate), "ok", or None (no connection, no answer, or files ssl cannot load)."""
    deadline = time.monotonic() + timeout_s
    host, port = host_and_port(address)
    try:
        context = ssl.create_default_context(cafile=ca)
        if cert and key:
            context.load_cert_chain(cert, key, password=lambda: b"")  # an encrypted key is refused, not prompted for
        context.set_alpn_protocols(["h2"])
        raw = socket.create_connection((host, int(port)), timeout=timeout_s)
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return None
    with raw:
        try:
            raw.settimeout(max(deadline - time.monotonic(), 0.01))
            tls = context.wrap_socket(raw, server_hostname=server_name or host)
        except ssl.SSLCertVerificationError as e:
            return f"untrusted: {e.verify_message}"
        except TimeoutError:
            return None
        except ssl.SSLError as e:
            return "refused" if cert and "ALERT" in str(e.reason or "") else None
        except OSError:
            return "refused" if cert else None
        with tls:  # gRPC sends its HTTP/2 settings at once to a client it took (speaks_tls)
            try:
                tls.settimeout(max(deadline - time.monotonic(), 0.01))
                return "ok" if tls.recv(1) else "refused"
            except TimeoutError:
                return "ok"
            except OSError:  # an alert (a certificate it does not accept) or a reset
                return "refused"


def tls_hint(address: str, ca: str | None = None, cert: str | None = None, key: str | None = None,
             server_name: str | None = None, timeout_s: float = 1.0) -> str:  # fmt: skip
    """ "; ..." saying which TLS flag a probe of address that failed with UNAVAILABLE, made with the client's TLS
    files (ca, cert, key: TLS is on with any of them; server_name: the name its certificate must give, by default
    the address's host), lacks (or has too many), or which of its files the shard's TLS does not take (a CA that
    did not sign the shard's certificate, a client certificate the shard's CA did not sign), as speaks_tls and
    verified_handshake find the shard; "" where its TLS setting is not the cause, or is unknown (nothing listens)."""
    tls, client_cert = bool(ca or cert or key), bool(cert)
    found = speaks_tls(address, timeout_s)
    if found in ("tls", "mutual") and not tls:
        also = (" and --tls-cert/--tls-key (it requires a client certificate: mutual TLS)" if found == "mutual"
                else "")  # fmt: skip
        return (f"; the shard serves TLS: give --tls-ca (the CA that signed its certificate){also}, as its clients "
                "do")  # fmt: skip
    verdict = verified_handshake(address, ca, cert, key, server_name, timeout_s) if found in ("tls", "mutual") else None
    if verdict and verdict.startswith("untrusted: "):
        against = f"--tls-ca {ca}" if ca else "the system's CA certificates (no --tls-ca)"
        return (f"; the shard's TLS certificate does not verify against {against}: {verdict.removeprefix('untrusted: ')}"
                " (give --tls-ca the CA that signed the shard's certificate, and dial a name or address the "
                "certificate names)")  # fmt: skip
    if found == "mutual" and not client_cert:
        return ("; the shard requires a client certificate (mutual TLS): give --tls-cert and --tls-key, a "
                "certificate its CA signed")  # fmt: skip
    if verdict == "refused" and client_cert:
        return (f"; the shard does not accept the client certificate (--tls-cert) {cert}: under mutual TLS it takes "
                "only certificates signed by its own --tls-ca, unexpired")  # fmt: skip
    if found == "plain" and tls:
        return ("; something listens there, but it does not serve TLS: if it is the shard, it runs without TLS "
                "(drop --tls-ca, --tls-cert and --tls-key)")  # fmt: skip
    if found == "plain":
        return ("; something listens there, but it did not answer as a sparseps shard (gRPC): it may be another "
                "service's port (HTTP, a metrics endpoint), or a shard too busy to answer")  # fmt: skip
    return ""

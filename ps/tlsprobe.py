"""What a client that cannot connect tells its user: what listens at an address (TLS, mutual TLS, plain), what a
TLS handshake with the client's own settings finds there, and the hint that follows for the flags to give."""

from __future__ import annotations

import socket
import ssl
import time

from ps.secretfiles import validity
from ps.utctime import utc

GRPC_DNS = "dns:///"  # gRPC's own name for a host:port resolved by DNS, which a channel takes as it is
NOT_YET_VALID = 9  # OpenSSL's X509_V_ERR_CERT_NOT_YET_VALID: a certificate of the chain starts after the clock's now
# The flags Python 3.13's ssl.create_default_context adds and verified_handshake takes off: gRPC's own handshake
# verifies without them, so with them the probe would call a shard's certificate untrusted where gRPC takes it (a CA
# without a keyUsage extension, as `openssl req -x509` makes one: "CA cert does not include key usage extension").
STRICTER_THAN_GRPC = ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN


def host_and_port(address: str) -> tuple[str, str]:
    """(host, port) of host:port or dns:///host:port, the host without IPv6 brackets; no check."""
    host, _, port = address.removeprefix(GRPC_DNS).rpartition(":")
    return host.strip("[]"), port


def speaks_tls(address: str, server_name: str | None = None,
               timeout_s: float = 1.0) -> tuple[str | None, bytes | None]:  # fmt: skip
    """What listens at host:port, as a TLS handshake that verifies nothing and presents no certificate finds it
    within timeout_s, asking for server_name, else the address's host (_handshake): "tls" (a TLS server that took
    the connection), "mutual" (a TLS server that closed it after the handshake: it wants a client certificate),
    "plain" (it answered, not in TLS), None (no connection, no answer, or not host:port); with the certificate the
    server presented (DER), where the handshake completed, else None."""
    try:
        tls = _handshake(address, server_name, timeout_s, _unverified())
    except TimeoutError:
        return None, None
    except ssl.SSLError as e:  # an alert is the other side speaking TLS; any other failure: it does not
        return ("tls" if "ALERT" in str(e.reason or "") else "plain"), None
    except OSError:  # reset or closed at our hello
        return "plain", None
    if tls is None:
        return None, None
    der = tls.getpeercert(binary_form=True)
    return ("tls" if _kept(tls) else "mutual"), der


def _unverified() -> ssl.SSLContext:
    """A client context that verifies nothing and presents no certificate, offering gRPC's ALPN (h2)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context


def _handshake(address: str, server_name: str | None, timeout_s: float,
               context: ssl.SSLContext) -> ssl.SSLSocket | None:  # fmt: skip
    """A connection to host:port wrapped in TLS by context within timeout_s, the rest of which it keeps for its
    reads; its handshake asks for server_name, else the address's host, as gRPC's does (SNI: an ingress that routes
    by it may send a handshake without it elsewhere, or close it); an IP address as host asks for no name. None
    where no connection is made (not host:port, refused, unreachable, timed out); the handshake's failures are
    raised (ssl.SSLError, TimeoutError, OSError), the connection closed."""
    deadline = time.monotonic() + timeout_s
    host, port = host_and_port(address)
    try:
        raw = socket.create_connection((host, int(port)), timeout=timeout_s)
    except (OSError, ValueError):
        return None
    with raw:  # wrap_socket takes the connection over (raw detached) and closes it where the handshake fails
        raw.settimeout(max(deadline - time.monotonic(), 0.01))
        tls = context.wrap_socket(raw, server_hostname=server_name or host)
    tls.settimeout(max(deadline - time.monotonic(), 0.01))
    return tls


def _kept(tls: ssl.SSLSocket) -> bool:
    """Whether the server kept the connection of a completed handshake (tls, closed here): gRPC sends its HTTP/2
    settings at once to a client it took, or stays silent to the deadline; one that does not accept the client (no
    client certificate, or one it does not take) closes it or alerts."""
    with tls:
        try:
            return bool(tls.recv(1))
        except TimeoutError:
            return True
        except OSError:  # an alert (certificate required, or not accepted) or a reset
            return False


def verified_handshake(address: str, ca: str | None, cert: str | None, key: str | None,
                       server_name: str | None = None, timeout_s: float = 1.0) -> str | None:  # fmt: skip
    """What a TLS handshake with the client's own settings finds at host:port within timeout_s, as gRPC's would:
    "early" (a certificate of the shard's chain is not yet valid by this machine's clock), "untrusted: WHY" (the
    shard's certificate does not verify against ca, the system's roots without one, or does
    not name server_name, else the address's host: WHY is the verifier's reason), "refused" (the shard closed the
    connection after the handshake, or alerted during it, with cert presented: it does not accept that
    certificate), "ok", or None (no connection, no answer, or files ssl cannot load). It verifies with OpenSSL's
    own checks, as gRPC's handshake does, not Python 3.13's stricter ones (STRICTER_THAN_GRPC)."""
    try:
        context = ssl.create_default_context(cafile=ca)
        context.verify_flags &= ~STRICTER_THAN_GRPC
        if cert and key:
            context.load_cert_chain(cert, key, password=lambda: b"")  # an encrypted key is refused, not prompted for
        context.set_alpn_protocols(["h2"])
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return None
    try:
        tls = _handshake(address, server_name, timeout_s, context)
    except ssl.SSLCertVerificationError as e:
        return "early" if e.verify_code == NOT_YET_VALID else f"untrusted: {e.verify_message}"
    except TimeoutError:
        return None
    except ssl.SSLError as e:
        return "refused" if cert and "ALERT" in str(e.reason or "") else None
    except OSError:
        return "refused" if cert else None
    if tls is None:
        return None
    return "ok" if _kept(tls) else "refused"


def uses_tls(tls_ca: str | None, tls_cert: str | None, tls_key: str | None) -> bool:
    """Whether a client given these paths speaks TLS to its servers (ps.security.client_channels, tls_hint): a CA
    or a client certificate."""
    return bool(tls_ca or tls_cert or tls_key)


def tls_hint(address: str, ca: str | None = None, cert: str | None = None, key: str | None = None,
             server_name: str | None = None, timeout_s: float = 1.0) -> str:  # fmt: skip
    """ "; ..." saying which TLS flag a probe of address that failed with UNAVAILABLE, made with the client's TLS
    files (ca, cert, key: TLS is on with any of them; server_name: the name its certificate must give, by default
    the address's host), lacks (or has too many), or which of its files the shard's TLS does not take (a CA that
    did not sign the shard's certificate, a client certificate the shard's CA did not sign), as speaks_tls and
    verified_handshake find the shard; "" where its TLS setting is not the cause, or is unknown (nothing listens)."""
    tls, client_cert = uses_tls(ca, cert, key), bool(cert)
    found, served = speaks_tls(address, server_name, timeout_s)
    if found in ("tls", "mutual") and not tls:
        also = (" and --tls-cert/--tls-key (it requires a client certificate: mutual TLS)" if found == "mutual"
                else "")  # fmt: skip
        return (f"; the shard serves TLS: give --tls-ca (the CA that signed its certificate){also}, as its clients "
                "do")  # fmt: skip
    verdict = verified_handshake(address, ca, cert, key, server_name, timeout_s) if found in ("tls", "mutual") else None
    if verdict == "early":
        return not_yet_valid_hint(served, ca)
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


def not_yet_valid_hint(served: bytes | None, ca: str | None) -> str:
    """tls_hint's "; ..." for a shard whose certificate chain, verified against ca, holds a certificate not yet valid
    by this machine's clock: the date from which the shard's own certificate (served: the DER speaks_tls had, asking
    for the same server name) is valid where that is the one, else that a certificate which signs it is; and that
    the clocks of both machines may be the cause."""
    try:
        start = validity(served)[0] if served else None
    except ValueError:  # a certificate that does not parse: its signer's words
        start = None
    now = time.time()
    clocks = (f"(this machine's clock says {utc(now)}): check the clocks of both machines, the shard's and this "
              "one, or wait until then")  # fmt: skip
    if start is not None and start > now:
        return f"; the shard's TLS certificate is not valid until {utc(start)} {clocks}"
    signer = f"the CA of --tls-ca {ca}" if ca else "a CA of the system's"
    return f"; a certificate that signs the shard's ({signer}, or an intermediate) is not yet valid {clocks}"

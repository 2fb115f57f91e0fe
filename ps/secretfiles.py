"""The files of a server's and a client's secrets, read and checked: tokens (one line of printable ASCII) and TLS
certificates and keys (PEM, a matching pair, not expired), each error naming the flag and the file, never the
secret; and the warnings for a secret's file that every user may read and for a certificate not yet valid."""

from __future__ import annotations

import base64
import binascii
import calendar
import errno
import os
import re
import ssl
import stat
import time

from ps.emptyflags import refuse_empty_path
from ps.utctime import utc

MAX_FILE_BYTES = 16 << 20  # a token, key, certificate or CA bundle file: a larger one is none of them
_KINDS = ((stat.S_ISFIFO, "a FIFO or pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))  # fmt: skip


def read_file(path: str, what: str, pipe_ok: bool = False) -> bytes:
    """The bytes of a secret's file (what: its flag's words), a regular file or a symbolic link to one; with
    pipe_ok (a file read once, as a token is), a FIFO or pipe too (`--auth-token-file <(command)`), opened without
    waiting for a writer: one that no process writes to reads as empty. ValueError naming what and path (never the
    bytes) for a file that cannot be read, is empty, holds over MAX_FILE_BYTES, or is of another kind (a device, a
    socket, a directory, a FIFO without pipe_ok: ssl and gRPC open TLS files again), which would be waited on or
    read without end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open waits for no writer
    except OSError as e:
        raise ValueError(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ValueError(f"cannot read {what} {path}: {os.strerror(errno.EISDIR)}")
        fifo = stat.S_ISFIFO(mode)
        if not (stat.S_ISREG(mode) or (fifo and pipe_ok)):
            kind = next((name for test, name in _KINDS if test(mode)), "a special file")
            raise ValueError(f"{what} {path} is {kind}, not a regular file: give a file (or a symbolic link to one) "
                             "that holds it")  # fmt: skip
        os.set_blocking(fd, True)  # a writer's bytes are waited for
        data = bytearray()
        while len(data) <= MAX_FILE_BYTES and (chunk := os.read(fd, MAX_FILE_BYTES + 1 - len(data))):
            data += chunk
    except OSError as e:
        raise ValueError(f"cannot read {what} {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{what} {path} holds more than {MAX_FILE_BYTES >> 20} MiB: no token, key or certificate "
                         "file is that large; give the file that holds it")  # fmt: skip
    if not data.strip():
        raise ValueError(f"{what} {path} is empty" + (" (a FIFO or pipe: no process wrote to it)" if fifo else ""))
    return bytes(data)


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


def refuse_empty(
    *flags: tuple[str, str | None], what: str = "its file's path", unsaid: str = "turn TLS or the token off"
) -> None:
    """ValueError naming the first flag of flags ((flag, path) pairs) given an empty or blank path (an unset
    variable in a template, PS_TLS_CERT=, say), saying to give `what`: taken as not given, it would `unsaid`
    without a word (ps.emptyflags.refuse_empty_path, the rule ps-server's --restore follows too)."""
    for flag, path in flags:
        refuse_empty_path(flag, path, what, unsaid)


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
    data = read_file(path, what, pipe_ok=True)
    token = data.strip()  # bytes.strip: ASCII whitespace only
    problem = token_problem(token, offset=len(data) - len(data.lstrip()), of="the file")
    if problem:
        raise ValueError(f"{what} {path} does not hold a usable token: {problem}; the token must be one line "
                         "of printable ASCII (0x20-0x7E)")  # fmt: skip
    return token.decode("ascii")


def optional_token(flag: str, path: str | None, what: str = TOKEN_FILE) -> str | None:
    """The token in the file of flag (path), read_token's checks and errors included; None where the flag is not
    given (path None); ValueError (refuse_empty's) for an empty or blank path."""
    if path is None:
        return None
    refuse_empty((flag, path))
    return read_token(path, what)


def check_token(token: str) -> str:
    """token, if it can be sent as `authorization: Bearer <token>`; else ValueError saying why (not showing it)."""
    problem = token_problem(token.encode("utf-8", "surrogateescape"))
    if problem:
        raise ValueError(f"the auth token is unusable: {problem}; it must be one line of printable ASCII "
                         "(0x20-0x7E)")  # fmt: skip
    return token


def check_tls_files(cert: str | None, key: str | None, ca: str | None = None, client: bool = False) -> list[str]:
    """ValueError naming the file that is wrong, and why, unless cert holds PEM certificates, the first of them
    not expired, key the unencrypted PEM private key of that one, and ca PEM certificates, not all expired (each
    where given). gRPC itself reports a bad pair only when it binds a port ("Failed to bind") or as a connection
    that never comes up, and an expired certificate as a handshake the other side fails. Returns the warnings of
    certificates not yet valid (dates_problem), read from the same bytes, saying who refuses them: a server's
    (client False) or a client's (client True) files."""
    warnings = []
    for path, what, own in ((cert, "TLS certificate (--tls-cert)", True), (ca, "TLS CA (--tls-ca)", False)):
        if path:
            pem = read_file(path, what)
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
            except ssl.SSLError as e:
                raise ValueError(f"{what} {path} holds no PEM certificate (expected '-----BEGIN CERTIFICATE-----' "
                                 f"blocks; {e.reason or e})") from None  # fmt: skip
            warning = dates_problem(pem, f"{what} {path}", first_only=own, refused_by=EARLY_REFUSED_BY[client, own])
            warnings += [warning] if warning else []
    if not (cert and key):
        return warnings
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
    return warnings


EARLY_REFUSED_BY = {  # (client, own certificate): who refuses a certificate of that file before its start
    (False, True): "clients refuse it",
    (False, False): "this server refuses the client certificates it signed (mutual TLS)",  # clients use their own CA
    (True, True): "shards that require a client certificate (mutual TLS) refuse it",
    (True, False): "this client refuses the shards' certificates it signed",
}
PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)


def pem_validity(pem_body: bytes) -> tuple[float, float] | None:
    """(start, end) of a certificate's validity (Unix times), from the base64 body of its PEM block; None where it
    does not parse (validity)."""
    try:
        return validity(base64.b64decode(pem_body))
    except (ValueError, binascii.Error):
        return None


def dates_problem(pem: bytes, named: str, first_only: bool, refused_by: str = "clients refuse it") -> str | None:
    """Of the certificates of pem (its first only, with first_only: a certificate's own, not its chain's), named
    (the flag's words and the path) in the message: ValueError where they are all expired by this machine's clock;
    a warning where they are all not yet valid, saying refused_by (who refuses it until then: a certificate
    presented before its start is refused by every peer, yet the clock that says so may be the one that is wrong,
    so a server warns and serves, a client warns and connects); None otherwise. A certificate whose dates do not
    parse is neither (ssl, which loads it, is the judge)."""
    dates = [pem_validity(block) for block in PEM_CERTIFICATE.findall(pem)]
    dates = dates[:1] if first_only else dates
    now = time.time()
    if dates and all(d is not None and d[1] < now for d in dates):
        raise ValueError(f"{named} expired on {utc(max(d[1] for d in dates))} (this machine's clock says {utc(now)}): "
                         "the other side of every connection refuses it; make new certificates "
                         "(deploy/gen-secrets.sh)")  # fmt: skip
    if dates and all(d is not None and d[0] > now for d in dates):
        return (f"{named} is not valid until {utc(min(d[0] for d in dates))} (this machine's clock says {utc(now)}): "
                f"until then {refused_by}; check the clocks of this machine and of the one that made it")  # fmt: skip
    return None


def validity(der: bytes) -> tuple[float, float]:
    """(notBefore, notAfter) of a certificate (Unix times), from its DER: Certificate { tbsCertificate { [0] version
    (optional), serial, signature, issuer, validity { notBefore, notAfter } ... } ... } (RFC 5280). ValueError where
    it does not parse so (ssl, which loads it, is the judge)."""
    try:
        (_, certificate), *_ = _der_elements(der)
        (_, tbs), *_ = _der_elements(certificate)
        fields = [(tag, value) for tag, value in _der_elements(tbs) if tag != 0xA0]  # the version, if any
        (_, times) = fields[3]
        (start_tag, start), (end_tag, end), *_ = _der_elements(times)
        return _der_time(start_tag, start), _der_time(end_tag, end)
    except IndexError:
        raise ValueError("not a DER certificate") from None


def _der_time(tag: int, value: bytes) -> float:
    """A UTCTime (tag 0x17) or GeneralizedTime's Unix time; ValueError for anything else."""
    text = value.decode("ascii")
    if tag == 0x17:  # UTCTime YYMMDDHHMMSSZ: years 50-99 are 19xx (RFC 5280 4.1.2.5.1)
        text = ("19" if int(text[:2]) >= 50 else "20") + text
    return calendar.timegm(time.strptime(text, "%Y%m%d%H%M%SZ"))


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

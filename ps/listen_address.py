"""Where a server listens: HOST:PORT as gRPC takes it, what binding a socket there meets (said with what to do),
and the warning for an address others may reach without TLS, or with no check of who calls."""

from __future__ import annotations

import errno
import ipaddress
import socket


def host_port(host: str, port: int) -> str:
    """HOST:PORT as gRPC takes it: an IPv6 address in brackets ([::1]:5000), whether --host gave them or not."""
    bare = host.strip("[]")
    return f"[{bare}]:{port}" if ":" in bare else f"{host}:{port}"


def bind_problems(host: str, port: int, only_in_use: bool = False) -> list[str]:
    """What binding a socket to each of host's addresses at port meets, as gRPC binds (SO_REUSEADDR), each said
    with what to do: the port in use, the host no address of this machine or no name that resolves ([] if every
    bind succeeds). only_in_use: the port in use, nothing else (an address gRPC would skip, as localhost's ::1 on
    a host without IPv6, is no problem)."""
    try:
        addresses = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)  # fmt: skip
    except (socket.gaierror, UnicodeError) as e:
        why = getattr(e, "strerror", None) or e
        return [] if only_in_use else [f"the host {host!r} is no address or name that resolves ({why}): give --host "
                                       "an address of this machine"]  # fmt: skip
    problems = []
    for family, kind, proto, _, sockaddr in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(sockaddr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                problems.append(f"port {port} of {sockaddr[0]} is in use ({e.strerror}): stop what listens there, or "
                                "give another --port")  # fmt: skip
            elif only_in_use:
                continue
            elif e.errno == errno.EACCES:
                problems.append(f"this user may not listen on port {port} ({e.strerror}): give a --port of 1024 or "
                                "more")  # fmt: skip
            else:
                problems.append(f"{sockaddr[0]} port {port}: {e.strerror or e}: is --host an address of this "
                                "machine? (0.0.0.0: all of them)")  # fmt: skip
    return problems


def exposure_warning(host: str, tls: bool, token: bool, mutual: bool = False) -> str | None:
    """What a server listening on host says when others may reach it and either anyone may call it (no token, and
    no client certificate asked for: mutual) or its traffic, token included, is plain (no tls). None for a loopback
    address, or with TLS and a check of the caller (a token, or mutual TLS)."""
    if (tls and (token or mutual)) or host == "" or is_loopback(host):
        return None
    if not tls and not token:
        return (f"listening on {host} with neither TLS nor a token: anyone who can reach this port can read and "
                "overwrite every table; give --tls-cert/--tls-key and --auth-token-file (docs/security.md), or "
                "listen on 127.0.0.1")  # fmt: skip
    if tls:
        return (f"listening on {host} with TLS but no token: TLS keeps the traffic private but admits every client, "
                "so anyone who can reach this port can read and overwrite every table; give --auth-token-file (or "
                "--tls-ca: mutual TLS) (docs/security.md), or listen on 127.0.0.1")  # fmt: skip
    return (f"listening on {host} with a token but no TLS: the token crosses the network in plain text, and whoever "
            "reads it there can read and overwrite every table; give --tls-cert/--tls-key (docs/security.md), or "
            "listen on 127.0.0.1")  # fmt: skip


def is_loopback(host: str) -> bool:
    """Whether host is this machine only: localhost, or a loopback address (127.0.0.0/8, ::1; in brackets too)."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: only its resolution would tell
        return False

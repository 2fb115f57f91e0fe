"""Channels: a client's gRPC channels to its shards (TLS, token, message limits), the wait until every shard
accepts a connection, and the check that the server list is one cluster's shards in order.

What it logs goes to the client's logger, "worker.client".
"""

from __future__ import annotations

import logging
import socket
import time

import grpc

from ps.config import MAX_MESSAGE_BYTES
from ps.errors import PsError, ServerUnavailableError
from ps.listen_address import is_loopback
from ps.secretfiles import TOKEN_FILE, optional_token, readable_by_all
from ps.security import client_channels
from ps.tlsprobe import host_and_port, tls_hint, uses_tls

log = logging.getLogger("worker.client")


def client_token(token_file: str | None, tls_key: str | None = None) -> str | None:
    """The token of --auth-token-file (None without one), read as a server reads its own (ps.secretfiles.read_token:
    ValueError naming what is wrong with it); a warning logged for that file, and for --tls-key, where every user of
    the machine may read it, as a server warns of its own. ValueError for an empty --auth-token-file (refuse_empty)."""
    for what, path in ((TOKEN_FILE, token_file), ("TLS key (--tls-key)", tls_key)):
        warning = readable_by_all(path) if path else None
        if warning:
            log.warning("%s %s", what, warning)
    return optional_token("--auth-token-file", token_file)


NOTHING_LISTENS = "; nothing listens there: is ps-server running on that host and port?"
READY_PATIENCE_S = 2.0  # wait_ready logs what it waits for once a shard has not answered for this long
READY_REMIND_S = 30.0  # and then says it still waits, every this many seconds
OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # a restarted shard is found within ~2 s, not after gRPC's default backoff (up to 120 s)
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def open_channels(
    servers: list[str], tls_ca: str | None, tls_cert: str | None, tls_key: str | None, auth_token: str | None
) -> list[grpc.Channel]:
    """One channel per server address (ps.security.client_channels: TLS and token as given), in order; a warning
    logged where a token goes without TLS to a server of another machine (as a server warns of listening so), and
    once for a TLS file of the client's not yet valid (as a server warns of its own)."""
    plain = [a for a in servers if not is_loopback(host_and_port(a)[0])]
    if auth_token and not uses_tls(tls_ca, tls_cert, tls_key) and plain:
        log.warning("the token of --auth-token-file crosses the network in plain text to %s (no TLS): whoever reads "
                    "it there can read and overwrite every table; give --tls-ca (docs/security.md)",
                    ", ".join(plain))  # fmt: skip
    channels, warnings = client_channels(servers, OPTIONS, tls_ca, tls_cert, tls_key, auth_token)
    for warning in warnings:  # a certificate not yet valid: the clock that says so may be the wrong one
        log.warning("%s", warning)
    return channels


def why_not_ready(address: str, tls: tuple[str | None, str | None, str | None], timeout_s: float = 1.0) -> str:
    """A hint for a server whose gRPC channel did not become ready: NOTHING_LISTENS when no TCP connection can be
    made there (the server is down); the TLS flag the shard wants, or has not, or the file of tls (the client's
    --tls-ca, --tls-cert, --tls-key) its TLS does not take, as a probe finds it (ps.tlsprobe.tls_hint); else that
    something listens but does not answer as a sparseps shard."""
    host, port = host_and_port(address)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except socket.gaierror as e:  # the name does not resolve (a DNS name of a cluster not up yet, or a typo)
        return f"; its host name {host!r} does not resolve ({e.strerror}): a typo, or a name not yet known"
    except (OSError, ValueError):
        return NOTHING_LISTENS
    return tls_hint(address, *tls, timeout_s=timeout_s) or (
        "; something listens there, but it did not answer as a sparseps shard (gRPC): it may be another service's "
        "port (HTTP, a metrics endpoint), or a shard too busy to answer"
    )


def wait_connected(
    channels: list[grpc.Channel], servers: list[str], tls: tuple[str | None, str | None, str | None], timeout_s: float
) -> None:
    """Waits up to timeout_s for every channel to be ready, logging a shard not ready within READY_PATIENCE_S and
    why (why_not_ready, with tls = the client's (--tls-ca, --tls-cert, --tls-key)); ServerUnavailableError past
    it."""
    deadline = time.monotonic() + timeout_s
    for i, channel in enumerate(channels):
        ready = grpc.channel_ready_future(channel)
        try:
            ready.result(timeout=min(READY_PATIENCE_S, max(0.1, deadline - time.monotonic())))
        except grpc.FutureTimeoutError:
            left = deadline - time.monotonic()
            if left > 0:
                log.warning("shard %d at %s does not answer yet%s; waiting for it up to %.0f s more (of a %.0f s "
                            "wait)", i, servers[i], why_not_ready(servers[i], tls), left,
                            timeout_s)  # fmt: skip
            try:
                while True:  # a reminder every READY_REMIND_S, so that a long wait is not silence
                    try:
                        ready.result(timeout=max(0.1, min(READY_REMIND_S, deadline - time.monotonic())))
                        break
                    except grpc.FutureTimeoutError:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise
                        log.warning("still waiting for shard %d at %s (%.0f s left; --server-timeout sets the wait)",
                                    i, servers[i], left)  # fmt: skip
            except grpc.FutureTimeoutError:
                raise ServerUnavailableError(
                    f"shard {i} at {servers[i]} did not accept a connection within {timeout_s:g} s"
                    + why_not_ready(servers[i], tls)
                ) from None


def check_cluster(servers: list[str], stats: list) -> None:
    """PsError unless shard i's stats say it is shard i of len(servers) and all give one cluster name
    (ps-server --cluster)."""
    found = [(s.shard_id, s.num_shards) for s in stats]
    if found != [(i, len(servers)) for i in range(len(servers))]:
        raise PsError(server_list_error(servers, found, [s.state_id for s in stats]))
    names = [s.cluster for s in stats]
    if len(set(names)) > 1:
        said = ", ".join(f"{a} (shard {i}) says {n or '(unnamed)'!r}" for i, (a, n) in enumerate(zip(servers, names)))
        raise PsError(f"the server list mixes clusters: {said} (ps-server --cluster); give the addresses of one "
                      "cluster's shards")  # fmt: skip


def server_list_error(servers: list[str], found: list[tuple[int, int]], state_ids: list[int]) -> str:
    """What is wrong with a server list whose servers say they are shards found[i] = (shard_id, num_shards), with
    model state ids state_ids[i] (StatsResponse state_id; 0: none): a server listed twice (under one address or
    two), shards missing or extra, or the order."""
    listed = [f"{a} (shard {sid} of {n})" for a, (sid, n) in zip(servers, found)]
    ids = [sid for sid, _ in found]
    counts = {n for _, n in found}
    if len(set(ids)) < len(ids):
        twice = sorted({sid for sid in ids if ids.count(sid) > 1})
        same = [a for a, sid in zip(servers, ids) if sid == twice[0]]
        states = [st for st, sid in zip(state_ids, ids) if sid == twice[0]]
        what = f"shard {', '.join(map(str, twice))} is listed more than once"
        if len(set(same)) < len(same):
            what += " (the same address twice)"
        elif one := [a for a, st in zip(same, states) if st and states.count(st) > 1]:
            what += f" ({' and '.join(one)} give the same model state id: one server listed under two addresses?)"
        else:
            what += (f" ({' and '.join(same)} both say they are shard {twice[0]}: was one started without its "
                     "--shard-id, which defaults to 0?)")  # fmt: skip
    elif len(counts) > 1:
        what = "the servers belong to clusters of different shard counts"
    elif counts != {len(servers)}:
        (n,) = counts
        absent = sorted(set(range(n)) - set(ids))
        what = f"the cluster has {n} shard{'s' * (n != 1)}, the list {len(servers)}" + (
            (f"; shard {absent[0]} is missing" if len(absent) == 1 else f"; shards {', '.join(map(str, absent))} are "
             "missing") if absent else "")  # fmt: skip
    else:
        what = "the servers are not in shard order"
    return (f"the server list does not match the cluster: {what}. Listed: {', '.join(listed)}; give every shard's "
            "address once, in shard order")  # fmt: skip

"""The checks the shard's and the worker's metrics endpoints share (ps.metricshttp): past MAX_CONNECTIONS idle
connections at once, a connection is closed unread; once the idle ones are gone, scrapes are served again; and
MAX_CONNECTIONS clients sending their requests a byte at a time are dropped at the handler's deadline, so that a
scrape is served."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
from collections.abc import Callable

from ps.metricshttp import MAX_CONNECTIONS

EXTRA = 8  # connections past the bound
DRIP_S = 0.2  # a slow client sends a byte this often: far within any read's socket timeout


def check_connections_bounded(port: int, scrape: Callable[[], None], wait_s: float) -> None:
    """Opens MAX_CONNECTIONS + EXTRA idle connections to 127.0.0.1:port and asserts that the server closes EXTRA
    of them within wait_s; then closes them all and asserts that scrape() (raising URLError or ConnectionError
    while no thread is free) passes within wait_s more. The caller keeps idle connections from timing out
    meanwhile (ps.metricshttp.Handler.timeout)."""
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CONNECTIONS + EXTRA)]
    try:
        closed, deadline = set(), time.monotonic() + wait_s
        while len(closed) < EXTRA and time.monotonic() < deadline:
            for i in set(range(len(idle))) - closed:
                idle[i].settimeout(0.01)
                try:
                    if idle[i].recv(1) == b"":  # the server closed it
                        closed.add(i)
                except ConnectionResetError:
                    closed.add(i)
                except TimeoutError:
                    pass
        assert len(closed) == EXTRA, f"{len(closed)} of {len(idle)} idle connections closed"
        for s in idle:
            s.close()
        deadline = time.monotonic() + wait_s
        while True:  # the idle connections' threads see them closed, and end
            try:
                scrape()
                return
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "no scrape served after the idle connections closed"
                time.sleep(0.05)
    finally:
        for s in idle:
            s.close()


def check_slow_clients_dropped(port: int, scrape: Callable[[], None], deadline_s: float) -> None:
    """Opens MAX_CONNECTIONS connections to 127.0.0.1:port that send a request's header a byte every DRIP_S, never
    ending it, and asserts that scrape() (raising URLError or ConnectionError while no thread is free) passes within
    deadline_s (the handler's deadline for a connection's TLS handshake and request, ps.metricshttp.Handler.timeout;
    a reply keeps to Handler.reply_s of its own) and 10 s more of their opening, the slow clients still sending, and
    that the server closed each of them. deadline_s of 3 s or more: a connection past the listen backlog may see its
    first bytes over a second after it was accepted (the handshake's retry), and a shorter per-read timeout would end
    it before any drip, hiding a deadline that is not there."""
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CONNECTIONS)]
    opened, stop = time.monotonic(), threading.Event()

    def drip() -> None:
        for s in slow:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        while not stop.wait(DRIP_S):
            for s in slow:
                try:
                    s.send(b"a")
                except OSError:  # the server closed it
                    pass

    dripping = threading.Thread(target=drip, daemon=True)
    dripping.start()
    try:
        while True:
            try:
                scrape()
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < opened + deadline_s + 10, "no scrape served while slow clients dripped"
                time.sleep(0.05)
        assert dripping.is_alive(), "the slow clients stopped sending"
        for i, s in enumerate(slow):
            s.settimeout(10)
            try:
                assert s.recv(1 << 16) == b"", f"slow client {i} got an answer"
            except ConnectionResetError:  # closed with its unread bytes: as good
                pass
    finally:
        stop.set()
        dripping.join(timeout=10)
        for s in slow:
            s.close()

"""The check the shard's and the worker's metrics endpoints share (ps.metricshttp): past MAX_CONNECTIONS idle
connections at once, a connection is closed unread; once the idle ones are gone, scrapes are served again."""

from __future__ import annotations

import socket
import time
import urllib.error
from collections.abc import Callable

from ps.metricshttp import MAX_CONNECTIONS

EXTRA = 8  # connections past the bound


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

"""Times as the server's messages give them: utc, a Unix time as "YYYY-MM-DD HH:MM:SS UTC" (stdlib only).

One form for every moment a message names: a certificate's start and end and this machine's clock beside them
(ps.secretfiles, ps.tlsprobe), the start of a running Shrink that refuses another (ps.engine.shrinkprogress).
"""

from __future__ import annotations

import time


def utc(seconds: float) -> str:
    """A Unix time as the server's messages give it: "2026-12-07 19:41:05 UTC"."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))

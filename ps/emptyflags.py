"""Flags given empty (an unset variable in a template: `--restore "$CKPT"`, PS_HOST=), refused naming the flag.

Taken as the flag left out, an empty path would change what a program does without a word (turn TLS off, start a
shard with no tables); an empty host would have gRPC refuse to listen with no reason given, or a plain socket listen
on every address. Stdlib only, so that ps.server_config (foundation), ps.secretfiles and the worker share one rule.
"""

from __future__ import annotations

LOOPBACK = "127.0.0.1"  # the address an empty host's refusal offers for this machine only


def refuse_empty_path(flag: str, path: str | None, what: str, unsaid: str) -> None:
    """ValueError where flag was given (path not None) an empty or blank path, saying to give `what` or leave the
    flag out: taken as not given, it would `unsaid` ("turn TLS or the token off") without a word."""
    if path is not None and not path.strip():
        raise ValueError(f"{flag} is empty ({path!r}): give {what}, or leave the flag out (an empty path is not "
                         f"taken as the flag left out, which would {unsaid} without a word)")  # fmt: skip


def refuse_empty_host(flag: str, host: str | None, default: str = "") -> None:
    """ValueError where flag was given (host not None) an empty host: blank, or brackets alone ("[]", an IPv6
    address's brackets with nothing in them). The message offers LOOPBACK for this machine only and 0.0.0.0 for all
    of its addresses; default: the flag's default, a loopback address, named there as the default (--metrics-host's);
    "": none named (ServerConfig.host, which callers other than ps-server's flags fill in)."""
    if host is not None and not host.strip("[] \t"):
        only = f"{default}, the default" if default else LOOPBACK
        raise ValueError(f"{flag} is empty ({host!r}): give an address of this machine ({only}: this machine only; "
                         "0.0.0.0: all of its addresses)")  # fmt: skip

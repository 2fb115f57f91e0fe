"""The argparse types and help of both CLIs' flags (ps-server, ps-worker): sizes with K/M/G/T suffixes, integers and
numbers within bounds, HOST:PORT addresses, and the help formatter that appends each option's default."""

from __future__ import annotations

import argparse
import decimal
import math
import re
from collections.abc import Callable

from ps.tlsprobe import GRPC_DNS

SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


SIZE_DIGITS = 100  # sizes lie below 10**SIZE_DIGITS bytes; a number past 1e±SIZE_DIGITS is a slip, refused unworked


class SizeTooLargeError(ValueError):
    """A size of 10**SIZE_DIGITS bytes or more (byte_size); its message names that bound."""


class SizeBelowOneByteError(ValueError):
    """A size other than 0 that comes to less than one byte once its unit is worked out ("0.0001K", "1e-99G"):
    a slip, never taken as 0, which means no bound or none of a thing to the flags that take it (byte_size)."""


def exact_number(text: str) -> decimal.Decimal | None:
    """text as an exact decimal number: an integer, a fraction or scientific notation ("1e9", "2.5e6", "1.5"), taken
    exactly however many digits it has (no float rounds it); None where it is no number, inf or nan. The parser of
    byte_size and whole_number."""
    try:
        value = decimal.Decimal(text.strip())
    except decimal.InvalidOperation:
        return None
    return value if value.is_finite() else None


def byte_size(text: str) -> int:
    """Bytes of a size flag: a number with an optional K, M, G or T suffix (powers of 1024; "64M", "64MiB", "64MB"
    and "1.5G" alike; a fraction of a byte that a unit leaves is dropped: "1.1G"), or a whole number of bytes
    ("67108864", "1e9"), taken exactly (exact_number). SizeTooLargeError for a size of 10**SIZE_DIGITS bytes or
    more; SizeBelowOneByteError for a number other than 0 that comes to less than a byte ("0.0001K": 0 bytes, once
    the fraction is dropped, would read as 0); ValueError for anything else (text, inf, nan, "1.5" bytes, a number
    other than 0 whose magnitude is below 1e-(SIZE_DIGITS - 1)): the number's exponent refuses both ends before any
    bytes are worked out (10**N for the exponent N of "1e-100000000" hangs). The sign is the caller's to check: a
    negative size comes back negative, -10**SIZE_DIGITS where its number's magnitude is 10**SIZE_DIGITS or more (its
    bytes not worked out)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = SIZE_UNITS.get(t[-1:], 1)
    value = exact_number(t[:-1] if unit > 1 else t)
    if value is None or (not value.is_zero() and value.adjusted() <= -SIZE_DIGITS):
        raise ValueError(f"not a size: {text!r}")
    if not value.is_zero() and value.adjusted() >= SIZE_DIGITS:
        if value < 0:
            return -(10**SIZE_DIGITS)
        raise SizeTooLargeError(_too_large(text))
    numerator, denominator = value.as_integer_ratio()
    if unit == 1 and denominator != 1:  # "1.5": bytes come whole (a fraction is a slip, not a size)
        raise ValueError(f"not a whole number of bytes: {text!r}")
    whole = abs(numerator) * unit // denominator  # the fraction of a byte dropped
    if whole == 0 and numerator != 0:  # "0.0001K": not 0 (no bound, none), which was not asked for
        raise SizeBelowOneByteError(f"size below one byte: {text!r} (a size other than 0 comes to 1 byte or more; 0 "
                                    "is written 0)")  # fmt: skip
    if whole >= 10**SIZE_DIGITS and numerator > 0:  # a unit took it there: "1e99T"
        raise SizeTooLargeError(_too_large(text))
    return whole if numerator >= 0 else -whole


def _too_large(text: str) -> str:
    """The message of SizeTooLargeError, naming the bound."""
    return f"size too large: {text!r} (sizes are below 1e{SIZE_DIGITS} bytes)"


def integer(lowest: int, highest: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in lowest..highest (argparse puts the flag before its message)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lowest or (highest is not None and value > highest):
            span = f">= {lowest}" if highest is None else f"in {lowest}..{highest}"
            raise argparse.ArgumentTypeError(f"expected an integer {span}, got {value}")
        return value

    return parse


def whole_number(lowest: int, highest: int) -> Callable[[str], int]:
    """An argparse type: a whole number in lowest..highest, as an integer or in scientific notation ("1e9",
    "2.5e6"), taken exactly however large (exact_number); a fraction ("2.5"), inf or nan is refused."""

    def parse(text: str) -> int:
        value = exact_number(text)
        if value is None or value != value.to_integral_value():
            raise argparse.ArgumentTypeError(f"expected a whole number (1e9 is fine), got {text!r}")
        if not lowest <= value <= highest:
            raise argparse.ArgumentTypeError(f"expected a whole number in {lowest}..{highest}, got {text!r}")
        return int(value)

    return parse


ADDRESS = re.compile(r"([^\s/@]+):(\d{1,5})")  # host:port (a port in 1..65535: see is_address); no scheme, path


def is_address(text: str) -> bool:
    """text is host:port with a port in 1..65535, or gRPC's dns:///host:port (no other scheme such as http://, no
    path, no user part)."""
    m = ADDRESS.fullmatch(text.removeprefix(GRPC_DNS))
    return m is not None and 1 <= int(m.group(2)) <= 65535


def address_hint(text: str) -> str:
    """What to write instead of text, an address with a scheme or a path (a URL), for a message; else ""."""
    if text.startswith(GRPC_DNS):
        return " (dns:///host:port: a port is needed)" if ":" not in text.removeprefix(GRPC_DNS) else ""
    m = re.fullmatch(r"[A-Za-z][\w+.-]*://([^/\s]+)/?", text)
    if m is not None and is_address(m.group(1)):
        return f" (no scheme: {m.group(1)})"
    return " (no scheme, path or user part: host:port alone)" if "/" in text or "@" in text else ""


def address(text: str) -> str:
    """An argparse type: host:port with a port in 1..65535."""
    if not is_address(text):
        raise argparse.ArgumentTypeError(
            f"expected host:port with a port in 1..65535, got {text!r}{address_hint(text)}"
        )
    return text


def number(lowest: float, highest: float = math.inf, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in lowest..highest (above: lowest itself excluded)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        low_ok = value > lowest if above else value >= lowest
        if not (math.isfinite(value) and low_ok and value <= highest):
            low = f"{'>' if above else '>='} {lowest:g}"
            span = low if highest == math.inf else f"{low} and <= {highest:g}"
            raise argparse.ArgumentTypeError(f"expected a number {span}, got {text!r}")
        return value

    return parse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with each option's default appended, "(default: X)", unless the help already speaks of its
    default, the default is None or empty (the help says what happens without the flag), or the option takes no
    value (--json)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, "", argparse.SUPPRESS) or action.nargs == 0:
            return action.help
        return super()._get_help_string(action)

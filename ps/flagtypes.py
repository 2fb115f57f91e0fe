"""The argparse types and help of both CLIs' flags (ps-server, ps-worker): sizes with K/M/G/T suffixes, integers and
numbers within bounds, HOST:PORT addresses, table names, and the help formatter that appends each option's default."""

from __future__ import annotations

import argparse
import decimal
import math
import re
from collections.abc import Callable

from ps.config import check_table_name
from ps.tlsprobe import GRPC_DNS

SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


SIZE_DIGITS = 100  # sizes lie below 10**SIZE_DIGITS bytes; a number past 1e±SIZE_DIGITS is a slip, refused unworked
LARGEST_SIZE = 10**SIZE_DIGITS - 1  # the largest size byte_size takes


def is_plain_number(text: str) -> bool:
    """text is ASCII without an underscore: Python's int(), float() and Decimal() also read other scripts' digits
    ("١٠٠", "１００") and digit separators ("1_0_0"), which no number of a flag or a setting is written with."""
    return text.isascii() and "_" not in text


def not_plain(text: str) -> str:
    """What a message refusing text as a number adds where text is not is_plain_number's: " (digits 0-9, no '_')"."""
    return "" if is_plain_number(text) else " (digits 0-9, no '_')"


def exact_number(text: str) -> decimal.Decimal | None:
    """text as an exact decimal number: an integer, a fraction or scientific notation ("1e9", "2.5e6", "1.5"), taken
    exactly however many digits it has (no float rounds it); None where it is no number, inf or nan, or not written
    in ASCII digits without '_' (is_plain_number). The parser of byte_size and whole_number."""
    if not is_plain_number(text):
        return None
    try:
        value = decimal.Decimal(text.strip())
    except decimal.InvalidOperation:
        return None
    return value if value.is_finite() else None


def byte_size(text: str, *, least: int = 0, most: int = LARGEST_SIZE, most_said: str = "") -> int:
    """Bytes of a size flag, least..most (0 <= least <= most <= LARGEST_SIZE): a number with an optional K, M, G or
    T suffix (powers of 1024; "64M", "64MiB", "64MB" and "1.5G" alike; a fraction of a byte that a unit leaves is
    dropped: "1.1G"), or a whole number of bytes ("67108864", "1e9"), taken exactly (exact_number). ValueError, its
    message the one a user reads, for anything else: no number (text, inf, nan, "1.5" bytes, a number other than 0
    whose magnitude is below 1e-(SIZE_DIGITS - 1)); a number other than 0 that comes to less than a byte
    ("0.0001K": 0 bytes, once the fraction is dropped, would read as 0, no bound or none of a thing); a size outside
    least..most, a negative one included (most_said spells most in that message, else its bytes are). The number's
    exponent refuses both ends before any bytes are worked out (10**N for the exponent N of "1e-100000000" or
    "-1e100000000" hangs)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = SIZE_UNITS.get(t[-1:], 1)
    value = exact_number(t[:-1] if unit > 1 else t)
    if value is None or (not value.is_zero() and value.adjusted() <= -SIZE_DIGITS):
        raise ValueError(_not_a_size(text))
    if value < 0 or (not value.is_zero() and value.adjusted() >= SIZE_DIGITS):  # refused unworked
        raise ValueError(_outside(text, value > 0, least, most, most_said))
    numerator, denominator = value.as_integer_ratio()
    if unit == 1 and denominator != 1:  # "1.5": bytes come whole (a fraction is a slip, not a size)
        raise ValueError(_not_a_size(text))
    whole = numerator * unit // denominator  # the fraction of a byte dropped
    if whole == 0 and numerator != 0:  # "0.0001K": not 0 (no bound, none), which was not asked for
        raise ValueError(f"size below one byte: {text!r} (a size other than 0 comes to 1 byte or more; 0 is "
                         "written 0)")  # fmt: skip
    if not least <= whole <= most:
        raise ValueError(_outside(text, whole > most, least, most, most_said))
    return whole


def _not_a_size(text: str) -> str:
    """The message of byte_size for text that is no size."""
    return f"expected a whole number of bytes or a size such as 512M or 2G, got {text!r}{not_plain(text)}"


def _outside(text: str, above: bool, least: int, most: int, most_said: str) -> str:
    """The message of byte_size for a size outside least..most (above: past most, else below least)."""
    if most < LARGEST_SIZE:
        return f"expected bytes from {least} to {most_said or f'{most:,}'}, got {text!r}"
    if above:
        return f"size too large: {text!r} (sizes are below 1e{SIZE_DIGITS} bytes)"
    return f"expected a size of at least {least} byte{'' if least == 1 else 's'}, such as 512M or 2G, got {text!r}"


def size_flag(least: int, most: int = LARGEST_SIZE, most_said: str = "") -> Callable[[str], int]:
    """An argparse type: a size of least..most bytes (byte_size, whose message argparse puts after the flag);
    most_said spells most in that message."""
    if not 0 <= least <= most <= LARGEST_SIZE:
        raise ValueError(f"size_flag({least}, {most}): expected 0 <= least <= most <= LARGEST_SIZE")

    def parse(text: str) -> int:
        try:
            return byte_size(text, least=least, most=most, most_said=most_said)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def plain_int(text: str) -> int:
    """An argparse type: an integer in ASCII digits (is_plain_number), of any value."""
    try:
        if is_plain_number(text):
            return int(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}{not_plain(text)}")


def plain_float(text: str) -> float:
    """float(text) for text in ASCII without '_' (is_plain_number); ValueError, naming text, for anything else."""
    try:
        if is_plain_number(text):
            return float(text)
    except ValueError:
        pass
    raise ValueError(f"expected a number, got {text!r}{not_plain(text)}")


def integer(lowest: int, highest: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in lowest..highest (argparse puts the flag before its message)."""

    def parse(text: str) -> int:
        value = plain_int(text)
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
            raise argparse.ArgumentTypeError(f"expected a whole number (1e9 is fine), got {text!r}{not_plain(text)}")
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
            value = plain_float(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        low_ok = value > lowest if above else value >= lowest
        if not (math.isfinite(value) and low_ok and value <= highest):
            low = f"{'>' if above else '>='} {lowest:g}"
            span = low if highest == math.inf else f"{low} and <= {highest:g}"
            raise argparse.ArgumentTypeError(f"expected a number {span}, got {text!r}")
        return value

    return parse


def table_name(text: str) -> str:
    """An argparse type: a name a table may have (ps.config.check_table_name), or "" for every table."""
    if text:
        try:
            check_table_name(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with each option's default appended, "(default: X)", unless the help already speaks of its
    default, the default is None or empty (the help says what happens without the flag), or the option takes no
    value (--json)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, "", argparse.SUPPRESS) or action.nargs == 0:
            return action.help
        return super()._get_help_string(action)

"""Byte counts as people read them: '512 B', '100.0 KiB', '12.5 MiB', '2.00 GiB', '1.20 TiB' (stdlib only).

One rule for every figure the server and the worker show (ps-server size, a low disk's log lines, ps-worker
stats, a run's progress and summary): below 1,000 the bytes themselves; else the smallest of KiB, MiB, GiB, TiB
and PiB in which the figure, rounded as printed, is under 1,000, so that no figure reads 1,024.0 KiB or
1,000.0 MiB (PiB past that, however large). KiB and MiB show a tenth, GiB and larger a hundredth: 2.00 GiB is
not 2.0 GiB give or take 51 MiB. exact_bytes adds the exact count where that figure is rounded, for a size a user
gives back (the least a flag needs) or checks against a flag's.
"""

from __future__ import annotations

from collections.abc import Callable

UNITS = (("KiB", 10, 1), ("MiB", 20, 1), ("GiB", 30, 2), ("TiB", 40, 2), ("PiB", 50, 2))
"""Each unit's name, its power of 2 and the decimals it is shown with, smallest first."""


def _unit(n: float) -> tuple[str, int, int]:
    """The unit human_bytes shows n >= 1,000 bytes in: its name, power of 2 and decimals (UNITS)."""
    return next((u for u in UNITS if round(n / 2 ** u[1], u[2]) < 1000), UNITS[-1])


def human_bytes(n: float) -> str:
    """n bytes in the module's form ('999 B', '1.0 KiB', '1.0 MiB' for 1,023.95 KiB, '4.00 TiB'); a negative n
    reads as its size with a minus sign."""
    if n < 0:
        return "-" + human_bytes(-n)
    if round(n) < 1000:
        return f"{round(n):,} B"
    unit, shift, decimals = _unit(n)
    return f"{n / 2**shift:,.{decimals}f} {unit}"


def exact_bytes(n: int) -> str:
    """human_bytes(n), and the exact count after it where that figure is rounded: '449.0 KiB' (459,776 bytes, no
    more to say), '16.0 MiB (16,777,376 bytes)'."""
    text = human_bytes(n)
    if abs(n) < 1000:
        return text
    _, shift, decimals = _unit(abs(n))
    exact = (abs(n) * 10**decimals) % (1 << shift) == 0  # n / 2**shift has no more decimals than are shown
    return text if exact else f"{text} ({n:,} bytes)"


def bytes_apart(a: int, b: int, form_a: Callable[[float], str] = human_bytes,
                form_b: Callable[[float], str] = human_bytes) -> tuple[str, str]:  # fmt: skip
    """a and b as a message comparing them shows them: in their forms (human_bytes), or, where they differ but would
    read the same so (33,791 and 33,792 bytes, both '33.0 KiB'), both as exact counts ('33,791 bytes'), so that
    the message does not say a figure is less than itself."""
    text_a, text_b = form_a(a), form_b(b)
    if a != b and text_a == text_b:
        return f"{a:,} bytes", f"{b:,} bytes"
    return text_a, text_b

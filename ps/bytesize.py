"""Byte counts as people read them: '512 B', '100.0 KiB', '12.5 MiB', '2.00 GiB', '1.20 TiB' (stdlib only).

One rule for every figure the server and the worker show (ps-server size, a low disk's log lines, ps-worker
stats, a run's progress and summary): below 1,000 the bytes themselves; else the smallest of KiB, MiB, GiB, TiB
and PiB in which the figure, rounded as printed, is under 1,000, so that no figure reads 1,024.0 KiB or
1,000.0 MiB (PiB past that, however large). KiB and MiB show a tenth, GiB and larger a hundredth: 2.00 GiB is
not 2.0 GiB give or take 51 MiB. exact_bytes adds the exact count where that figure is rounded, for a size a user
gives back (the least a flag needs) or checks against a flag's; read_bytes reads either form back.
"""

from __future__ import annotations

import re
from collections.abc import Callable

UNITS = (("KiB", 10, 1), ("MiB", 20, 1), ("GiB", 30, 2), ("TiB", 40, 2), ("PiB", 50, 2))
"""Each unit's name, its power of 2 and the decimals it is shown with, smallest first."""


def human_bytes(n: float) -> str:
    """n bytes in the module's form ('999 B', '1.0 KiB', '1.0 MiB' for 1,023.95 KiB, '4.00 TiB'); a negative n
    reads as its size with a minus sign."""
    if n < 0:
        return "-" + human_bytes(-n)
    if round(n) < 1000:
        return f"{round(n):,} B"
    unit, shift, decimals = next((u for u in UNITS if round(n / 2 ** u[1], u[2]) < 1000), UNITS[-1])
    return f"{n / 2**shift:,.{decimals}f} {unit}"


def exact_bytes(n: int) -> str:
    """human_bytes(n), and the exact count after it where that figure is rounded: '449.0 KiB' (459,776 bytes, no
    more to say), '16.0 MiB (16,777,376 bytes)'."""
    text = human_bytes(n)
    return text if read_bytes(text) == n else f"{text} ({n:,} bytes)"


_COUNT = r"-?[0-9]{1,3}(?:,[0-9]{3})*"  # ASCII digits in groups of three, as f"{n:,}" writes them
_FORM = re.compile(rf"({_COUNT}(?:\.[0-9]+)?) (B|KiB|MiB|GiB|TiB|PiB)(?: \(({_COUNT}) bytes\))?")
_SHIFTS = {"B": 0, **{unit: shift for unit, shift, _ in UNITS}}


def read_bytes(text: str) -> int | None:
    """The bytes exact_bytes' text says (its exact count where it has one, else its figure, rounded as shown, times
    its unit); None for text of neither form."""
    m = _FORM.fullmatch(text.strip())
    if m is None:
        return None
    if m.group(3) is not None:
        return int(m.group(3).replace(",", ""))
    whole, _, tenths = m.group(1).replace(",", "").partition(".")
    scale = 10 ** len(tenths)
    return (int(whole + tenths) << _SHIFTS[m.group(2)]) // scale if m.group(2) != "B" or not tenths else None


def bytes_apart(a: int, b: int, form_a: Callable[[float], str] = human_bytes,
                form_b: Callable[[float], str] = human_bytes) -> tuple[str, str]:  # fmt: skip
    """a and b as a message comparing them shows them: in their forms (human_bytes), or, where they differ but would
    read the same so (33,791 and 33,792 bytes, both '33.0 KiB'), both as exact counts ('33,791 bytes'), so that
    the message does not say a figure is less than itself."""
    text_a, text_b = form_a(a), form_b(b)
    if a != b and text_a == text_b:
        return f"{a:,} bytes", f"{b:,} bytes"
    return text_a, text_b

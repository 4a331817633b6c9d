"""Cell formatting shared by the table modules (tables.py, tables_studies.py, tables_scale.py): a missing
value is "–"."""

from __future__ import annotations

import math

DTYPE = {"float16": "fp16", "float32": "fp32"}
def _f(value, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _x(value, fmt: str = ".2f") -> str:
    return "–" if value is None else f"{value:{fmt}}×"


def _pct(value) -> str:
    return "–" if value is None else f"{100 * value:.0f} %"


def _sig(value: float, digits: int) -> str:
    """`digits` significant figures, never an exponent: 19.199 -> 19.2, 228.4 -> 228, 0.902 -> 0.90."""
    if value == 0:
        return "0"
    return f"{value:.{max(digits - 1 - math.floor(math.log10(abs(value))), 0)}f}"


def _e(value: float) -> str:
    """One decimal in scientific notation, exponent unpadded: 0.0041 -> 4.1e-3."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _bytes_change(before: float, after: float) -> str:
    """'8.4 → 5.2 GB', or in MB when both are under a GB."""
    if max(before, after) < 1e9:
        return f"{before / 1e6:.0f} → {after / 1e6:.0f} MB"
    return f"{before / 1e9:.1f} → {after / 1e9:.1f} GB"


def _gb(n: float, fmt: str = ".1f") -> str:
    return f"{n / 1e9:{fmt}} GB"


def _kb(n: float) -> str:
    kb = n / 1e3
    return f"{kb:,.0f} KB" if kb >= 100 else f"{kb:.1f} KB"


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s"


def _yes(flag) -> str:
    return "–" if flag is None else ("yes" if flag else "no")


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)

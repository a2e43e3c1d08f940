"""Sizes and counts as people read them (report.md, report.html, the terminal tables)."""
from __future__ import annotations


def human_size(n: int | None) -> str:
    """Bytes as people read them (report.md, the terminal table)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def short_count(n: int | None) -> str:
    """12_500 -> "12.50k", 1_500_000 -> "1.50M"; None -> "-"."""
    if n is None:
        return "-"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)

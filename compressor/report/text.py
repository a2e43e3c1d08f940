"""Wording report.md and report.html share: the fallback search's summary."""
from __future__ import annotations

from typing import Any


def fallback_summary(fallback: dict[str, Any], metric: str) -> str:
    """What the int8 fallback search found: full int8, the layers kept float, and the result."""
    dtypes = "; ".join(f"{fmt}: {', '.join(found) or 'none'}"
                       for fmt, found in fallback.get("float_weight_dtypes", {}).items())
    read_back = f"; float weights read back: {dtypes}" if dtypes else ""
    full, chosen = fallback["full_int8"], fallback["chosen"]
    return (f"Full int8 ({fallback['format']}): {metric} {full['metric_value']:.4f} "
            f"(drop {full['drop']:+.4f}). Kept float ({fallback['dtype']} asked{read_back}): "
            f"{', '.join(fallback['float_layers']) or 'none'} -> {metric} "
            f"{chosen['metric_value']:.4f} (drop {chosen['drop']:+.4f}), "
            f"{fallback['evaluations']} evaluations of the val set.")

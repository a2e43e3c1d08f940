"""How an artifact row's values read, wherever a row is shown (report.md, the terminal)."""
from __future__ import annotations


def weight_share_text(row: dict, top_only: bool = False) -> str:
    """How the summary table and report.md show an artifact's weights: for an integer scheme
    its share as the gate reads it (weight_share_at: "int8 83.0%"; the element fractions of
    `weight_dtypes` count biases and scales too and read higher), else the dtypes by element."""
    bits = row.get("weight_bits")
    if bits is not None and bits <= 8 and row.get("weight_share_at_bits") is not None:
        return f"int{bits} {row['weight_share_at_bits']:.1%}"
    dtypes = list(row.get("weight_dtypes", {}).items())
    if top_only:
        dtypes = [max(dtypes, key=lambda kv: kv[1], default=("-", 0))]
    return ", ".join(f"{k} {v:.1%}" for k, v in dtypes)

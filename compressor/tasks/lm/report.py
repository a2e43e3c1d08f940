"""The language-model columns of the terminal summary and report.md (one definition for both),
and the byte sizes both print."""
from __future__ import annotations

from typing import Any

COLUMNS = ("artifact", "size", "vs fp16", "perplexity", "increase", "top-1", "greedy",
           "prefill ms", "decode tok/s", "peak RSS", "KV cache", "fits")


def is_lm_report(report: dict[str, Any]) -> bool:
    return "perplexity" in report["baseline"]


def human_size(n: int | None) -> str:
    """Bytes as people read them (report.md, the terminal table)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def lm_row(art: dict[str, Any], report: dict[str, Any]) -> list[str]:
    fp16 = report["baseline"]["fp16_bytes"]
    return [art["path"], human_size(art["size_bytes"]), f"{art['size_bytes'] / fp16:.3f}x",
            f"{art['perplexity']:.3f}", f"{art['perplexity_increase']:+.2%}",
            f"{art['top1_agreement']:.1%}", f"{art['greedy_agreement']:.1%}",
            _number(art.get("prefill_ms"), ".1f"), _number(art.get("decode_tokens_per_s"), ".1f"),
            _size(art.get("peak_rss_bytes")), human_size(art["kv_cache_bytes"]),
            "yes" if art["fits_target"] else "NO"]


def lm_title(report: dict[str, Any]) -> str:
    base = report["baseline"]
    return (f"{report['recipe']['name']}: language model, {base['params']:,} params, baseline "
            f"perplexity {base['perplexity']:.3f} (torch), context {report['context']}, "
            f"gate +{report['gate']['max_increase']:.0%}")


def markdown_lines(report: dict[str, Any]) -> list[str]:
    threads = next((a.get("threads") for a in report["artifacts"] if a.get("threads")), None)
    lines = [f"- {lm_title(report)}",
             f"- Peak RSS of this compress run (its child processes added): "
             f"{_size(report.get('compress_peak_rss_bytes'))}; "
             f"speed at {threads} thread(s)", "",
             "| " + " | ".join(COLUMNS) + " |", "|---" + "|---:" * (len(COLUMNS) - 1) + "|"]
    lines += ["| " + " | ".join(lm_row(art, report)) + " |" for art in report["artifacts"]]
    return lines


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _size(value: int | None) -> str:
    return human_size(value)

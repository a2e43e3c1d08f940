"""What a language model's report shows: its table in report.md and on the terminal (one
definition of the columns for both) and its section of report.html."""
from __future__ import annotations

from typing import Any

from compressor.render.charts import BarRow, Marker, Segment, bar_chart
from compressor.render.html import cell, number, para, section, table
from compressor.render.sizes import human_size

COLUMNS = ("artifact", "size", "vs fp16", "perplexity", "increase", "top-1", "greedy",
           "prefill ms", "decode tok/s", "peak RSS", "KV cache", "fits")


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
    for art in report["artifacts"]:
        if art.get("split"):
            lines += split_lines(art["path"], art["split"])
    return lines


def split_lines(path: str, split: dict[str, Any]) -> list[str]:
    """report.md's lines on an artifact's --devices split: the check, the speed, each stage."""
    check = split["validation"]
    lines = ["", f"- {path} split into {split['devices']} stages ({split['path']}/): greedy "
             f"{'identical' if check['greedy_identical'] else 'DIFFERENT'}, logits within "
             f"{check['max_abs_logit_diff']:.1e}, top-1 {check['top1_agreement']:.1%}, perplexity "
             f"{check['perplexity']:.3f} (unsplit {check['perplexity_unsplit']:.3f}); decode "
             f"{_number(split['decode_tokens_per_s'], '.1f')} tok/s split, "
             f"{_number(split['decode_tokens_per_s_single'], '.1f')} in one process; link "
             f"{', '.join(f'{b:,}' for b in split['link_bytes_per_token'])} B/token", "",
             "| stage | layers | file | size | peak RSS |", "|---:|---|---|---:|---:|"]
    lines += [f"| {s['rank']} | {s['layers'][0]}-{s['layers'][1]} | {s['file']} | "
              f"{human_size(s['bytes'])} | {_size(s.get('peak_rss_bytes'))} |" for s in split["stages"]]
    return lines


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _size(value: int | None) -> str:
    return human_size(value)


def llm_section(report: dict[str, Any]) -> str:
    """Perplexity vs the original, agreement, prefill / decode speed, KV cache, peak RSS."""
    if not report["artifacts"]:
        return ""
    base, arts = report["baseline"], report["artifacts"]
    limit = base["perplexity"] * (1 + report["gate"]["max_increase"])
    ppl = bar_chart([BarRow("original (torch)", [Segment(base["perplexity"], "#9e9e9e",
                                                         f"{base['perplexity']:.3f}")],
                            f"{base['perplexity']:.3f}")]
                    + [BarRow(a["path"], [Segment(a["perplexity"], "#4c78a8",
                                                  f"{a['perplexity']:.3f}")],
                              f"{a['perplexity']:.3f} ({a['perplexity_increase']:+.2%})")
                       for a in arts],
                    [Marker(limit, f"gate {limit:.2f}", "#c62828")],
                    label="perplexity against the original", fmt=lambda v: f"{v:.3f}")
    speed = bar_chart([BarRow(a["path"], [Segment(a.get("decode_tokens_per_s") or 0, "#54a24b",
                                                  "decode tokens/s")],
                              f"{number(a.get('decode_tokens_per_s'), '.1f')} tok/s")
                       for a in arts], label="decode tokens per second")
    fp16 = base.get("fp16_bytes") or 1
    cells = [(a["path"], [
        cell(a["path"]), cell(human_size(a["size_bytes"]), a["size_bytes"]),
        cell(f"{a['size_bytes'] / fp16:.3f}x", round(a["size_bytes"] / fp16, 6)),
        cell(f"{a['perplexity']:.3f}", a["perplexity"]),
        cell(f"{a['perplexity_increase']:+.2%}", a["perplexity_increase"]),
        cell(f"{a['top1_agreement']:.1%}", a["top1_agreement"]),
        cell(f"{a['greedy_agreement']:.1%}", a["greedy_agreement"]),
        cell(number(a.get("prefill_ms"), ".1f"), a.get("prefill_ms")),
        cell(number(a.get("decode_tokens_per_s"), ".1f"), a.get("decode_tokens_per_s")),
        cell(human_size(a.get("peak_rss_bytes")), a.get("peak_rss_bytes")),
        cell(human_size(a.get("kv_cache_bytes")), a.get("kv_cache_bytes")),
        cell(a.get("context", "-"), a.get("context")),
        cell(a.get("threads") or "-", a.get("threads"))]) for a in arts]
    headers = ("artifact", "size", "vs fp16", "perplexity", "increase", "top-1", "greedy",
               "prefill ms", "decode tok/s", "peak RSS", "KV cache", "context", "threads")
    return section("llm", "Language model", ppl, speed, table(headers, cells, "llm", sortable=True),
                   para(f"Baseline perplexity {base['perplexity']:.3f} (torch); prefill of 512 "
                        f"tokens; KV cache sized to context {report.get('context')}; this "
                        f"compress run peaked at {human_size(report.get('compress_peak_rss_bytes'))}"
                        " resident.", "note"))

"""The terminal summary table printed after a run (the same numbers as report.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from compressor.report import human_size
from compressor.tasks.lm.report import COLUMNS, is_lm_report, lm_row, lm_title
from compressor.tasks.array.metrics import weight_share_text


def print_summary(report: dict[str, Any], out_dir: Path) -> None:
    from rich.table import Table

    if is_lm_report(report):
        return _print_lm_summary(report, out_dir)
    base = report["baseline"]
    metric = base["metric"]
    table = Table(title=f"{report['recipe']['name']}: {report['framework']} model, baseline "
                        f"{metric} {base['value']:.4f}")
    for column in ("artifact", "size", "gzip", metric, "drop", "sparsity", "weights", "p50 ms",
                   "est. memory", "fits"):
        table.add_column(column, justify="left" if column in ("artifact", "weights") else "right")
    for art in report["artifacts"]:
        latency = "-" if art["latency_ms_p50"] is None else f"{art['latency_ms_p50']:.3f}"
        table.add_row(art["path"], human_size(art["size_bytes"]), human_size(art["gzip_bytes"]),
                      f"{art['metric_value']:.4f}", f"{art['drop']:+.4f}", f"{art['sparsity']:.1%}",
                      weight_share_text(art, top_only=True), latency,
                      human_size(art["est_peak_memory_bytes"]), "yes" if art["fits_target"] else "NO")
    _print(table, report, out_dir)


def _print(table: Any, report: dict[str, Any], out_dir: Path) -> None:
    from rich.console import Console

    console = Console(width=max(Console().width, 132))  # pipes get 80 columns: too narrow
    console.print(table)
    verdict = "[green]PASSED[/green]" if report["passed"] else "[red]FAILED[/red]"
    console.print(f"{verdict}  report: {out_dir / 'report.md'}", highlight=False)


def _print_lm_summary(report: dict[str, Any], out_dir: Path) -> None:
    from rich.table import Table

    table = Table(title=lm_title(report))
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "artifact" else "right")
    for art in report["artifacts"]:
        table.add_row(*lm_row(art, report))
    _print(table, report, out_dir)

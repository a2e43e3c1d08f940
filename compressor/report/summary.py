"""The terminal summary table printed after a run (the same numbers as report.md): the columns
and rows are the task's (tasks/*/report.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from compressor.tasks import task_of_report

LEFT_ALIGNED = ("artifact", "weights")


def print_summary(report: dict[str, Any], out_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    title, columns, rows = task_of_report(report).summary(report)
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column in LEFT_ALIGNED else "right")
    for row in rows:
        table.add_row(*row)
    console = Console(width=max(Console().width, 132))  # pipes get 80 columns: too narrow
    console.print(table)
    verdict = "[green]PASSED[/green]" if report["passed"] else "[red]FAILED[/red]"
    console.print(f"{verdict}  report: {out_dir / 'report.md'}", highlight=False)

"""report.json (stable keys: docs/report-format.md), report.md (markdown.py) and report.html (html/)."""
from __future__ import annotations

import json
import platform
from importlib import metadata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compressor.report.markdown import render_markdown


# Packages whose versions make a result reproducible; missing ones are simply left out.
VERSIONED_PACKAGES = ("compressor", "numpy", "tensorflow", "tf-keras", "tensorflow-model-optimization",
                      "tf2onnx", "torch", "torchao", "litert-torch", "onnx", "onnxruntime",
                      "ai-edge-litert", "tflite-runtime")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def build_report(session: Any, rows: list[dict[str, Any]], verdict: dict[str, Any],
                 artifacts: Mapping[str, Path]) -> dict:
    """report.json's content for validated artifact `rows` and the gate / budget `verdict`;
    the run record (session.record) gives timings, histories, sections and notes, and the
    session's task its own keys (`session`: run/session.Session)."""
    recipe = session.recipe
    record = session.record
    validation = session.validation
    report = {
        "recipe": {"name": recipe.name, "sha256": recipe.sha256()},
        "seed": session.ctx.seed,
        "target": session.target,
        "budget_bytes": verdict["budget_bytes"],
        "framework": session.backend.name,
        "model": session.model_ref,
        "data": session.ctx.data.name,
        "task": session.task.name,
        "baseline": {"metric": session.metric_name, "value": session.ctx.baseline_value,
                     "size_bytes": session.info.size_bytes, "params": session.info.params,
                     "chance_level": False},
        "teacher": session.teacher_entry,
        "artifacts": rows,
        # batch-1 latency is timed in a fresh process per artifact with this many threads
        "latency_threads": next((row.get("latency_threads") for row in rows
                                 if row.get("latency_threads")), None),
        "gate": {"max_drop": validation.max_drop, "min_fidelity": validation.min_fidelity,
                 "passed": verdict["gate_passed"]},
        "passed": verdict["exit_code"] == 0,
        "exit_code": verdict["exit_code"],
        "failures": verdict["failures"],
        "timings_s": {k: round(v, 3) for k, v in record.timings.items()},
        # each training step's epochs: loss, lr, val metric, the kept (best) epoch
        "history": [entry.as_dict() for entry in record.histories],
        "versions": package_versions(),
    }
    session.task.add_report_keys(report, session)
    report.update(record.notes)   # user_loop (cz.prepare runs), sweep (what a sweep resumes by)
    report.update(training_totals(report))
    report["failed_formats"] = record.failed_formats
    for section in record.sections:
        report[section.key] = section.report(artifacts)
    return report


def training_totals(report: dict[str, Any]) -> dict[str, Any]:
    """`training_peak_rss_bytes` / `training_seconds` when the run trained: the largest peak and
    the summed seconds of every training it recorded (`training`, an LM's `distillation` and
    `pruning.training`), so runs compare without knowing which step trained."""
    facts = [f for f in (report.get("training"), report.get("distillation"),
                         (report.get("pruning") or {}).get("training"))
             if isinstance(f, dict) and f.get("seconds") is not None]
    if not facts:
        return {}
    return {"training_peak_rss_bytes": max(f.get("peak_rss_bytes") or 0 for f in facts),
            "training_seconds": round(sum(f["seconds"] for f in facts), 2)}


def write_report(report: dict[str, Any], folder: Path) -> None:
    """report.json, report.md and report.html into `folder` (the caller's staging folder, which
    is published whole; report.html reads the artifacts beside it for its tensor chart)."""
    from compressor.report.html.report_page import render_html

    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(render_markdown(report))
    (folder / "report.html").write_text(render_html(report, folder))

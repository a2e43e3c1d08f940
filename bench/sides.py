"""The two sides of every comparison: our toolkit (the `compress` CLI) and the hand-written
baseline scripts in bench/baselines/. Each run is a fresh process, measured whole.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from bench.measure import (
    REPO,
    ProcessRun,
    compress_cmd,
    error_line,
    python_cmd,
    run_process,
)

BUILD = REPO / "build" / "bench"
MODELS = BUILD / "models"
ARTIFACTS = BUILD / "artifacts"
BENCH_RECIPES = Path(__file__).resolve().parent / "recipes"
BASELINE_SCRIPTS = {"keras": REPO / "bench" / "baselines" / "keras_tflite.py",
                    "torch": REPO / "bench" / "baselines" / "torch_onnx.py"}
BASELINE_FORMAT = {"keras": "tflite", "torch": "onnx"}
# exit codes of `compress` after which the artifacts exist: passed, gate failed, over budget
PRODUCED = (0, 3, 4)


@dataclass
class SideRun:
    """One process of one side: what it made (format or recipe -> path) and what it cost."""

    side: str                            # "toolkit" | "baseline"
    process: ProcessRun
    artifacts: dict[str, str] = field(default_factory=dict)
    report: dict | None = None
    error: str | None = None

    def summary(self) -> dict:
        data = {"side": self.side, "process": self.process.summary(), "artifacts": self.artifacts}
        if self.error:
            data["error"] = self.error
        if self.report and "printed" in self.report:
            data["printed"] = self.report["printed"]
        elif self.report:
            data["exit_code"] = self.report.get("exit_code")
            data["timings_s"] = self.report.get("timings_s")
            data["report_artifacts"] = [
                {k: a.get(k) for k in ("format", "size_bytes", "gzip_bytes", "metric_value",
                                       "sparsity", "weight_dtypes", "latency_ms_p50")}
                for a in self.report.get("artifacts", [])]
        return data


def recipe_ref(recipe: str) -> str:
    """Built-in recipe names pass through; `fp32` (no steps: plain export) is bench/recipes/fp32.yaml."""
    local = BENCH_RECIPES / f"{recipe}.yaml"
    return str(local) if local.exists() else recipe


def model_args(framework: str, entry: dict, torch_form: str = "pt2") -> list[str]:
    """How `compress` gets the model: a .keras file, a .pt2 file, or module:function + --weights."""
    if framework == "torch" and torch_form == "function":
        return [entry["function"], "--weights", entry["weights"]]
    return [entry["model"]]


def run_toolkit(framework: str, entry: dict, recipe: str, data: str, out: Path,
                formats: str | None = None, torch_form: str = "pt2", timeout: float = 900) -> SideRun:
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    args = [*model_args(framework, entry, torch_form), "--recipe", recipe_ref(recipe),
            "--data", data, "--out", str(out), "--quiet"]
    if formats:
        args += ["--format", formats]
    proc = run_process(compress_cmd(*args), timeout=timeout)
    run = SideRun("toolkit", proc)
    report_path = out / "report.json"
    if proc.returncode in PRODUCED and report_path.exists():
        run.report = json.loads(report_path.read_text())
        run.artifacts = {a["format"]: str(out / a["path"]) for a in run.report.get("artifacts", [])}
    if not run.artifacts:
        run.error = (f"compress exited {proc.returncode}"
                     f"{' (timed out)' if proc.timed_out else ''}: {error_line(proc.stderr_tail)}")
    return run


def run_baseline(framework: str, entry: dict, recipes: list[str], data: str, out: Path,
                 evaluate: bool = False, timeout: float = 900) -> SideRun:
    """One baseline process making every recipe in `recipes`; artifacts keyed by recipe."""
    shutil.rmtree(out, ignore_errors=True)
    args = [BASELINE_SCRIPTS[framework], entry["model"], "--recipe", ",".join(recipes),
            "--data", data, "--out", str(out)]
    if evaluate:
        args.append("--evaluate")
    proc = run_process(python_cmd(*args), timeout=timeout)
    run = SideRun("baseline", proc)
    if proc.ok:
        try:
            printed = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            printed = None
        if isinstance(printed, dict):
            run.artifacts = {r: v["artifact"] for r, v in printed.items() if "artifact" in v}
            run.report = {"printed": printed}
    if not run.artifacts:
        run.error = (f"baseline exited {proc.returncode}"
                     f"{' (timed out)' if proc.timed_out else ''}: {error_line(proc.stderr_tail)}")
    return run


def probe(command: str, paths: list[str], *options: str,
          timeout: float = 600) -> tuple[dict | list | None, str | None]:
    """Run bench.probe in a child process; (parsed JSON, error)."""
    if not paths:
        return None, "no artifacts to probe"
    proc = run_process(python_cmd("-m", "bench.probe", command, *options, *paths), timeout=timeout)
    if not proc.ok:
        return None, f"probe {command} exited {proc.returncode}: {error_line(proc.stderr_tail)}"
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), None
    except (ValueError, IndexError):
        return None, f"probe {command} printed no JSON: {proc.stdout[-300:]}"

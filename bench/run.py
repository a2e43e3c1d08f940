"""`make bench`: the toolkit vs hand-written baselines, as ratios, in one run.

    python -m bench.run                      # everything -> bench/results.json + bench/RESULTS.md
    python -m bench.run --only size,speed    # a subset -> build/bench/results-size-speed.{json,md}
    python -m bench.run --quick              # fewer repeats and rounds (development)
    python -m bench.run --only sweep --into bench/results.json   # re-measure one case in place

Cases (bench/cases.py, one bench/case_*.py module each): size (+ accuracy), speed, overhead,
scaling, zoo (int8 vs fp32 vs vendor int8), channels, transformer (BERT int8 vs fp32 vs
onnxruntime quantize_dynamic), sweep, kd_gain and pretrained_drop (issue 15: distillation's gain,
default recipes on trained ResNet / MobileNetV2-style nets). Every case is independent: one that
fails is recorded in the results as an error, and the others still run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench import report_md
from bench.case import RunContext
from bench.cases import BY_NAME, NAMES
from bench.measure import REPO, error_line, python_cmd, run_process
from bench.sides import BUILD, MODELS
from bench.targets import judge

JSON_INDENT = 2   # as bench/results.json is committed: a merged case changes only its lines

FRAMEWORKS = ("keras", "torch")   # bench/prepare.py's, in the order they are prepared


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def prepare_models(frameworks: list[str]) -> tuple[dict, list[str]]:
    """Build and save the models (cached in build/bench/models) in one process per framework."""
    models, errors = {}, []
    for framework in frameworks:
        log(f"preparing {framework} models in {MODELS}")
        proc = run_process(python_cmd("-m", "bench.prepare", framework, MODELS), timeout=1200)
        try:
            models[framework] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            errors.append(f"prepare {framework} exited {proc.returncode}: {error_line(proc.stderr_tail)}")
    return models, errors


INT8_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_facts() -> dict:
    """CPU model and the SIMD flags that decide int8 speed (VNNI: int8 dot products)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor() or "unknown", "simd_flags": []}
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("model name")), "unknown")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    return {"model": model, "simd_flags": [f for f in INT8_FLAGS if f in flags]}


def git_commit() -> str:
    """HEAD of the checkout; BENCH_COMMIT when the bench runs from an exported snapshot."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def merge_into(path: Path, measured: dict) -> int:
    """Put the cases just measured into an existing results file (each with this run's facts
    as its `run`: when, which commit, the load), then recompute its targets and Markdown."""
    results = json.loads(path.read_text())
    run = {key: measured["meta"].get(key) for key in
           ("started", "commit", "cpus", "loadavg_start", "loadavg_end", "wall_s")}
    for name, case in measured["cases"].items():
        results["cases"][name] = {**case, "run": run}
    path.write_text(json.dumps(results, indent=JSON_INDENT, default=str) + "\n")
    return render_again(path)


def render_again(path: Path) -> int:
    """Recompute the derived numbers and the Markdown of an existing results file (no measuring)."""
    results = json.loads(path.read_text())
    results["meta"]["rendered_commit"] = git_commit()
    judge(results)
    path.write_text(json.dumps(results, indent=JSON_INDENT, default=str) + "\n")
    md = path.with_name("RESULTS.md") if path.name == "results.json" else path.with_suffix(".md")
    md.write_text(report_md.render(results))
    log(f"re-rendered {path} and {md}")
    return 0


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the cases to run (all, or --only's, checked against bench/cases.py)."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated cases: {','.join(NAMES)}")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (development)")
    parser.add_argument("--torch-form", choices=["pt2", "function"], default="pt2",
                        help="how compress gets the PyTorch nets: .pt2 file or module:function + --weights")
    parser.add_argument("--out", type=Path, help="results .json path (RESULTS.md goes beside it)")
    parser.add_argument("--into", type=Path, metavar="RESULTS_JSON",
                        help="merge the measured cases into this results file (e.g. "
                             "bench/results.json) and re-render it")
    parser.add_argument("--render", type=Path, metavar="RESULTS_JSON",
                        help="only recompute targets and the Markdown of an existing results file")
    args = parser.parse_args(argv)
    cases = args.only.split(",") if args.only else list(NAMES)
    unknown = [c for c in cases if c not in NAMES]
    if unknown and not args.render:
        parser.error(f"unknown case(s) {unknown}; choose from {NAMES}")
    return args, cases


def main(argv: list[str] | None = None) -> int:
    args, cases = parse_args(argv)
    if args.render:
        return render_again(args.render)
    full = cases == list(NAMES) and not args.quick
    out = args.out or (REPO / "bench" / "results.json" if full
                       else BUILD / f"results-{'-'.join(cases)}{'-quick' if args.quick else ''}.json")

    started = time.perf_counter()
    results = {"meta": {"started": datetime.now(UTC).isoformat(timespec="seconds"),
                        "cases": cases, "quick": args.quick, "torch_form": args.torch_form,
                        "cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                        "machine": platform.machine(), "cpu": cpu_facts(), "commit": git_commit(),
                        "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
               "cases": {}}
    # Only the cases that declare uses_models share the prepared nets; the others build their own.
    frameworks = [fw for fw in FRAMEWORKS if any(fw in BY_NAME[name].uses_models for name in cases)]
    prepare_started = time.perf_counter()
    models, errors = prepare_models(frameworks)
    results["meta"]["prepare_s"] = round(time.perf_counter() - prepare_started, 1)
    results["models"] = models
    results["prepare_errors"] = errors
    context = RunContext(models=models, results=results, log=log, quick=args.quick,
                         torch_form=args.torch_form)
    for name in cases:
        case_started = time.perf_counter()
        try:
            results["cases"][name] = BY_NAME[name].run(context)
        except Exception as exc:  # noqa: BLE001  a broken case is recorded; the others still run
            results["cases"][name] = {"errors": [f"case {name} crashed: {type(exc).__name__}: {exc}"],
                                      "traceback": traceback.format_exc()[-3000:]}
        results["cases"][name]["wall_s"] = round(time.perf_counter() - case_started, 1)
        log(f"{name} done in {results['cases'][name]['wall_s']} s "
            f"({len(results['cases'][name].get('errors', []))} error(s))")
    judge(results)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    results["meta"]["children_cpu_s"] = round(children.ru_utime + children.ru_stime, 1)
    results["meta"]["wall_s"] = round(time.perf_counter() - started, 1)
    results["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=JSON_INDENT, default=str) + "\n")
    md = out.with_name("RESULTS.md") if full else out.with_suffix(".md")
    md.write_text(report_md.render(results))
    met = sum(t["met"] for t in results["targets"].values())
    log(f"wrote {out} and {md}: {met}/{len(results['targets'])} targets met, "
        f"{results['meta']['wall_s']} s")
    return merge_into(args.into, results) if args.into else 0


if __name__ == "__main__":
    sys.exit(main())

"""What the training cases (llm_train, cnn_bf16) share: a `compress` command run and the row of
its report.json they read, bench recipes checked against the built-ins they copy, and the
bf16 / fp32 training-peak ratios and table cells read from those rows."""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from bench.measure import compress_cmd, error_line, ratio, run_process
from bench.sides import BENCH_RECIPES, PRODUCED

TIMEOUT = 3 * 3600
ARTIFACT_KEYS = ("perplexity", "perplexity_increase", "metric_value", "size_bytes", "params",
                 "decode_tokens_per_s", "prefill_ms", "peak_rss_bytes", "latency_ms_p50")
TRAINING_KEYS = ("seconds", "tokens_per_s", "peak_rss_bytes", "peak_rss_increase_bytes",
                 "peak_heap_increase_bytes",
                 "precision", "steps", "tokens", "batch_windows", "loss_first", "loss_last")
TRAINING_COLUMNS = ["training precision", "steps", "training s", "training tok/s",
                    "training peak RSS B", "training peak RSS increase B",
                    "training peak heap increase B"]


def compress_row(runs: list, errors: list, what: str, model: str, recipe: str, data: str,
                 out: Path, formats: str | None) -> dict | None:
    """`compress --recipe RECIPE MODEL --data DATA --out OUT --threads 1 --force [--format F]`
    (latency on): the row of its report.json a case reads, and what the whole command cost
    (a gate that failed, exit 3, still wrote a report). `what` names the run in `runs` and
    in `errors` (prefixed with the case)."""
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = [round(x, 2) for x in os.getloadavg()]
    args = ["--recipe", recipe, model, "--data", data, "--out", out, "--threads", "1", "--force"]
    proc = run_process(compress_cmd(*args, *(("--format", formats) if formats else ())),
                       timeout=TIMEOUT)
    runs.append({"what": what, "process": proc.summary()})
    report = out / "report.json"
    if proc.returncode not in PRODUCED or not report.exists():
        errors.append(f"{what}: compress exited {proc.returncode}"
                      f"{' (timed out)' if proc.timed_out else ''}: {error_line(proc.stderr_tail)}")
        return None
    data_ = json.loads(report.read_text())
    pruning = data_.get("pruning")
    distillation = data_.get("distillation")
    training = data_.get("training") or distillation or (pruning or {}).get("training")
    return {
        "recipe": Path(recipe).stem, "formats": formats, "exit_code": proc.returncode,
        "wall_s": round(proc.wall_s, 1), "cpu_s": round(proc.cpu_s, 1),
        "process_peak_rss_bytes": int(proc.peak_rss_mb * 2**20),
        "compress_peak_rss_bytes": data_.get("compress_peak_rss_bytes"),
        "loadavg_at_start": load, "timings_s": data_.get("timings_s"),
        "baseline": {k: data_.get("baseline", {}).get(k) for k in ("metric", "value", "params",
                                                                   "size_bytes")},
        "params": (pruning or {}).get("params_after") or data_.get("baseline", {}).get("params"),
        "params_before": (pruning or {}).get("params_before")
        or data_.get("baseline", {}).get("params"),
        "pruning": {k: v for k, v in (pruning or {}).items() if k != "training"} or None,
        "training": _training(training),
        "training_of": ("quantize" if data_.get("training") else "distill" if distillation
                        else "prune" if training else None),
        "failed_formats": data_.get("failed_formats") or None,
        "artifacts": {art["format"]: {k: art.get(k) for k in ARTIFACT_KEYS}
                      for art in data_.get("artifacts", [])},
    }


def _training(facts: dict | None) -> dict | None:
    return {k: facts.get(k) for k in TRAINING_KEYS} if isinstance(facts, dict) else None


def as_copied(name: str, original: dict) -> dict:
    """What bench recipe `name` should be, from its built-in `original`: the same steps,
    validation and target, with `precision: bf16` on every step when the name ends in
    `_bf16`."""
    steps = original.get("steps") or []
    if name.endswith("_bf16"):
        steps = [{**step, "precision": "bf16"} for step in steps]
    return {"steps": steps, "validate": original.get("validate"), "target": original.get("target")}


def check_copies(case: str, copies: dict[str, str], errors: list,
                 expected: Callable[[str, dict], dict] = as_copied) -> dict:
    """Each bench recipe (bench/recipes/NAME.yaml) against the built-in it copies, both as
    `compress recipes show` resolves them (a built-in's defaults may move after the copy was
    written); an error names the keys that drifted."""
    checked = {}
    for name, original in copies.items():
        ours, theirs = _shown(str(BENCH_RECIPES / f"{name}.yaml")), _shown(original)
        wanted = expected(name, theirs)
        drift = [key for key in wanted if ours.get(key) != wanted[key]]
        checked[name] = {"copies": original, "drift": drift}
        if drift or not ours or not theirs:
            errors.append(f"{case}: bench/recipes/{name}.yaml is no longer {original} with only "
                          f"its change: {drift or 'recipes show failed'} differ")
    return checked


def _shown(recipe: str) -> dict:
    """A recipe as `compress recipes show` resolves it (defaults filled in, `extends` merged)."""
    import yaml

    proc = run_process(compress_cmd("recipes", "show", recipe), timeout=300)
    return yaml.safe_load(proc.stdout) if proc.ok else {}


def arts(rows: dict, label: str) -> dict:
    return (rows.get(label) or {}).get("artifacts") or {}


def _peak_ratio(rows: dict, ours: str, base: str, key: str = "peak_heap_increase_bytes"
                ) -> float | None:
    def peak(label: str):
        return ((rows.get(label) or {}).get("training") or {}).get(key)
    return ratio(peak(ours), peak(base))


def bf16_peaks(rows: dict, ours: str, base: str) -> dict:
    """bf16 / fp32 training peak: the heap increase's ratio, judged; rows recorded before
    report.json had it (peak_heap_increase_bytes) give the RSS increase's, and say so."""
    heap = _peak_ratio(rows, ours, base)
    rss = _peak_ratio(rows, ours, base, "peak_rss_increase_bytes")
    if heap is not None:
        judged, measure = heap, "heap"
    else:
        judged, measure = rss, "RSS (rows before the heap was recorded)" if rss is not None else None
    return {"bf16_peak_ratio": judged, "bf16_peak_rss_ratio": rss, "bf16_peak_measure": measure}


def training_cells(row: dict) -> list:
    """A row's report.json `training`, as TRAINING_COLUMNS."""
    t = row.get("training") or {}
    return [t.get("precision"), t.get("steps"), t.get("seconds"), one(t.get("tokens_per_s")),
            t.get("peak_rss_bytes"), t.get("peak_rss_increase_bytes"),
            t.get("peak_heap_increase_bytes")]


def one(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def load(row: dict) -> str | None:
    """The 1-minute load average when the command started (2 cores, shared: wall time and
    tokens/s move with it)."""
    loadavg = row.get("loadavg_at_start")
    return None if not loadavg else f"{loadavg[0]:.2f}"


def timings(row: dict) -> str | None:
    steps = row.get("timings_s") or {}
    return " / ".join(f"{k} {round(v)}" for k, v in steps.items()) or None

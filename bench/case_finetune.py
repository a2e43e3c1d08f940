"""Cases 9 and 10 (issue 15): fine-tuning that keeps a pretrained model's accuracy, and
distillation that pays. Each runs bench/finetune_build.py once per framework (a fresh
process: one framework's imports per process).

- kd_gain: int8_prune30_kd vs int8_prune30, mean artifact accuracy over seeds 0-2, for a
  briefly trained quarter-size student (target: gain >= 0.01) and a converged one (recorded).
- pretrained_drop: ResNet- and MobileNetV2-style digits nets trained to high accuracy, default
  int8_prune30 and int8_qat with seeds 0-2 (target: mean drop over the seeds <= 0.01 on every
  net, recipe and framework).
"""
from __future__ import annotations

import json

from bench.case import Case, RunContext, case_results, no_reason, target
from bench.markdown import table
from bench.measure import error_line, python_cmd, run_process

FRAMEWORKS = ("keras", "torch")
KD_GAIN_GOAL, DROP_GOAL = 0.01, 0.01


def _build(case: str, log) -> dict:
    results, errors, runs = {}, [], []
    for framework in FRAMEWORKS:
        log(f"{case}: {framework}")
        proc = run_process(python_cmd("-m", "bench.finetune_build", case, framework), timeout=3600)
        runs.append({"what": f"{case} {framework}", "process": proc.summary()})
        try:
            results[framework] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            errors.append(f"{case} {framework} exited {proc.returncode}: "
                          f"{error_line(proc.stderr_tail)}")
    return {"frameworks": results, "runs": runs, "errors": errors}


def kd_gain_targets(results: dict) -> dict:
    frameworks = case_results(results, "kd_gain").get("frameworks", {})
    gains = {fw: r["summary"]["brief"]["kd_gain"] for fw, r in frameworks.items()}
    converged = {fw: r["summary"]["converged"]["kd_gain"] for fw, r in frameworks.items()}
    worst_gain = min(gains.values()) if gains else None
    return {"kd_gain": target(worst_gain, KD_GAIN_GOAL, ">=", "int8_prune30_kd - int8_prune30, mean "
                              "artifact accuracy over 3 seeds, briefly trained 1/5-size digits student",
                              f"per framework {gains}; converged student {converged}",
                              force_miss=len(gains) < len(FRAMEWORKS))}


def pretrained_drop_targets(results: dict) -> dict:
    rows = [{**row, "framework": fw}
            for fw, r in case_results(results, "pretrained_drop").get("frameworks", {}).items()
            for row in r["rows"]]
    worst = max(rows, key=lambda row: row["drop"]) if rows else None
    return {"pretrained_drop": target(
        worst and worst["drop"], DROP_GOAL, "<=", "trained accuracy - artifact accuracy, mean "
        "over seeds 0-2, default int8_prune30 / int8_qat, ResNet- and MobileNetV2-style digits "
        "nets", f"worst: {worst['net']}/{worst['framework']} {worst['recipe']} (per seed "
        f"{[s['drop'] for s in worst.get('seeds', [])]})" if worst else "not measured",
        force_miss=len(rows) < 2 * 2 * len(FRAMEWORKS))}


def kd_gain_section(kd: dict, results: dict) -> list[str]:
    rows = [[fw, scenario, s["student"], s["int8_prune30"], s["int8_prune30_kd"], s["kd_gain"]]
            for fw, r in kd.get("frameworks", {}).items() for scenario, s in r["summary"].items()]
    return (["## 9. Distillation gain (int8_prune30_kd vs int8_prune30)", "",
             "Digits teacher CNN (~38k parameters), student ~7.7k trained 1 epoch (brief) or 20 "
             "(converged) from scratch; mean val accuracy of the exported artifact over seeds "
             "0-2 (Keras tflite, PyTorch onnx).", ""]
            + table(["framework", "student", "student acc", "int8_prune30", "int8_prune30_kd",
                     "gain"], rows) + [""])


def pretrained_drop_section(drop: dict, results: dict) -> list[str]:
    rows = [[r["net"], fw, r["recipe"], r["trained"], r["artifact"], r["drop"],
             " / ".join(str(s["drop"]) for s in r.get("seeds", [])), _passed(r)]
            for fw, result in drop.get("frameworks", {}).items() for r in result["rows"]]
    return (["## 10. Pretrained models through the default recipes", "",
             "ResNet- / MobileNetV2-style digits nets (bench/finetune_build.py) trained to high "
             "accuracy once, then each recipe run with seeds 0-2; drop = trained float accuracy - "
             "artifact accuracy (450 val images: one image is 0.22 pt), artifact and drop are "
             "means over the seeds.", ""]
            + table(["net", "framework", "recipe", "trained", "artifact", "drop", "drop per seed",
                     "gate passed"], rows) + [""])


def _passed(row: dict) -> str:
    """Seeds whose run passed its gate (a row measured before seeds: its one run)."""
    if "seeds" not in row:
        return str(row["passed"])
    return f"{row['passed']}/{len(row['seeds'])}"


def _run_kd_gain(ctx: RunContext) -> dict:
    return _build("kd_gain", ctx.log)


def _run_pretrained_drop(ctx: RunContext) -> dict:
    return _build("pretrained_drop", ctx.log)


KD_GAIN = Case(name="kd_gain", run=_run_kd_gain, targets=kd_gain_targets, why_missed=no_reason,
               section=kd_gain_section)
PRETRAINED_DROP = Case(name="pretrained_drop", run=_run_pretrained_drop,
                       targets=pretrained_drop_targets, why_missed=no_reason,
                       section=pretrained_drop_section)

"""The issue's targets, judged from the measured results: each registered case (bench/cases.py)
computes its own and says why one it owns was missed. Recomputed on every run and --render.
"""
from __future__ import annotations

from bench.cases import CASES, in_targets_order


def judge(results: dict) -> None:
    """Refresh derived numbers, then results["targets"]: value, goal, met, and `why` if missed."""
    for case in CASES:
        measured = results["cases"].get(case.name)
        if case.derive and measured:
            case.derive(measured)
    results["targets"] = compute(results)


def compute(results: dict) -> dict:
    targets = {}
    for case in in_targets_order():
        for name, target in case.targets(results).items():
            if not target["met"]:
                target["why"] = case.why_missed(name, target, results)
            targets[name] = target
    return targets

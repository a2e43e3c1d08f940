"""What a bench case declares (`Case`), what its run gets (`RunContext`), and the record
every target is (`target`). Imports nothing from bench: every case module imports this one.

A target whose measurement is missing (a case failed or was not run) is not met, and says why.
Where a target covers several artifacts, its value is the worst of them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RunContext:
    """What `python -m bench.run` hands each case's run."""

    models: dict                    # the shared prepared models: framework -> net -> entry
    results: dict                   # everything measured so far (speed reuses size's artifacts)
    log: Callable[[str], None]
    quick: bool = False             # --quick: fewer repeats and rounds
    torch_form: str = "pt2"         # --torch-form

    def timing(self, quick_runs: int = 50, rounds: int = 5, runs: int = 100) -> dict:
        """Latency rounds and runs per round (a case's own, or 5 of 100), fewer with --quick."""
        return {"rounds": 2 if self.quick else rounds,
                "runs_per_round": quick_runs if self.quick else runs}


@dataclass(frozen=True)
class Case:
    """One bench case: how it measures, which targets it judges, how it reads in RESULTS.md.

    run(ctx) -> the case's results (results.json's cases[name]); targets(results) -> {target
    name: target(...)}; why_missed(target name, target, results) -> the reason a missed target
    was missed, from the numbers; section(case's results, results) -> its Markdown lines.
    """

    name: str                                       # results.json's cases key, what --only takes
    run: Callable[[RunContext], dict]
    targets: Callable[[dict], dict]
    why_missed: Callable[[str, dict, dict], str]
    section: Callable[[dict, dict], list[str]]
    uses_models: tuple[str, ...] = ()               # frameworks of bench/prepare.py's models it needs
    derive: Callable[[dict], None] | None = None    # recomputes derived numbers in place (also on --render)


def no_targets(results: dict) -> dict:
    return {}


def no_reason(name: str, target: dict, results: dict) -> str:
    return ""


def case_results(results: dict, name: str) -> dict:
    """A case's results, {} when it was not run."""
    return results.get("cases", {}).get(name) or {}


def not_measured(results: dict, name: str) -> str:
    """Why a target of case `name` has no value: the case's first error, or that it did not run."""
    errors = case_results(results, name).get("errors", [])
    return "not measured" + (f": {errors[0][:300]}" if errors else " (case not run)")


def target(value, goal: float, op: str, what: str, note: str, force_miss: bool = False) -> dict:
    met = value is not None and not force_miss and (value <= goal if op == "<=" else value >= goal)
    return {"value": value, "goal": f"{op} {goal}", "met": bool(met), "what": what, "note": note}

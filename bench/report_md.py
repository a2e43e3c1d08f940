"""bench/RESULTS.md from the results dict: a summary, the targets, then each case's section
(from its module, in bench/cases.py's order), then every case's errors."""
from __future__ import annotations

from bench.cases import CASES
from bench.markdown import fmt, table


def targets_section(results: dict) -> list[str]:
    rows = []
    for name, t in results.get("targets", {}).items():
        reason = "" if t["met"] else t.get("why", "")   # bench.targets.judge sets it on every miss
        rows.append([f"`{name}`", t["what"], t["value"], t["goal"], t["met"],
                     t["note"] + (f". **Why missed:** {reason}" if reason else "")])
    return ["## Targets", ""] + table(["target", "what", "value", "goal", "met", "notes"], rows)


def render(results: dict) -> str:
    meta = results.get("meta", {})
    cpu = meta.get("cpu", {})
    summary = (f"`make bench` (`python -m bench.run`) on {meta.get('cpus')} CPU(s) "
               f"({cpu.get('model', '?')}), {meta.get('started')}; total "
               f"{fmt(meta.get('wall_s'), 0)} s (of which {fmt(meta.get('prepare_s'), 0)} s building "
               f"the models, cached in build/bench/models); {fmt(meta.get('children_cpu_s'), 0)} CPU-seconds "
               f"in child processes; load average at start {meta.get('loadavg_start')}, "
               f"at end {meta.get('loadavg_end')} (other people's jobs share this machine). Commit "
               f"{meta.get('commit')}"
               + (f" (targets recomputed at {meta['rendered_commit']})" if meta.get("rendered_commit") else "")
               + ". Every number is in `bench/results.json`; ratios are the point.")
    lines = ["# compressor benchmark", "", summary, ""]
    lines += targets_section(results)
    cases = results.get("cases", {})
    for case in CASES:
        if case.name in cases:
            lines += case.section(cases[case.name], results)
    errors = [e for case in cases.values() for e in case.get("errors", [])]
    lines += ["## Errors", ""] + ([f"- {e}" for e in errors] or ["none"]) + [""]
    return "\n".join(lines)

"""The bench's shape, read from its source and its committed results: no import cycles, one
module per case, every case registered in bench/cases.py, and targets / RESULTS.md that the
code reproduces from bench/results.json. Fast: no framework imports, nothing measured."""
from __future__ import annotations

import ast
import copy
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report_md
from bench.case import Case
from bench.cases import CASES, NAMES
from bench.run import parse_args
from bench.targets import judge

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
# What the bench's parent process may never import: cases run frameworks in fresh processes.
FRAMEWORKS = ("numpy", "tensorflow", "tf_keras", "torch", "onnx", "onnxruntime", "compressor")
# What a case module may import from bench: shared helpers only, never another case, the
# registry or what reads it (that was the targets.py <-> case_*.py cycle).
NOT_FOR_CASES = ("bench.cases", "bench.targets", "bench.report_md", "bench.run")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(BENCH.rglob("*.py"))}


def _imported(path: Path, name: str) -> set[str]:
    """Every module the file imports, function bodies included, relative imports resolved;
    `from bench import x` counts as importing bench.x."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def import_graph() -> dict[str, set[str]]:
    """bench module -> the bench modules it imports."""
    modules = _modules()
    return {name: {m for m in _imported(path, name) if m in modules} - {name}
            for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}   # "open" while on the DFS stack, "done" after
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


# (a) imports


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_bench():
    graph = import_graph()
    assert "bench.run" in graph and graph["bench.cases"], "the bench's modules were not found"
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_case_modules_import_only_shared_helpers():
    graph = import_graph()
    for name in (n for n in graph if n.startswith("bench.case_")):
        wrong = {m for m in graph[name] if m.startswith("bench.case_") or m in NOT_FOR_CASES}
        assert not wrong, f"{name} imports {sorted(wrong)}"


def test_the_bench_parent_process_imports_no_framework():
    code = ("import sys, bench.run; "
            f"print([m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out


# (b) the registry


def test_every_registered_case_declares_its_parts():
    for case in CASES:
        assert isinstance(case, Case), case
        for part in ("run", "targets", "why_missed", "section"):
            assert callable(getattr(case, part)), f"{case.name}.{part}"


def test_case_names_are_unique_and_what_only_accepts():
    assert len(set(NAMES)) == len(NAMES) == len(CASES)
    assert parse_args([])[1] == list(NAMES)
    assert parse_args(["--only", ",".join(NAMES)])[1] == list(NAMES)
    for name in NAMES:
        assert parse_args(["--only", name])[1] == [name]
    with pytest.raises(SystemExit):
        parse_args(["--only", "no_such_case"])


def test_every_case_module_is_registered():
    for path in sorted(BENCH.glob("case_*.py")):
        module = importlib.import_module(f"bench.{path.stem}")
        exported = [v for v in vars(module).values() if isinstance(v, Case)]
        assert exported, f"{path.name} exports no Case"
        missing = [case.name for case in exported if case not in CASES]
        assert not missing, f"{path.name}: {missing} not in bench/cases.py's CASES"


def test_cases_without_measurements_miss_their_targets_and_still_render():
    """A case that crashed is stored as its errors only: its targets are missed, with a reason,
    and its section and the whole report still render."""
    crashed = {"errors": ["case crashed: RuntimeError: boom"], "wall_s": 1.0}
    results = {"meta": {}, "cases": {case.name: dict(crashed) for case in CASES}}
    judge(results)
    assert results["targets"]
    for name, target in results["targets"].items():
        assert target["met"] is False and target["value"] is None, name
        assert isinstance(target["why"], str), name
    for case in CASES:
        assert all(isinstance(line, str) for line in case.section(crashed, results)), case.name
    assert "boom" in report_md.render(results)


# (c) the committed results


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads((BENCH / "results.json").read_text())


def test_committed_targets_are_what_the_code_computes(committed):
    judged = copy.deepcopy(committed)
    judge(judged)
    assert list(judged["targets"]) == list(committed["targets"])
    for name, target in committed["targets"].items():
        assert judged["targets"][name] == target, name


def test_committed_results_md_is_what_render_writes(committed):
    """bench/RESULTS.md is `python -m bench.run --render bench/results.json`'s output."""
    judged = copy.deepcopy(committed)
    judge(judged)
    assert report_md.render(judged) == (BENCH / "RESULTS.md").read_text()

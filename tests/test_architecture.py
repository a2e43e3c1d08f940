"""The package's shape, read from its source: import directions without cycles, a small
Backend protocol, small modules, and framework imports only where they belong (docs/architecture.md)."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "compressor"
FRAMEWORKS = {"tensorflow", "tf_keras", "tensorflow_model_optimization", "torch", "torchao",
              "onnx", "onnxruntime", "ai_edge_litert", "tf2onnx", "keras", "litert_torch",
              "onnxconverter_common", "onnxscript", "tflite_runtime"}
MAX_LINES = 300
MAX_BACKEND_METHODS = 10


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, name: str) -> list[tuple[str, bool]]:
    """(imported module, at module level) for every import in the file, TYPE_CHECKING blocks
    and function bodies included; relative imports resolved against `name`."""
    tree = ast.parse(path.read_text())
    found = []
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.append((base, id(node) in top_level))
            # `from compressor.x import y` may import the submodule compressor.x.y
            found += [(f"{base}.{alias.name}", id(node) in top_level) for alias in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    """compressor module -> the compressor modules it imports (any place in the file)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = {target for target, _ in _imports(path, name) if target in modules}
        graph[name] = edges - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    # A package's __init__ importing its own submodules is not a cycle of concern, but every
    # other edge counts, TYPE_CHECKING imports included.
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


STEP_CONFIG_IMPORTS = ("compressor.errors", "compressor.schemes", "compressor.config.scheme_steps")


@pytest.mark.parametrize("source, forbidden", [
    ("compressor.export", "compressor.backends"),
    ("compressor.runtimes", "compressor.backends"),
    ("compressor.runtimes", "compressor.export"),
    ("compressor.backends", "compressor.run.pipeline"),
    ("compressor.backends", "compressor.passes"),
    ("compressor.config.steps", "compressor."),
])
def test_import_directions(source, forbidden):
    """runtimes and export never reach into backends; runtimes never into export; backends
    never up into the pipeline or passes; step configs import nothing of ours but errors and
    the schemes (a quantize step is its scheme's typed model)."""
    bad = [f"{module} -> {target}" for module, targets in import_graph().items()
           if _package_of(module) == source or module == source
           for target in targets
           if target.startswith(forbidden) and not target.startswith(STEP_CONFIG_IMPORTS)
           and not target.startswith(source)]
    assert bad == []


def test_framework_imports_stay_in_backends_export_and_runtimes():
    """Elsewhere a framework would load with `import compressor` (lean-import tests run it)."""
    allowed = ("compressor.backends", "compressor.export", "compressor.runtimes")
    bad = [f"{name}: {target}" for name, path in _modules().items()
           if not name.startswith(allowed)
           for target, _ in _imports(path, name) if target.split(".")[0] in FRAMEWORKS]
    assert bad == []


def test_no_module_is_over_300_lines():
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_backend_protocol_is_small_and_documented():
    from compressor.backends.base import Backend, UserLoopBackend

    for protocol, limit in ((Backend, MAX_BACKEND_METHODS), (UserLoopBackend, 2)):
        methods = {name: member for name, member in vars(protocol).items()
                   if inspect.isfunction(member) and not name.startswith("_")}
        assert 0 < len(methods) <= limit, sorted(methods)
        undocumented = [name for name, member in methods.items() if not inspect.getdoc(member)]
        assert undocumented == [], f"{protocol.__name__} methods without a docstring"


def test_each_backend_implements_the_protocols():
    from compressor.backends.base import Backend, UserLoopBackend
    from compressor.backends.keras import KerasBackend
    from compressor.backends.torch import TorchBackend

    for protocol in (Backend, UserLoopBackend):
        methods = [name for name, member in vars(protocol).items()
                   if inspect.isfunction(member) and not name.startswith("_")]
        for backend in (KerasBackend, TorchBackend):
            missing = [name for name in methods if not callable(getattr(backend, name, None))]
            assert missing == [], f"{backend.__name__} lacks {missing}"


def test_every_step_config_has_a_registered_pass():
    import compressor.passes  # noqa: F401
    from compressor.passes.registry import registered_passes
    from compressor.config.steps import STEP_CONFIGS, step_kind

    assert sorted(step_kind(cls) for cls in STEP_CONFIGS) == registered_passes()


def test_the_cycle_check_finds_a_cycle():
    """The check above must be able to fail."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# Modules that write artifacts: they read the state's scheme, never the recipe's steps.
EXPORTER_MODULES = ("handlers", "tflite", "onnx", "export", "convert", "mixed")
STEP_READS = {"QuantizeConfig", "PrecisionConfig", "steps", "last"}


def _step_reads(path: Path) -> list[str]:
    """Names in the file that read recipe steps: the step config types, `state.steps`,
    `state.last(...)`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = node.id if isinstance(node, ast.Name) else \
            node.attr if isinstance(node, ast.Attribute) else None
        if name in STEP_READS:
            found.append(f"{path.name}:{node.lineno} {name}")
    return found


def _exporter_files() -> list[Path]:
    backends = [path for path in (PACKAGE / "backends").rglob("*.py")
                if path.stem in EXPORTER_MODULES]
    return sorted(backends + list((PACKAGE / "export").glob("*.py")))


def test_no_exporter_reads_recipe_steps():
    files = _exporter_files()
    assert len(files) >= 12, files   # handlers of four model kinds, their converters, export/
    assert [read for path in files for read in _step_reads(path)] == []


def test_the_step_read_check_finds_one(tmp_path):
    path = tmp_path / "tflite.py"
    path.write_text("def f(state):\n    return state.last(QuantizeConfig)\n")
    assert _step_reads(path) == ["tflite.py:2 last", "tflite.py:2 QuantizeConfig"]


def _is_no_op(function: ast.FunctionDef) -> bool:
    """A body (docstring aside) that only passes, or returns None, a constant or an argument."""
    body = [node for node in function.body
            if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    if not body:
        return True
    if len(body) != 1:
        return False
    node = body[0]
    arguments = {arg.arg for arg in function.args.args}
    return isinstance(node, ast.Pass) or (isinstance(node, ast.Return) and (
        node.value is None or isinstance(node.value, (ast.Constant, ast.List, ast.Tuple))
        and not getattr(node.value, "elts", None)
        or isinstance(node.value, ast.Name) and node.value.id in arguments))


def _backend_methods() -> dict[str, list[bool]]:
    """Public method name -> for each backend class defining it, whether it is a no-op."""
    classes = {}
    for path in (PACKAGE / "backends").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Backend") \
                    and path.name != "base.py":
                classes[node.name] = node
    methods: dict[str, list[bool]] = {}
    for cls in classes.values():
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                methods.setdefault(item.name, []).append(_is_no_op(item))
    return methods


def test_no_backend_method_is_a_no_op_in_every_backend():
    methods = _backend_methods()
    assert {"load", "predict", "prune", "distill", "quantizable_layers"} <= set(methods)
    assert [name for name, no_ops in methods.items() if all(no_ops)] == []


def test_the_no_op_check_finds_one():
    source = "def to_precision(self, state, config, ctx):\n    '''doc'''\n    return state\n"
    assert _is_no_op(ast.parse(source).body[0])
    source = "def f(self, state):\n    return []\n"
    assert _is_no_op(ast.parse(source).body[0])
    source = "def f(self, state):\n    return state.replace(model=None)\n"
    assert not _is_no_op(ast.parse(source).body[0])


def test_each_model_kind_has_the_capabilities_it_claims():
    from compressor.backends.base import (Backend, Distilling, LayerSelection, Pruning,
                                          UserLoopBackend)
    from compressor.backends.keras import KerasBackend
    from compressor.backends.onnx import OnnxBackend
    from compressor.backends.torch import TorchBackend

    io = [name for name, member in vars(Backend).items()
          if inspect.isfunction(member) and not name.startswith("_")]
    for backend in (KerasBackend(), TorchBackend(), OnnxBackend()):
        assert [name for name in io if not callable(getattr(backend, name, None))] == []
        assert set(backend.export_formats) <= {"tflite", "onnx"} and backend.export_formats
    for backend in (KerasBackend(), TorchBackend()):
        assert all(isinstance(backend, cap) for cap in (Pruning, Distilling, LayerSelection,
                                                        UserLoopBackend))
    onnx = OnnxBackend()
    assert isinstance(onnx, LayerSelection) and onnx.export_formats == ("onnx",)
    assert not any(isinstance(onnx, cap) for cap in (Pruning, Distilling, UserLoopBackend))


# ------------------------------------------------------------------ the task seam and layering

# Bottom to top: a package imports only packages below it (and itself). The root module
# (compressor/__init__.py) and the loose public modules above everything may import any.
LAYERS = ("compressor.errors", "compressor.registry", "compressor.formats", "compressor.render",
          "compressor.decoders", "compressor.schemes", "compressor.config", "compressor.core", "compressor.runtimes",
          "compressor.devices", "compressor.export", "compressor.backends", "compressor.plan",
          "compressor.tasks", "compressor.passes", "compressor.report", "compressor.run",
          "compressor.cli")
ABOVE_ALL = ("compressor", "compressor.data", "compressor.demo", "compressor.demo_lm")


def _layer_of(module: str) -> str:
    return _package_of(module)


def test_every_package_has_a_layer():
    packages = {_layer_of(name) for name in _modules()}
    assert packages <= set(LAYERS) | set(ABOVE_ALL), sorted(packages - set(LAYERS) - set(ABOVE_ALL))


def test_no_import_runs_upward():
    rank = {name: index for index, name in enumerate(LAYERS)}
    upward = [f"{module} -> {target}" for module, targets in import_graph().items()
              if _layer_of(module) in rank
              for target in targets
              if _layer_of(target) not in rank or rank[_layer_of(target)] > rank[_layer_of(module)]]
    assert upward == []


# What asks "which task is this?" and may: the tasks themselves and the language-model kind's
# own backend (packages); the kind detectors (the model kind names its task), the gate, whose
# bound is chosen by the metric name a recipe's `validate` gives, and the int8 mode, chosen by
# the layer kinds a model describes (a causal-LM head among them) (modules).
TASK_CHECK_PACKAGES = ("compressor.tasks", "compressor.backends.llm")
TASK_CHECK_MODULES = {"compressor.backends", "compressor.backends.kinds",
                      "compressor.backends.model_kinds", "compressor.config.gate",
                      "compressor.core.int8_mode"}
TASK_WORDS = {"perplexity", "llm", "lm", "language_model", "causal_lm"}
TASK_PREDICATES = {"is_causal_lm", "is_lm_outputs", "is_lm_report", "is_language_model",
                   "TextModel"}


def _task_checks(path: Path) -> list[str]:
    """Comparisons with a task's name or metric (`x == "perplexity"`, `"perplexity" in x`,
    `kind == "llm"`) and calls of the predicates that tell a language model apart."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in TASK_WORDS for o in operands):
                found.append(f"{path.name}:{node.lineno} compares with a task word")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in TASK_PREDICATES or (name == "isinstance" and any(
                    isinstance(a, ast.Name) and a.id in TASK_PREDICATES for a in node.args)):
                found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_no_task_check_outside_tasks_and_the_kind_detectors():
    checks = [check for name, path in _modules().items()
              if not name.startswith(TASK_CHECK_PACKAGES) and name not in TASK_CHECK_MODULES
              for check in _task_checks(path)]
    assert checks == []


def test_the_task_check_finds_one(tmp_path):
    path = tmp_path / "report.py"
    path.write_text('def f(report, backend):\n    if "perplexity" in report["baseline"]:\n'
                    '        return 1\n    return isinstance(backend, TextModel)\n')
    assert _task_checks(path) == ["report.py:2 compares with a task word",
                                  "report.py:4 isinstance"]


def test_every_task_is_registered_and_complete():
    from compressor.tasks import registered_tasks, task_named
    from compressor.tasks.base import Task

    methods = [name for name, member in vars(Task).items()
               if inspect.isfunction(member) and not name.startswith("_")]
    methods += ["markdown_lines", "summary", "metric_section"]
    assert registered_tasks() == ["array", "lm"]
    for name in registered_tasks():
        task = task_named(name)
        assert [m for m in methods if not callable(getattr(task, m, None))] == [], name
        assert isinstance(task.sweep_columns, tuple) and isinstance(task.metric_lower_is_better, bool)


# Closed lists the registries replaced: a format, a model kind or a decoder family named in a
# comparison or a literal list outside its registry (and the kind's own package) is a second
# place to edit when one is added.
REGISTERED_NAMES = {
    "formats": ({"tflite", "onnx", ".tflite", ".onnx"},
                ("compressor.formats", "compressor.backends.kinds", "compressor.runtimes.tflite",
                 "compressor.config.recipe")),
    "families": ({"llama", "qwen2", "qwen3", "gemma2", "phi3", "mistral", "gemma", "granite",
                  "olmo2", "smollm3", "qwen3_moe", "mixtral", "gpt2", "gpt_neox"},
                 ("compressor.decoders.families",)),
}


def _named_in_comparisons_or_lists(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        operands = ([node.left, *node.comparators] if isinstance(node, ast.Compare)
                    else [node] if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [])
        for operand in operands:
            items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            named = sorted({i.value for i in items if isinstance(i, ast.Constant) and i.value in names})
            if named and (isinstance(node, ast.Compare) or len(named) > 1):
                found.append(f"{path.name}:{node.lineno} {', '.join(named)}")
    return found


@pytest.mark.parametrize("registry", sorted(REGISTERED_NAMES))
def test_formats_and_families_are_named_only_in_their_registries(registry):
    names, homes = REGISTERED_NAMES[registry]
    found = [hit for module, path in _modules().items() if not module.startswith(homes)
             for hit in _named_in_comparisons_or_lists(path, names)]
    assert found == []

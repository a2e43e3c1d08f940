"""Recipes: a named list of steps, the export formats, the accuracy gate and a target device.

Loaded from a built-in name or a YAML path; `extends: parent` inherits a recipe (the child's
`steps` replace the parent's whole, mappings such as `validate` merge key by key).
"""
from __future__ import annotations

import hashlib
import reprlib
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from compressor.errors import RecipeError, did_you_mean
from compressor.formats import default_formats, format_names
from compressor.config.order import recipe_order_error
from compressor.config.steps import STEP_CONFIGS, ValidateConfig, pass_names, step_kind

# Union over a tuple of config classes; PEP 604 `|` cannot spell that.
Step = Annotated[Union[STEP_CONFIGS], Field(discriminator="kind")]  # type: ignore[valid-type]  # noqa: UP007


def _registered_format(value: Any) -> Any:
    """A name in the format registry (compressor/formats), refused as pydantic refuses a
    Literal, so the message reads the same: "Input should be 'tflite' or 'onnx'"."""
    names = format_names()
    if value not in names:
        quoted = [repr(name) for name in names]
        expected = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        raise PydanticCustomError("literal_error", "Input should be {expected}",
                                  {"expected": expected})
    return value


ExportFormat = Annotated[str, BeforeValidator(_registered_format)]

# Limits that keep a hostile or broken recipe from costing more than a clear error.
MAX_RECIPE_BYTES = 64 * 1024
MAX_VALUES = 5_000       # values after YAML aliases are expanded (an alias bomb is millions)
MAX_NESTING = 32
MAX_EXTENDS = 8
MAX_STEPS = 64
MAX_REF_CHARS = 255
MAX_ERRORS_SHOWN = 5
_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxdict, _repr.maxlevel = 60, 60, 4, 4, 2
_short = _repr.repr


class Recipe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=100)
    description: str = Field("", max_length=2000)
    steps: tuple[Step, ...] = Field((), max_length=MAX_STEPS)
    export: tuple[ExportFormat, ...] = Field(default_factory=default_formats, min_length=1)
    validation: ValidateConfig = Field(default_factory=ValidateConfig, alias="validate")
    target: str | None = None

    @model_validator(mode="after")
    def _steps_fit_together(self) -> Recipe:
        problem = recipe_order_error(self.steps)
        if problem:
            raise ValueError(problem)
        for index, step in enumerate(self.steps):
            if step.kind == "quantize":
                _check_scheme(index, step)
        for step in self.steps:
            if step.kind == "precision" and step.dtype == "bfloat16" and "tflite" in self.export:
                raise ValueError("asks for bfloat16 with tflite export; TFLite cannot store "
                                 "bfloat16 weights: use float16, or export: [onnx]")
        return self

    @property
    def needs_teacher(self) -> bool:
        return any(step.kind == "distill" for step in self.steps)

    @property
    def needs_train_data(self) -> bool:
        """Fine-tuning and ptq calibration both read the training split."""
        return any(getattr(step, "epochs", 0) > 0 or getattr(step, "mode", "") == "ptq"
                   for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        raw = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        # `pass` first in each step: that is how people read and write recipes.
        raw["steps"] = [{"pass": step.pop("pass"), **step} for step in raw["steps"]]
        return raw

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def sha256(self) -> str:
        return hashlib.sha256(self.to_yaml().encode()).hexdigest()


def _check_scheme(index: int, step: Any) -> None:
    """A quantize step's mode and dtype must name a registered scheme (compressor.schemes)."""
    from compressor.schemes import scheme_class

    try:
        scheme_class(step.mode, step.dtype)
    except RecipeError as exc:
        raise ValueError(f"steps.{index}: {exc}") from None


# ---------------------------------------------------------------------------------- loading

def builtin_dir() -> Path:
    packaged = Path(__file__).parent.parent / "recipes"  # a regular install ships them in the package
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "recipes"


def builtin_names() -> list[str]:
    return sorted(p.stem for p in builtin_dir().glob("*.yaml"))


def load_recipe(name_or_path: str | Path | Recipe) -> Recipe:
    """A Recipe from a built-in name, a .yaml path, or a Recipe (returned as is)."""
    if isinstance(name_or_path, Recipe):
        return name_or_path
    raw, source = _resolve_raw(str(name_or_path), seen=())
    return recipe_from_dict(raw, source)


def recipe_from_dict(raw: dict[str, Any], source: str = "recipe") -> Recipe:
    steps = raw.get("steps")
    if isinstance(steps, (list, tuple)) and len(steps) > MAX_STEPS:
        raise RecipeError(f"{source}: {len(steps)} steps; a recipe has at most {MAX_STEPS}")
    try:
        return Recipe.model_validate(raw)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, source)) from None


def _resolve_raw(ref: str, seen: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    if len(seen) > MAX_EXTENDS:
        raise RecipeError(f"{seen[0]}: `extends` chain deeper than {MAX_EXTENDS} recipes; "
                          "inherit from fewer levels")
    path = _locate(ref)
    if str(path) in seen:
        raise RecipeError(f"{path}: `extends` loops back to itself ({' -> '.join(seen)})")
    raw = _read_yaml(path)
    parent_ref = raw.pop("extends", None)
    if parent_ref is not None:
        parent, _ = _resolve_raw(str(parent_ref), seen + (str(path),))
        raw = _merge(parent, raw)
    return raw, str(path)


def _locate(ref: str) -> Path:
    if not ref or len(ref) > MAX_REF_CHARS or "\0" in ref:
        raise RecipeError(f"recipe {_short(ref)} is not a recipe name or path (empty, over "
                          f"{MAX_REF_CHARS} characters, or a NUL byte); see compress recipes list")
    path = Path(ref)
    try:
        exists = path.exists()
    except OSError as exc:
        raise RecipeError(f"recipe path {_short(ref)}: {exc.strerror}") from None
    if path.suffix in (".yaml", ".yml") or exists:
        if not path.is_file():
            raise RecipeError(f"recipe file {ref} does not exist; pass a built-in name "
                              f"({', '.join(builtin_names())}) or a path to a .yaml file")
        return path
    builtin = builtin_dir() / f"{ref}.yaml"
    if not builtin.is_file():
        raise RecipeError(f"unknown recipe {ref!r}{did_you_mean(ref, builtin_names())} "
                          "(compress recipes list)")
    return builtin


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_RECIPE_BYTES:
            raise RecipeError(f"{path}: {path.stat().st_size:,} bytes; a recipe is at most "
                              f"{MAX_RECIPE_BYTES:,} bytes of YAML")
        raw = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise RecipeError(f"{path}: not valid YAML ({first}); fix the file's syntax") from None
    except RecursionError:
        raise RecipeError(f"{path}: nested too deeply; a recipe nests a few levels") from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read it ({exc.strerror})") from None
    _check_size(raw, path)
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe is a YAML mapping with `name` and `steps`")
    raw.setdefault("name", path.stem)
    return raw


def _check_size(raw: Any, path: Path) -> None:
    """Count values as if YAML aliases were expanded (shared objects counted per use, each
    computed once), without expanding them: an alias bomb is refused in microseconds."""
    sizes: dict[int, int] = {}

    def size(value: Any, depth: int) -> int:
        if not isinstance(value, (dict, list)):
            return 1
        if depth > MAX_NESTING:
            raise RecipeError(f"{path}: nested more than {MAX_NESTING} levels (or an alias "
                              "refers to itself); a recipe nests a few levels")
        if id(value) not in sizes:
            children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            total = 1
            for child in children:
                total += size(child, depth + 1)
                if total > MAX_VALUES:
                    break
            sizes[id(value)] = total
        if sizes[id(value)] > MAX_VALUES:
            raise RecipeError(f"{path}: more than {MAX_VALUES:,} values (YAML aliases counted "
                              "expanded); a recipe is a few dozen values")
        return sizes[id(value)]

    size(raw, 0)


def _merge(parent: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; lists (steps, export) and scalars are replaced whole."""
    merged = dict(parent)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(parent.get(key), dict):
            merged[key] = _merge(parent[key], value)
        else:
            merged[key] = value
    return merged


# --------------------------------------------------------------------------- error messages

def format_validation_error(exc: ValidationError, source: str) -> str:
    errors = exc.errors()
    shown = [_describe(err, source) for err in errors[:MAX_ERRORS_SHOWN]]
    if len(errors) > MAX_ERRORS_SHOWN:
        shown.append(f"{source}: and {len(errors) - MAX_ERRORS_SHOWN} more errors")
    return "\n".join(shown)


def _describe(err: dict[str, Any], source: str) -> str:
    loc = _public_loc(err["loc"])
    where = ".".join(str(part)[:40] for part in loc)[:120] or "recipe"
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(err["loc"])
        hint = did_you_mean(str(loc[-1])[:100], allowed)
        return f"{source}: {where}: unknown key{hint} (allowed here: {', '.join(allowed)})"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        got = err.get("input", {}).get("pass") if isinstance(err.get("input"), dict) else None
        hint = did_you_mean(str(got)[:100], pass_names()) if got else ""
        return (f"{source}: {where}.pass = {_short(got)} is not a pass{hint} "
                f"(passes: {', '.join(pass_names())})")
    if kind == "value_error":
        return f"{source}: {where} {err['msg'].removeprefix('Value error, ')}"
    value = f" = {_short(err['input'])}" if not isinstance(err.get("input"), dict) else ""
    hint = _field_description(err["loc"])
    return f"{source}: {where}{value}: {err['msg']}" + (f" ({hint})" if hint else "")


def _public_loc(loc: tuple) -> tuple:
    """Drop the union tag pydantic inserts: ('steps', 0, 'prune', 'sparsity') -> steps.0.sparsity."""
    out = []
    for i, part in enumerate(loc):
        if i > 0 and isinstance(loc[i - 1], int) and part in pass_names():
            continue
        out.append("validate" if part == "validation" else part)
    return tuple(out)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that owns the last key of `loc`."""
    if len(loc) >= 3 and loc[0] == "steps" and loc[2] in pass_names():
        return next(cls for cls in STEP_CONFIGS if step_kind(cls) == loc[2])
    if loc and loc[0] in ("validate", "validation") and len(loc) == 2:
        return ValidateConfig
    return Recipe if len(loc) == 1 else None


def _allowed_keys(loc: tuple) -> list[str]:
    owner = _model_at(loc)
    if owner is None:
        return []
    return [f.alias or name for name, f in owner.model_fields.items()]


def _field_description(loc: tuple) -> str:
    owner = _model_at(loc)
    field = owner.model_fields.get(str(loc[-1])) if owner else None
    return field.description or "" if field else ""

"""`compress plan`: will a model fit a device, at which recipe, and how fast can it decode,
answered from shapes alone (no weight data is read).

A language model (config.json, HF folder, .safetensors / shard index header, .gguf header,
a built-in name) gets a plan per recipe (any recipe: a built-in name, a .yaml file, a Recipe;
plan/recipes.py); an .onnx / .tflite artifact gets the weights + activations estimate
`compress inspect` makes. `plan()` returns the JSON object the CLI prints (keys in
docs/language-models.md); `plan_gate()` is the check `compress --recipe` runs first on a language model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from compressor.config.recipe import Recipe
from compressor.decoders.counting import counter, set_counter
from compressor.formats import artifact_only_suffixes
from compressor.decoders.footprint_gguf import llama_cpp_kv_bytes
from compressor.decoders.footprint_tflite import tokenizer_bytes
from compressor.decoders.headers import ModelDescription, describe
from compressor.decoders.shapes import (ModelShape, active_param_count, from_hf_config,
                                       param_count, params_by_kind)
from compressor.devices import DeviceProfile, get_profile, load_profiles
from compressor.errors import DeviceBudgetError, ModelLoadError, UsageError
from compressor.plan.llm import HEADROOM_FRACTION, RecipeRef, plan_recipe, recommend
from compressor.plan.recipes import DEFAULT_RECIPES, PlannedRecipe, planned, recipe_of, resolve
from compressor.plan.split import split_plan

__all__ = ["plan", "plan_gate", "HEADROOM_FRACTION"]
DEFAULT_TARGET = "jetson-orin-nx-8gb"
DEFAULT_CONTEXT = 4096   # without --context: the model's positions, at most this many


class _MetaCounter:
    """decoders' counter (decoders/counting.py): transformers' own model on the meta device
    (backends/llm/meta_shapes.py), imported only when a config needs it, so planning a
    standard family loads no framework."""

    @staticmethod
    def knows(config: dict) -> bool:
        from compressor.backends.llm import meta_shapes

        return meta_shapes.knows(config)

    @staticmethod
    def count(config: dict):
        from compressor.backends.llm import meta_shapes

        return meta_shapes.count(config)


if counter() is None:
    set_counter(_MetaCounter())


def _profiles(target: str | None) -> list[DeviceProfile]:
    if target in (None, ""):
        return [get_profile(DEFAULT_TARGET)]
    if target == "all":
        return list(load_profiles().values())
    return [get_profile(target)]


def _check(context: int, batch: int, devices: int | None, shape: ModelShape | None) -> None:
    for name, value in (("--context", context), ("--batch", batch), ("--devices", devices or 1)):
        if value < 1:
            raise UsageError(f"{name} {value}: must be at least 1")
    if shape and context > shape.max_position_embeddings:
        raise UsageError(f"--context {context} is beyond {shape.name}'s "
                         f"max_position_embeddings ({shape.max_position_embeddings}); "
                         f"give --context {shape.max_position_embeddings} or less")


def _model_json(desc: ModelDescription) -> dict:
    s = desc.shape
    return {"name": s.name, "params": param_count(s), "active_params": active_param_count(s),
            "layers": s.num_layers, "source": desc.source, "family": s.family,
            "params_by_kind": params_by_kind(s)}


def _device_json(profile: DeviceProfile, llm: bool) -> dict:
    return {"name": profile.name,
            "usable_bytes": profile.llm_budget_bytes if llm else profile.budget_bytes,
            "bandwidth_bytes_per_s": profile.memory_bandwidth}


def _llm_target(shape: ModelShape, profile: DeviceProfile, context: int, batch: int,
                recipes: tuple[PlannedRecipe, ...], kv_dtype: str | None, devices: int | None,
                tokenizer: int | None = None) -> dict:
    plans = [plan_recipe(shape, r, profile, context, batch, kv_dtype, tokenizer) for r in recipes]
    out = {"target": profile.name, "device": _device_json(profile, llm=True),
           "plans": [p.as_json() for p in plans],
           "recommended": recommend(plans, profile.llm_budget_bytes)}
    if devices:
        ranked = sorted(recipes, key=lambda r: -r.accuracy_rank)
        splits = [split_plan(shape, r.onnx, profile, devices, context, batch, kv_dtype)
                  for r in ranked]
        out["split"] = next((s for s in splits if s.fits), splits[-1]).as_json()
    return out


def plan(model: str | Path | dict, target: str | None = DEFAULT_TARGET, context: int | None = None,
         batch: int = 1, recipes: list[RecipeRef] | tuple[RecipeRef, ...] | None = None,
         kv_dtype: str | None = None, devices: int | None = None) -> dict[str, Any]:
    """The plan as one JSON-ready object. `context`: positions in the KV cache [default: the
    model's max_position_embeddings, at most DEFAULT_CONTEXT]. `recipes`: built-in names, fp32,
    .yaml paths or Recipes [default: fp16, int8, int4, int4_g128]. target "all" plans every
    built-in profile (under "targets", one object per device with target / device / plans /
    recommended)."""
    if isinstance(model, (str, Path)) and str(model).endswith(artifact_only_suffixes()):
        from compressor.plan.artifact import artifact_plan

        _check(context or 1, batch, devices, None)
        return artifact_plan(Path(model), _profiles(target), target)
    desc = (ModelDescription(from_hf_config(model, source="config"), "config")
            if isinstance(model, dict) else describe(model))
    if context is None:
        context = min(desc.shape.max_position_embeddings, DEFAULT_CONTEXT)
    _check(context, batch, devices, desc.shape)
    recipes = tuple(resolve(r) for r in recipes or DEFAULT_RECIPES)
    if kv_dtype not in (None, "float32", "float16", "int8"):
        raise UsageError(f"--kv-dtype {kv_dtype}: give float16, int8 or float32")
    tokenizer = tokenizer_bytes(_model_folder(model), desc.shape)
    per_device = [_llm_target(desc.shape, p, context, batch, recipes, kv_dtype, devices, tokenizer)
                  for p in _profiles(target)]
    head = {"model": _model_json(desc), "target": target or DEFAULT_TARGET, "context": context,
            "batch": batch,
            # the GGUF route's runtime keeps its own cache: llama.cpp's -ctk / -ctv types
            "llama_cpp_kv_cache_bytes": llama_cpp_kv_bytes(desc.shape, context * batch)}
    if target == "all":
        return {**head, "targets": per_device}
    one = per_device[0]
    return {**head, **{k: v for k, v in one.items() if k != "target"}}


def _model_folder(model: str | Path | dict) -> Path | None:
    """The folder whose tokenizer files a .tflite export would carry (None: a built-in name
    or a config dict)."""
    if isinstance(model, dict):
        return None
    path = Path(str(model))
    return path if path.is_dir() else path.parent if path.is_file() else None


def plan_gate(model_ref: str | Path | dict, recipe: str | Recipe, target: str | None,
              context: int | None = None, batch: int = 1, devices: int | None = None
              ) -> dict | None:
    """Raise DeviceBudgetError (exit 4) naming the plan's numbers when `recipe` (a Recipe or a
    built-in name) cannot fit `target` at `context`; else the plan (what report.json records
    as `plan`). The language-model task runs it before loading a model. None when there is no
    target, the recipe writes no language model (a step trains it), or `model_ref` is not a
    model the plan reads shapes of. `devices` K >= 2: the recipe split over K boards must fit,
    each stage on its own board (the plan's `split`)."""
    if not target or target == "all":
        return None
    counted = planned(recipe if isinstance(recipe, Recipe) else recipe_of(recipe))
    if counted is None:
        return None
    try:
        result = plan(model_ref, target, context, batch, [counted],
                      devices=devices if devices and devices > 1 else None)
    except ModelLoadError:
        return None   # no shapes to read: nothing to plan
    p = result["plans"][0]
    if "split" in result:
        return _split_gate(result, target)
    if p["fits"]:
        return result
    usable = result["device"]["usable_bytes"]
    gb = 1e9
    raise DeviceBudgetError(
        f"plan: {result['model']['name']} at {counted.name} needs {p['total_bytes'] / gb:.2f} GB "
        f"(weights {p['weights_bytes'] / gb:.2f} + KV cache {p['kv_cache_bytes'] / gb:.2f} at "
        f"{result['context']} tokens + working {p['working_bytes'] / gb:.2f}) but {target} has "
        f"{usable / gb:.2f} GB for a language model; it fits up to {p['max_context']} tokens. "
        f"Use a smaller recipe (compress plan {model_ref if not isinstance(model_ref, dict) else 'MODEL'} "
        f"--target {target}), a shorter context, or --force-plan to try anyway")


def _split_gate(result: dict, target: str) -> dict:
    """The plan of a split run, or DeviceBudgetError naming the stage that does not fit."""
    split = result["split"]
    if split["fits"]:
        return result
    usable = result["device"]["usable_bytes"]
    largest = max(split["stages"], key=lambda s: s["bytes"])
    raise DeviceBudgetError(
        f"plan: {result['model']['name']} at {split['recipe']} over {split['devices']} boards: "
        f"layers {largest['first_layer']}-{largest['last_layer']} need "
        f"{largest['bytes'] / 1e9:.2f} GB but {target} has {usable / 1e9:.2f} GB for a language "
        "model; use more --devices, a smaller recipe, a shorter context, or --force-plan")

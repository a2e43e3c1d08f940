"""Load PyTorch models as private copies: `module:function` (+ weights), `.pt2`, in-memory.

Nothing here changes the caller's module or files: files are only read and in-memory
modules are deep-copied. Loading a pickled whole module or a TorchScript file runs code
stored in the file, so both are refused unless the user passes --trust-pickle.
"""
from __future__ import annotations

import copy
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from compressor.backends.references import call_reference, is_builder_reference
from compressor.backends.torch.env import configure_environment, quiet_loggers
from compressor.errors import ModelLoadError, first_line

configure_environment()

PICKLE_SUFFIXES = (".pt", ".pth", ".ts", ".pkl")
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")   # common checkpoint layouts
WEIGHTS_ONLY_REFUSAL = "Weights only load failed"
LISTED_KEYS = 6


def load_torch_model(source: Any, weights: str | Path | None = None,
                     trust_pickle: bool = False) -> torch.nn.Module:
    if isinstance(source, (str, Path)):
        model = _load_reference(str(source), trust_pickle)
    elif isinstance(source, torch.export.ExportedProgram):
        model = clone_module(source.module())
    elif isinstance(source, torch.nn.Module):
        model = clone_module(source)
    else:
        raise ModelLoadError(f"cannot load a {type(source).__qualname__} as a PyTorch model; "
                             "pass a torch.nn.Module, a .pt2 file, or module:function")
    if weights is not None:
        load_weights(model, Path(weights))
    return model


def clone_module(model: torch.nn.Module) -> torch.nn.Module:
    try:
        return copy.deepcopy(model)
    except (TypeError, RuntimeError, copy.Error, pickle.PicklingError) as exc:
        raise ModelLoadError(f"cannot copy this {type(model).__name__} ({first_line(exc)}); "
                             "compressor works on a copy so that your module stays unchanged: "
                             "keep unpicklable objects (files, locks) out of its attributes"
                             ) from None


def _load_reference(ref: str, trust_pickle: bool) -> torch.nn.Module:
    path = Path(ref)
    if path.suffix == ".pt2":
        return _load_pt2(path)
    if not path.exists() and is_builder_reference(ref):
        return _call_builder(ref)
    if not path.exists():
        raise ModelLoadError(f"model {ref} does not exist; check the path, or give "
                             "module:function for a function that builds the model")
    if path.suffix in PICKLE_SUFFIXES:
        return _load_pickled(path, trust_pickle)
    raise ModelLoadError(f"{ref}: unknown PyTorch model format {path.suffix or '(no suffix)'}; "
                         "use a .pt2 file (torch.export.save) or module:function")


def _call_builder(ref: str) -> torch.nn.Module:
    model = call_reference(ref)
    if isinstance(model, torch.export.ExportedProgram):
        model = model.module()
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(f"{ref} returned a {type(model).__qualname__}, not a "
                             "torch.nn.Module; make it return the model (untrained is fine "
                             "with --weights)")
    return model


def _load_pt2(path: Path) -> torch.nn.Module:
    if not path.is_file():
        raise ModelLoadError(f"model {path} does not exist; check the path")
    try:   # torch.export.load logs a full traceback before raising; the typed error is enough
        with quiet_loggers("torch.export"):
            program = torch.export.load(str(path))
    except (RuntimeError, ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"{path} is not a readable .pt2 file ({first_line(exc)}); save it "
                             "again with torch.export.save(torch.export.export(model, (x,)), "
                             "'model.pt2')") from None
    _require_dynamic_batch(program, path)
    return program.module()


def _require_dynamic_batch(program: Any, path: Path) -> None:
    """Fine-tuning and validation run batches of any size; a fixed batch graph cannot."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for name in program.graph_signature.user_inputs:
        value = placeholders[name].meta.get("val")
        shape = getattr(value, "shape", ())
        if len(shape) and isinstance(shape[0], int):
            raise ModelLoadError(
                f"{path} was exported with a fixed batch size of {shape[0]}; export it with a "
                "dynamic batch: torch.export.export(model, (x,), dynamic_shapes=({0: "
                "torch.export.Dim.DYNAMIC},)) with x of 2 or more rows")


def _load_pickled(path: Path, trust_pickle: bool) -> torch.nn.Module:
    torchscript = _is_torchscript(path)
    if trust_pickle:
        return _load_trusted(path, torchscript)
    kind = "TorchScript module" if torchscript else "pickled module"
    refusal = ModelLoadError(f"{path} is a {kind}; loading it runs code from the file. Pass "
                             "--trust-pickle if you trust it, or save a state_dict and use "
                             "--weights.")
    if torchscript:
        raise refusal
    if not _looks_like_torch_save(path):
        raise _unreadable(path, ValueError("neither a zip archive nor a pickle"))
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if WEIGHTS_ONLY_REFUSAL in str(exc):
            raise refusal from None
        raise _unreadable(path, exc) from None
    except (RuntimeError, OSError, EOFError, KeyError, ValueError) as exc:
        raise _unreadable(path, exc) from None
    if isinstance(content, Mapping):
        raise ModelLoadError(f"{path} holds only weights (a state_dict); give the code that "
                             "builds the model as module:function and this file with --weights")
    raise ModelLoadError(f"{path} holds a {type(content).__name__}, not a model; pass a .pt2 "
                         "file or module:function (with --weights for a state_dict)")


def _load_trusted(path: Path, torchscript: bool) -> torch.nn.Module:
    try:
        model = torch.jit.load(str(path), map_location="cpu") if torchscript else \
            torch.load(path, map_location="cpu", weights_only=False)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, KeyError, ValueError,
            AttributeError, ImportError) as exc:
        hint = ("; the classes it was pickled with must be importable (run from the project "
                "folder or set PYTHONPATH)" if isinstance(exc, (AttributeError, ImportError))
                else "")
        raise _unreadable(path, exc, hint) from None
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(f"{path} holds a {type(model).__name__}, not a torch.nn.Module; "
                             "use --weights for a state_dict")
    return model


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("/constants.pkl") or "/code/" in name
                   for name in archive.namelist())


def _looks_like_torch_save(path: Path) -> bool:
    """torch.save writes a zip archive (legacy: a pickle, which starts with its PROTO opcode)."""
    if zipfile.is_zipfile(path):
        return True
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load a state_dict file (tensors only, weights_only=True) into `model` strictly."""
    if not path.is_file():
        raise ModelLoadError(f"weights file {path} does not exist; check the --weights path")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if WEIGHTS_ONLY_REFUSAL in str(exc):
            raise ModelLoadError(f"{path} holds more than tensors (a pickled object); save only "
                                 "the weights: torch.save(model.state_dict(), path)") from None
        raise _unreadable(path, exc) from None
    except (RuntimeError, OSError, EOFError, KeyError, ValueError) as exc:
        raise _unreadable(path, exc) from None
    state = _unwrap_checkpoint(state, path)
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:   # shape mismatches
        lines = [line.strip() for line in str(exc).splitlines() if "size mismatch" in line]
        detail = "; ".join(lines[:LISTED_KEYS]) or first_line(exc)
        raise ModelLoadError(f"{path} does not fit the model: {detail}; the weights must come "
                             "from the same architecture") from None
    problems = [f"{label}: {_listed(keys)}" for label, keys in
                (("missing keys", result.missing_keys), ("unexpected keys", result.unexpected_keys))
                if keys]
    if problems:
        raise ModelLoadError(f"{path} does not match the model's state_dict ({'; '.join(problems)}"
                             "); the weights must come from the same architecture")


def _unwrap_checkpoint(state: Any, path: Path) -> Mapping:
    if isinstance(state, Mapping):
        for key in WRAPPER_KEYS:
            if isinstance(state.get(key), Mapping):   # a checkpoint dict around the weights
                return state[key]
        return state
    raise ModelLoadError(f"{path} holds a {type(state).__name__}, not a state_dict; save the "
                         "weights with torch.save(model.state_dict(), path)")


def _listed(keys: list[str]) -> str:
    more = f" (+{len(keys) - LISTED_KEYS} more)" if len(keys) > LISTED_KEYS else ""
    return ", ".join(keys[:LISTED_KEYS]) + more


def _unreadable(path: Path, exc: BaseException, hint: str = "") -> ModelLoadError:
    return ModelLoadError(f"{path} is not a readable PyTorch file ({first_line(exc)}){hint}; "
                          "check that the file is complete, or save it again")

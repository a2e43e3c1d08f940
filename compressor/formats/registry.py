"""The format registry: `Format` entries and the lookups every layer reads (compressor/formats)."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compressor.errors import ModelLoadError
from compressor.registry import Registry

@dataclass(frozen=True)
class Format:
    """One artifact format. References are "module:attribute", imported when first used."""

    name: str                    # "tflite": recipes' `export`, --format, report rows
    runtime: str                 # the runtime that runs it, as device profiles name it ("litert")
    open: str                    # (path, threads=None, **options) -> Runtime, for the array task
    inspect: str                 # (path, sample_shapes=None) -> ArtifactInfo
    suffix: str = ""             # the artifact file's suffix; default "." + name
    options: tuple[str, ...] = ()   # keyword options `open` takes besides threads ("optimization")
    open_lm: str = ""            # (path, threads=None) -> LmRuntime; "" : no language-model artifact
    lm_hint: str = ""            # how errors describe its language-model artifact
    folder: str = ""             # a folder holding this file is an artifact of this format
    folder_hint: str = ""        # how errors describe such a folder ("a model-onnx/ folder")
    inspect_folder: str = ""     # (folder) -> ArtifactInfo for such a folder
    check: str = ""              # (path) -> None: a quick check before a file is opened
    float_kernels: str = ""      # (path) -> names of kernel ops computing in float; "" : the
    #                              inspector's float kernel weights
    lm_weights: str = ""         # (QuantizedLinear) -> the weight as its runtime computes a
    #                              language model's integers ("": exactly as quantized)
    lm_activations: str = ""     # (model, quantized parameter names) -> a context in which
    #                              the torch model rounds those matrices' inputs as its runtime
    #                              does ("": computed in float, as they are)
    lm_int8_block: int = 0       # its own int8 grid: symmetric, a scale per this many inputs
    #                              (an int8 candidate made on it; 0: none of its own)
    packages: tuple[str, ...] = ()   # pip packages of its runtime; the first installed one
    #                                  names the runtime in reports ("onnxruntime 1.32.0")
    default_export: bool = False   # in a recipe's `export` when the recipe names none
    model_input: bool = False    # its files are also models compress reads (a .gguf): `plan`
    #                              plans them as models, not as finished artifacts

    def __post_init__(self) -> None:
        if not self.suffix:
            object.__setattr__(self, "suffix", f".{self.name}")

    def is_folder_artifact(self, path: Path) -> bool:
        return bool(self.folder) and path.is_dir() and (path / self.folder).is_file()


_FORMATS: Registry[Format] = Registry("format")


def register_format(fmt: Format) -> Format:
    """Add `fmt`; the order of registration is the house order (report rows, --format hints)."""
    return _FORMATS.add(fmt.name, fmt)


def unregister_format(name: str) -> None:
    """Remove a format (tests that register a toy one)."""
    _FORMATS.remove(name)


def registered_formats() -> tuple[Format, ...]:
    return tuple(_FORMATS)


def format_names() -> tuple[str, ...]:
    return _FORMATS.names()


def default_formats() -> tuple[str, ...]:
    return tuple(f.name for f in _FORMATS if f.default_export)


def format_named(name: str) -> Format:
    if name not in _FORMATS:
        raise ModelLoadError(f"unknown artifact format {name!r}; the formats are "
                             f"{', '.join(_FORMATS.names())}")
    return _FORMATS.get(name)


def artifact_suffixes() -> tuple[str, ...]:
    return tuple(f.suffix for f in _FORMATS)


def artifact_only_suffixes() -> tuple[str, ...]:
    """The suffixes of artifacts that are never a model to compress (not a .gguf)."""
    return tuple(f.suffix for f in _FORMATS if not f.model_input)


def artifact_format(path: Path) -> Format | None:
    """The format of the artifact at `path`: a folder holding a format's marker file, else a
    file named with its suffix (which need not exist); None for anything else."""
    path = Path(path)
    for fmt in _FORMATS:
        if fmt.is_folder_artifact(path):
            return fmt
    return next((f for f in _FORMATS if path.suffix == f.suffix), None)


def format_of(path: Path) -> str:
    """The name of the format of the artifact file `path`; ModelLoadError for anything else."""
    found = next((f for f in _FORMATS if Path(path).suffix == f.suffix), None)
    if found is None:
        raise ModelLoadError(f"{path}: not an artifact compressor can run; expected "
                             f"{' or '.join(artifact_suffixes())}")
    return found.name


def resolve(reference: str) -> Callable[..., Any]:
    """The object a "module:attribute" reference names, imported now."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


class _Names(Sequence):
    """The registered format names, read at each use (a tuple taken at import would miss a
    format registered later)."""

    def __getitem__(self, index: Any) -> Any:
        return format_names()[index]

    def __len__(self) -> int:
        return len(_FORMATS.names())

    def __iter__(self) -> Iterator[str]:
        return iter(format_names())

    def __contains__(self, name: object) -> bool:
        return name in _FORMATS

    def __repr__(self) -> str:
        return repr(format_names())


class _Runtimes(Mapping):
    """Format name -> the runtime that runs it, read at each use."""

    def __getitem__(self, name: str) -> str:
        fmt = _FORMATS.get(name)
        if fmt is None:
            raise KeyError(name)
        return fmt.runtime

    def __len__(self) -> int:
        return len(_FORMATS.names())

    def __iter__(self) -> Iterator[str]:
        return iter(format_names())


FORMAT_NAMES: Sequence[str] = _Names()
FORMAT_RUNTIMES: Mapping[str, str] = _Runtimes()

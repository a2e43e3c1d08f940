"""A language model's shape from what describes it, never from its weight data: config.json,
a Hugging Face folder, a .safetensors file or shard index (the JSON header only), a .gguf file
(the metadata header only), or a built-in name (catalogue.yaml).

A header that lies (a length past the end of the file, tensor offsets beyond it, a size that
does not match its dtype and shape) is a ModelLoadError: the file is truncated or not what its
name says.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from compressor.errors import ConfigMismatchError, ModelLoadError
from compressor.decoders import catalogue
from compressor.decoders.gguf_header import gguf_config
from compressor.decoders.shapes import ModelShape, from_hf_config, tensor_inventory

_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_HEADER_LIMIT = 100 * 2**20          # safetensors refuses headers above 100 MB too
# float tensors keep the shape config.json gives them (packed integer formats do not)
_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})


@dataclass(frozen=True)
class ModelDescription:
    shape: ModelShape
    source: str                          # what the numbers were read from
    header_params: int | None = None     # numel summed over the checkpoint's header(s)
    dtypes: dict[str, int] = field(default_factory=dict)   # checkpoint dtype -> tensors


def safetensors_header(path: Path) -> dict[str, dict]:
    """The tensor entries of a .safetensors file's header, checked against the file size."""
    size = _size(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad(path, f"it is {size} bytes, shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8 or length > _HEADER_LIMIT:
            raise _bad(path, f"its header claims {length:,} bytes but the file holds {size - 8:,} "
                             "after the length field")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise _bad(path, "its header is not a JSON object")
    data_bytes = size - 8 - length
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, entry in tensors.items():
        _check_entry(path, name, entry, data_bytes)
    return tensors


def _check_entry(path: Path, name: str, entry: object, data_bytes: int) -> None:
    if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPE_BYTES:
        raise _bad(path, f"tensor {name!r} has no known dtype")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)):
        raise _bad(path, f"tensor {name!r} has a malformed shape or data_offsets")
    begin, end = offsets
    numel = 1
    for d in shape:
        numel *= d
    if not 0 <= begin <= end <= data_bytes:
        raise _bad(path, f"tensor {name!r} lies at bytes {begin:,}-{end:,} of the data, but the "
                         f"file holds only {data_bytes:,} bytes of data")
    if end - begin != numel * _DTYPE_BYTES[entry["dtype"]]:
        raise _bad(path, f"tensor {name!r} spans {end - begin:,} bytes, but {entry['dtype']} "
                         f"{shape} needs {numel * _DTYPE_BYTES[entry['dtype']]:,}")


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read it ({e.strerror})") from None


def _bad(path: Path, why: str) -> ModelLoadError:
    return ModelLoadError(f"{path}: not a valid checkpoint header: {why}; the file is truncated or "
                          "corrupt (download it again)")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read it ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def _headers(files: list[Path]) -> tuple[dict[str, dict], dict[str, int]]:
    tensors: dict[str, dict] = {}
    for f in files:
        tensors.update(safetensors_header(f))
    dtypes: dict[str, int] = {}
    for entry in tensors.values():
        dtypes[entry["dtype"]] = dtypes.get(entry["dtype"], 0) + 1
    return tensors, dtypes


def _numel(tensors: dict[str, dict]) -> int:
    total = 0
    for entry in tensors.values():
        n = 1
        for d in entry["shape"]:
            n *= d
        total += n
    return total


def _shards(index: Path) -> list[Path]:
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ModelLoadError(f"{index}: a shard index needs a `weight_map` of tensor -> file")
    files = sorted({index.parent / str(f) for f in weight_map.values()})
    return [f for f in files if f.is_file()]


def describe(ref: str | Path) -> ModelDescription:
    """The shape of the model `ref` names: a path (config.json, folder, .safetensors, shard
    index, .gguf) or a built-in name."""
    path = Path(ref)
    if path.is_dir():
        return _folder(path)
    if path.is_file():
        name = path.name
        if name.endswith(".gguf"):
            config, tensors = gguf_config(path)
            return ModelDescription(from_hf_config(config, name=path.stem, source=str(path)),
                                    str(path), tensors)
        if name.endswith(".index.json"):
            return _checkpoint(path.parent, _shards(path), str(path))
        if name.endswith(".safetensors"):
            return _checkpoint(path.parent, [path], str(path))
        if name.endswith(".json"):
            return ModelDescription(from_hf_config(_read_json(path), name=path.parent.name,
                                                   source=str(path)), str(path))
        raise ModelLoadError(f"{path}: compress plan reads config.json, *.safetensors, "
                             "model.safetensors.index.json, *.gguf, .onnx or .tflite files")
    entry = catalogue.lookup(str(ref))
    return ModelDescription(entry.shape(), f"catalogue: {entry.source}")


def _folder(folder: Path) -> ModelDescription:
    if (folder / "config.json").is_file() or not list(folder.glob("*.gguf")):
        index = sorted(folder.glob("*.safetensors.index.json"))
        files = _shards(index[0]) if index else sorted(folder.glob("*.safetensors"))
        return _checkpoint(folder, files, str(folder))
    return describe(sorted(folder.glob("*.gguf"))[0])


def _checkpoint(folder: Path, files: list[Path], source: str) -> ModelDescription:
    tensors, dtypes = _headers(files)
    config_path = folder / "config.json"
    if config_path.is_file():
        shape = from_hf_config(_read_json(config_path), name=folder.name, source=source)
        check_config_matches(shape, tensors, config_path)
    elif tensors:
        from compressor.decoders.infer import shape_from_tensors

        shape = shape_from_tensors({k: v["shape"] for k, v in tensors.items()}, folder.name, source)
    else:
        raise ModelLoadError(f"{folder}: no config.json and no safetensors header to read shapes "
                             "from; give the model's Hugging Face folder or its config.json")
    return ModelDescription(shape, shape.source or source, _numel(tensors) if tensors else None, dtypes)


def check_config_matches(shape: ModelShape, tensors: dict[str, dict], config: Path | str) -> None:
    """Refuse (ModelLoadError, exit 2) a config.json that disagrees with the checkpoint's header:
    a float tensor named as the config's inventory names it but of another shape (a config of
    another size beside these weights would be planned, and loaded, as that size)."""
    expected = {t.name: t.stored_shape for t in tensor_inventory(shape) if not t.tied}
    wrong = [(name, tuple(e["shape"]), expected[name]) for name, e in tensors.items()
             if name in expected and e["dtype"] in _FLOAT_DTYPES
             and tuple(e["shape"]) != expected[name]]
    if wrong:
        name, found, want = wrong[0]
        more = f" (and {len(wrong) - 1} more tensors)" if len(wrong) > 1 else ""
        raise ConfigMismatchError(
            f"{config}: config.json does not match the weights: tensor {name!r} is "
            f"{list(found)} in the checkpoint but config.json makes it {list(want)}{more}; use the "
            "config.json saved with these weights (or fix its sizes: hidden_size, "
            "intermediate_size, heads, layers, vocab_size)")

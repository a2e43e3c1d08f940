"""Facts a .tflite's flatbuffer holds that LiteRT's Python interpreter does not show: which
tensors are INT4 (the interpreter hands them out unpacked as int8), and the named entries of
its metadata table (an LLM artifact's tokenizer files). Read with the schema ai-edge-litert
ships, from a memory map: nothing is loaded but the few tables asked for.
"""
from __future__ import annotations

import dataclasses
import mmap
from pathlib import Path

from compressor.runtimes.base import ArtifactInfo
from compressor.runtimes.common import weight_summary


def _root(data):
    from ai_edge_litert import schema_py_generated as schema

    return schema, schema.Model.GetRootAs(data, 0)


def _mapped(path: Path):
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def int4_tensor_names(path: Path) -> set[str]:
    """Names of the INT4 tensors of the first subgraph (the one the interpreter lists)."""
    data = _mapped(path)
    try:
        schema, model = _root(data)
        if not model.SubgraphsLength():
            return set()
        graph = model.Subgraphs(0)
        return {graph.Tensors(i).Name().decode() for i in range(graph.TensorsLength())
                if graph.Tensors(i).Type() == schema.TensorType.INT4}
    finally:
        data.close()


def metadata_entries(path: Path, prefix: str = "") -> dict[str, bytes]:
    """Metadata name -> its buffer's bytes, for the names starting with `prefix`."""
    data = _mapped(path)
    try:
        _, model = _root(data)
        found = {}
        for i in range(model.MetadataLength()):
            entry = model.Metadata(i)
            name = (entry.Name() or b"").decode()
            if name.startswith(prefix):
                buffer = model.Buffers(entry.Buffer())
                found[name] = bytes(buffer.DataAsNumpy()) if buffer.DataLength() else b""
        return found
    finally:
        data.close()


def with_int4_weights(info: ArtifactInfo) -> ArtifactInfo:
    """`info` with the INT4 tensors' dtype "int4" (LiteRT reports them as int8), and the
    dtype shares recomputed, so weight shares count them at 4 bits."""
    if info.format != "tflite":
        return info
    names = int4_tensor_names(info.path)
    if not names:
        return info
    weights = tuple(dataclasses.replace(w, dtype="int4") if w.name in names else w
                    for w in info.weights)
    _, dtypes, _ = weight_summary(weights)
    return dataclasses.replace(info, weights=weights, weight_dtypes=dtypes)

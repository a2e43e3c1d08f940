"""One stage of a split model.onnx (export/onnx_split.py) written to disk: its nodes, the graph
inputs and crossing tensors they read, its outputs, and only the initializers it uses, their
external bytes copied from the source's data file into stage{k}.onnx.data in chunks."""
from __future__ import annotations

from pathlib import Path

from compressor.errors import ModelLoadError

CHUNK = 64 * 2**20
ALIGN_LARGE = 4096       # tensors of 1 MiB and more start on a page (onnxruntime maps them)
LARGE = 2**20


def write_stage(model, source: Path, out: Path, k: int, nodes: list, received: list,
                outputs: list[str], infos: dict) -> dict:
    """stage{k}.onnx (+ .data); returns {"file", "data", "bytes", "inputs", "weights_bytes"}."""
    import onnx
    from onnx import helper

    used = {name for node in nodes for name in node.input if name}
    inputs = [v for v in model.graph.input if v.name in used]
    received_used = [v for v in received if v.name in used]
    name = f"stage{k}.onnx"
    data_name = f"{name}.data"
    initializers, weights = _copy_initializers(
        [t for t in model.graph.initializer if t.name in used], source, out / data_name)
    graph = helper.make_graph(nodes, f"{model.graph.name}_stage{k}", inputs + received_used,
                              [infos[o] for o in outputs], initializers)
    inner = {n for node in nodes for n in node.output}
    graph.value_info.extend(v for v in model.graph.value_info if v.name in inner and v.name not in outputs)
    stage = helper.make_model(graph, opset_imports=list(model.opset_import),
                              producer_name="compressor split")
    stage.ir_version = model.ir_version
    onnx.save(stage, str(out / name))
    files = [out / name] + ([out / data_name] if (out / data_name).exists() else [])
    return {"file": name, "data": data_name if len(files) > 1 else None,
            "bytes": sum(f.stat().st_size for f in files), "weights_bytes": weights,
            "tensors": sorted(t.name for t in initializers),
            "inputs": [v.name for v in inputs]}


def _copy_initializers(tensors: list, source: Path, data_path: Path) -> tuple[list, int]:
    """Copies of `tensors` whose external bytes now live in `data_path`; and their bytes."""
    import onnx

    data_path.unlink(missing_ok=True)
    copied, total, handles = [], 0, {}
    try:
        with open(data_path, "wb") as sink:
            for tensor in tensors:
                new = onnx.TensorProto()
                new.CopyFrom(tensor)
                if tensor.data_location != onnx.TensorProto.EXTERNAL:
                    total += len(tensor.raw_data) or _inline_bytes(tensor)
                    copied.append(new)
                    continue
                ext = {e.key: e.value for e in tensor.external_data}
                location = source.parent / ext["location"]
                offset, length = int(ext.get("offset", 0)), int(ext["length"])
                align = ALIGN_LARGE if length >= LARGE else 64
                start = -(-sink.tell() // align) * align
                sink.write(b"\0" * (start - sink.tell()))
                if location not in handles:
                    handles[location] = open(location, "rb")
                _copy(handles[location], offset, length, sink, tensor.name)
                del new.external_data[:]
                for key, value in (("location", data_path.name), ("offset", str(start)),
                                   ("length", str(length))):
                    entry = new.external_data.add()
                    entry.key, entry.value = key, value
                copied.append(new)
                total += length
    except OSError as exc:
        raise ModelLoadError(f"{source}: its external data cannot be read ({exc}); export it "
                             "again") from None
    finally:
        for handle in handles.values():
            handle.close()
    if data_path.stat().st_size == 0:
        data_path.unlink()
    return copied, total


def _copy(handle, offset: int, length: int, sink, name: str) -> None:
    handle.seek(offset)
    left = length
    while left:
        chunk = handle.read(min(CHUNK, left))
        if not chunk:
            raise OSError(f"{name}: the data file ends before its {length} bytes")
        sink.write(chunk)
        left -= len(chunk)


def _inline_bytes(tensor) -> int:
    import numpy as np
    from onnx import numpy_helper

    return int(np.asarray(numpy_helper.to_array(tensor)).nbytes)

"""ONNX external data must stay inside the model's folder.

An ONNX file may keep tensors in other files it names (`location`); a name like
`../../../etc/hostname` or an absolute path would make every reader (onnx.load,
onnxruntime) read any file the user can. Checked without loading any tensor data, by
`compress eval` / `compress inspect` and by anything that takes an ONNX model as input.
"""
from __future__ import annotations

import os
from pathlib import Path

from compressor.errors import ModelLoadError, first_line


def check_external_data(path: Path) -> None:
    """ModelLoadError when a tensor of the ONNX file at `path` points outside its folder."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:   # protobuf DecodeError and friends: not an ONNX file
        raise ModelLoadError(f"{path} is not a readable ONNX file ({first_line(exc, 120)}); "
                             "export it again") from None
    folder = Path(os.path.realpath(Path(path).parent))
    for tensor in _get_all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((entry.value for entry in tensor.external_data
                         if entry.key == "location"), "")
        target = Path(os.path.realpath(folder / location))
        if not location or Path(location).is_absolute() or folder not in target.parents:
            raise ModelLoadError(f"{path}: tensor {tensor.name[:60]!r} keeps its data in "
                                 f"{location[:120]!r}, outside the model's folder; external data "
                                 "must be a file beside the model")

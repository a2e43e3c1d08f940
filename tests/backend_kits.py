"""Per-framework kits for the backend-agnostic suite (tests/test_backends.py).

A kit gives the backend, its image layout, a trained digits CNN, a BatchNorm + skip model
trained for QAT, and the caller's weights as numpy arrays (to check they are left alone).
Frameworks are imported when a kit method runs, not when this module is imported.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from compressor.backends import get_backend
from compressor.context import Context, Data
from compressor.data import digits
from compressor.progress import Progress


class Kit:
    name = ""
    framework_modules: tuple[str, ...] = ()   # must stay unimported by the backend module

    def __init__(self) -> None:
        self.backend = get_backend(self.name)
        self.data = digits(self.backend.image_layout)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One image, without the batch dimension, in this framework's layout."""
        return tuple(self.data.val[0].shape[1:])

    def context(self, data: Data | None, workdir: Path, seed: int = 0) -> Context:
        return Context(data=self.data if data is None else data, backend=self.backend,
                       progress=Progress(quiet=True), workdir=Path(workdir), seed=seed)

    def small(self, samples: int) -> Data:
        return Data(train=(self.data.train[0][:samples], self.data.train[1][:samples]),
                    val=self.data.val)

    def setup(self) -> None:
        """Called once before the kit's tests (module scope)."""

    def teardown(self) -> None:
        """Called once after them."""

    def trained_cnn(self) -> Any:
        raise NotImplementedError

    def bn_skip_model(self) -> tuple[Any, Data]:
        """A trained Conv + BatchNorm + skip-connection model, and the data to fine-tune it on."""
        raise NotImplementedError

    def weights(self, model: Any) -> list[np.ndarray]:
        """Every weight of the model, as numpy copies."""
        raise NotImplementedError

    def kernels(self, model: Any) -> list[np.ndarray]:
        """The conv / dense kernels of the model, as numpy copies."""
        raise NotImplementedError

    def params(self, model: Any) -> int:
        raise NotImplementedError


class KerasKit(Kit):
    name = "keras"
    framework_modules = ("tensorflow", "tf_keras", "tensorflow_model_optimization", "tf2onnx",
                         "onnx", "onnxruntime", "ai_edge_litert", "keras")
    backend_imports = ("compressor.backends.keras_backend", "compressor.export",
                       "compressor.export.tflite", "compressor.export.onnx",
                       "compressor.export.quiet")

    def trained_cnn(self) -> Any:
        import keras_models as km

        return km.train(km.digits_cnn(), self.data)

    def bn_skip_model(self) -> tuple[Any, Data]:
        import keras_models as km

        small = self.small(512)
        return km.train(km.digits_functional(), small, epochs=2), small

    def weights(self, model: Any) -> list[np.ndarray]:
        return [np.array(w, copy=True) for w in model.get_weights()]

    def kernels(self, model: Any) -> list[np.ndarray]:
        return [w for w in self.weights(model) if w.ndim >= 2]

    def params(self, model: Any) -> int:
        return int(model.count_params())


class TorchKit(Kit):
    name = "torch"
    framework_modules = ("torch", "torchao", "litert_torch", "onnx")
    backend_imports = ("compressor.backends.torch_backend",)

    def setup(self) -> None:
        # One thread: on shared 2-core machines that is faster than two contended ones.
        import torch

        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def teardown(self) -> None:
        import torch

        torch.set_num_threads(self._threads)

    def trained_cnn(self) -> Any:
        import torch_models as tm

        return tm.train(tm.digits_cnn(), self.data)

    def bn_skip_model(self) -> tuple[Any, Data]:
        import torch_models as tm

        return tm.train(tm.digits_residual(), self.data, epochs=3), self.data

    def weights(self, model: Any) -> list[np.ndarray]:
        return [t.detach().cpu().numpy().copy() for t in model.state_dict().values()]

    def kernels(self, model: Any) -> list[np.ndarray]:
        return [t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()
                if name.endswith("weight") and t.ndim >= 2]

    def params(self, model: Any) -> int:
        return sum(p.numel() for p in model.parameters())


KITS = {"keras": KerasKit, "torch": TorchKit}

"""Per-framework kits for the backend-agnostic suites (tests/backends, tests/passes).

A kit gives the backend, its image layout, a trained digits CNN, a BatchNorm + skip model
trained for QAT, a model with one int8-hostile layer (quantize fallback), and the caller's
weights as numpy arrays (to check they are left alone). Frameworks are imported when a kit
method runs, not when this module is imported.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from support import helpers
import numpy as np

from compressor.backends import get_backend
from compressor.core.context import Context, Data, ModelState
from compressor.tasks.array.data import digits
from compressor.config.steps import StepConfig


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
        return helpers.context(self.data if data is None else data, workdir, seed)

    def apply(self, state: ModelState, config: StepConfig, ctx: Context) -> ModelState:
        """`config`'s pass on `state` with this kit's backend, as a recipe step runs it."""
        return helpers.apply(self.backend, state, config, ctx)

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

    def outlier_model(self) -> Any:
        """A trained digits classifier whose `bottleneck` dense layer reads one always-zero
        unit through weights 500x the largest real one: harmless in float, but per-channel
        int8 scales are set by the outliers and full int8 collapses (quantize fallback)."""
        raise NotImplementedError

    def head_name(self, model: Any) -> str:
        """What a precision `exclude` pattern names the last dense layer by."""
        raise NotImplementedError


class KerasKit(Kit):
    name = "keras"
    framework_modules = ("tensorflow", "tf_keras", "tensorflow_model_optimization", "tf2onnx",
                         "onnx", "onnxruntime", "ai_edge_litert", "keras")
    backend_imports = ("compressor.backends.keras", "compressor.backends.keras.tflite",
                       "compressor.backends.keras.onnx", "compressor.export.int8",
                       "compressor.core.quiet")

    def trained_cnn(self) -> Any:
        from support import keras_models as km

        return km.train(km.digits_cnn(), self.data)

    def bn_skip_model(self) -> tuple[Any, Data]:
        from support import keras_models as km

        small = self.small(512)
        return km.train(km.digits_functional(), small, epochs=2), small

    def weights(self, model: Any) -> list[np.ndarray]:
        return [np.array(w, copy=True) for w in model.get_weights()]

    def kernels(self, model: Any) -> list[np.ndarray]:
        return [w for w in self.weights(model) if w.ndim >= 2]

    def params(self, model: Any) -> int:
        return int(model.count_params())

    def outlier_model(self) -> Any:
        from support import keras_models as km

        keras = km.tf_keras()
        keras.utils.set_random_seed(0)
        layers = keras.layers
        model = keras.Sequential([
            keras.Input((8, 8, 1)),
            layers.Conv2D(16, 3, activation="relu", name="conv_a"),
            layers.Conv2D(32, 3, activation="relu", name="conv_b"),
            layers.Flatten(name="flatten"),
            layers.Dense(64, activation="relu", name="hidden"),
            layers.Dense(16, activation="relu", name="bottleneck"),
            layers.Dense(10, name="logits"),
        ], name="outlier_cnn")
        km.train(model, self.data)
        hidden, bottleneck = model.get_layer("hidden"), model.get_layer("bottleneck")
        kernel, bias = hidden.get_weights()
        kernel[:, 0], bias[0] = 0.0, -1.0                  # unit 0 of hidden: always 0
        hidden.set_weights([kernel, bias])
        kernel, bias = bottleneck.get_weights()
        kernel[0, :] = 500 * np.abs(kernel).max()          # harmless in float: its input is 0
        bottleneck.set_weights([kernel, bias])
        return model

    def head_name(self, model: Any) -> str:
        return model.layers[-1].name          # Keras numbers layer names per process: read it


class TorchKit(Kit):
    name = "torch"
    framework_modules = ("torch", "torchao", "litert_torch", "onnx")
    backend_imports = ("compressor.backends.torch",)

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

    def outlier_model(self) -> Any:
        import torch
        import torch_models as tm

        torch.manual_seed(0)
        model = tm.train(tm.OutlierNet(), self.data)
        with torch.no_grad():
            model.hidden.weight[0], model.hidden.bias[0] = 0.0, -1.0    # unit 0: always 0
            model.bottleneck.weight[:, 0] = 500 * model.bottleneck.weight.abs().max()
        return model

    def head_name(self, model: Any) -> str:
        return "head.3"                       # DigitsCNN.head: Flatten, Linear, ReLU, Linear


KITS = {"keras": KerasKit, "torch": TorchKit}

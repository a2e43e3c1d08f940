"""Per-framework helpers for the backend-agnostic distillation tests (tests/passes/test_distill.py).

Each kit builds the same models in its framework: a digits teacher CNN (~38k parameters), a
student of the same shape at a fifth of its size (~7.7k), and a teacher with the wrong output
width. Frameworks are imported when a kit method runs, not when this module is imported.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from support import helpers
import numpy as np

from compressor.backends import examples, get_backend
from compressor.core.context import Context, Data, ModelState
from compressor.tasks.array.data import digits
from compressor.config.steps import StepConfig

STUDENT_SHAPE = {"filters": (8, 16), "dense": 24}   # about 20% of the teacher's parameters


class Kit:
    name = ""

    def __init__(self) -> None:
        self.backend = get_backend(self.name)
        self.data = digits(self.backend.image_layout)

    def context(self, data: Data | None = None, seed: int = 0, teacher: Any = None,
                workdir: Path = Path("unused")) -> Context:
        return helpers.context(data or self.data, workdir, seed, teacher)

    def apply(self, state: ModelState, config: StepConfig, ctx: Context) -> ModelState:
        return helpers.apply(self.backend, state, config, ctx)

    def good_teacher(self) -> Any:
        model = self.teacher()
        assert self.accuracy(model) >= 0.95, "the teacher must be good for its soft targets to help"
        return model

    def accuracy(self, model: Any) -> float:
        outputs = self.backend.predict(model, self.data.val[0])
        return float(np.mean(np.argmax(outputs, axis=-1) == self.data.val[1]))


class KerasKit(Kit):
    name = "keras"

    def teacher(self) -> Any:
        return examples.train_keras_digits_cnn(epochs=8)

    def brief_student(self) -> Any:
        """Trained briefly from scratch with plain cross-entropy: clearly worse than the teacher."""
        return self.trained_student(3)

    def trained_student(self, epochs: int, seed: int = 0) -> Any:
        return examples.train_keras_digits_cnn(epochs=epochs, seed=seed, **STUDENT_SHAPE)

    def student(self, seed: int) -> Any:
        import tf_keras

        tf_keras.utils.set_random_seed(seed)
        return examples.keras_digits_cnn(**STUDENT_SHAPE)

    def mismatched_teacher(self) -> Any:
        import tf_keras

        return tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Flatten(),
                                    tf_keras.layers.Dense(5)])

    def weights(self, model: Any) -> list[np.ndarray]:
        return [np.array(w) for w in model.get_weights()]

    def kernels(self, model: Any) -> list[np.ndarray]:
        return [w.numpy() for w in model.trainable_weights if len(w.shape) >= 2]

    def loss_value(self, config, student, labels, teacher) -> float:
        import tf_keras

        from compressor.backends.keras.train import distillation_loss

        def hard(y, logits):
            return tf_keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)

        y_true = teacher if labels is None else np.concatenate(
            [labels[:, None].astype(np.float32), teacher], axis=-1)
        loss = distillation_loss(config, None if labels is None else hard, False)
        return float(np.mean(loss(y_true, student)))

    def cli_models(self, folder: Path, student: Any, teacher: Any) -> list[str]:
        student.save(folder / "student.keras")
        teacher.save(folder / "teacher.keras")
        return [str(folder / "student.keras"), "--teacher", str(folder / "teacher.keras")]

    def pickled_teacher(self, folder: Path) -> Path:
        """A model with a Lambda layer: loading it runs code, so it needs --trust-pickle."""
        import tf_keras

        model = tf_keras.Sequential([tf_keras.Input((8, 8, 1)),
                                     tf_keras.layers.Lambda(lambda x: x * 2.0),
                                     tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])
        model.save(folder / "lambda_teacher.keras")
        return folder / "lambda_teacher.keras"


class TorchKit(Kit):
    name = "torch"

    def teacher(self) -> Any:
        return examples.train_torch_digits_cnn(epochs=8)

    def brief_student(self) -> Any:
        return self.trained_student(3)

    def trained_student(self, epochs: int, seed: int = 0) -> Any:
        return examples.train_torch_digits_cnn(epochs=epochs, seed=seed, **STUDENT_SHAPE)

    def student(self, seed: int) -> Any:
        return examples.torch_digits_cnn(seed=seed, **STUDENT_SHAPE)

    def mismatched_teacher(self) -> Any:
        from torch import nn

        return nn.Sequential(nn.Flatten(), nn.Linear(64, 5))

    def weights(self, model: Any) -> list[np.ndarray]:
        return [t.detach().numpy().copy() for t in model.state_dict().values()]

    def kernels(self, model: Any) -> list[np.ndarray]:
        return [p.detach().numpy() for p in model.parameters() if p.ndim >= 2]

    def loss_value(self, config, student, labels, teacher) -> float:
        import torch

        from compressor.backends.torch.train import distillation_loss

        hard = None if labels is None else torch.nn.functional.cross_entropy
        targets = [torch.from_numpy(teacher)]
        if labels is not None:
            targets.insert(0, torch.from_numpy(labels))
        return float(distillation_loss(config, hard, False)(torch.from_numpy(student), *targets))

    def cli_models(self, folder: Path, student: Any, teacher: Any) -> list[str]:
        """The issue's form: module:function models with --weights / --teacher-weights."""
        import torch

        (folder / "nets.py").write_text(textwrap.dedent("""
            from torch import nn
            from compressor.backends.examples import torch_digits_cnn

            def student():
                return torch_digits_cnn(filters=(8, 16), dense=24)

            def teacher():
                return nn.Sequential(nn.Flatten(), nn.Linear(64, 5))
        """))
        torch.save(student.state_dict(), folder / "student.pt")
        torch.save(teacher.state_dict(), folder / "teacher.pt")
        return ["nets:student", "--weights", str(folder / "student.pt"), "--teacher",
                "nets:teacher", "--teacher-weights", str(folder / "teacher.pt")]

    def pickled_teacher(self, folder: Path) -> Path:
        import torch

        torch.save(examples.torch_digits_cnn(), folder / "teacher.pt")   # a whole pickled module
        return folder / "teacher.pt"


KITS = {"keras": KerasKit, "torch": TorchKit}


def kit_fixture(name: str):
    """Yields the kit; PyTorch on one thread meanwhile (faster than two contended ones on
    shared 2-core machines). The body of the distill suites' module-scoped `kit` fixtures."""
    if name != "torch":
        yield KITS[name]()
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield KITS[name]()
    torch.set_num_threads(threads)

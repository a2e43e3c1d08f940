"""The array task: classifiers, regressors and encoders fed arrays, scored by accuracy,
fidelity, mse or a custom metric (task.py registers it)."""
from compressor.tasks.array.task import ArrayTask

__all__ = ["ArrayTask"]

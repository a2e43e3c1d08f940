"""The data helpers the Python API documents (`from compressor.data import digits`): the built-in
digits split and `load_data` for `.npz` files, `module:function` references and arrays.
They live with the array task (tasks/array/data.py) and the example data (core/datasets.py)."""
from compressor.core.datasets import digits
from compressor.tasks.array.data import load_data

__all__ = ["digits", "load_data"]

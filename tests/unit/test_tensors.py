"""compressor/core/tensors.py: one array or several named ones, in and out of a model."""
from __future__ import annotations

import numpy as np
import pytest

from compressor.errors import DataError
from compressor.core.tensors import (TensorSpec, aligned_outputs, concat, is_integer, matched, named,
                                output_index, output_list, rows, select_output, specs_of, take)


def test_tensor_spec_describes_itself_without_the_batch():
    assert TensorSpec("image", (None, 8, 8, 1), "float32").describe() == "image (N, 8, 8, 1) float32"
    assert TensorSpec("ids", (None, None), "int64").describe() == "ids (N, ?) int64"


def test_named_puts_a_single_array_under_the_default_name():
    x = np.zeros((3, 2))
    assert list(named(x)) == ["input"] and list(named(x, "image")) == ["image"]
    both = named({"a": [[1, 2]], 7: [[3]]})
    assert list(both) == ["a", "7"] and both["a"].shape == (1, 2)


def test_rows_counts_samples_and_checks_named_inputs_agree():
    assert rows(np.zeros((5, 3))) == 5
    assert rows({"image": np.zeros((4, 8)), "meta": np.zeros((4, 2))}) == 4
    with pytest.raises(DataError, match=r"different numbers of rows \{'image': 4, 'meta': 3\}"):
        rows({"image": np.zeros((4, 8)), "meta": np.zeros((3, 2))})
    with pytest.raises(DataError, match="empty dict of inputs"):
        rows({})


def test_take_and_concat_work_on_arrays_and_dicts():
    x = {"a": np.arange(6).reshape(3, 2), "b": np.arange(3)}
    part = take(x, [2, 0])
    assert part["a"].tolist() == [[4, 5], [0, 1]] and part["b"].tolist() == [2, 0]
    assert take(np.arange(5), slice(1, 3)).tolist() == [1, 2]
    joined = concat([take(x, slice(0, 1)), take(x, slice(1, 3))])
    assert joined["a"].tolist() == x["a"].tolist() and joined["b"].tolist() == [0, 1, 2]
    assert concat([np.zeros((2, 3)), np.ones((1, 3))]).shape == (3, 3)


def test_matched_by_name_in_the_models_order():
    x = {"meta": np.ones((2, 1)), "image": np.zeros((2, 4)), "unused": np.zeros(2)}
    image, meta = matched(x, ["image", "meta"])
    assert image.shape == (2, 4) and meta.shape == (2, 1)


def test_matched_by_position_when_only_the_names_differ():
    first, second = matched({"x0": np.zeros(2), "x1": np.ones(2)}, ["image", "meta"])
    assert first.tolist() == [0, 0] and second.tolist() == [1, 1]


def test_matched_errors_name_the_inputs():
    with pytest.raises(DataError, match=r"the model has 2 inputs \(image, meta\) but the data gives "
                                        r"one array; pass a dict name -> array"):
        matched(np.zeros((2, 4)), ["image", "meta"])
    with pytest.raises(DataError, match="the model's inputs are image, meta but the data has x; "
                                        "name the arrays after the model's inputs"):
        matched({"x": np.zeros(2)}, ["image", "meta"])
    assert matched(np.zeros((2, 4)), ["image"])[0].shape == (2, 4)


def test_output_list():
    assert [a.shape for a in output_list({"a": np.zeros(2), "b": np.zeros(3)})] == [(2,), (3,)]
    assert [a.shape for a in output_list(np.zeros((4, 10)))] == [(4, 10)]


def test_select_output_by_name_position_or_first():
    outputs = {"aux": np.zeros((2, 2)), "logits": np.ones((2, 10))}
    assert select_output(outputs, None).shape == (2, 2)
    assert select_output(outputs, 1).shape == (2, 10)
    assert select_output(outputs, "logits").shape == (2, 10)
    single = np.zeros((2, 10))
    for key in (None, 0, "output"):
        assert select_output(single, key).shape == (2, 10)


def test_select_output_errors_say_what_the_model_has():
    outputs = {"aux": np.zeros(2), "logits": np.zeros(2)}
    with pytest.raises(DataError, match=r"validate.output is 2 but the model has 2 outputs "
                                        r"\(aux, logits\); use an index below 2 or a name"):
        select_output(outputs, 2)
    with pytest.raises(DataError, match="validate.output 'probs' is not an output of the model; "
                                        "its outputs are aux, logits"):
        select_output(outputs, "probs")
    with pytest.raises(DataError, match="validate.output is 'logits' but the model has one output; "
                                        "remove it"):
        select_output(np.zeros(2), "logits")


def test_output_index_from_specs():
    specs = (TensorSpec("aux", (None, 2), "float32"), TensorSpec("logits", (None, 10), "float32"))
    assert output_index(specs, None) == 0
    assert output_index(specs, "logits") == 1
    assert output_index(specs, 1) == 1
    with pytest.raises(DataError, match=r"validate.output is 2 but the model has 2 output\(s\)"):
        output_index(specs, 2)
    with pytest.raises(DataError, match="validate.output 'probs' is not an output of the model"):
        output_index(specs, "probs")
    assert output_index((), 0) == 0   # a model whose outputs are not known yet


def test_aligned_outputs_by_name_else_by_position():
    artifact = {"logits": np.ones(2), "aux": np.zeros(2)}
    original = {"aux": np.full(2, 5.0), "logits": np.full(2, 7.0)}
    pairs = aligned_outputs(artifact, original)            # the original's order, matched by name
    assert [(got[0], want[0]) for got, want in pairs] == [(0.0, 5.0), (1.0, 7.0)]
    pairs = aligned_outputs({"output_0": np.ones(2), "output_1": np.zeros(2)}, original)
    assert [(got[0], want[0]) for got, want in pairs] == [(1.0, 5.0), (0.0, 7.0)]
    with pytest.raises(DataError, match="the artifact gives 1 outputs but the original model 2; "
                                        "export every output"):
        aligned_outputs(np.ones(2), original)


def test_specs_of_keep_integer_dtypes_and_a_dynamic_batch():
    specs = specs_of({"ids": np.zeros((4, 16), np.int64), "mask": np.ones((4, 16), np.int32)})
    assert specs == (TensorSpec("ids", (None, 16), "int64"), TensorSpec("mask", (None, 16), "int32"))
    assert specs_of(np.zeros((3, 8, 8, 1), np.float32)) == (TensorSpec("input", (None, 8, 8, 1), "float32"),)


@pytest.mark.parametrize("dtype, integer", [
    ("int8", True), (np.int64, True), ("uint8", True), ("bool", True),
    ("float32", False), (np.float16, False),
])
def test_is_integer(dtype, integer):
    assert is_integer(dtype) is integer

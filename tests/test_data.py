"""tf.data Datasets and torch DataLoaders as data: read once into arrays, wrong framework refused."""
from __future__ import annotations

import numpy as np
import pytest

from compressor.core.context import Data
from compressor.tasks.array.data import dataset_framework, digits, load_data
from compressor.errors import DataError


@pytest.fixture(scope="module")
def nchw():
    return digits("NCHW")


@pytest.fixture(scope="module")
def nhwc():
    return digits("NHWC")


def _loader(split, batch_size=64, shuffle=False):
    import torch

    dataset = torch.utils.data.TensorDataset(*(torch.from_numpy(a) for a in split))
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)


def _tf_dataset(split, batch_size=64):
    from compressor.backends.keras.env import import_tensorflow

    dataset = import_tensorflow().data.Dataset.from_tensor_slices(split)
    return dataset.batch(batch_size) if batch_size else dataset


def test_dataset_framework_is_told_by_type_without_imports():
    assert dataset_framework((np.zeros(2), np.zeros(2))) is None
    assert dataset_framework("digits") is None


def test_torch_dataloaders_become_arrays(nchw):
    data = load_data(Data(train=_loader(nchw.train, shuffle=True), val=_loader(nchw.val)),
                     "NCHW", "torch")
    np.testing.assert_array_equal(data.val[0], nchw.val[0])
    np.testing.assert_array_equal(data.val[1], nchw.val[1])
    x, y = data.train
    assert x.shape == nchw.train[0].shape and x.dtype == np.float32
    # Shuffled: another order, the same (image, label) pairs.
    order, reference = np.lexsort(x.reshape(len(x), -1).T), np.lexsort(
        nchw.train[0].reshape(len(x), -1).T)
    np.testing.assert_array_equal(y[order], nchw.train[1][reference])


def test_unbatched_dataloader_and_pair_form(nchw):
    import torch

    samples = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(*(torch.from_numpy(a) for a in nchw.val)), batch_size=None)
    data = load_data((samples, _loader(nchw.val, batch_size=7)), "NCHW", "torch")
    np.testing.assert_array_equal(data.train[0], nchw.val[0])
    np.testing.assert_array_equal(data.val[1], nchw.val[1])


@pytest.mark.parametrize("batch_size", [64, 0])
def test_tf_datasets_batched_or_not_become_arrays(nhwc, batch_size):
    data = load_data(Data(train=nhwc.train, val=_tf_dataset(nhwc.val, batch_size)), "NHWC", "keras")
    np.testing.assert_array_equal(data.val[0], nhwc.val[0])
    np.testing.assert_array_equal(data.val[1], nhwc.val[1])
    assert data.train[0] is nhwc.train[0]


def test_inputs_only_dataset_has_no_labels(nchw):
    import torch

    loader = torch.utils.data.DataLoader(torch.from_numpy(nchw.val[0]), batch_size=50)
    data = load_data(Data(val=loader), "NCHW", "torch")
    assert data.val[1] is None and data.val[0].shape == nchw.val[0].shape


def test_wrong_framework_is_refused(nchw, nhwc):
    with pytest.raises(DataError, match="torch DataLoader, but the model is a keras model"):
        load_data(Data(train=nhwc.train, val=_loader(nchw.val)), "NHWC", "keras")
    with pytest.raises(DataError, match="tf.data.Dataset, but the model is a torch model"):
        load_data((_tf_dataset(nhwc.train), nhwc.val), "NCHW", "torch")


def test_one_dataset_alone_or_empty_is_a_data_error(nchw):
    with pytest.raises(DataError, match="cz.Data"):
        load_data(_loader(nchw.val), "NCHW", "torch")
    with pytest.raises(DataError, match="empty"):
        load_data(Data(val=_loader((nchw.val[0][:0], nchw.val[1][:0]))), "NCHW", "torch")

"""Models with several inputs, several outputs or integer token ids, in both frameworks,
built and trained inside the tests (seconds on digits or a synthetic token task).

`support.io_models:tiny_bert` is a `module:function` model reference (a random-init Hugging Face
BertModel: nothing is downloaded).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from compressor.core.context import Data
from compressor.tasks.array.data import digits


def image_stats(images: np.ndarray) -> np.ndarray:
    """A second input for the two-input models: 4 statistics per image."""
    axes = tuple(range(1, images.ndim))
    return np.stack([images.mean(axes), images.std(axes), images.max(axes), images.min(axes)],
                    axis=1).astype(np.float32)


def two_input_data(layout: str) -> Data:
    """digits as {"image", "meta"}; the names are the models' input names."""
    base = digits(layout)
    (x, y), (xv, yv) = base.train, base.val
    return Data(train=({"image": x, "meta": image_stats(x)}, y),
                val=({"image": xv, "meta": image_stats(xv)}, yv), name="digits+meta")


def token_data(rows: int = 600, length: int = 16, vocab: int = 20, seed: int = 0) -> Data:
    """int64 token ids; the label says whether low ids (< 8) are the majority."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (rows, length)).astype(np.int64)
    labels = (np.sum(ids < 8, axis=1) > length * 7 / 19).astype(np.int64)
    cut = rows * 3 // 4
    return Data(train=(ids[:cut], labels[:cut]), val=(ids[cut:], labels[cut:]), name="tokens")


# ---- PyTorch ---------------------------------------------------------------------------

def torch_two_inputs_dict_outputs(data: Data, epochs: int = 3) -> Any:
    """forward(image, meta) -> {"aux": (N, 2), "logits": (N, 10)}: the metric must read
    `logits`, which is not the first output."""
    import torch
    from torch import nn

    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, 3, padding=1)
            self.meta = nn.Linear(4, 8)
            self.logits = nn.Linear(8 * 64 + 8, 10)
            self.aux = nn.Linear(8 * 64 + 8, 2)

        def forward(self, image, meta):
            features = torch.cat([torch.relu(self.conv(image)).flatten(1),
                                  torch.relu(self.meta(meta))], dim=1)
            return {"aux": self.aux(features), "logits": self.logits(features)}

    return _torch_trained(TwoInputs(), data, epochs, lambda out: out["logits"])


def torch_tuple_outputs(data: Data, epochs: int = 3) -> Any:
    """forward(x) -> (logits, aux)."""
    import torch
    from torch import nn

    class TupleOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, 3, padding=1)
            self.logits = nn.Linear(8 * 64, 10)
            self.aux = nn.Linear(8 * 64, 2)

        def forward(self, x):
            features = torch.relu(self.conv(x)).flatten(1)
            return self.logits(features), self.aux(features)

    return _torch_trained(TupleOut(), data, epochs, lambda out: out[0])


def torch_token_transformer(data: Data, epochs: int = 10) -> Any:
    """Embedding + a root-level positional nn.Parameter + TransformerEncoder on int64 ids."""
    import torch
    from torch import nn

    class TokenTransformer(nn.Module):
        def __init__(self, vocab: int = 20, width: int = 32, length: int = 16):
            super().__init__()
            self.position = nn.Parameter(torch.randn(1, length, width) * 0.02)
            self.embedding = nn.Embedding(vocab, width)
            layer = nn.TransformerEncoderLayer(width, 4, 64, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 1)
            self.head = nn.Linear(width, 2)

        def forward(self, ids):
            return self.head(self.encoder(self.embedding(ids) + self.position).mean(1))

    return _torch_trained(TokenTransformer(), data, epochs, lambda out: out)


def tiny_bert() -> Any:
    """A random-init 2-layer, 32-wide BertModel (outputs last_hidden_state, pooler_output)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
    return BertModel(config).eval()


def bert_inputs(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 100, (rows, 16)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[:, 12:] = rng.integers(0, 2, (rows, 4))
    return {"input_ids": ids, "attention_mask": mask}


def _torch_trained(model: Any, data: Data, epochs: int, logits_of, lr: float = 1e-2) -> Any:
    import torch

    torch.manual_seed(0)
    x, y = data.train
    arrays = list(x.values()) if isinstance(x, dict) else [x]
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(epochs):
        for lo in range(0, len(y), 64):
            batch = [torch.as_tensor(a[lo:lo + 64]) for a in arrays]
            loss = torch.nn.functional.cross_entropy(logits_of(model(*batch)),
                                                     torch.as_tensor(y[lo:lo + 64]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


# ---- Keras -----------------------------------------------------------------------------

def keras_two_inputs_dict_outputs(data: Data, epochs: int = 3) -> Any:
    """Inputs `image` and `meta`; outputs {"aux", "logits"} (a dict, flattened by sorted key)."""
    from compressor.backends.keras.env import import_tf_keras

    keras = import_tf_keras()
    keras.utils.set_random_seed(0)
    image, meta = keras.Input((8, 8, 1), name="image"), keras.Input((4,), name="meta")
    features = keras.layers.Concatenate()([
        keras.layers.Flatten()(keras.layers.Conv2D(8, 3, padding="same", activation="relu")(image)),
        keras.layers.Dense(8, activation="relu")(meta)])
    model = keras.Model([image, meta], {"aux": keras.layers.Dense(2, name="aux")(features),
                                        "logits": keras.layers.Dense(10, name="logits")(features)})
    model.compile("adam", loss={"logits": keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), "aux": None})
    x, y = data.train
    model.fit(x, {"logits": y}, epochs=epochs, batch_size=64, verbose=0)
    return model


def torch_lstm_classifier(data: Data, epochs: int = 6) -> Any:
    """Embedding + nn.LSTM + Linear on int64 ids (the last step's hidden state)."""
    from torch import nn

    class LSTMClassifier(nn.Module):
        def __init__(self, vocab: int = 20, width: int = 32):
            super().__init__()
            self.embedding = nn.Embedding(vocab, width)
            self.lstm = nn.LSTM(width, width, batch_first=True)
            self.head = nn.Linear(width, 2)

        def forward(self, ids):
            sequence, _ = self.lstm(self.embedding(ids))
            return self.head(sequence[:, -1])

    return _torch_trained(LSTMClassifier(), data, epochs, lambda out: out)

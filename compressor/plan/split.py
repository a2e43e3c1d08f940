"""`--devices K`: the decoder layers split into K contiguous pipeline stages, one per board.

Stage 1 also holds the embedding, stage K the final norm and lm_head; every stage holds its
layers' weights and KV cache, the rotary caches, and a runtime with its working memory (the
vocabulary-wide logits only on the last). Per token each link carries one hidden state
(hidden_size values in the artifact's io dtype per sequence).
"""
from __future__ import annotations

from dataclasses import dataclass

from compressor.devices import DeviceProfile
from compressor.decoders.footprint import (
    PREFILL_TOKENS,
    RUNTIME_BASELINE_BYTES,
    Layout,
    activation_bytes,
    kv_cache_bytes,
    weight_bytes,
)
from compressor.decoders.shapes import ModelShape
from compressor.plan.llm import kv_bytes_of


@dataclass(frozen=True)
class Split:
    devices: int
    recipe: str
    stages: list[tuple[int, int, int]]      # (first_layer, last_layer, bytes)
    fits: bool
    link_bytes_per_token: int
    link_tokens_per_s_bound: float | None
    decode_tokens_per_s_bound: float | None

    def as_json(self) -> dict:
        return {"devices": self.devices, "recipe": self.recipe,
                "stages": [{"first_layer": a, "last_layer": b, "bytes": n} for a, b, n in self.stages],
                "fits": self.fits, "link_bytes_per_token": self.link_bytes_per_token,
                "link_tokens_per_s_bound": _round(self.link_tokens_per_s_bound),
                "decode_tokens_per_s_bound": _round(self.decode_tokens_per_s_bound)}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _partition(costs: list[int], k: int, first: int, last: int) -> list[tuple[int, int]]:
    """Contiguous ranges of layers over k stages minimising the largest stage (stage 0 also
    carries `first` bytes, the last stage `last`), by dynamic programming over prefixes."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[j][i]: the smallest largest-stage of layers [0, i) over j stages, and its cut
    best = [[(inf, 0)] * (n + 1) for _ in range(k + 1)]
    best[0][0] = (0, 0)
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for cut in range(j - 1, i):
                stage = prefix[i] - prefix[cut] + (first if j == 1 else 0) + (last if j == k else 0)
                value = max(best[j - 1][cut][0], stage)
                if value < best[j][i][0]:
                    best[j][i] = (value, cut)
    ranges, i = [], n
    for j in range(k, 0, -1):
        cut = best[j][i][1]
        ranges.append((cut, i - 1))
        i = cut
    return ranges[::-1]


def partition(costs: list[int], k: int, first: int, last: int) -> list[tuple[int, int]]:
    """The stages' (first_layer, last_layer) for per-layer `costs` (also an artifact's measured
    bytes: compress split), stage 0 carrying `first` more, the last stage `last`."""
    return _partition(costs, k, first, last)


def split_plan(shape: ModelShape, layout: Layout, profile: DeviceProfile, devices: int,
               context: int, batch: int, kv_dtype: str | None) -> Split:
    kv_bytes = kv_bytes_of(layout, kv_dtype)
    w = weight_bytes(shape, layout, context)
    costs = [w.per_layer[i] + kv_cache_bytes(shape, context, batch, kv_bytes, range(i, i + 1))
             for i in range(shape.num_layers)]
    p = min(context, PREFILL_TOKENS) * batch
    logits = p * shape.vocab_size * layout.io_bytes
    common = w.by_kind["rotary"] + w.by_kind["graph"] + RUNTIME_BASELINE_BYTES + \
        activation_bytes(shape, layout, context, batch) - logits
    first = w.by_kind["embedding"]
    last = w.by_kind["lm_head"] + shape.hidden_size * layout.io_bytes + logits   # + final norm
    devices = min(devices, shape.num_layers)
    ranges = _partition(costs, devices, first, last)
    stages = []
    for j, (a, b) in enumerate(ranges):
        size = sum(costs[a:b + 1]) + common + (first if j == 0 else 0) + (last if j == devices - 1 else 0)
        stages.append((a, b, size))
    usable = profile.llm_budget_bytes
    link = shape.hidden_size * layout.io_bytes * batch
    link_bound = profile.network_bandwidth / link if profile.network_bandwidth else None
    decode = None
    if profile.memory_bandwidth:
        read = w.read_per_token + kv_cache_bytes(shape, context, batch, kv_bytes)
        seconds = read / profile.memory_bandwidth + (devices - 1) * (1 / link_bound if link_bound else 0)
        decode = batch / seconds
    return Split(devices=devices, recipe=layout.recipe, stages=stages,
                 fits=all(s[2] <= usable for s in stages), link_bytes_per_token=link,
                 link_tokens_per_s_bound=link_bound, decode_tokens_per_s_bound=decode)

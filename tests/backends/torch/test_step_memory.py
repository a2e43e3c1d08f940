"""backends/torch/step_memory.py: what a training step saves for backward is stored smaller
(bit-packed masks, narrowed pool indices) and QAT's fused observers run on bfloat16
activations, without changing one value the step computes."""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

from torchao.quantization.pt2e.fake_quantize import FusedMovingAvgObsFakeQuantize  # noqa: E402
from torchao.quantization.pt2e.observer import MovingAverageMinMaxObserver  # noqa: E402

from compressor.backends.torch import step_memory  # noqa: E402
from compressor.backends.torch.step_memory import (bf16_observers,  # noqa: E402
                                                   compact_saved_tensors)


def _fake_quant(symmetric: bool) -> FusedMovingAvgObsFakeQuantize:
    scheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    return FusedMovingAvgObsFakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=-128,
                                         quant_max=127, dtype=torch.qint8, qscheme=scheme)


class _QatNet(torch.nn.Module):
    """conv -> relu -> fake-quant -> max pool, twice, as a PT2E QAT graph of a CNN runs."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.fq1, self.fq2 = _fake_quant(False), _fake_quant(False)
        self.head = torch.nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(self.fq1(torch.relu(self.conv1(x))), 2)
        x = torch.nn.functional.max_pool2d(self.fq2(torch.relu(self.conv2(x))), 2)
        return self.head(x.flatten(1))


def _step(net, x, y, bf16: bool, compact: bool):
    """Two training steps' gradients and losses (the observers move between them)."""
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    hooks = compact_saved_tensors() if compact else torch.autograd.graph.saved_tensors_hooks(
        lambda t: t, lambda t: t)
    results = []
    with hooks, bf16_observers(net, bf16):
        for _ in range(2):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.float().backward()
            results.append((loss.detach().clone(),
                            [p.grad.clone() for p in net.parameters()]))
            optimizer.step()
    return results, net


@pytest.mark.parametrize("bf16", [False, True])
def test_compacted_steps_compute_exactly_the_same_gradients(bf16, monkeypatch):
    torch.manual_seed(0)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    net = _QatNet()
    stored = []
    pack = step_memory._pack

    def recording(saved):
        packed = pack(saved)
        stored.append((saved.dtype, saved.numel() * saved.element_size(), packed))
        return packed

    monkeypatch.setattr(step_memory, "_pack", recording)
    plain, plain_net = _step(copy.deepcopy(net), x, y, bf16, compact=False)
    compact, compact_net = _step(copy.deepcopy(net), x, y, bf16, compact=True)
    for (loss_a, grads_a), (loss_b, grads_b) in zip(plain, compact):
        assert torch.equal(loss_a, loss_b)
        assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    assert torch.equal(plain_net.fq1.scale, compact_net.fq1.scale)

    masks = [(nbytes, packed) for dtype, nbytes, packed in stored if dtype == torch.bool]
    indices = [(nbytes, packed) for dtype, nbytes, packed in stored if dtype == torch.int64]
    big_masks = [(n, p) for n, p in masks if n >= 4096]
    assert big_masks and all(p.bytes.numel() * 8 >= n and p.bytes.numel() <= n // 8 + 1
                             for n, p in big_masks)
    assert indices and all(p.values.dtype == torch.int16 for n, p in indices if n >= 4096 * 8)


def test_bits_and_narrowed_integers_round_trip():
    torch.manual_seed(1)
    for shape in [(4096,), (4099,), (3, 37, 41)]:
        mask = torch.rand(shape) > 0.4
        assert torch.equal(step_memory._unpack(step_memory._pack(mask)), mask)
    strided = (torch.rand(64, 200) > 0.5)[:, ::3]
    assert torch.equal(step_memory._unpack(step_memory._pack(strided)), strided)
    for low, high, dtype in [(0, 1024, torch.int16), (-70000, 70000, torch.int32)]:
        values = torch.randint(low, high, (5000,))
        packed = step_memory._pack(values)
        assert packed.values.dtype == dtype
        assert torch.equal(step_memory._unpack(packed), values)
    wide = torch.randint(0, 2**40, (5000,))
    assert step_memory._pack(wide) is wide
    small = torch.rand(100) > 0.5
    assert step_memory._pack(small) is small


@pytest.mark.parametrize("symmetric", [False, True])
def test_bf16_observer_is_bit_exact_with_the_float32_route(symmetric):
    """The fused observer on the (min, max) pair + fake-quantize in bfloat16 == torchao's fused
    op on a float32 copy, rounded to bfloat16: outputs, ranges, scale, zero point, gradients,
    with the observer on and off and fake quantization off."""
    torch.manual_seed(2)
    reference, ours = _fake_quant(symmetric), _fake_quant(symmetric)
    holder = torch.nn.Sequential(ours)
    for step in range(6):
        if step == 3:
            reference.observer_enabled.fill_(0)
            ours.observer_enabled.fill_(0)
        if step == 5:
            reference.fake_quant_enabled.fill_(0)
            ours.fake_quant_enabled.fill_(0)
        x = ((torch.randn(4, 8, 6, 6) * (step + 1) + step).bfloat16()).requires_grad_()
        x_float = x.detach().float().requires_grad_()
        expected = reference(x_float)
        with bf16_observers(holder, True):
            got = holder(x)
        assert got.dtype == torch.bfloat16
        assert torch.equal(expected.bfloat16(), got)
        for name in ("scale", "zero_point"):
            assert torch.equal(getattr(reference, name), getattr(ours, name))
        for name in ("min_val", "max_val"):
            assert torch.equal(getattr(reference.activation_post_process, name),
                               getattr(ours.activation_post_process, name))
        grad = torch.randn_like(x_float)
        expected.backward(grad)
        got.backward(grad.bfloat16())
        assert torch.equal(x_float.grad.bfloat16(), x.grad)
    assert "forward" not in vars(ours)   # restored on exit


def test_a_bf16_step_makes_no_float32_activation():
    """Under bf16_observers + autocast no op of a step's forward or backward makes a float32
    tensor of an activation's shape (the float32 route copied every activation to float32 and
    back, and its gradient too): the step's largest tensors are all bfloat16."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Float32Activations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.made = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for value in (out if isinstance(out, (tuple, list)) else [out]):
                if (isinstance(value, torch.Tensor) and value.dtype == torch.float32
                        and value.dim() == 4 and value.shape[:2] == (8, 16)):
                    self.made.append(str(func))
            return out

    torch.manual_seed(3)
    net, x = _QatNet(), torch.randn(8, 3, 16, 16)
    with bf16_observers(net, True), Float32Activations() as watch:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(net(x), torch.zeros(8, dtype=torch.long))
        loss.float().backward()
    assert not watch.made, watch.made

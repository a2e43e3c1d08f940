"""int4 QAT for language models (`int4_qat`, backends/llm/qat.py, fake_quant.py): the fake-quant
forward is the stored grid, the trained integers are what every artifact stores (read back from
the .gguf), the run ends closer to the float model than `int4`, and bf16 training runs."""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xllamacpp")

import compressor as cz  # noqa: E402
from compressor.backends.llm import fake_quant  # noqa: E402
from compressor.backends.llm.load import load_lm  # noqa: E402
from compressor.backends.llm.quantize import WeightOnlyPlan, quantize_lm  # noqa: E402
from compressor.config.steps import QuantizeConfig  # noqa: E402
from compressor.core.progress import Progress  # noqa: E402
from compressor.tasks.lm.text_data import TextData  # noqa: E402
from support.gguf_readback import assert_holds  # noqa: E402

START = WeightOnlyPlan(bits=4, group_size=32, algorithm="rtn", symmetric=True)


def test_the_fake_quant_forward_is_the_stored_grid(random_lm_dir):
    """Before any step the student computes exactly the int4 model; the integers read back
    are the starting ones; after steps they are what the forward computes with."""
    import copy

    loaded = load_lm(random_lm_dir("llama"))
    start = quantize_lm(loaded, START, None)
    student = copy.deepcopy(loaded.model)
    attached = fake_quant.attach(student, start, learn_scales=True)
    reference = copy.deepcopy(loaded.model)
    reference.load_state_dict(loaded.with_quantized(start).dequantized_state_dict())
    ids = torch.randint(4, 500, (2, 24))
    with torch.no_grad():
        assert torch.equal(student(input_ids=ids).logits, reference(input_ids=ids).logits)
    head = student.get_output_embeddings()
    assert torch.equal(head.weight, student.get_input_embeddings().weight)   # still tied
    optimizer = torch.optim.SGD([p for p in student.parameters() if p.requires_grad], lr=1.0)
    student(input_ids=ids).logits.square().sum().backward()
    optimizer.step()
    with torch.no_grad():
        computed = {name: module.weight.clone() for name, module in (
            ("model.layers.0.self_attn.q_proj.weight", student.model.layers[0].self_attn.q_proj),
            ("model.embed_tokens.weight", student.model.embed_tokens))}
    trained = fake_quant.detach(student, attached)
    assert set(trained) == set(start)
    moved = sum(int((trained[n].q != start[n].q).sum()) for n in start)
    assert moved > 0
    for name, weight in computed.items():
        assert torch.equal(trained[name].dequantize(), weight)   # what the forward used
        assert torch.equal(trained[name].scales, trained[name].scales.to(torch.bfloat16).float())


def test_the_fake_quant_gradient_is_the_straight_through_one():
    """The memory-lean autograd Function's gradients equal those of the plain expression
    (round passed straight through, clamp's mask, LSQ's scale gradient), clamped codes included."""
    torch.manual_seed(0)
    groups = torch.randn(6, 4, 32, requires_grad=True)
    scales = (groups.detach().abs().amax(-1, keepdim=True) / 9).requires_grad_()  # some clamp
    zeros = torch.full((6, 4, 1), 8.0)
    upstream = torch.randn(6, 4, 32)

    x = groups / scales
    q = torch.clamp(x + (torch.round(x) - x).detach() + zeros, 0, 15)
    ((q - zeros) * scales * upstream).sum().backward()
    expected = groups.grad.clone(), scales.grad.clone()
    groups.grad = scales.grad = None

    out = fake_quant._GroupFakeQuant.apply(groups, scales, zeros, 15, torch.float32)
    assert torch.equal(out, ((q - zeros) * scales).detach())
    (out * upstream).sum().backward()
    assert torch.allclose(groups.grad, expected[0], atol=1e-6)
    assert torch.allclose(scales.grad, expected[1], rtol=1e-5, atol=1e-5)
    assert (groups.grad == 0).any()   # the clamped ones got no gradient


def test_bf16_weights_read_float32_masters(random_lm_dir):
    """Inside bf16_weights the model computes in bfloat16 while its parameters (tied table
    included) stay float32 and take the gradients; leaving restores plain float32 weights."""
    from compressor.backends.llm.master_weights import bf16_weights

    model = load_lm(random_lm_dir("llama")).model.float()
    masters = {name: p for name, p in model.named_parameters()}
    ids = torch.randint(4, 500, (2, 16))
    with bf16_weights(model, True):
        assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
        logits = model(input_ids=ids).logits
        assert logits.dtype == torch.bfloat16
        logits.float().square().mean().backward()
        assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.abs().sum() > 0
                   for p in model.parameters())
    after = dict(model.named_parameters())
    assert after.keys() == masters.keys() and all(after[n] is masters[n] for n in masters)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32


def _scheme(**training):
    step = QuantizeConfig(**{"mode": "qat", "dtype": "int4", "epochs": 1, "batch_size": 4,
                             "lr": 2e-4, **training})
    return step.scheme


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trained_integers_are_what_the_gguf_stores(precision, random_lm_dir, tmp_path):
    from compressor.backends.llm.gguf_write import write_gguf_model
    from compressor.backends.llm.qat import train
    from compressor.core.context import Context, Data, ModelState

    loaded = load_lm(random_lm_dir("llama"))
    windows = TextData(calibration_windows=8, window=64).windows(loaded.tokenizer)[0]
    scheme = _scheme(precision=precision)
    start = quantize_lm(loaded, START, None)
    model, facts = train(loaded, start, windows, scheme, Progress(quiet=True))
    assert facts["precision"] == precision and facts["steps"] == 2 and facts["tokens"] == 512
    assert facts["val_windows"] == 0      # 8 windows spare none to judge the epochs
    trained = model.quantized
    assert facts["peak_rss_bytes"] > 0 and facts["seconds"] > 0
    assert facts["peak_heap_increase_bytes"] > 0
    assert any(not torch.equal(trained[n].q, start[n].q) for n in start)
    ctx = Context(data=Data(), progress=Progress(quiet=True), workdir=tmp_path, context=64)
    state = ModelState(model=model, scheme=scheme)
    path = write_gguf_model(state, scheme, tmp_path / "model.gguf", ctx)
    assert assert_holds(path, trained, loaded.config) == len(start)


def test_too_little_text_is_refused_before_training(random_lm_dir):
    from compressor.backends.llm.qat import train
    from compressor.errors import DataError

    loaded = load_lm(random_lm_dir("llama"))
    windows = TextData(calibration_windows=4, window=32).windows(loaded.tokenizer)[0]
    with pytest.raises(DataError, match="at least 8 training windows"):
        train(loaded, quantize_lm(loaded, START, None), windows, _scheme(), Progress(quiet=True))


@pytest.mark.slow
def test_int4_qat_ends_closer_to_float_than_int4_in_every_format(trained_lm_dir, int4_gguf_run,
                                                                 tmp_path):
    result = cz.compress(str(trained_lm_dir), recipe="int4_qat", data="text", latency=False,
                         out_dir=tmp_path / "qat", formats=("onnx", "tflite", "gguf"))
    assert result.exit_code == 0, result.report["failures"]
    qat = {row["format"]: row for row in result.report["artifacts"]}
    training = result.report["training"]
    (ptq,) = int4_gguf_run[2]["artifacts"]   # int4 on the same model, the same windows
    print({k: round(v["perplexity_increase"], 5) for k, v in qat.items()}, ptq["perplexity_increase"])
    # closer than int4 in every file (this tiny model's int4 is already +0.83% since int4's
    # candidates improved, and QAT ends at +0.71-0.76%; the 0.6x target is the bench's, on
    # the bench Llama and SmolLM2-135M)
    for row in qat.values():
        assert row["perplexity_increase"] <= 0.95 * ptq["perplexity_increase"], row["format"]
    assert qat["gguf"]["size_bytes"] == pytest.approx(ptq["size_bytes"], rel=0.005)
    # one set of integers: the three runtimes agree on it
    increases = [row["perplexity_increase"] for row in qat.values()]
    assert max(increases) - min(increases) <= 0.003
    assert training["loss_last"] < training["loss_first"]
    assert training["precision"] == "fp32" and training["steps"] > 0
    # each epoch judged on held-back calibration windows, the best kept (keep_best)
    (history,) = result.report["history"]
    assert history["step"] == "int4 QAT" and history["metric"] == "neg_val_loss"
    assert training["val_windows"] > 0 and len(history["epochs"]) == 2
    best = max(history["epochs"], key=lambda e: e["val_metric"])
    assert history["best_epoch"] == training["kept_epoch"] == best["epoch"]


def test_int4_qat_is_listed_and_planned_like_int4():
    from compressor.plan import plan

    names = [r.name for r in cz.list_recipes()] if hasattr(cz, "list_recipes") else None
    if names is not None:
        assert "int4_qat" in names
    plans = {p["recipe"]: p for p in plan("llama-3.1-8b", target="jetson-orin-nx-8gb",
                                          context=1024, recipes=["int4", "int4_qat"])["plans"]}
    assert plans["int4_qat"]["weights_bytes"] == plans["int4"]["weights_bytes"]
    assert dataclasses.is_dataclass(_scheme())


@pytest.mark.parametrize("hard_weight, loss", [(0.0, "kl"), (0.3, "kl"), (0.5, "mse")])
def test_the_loss_summed_window_by_window_is_the_batch_loss(random_lm_dir, monkeypatch,
                                                             hard_weight, loss):
    """A big vocabulary's loss runs a few windows at a time under checkpointing: the same
    value and the same gradients as the whole batch at once."""
    import copy

    from compressor.backends.llm import lm_train

    loaded = load_lm(random_lm_dir("llama"))
    teacher = lm_train.frozen_teacher(loaded.model, bf16=False)
    ids = torch.randint(4, 500, (5, 24))
    results = []
    for chunk in (1 << 30, 2 * 23 * 512 * 4):     # one chunk; 2 windows per chunk
        monkeypatch.setattr(lm_train, "CHUNK_BYTES", chunk)
        student = copy.deepcopy(loaded.model).train()
        with torch.no_grad():   # a student unlike its teacher
            for parameter in student.parameters():
                parameter.mul_(1.1)
        value = lm_train.distillation_loss(student, teacher, ids, 2.0, hard_weight, False, loss)
        value.backward()
        results.append((value.detach(), student.model.layers[0].mlp.up_proj.weight.grad.clone()))
    (whole, whole_grad), (chunked, chunked_grad) = results
    assert float(whole) > 0
    assert torch.allclose(whole, chunked, rtol=1e-5)
    assert torch.allclose(whole_grad, chunked_grad, rtol=1e-4, atol=1e-9)

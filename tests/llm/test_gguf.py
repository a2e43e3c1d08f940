"""A .gguf file as model input: written in the test from tiny random Llama / Mistral / Qwen2 /
Qwen3 models (F32, F16, BF16, Q8_0, Q4_0, Q4_1; Q5_0, Q5_1 and synthetic K-quant blocks on a
Llama with 256-wide rows), loaded with load_gguf and compared with the same weights from a
Hugging Face folder, with transformers' own dequantization and with gguf.quants.dequantize of
the file's blocks."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from compressor.backends.llm.gguf import load_gguf  # noqa: E402
from compressor.backends.llm.quantize import (WeightOnlyPlan, quantize_lm,  # noqa: E402
                                               quantized_weight_names)
from compressor.errors import ModelLoadError  # noqa: E402
from support import tiny_lm  # noqa: E402
from support.gguf_writer import write_gguf, write_header_only  # noqa: E402

DEQUANTIZED = "weights dequantized (no recipe writes that grid: an integer recipe quantizes them again)"
PROMPT = "It was the best of times, it was the worst of times, it was the age of wisdom."
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _models(tokenizer) -> dict[tuple[str, bool], object]:
    """(family, tied) -> a random-init tiny model (tiny_lm's shapes; Qwen3 is not one of its
    families). Qwen2's q/k biases start at zero in transformers: made to count."""
    untied = {"tie_word_embeddings": False}
    qwen2 = tiny_lm.random_lm(tokenizer, "qwen2", **untied)
    with torch.no_grad():
        for layer in qwen2.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.2)
            layer.self_attn.k_proj.bias.normal_(0, 0.2)
    torch.manual_seed(0)
    qwen3 = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **{**tiny_lm.TINY, "vocab_size": len(tokenizer), **untied})).eval()
    return {("llama", False): tiny_lm.random_lm(tokenizer, "llama", **untied),
            ("llama", True): tiny_lm.random_lm(tokenizer, "llama"),
            ("mistral", False): tiny_lm.random_lm(tokenizer, "mistral", **untied),
            ("qwen2", False): qwen2, ("qwen3", False): qwen3}


@pytest.fixture(scope="module")
def kit(tmp_path_factory, lm_tokenizer):
    """The session tokenizer, models, their HF folders and .gguf files (written once each)."""
    root = tmp_path_factory.mktemp("gguf")
    models = _models(lm_tokenizer)
    files: dict[tuple, Path] = {}

    def gguf(family="llama", linear="F32", tied=False, embedding=None) -> Path:
        key = (family, linear, tied, embedding)
        if key not in files:
            name = f"{family}-{'tied' if tied else 'untied'}-{linear}-{embedding}.gguf"
            files[key] = write_gguf(models[(family, tied)], lm_tokenizer, root / name, linear,
                                    embedding=embedding)
        return files[key]

    def folder(family="llama", tied=False) -> Path:
        path = root / f"hf-{family}-{tied}"
        if not path.exists():
            tiny_lm.save_hf_folder(models[(family, tied)], lm_tokenizer, path)
        return path

    ids = torch.tensor([lm_tokenizer(PROMPT)["input_ids"]])
    return {"tokenizer": lm_tokenizer, "models": models, "gguf": gguf, "folder": folder,
            "ids": ids}


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.to(torch.float32)


def _transformers_fp32(path: Path, loaded):
    """transformers' own float32 dequantization of the file (the reference grid); head_dim
    given as load_gguf does (transformers 5.24 does not read Qwen3's from the file)."""
    extra = {"head_dim": loaded.config.head_dim} if loaded.config.model_type == "qwen3" else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, **extra)
    return dict(model.named_parameters(remove_duplicate=False)), model.eval()


def test_f32_file_matches_its_hf_folder(kit):
    loaded = load_gguf(kit["gguf"]("llama", "F32"))
    folder = transformers.AutoModelForCausalLM.from_pretrained(kit["folder"]()).eval()
    assert loaded.model.dtype == torch.float32 and loaded.source is None
    assert loaded.file_grids == {} and set(loaded.grids_on(4, 32)) == set()
    assert torch.equal(_logits(loaded.model, kit["ids"]), _logits(folder, kit["ids"]))
    assert loaded.tokenizer(PROMPT)["input_ids"] == kit["tokenizer"](PROMPT)["input_ids"]
    assert loaded.tokenizer.decode(kit["ids"][0], skip_special_tokens=True) == PROMPT
    assert loaded.tokenizer.chat_template == kit["tokenizer"].chat_template


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_f16_file_loads_in_float16_and_matches_the_folder(kit, family):
    loaded = load_gguf(kit["gguf"](family, "F16"))
    assert loaded.model.dtype == torch.float16
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float16}
    # the folder's fp32 weights rounded to fp16, as the file stores them: identical logits
    half = transformers.AutoModelForCausalLM.from_pretrained(kit["folder"](family),
                                                             dtype=torch.float16).eval()
    assert torch.equal(_logits(loaded.model, kit["ids"]), _logits(half, kit["ids"]))
    gap = _logits(loaded.model, kit["ids"]) - _logits(kit["models"][(family, False)], kit["ids"])
    assert gap.abs().max() < 2e-3


def test_bf16_file_loads_in_bfloat16(kit):
    loaded = load_gguf(kit["gguf"]("llama", "BF16"))
    assert loaded.model.dtype == torch.bfloat16
    half = transformers.AutoModelForCausalLM.from_pretrained(kit["folder"](),
                                                             dtype=torch.bfloat16).eval()
    assert torch.equal(_logits(loaded.model, kit["ids"]), _logits(half, kit["ids"]))


def test_loaded_model_and_tokenizer_save_as_a_plain_hf_folder(kit, tmp_path):
    """What an exporter does with a LoadedLm whose source is None."""
    loaded = load_gguf(kit["gguf"]("llama", "Q4_0"))
    loaded.model.save_pretrained(tmp_path / "hf")
    loaded.tokenizer.save_pretrained(tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert model.dtype == torch.float16 and "quantization_config" not in model.config.to_dict()
    assert torch.equal(_logits(model, kit["ids"]), _logits(loaded.model, kit["ids"]))
    assert tokenizer(PROMPT)["input_ids"] == kit["tokenizer"](PROMPT)["input_ids"]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_q4_0_linears_come_back_on_their_own_grid_exactly(kit, family):
    path = kit["gguf"](family, "Q4_0")
    loaded = load_gguf(path)
    reference, reference_model = _transformers_fp32(path, loaded)
    expected = {f"model.layers.{i}.{'self_attn' if n in LINEARS[:4] else 'mlp'}.{n}.weight"
                for i in range(2) for n in LINEARS} | {"lm_head.weight",
                                                       "model.embed_tokens.weight"}
    assert set(loaded.file_grids) == expected == set(loaded.grids_on(4, 32))
    assert set(loaded.grids_on(4, 128)) == set() and set(loaded.grids_on(8, 32)) == set()
    for name, grid in loaded.file_grids.items():
        assert (grid.bits, grid.group_size) == (4, 32)
        assert (grid.zeros == 8).all()
        # bit-identical to transformers' dequantization (llama: q/k rows un-permuted)
        assert (grid.dequantize() - reference[name]).abs().max().item() == 0.0
        weight = dict(loaded.model.named_parameters(remove_duplicate=False))[name]
        assert torch.equal(grid.dequantize().to(torch.float16), weight)
    assert loaded.model.dtype == torch.float16
    assert loaded.notes == ("gguf: 16 Q4_0 weights kept on the file's own grid (exact)",)
    gap = _logits(loaded.model, kit["ids"]) - _logits(reference_model, kit["ids"])
    assert gap.abs().max() < 2e-3


def test_tied_q4_0_head_is_named_as_the_quantize_pass_names_it(kit):
    loaded = load_gguf(kit["gguf"]("llama", "Q4_0", tied=True))
    assert loaded.model.config.tie_word_embeddings
    names = quantized_weight_names(loaded.model)
    assert set(loaded.file_grids) == set(names) and len(names) == 15
    head = loaded.model.get_output_embeddings().weight
    tied_name = next(n for n in names if not n.startswith("model.layers."))
    assert torch.equal(loaded.file_grids[tied_name].dequantize().half(), head)


def test_int4_pass_keeps_the_file_grid_and_quantizes_the_rest(kit):
    """Q4_0 linears, Q8_0 embeddings: the int4 group-32 pass keeps every Q4_0 grid as is
    and rounds only the embedding and lm_head."""
    loaded = load_gguf(kit["gguf"]("llama", "Q4_0", embedding="Q8_0"))
    kept = set(loaded.grids_on(4, 32))
    assert len(kept) == 14 and not any("embed" in n or "lm_head" in n for n in kept)
    result = quantize_lm(loaded, WeightOnlyPlan(bits=4, group_size=32, algorithm="rtn"), None)
    assert set(result) == set(quantized_weight_names(loaded.model))
    assert all(result[name] is loaded.file_grids[name] for name in kept)


def test_q4_1_is_left_to_the_recipe_by_default(kit):
    """Q4_1's zero points -m/d are not integers: the recipe quantizes those tensors again
    from the file's values (the loaded model holds them exactly)."""
    path = kit["gguf"]("llama", "Q4_1")
    loaded = load_gguf(path)
    assert loaded.file_grids == {} and set(loaded.grids_on(4, 32)) == set()
    assert loaded.notes == ("gguf: 16 Q4_1 weights left to the recipe (zero points -m/d are "
                            "not integers): quantized again from the file's values",)
    reference, reference_model = _transformers_fp32(path, loaded)
    gap = _logits(loaded.model, kit["ids"]) - _logits(reference_model, kit["ids"])
    assert gap.abs().max() < 2e-3


def test_q4_1_kept_on_request_within_half_a_step(kit):
    """keep_q4_1: per group, the error is at most rounding the zero point with scale d
    (|z - (-m/d)| * d <= d / 2 on every weight), read against the file's own d and m."""
    from gguf import GGUFReader

    from compressor.backends.llm import gguf as gguf_module
    from compressor.backends.llm import gguf_blocks

    path = kit["gguf"]("llama", "Q4_1")
    loaded = load_gguf(path, keep_q4_1=True)
    assert len(set(loaded.grids_on(4, 32))) == 16
    assert loaded.notes == ("gguf: 16 Q4_1 weights kept with their zero points rounded to "
                            "integers",)
    checked = 0
    for tensor in GGUFReader(path).tensors:
        name = gguf_module._param_name(tensor.name)
        if name not in loaded.file_grids:
            continue
        order = gguf_module._row_order(tensor.name, "llama", loaded.config, tensor.data.shape[0])
        codes, d, m = gguf_blocks.unpack_blocks(tensor.data, gguf_blocks.Q4_1, order)
        exact = gguf_blocks.exact_weight(codes, d, m).reshape(*d.shape, 32)
        grid = loaded.file_grids[name]
        rms = (grid.dequantize().reshape(exact.shape) - exact).pow(2).mean(-1).sqrt()
        # zero point rounded, scale d (a d = 0 block, e.g. the zeroed padding row, is exact)
        ratio = torch.where(d > 0, m / d.clamp(min=1e-30), torch.zeros_like(d))
        plain = (torch.round(-ratio) + ratio).abs() * d
        assert (rms <= plain + 1e-7).all() and (plain <= d / 2 + 1e-7).all()
        checked += 1
    assert checked == 16


def test_q8_0_is_dequantized_only(kit):
    loaded = load_gguf(kit["gguf"]("llama", "Q8_0"))
    assert loaded.file_grids == {} and loaded.model.dtype == torch.float16
    assert loaded.notes == (f"gguf: 16 Q8_0 {DEQUANTIZED}",)


@pytest.fixture(scope="module")
def wide(kit, tmp_path_factory):
    """kit's tokenizer on a Llama whose rows are 256 wide (K-quant super-blocks), untied;
    `wide(linear, embedding=None)` writes (once) and returns its .gguf."""
    root = tmp_path_factory.mktemp("wide")
    model = tiny_lm.random_lm(kit["tokenizer"], "llama", hidden_size=256,
                              intermediate_size=512, head_dim=64, tie_word_embeddings=False)
    files: dict[tuple, Path] = {}

    def gguf(linear: str, embedding: str | None = None) -> Path:
        if (linear, embedding) not in files:
            files[linear, embedding] = write_gguf(model, kit["tokenizer"],
                                                  root / f"wide-{linear}-{embedding}.gguf",
                                                  linear, embedding=embedding)
        return files[linear, embedding]

    return gguf


def _file_weights(path: Path, loaded) -> dict[str, tuple[str, torch.Tensor]]:
    """Parameter name -> (ggml type, gguf.quants.dequantize of the file's raw blocks, rows in
    transformers' order) for every tensor load_gguf maps to a parameter."""
    from gguf import GGUFReader, quants

    from compressor.backends.llm import gguf as gguf_module

    found = {}
    for tensor in GGUFReader(path).tensors:
        name = gguf_module._param_name(tensor.name)
        if name is None:
            continue
        values = quants.dequantize(tensor.data, tensor.tensor_type)
        order = gguf_module._row_order(tensor.name, "llama", loaded.config, values.shape[0])
        if order is not None:
            values = values[order.numpy()]
        found[name] = (tensor.tensor_type.name, torch.from_numpy(np.ascontiguousarray(values)))
    return found


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                  "Q4_K", "Q5_K", "Q6_K", "F16", "BF16"])
def test_every_common_type_loads_as_gguf_dequantizes_it(wide, kind):
    """Each weight is gguf.quants.dequantize of the file's blocks, cast to the model's dtype
    (bit for bit); the notes say per type what was kept and what dequantized. K-quant blocks
    are synthetic (support/gguf_writer.k_blocks): random codes, d from the float weights."""
    loaded = load_gguf(wide(kind))
    dtype = torch.bfloat16 if kind == "BF16" else torch.float16
    assert loaded.model.dtype == dtype
    params = dict(loaded.model.named_parameters(remove_duplicate=False))
    weights = _file_weights(wide(kind), loaded)
    assert len(weights) == 16 and {t for t, _ in weights.values()} == {kind}
    for name, (_, values) in weights.items():
        assert torch.equal(values.to(dtype), params[name]), name
    assert set(loaded.file_grids) == (set(weights) if kind == "Q4_0" else set())
    notes = {"Q4_0": ("gguf: 16 Q4_0 weights kept on the file's own grid (exact)",),
             "Q4_1": ("gguf: 16 Q4_1 weights left to the recipe (zero points -m/d are not "
                      "integers): quantized again from the file's values",),
             "F16": (), "BF16": ()}
    assert loaded.notes == notes.get(kind, (f"gguf: 16 {kind} {DEQUANTIZED}",))
    assert torch.isfinite(_logits(loaded.model, torch.tensor([[1, 5, 9, 200]]))).all()


def test_k_quant_mix_notes_each_type(wide):
    """A Q4_K_M-like file: Q4_K linears, Q6_K embedding and output; one note per type."""
    loaded = load_gguf(wide("Q4_K", embedding="Q6_K"))
    assert loaded.file_grids == {}
    assert loaded.notes == (f"gguf: 14 Q4_K {DEQUANTIZED}", f"gguf: 2 Q6_K {DEQUANTIZED}")


def test_synthetic_k_blocks_follow_the_float_weights_scale():
    """d from each block's largest |value|: the dequantized block stays within about that."""
    from gguf import GGMLQuantizationType, quants

    from support.gguf_writer import k_blocks

    values = np.random.default_rng(1).normal(0, 0.05, (4, 512)).astype(np.float32)
    for kind in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"):
        raw = k_blocks(values, kind, seed=3)
        assert np.array_equal(raw, k_blocks(values, kind, seed=3))
        weights = quants.dequantize(raw, getattr(GGMLQuantizationType, kind))
        assert weights.shape == values.shape and np.isfinite(weights).all()
        peak = np.abs(values.reshape(4, 2, 256)).max(-1)
        assert (np.abs(weights.reshape(4, 2, 256)).max(-1) <= 1.01 * peak).all(), kind
        assert weights.std() > 0.1 * values.std(), kind


def test_q4_1_int_grid_edge_groups():
    """All-positive groups (zero point below 0) and constant groups (d = 0) fall back to
    their own min-max grid; ordinary groups keep their codes."""
    import numpy as np

    from compressor.backends.llm import gguf_blocks

    d = torch.tensor([[0.01, 0.0, 0.02]])
    m = torch.tensor([[-0.05, 0.3, 0.5]])
    codes = torch.randint(0, 16, (1, 96), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    exact = gguf_blocks.exact_weight(codes, d, m)
    grid = gguf_blocks.q41_on_int_grid(codes.clone(), d, m)
    error = (grid.dequantize() - exact).abs().reshape(3, 32).amax(-1)
    assert error[0] <= 0.005 + 1e-7 and torch.equal(grid.q[0, :32], codes[0, :32])
    assert error[1] < 1e-6                       # a constant group is exact on 0 .. 15 grid
    assert error[2] <= (0.5 + 15 * 0.02) / 15 / 2 + 1e-6
    assert np.array_equal(gguf_blocks.unpermute_rows(8, 2).numpy(), [0, 2, 1, 3, 4, 6, 5, 7])


def _message(path: Path) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_gguf(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_truncated_gguf_is_refused_in_one_line(kit, tmp_path):
    data = kit["gguf"]("llama", "Q4_0").read_bytes()
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(data[: len(data) // 2])
    assert _message(truncated).startswith(f"{truncated} is a corrupt or truncated GGUF file (")
    assert _message(truncated).endswith("); download or convert it again")


def test_a_text_file_named_gguf_is_refused(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_text("not a model\n")
    assert _message(fake) == (f"{fake} is not a GGUF file (it does not start with the GGUF "
                              "magic bytes); give a .gguf written by llama.cpp or a Hugging "
                              "Face model folder")
    assert _message(tmp_path / "missing.gguf") == (f"model {tmp_path / 'missing.gguf'} does "
                                                   "not exist; check the path")


def test_a_type_no_python_dequantizer_reads_is_refused_in_one_line(kit):
    from importlib.metadata import version

    path = kit["gguf"]("llama", "Q8_1", embedding="F16")
    assert _message(path) == (
        f"{path}: 14 tensors (blk.0.attn_q.weight, ...) are stored as Q8_1, which no Python "
        f"dequantizer reads (gguf {version('gguf')}); give a file in F32, F16, BF16, Q4_0, "
        "Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K")


def test_a_type_id_gguf_does_not_know_is_refused_in_one_line(kit, tmp_path):
    """A newer llama.cpp type: GGUFReader cannot map the id; the refusal says so."""
    from importlib.metadata import version

    from gguf import GGUFReader

    path = tmp_path / "newer.gguf"
    path.write_bytes(kit["gguf"]("llama", "Q4_0").read_bytes())
    reader = GGUFReader(path, "r+")
    reader.tensors[0].field.parts[-2][0] = 250    # n_dims, dims, type, offset: the type id
    reader.data.flush()
    del reader
    assert _message(path) == (
        f"{path} holds tensors of ggml type id 250, which the gguf package "
        f"{version('gguf')} does not know; give a file in F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
        "Q5_1, Q8_0, Q2_K .. Q6_K, or upgrade gguf if a newer one reads that type")


@pytest.mark.parametrize("architecture", ["gpt2", "made-up"])
def test_unsupported_architecture_is_refused(tmp_path, architecture):
    path = write_header_only(tmp_path / "other.gguf", architecture)
    assert _message(path) == (f"{path}: GGUF architecture '{architecture}' is not supported "
                              "(supported: llama, qwen2, qwen3); convert the model to "
                              "a Hugging Face folder and give that")


@pytest.fixture(scope="module")
def trained_q4_0(trained_lm_dir, lm_tokenizer, tmp_path_factory) -> Path:
    """The session's trained tiny Llama as a Q4_0 .gguf (linears and the tied embedding)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(trained_lm_dir).eval()
    return write_gguf(model, lm_tokenizer, tmp_path_factory.mktemp("q4") / "tiny-q4_0.gguf",
                      "Q4_0")


@pytest.mark.slow
def test_int4_on_a_q4_0_file_keeps_its_grid_and_costs_no_perplexity(trained_q4_0, tmp_path):
    import json

    from conftest import run_cli

    before = trained_q4_0.read_bytes()
    out = tmp_path / "int4"
    result = run_cli("--recipe", "int4", str(trained_q4_0), "--format", "onnx", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    (row,) = report["artifacts"]
    # the baseline is the file's own model in torch; the artifact stores the same integers
    assert abs(row["perplexity_increase"]) <= 0.005 and row["weight_bits"] == 4
    assert any("Q4_0 weights kept on the file's own grid" in note for note in report["notes"])
    assert trained_q4_0.read_bytes() == before


@pytest.mark.slow
def test_fp16_on_a_q4_0_file_exports_the_dequantized_weights(trained_q4_0, tmp_path):
    import json

    from conftest import run_cli

    out = tmp_path / "fp16"
    result = run_cli("--recipe", "fp16", str(trained_q4_0), "--format", "onnx", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = json.loads((out / "report.json").read_text())["artifacts"]
    assert abs(row["perplexity_increase"]) <= 0.005 and row["weight_bits"] == 16


@pytest.mark.slow   # 5-16 s on two shared cores (compress, perplexity, ONNX export)
def test_int4_on_a_q4_k_file_quantizes_the_dequantized_weights(wide, tmp_path):
    """End to end: the int4 recipe runs on a Q4_K file (its grid is not int4's: every weight
    is quantized again from the dequantized values) and report.json says so."""
    import compressor as cz

    result = cz.compress(str(wide("Q4_K")), recipe="int4", data="text", out_dir=tmp_path / "out",
                         formats=("onnx",), latency=False)
    assert result.exit_code == 0, result.report["failures"]
    assert f"gguf: 16 Q4_K {DEQUANTIZED}" in result.report["notes"]
    (row,) = result.report["artifacts"]
    assert row["weight_bits"] == 4

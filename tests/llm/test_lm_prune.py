"""Width pruning and distillation of language models (backends/llm/width_prune.py,
lm_steps.py, lm_train.py; recipe lm_prune30_kd): the pruned model is an ordinary config of its
family that reloads in transformers, the importance ranking drops what carries nothing,
distillation recovers part of what pruning lost, and what cannot be pruned is refused in one
line, exit 2."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import compressor as cz  # noqa: E402
import compressor.backends.llm.lm_steps as lm_steps  # noqa: E402
import compressor.backends.llm.width_prune as width_prune  # noqa: E402
from compressor.backends.llm import LlmBackend  # noqa: E402
from compressor.backends.llm.load import load_lm  # noqa: E402
from compressor.config.steps import DistillConfig, PruneConfig  # noqa: E402
from compressor.core.context import Context, ModelState  # noqa: E402
from compressor.core.progress import Progress  # noqa: E402
from compressor.tasks.lm.metrics import perplexity  # noqa: E402
from compressor.tasks.lm.windows import text_windows  # noqa: E402

PRUNE30 = PruneConfig(structure="channel", sparsity=0.3, epochs=0)


def _context(loaded, tmp_path: Path, calibration: int = 16, window: int = 64) -> Context:
    data = text_windows(loaded, "text", {"calibration_windows": calibration,
                                         "eval_windows": 8, "window": window})
    return Context(data=data, progress=Progress(quiet=True), workdir=tmp_path, teacher=loaded)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3_text"])
def test_width_pruning_keeps_a_valid_config_that_reloads(family, random_lm_dir, tmp_path):
    """Tiny Llama (hidden 64, 4 heads / 2 KV heads of 16, MLP 128, a 512-token table = 31% of
    it): sparsity 0.3 = 30% of the parameters: 106,816 -> 69,952 (0.65x): 2 query heads on 1
    KV head, MLP 64 channels (the multiple of 32 nearest to the share's 77) per layer."""
    import transformers

    loaded = load_lm(random_lm_dir(family))
    ctx = _context(loaded, tmp_path)
    pruned = lm_steps.prune(ModelState(model=loaded), PRUNE30, ctx).model
    config = pruned.config
    assert config.num_attention_heads % config.num_key_value_heads == 0
    assert (config.num_key_value_heads, config.intermediate_size, config.head_dim) == (1, 64, 16)
    before, after = width_prune.params(loaded.model), width_prune.params(pruned.model)
    assert after <= 0.72 * before, (before, after)
    if family == "llama":
        assert (before, after) == (106_816, 69_952)
    assert ctx.record.notes["pruning"]["params_after"] == after
    pruned.model.save_pretrained(tmp_path / "pruned")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval()
    ids = torch.as_tensor(ctx.data.val[0][:2])
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, pruned.model(input_ids=ids).logits,
                              atol=1e-5)
    with torch.no_grad():   # the original is untouched
        assert loaded.model(input_ids=ids).logits.shape == (2, ids.shape[1], 512)
    assert loaded.config.num_key_value_heads == 2


def test_the_ranking_prunes_silenced_channels_and_heads_first(random_lm_dir, tmp_path):
    """An MLP channel whose gate and up rows are zero (its activation is 0) and the KV group
    whose values are zero (its query heads output 0) are the ones removed."""
    import copy

    loaded = load_lm(random_lm_dir("llama"))
    model = copy.deepcopy(loaded.model)
    silenced = [5, 70, 127]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate_proj.weight[silenced] = 0
            layer.mlp.up_proj.weight[silenced] = 0
            layer.self_attn.v_proj.weight[16:32] = 0   # KV group 1's value head
    windows = _context(loaded, tmp_path).data.train[0]
    kept = width_prune.plan(model, windows, 0.3)
    for channels, groups in kept:
        assert len(channels) == 64 and not set(silenced) & set(channels.tolist())
        assert groups.tolist() == [0]
    mlp, heads = width_prune.importance(model, windows)
    assert float(mlp[0][silenced].max()) == 0.0 and float(heads[0][2:].max()) == 0.0


def _perplexity(loaded, ctx) -> float:
    return perplexity(LlmBackend().predict(loaded, ctx.data.val[0]))


@pytest.mark.slow
def test_distillation_recovers_part_of_what_pruning_lost(trained_lm_dir, tmp_path):
    """The tests' trained Llama, 32 windows of 256 tokens (2 judge the epochs: 3 batches of 8
    an epoch): pruned alone loses far more than pruned + distilled (measured on 8 held-out
    windows: 47.3 -> 88.7 -> 57.8)."""
    loaded = load_lm(trained_lm_dir)
    ctx = _context(loaded, tmp_path, calibration=32, window=256)
    original = _perplexity(loaded, ctx)
    pruned = lm_steps.prune(ModelState(model=loaded), PRUNE30, ctx)
    distilled = lm_steps.distill(pruned, DistillConfig(temperature=2.0, alpha=0.7, epochs=4,
                                                       batch_size=8, lr=1e-3), ctx)
    lost, kept = _perplexity(pruned.model, ctx), _perplexity(distilled.model, ctx)
    print(f"perplexity original {original:.2f}, pruned {lost:.2f}, distilled {kept:.2f}")
    assert original < kept < lost
    assert (kept - original) < 0.5 * (lost - original)
    facts = ctx.record.notes["distillation"]
    assert facts["loss_last"] < facts["loss_first"] and facts["steps"] == 12
    assert facts["val_windows"] == 2 and ctx.record.histories[-1].metric == "neg_val_loss"


@pytest.mark.slow
def test_lm_prune30_kd_to_onnx(trained_lm_dir, tmp_path):
    import json

    result = cz.compress(str(trained_lm_dir), recipe="lm_prune30_kd", data="text", latency=False,
                         out_dir=tmp_path / "out", formats=("onnx",))
    assert result.exit_code == 0, result.report["failures"]
    report = result.report
    (row,) = report["artifacts"]
    print(report["baseline"]["perplexity"], row["perplexity"], report["distillation"]["seconds"])
    assert row["perplexity_increase"] <= report["gate"]["max_increase"] == 0.25
    assert report["pruning"]["params_after"] <= 0.8 * report["pruning"]["params_before"]
    assert report["teacher"]["model"] == "the original model"
    genai = json.loads(next((tmp_path / "out").rglob("genai_config.json")).read_text())
    assert genai["model"]["decoder"]["num_key_value_heads"] == 1


def _recipe(tmp_path: Path, sparsity: float) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: r\nsteps:\n  - pass: prune\n    structure: channel\n"
                      f"    sparsity: {sparsity}\n    epochs: 0\n  - pass: distill\n"
                      "    epochs: 1\nexport: [tflite]\n")
    return recipe


@pytest.mark.slow
def test_a_mixture_of_experts_is_refused_in_one_line(cli, random_lm_dir, tmp_path):
    run = cli(str(random_lm_dir("qwen3_moe")), "--recipe", str(_recipe(tmp_path, 0.3)),
              "--out", str(tmp_path / "out"), timeout=300)
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: step 1 `prune`"), run.stderr
    assert "mixture of experts" in lines[0] and "Traceback" not in run.stderr


def test_a_ratio_that_leaves_no_kv_group_is_refused_before_any_work(random_lm_dir, tmp_path):
    from compressor.errors import RecipeError

    with pytest.raises(RecipeError, match=r"step 1 `prune`: sparsity 0.8 removes all 2 KV groups") \
            as refused:
        cz.compress(str(random_lm_dir("llama")), recipe=str(_recipe(tmp_path, 0.8)), data="text",
                    out_dir=tmp_path / "out", quiet=True)
    assert refused.value.exit_code == 2 and "\n" not in str(refused.value)
    assert width_prune.refusal(load_lm(random_lm_dir("phi3")).model, 0.3).startswith(
        "phi3 layer 0 has fused projections")


def test_a_teacher_with_another_vocabulary_is_refused(random_lm_dir, lm_tokenizer, tmp_path):
    from compressor.errors import ModelLoadError
    from support import tiny_lm

    other = tiny_lm.train_tokenizer(tiny_lm.builtin_texts()[0][:20000], vocab_size=300)
    model = tiny_lm.random_lm(other, "llama")
    folder = tiny_lm.save_hf_folder(model, other, tmp_path / "other")
    student = load_lm(random_lm_dir("llama"))
    with pytest.raises(ModelLoadError, match="cannot teach this model: its vocabulary has"):
        lm_steps.load_teacher(str(folder), student)
    assert lm_steps.load_teacher(None, student) is student
    assert lm_steps.load_teacher(str(random_lm_dir("llama")), student).config.vocab_size == 512


def test_a_quantize_group_the_pruned_width_breaks_is_refused_before_any_work(random_lm_dir,
                                                                              tmp_path):
    from compressor.errors import RecipeError

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: r\nsteps:\n  - pass: prune\n    structure: channel\n"
                      "    sparsity: 0.3\n    channel_multiple: 16\n    epochs: 0\n"
                      "  - pass: quantize\n    mode: weight_only\n    dtype: int4\n"
                      "    group_size: 32\nexport: [onnx]\n")
    with pytest.raises(RecipeError, match=r"steps.1: quantize group_size 32 does not divide the "
                                          r"MLP width 80 the prune step keeps; give the prune "
                                          r"step channel_multiple: 32") as refused:
        cz.compress(str(random_lm_dir("llama")), recipe=str(recipe), data="text",
                    out_dir=tmp_path / "out", quiet=True)
    assert refused.value.exit_code == 2 and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_prune_distill_and_int4_qat_compose_in_bf16_to_onnx_and_tflite(trained_lm_dir, tmp_path):
    """One recipe: width pruning, distillation and int4 QAT, both training steps in bfloat16;
    both artifacts validate, hold the same integers and the pruned shapes."""
    import json

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("""name: prune_kd_qat_bf16
steps:
  - pass: prune
    structure: channel
    sparsity: 0.3
    epochs: 0
  - pass: distill
    temperature: 2.0
    alpha: 0.7
    epochs: 2
    batch_size: 8
    lr: 1.0e-3
    precision: bf16
  - pass: quantize
    mode: qat
    dtype: int4
    group_size: 32
    algorithm: rtn
    epochs: 1
    batch_size: 8
    lr: 2.0e-4
    precision: bf16
export: [onnx, tflite]
validate:
  metric: perplexity
  max_increase: 0.25
""")
    result = cz.compress(str(trained_lm_dir), recipe=str(recipe), data="text", latency=False,
                         out_dir=tmp_path / "out")
    assert result.exit_code == 0, result.report["failures"]
    report = result.report
    assert report["pruning"]["params_after"] <= 0.72 * report["pruning"]["params_before"]
    assert report["distillation"]["precision"] == report["training"]["precision"] == "bf16"
    # the contract's top-level totals: the distill and the QAT trainings (prune had no epochs)
    trainings = (report["distillation"], report["training"])
    assert report["training_seconds"] == pytest.approx(sum(t["seconds"] for t in trainings), abs=0.02)
    assert report["training_peak_rss_bytes"] == max(t["peak_rss_bytes"] for t in trainings)
    rows = {row["format"]: row for row in report["artifacts"]}
    assert set(rows) == {"onnx", "tflite"}
    print({k: round(v["perplexity_increase"], 4) for k, v in rows.items()})
    assert all(row["perplexity_increase"] <= 0.25 for row in rows.values())
    assert abs(rows["onnx"]["perplexity_increase"] - rows["tflite"]["perplexity_increase"]) <= 0.003
    genai = json.loads(next((tmp_path / "out").rglob("genai_config.json")).read_text())
    assert genai["model"]["decoder"]["num_key_value_heads"] == 1

"""Tiny causal-LM configs of each family `compress plan` reads (random init, built in tests),
and the onnxruntime-genai model builder run on them, for checking the plan's shapes and
byte accounting against what transformers and the builder really make."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_BASE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

# config.json contents (model_type + architectures + the family's own keys): each one
# exercises a layout rule (tied / untied embeddings, biases, q/k norms, fused projections,
# sliding windows, head_dim != hidden / heads, widths that blocks of 128 do not divide).
TINY_CONFIGS: dict[str, dict] = {
    "llama": {**_BASE, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "tie_word_embeddings": True},
    "llama_untied": {**_BASE, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
                     "tie_word_embeddings": False},
    "smol192": {**_BASE, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
                "hidden_size": 192, "intermediate_size": 320, "num_attention_heads": 3,
                "num_key_value_heads": 1, "tie_word_embeddings": True},
    "qwen2": {**_BASE, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
              "tie_word_embeddings": True},
    "qwen3": {**_BASE, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
              "head_dim": 64, "tie_word_embeddings": True},
    "mistral": {**_BASE, "model_type": "mistral", "architectures": ["MistralForCausalLM"],
                "sliding_window": 64, "tie_word_embeddings": False},
    "phi3": {**_BASE, "model_type": "phi3", "architectures": ["Phi3ForCausalLM"],
             "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
             "original_max_position_embeddings": 256, "tie_word_embeddings": False},
    "gemma2": {**_BASE, "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"],
               "head_dim": 32, "sliding_window": 64, "pad_token_id": 0, "bos_token_id": 1,
               "eos_token_id": 2},
    "gemma3": {**_BASE, "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
               "head_dim": 32, "sliding_window": 64, "pad_token_id": 0, "bos_token_id": 1,
               "eos_token_id": 2, "layer_types": ["sliding_attention", "full_attention"]},
}


def hf_config(name_or_dict: str | dict):
    """The transformers config object for a tiny config (or any config.json dict)."""
    from transformers import AutoConfig

    raw = dict(TINY_CONFIGS[name_or_dict] if isinstance(name_or_dict, str) else name_or_dict)
    raw.pop("architectures", None)
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


def meta_param_count(config) -> int:
    """sum(p.numel()) of the model built on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def save_hf_folder(name: str, folder: Path, seed: int = 0, **overrides) -> Path:
    """A Hugging Face folder (config.json, model.safetensors, tokenizer) of random weights."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = hf_config({**TINY_CONFIGS[name], **overrides})
    config.architectures = list(TINY_CONFIGS[name]["architectures"])
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():   # transformers zero-inits biases, and the builder drops zero biases
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    save_tokenizer(folder, config.vocab_size)
    return folder


def save_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer trained on a few lines (the builder needs one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    lines = [f"the quick brown fox jumps over the lazy dog {i}" for i in range(200)]
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=min(vocab_size, 512), special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>").save_pretrained(folder)


def run_builder(hf_dir: Path, out_dir: Path, precision: str, block_size: int = 32,
                *extra: str, timeout: int = 600) -> Path:
    """`python -m onnxruntime_genai.models.builder` as the LLM route runs it (CPU EP)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"}
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir),
           "-o", str(out_dir), "-p", precision, "-e", "cpu", "-c", str(out_dir.parent / "cache"),
           "--extra_options", f"block_size={block_size}", "accuracy_level=4", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=out_dir.parent, check=False)
    if done.returncode != 0 or not (out_dir / "model.onnx").is_file():
        raise RuntimeError(f"builder failed for {hf_dir.name} {precision}:\n{done.stdout[-2000:]}"
                           f"\n{done.stderr[-3000:]}")
    return out_dir


def save_gptq_folder(src: Path, dst: Path, group_size: int = 32) -> Path:
    """`src` as a GPTQ-format checkpoint (4-bit, asymmetric, v1 packing: qweight int32
    [K/8, N], qzeros int32 [groups, N/8] holding zero - 1, fp16 scales [groups, N], g_idx),
    quantized by round-to-nearest: the form the LLM route's int4 exporter hands the builder."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    out = {}
    for name, w in load_file(str(src / "model.safetensors")).items():
        if not name.endswith("_proj.weight"):
            out[name] = w.half()
            continue
        base = name.removesuffix(".weight")
        wt = w.t().float()                                  # [K, N]
        k, n = wt.shape
        blocks = wt.reshape(k // group_size, group_size, n)
        low, high = blocks.amin(1), blocks.amax(1)
        scale = ((high - low) / 15).clamp(min=1e-8)
        zero = torch.round(-low / scale).clamp(0, 15)
        q = torch.round(blocks / scale[:, None] + zero[:, None]).clamp(0, 15).reshape(k, n)
        out[base + ".qweight"] = _pack(q.reshape(k // 8, 8, n), dim=1)
        out[base + ".qzeros"] = _pack((zero - 1).reshape(k // group_size, n // 8, 8), dim=2)
        out[base + ".scales"] = scale.half()
        out[base + ".g_idx"] = (torch.arange(k) // group_size).to(torch.int32)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group_size,
                                     "desc_act": False, "sym": False, "checkpoint_format": "gptq"}
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def _pack(values, dim: int):
    """Eight 4-bit values along `dim` into one int32 (lowest nibble first)."""
    import torch

    packed = torch.zeros([s for i, s in enumerate(values.shape) if i != dim], dtype=torch.int64)
    for i in range(8):
        packed |= (values.select(dim, i).to(torch.int64) & 15) << (4 * i)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


_BUILDS = """
import json, sys
from onnxruntime_genai.models.builder import create_model, parse_extra_options
for hf, out, precision, extra in json.loads(sys.argv[1]):
    options = parse_extra_options(None, hf, out, precision, "cpu", out + ".cache", extra)
    create_model(None, hf, out, precision, "cpu", out + ".cache", **options)
"""


def run_builds(jobs: list[tuple[Path, Path, str, list[str]]], timeout: int = 900) -> None:
    """Several builder runs (hf_dir, out_dir, precision, extra options) in one process: the
    builder's imports (torch, transformers) cost more than a tiny model's build."""
    import json

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"}
    spec = json.dumps([[str(h), str(o), p, ["accuracy_level=4", *extra]] for h, o, p, extra in jobs])
    done = subprocess.run([sys.executable, "-c", _BUILDS, spec], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=Path(jobs[0][1]).parent, check=False)
    missing = [str(o) for _, o, _, _ in jobs if not (Path(o) / "model.onnx").is_file()]
    if done.returncode != 0 or missing:
        raise RuntimeError(f"builder failed ({missing}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


# Peak RSS of the current process, for scripts run in a subprocess. Not ru_maxrss: Linux keeps
# the parent's high-water mark across fork + exec (a pytest process holding torch would be
# counted); VmHWM belongs to the process's own address space.
PEAK_RSS = """
def peak_rss():
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""


def artifact_bytes(out_dir: Path) -> int:
    """model.onnx + model.onnx.data: the bytes the plan's weights_bytes predicts."""
    return sum((out_dir / n).stat().st_size for n in ("model.onnx", "model.onnx.data")
               if (out_dir / n).exists())

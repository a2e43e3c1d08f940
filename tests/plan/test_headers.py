"""Reading a model without its weight data: safetensors headers (one file, shards, a 16 GB file
written sparse), GGUF headers, config.json and folders; lying or truncated headers are one
`error:` line and exit 2."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from compressor.errors import ModelLoadError
from compressor.decoders.catalogue import lookup
from compressor.decoders.headers import describe, safetensors_header
from compressor.decoders.shapes import from_hf_config, param_count, tensor_inventory
from support import plan_models
from support.plan_models import TINY_CONFIGS

BYTES = {"BF16": 2, "F32": 4, "F16": 2}


def write_safetensors(path: Path, shape, dtype: str = "BF16", data: bool = True,
                      lie: dict | None = None) -> Path:
    """A .safetensors file of `shape`'s tensors: the header, then the data region either
    written as zeros or left as a hole (truncate: a sparse file, nothing written)."""
    header, offset = {}, 0
    for t in tensor_inventory(shape):
        if t.tied:
            continue
        size = t.numel * BYTES[dtype]
        header[t.name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header.update(lie or {})
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        if data:
            f.write(bytes(offset))
        else:
            f.truncate(8 + len(raw) + offset)
    return path


def tiny_folder(tmp_path: Path, name: str = "llama_untied", config: bool = True) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    cfg = TINY_CONFIGS[name]
    if config:
        (folder / "config.json").write_text(json.dumps(cfg))
    write_safetensors(folder / "model.safetensors", from_hf_config(cfg), "F32")
    return folder


def test_config_folder_file_and_index_agree(tmp_path):
    folder = tiny_folder(tmp_path)
    want = from_hf_config(TINY_CONFIGS["llama_untied"])
    for ref in (folder, folder / "config.json", folder / "model.safetensors"):
        d = describe(ref)
        assert param_count(d.shape) == param_count(want) == 426_624
    d = describe(folder / "model.safetensors")
    assert d.header_params == 426_624 and d.dtypes == {"F32": 21}
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"x": "model.safetensors"}}))
    assert describe(index).header_params == 426_624


@pytest.mark.parametrize("name", ["llama", "llama_untied", "qwen2", "qwen3", "phi3", "gemma2",
                                  "gemma3", "smol192"])
def test_without_config_json_the_shapes_come_from_tensor_names(tmp_path, name):
    want = from_hf_config(TINY_CONFIGS[name])
    got = describe(tiny_folder(tmp_path, name, config=False) / "model.safetensors").shape
    assert param_count(got) == param_count(want)
    assert (got.num_layers, got.kv_width, got.q_width, got.tie_word_embeddings) == \
        (want.num_layers, want.kv_width, want.q_width, want.tie_word_embeddings)


SPARSE_PLAN = plan_models.PEAK_RSS + """
import json, resource, sys, time
start = time.perf_counter()
from compressor.cli import main
rc = main(["plan", sys.argv[1], "--json"])
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rc": rc, "wall_s": time.perf_counter() - start,
                  "cpu_s": usage.ru_utime + usage.ru_stime,
                  "peak_rss": peak_rss()}),
      file=sys.stderr)
"""


def test_a_16_gb_sparse_checkpoint_is_planned_from_its_header_alone(tmp_path):
    folder = tmp_path / "llama-8b"
    folder.mkdir()
    shape = lookup("llama-3.1-8b").shape()
    big = write_safetensors(folder / "model.safetensors", shape, data=False)
    assert big.stat().st_size > 16e9 and big.stat().st_blocks * 512 < 1e6   # a hole, not data
    done = subprocess.run([sys.executable, "-c", SPARSE_PLAN, str(big)], capture_output=True,
                          text=True, timeout=120, check=True)
    stats = json.loads(done.stderr.strip().splitlines()[-1])
    plan = json.loads(done.stdout)
    # CPU seconds of the whole process (interpreter, imports, plan): what the work costs,
    # whatever else the machine runs at the same time
    assert stats["rc"] == 0 and stats["cpu_s"] < 2 and stats["peak_rss"] < 300 * 2**20, stats
    assert plan["model"]["params"] == 8_030_261_248 and plan["model"]["layers"] == 32
    assert "(shapes from tensor names)" in plan["model"]["source"]


@pytest.mark.parametrize("damage, message", [
    ("length", "its header claims"),
    ("truncated", "lies at bytes"),
    ("json", "its header is not JSON"),
    ("span", "needs 262,144"),
])
def test_a_lying_or_truncated_header_is_one_error_line(tmp_path, cli, damage, message):
    path = tmp_path / "model.safetensors"
    shape = from_hf_config(TINY_CONFIGS["llama"])
    if damage == "span":
        write_safetensors(path, shape, "F32", lie={"model.embed_tokens.weight": {
            "dtype": "F32", "shape": [512, 128], "data_offsets": [0, 1000]}})
    else:
        write_safetensors(path, shape, "F32")
    raw = path.read_bytes()
    if damage == "length":
        path.write_bytes(struct.pack("<Q", 10**9) + raw[8:200])
    elif damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "json":
        path.write_bytes(raw[:8] + b"{not json" + raw[17:])
    with pytest.raises(ModelLoadError, match=message):
        safetensors_header(path)
    done = cli("plan", str(path))
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: not a valid checkpoint header")


def write_gguf(path: Path, name: str, truncate: int | None = None) -> Path:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    cfg = TINY_CONFIGS[name]
    shape = from_hf_config(cfg)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(shape.num_layers)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_context_length(shape.max_position_embeddings)
    writer.add_token_list([f"t{i}" for i in range(shape.vocab_size)])
    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    for t in tensor_inventory(shape):
        if t.tied:
            continue
        stem = t.name.removesuffix(".weight")
        if t.layer is not None:
            stem = f"blk.{t.layer}." + names[stem.split(".", 3)[3]]
        writer.add_tensor(names.get(stem, stem) + ".weight", np.zeros(t.shape, np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if truncate:
        path.write_bytes(path.read_bytes()[:truncate])
    return path


@pytest.mark.parametrize("name", ["llama", "llama_untied"])
def test_gguf_metadata_maps_to_the_same_shape(tmp_path, name):
    path = write_gguf(tmp_path / f"{name}.gguf", name)
    d = describe(path)
    want = from_hf_config(TINY_CONFIGS[name])
    assert param_count(d.shape) == param_count(want) == d.header_params
    assert (d.shape.num_layers, d.shape.kv_width, d.shape.tie_word_embeddings) == \
        (2, 64, want.tie_word_embeddings)


def test_a_truncated_gguf_is_one_error_line(tmp_path, cli):
    path = write_gguf(tmp_path / "m.gguf", "llama", truncate=300)
    done = cli("plan", str(path))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1
    assert lines[0].startswith(f"error: {path}: not a valid GGUF header: it reads past the end")

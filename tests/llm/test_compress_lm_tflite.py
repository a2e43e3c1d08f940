"""`compress --recipe int4` to TFLite end to end on the trained tiny Llama: the default grid is
symmetric when a TFLite file is exported, so LiteRT stores compressor's integers as they are
(none rounded a second time) and the file keeps GPTQ's quality."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_int4_tflite_stores_gptq_integers_exactly(trained_lm_dir, tmp_path):
    from conftest import run_cli

    out = tmp_path / "out"
    result = run_cli("--recipe", "int4", str(trained_lm_dir), "--format", "tflite",
                     "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "int4 weights, symmetric groups of 32, auto" in result.stderr
    report = json.loads((out / "report.json").read_text())
    (row,) = report["artifacts"]
    assert row["path"] == "model.tflite" and row["weight_bits"] == 4
    stored = report["tflite_weights"]
    assert stored["as_quantized"] == 15 and stored["rounded_again"] == [] \
        and stored["scales_rounded_to_bf16"] == []
    # measured +1.05% (asymmetric integers rounded again onto LiteRT's grid: +2.59%)
    assert 0 <= row["perplexity_increase"] <= 0.02
    assert row["top1_agreement"] >= 0.8 and row["weight_share_at_bits"] >= 0.9   # 84.5% seen
    assert row["decode_tokens_per_s"] > 0 and row["kv_cache_bytes"] > 0

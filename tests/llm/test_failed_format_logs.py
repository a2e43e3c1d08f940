"""A language model's format that fails to convert: its log is kept in --out/logs/, the
warning and the error cite that file (which exists), and nothing is left in the temp dir."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

import compressor as cz
from compressor.errors import BackendUnavailableError


class _RefusingBuilder:
    """onnxruntime-genai's model builder, failing as it does on an op it does not know."""

    def parse_extra_options(self, *args):
        print("builder: no such op in this graph")   # into the builder's log
        raise ValueError("no such op")


@pytest.mark.slow
def test_a_failed_conversion_cites_its_log_in_out(random_lm_dir, tmp_path, monkeypatch, capsys):
    import compressor.backends.llm.genai_builder as genai_builder

    monkeypatch.setattr(genai_builder, "_import_builder", _RefusingBuilder)
    out = tmp_path / "out"
    with pytest.raises(BackendUnavailableError) as caught:
        cz.compress(str(random_lm_dir("llama")), recipe="fp16",
                    data=cz.TextData("text", eval_windows=4),
                    out_dir=out, formats=("onnx",), latency=False)
    log = out / "logs" / "genai_builder.log"
    assert f"(log: {log})" in str(caught.value)
    assert "builder: no such op" in log.read_text()
    assert [p.name for p in out.iterdir()] == ["logs"]   # nothing else was produced
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert any(str(log) in line for line in warnings), warnings
    left = [p.name for p in Path(tempfile.gettempdir()).iterdir()
            if re.match(r"compressor-(logs|work)-", p.name)]
    assert not left, left

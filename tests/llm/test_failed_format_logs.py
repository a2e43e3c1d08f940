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


def _exit_code_rows(text: str) -> dict[str, str]:
    rows = re.findall(r"^\| \**(\d+)\** \| (.*) \|$", text, flags=re.MULTILINE)
    return {code: meaning for code, meaning in rows}


@pytest.mark.slow
def test_the_only_requested_format_failing_exits_2_as_documented(random_lm_dir, tmp_path,
                                                                   monkeypatch, capsys):
    """README said exit 5 for a format that could not be produced; with no other format
    produced the run exits 2 (the converter's error), and both tables say so."""
    import compressor.backends.llm.genai_builder as genai_builder
    from compressor.cli import main
    from conftest import REPO

    monkeypatch.setattr(genai_builder, "_import_builder", _RefusingBuilder)
    out = tmp_path / "out"
    code = main(["--recipe", "fp16", str(random_lm_dir("llama")), "--out", str(out),
                 "--format", "onnx", "--no-latency"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2
    assert errors == [f"error: onnxruntime-genai's model builder failed: ValueError: no such op "
                      f"(log: {out / 'logs' / 'genai_builder.log'})"]
    for doc in ("README.md", "docs/cli.md"):
        rows = _exit_code_rows((REPO / doc).read_text())
        assert "none of the requested formats could be converted" in rows["2"], (doc, rows["2"])
        assert "at least one other format was converted" in rows["5"], (doc, rows["5"])

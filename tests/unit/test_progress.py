"""compressor's own terminal lines (core/progress.py)."""
from __future__ import annotations

from compressor.core.progress import Progress


def test_a_long_warning_is_one_line_starting_with_warning(capsys):
    """Warnings were hard-wrapped at 80 columns: their continuation lines had no prefix."""
    message = ("warning: onnx not produced: onnxruntime-genai's model builder failed: "
               "ValueError: no such op (log: /a/rather/long/path/to/the/out/folder/logs/"
               "genai_builder.log)")
    Progress().info(message)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [message]
    assert all(line.startswith("warning:") for line in lines)


def test_every_line_of_a_multi_line_warning_starts_with_warning(capsys):
    Progress().info("warning: first line\nsecond line")
    assert capsys.readouterr().err.splitlines() == ["warning: first line", "warning: second line"]

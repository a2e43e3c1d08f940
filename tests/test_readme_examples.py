"""Every ```python block in the README runs as written (in a fresh process, in a temp folder)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)

pytestmark = pytest.mark.slow


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 3   # compress, training loop, sweep


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path):
    script = tmp_path / f"example_{index}.py"
    script.write_text(BLOCKS[index])
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=900, check=False)
    assert result.returncode == 0, f"README example {index} failed:\n{BLOCKS[index]}\n{result.stderr[-3000:]}"

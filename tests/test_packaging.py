"""A regular (non-editable) install ships the built-in recipes and device profiles."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_wheel_install_finds_builtin_recipes_and_devices(tmp_path):
    wheels, target, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
    # A copy without build/: setuptools would reuse a stale build/lib from an earlier wheel.
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".venv", "build", ".git", "*.egg-info", "__pycache__", "demo-out", "notebooks", "bench"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", str(source), "--no-deps",
                    "--no-build-isolation", "-w", str(wheels)], check=True, cwd=tmp_path,
                   capture_output=True)
    (wheel,) = wheels.glob("compressor-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)
    probe = ("import compressor, compressor.config.recipe as r, compressor.devices as d\n"
             "print(compressor.__file__)\n"
             "print(','.join(r.builtin_names()))\n"
             "print(r.load_recipe('int8_prune30').steps[0].sparsity)\n"
             "print(len(d.load_profiles()))\n"
             "import pkgutil\n"
             "print(','.join(sorted(m.name for m in pkgutil.walk_packages(compressor.__path__, "
             "'compressor.'))))\n"
             "from importlib import resources\n"   # report.html's stylesheet is package data
             "print(len(resources.files('compressor.render').joinpath('style.css').read_text()))")
    out = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(target)},
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    assert out[0].startswith(str(target))          # the installed copy, not the checkout
    assert set(out[1].split(",")) >= {"fp16", "int8", "int8_qat", "prune50", "int8_prune30",
                                      "int8_prune30_kd", "mixed_int8_fp16", "channels50",
                                      "int8_channels50"}
    assert out[2] == "0.3"
    assert int(out[3]) >= 5
    checkout = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                for p in (REPO / "compressor").rglob("*.py")} - {"compressor"}
    assert set(out[4].split(",")) >= checkout, "subpackages missing from setup.cfg `packages`"
    assert int(out[5]) > 500, "compressor/render/style.css missing from the wheel"

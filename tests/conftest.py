"""Shared fixtures: leak checks, the CLI runner, and framework environment defaults."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Before any test imports TensorFlow / torchao: Keras 2 for tfmot, quiet logs, no CUDA probing.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")


def _repo_files() -> set[str]:
    """Untracked files in the checkout (ignored build outputs excluded). Python sources are
    left out: they are what developers add while the suite runs, never what a test writes."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                         capture_output=True, text=True, check=False).stdout
    return {line[3:] for line in out.splitlines()
            if line.startswith("??") and not line.endswith(".py")}


@pytest.fixture(autouse=True)
def no_files_outside_tmp(tmp_path, monkeypatch):
    """Fail a test that leaves files in the checkout or temporary folders it did not clean up."""
    before = _repo_files()
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    monkeypatch.chdir(tmp_path)
    yield
    leaked = _repo_files() - before
    assert not leaked, f"test left files in the checkout: {sorted(leaked)}"
    leftovers = [p.name for p in own_tmp.iterdir() if p.name.startswith(("compressor-", "."))]
    assert not leftovers, f"test left temporary folders behind: {leftovers}"


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `compress ARGS` as a user would, in a fresh process."""
    return subprocess.run([sys.executable, "-m", "compressor.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def untrained_keras_file(tmp_path_factory):
    """An untrained tf_keras digits CNN saved as .keras, for tests whose runs fail before
    training or do not care about accuracy (it scores at chance level)."""
    from compressor.backends.examples import keras_digits_cnn

    path = tmp_path_factory.mktemp("untrained") / "digits.keras"
    keras_digits_cnn().save(path)
    return path

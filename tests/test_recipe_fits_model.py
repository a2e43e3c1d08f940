"""A language-model recipe on a classifier is refused before the model is loaded, naming the
recipes that fit (it was refused after loading and scoring, ~11 s, as "the perplexity metric
is for language models": a metric the user never set)."""
from __future__ import annotations

import pytest

from compressor.errors import RecipeError


def test_int4_on_a_classifier_is_refused_before_loading(tmp_path, monkeypatch, capsys):
    from compressor.backends import get_backend
    from compressor.cli import main

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(type(get_backend("torch")), "load", no_loading)
    code = main(["--recipe", "int4", "torch_models:digits_cnn", "--data", "digits",
                 "--out", str(tmp_path / "out")])
    (error,) = capsys.readouterr().err.splitlines()
    assert code == 2
    assert error.startswith("error: recipe 'int4' is a language-model recipe"), error
    assert "fp16, int8," in error and "int4_g128" not in error, error
    assert not (tmp_path / "out").exists()


def test_the_python_api_refuses_it_too(tmp_path):
    import compressor as cz
    from torch_models import digits_cnn

    with pytest.raises(RecipeError, match="is a language-model recipe"):
        cz.compress(digits_cnn(), "int4_g128", data="digits", out_dir=tmp_path / "out")

"""TextData: the built-in corpus, window counts and shapes, disjoint calibration / held-out
windows, determinism, BOS handling, and every user mistake's one-line error. A trained tiny
Llama's held-out perplexity is checked against an untrained one and a unigram model."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from compressor.errors import DataError
from compressor.tasks.lm.text_data import CORPUS, TextData, is_text_data_ref, resolve_text_data
from support import tiny_lm

FORMATS = "a UTF-8 .txt file, a .jsonl file with a \"text\" field per line, or `text`"
JSONL_FIX = "write one JSON object per line with a \"text\" string field"


class NumberTokenizer:
    """One token per whitespace-separated integer (other words dropped), id = the integer + 10:
    a window's ids tell exactly which part of the text it came from. `bos` is prepended when
    encoding with special tokens, as a Llama tokenizer does."""

    def __init__(self, bos: int | None = None):
        self.bos_token_id = bos

    def __call__(self, text, add_special_tokens=True, **_):
        ids = [int(word) + 10 for word in text.split() if word.isdigit()]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens and self.bos_token_id
                              is not None else []) + ids}


def _numbers(folder: Path, paragraphs: int = 50, per: int = 100) -> Path:
    """paragraphs of consecutive integers: paragraph p holds p*per .. p*per + per - 1."""
    path = folder / "numbers.txt"
    path.write_text("\n\n".join(" ".join(str(p * per + i) for i in range(per))
                                for p in range(paragraphs)) + "\n", encoding="utf-8")
    return path


def _error(call) -> str:
    with pytest.raises(DataError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_builtin_corpus_is_sizeable_varied_prose_with_its_sources():
    raw = CORPUS.read_bytes()
    assert 120_000 <= len(raw) <= 200_000
    paragraphs = TextData().units()
    assert len(paragraphs) >= 400
    repeated = [text for text, count in Counter(paragraphs).items() if count > 1]
    assert all(len(text) < 20 for text in repeated), repeated   # only "No answer." and the like
    headings = [text.split(",")[0].split(" (")[0] for text in paragraphs
                if len(text) < 120 and text.split(",")[0].split(" (")[0].isupper()]
    sources = (CORPUS.parent / "SOURCES.md").read_text(encoding="utf-8").lower()
    assert len(headings) >= 20
    assert [title for title in headings if title.lower() not in sources] == []


def test_windows_have_the_requested_counts_and_shape(tmp_path):
    data = TextData(str(_numbers(tmp_path)), calibration_windows=10, eval_windows=4, window=64)
    calibration, evaluation = data.windows(NumberTokenizer())
    assert calibration.shape == (10, 64) and evaluation.shape == (4, 64)
    assert calibration.dtype == evaluation.dtype == np.int64


def test_windows_are_contiguous_disjoint_and_evaluation_is_held_out(tmp_path):
    # 50 paragraphs: the last 10 (numbers 4000-4999) are the held-out tail
    data = TextData(_numbers(tmp_path), calibration_windows=40, eval_windows=10, window=100)
    calibration, evaluation = data.windows(NumberTokenizer())
    numbers = np.concatenate([calibration, evaluation]) - 10
    assert (np.diff(numbers, axis=1) == 1).all()               # contiguous text
    assert len(np.unique(numbers)) == numbers.size             # no token in two windows
    assert calibration.max() - 10 < 4000 <= evaluation.min() - 10
    assert np.array_equal(evaluation[:, 0] - 10, np.arange(4000, 5000, 100))   # spread evenly


def test_windows_are_deterministic_for_a_seed(tmp_path):
    path = _numbers(tmp_path)
    first, second, other = (TextData(path, calibration_windows=8, eval_windows=4, window=50,
                                     seed=seed).windows(NumberTokenizer()) for seed in (3, 3, 4))
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    assert not np.array_equal(first[0], other[0])
    assert np.array_equal(first[1], other[1])      # evaluation text does not depend on the seed


def test_a_bos_starts_each_window_when_the_tokenizer_prepends_one(tmp_path):
    data = TextData(_numbers(tmp_path), calibration_windows=4, eval_windows=2, window=33)
    calibration, evaluation = data.windows(NumberTokenizer(bos=7))
    both = np.concatenate([calibration, evaluation])
    assert both.shape[1] == 33 and (both[:, 0] == 7).all() and (both[:, 1:] >= 10).all()
    assert (np.diff(both[:, 1:], axis=1) == 1).all()


def test_jsonl_records_are_the_units(tmp_path):
    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": " ".join(str(r * 10 + i) for i in range(10)), "id": r})
             for r in range(10)]
    path.write_text("\n".join(lines[:5] + [""] + lines[5:]) + "\n", encoding="utf-8")
    calibration, evaluation = TextData(path, calibration_windows=8, eval_windows=2,
                                       window=10).windows(NumberTokenizer())
    assert sorted(calibration[:, 0] - 10) == list(range(0, 80, 10))
    assert list(evaluation[:, 0] - 10) == [80, 90]
    path.write_text(json.dumps({"text": "0 1\u2028 2"}) + "\n" + json.dumps({"text": "3"}),
                    encoding="utf-8")   # U+2028 inside a JSON string does not end the line
    assert TextData(path).units() == ["0 1\u2028 2", "3"]


def test_the_trained_tokenizer_gives_bos_windows_with_no_special_token_inside(tmp_path,
                                                                              lm_tokenizer):
    calibration, evaluation = TextData().windows(lm_tokenizer)
    assert calibration.shape == (32, 256) and evaluation.shape == (16, 256)
    assert (calibration[:, 0] == tiny_lm.BOS_ID).all() and (evaluation[:, 0] == tiny_lm.BOS_ID).all()
    path = tmp_path / "specials.txt"
    path.write_text("\n\n".join(f"Paragraph {i} says <s> and </s> and <pad> aloud." for i in range(60)))
    calibration, evaluation = TextData(path, calibration_windows=2, eval_windows=1,
                                       window=64).windows(lm_tokenizer)
    inside = np.concatenate([calibration, evaluation])[:, 1:]
    assert not np.isin(inside, [tiny_lm.BOS_ID, tiny_lm.EOS_ID, tiny_lm.PAD_ID]).any()
    plain = tiny_lm.train_tokenizer(tiny_lm.builtin_texts()[0], prepend_bos=False)
    calibration, _ = TextData(calibration_windows=4, eval_windows=1).windows(plain)
    assert not (calibration == tiny_lm.BOS_ID).any()


def test_resolve_text_data_and_the_reference_predicate(tmp_path):
    assert resolve_text_data("text") == TextData()
    data = TextData("a.txt", window=64)
    assert resolve_text_data(data) is data
    assert resolve_text_data(data, window=None, eval_windows=3) == TextData("a.txt", window=64,
                                                                            eval_windows=3)
    assert resolve_text_data(tmp_path / "c.jsonl", calibration_windows=2) == TextData(
        str(tmp_path / "c.jsonl"), calibration_windows=2)
    assert [is_text_data_ref(value) for value in ("text", "a.TXT", Path("b.jsonl"), "digits",
                                                  "x.npz", "mod:fn", 3, None)] == \
        [True, True, True, False, False, False, False, False]
    assert TextData().name == "text" and TextData(tmp_path / "c.jsonl").name == "c.jsonl"


def test_each_mistake_is_one_line_naming_the_fix(tmp_path):
    missing = tmp_path / "missing.txt"
    assert _error(lambda: TextData(missing).windows(NumberTokenizer())) == (
        f"text data {missing} not found; give {FORMATS} for the built-in English corpus")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 au lait".encode("utf-8") + b" na\xefve")
    assert _error(lambda: TextData(latin).units()) == (
        f"text data {latin} is not UTF-8 (byte 16); save it as UTF-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n\n")
    assert _error(lambda: TextData(empty).units()) == (
        f"text data {empty} holds no text; give {FORMATS}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    assert _error(lambda: TextData(bad).units()) == (
        f"{bad} line 2 is not JSON (Expecting value); {JSONL_FIX}")
    bad.write_text('{"text": "fine"}\n\n{"body": "no text"}\n')
    assert _error(lambda: TextData(bad).units()) == (
        f"{bad} line 3 has no \"text\" string field; {JSONL_FIX}")
    bad.write_text('["a list"]\n')
    assert _error(lambda: TextData(bad).units()) == (
        f"{bad} line 1 has no \"text\" string field; {JSONL_FIX}")
    assert _error(lambda: TextData("corpus.csv")) == (
        f"text data 'corpus.csv' is not understood; give {FORMATS} for the built-in English corpus")
    assert _error(lambda: resolve_text_data("digits")) == (
        f"data 'digits' is not text data; a language model needs {FORMATS} for the built-in "
        "English corpus")
    for key, value, minimum in (("window", 1, 2), ("calibration_windows", 0, 1),
                                ("eval_windows", 2.0, 1), ("seed", -1, 0), ("window", True, 2)):
        assert _error(lambda key=key, value=value: TextData(**{key: value})) == (
            f"text data `{key}` must be an integer >= {minimum}, got {value!r}")


def test_too_little_text_says_how_many_tokens_and_which_keys_to_lower(tmp_path):
    path = _numbers(tmp_path)     # 4000 calibration tokens, 1000 held out
    assert _error(lambda: TextData(path, calibration_windows=100, window=1000).windows(
        NumberTokenizer())) == (
        "text data numbers.txt: its calibration part has 4000 tokens, 4 windows of 1000; at "
        "least 8 calibration windows are needed (100 asked for; fewer are used, down to 8): "
        "give more text or lower the recipe's `window` or `calibration_windows`")
    assert _error(lambda: TextData(path, calibration_windows=4, eval_windows=16, window=301).windows(
        NumberTokenizer(bos=1))) == (
        "text data numbers.txt: its evaluation part has 1000 tokens, 3 windows of 300; at "
        "least 4 evaluation windows are needed (16 asked for; fewer are used, down to 4): "
        "give more text or lower the recipe's `window` or `eval_windows`")
    one = tmp_path / "one.txt"
    one.write_text(" ".join(str(i) for i in range(100)))   # one paragraph: cut at 80%
    calibration, evaluation = TextData(one, calibration_windows=2, eval_windows=1,
                                       window=20).windows(NumberTokenizer())
    assert calibration.max() - 10 < evaluation.min() - 10


def test_short_text_uses_the_windows_that_fit_and_says_so(tmp_path):
    """A user's short text was refused when the held-out part held fewer windows than asked
    for (16 by default); the windows that fit are used, down to 4 (8 for calibration)."""
    path = _numbers(tmp_path)     # 4000 calibration tokens, 1000 held out
    data = TextData(path, calibration_windows=50, eval_windows=16, window=100)
    calibration, evaluation = data.windows(NumberTokenizer())
    assert calibration.shape == (40, 100) and evaluation.shape == (10, 100)
    assert np.array_equal(evaluation[:, 0] - 10, np.arange(4000, 5000, 100))   # all of it
    assert data.short_note(calibration, evaluation) == (
        "warning: text data numbers.txt is short: 40 calibration windows of 100 tokens used "
        "instead of 50, 10 evaluation windows instead of 16 (at least 8 and 4 are needed); "
        "more text gives steadier numbers")
    full = TextData(path, calibration_windows=8, eval_windows=4, window=100)
    assert full.short_note(*full.windows(NumberTokenizer())) is None


@pytest.mark.slow
def test_the_trained_tiny_lm_predicts_held_out_text_far_better_than_chance(trained_lm_dir,
                                                                            random_lm_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained_lm_dir)
    calibration, evaluation = TextData().windows(tokenizer)
    trained = tiny_lm.perplexity(AutoModelForCausalLM.from_pretrained(trained_lm_dir), evaluation)
    untrained = tiny_lm.perplexity(AutoModelForCausalLM.from_pretrained(random_lm_dir("llama")),
                                   evaluation)
    unigram = tiny_lm.unigram_perplexity(calibration, evaluation, len(tokenizer))
    # measured: trained ~48, unigram ~210, untrained ~520 (about the 512-token vocabulary)
    assert 400 < untrained < 650
    assert trained < unigram / 2.5 and trained < untrained / 6
    assert sorted(re.sub(r"\.\w+$", "", p.name) for p in trained_lm_dir.iterdir()) == [
        "chat_template", "config", "generation_config", "model", "tokenizer", "tokenizer_config"]


@pytest.mark.slow
def test_a_users_short_text_opens_a_run_with_one_warning(random_lm_dir, tmp_path, capsys):
    """A user text whose held-out part holds 9 windows of 256 (16 asked for) was refused."""
    import shutil

    from compressor.core.memory import stop_sampling
    from compressor.run.session import open_session

    short = tmp_path / "short.txt"
    short.write_text("\n\n".join(TextData().units()[:80]), encoding="utf-8")
    session = open_session(str(random_lm_dir("llama")), "fp16", data=str(short),
                           out_dir=tmp_path / "out", formats=("onnx",), latency=False)
    shutil.rmtree(session.ctx.workdir)
    stop_sampling()
    assert session.ctx.data.val[0].shape == (9, 256)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["warning: text data short.txt is short: 9 evaluation windows of 256 "
                        "tokens used instead of 16 (at least 4 are needed); more text gives "
                        "steadier numbers"]

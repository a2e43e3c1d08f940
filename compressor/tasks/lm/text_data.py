"""Text for language models: a UTF-8 `.txt`, a `.jsonl` with a `text` field per line, or `text`
(the built-in English corpus, public-domain prose shipped in compressor/tasks/lm/corpus/).

The text is split into units (paragraphs of a `.txt`, separated by blank lines; records of a
`.jsonl`) and the last 20% of units are held out: evaluation windows come only from that tail,
calibration windows only from the rest, so a perplexity is never measured on calibration text.
Each part is tokenized as one stream (units joined by a blank line) with the model's tokenizer,
without special tokens, and cut into disjoint windows of `window` tokens. A BOS token is
prepended to every window exactly when the tokenizer adds one to encoded text itself (Llama,
Gemma: yes; Qwen2, GPT-2: no), so windows look like what the model saw in training; the BOS is
one of the `window` tokens. Calibration windows are drawn at random (`seed`); evaluation windows
are spread evenly over the tail and do not depend on the seed, so every run of a sweep is
scored on the same text. A text too short for the windows asked for gives the windows that fit,
down to MINIMUM_WINDOWS per part (fewer is a DataError); `short_note` says so in one line.

Framework-free: the tokenizer is only called, never imported.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from compressor.errors import DataError

BUILTIN = "text"
CORPUS = Path(__file__).resolve().parent / "corpus" / "english.txt"
SUFFIXES = (".txt", ".jsonl")
HELD_OUT_SHARE = 0.2
MAX_PART_CHARS = 16_000_000   # windows come from at most this much of each part (memory)
SEPARATOR = "\n\n"
_FORMATS = "a UTF-8 .txt file, a .jsonl file with a \"text\" field per line, or `text`"
_FIELD_MINIMUM = {"calibration_windows": 1, "eval_windows": 1, "window": 2}
# The fewest windows a part may be cut into when its text is short (unless fewer are asked for)
MINIMUM_WINDOWS = {"calibration": 8, "evaluation": 4}


def is_text_data_ref(value: Any) -> bool:
    """Whether `value` names text data: `text`, or a path ending in .txt / .jsonl (not checked
    for existence)."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    return str(value) == BUILTIN or Path(value).suffix.lower() in SUFFIXES


@dataclass(frozen=True)
class TextData:
    """Text data for a language model: `cz.TextData("corpus.txt", calibration_windows=32)`.

    `source` is a .txt / .jsonl path or `text` (built-in corpus); `calibration_windows` and
    `eval_windows` windows of `window` tokens each; `seed` picks the calibration windows.
    """

    source: str = BUILTIN
    calibration_windows: int = 32
    eval_windows: int = 16
    window: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.source, os.PathLike):
            object.__setattr__(self, "source", os.fspath(self.source))
        if not is_text_data_ref(self.source):
            raise DataError(f"text data {self.source!r} is not understood; give {_FORMATS} "
                            "for the built-in English corpus")
        for key, minimum in (*_FIELD_MINIMUM.items(), ("seed", 0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < minimum:
                raise DataError(f"text data `{key}` must be an integer >= {minimum}, "
                                f"got {value!r}")

    @property
    def name(self) -> str:
        """What reports call it: `text` or the file's name."""
        return BUILTIN if self.source == BUILTIN else Path(self.source).name

    def units(self) -> list[str]:
        """The paragraphs (.txt, `text`) or records (.jsonl) of the text, in order."""
        path = CORPUS if self.source == BUILTIN else Path(self.source)
        text = _read_utf8(path)
        units = _records(text, path) if path.suffix.lower() == ".jsonl" else _paragraphs(text)
        if not units:
            raise DataError(f"text data {path} holds no text; give {_FORMATS}")
        return units

    def texts(self) -> tuple[str, str]:
        """(calibration text, held-out evaluation text): the text before and in the tail."""
        calibration, evaluation = _held_out_split(self.units())
        return SEPARATOR.join(calibration), SEPARATOR.join(evaluation)

    def windows(self, tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
        """(calibration [calibration_windows, window], evaluation [eval_windows, window]) int64
        token ids from `tokenizer` (a transformers tokenizer), cut as the module says."""
        bos = bos_token_id(tokenizer)
        body = self.window - (bos is not None)
        calibration_text, evaluation_text = self.texts()
        rng = np.random.default_rng(self.seed)
        calibration = self._cut(_encode(tokenizer, calibration_text), body,
                                self.calibration_windows, "calibration", rng)
        evaluation = self._cut(_encode(tokenizer, evaluation_text), body, self.eval_windows,
                               "evaluation", None)
        if bos is not None:
            calibration, evaluation = (np.concatenate(
                [np.full((len(part), 1), bos, np.int64), part], axis=1)
                for part in (calibration, evaluation))
        return calibration, evaluation

    def short_note(self, calibration: np.ndarray, evaluation: np.ndarray) -> str | None:
        """The one `warning:` line for windows cut from a short text (fewer than asked for),
        else None."""
        short = [(part, len(got), asked) for part, got, asked in (
            ("calibration", calibration, self.calibration_windows),
            ("evaluation", evaluation, self.eval_windows)) if len(got) < asked]
        if not short:
            return None
        used = ", ".join(f"{got} {part} windows{f' of {self.window} tokens' if i == 0 else ''}"
                         f"{' used' if i == 0 else ''} instead of {asked}"
                         for i, (part, got, asked) in enumerate(short))
        least = " and ".join(str(min(asked, MINIMUM_WINDOWS[part])) for part, _, asked in short)
        return (f"warning: text data {self.name} is short: {used} (at least {least} "
                f"{'is' if least == '1' else 'are'} needed); more text gives steadier numbers")

    def _cut(self, ids: np.ndarray, body: int, count: int, part: str,
             rng: np.random.Generator | None) -> np.ndarray:
        """`count` disjoint slices of `body` tokens (fewer when the text is short, down to
        MINIMUM_WINDOWS): random ones with `rng`, else evenly spread."""
        slots = len(ids) // body
        least = min(count, MINIMUM_WINDOWS[part])
        if slots < least:
            key = "calibration_windows" if part == "calibration" else "eval_windows"
            raise DataError(
                f"text data {self.name}: its {part} part has {len(ids)} tokens, {slots} windows "
                f"of {body}; at least {least} {part} windows are needed ({count} asked for; "
                f"fewer are used, down to {MINIMUM_WINDOWS[part]}): give more text or lower "
                f"the recipe's `window` or `{key}`")
        count = min(count, slots)
        if rng is None:
            chosen = np.floor(np.linspace(0, slots - 1, count)).astype(np.int64)
        else:
            chosen = np.sort(rng.choice(slots, size=count, replace=False))
        starts = chosen[:, None] * body + np.arange(body)[None, :]
        return ids[starts]


def resolve_text_data(value: Any, **settings: Any) -> TextData:
    """A TextData from the CLI's `--data` (`text`, `corpus.txt`, `corpus.jsonl`) or a TextData;
    `settings` (window counts and sizes set by the recipe; None values ignored) override."""
    settings = {key: setting for key, setting in settings.items() if setting is not None}
    if isinstance(value, TextData):
        return replace(value, **settings) if settings else value
    if is_text_data_ref(value):
        return TextData(os.fspath(value), **settings)
    raise DataError(f"data {value!r} is not text data; a language model needs {_FORMATS} "
                    "for the built-in English corpus")


def bos_token_id(tokenizer: Any) -> int | None:
    """The BOS id when `tokenizer` prepends it to encoded text by itself, else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return int(bos) if len(ids) and ids[0] == bos else None


def _encode(tokenizer: Any, text: str) -> np.ndarray:
    """Token ids of `text`, no special tokens added, special-token strings in it split as text."""
    if not text:
        return np.zeros(0, np.int64)
    ids = tokenizer(text[:MAX_PART_CHARS], add_special_tokens=False, verbose=False,
                    split_special_tokens=True)["input_ids"]
    return np.asarray(ids, dtype=np.int64)


def _read_utf8(path: Path) -> str:
    if not path.is_file():
        raise DataError(f"text data {path} not found; give {_FORMATS} for the built-in "
                        "English corpus")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"text data {path} is not UTF-8 (byte {exc.start}); "
                        "save it as UTF-8") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _paragraphs(text: str) -> list[str]:
    """Blocks separated by blank lines (lines of only whitespace count as blank)."""
    blocks, lines = [], []
    for line in text.split("\n"):
        if line.strip():
            lines.append(line.rstrip())
        elif lines:
            blocks.append("\n".join(lines))
            lines = []
    if lines:
        blocks.append("\n".join(lines))
    return blocks


def _records(text: str, path: Path) -> list[str]:
    """The `text` field of each non-blank line; U+2028 inside JSON strings is not a line end."""
    fix = "write one JSON object per line with a \"text\" string field"
    records = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} line {number} is not JSON ({exc.msg}); {fix}") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataError(f"{path} line {number} has no \"text\" string field; {fix}")
        if record["text"].strip():
            records.append(record["text"].strip())
    return records


def _held_out_split(units: list[str]) -> tuple[list[str], list[str]]:
    """(units before the tail, the last ~HELD_OUT_SHARE of units); one unit is cut at the
    whitespace before its 80% point."""
    if len(units) >= 2:
        keep = min(len(units) - 1, max(1, round(len(units) * (1 - HELD_OUT_SHARE))))
        return units[:keep], units[keep:]
    text = units[0]
    point = int(len(text) * (1 - HELD_OUT_SHARE))
    cut = text.rfind(" ", 0, point)
    cut = cut if cut > 0 else point
    return [text[:cut].rstrip()], [text[cut:].lstrip()]

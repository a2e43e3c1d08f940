"""Typed errors. Every user mistake is a CompressorError whose message says what to do.

The CLI turns a CompressorError into one line on stderr and its `exit_code`; anything else
escaping is a bug in compressor and is shown with a traceback.
"""
from __future__ import annotations

import difflib


class CompressorError(Exception):
    """Base class: a problem the user can fix. `exit_code` is what the CLI exits with."""

    exit_code = 2


class RecipeError(CompressorError):
    """A recipe is unknown, malformed, or asks for something inconsistent."""


class ModelLoadError(CompressorError):
    """A model (or teacher) file is missing, corrupt, unsupported or unsafe to load."""


class ConfigMismatchError(ModelLoadError):
    """A checkpoint's config.json does not describe the weights beside it."""


class DataError(CompressorError):
    """Data is missing, malformed, or does not match the model's inputs."""


class BackendUnavailableError(CompressorError):
    """A framework, converter or runtime this work needs is not installed or cannot do it."""


class UsageError(CompressorError):
    """An API call out of order, e.g. finalizing a training run twice."""


class AccuracyGateError(CompressorError):
    """An artifact lost more accuracy than the recipe's `validate` allows."""

    exit_code = 3


class DeviceBudgetError(CompressorError):
    """An artifact does not fit the target device's memory budget."""

    exit_code = 4


class FormatsIncompleteError(CompressorError):
    """Some requested formats could not be produced; the others are written and validated."""

    exit_code = 5


def first_line(exc: BaseException, limit: int = 240) -> str:
    """The first line of an exception's message (or its type name), cut to `limit` characters:
    what an error message quotes from a library's multi-line failure text."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


MESSAGE_LIMIT = 300   # a converter failure is one `error:` line of at most this many characters


def converter_failure(what: str, exc: BaseException, fix: str, log: object) -> str:
    """One line (<= MESSAGE_LIMIT characters) for a converter's multi-line failure text: the
    first `error:` it reports (MLIR source locations dropped), what to do, and the log file
    that holds the full text."""
    lines = str(exc).strip().splitlines()
    errors = [line.split("error: ", 1)[1] for line in lines if "error: " in line]
    reason = (errors or lines or [type(exc).__name__])[0].strip()
    if reason.startswith("loc("):   # loc(fused[...]): message
        reason = reason.split("): ", 1)[-1]
    tail = f"; {fix} (full log: {log})"
    room = max(MESSAGE_LIMIT - len(what) - len(" failed: ") - len(tail), 40)
    if len(reason) > room:
        reason = reason[:room - 3] + "..."
    return f"{what} failed: {reason}{tail}"[:MESSAGE_LIMIT]


def did_you_mean(word: str, choices: list[str]) -> str:
    """'; did you mean 'x'?' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""

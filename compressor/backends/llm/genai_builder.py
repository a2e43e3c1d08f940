"""Run onnxruntime-genai's model builder on a Hugging Face folder, quietly.

In this process (torch and transformers are already imported by a compress run, which is
most of the builder's start-up), with everything it prints (its own prints, tqdm bars,
onnxruntime's logging, C++ output on fd 1 / 2) going to the log file: the console stays
quiet. The builder's logging.basicConfig and warnings filters are undone afterwards.
"""
from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from compressor.errors import BackendUnavailableError, first_line
from compressor.core.memory import trim_heap

EXTRA_OPTIONS = ("accuracy_level=4",)   # int8 activations in MatMulNBits: the fast CPU kernel
LAST_RUN: dict[str, float] = {}         # seconds and peak RSS of the last run (tests, bench)


def run_builder(source: Path, out: Path, precision: str, cache: Path, log: Path,
                extra: tuple[str, ...] = (), fast_repack: bool = True,
                architecture: str = "this model") -> None:
    """`python -m onnxruntime_genai.models.builder -i source -o out -p precision -e cpu
    --extra_options accuracy_level=4 *extra`; `fast_repack`: GPTQ tensors re-packed by
    genai_repack.py (the same bytes, ~25x faster) instead of the builder's own code."""
    from compressor.backends.llm.genai_repack import fast_gptq_repack

    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        with _output_to(log):
            builder = _import_builder()
            repack = fast_gptq_repack() if fast_repack else contextlib.nullcontext()
            options = builder.parse_extra_options(None, str(source), str(out), precision, "cpu",
                                                  str(cache), [*EXTRA_OPTIONS, *extra])
            with repack, builder_fixes(), _no_git_above_the_environment():
                builder.create_model(None, str(source), str(out), precision, "cpu", str(cache),
                                     **options)
    except NotImplementedError as exc:   # an architecture or tensor it does not know
        reason = first_line(exc, 160).replace(str(source), "it")
        raise BackendUnavailableError(
            f"onnxruntime-genai's model builder cannot convert {architecture} ({reason}); "
            f"export tflite instead (log: {log})") from None
    except (ValueError, KeyError, RuntimeError, AttributeError, TypeError, OSError) as exc:
        raise BackendUnavailableError(
            f"onnxruntime-genai's model builder failed: {type(exc).__name__}: "
            f"{first_line(exc, 160)} (log: {log})") from None
    LAST_RUN.update(seconds=time.perf_counter() - start,
                    peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    trim_heap()   # the builder's freed model (about the checkpoint's size) back to the system


def _import_builder():
    try:
        from onnxruntime_genai.models import builder
    except ImportError as exc:
        raise BackendUnavailableError(
            "the ONNX route of a language model needs onnxruntime-genai: "
            f"pip install onnxruntime-genai ({first_line(exc, 120)})") from None
    return builder


@contextlib.contextmanager
def builder_fixes() -> Iterator[None]:
    """The builder's SmolLM3 (builders/smollm.py) fixed inside the block (restored after).

    SmolLM3 leaves RoPE out of the layers where `no_rope_layers[i]` is 0. The builder's
    SmolLM3Model toggles `use_rope_in_attn` per layer instead: for such a layer it asks for a
    separate RotaryEmbedding op fed by the `position_ids` input, which the CPU graph (RoPE
    fused into GroupQueryAttention) does not have (KeyError 'position_ids'), and would rotate
    where the model does not. `_smollm3_attention` builds those layers without any rotary
    embedding; the per-layer window is the base class's (`layer_types`). Patched on both names
    the builder's classes go by (see genai_repack.fast_gptq_repack)."""
    import importlib

    import onnxruntime_genai.models  # noqa: F401  (adds the builders' folder to sys.path)

    saved = []
    for package in ("", "onnxruntime_genai.models."):
        cls = importlib.import_module(f"{package}builders.smollm").SmolLM3Model
        saved.append((cls, cls.__dict__["make_attention"]))
        cls.make_attention = _smollm3_attention(cls.__mro__[1])
    try:
        yield
    finally:
        for cls, original in saved:
            cls.make_attention = original


def _smollm3_attention(parent: type):
    """SmolLM3Model.make_attention: `parent`'s, without RoPE where the model has none."""
    def make_attention(self, layer_id, attention, root_input, **kwargs):
        attrs = self.attention_attrs
        saved = attrs["rope"], attrs["use_rope_in_attn"]
        if not self.no_rope_layers[layer_id]:
            attrs["rope"] = attrs["use_rope_in_attn"] = False
        try:
            parent.make_attention(self, layer_id, attention, root_input, **kwargs)
        finally:
            attrs["rope"], attrs["use_rope_in_attn"] = saved
    return make_attention


@contextlib.contextmanager
def _no_git_above_the_environment() -> Iterator[None]:
    """The builder stamps model.onnx's producer_version with `git rev-parse HEAD` run beside its
    install: where the Python environment sits inside a git checkout (a .venv in a project),
    every commit of that project changed model.onnx's bytes. Git may not look above the
    environment's root while it builds, so the stamp is the package's own."""
    saved = os.environ.get("GIT_CEILING_DIRECTORIES")
    os.environ["GIT_CEILING_DIRECTORIES"] = sys.prefix
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("GIT_CEILING_DIRECTORIES", None)
        else:
            os.environ["GIT_CEILING_DIRECTORIES"] = saved


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """Python-level and fd-level stdout / stderr into `log`; logging and warnings restored."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(log, "a", encoding="utf-8", errors="replace") as sink, \
            warnings.catch_warnings():
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                yield
        finally:
            sink.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            root.handlers[:] = handlers
            root.setLevel(level)
            _drop_handlers_on(sink)


def _drop_handlers_on(stream) -> None:
    """Logging handlers created during the run write to our (now closed) log file: remove them."""
    for item in list(logging.root.manager.loggerDict.values()):
        if isinstance(item, logging.Logger):
            item.handlers[:] = [h for h in item.handlers
                                if getattr(h, "stream", None) is not stream]

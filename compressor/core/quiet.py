"""Keep the libraries' own output off the user's terminal: stderr holds compressor's lines.

Converters write from C++ straight to file descriptors 1 and 2, so redirecting
`sys.stdout` is not enough: the descriptors themselves are pointed at the log. Python's
`sys.stderr` points at the log too (tqdm bars, logging handlers, warnings of the libraries);
compressor's own lines (Progress, `warning:`) go to `user_stream()`, the real terminal, so
progress bars (e.g. during int8 calibration) stay visible.

`hush_libraries()` runs once before the frameworks are imported: start-up warnings about the
libraries themselves (torchao skipping its CUDA kernels, torch deprecations inside torchao,
onnxruntime's quantizer notes) are dropped. `--debug` (COMPRESSOR_DEBUG=1, inherited by
child processes) lets all of it through.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

TAIL_LINES = 15
HEADER = "=== "   # starts the line that opens each capture in a log
DEBUG_ENV = "COMPRESSOR_DEBUG"
CLI_ENV = "COMPRESSOR_CLI"   # set by the `compress` command (and inherited by its children)
# Loggers whose warnings are about the library itself, never about the user's model: torchao
# ("Skipping import of cpp extensions", "Detected no triton"), torch's pytree deprecation that
# torchao triggers, TensorFlow / absl start-up, converter internals.
LIBRARY_LOGGERS = ("torchao", "torch.utils._pytree", "tensorflow", "absl", "tf2onnx",
                   "litert_torch", "ai_edge_quantizer", "onnxscript", "onnx_ir")
# Deprecations raised inside torch's own code (torch.onnx dynamo export), not the caller's.
LIBRARY_WARNINGS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated",)
_terminals: list = []   # the real stderr of each open capture, innermost last
_hushed: list[bool] = []


def library_output_shown() -> bool:
    """True under --debug: library output reaches the terminal as it is."""
    return os.environ.get(DEBUG_ENV) == "1"


def user_stream():
    """Where compressor's own lines go: the terminal, also while a capture holds fd 2."""
    return _terminals[-1] if _terminals else sys.stderr


def hush_libraries() -> None:
    """Once per process, before framework imports: library warnings below ERROR are dropped.

    The root logger gets an ERROR-level handler, so the module-level `logging.warning()`
    calls of onnxruntime's quantizer ("Axis 1 is out-of-range", once per weight) and
    litert-torch ("converted in training mode": we convert in eval mode) no longer install
    a WARNING handler through logging.basicConfig.
    """
    if _hushed or library_output_shown():
        return
    _hushed.append(True)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    root = logging.getLogger()
    # The root logger is the application's: only the `compress` command takes it (a training
    # script calling cz.compress keeps its own logging.basicConfig working).
    if os.environ.get(CLI_ENV) == "1" and not root.handlers:
        root.addHandler(_StderrHandler(logging.ERROR))
    for message in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    if "tensorflow" not in sys.modules:
        sys.meta_path.insert(0, _QuietFirstImport("tensorflow"))


class _QuietFirstImport(importlib.abc.MetaPathFinder):
    """Runs the first import of `name` under quiet_import, wherever it happens: TensorFlow is
    imported by tflite flatbuffer tools, litert-torch and tf2onnx alike, and prints its absl
    and CUDA-probe banners from C++ as it loads."""

    def __init__(self, name: str):
        self.name = name
        self.looking = False

    def find_spec(self, name, path=None, target=None):
        if name != self.name or self.looking:
            return None
        self.looking = True   # the lookup below must not find us again
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.looking = False
        if spec is not None and spec.loader is not None:
            spec.loader = _CapturedLoader(spec.loader, self)
        return spec   # find_spec alone (torch._dynamo asks) imports nothing: we stay


class _CapturedLoader(importlib.abc.Loader):
    def __init__(self, loader, finder: _QuietFirstImport):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader   # as if never wrapped
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        if _terminals:   # already inside a capture
            self.loader.exec_module(module)
            return
        with quiet_import(self.finder.name):
            self.loader.exec_module(module)


class _StderrHandler(logging.StreamHandler):
    """sys.stderr as it is when a record is emitted (inside a capture: the log)."""

    def __init__(self, level: int):
        super().__init__()
        self.setLevel(level)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


@contextlib.contextmanager
def captured_native_output(log_path: Path, title: str = "conversion") -> Iterator[Path]:
    """Run the body with fds 1 and 2 appending to `log_path` under a `title` header."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)
    saved_fds = {fd: os.dup(fd) for fd in (1, 2)}
    terminal = io.TextIOWrapper(os.fdopen(os.dup(saved_fds[2]), "wb", buffering=0),
                                write_through=True)
    original_stderr = sys.stderr
    with open(log_path, "ab") as log, warnings.catch_warnings(record=True) as caught:
        log.write(f"{HEADER}{title}\n".encode())
        log.flush()
        warnings.simplefilter("always")
        into_log = io.TextIOWrapper(os.fdopen(os.dup(log.fileno()), "wb", buffering=0),
                                    write_through=True)
        try:
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
            sys.stderr = into_log   # tqdm bars, handlers created now: the log
            _terminals.append(terminal)
            yield log_path
        finally:
            _terminals.pop()
            sys.stderr = original_stderr
            _flush(sys.stdout)
            for fd, saved in saved_fds.items():
                os.dup2(saved, fd)
                os.close(saved)
            _repoint_logging_handlers(into_log, original_stderr)
            into_log.close()
            terminal.close()
            log.writelines(f"{warning.category.__name__}: {warning.message}\n".encode()
                           for warning in caught)


def log_tail(log_path: Path, lines: int = TAIL_LINES) -> str:
    """The last lines of the latest capture in a log, for error messages ('' if none)."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return ""
    latest = text.rsplit("\n" + HEADER, 1)[-1].split("\n", 1)[-1]
    kept = [line for line in latest.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def _repoint_logging_handlers(old_stream, new_stream) -> None:
    """Handlers created during the capture (tf.get_logger() is lazy) took our temporary stderr."""
    loggers = [logging.getLogger(), *(item for item in logging.root.manager.loggerDict.values()
                                      if isinstance(item, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is old_stream:
                handler.setStream(new_stream)


def _flush(stream) -> None:
    try:
        stream.flush()
    except (AttributeError, ValueError, OSError):
        pass  # a closed or fake stream has nothing to flush


@contextlib.contextmanager
def muted_native_output() -> Iterator[None]:
    """Drop what native code prints on fds 1 and 2 (e.g. LiteRT's one-time 'Created XNNPACK
    delegate' INFO line); failures still surface as Python exceptions."""
    if library_output_shown():
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)
    saved_fds = {fd: os.dup(fd) for fd in (1, 2)}
    with open(os.devnull, "wb") as devnull:
        try:
            for fd in (1, 2):
                os.dup2(devnull.fileno(), fd)
            yield
        finally:
            for fd, saved in saved_fds.items():
                os.dup2(saved, fd)
                os.close(saved)


@contextlib.contextmanager
def quiet_import(title: str) -> Iterator[Path]:
    """A framework's first import with its native start-up banners (absl's "All log messages
    before absl::InitializeLog()", "cudart_stub.cc: Could not find cuda drivers") in a
    temporary log, removed afterwards; yields the log, whose tail an import error can quote.
    Under --debug nothing is captured."""
    hush_libraries()
    handle, name = tempfile.mkstemp(prefix=f"compressor-work-{os.getpid()}-import-", suffix=".log")
    os.close(handle)
    log = Path(name)
    try:
        if library_output_shown():
            yield log
        else:
            with captured_native_output(log, f"import {title}"):
                yield log
    finally:
        log.unlink(missing_ok=True)

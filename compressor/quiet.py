"""Silence the native noise converters print (TensorFlow, MLIR, tf2onnx) into a log file.

Converters write from C++ straight to file descriptors 1 and 2, so redirecting
`sys.stdout` is not enough: the descriptors themselves are pointed at the log. Python's
`sys.stderr` is pointed back at the real terminal meanwhile, so progress bars (e.g. during
int8 calibration) stay visible; Python warnings and logging handlers created earlier (absl,
tf2onnx) go to the log.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

TAIL_LINES = 15
HEADER = "=== "   # starts the line that opens each capture in a log


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
        try:
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
            sys.stderr = terminal
            yield log_path
        finally:
            sys.stderr = original_stderr
            _flush(sys.stdout)
            for fd, saved in saved_fds.items():
                os.dup2(saved, fd)
                os.close(saved)
            _repoint_logging_handlers(terminal, original_stderr)
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

"""The one place the CLI turns every failure into one `error:` line and an exit code.

CompressorError -> its exit code (2 bad input, 3 gate, 4 budget); an OSError (disk full,
read-only file system, a name too long) -> 2; SIGINT / SIGTERM -> 130 / 143 after the run's
own cleanup; anything else is a bug in compressor -> 1, with the traceback only under --debug.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable

from compressor.errors import CompressorError, UsageError

MAX_ERROR_CHARS = 500


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError (one `error:` line) instead of printing usage + exiting."""

    def error(self, message: str):   # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


class Interrupted(KeyboardInterrupt):
    """Raised by the SIGINT / SIGTERM handler, so `finally` blocks clean up on both."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_received: list[int] = []


def _on_signal(signum: int, frame) -> None:
    _received.append(signum)
    raise Interrupted(signum)


def one_line(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`error: ...` on one line of at most `limit` characters. A multi-line message keeps its
    first and last lines (what failed, and where the full log is)."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()] or ["failed"]
    text = "; ".join(lines)
    if len(text) + 7 > limit and len(lines) > 1:
        text = f"{lines[0][:limit // 2]} ... {lines[-1]}"
    text = f"error: {text}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def guarded(run: Callable[[], int], debug: bool) -> int:
    """Run the command; every failure becomes one `error:` line on stderr and an exit code."""
    _received.clear()
    in_main_thread = threading.current_thread() is threading.main_thread()
    for signum in (signal.SIGINT, signal.SIGTERM) if in_main_thread else ():
        signal.signal(signum, _on_signal)   # only the main thread may set handlers
    try:
        code = run()
    except KeyboardInterrupt:
        signum = _received[0] if _received else signal.SIGINT
        _show(debug, "interrupted by "
              f"{signal.Signals(signum).name}; nothing was written to the output folder")
        return 128 + signum
    except CompressorError as exc:
        _show(debug, str(exc))
        return exc.exit_code
    except OSError as exc:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        _show(debug, f"{exc.strerror or exc}{where}; check the path, free disk space and "
                     "permissions")
        return 2
    except MemoryError:
        _show(debug, "out of memory; use a smaller model or less data")
        return 2
    except Exception as exc:   # a bug in compressor: say so, keep the traceback for --debug
        _show(debug, f"internal error {type(exc).__name__}: {exc}; rerun with --debug for the "
                     "traceback and report it")
        return 1
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM) if in_main_thread else ():
            signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM
                          else signal.default_int_handler)
    if _received:   # a signal swallowed somewhere (e.g. in a __del__): still not a success
        signum = _received[0]
        _show(debug, f"interrupted by {signal.Signals(signum).name}")
        return 128 + signum
    return code


def _show(debug: bool, message: str) -> None:
    if debug:
        traceback.print_exc()
    sys.stderr.flush()
    print(one_line(message), file=sys.stderr, flush=True)


def debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """(--debug given, argv without it); COMPRESSOR_DEBUG=1 also turns it on. --debug sets
    COMPRESSOR_DEBUG=1, so this process and its children let library output through
    (compressor.core.quiet)."""
    rest = [arg for arg in argv if arg != "--debug"]
    if len(rest) != len(argv):
        os.environ["COMPRESSOR_DEBUG"] = "1"
    return os.environ.get("COMPRESSOR_DEBUG") == "1", rest

"""Progress bars and status lines for long work, silenced by `quiet`."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

WARNING = "warning:"


class Progress:
    """A thin layer over rich so that backends report progress without knowing the terminal."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet

    def info(self, message: str) -> None:
        """One status line, never hard-wrapped (the terminal folds a long one). A multi-line
        `warning:` message gets the prefix on every line."""
        if self.quiet:
            return
        if message.startswith(WARNING) and "\n" in message:
            message = "\n".join(line if line.startswith(WARNING) else f"{WARNING} {line}"
                                 for line in message.splitlines())
        self._console().print(message, highlight=False, soft_wrap=True)

    @contextlib.contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        """Yields `advance(n, status=None)`; shows a bar with a time estimate unless quiet
        (`status`: shown after the description from then on, e.g. the running loss)."""
        if self.quiet or total <= 0:
            yield lambda n=1, status=None: None
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar,
                                   TextColumn, TimeElapsedColumn, TimeRemainingColumn)

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn())
        with Bar(*columns, console=self._console(), transient=False) as bar:
            task_id = bar.add_task(description, total=total)
            yield lambda n=1, status=None: bar.update(
                task_id, advance=n, description=f"{description} {status}" if status else None)

    def _console(self):
        from rich.console import Console

        from compressor.core.quiet import user_stream

        return Console(file=user_stream())   # the terminal, also while a converter's output is captured

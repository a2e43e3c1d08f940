"""The `compress` command: main.py parses, each subcommand has its module, and guard.py turns
every failure into one `error:` line and an exit code."""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """The `compress` entry point (setup.cfg console_scripts: compressor.cli:main)."""
    from compressor.cli.command import main as run

    return run(argv)

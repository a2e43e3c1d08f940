"""The `compress` command: `main` parses, each subcommand has its module, and guard.py turns
every failure into one `error:` line and an exit code."""
from compressor.cli.main import main

__all__ = ["main"]

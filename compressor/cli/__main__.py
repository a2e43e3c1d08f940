"""`python -m compressor.cli ...` runs the `compress` command."""
import sys

from compressor.cli import main

sys.exit(main())

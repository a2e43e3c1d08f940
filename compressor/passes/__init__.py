"""Every pass, imported explicitly so that the registry is complete (no package walking)."""
from compressor.passes import distill, precision, prune, quantize  # noqa: F401

"""How a scheme stores a language model's weight matrices: bits, group size and zero points,
per kind of tensor (the decoder's linears, its lm_head, its input embedding).

A scheme declares one (`Scheme.storage`, compressor/schemes); the LLM route's exporters make
their integers from it (backends/llm/handlers.py `weight_only_plan`: bits, group, symmetric)
and the planner counts its bytes from it (footprint.exporter_layout, footprint_tflite.
litert_layout), so a plan's bytes are the exporter's bytes whatever the recipe, built-in or a
user's file. Norms and biases are not covered: they stay float in the artifact's io dtype.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MIN_GROUP = 16   # the smallest block the int4 / int8 kernels (MatMulNBits, LiteRT) take


@dataclass(frozen=True)
class Grid:
    """One kind of weight matrix: float at `bits` (32, 16), or integers at `bits` (8, 4) in
    groups of `group_size` values along the input width, a scale per group and, unless
    `symmetric`, a zero point per group."""

    bits: int
    group_size: int | None = None   # integers: values per scale along K; None: one per row
    symmetric: bool = True          # w = (q - 2**(bits-1)) * scale: no zero points stored
    fit_group: bool = False         # the group is the largest power of two <= group_size
                                    # (>= MIN_GROUP) dividing every input width of the model

    @property
    def quantized(self) -> bool:
        return self.bits < 16

    def group_for(self, widths: Iterable[int]) -> int | None:
        """The group a model whose quantized matrices have these input widths gets: group_size,
        or with fit_group the largest power of two up to it dividing them all (None when no
        group of MIN_GROUP or more does)."""
        if not self.fit_group or self.group_size is None:
            return self.group_size
        return fitted_group(self.group_size, widths)


def fitted_group(largest: int, widths: Iterable[int]) -> int | None:
    """The largest power-of-two group up to `largest` dividing every width (None below
    MIN_GROUP)."""
    widths = list(widths)
    group = largest
    while group >= MIN_GROUP and any(width % group for width in widths):
        group //= 2
    return group if group >= MIN_GROUP else None


@dataclass(frozen=True)
class WeightStorage:
    """A language model's weights under a scheme, by tensor kind. A tied embedding is the
    lm_head's matrix (the artifact stores it once, on the lm_head's grid)."""

    linears: Grid                   # attention and MLP projections of every decoder layer
    lm_head: Grid
    embedding: Grid                 # the input embedding table
    int8_budget: float = 1.0        # int4: the matrices' bytes may reach this x their int4
                                    # bytes, the costliest kept at int8 (chosen when quantizing,
                                    # backends/llm/mixed.py); the planner counts the ceiling

    @classmethod
    def every(cls, grid: Grid, int8_budget: float = 1.0) -> WeightStorage:
        """One grid for every weight matrix."""
        return cls(grid, grid, grid, int8_budget if grid.bits == 4 else 1.0)

    @property
    def grids(self) -> tuple[Grid, Grid, Grid]:
        return self.linears, self.lm_head, self.embedding

    @property
    def precision(self) -> str:
        """fp32, fp16, int8 or int4: the linears' width, which picks the artifact's graph."""
        return f"{'fp' if not self.linears.quantized else 'int'}{self.linears.bits}"

    @property
    def accuracy_rank(self) -> int:
        """Higher = closer to the original model: more bits, then smaller groups, then zero
        points, then more bytes at int8 (fp32 > fp16 > int8 > int4 groups of 32 > int4 groups
        of 128)."""
        grid = self.linears
        return (grid.bits * 4096 - 2 * (grid.group_size or 0) + (not grid.symmetric)
                + round((self.int8_budget - 1.0) * 20))

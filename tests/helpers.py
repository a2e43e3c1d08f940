"""What every test that drives passes and backends directly needs: a Context, and a step
applied the way the pipeline applies it (the pass records it in the state)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from compressor.context import Context, Data, ModelState
from compressor.progress import Progress
from compressor.registry import get_pass
from compressor.steps import StepConfig


def context(data: Data | None = None, workdir: Path | str = "work", seed: int = 0,
            teacher: Any = None, **gate: Any) -> Context:
    return Context(data=data or Data(), progress=Progress(quiet=True), workdir=Path(workdir),
                   seed=seed, teacher=teacher, **gate)


def apply(backend: Any, state: ModelState, config: StepConfig, ctx: Context) -> ModelState:
    """Run `config`'s pass on `state`, as a recipe step would."""
    import compressor.passes  # noqa: F401  (fills the registry)

    return get_pass(config.kind)(state, config, ctx, backend)

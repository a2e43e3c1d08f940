"""The accuracy gate as one bound: which key of a recipe's `validate` decides (max_drop,
min_fidelity, max_increase), the number it compares, and the line naming both when an artifact
fails it. Passing, failing and the words said about it come from the same place, so a message
cannot name a bound other than the one that decided.
"""
from __future__ import annotations

from dataclasses import dataclass

from compressor.config.steps import ValidateConfig

DEFAULT_MAX_INCREASE = 0.05   # language models: relative perplexity increase allowed
TOLERANCE = 1e-12             # equal to the bound counts as passing despite float rounding


@dataclass(frozen=True)
class GateBound:
    """`key` (the validate key that decides) and its `limit`, for metric `metric`."""

    key: str        # "max_drop" | "min_fidelity" | "max_increase"
    limit: float
    metric: str

    def passes(self, value: float, drop: float) -> bool:
        if self.key == "min_fidelity":
            return value >= self.limit - TOLERANCE
        return drop <= self.limit + TOLERANCE

    def failure(self, path: str, value: float, drop: float) -> str:
        """The failure line: the artifact, its number, and the bound it missed."""
        if self.key == "min_fidelity":
            return f"{path} fidelity {value:.4f} < min_fidelity {self.limit}"
        if self.key == "max_increase":
            return (f"{path} perplexity {value:.3f} is {drop:+.1%} vs the original's, over "
                    f"max_increase +{self.limit:.1%}")
        if self.metric == "mse":
            return f"{path} mse {value:.4g} rises by {drop:.4g} > max_drop {self.limit}"
        return (f"{path} {self.metric} {value:.4f} drops by {drop:.4f} (from {value + drop:.4f}) "
                f"> max_drop {self.limit}")

    def text(self) -> str:
        """What the gate asks, for report.md's Gate line."""
        if self.key == "min_fidelity":
            return f"fidelity >= {self.limit}"
        if self.key == "max_increase":
            return f"perplexity increase <= +{self.limit:.1%}"
        rises = "rise" if self.metric == "mse" else "drop"
        return f"{self.metric} {rises} <= {self.limit}"


def gate_bound(config: ValidateConfig, metric_name: str | None = None) -> GateBound:
    """The bound `config` sets; `metric_name`: a custom metric's name (default config.metric)."""
    return bound_of(config.metric, max_drop=config.max_drop, min_fidelity=config.min_fidelity,
                    max_increase=config.max_increase, name=metric_name)


def bound_from_report(gate: dict, metric: str) -> GateBound:
    """The bound of a report.json `gate` section (report.md is rendered from report.json)."""
    return bound_of(metric, max_drop=gate["max_drop"], min_fidelity=gate.get("min_fidelity"),
                    max_increase=gate.get("max_increase"))


def bound_of(metric: str, *, max_drop: float, min_fidelity: float | None = None,
             max_increase: float | None = None, name: str | None = None) -> GateBound:
    """The one rule: fidelity with a min_fidelity is bounded below, perplexity by its relative
    increase, everything else by its drop (`name`: what the failure line calls the metric)."""
    if metric == "fidelity" and min_fidelity is not None:
        return GateBound("min_fidelity", min_fidelity, "fidelity")
    if metric == "perplexity":
        limit = DEFAULT_MAX_INCREASE if max_increase is None else max_increase
        return GateBound("max_increase", limit, "perplexity")
    return GateBound("max_drop", max_drop, name or metric)


def allowed_increase(config: ValidateConfig) -> float:
    return bound_of("perplexity", max_drop=0.0, max_increase=config.max_increase).limit


def gate_passes(config: ValidateConfig, metric_value_: float, drop_: float) -> bool:
    return gate_bound(config).passes(metric_value_, drop_)


def gate_failure(config: ValidateConfig, row: dict, metric_name: str | None = None) -> str:
    """The failure line of an artifact the gate refused: its number and the bound it missed."""
    return gate_bound(config, metric_name).failure(row["path"], row["metric_value"], row["drop"])

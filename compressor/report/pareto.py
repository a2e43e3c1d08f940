"""The Pareto front of a sweep's artifacts and its plot (`cz.plot_pareto`, sweep.html)."""
from __future__ import annotations

import numpy as np

from compressor.errors import DataError
from compressor.tasks import task_named

# columns where a smaller value is the better one (the Pareto front minimises them)
LOWER_IS_BETTER = {"perplexity", "perplexity_increase", "drop", "latency_ms_p50", "prefill_ms",
                   "peak_rss_bytes", "est_peak_memory_bytes"}


def pareto_front(frame, x: str, y: str):
    """Rows no other row beats: smaller-or-equal `x` and better-or-equal `y` (larger, or smaller
    for perplexity, drop, latency and memory columns), one strictly."""
    sign = -1.0 if lower_is_better(frame, y) else 1.0
    ok = frame.dropna(subset=[x, y])
    ok = ok.assign(_better=sign * ok[y]).sort_values([x, "_better"], ascending=[True, False])
    best = -np.inf
    keep = []
    for index, value in zip(ok.index, ok["_better"]):
        if value > best:
            keep.append(index)
            best = value
    return ok.drop(columns="_better").loc[keep]


def lower_is_better(frame, y: str) -> bool:
    """Whether the Pareto front minimises `y`; `metric_value` where the rows' task says so (a
    language model's is a perplexity)."""
    if y in LOWER_IS_BETTER:
        return True
    tasks = set(frame["task"].dropna()) if y == "metric_value" and "task" in frame else set()
    return bool(tasks) and all(task_named(name).metric_lower_is_better for name in tasks)


def plot_pareto(frame, x: str = "size_bytes", y: str = "metric_value",
                budget_bytes: int | None = None, title: str | None = None):
    """A matplotlib Figure: every artifact labelled, the Pareto front drawn, the budget marked
    (`budget_bytes`, by default the sweep target's budget kept in `frame.attrs`)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    for column in (x, y):
        if column not in frame:
            raise DataError(f"the sweep table has no column {column!r}; columns: "
                            f"{', '.join(frame.columns)}")
    ok = frame.dropna(subset=[x, y])
    budget_bytes = budget_bytes if budget_bytes is not None else frame.attrs.get("budget_bytes")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(ok[x], ok[y], color="tab:blue", zorder=3)
    for _, row in ok.iterrows():
        ax.annotate(f"{row['recipe']} ({row['format']})", (row[x], row[y]), fontsize=8,
                    xytext=(4, 4), textcoords="offset points")
    front = pareto_front(ok, x, y)
    ax.plot(front[x], front[y], color="tab:red", drawstyle="steps-post", label="Pareto front",
            zorder=2)
    if budget_bytes is not None:
        ax.axvline(budget_bytes, color="tab:gray", linestyle="--", label="device budget")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title or f"{y} vs {x}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right" if lower_is_better(ok, y) else "lower right")
    fig.tight_layout()
    return fig

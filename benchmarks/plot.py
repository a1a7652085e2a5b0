"""The paper's figure from a report: real tokens/s, peak memory and the loss at every step, per variant, one row of
panels per dataset (matplotlib, the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(report: dict[str, Any], path: Path) -> Path | None:
    """Draw ``report`` (``harness.run``'s) into ``path`` (a PNG); None, with nothing written, without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    datasets = report["datasets"]
    fig, axes = plt.subplots(len(datasets), 3, figsize=(13, 3.6 * len(datasets)), squeeze=False)
    for row, (dataset, data) in zip(axes, datasets.items(), strict=True):
        figures = data["figures"]
        names = list(figures)
        title = dataset or report["task"]
        for ax, key, label in ((row[0], "tokens_per_second", "real tokens/s"),
                               (row[1], "peak_memory_mb", "peak memory (MB)")):
            values = [figures[n][key] for n in names]
            bars = ax.bar(range(len(names)), values, color=[f"C{i}" for i in range(len(names))])
            ax.bar_label(bars, [f"{v / values[0]:.2f}x" for v in values], fontsize=8)  # the ratio to the first
            ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
            ax.set_title(f"{title}: {label}")
        for i, name in enumerate(names):  # a step without a logged loss: a gap
            losses = [float("nan") if x is None else x for x in figures[name]["losses"]]
            row[2].plot(range(1, len(losses) + 1), losses, marker="o", ms=3, color=f"C{i}", label=name)
        row[2].set(title=f"{title}: loss per optimizer step", xlabel="step")
        row[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

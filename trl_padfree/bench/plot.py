"""The benchmark figure (matplotlib): tokens/s, peak memory and train loss per dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .config import _fmt_params

_COLORS = {"padded-sdpa": "#7f7f7f", "packed-sdpa": "#1f77b4", "packed-padfree": "#d62728", "packed-fa2": "#2ca02c"}
_STYLES = {"padded-sdpa": "-", "packed-sdpa": "--", "packed-padfree": ":", "packed-fa2": "-."}


def plot(report: dict[str, Any], path: Path) -> None:
    """PNG: one row per dataset; real tokens/s bars, peak memory bars, train loss curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    datasets = list(report["datasets"].items())
    fig, axes = plt.subplots(len(datasets), 3, figsize=(15, 3.8 * len(datasets)), squeeze=False)
    for row, (_, entry) in enumerate(datasets):
        ran = {n: r for n, r in entry["variants"].items() if "skipped" not in r}
        names = list(ran)
        colors = [_COLORS.get(n, "#9467bd") for n in names]
        ax_tps, ax_mem, ax_loss = axes[row]
        bars = ax_tps.bar(names, [ran[n]["tokens_per_second"] for n in names], color=colors)
        for bar, n in zip(bars, names, strict=True):
            ratio = entry["comparison"].get(n, {}).get("throughput_ratio")
            if ratio is not None:
                ax_tps.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=9)
        ax_tps.set_title(f"{entry['label']}\nreal tokens/s (higher is better)", fontsize=10)
        bars = ax_mem.bar(names, [ran[n]["peak_memory_mb"] for n in names], color=colors)
        for bar, n in zip(bars, names, strict=True):
            ratio = entry["comparison"].get(n, {}).get("memory_ratio")
            if ratio is not None:
                ax_mem.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=9)
        kind = next((r["memory_kind"] for r in ran.values()), "")
        ax_mem.set_title(f"peak memory, MB (lower is better)\n{kind}", fontsize=10)
        for n in names:
            res = ran[n]
            ax_loss.plot(range(1, len(res["train_loss"]) + 1), res["train_loss"], _STYLES.get(n, "-"),
                         color=_COLORS.get(n, "#9467bd"), label=f"{n} (eval {res['eval_loss']:.4f})", linewidth=2)
        warmup = report["config"]["warmup"]
        if warmup:
            ax_loss.axvspan(0.5, warmup + 0.5, color="#eeeeee", zorder=0, label="warm-up (untimed)")
        ax_loss.set_title("train loss per optimizer step", fontsize=10)
        ax_loss.set_xlabel("optimizer step")
        ax_loss.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_loss.legend(fontsize=8)
        for ax in (ax_tps, ax_mem):
            ax.tick_params(axis="x", labelsize=8)
            ax.margins(y=0.12)
    c, m = report["config"], report["machine"]
    fig.suptitle(
        f"Padded vs padding-free: Llama {c['layers']}x{c['hidden']} ({_fmt_params(c['parameters'])}), {c['dtype']}, "
        f"batch {c['batch_size']}, {c['steps']} timed steps; {m['gpu'] or m['cpu']}"
        + ("" if m["gpu"] else f" ({m['torch_threads']} torch threads)") + f"; torch {m['torch']}, "
        f"transformers {m['transformers']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

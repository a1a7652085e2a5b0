"""The benchmark figures (matplotlib): SFT, per dataset, real tokens/s, time per step, peak memory and train loss;
DPO, the measured ratio next to the FLOP ratio, peak memory and the per-step losses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .data import dataset_title
from .preset import fmt_params as _fmt_params
from .report import step_medians

_COLORS = {"padded-sdpa": "#7f7f7f", "packed-sdpa": "#1f77b4", "packed-padfree": "#d62728", "packed-fa2": "#2ca02c",
           "trl-native": "#ff7f0e", "sft-padfree": "#9467bd", "token-budget": "#8c564b"}
_STYLES = {"padded-sdpa": "-", "packed-sdpa": "--", "packed-padfree": ":", "packed-fa2": "-.", "trl-native": "-",
           "sft-padfree": "--", "token-budget": "-."}
_MARKERS = {"padded-sdpa": "o", "packed-sdpa": "s", "packed-padfree": "^", "packed-fa2": "v", "trl-native": "D",
            "sft-padfree": "x", "token-budget": "+"}


def loss_axis(steps: int) -> tuple[tuple[float, float], list[int] | None]:
    """x-limits of the loss panel and its ticks (every step when there are few, else matplotlib's choice).

    >>> loss_axis(1)
    ((0.5, 1.5), [1])
    >>> loss_axis(3)
    ((0.5, 3.5), [1, 2, 3])
    >>> loss_axis(40)
    ((0.5, 40.5), None)
    """
    return (0.5, steps + 0.5), (list(range(1, steps + 1)) if steps <= 12 else None)


def _ratio_labels(ax, bars, ratios: list[float | None]) -> None:
    for bar, ratio in zip(bars, ratios, strict=True):
        if ratio is not None:
            ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)


def make_figure(report: dict[str, Any]):
    """The figure: one row per dataset; tokens/s bars, ms-per-step bars (compute / rest), peak memory bars, loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    c, m = report["config"], report["machine"]
    datasets = list(report["datasets"].items())
    fig, axes = plt.subplots(len(datasets), 4, figsize=(20, 4.2 * len(datasets)), squeeze=False)
    for row, (name, entry) in enumerate(datasets):
        ran = {n: r for n, r in entry["variants"].items() if "skipped" not in r}
        names = list(ran)
        colors = [_COLORS.get(n, "#17becf") for n in names]
        cmp = entry["comparison"]
        ax_tps, ax_time, ax_mem, ax_loss = axes[row]
        bars = ax_tps.bar(names, [ran[n]["tokens_per_second"] for n in names], color=colors)
        _ratio_labels(ax_tps, bars, [cmp.get(n, {}).get("throughput_ratio") for n in names])
        ax_tps.set_title(f"{dataset_title(name, entry, c.get('length_scale', 1.0))}\n"
                         "real tokens/s (higher is better)", fontsize=9)
        medians = [step_medians(ran[n]) for n in names]
        if names and all(step is not None and rest is not None for step, rest in medians):
            total = [step * 1000 for step, _ in medians]
            rest = [rest * 1000 for _, rest in medians]
            ax_time.bar(names, [t - r for t, r in zip(total, rest, strict=True)], color=colors,
                        label="forward + backward + optimizer")
            ax_time.bar(names, rest, bottom=[t - r for t, r in zip(total, rest, strict=True)], color=colors,
                        alpha=0.35, hatch="//", label="rest of the step (data, logging, ...)")
            ax_time.legend(fontsize=7)
        ax_time.set_title("wall time per step, ms (median of timed steps)", fontsize=9)
        bars = ax_mem.bar(names, [ran[n]["peak_memory_mb"] for n in names], color=colors)
        _ratio_labels(ax_mem, bars, [cmp.get(n, {}).get("memory_ratio") for n in names])
        kind = next((r["memory_kind"] for r in ran.values()), "")
        ax_mem.set_title(f"peak memory, MB (lower is better)\n{kind}", fontsize=9)
        steps = max((len(r["train_loss"]) for r in ran.values()), default=1)
        for n in names:
            res = ran[n]
            ax_loss.plot(range(1, len(res["train_loss"]) + 1), res["train_loss"], _STYLES.get(n, "-"),
                         marker=_MARKERS.get(n, "o") if steps <= 30 else None, markersize=6, fillstyle="none",
                         color=_COLORS.get(n, "#17becf"), label=f"{n} (eval {res['eval_loss']:.4f})", linewidth=1.5)
        warmup = c["warmup"]
        if warmup:
            ax_loss.axvspan(0.5, warmup + 0.5, color="#eeeeee", zorder=0, label="warm-up (untimed)")
        xlim, ticks = loss_axis(steps)
        ax_loss.set_xlim(*xlim)
        if ticks is not None:
            ax_loss.set_xticks(ticks)
        else:
            ax_loss.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_loss.set_title("train loss per optimizer step", fontsize=9)
        ax_loss.set_xlabel("optimizer step")
        ax_loss.legend(fontsize=7)
        for ax in (ax_tps, ax_time, ax_mem):
            ax.tick_params(axis="x", labelsize=7, labelrotation=20)
            ax.margins(y=0.12)
    fig.suptitle(
        f"Padded vs padding-free: Llama {c['layers']}x{c['hidden']} ({_fmt_params(c['parameters'])}), {c['dtype']}, "
        f"batch {c['batch_size']}, {c['steps']} timed steps; {m['gpu'] or m['cpu']}"
        + ("" if m["gpu"] else f" ({m['torch_threads']} torch threads)") + f"; torch {m['torch']}, "
        f"transformers {m['transformers']}" + (f", trl {m['trl']}" if m.get("trl") else ""), fontsize=10)
    fig.tight_layout()
    return fig


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(report: dict[str, Any], path: Path) -> None:
    """Write :func:`make_figure` (the SFT task's figure) as a PNG."""
    _save(make_figure(report), path)


def plot_dpo(report: dict[str, Any], path: Path) -> None:
    """The DPO task's figure: real tokens/s ratio next to the FLOP ratio, peak memory, and the per-step losses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants, cmp, c = report["variants"], report["comparison"], report["config"]
    names = list(variants)
    fig, (ax_r, ax_m, ax_l) = plt.subplots(1, 3, figsize=(16, 4.5))
    x = range(len(names))
    measured = [cmp[n].get("throughput_ratio", 1.0) for n in names]
    flops = [cmp[n].get("flop_ratio", 1.0) for n in names]
    ax_r.bar([i - 0.2 for i in x], measured, 0.4, label="measured real tokens/s vs padded", color="#d62728")
    ax_r.bar([i + 0.2 for i in x], flops, 0.4, label="workload FLOP ratio (padded / variant)", color="#7f7f7f")
    for i, (a, b) in enumerate(zip(measured, flops, strict=True)):
        ax_r.annotate(f"{a:.2f}x", (i - 0.2, a), ha="center", va="bottom", fontsize=8)
        ax_r.annotate(f"{b:.2f}x", (i + 0.2, b), ha="center", va="bottom", fontsize=8)
    ax_r.set_xticks(list(x), names, fontsize=8)
    ax_r.set_title("speed-up over TRL's padded DPO vs the FLOP ratio", fontsize=9)
    ax_r.legend(fontsize=7)
    bars = ax_m.bar(names, [variants[n]["peak_memory_mb"] for n in names], color="#1f77b4")
    _ratio_labels(ax_m, bars, [cmp[n].get("memory_ratio") for n in names])
    ax_m.set_title(f"peak memory, MB\n{variants[names[0]].get('memory_kind', '')}", fontsize=9)
    ax_m.tick_params(axis="x", labelsize=8)
    for n, style in zip(names, ("-o", "--^", ":s"), strict=False):
        losses = variants[n]["train_loss"]
        ax_l.plot(range(1, len(losses) + 1), losses, style, fillstyle="none", label=n)
    ax_l.set_title("DPO loss per optimizer step (the curves coincide when exact)", fontsize=9)
    ax_l.set_xlabel("optimizer step")
    ax_l.legend(fontsize=7)
    for ax in (ax_r, ax_m):
        ax.margins(y=0.15)
    m = report["machine"]
    fig.suptitle(f"DPO, Llama {c['layers']}x{c['hidden']} ({_fmt_params(c['parameters'])}), {c['dtype']}, batch "
                 f"{c['batch_size']} pairs, {c['steps']} timed steps, lengths x {c['length_scale']:g}; "
                 f"{m['gpu'] or m['cpu']} ({m['torch_threads']} torch threads)", fontsize=10)
    fig.tight_layout()
    _save(fig, path)



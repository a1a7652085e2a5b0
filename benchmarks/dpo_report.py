"""The DPO benchmark's report: measured ratios next to the workload's FLOP ratios, the targets, the Markdown tables
(throughput, per-step losses side by side) and the written JSON/Markdown/PNG files."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .dpo_data import DISTRIBUTION_LABEL, STEP_FORWARDS
from .flops import timed_flops
from .measures import max_rel_diff
from .preset import fmt_params as _fmt_params
from .targets import TARGETS, in_memory_setup, in_speed_setup
from .targets import failed_targets as failed_targets

DPO_BASELINE = TARGETS["dpo"]["baseline"]
FLOP_SHARE_TARGET = TARGETS["dpo"]["flop_share"]
_JUDGED = TARGETS["dpo"]["judged"]
SPEED_TARGET_SETUP = TARGETS["dpo"]["speed_setup_text"]


def compare(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per variant: measured ratios over TRL's padded run, the workload's FLOP ratio, loss and batch agreement."""
    variants, config = report["variants"], report["config"]
    base = variants.get(DPO_BASELINE)
    out: dict[str, dict[str, Any]] = {}
    for name, res in variants.items():
        flops = timed_flops(config, res)
        entry: dict[str, Any] = {
            "forward_flops_timed": flops,
            "step_gflop_per_s": STEP_FORWARDS * flops["total"] / res["timed_seconds"] / 1e9,
        }
        if base is not None:
            base_flops = timed_flops(config, base)
            warm = res["warmup_steps"]
            flop_ratio = base_flops["total"] / flops["total"]
            throughput = res["tokens_per_second"] / base["tokens_per_second"]
            entry.update(
                throughput_ratio=throughput,
                flop_ratio=flop_ratio,
                share_of_flop_ratio=throughput / flop_ratio,
                forwarded_ratio=res["forwarded_tokens_per_second"] / base["forwarded_tokens_per_second"],
                cpu_throughput_ratio=None if res["tokens_per_cpu_second"] is None
                else res["tokens_per_cpu_second"] / base["tokens_per_cpu_second"],
                median_step_speedup=statistics.median(
                    b / v for b, v in zip(base["step_seconds"][warm:], res["step_seconds"][warm:], strict=True)),
                memory_ratio=res["peak_memory_mb"] / base["peak_memory_mb"],
                train_loss_max_rel_diff=max_rel_diff(res["train_loss"], base["train_loss"]),
                logps_max_rel_diff=max(
                    max_rel_diff([e[k] for e in res["logged"]], [e[k] for e in base["logged"]])
                    for k in ("logps/chosen", "logps/rejected")),
                same_batches=res["batch_fingerprints"] == base["batch_fingerprints"],
                same_steps=res["optimizer_steps"] == base["optimizer_steps"],
            )
        out[name] = entry
    return out


def evaluate_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets; ``holds`` None ("n/a") where a target does not apply, with the reason in ``shown``."""
    config, cmp, variants = report["config"], report["comparison"], report["variants"]
    speed, memory = in_speed_setup("dpo", config), in_memory_setup(config)
    rtol, logps_rtol = config["loss_rtol"], config.get("logps_rtol", config["loss_rtol"])
    targets: list[dict[str, Any]] = []
    for name in _JUDGED:
        c = cmp.get(name)
        if c is None or "flop_ratio" not in c:
            continue
        need = FLOP_SHARE_TARGET * c["flop_ratio"]
        shown = (f"{c['throughput_ratio']:.2f}x measured vs FLOP ratio {c['flop_ratio']:.2f}x = "
                 f"{c['share_of_flop_ratio']:.0%} of it (needs >= {need:.2f}x)")
        if not speed:
            shown += f" (judged only on {SPEED_TARGET_SETUP})"
        targets.append({"target": f"{name} real tokens/s >= {FLOP_SHARE_TARGET:.0%} of the workload's FLOP ratio "
                                  f"over {DPO_BASELINE}",
                        "value": c["share_of_flop_ratio"], "shown": shown,
                        "holds": c["share_of_flop_ratio"] >= FLOP_SHARE_TARGET if speed else None})
    for name in _JUDGED:
        c = cmp.get(name)
        if c is None or "memory_ratio" not in c:
            continue
        shown = (f"{variants[name]['peak_memory_mb']:,.0f} vs {variants[DPO_BASELINE]['peak_memory_mb']:,.0f} MB "
                 f"({c['memory_ratio']:.2f}x)")
        if not memory:
            shown += " (judged only with each variant in its own worker at --length-scale 1, or on CUDA)"
        targets.append({"target": f"{name} peak memory below {DPO_BASELINE}", "value": c["memory_ratio"],
                        "shown": shown, "holds": c["memory_ratio"] < 1.0 if memory else None})
    for name in _JUDGED:
        c = cmp.get(name)
        if c is None or "train_loss_max_rel_diff" not in c:
            continue
        ok = c["same_batches"] and c["same_steps"] and c["logps_max_rel_diff"] <= logps_rtol
        ok = ok and c["train_loss_max_rel_diff"] <= rtol
        shown = (f"logps max rel. diff {c['logps_max_rel_diff']:.1e}, loss {c['train_loss_max_rel_diff']:.1e} over "
                 f"{variants[name]['optimizer_steps']} steps; same pairs in the same batches: "
                 f"{'yes' if c['same_batches'] else 'NO'}")
        targets.append({"target": f"{name} per-step chosen/rejected logps (rel. tol. {logps_rtol:g}) and losses "
                                  f"(rel. tol. {rtol:g}) equal {DPO_BASELINE}'s, same batches",
                        "value": c["train_loss_max_rel_diff"], "shown": shown, "holds": ok})
    return targets


def _x(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}x"


def to_markdown(report: dict[str, Any]) -> str:
    c, m, s = report["config"], report["machine"], report["length_stats"]
    variants, cmp = report["variants"], report["comparison"]
    scale = c["length_scale"]
    lines = [
        "# DPO: TRL's padded DPOTrainer vs padding-free vs prompt-once (trl-padfree bench --task dpo)",
        "",
        f"- Machine: {m['gpu'] or m['cpu']} ({m['cpu_count']} CPUs, {m['torch_threads']} torch threads); torch "
        f"{m['torch']}, transformers {m['transformers']}, trl {m.get('trl')}, trl-padfree {m['trl_padfree']}"
        + (f" (git {m['git']})" if m.get("git") else "")
        + (f"; load average (1/5/15 min) {m['load_average_start']} at start, {m.get('load_average_end')} at end"
           if m.get("load_average_start") else ""),
        f"- Model: random-init Llama, {c['layers']} layers x {c['hidden']} hidden, {c['heads']} heads / "
        f"{c['kv_heads']} kv heads, MLP {c['intermediate']}, vocab {c['vocab_size']} "
        f"({_fmt_params(c['parameters'])} parameters), {c['dtype']} on {c['device']}; a separate reference model "
        "(a copy of the initial policy) whose forward is part of every step",
        f"- Training: DPOTrainer, sigmoid loss, beta {c['beta']:g}, AdamW lr {c['lr']:g} (constant, no clipping), "
        f"batch {c['batch_size']} pairs, {c['warmup']} warm-up + {c['steps']} timed steps, seed {c['seed']}; "
        + ("each variant in a fresh worker process, trained in lockstep (step i of every variant, then step i+1)"
           if c["subprocess"] else "in-process, one variant after the other (peak memory not judged)"),
        f"- Data: {DISTRIBUTION_LABEL}"
        + (f", lengths x {scale:g}" if scale != 1.0 else "") + f", each part clipped to {c['max_length']} tokens. "
        f"This run: prompt mean {s['prompt']['mean']:.0f} (median {s['prompt']['median']:.0f}, max "
        f"{s['prompt']['max']}), chosen mean {s['chosen']['mean']:.0f}, rejected mean {s['rejected']['mean']:.0f} "
        f"tokens; {s['trl_tokens_per_step']:,.0f} TRL tokens per timed step, {s['prompt_share_of_trl_tokens']:.0%} "
        "of them prompt tokens",
        "- Real tokens/s: the tokens of the 2B sequences as TRL counts them (prompt + chosen and prompt + rejected: "
        "each prompt counted twice; no padding), the same number in every variant, over the timed steps (the whole "
        "trainer loop iteration). Forwarded tokens/s: token slots the model runs (padded: 2B x T, padding included; "
        "padding-free: sum(P+C) + sum(P+R); prompt-once: sum(P+C+R+1)). FLOP ratio: the workload's matmul FLOPs "
        "(linear layers and LM head per slot, attention q_len x k_len per segment; policy forward + backward + "
        "reference forward = 4 forwards in every variant), counted from the batches really run, padded / variant; "
        "'share' = measured ratio / FLOP ratio",
        f"- Exactness: every step's loss and TRL's logged logps/chosen and logps/rejected (batch means of the "
        f"per-sequence log-prob sums) against TRL's padded run, relative tolerances {c.get('logps_rtol', 0):g} "
        f"(logps) and {c['loss_rtol']:g} (loss) in {c['dtype']}: the loss is a function of the margin, a "
        "difference of four such sums of ~1,000-3,000 nats each at these lengths, which float32 resolves to "
        "~1e-4 absolute (ulp), so the loss carries ~1e-4 relative rounding where the logps carry ~1e-7",
        "",
        "| variant | real tokens/s | vs padded | FLOP ratio | share | forwarded tokens/s | median step speed-up "
        "| tokens/CPU-s vs padded | ms/step | GFLOP/s | peak MB | vs padded | max rel. diff logps / loss "
        "| same batches |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, res in variants.items():
        k = cmp.get(name, {})
        base = name == DPO_BASELINE
        share = "" if base or "share_of_flop_ratio" not in k else f"{k['share_of_flop_ratio']:.0%}"
        diff = "" if base or "train_loss_max_rel_diff" not in k else \
            f"{k['logps_max_rel_diff']:.1e} / {k['train_loss_max_rel_diff']:.1e}"
        same = "" if base or "same_batches" not in k else ("yes" if k["same_batches"] else "NO")
        lines.append(
            f"| {name} | {res['tokens_per_second']:,.0f} | {_x(k.get('throughput_ratio'))} | "
            f"{_x(k.get('flop_ratio'))} | {share} | {res['forwarded_tokens_per_second']:,.0f} | "
            f"{'' if base else _x(k.get('median_step_speedup'))} | "
            f"{'' if base else _x(k.get('cpu_throughput_ratio'))} | {res['median_step_seconds'] * 1000:,.0f} | "
            f"{k['step_gflop_per_s']:.1f} | {res['peak_memory_mb']:,.0f} | {_x(k.get('memory_ratio'))} | "
            f"{diff} | {same} |"
        )
    kind = next((r.get("memory_kind") for r in variants.values()), None)
    lines += ["", f"Peak memory: {kind}. GFLOP/s: 4 x the counted forward FLOPs of the timed steps per second."]
    lines += ["", "FLOPs of one forward over the timed steps (policy and reference each run it; the backward ~2x):", "",
              "| variant | linear layers (GFLOP) | attention (GFLOP) | LM head (GFLOP) | total (GFLOP) |",
              "|---|---:|---:|---:|---:|"]
    for name in variants:
        f = cmp[name]["forward_flops_timed"]
        lines.append(f"| {name} | {f['linear'] / 1e9:.2f} | {f['attention'] / 1e9:.2f} | {f['lm_head'] / 1e9:.2f} | "
                     f"{f['total'] / 1e9:.2f} |")
    names = list(variants)
    lines += ["", "Per-step losses (warm-up steps included; the fingerprint of step i's batch is the same in every "
              "variant when 'same batches' says yes):", "",
              "| step | " + " | ".join(names) + " | TRL tokens | batch fingerprint |",
              "|---:|" + "---:|" * len(names) + "---:|---|"]
    first = variants[names[0]]
    for i in range(first["optimizer_steps"]):
        losses = " | ".join(f"{variants[n]['train_loss'][i]:.7f}" if i < len(variants[n]["train_loss"]) else ""
                            for n in names)
        mark = " (warm-up)" if i < first["warmup_steps"] else ""
        lines.append(f"| {i + 1}{mark} | {losses} | {first['real_tokens'][i]:,} | `{first['batch_fingerprints'][i]}` |")
    notes = []
    for name, res in variants.items():
        probe = "; ".join(f"{p['attn']!r} max logit diff {p['max_abs_diff']:.1e}" for p in res.get("probe", []))
        warned = "; ".join(res.get("trainer_warnings") or []) or "none"
        notes.append(f"- {name}: `{res['trainer']}`, attention `{res['attn_implementation']}`"
                     + (f"; preference probe (policy, reference): {probe}" if probe else "")
                     + f"; warnings while building the trainer: {warned}")
    lines += ["", *notes, "", "## Targets", ""]
    for t in report["targets"]:
        lines.append(f"- {({True: 'PASS', False: 'FAIL', None: 'n/a'})[t['holds']]}: {t['target']}: {t['shown']}")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Real tokens/s ratio next to the FLOP ratio, peak memory, and the per-step losses."""
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
    for bar, n in zip(bars, names, strict=True):
        r = cmp[n].get("memory_ratio")
        if r is not None:
            ax_m.annotate(f"{r:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                          va="bottom", fontsize=8)
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
    fig.savefig(path, dpi=100)
    plt.close(fig)


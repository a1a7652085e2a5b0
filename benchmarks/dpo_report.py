"""The DPO benchmark's report: measured ratios next to the workload's FLOP ratios, the targets and the Markdown
tables (throughput, per-step losses side by side)."""

from __future__ import annotations

from typing import Any

from .dpo_data import DISTRIBUTION_LABEL, STEP_FORWARDS
from .flops import timed_flops
from .report import fmt, machine_line, max_rel_diff, model_line, ratios, target_lines
from .targets import TARGETS, failed_targets, in_memory_setup, in_speed_setup, memory_target, share_target

__all__ = ["compare", "evaluate_targets", "failed_targets", "to_markdown"]

DPO_BASELINE = TARGETS["dpo"]["baseline"]
_JUDGED = TARGETS["dpo"]["judged"]


def compare(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per variant: its forward FLOPs and :func:`~.report.ratios` over TRL's padded run, with the forwarded-tokens
    ratio, the logged logps' difference and whether the batches were the same."""
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
            entry.update(
                ratios(config, res, base),
                forwarded_ratio=res["forwarded_tokens_per_second"] / base["forwarded_tokens_per_second"],
                logps_max_rel_diff=max(
                    max_rel_diff([e[k] for e in res["logged"]], [e[k] for e in base["logged"]])
                    for k in ("logps/chosen", "logps/rejected")),
                same_batches=res["batch_fingerprints"] == base["batch_fingerprints"],
            )
        out[name] = entry
    return out


def evaluate_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets; ``holds`` None ("n/a") where a target does not apply, with the reason in ``shown``."""
    config, cmp, variants = report["config"], report["comparison"], report["variants"]
    speed, memory = in_speed_setup("dpo", config), in_memory_setup(config)
    rtol, logps_rtol = config["loss_rtol"], config.get("logps_rtol", config["loss_rtol"])
    judged = [(name, cmp[name]) for name in _JUDGED if "flop_ratio" in cmp.get(name, {})]
    targets = [share_target(f"{name} real tokens/s >= {TARGETS['dpo']['flop_share']:.0%} of the workload's FLOP "
                            f"ratio over {DPO_BASELINE}", "dpo", c["throughput_ratio"], c["flop_ratio"], speed)
               for name, c in judged]
    targets += [memory_target(f"{name} peak memory below {DPO_BASELINE}", variants[name]["peak_memory_mb"],
                              variants[DPO_BASELINE]["peak_memory_mb"], memory) for name, _ in judged]
    for name, c in judged:
        ok = c["same_batches"] and c["same_steps"] and c["logps_max_rel_diff"] <= logps_rtol
        ok = ok and c["train_loss_max_rel_diff"] <= rtol
        shown = (f"logps max rel. diff {c['logps_max_rel_diff']:.1e}, loss {c['train_loss_max_rel_diff']:.1e} over "
                 f"{variants[name]['optimizer_steps']} steps; same pairs in the same batches: "
                 f"{'yes' if c['same_batches'] else 'NO'}")
        targets.append({"target": f"{name} per-step chosen/rejected logps (rel. tol. {logps_rtol:g}) and losses "
                                  f"(rel. tol. {rtol:g}) equal {DPO_BASELINE}'s, same batches",
                        "value": c["train_loss_max_rel_diff"], "shown": shown, "holds": ok})
    return targets


def to_markdown(report: dict[str, Any]) -> str:
    c, m, s = report["config"], report["machine"], report["length_stats"]
    variants, cmp = report["variants"], report["comparison"]
    scale = c["length_scale"]
    lines = [
        "# DPO: TRL's padded DPOTrainer vs padding-free vs prompt-once (trl-padfree bench --task dpo)",
        "",
        machine_line(m),
        model_line(c) + "; a separate reference model (a copy of the initial policy) whose forward is part of every "
        "step",
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
            f"| {name} | {res['tokens_per_second']:,.0f} | {fmt(k.get('throughput_ratio'))} | "
            f"{fmt(k.get('flop_ratio'))} | {share} | {res['forwarded_tokens_per_second']:,.0f} | "
            f"{'' if base else fmt(k.get('median_step_speedup'))} | "
            f"{'' if base else fmt(k.get('cpu_throughput_ratio'))} | {res['median_step_seconds'] * 1000:,.0f} | "
            f"{k['step_gflop_per_s']:.1f} | {res['peak_memory_mb']:,.0f} | {fmt(k.get('memory_ratio'))} | "
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
    lines += ["", *notes, "", *target_lines(report)]
    return "\n".join(lines) + "\n"
